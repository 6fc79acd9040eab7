//! What new keys share once the limiter tracks `max_keys` keys, under per-key policies: one
//! shared state per policy the resolver returns ([`PolicyOverflows`]), and what a generation's
//! shared state(s) hand on to the next generation's when the policy changes ([`Inherited`]).
//!
//! A policy change retires the shared states of the generation it replaces and hands what
//! they counted to the new generation's, every one of which starts with all of it (see
//! [`Inherited`]). So keys that were sharing keep what they spent, as tracked keys do. A
//! request that meets a retired shared state starts over in the new generation.

use std::sync::atomic::{AtomicBool, Ordering};

use crossbeam_utils::CachePadded;

use crate::clock::Clock;
use crate::decision::Decision;
use crate::engine::any_state::{any_state, AnyState};
use crate::engine::state::{Carry, Decides, RateState};
use crate::error::CostError;
use crate::policy::Policy;
use crate::reservation::Marks;

/// What a replaced generation's shared overflow states counted: per policy, the permits in
/// use and the instant they were counted at.
///
/// A shared state built from it counts all of it, whatever its policy: keys that shared under
/// one policy may now get another (a change of tiers, or a resolver whose answer changed),
/// so every shared state of the new generation counts what any of them spent (it may refuse
/// more, never admit more). A single part is built as of the instant it was counted, so it
/// ages as any state's permits do; several are merged as of the build. A state built from
/// it that admitted nothing since hands the parts on as they were: changes of policy that
/// follow one another without new admissions do not keep a flood's count alive.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Inherited(Vec<(Policy, Carry, u64)>);

impl Inherited {
    /// Everything inherited, folded into one carry counted as spent at `now`, each part aged
    /// to `now` first. `None` when nothing is still in use.
    fn merged(&self, now: u64) -> Option<Carry> {
        let mut parts = self.0.iter().filter_map(|(policy, carry, at)| {
            let state = any_state(policy, Some(carry), *at);
            (!state.is_at_rest(now)).then(|| state.carry(now)).flatten()
        });
        let mut merged = parts.next()?;
        for part in parts {
            merged.merge(&part);
        }
        Some(merged)
    }

    /// What a new shared state built at `now` starts with, and as of when: the one part as it
    /// was counted, or every part merged as of `now`; `None` when nothing was inherited or
    /// nothing inherited is still in use.
    pub(super) fn carry(&self, now: u64) -> Option<(Carry, u64)> {
        match self.0.as_slice() {
            [(_, carry, at)] => Some((*carry, *at)),
            // None when there are no parts, or none still in use.
            _ => self.merged(now).map(|merged| (merged, now)),
        }
    }

    /// A shared state of `policy` built at `now` from what was inherited (see `carry`).
    fn state(&self, policy: &Policy, now: u64) -> AnyState {
        match self.carry(now) {
            Some((carry, at)) => any_state(policy, Some(&carry), at),
            None => any_state(policy, None, 0),
        }
    }

    /// What a shared state of `policy` retired at `now` hands on, given `counted`, what it
    /// had in use then: nothing when nothing; the parts it was built from, as they were, when
    /// it admitted nothing since (it counts exactly what a state built from them counts now);
    /// else what it counted, as of `now`, beside the parts still in use.
    pub(super) fn hand_on(&self, policy: &Policy, counted: Option<Carry>, now: u64) -> Self {
        let Some(counted) = counted.and_then(|counted| counted.within(0)) else {
            return Inherited::default();
        };
        let unchanged = self.state(policy, now).carry(now).and_then(|c| c.within(0));
        let mut handed = self.still_in_use(now);
        if unchanged != Some(counted) {
            handed.0.push((*policy, counted, now));
        }
        handed
    }

    /// The parts a state built from them would still count at `now`, as they were.
    fn still_in_use(&self, now: u64) -> Self {
        Inherited(
            self.0
                .iter()
                .filter(|(policy, carry, at)| !any_state(policy, Some(carry), *at).is_at_rest(now))
                .copied()
                .collect(),
        )
    }

    /// `other`'s parts beside these.
    fn extend(&mut self, other: Inherited) {
        for part in other.0 {
            if !self.0.contains(&part) {
                self.0.push(part);
            }
        }
    }
}

/// The one shared state of a uniform policy, and what it was built from.
pub(super) struct OneOverflow<St> {
    pub(super) state: CachePadded<St>,
    inherited: Inherited,
}

impl<St: RateState> OneOverflow<St> {
    pub(super) fn new(params: &St::Params, inherited: Inherited, now: u64) -> Self {
        let state = match inherited.carry(now) {
            Some((carry, at)) => St::new(params, Some(&carry), at),
            None => St::fresh(params),
        };
        OneOverflow {
            state: CachePadded::new(state),
            inherited,
        }
    }

    /// Retires the shared state of `policy` at `now`, returning what it hands on.
    pub(super) fn retire(&self, params: &St::Params, policy: &Policy, now: u64) -> Inherited {
        let counted = self.state.retire_with_carry(params, now);
        self.inherited.hand_on(policy, counted, now)
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
        if let Err(refused) = CostError::within(cost, policy.max_cost()) {
            return Some(Err(refused));
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
    pub(super) fn peek<C: Clock + ?Sized>(
        &self,
        policy: &Policy,
        clock: &C,
        cost: u64,
    ) -> Option<Decision> {
        self.states
            .read_sync(policy, |_, state| state.peek(clock, cost))
            .unwrap_or_else(|| self.inherited.state(policy, clock.now()).peek(clock, cost))
    }

    /// Retires every shared state at `now` and returns what they counted, policy by policy
    /// (see [`Inherited::hand_on`]), with what was inherited here and is still in use. No
    /// state is created here afterwards.
    pub(super) fn retire(&self, now: u64) -> Inherited {
        // Release: published to creators through the bucket locks taken below.
        self.closed.store(true, Ordering::Release);
        let mut handed = self.inherited.still_in_use(now);
        // `retain_sync` takes every bucket's lock in turn: a creator that took one before us
        // has inserted its state, and one after us sees the flag. Every state is retired, at
        // rest or not, so none admits again.
        self.states.retain_sync(|policy, state| {
            let counted = state.retire_with_carry(now);
            handed.extend(self.inherited.hand_on(policy, counted, now));
            true
        });
        handed
    }
}
