//! The one place that enumerates the algorithms and builds a state for a policy.
//!
//! Every user stores something per algorithm: the keyed registry one map per generation, the
//! direct limiter one padded cell, a per-key policy one state with its parameters, the loom
//! models one state. Each names what it stores for an algorithm's state type `St` (a
//! [`Storage`]); [`PerAlgorithm`] holds that for whichever algorithm a policy names, so every user
//! keeps its own layout (a keyed map stores its states inline, with no enum around each)
//! while the enumeration, the choice from a policy and the match are written once, here.

use std::fmt;

use crate::clock::Clock;
use crate::decision::Decision;
use crate::engine::composite::CompositeCell;
use crate::engine::sliding_counter::CounterCell;
use crate::engine::sliding_log::LogCell;
use crate::engine::state::{Bound, Carry, Decides, RateState};
use crate::engine::token_bucket::GcraCell;
use crate::policy::{Algorithm, Policy};
use crate::reservation::{Marks, STAMP};

/// What a user stores for the algorithm whose state type is `St`.
pub(crate) trait Storage {
    /// What is stored for `St`.
    type Stored<St: RateState>;
}

/// A family's value for one algorithm, chosen by a policy.
// One per limiter, generation or key; where it is per key, the family keeps large
// parameters behind a box (`RateState::OwnParams`).
#[allow(clippy::large_enum_variant)]
pub(crate) enum PerAlgorithm<F: Storage> {
    /// GCRA.
    TokenBucket(F::Stored<GcraCell>),
    /// The sliding window log.
    SlidingLog(F::Stored<LogCell>),
    /// The sliding window counter.
    SlidingCounter(F::Stored<CounterCell>),
    /// Several bands, all-or-nothing (a policy with more than one band).
    Composite(F::Stored<CompositeCell>),
}

/// Builds a family's value for an algorithm, from the parameters of the policy.
pub(crate) trait Builder<F: Storage> {
    /// The value for `St`, whose parameters the policy gave.
    fn build<St: RateState>(self, params: St::Params) -> F::Stored<St>;
}

impl<F: Storage> PerAlgorithm<F> {
    /// The value for `policy`'s algorithm (the composite one when it has several bands).
    pub(crate) fn new(policy: &Policy, build: impl Builder<F>) -> Self {
        if policy.is_composite() {
            return PerAlgorithm::Composite(build.build(CompositeCell::params(policy)));
        }
        // One band: the first is the policy's only one.
        match policy.first_band().algorithm() {
            Algorithm::TokenBucket => {
                PerAlgorithm::TokenBucket(build.build(GcraCell::params(policy)))
            }
            Algorithm::SlidingLog => PerAlgorithm::SlidingLog(build.build(LogCell::params(policy))),
            Algorithm::SlidingCounter => {
                PerAlgorithm::SlidingCounter(build.build(CounterCell::params(policy)))
            }
        }
    }
}

/// Runs `$body` with `$value` bound to the [`PerAlgorithm`] value's content, whatever its
/// algorithm: the body is compiled once per algorithm, for its own state type.
macro_rules! with_state {
    ($erased:expr, $value:pat => $body:expr) => {
        match $erased {
            $crate::engine::dispatch::PerAlgorithm::TokenBucket($value) => $body,
            $crate::engine::dispatch::PerAlgorithm::SlidingLog($value) => $body,
            $crate::engine::dispatch::PerAlgorithm::SlidingCounter($value) => $body,
            $crate::engine::dispatch::PerAlgorithm::Composite($value) => $body,
        }
    };
}
pub(crate) use with_state;

/// A family whose value for each algorithm holds a state and its parameters: its
/// [`PerAlgorithm`] value decides as the state it holds, whatever the algorithm.
pub(crate) trait Holds: Storage {
    /// Whether a reservation is stamped with its state's policy ([`STAMP`]), and a refund
    /// applies only on a state of the same: where states keep policies of their own.
    const STAMPED: bool = false;

    /// The state in `held` and its parameters.
    fn bound<St: RateState>(held: &Self::Stored<St>) -> Bound<'_, St>;
}

/// `marks` with the stamp of `bound`'s policy, where `F` stamps them.
#[inline(always)]
fn stamped<F: Holds, St: RateState>(bound: &Bound<'_, St>, mut marks: Marks) -> Marks {
    if F::STAMPED {
        marks[STAMP] = bound.stamp();
    }
    marks
}

/// The one dispatch of every decision over the algorithms.
impl<F: Holds> Decides for PerAlgorithm<F> {
    #[inline(always)]
    fn max_cost(&self) -> u64 {
        with_state!(self, held => F::bound(held).max_cost())
    }

    #[inline(always)]
    fn reserve<C: Clock + ?Sized>(&self, clock: &C, cost: u64) -> Option<(Decision, Marks)> {
        with_state!(self, held => {
            let bound = F::bound(held);
            bound
                .reserve(clock, cost)
                .map(|(decision, marks)| (decision, stamped::<F, _>(&bound, marks)))
        })
    }

    #[inline(always)]
    fn reserve_checked<C: Clock + ?Sized>(
        &self,
        clock: &C,
        cost: u64,
    ) -> Option<Result<(Decision, Marks), crate::error::CostError>> {
        // Checked and decided under one match.
        with_state!(self, held => {
            let bound = F::bound(held);
            bound.reserve_checked(clock, cost).map(|result| {
                result.map(|(decision, marks)| (decision, stamped::<F, _>(&bound, marks)))
            })
        })
    }

    fn settle(&self, held: u64, marks: &Marks, actual: u64, now: u64) -> Option<()> {
        with_state!(self, of => {
            let bound = F::bound(of);
            let stamp = marks[STAMP];
            if F::STAMPED && actual < held && stamp != 0 && stamp != bound.stamp() {
                // A refund read against another policy's state (the key evicted and created
                // again under another one) would give back what that state never held: it
                // has nothing of the reservation. A charge applies anywhere (it reads no
                // mark).
                return Some(());
            }
            bound.settle(held, marks, actual, now)
        })
    }

    fn peek<C: Clock + ?Sized>(&self, clock: &C, cost: u64) -> Option<Decision> {
        with_state!(self, held => F::bound(held).peek(clock, cost))
    }

    fn is_at_rest(&self, now: u64) -> bool {
        with_state!(self, held => F::bound(held).is_at_rest(now))
    }

    fn carry(&self, now: u64) -> Option<Carry> {
        with_state!(self, held => F::bound(held).carry(now))
    }

    fn try_retire(&self, now: u64) -> bool {
        with_state!(self, held => F::bound(held).try_retire(now))
    }

    fn retire_with_carry(&self, now: u64) -> Option<Carry> {
        with_state!(self, held => F::bound(held).retire_with_carry(now))
    }
}

impl<F: Holds> fmt::Debug for PerAlgorithm<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        with_state!(self, held => {
            let bound = F::bound(held);
            f.debug_tuple("State")
                .field(bound.state)
                .field(bound.params)
                .finish()
        })
    }
}
