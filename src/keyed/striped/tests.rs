//! Keys of the keyed limiter striped from the start (as contention would stripe them), so
//! that these tests do not depend on the scheduler making threads collide.

use std::sync::Arc;
use std::time::Duration;

use scc::Guard;

use crate::clock::FakeClock;
use crate::engine::dispatch::PerAlgorithm;
use crate::engine::token_bucket::GcraCell;
use crate::keyed::key_state::{AnyKeys, Keys};
use crate::keyed::RateLimiter;
use crate::keys::KeyHasher;
use crate::race::race;

type Limiter = RateLimiter<u64, FakeClock>;

fn limiter(policy: &str) -> (Arc<Limiter>, FakeClock) {
    let clock = FakeClock::new();
    let limiter = RateLimiter::with_clock(policy.parse().unwrap(), clock.clone());
    (Arc::new(limiter), clock)
}

/// Runs `look` on the token bucket table of `limiter`'s current generation.
fn with_table<R>(
    limiter: &Limiter,
    look: impl FnOnce(&Keys<u64, GcraCell, KeyHasher>, &Guard) -> R,
) -> R {
    let guard = Guard::new();
    let generation = limiter.generations.generation(&guard);
    let AnyKeys::Uniform(PerAlgorithm::TokenBucket(keyed)) = &generation.keys else {
        panic!("a token bucket's table");
    };
    look(keyed, &guard)
}

/// Stripes `key` if it is tracked; whether it was.
fn try_stripe(limiter: &Limiter, key: u64) -> bool {
    with_table(limiter, |keyed, guard| {
        keyed
            .table
            .read(&key, guard, |cell| {
                keyed.hot.stripe(cell, &keyed.params);
                Some(())
            })
            .is_some()
    })
}

/// Stripes `key`, which must be tracked.
fn stripe(limiter: &Limiter, key: u64) {
    assert!(try_stripe(limiter, key), "key {key} is tracked");
    assert!(limiter.is_striped(&key));
}

#[test]
fn sixteen_threads_on_a_striped_key_admit_exactly_its_permits() {
    for trial in 0..20 {
        let (limiter, _) = limiter("20000/1h");
        assert!(limiter.try_acquire(&7).is_allowed());
        stripe(&limiter, 7);
        let l = limiter.clone();
        let admitted = race(16, move || {
            let mut admitted = 0;
            while l.try_acquire(&7).is_allowed() {
                admitted += 1;
            }
            admitted
        });
        assert!(
            limiter.is_striped(&7),
            "trial {trial}: a frozen clock never goes quiet"
        );
        assert_eq!(admitted, 19_999, "trial {trial}");
        assert_eq!(limiter.peek(&7).remaining(), 0, "trial {trial}");
        assert_eq!(limiter.available(&7), 0, "trial {trial}");
        // Another key is untouched.
        assert_eq!(limiter.try_acquire(&8).remaining(), 19_999);
    }
}

#[test]
fn a_peek_counts_what_the_stripes_hold() {
    let (limiter, _) = limiter("1000/1h");
    assert!(limiter.try_acquire(&1).is_allowed());
    stripe(&limiter, 1);
    for spent in 2..=10 {
        let decision = limiter.try_acquire(&1);
        assert!(decision.is_allowed());
        // The stripe leased more than it used: a peek still counts it as available.
        assert_eq!(
            limiter.peek(&1).remaining(),
            1000 - spent - 1,
            "after {spent}"
        );
        assert_eq!(limiter.available(&1), 1000 - spent, "after {spent}");
    }
}

#[test]
fn a_refund_under_a_stripes_lease_gives_back_nothing_twice() {
    let (limiter, clock) = limiter("1000000/1s");
    assert!(limiter.try_acquire(&1).is_allowed());
    stripe(&limiter, 1);
    let reservation = limiter.reserve_n(&1, 500_000).unwrap();
    assert!(limiter.try_acquire(&1).is_allowed()); // this thread's stripe leases above it
    limiter.cancel(&1, reservation).unwrap();
    clock.advance(Duration::from_micros(10));
    let mut admitted = 0u64;
    while limiter.try_acquire(&1).is_allowed() {
        admitted += 1;
    }
    assert!(
        admitted <= 1_000_000,
        "{admitted} admitted, burst 1,000,000"
    );
    // The refund stops at the run the stripe leased above the reservation: what was never
    // reserved is all still there.
    assert!(admitted >= 499_998, "{admitted}");
}

