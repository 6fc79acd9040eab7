//! Per-key concurrency limits: [`ConcurrencyLimiter`], how many requests of one key may be in
//! flight at once (not how many per second).
//!
//! A job scheduler capping each tenant at 4 running jobs, a proxy capping each client at 10
//! open connections: [`try_acquire`](ConcurrencyLimiter::try_acquire) hands out a [`Permit`]
//! while the key has fewer than its limit in flight, and the permit gives its place back when
//! it is dropped, on every path out of the guarded work, unwinding from a panic included.
//!
//! Each key's count is one atomic word in a [`Gauge`], updated by compare-and-swap; the map
//! holds the gauge behind an `Arc` so that a permit can release it without looking the key up
//! again (see [`ConcurrencyLimiter`] for why, and `docs/ARCHITECTURE.md`).

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::{Arc, Mutex};

use scc::hash_map::Entry;

use crate::bounded::{sweep_step, BoundedMap, SWEEP_PER_INSERT};
use crate::engine::retry::Retry;
use crate::engine::sync::{AtomicU64, Ordering};
use crate::hasher::KeyHasher;

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
/// use tollgate::ConcurrencyLimiter;
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
/// # Ok::<(), tollgate::AtCapacity>(())
/// ```
pub struct ConcurrencyLimiter<K = String, S: BuildHasher = KeyHasher> {
    /// The gauge of each key tracked now, at most `max_keys` of them.
    map: BoundedMap<K, Arc<Gauge>, S>,
    limits: Limits<K>,
    /// What keys get while the map is full: the shared gauges and the overflow ledger.
    overflow: Overflow<K>,
}

/// What keys that find the map full are decided on (see
/// [`max_keys`](ConcurrencyLimiter::max_keys)): one gauge shared by all such keys of a limit,
/// and, in the *ledger*, the key's own gauge, so that every permit of a key, shared or not,
/// counts on one gauge.
///
/// A key's ledger entry is read, created and taken out only inside
/// [`BoundedMap::get_or_insert_else`]'s `make` and `full`, while the key's bucket in the map
/// is held exclusively with the key absent. So a key has one gauge at a time, in the map or
/// in the ledger, and a gauge moves from the ledger into the map (when room frees up) in a
/// step during which nobody can take a permit of the key. The sweep removes only ledger
/// gauges with nothing in flight, under the ledger bucket's exclusive lock, which every
/// acquire on a ledger gauge also holds: a count of 0 there cannot be raised while it is
/// checked, exactly as in the map. Lock order: the map's bucket, then the ledger's, then the
/// shared gauges'; nothing takes them the other way round (a permit's release takes none).
struct Overflow<K> {
    /// One gauge per distinct limit, shared by every key of that limit that overflows.
    shared: scc::HashMap<u64, Arc<Gauge>>,
    /// The gauge of each untracked key that holds (or lately held) shared permits. Hashed
    /// with the default hasher whatever the map's: it is on the cold path, keyed by clients.
    ledger: scc::HashMap<K, Arc<Gauge>, KeyHasher>,
    /// Where the incremental sweep of idle ledger gauges stopped.
    cursor: Mutex<Option<K>>,
}

impl<K: Hash + Eq + Clone> Overflow<K> {
    fn new() -> Self {
        Overflow {
            shared: scc::HashMap::new(),
            ledger: scc::HashMap::with_hasher(KeyHasher::default()),
            cursor: Mutex::new(None),
        }
    }

    /// Takes the key's ledger gauge out, to be tracked in the map. Call only from `make`.
    fn take(&self, key: &K) -> Option<Arc<Gauge>> {
        self.ledger.remove_sync(key).map(|(_, gauge)| gauge)
    }

    /// A shared permit for `key`, on its ledger gauge (created with `limit` when it has
    /// none) and on the shared gauge of that gauge's limit, and whether it added a ledger
    /// gauge. Call only from `full`. A refusal adds nothing.
    fn acquire(&self, key: &K, limit: u64) -> (Result<Permit, AtCapacity>, bool) {
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
    fn in_flight<Q>(&self, key: &Q) -> Option<u64>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.ledger.read_sync(key, |_, gauge| gauge.in_flight())
    }

