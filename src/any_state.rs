//! A state of any algorithm carrying its own parameters: what a keyed limiter stores per key
//! when each key may have a different policy (`RateLimiter::with_resolver`).

use crate::composite::{Composite, CompositeCell};
use crate::sliding_counter::{Counter, CounterCell};
use crate::sliding_log::{Log, LogCell};
use crate::state::{Carry, RateState};
use crate::token_bucket::{Gcra, GcraCell};
use crate::{Algorithm, Clock, Decision, Policy};

/// One key's state and the parameters of the policy it was created under.
///
/// Larger than a uniform limiter's state (it keeps its parameters: 32 to 48 bytes inline,
/// a composite's behind a box), which is the price of a policy per key.
#[derive(Debug)]
pub(crate) enum AnyState {
    TokenBucket(GcraCell, Gcra),
    SlidingLog(LogCell, Log),
    SlidingCounter(CounterCell, Counter),
    Composite(CompositeCell, Box<Composite>),
}

/// Runs `$body` with `$state` and `$params` bound to the variant's cell and parameters.
macro_rules! with_any {
    ($any:expr, ($state:ident, $params:ident) => $body:expr) => {
        match $any {
            AnyState::TokenBucket($state, $params) => $body,
            AnyState::SlidingLog($state, $params) => $body,
            AnyState::SlidingCounter($state, $params) => $body,
            AnyState::Composite($state, $params) => {
                let $params = &**$params;
                $body
            }
        }
    };
}

impl AnyState {
    /// A state for `policy`: fresh, or with the permits of `carry` spent at `now`.
    pub(crate) fn new(policy: &Policy, carry: Option<&Carry>, now: u64) -> Self {
        fn build<St: RateState>(
            policy: &Policy,
            carry: Option<&Carry>,
            now: u64,
        ) -> (St, St::Params) {
            let params = St::params(policy);
            let state = match carry {
                Some(carry) => St::from_carry(&params, carry, now),
                None => St::fresh(&params),
            };
            (state, params)
        }
        if policy.is_composite() {
            let (state, params) = build::<CompositeCell>(policy, carry, now);
            return AnyState::Composite(state, Box::new(params));
        }
        match policy.algorithm() {
            Algorithm::TokenBucket => {
                let (state, params) = build(policy, carry, now);
                AnyState::TokenBucket(state, params)
            }
            Algorithm::SlidingLog => {
                let (state, params) = build(policy, carry, now);
                AnyState::SlidingLog(state, params)
            }
            Algorithm::SlidingCounter => {
                let (state, params) = build(policy, carry, now);
                AnyState::SlidingCounter(state, params)
            }
        }
    }

    pub(crate) fn max_cost(&self) -> u64 {
        fn of<St: RateState>(_: &St, params: &St::Params) -> u64 {
            St::max_cost(params)
        }
        with_any!(self, (state, params) => of(state, params))
    }

    #[inline]
    pub(crate) fn try_acquire<C: Clock + ?Sized>(&self, clock: &C, cost: u64) -> Option<Decision> {
        with_any!(self, (state, params) => state.try_acquire(params, clock, cost))
    }

    pub(crate) fn peek<C: Clock + ?Sized>(&self, clock: &C, cost: u64) -> Option<Decision> {
        with_any!(self, (state, params) => state.peek(params, clock, cost))
    }

    pub(crate) fn is_at_rest(&self, now: u64) -> bool {
        with_any!(self, (state, params) => state.is_at_rest(params, now))
    }

    pub(crate) fn carry(&self, now: u64, retire: bool) -> Option<Carry> {
        with_any!(self, (state, params) => state.carry(params, now, retire))
    }
}
