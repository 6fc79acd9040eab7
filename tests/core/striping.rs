//! A hot key spread over stripes (`DirectLimiter::striping`, `RateLimiter::striping`): exact
//! under racing threads, striped by their contention or not, on a frozen clock and on a
//! moving one. Each test runs on the direct limiter and on one key of the keyed limiter.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tollgate::{Clock, Decision, DirectLimiter, FakeClock, RateLimiter};

use crate::support::race;

/// One hot key: the direct limiter's, or key 7 of a keyed limiter.
trait HotKey: Send + Sync + 'static {
    fn with_clock(policy: &str, clock: FakeClock) -> Self;
    fn try_acquire(&self) -> Decision;
    fn try_acquire_n(&self, n: u64) -> Decision;
    fn available(&self) -> u64;
    fn set_policy(&self, policy: &str);
    fn is_striped(&self) -> bool;
}

impl HotKey for DirectLimiter<FakeClock> {
    fn with_clock(policy: &str, clock: FakeClock) -> Self {
        DirectLimiter::with_clock(policy.parse().unwrap(), clock)
    }
    fn try_acquire(&self) -> Decision {
        DirectLimiter::try_acquire(self)
    }
    fn try_acquire_n(&self, n: u64) -> Decision {
        DirectLimiter::try_acquire_n(self, n).unwrap()
    }
    fn available(&self) -> u64 {
        DirectLimiter::available(self)
    }
    fn set_policy(&self, policy: &str) {
        DirectLimiter::set_policy(self, policy.parse().unwrap());
    }
    fn is_striped(&self) -> bool {
        DirectLimiter::is_striped(self)
    }
}

/// The key the keyed limiter's tests hammer.
const KEY: u64 = 7;

impl HotKey for RateLimiter<u64, FakeClock> {
    fn with_clock(policy: &str, clock: FakeClock) -> Self {
        RateLimiter::with_clock(policy.parse().unwrap(), clock)
    }
    fn try_acquire(&self) -> Decision {
        RateLimiter::try_acquire(self, &KEY)
    }
    fn try_acquire_n(&self, n: u64) -> Decision {
        RateLimiter::try_acquire_n(self, &KEY, n).unwrap()
    }
    fn available(&self) -> u64 {
        RateLimiter::available(self, &KEY)
    }
    fn set_policy(&self, policy: &str) {
        RateLimiter::set_policy(self, policy.parse().unwrap());
    }
    fn is_striped(&self) -> bool {
        RateLimiter::is_striped(self, &KEY)
    }
}

/// Runs a test on both limiters.
macro_rules! on_both {
    ($test:ident) => {
        mod $test {
            #[test]
            fn direct() {
                super::$test::<tollgate::DirectLimiter<tollgate::FakeClock>>();
            }
            #[test]
            fn keyed() {
                super::$test::<tollgate::RateLimiter<u64, tollgate::FakeClock>>();
            }
        }
    };
}

/// 16 threads hammer a key of 20,000 permits on a frozen clock until it refuses: exactly
/// 20,000 are admitted, with nothing left anywhere, whether or not the contention striped
/// the key (the unit tests of the direct limiter stripe it from the start).
fn a_contended_key_admits_exactly_its_permits_under_16_threads<L: HotKey>() {
    for trial in 0..10 {
        let limiter = Arc::new(L::with_clock("20000/1h", FakeClock::new()));
        let l = limiter.clone();
        let admitted = race(16, move |_| {
            let mut admitted = 0;
            while l.try_acquire().is_allowed() {
                admitted += 1;
            }
            admitted
        });
        assert_eq!(admitted, 20_000, "trial {trial}");
        assert_eq!(limiter.available(), 0, "trial {trial}");
        assert!(!limiter.try_acquire().is_allowed());
    }
}

/// Requests of cost 1 (on the stripes) race requests of cost 3 (on the key's word): the
/// permits spent never exceed the capacity, and the costs of 1 use up what is left.
fn costs_above_one_race_the_stripes_exactly<L: HotKey>() {
    for trial in 0..10 {
        let limiter = Arc::new(L::with_clock("30000/1h", FakeClock::new()));
        let l = limiter.clone();
        let spent = race(8, move |thread| {
            let cost = if thread % 2 == 0 { 1 } else { 3 };
            let mut spent = 0;
            let mut refused = 0;
            while refused < 100 {
                if l.try_acquire_n(cost).is_allowed() {
                    spent += cost;
                } else {
                    refused += 1;
                }
            }
            spent
        });
        assert_eq!(
            spent, 30_000,
            "trial {trial}: every permit used by the costs of 1"
        );
        assert_eq!(limiter.available(), 0);
    }
}

