//! Exactness under racing threads, with a frozen `FakeClock` (DESIGN.md section 4).
//!
//! Every test starts its threads together on a `Barrier` so that they really collide, and
//! runs for each algorithm.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use tollgate::{DirectLimiter, FakeClock, Policy, RateLimiter};

const ALGORITHMS: [&str; 3] = ["token-bucket", "sliding-log", "sliding-counter"];

fn policy(algorithm: &str, permits: u64, window: &str) -> Policy {
    format!("{algorithm} {permits}/{window}").parse().unwrap()
}

/// Runs `threads` copies of `work` started together and sums what they return.
fn race(threads: usize, work: impl Fn(usize) -> u64 + Send + Sync + 'static) -> u64 {
    let work = Arc::new(work);
    let start = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let (work, start) = (work.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                work(i)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).sum()
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

#[test]
fn eviction_racing_requests_never_admits_extra() {
    // Time moves in phases two windows apart, so every state is at rest when a phase starts.
    // During a phase the clock is frozen: each key may admit exactly its capacity, however
    // the requests interleave with a thread that evicts in a loop. An eviction that unlinked
    // a state while a request still used it would let a key admit more than that.
    const KEYS: u64 = 4;
    const CAPACITY: u64 = 50;
    const WORKERS: usize = 6;
    const PHASES: u64 = 150;
    for algorithm in ALGORITHMS {
        let clock = FakeClock::new();
        let limiter: Arc<RateLimiter<u64, FakeClock>> = Arc::new(RateLimiter::with_clock(
            policy(algorithm, CAPACITY, "1s"),
            clock.clone(),
        ));
        let stop = Arc::new(AtomicBool::new(false));
        let evicted = Arc::new(AtomicU64::new(0));
        let evictor = {
            let (limiter, stop, evicted) = (limiter.clone(), stop.clone(), evicted.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    evicted.fetch_add(limiter.evict_idle() as u64, Ordering::Relaxed);
                }
            })
        };
        let phase_start = Arc::new(Barrier::new(WORKERS + 1));
        let phase_end = Arc::new(Barrier::new(WORKERS + 1));
        let counts: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                let (limiter, counts) = (limiter.clone(), counts.clone());
                let (phase_start, phase_end) = (phase_start.clone(), phase_end.clone());
                thread::spawn(move || {
                    for _ in 0..PHASES {
                        phase_start.wait();
                        for i in 0..(CAPACITY * 3) {
                            let key = (i + w as u64) % KEYS;
                            if limiter.try_acquire(&key).is_allowed() {
                                counts[key as usize].fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        phase_end.wait();
                    }
                })
            })
            .collect();
        for phase in 0..PHASES {
            let before = evicted.load(Ordering::Relaxed);
            clock.set(Duration::from_secs(2 * phase + 2));
            if phase % 10 == 0 {
                // Now and then, let the evictor find the at-rest states before the requests
                // start, so removal and re-creation are exercised for certain; the other
                // phases race them.
                while phase > 0 && evicted.load(Ordering::Relaxed) == before {
                    thread::yield_now();
                }
            }
            phase_start.wait();
            phase_end.wait();
            for (key, count) in counts.iter().enumerate() {
                let admitted = count.swap(0, Ordering::Relaxed);
                assert_eq!(
                    admitted, CAPACITY,
                    "{algorithm}, phase {phase}, key {key}: admitted {admitted}"
                );
            }
        }
        stop.store(true, Ordering::Relaxed);
        evictor.join().unwrap();
        for w in workers {
            w.join().unwrap();
        }
        assert!(
            evicted.load(Ordering::Relaxed) > 0,
            "{algorithm}: the evictor must actually have removed states for the race to mean anything"
        );
    }
}
