//! A state of any algorithm carrying its own parameters: what a keyed limiter stores per key
//! when each key may have a different policy (`RateLimiter::with_resolver`).

use std::borrow::Borrow;

use crate::engine::dispatch::{Builder, Holds, PerAlgorithm, Storage};
use crate::engine::state::{Bound, Carry, RateState};
use crate::policy::Policy;

/// One key's state and the parameters of the policy it was created under; it decides as
/// every erased state does ([`Decides`](crate::engine::state::Decides)).
///
/// Larger than a uniform limiter's state (it keeps its parameters: 32 to 48 bytes inline,
/// a composite's behind a box), which is the price of a policy per key.
pub(crate) type AnyState = PerAlgorithm<WithParams>;

/// A state beside its parameters, as `RateState::OwnParams` keeps them.
pub(crate) struct WithParams;

impl Storage for WithParams {
    type Stored<St: RateState> = (St, St::OwnParams);
}

impl Holds for WithParams {
    const STAMPED: bool = true;

    #[inline(always)]
    fn bound<St: RateState>((state, kept): &(St, St::OwnParams)) -> Bound<'_, St> {
        Bound {
            state,
            params: kept.borrow(),
        }
    }
}

/// A state for `policy`: fresh, or with the permits of `carry` spent at `now`.
pub(crate) fn any_state(policy: &Policy, carry: Option<&Carry>, now: u64) -> AnyState {
    struct New<'a>(Option<&'a Carry>, u64);
    impl Builder<WithParams> for New<'_> {
        fn build<St: RateState>(self, params: St::Params) -> (St, St::OwnParams) {
            (St::new(&params, self.0, self.1), params.into())
        }
    }
    PerAlgorithm::new(policy, New(carry, now))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::state::Decides;

    /// The debug form shows the state and the parameters it keeps (a login guard's debug
    /// form includes it).
    #[test]
    fn debug_shows_the_state_and_its_parameters() {
        let policy: Policy = "5/1s".parse().unwrap();
        let shown = format!("{:?}", any_state(&policy, None, 0));
        assert!(shown.starts_with("State(GcraCell"), "{shown}");
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
            let state = any_state(&policy.parse().unwrap(), None, 0);
            assert!(state.is_at_rest(0), "{policy}");
            assert!(state.try_acquire(&clock, 1).unwrap().is_allowed());
            assert!(!state.is_at_rest(0), "{policy}");
            let expired = if policy.contains("1h") { 3_600 } else { 2 } * 1_000_000_000;
            assert!(state.is_at_rest(expired), "{policy}");
        }
    }
}