/// Threads race on a key while another moves the clock on: in every run the key admits no
/// more than the policy allows over the time that passed (the burst plus one permit per
/// interval), and the permits time gives back are used.
fn a_moving_clock_never_admits_more_than_the_policy<L: HotKey>() {
    for trial in 0..5 {
        let clock = FakeClock::new();
        // 1,000 permits, one back every millisecond.
        let limiter = Arc::new(L::with_clock("1000/1s", clock.clone()));
        let stop = Arc::new(AtomicBool::new(false));
        let admitted = Arc::new(AtomicU64::new(0));
        let attempts = Arc::new(AtomicU64::new(0));
        let (l, a, s, c, n) = (
            limiter.clone(),
            admitted.clone(),
            stop.clone(),
            clock.clone(),
            attempts.clone(),
        );
        // Thread 0 moves the clock, 50 ms in all, each step once the others have made a
        // hundred more attempts (so the test does not depend on how the threads are
        // scheduled); the others decide until it is done.
        race(9, move |thread| {
            if thread == 0 {
                for _ in 0..200 {
                    let seen = n.load(Ordering::Relaxed);
                    while n.load(Ordering::Relaxed) < seen + 100 {
                        std::thread::yield_now();
                    }
                    c.advance(Duration::from_micros(250));
                }
                s.store(true, Ordering::Relaxed);
                return 0;
            }
            while !s.load(Ordering::Relaxed) {
                n.fetch_add(1, Ordering::Relaxed);
                if l.try_acquire().is_allowed() {
                    a.fetch_add(1, Ordering::Relaxed);
                }
            }
            0
        });
        let elapsed = clock.now(); // 50 ms
        let bound = 1_000 + elapsed / 1_000_000;
        let admitted = admitted.load(Ordering::Relaxed);
        assert!(
            admitted <= bound,
            "trial {trial}: {admitted} admitted, at most {bound}"
        );
        // Under-admission: the permit time gave back last (the threads stop with it), and at
        // most one lease per stripe (one permit each at this rate, at most 64 stripes).
        assert!(
            admitted + 65 >= bound,
            "trial {trial}: {admitted} admitted of {bound}"
        );
    }
}

/// A policy change while the key is striped: what the stripes held was handed out by the old
/// state, so it is carried as spent, and the key never admits more than its permits over both
/// policies (at most one permit per stripe is lost to the change at this rate).
fn a_policy_change_carries_what_the_stripes_held_as_spent<L: HotKey>() {
    for trial in 0..5 {
        let limiter = Arc::new(L::with_clock("20000/1h", FakeClock::new()));
        let admitted = Arc::new(AtomicU64::new(0));
        let (l, a) = (limiter.clone(), admitted.clone());
        race(16, move |_| {
            while a.load(Ordering::Relaxed) < 10_000 {
                if l.try_acquire().is_allowed() {
                    a.fetch_add(1, Ordering::Relaxed);
                }
            }
            0
        });
        // Another window, so that the keyed limiter builds a new generation too.
        limiter.set_policy("20000/2h");
        let before = admitted.load(Ordering::Relaxed);
        let mut after = 0;
        while limiter.try_acquire().is_allowed() {
            after += 1;
        }
        assert!(
            before + after <= 20_000,
            "trial {trial}: {before} + {after}"
        );
        assert!(
            before + after + 64 >= 20_000,
            "trial {trial}: {before} + {after}"
        );
        assert!(
            !limiter.is_striped(),
            "trial {trial}: a new policy starts on one word"
        );
    }
}

on_both!(a_contended_key_admits_exactly_its_permits_under_16_threads);
on_both!(costs_above_one_race_the_stripes_exactly);
on_both!(a_moving_clock_never_admits_more_than_the_policy);
on_both!(a_policy_change_carries_what_the_stripes_held_as_spent);
