//! A concurrent map of client-chosen keys with a cap on its entries: [`BoundedMap`], and the
//! incremental sweep of idle entries ([`sweep_step`]) that keeps a capped map from filling
//! with entries that no longer matter.
//!
//! Every entry of a [`BoundedMap`] is created, swept and removed under its bucket's exclusive
//! lock, and read under its shared lock, so an entry checked idle and removed in one locked
//! step cannot be in use by anyone at that moment. (The keyed registry's table, also swept
//! here, has lock-free readers: its sweep retires a state before removing it.)

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crossbeam_utils::CachePadded;
use scc::hash_map::Entry;

/// Entries each insertion sweeps for idle ones, so a map fed new keys forever keeps pace with
/// the keys that come to rest.
pub(crate) const SWEEP_PER_INSERT: usize = 8;
/// Entries swept when an insertion finds the map full, before it gives up.
pub(crate) const SWEEP_WHEN_FULL: usize = 64;

/// What one sweep step did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Swept {
    /// Entries removed.
    pub(crate) removed: usize,
    /// Whether the step found the map empty (its start had no entry).
    pub(crate) empty: bool,
}

/// A map the incremental sweep can walk: scc's `HashMap` and `HashIndex`, whose walks hold
/// one bucket exclusively at a time.
pub(crate) trait Walk<K, V> {
    /// An entry, its bucket held exclusively.
    type At<'m>
    where
        Self: 'm;
    /// The first entry.
    fn first(&self) -> Option<Self::At<'_>>;
    /// `key`'s entry.
    fn at<'m>(&'m self, key: &K) -> Option<Self::At<'m>>;
    /// The entry's key and value.
    fn here<'a, 'm>(at: &'a Self::At<'m>) -> (&'a K, &'a V);
    /// The entry after `at`.
    fn next(at: Self::At<'_>) -> Option<Self::At<'_>>;
    /// Removes `at`'s entry; the entry after it.
    fn remove(at: Self::At<'_>) -> Option<Self::At<'_>>;
}

/// `Walk` for one of scc's maps, whose entry APIs differ only in what a removal returns (and
/// in `HashIndex` asking for `'static` keys and values).
macro_rules! walk {
    ($map:ident, $entries:ident, $($life:lifetime)?, |$at:ident| $remove:expr) => {
        impl<K: Hash + Eq $(+ $life)?, V $(: $life)?, S: BuildHasher> Walk<K, V>
            for scc::$map<K, V, S>
        {
            type At<'m>
                = scc::$entries::OccupiedEntry<'m, K, V, S>
            where
                Self: 'm;
            fn first(&self) -> Option<Self::At<'_>> {
                self.begin_sync()
            }
            fn at<'m>(&'m self, key: &K) -> Option<Self::At<'m>> {
                self.get_sync(key)
            }
            fn here<'a, 'm>(at: &'a Self::At<'m>) -> (&'a K, &'a V) {
                (at.key(), at.get())
            }
            fn next(at: Self::At<'_>) -> Option<Self::At<'_>> {
                at.next_sync()
            }
            fn remove($at: Self::At<'_>) -> Option<Self::At<'_>> {
                $remove
            }
        }
    };
}

