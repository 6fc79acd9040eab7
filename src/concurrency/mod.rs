//! Per-key concurrency limits: [`ConcurrencyLimiter`], how many requests of one key may be in
//! flight at once (not how many per second).
//!
//! ```
//! use tollgate::concurrency::{AtCapacity, ConcurrencyLimiter};
//!
//! let jobs: ConcurrencyLimiter<String> = ConcurrencyLimiter::new(1);
//! let running = jobs.try_acquire("tenant-1")?;
//! assert!(jobs.try_acquire("tenant-1").is_err()); // one at a time
//! drop(running); // done: the place is free again
//! assert!(jobs.try_acquire("tenant-1").is_ok());
//! # Ok::<(), AtCapacity>(())
//! ```
//!
//! A job scheduler capping each tenant at 4 running jobs, a proxy capping each client at 10
//! open connections: [`try_acquire`](ConcurrencyLimiter::try_acquire) hands out a [`Permit`]
//! while the key has fewer than its limit in flight, and the permit gives its place back when
//! it is dropped, on every path out of the guarded work, unwinding from a panic included.
//!
//! Each key's count is one atomic word in a gauge, updated by compare-and-swap; the map
//! holds the gauge behind an `Arc` so that a permit can release it without looking the key up
//! again (see [`ConcurrencyLimiter`] for why, and `docs/ARCHITECTURE.md`).

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

use crate::bounded::BoundedMap;
use crate::keys::KeyHasher;

use self::gauge::{acquire_on, Gauge};
use self::overflow::Overflow;

pub use self::gauge::{AtCapacity, Permit};

pub(crate) mod gauge;
mod overflow;

/// How a limiter built with [`ConcurrencyLimiter::with_resolver`] chooses each key's limit.
type LimitResolver<K> = dyn Fn(&K) -> u64 + Send + Sync;

/// A limit on how many requests of each key may be in flight at once.
///
/// A request takes a [`Permit`] with [`try_acquire`](ConcurrencyLimiter::try_acquire) before
/// it starts and drops it when it ends; while a key has `limit` permits out, further requests
/// for it are refused with [`AtCapacity`] (never queued: the caller decides whether to wait,
/// shed or retry). Keys are independent, and lookups take any borrowed form of the key
/// (`&str` for `String` keys), exactly as in [`RateLimiter`](crate::RateLimiter).
///
/// | method | does |
/// |---|---|
/// | [`try_acquire`](ConcurrencyLimiter::try_acquire) | a permit, or [`AtCapacity`] |
/// | [`in_flight`](ConcurrencyLimiter::in_flight) | permits of one key held now |
/// | [`evict_idle`](ConcurrencyLimiter::evict_idle) | removes every key with nothing in flight, exactly |
/// | [`len`](ConcurrencyLimiter::len) | counts the keys tracked now |
/// | [`max_keys`](ConcurrencyLimiter::max_keys) | caps the keys tracked at once |
///
/// # How it stays exact
///
/// Each key's count is one `AtomicU64` in a small heap cell (a *gauge*, with the key's
/// limit beside it), and the map stores an `Arc` to it:
///
/// | count | meaning |
/// |---|---|
/// | `0` | nothing in flight: idle, may be evicted |
/// | `1 ..= limit` | that many permits held |
///
/// * **Acquire** runs inside the map's shared bucket lock: load the count, refuse if it is
///   at the limit (writing nothing), else compare-and-swap it to one more. A count is only
///   ever raised by that CAS from a value below the limit, so however many threads race, no
///   more than `limit` permits are out. A key seen for the first time is created through
///   the map's entry API under the bucket's exclusive lock: one gauge per key.
/// * **Release** is a `fetch_sub` on the gauge the permit holds (its own `Arc`), with no map
///   lookup and no lock, so dropping a permit never waits on anything. (A permit taken
///   while the map was full holds two gauges, its key's and a shared one: two `fetch_sub`s.)
/// * **Eviction** (and the sweep that each new key's creation runs) holds each bucket
///   exclusively and removes the gauges whose count is 0. Under that lock no acquirer is
///   inside the bucket's gauges, and a count of 0 means no permit is out (each holds one
///   place until it drops), so nobody can raise it while it is checked and removed: **a
///   gauge with a permit out is never removed**, a permit always releases into the gauge
///   that is still its key's, and a removed gauge is reached by nobody again. The map's lock
///   is the whole protocol; the gauge needs no retired value.
/// * **A full map** ([`max_keys`](ConcurrencyLimiter::max_keys)): an untracked key keeps its
///   gauge in an overflow ledger, handled only under the key's exclusive bucket lock in the
///   map, and moved into the map with the permits it counts when room frees up: a key has
///   one gauge at a time, whichever gauges its permits also share.
///
/// Why an `Arc` per key rather than the count inline in the map entry: the map moves entries
/// when it resizes, so an inline count may only be touched under the bucket lock, and a
/// permit would then have to keep the key (a clone: an allocation per request for `String`
/// keys) and look it up again on drop, a second hash and bucket lock per request. With the
/// `Arc`, a permit owns its gauge: release is one atomic instruction (plus the `Arc`'s own
/// count, on the same cache line), and a permit is `'static`, so it can move into a spawned
/// thread or task. The price is one allocation of 32 bytes per new key.
///
/// # Examples
///
/// ```
/// use tollgate::concurrency::ConcurrencyLimiter;
///
/// let jobs: ConcurrencyLimiter<String> = ConcurrencyLimiter::new(2);
/// let a = jobs.try_acquire("tenant-1")?;
/// let b = jobs.try_acquire("tenant-1")?;
/// assert!(jobs.try_acquire("tenant-1").is_err()); // two running: the third is refused
/// assert!(jobs.try_acquire("tenant-2").is_ok()); // keys are independent
/// drop(a); // finished: its place is free again
/// let c = jobs.try_acquire("tenant-1")?;
/// assert_eq!(jobs.in_flight("tenant-1"), 2);
/// drop((b, c));
/// assert_eq!(jobs.evict_idle(), 2);
/// # Ok::<(), tollgate::concurrency::AtCapacity>(())
/// ```
pub struct ConcurrencyLimiter<K = String, S: BuildHasher = KeyHasher> {
    /// The gauge of each key tracked now, at most `max_keys` of them.
    map: BoundedMap<K, Arc<Gauge>, S>,
    limits: Limits<K>,
    /// What keys get while the map is full: the shared gauges and the overflow ledger.
    overflow: Overflow<K>,
}

