//! Property tests: random traces through two-band composite policies, of every pair of
//! algorithms, via the direct and the keyed limiter, against a model that combines the plain
//! per-band reference models in `tests/models/` all-or-nothing (`tests/models/composite.rs`,
//! shared with the differential fuzz target).
//!
//! The combined model peeks every band's model (a clone decides, the model itself is left
//! alone); only when every band allows does it commit the request to all of them. Its
//! decision follows the table in `src/engine/composite.rs`: allowed, the smallest remaining and its
//! band's limit, the largest reset_after; refused, the smallest of the permits available now,
//! the largest retry_after among the refusing bands, and the largest reset_after as the bands
//! stand (for a band that would allow, found from the model's own `is_at_rest`).
//!
//! Time only moves forwards here (faulty clocks are covered per algorithm in the other
//! property tests); costs are 1..= the smaller band's permits. Every decision must match to
//! the nanosecond.

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use tollgate::{Algorithm, Clock, DirectLimiter, FakeClock, Policy, RateLimiter};

use crate::models::composite::CompositeModel;
use crate::models::Outcome;

#[derive(Clone, Copy, Debug)]
enum Step {
    /// Move the clock forward, then ask for `cost` permits.
    Acquire { advance: u64, cost: u64 },
    /// Run the keyed limiter's eviction.
    Evict,
}

#[derive(Clone, Debug)]
struct Scenario {
    policy: Policy,
    steps: Vec<Step>,
}

const ALGORITHMS: [Algorithm; 3] = [
    Algorithm::TokenBucket,
    Algorithm::SlidingLog,
    Algorithm::SlidingCounter,
];

/// One band: any algorithm, 1..=8 permits, a window from a nanosecond to seconds.
fn band() -> impl Strategy<Value = Policy> {
    let window = prop_oneof![1..=16u64, 17..=2_000u64, 1_000_000..=3_000_000_000u64];
    (0..3usize, 1..=8u64, window).prop_map(|(algorithm, permits, window)| {
        // A policy needs at least one nanosecond per permit.
        let window = window.max(permits);
        Policy::new(ALGORITHMS[algorithm], permits, Duration::from_nanos(window)).unwrap()
    })
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (band(), band())
        .prop_filter("two distinct bands", |(a, b)| a != b)
        .prop_flat_map(|(a, b)| {
            let policy = a.and(b).unwrap();
            let windows: Vec<u64> = policy
                .bands()
                .map(|b| b.window().as_nanos() as u64)
                .collect();
            let (short, long) = (windows[0], windows[1]);
            let max_cost = policy.bands().map(|b| b.permits()).min().unwrap();
            let advance = prop_oneof![
                3 => Just(0),
                1 => Just(1),
                1 => Just(short - 1),
                1 => Just(short),
                1 => Just(long - 1),
                1 => Just(long),
                4 => 0..=2 * short,
                2 => 0..=2 * long,
            ];
            let acquire =
                (advance, 1..=max_cost).prop_map(|(advance, cost)| Step::Acquire { advance, cost });
            let step = prop_oneof![
                16 => acquire,
                2 => Just(Step::Evict),
            ];
            prop::collection::vec(step, 1..80).prop_map(move |steps| Scenario { policy, steps })
        })
}

/// Replays `scenario` through both limiters and two copies of the model (the keyed one is
/// reset whenever eviction removes the key).
fn check(scenario: &Scenario) -> Result<(), TestCaseError> {
    let policy = scenario.policy;
    prop_assert!(policy.is_composite());
    let clock = FakeClock::new();
    let direct = DirectLimiter::with_clock(policy, clock.clone());
    let keyed: RateLimiter<String, FakeClock> = RateLimiter::with_clock(policy, clock.clone());
    let mut direct_model = CompositeModel::new(&policy);
    let mut keyed_model = CompositeModel::new(&policy);
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
                    keyed_model = CompositeModel::new(&policy);
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

/// 512 cases (a second or two), or `PROPTEST_CASES` for a longer soak. A failing case is
/// saved to `tests/core/proptest_composite.proptest-regressions` (committed) and replayed first on
/// every later run.
fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok());
    ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::with_cases(cases.unwrap_or(512))
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn composite_matches_its_bands_all_or_nothing(scenario in scenario()) {
        check(&scenario)?;
    }
}

/// The combined model itself follows the composite table on a hand-checked trace.
#[test]
fn model_reproduces_a_hand_checked_trace() {
    const MS: u64 = 1_000_000;
    const SEC: u64 = 1_000 * MS;
    let policy: Policy = "sliding-log 1/1s & 5/1h".parse().unwrap();
    let mut model = CompositeModel::new(&policy);
    let o = model.acquire(0, 1);
    assert_eq!(
        (o.allowed, o.remaining, o.limit, o.reset_after),
        (true, 0, 1, 720 * SEC)
    );
    let o = model.acquire(500 * MS, 1);
    assert_eq!(
        (
            o.allowed,
            o.remaining,
            o.limit,
            o.retry_after,
            o.reset_after
        ),
        (false, 0, 1, 500 * MS, 720 * SEC - 500 * MS)
    );
}
