//! `reserve_guarded`: a reservation that is cancelled when its guard is dropped unsettled
//! (an early return, a panic), and settled like any other when asked.

use std::panic::{self, AssertUnwindSafe};
use std::time::Duration;

use tollgate::{DirectLimiter, FakeClock, RateLimiter, SettleError};

/// One policy of each algorithm, and a composite.
const POLICIES: [&str; 4] = [
    "token-bucket 10/1s",
    "sliding-log 10/1s",
    "sliding-counter 10/1s",
    "10/1s & sliding-log 20/1min",
];

fn keyed(policy: &str) -> RateLimiter<String, FakeClock> {
    RateLimiter::with_clock(policy.parse().unwrap(), FakeClock::new())
}

fn direct(policy: &str) -> DirectLimiter<FakeClock> {
    DirectLimiter::with_clock(policy.parse().unwrap(), FakeClock::new())
}

#[test]
fn a_guard_dropped_unsettled_gives_every_permit_back() {
    for policy in POLICIES {
        let limiter = keyed(policy);
        assert!(limiter.try_acquire_n("k", 2).unwrap().is_allowed());
        {
            let guard = limiter.reserve_guarded("k", 6).unwrap();
            assert!(guard.decision().is_allowed(), "{policy}");
            assert_eq!(guard.held(), 6);
            assert_eq!(limiter.available("k"), 2, "{policy}: the permits are held");
        }
        assert_eq!(limiter.available("k"), 8, "{policy}: the 6 came back");
        assert_eq!(
            limiter.available("other"),
            10,
            "{policy}: no other key touched"
        );

        let one = direct(policy);
        assert!(one.try_acquire_n(2).unwrap().is_allowed());
        drop(one.reserve_guarded(6).unwrap());
        assert_eq!(one.available(), 8, "{policy}");
    }
}

#[test]
fn a_settled_guard_is_consumed_and_cancels_nothing() {
    for policy in POLICIES {
        let limiter = keyed(policy);
        let guard = limiter.reserve_guarded("k", 6).unwrap();
        guard.settle(4).unwrap(); // 2 come back, 4 stay spent
        assert_eq!(limiter.available("k"), 6, "{policy}");

        // Above the reservation: the excess is charged, and stays charged.
        limiter.reserve_guarded("k", 2).unwrap().settle(5).unwrap();
        assert_eq!(limiter.available("k"), 1, "{policy}");

        let one = direct(policy);
        one.reserve_guarded(6).unwrap().settle(4).unwrap();
        assert_eq!(one.available(), 6, "{policy}");
    }
}

#[test]
fn a_guard_settles_as_the_plain_reservation_would() {
    for policy in POLICIES {
        for actual in [0, 3, 6, 9] {
            let guarded = keyed(policy);
            let plain = keyed(policy);
            guarded
                .reserve_guarded("k", 6)
                .unwrap()
                .settle(actual)
                .unwrap();
            let r = plain.reserve_n("k", 6).unwrap();
            plain.settle("k", r, actual).unwrap();
            assert_eq!(
                guarded.peek("k"),
                plain.peek("k"),
                "{policy}, settled at {actual}"
            );
        }
    }
}

#[test]
fn a_panic_between_reserve_and_settle_gives_the_permits_back() {
    for policy in POLICIES {
        let limiter = keyed(policy);
        let one = direct(policy);
        let unwound = panic::catch_unwind(AssertUnwindSafe(|| {
            let guard = limiter.reserve_guarded("k", 7).unwrap();
            let direct_guard = one.reserve_guarded(7).unwrap();
            assert_eq!(limiter.available("k"), 3);
            if guard.held() + direct_guard.held() > 0 {
                panic!("the request failed before its cost was known");
            }
            guard.settle(7).unwrap();
            direct_guard.settle(7).unwrap();
        }));
        assert!(unwound.is_err(), "{policy}: the closure panicked");
        assert_eq!(limiter.available("k"), 10, "{policy}");
        assert_eq!(one.available(), 10, "{policy}");
    }
}

#[test]
fn an_early_return_gives_the_permits_back() {
    fn request(limiter: &RateLimiter<String, FakeClock>, fail: bool) -> Result<(), String> {
        let guard = limiter
            .reserve_guarded("tenant", 4)
            .map_err(|e| e.to_string())?;
        if fail {
            return Err("upstream error".into());
        }
        guard.settle(1).map_err(|e| e.to_string())
    }
    let limiter = keyed("10/1min");
    assert!(request(&limiter, true).is_err());
    assert_eq!(limiter.available("tenant"), 10);
    request(&limiter, false).unwrap();
    assert_eq!(limiter.available("tenant"), 9);
}