enum Limits<K> {
    Uniform(u64),
    PerKey(Box<LimitResolver<K>>),
}

impl<K> Limits<K> {
    fn for_key(&self, key: &K) -> u64 {
        match self {
            Limits::Uniform(limit) => *limit,
            Limits::PerKey(resolver) => resolver(key),
        }
    }
}

impl<K: Hash + Eq + Clone> ConcurrencyLimiter<K, KeyHasher> {
    /// A limiter allowing `limit` requests in flight per key.
    ///
    /// A limit of 0 refuses every request (and tracks no key).
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::concurrency::ConcurrencyLimiter;
    ///
    /// let per_client: ConcurrencyLimiter<std::net::IpAddr> = ConcurrencyLimiter::new(10);
    /// let ip = "192.0.2.7".parse().unwrap();
    /// let _connection = per_client.try_acquire(&ip)?;
    /// assert_eq!(per_client.in_flight(&ip), 1);
    /// # Ok::<(), tollgate::concurrency::AtCapacity>(())
    /// ```
    #[must_use]
    pub fn new(limit: u64) -> Self {
        Self::with_hasher(limit, KeyHasher::default())
    }

    /// A limiter whose limit is chosen per key, by `resolver`, when the key is first seen
    /// (and again after its entry is evicted): tiers, or per-tenant caps from a config.
    ///
    /// The resolver runs when a request finds its key untracked, before any lock is taken,
    /// once per such request (racing first requests of one key may each call it once; the
    /// first to create the key's gauge sets its limit).
    /// A key it gives 0 is refused and not tracked (the resolver then runs on each of its
    /// requests). To change a key's limit, change what the resolver returns; keys pick it up
    /// when they are next created, after eviction.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::concurrency::ConcurrencyLimiter;
    ///
    /// let jobs: ConcurrencyLimiter<String> =
    ///     ConcurrencyLimiter::with_resolver(|tenant: &String| if tenant.starts_with("big-") { 8 } else { 2 });
    /// assert_eq!(jobs.try_acquire("big-corp")?.limit(), 8);
    /// assert_eq!(jobs.try_acquire("small-shop")?.limit(), 2);
    /// # Ok::<(), tollgate::concurrency::AtCapacity>(())
    /// ```
    #[must_use]
    pub fn with_resolver(resolver: impl Fn(&K) -> u64 + Send + Sync + 'static) -> Self {
        Self::build(Limits::PerKey(Box::new(resolver)), KeyHasher::default())
    }
}

