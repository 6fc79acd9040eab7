//! What new keys share once the limiter tracks `max_keys` keys, under per-key policies: one
//! shared state per policy the resolver returns ([`PolicyOverflows`]), and what a generation's
//! shared state(s) hand on to the next generation's when the policy changes ([`Inherited`]).
//!
//! A policy change retires the shared states of the generation it replaces and merges what
//! they count into the new generation's, so keys that were sharing keep what they spent, as
//! tracked keys do. A request that meets a retired shared state starts over in the new
//! generation.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::clock::Clock;
use crate::decision::Decision;
use crate::engine::any_state::AnyState;
use crate::engine::state::Carry;
use crate::error::CostError;
use crate::policy::Policy;
use crate::reservation::Marks;

/// The permits a replaced generation's shared state(s) counted when it was retired, and
/// when: a new shared state is built as if they had been spent then.
#[derive(Clone, Copy, Debug)]
pub(super) struct Inherited {
    pub(super) carry: Carry,
    pub(super) at: u64,
}

impl Inherited {
    /// The inherited permits that may still count at `now`: the bands whose window has not
    /// passed since they were inherited (counted as spent at `now` from then on, which can
    /// only count more, never less).
    pub(super) fn live_at(&self, now: u64) -> Option<Carry> {
        self.carry.within(now.saturating_sub(self.at))
    }

    /// A fresh state of `policy`, or one with the inherited permits spent.
    fn state(inherited: Option<&Self>, policy: &Policy) -> AnyState {
        match inherited {
            Some(inherited) => AnyState::new(policy, Some(&inherited.carry), inherited.at),
            None => AnyState::new(policy, None, 0),
        }
    }
}

/// One shared state per policy the resolver returns for overflowing keys, built on first use.
pub(super) struct PolicyOverflows {
    states: scc::HashMap<Policy, AnyState>,
    /// Set once, by the policy change that retires every state here; no state is created
    /// after it. Read and written under a bucket's lock (see `retire`).
    closed: AtomicBool,
    /// What the replaced generation's shared states counted: every state built here starts
    /// with it.
    inherited: Option<Inherited>,
}

impl PolicyOverflows {
    pub(super) fn new(inherited: Option<Inherited>) -> Self {
        PolicyOverflows {
            states: scc::HashMap::new(),
            closed: AtomicBool::new(false),
            inherited,
        }
    }

    /// Decides a request of `cost` on `policy`'s shared state; `None` when a policy change
    /// retired it (the caller starts over in the new generation).
    pub(super) fn acquire<C: Clock + ?Sized>(
        &self,
        policy: &Policy,
        clock: &C,
        cost: u64,
    ) -> Option<Result<(Decision, Marks), CostError>> {
        let limit = policy.max_cost();
        if cost > limit {
            return Some(Err(CostError::ExceedsLimit { cost, limit }));
        }
        if let Some(decided) = self
            .states
            .read_sync(policy, |_, state| state.reserve(clock, cost))
        {
            return decided.map(Ok);
        }
        let entry = self.states.entry_sync(*policy);
        // Acquire, under the bucket's lock: `retire` sets the flag before it takes every
        // bucket's lock in turn, so either it sees the state inserted here or we see the flag.
        if self.closed.load(Ordering::Acquire) {
            return None;
        }
        let entry = entry.or_insert_with(|| Inherited::state(self.inherited.as_ref(), policy));
        entry.get().reserve(clock, cost).map(Ok)
    }

    /// Settles `settle` on `policy`'s shared state; `false` when a policy change retired it.
    pub(super) fn settle(
        &self,
        policy: &Policy,
        settle: impl FnOnce(&AnyState) -> Option<()>,
    ) -> bool {
        // A state absent is one never used: a reservation decided by it would have made it.
        self.states
            .read_sync(policy, |_, state| settle(state).is_some())
            .unwrap_or(true)
    }

    /// The permits `policy`'s shared state has in use at `now`: `Some(None)` when it is at
    /// rest or was never used, `None` when a policy change retired it.
    pub(super) fn carry(&self, policy: &Policy, now: u64) -> Option<Option<Carry>> {
        let carry = |state: &AnyState| {
            if state.is_at_rest(now) {
                Some(None)
            } else {
                state.carry(now).map(Some)
            }
        };
        match self.states.read_sync(policy, |_, state| carry(state)) {
            Some(carried) => carried,
            // Never used: what this generation inherited, as a state built from it counts it.
            None if self.inherited.is_some() => {
                carry(&Inherited::state(self.inherited.as_ref(), policy))
            }
            None => Some(None),
        }
    }

    /// What a request would get from `policy`'s shared state now; `None` when a policy
    /// change retired it.
    pub(super) fn peek<C: Clock + ?Sized>(&self, policy: &Policy, clock: &C) -> Option<Decision> {
        self.states
            .read_sync(policy, |_, state| state.peek(clock, 1))
            .unwrap_or_else(|| Inherited::state(self.inherited.as_ref(), policy).peek(clock, 1))
    }

    /// Retires every shared state at `now` and returns what they counted, merged: for the
    /// policy change that replaces them. No state is created here afterwards.
    pub(super) fn retire(&self, now: u64) -> Option<Carry> {
        // Release: published to creators through the bucket locks taken below.
        self.closed.store(true, Ordering::Release);
        // What this generation inherited and no state here has taken up yet.
        let mut merged = self.inherited.and_then(|inherited| inherited.live_at(now));
        // `retain_sync` takes every bucket's lock in turn: a creator that took one before us
        // has inserted its state, and one after us sees the flag.
        self.states.retain_sync(|_, state| {
            if let Some(carry) = state.retire_with_carry(now) {
                match &mut merged {
                    Some(merged) => merged.merge(&carry),
                    None => merged = Some(carry),
                }
            }
            true
        });
        merged
    }
}
