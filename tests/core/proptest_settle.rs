//! Property tests: reserve now, settle later. Random traces of `reserve_n`, `settle` (below,
//! equal to and above what the reservation holds), `cancel`, `try_acquire_n` and clock steps
//! through every algorithm and through two-band composites, via the direct and the keyed
//! limiter, against the plain reference models in `tests/models/`, which settle by the rules
//! each algorithm's `settle` documents.
//!
//! Every decision (of a request or a reservation) must match the model exactly, to the
//! nanosecond; a reservation holds its cost when admitted and nothing when refused, and one
//! refused cannot be settled. After every settle a peek must match the model, and at the end
//! peeks over the next few windows must too, so the state a settle leaves is checked, not
//! only the next decision. The keyed limiter also runs `evict_idle`, which must remove
//! exactly a key whose model is at rest: a reservation whose key was evicted gives nothing
//! back, and a charge lands on a new state.
//!
//! Single-band traces now and then set the clock backwards, as `proptest_windowed.rs` does;
//! composite ones only move forwards (the combined model's reset_after assumes it).

use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use tollgate::{
    Algorithm, Clock, Decision, DirectLimiter, FakeClock, Policy, RateLimiter, Reservation,
    SettleError,
};

use crate::models::composite::{BandModel, CompositeModel};
use crate::models::Outcome;

/// What a settle says the request really cost, against what its reservation holds.
#[derive(Clone, Copy, Debug)]
enum Actual {
    /// Less: `seed % held`, so 0 (a cancel by `settle`) too.
    Below(u64),
    /// Exactly what it holds.
    Equal,
    /// `extra` more (1 ..= twice the tightest band's permits, past every cap).
    Above(u64),
}

#[derive(Clone, Copy, Debug)]
enum Step {
    /// Move the clock forward, then ask for `cost` permits.
    Acquire { advance: u64, cost: u64 },
    /// Move the clock forward, then reserve `cost` permits.
    Reserve { advance: u64, cost: u64 },
    /// Move the clock forward, then settle an outstanding reservation (`pick` modulo how
    /// many there are).
    Settle {
        advance: u64,
        pick: usize,
        actual: Actual,
    },
    /// Move the clock forward, then cancel an outstanding reservation.
    Cancel { advance: u64, pick: usize },
    /// Set the clock this far back (saturating at zero).
    Back(u64),
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

/// One band of `algorithm`: 1..=8 permits, a window from a nanosecond to seconds.
fn band(algorithm: Algorithm) -> impl Strategy<Value = Policy> {
    let window = prop_oneof![1..=16u64, 17..=2_000u64, 1_000_000..=3_000_000_000u64];
    (1..=8u64, window).prop_map(move |(permits, window)| {
        // A policy needs at least one nanosecond per permit.
        let window = window.max(permits);
        Policy::new(algorithm, permits, Duration::from_nanos(window)).unwrap()
    })
}

/// A trace for `policy`: clock steps of 0..=2W of its longest window (often exactly 0, 1 ns
/// or a window, so boundaries are hit), costs 1..= its tightest band's permits, and `Back`
/// steps only when `backwards`.
fn steps(policy: Policy, backwards: bool) -> impl Strategy<Value = Scenario> {
    let windows: Vec<u64> = policy
        .bands()
        .map(|b| b.window().as_nanos() as u64)
        .collect();
    let (short, long) = (windows[0], windows[windows.len() - 1]);
    let max_cost = policy.bands().map(|b| b.permits()).min().unwrap();
    let advance = || {
        prop_oneof![
            4 => Just(0),
            1 => Just(1),
            1 => Just(short - 1),
            1 => Just(short),
            1 => Just(long),
            2 => 0..=short / 4,
            3 => 0..=2 * short,
            1 => 0..=2 * long,
        ]
    };
    let actual = prop_oneof![
        4 => any::<u64>().prop_map(Actual::Below),
        1 => Just(Actual::Equal),
        2 => (1..=2 * max_cost).prop_map(Actual::Above),
    ];
    let step = prop_oneof![
        6 => (advance(), 1..=max_cost).prop_map(|(advance, cost)| Step::Acquire { advance, cost }),
        6 => (advance(), 1..=max_cost).prop_map(|(advance, cost)| Step::Reserve { advance, cost }),
        5 => (advance(), any::<usize>(), actual)
            .prop_map(|(advance, pick, actual)| Step::Settle { advance, pick, actual }),
        2 => (advance(), any::<usize>()).prop_map(|(advance, pick)| Step::Cancel { advance, pick }),
        // Without `backwards`, a step back of nothing.
        1 => (0..=2 * long).prop_map(move |by| Step::Back(if backwards { by } else { 0 })),
        1 => Just(Step::Evict),
    ];
    prop::collection::vec(step, 1..60).prop_map(move |steps| Scenario { policy, steps })
}

fn single(algorithm: Algorithm) -> impl Strategy<Value = Scenario> {
    band(algorithm).prop_flat_map(|policy| steps(policy, true))
}

fn composite() -> impl Strategy<Value = Scenario> {
    let any_band = (0..3usize).prop_flat_map(|a| band(ALGORITHMS[a]));
    (any_band.clone(), any_band)
        .prop_filter("two distinct bands", |(a, b)| a != b)
        .prop_flat_map(|(a, b)| steps(a.and(b).unwrap(), false))
}

/// The reference model of a policy: its band's model, or the combined one.
#[derive(Clone, Debug)]
enum Reference {
    Band(BandModel),
    Composite(CompositeModel),
}

impl Reference {
    fn new(policy: &Policy) -> Self {
        if policy.is_composite() {
            Reference::Composite(CompositeModel::new(policy))
        } else {
            Reference::Band(BandModel::new(policy.first_band()))
        }
    }

