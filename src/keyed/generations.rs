//! A limiter's generations, and what every operation on its keys shares.
//!
//! A policy change starts a new generation (a new map); a key moves into it on its next
//! request, carrying the permits it has in use, and a generation that has drained is
//! unlinked. [`Generations`] holds the current generation and the chain of older ones, the
//! clock, the count of keys tracked and the count of rebuilds: the requests, sweeps and
//! settles of `request`, `sweep` and `settle` are its methods.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{fence, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};

use crossbeam_utils::CachePadded;
use scc::{AtomicShared, Guard, Shared, Tag};

use crate::bounded::SWEEP_PER_INSERT;
use crate::clock::Clock;
use crate::engine::dispatch::with_state;
use crate::engine::rebuilds::Rebuilds;
use crate::engine::state::{Carry, Decides};
use crate::policy::Policy;
use crate::reservation::next_limiter_id;

use super::kept::Kept;
use super::key_state::{with_keys, AnyKeys, KeyState};
use super::last_hit::LastHits;
use super::overflow::Inherited;
use super::rules::Rules;

/// The keys' states under one policy (or one resolver), and the generation it replaced.
pub(super) struct Generation<K, S: BuildHasher> {
    pub(super) rules: Rules<K>,
    pub(super) keys: AnyKeys<K, S>,
    /// The previous generation while it may still hold states; null once it has drained.
    pub(super) older: AtomicShared<Generation<K, S>>,
    /// Where the incremental sweep stopped: the next step starts at this key (or at the
    /// beginning). `try_lock`ed, so one thread sweeps a generation at a time.
    pub(super) sweep_cursor: Mutex<Option<K>>,
    /// How long a state must have been at rest before routine sweeping removes it: the
    /// policy's longest window, so a key used now and then is not removed and re-created
    /// over and over. (`evict_idle` and a full limiter remove any state at rest.)
    pub(super) sweep_grace: u64,
}

/// The first answer `found` gives for the generations older than `generation`, newest first.
pub(super) fn first_in_older<K, S: BuildHasher, R>(
    generation: &Generation<K, S>,
    guard: &Guard,
    mut found: impl FnMut(&Generation<K, S>) -> Option<R>,
) -> Option<R> {
    // Acquire: pairs with the Release swap that linked each older generation.
    let mut older = generation.older.load(Ordering::Acquire, guard);
    while let Some(old) = older.as_ref() {
        if let Some(answer) = found(old) {
            return Some(answer);
        }
        older = old.older.load(Ordering::Acquire, guard);
    }
    None
}

impl<K: Hash + Eq + Clone + 'static, S: BuildHasher> Generation<K, S> {
    /// Whether this generation, already replaced, holds no state and never will again.
    ///
    /// Why "never again": a generation gains a state only in `Generations::create_in`, from a
    /// request that holds the key's bucket exclusively and found the generation current
    /// *after* taking the bucket. This check runs after the swap that replaced the generation (the
    /// caller reached it through a newer generation's link) and takes every bucket of the map
    /// in turn (`begin_sync` on a map without entries visits them all, as `retain_sync`
    /// does). For each such request, either this pass took the bucket after the request let
    /// go of it, and then sees the state it inserted; or the pass took it first, and then the
    /// request took it after the pass, so after the swap, and found the generation replaced.
    /// The one outcome that would break this, the request's load of `current` missing the
    /// swap while this pass misses the request's hold of the bucket, is what the two SeqCst
    /// fences forbid (here between learning of the swap and the pass, in
    /// [`Generations::still_current`] between taking the bucket and loading `current`). So a
    /// generation found drained
    /// stays empty: unlinking it loses no key's spent permits, and readers still inside it
    /// are protected by their epoch guards.
    pub(super) fn is_drained(&self) -> bool {
        // SeqCst: see above; pairs with the fence in `Generations::still_current`.
        fence(Ordering::SeqCst);
        with_keys!(&self.keys, keyed => keyed.table.is_empty_locked())
    }

    /// Unlinks every generation older than this one that has drained, so that no request
    /// walks it again and its map is freed. The caller holds the limiter's `config` lock,
    /// which serialises every change of the links.
    pub(super) fn unlink_drained(&self, guard: &Guard) {
        let mut newer = self;
        // Acquire: pairs with the Release that linked each older generation, so its map is
        // seen whole.
        while let Some(old) = newer.older.load(Ordering::Acquire, guard).as_ref() {
            if old.is_drained() {
                // AcqRel: publishes the new link to walkers that load it with Acquire. A
                // walker still on the old link reaches the same generations through `old`.
                newer.older.swap(
                    (old.older.get_shared(Ordering::Acquire, guard), Tag::None),
                    Ordering::AcqRel,
                );
            } else {
                newer = old;
            }
        }
    }
}

