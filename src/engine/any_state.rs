//! A state of any algorithm carrying its own parameters: what a keyed limiter stores per key
//! when each key may have a different policy (`RateLimiter::with_resolver`).

use std::borrow::Borrow;
use std::fmt;

use crate::clock::Clock;
use crate::decision::Decision;
use crate::engine::dispatch::{with_state, Build, Erased, Family};
use crate::engine::state::{Carry, RateState};
use crate::policy::Policy;
use crate::reservation::Marks;

/// One key's state and the parameters of the policy it was created under.
///
/// Larger than a uniform limiter's state (it keeps its parameters: 32 to 48 bytes inline,
/// a composite's behind a box), which is the price of a policy per key.
pub(crate) struct AnyState(Erased<WithParams>);

/// A state beside its parameters, as `RateState::Kept` keeps them.
pub(crate) struct WithParams;

impl Family for WithParams {
    type Of<St: RateState> = (St, St::Kept);
}

/// Runs `$body` with `$state` and `$params` bound to the state and its parameters.
macro_rules! with_any {
    ($any:expr, ($state:ident, $params:ident) => $body:expr) => {
        with_state!(&$any.0, ($state, kept) => {
            let $params = kept.borrow();
            $body
        })
    };
}

impl AnyState {
    /// A state for `policy`: fresh, or with the permits of `carry` spent at `now`.
    pub(crate) fn new(policy: &Policy, carry: Option<&Carry>, now: u64) -> Self {
        struct New<'a>(Option<&'a Carry>, u64);
        impl Build<WithParams> for New<'_> {
            fn build<St: RateState>(self, params: St::Params) -> (St, St::Kept) {
                (St::new(&params, self.0, self.1), params.into())
            }
        }
        AnyState(Erased::new(policy, New(carry, now)))
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

    #[inline]
    pub(crate) fn reserve<C: Clock + ?Sized>(
        &self,
        clock: &C,
        cost: u64,
    ) -> Option<(Decision, Marks)> {
        with_any!(self, (state, params) => state.reserve(params, clock, cost))
    }

    pub(crate) fn settle(&self, held: u64, marks: &Marks, actual: u64, now: u64) -> Option<()> {
        with_any!(self, (state, params) => state.settle(params, held, marks, actual, now))
    }

    pub(crate) fn peek<C: Clock + ?Sized>(&self, clock: &C, cost: u64) -> Option<Decision> {
        with_any!(self, (state, params) => state.peek(params, clock, cost))
    }

    pub(crate) fn is_at_rest(&self, now: u64) -> bool {
        with_any!(self, (state, params) => state.is_at_rest(params, now))
    }

    pub(crate) fn carry(&self, now: u64) -> Option<Carry> {
        with_any!(self, (state, params) => state.carry(params, now))
    }

    /// See `RateState::retire_with_carry`.
    pub(crate) fn retire_with_carry(&self, now: u64) -> Option<Carry> {
        with_any!(self, (state, params) => state.retire_with_carry(params, now))
    }

    /// See `RateState::try_retire`.
    pub(crate) fn try_retire(&self, now: u64) -> bool {
        with_any!(self, (state, params) => state.try_retire(params, now))
    }
}

impl fmt::Debug for AnyState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        with_state!(&self.0, (state, params) => f
            .debug_tuple("AnyState")
            .field(state)
            .field(params)
            .finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The debug form shows the state and the parameters it keeps (a login guard's debug
    /// form includes it).
    #[test]
    fn debug_shows_the_state_and_its_parameters() {
        let policy: Policy = "5/1s".parse().unwrap();
        let shown = format!("{:?}", AnyState::new(&policy, None, 0));
        assert!(shown.starts_with("AnyState(GcraCell"), "{shown}");
        assert!(shown.contains("interval: 200000000"), "{shown}");
    }

    /// A state is at rest until it admits, and again once what it admitted has expired, for
    /// every algorithm and a composite.
    #[test]
    fn at_rest_until_it_admits_and_again_once_that_expires() {
        let clock = crate::FakeClock::new();
        for policy in [
            "token-bucket 2/1s",
            "sliding-counter 2/1s",
            "sliding-log 2/1s",
            "2/1s & 5/1h",
        ] {
            let state = AnyState::new(&policy.parse().unwrap(), None, 0);
            assert!(state.is_at_rest(0), "{policy}");
            assert!(state.try_acquire(&clock, 1).unwrap().is_allowed());
            assert!(!state.is_at_rest(0), "{policy}");
            let expired = if policy.contains("1h") { 3_600 } else { 2 } * 1_000_000_000;
            assert!(state.is_at_rest(expired), "{policy}");
        }
    }
}
