//! The GCRA token bucket against a plain reference model: `models::GcraModel`, an
//! "allowance" counter, the textbook token bucket written in another form (shared with the
//! differential fuzz target). On random sequences of (advance time, cost) both must give
//! identical decisions, to the nanosecond.

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use tollgate::{Algorithm, DirectLimiter, FakeClock, Policy, RateLimiter};

use crate::models::{GcraModel, Model, Outcome};

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

/// 512 cases. A failing case is saved to `tests/core/proptest_gcra.proptest-regressions`
/// (committed) and replayed first on every later run.
fn config() -> ProptestConfig {
    ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::with_cases(512)
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn direct_matches_the_model((permits, window, steps) in scenario()) {
        let clock = FakeClock::new();
        let policy = Policy::new(Algorithm::TokenBucket, permits, Duration::from_nanos(window)).unwrap();
        let limiter = DirectLimiter::with_clock(policy, clock.clone());
        let mut model = GcraModel::new(permits, window);
        let mut now = 0u64;
        for (i, (advance, cost)) in steps.into_iter().enumerate() {
            // Most steps are small so that bursts and refusals both happen.
            let advance = if i % 3 == 0 { advance } else { advance / 64 };
            now += advance;
            clock.set(Duration::from_nanos(now));
            let got = Outcome::from(limiter.try_acquire_n(cost).unwrap());
            prop_assert_eq!(got, model.acquire(now, cost), "step {} at {} ns, cost {}", i, now, cost);
        }
    }

    #[test]
    fn keyed_matches_one_model_per_key((permits, window, steps) in scenario()) {
        let clock = FakeClock::new();
        let policy = Policy::new(Algorithm::TokenBucket, permits, Duration::from_nanos(window)).unwrap();
        let limiter: RateLimiter<u64, FakeClock> = RateLimiter::with_clock(policy, clock.clone());
        let mut models = [GcraModel::new(permits, window), GcraModel::new(permits, window)];
        let mut now = 0u64;
        for (i, (advance, cost)) in steps.into_iter().enumerate() {
            now += advance / 32;
            clock.set(Duration::from_nanos(now));
            let key = (advance % 2) as usize;
            if advance % 7 == 0 {
                // Eviction removes only at-rest states, so it never changes a decision.
                let _ = limiter.evict_idle();
            }
            let got = Outcome::from(limiter.try_acquire_n(&(key as u64), cost).unwrap());
            prop_assert_eq!(got, models[key].acquire(now, cost), "step {} key {}", i, key);
        }
    }
}