/// The keys of one limiter: its generations (the current one and the older ones still
/// linked), and what every request, sweep and settle on them shares.
pub(super) struct Generations<K, C, S: BuildHasher> {
    /// The generation requests go to. Never null.
    current: AtomicShared<Generation<K, S>>,
    pub(super) clock: C,
    /// Builds the map of each new generation, and hashes the key of each reservation.
    pub(super) hasher: S,
    /// Keys tracked now, over all generations: incremented before an insertion (under the
    /// bucket's exclusive lock) and decremented after a removal, so it never falls below the
    /// keys present.
    pub(super) tracked: CachePadded<AtomicUsize>,
    /// Serialises policy changes and the unlinking of drained generations (cold paths only).
    config: Mutex<()>,
    /// The most keys tracked at once; new keys past it share an overflow state.
    pub(super) max_keys: usize,
    /// How many entries each new key's insertion sweeps for idle states (0: never).
    pub(super) sweep_slice: usize,
    /// Whether a contended token bucket key may be striped (`RateLimiter::striping`).
    pub(super) may_stripe: bool,
    /// Tells this limiter's reservations from another's.
    pub(super) id: u64,
    /// States forgotten or rebuilt so far (`reset`, a policy change): a reservation made
    /// before one gets no refund (see `settle`). Each counts itself before it retires the
    /// state(s) it replaces and again once the new ones are published; a refund would land
    /// on a state that never held its permits (a reset's fresh one, or one built under
    /// another policy, which reads the marks differently), while a charge still lands, as it
    /// reads no mark. Limiter-wide, so a reset of one key also withholds the refunds of
    /// reservations outstanding on others: those give back less, never more.
    pub(super) rebuilds: Rebuilds,
    /// Counts the changes after which a thread's last hit (`keyed::last_hit`) is decided
    /// through the table again: a new generation, a key striped.
    pub(super) changes: Arc<AtomicU64>,
    /// Each thread's last hit (`keyed::last_hit`).
    pub(super) last_hits: LastHits<K>,
    /// What moves could not carry, until it would have come back (`keyed::kept`).
    pub(super) kept: Kept<K, S>,
}

impl<K: Hash + Eq + Clone + Send + 'static, C, S: BuildHasher + Clone + 'static>
    Generations<K, C, S>
{
    /// One generation under `rules`, no key tracked, no cap.
    pub(super) fn new(rules: Rules<K>, clock: C, hasher: S) -> Self {
        let changes = Arc::new(AtomicU64::new(0));
        let keys = AnyKeys::new(&rules, hasher.clone(), Inherited::default(), 0, &changes);
        let generation = Generation {
            sweep_grace: rules.sweep_grace(),
            rules,
            keys,
            older: AtomicShared::null(),
            sweep_cursor: Mutex::new(None),
        };
        Generations {
            current: AtomicShared::new(generation),
            clock,
            kept: Kept::with_hasher(hasher.clone()),
            hasher,
            tracked: CachePadded::new(AtomicUsize::new(0)),
            config: Mutex::new(()),
            max_keys: usize::MAX,
            sweep_slice: SWEEP_PER_INSERT,
            may_stripe: true,
            id: next_limiter_id(),
            rebuilds: Rebuilds::new(),
            changes,
            last_hits: LastHits::new(),
        }
    }
}

