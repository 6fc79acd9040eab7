//! The reference traces of docs/ALGORITHMS.md, replayed exactly through the public API.

use std::time::Duration;

use tollgate::{DirectLimiter, FakeClock, Policy, RateLimiter};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn keyed(policy: &str) -> (RateLimiter<String, FakeClock>, FakeClock) {
    let clock = FakeClock::new();
    let policy: Policy = policy.parse().unwrap();
    (RateLimiter::with_clock(policy, clock.clone()), clock)
}

#[track_caller]
fn allowed(d: tollgate::Decision, remaining: u64) {
    assert!(d.is_allowed(), "expected allowed, got {d:?}");
    assert_eq!(d.remaining(), remaining, "{d:?}");
    assert_eq!(d.retry_after(), Duration::ZERO, "{d:?}");
}

#[track_caller]
fn denied(d: tollgate::Decision, retry_after: Duration) {
    assert!(!d.is_allowed(), "expected denied, got {d:?}");
    assert_eq!(d.retry_after(), retry_after, "{d:?}");
}

#[test]
fn token_bucket_trace() {
    let (limiter, clock) = keyed("5/1s");
    for remaining in [4, 3, 2, 1, 0] {
        allowed(limiter.try_acquire("alice"), remaining);
    }
    denied(limiter.try_acquire("alice"), ms(200)); // #6
    clock.set(ms(100));
    denied(limiter.try_acquire("alice"), ms(100)); // #7
    clock.set(ms(300));
    allowed(limiter.try_acquire("alice"), 0); // #8
    denied(limiter.try_acquire("alice"), ms(100)); // #9
    allowed(limiter.try_acquire("bob"), 4);
    clock.set(ms(1300));
    allowed(limiter.try_acquire("alice"), 4); // #10
    assert_eq!(limiter.evict_idle(), 1, "bob is at rest, alice is not");
    assert_eq!(limiter.len(), 1);
    clock.set(ms(1500));
    assert_eq!(limiter.evict_idle(), 1, "alice is at rest");
    assert_eq!(limiter.len(), 0);
}

#[test]
fn token_bucket_trace_reports_limit_and_reset() {
    let (limiter, clock) = keyed("5/1s");
    let first = limiter.try_acquire("alice");
    assert_eq!(first.limit(), 5);
    assert_eq!(first.reset_after(), ms(200));
    for _ in 0..4 {
        let _ = limiter.try_acquire("alice");
    }
    let refused = limiter.try_acquire("alice");
    assert_eq!(refused.reset_after(), ms(1000));
    assert_eq!(refused.remaining(), 0);
    clock.set(ms(100));
    assert_eq!(limiter.try_acquire("alice").reset_after(), ms(900));
}

#[test]
fn token_bucket_trace_direct() {
    let clock = FakeClock::new();
    let limiter = DirectLimiter::with_clock("5/1s".parse().unwrap(), clock.clone());
    for remaining in [4, 3, 2, 1, 0] {
        allowed(limiter.try_acquire(), remaining);
    }
    denied(limiter.try_acquire(), ms(200));
    clock.set(ms(100));
    denied(limiter.try_acquire(), ms(100));
    clock.set(ms(300));
    allowed(limiter.try_acquire(), 0);
    denied(limiter.try_acquire(), ms(100));
    clock.set(ms(1300));
    allowed(limiter.try_acquire(), 4);
    assert!(!limiter.is_at_rest());
    clock.set(ms(1500));
    assert!(limiter.is_at_rest());
}

#[test]
fn sliding_log_trace() {
    let (limiter, clock) = keyed("sliding-log 3/s");
    for (t, remaining) in [(0, 2), (400, 1), (800, 0)] {
        clock.set(ms(t));
        allowed(limiter.try_acquire("alice"), remaining);
    }
    clock.set(ms(900));
    denied(limiter.try_acquire("alice"), ms(100));
    clock.set(ms(1000));
    allowed(limiter.try_acquire("alice"), 0);
    clock.set(ms(1050));
    denied(limiter.try_acquire("alice"), ms(350));
}

#[test]
fn sliding_log_trace_direct() {
    let clock = FakeClock::new();
    let limiter = DirectLimiter::with_clock("sliding-log 3/s".parse().unwrap(), clock.clone());
    for (t, remaining) in [(0, 2), (400, 1), (800, 0)] {
        clock.set(ms(t));
        allowed(limiter.try_acquire(), remaining);
    }
    clock.set(ms(900));
    denied(limiter.try_acquire(), ms(100));
    clock.set(ms(1000));
    allowed(limiter.try_acquire(), 0);
    clock.set(ms(1050));
    denied(limiter.try_acquire(), ms(350));
}

#[test]
fn sliding_counter_trace() {
    let (limiter, clock) = keyed("sliding-counter 10/min");
    clock.set(Duration::from_secs(50));
    for _ in 0..8 {
        assert!(limiter.try_acquire("alice").is_allowed());
    }
    clock.set(Duration::from_secs(69));
    for remaining in [3, 2, 1, 0] {
        allowed(limiter.try_acquire("alice"), remaining);
    }
    let refused = limiter.try_acquire("alice");
    assert!(!refused.is_allowed());
    // The exact answer is 6 s plus 1 ns; the trace states it rounded to whole ms.
    assert_eq!(refused.retry_after().as_millis(), 6_000, "{refused:?}");
    assert!(
        refused.retry_after() > Duration::from_secs(6),
        "{refused:?}"
    );
    clock.set(Duration::from_millis(75_001));
    allowed(limiter.try_acquire("alice"), 0);
}

#[test]
fn sliding_counter_trace_direct() {
    let clock = FakeClock::new();
    let limiter =
        DirectLimiter::with_clock("sliding-counter 10/min".parse().unwrap(), clock.clone());
    clock.set(Duration::from_secs(50));
    for _ in 0..8 {
        assert!(limiter.try_acquire().is_allowed());
    }
    clock.set(Duration::from_secs(69));
    for remaining in [3, 2, 1, 0] {
        allowed(limiter.try_acquire(), remaining);
    }
    let refused = limiter.try_acquire();
    assert_eq!(refused.retry_after().as_millis(), 6_000, "{refused:?}");
    clock.set(Duration::from_millis(75_001));
    allowed(limiter.try_acquire(), 0);
}

#[test]
fn str_lookups_find_string_keys() {
    let (limiter, _clock) = keyed("2/1s");
    let owned = String::from("alice");
    allowed(limiter.try_acquire(owned.as_str()), 1);
    allowed(limiter.try_acquire("alice"), 0);
    assert_eq!(limiter.len(), 1);
}
