//! `available`: the permits a key has now, the largest cost `try_acquire_n` admits at this
//! instant, against `peek().remaining()`, what one more request would leave.

use std::time::Duration;

use tollgate::{CostError, Decision, DirectLimiter, FakeClock, Policy, RateLimiter};

/// Each algorithm, a token bucket whose emission interval is not a whole number of
/// nanoseconds, and a composite.
const POLICIES: [&str; 6] = [
    "token-bucket 10/1s",
    "token-bucket 3/1s",
    "sliding-log 5/1s",
    "sliding-counter 7/1s",
    "sliding-counter 10/1s",
    "4/1s & sliding-log 6/2s & sliding-counter 9/3s",
];

/// One limiter seen through the operations the test needs, keyed or direct.
trait Probe {
    fn available(&self) -> u64;
    fn peek(&self) -> Decision;
    fn try_acquire_n(&self, n: u64) -> Result<Decision, CostError>;
}

struct Keyed(RateLimiter<String, FakeClock>);
struct Direct(DirectLimiter<FakeClock>);

impl Probe for Keyed {
    fn available(&self) -> u64 {
        self.0.available("k")
    }
    fn peek(&self) -> Decision {
        self.0.peek("k")
    }
    fn try_acquire_n(&self, n: u64) -> Result<Decision, CostError> {
        self.0.try_acquire_n("k", n)
    }
}

impl Probe for Direct {
    fn available(&self) -> u64 {
        self.0.available()
    }
    fn peek(&self) -> Decision {
        self.0.peek()
    }
    fn try_acquire_n(&self, n: u64) -> Result<Decision, CostError> {
        self.0.try_acquire_n(n)
    }
}

fn both(policy: &str, clock: &FakeClock) -> [Box<dyn Probe>; 2] {
    let policy: Policy = policy.parse().unwrap();
    [
        Box::new(Keyed(RateLimiter::with_clock(policy, clock.clone()))),
        Box::new(Direct(DirectLimiter::with_clock(policy, clock.clone()))),
    ]
}

/// At every step of a schedule that spends part of what is there and lets time refill the
/// rest: `available` is one more than `peek().remaining()` while anything is left and 0 with
/// a refused peek otherwise; a cost of `available + 1` is refused (and changes nothing), and
/// spending `h` of it leaves exactly `available - h`.
#[test]
fn available_is_the_largest_cost_admitted_now() {
    for policy in POLICIES {
        let clock = FakeClock::new();
        for (kind, limiter) in ["keyed", "direct"].iter().zip(both(policy, &clock)) {
            clock.set(Duration::ZERO);
            // Steps that met the state with room, and empty: the schedule must meet both.
            let (mut with_room, mut empty) = (0, 0);
            for step in 0..120u64 {
                let at = format!("{policy}, {kind}, step {step}");
                let available = limiter.available();
                let peek = limiter.peek();
                if available > 0 {
                    with_room += 1;
                    assert!(peek.is_allowed(), "{at}");
                    assert_eq!(peek.remaining(), available - 1, "{at}");
                } else {
                    empty += 1;
                    assert!(!peek.is_allowed(), "{at}");
                    assert_eq!(peek.remaining(), 0, "{at}");
                }
                match limiter.try_acquire_n(available + 1) {
                    Ok(more) => {
                        assert!(!more.is_allowed(), "{at}: {} admitted", available + 1);
                        // A refusal's remaining is already what is available.
                        assert_eq!(more.remaining(), available, "{at}");
                    }
                    Err(CostError::ExceedsLimit { .. }) => {}
                    Err(other) => panic!("{at}: {other}"),
                }
                assert_eq!(limiter.available(), available, "{at}: a refusal changed it");
                // Spend all of it every tenth step, up to 2 otherwise.
                let spend = if step % 10 == 0 {
                    available
                } else {
                    (step % 3).min(available)
                };
                if spend > 0 {
                    assert!(limiter.try_acquire_n(spend).unwrap().is_allowed(), "{at}");
                }
                assert_eq!(
                    limiter.available(),
                    available - spend,
                    "{at}: spent {spend}"
                );
                clock.advance(Duration::from_millis(37));
            }
            println!("{policy}, {kind}: {with_room} steps with room, {empty} empty");
            assert!(
                with_room > 5 && empty > 5,
                "{policy}, {kind}: {with_room} steps with room, {empty} empty"
            );
        }
    }
}

#[test]
fn after_a_cost_n_available_is_what_is_left_and_remaining_one_less() {
    let clock = FakeClock::new();
    let limiter: RateLimiter<String, FakeClock> =
        RateLimiter::with_clock("10/1s".parse().unwrap(), clock.clone());
    assert_eq!(limiter.available("alice"), 10);
    let d = limiter.try_acquire_n("alice", 4).unwrap();
    // The admission's remaining is what is left after it; so is `available` now.
    assert_eq!(d.remaining(), 6);
    assert_eq!(limiter.available("alice"), 6);
    assert_eq!(limiter.peek("alice").remaining(), 5);

    let direct = DirectLimiter::with_clock("10/1s".parse().unwrap(), clock.clone());
    assert_eq!(direct.try_acquire_n(4).unwrap().remaining(), 6);
    assert_eq!(direct.available(), 6);
    assert_eq!(direct.peek().remaining(), 5);
}

#[test]
fn a_refused_cost_leaves_available_as_it_was_and_reports_it() {
    let limiter: RateLimiter<String, FakeClock> =
        RateLimiter::with_clock("5/1min".parse().unwrap(), FakeClock::new());
    assert!(limiter.try_acquire_n("bob", 3).unwrap().is_allowed());
    let refused = limiter.try_acquire_n("bob", 3).unwrap();
    assert!(!refused.is_allowed());
    assert_eq!(refused.remaining(), 2);
    assert_eq!(limiter.available("bob"), 2);
    assert!(limiter.try_acquire_n("bob", 2).unwrap().is_allowed());
    assert_eq!(limiter.available("bob"), 0);
    let peek = limiter.peek("bob");
    assert!(!peek.is_allowed());
    assert_eq!(peek.remaining(), 0);
}

#[test]
fn available_creates_no_state() {
    let limiter: RateLimiter<String, FakeClock> =
        RateLimiter::with_clock("5/1s".parse().unwrap(), FakeClock::new());
    assert_eq!(limiter.available("nobody"), 5);
    assert_eq!(limiter.len(), 0);
}

#[test]
fn shadow_mode_lets_requests_through_but_adds_no_permits() {
    let limiter: RateLimiter<String, FakeClock> =
        RateLimiter::with_clock("2/1min".parse().unwrap(), FakeClock::new()).shadow();
    assert!(limiter.try_acquire_n("k", 2).unwrap().is_allowed());
    assert!(
        limiter.try_acquire("k").is_allowed(),
        "shadow mode refuses nothing"
    );
    assert_eq!(limiter.available("k"), 0);
}

#[test]
fn an_overflowing_key_has_what_the_shared_state_has() {
    let limiter: RateLimiter<String, FakeClock> =
        RateLimiter::with_clock("3/1min".parse().unwrap(), FakeClock::new()).max_keys(1);
    assert!(limiter.try_acquire("tracked").is_allowed());
    assert_eq!(limiter.available("tracked"), 2);
    assert!(limiter.try_acquire_n("new-1", 2).unwrap().is_allowed());
    // Every untracked key shares the overflow state: 1 left there.
    assert_eq!(limiter.available("new-2"), 1);
    assert_eq!(limiter.available("tracked"), 2);
}
