//! The keyed registry: [`RateLimiter`], one state per key in a concurrent map.
//!
//! The request path is a shared-lock map lookup, then the key's own lock-free state machine.
//! A key seen for the first time goes through the map's entry API, out of line. Eviction
//! removes states that are at rest, exactly, while requests run (see `docs/ARCHITECTURE.md`).

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;

use crate::error::check_cost;
use crate::sliding_counter::CounterCell;
use crate::sliding_log::LogCell;
use crate::state::RateState;
use crate::token_bucket::GcraCell;
use crate::{Algorithm, Clock, CostError, Decision, KeyHasher, Policy, SystemClock};

/// A rate limiter with one independent state per key (user id, API key, IP address...).
///
/// Share it through an `Arc` or a `static`: every method takes `&self`, and requests for
/// different keys never wait on each other. A request for an existing key takes a shared
/// lock on one bucket of the map and a compare-and-swap on the key's state; it allocates
/// nothing. Keys may be looked up by any borrowed form (`&str` for `String` keys).
///
/// | method | does |
/// |---|---|
/// | [`try_acquire`](RateLimiter::try_acquire) | decides a request of cost 1 |
/// | [`try_acquire_n`](RateLimiter::try_acquire_n) | decides a request of cost n |
/// | [`evict_idle`](RateLimiter::evict_idle) | removes every state at rest, exactly |
/// | [`len`](RateLimiter::len) | counts the keys tracked now |
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tollgate::{FakeClock, RateLimiter};
///
/// let clock = FakeClock::new();
/// let limiter: RateLimiter<String, FakeClock> =
///     RateLimiter::with_clock("2/1s".parse()?, clock.clone());
///
/// assert!(limiter.try_acquire("alice").is_allowed());
/// assert!(limiter.try_acquire("alice").is_allowed());
/// let refused = limiter.try_acquire("alice");
/// assert!(!refused.is_allowed());
/// assert_eq!(refused.retry_after(), Duration::from_millis(500));
/// assert!(limiter.try_acquire("bob").is_allowed()); // keys are independent
///
/// clock.advance(Duration::from_secs(1));
/// assert_eq!(limiter.evict_idle(), 2);
/// assert_eq!(limiter.len(), 0);
/// # Ok::<(), tollgate::PolicyError>(())
/// ```
pub struct RateLimiter<K = String, C = SystemClock, S: BuildHasher = KeyHasher> {
    registry: Registry<K, S>,
    clock: C,
    policy: Policy,
    /// Keys tracked now: incremented on creation, decremented on eviction, both under the
    /// bucket's exclusive lock, so it never drifts from the map.
    tracked: CachePadded<AtomicUsize>,
}

/// One map per algorithm, chosen once at construction: a single predictable branch per call,
/// and each map stores its algorithm's state inline with no enum padding.
enum Registry<K, S: BuildHasher> {
    TokenBucket(Keyed<K, GcraCell, S>),
    SlidingLog(Keyed<K, LogCell, S>),
    SlidingCounter(Keyed<K, CounterCell, S>),
}

/// Runs `$body` with `$keyed` bound to whichever map the registry holds.
macro_rules! with_keyed {
    ($registry:expr, $keyed:ident => $body:expr) => {
        match $registry {
            Registry::TokenBucket($keyed) => $body,
            Registry::SlidingLog($keyed) => $body,
            Registry::SlidingCounter($keyed) => $body,
        }
    };
}

struct Keyed<K, St: RateState, S: BuildHasher> {
    map: scc::HashMap<K, St, S>,
    params: St::Params,
}

impl<K: Hash + Eq, St: RateState, S: BuildHasher> Keyed<K, St, S> {
    fn new(policy: &Policy, hasher: S) -> Self {
        Keyed {
            map: scc::HashMap::with_hasher(hasher),
            params: St::params(policy),
        }
    }

    /// The hit path: a shared bucket lock for the duration of the state's CAS loop.
    #[inline]
    fn try_acquire<Q, C>(&self, key: &Q, clock: &C, cost: u64, tracked: &AtomicUsize) -> Decision
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
        C: Clock,
    {
        let hit = self
            .map
            .read_sync(key, |_, state| state.try_acquire(&self.params, clock, cost));
        match hit {
            Some(Some(decision)) => decision,
            _ => self.acquire_slow(key, clock, cost, tracked),
        }
    }

