//! What a generation's table stores per key: one table type per algorithm, so each state is
//! its algorithm's cell with no enum around it, plus the table of a per-key policy's states.

use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::clock::{Clock, Fixed};
use crate::decision::Decision;
use crate::engine::any_state::{any_state, AnyState};
use crate::engine::cells::{Boxed, Cells};
use crate::engine::dispatch::{with_state, Builder, PerAlgorithm, Storage};
use crate::engine::rebuilds::Rebuilds;
use crate::engine::state::{Bound, Carry, Decides, RateState};
use crate::error::CostError;
use crate::policy::Policy;
use crate::reservation::Marks;

use super::overflow::{Inherited, OneOverflow, PolicyOverflows};
use super::rules::{Resolved, Resolver, Rules};
use super::striped::Hot;
use super::table::Table;

/// One table per kind of state, chosen once per generation: a single predictable branch per
/// call, and each table stores its algorithm's cell with no enum padding.
pub(super) enum AnyKeys<K, S: BuildHasher> {
    /// One policy for every key: the map of its algorithm's state.
    Uniform(PerAlgorithm<KeysStorage<K, S>>),
    /// A policy per key: each state keeps its parameters.
    PerKey(Keys<K, AnyState, S>),
}

/// A generation's map for one algorithm's state.
pub(super) struct KeysStorage<K, S>(PhantomData<(K, S)>);

impl<K, S: BuildHasher> Storage for KeysStorage<K, S> {
    type Stored<St: RateState> = Keys<K, St, S>;
}

/// Runs `$body` with `$keyed` bound to whichever table a generation's keys are in.
macro_rules! with_keys {
    ($keys:expr, $keyed:ident => $body:expr) => {
        match $keys {
            AnyKeys::Uniform(uniform) => with_state!(uniform, $keyed => $body),
            AnyKeys::PerKey($keyed) => $body,
        }
    };
}
pub(super) use with_keys;

pub(super) struct Keys<K, St: KeyState<K>, S: BuildHasher> {
    pub(super) table: Table<K, St, St::Cells, S>,
    pub(super) params: St::Params,
    /// What new keys share once the limiter tracks `max_keys` keys.
    pub(super) overflow: St::Overflow,
    /// The keys striped (the token bucket's table only: see `keyed::striped`).
    pub(super) hot: Hot,
}