impl<K: Hash + Eq + Clone, S: BuildHasher> ConcurrencyLimiter<K, S> {
    /// The largest limit a key can have: any `u64` (a count stays below its limit before it
    /// is raised, so it never overflows).
    pub const MAX_LIMIT: u64 = u64::MAX;

    /// A limiter with a hasher of your choice for its keys (see [`KeyHasher`] for the
    /// default and why).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::collections::hash_map::RandomState;
    /// use tollgate::concurrency::ConcurrencyLimiter;
    ///
    /// let limiter = ConcurrencyLimiter::<String, _>::with_hasher(4, RandomState::new());
    /// assert!(limiter.try_acquire("k").is_ok());
    /// ```
    #[must_use]
    pub fn with_hasher(limit: u64, hasher: S) -> Self {
        Self::build(Limits::Uniform(limit), hasher)
    }

    fn build(limits: Limits<K>, hasher: S) -> Self {
        ConcurrencyLimiter {
            map: BoundedMap::with_hasher(hasher),
            limits,
            overflow: Overflow::new(),
        }
    }

    /// This limiter tracking at most `max_keys` keys at once.
    ///
    /// A key is tracked while it has permits out and for a while after; each new key's
    /// creation sweeps a few entries and removes those with nothing in flight, so a limiter
    /// fed new keys forever stays bounded without anyone calling
    /// [`evict_idle`](ConcurrencyLimiter::evict_idle). A key with a permit out is never
    /// removed to make room: tracked keys stay exact, and a flood of new keys cannot hand
    /// anyone a fresh set of places.
    ///
    /// When `max_keys` keys all have permits out, a key that is not tracked is decided on
    /// two gauges: one shared by every such key of the same limit, and the key's own, kept
    /// in a small *overflow ledger* beside the map. Its permits take a place on both, and
    /// its permits and refusals say [`is_overflow`](Permit::is_overflow). So in-flight work
    /// over all untracked keys of a limit is capped at that one limit, and each of them at
    /// its own.
    ///
    /// **No key ever has more than its limit in flight, shared permits included.** When
    /// room frees up and a key with shared permits out is tracked again, the gauge that goes
    /// into the map is its ledger gauge, which still counts those permits (they release into
    /// it as they end), not a fresh one. This is exact under any interleaving: a key's
    /// ledger gauge is read, created and moved into the map only while the key's bucket in
    /// the map is held exclusively and the key is absent, the same lock under which the map
    /// creates a key's gauge, so a key has one gauge at a time and every permit of the key
    /// holds a place on it. Tracked keys are decided as before: their hit path takes no
    /// other lock, and the release of any permit takes none.
    ///
    /// **What a flood does to new keys.** A flood of new keys squeezes other new keys, never
    /// the keys already tracked: while the flood holds the shared places of a limit, every
    /// untracked key of that limit is refused (with `is_overflow`) until places come back or
    /// the sweep frees room in the map for it. A refused request creates nothing. Memory
    /// stays bounded: the map holds at most `max_keys` gauges; the ledger holds one gauge
    /// per untracked key with shared permits out (each holds a shared place, so at most
    /// `limit` keys per distinct limit) plus idle ones, which each new ledger gauge sweeps
    /// as the map does and `evict_idle` removes; the shared gauges live as long as the
    /// limiter, one per distinct limit. `max_keys(0)` tracks no key: each key is held to
    /// its limit by its ledger gauge, and all keys of a limit together by the shared gauge.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::concurrency::ConcurrencyLimiter;
    ///
    /// let limiter: ConcurrencyLimiter<u32> = ConcurrencyLimiter::new(2).max_keys(1);
    /// let held = limiter.try_acquire(&1)?;
    /// let shared = limiter.try_acquire(&2)?; // key 1 holds the only place: 2 overflows
    /// assert!(shared.is_overflow() && !held.is_overflow());
    /// let _also_shared = limiter.try_acquire(&3)?;
    /// assert!(limiter.try_acquire(&4).unwrap_err().is_overflow()); // the shared 2 are out
    /// drop(held);
    /// // Key 1 was idle: swept, and key 2 is tracked, on a gauge that counts its shared permit.
    /// let own = limiter.try_acquire(&2)?;
    /// assert!(!own.is_overflow());
    /// assert_eq!(limiter.in_flight(&2), 2);
    /// assert!(!limiter.try_acquire(&2).unwrap_err().is_overflow()); // 2 in flight: its limit
    /// drop(shared);
    /// assert!(limiter.try_acquire(&2).is_ok());
    /// # Ok::<(), tollgate::concurrency::AtCapacity>(())
    /// ```
    #[must_use]
    pub fn max_keys(self, max_keys: usize) -> Self {
        ConcurrencyLimiter {
            map: self.map.max_entries(max_keys),
            ..self
        }
    }