impl<K, C, S: BuildHasher> Generations<K, C, S> {
    /// The generation requests go to now.
    #[inline(always)]
    pub(super) fn generation<'g>(&self, guard: &'g Guard) -> &'g Generation<K, S> {
        // Acquire: pairs with the Release swap in `replace_rules`, so the new generation's
        // contents are visible before it is used.
        match self.current.load(Ordering::Acquire, guard).as_ref() {
            Some(generation) => generation,
            None => unreachable!("a limiter always has a current generation"),
        }
    }

    /// How many keys are tracked now.
    pub(super) fn len(&self) -> usize {
        // Relaxed: a snapshot of a statistic.
        self.tracked.load(Ordering::Relaxed)
    }

    /// The policy every key is held to; `None` under a resolver.
    pub(super) fn policy(&self) -> Option<Policy> {
        let guard = Guard::new();
        match &self.generation(&guard).rules {
            Rules::Uniform(policy) => Some(*policy),
            Rules::PerKey(_) => None,
        }
    }

    pub(super) fn lock_config(&self) -> MutexGuard<'_, ()> {
        // The guarded data is `()`: a panic elsewhere cannot leave it inconsistent.
        self.config.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The `config` lock if it is free now (poisoned or not, as `lock_config`).
    pub(super) fn try_lock_config(&self) -> Option<MutexGuard<'_, ()>> {
        match self.config.try_lock() {
            Ok(config) => Some(config),
            Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// Whether `generation` is still current, asked by a request that holds a key's bucket
    /// in it exclusively, about to create the key's state there: the other side of
    /// [`Generation::is_drained`]'s protocol. A generation found no longer current gains no
    /// state from here. One that was current when checked may still gain this key after a
    /// swap: the key is moved out later under this same lock, and the generation is not
    /// unlinked meanwhile, because the pass that confirms it drained waits for this lock.
    pub(super) fn still_current(&self, generation: &Generation<K, S>, guard: &Guard) -> bool {
        // SeqCst: pairs with the fence in `is_drained`; either our load of `current` sees
        // the swap, or that pass sees our hold of the bucket.
        fence(Ordering::SeqCst);
        std::ptr::eq(self.generation(guard), generation)
    }

    /// How many generations are linked now, the current one included: what a new key's
    /// request may walk.
    #[cfg(test)]
    pub(super) fn linked(&self) -> usize {
        let guard = Guard::new();
        let mut linked = 0;
        // Acquire: as every walk of the chain.
        let mut generation = self.current.load(Ordering::Acquire, &guard);
        while let Some(g) = generation.as_ref() {
            linked += 1;
            generation = g.older.load(Ordering::Acquire, &guard);
        }
        linked
    }
}

