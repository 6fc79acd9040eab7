//! A key the current generation's table does not have: the cold miss. The key's state is
//! created under its bucket lock (with what an older generation or a full limiter's shared
//! overflow state holds for it) and decided on, or, with the limiter full, the request is
//! decided on the shared overflow state.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use scc::Guard;

use crate::bounded::SWEEP_WHEN_FULL;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::engine::dispatch::with_state;
use crate::engine::retry::Retry;
use crate::engine::state::{built_from, Carry, Decides, KeptCarry};
use crate::error::CostError;
use crate::policy::Policy;

use super::generations::{Generation, Generations};
use super::key_state::{with_keys, AnyKeys, KeyState, Keys, Settle};
use super::request::{Decided, Job};
use super::rules::{Resolved, Rules};
use super::table::TableEntry;

/// What a settle's pass through the creation path returns in place of a decision.
const SETTLED: Decided = Decided {
    decision: Decision::allow(0, 0, 0),
    marks: [0; Policy::MAX_BANDS + 1],
    overflow: None,
    created: false,
};

/// How far one attempt at a decision got.
enum Attempt {
    /// Decided (or the cost refused).
    Done(Result<Decided, CostError>),
    /// Decided on a state just created for the key.
    Created(Result<Decided, CostError>),
    /// The generation was replaced: start over in the new one.
    Stale,
}