#[test]
fn a_key_judged_quiet_returns_to_one_word() {
    let (limiter, clock) = limiter("1000000/1s");
    assert!(limiter.try_acquire(&1).is_allowed());
    stripe(&limiter, 1);
    // One thread alone takes leases for more than a millisecond.
    for _ in 0..3 {
        clock.advance(Duration::from_micros(600));
        for _ in 0..1000 {
            assert!(limiter.try_acquire(&1).is_allowed());
        }
    }
    assert!(
        !limiter.is_striped(&1),
        "one thread for over a millisecond: quiet"
    );
    clock.advance(Duration::from_secs(2));
    assert_eq!(limiter.available(&1), 1_000_000, "nothing lost");
}

#[test]
fn a_reset_forgets_the_stripes_and_the_key_starts_afresh() {
    let (limiter, _) = limiter("100/1h");
    assert!(limiter.try_acquire(&1).is_allowed());
    stripe(&limiter, 1);
    for _ in 0..10 {
        assert!(limiter.try_acquire(&1).is_allowed());
    }
    assert!(limiter.reset(&1));
    // The key's next state (in the place its old one had, or another) is not striped, and
    // admits its policy's permits, none of the old stripes' runs besides.
    let mut admitted = 0;
    while limiter.try_acquire(&1).is_allowed() {
        admitted += 1;
    }
    assert_eq!(admitted, 100);
    assert!(!limiter.is_striped(&1));
}

#[test]
fn eviction_forgets_the_stripes_of_a_key_at_rest() {
    let (limiter, clock) = limiter("100/1s");
    assert!(limiter.try_acquire(&1).is_allowed());
    stripe(&limiter, 1);
    assert!(limiter.try_acquire(&1).is_allowed());
    clock.advance(Duration::from_secs(1));
    assert_eq!(limiter.evict_idle(), 1);
    for key in 2..50 {
        let _ = limiter.try_acquire(&key);
        assert!(
            !limiter.is_striped(&key),
            "key {key} has no stripes of its own"
        );
    }
}

#[test]
fn a_policy_change_carries_what_the_stripes_held_as_spent() {
    let (limiter, _) = limiter("1000/1h");
    assert!(limiter.try_acquire(&1).is_allowed());
    stripe(&limiter, 1);
    for _ in 0..99 {
        assert!(limiter.try_acquire(&1).is_allowed());
    }
    limiter.set_policy("1000/1h".parse().unwrap());
    let mut admitted = 100;
    while limiter.try_acquire(&1).is_allowed() {
        admitted += 1;
    }
    // What the stripe held unused was handed out by the old state: spent, never twice.
    assert!(admitted <= 1000, "{admitted}");
    assert!(
        admitted >= 1000 - 64,
        "at most one lease per stripe lost: {admitted}"
    );
}

/// Threads stripe a key as fast as they can while another resets it over and over: an
/// installation racing the removal of the state it is for never leaves stripes behind (a new
/// state in the same place would decide on them), and the filter marks the striped keys'
/// spots and nothing else.
#[test]
fn resets_racing_striping_leave_no_stripes_behind() {
    for trial in 0..20 {
        let (limiter, _) = limiter("1000/1h");
        let roles = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let l = limiter.clone();
        race(3, move || {
            let resets = roles.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0;
            for _ in 0..2_000 {
                if resets {
                    l.reset(&1);
                } else {
                    let _ = l.try_acquire(&1);
                    try_stripe(&l, 1);
                }
            }
            0
        });
        limiter.reset(&1);
        let (striped, marked) = with_table(&limiter, |keyed, _| keyed.hot.census());
        assert_eq!(
            striped, 0,
            "trial {trial}: stripes left for a removed state"
        );
        assert!(marked, "trial {trial}: the filter marks what is striped");
        let mut admitted = 0;
        while limiter.try_acquire(&1).is_allowed() {
            admitted += 1;
        }
        assert_eq!(admitted, 1000, "trial {trial}");
    }
}