/// What a generation's table stores per key: a state machine and how to build one for a key.
pub(super) trait KeyState<K>: Sized + Send + Sync + 'static {
    /// Shared by every key of the map: the policy's parameters, or the resolver.
    type Params: Send + Sync;
    /// How the table keeps states of this type.
    type Cells: Cells<Self>;
    /// Whether a contended key's state is spread over stripes (`keyed::striped`).
    const STRIPED: bool;

    /// The state bound to what it is decided under: the table's parameters for a uniform
    /// policy, its own for a per-key one.
    type Decider<'a>: Decides
    where
        Self: 'a;
    fn bind<'a>(&'a self, params: &'a Self::Params) -> Self::Decider<'a>;

    /// What a new state for a key is built from: nothing for a uniform policy, the key's
    /// policy under a resolver.
    type Blueprint;
    /// The blueprint of a new state from `resolved`, the answer of the resolver in force when the
    /// request looked (see `Generations::resolve`): `None` when this map's resolver is not the
    /// one that answered (a policy change came in between), so the caller asks again.
    fn blueprint(params: &Self::Params, resolved: Option<&Resolved<K>>) -> Option<Self::Blueprint>;
    /// The most a new state of `blueprint` would accept: checked before anything is created.
    fn max_cost_for(params: &Self::Params, blueprint: &Self::Blueprint) -> u64;
    /// A new state of `blueprint`: fresh, or carrying permits from an older generation.
    fn build(
        params: &Self::Params,
        blueprint: &Self::Blueprint,
        carry: Option<&Carry>,
        now: u64,
    ) -> Self;

    /// The policy of `blueprint`, when each key has its own (`None` for a uniform policy): what a
    /// reservation decided by the shared overflow state keeps, to be settled there.
    fn blueprint_policy(blueprint: &Self::Blueprint) -> Option<Policy>;
    /// The blueprint of the overflow state that decided a reservation: the policy it recorded
    /// (`recorded`), else `resolved` as in [`KeyState::blueprint`].
    fn overflow_blueprint(
        params: &Self::Params,
        recorded: Option<&Policy>,
        resolved: Option<&Resolved<K>>,
    ) -> Option<Self::Blueprint>;

    /// The state(s) shared by new keys that find the limiter full (see `keyed::overflow`).
    type Overflow: Send + Sync;
    /// New shared state(s), counting what the replaced generation's counted (as of `now`).
    fn new_overflow(params: &Self::Params, inherited: Inherited, now: u64) -> Self::Overflow;
    /// Decides a request of a new key of `blueprint` on the shared overflow state; `None` when a
    /// policy change retired it (the caller starts over in the new generation).
    fn overflow_acquire<C: Clock + ?Sized>(
        overflow: &Self::Overflow,
        params: &Self::Params,
        blueprint: &Self::Blueprint,
        clock: &C,
        cost: u64,
    ) -> Option<Result<(Decision, Marks), CostError>>;
    /// Settles a reservation that the shared overflow state for `blueprint` admitted; `false` when
    /// a policy change retired it.
    fn overflow_settle<C: Clock + ?Sized>(
        overflow: &Self::Overflow,
        params: &Self::Params,
        blueprint: &Self::Blueprint,
        settle: &Settle<'_>,
        clock: &C,
    ) -> bool;
    /// The permits in use at `now` on the overflow state of `blueprint`: `Some(None)` when it is at
    /// rest (or was never used), `None` when a policy change retired it.
    fn overflow_carry(
        overflow: &Self::Overflow,
        params: &Self::Params,
        blueprint: &Self::Blueprint,
        now: u64,
    ) -> Option<Option<Carry>>;
    /// What a request of a new key of `blueprint` would get from the overflow state now; `None`
    /// when a policy change retired it.
    fn overflow_peek<C: Clock + ?Sized>(
        overflow: &Self::Overflow,
        params: &Self::Params,
        blueprint: &Self::Blueprint,
        clock: &C,
        cost: u64,
    ) -> Option<Decision>;
}

/// A reservation being settled: what it holds, where it stood, and what it really cost.
pub(super) struct Settle<'a> {
    pub(super) held: u64,
    pub(super) marks: Marks,
    pub(super) actual: u64,
    /// The limiter's count of rebuilds when the reservation was made.
    pub(super) made: u64,
    /// The limiter's count now, read again once the state to settle on is found.
    pub(super) rebuilds: &'a Rebuilds,
}

impl Settle<'_> {
    /// Settles on `state` at `now` (read once the state is found: a slow resolver or a wait
    /// for a lock must not leave it stale); `None` when the state was retired. A refund on a
    /// state found after a `reset` or a policy change gives nothing back (see `Rebuilds`).
    pub(super) fn on(&self, state: impl Decides, now: u64) -> Option<()> {
        self.apply(|held, marks, actual| state.settle(held, marks, actual, now))
    }

    /// Settles with `settle`, given what the reservation held, its marks and what it really
    /// cost (see [`Settle::on`]).
    pub(super) fn apply(&self, settle: impl FnOnce(u64, &Marks, u64) -> Option<()>) -> Option<()> {
        self.rebuilds
            .settle_unless_rebuilt(self.made, self.held, self.actual, || {
                settle(self.held, &self.marks, self.actual)
            })
    }
}

impl<K, St: RateState> KeyState<K> for St {
    type Params = St::Params;
    type Cells = St::Cells;
    const STRIPED: bool = St::STRIPED;

    type Decider<'a> = Bound<'a, St>;

    #[inline(always)]
    fn bind<'a>(&'a self, params: &'a St::Params) -> Bound<'a, St> {
        Bound {
            state: self,
            params,
        }
    }

    /// Every key's state is built from the policy's parameters alone.
    type Blueprint = ();

    #[inline(always)]
    fn blueprint(_: &St::Params, _: Option<&Resolved<K>>) -> Option<()> {
        Some(())
    }

    fn max_cost_for(params: &St::Params, (): &()) -> u64 {
        St::max_cost(params)
    }

    fn build(params: &St::Params, (): &(), carry: Option<&Carry>, now: u64) -> Self {
        St::new(params, carry, now)
    }

