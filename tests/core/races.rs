//! Exactness under racing threads, with a frozen `FakeClock`.
//!
//! Every test starts its threads together on a `Barrier` so that they really collide, and
//! runs for each algorithm.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

use tollgate::{DirectLimiter, FakeClock, Policy, RateLimiter};

use crate::support::{eviction_race, eviction_stress, race};

const ALGORITHMS: [&str; 3] = ["token-bucket", "sliding-log", "sliding-counter"];

fn policy(algorithm: &str, permits: u64, window: &str) -> Policy {
    format!("{algorithm} {permits}/{window}").parse().unwrap()
}

#[test]
fn keyed_capacity_is_exact_under_16_threads() {
    for algorithm in ALGORITHMS {
        for trial in 0..20 {
            let limiter: Arc<RateLimiter<String, FakeClock>> = Arc::new(RateLimiter::with_clock(
                policy(algorithm, 1_000, "1h"),
                FakeClock::new(),
            ));
            let admitted = race(16, move |_| {
                (0..2_000)
                    .filter(|_| limiter.try_acquire("hot").is_allowed())
                    .count() as u64
            });
            assert_eq!(admitted, 1_000, "{algorithm}, trial {trial}");
        }
    }
}

#[test]
fn direct_capacity_is_exact_under_16_threads() {
    for algorithm in ALGORITHMS {
        for trial in 0..20 {
            let limiter = Arc::new(DirectLimiter::with_clock(
                policy(algorithm, 1_000, "1h"),
                FakeClock::new(),
            ));
            let admitted = race(16, move |_| {
                (0..2_000)
                    .filter(|_| limiter.try_acquire().is_allowed())
                    .count() as u64
            });
            assert_eq!(admitted, 1_000, "{algorithm}, trial {trial}");
        }
    }
}

#[test]
fn costs_are_exact_under_racing_threads() {
    // Costs 1, 2 and 3 racing on capacity 1,000: the permits spent never exceed 1,000, and
    // the state is left with fewer than 3 permits (nothing is lost to a race).
    for algorithm in ALGORITHMS {
        let limiter = Arc::new(DirectLimiter::with_clock(
            policy(algorithm, 1_000, "1h"),
            FakeClock::new(),
        ));
        let l = limiter.clone();
        let spent = race(12, move |i| {
            let cost = (i % 3) as u64 + 1;
            (0..500)
                .filter(|_| l.try_acquire_n(cost).unwrap().is_allowed())
                .count() as u64
                * cost
        });
        assert!(spent <= 1_000, "{algorithm}: spent {spent}");
        let left = 1_000 - spent;
        let mut drained = 0;
        while limiter.try_acquire().is_allowed() {
            drained += 1;
        }
        assert_eq!(
            drained, left,
            "{algorithm}: the permits not spent are all still there"
        );
    }
}

#[test]
fn a_new_keys_first_requests_create_one_state() {
    for algorithm in ALGORITHMS {
        let limiter: Arc<RateLimiter<u64, FakeClock>> = Arc::new(RateLimiter::with_clock(
            policy(algorithm, 1, "1h"),
            FakeClock::new(),
        ));
        let admitted: Arc<Vec<AtomicU64>> =
            Arc::new((0..2_000).map(|_| AtomicU64::new(0)).collect());
        let round = Arc::new(Barrier::new(8));
        let (l, a) = (limiter.clone(), admitted.clone());
        race(8, move |_| {
            for key in 0..2_000u64 {
                round.wait();
                if l.try_acquire(&key).is_allowed() {
                    a[key as usize].fetch_add(1, Ordering::Relaxed);
                }
            }
            0
        });
        for (key, count) in admitted.iter().enumerate() {
            assert_eq!(count.load(Ordering::Relaxed), 1, "{algorithm}, key {key}");
        }
        assert_eq!(limiter.len(), 2_000, "{algorithm}: one state per key");
    }
}

/// 3,200,000 races of a key's first admission with its eviction and re-creation (64 keys,
/// 50,000 phases on a frozen clock) admit exactly one request per key and phase.
#[test]
fn eviction_and_recreation_under_load_admit_exactly_the_capacity() {
    eviction_stress(64, 50_000);
}

#[test]
fn eviction_racing_requests_never_admits_extra() {
    // Windows of 1 s: every state is at rest when the next phase starts, 2 s later.
    for algorithm in ALGORITHMS {
        eviction_race(algorithm, policy(algorithm, 50, "1s"), 50);
    }
}
