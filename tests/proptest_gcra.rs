//! The GCRA token bucket against a plain reference model: a lock around an "allowance"
//! counter, the textbook token bucket written in another form. On random sequences of
//! (advance time, cost) both must give identical decisions, to the nanosecond.

use std::sync::Mutex;
use std::time::Duration;

use proptest::prelude::*;
use tollgate::{Algorithm, DirectLimiter, FakeClock, Policy, RateLimiter};

/// Token bucket measured in nanoseconds of allowance: it refills one ns per ns up to the
/// burst `permits * interval`, and a permit costs `interval` ns, where `interval` is
/// window / permits rounded up (the crate's documented rounding).
struct Model {
    interval: u128,
    burst: u128,
    state: Mutex<(u128, u64)>, // (allowance, time of last update)
}

#[derive(Debug, PartialEq)]
struct Expected {
    allowed: bool,
    remaining: u64,
    retry_after: Duration,
    reset_after: Duration,
}

impl Model {
    fn new(permits: u64, window: Duration) -> Self {
        let window = window.as_nanos();
        let interval = window.div_ceil(u128::from(permits));
        let burst = interval * u128::from(permits);
        Model {
            interval,
            burst,
            state: Mutex::new((burst, 0)),
        }
    }

    fn acquire(&self, now: u64, cost: u64) -> Expected {
        let mut state = self.state.lock().unwrap();
        let (allowance, last) = *state;
        let allowance = (allowance + u128::from(now - last)).min(self.burst);
        let price = u128::from(cost) * self.interval;
        let nanos = |n: u128| Duration::from_nanos(n as u64);
        if allowance >= price {
            let left = allowance - price;
            *state = (left, now);
            Expected {
                allowed: true,
                remaining: (left / self.interval) as u64,
                retry_after: Duration::ZERO,
                reset_after: nanos(self.burst - left),
            }
        } else {
            *state = (allowance, now);
            Expected {
                allowed: false,
                remaining: (allowance / self.interval) as u64,
                retry_after: nanos(price - allowance),
                reset_after: nanos(self.burst - allowance),
            }
        }
    }
}

fn observed(d: tollgate::Decision) -> Expected {
    Expected {
        allowed: d.is_allowed(),
        remaining: d.remaining(),
        retry_after: d.retry_after(),
        reset_after: d.reset_after(),
    }
}

fn scenario() -> impl Strategy<Value = (u64, u64, Vec<(u64, u64)>)> {
    (1u64..=20, 1u64..=3_000_000_000).prop_flat_map(|(permits, window)| {
        let window = window.max(permits);
        let step = (0u64..=window * 2, 1u64..=permits);
        (
            Just(permits),
            Just(window),
            prop::collection::vec(step, 1..200),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn direct_matches_the_model((permits, window, steps) in scenario()) {
        let window = Duration::from_nanos(window);
        let clock = FakeClock::new();
        let policy = Policy::new(Algorithm::TokenBucket, permits, window).unwrap();
        let limiter = DirectLimiter::with_clock(policy, clock.clone());
        let model = Model::new(permits, window);
        let mut now = 0u64;
        for (i, (advance, cost)) in steps.into_iter().enumerate() {
            // Most steps are small so that bursts and refusals both happen.
            let advance = if i % 3 == 0 { advance } else { advance / 64 };
            now += advance;
            clock.set(Duration::from_nanos(now));
            let got = observed(limiter.try_acquire_n(cost).unwrap());
            prop_assert_eq!(got, model.acquire(now, cost), "step {} at {} ns, cost {}", i, now, cost);
        }
    }

    #[test]
    fn keyed_matches_one_model_per_key((permits, window, steps) in scenario()) {
        let window = Duration::from_nanos(window);
        let clock = FakeClock::new();
        let policy = Policy::new(Algorithm::TokenBucket, permits, window).unwrap();
        let limiter: RateLimiter<u64, FakeClock> = RateLimiter::with_clock(policy, clock.clone());
        let models = [Model::new(permits, window), Model::new(permits, window)];
        let mut now = 0u64;
        for (i, (advance, cost)) in steps.into_iter().enumerate() {
            now += advance / 32;
            clock.set(Duration::from_nanos(now));
            let key = (advance % 2) as usize;
            if advance % 7 == 0 {
                // Eviction removes only at-rest states, so it never changes a decision.
                let _ = limiter.evict_idle();
            }
            let got = observed(limiter.try_acquire_n(&(key as u64), cost).unwrap());
            prop_assert_eq!(got, models[key].acquire(now, cost), "step {} key {}", i, key);
        }
    }
}
