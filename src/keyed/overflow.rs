//! What new keys share once the limiter tracks `max_keys` keys, under per-key policies: one
//! shared state per policy the resolver returns ([`PolicyOverflows`]), and what a generation's
//! shared state(s) hand on to the next generation's when the policy changes ([`Inherited`]).
//!
//! A policy change retires the shared states of the generation it replaces and hands what
//! they count, policy by policy, to the new generation's: under per-key policies each policy's
//! shared state starts with what its predecessor of the same policy counted, and one of a
//! policy new to the generation with all of it; under one policy the new shared state starts
//! with all of it. So keys that were sharing keep what they spent, as tracked keys do. A
//! request that meets a retired shared state starts over in the new generation.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::clock::Clock;
use crate::decision::Decision;
use crate::engine::any_state::AnyState;
use crate::engine::state::Carry;
use crate::error::CostError;
use crate::policy::Policy;
use crate::reservation::Marks;

/// What a replaced generation's shared overflow states counted: per policy, the permits in
/// use and the instant they were counted at. A state built from an entry is built at that
/// instant, so what it inherited ages from then on as any state's permits do, however many
/// policy changes pass it on.
#[derive(Clone, Debug, Default)]
pub(super) struct Inherited(Vec<(Policy, Carry, u64)>);

impl Inherited {
    /// The shared state of a uniform policy: `policy`'s permits in use at `now`.
    pub(super) fn one(policy: Policy, carry: Option<Carry>, now: u64) -> Self {
        let carry = carry.and_then(|carry| carry.within(0));
        Inherited(
            carry
                .map(|carry| (policy, carry, now))
                .into_iter()
                .collect(),
        )
    }

    /// Everything inherited, folded into one carry counted as spent at `now`: for the one
    /// shared state of a uniform policy (whatever policy each part came from, as a policy
    /// change folds a tracked key's bands into the new policy's). `None` when nothing is.
    pub(super) fn merged(&self, now: u64) -> Option<Carry> {
        let mut parts = self.0.iter().filter_map(|(policy, carry, at)| {
            let state = AnyState::new(policy, Some(carry), *at);
            (!state.is_at_rest(now)).then(|| state.carry(now)).flatten()
        });
        let mut merged = parts.next()?;
        for part in parts {
            merged.merge(&part);
        }
        Some(merged)
    }

    /// A shared state of `policy`, built at `now`: from what was inherited for that policy
    /// (as of when it was counted); for a policy new to the generation, from everything
    /// inherited, merged (the keys that shared under other policies may now get this one, so
    /// it counts what they spent: it may refuse more, never admit more); else fresh.
    fn state(&self, policy: &Policy, now: u64) -> AnyState {
        match self.0.iter().find(|(p, _, _)| p == policy) {
            Some((_, carry, at)) => AnyState::new(policy, Some(carry), *at),
            None => AnyState::new(policy, self.merged(now).as_ref(), now),
        }
    }
}

/// One shared state per policy the resolver returns for overflowing keys, built on first use.
pub(super) struct PolicyOverflows {
    states: scc::HashMap<Policy, AnyState>,
    /// Set once, by the policy change that retires every state here; no state is created
    /// after it. Read and written under a bucket's lock (see `retire`).
    closed: AtomicBool,
    /// What the replaced generation's shared states counted: each state built here starts
    /// with its policy's part.
    inherited: Inherited,
}

impl PolicyOverflows {
    pub(super) fn new(inherited: Inherited) -> Self {
        PolicyOverflows {
            states: scc::HashMap::new(),
            closed: AtomicBool::new(false),
            inherited,
        }
    }

    /// `f` on `policy`'s shared state, built at `now` first if it is not there yet; `None`
    /// when a policy change retired the states here (the caller starts over in the new
    /// generation).
    fn with_state<R>(
        &self,
        policy: &Policy,
        now: u64,
        f: impl FnOnce(&AnyState) -> R,
    ) -> Option<R> {
        let mut f = Some(f);
        if let Some(found) = self
            .states
            .read_sync(policy, |_, state| f.take().map(|f| f(state)))
        {
            return found;
        }
        let entry = self.states.entry_sync(*policy);
        // Acquire, under the bucket's lock: `retire` sets the flag before it takes every
        // bucket's lock in turn, so either it sees the state inserted here or we see the flag.
        if self.closed.load(Ordering::Acquire) {
            return None;
        }
        let entry = entry.or_insert_with(|| self.inherited.state(policy, now));
        f.take().map(|f| f(entry.get()))
    }

    /// Decides a request of `cost` on `policy`'s shared state; `None` when a policy change
    /// retired it.
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
        self.with_state(policy, clock.now(), |state| state.reserve(clock, cost))
            .flatten()
            .map(Ok)
    }

    /// Settles on `policy`'s shared state (`settle` returns `None` for a retired one); `false`
    /// when a policy change retired it. A charge builds the state if it is not there (a policy
    /// change since the reservation), a refund does not: a state never used holds nothing.
    pub(super) fn settle(
        &self,
        policy: &Policy,
        charge: bool,
        now: u64,
        settle: impl FnOnce(&AnyState) -> Option<()>,
    ) -> bool {
        if charge {
            return self.with_state(policy, now, settle).flatten().is_some();
        }
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
            // Never used here: what was inherited for it, as a state built from that counts.
            None => carry(&self.inherited.state(policy, now)),
        }
    }

    /// What a request would get from `policy`'s shared state now; `None` when a policy
    /// change retired it.
    pub(super) fn peek<C: Clock + ?Sized>(&self, policy: &Policy, clock: &C) -> Option<Decision> {
        self.states
            .read_sync(policy, |_, state| state.peek(clock, 1))
            .unwrap_or_else(|| self.inherited.state(policy, clock.now()).peek(clock, 1))
    }

    /// Retires every shared state at `now` and returns what they counted, policy by policy,
    /// with what was inherited here and never taken up (still counting). No state is created
    /// here afterwards.
    pub(super) fn retire(&self, now: u64) -> Inherited {
        // Release: published to creators through the bucket locks taken below.
        self.closed.store(true, Ordering::Release);
        let mut handed = Inherited::default();
        let mut seen = HashSet::new();
        // `retain_sync` takes every bucket's lock in turn: a creator that took one before us
        // has inserted its state, and one after us sees the flag.
        self.states.retain_sync(|policy, state| {
            seen.insert(*policy);
            // Every state is retired, at rest or not, so none admits again; only one with
            // permits in use hands them on.
            if let Some(carry) = state.retire_with_carry(now).and_then(|c| c.within(0)) {
                handed.0.push((*policy, carry, now));
            }
            true
        });
        // A policy inherited but never used here keeps its entry, counted from when it was,
        // until it has aged out.
        for (policy, carry, at) in &self.inherited.0 {
            if !seen.contains(policy) && !AnyState::new(policy, Some(carry), *at).is_at_rest(now) {
                handed.0.push((*policy, *carry, *at));
            }
        }
        handed
    }
}
