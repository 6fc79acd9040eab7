//! Known clients: a client that logged into an account successfully is *known* for that
//! account for a while, and is then judged by a failure budget of its own.

use crate::any_state::AnyState;
use crate::clock::Fixed;
use crate::{Clock, Decision, Policy};

/// One known (account, client) pair: until when it is known, and its own failure budget.
///
/// The whole value is replaced (under the map bucket's exclusive lock) by each success, so
/// `until` needs no atomic; failures spend through the budget's own lock-free state.
#[derive(Debug)]
pub(crate) struct KnownClient {
    /// ns on the guard's clock at which the client stops being known.
    until: u64,
    failures: AnyState,
}

impl KnownClient {
    /// A client known until `until`, with a full budget under `policy`.
    pub(crate) fn new(policy: &Policy, until: u64) -> Self {
        KnownClient {
            until,
            failures: AnyState::new(policy, None, 0),
        }
    }

    /// Whether the client is still known at `now`.
    pub(crate) fn is_known(&self, now: u64) -> bool {
        now < self.until
    }

    /// What the client's next attempt gets at `now`, spending nothing.
    pub(crate) fn peek(&self, now: u64) -> Decision {
        match self.failures.peek(&Fixed(now), 1) {
            Some(decision) => decision,
            None => unreachable!("a known client's budget is never retired"),
        }
    }

    /// Spends one failure from the client's own budget (a full budget stays as it is).
    pub(crate) fn fail<C: Clock + ?Sized>(&self, clock: &C) {
        let _ = self.failures.try_acquire(clock, 1);
    }
}