impl<K: Hash + Eq + Clone + 'static, C: Clock, S: BuildHasher + Clone + 'static>
    Generations<K, C, S>
{
    /// A key not in the current generation's map: straight to the map's entry API, which
    /// looks the key up once and decides on the state it finds or creates. Starts over in
    /// the new generation when a policy change replaced the one it looked in.
    ///
    /// Asked to settle, it finds or creates the key's state the same way and settles the
    /// reservation on it instead of deciding a request: a charge for a key whose state is
    /// gone. The decision returned then means nothing.
    #[cold]
    #[inline(never)]
    pub(super) fn miss<Q>(&self, key: &Q, ask: Job<'_>) -> Result<Decided, CostError>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        let mut resolved = None;
        let mut retry = Retry::new();
        loop {
            resolved = self.resolve(key, resolved);
            // Held across the attempt, so the map's own guard inside is a cheap nested one.
            let guard = Guard::new();
            let generation = self.generation(&guard);
            let step = with_keys!(&generation.keys, keyed => {
                self.create_in(generation, keyed, key, ask, resolved.as_ref(), &guard)
            });
            match step {
                Attempt::Done(result) => return result,
                Attempt::Created(result) => {
                    // Pay for a few steps of the incremental sweep, now that no lock is held.
                    if self.sweep_slice > 0 {
                        self.sweep(generation, self.sweep_slice, true, &guard);
                    }
                    self.kept.clear_when_grown(self.clock.now());
                    return result;
                }
                // The generation was replaced, or is being replaced (a policy change between
                // retiring the shared overflow state and swapping the new generation in):
                // yield, then decide in the new one.
                Attempt::Stale => retry.snooze(),
            }
        }
    }

    /// Under the key's bucket in `generation`'s map, held exclusively: decides on the key's
    /// state if a racing first request created it meanwhile (the entry API gives both the
    /// same state), else creates it, carrying permits from an older generation if the key is
    /// still there, then decides.
    ///
    /// `resolved` is the answer of the resolver (if any), which ran before any of this (see
    /// [`resolve`](Self::resolve)); a policy change that came in since makes the attempt stale.
    fn create_in<Q, St: KeyState<K>>(
        &self,
        generation: &Generation<K, S>,
        keyed: &Keys<K, St, S>,
        key: &Q,
        ask: Job<'_>,
        resolved: Option<&Resolved<K>>,
        guard: &Guard,
    ) -> Attempt
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        let Some(blueprint) = St::blueprint(&keyed.params, resolved) else {
            return Attempt::Stale;
        };
        // A settle or a move passes every cost check: it decides no request.
        let (cost, settle) = match ask {
            Job::Decide(cost) => (cost, None),
            Job::Settle(settle) => (0, Some(settle)),
            Job::Move => (0, None),
        };
        let moving = matches!(ask, Job::Move);
        let mut owned = K::from(key.to_owned());
        let mut swept = false;
        loop {
            let entry = keyed.table.entry(owned);
            // We hold the bucket exclusively (see `Generations::still_current`).
            if !self.still_current(generation, guard) {
                return Attempt::Stale;
            }
            // Every path that retires a state unlinks it under the same hold of its bucket
            // lock (see `keyed::table`), and we hold that lock: the state found here is live.
            let decide = |state: &St| {
                if moving {
                    return Ok(SETTLED);
                }
                if let Some(settle) = settle {
                    let settled =
                        settle.on(KeyState::<K>::bind(state, &keyed.params), self.clock.now());
                    debug_assert!(settled.is_some(), "a state in the table is live");
                    return Ok(SETTLED);
                }
                match state.bind(&keyed.params).reserve_checked(&self.clock, cost) {
                    Some(decided) => decided.map(Decided::own),
                    None => unreachable!("a state in the table under its bucket lock is live"),
                }
            };
            let entry = match entry {
                // The entry holds the bucket until the decision is made.
                TableEntry::Occupied(entry) => return Attempt::Done(decide(entry.get())),
                TableEntry::Vacant(entry) => entry,
            };
            // A cost that could never be admitted creates nothing and moves nothing (a key
            // still in an older generation stays there).
            if let Err(refused) =
                CostError::within(cost, St::max_cost_for(&keyed.params, &blueprint))
            {
                return Attempt::Done(Err(refused));
            }
            let now = self.clock.now();
            // A key still in an older generation moves here: its place is already counted, so
            // it takes no new one.
            let moved = self.take_from_older(generation, key, now, guard);
            // A state made for a key new to the limiter, not moved from an older generation.
            let created = moved.is_none();
            if moving && created {
                // Gone from the older generations meanwhile: nothing to move.
                return Attempt::Done(Ok(SETTLED));
            }
            if created && !self.take_place() {
                if !swept {
                    // Full: let go of the bucket (the sweep may need it), sweep a larger slice
                    // for states at rest, then try once more with the same blueprint.
                    owned = entry.into_key();
                    self.sweep(generation, SWEEP_WHEN_FULL, false, guard);
                    swept = true;
                    continue;
                }
                return self.at_cap(keyed, &blueprint, key, settle, cost, now);
            }
            // A key new to the table may have spent permits on the shared overflow state while
            // the limiter was full (its requests are decided there under this same bucket
            // lock): it starts with what that state still counts.
            let Some(carry) = self.starting_carry(keyed, &blueprint, moved, now) else {
                // A policy change retired the shared state: start over in the new generation,
                // giving back the place taken (only a key not moved took one).
                self.tracked.fetch_sub(1, Ordering::Relaxed);
                return Attempt::Stale;
            };
            let (state, old, own_refuses) = self.starting_state(
                keyed,
                &blueprint,
                key,
                carry,
                (created && settle.is_none(), cost),
                now,
            );
            if own_refuses && (swept || !keyed.shared_admits(&blueprint, cost, now)) {
                // A key new to the limiter starting with the busy shared state's permits
                // counts them less exactly than that state does (rounded up, stamped now).
                // Where its own state would refuse, the request is decided on the shared
                // state instead: when the limiter was full as the request came (as `peek`
                // and `available` decided it there), and for a refusal, which then creates
                // nothing and stamps nothing again. Never otherwise: admissions on the
                // shared state below the cap would keep it busy, and every new key on it.
                // The place taken goes back.
                self.tracked.fetch_sub(1, Ordering::Relaxed);
                return self.overflow(keyed, &blueprint, settle, cost);
            }
            let Some(entry) = entry.insert(state) else {
                // No place left for a state (a slab's 2^28 - 32 cells): the new key shares the overflow
                // state, and gives back the place it took in `tracked`.
                self.tracked.fetch_sub(1, Ordering::Relaxed);
                return self.at_cap(keyed, &blueprint, key, settle, cost, now);
            };
            if carry.is_some() || old.is_some() {
                // Under the bucket lock, before any request decides on the state: the key's
                // next move (or creation) reads what is kept after this.
                let counted = KeyState::<K>::bind(entry.get(), &keyed.params).carry(now);
                self.kept
                    .keep(key, (carry.as_ref(), old.as_ref()), counted, now);
            }
            let decided = decide(entry.get()).map(|decided| Decided { created, ..decided });
            return Attempt::Created(decided);
        }
    }

    /// Decides (or settles) a request of `key`, new to the limiter, that finds it full: a
    /// key with permits kept (`keyed::kept`) is refused by a state built from them and the
    /// shared overflow state's count, when that state refuses (the shared state does not know
    /// them; nothing is created); every other request is decided on the shared state. Stale
    /// when a policy change retired the shared state.
    fn at_cap<Q, St: KeyState<K>>(
        &self,
        keyed: &Keys<K, St, S>,
        blueprint: &St::Blueprint,
        key: &Q,
        settle: Option<&Settle<'_>>,
        cost: u64,
        now: u64,
    ) -> Attempt
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if settle.is_none() {
            match self.kept_refusal(keyed, blueprint, key, cost, now) {
                None => return Attempt::Stale,
                Some(Some(refused)) => {
                    return Attempt::Done(Ok(Decided {
                        decision: refused,
                        marks: [0; Policy::MAX_BANDS + 1],
                        overflow: None,
                        created: false,
                    }))
                }
                Some(None) => {}
            }
        }
        self.overflow(keyed, blueprint, settle, cost)
    }

    /// At the cap, the refusal of a request of `cost` for `key` by a state built from what is
    /// kept for it and the shared overflow state's count (`Some(None)` when nothing is kept
    /// or that state admits; `None` when a policy change retired the shared state).
    pub(super) fn kept_refusal<Q, St: KeyState<K>>(
        &self,
        keyed: &Keys<K, St, S>,
        blueprint: &St::Blueprint,
        key: &Q,
        cost: u64,
        now: u64,
    ) -> Option<Option<Decision>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let Some(old) = self.kept.read(key, now) else {
            return Some(None);
        };
        let shared = St::overflow_carry(&keyed.overflow, &keyed.params, blueprint, now)?;
        let state = built_state(keyed, blueprint, shared, Some(&old), now);
        let decision = keyed.peek_new(&state, cost, now);
        Some((!decision.is_allowed()).then(|| decision.overflowed()))
    }

    /// Decides (or settles) on the state shared by new keys that find the limiter full;
    /// stale when a policy change retired it.
    fn overflow<St: KeyState<K>>(
        &self,
        keyed: &Keys<K, St, S>,
        blueprint: &St::Blueprint,
        settle: Option<&Settle<'_>>,
        cost: u64,
    ) -> Attempt {
        if let Some(settle) = settle {
            if St::overflow_settle(
                &keyed.overflow,
                &keyed.params,
                blueprint,
                settle,
                &self.clock,
            ) {
                return Attempt::Done(Ok(SETTLED));
            }
            return Attempt::Stale;
        }
        match St::overflow_acquire(&keyed.overflow, &keyed.params, blueprint, &self.clock, cost) {
            Some(shared) => Attempt::Done(shared.map(|(decision, marks)| Decided {
                decision: decision.overflowed(),
                marks,
                overflow: St::blueprint_policy(blueprint).map(Box::new),
                created: false,
            })),
            None => Attempt::Stale,
        }
    }

    /// What a new state of `blueprint` for a key starts with at `now`: what it `moved` with from
    /// an older generation, else what the shared overflow state counts (the one of `blueprint`'s
    /// policy). `Some(None)` for a fresh state (the shared state at rest, or a limiter with
    /// no cap, where no key ever overflows); `None` when a policy change retired the shared
    /// state (never for a key that moved).
    ///
    /// Every key that overflowed spent its permits there, and that state counts no fewer
    /// than any one of them spent, so a key starting with that count is never admitted
    /// beyond its policy, counting what it spent while it shared. The price falls on keys
    /// that never overflowed but get their state while the shared one is busy: they start
    /// with its permits spent (until it comes to rest, and only after a flood
    /// filled the limiter or its table). An unused shared state is at rest: `Some(None)`.
    pub(super) fn starting_carry<St: KeyState<K>>(
        &self,
        keyed: &Keys<K, St, S>,
        blueprint: &St::Blueprint,
        moved: Option<Carry>,
        now: u64,
    ) -> Option<Option<Carry>> {
        if moved.is_some() {
            return Some(moved);
        }
        // Asked even without a cap: a table out of places sends new keys to the shared
        // state as a full limiter does (see `create_in`).
        St::overflow_carry(&keyed.overflow, &keyed.params, blueprint, now)
    }

    /// The state `key` starts with at `now` when this generation does not track it, built
    /// from `fresh` (what [`starting_carry`](Generations::starting_carry) found) and what an
    /// earlier move could not carry (`keyed::kept`), with the latter; and, for a request
    /// of `cost` of a key `new` to the limiter, whether that state would refuse it while
    /// counting nothing but the shared overflow state's permits (rounded up, stamped now),
    /// the case in which the shared state may decide instead (see `create_in`).
    pub(super) fn starting_state<Q, St: KeyState<K>>(
        &self,
        keyed: &Keys<K, St, S>,
        blueprint: &St::Blueprint,
        key: &Q,
        fresh: Option<Carry>,
        (new, cost): (bool, u64),
        now: u64,
    ) -> (St, Option<KeptCarry>, bool)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let old = self.kept.read(key, now);
        let state = built_state(keyed, blueprint, fresh, old.as_ref(), now);
        let own_refuses = new
            && fresh.is_some()
            && old.is_none()
            && !keyed.peek_new(&state, cost, now).is_allowed();
        (state, old, own_refuses)
    }

    /// The per-key resolver's answer for `key`, when the limiter has one: `previous` when the
    /// resolver in force is the one that gave it, else a new call.
    ///
    /// It runs before any bucket is taken and outside the epoch guard of the maps, and once
    /// per creation attempt: a slow resolver (a database lookup of the customer's tier) delays
    /// only this request and holds back neither another key nor the reclamation of memory the
    /// maps free, and one that asks the limiter about other keys cannot wait on a lock its own
    /// request holds. Racing first requests for the key may each call it; the first to insert
    /// decides the state's policy.
    pub(super) fn resolve<Q>(&self, key: &Q, previous: Option<Resolved<K>>) -> Option<Resolved<K>>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        let resolver = {
            let guard = Guard::new();
            match &self.generation(&guard).rules {
                Rules::Uniform(_) => return None,
                Rules::PerKey(resolver) => Arc::clone(resolver),
            }
        };
        match previous {
            Some(previous) if Arc::ptr_eq(&previous.resolver, &resolver) => Some(previous),
            _ => {
                let policy = resolver(&K::from(key.to_owned()));
                Some(Resolved { resolver, policy })
            }
        }
    }

    /// Takes a place for a new key, if the limiter is below `max_keys`.
    fn take_place(&self) -> bool {
        // Relaxed: `tracked` is only a count; the exclusive bucket lock held by the caller
        // orders the insertion that follows. It is incremented before an insertion and
        // decremented after a removal, so it never falls below the keys present: the cap holds
        // however requests, sweeps and evictions interleave.
        if self.max_keys == usize::MAX {
            self.tracked.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        self.tracked
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max_keys).then_some(n + 1)
            })
            .is_ok()
    }
}

/// A state of `blueprint` built from `fresh` and what was kept, `old`, as [`built_from`]
/// says.
fn built_state<K, St: KeyState<K>, S: BuildHasher>(
    keyed: &Keys<K, St, S>,
    blueprint: &St::Blueprint,
    fresh: Option<Carry>,
    old: Option<&KeptCarry>,
    now: u64,
) -> St {
    let (carry, at) = built_from(fresh, old, now);
    St::build(&keyed.params, blueprint, carry.as_ref(), at)
}