    /// One step of the incremental sweep of idle ledger gauges, after a new one.
    fn sweep(&self) {
        sweep_step(&self.ledger, &self.cursor, SWEEP_PER_INSERT, |gauge| {
            gauge.in_flight() == 0
        });
    }

    /// Removes every ledger gauge with nothing in flight.
    fn evict(&self) {
        // Each bucket is held exclusively while its gauges are checked (see the type's docs).
        self.ledger.retain_sync(|_, gauge| gauge.in_flight() != 0);
    }
}

/// A permit on a key's gauge and on the shared gauge of its limit (what a request decides
/// while the map is full), or a refusal that leaves both as they were.
///
/// The key's gauge is tried first: a refusal by the shared gauge then gives the key's place
/// back, so no other key's request ever sees a shared place taken and returned. The key's
/// own gauge is raised here only while its map bucket is held (see [`Overflow`]), so no
/// other request of the key decides while the place is out either; only a snapshot
/// ([`Permit::in_flight`]) can see it.
#[inline]
fn acquire_shared(gauge: &Arc<Gauge>, shared: &Arc<Gauge>) -> Result<Permit, AtCapacity> {
    let refused = Err(AtCapacity {
        limit: gauge.limit,
        overflow: true,
    });
    if gauge.try_acquire() == Acquire::Full {
        return refused;
    }
    if shared.try_acquire() == Acquire::Full {
        // The `Release` of `release` is more than this needs (the request did nothing to
        // publish); a `Relaxed` RMW would keep the count exact as well.
        gauge.release();
        return refused;
    }
    Ok(Permit {
        gauge: Arc::clone(gauge),
        shared: Some(Arc::clone(shared)),
    })
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

/// One key's in-flight count and its limit. See [`ConcurrencyLimiter`] for the value table.
///
/// Orderings: a successful acquire is `Acquire` and a release is `Release`, as for a lock:
/// whatever a holder did before dropping its permit happens-before whatever the thread that
/// takes the freed place does after acquiring, so a permit can guard a resource (a
/// connection, a slot of a buffer), not only a count. Everything else is `Relaxed`: a
/// refusal publishes nothing, and exactness comes from the compare-and-swap alone (all
/// writes to the count form one modification order, and a CAS succeeds only on the latest
/// value, so two acquirers never take the same place).
#[derive(Debug)]
pub(crate) struct Gauge {
    count: AtomicU64,
    limit: u64,
}

/// What [`Gauge::try_acquire`] concluded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Acquire {
    /// One more in flight: the caller now owns a place and must release it.
    Acquired,
    /// At the limit; nothing was written.
    Full,
}

impl Gauge {
    fn new(limit: u64) -> Self {
        Gauge {
            count: AtomicU64::new(0),
            limit,
        }
    }

    #[inline]
    fn try_acquire(&self) -> Acquire {
        // Relaxed: a snapshot to decide from. A stale value only makes the CAS below fail
        // (and retry with the fresh one) or refuses from a count the key really had.
        let mut count = self.count.load(Ordering::Relaxed);
        let mut retry = Retry::new();
        loop {
            if count >= self.limit {
                return Acquire::Full;
            }
            // Acquire on success: pairs with the Release in `release`, so the work of the
            // permit whose place we take happens-before ours. Relaxed on failure: we only
            // retry from the value read. `count < limit`: no overflow.
            match self.count.compare_exchange_weak(
                count,
                count + 1,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Acquire::Acquired,
                Err(_) => {
                    // Another holder came or went first: let its core keep the line a
                    // little, then read the count afresh (the value the CAS saw is stale
                    // by then). Relaxed: as the first read.
                    retry.spin();
                    count = self.count.load(Ordering::Relaxed);
                }
            }
        }
    }

    /// Gives back one place. Called exactly once per `Acquired`, by the permit's `Drop`.
    #[inline]
    fn release(&self) {
        // Release: publishes the holder's work to the next acquirer (see the type's docs).
        // The count is at least 1 here (this permit's place), so it never wraps.
        let before = self.count.fetch_sub(1, Ordering::Release);
        debug_assert!(before >= 1, "release of count {before}");
    }