walk!(HashMap, hash_map, , |at| at.remove_and_sync().1);
walk!(HashIndex, hash_index, 'static, |at| at.remove_and_sync());

/// One step of the incremental sweep over `map`: up to `slice` entries from `cursor` on
/// (wrapping to the beginning at most once), removing those `is_idle` says may go.
///
/// Each entry is checked and removed while its bucket is held exclusively (as `retain_sync`
/// does). One thread sweeps a map at a time (the cursor is `try_lock`ed); another that finds
/// it busy sweeps nothing.
pub(crate) fn sweep_step<K, V, M>(
    map: &M,
    cursor: &Mutex<Option<K>>,
    slice: usize,
    mut is_idle: impl FnMut(&V) -> bool,
) -> Swept
where
    K: Clone,
    M: Walk<K, V>,
{
    let Ok(mut cursor) = cursor.try_lock() else {
        return Swept::default();
    };
    let mut swept = Swept::default();
    let mut begin = || {
        let first = map.first();
        swept.empty |= first.is_none();
        first
    };
    let mut entry = match cursor.take() {
        Some(key) => map.at(&key).or_else(&mut begin),
        None => begin(),
    };
    let mut removed = 0;
    let mut wrapped = false;
    for _ in 0..slice {
        let Some(here) = entry.take().or_else(|| {
            // The end of the map: go on from the beginning, once per step.
            if wrapped {
                return None;
            }
            wrapped = true;
            begin()
        }) else {
            break;
        };
        if is_idle(M::here(&here).1) {
            removed += 1;
            entry = M::remove(here);
        } else {
            entry = M::next(here);
        }
    }
    *cursor = entry.map(|here| M::here(&here).0.clone());
    Swept { removed, ..swept }
}

/// A concurrent map that holds at most `max` entries, sweeping idle ones as it goes.
///
/// Entries are never pushed out to make room: an entry stays until the caller's idleness
/// rule says it no longer matters (checked under the bucket's exclusive lock). When the map is
/// full and a sweep frees nothing, an insertion is refused and the caller decides what the
/// key gets instead (a shared overflow state, or nothing).
pub(crate) struct BoundedMap<K, V, S: BuildHasher> {
    map: scc::HashMap<K, V, S>,
    /// Entries present now: incremented before an insertion and decremented after a removal,
    /// each under the entry's bucket lock, so it never falls below the entries present and
    /// the cap holds however insertions, sweeps and removals interleave.
    tracked: CachePadded<AtomicUsize>,
    max: usize,
    /// Where the incremental sweep stopped.
    cursor: Mutex<Option<K>>,
}

impl<K, V, S: BuildHasher> BoundedMap<K, V, S> {
    /// Entries present now.
    pub(crate) fn len(&self) -> usize {
        // Relaxed: a snapshot of a count.
        self.tracked.load(Ordering::Relaxed)
    }

    /// Whether the map holds its `max` entries.
    pub(crate) fn is_full(&self) -> bool {
        self.len() >= self.max
    }
}

impl<K: Hash + Eq + Clone, V, S: BuildHasher> BoundedMap<K, V, S> {
    /// An empty map without a cap.
    pub(crate) fn with_hasher(hasher: S) -> Self {
        BoundedMap {
            map: scc::HashMap::with_hasher(hasher),
            tracked: CachePadded::new(AtomicUsize::new(0)),
            max: usize::MAX,
            cursor: Mutex::new(None),
        }
    }

    /// This map holding at most `max` entries.
    pub(crate) fn max_entries(mut self, max: usize) -> Self {
        self.max = max;
        self
    }

    /// `f` on the key's value under its bucket's shared lock; `None` when absent.
    #[inline]
    pub(crate) fn read<Q, R>(&self, key: &Q, f: impl FnOnce(&V) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.read_sync(key, |_, value| f(value))
    }

    /// `f` on the key's value, inserting `make()` first when the key is absent and a place is
    /// free (sweeping idle entries to free one). `None` when the map is full: nothing was
    /// inserted and `f` did not run.
    pub(crate) fn get_or_insert<R>(
        &self,
        key: K,
        make: impl FnOnce() -> V,
        is_idle: impl FnMut(&V) -> bool + Copy,
        f: impl FnOnce(&V) -> R,
    ) -> Option<R> {
        self.get_or_insert_else(key, |_| make(), is_idle, |value| Some(f(value)), |_| None)
    }

    /// `f` on the key's value, inserting `make(&key)` first when the key is absent and a place
    /// is free (sweeping idle entries to free one); `full(&key)` when the key is absent and
    /// the map is full (nothing is inserted).
    ///
    /// `make` and `full` run while the key's bucket is held exclusively, the key absent: no
    /// other call for the same key can read, insert or decide on it until they return, so
    /// whatever they do for the key (the concurrency limiter's overflow ledger) is one step
    /// with the key's insertion. They must not lock this map again.
    pub(crate) fn get_or_insert_else<R>(
        &self,
        key: K,
        make: impl FnOnce(&K) -> V,
        is_idle: impl FnMut(&V) -> bool + Copy,
        f: impl FnOnce(&V) -> R,
        full: impl FnOnce(&K) -> R,
    ) -> R {
        self.make_room(is_idle);
        let result = match self.map.entry_sync(key) {
            Entry::Occupied(entry) => return f(entry.get()),
            Entry::Vacant(entry) => {
                if !self.reserve() {
                    return full(entry.key());
                }
                let value = make(entry.key());
                f(entry.insert_entry(value).get())
            }
        };
        self.sweep(SWEEP_PER_INSERT, is_idle);
        result
    }

    /// Runs `update` on the key's value under its bucket's exclusive lock, inserting
    /// `make()` first when the key is absent and a place is free. `false` when the key was
    /// absent and the map is full: nothing was inserted or updated.
    pub(crate) fn upsert(
        &self,
        key: K,
        make: impl FnOnce() -> V,
        update: impl FnOnce(&mut V),
        is_idle: impl FnMut(&V) -> bool + Copy,
    ) -> bool {
        self.make_room(is_idle);
        match self.map.entry_sync(key) {
            Entry::Occupied(mut entry) => {
                update(entry.get_mut());
                return true;
            }
            Entry::Vacant(entry) => {
                if !self.reserve() {
                    return false;
                }
                let mut value = make();
                update(&mut value);
                entry.insert_entry(value);
            }
        }
        self.sweep(SWEEP_PER_INSERT, is_idle);
        true
    }

    /// Removes the key; whether it was present.
    pub(crate) fn remove<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let removed = self.map.remove_sync(key).is_some();
        if removed {
            // Relaxed: a count, decremented after the removal (see `tracked`).
            self.tracked.fetch_sub(1, Ordering::Relaxed);
        }
        removed
    }

    /// Removes every entry `is_idle` says may go; returns how many.
    pub(crate) fn evict(&self, mut is_idle: impl FnMut(&V) -> bool) -> usize {
        let mut removed = 0;
        // `retain_sync` holds each bucket exclusively while the predicate runs.
        self.map.retain_sync(|_, value| {
            let idle = is_idle(value);
            removed += usize::from(idle);
            !idle
        });
        // Relaxed: a count, decremented after the removals.
        self.tracked.fetch_sub(removed, Ordering::Relaxed);
        removed
    }

    /// When the map is full, sweeps a larger slice for idle entries (no lock held).
    fn make_room(&self, is_idle: impl FnMut(&V) -> bool) {
        if self.is_full() {
            self.sweep(SWEEP_WHEN_FULL, is_idle);
        }
    }

    fn sweep(&self, slice: usize, is_idle: impl FnMut(&V) -> bool) {
        let swept = sweep_step(&self.map, &self.cursor, slice, is_idle);
        // Relaxed: a count, decremented after the removals.
        self.tracked.fetch_sub(swept.removed, Ordering::Relaxed);
    }

    /// Takes a place for an insertion, or `false` when the map is full.
    fn reserve(&self) -> bool {
        // Relaxed: a count; the caller's exclusive bucket lock orders the insertion.
        self.tracked
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max).then_some(n + 1)
            })
            .is_ok()
    }
}