    /// A permit for one more request of `key` in flight, or [`AtCapacity`] when `key`
    /// already has its limit out.
    ///
    /// An existing key costs a map lookup (shared lock on one bucket), a compare-and-swap
    /// on its count and an increment of its gauge's `Arc`; nothing is allocated. A new key
    /// allocates its entry and its gauge (and clones the key) once.
    ///
    /// # Errors
    ///
    /// [`AtCapacity`] when the key has its limit of permits out; nothing is changed.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::concurrency::ConcurrencyLimiter;
    ///
    /// let limiter: ConcurrencyLimiter<String> = ConcurrencyLimiter::new(1);
    /// {
    ///     let _permit = limiter.try_acquire("alice")?;
    ///     assert!(limiter.try_acquire("alice").is_err());
    /// } // released here
    /// assert!(limiter.try_acquire("alice").is_ok());
    /// # Ok::<(), tollgate::concurrency::AtCapacity>(())
    /// ```
    #[inline]
    pub fn try_acquire<Q>(&self, key: &Q) -> Result<Permit, AtCapacity>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        match self.map.read(key, acquire_on) {
            Some(result) => result,
            None => self.acquire_slow(key),
        }
    }

    /// A key not in the map: under the bucket's exclusive lock, track it (with its ledger
    /// gauge, if it has one, else a new one) and decide on its gauge, or, when the map is
    /// full, decide on its ledger gauge and the shared one. Two racing first requests meet
    /// here and the entry API gives both the same gauge.
    #[cold]
    #[inline(never)]
    fn acquire_slow<Q>(&self, key: &Q) -> Result<Permit, AtCapacity>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        let key = K::from(key.to_owned());
        // The resolver runs here, before any lock.
        let limit = self.limits.for_key(&key);
        if limit == 0 {
            // Nothing could ever be admitted: track nothing.
            return Err(AtCapacity {
                limit,
                overflow: false,
            });
        }
        let mut added = false;
        let decided = self.map.get_or_insert_else(
            key,
            // Room: the key's ledger gauge, still counting its shared permits out, becomes
            // its tracked gauge.
            |key| {
                self.overflow
                    .take(key)
                    .unwrap_or_else(|| Arc::new(Gauge::new(limit)))
            },
            |gauge| gauge.in_flight() == 0,
            acquire_on,
            |key| {
                let (decided, new) = self.overflow.acquire(key, limit);
                added = new;
                decided
            },
        );
        if added {
            // After the map's bucket is released, as the map sweeps after an insertion.
            self.overflow.sweep();
        }
        decided
    }

    /// How many permits of `key` are held now, shared ones (taken while the map was full)
    /// included; 0 for a key with none. A snapshot.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter: tollgate::concurrency::ConcurrencyLimiter<String> = tollgate::concurrency::ConcurrencyLimiter::new(4);
    /// assert_eq!(limiter.in_flight("alice"), 0);
    /// let _p = limiter.try_acquire("alice")?;
    /// assert_eq!(limiter.in_flight("alice"), 1);
    /// # Ok::<(), tollgate::concurrency::AtCapacity>(())
    /// ```
    #[must_use]
    pub fn in_flight<Q>(&self, key: &Q) -> u64
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map
            .read(key, |gauge| gauge.in_flight())
            .or_else(|| self.overflow.in_flight(key))
            .unwrap_or(0)
    }

    /// Removes every key with nothing in flight and returns how many it removed.
    ///
    /// Exact while requests run, from any thread: a key with a permit out is never removed
    /// (its count is at least 1, so the retiring CAS from 0 fails), and a request racing the
    /// removal either takes its permit first (and the key stays) or finds the key gone and
    /// creates it afresh, never a second count for one key. It visits the whole map, locking
    /// one bucket at a time: call it from a timer, not per request. It also drops the idle
    /// gauges of the overflow ledger (see [`max_keys`](ConcurrencyLimiter::max_keys)), which
    /// are not tracked keys and not counted.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter: tollgate::concurrency::ConcurrencyLimiter<String> = tollgate::concurrency::ConcurrencyLimiter::new(4);
    /// let busy = limiter.try_acquire("busy")?;
    /// drop(limiter.try_acquire("done")?);
    /// assert_eq!(limiter.evict_idle(), 1); // "done"; "busy" still has a permit out
    /// drop(busy);
    /// assert_eq!(limiter.evict_idle(), 1);
    /// assert!(limiter.is_empty());
    /// # Ok::<(), tollgate::concurrency::AtCapacity>(())
    /// ```
    pub fn evict_idle(&self) -> usize {
        // Each bucket is held exclusively while its gauges are checked: no acquirer is inside
        // them, and a count of 0 has no permit out to change it (see the type's docs).
        let removed = self.map.evict(|gauge| gauge.in_flight() == 0);
        self.overflow.evict();
        removed
    }

    /// How many keys are tracked now.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter: tollgate::concurrency::ConcurrencyLimiter<String> = tollgate::concurrency::ConcurrencyLimiter::new(4);
    /// let _a = limiter.try_acquire("a")?;
    /// let _b = limiter.try_acquire("b")?;
    /// assert_eq!(limiter.len(), 2);
    /// # Ok::<(), tollgate::concurrency::AtCapacity>(())
    /// ```
    #[must_use]
    pub fn len(&self) -> usize {
        // Relaxed: a snapshot of a statistic.
        self.map.len()
    }

    /// `true` when no key is tracked.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter: tollgate::concurrency::ConcurrencyLimiter<String> = tollgate::concurrency::ConcurrencyLimiter::new(4);
    /// assert!(limiter.is_empty());
    /// ```
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The limit every key is held to, or `None` when each key's limit comes from a
    /// resolver.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter: tollgate::concurrency::ConcurrencyLimiter<String> = tollgate::concurrency::ConcurrencyLimiter::new(4);
    /// assert_eq!(limiter.limit(), Some(4));
    /// ```
    #[must_use]
    pub fn limit(&self) -> Option<u64> {
        match self.limits {
            Limits::Uniform(limit) => Some(limit),
            Limits::PerKey(_) => None,
        }
    }
}