    /// Permits held now.
    fn in_flight(&self) -> u64 {
        // Relaxed: a snapshot for statistics and tests; under the bucket's exclusive lock
        // (eviction), a 0 read here cannot be raised by anyone (see the type's docs).
        self.count.load(Ordering::Relaxed)
    }
}

/// One place in flight for a key of a [`ConcurrencyLimiter`], given back when dropped.
///
/// Keep it alive for exactly as long as the guarded work runs (bind it: `let _permit = ...`,
/// not `let _ = ...`, which drops it at once). It releases on every way out of its scope,
/// including unwinding from a panic. (A panic in a build with `panic = "abort"` ends the
/// process, and with it every count.)
///
/// A permit owns its place: it borrows neither the limiter nor the key, so it can move into
/// another thread or an async task and be dropped there (`Permit: Send + Sync + 'static`).
///
/// # Examples
///
/// ```
/// use tollgate::ConcurrencyLimiter;
///
/// let limiter: ConcurrencyLimiter<String> = ConcurrencyLimiter::new(1);
/// let permit = limiter.try_acquire("db")?;
/// let worker = std::thread::spawn(move || {
///     let _permit = permit; // released when the worker finishes
///     // ... use the connection ...
/// });
/// worker.join().unwrap();
/// assert_eq!(limiter.in_flight("db"), 0);
/// # Ok::<(), tollgate::AtCapacity>(())
/// ```
#[must_use = "the place is given back as soon as the permit is dropped"]
pub struct Permit {
    /// The key's gauge: the one in the map, or the key's ledger gauge while it overflows.
    gauge: Arc<Gauge>,
    /// The shared gauge of the key's limit, for a permit taken while the map was full.
    shared: Option<Arc<Gauge>>,
}

impl Permit {
    /// The limit of the permit's key.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter: tollgate::ConcurrencyLimiter<String> = tollgate::ConcurrencyLimiter::new(3);
    /// assert_eq!(limiter.try_acquire("k")?.limit(), 3);
    /// # Ok::<(), tollgate::AtCapacity>(())
    /// ```
    #[must_use]
    pub fn limit(&self) -> u64 {
        self.gauge.limit
    }

    /// How many permits of this key are held now, this one included, shared permits of
    /// the key counted with its own (a snapshot).
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter: tollgate::ConcurrencyLimiter<String> = tollgate::ConcurrencyLimiter::new(3);
    /// let first = limiter.try_acquire("k")?;
    /// let second = limiter.try_acquire("k")?;
    /// assert_eq!(first.in_flight(), 2);
    /// drop(second);
    /// assert_eq!(first.in_flight(), 1);
    /// # Ok::<(), tollgate::AtCapacity>(())
    /// ```
    #[must_use]
    pub fn in_flight(&self) -> u64 {
        self.gauge.in_flight()
    }

    /// Whether the permit came from the gauge that keys share while the limiter tracks
    /// [`max_keys`](ConcurrencyLimiter::max_keys) keys (see there).
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter: tollgate::ConcurrencyLimiter<String> = tollgate::ConcurrencyLimiter::new(3);
    /// assert!(!limiter.try_acquire("k")?.is_overflow());
    /// # Ok::<(), tollgate::AtCapacity>(())
    /// ```
    #[must_use]
    pub fn is_overflow(&self) -> bool {
        self.shared.is_some()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        // The shared place first: by the time the key's own place is free, and another
        // request of the key can take it, the shared one is back as well. (Either order
        // keeps every count at or above the permits really out.)
        if let Some(shared) = &self.shared {
            shared.release();
        }
        self.gauge.release();
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("in_flight", &self.gauge.in_flight())
            .field("limit", &self.gauge.limit)
            .finish()
    }
}