#[test]
fn a_guard_over_a_reset_key_does_what_cancel_does() {
    for policy in POLICIES {
        let (guarded, plain) = (keyed(policy), keyed(policy));
        let guard = guarded.reserve_guarded("k", 6).unwrap();
        let r = plain.reserve_n("k", 6).unwrap();
        for limiter in [&guarded, &plain] {
            assert!(limiter.reset("k"));
            assert!(limiter.try_acquire_n("k", 3).unwrap().is_allowed());
        }
        drop(guard);
        plain.cancel("k", r).unwrap();
        // The fresh state never held the reservation's permits: nothing comes back to it.
        assert_eq!(guarded.peek("k"), plain.peek("k"), "{policy}");
        assert_eq!(guarded.available("k"), 7, "{policy}");
    }
}

#[test]
fn a_guard_over_a_changed_direct_policy_does_what_cancel_does() {
    let (guarded, plain) = (direct("10/1s"), direct("10/1s"));
    let guard = guarded.reserve_guarded(6).unwrap();
    let r = plain.reserve_n(6).unwrap();
    for limiter in [&guarded, &plain] {
        limiter.set_policy("20/2s".parse().unwrap());
    }
    drop(guard);
    plain.cancel(r).unwrap();
    assert_eq!(guarded.peek(), plain.peek());
}

#[test]
fn a_refused_guard_holds_nothing_and_its_drop_changes_nothing() {
    let limiter = keyed("10/1min");
    let _held = limiter.reserve_guarded("k", 8).unwrap();
    let refused = limiter.reserve_guarded("k", 8).unwrap();
    assert!(!refused.decision().is_allowed());
    assert_eq!(refused.held(), 0);
    drop(refused);
    assert_eq!(limiter.available("k"), 2);
    let refused = limiter.reserve_guarded("k", 8).unwrap();
    assert_eq!(refused.settle(8), Err(SettleError::Refused));
    assert_eq!(limiter.available("k"), 2);
}

#[test]
fn into_reservation_hands_back_a_plain_reservation_that_keeps_its_permits() {
    let clock = FakeClock::new();
    let limiter: RateLimiter<String, FakeClock> =
        RateLimiter::with_clock("10/1min".parse().unwrap(), clock.clone());
    let r = limiter.reserve_guarded("k", 5).unwrap().into_reservation();
    assert_eq!(limiter.available("k"), 5);
    drop(r);
    assert_eq!(limiter.available("k"), 5);
    clock.advance(Duration::from_secs(60));
    assert_eq!(limiter.available("k"), 10);
}

#[test]
fn a_cost_error_makes_no_guard_and_changes_nothing() {
    let limiter = keyed("10/1min");
    assert!(limiter.reserve_guarded("k", 0).is_err());
    assert!(limiter.reserve_guarded("k", 11).is_err());
    assert_eq!(limiter.len(), 0);
    assert!(direct("10/1min").reserve_guarded(0).is_err());
}

/// A key whose hashing panics once `BROKEN` is set: the same fault hitting the guard's
/// cancel while a panic already unwinds.
#[derive(Clone, PartialEq, Eq)]
struct Fragile(u64);

static BROKEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl std::hash::Hash for Fragile {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        if BROKEN.load(std::sync::atomic::Ordering::SeqCst) {
            panic!("hashing a Fragile key");
        }
        self.0.hash(state);
    }
}

#[test]
fn a_guard_dropped_while_unwinding_survives_a_panic_in_its_cancel() {
    let limiter: RateLimiter<Fragile, FakeClock> =
        RateLimiter::with_clock("10/1s".parse().unwrap(), FakeClock::new());
    let key = Fragile(1);
    // Without the guard catching it, the second panic (in the cancel, during the unwind of
    // the first) would abort the whole test process.
    let unwound = panic::catch_unwind(AssertUnwindSafe(|| {
        let _guard = limiter.reserve_guarded(&key, 6).unwrap();
        BROKEN.store(true, std::sync::atomic::Ordering::SeqCst);
        panic!("the request failed");
    }));
    BROKEN.store(false, std::sync::atomic::Ordering::SeqCst);
    assert!(unwound.is_err());
    // The cancel could not run: the reservation keeps its permits, as a plain one would.
    assert_eq!(limiter.available(&key), 4);
}
