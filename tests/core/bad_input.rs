//! Bad input: typed errors that name the field and the value, never a
//! panic, and nothing changed by a refused call.

use std::time::Duration;

use tollgate::{Algorithm, CostError, DirectLimiter, FakeClock, Policy, PolicyError, RateLimiter};

const ALGORITHMS: [Algorithm; 3] = [
    Algorithm::TokenBucket,
    Algorithm::SlidingLog,
    Algorithm::SlidingCounter,
];

#[test]
fn zero_permits() {
    for algorithm in ALGORITHMS {
        let err = Policy::new(algorithm, 0, Duration::from_secs(1)).unwrap_err();
        assert_eq!(err, PolicyError::ZeroPermits);
        assert_eq!(err.to_string(), "permits must be at least 1, got 0");
    }
}

#[test]
fn zero_window() {
    let err = Policy::new(Algorithm::TokenBucket, 5, Duration::ZERO).unwrap_err();
    assert_eq!(err, PolicyError::ZeroWindow);
    assert_eq!(err.to_string(), "window must be longer than zero, got 0ns");
}

#[test]
fn window_too_long_to_compute_in_u64_nanoseconds() {
    for window in [
        Duration::MAX,
        Duration::from_secs(u64::MAX / 1_000_000_000 + 1),
        Policy::MAX_WINDOW + Duration::from_nanos(1),
    ] {
        let err = Policy::new(Algorithm::TokenBucket, 1, window).unwrap_err();
        assert_eq!(err, PolicyError::WindowTooLong { window });
        assert!(
            err.to_string()
                .starts_with(&format!("window {window:?} is longer than")),
            "{err}"
        );
    }
    // The maximum itself is fine, with the most permits it allows.
    Policy::new(Algorithm::TokenBucket, 1 << 62, Policy::MAX_WINDOW).unwrap();
}

#[test]
fn interval_below_one_nanosecond() {
    let err = Policy::new(Algorithm::TokenBucket, 1_001, Duration::from_micros(1)).unwrap_err();
    assert_eq!(
        err,
        PolicyError::IntervalTooShort {
            permits: 1_001,
            window: Duration::from_micros(1)
        }
    );
    assert_eq!(
        err.to_string(),
        "permits 1001 per window 1µs is more than one permit per nanosecond"
    );
    // Exactly one permit per nanosecond is allowed.
    Policy::new(Algorithm::TokenBucket, 1_000, Duration::from_micros(1)).unwrap();
}

#[test]
fn sliding_log_permits_are_bounded() {
    let permits = Policy::MAX_LOG_PERMITS + 1;
    let err = Policy::new(Algorithm::SlidingLog, permits, Duration::from_secs(1)).unwrap_err();
    assert_eq!(
        err,
        PolicyError::TooManyPermits {
            algorithm: Algorithm::SlidingLog,
            permits,
            max: Policy::MAX_LOG_PERMITS
        }
    );
    assert_eq!(
        err.to_string(),
        "permits 65537 is above the maximum of 65536 for sliding-log"
    );
}

#[test]
fn unparsable_policies_name_the_part() {
    let cases: [(&str, &str, &str); 7] = [
        ("leaky-bucket 5/s", "algorithm", "leaky-bucket"),
        ("five/s", "algorithm", "five/s"),
        ("5 in 1s", "separator", "in"),
        ("5/1fortnight", "unit", "fortnight"),
        ("5/", "unit", ""),
        ("x5/s", "algorithm", "x5/s"),
        ("99999999999999999999/s", "permits", "99999999999999999999"),
    ];
    for (input, field, value) in cases {
        match input.parse::<Policy>() {
            Err(PolicyError::Syntax {
                input: i,
                field: f,
                value: v,
                ..
            }) => {
                assert_eq!(
                    (i.as_str(), f, v.as_str()),
                    (input, field, value),
                    "{input}"
                );
            }
            other => panic!("{input}: expected a syntax error, got {other:?}"),
        }
        let message = input.parse::<Policy>().unwrap_err().to_string();
        assert!(message.contains(field), "{message}");
        assert!(message.contains(&format!("`{input}`")), "{message}");
    }
    assert_eq!(
        "5 in 1s".parse::<Policy>().unwrap_err().to_string(),
        "policy `5 in 1s`: separator `in` is not valid, expected `/` or `per`"
    );
    assert_eq!(
        "5/".parse::<Policy>().unwrap_err().to_string(),
        "policy `5/`: unit is missing, expected a time unit: ns, us, ms, s, sec, m, min, h, hour, d or day"
    );
    assert_eq!(
        "0/s".parse::<Policy>().unwrap_err(),
        PolicyError::ZeroPermits
    );
    assert_eq!(
        "5/0ms".parse::<Policy>().unwrap_err(),
        PolicyError::ZeroWindow
    );
}