/// A refusal from [`ConcurrencyLimiter::try_acquire`]: the key already has its limit of
/// permits in flight. Nothing was changed.
///
/// It carries no retry time: places come back when holders finish, not at a known instant.
/// Callers typically answer 429 or 503, queue the work, or retry after a short backoff.
///
/// # Examples
///
/// ```
/// use tollgate::{AtCapacity, ConcurrencyLimiter};
///
/// let limiter: ConcurrencyLimiter<String> = ConcurrencyLimiter::new(1);
/// let _held = limiter.try_acquire("k")?;
/// let refused: AtCapacity = limiter.try_acquire("k").unwrap_err();
/// assert_eq!(refused.limit(), 1);
/// assert_eq!(refused.to_string(), "at its concurrency limit: 1 in flight");
/// # Ok::<(), AtCapacity>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AtCapacity {
    limit: u64,
    overflow: bool,
}

impl AtCapacity {
    /// The key's limit, all of it in flight.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter: tollgate::ConcurrencyLimiter<String> = tollgate::ConcurrencyLimiter::new(0);
    /// assert_eq!(limiter.try_acquire("closed").unwrap_err().limit(), 0);
    /// ```
    #[must_use]
    pub const fn limit(&self) -> u64 {
        self.limit
    }
}

impl AtCapacity {
    /// Whether the refusal came from the gauge that keys share while the limiter tracks
    /// [`max_keys`](ConcurrencyLimiter::max_keys) keys (see there).
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter: tollgate::ConcurrencyLimiter<String> = tollgate::ConcurrencyLimiter::new(1);
    /// let _held = limiter.try_acquire("k")?;
    /// assert!(!limiter.try_acquire("k").unwrap_err().is_overflow());
    /// # Ok::<(), tollgate::AtCapacity>(())
    /// ```
    #[must_use]
    pub const fn is_overflow(&self) -> bool {
        self.overflow
    }
}

impl fmt::Display for AtCapacity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at its concurrency limit: {} in flight", self.limit)
    }
}

impl std::error::Error for AtCapacity {}