    fn reserve(&mut self, now: u64, cost: u64) -> (Outcome, Vec<u64>) {
        match self {
            Reference::Band(m) => {
                let (outcome, mark) = m.reserve(now, cost);
                (outcome, vec![mark])
            }
            Reference::Composite(m) => m.reserve(now, cost),
        }
    }

    fn settle(&mut self, held: u64, marks: &[u64], actual: u64, now: u64) {
        match self {
            Reference::Band(m) => m.settle(held, marks[0], actual, now),
            Reference::Composite(m) => m.settle(held, marks, actual, now),
        }
    }

    fn peek(&self, now: u64) -> Outcome {
        match self {
            Reference::Band(m) => m.peek(now, 1),
            Reference::Composite(m) => m.peek(now, 1),
        }
    }

    fn is_at_rest(&self, now: u64) -> bool {
        match self {
            Reference::Band(m) => m.is_at_rest(now),
            Reference::Composite(m) => m.is_at_rest(now),
        }
    }
}

/// The direct limiter, or one key of the keyed limiter.
trait Limiter {
    fn acquire(&self, cost: u64) -> Decision;
    fn reserve(&self, cost: u64) -> Reservation;
    fn settle(&self, reservation: Reservation, actual: u64) -> Result<(), SettleError>;
    fn cancel(&self, reservation: Reservation) -> Result<(), SettleError>;
    fn peek(&self) -> Decision;
}

impl Limiter for DirectLimiter<FakeClock> {
    fn acquire(&self, cost: u64) -> Decision {
        self.try_acquire_n(cost).unwrap()
    }
    fn reserve(&self, cost: u64) -> Reservation {
        self.reserve_n(cost).unwrap()
    }
    fn settle(&self, reservation: Reservation, actual: u64) -> Result<(), SettleError> {
        DirectLimiter::settle(self, reservation, actual)
    }
    fn cancel(&self, reservation: Reservation) -> Result<(), SettleError> {
        DirectLimiter::cancel(self, reservation)
    }
    fn peek(&self) -> Decision {
        DirectLimiter::peek(self)
    }
}

impl Limiter for RateLimiter<String, FakeClock> {
    fn acquire(&self, cost: u64) -> Decision {
        self.try_acquire_n("key", cost).unwrap()
    }
    fn reserve(&self, cost: u64) -> Reservation {
        self.reserve_n("key", cost).unwrap()
    }
    fn settle(&self, reservation: Reservation, actual: u64) -> Result<(), SettleError> {
        RateLimiter::settle(self, "key", reservation, actual)
    }
    fn cancel(&self, reservation: Reservation) -> Result<(), SettleError> {
        RateLimiter::cancel(self, "key", reservation)
    }
    fn peek(&self) -> Decision {
        RateLimiter::peek(self, "key")
    }
}

/// A reservation not settled yet, and what the model marked it with.
struct Outstanding {
    reservation: Reservation,
    held: u64,
    marks: Vec<u64>,
}

/// One limiter and its model, with the reservations made on it.
struct Lane<'a, L> {
    name: &'static str,
    limiter: &'a L,
    model: Reference,
    outstanding: Vec<Outstanding>,
    /// Whether the limiter holds a state for the lane's key (always, for the direct one).
    tracked: bool,
}

