//! The direct limiter striped from the start (as contention would stripe it), so that these
//! tests do not depend on the scheduler making threads collide: exactness under racing
//! threads on a frozen clock, and refunds under a stripe's lease.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::{DirectLimiter, STRIPED};
use crate::clock::FakeClock;
use crate::race::race;

/// A limiter under `policy` on a frozen clock whose requests of cost 1 go to its stripes.
fn striped(policy: &str) -> (Arc<DirectLimiter<FakeClock>>, FakeClock) {
    let clock = FakeClock::new();
    let limiter = DirectLimiter::with_clock(policy.parse().unwrap(), clock.clone());
    limiter.mode.store(STRIPED, Ordering::Relaxed);
    (Arc::new(limiter), clock)
}

#[test]
fn sixteen_threads_on_a_striped_key_admit_exactly_its_permits() {
    for trial in 0..20 {
        let (limiter, _) = striped("20000/1h");
        let l = limiter.clone();
        let admitted = race(16, move || {
            let mut admitted = 0;
            while l.try_acquire().is_allowed() {
                admitted += 1;
            }
            admitted
        });
        assert!(
            limiter.is_striped(),
            "trial {trial}: a frozen clock never goes quiet"
        );
        assert_eq!(admitted, 20_000, "trial {trial}");
        assert_eq!(limiter.available(), 0, "trial {trial}");
    }
}

#[test]
fn a_refund_under_a_stripes_lease_gives_back_nothing_twice() {
    let (limiter, clock) = striped("1000000/1s");
    let reservation = limiter.reserve_n(500_000).unwrap();
    assert!(limiter.try_acquire().is_allowed()); // this thread's stripe leases above it
    limiter.cancel(reservation).unwrap();
    clock.advance(Duration::from_micros(10));
    assert!(limiter.available() <= 1_000_000, "{}", limiter.available());
    let mut admitted = 0u64;
    while limiter.try_acquire().is_allowed() {
        admitted += 1;
    }
    assert!(
        admitted <= 1_000_000,
        "{admitted} admitted, burst 1,000,000"
    );
}

#[test]
fn a_key_judged_quiet_returns_to_one_word() {
    let (limiter, clock) = striped("1000000/1s");
    assert!(limiter.try_acquire().is_allowed());
    let held = limiter.available();
    // One thread alone takes leases for more than a millisecond.
    for _ in 0..3 {
        clock.advance(Duration::from_micros(600));
        while limiter.is_striped() && limiter.try_acquire().is_allowed() {
            if limiter.available() < held / 2 {
                break;
            }
        }
    }
    assert!(
        !limiter.is_striped(),
        "one thread for over a millisecond: quiet"
    );
    // Back on one word, nothing lost.
    clock.advance(Duration::from_secs(2));
    assert!(limiter.is_at_rest());
    assert_eq!(limiter.available(), 1_000_000);
}
