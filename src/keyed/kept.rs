//! What a move could not carry: the permits a key had spent that its state under the policy
//! in force cannot count, kept beside the states until they have come back.
//!
//! A key moved to a new policy starts with what it had in use (`engine::state::Carry`), as
//! far as the new state can count it: capped at the new limit, and a new band does not
//! count an old band of a longer window. Counted from that state alone, the next move
//! would carry only that much, and a change undone within a window would give the key the
//! difference once more. So when a key's new state does not count all of what it was built
//! from, the bands it does not count are kept here (`engine::state::KeptCarry`), each until
//! a window after it was first counted, and every state built for the key while they last
//! (after a move, or after eviction and a request that creates it again) is built from them
//! too; at the cap, where a new key shares the overflow state, a key refused by what is
//! kept is refused.
//!
//! One entry per key at most, written under the key's bucket lock in the generation its
//! state is created in, before that state is published, and read under a bucket lock every
//! later creation or move of the key takes after it (see `create`). Entries that have all
//! come back are cleared by `evict_idle`, and after a creation once the map has doubled
//! since the last clearing (never under a bucket lock).

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use scc::HashMap;

use crate::engine::state::{to_keep, Carry, KeptCarry};

/// The size at which the map is first cleared of carries that have come back.
const FIRST_CLEARING: usize = 64;

/// The carries moves could not count, by key (see the module docs).
pub(super) struct Kept<K, S: BuildHasher> {
    map: HashMap<K, KeptCarry, S>,
    /// Whether anything was ever kept: a new key asks the map only then.
    used: AtomicBool,
    /// The map's size at which it is next cleared.
    next_clearing: AtomicUsize,
}

impl<K: Hash + Eq, S: BuildHasher> Kept<K, S> {
    pub(super) fn with_hasher(hasher: S) -> Self {
        Kept {
            map: HashMap::with_hasher(hasher),
            used: AtomicBool::new(false),
            next_clearing: AtomicUsize::new(FIRST_CLEARING),
        }
    }

    /// What is kept for `key` that still counts at `now`.
    pub(super) fn read<Q>(&self, key: &Q, now: u64) -> Option<KeptCarry>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        // Acquire: pairs with the Release store in `keep`. An entry written for this key was
        // written under a bucket lock this caller's path takes after it (see the module
        // docs), so the flag is seen set; for a key never kept, a stale `false` is right.
        if !self.used.load(Ordering::Acquire) {
            return None;
        }
        self.map.read_sync(key, |_, kept| *kept)?.live(now)
    }

    /// Records what `key`'s new state, counting `counted`, was built from at `now`: what
    /// it moved with (or what the shared overflow state counted) and what was kept for it
    /// (see [`to_keep`]). What the state counts is forgotten.
    pub(super) fn keep<Q>(
        &self,
        key: &Q,
        built_from: (Option<&Carry>, Option<&KeptCarry>),
        counted: Option<Carry>,
        now: u64,
    ) where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        let Some(kept) = to_keep(built_from, counted, now) else {
            if built_from.1.is_some() {
                self.map.remove_sync(key);
            }
            return;
        };
        // Release: see `read`.
        self.used.store(true, Ordering::Release);
        self.map.upsert_sync(K::from(key.to_owned()), kept);
    }

    /// Clears the carries that have all come back at `now`, if the map has doubled since
    /// the last clearing. Called with no bucket lock held: the clearing visits every entry.
    pub(super) fn clear_when_grown(&self, now: u64) {
        // Relaxed: only when to clear; a clearing more or less changes no answer.
        if self.used.load(Ordering::Relaxed)
            && self.map.len() >= self.next_clearing.load(Ordering::Relaxed)
        {
            self.clear_passed(now);
            let left = self.map.len();
            self.next_clearing
                .store((left * 2).max(FIRST_CLEARING), Ordering::Relaxed);
        }
    }

    /// Forgets what is kept for `key` (a reset).
    pub(super) fn forget<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if self.used.load(Ordering::Acquire) {
            self.map.remove_sync(key);
        }
    }

    /// Drops every carry that has all come back at `now`.
    pub(super) fn clear_passed(&self, now: u64) {
        if self.used.load(Ordering::Acquire) {
            self.map.retain_sync(|_, kept| kept.live(now).is_some());
        }
    }
}