#[test]
fn bad_costs_are_refused_and_change_nothing() {
    for algorithm in ALGORITHMS {
        let policy = Policy::new(algorithm, 5, Duration::from_secs(1)).unwrap();
        let limiter: RateLimiter<String, FakeClock> =
            RateLimiter::with_clock(policy, FakeClock::new());
        assert_eq!(limiter.try_acquire_n("alice", 0), Err(CostError::Zero));
        assert_eq!(
            limiter.try_acquire_n("alice", 6),
            Err(CostError::ExceedsLimit { cost: 6, limit: 5 })
        );
        assert_eq!(
            limiter.len(),
            0,
            "{algorithm}: a refused cost creates no state"
        );
        assert_eq!(limiter.try_acquire("alice").remaining(), 4, "{algorithm}");

        let direct = DirectLimiter::with_clock(policy, FakeClock::new());
        assert_eq!(direct.try_acquire_n(0), Err(CostError::Zero));
        let err = direct.try_acquire_n(u64::MAX).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "cost {} is above the policy's limit of 5 permits, so it could never be admitted",
                u64::MAX
            )
        );
        assert!(
            direct.is_at_rest(),
            "{algorithm}: a refused cost changes nothing"
        );
        assert_eq!(direct.try_acquire_n(5).unwrap().remaining(), 0);
        assert_eq!(
            CostError::Zero.to_string(),
            "cost must be at least 1, got 0"
        );
    }
}

#[test]
fn a_clock_that_jumps_backwards_never_admits_extra_or_overstates_the_wait() {
    for algorithm in ALGORITHMS {
        let clock = FakeClock::new();
        let policy = Policy::new(algorithm, 5, Duration::from_secs(1)).unwrap();
        let limiter = DirectLimiter::with_clock(policy, clock.clone());
        clock.set(Duration::from_secs(100));
        let mut admitted = 0;
        for _ in 0..10 {
            admitted += u64::from(limiter.try_acquire().is_allowed());
        }
        assert_eq!(admitted, 5, "{algorithm}");
        // Back by a day: elapsed time counts as zero, nothing more is admitted, and no wait
        // is longer than the policy could ever need (two windows for the counter).
        clock.set(Duration::from_secs(100 - 86_400 / 1_000));
        for t in [0, 50, 99] {
            clock.set(Duration::from_secs(t));
            let d = limiter.try_acquire();
            assert!(!d.is_allowed(), "{algorithm} at {t}s: {d:?}");
            assert!(
                d.retry_after() <= Duration::from_secs(2),
                "{algorithm}: {d:?}"
            );
            assert!(
                d.reset_after() <= Duration::from_secs(2),
                "{algorithm}: {d:?}"
            );
        }
    }
}

#[test]
fn extreme_clock_readings_do_not_panic() {
    for algorithm in ALGORITHMS {
        let clock = FakeClock::new();
        let policy = Policy::new(algorithm, 3, Duration::from_secs(1)).unwrap();
        let limiter: RateLimiter<u64, FakeClock> = RateLimiter::with_clock(policy, clock.clone());
        clock.set(Duration::MAX);
        for _ in 0..5 {
            let _ = limiter.try_acquire(&1);
        }
        let _ = limiter.evict_idle();
        clock.set(Duration::ZERO);
        let d = limiter.try_acquire(&1);
        assert!(
            d.retry_after() <= Duration::from_secs(2),
            "{algorithm}: {d:?}"
        );
        clock.advance(Duration::MAX);
        clock.advance(Duration::MAX);
        let _ = limiter.try_acquire(&2);
    }
}

/// A clock at the end of its range (a `FakeClock` set to `Duration::MAX`, or a faulty clock of
/// one's own) never lets a limiter admit more than its policy: near `u64::MAX` nanoseconds a
/// state cannot store the time it runs ahead, and refuses rather than forget it.
#[test]
fn a_clock_at_the_end_of_its_range_never_admits_extra() {
    let policies = [
        "2/1s",
        "sliding-log 2/1s",
        "sliding-counter 2/1s",
        "2/1s & 3/1h",
    ];
    for reading in [
        u64::MAX,
        u64::MAX - 1,
        u64::MAX - 500_000_000,
        u64::MAX - 900_000_000,
        u64::MAX - 2_000_000_000,
    ] {
        for policy in policies {
            let clock = FakeClock::new();
            clock.set(Duration::from_nanos(reading));
            let policy: Policy = policy.parse().unwrap();
            let keyed: RateLimiter<u64, FakeClock> = RateLimiter::with_clock(policy, clock.clone());
            let direct = DirectLimiter::with_clock(policy, clock.clone());
            let admitted_keyed = (0..100)
                .filter(|_| keyed.try_acquire(&1).is_allowed())
                .count();
            let admitted_direct = (0..100)
                .filter(|_| direct.try_acquire().is_allowed())
                .count();
            assert!(
                admitted_keyed <= 2 && admitted_direct <= 2,
                "{policy} at {reading}: keyed {admitted_keyed}, direct {admitted_direct}"
            );
            // No longer than the policy could ever need (its longest window, twice).
            let longest = if policy.to_string().contains("/1h") {
                3600
            } else {
                1
            };
            for refused in [keyed.try_acquire(&1), direct.try_acquire()] {
                assert!(
                    !refused.is_allowed()
                        && refused.retry_after() <= Duration::from_secs(2 * longest),
                    "{policy} at {reading}: {refused:?}"
                );
            }
        }
    }
}