impl<K: Hash + Eq + Clone + 'static, C: Clock, S: BuildHasher + Clone + 'static>
    Generations<K, C, S>
{
    /// Removes `key` from the older generations, if one still holds it, and returns the
    /// permits its state had in use at `now`. The caller holds the key's bucket in
    /// the current generation exclusively, so no other request can create the key meanwhile.
    pub(super) fn take_from_older<Q>(
        &self,
        generation: &Generation<K, S>,
        key: &Q,
        now: u64,
        guard: &Guard,
    ) -> Option<Carry>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        first_in_older(generation, guard, |old| {
            with_keys!(&old.keys, keyed => {
                // Retired from exactly the snapshot its permits are counted from: a request
                // still holding the old state's slot meets it retired and looks again.
                keyed
                    .table
                    .remove(key, |state| {
                        let carry = KeyState::<K>::bind(state, &keyed.params).retire_with_carry(now);
                        keyed.hot.forget(state);
                        carry
                    })
            })
        })
        // The key keeps its place in `tracked`: the caller inserts it here.
        .flatten()
    }

    pub(super) fn peek_older<Q>(
        &self,
        generation: &Generation<K, S>,
        key: &Q,
        now: u64,
        guard: &Guard,
    ) -> Option<Carry>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        first_in_older(generation, guard, |old| {
            with_keys!(&old.keys, keyed => {
                // Under the bucket lock, where no state is met retired.
                keyed
                    .table
                    .read_locked(key, |state| KeyState::<K>::bind(state, &keyed.params).carry(now))
            })
        })
        .flatten()
    }

    /// Starts a generation under `rules`, unless they are the uniform policy in force (see
    /// `RateLimiter::set_policy` for what keys already tracked keep).
    pub(super) fn replace_rules(&self, rules: Rules<K>) {
        let _config = self.lock_config();
        let guard = Guard::new();
        if let (Rules::Uniform(new), Rules::Uniform(in_force)) =
            (&rules, &self.generation(&guard).rules)
        {
            if new == in_force {
                // Re-applying the policy in force: nothing to move, and the overflow keeps
                // its budget.
                return;
            }
        }
        // The caller's code first (the hasher's clone, the clock), so that nothing it does can
        // leave the shared overflow state retired with no new generation to go to.
        let hasher = self.hasher.clone();
        let now = self.clock.now();
        // Counted from before the shared overflow state is retired to after the new generation
        // is published: a refund never lands on a state of the new generation for a
        // reservation made before (see `Rebuilds`).
        self.rebuilds.around(|| {
            // The keys sharing the overflow state keep what they spent there, as tracked keys
            // keep theirs: the new generation's shared state starts with it. A request that
            // meets the retired one starts over, in the new generation once it is swapped in.
            let replaced = self.generation(&guard);
            let inherited = replaced.keys.retire_overflow(&replaced.rules, now);
            let older = self.current.get_shared(Ordering::Acquire, &guard);
            let keys = AnyKeys::new(&rules, hasher, inherited, now, &self.changes);
            let generation = Generation {
                sweep_grace: rules.sweep_grace(),
                rules,
                keys,
                older: older.map_or_else(AtomicShared::null, AtomicShared::from),
                sweep_cursor: Mutex::new(None),
            };
            // Release: publishes the new generation's contents to requests that load it with
            // Acquire. The old one stays reachable through `older` until it drains.
            self.current
                .swap((Some(Shared::new(generation)), Tag::None), Ordering::AcqRel);
            // Release: a thread that sees the count move leaves its last hit, which may be a
            // state of the replaced generation, for the table. Until then it decides on that
            // state, as a request that loaded the generation before the swap does.
            self.changes.fetch_add(1, Ordering::Release);
        });
        // A generation replaced before it held a key (a reload soon after another) is
        // unlinked now, so reloads never grow the chain new keys walk.
        self.generation(&guard).unlink_drained(&guard);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::clock::FakeClock;
    use crate::keyed::RateLimiter;
    use crate::policy::Policy;

    fn policy(s: &str) -> Policy {
        s.parse().unwrap()
    }

    #[test]
    fn reapplying_the_policy_in_force_builds_nothing() {
        let limiter: RateLimiter<u64, FakeClock> =
            RateLimiter::with_clock(policy("5/1h"), FakeClock::new());
        let _ = limiter.try_acquire(&1);
        for _ in 0..10 {
            limiter.set_policy(policy("5/1h"));
        }
        assert_eq!(limiter.generations.linked(), 1);
        assert_eq!(limiter.try_acquire(&1).remaining(), 3);
    }

    #[test]
    fn alternating_reloads_keep_the_chain_short() {
        let (a, b) = (policy("token-bucket 5/1h"), policy("sliding-log 5/1h"));
        let limiter: RateLimiter<u64, FakeClock> = RateLimiter::with_clock(a, FakeClock::new());
        for key in 0..1_000 {
            let _ = limiter.try_acquire(&key);
        }
        for i in 0..100_000 {
            limiter.set_policy(if i % 2 == 0 { b } else { a });
            // The current generation and the one holding the 1,000 keys; every map replaced
            // in between held nothing.
            assert!(
                limiter.generations.linked() <= 2,
                "{} linked",
                limiter.generations.linked()
            );
        }
        assert_eq!(limiter.len(), 1_000);
        // The keys kept their spent permit across every reload.
        assert_eq!(limiter.try_acquire(&7).remaining(), 3);
        assert_eq!(limiter.try_acquire(&1_000).remaining(), 4);
    }

    #[test]
    fn the_sweep_unlinks_a_generation_drained_by_moves() {
        let limiter: RateLimiter<u64, FakeClock> =
            RateLimiter::with_clock(policy("5/1h"), FakeClock::new());
        for key in 0..100 {
            let _ = limiter.try_acquire(&key);
        }
        limiter.set_policy(policy("6/1h"));
        assert_eq!(limiter.generations.linked(), 2);
        // Every key moves to the new generation; the last move's sweep finds the old one
        // empty.
        for key in 0..100 {
            assert_eq!(limiter.try_acquire(&key).remaining(), 4);
        }
        let _ = limiter.try_acquire(&100);
        assert_eq!(limiter.generations.linked(), 1);
        assert_eq!(limiter.len(), 101);
    }

    #[test]
    fn with_sweeping_off_a_drained_generation_waits_for_evict_idle() {
        let limiter: RateLimiter<u64, FakeClock> =
            RateLimiter::with_clock(policy("5/1h"), FakeClock::new()).sweep_per_insert(0);
        let _ = limiter.try_acquire(&1);
        limiter.set_policy(policy("6/1h"));
        // The move drains the old generation, but no new key sweeps.
        assert_eq!(limiter.try_acquire(&1).remaining(), 4);
        let _ = limiter.try_acquire(&2);
        assert_eq!(limiter.generations.linked(), 2);
        assert_eq!(limiter.evict_idle(), 0);
        assert_eq!(limiter.generations.linked(), 1);
    }

    #[test]
    fn a_resolver_that_changes_the_rules_once_is_asked_again_under_the_new_ones() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, OnceLock};

        let limiter: Arc<OnceLock<RateLimiter<u64, FakeClock>>> = Arc::new(OnceLock::new());
        let changed = Arc::new(AtomicBool::new(false));
        let (weak, flag) = (Arc::downgrade(&limiter), Arc::clone(&changed));
        let first = RateLimiter::with_resolver(
            move |_: &u64| {
                // The first answer comes with a change of resolver: the request that asked
                // must start over under the new one, not create the key from this answer.
                if !flag.swap(true, Ordering::SeqCst) {
                    if let Some(limiter) = weak.upgrade() {
                        if let Some(limiter) = limiter.get() {
                            limiter.set_resolver(|_: &u64| policy("7/1h"));
                        }
                    }
                }
                policy("2/1h")
            },
            FakeClock::new(),
        );
        assert!(limiter.set(first).is_ok());
        let limiter = limiter.get().unwrap();
        let decision = limiter.try_acquire(&1);
        assert!(changed.load(Ordering::SeqCst));
        assert_eq!((decision.limit(), decision.remaining()), (7, 6));
    }

    #[test]
    fn a_peek_counts_what_a_key_in_an_older_generation_has_spent() {
        let limiter: RateLimiter<u64, FakeClock> =
            RateLimiter::with_resolver(|_: &u64| policy("5/1h"), FakeClock::new());
        for _ in 0..3 {
            let _ = limiter.try_acquire(&1);
        }
        limiter.set_resolver(|_: &u64| policy("4/1h"));
        // Key 1 is still in the old generation: a peek counts its 3 spent permits.
        assert_eq!(limiter.peek(&1).remaining(), 0);
        limiter.set_policy(policy("10/1h"));
        assert_eq!(limiter.peek(&1).remaining(), 6);
        assert_eq!(limiter.try_acquire(&1).remaining(), 6);
    }

    #[test]
    fn the_sweep_unlinks_a_generation_drained_by_eviction() {
        let clock = FakeClock::new();
        let limiter: RateLimiter<u64, FakeClock> =
            RateLimiter::with_clock(policy("5/1s"), clock.clone());
        for key in 0..100 {
            let _ = limiter.try_acquire(&key);
        }
        limiter.set_policy(policy("6/1s"));
        clock.advance(Duration::from_secs(3));
        // New keys sweep 8 entries each: the old keys, at rest, go; then their map does.
        for key in 100..200 {
            let _ = limiter.try_acquire(&key);
        }
        assert_eq!(limiter.len(), 100);
        assert_eq!(limiter.generations.linked(), 1);
    }
}
