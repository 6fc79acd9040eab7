//! Property tests: random traces through the sliding log and the sliding counter, via the
//! direct and the keyed limiter, against the plain reference models in `tests/models/`.
//!
//! Traces advance the clock by 0..=2W (often exactly 0, 1 ns or W, so window boundaries are
//! hit), spend costs 1..=N, now and then set the clock backwards, and run `evict_idle`. Small
//! N (1..=8) and W from a nanosecond to seconds. Every decision must match the model exactly:
//! allowed, remaining, retry_after and reset_after to the nanosecond.

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use tollgate::{Algorithm, Clock, DirectLimiter, FakeClock, Policy, RateLimiter};

use crate::models::{CounterModel, LogModel, Model, Outcome};

#[derive(Clone, Copy, Debug)]
enum Step {
    /// Move the clock forward, then ask for `cost` permits.
    Acquire { advance: u64, cost: u64 },
    /// Set the clock this far back (saturating at zero).
    Back(u64),
    /// Run the keyed limiter's eviction.
    Evict,
}

#[derive(Clone, Debug)]
struct Scenario {
    permits: u64,
    window: u64,
    steps: Vec<Step>,
}

fn scenario() -> impl Strategy<Value = Scenario> {
    let window = prop_oneof![1..=16u64, 17..=2_000u64, 1_000_000..=3_000_000_000u64];
    (1..=8u64, window).prop_flat_map(|(permits, window)| {
        // A policy needs at least one nanosecond per permit.
        let window = window.max(permits);
        let advance = prop_oneof![
            3 => Just(0),
            1 => Just(1),
            1 => Just(window - 1),
            1 => Just(window),
            6 => 0..=2 * window,
        ];
        let acquire =
            (advance, 1..=permits).prop_map(|(advance, cost)| Step::Acquire { advance, cost });
        let step = prop_oneof![
            16 => acquire,
            1 => (0..=2 * window).prop_map(Step::Back),
            2 => Just(Step::Evict),
        ];
        prop::collection::vec(step, 1..80).prop_map(move |steps| Scenario {
            permits,
            window,
            steps,
        })
    })
}

/// Replays `scenario` through both limiters and two copies of the model (the keyed one is
/// reset whenever eviction removes the key).
fn check<M: Model>(algorithm: Algorithm, scenario: &Scenario) -> Result<(), TestCaseError> {
    let policy = Policy::new(
        algorithm,
        scenario.permits,
        Duration::from_nanos(scenario.window),
    )
    .unwrap();
    let clock = FakeClock::new();
    let direct = DirectLimiter::with_clock(policy, clock.clone());
    let keyed: RateLimiter<String, FakeClock> = RateLimiter::with_clock(policy, clock.clone());
    let mut direct_model = M::new(scenario.permits, scenario.window);
    let mut keyed_model = M::new(scenario.permits, scenario.window);
    let mut tracked = false;

    for (i, step) in scenario.steps.iter().enumerate() {
        match *step {
            Step::Acquire { advance, cost } => {
                clock.advance(Duration::from_nanos(advance));
                let now = clock.now();
                let expected = direct_model.acquire(now, cost);
                let got = Outcome::from(direct.try_acquire_n(cost).unwrap());
                prop_assert_eq!(
                    got,
                    expected,
                    "direct, step {} at {} ns: {:?}",
                    i,
                    now,
                    step
                );
                let expected = keyed_model.acquire(now, cost);
                let got = Outcome::from(keyed.try_acquire_n("key", cost).unwrap());
                prop_assert_eq!(got, expected, "keyed, step {} at {} ns: {:?}", i, now, step);
                tracked = true;
            }
            Step::Back(by) => {
                clock.set(Duration::from_nanos(clock.now().saturating_sub(by)));
            }
            Step::Evict => {
                let now = clock.now();
                let expected = tracked && keyed_model.is_at_rest(now);
                prop_assert_eq!(
                    keyed.evict_idle(),
                    usize::from(expected),
                    "step {} at {} ns",
                    i,
                    now
                );
                if expected {
                    keyed_model = M::new(scenario.permits, scenario.window);
                    tracked = false;
                }
                prop_assert_eq!(keyed.len(), usize::from(tracked));
            }
        }
        let now = clock.now();
        prop_assert_eq!(
            direct.is_at_rest(),
            direct_model.is_at_rest(now),
            "step {} at {} ns",
            i,
            now
        );
    }
    Ok(())
}

/// 256 cases (a second or so), or `PROPTEST_CASES` for a longer soak. A failing case is
/// saved to `tests/core/proptest_windowed.proptest-regressions` (committed) and replayed first on
/// every later run.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok());
    ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::with_cases(cases.unwrap_or(256))
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn sliding_log_matches_its_model(scenario in scenario()) {
        check::<LogModel>(Algorithm::SlidingLog, &scenario)?;
    }

    #[test]
    fn sliding_counter_matches_its_model(scenario in scenario()) {
        check::<CounterModel>(Algorithm::SlidingCounter, &scenario)?;
    }
}

/// The models themselves reproduce the reference traces of docs/ALGORITHMS.md.
#[test]
fn models_reproduce_the_reference_traces() {
    const MS: u64 = 1_000_000;
    let mut log = LogModel::new(3, 1000 * MS);
    for (t, remaining) in [(0, 2), (400, 1), (800, 0)] {
        let o = log.acquire(t * MS, 1);
        assert!(o.allowed);
        assert_eq!(o.remaining, remaining);
    }
    assert_eq!(log.acquire(900 * MS, 1).retry_after, 100 * MS);
    assert!(log.acquire(1000 * MS, 1).allowed);
    assert_eq!(log.acquire(1050 * MS, 1).retry_after, 350 * MS);

    const SEC: u64 = 1000 * MS;
    let mut counter = CounterModel::new(10, 60 * SEC);
    for _ in 0..8 {
        assert!(counter.acquire(50 * SEC, 1).allowed);
    }
    for remaining in [3, 2, 1, 0] {
        let o = counter.acquire(69 * SEC, 1);
        assert!(o.allowed);
        assert_eq!(o.remaining, remaining);
    }
    let o = counter.acquire(69 * SEC, 1);
    assert!(!o.allowed);
    assert_eq!(o.retry_after / MS, 6_000);
    let o = counter.acquire(75_001 * MS, 1);
    assert!(o.allowed);
    assert_eq!(o.remaining, 0);
}