impl<L: Limiter> Lane<'_, L> {
    fn acquire(&mut self, now: u64, cost: u64, at: &str) -> Result<(), TestCaseError> {
        let (expected, _) = self.model.reserve(now, cost);
        let got = Outcome::from(self.limiter.acquire(cost));
        prop_assert_eq!(got, expected, "{}, {}", self.name, at);
        Ok(())
    }

    fn reserve(&mut self, now: u64, cost: u64, at: &str) -> Result<(), TestCaseError> {
        let (expected, marks) = self.model.reserve(now, cost);
        let reservation = self.limiter.reserve(cost);
        prop_assert_eq!(
            Outcome::from(reservation.decision()),
            expected,
            "{}, {}",
            self.name,
            at
        );
        let held = if expected.allowed { cost } else { 0 };
        prop_assert_eq!(reservation.held(), held, "{}, {}", self.name, at);
        self.outstanding.push(Outstanding {
            reservation,
            held,
            marks,
        });
        Ok(())
    }

    /// Settles reservation `pick` at `actual` (a cancel when `None`); a refused reservation
    /// must be handed back as an error.
    fn settle(
        &mut self,
        now: u64,
        pick: usize,
        actual: Option<Actual>,
        at: &str,
    ) -> Result<(), TestCaseError> {
        if self.outstanding.is_empty() {
            return Ok(());
        }
        let Outstanding {
            reservation,
            held,
            marks,
        } = self.outstanding.swap_remove(pick % self.outstanding.len());
        let (result, actual) = match actual {
            None => (self.limiter.cancel(reservation), 0),
            Some(actual) => {
                let actual = match actual {
                    Actual::Below(seed) => seed % held.max(1),
                    Actual::Equal => held,
                    Actual::Above(extra) => held + extra,
                };
                (self.limiter.settle(reservation, actual), actual)
            }
        };
        if held == 0 {
            prop_assert_eq!(result, Err(SettleError::Refused), "{}, {}", self.name, at);
        } else {
            prop_assert_eq!(result, Ok(()), "{}, {}", self.name, at);
            // A give-back to a key no longer tracked finds no state and creates none, so its
            // model stays fresh; a charge creates the state again (the model moves as one).
            if self.tracked || actual > held {
                self.model.settle(held, &marks, actual, now);
                self.tracked = true;
            }
        }
        self.check_peek(now, &format!("{at}, held {held}, actual {actual}"))?;
        Ok(())
    }

    fn check_peek(&self, now: u64, at: &str) -> Result<(), TestCaseError> {
        let got = Outcome::from(self.limiter.peek());
        prop_assert_eq!(got, self.model.peek(now), "{} peek, {}", self.name, at);
        Ok(())
    }
}

