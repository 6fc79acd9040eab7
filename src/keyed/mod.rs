//! The keyed registry: [`RateLimiter`], one state per key in a concurrent map.
//!
//! The request path is a lock-free lookup, then the key's own lock-free state machine. A key
//! seen for the first time goes through the table's entry API, out of line. Eviction retires
//! and removes states that are at rest, exactly, while requests run. A policy change starts a
//! new *generation* (a new table); keys move into it one by one, carrying the permits they
//! have in use (see `docs/ARCHITECTURE.md`).
//!
//! | module | job |
//! |---|---|
//! | this one | the limiter, its constructors and options, what it reports |
//! | `slot` | what a generation's table stores per key, one table type per algorithm |
//! | `table` | the table: a lock-free index from key to state, retire-then-unlink removal |
//! | `request` | deciding: a small inline hit, one cold miss that creates the key's state |
//! | `generations` | policy changes: generations, keys carrying their permits into the new one |
//! | `sweep` | removing states at rest: the incremental sweep, `evict_idle`, `reset` |
//! | `wait` | waiting until a request is admitted |
//! | `stats` | decision counters and shadow mode |

use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_utils::CachePadded;
use scc::{AtomicShared, Guard};

use crate::clock::{Clock, SystemClock};
use crate::engine::rebuilds::Rebuilds;
use crate::hasher::KeyHasher;
use crate::policy::Policy;
use crate::reservation::next_limiter_id;

use self::generations::{Generation, Rules};
use self::overflow::Inherited;
use self::slot::Registry;
use self::stats::Extras;
use self::sweep::{sweep_grace, DEFAULT_SWEEP_SLICE};

mod generations;
mod overflow;
mod request;
mod settle;
mod slot;
mod stats;
mod sweep;
mod table;
mod wait;

/// How a limiter built with [`RateLimiter::with_resolver`] chooses each key's policy.
pub(crate) type Resolver<K> = dyn Fn(&K) -> Policy + Send + Sync;

/// A rate limiter with one independent state per key (user id, API key, IP address...).
///
/// Share it through an `Arc` or a `static`: every method takes `&self`, and requests for
/// different keys never wait on each other. A request for an existing key takes no lock: a
/// lock-free lookup, then a compare-and-swap on the key's state; it allocates nothing. Keys
/// may be looked up by any borrowed form (`&str` for `String` keys).
///
/// | method | does |
/// |---|---|
/// | [`try_acquire`](RateLimiter::try_acquire) | decides a request of cost 1 |
/// | [`try_acquire_n`](RateLimiter::try_acquire_n) | decides a request of cost n |
/// | [`peek`](RateLimiter::peek) | what a request would get now, changing nothing |
/// | [`reserve_n`](RateLimiter::reserve_n), [`settle`](RateLimiter::settle), [`cancel`](RateLimiter::cancel) | takes permits now, gives back or charges the difference once the real cost is known |
/// | [`evict_idle`](RateLimiter::evict_idle) | removes every state at rest, exactly |
/// | [`reset`](RateLimiter::reset) | forgets one key's state |
/// | [`set_policy`](RateLimiter::set_policy) | changes the policy live, keeping spent permits spent |
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
///
/// # Choosing the key type
///
/// The limiter keeps its own copy of each key, so the key type is most of the memory a
/// tracked key costs. For string keys, [`InlineKey`](crate::InlineKey) is the lean choice:
/// 16 bytes holding a string of up to 15 bytes inside itself (a longer one behind a
/// pointer), looked up by `&str` exactly as `String` is. `Box<str>` is also 16 bytes in the
/// table, but keeps the string in a heap block of its own; `String` is 24 bytes plus that
/// block. With 1,000,000 11-byte keys on a token bucket that is 54.5 heap bytes per key with
/// `InlineKey`, 65.5 with `Box<str>` and 82.3 with `String` (`cargo run --release --example
/// memory`, docs/BENCHMARKS.md). Across many keys of up to 15 bytes it is also faster: a
/// lookup compares the key inside the entry instead of following a pointer to its bytes (on
/// 100,000 random keys, about 130 ns per decision against 220 to 310 with `String`). On one
/// hot key it is slower by about 10 ns, the check that its bytes are UTF-8 each time it is
/// compared with the `&str` looked up. Fixed-size keys (`u64`, `IpAddr`, `[u8; 16]`)
/// allocate nothing of their own.
///
/// ```
/// use tollgate::{FakeClock, InlineKey, RateLimiter};
///
/// let limiter: RateLimiter<InlineKey, FakeClock> =
///     RateLimiter::with_clock("2/1s".parse()?, FakeClock::new());
/// assert_eq!(limiter.try_acquire("alice").remaining(), 1); // &str, as for String keys
/// # Ok::<(), tollgate::PolicyError>(())
/// ```
pub struct RateLimiter<K = String, C = SystemClock, S: BuildHasher = KeyHasher> {
    /// The generation requests go to. Never null.
    current: AtomicShared<Generation<K, S>>,
    clock: C,
    /// Builds the map of each new generation.
    hasher: S,
    /// Keys tracked now, over all generations: incremented before an insertion (under the
    /// bucket's exclusive lock) and decremented after a removal, so it never falls below the
    /// keys present.
    tracked: CachePadded<AtomicUsize>,
    /// Serialises policy changes and the unlinking of drained generations (cold paths only).
    config: Mutex<()>,
    /// The most keys tracked at once; new keys past it share an overflow state.
    max_keys: usize,
    /// How many entries each new key's insertion sweeps for idle states (0: never).
    sweep_slice: usize,
    /// Decision counters and shadow mode, when either is on: one test on the hot path when
    /// both are off.
    extras: Option<Box<Extras>>,
    /// Tells this limiter's reservations from another's.
    id: u64,
    /// States forgotten or rebuilt so far (`reset`, a policy change): a reservation made
    /// before one gets no refund (see `settle`).
    rebuilds: Rebuilds,
}

