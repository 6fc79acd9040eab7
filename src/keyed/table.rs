//! A generation's table of keys: an index from each key to its state, which lives in a cell
//! of its own that never moves.
//!
//! The request path takes no lock: a lock-free lookup in `scc::HashIndex` (an epoch guard,
//! no bucket lock) finds the key's cell, and the request decides on the state in it with the
//! state's own compare-and-swap. The index moves its entries when it resizes, so an entry
//! holds only a pointer to the cell: a request that read the entry before a move still
//! decides on the one state, never on a stale copy.
//!
//! Everything that writes the index (creating a key, removing one) holds the key's bucket
//! lock. What a lock-free reader cannot be kept out of is the state itself, so a state leaves
//! the table in two steps, both under its bucket lock: it is *retired* first, with a
//! compare-and-swap from the exact word it was judged by (at rest, for eviction; its permits
//! in use, for a move to a new policy), then unlinked. A request that read the entry before
//! the unlink meets the retired state, which refuses to decide, and looks the key up again.
//! The cell is freed by the index's epoch-based reclamation once no reader can hold it.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::sync::Mutex;

use scc::hash_index::{Entry, OccupiedEntry, VacantEntry};
use scc::{Guard, HashIndex};

use crate::bounded::{sweep_step, Swept};

/// The keys of one generation and their states.
pub(super) struct Table<K, St, S: BuildHasher> {
    index: HashIndex<K, Box<St>, S>,
}

/// What `Table::entry` found for a key, its bucket held exclusively until dropped.
pub(super) enum TableEntry<'t, K, St, S: BuildHasher> {
    /// The key's state (the entry holds the bucket).
    Occupied(OccupiedEntry<'t, K, Box<St>, S>),
    /// No state for the key yet.
    Vacant(VacantEntry<'t, K, Box<St>, S>),
}

impl<K, St, S: BuildHasher> Table<K, St, S> {
    pub(super) fn with_hasher(hasher: S) -> Self {
        Table {
            index: HashIndex::with_hasher(hasher),
        }
    }
}

impl<K: Hash + Eq + Clone + 'static, St: 'static, S: BuildHasher> Table<K, St, S> {
    /// Runs `decide` on `key`'s state without taking any lock; `None` when the key is not in
    /// the table or `decide` says no (the state was retired under us).
    #[inline(always)]
    pub(super) fn read<Q, R>(
        &self,
        key: &Q,
        guard: &Guard,
        decide: impl FnOnce(&St) -> Option<R>,
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        decide(self.index.peek(key, guard)?)
    }

    /// Runs `read` on `key`'s state under its bucket lock, where no state is ever met
    /// retired: for the paths that must not miss a state being moved (a lock-free read may
    /// meet it retired just before its successor is published).
    pub(super) fn read_locked<Q, R>(&self, key: &Q, read: impl FnOnce(&St) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        Some(read(self.index.get_sync(key)?.get()))
    }

    /// The key's entry, its bucket held exclusively: its state, or a place to insert one.
    pub(super) fn entry(&self, key: K) -> TableEntry<'_, K, St, S> {
        match self.index.entry_sync(key) {
            Entry::Occupied(entry) => TableEntry::Occupied(entry),
            Entry::Vacant(entry) => TableEntry::Vacant(entry),
        }
    }

    /// Retires `key`'s state with `retire` and removes it, under the bucket lock; returns
    /// what `retire` returned. `retire` must leave the state retired (requests that still
    /// hold it then look the key up again).
    pub(super) fn remove<Q, R>(&self, key: &Q, retire: impl FnOnce(&St) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let entry = self.index.get_sync(key)?;
        let retired = retire(entry.get());
        entry.remove_entry();
        Some(retired)
    }

    /// Removes every state `try_retire` retires (it must retire the state when it returns
    /// `true`, and leave it be otherwise), one bucket at a time; returns how many.
    pub(super) fn retain(&self, mut try_retire: impl FnMut(&St) -> bool) -> usize {
        let mut removed = 0;
        self.index.retain_sync(|_, state| {
            let gone = try_retire(state);
            removed += usize::from(gone);
            !gone
        });
        removed
    }

    /// One step of the incremental sweep: up to `slice` entries from `cursor` on, removing
    /// the states `try_retire` retires (as for `retain`).
    pub(super) fn sweep_step(
        &self,
        cursor: &Mutex<Option<K>>,
        slice: usize,
        mut try_retire: impl FnMut(&St) -> bool,
    ) -> Swept {
        sweep_step(&self.index, cursor, slice, |state| {
            try_retire(Box::as_ref(state))
        })
    }

    /// `true` when no key is in the table, having taken every bucket's lock in turn.
    pub(super) fn is_empty_locked(&self) -> bool {
        self.index.begin_sync().is_none()
    }

    /// `key`'s state, as a request holds it between its lookup and its decision.
    #[cfg(test)]
    pub(super) fn held<'g, Q>(&'g self, key: &Q, guard: &'g Guard) -> Option<&'g St>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.index.peek(key, guard).map(Box::as_ref)
    }
}