/// Replays `scenario` through both limiters and a model for each (the keyed one is reset
/// whenever eviction removes the key).
fn check(scenario: &Scenario) -> Result<(), TestCaseError> {
    let policy = scenario.policy;
    let clock = FakeClock::new();
    let direct = DirectLimiter::with_clock(policy, clock.clone());
    // The default sweep on insertion meets only this key, just created: by a request, which
    // leaves it not at rest, or by a charge on a key no longer tracked, which must not sweep
    // its state away before the charge lands. Every removal is one the trace asks for.
    let keyed: RateLimiter<String, FakeClock> = RateLimiter::with_clock(policy, clock.clone());
    let mut direct_lane = Lane {
        name: "direct",
        limiter: &direct,
        model: Reference::new(&policy),
        outstanding: Vec::new(),
        tracked: true,
    };
    let mut keyed_lane = Lane {
        name: "keyed",
        limiter: &keyed,
        model: Reference::new(&policy),
        outstanding: Vec::new(),
        tracked: false,
    };

    for (i, step) in scenario.steps.iter().enumerate() {
        let advance = match *step {
            Step::Acquire { advance, .. }
            | Step::Reserve { advance, .. }
            | Step::Settle { advance, .. }
            | Step::Cancel { advance, .. } => advance,
            Step::Back(_) | Step::Evict => 0,
        };
        clock.advance(Duration::from_nanos(advance));
        let now = clock.now();
        let at = format!("step {i} at {now} ns: {step:?}");
        match *step {
            Step::Acquire { cost, .. } => {
                direct_lane.acquire(now, cost, &at)?;
                keyed_lane.acquire(now, cost, &at)?;
                keyed_lane.tracked = true;
            }
            Step::Reserve { cost, .. } => {
                direct_lane.reserve(now, cost, &at)?;
                keyed_lane.reserve(now, cost, &at)?;
                keyed_lane.tracked = true;
            }
            Step::Settle { pick, actual, .. } => {
                direct_lane.settle(now, pick, Some(actual), &at)?;
                keyed_lane.settle(now, pick, Some(actual), &at)?;
            }
            Step::Cancel { pick, .. } => {
                direct_lane.settle(now, pick, None, &at)?;
                keyed_lane.settle(now, pick, None, &at)?;
            }
            Step::Back(by) => {
                clock.set(Duration::from_nanos(now.saturating_sub(by)));
            }
            Step::Evict => {
                let expected = keyed_lane.tracked && keyed_lane.model.is_at_rest(now);
                prop_assert_eq!(keyed.evict_idle(), usize::from(expected), "{}", at);
                if expected {
                    keyed_lane.model = Reference::new(&policy);
                    keyed_lane.tracked = false;
                }
            }
        }
        let now = clock.now();
        prop_assert_eq!(keyed.len(), usize::from(keyed_lane.tracked), "{}", at);
        prop_assert_eq!(
            direct.is_at_rest(),
            direct_lane.model.is_at_rest(now),
            "{}",
            at
        );
    }

    // The state left: what a request would get over the next windows, until at rest.
    let long = policy
        .bands()
        .map(|b| b.window().as_nanos() as u64)
        .max()
        .unwrap();
    for advance in [0, 1, long / 3, long / 2, long, long, long, long] {
        clock.advance(Duration::from_nanos(advance));
        let now = clock.now();
        let at = format!("the end, at {now} ns");
        direct_lane.check_peek(now, &at)?;
        keyed_lane.check_peek(now, &at)?;
        prop_assert_eq!(
            direct.is_at_rest(),
            direct_lane.model.is_at_rest(now),
            "{}",
            at
        );
    }
    Ok(())
}

/// `cases` cases (here 160 per algorithm and 256 of composites, a second or two in all), or
/// `PROPTEST_CASES` for a longer soak. A failing case is saved beside the calling test's
/// source (`tests/core/<file>.proptest-regressions`) and replayed first on every later run.
/// `proptest_all_of` runs with it too.
pub(crate) fn config(cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::with_cases(cases)
    }
}

proptest! {
    #![proptest_config(config(160))]

    #[test]
    fn token_bucket_settles_as_its_model(scenario in single(Algorithm::TokenBucket)) {
        check(&scenario)?;
    }

    #[test]
    fn sliding_log_settles_as_its_model(scenario in single(Algorithm::SlidingLog)) {
        check(&scenario)?;
    }

    #[test]
    fn sliding_counter_settles_as_its_model(scenario in single(Algorithm::SlidingCounter)) {
        check(&scenario)?;
    }
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn composite_settles_every_band_as_its_model(scenario in composite()) {
        check(&scenario)?;
    }
}