impl<K: Hash + Eq + Clone + 'static> RateLimiter<K, SystemClock, KeyHasher> {
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

impl<K: Hash + Eq + Clone + 'static, C: Clock> RateLimiter<K, C, KeyHasher> {
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

    /// A limiter whose policy is chosen per key, by `resolver`, when the key's state is
    /// created: tiers such as free users at 100 per minute and paid ones at 1,000.
    ///
    /// The resolver runs when a key's state is created (and again only if the key's state is
    /// evicted or [`reset`](RateLimiter::reset)), never for a key already tracked. It runs
    /// before the limiter takes any lock or holds back any memory reclamation, once per
    /// attempt to create the state: a slow resolver (a database lookup of the customer's
    /// tier) delays only the new key's own request, and a resolver may ask its own limiter
    /// about *other* keys. It must not change its limiter's rules
    /// ([`set_resolver`](RateLimiter::set_resolver), [`set_policy`](RateLimiter::set_policy)):
    /// a request that finds the rules changed while it created its key starts over and calls
    /// the resolver again, so a resolver that changes them every time keeps its own request
    /// from ever finishing. Two first requests for the same key that race each other may each
    /// call it once; the state is built from the answer of the one that creates it. A
    /// [`peek`](RateLimiter::peek) at a key not tracked calls it once too. To move a key to
    /// another tier, change what the resolver returns for it, then call `reset(&key)`: its
    /// next request starts from a fresh state under the new policy (but for what a full
    /// limiter's shared overflow state still counts: see [`max_keys`](RateLimiter::max_keys)).
    /// (Eviction does the same for keys at rest.) Each key then stores its policy's parameters beside its state, so
    /// per-key memory is larger than with one policy (see `docs/ALGORITHMS.md`).
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, Policy, RateLimiter};
    ///
    /// let free: Policy = "2/min".parse()?;
    /// let paid: Policy = "1000/min".parse()?;
    /// let limiter: RateLimiter<String, FakeClock> = RateLimiter::with_resolver(
    ///     move |user: &String| if user.starts_with("paid:") { paid } else { free },
    ///     FakeClock::new(),
    /// );
    /// assert_eq!(limiter.try_acquire("free:ann").limit(), 2);
    /// assert_eq!(limiter.try_acquire("paid:bob").remaining(), 999);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn with_resolver(
        resolver: impl Fn(&K) -> Policy + Send + Sync + 'static,
        clock: C,
    ) -> Self {
        Self::build(
            Rules::PerKey(Arc::new(resolver)),
            clock,
            KeyHasher::default(),
        )
    }
}