    /// A key not in the map (or whose state was retired): create or replace its state under
    /// the bucket's exclusive lock, then decide. Two racing first requests meet here and the
    /// entry API gives both the same state.
    #[cold]
    #[inline(never)]
    fn acquire_slow<Q, C>(&self, key: &Q, clock: &C, cost: u64, tracked: &AtomicUsize) -> Decision
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
        C: Clock,
    {
        let mut entry = match self.map.entry_sync(K::from(key.to_owned())) {
            scc::hash_map::Entry::Occupied(entry) => entry,
            scc::hash_map::Entry::Vacant(entry) => {
                // Relaxed: a statistic; the bucket lock orders it against eviction's decrement.
                tracked.fetch_add(1, Ordering::Relaxed);
                entry.insert_entry(St::fresh(&self.params))
            }
        };
        if let Some(decision) = entry.get().try_acquire(&self.params, clock, cost) {
            return decision;
        }
        // Retired in place: replace it (never revive it). We hold the bucket exclusively, so
        // no reader can still be inside the old state.
        *entry.get_mut() = St::fresh(&self.params);
        match entry.get().try_acquire(&self.params, clock, cost) {
            Some(decision) => decision,
            None => unreachable!("a fresh state is live and the bucket lock is held"),
        }
    }

    fn evict_idle(&self, now: u64, tracked: &AtomicUsize) -> usize {
        let mut removed = 0;
        // `retain_sync` holds each bucket's lock exclusively while it runs the predicate, so
        // no request is inside a state while it is retired and unlinked; retiring first also
        // keeps the state machine exact on its own (the loom models check that part).
        self.map.retain_sync(|_, state| {
            let retire = state.try_retire(&self.params, now);
            removed += usize::from(retire);
            !retire
        });
        tracked.fetch_sub(removed, Ordering::Relaxed);
        removed
    }
}

impl<K: Hash + Eq> RateLimiter<K, SystemClock, KeyHasher> {
    /// A limiter enforcing `policy` per key, on the real clock.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::RateLimiter;
    ///
    /// let limiter: RateLimiter<String> = RateLimiter::new("100/min".parse()?);
    /// assert!(limiter.try_acquire("alice").is_allowed());
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn new(policy: Policy) -> Self {
        Self::with_clock(policy, SystemClock::new())
    }
}

impl<K: Hash + Eq, C: Clock> RateLimiter<K, C, KeyHasher> {
    /// A limiter enforcing `policy` per key, reading time from `clock`.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, RateLimiter};
    ///
    /// let limiter: RateLimiter<u64, FakeClock> =
    ///     RateLimiter::with_clock("1/s".parse()?, FakeClock::new());
    /// assert!(limiter.try_acquire(&42).is_allowed());
    /// assert!(!limiter.try_acquire(&42).is_allowed());
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn with_clock(policy: Policy, clock: C) -> Self {
        Self::with_hasher(policy, clock, KeyHasher::default())
    }
}

