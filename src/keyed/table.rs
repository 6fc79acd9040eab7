//! A generation's table of keys: an index from each key to its state, which lives in a place
//! of its own that never moves (a cell of a slab, or a box: `engine::cells`).
//!
//! The request path takes no lock: a lock-free lookup in `scc::HashIndex` (an epoch guard,
//! no bucket lock) finds the key's cell, and the request decides on the state in it with the
//! state's own compare-and-swap. The index moves its entries when it resizes, so an entry
//! holds only where the state is: a request that read the entry before a move still decides
//! on the one state, never on a stale copy.
//!
//! Everything that writes the index (creating a key, removing one) holds the key's bucket
//! lock. What a lock-free reader cannot be kept out of is the state itself, so a state leaves
//! the table in two steps, both under its bucket lock: it is *retired* first, with a
//! compare-and-swap from the exact word it was judged by (at rest, for eviction; its permits
//! in use, for a move to a new policy), then unlinked. A request that read the entry before
//! the unlink meets the retired state, which refuses to decide, and looks the key up again.
//! The state's place is given again only once no reader can hold it (epoch-based
//! reclamation: the index's own for a box, a deferred release for a slab's cell).

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;
use std::sync::Mutex;

use scc::hash_index::{Entry, OccupiedEntry, VacantEntry};
use scc::{Guard, HashIndex};

use crate::bounded::{sweep_step, Swept};
use crate::engine::cells::{Cells, Pinned, Reusable, Slab};

/// The keys of one generation and their states.
pub(super) struct Table<K, St, C: Cells<St>, S: BuildHasher> {
    index: HashIndex<K, C::Handle, S>,
    cells: C,
    _states: PhantomData<fn() -> St>,
}

/// What `Table::entry` found for a key, its bucket held exclusively until dropped.
pub(super) enum TableEntry<'t, K, St, C: Cells<St>, S: BuildHasher> {
    /// The key's state.
    Occupied(Occupied<'t, K, St, C, S>),
    /// No state for the key yet.
    Vacant(Vacant<'t, K, St, C, S>),
}

/// A key's state, its bucket held exclusively.
pub(super) struct Occupied<'t, K, St, C: Cells<St>, S: BuildHasher> {
    entry: OccupiedEntry<'t, K, C::Handle, S>,
    cells: &'t C,
    _states: PhantomData<fn() -> St>,
}

impl<K: Hash + Eq + 'static, St, C: Cells<St>, S: BuildHasher> Occupied<'_, K, St, C, S> {
    pub(super) fn get(&self) -> &St {
        self.cells.get(self.entry.get())
    }
}

/// A key not in the table, its bucket held exclusively.
pub(super) struct Vacant<'t, K, St, C: Cells<St>, S: BuildHasher> {
    entry: VacantEntry<'t, K, C::Handle, S>,
    cells: &'t C,
    _states: PhantomData<fn() -> St>,
}

impl<'t, K: Hash + Eq + 'static, St, C: Cells<St>, S: BuildHasher> Vacant<'t, K, St, C, S> {
    /// Stores `state` for the key and publishes it (the index publishes an entry with a
    /// Release store, which a reader's lookup acquires); `None`, with nothing published,
    /// when the cells have no place left.
    pub(super) fn insert(self, state: St) -> Option<Occupied<'t, K, St, C, S>> {
        let held = self.cells.hold(state)?;
        Some(Occupied {
            entry: self.entry.insert_entry(held),
            cells: self.cells,
            _states: PhantomData,
        })
    }

    /// Lets go of the bucket, handing back the key.
    pub(super) fn into_key(self) -> K {
        self.entry.into_key()
    }
}

