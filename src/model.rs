//! Entry points for the loom models in `tests/loom*.rs`; compiled only under
//! `--cfg tollgate_loom`, never part of the public API.
//!
//! [`ModelCell`] exposes one per-key state machine with its raw retire step, so a model can
//! race requests against eviction on the very code the limiters run.

use crate::composite::CompositeCell;
use crate::sliding_counter::CounterCell;
use crate::sliding_log::LogCell;
use crate::state::RateState;
use crate::token_bucket::GcraCell;
use crate::{Algorithm, Clock, Decision, Policy};

pub use crate::concurrency::ModelGauge;
pub use crate::login::ModelStrikes;

/// One per-key state machine of any algorithm.
#[derive(Debug)]
pub struct ModelCell(Cell);

#[derive(Debug)]
enum Cell {
    /// GCRA.
    TokenBucket(GcraCell, <GcraCell as RateState>::Params),
    /// Sliding window log.
    SlidingLog(LogCell, <LogCell as RateState>::Params),
    /// Sliding window counter.
    SlidingCounter(CounterCell, <CounterCell as RateState>::Params),
    /// Several bands, all-or-nothing (a policy with more than one band). The parameters of
    /// up to four bands are boxed to keep the enum small.
    Composite(CompositeCell, Box<<CompositeCell as RateState>::Params>),
}

macro_rules! with_cell {
    ($cell:expr, ($state:ident, $params:ident) => $body:expr) => {
        match $cell {
            Cell::TokenBucket($state, $params) => $body,
            Cell::SlidingLog($state, $params) => $body,
            Cell::SlidingCounter($state, $params) => $body,
            Cell::Composite($state, $params) => {
                let $params = &**$params;
                $body
            }
        }
    };
}

impl ModelCell {
    /// A fresh state for `policy`: the composite state machine when it has several bands.
    pub fn new(policy: &Policy) -> Self {
        fn fresh<St: RateState>(policy: &Policy) -> (St, St::Params) {
            let params = St::params(policy);
            (St::fresh(&params), params)
        }
        if policy.is_composite() {
            let (s, p) = fresh(policy);
            return ModelCell(Cell::Composite(s, Box::new(p)));
        }
        match policy.algorithm() {
            Algorithm::TokenBucket => {
                let (s, p) = fresh(policy);
                ModelCell(Cell::TokenBucket(s, p))
            }
            Algorithm::SlidingLog => {
                let (s, p) = fresh(policy);
                ModelCell(Cell::SlidingLog(s, p))
            }
            Algorithm::SlidingCounter => {
                let (s, p) = fresh(policy);
                ModelCell(Cell::SlidingCounter(s, p))
            }
        }
    }

    /// Decides a request; `None` when the state was retired.
    pub fn try_acquire<C: Clock>(&self, clock: &C, cost: u64) -> Option<Decision> {
        with_cell!(&self.0, (state, params) => state.try_acquire(params, clock, cost))
    }

    /// What a request would get now, changing nothing; `None` when the state was retired.
    pub fn peek<C: Clock>(&self, clock: &C, cost: u64) -> Option<Decision> {
        with_cell!(&self.0, (state, params) => state.peek(params, clock, cost))
    }

    /// Retires the state if it is at rest at `now`.
    pub fn try_retire(&self, now: u64) -> bool {
        with_cell!(&self.0, (state, params) => state.try_retire(params, now))
    }

    /// Retires the state for a policy change (`set_policy`), from one consistent snapshot
    /// whatever it holds, and returns the most permits in use at `now` in any of its bands:
    /// what the new policy's state will count as spent. `None` when it was already retired.
    pub fn retire_for_change(&self, now: u64) -> Option<u64> {
        with_cell!(&self.0, (state, params) => state.carry(params, now, true))
            .map(|carry| carry.spent_within(u64::MAX))
    }

    /// Whether the state is at rest at `now`.
    pub fn is_at_rest(&self, now: u64) -> bool {
        with_cell!(&self.0, (state, params) => state.is_at_rest(params, now))
    }
}
