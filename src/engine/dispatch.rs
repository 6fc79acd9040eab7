//! The one place that enumerates the algorithms and builds a state for a policy.
//!
//! Every user stores something per algorithm: the keyed registry one map per generation, the
//! direct limiter one padded cell, a per-key policy one state with its parameters, the loom
//! models one state. Each names what it stores for an algorithm's state type `St` (a
//! [`Family`]); [`Erased`] holds that for whichever algorithm a policy names, so every user
//! keeps its own layout (a keyed map stores its states inline, with no enum around each)
//! while the enumeration, the choice from a policy and the match are written once, here.

use crate::engine::composite::CompositeCell;
use crate::engine::sliding_counter::CounterCell;
use crate::engine::sliding_log::LogCell;
use crate::engine::state::RateState;
use crate::engine::token_bucket::GcraCell;
use crate::policy::{Algorithm, Policy};

/// What a user stores for the algorithm whose state type is `St`.
pub(crate) trait Family {
    /// What is stored for `St`.
    type Of<St: RateState>;
}

/// A family's value for one algorithm, chosen by a policy.
// One per limiter, generation or key; where it is per key, the family keeps large
// parameters behind a box (`RateState::Kept`).
#[allow(clippy::large_enum_variant)]
pub(crate) enum Erased<F: Family> {
    /// GCRA.
    TokenBucket(F::Of<GcraCell>),
    /// The sliding window log.
    SlidingLog(F::Of<LogCell>),
    /// The sliding window counter.
    SlidingCounter(F::Of<CounterCell>),
    /// Several bands, all-or-nothing (a policy with more than one band).
    Composite(F::Of<CompositeCell>),
}

/// Builds a family's value for an algorithm, from the parameters of the policy.
pub(crate) trait Build<F: Family> {
    /// The value for `St`, whose parameters the policy gave.
    fn build<St: RateState>(self, params: St::Params) -> F::Of<St>;
}

impl<F: Family> Erased<F> {
    /// The value for `policy`'s algorithm (the composite one when it has several bands).
    pub(crate) fn new(policy: &Policy, build: impl Build<F>) -> Self {
        if policy.is_composite() {
            return Erased::Composite(build.build(CompositeCell::params(policy)));
        }
        // One band: the first is the policy's only one.
        match policy.first_band().algorithm() {
            Algorithm::TokenBucket => Erased::TokenBucket(build.build(GcraCell::params(policy))),
            Algorithm::SlidingLog => Erased::SlidingLog(build.build(LogCell::params(policy))),
            Algorithm::SlidingCounter => {
                Erased::SlidingCounter(build.build(CounterCell::params(policy)))
            }
        }
    }
}

/// Runs `$body` with `$value` bound to the [`Erased`] value's content, whatever its
/// algorithm: the body is compiled once per algorithm, for its own state type.
macro_rules! with_state {
    ($erased:expr, $value:pat => $body:expr) => {
        match $erased {
            $crate::engine::dispatch::Erased::TokenBucket($value) => $body,
            $crate::engine::dispatch::Erased::SlidingLog($value) => $body,
            $crate::engine::dispatch::Erased::SlidingCounter($value) => $body,
            $crate::engine::dispatch::Erased::Composite($value) => $body,
        }
    };
}
pub(crate) use with_state;