impl<K: Hash + Eq + Clone + 'static, C: Clock, S: BuildHasher + Clone + 'static>
    RateLimiter<K, C, S>
{
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
        Self::build(Rules::Uniform(policy), clock, hasher)
    }

    fn build(rules: Rules<K>, clock: C, hasher: S) -> Self {
        let registry = Registry::new(&rules, hasher.clone(), Inherited::default(), 0);
        let grace = sweep_grace(&rules);
        let generation = Generation {
            rules,
            registry,
            older: AtomicShared::null(),
            sweep_cursor: Mutex::new(None),
            sweep_grace: grace,
        };
        RateLimiter {
            current: AtomicShared::new(generation),
            clock,
            hasher,
            tracked: CachePadded::new(AtomicUsize::new(0)),
            config: Mutex::new(()),
            max_keys: usize::MAX,
            sweep_slice: DEFAULT_SWEEP_SLICE,
            extras: None,
            id: next_limiter_id(),
            rebuilds: Rebuilds::new(),
        }
    }

    /// Caps the keys tracked at once at `max_keys`, so that clients sending endless new keys
    /// (random IPs, forged tokens) cannot grow memory without bound.
    ///
    /// The overflow rule: when a new key finds the limiter full, the limiter first sweeps a
    /// slice of the map for states at rest and takes a freed place if there is one. If there
    /// is none, the key's request is decided by a **state shared by all overflowing keys**
    /// (one per policy), and the decision says so ([`Decision::is_overflow`](crate::Decision::is_overflow)); no state is
    /// created for the key. Keys already tracked keep their exact limits. So a flood of new
    /// keys can never exceed the cap, never resets a tracked key's spent permits (as evicting
    /// live states would), and never admits any key beyond its policy: the overflowing keys
    /// together get one key's budget. Refusing every new key instead would turn the flood
    /// into a denial of service for every new legitimate user; this rule degrades them to a
    /// shared budget until the flood's keys come to rest and are swept.
    ///
    /// What a key spent on the shared state follows it: when a place frees up and a key gets
    /// a state of its own, that state starts with the permits the shared state still counts
    /// (all the overflowing keys' together, so at least the key's own). A key cannot double
    /// its budget by being pushed out of the map and back in. The price is paid by new keys
    /// that never overflowed but get their state while the shared one is still busy (a key
    /// [`reset`](RateLimiter::reset) then too): they start with its permits spent, until the
    /// shared state comes to rest (one window of the policy after the flood stops; two for a
    /// sliding counter, whose previous window still weighs). During a flood that keeps the
    /// shared state spent, new keys therefore get nothing more than the overflowing ones:
    /// the flood squeezes new keys, never tracked ones. A policy change keeps the shared
    /// state's spent permits too, under the rule of [`set_policy`](RateLimiter::set_policy);
    /// under per-key policies every shared state of the new generation starts with what all
    /// of the old ones counted (keys that shared under one tier may have moved to another),
    /// so a change of tiers may refuse more for a window, never admit more. A change that
    /// follows another with no admission on the shared state in between hands on what it
    /// counted as it was counted, so frequent reloads do not keep a flood's count alive.
    /// (A resolver whose answer for an overflowing key changes between its requests lets
    /// that key spend on two shared states; change tiers with `set_resolver` or `reset`.)
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, RateLimiter};
    ///
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("2/min".parse()?, FakeClock::new()).max_keys(2);
    /// let _ = limiter.try_acquire("alice");
    /// let _ = limiter.try_acquire("bob");
    /// let third = limiter.try_acquire("mallory");
    /// assert!(third.is_overflow() && third.is_allowed());
    /// assert_eq!(limiter.len(), 2);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// How many entries of the map each new key's insertion sweeps for states at rest
    /// (default 8; 0 turns automatic eviction off).
    ///
    /// Idle keys then disappear without anyone calling
    /// [`evict_idle`](RateLimiter::evict_idle): every new key pays for a few steps of an
    /// incremental sweep that walks the whole map in turn, so the map is swept about
    /// `entries` times as fast as it grows, at a small constant cost per insertion and none
    /// on the hit path. Routine sweeping removes a state only once it has been at rest for
    /// a grace period (the policy's longest window; a minute with a resolver), so a key
    /// that is used now and then is not removed and re-created each time; a limiter that
    /// is full ([`max_keys`](RateLimiter::max_keys)) removes any state at rest. The sweep
    /// also drops the map of a replaced policy once it holds no key. A limiter that stops
    /// gaining keys stops sweeping, but then it does not grow either; call `evict_idle` from
    /// a timer to reclaim memory after a burst.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{FakeClock, RateLimiter};
    ///
    /// let clock = FakeClock::new();
    /// let limiter: RateLimiter<u64, FakeClock> =
    ///     RateLimiter::with_clock("1/s".parse()?, clock.clone()).sweep_per_insert(4);
    /// for key in 0..100 {
    ///     let _ = limiter.try_acquire(&key);
    /// }
    /// clock.advance(Duration::from_secs(3)); // all 100 at rest for over a window
    /// for key in 100..200 {
    ///     let _ = limiter.try_acquire(&key);
    /// }
    /// assert!(limiter.len() < 200);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn sweep_per_insert(mut self, entries: usize) -> Self {
        self.sweep_slice = entries;
        self
    }

    /// The generation requests go to now.
    #[inline(always)]
    fn generation<'g>(&self, guard: &'g Guard) -> &'g Generation<K, S> {
        // Acquire: pairs with the Release swap in `replace_rules`, so the new generation's
        // contents are visible before it is used.
        match self.current.load(Ordering::Acquire, guard).as_ref() {
            Some(generation) => generation,
            None => unreachable!("a limiter always has a current generation"),
        }
    }

    fn lock_config(&self) -> std::sync::MutexGuard<'_, ()> {
        // The guarded data is `()`: a panic elsewhere cannot leave it inconsistent.
        self.config
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The `config` lock if it is free now (poisoned or not, as `lock_config`).
    fn try_lock_config(&self) -> Option<std::sync::MutexGuard<'_, ()>> {
        match self.config.try_lock() {
            Ok(config) => Some(config),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
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

    /// The policy every key is held to, or `None` when each key's policy comes from a
    /// resolver.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, Policy, RateLimiter};
    ///
    /// let policy: Policy = "5/1s".parse()?;
    /// let limiter: RateLimiter<String, FakeClock> = RateLimiter::with_clock(policy, FakeClock::new());
    /// assert_eq!(limiter.policy(), Some(policy));
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn policy(&self) -> Option<Policy> {
        let guard = Guard::new();
        match &self.generation(&guard).rules {
            Rules::Uniform(policy) => Some(*policy),
            Rules::PerKey(_) => None,
        }
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
            .field("keys", &self.tracked.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::RateLimiter;
    use crate::clock::FakeClock;

    #[test]
    fn len_is_empty_and_debug_count_the_keys_tracked() {
        let limiter: RateLimiter<u64, FakeClock> =
            RateLimiter::with_clock("1/1h".parse().unwrap(), FakeClock::new());
        assert!(limiter.is_empty());
        assert_eq!(format!("{limiter:?}"), "RateLimiter { keys: 0, .. }");
        let _ = limiter.try_acquire(&1);
        let _ = limiter.try_acquire(&2);
        assert!(!limiter.is_empty());
        assert_eq!(limiter.len(), 2);
        assert_eq!(format!("{limiter:?}"), "RateLimiter { keys: 2, .. }");
    }
}