impl<K: Hash + Eq + 'static, St: Reusable, S: BuildHasher> Table<K, St, Slab<St>, S> {
    /// As [`Table::read`], `decide` also given where the state is.
    #[inline(always)]
    pub(super) fn read_at<Q, R>(
        &self,
        key: &Q,
        guard: &Guard,
        decide: impl FnOnce(u32, &St) -> Option<R>,
    ) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let held = *self.index.peek(key, guard)?;
        decide(held, self.cells.get(&held))
    }

    /// Pins the cell at `held`, found in the index under a guard still held (see
    /// `engine::cells::Pinned`).
    pub(super) fn pin(&self, held: u32) -> Pinned<St> {
        self.cells.pin(held)
    }
}

impl<K, St, C: Cells<St>, S: BuildHasher> Table<K, St, C, S> {
    pub(super) fn with_hasher(hasher: S) -> Self {
        Table {
            index: HashIndex::with_hasher(hasher),
            cells: C::new(),
            _states: PhantomData,
        }
    }
}

impl<K: Hash + Eq + Clone + 'static, St, C: Cells<St>, S: BuildHasher> Table<K, St, C, S> {
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
        decide(self.cells.get(self.index.peek(key, guard)?))
    }

    /// Runs `read` on `key`'s state under its bucket lock, where no state is ever met
    /// retired: for the paths that must not miss a state being moved (a lock-free read may
    /// meet it retired just before its successor is published).
    pub(super) fn read_locked<Q, R>(&self, key: &Q, read: impl FnOnce(&St) -> R) -> Option<R>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        Some(read(self.cells.get(self.index.get_sync(key)?.get())))
    }

    /// The key's entry, its bucket held exclusively: its state, or a place to insert one.
    pub(super) fn entry(&self, key: K) -> TableEntry<'_, K, St, C, S> {
        match self.index.entry_sync(key) {
            Entry::Occupied(entry) => TableEntry::Occupied(Occupied {
                entry,
                cells: &self.cells,
                _states: PhantomData,
            }),
            Entry::Vacant(entry) => TableEntry::Vacant(Vacant {
                entry,
                cells: &self.cells,
                _states: PhantomData,
            }),
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
        let mut retired = None;
        self.remove_if(key, |state| {
            retired = Some(retire(state));
            true
        });
        retired
    }

    /// Removes `key`'s entry if `try_retire` retires its state (it must retire the state
    /// when it returns `true`, and leave it be otherwise), under the key's bucket lock;
    /// whether it did.
    pub(super) fn remove_if<Q>(&self, key: &Q, try_retire: impl FnOnce(&St) -> bool) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let Some(entry) = self.index.get_sync(key) else {
            return false;
        };
        if !try_retire(self.cells.get(entry.get())) {
            return false;
        }
        let freed = C::freed(entry.get());
        entry.remove_entry();
        self.cells.release(vec![freed]);
        true
    }

    /// Appends every key of the table to `keys` (a snapshot under `guard`).
    pub(super) fn keys_into(&self, keys: &mut Vec<K>, guard: &Guard)
    where
        K: Clone,
    {
        keys.extend(self.index.iter(guard).map(|(key, _)| key.clone()));
    }

    /// Removes every state `try_retire` retires (it must retire the state when it returns
    /// `true`, and leave it be otherwise), one bucket at a time; returns how many.
    pub(super) fn retain(&self, mut try_retire: impl FnMut(&St) -> bool) -> usize {
        let mut freed = Vacated::new(&self.cells);
        self.index.retain_sync(|_, held| {
            let gone = try_retire(self.cells.get(held));
            if gone {
                freed.push(C::freed(held));
            }
            !gone
        });
        freed.release()
    }

    /// One step of the incremental sweep: up to `slice` entries from `cursor` on, removing
    /// the states `try_retire` retires (as for `retain`).
    pub(super) fn sweep_step(
        &self,
        cursor: &Mutex<Option<K>>,
        slice: usize,
        mut try_retire: impl FnMut(&St) -> bool,
    ) -> Swept {
        let mut freed = Vacated::new(&self.cells);
        let swept = sweep_step(&self.index, cursor, slice, |held| {
            let gone = try_retire(self.cells.get(held));
            if gone {
                freed.push(C::freed(held));
            }
            gone
        });
        freed.release();
        swept
    }

    /// `true` when the cells have no place left for a new key's state (a new key then shares
    /// the overflow state): a cold check, for a peek at a key not tracked.
    pub(super) fn is_full(&self) -> bool {
        self.cells.is_full()
    }

    /// The cells, for tests that put them in a state no test could reach by requests.
    #[cfg(test)]
    pub(super) fn cells(&self) -> &C {
        &self.cells
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
        self.index.peek(key, guard).map(|held| self.cells.get(held))
    }
}

