//! What a full [`ConcurrencyLimiter`](super::ConcurrencyLimiter) decides new keys on: one
//! gauge shared per limit, and a ledger of each overflowing key's own gauge.

use std::borrow::Borrow;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use scc::hash_map::Entry;

use crate::bounded::{sweep_step, SWEEP_PER_INSERT};
use crate::keys::KeyHasher;

use super::gauge::{acquire_shared, AtCapacity, Gauge, Permit};

/// What keys that find the map full are decided on (see
/// [`max_keys`](super::ConcurrencyLimiter::max_keys)): one gauge shared by all such keys of a limit,
/// and, in the *ledger*, the key's own gauge, so that every permit of a key, shared or not,
/// counts on one gauge.
///
/// A key's ledger entry is read, created and taken out only inside
/// [`BoundedMap::get_or_insert_else`](crate::bounded::BoundedMap::get_or_insert_else)'s `make` and `full`, while the key's bucket in the map
/// is held exclusively with the key absent. So a key has one gauge at a time, in the map or
/// in the ledger, and a gauge moves from the ledger into the map (when room frees up) in a
/// step during which nobody can take a permit of the key. The sweep removes only ledger
/// gauges with nothing in flight, under the ledger bucket's exclusive lock, which every
/// acquire on a ledger gauge also holds: a count of 0 there cannot be raised while it is
/// checked, exactly as in the map. Lock order: the map's bucket, then the ledger's, then the
/// shared gauges'; nothing takes them the other way round (a permit's release takes none).
pub(super) struct Overflow<K> {
    /// One gauge per distinct limit, shared by every key of that limit that overflows.
    shared: scc::HashMap<u64, Arc<Gauge>>,
    /// The gauge of each untracked key that holds (or lately held) shared permits. Hashed
    /// with the default hasher whatever the map's: it is on the cold path, keyed by clients.
    pub(super) ledger: scc::HashMap<K, Arc<Gauge>, KeyHasher>,
    /// Where the incremental sweep of idle ledger gauges stopped.
    cursor: Mutex<Option<K>>,
}

impl<K: Hash + Eq + Clone> Overflow<K> {
    pub(super) fn new() -> Self {
        Overflow {
            shared: scc::HashMap::new(),
            ledger: scc::HashMap::with_hasher(KeyHasher::default()),
            cursor: Mutex::new(None),
        }
    }

    /// Takes the key's ledger gauge out, to be tracked in the map. Call only from `make`.
    pub(super) fn take(&self, key: &K) -> Option<Arc<Gauge>> {
        self.ledger.remove_sync(key).map(|(_, gauge)| gauge)
    }

    /// A shared permit for `key`, on its ledger gauge (created with `limit` when it has
    /// none) and on the shared gauge of that gauge's limit, and whether it added a ledger
    /// gauge. Call only from `full`. A refusal adds nothing.
    pub(super) fn acquire(&self, key: &K, limit: u64) -> (Result<Permit, AtCapacity>, bool) {
        if let Some(entry) = self.ledger.get_sync(key) {
            return (self.on_shared(entry.get()), false);
        }
        // A new entry, added only on admission (the clone of the key is on the cold path).
        match self.ledger.entry_sync(key.clone()) {
            // Not reached while the caller holds the key's map bucket (nobody else adds the
            // key here meanwhile), but decided the same way if it were.
            Entry::Occupied(entry) => (self.on_shared(entry.get()), false),
            Entry::Vacant(entry) => {
                let gauge = Arc::new(Gauge::new(limit));
                let decided = self.on_shared(&gauge);
                let added = decided.is_ok();
                if added {
                    entry.insert_entry(gauge);
                }
                (decided, added)
            }
        }
    }

    /// Decides on `gauge` and the shared gauge of its limit.
    fn on_shared(&self, gauge: &Arc<Gauge>) -> Result<Permit, AtCapacity> {
        let limit = gauge.limit;
        let decide = |shared: &Arc<Gauge>| acquire_shared(gauge, shared);
        if let Some(decided) = self.shared.read_sync(&limit, |_, shared| decide(shared)) {
            return decided;
        }
        let entry = self
            .shared
            .entry_sync(limit)
            .or_insert_with(|| Arc::new(Gauge::new(limit)));
        decide(entry.get())
    }

    /// Permits of the key held now, if it has a ledger gauge.
    pub(super) fn in_flight<Q>(&self, key: &Q) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.ledger.read_sync(key, |_, gauge| gauge.in_flight())
    }

    /// One step of the incremental sweep of idle ledger gauges, after a new one.
    pub(super) fn sweep(&self) {
        sweep_step(&self.ledger, &self.cursor, SWEEP_PER_INSERT, |gauge| {
            gauge.in_flight() == 0
        });
    }

    /// Removes every ledger gauge with nothing in flight.
    pub(super) fn evict(&self) {
        // Each bucket is held exclusively while its gauges are checked (see the type's docs).
        self.ledger.retain_sync(|_, gauge| gauge.in_flight() != 0);
    }
}