impl<K: Hash + Eq + Clone> ConcurrencyLimiter<K, KeyHasher> {
    /// A limiter allowing `limit` requests in flight per key.
    ///
    /// A limit of 0 refuses every request (and tracks no key).
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::ConcurrencyLimiter;
    ///
    /// let per_client: ConcurrencyLimiter<std::net::IpAddr> = ConcurrencyLimiter::new(10);
    /// let ip = "192.0.2.7".parse().unwrap();
    /// let _connection = per_client.try_acquire(&ip)?;
    /// assert_eq!(per_client.in_flight(&ip), 1);
    /// # Ok::<(), tollgate::AtCapacity>(())
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
    /// use tollgate::ConcurrencyLimiter;
    ///
    /// let jobs: ConcurrencyLimiter<String> =
    ///     ConcurrencyLimiter::with_resolver(|tenant: &String| if tenant.starts_with("big-") { 8 } else { 2 });
    /// assert_eq!(jobs.try_acquire("big-corp")?.limit(), 8);
    /// assert_eq!(jobs.try_acquire("small-shop")?.limit(), 2);
    /// # Ok::<(), tollgate::AtCapacity>(())
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
    /// use tollgate::ConcurrencyLimiter;
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
    /// use tollgate::ConcurrencyLimiter;
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
    /// # Ok::<(), tollgate::AtCapacity>(())
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
    /// use tollgate::ConcurrencyLimiter;
    ///
    /// let limiter: ConcurrencyLimiter<String> = ConcurrencyLimiter::new(1);
    /// {
    ///     let _permit = limiter.try_acquire("alice")?;
    ///     assert!(limiter.try_acquire("alice").is_err());
    /// } // released here
    /// assert!(limiter.try_acquire("alice").is_ok());
    /// # Ok::<(), tollgate::AtCapacity>(())
    /// ```
    #[inline]
    pub fn try_acquire<Q>(&self, key: &Q) -> Result<Permit, AtCapacity>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        match self.map.read(key, Self::acquire_on) {
            Some(result) => result,
            None => self.acquire_slow(key),
        }
    }

    /// Decides on a tracked key's gauge.
    #[inline]
    fn acquire_on(gauge: &Arc<Gauge>) -> Result<Permit, AtCapacity> {
        match gauge.try_acquire() {
            Acquire::Acquired => Ok(Permit {
                gauge: Arc::clone(gauge),
                shared: None,
            }),
            Acquire::Full => Err(AtCapacity {
                limit: gauge.limit,
                overflow: false,
            }),
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
            Self::acquire_on,
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
    /// let limiter: tollgate::ConcurrencyLimiter<String> = tollgate::ConcurrencyLimiter::new(4);
    /// assert_eq!(limiter.in_flight("alice"), 0);
    /// let _p = limiter.try_acquire("alice")?;
    /// assert_eq!(limiter.in_flight("alice"), 1);
    /// # Ok::<(), tollgate::AtCapacity>(())
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
    /// let limiter: tollgate::ConcurrencyLimiter<String> = tollgate::ConcurrencyLimiter::new(4);
    /// let busy = limiter.try_acquire("busy")?;
    /// drop(limiter.try_acquire("done")?);
    /// assert_eq!(limiter.evict_idle(), 1); // "done"; "busy" still has a permit out
    /// drop(busy);
    /// assert_eq!(limiter.evict_idle(), 1);
    /// assert!(limiter.is_empty());
    /// # Ok::<(), tollgate::AtCapacity>(())
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
    /// let limiter: tollgate::ConcurrencyLimiter<String> = tollgate::ConcurrencyLimiter::new(4);
    /// let _a = limiter.try_acquire("a")?;
    /// let _b = limiter.try_acquire("b")?;
    /// assert_eq!(limiter.len(), 2);
    /// # Ok::<(), tollgate::AtCapacity>(())
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
    /// let limiter: tollgate::ConcurrencyLimiter<String> = tollgate::ConcurrencyLimiter::new(4);
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
    /// let limiter: tollgate::ConcurrencyLimiter<String> = tollgate::ConcurrencyLimiter::new(4);
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

/// One gauge, for the loom models in `tests/loom_models/concurrency.rs`; compiled only under
/// `--cfg tollgate_loom` (re-exported from `tollgate::model`).
#[cfg(tollgate_loom)]
#[doc(hidden)]
#[derive(Debug)]
pub struct ModelGauge(Arc<Gauge>);

#[cfg(tollgate_loom)]
impl ModelGauge {
    /// A gauge with nothing in flight.
    pub fn new(limit: u64) -> Self {
        ModelGauge(Arc::new(Gauge::new(limit)))
    }

    /// What the limiter's hit path does on this gauge.
    pub fn try_acquire(&self) -> Result<Permit, AtCapacity> {
        ConcurrencyLimiter::<String>::acquire_on(&self.0)
    }

    /// What a request does while the map is full, this gauge being the key's (in the
    /// overflow ledger, its map bucket held) and `shared` the shared gauge of its limit.
    pub fn try_acquire_overflow(&self, shared: &ModelGauge) -> Result<Permit, AtCapacity> {
        acquire_shared(&self.0, &shared.0)
    }

    /// Permits held now.
    pub fn in_flight(&self) -> u64 {
        self.0.in_flight()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acquire_up_to_the_limit_then_refuse_without_writing() {
        let gauge = Gauge::new(2);
        assert_eq!(gauge.try_acquire(), Acquire::Acquired);
        assert_eq!(gauge.try_acquire(), Acquire::Acquired);
        assert_eq!(gauge.try_acquire(), Acquire::Full);
        assert_eq!(gauge.in_flight(), 2);
        gauge.release();
        assert_eq!(gauge.in_flight(), 1);
        assert_eq!(gauge.try_acquire(), Acquire::Acquired);
    }

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

    #[test]
    fn zero_limit_always_full() {
        assert_eq!(Gauge::new(0).try_acquire(), Acquire::Full);
    }

    #[test]
    fn the_largest_limit_counts_to_the_top_without_overflow() {
        let gauge = Gauge::new(u64::MAX);
        gauge.count.store(u64::MAX - 1, Ordering::Relaxed);
        assert_eq!(gauge.try_acquire(), Acquire::Acquired);
        assert_eq!(gauge.in_flight(), u64::MAX);
        assert_eq!(gauge.try_acquire(), Acquire::Full);
        gauge.release();
        assert_eq!(gauge.in_flight(), u64::MAX - 1);
    }
}