    fn blueprint_policy((): &()) -> Option<Policy> {
        None
    }

    /// The one overflow state of the generation.
    fn overflow_blueprint(
        _: &St::Params,
        _: Option<&Policy>,
        _: Option<&Resolved<K>>,
    ) -> Option<()> {
        Some(())
    }

    /// One state shared by every overflowing key.
    type Overflow = OneOverflow<St>;

    fn new_overflow(params: &St::Params, inherited: Inherited, now: u64) -> OneOverflow<St> {
        OneOverflow::new(params, inherited, now)
    }

    fn overflow_acquire<C: Clock + ?Sized>(
        overflow: &OneOverflow<St>,
        params: &St::Params,
        (): &(),
        clock: &C,
        cost: u64,
    ) -> Option<Result<(Decision, Marks), CostError>> {
        if let Err(refused) = CostError::within(cost, St::max_cost(params)) {
            return Some(Err(refused));
        }
        overflow.state.reserve(params, clock, cost).map(Ok)
    }

    fn overflow_settle<C: Clock + ?Sized>(
        overflow: &OneOverflow<St>,
        params: &St::Params,
        (): &(),
        settle: &Settle<'_>,
        clock: &C,
    ) -> bool {
        settle
            .on(
                Bound {
                    state: &*overflow.state,
                    params,
                },
                clock.now(),
            )
            .is_some()
    }

    fn overflow_carry(
        overflow: &OneOverflow<St>,
        params: &St::Params,
        (): &(),
        now: u64,
    ) -> Option<Option<Carry>> {
        if overflow.state.is_at_rest(params, now) {
            // A retired state is never at rest.
            return Some(None);
        }
        overflow.state.carry(params, now).map(Some)
    }

    fn overflow_peek<C: Clock + ?Sized>(
        overflow: &OneOverflow<St>,
        params: &St::Params,
        (): &(),
        clock: &C,
        cost: u64,
    ) -> Option<Decision> {
        overflow.state.peek(params, clock, cost)
    }
}

impl<K> KeyState<K> for AnyState {
    type Params = Arc<Resolver<K>>;
    /// Keys of different policies differ in layout: one box each.
    type Cells = Boxed;
    /// A resolver's keys are not striped: each has its own policy.
    const STRIPED: bool = false;

    type Decider<'a> = &'a AnyState;

    #[inline(always)]
    fn bind<'a>(&'a self, _: &'a Self::Params) -> &'a AnyState {
        self
    }

    /// The policy the resolver chose for the key.
    type Blueprint = Policy;

    fn blueprint(resolver: &Self::Params, resolved: Option<&Resolved<K>>) -> Option<Policy> {
        resolved
            .filter(|resolved| Arc::ptr_eq(&resolved.resolver, resolver))
            .map(|resolved| resolved.policy)
    }

    fn max_cost_for(_: &Self::Params, policy: &Policy) -> u64 {
        policy.max_cost()
    }

    fn build(_: &Self::Params, policy: &Policy, carry: Option<&Carry>, now: u64) -> Self {
        any_state(policy, carry, now)
    }

    fn blueprint_policy(policy: &Policy) -> Option<Policy> {
        Some(*policy)
    }

    /// The overflow state of the policy the reservation was decided under, not of the one the
    /// resolver gives the key now (its answer may have changed since).
    fn overflow_blueprint(
        resolver: &Self::Params,
        recorded: Option<&Policy>,
        resolved: Option<&Resolved<K>>,
    ) -> Option<Policy> {
        recorded
            .copied()
            .or_else(|| Self::blueprint(resolver, resolved))
    }

    /// One shared state per policy the resolver returns for overflowing keys.
    type Overflow = PolicyOverflows;

    fn new_overflow(_: &Self::Params, inherited: Inherited, _: u64) -> PolicyOverflows {
        PolicyOverflows::new(inherited)
    }

    fn overflow_acquire<C: Clock + ?Sized>(
        overflow: &PolicyOverflows,
        _: &Self::Params,
        policy: &Policy,
        clock: &C,
        cost: u64,
    ) -> Option<Result<(Decision, Marks), CostError>> {
        overflow.acquire(policy, clock, cost)
    }