/// The places freed by a walk over the table, handed back in batches: a sweep of a million
/// keys holds a few kilobytes of them at a time, not megabytes.
struct Vacated<'t, St, C: Cells<St>> {
    cells: &'t C,
    batch: Vec<C::Vacated>,
    count: usize,
    _states: PhantomData<fn() -> St>,
}

impl<'t, St, C: Cells<St>> Vacated<'t, St, C> {
    const BATCH: usize = 1024;

    fn new(cells: &'t C) -> Self {
        Vacated {
            cells,
            batch: Vec::new(),
            count: 0,
            _states: PhantomData,
        }
    }

    /// Called for an entry about to be unlinked (the walk unlinks it once this returns).
    fn push(&mut self, freed: C::Vacated) {
        // A full batch goes first: its entries have all been unlinked by now, as `release`
        // requires; the one being pushed has not yet.
        if self.batch.len() == Self::BATCH {
            self.cells.release(std::mem::take(&mut self.batch));
        }
        self.count += 1;
        self.batch.push(freed);
    }

    /// Hands back the rest, once the walk has unlinked them all; how many were freed in all.
    fn release(self) -> usize {
        self.cells.release(self.batch);
        self.count
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::hash_map::RandomState;

    /// States in boxes, recording the size of each batch of freed places handed back.
    struct Recording(Mutex<Vec<usize>>);

    impl Cells<u64> for Recording {
        type Handle = Box<u64>;
        type Vacated = ();

        fn new() -> Self {
            Recording(Mutex::new(Vec::new()))
        }

        fn get<'a>(&'a self, held: &'a Box<u64>) -> &'a u64 {
            held
        }

        fn hold(&self, state: u64) -> Option<Box<u64>> {
            Some(Box::new(state))
        }

        fn freed(_: &Box<u64>) {}

        fn is_full(&self) -> bool {
            false
        }

        fn release(&self, freed: Vec<()>) {
            self.0.lock().unwrap().push(freed.len());
        }
    }

    fn table_of(keys: u64) -> Table<u64, u64, Recording, RandomState> {
        let table = Table::with_hasher(RandomState::new());
        for key in 0..keys {
            match table.entry(key) {
                TableEntry::Vacant(vacant) => assert!(vacant.insert(key).is_some()),
                TableEntry::Occupied(_) => unreachable!("{key} inserted twice"),
            }
        }
        table
    }

    #[test]
    fn a_walk_hands_freed_places_back_in_batches_of_1024() {
        let table = table_of(2500);
        assert_eq!(table.retain(|state| state % 5 != 0), 2000);
        assert_eq!(*table.cells.0.lock().unwrap(), [1024, 976]);

        let table = table_of(2500);
        let cursor = Mutex::new(None);
        let swept = table.sweep_step(&cursor, 2500, |_| true);
        assert_eq!(swept.removed, 2500);
        assert_eq!(*table.cells.0.lock().unwrap(), [1024, 1024, 452]);
    }

    #[test]
    fn a_removal_hands_back_its_place_at_once() {
        let table = table_of(3);
        assert_eq!(table.remove(&1, |state| *state), Some(1));
        assert_eq!(table.remove(&1, |state| *state), None);
        assert_eq!(*table.cells.0.lock().unwrap(), [1]);
    }
}