impl<K, S: BuildHasher> fmt::Debug for ConcurrencyLimiter<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let limit = match self.limits {
            Limits::Uniform(limit) => Some(limit),
            Limits::PerKey(_) => None,
        };
        f.debug_struct("ConcurrencyLimiter")
            .field("keys", &self.map.len())
            .field("limit", &limit)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ledger holds a gauge only for a key admitted while the map was full, gives it
    /// to the map when the key is tracked again, and forgets idle ones (the sweep of each
    /// new one, and `evict_idle`); a refusal adds none.
    #[test]
    fn the_ledger_holds_only_keys_that_overflowed() {
        let limiter: ConcurrencyLimiter<u32> = ConcurrencyLimiter::new(1).max_keys(1);
        let ledger = |limiter: &ConcurrencyLimiter<u32>| limiter.overflow.ledger.len();
        let held = limiter.try_acquire(&0).unwrap();
        let shared = limiter.try_acquire(&1).unwrap();
        assert!(shared.is_overflow());
        assert_eq!(ledger(&limiter), 1);
        // The only shared place is out: a new key is refused and leaves nothing behind.
        assert!(limiter.try_acquire(&2).unwrap_err().is_overflow());
        assert_eq!(ledger(&limiter), 1);
        // Key 1's idle gauge goes with the sweep that key 2's new one runs.
        drop(shared);
        let shared = limiter.try_acquire(&2).unwrap();
        assert!(shared.is_overflow());
        assert_eq!(ledger(&limiter), 1);
        assert_eq!(limiter.in_flight(&1), 0);
        assert_eq!(limiter.in_flight(&2), 1);
        // Room: key 2 is tracked on its ledger gauge, which leaves the ledger.
        drop(held);
        assert!(!limiter.try_acquire(&2).unwrap_err().is_overflow());
        assert_eq!(ledger(&limiter), 0);
        assert_eq!(limiter.len(), 1);
        drop(shared);
        // An idle ledger gauge goes with `evict_idle` too.
        let held = limiter.try_acquire(&2).unwrap();
        drop(limiter.try_acquire(&3).unwrap());
        assert_eq!(ledger(&limiter), 1);
        assert_eq!(limiter.evict_idle(), 0);
        assert_eq!(ledger(&limiter), 0);
        drop(held);
    }
}