    fn overflow_settle<C: Clock + ?Sized>(
        overflow: &PolicyOverflows,
        _: &Self::Params,
        policy: &Policy,
        settle: &Settle<'_>,
        clock: &C,
    ) -> bool {
        overflow.settle(policy, settle.actual > settle.held, clock.now(), |state| {
            settle.on(state, clock.now())
        })
    }

    fn overflow_carry(
        overflow: &PolicyOverflows,
        _: &Self::Params,
        policy: &Policy,
        now: u64,
    ) -> Option<Option<Carry>> {
        overflow.carry(policy, now)
    }

    fn overflow_peek<C: Clock + ?Sized>(
        overflow: &PolicyOverflows,
        _: &Self::Params,
        policy: &Policy,
        clock: &C,
        cost: u64,
    ) -> Option<Decision> {
        overflow.peek(policy, clock, cost)
    }
}

impl<K: Hash + Eq, St: KeyState<K>, S: BuildHasher> Keys<K, St, S> {
    pub(super) fn new(
        params: St::Params,
        hasher: S,
        inherited: Inherited,
        now: u64,
        changes: &Arc<AtomicU64>,
    ) -> Self {
        Keys {
            table: Table::with_hasher(hasher),
            overflow: St::new_overflow(&params, inherited, now),
            params,
            hot: Hot::new(<St as KeyState<K>>::STRIPED, Arc::clone(changes)),
        }
    }

    /// Whether the shared overflow state of `blueprint` would admit a request of `cost` at
    /// `now` (not when a policy change retired it).
    pub(super) fn shared_admits(&self, blueprint: &St::Blueprint, cost: u64, now: u64) -> bool {
        St::overflow_peek(&self.overflow, &self.params, blueprint, &Fixed(now), cost)
            .is_some_and(|decision| decision.is_allowed())
    }

    /// What `state`, built for a key and seen by no one else yet, would decide on a request
    /// of `cost` at `now`.
    pub(super) fn peek_new(&self, state: &St, cost: u64, now: u64) -> Decision {
        match state.bind(&self.params).peek(&Fixed(now), cost) {
            Some(decision) => decision,
            None => unreachable!("a state just built is live"),
        }
    }
}

impl<K: Hash + Eq + 'static, S: BuildHasher + 'static> AnyKeys<K, S> {
    /// The tables of a generation under `rules`, its shared overflow state(s) counting what
    /// the replaced generation's counted at `now` (`inherited`).
    /// `changes` is the limiter's count of changes that a thread's last hit must see
    /// (`keyed::last_hit`).
    pub(super) fn new(
        rules: &Rules<K>,
        hasher: S,
        inherited: Inherited,
        now: u64,
        changes: &Arc<AtomicU64>,
    ) -> Self {
        struct New<'c, S>(S, Inherited, u64, &'c Arc<AtomicU64>);
        impl<K: Hash + Eq, S: BuildHasher> Builder<KeysStorage<K, S>> for New<'_, S> {
            fn build<St: RateState>(self, params: St::Params) -> Keys<K, St, S> {
                Keys::new(params, self.0, self.1, self.2, self.3)
            }
        }
        match rules {
            Rules::PerKey(resolver) => {
                AnyKeys::PerKey(Keys::new(resolver.clone(), hasher, inherited, now, changes))
            }
            Rules::Uniform(policy) => AnyKeys::Uniform(PerAlgorithm::new(
                policy,
                New(hasher, inherited, now, changes),
            )),
        }
    }

    /// Retires this generation's shared overflow state(s) for a policy change: what they
    /// counted at `now`, for the new generation's to inherit.
    pub(super) fn retire_overflow(&self, rules: &Rules<K>, now: u64) -> Inherited {
        match (self, rules) {
            (AnyKeys::Uniform(uniform), Rules::Uniform(policy)) => with_state!(uniform, keyed => {
                keyed.overflow.retire(&keyed.params, policy, now)
            }),
            (AnyKeys::PerKey(keyed), _) => keyed.overflow.retire(now),
            // A generation's keys are built from its own rules: never met.
            (AnyKeys::Uniform(_), Rules::PerKey(_)) => Inherited::default(),
        }
    }
}