impl<K: Hash + Eq, C: Clock, S: BuildHasher> RateLimiter<K, C, S> {
    /// A limiter with a hasher of your choice for its keys (see [`KeyHasher`] for the
    /// default and why).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::collections::hash_map::RandomState;
    /// use tollgate::{FakeClock, RateLimiter};
    ///
    /// let limiter = RateLimiter::<String, _, _>::with_hasher(
    ///     "3/s".parse()?,
    ///     FakeClock::new(),
    ///     RandomState::new(), // SipHash, the standard library's
    /// );
    /// assert_eq!(limiter.try_acquire("alice").remaining(), 2);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn with_hasher(policy: Policy, clock: C, hasher: S) -> Self {
        let registry = match policy.algorithm() {
            Algorithm::TokenBucket => Registry::TokenBucket(Keyed::new(&policy, hasher)),
            Algorithm::SlidingLog => Registry::SlidingLog(Keyed::new(&policy, hasher)),
            Algorithm::SlidingCounter => Registry::SlidingCounter(Keyed::new(&policy, hasher)),
        };
        RateLimiter {
            registry,
            clock,
            policy,
            tracked: CachePadded::new(AtomicUsize::new(0)),
        }
    }

    /// Decides a request of cost 1 for `key`.
    ///
    /// An existing key costs a map lookup (shared lock on one bucket) and a compare-and-swap;
    /// nothing is allocated. A new key allocates its entry (and clones the key) once.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, RateLimiter};
    ///
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("5/1s".parse()?, FakeClock::new());
    /// let decision = limiter.try_acquire("alice"); // &str finds the String key
    /// assert!(decision.is_allowed());
    /// assert_eq!(decision.remaining(), 4);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[inline]
    pub fn try_acquire<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        self.acquire(key, 1)
    }

    /// Decides a request of cost `n` for `key`: allowed only if `n` permits are available,
    /// and then all `n` are spent.
    ///
    /// # Errors
    ///
    /// [`CostError::Zero`] for `n == 0` and [`CostError::ExceedsLimit`] for `n` above the
    /// policy's permits. A refused cost creates and changes nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{CostError, FakeClock, RateLimiter};
    ///
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("5/1s".parse()?, FakeClock::new());
    /// assert_eq!(limiter.try_acquire_n("export", 3)?.remaining(), 2);
    /// assert!(!limiter.try_acquire_n("export", 3)?.is_allowed());
    /// assert_eq!(limiter.try_acquire_n("export", 0), Err(CostError::Zero));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_acquire_n<Q>(&self, key: &Q, n: u64) -> Result<Decision, CostError>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        check_cost(n, self.policy.permits())?;
        Ok(self.acquire(key, n))
    }

    #[inline]
    fn acquire<Q>(&self, key: &Q, cost: u64) -> Decision
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        with_keyed!(&self.registry, keyed => keyed.try_acquire(key, &self.clock, cost, &self.tracked))
    }

    /// Removes every key whose state is at rest (it would decide exactly as a key never seen),
    /// and returns how many it removed.
    ///
    /// Safe to run while requests are being decided, from any thread: no request racing it is
    /// ever admitted beyond the policy. It visits the whole map, locking one bucket at a time,
    /// so call it from a timer rather than per request.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{FakeClock, RateLimiter};
    ///
    /// let clock = FakeClock::new();
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("5/1s".parse()?, clock.clone());
    /// limiter.try_acquire("alice");
    /// assert_eq!(limiter.evict_idle(), 0); // alice still owes 200 ms of refill
    /// clock.advance(Duration::from_millis(200));
    /// assert_eq!(limiter.evict_idle(), 1);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn evict_idle(&self) -> usize {
        let now = self.clock.now();
        with_keyed!(&self.registry, keyed => keyed.evict_idle(now, &self.tracked))
    }

    /// How many keys are tracked now.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, RateLimiter};
    ///
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("5/1s".parse()?, FakeClock::new());
    /// limiter.try_acquire("a");
    /// limiter.try_acquire("b");
    /// assert_eq!(limiter.len(), 2);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn len(&self) -> usize {
        // Relaxed: a snapshot of a statistic.
        self.tracked.load(Ordering::Relaxed)
    }

    /// `true` when no key is tracked.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, RateLimiter};
    ///
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("5/1s".parse()?, FakeClock::new());
    /// assert!(limiter.is_empty());
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The policy every key is held to.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, Policy, RateLimiter};
    ///
    /// let policy: Policy = "5/1s".parse()?;
    /// let limiter: RateLimiter<String, FakeClock> = RateLimiter::with_clock(policy, FakeClock::new());
    /// assert_eq!(limiter.policy(), policy);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The clock the limiter reads.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{Clock, FakeClock, RateLimiter};
    ///
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("5/1s".parse()?, FakeClock::new());
    /// assert_eq!(limiter.clock().now(), 0);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn clock(&self) -> &C {
        &self.clock
    }
}

impl<K, C, S: BuildHasher> fmt::Debug for RateLimiter<K, C, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiter")
            .field("policy", &self.policy)
            .field("keys", &self.tracked.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}
