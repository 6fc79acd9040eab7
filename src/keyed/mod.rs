//! The keyed limiter: [`RateLimiter`], one state per key in a concurrent map.
//!
//! The request path is a lock-free lookup, then the key's own lock-free state machine. A key
//! seen for the first time goes through the table's entry API, out of line. Eviction retires
//! and removes states that are at rest, exactly, while requests run. A policy change starts a
//! new *generation* (a new table); keys move into it one by one, carrying the permits they
//! have in use (see `docs/ARCHITECTURE.md`).
//!
//! Modules, each importing (with `use`) only those above it:
//!
//! | module | job |
//! |---|---|
//! | `table` | the table: a lock-free index from key to state, retire-then-unlink removal |
//! | `rules` | what a generation enforces: one policy, or a resolver per key |
//! | `overflow` | the states new keys share once the limiter is full |
//! | `striped` | a contended key's stripes, in a side table beside the key's state |
//! | `last_hit` | each thread's pinned key, decided with no guard and no lookup |
//! | `key_state` | what a generation's table stores per key, one table type per algorithm |
//! | `generations` | the current and older generations, policy changes, what every operation shares |
//! | `request` | deciding a tracked key: a small inline hit, the rest out of line; `peek` |
//! | `create` | the cold miss: a key's state created under its bucket lock, or the overflow state |
//! | `sweep` | removing states at rest: the incremental sweep, eviction, the reset of a key |
//! | `settle` | giving back or charging the difference of a reservation |
//! | `stats` | decision counters and shadow mode |
//! | this one | [`RateLimiter`]: every public method, over the modules above |
//! | `wait` | waiting for a permit: the `acquire` methods, over this one's `try_acquire` |

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::Arc;

use crate::clock::{Clock, Fixed, Reading, SystemClock};
use crate::decision::Decision;
use crate::error::CostError;
use crate::keys::KeyHasher;
use crate::policy::Policy;
use crate::reservation::{Origin, PartHeld, Reservation, SettleError};
use crate::reservation_guard::ReservationGuard;
use crate::stats::{Counted, Counters, Stats};

use self::generations::Generations;
use self::request::Decided;
use self::rules::Rules;
use self::stats::Extras;

mod create;
mod generations;
mod kept;
mod key_state;
mod last_hit;
mod overflow;
mod request;
mod rules;
mod settle;
mod stats;
mod striped;
mod sweep;
mod table;
mod wait;

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
/// tracked key costs. For string keys, [`InlineKey`](crate::keys::InlineKey) is the lean choice:
/// 16 bytes holding a string of up to 15 bytes inside itself (a longer one behind a
/// pointer), looked up by `&str` exactly as `String` is. `Box<str>` is also 16 bytes in the
/// table, but keeps the string in a heap block of its own; `String` is 24 bytes plus that
/// block (docs/BENCHMARKS.md gives the bytes per key of each, measured). Across many keys of
/// up to 15 bytes `InlineKey` is also faster: a lookup compares the key inside the entry
/// instead of following a pointer to its bytes. On one hot key it is slower, by the check
/// that its bytes are UTF-8 each time it is compared with the `&str` looked up. Fixed-size
/// keys (`u64`, `IpAddr`, `[u8; 16]`)
/// allocate nothing of their own.
///
/// ```
/// use tollgate::{FakeClock, RateLimiter};
/// use tollgate::keys::InlineKey;
///
/// let limiter: RateLimiter<InlineKey, FakeClock> =
///     RateLimiter::with_clock("2/1s".parse()?, FakeClock::new());
/// assert_eq!(limiter.try_acquire("alice").remaining(), 1); // &str, as for String keys
/// # Ok::<(), tollgate::PolicyError>(())
/// ```
pub struct RateLimiter<K = String, C = SystemClock, S: BuildHasher = KeyHasher> {
    /// The keys' states, in the generations of the policies enforced so far.
    generations: Generations<K, C, S>,
    /// Decision counters and shadow mode, when either is on: one test on the hot path when
    /// both are off.
    extras: Option<Box<Extras>>,
}

impl<K: Hash + Eq + Clone + Send + 'static> RateLimiter<K, SystemClock, KeyHasher> {
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

impl<K: Hash + Eq + Clone + Send + 'static, C: Clock> RateLimiter<K, C, KeyHasher> {
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

impl<K: Hash + Eq + Clone + Send + 'static, C: Clock, S: BuildHasher + Clone + 'static>
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
        RateLimiter {
            generations: Generations::new(rules, clock, hasher),
            extras: None,
        }
    }
}

impl<K: Hash + Eq + Clone + 'static, C: Clock, S: BuildHasher + Clone + 'static>
    RateLimiter<K, C, S>
{
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
    /// its budget by being pushed out of the map and back in. Counted in a state of the
    /// key's own, those permits are stamped at that instant and rounded up; a request that
    /// state would refuse is decided on the shared state instead when the limiter was full
    /// as it came (as a [`peek`](RateLimiter::peek) or [`available`](RateLimiter::available)
    /// of a key the limiter does not track decides it at the cap), and when the shared state
    /// refuses too (a refusal then creates nothing). The price is paid by new keys
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
        self.generations.max_keys = max_keys;
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
        self.generations.sweep_slice = entries;
        self
    }

    /// Whether a key that threads keep contending for may be striped (default on).
    ///
    /// Striped, a key's requests of cost 1 decide on stripes, one per core, each on its own
    /// cache line, leased in runs from the key's state, so that threads on different cores
    /// stop writing one line and a hot key's throughput grows with them. The decisions stay
    /// exact: a key of `N` permits admits exactly `N` requests of cost 1 on a frozen clock
    /// however many threads race, and never more than the policy allows in any interval on a
    /// moving one (see `docs/ARCHITECTURE.md`, "Striped hot keys"). A key is striped only
    /// once compare-and-swaps on it keep failing (sixteen lost within about a millisecond,
    /// counted over the keys of one of 64 hashes), costs no memory until then, and returns
    /// to one word when it goes quiet; up to 64 keys of a limiter are striped at once.
    ///
    /// What changes while a key is striped: an admission's `remaining` counts the key's word
    /// and the deciding thread's stripe, not the others' (it may be low by one lease per
    /// other stripe); `peek` and [`available`](RateLimiter::available) count every stripe,
    /// but a request of cost above 1 or a reservation takes only from the key's word, so it
    /// may be refused while stripes hold permits; a refund stops at the end of the latest run
    /// a stripe leased, used up or not, so a reservation settled after a stripe leased a run
    /// above it gets back less than it held, or nothing (the rest returns as time refills
    /// the bucket). A lease lasts 10 µs of the policy's timeline (fewer permits for a small
    /// burst), and what other stripes hold when the key is unstriped is lost once time
    /// passes it (one lease per stripe at most, never an admission beyond the policy).
    ///
    /// Only a token bucket under one policy for every key is striped (not a per-key
    /// resolver's keys, nor the shared overflow state). Off, every request is one
    /// compare-and-swap on its key's word, and a refund takes no lock.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::RateLimiter;
    ///
    /// let limiter: RateLimiter<u64> = RateLimiter::new("1000000/s".parse()?).striping(false);
    /// assert!(limiter.try_acquire(&7).is_allowed());
    /// assert!(!limiter.is_striped(&7));
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn striping(mut self, on: bool) -> Self {
        self.generations.may_stripe = on;
        self
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
        self.generations.len()
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
        self.generations.policy()
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
        &self.generations.clock
    }

    /// Decides a request of cost 1 for `key`.
    ///
    /// An existing key costs a lock-free lookup and a compare-and-swap; nothing is allocated.
    /// A key this thread keeps deciding on (a run of requests in a row) costs the
    /// compare-and-swap alone, once the thread has kept a copy of it (see
    /// `docs/ARCHITECTURE.md`, "Each thread's last hit"). A new key allocates its state and
    /// its entry (and clones the key) once.
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
        self.acquire_at(key, &mut Reading::default())
    }

    /// [`try_acquire`](RateLimiter::try_acquire) at `reading`'s instant (see
    /// [`Clock::now_in`]): a fresh one, or the one reading of an `AllOf`. A key not tracked
    /// yet is decided at the limiter's own time, and clears `reading` (`Generations::miss_at`).
    #[inline(always)]
    pub(crate) fn acquire_at<Q>(&self, key: &Q, reading: &mut Reading) -> Decision
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        let at = Fixed(self.generations.clock.now_in(reading));
        self.generations
            .acquire_one(key, &at, reading, |decision| self.finish(decision))
    }

    /// Decides a request of cost `n` for `key`: allowed only if `n` permits are available,
    /// and then all `n` are spent.
    ///
    /// # Errors
    ///
    /// [`CostError::Zero`] for `n == 0` and [`CostError::ExceedsLimit`] for `n` above the
    /// key's policy's permits (the smallest band's, for a composite policy). A refused cost
    /// creates and changes nothing.
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
        self.acquire_n_at(key, n, &mut Reading::default())
    }

    /// [`try_acquire_n`](RateLimiter::try_acquire_n) at `reading`'s instant, as
    /// [`acquire_at`](RateLimiter::acquire_at).
    #[inline(always)]
    pub(crate) fn acquire_n_at<Q>(
        &self,
        key: &Q,
        n: u64,
        reading: &mut Reading,
    ) -> Result<Decision, CostError>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        if n == 1 {
            // The path that knows the stripes.
            return Ok(self.acquire_at(key, reading));
        }
        CostError::nonzero(n)?;
        // Inlined, the marks are never stored.
        self.reserve_cost(key, n, reading)
            .map(|decided| decided.decision)
    }

    /// What a request of cost 1 for `key` would get now, changing nothing and creating no
    /// state. Any number of peeks leave every later decision as it would have been. In
    /// [shadow mode](RateLimiter::shadow) it is the policy's own answer, and is not counted.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, RateLimiter};
    ///
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("2/1s".parse()?, FakeClock::new());
    /// assert_eq!(limiter.peek("alice").remaining(), 1); // what the first request would get
    /// assert_eq!(limiter.len(), 0);
    /// limiter.try_acquire("alice");
    /// assert_eq!(limiter.peek("alice").remaining(), 0);
    /// assert!(limiter.try_acquire("alice").is_allowed());
    /// assert!(!limiter.peek("alice").is_allowed());
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn peek<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        match self.generations.peek(key, 1, true) {
            Ok(decision) => decision,
            // Every policy has at least one permit, so a cost of 1 is always acceptable.
            Err(_) => unreachable!("a cost of 1 is within every policy"),
        }
    }

    /// What a request of cost `n` for `key` would get now, changing nothing and creating no
    /// state: [`peek`](RateLimiter::peek) for a request of several permits, as
    /// [`try_acquire_n`](RateLimiter::try_acquire_n) would decide it at this instant.
    ///
    /// # Errors
    ///
    /// As `try_acquire_n`: [`CostError::Zero`] and [`CostError::ExceedsLimit`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{FakeClock, RateLimiter};
    ///
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("10/1s".parse()?, FakeClock::new());
    /// limiter.try_acquire_n("alice", 8)?;
    /// let peeked = limiter.peek_n("alice", 5)?;
    /// assert!(!peeked.is_allowed());
    /// assert_eq!(peeked.retry_after(), Duration::from_millis(300)); // 3 more to come back
    /// assert!(limiter.peek_n("alice", 2)?.is_allowed());
    /// assert!(limiter.peek_n("alice", 11).is_err()); // above the policy: never allowed
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peek_n<Q>(&self, key: &Q, n: u64) -> Result<Decision, CostError>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        CostError::nonzero(n)?;
        self.generations.peek(key, n, true)
    }

    /// What [`RateLimiter::take_part`] would decide now, changing nothing: the key's word
    /// alone, as a reservation takes from it.
    pub(crate) fn peek_part<Q>(&self, key: &Q, cost: u64) -> Result<Decision, CostError>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        CostError::nonzero(cost)?;
        self.generations.peek(key, cost, false)
    }

    /// Where a reservation of `key` made now would come from: this limiter and key.
    pub(crate) fn origin<Q: Hash + ?Sized>(&self, key: &Q) -> Origin {
        self.generations.origin(key)
    }

    /// Whether `key`'s requests of cost 1 are now spread over stripes: the key was
    /// contended, and has not gone quiet since (see [`striping`](RateLimiter::striping)).
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::RateLimiter;
    ///
    /// let limiter: RateLimiter<u64> = RateLimiter::new("10/s".parse()?);
    /// limiter.try_acquire(&1);
    /// assert!(!limiter.is_striped(&1), "one caller: one word");
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn is_striped<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.generations.is_striped(key)
    }

    /// The permits `key` has now: the largest cost `n` for which
    /// [`try_acquire_n(key, n)`](RateLimiter::try_acquire_n) would be allowed at this
    /// instant, 0 when even one request would be refused. Changes nothing and creates no
    /// state, as [`peek`](RateLimiter::peek).
    ///
    /// **Not `peek(key).remaining()`**: that is what would remain *after* one more request,
    /// the number an admission reports. While anything is left, `available` is one more;
    /// when nothing is, both are 0.
    ///
    /// Under a policy of several limits it is the smallest over them; for a key decided by
    /// the shared overflow state of a full limiter ([`max_keys`](RateLimiter::max_keys)), the
    /// shared state's. In shadow mode it is what the policy has (shadow mode lets requests
    /// through, it does not add permits). While the key is
    /// [striped](RateLimiter::striping), the count includes permits the stripes hold, which
    /// only requests of cost 1 take: at most one lease per stripe of it may be out of reach of
    /// a larger request.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, RateLimiter};
    ///
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("5/1s".parse()?, FakeClock::new());
    /// assert_eq!(limiter.available("alice"), 5); // a fresh key has all 5
    /// assert_eq!(limiter.peek("alice").remaining(), 4); // what one more request would leave
    /// limiter.try_acquire_n("alice", 3)?;
    /// assert_eq!(limiter.available("alice"), 2);
    /// assert!(!limiter.try_acquire_n("alice", 3)?.is_allowed()); // 3 > 2: refused
    /// assert!(limiter.try_acquire_n("alice", 2)?.is_allowed());
    /// assert_eq!(limiter.available("alice"), 0);
    /// assert_eq!(limiter.peek("alice").remaining(), 0); // both 0 when nothing is left
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn available<Q>(&self, key: &Q) -> u64
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        // A peek decides a request of cost 1 without taking it.
        self.peek(key).available_before(1)
    }

    /// A request of `cost` (at least 1) for `key`, its decision through stats and shadow
    /// mode, and where its admission stands.
    #[inline(always)]
    fn reserve_cost<Q>(
        &self,
        key: &Q,
        cost: u64,
        reading: &mut Reading,
    ) -> Result<Decided, CostError>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        self.generations
            .decide(key, cost, reading)
            .map(|decided| Decided {
                decision: self.finish(decided.decision),
                ..decided
            })
    }

    /// A request of `cost` for `key` decided as [`reserve_n`](RateLimiter::reserve_n) decides
    /// it, for a part of an `AllOf`: the decision and what a reservation of it keeps, less
    /// the key's hash, which only a give-back needs ([`RateLimiter::part_reservation`]).
    /// Decided at `reading`'s instant, as [`acquire_at`](RateLimiter::acquire_at).
    #[inline]
    pub(crate) fn take_part<Q, R>(
        &self,
        key: &Q,
        cost: u64,
        reading: &mut Reading,
        mut on: impl FnMut(Decision, PartHeld) -> R,
    ) -> Result<R, CostError>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        CostError::nonzero(cost)?;
        // Read before the decision, as `reserve_n`'s origin.
        let made = self.generations.rebuilds.read();
        self.generations.decide_with(
            key,
            cost,
            reading,
            #[inline(always)]
            |decided| {
                let held = PartHeld {
                    marks: decided.marks,
                    made,
                    overflow: decided.overflow,
                    overflowed: decided.decision.is_overflow(),
                    created: decided.created,
                };
                on(self.finish(decided.decision), held)
            },
        )
    }

    /// The reservation of `key` that [`RateLimiter::take_part`] took, `decision` on `cost`.
    pub(crate) fn part_reservation<Q>(
        &self,
        key: &Q,
        decision: Decision,
        cost: u64,
        held: PartHeld,
    ) -> Reservation
    where
        Q: Hash + ?Sized,
    {
        let origin = Origin {
            rebuilds: held.made,
            ..self.generations.origin(key)
        };
        // The shared overflow state's flag, for the settle to find that state again.
        let decision = if held.overflowed {
            decision.overflowed()
        } else {
            decision
        };
        Reservation::new(decision, cost, held.marks, origin).decided_under(held.overflow)
    }

    /// Gives back every permit of `reservation`, what a part of a refused request of
    /// several limits (an `AllOf`, a route of several rules) took for `key`; a state it
    /// `created` goes again, unless another request has spent from it since, so that the
    /// refusal leaves the key as it found it.
    pub(crate) fn give_back_part<Q>(&self, key: &Q, reservation: Reservation, created: bool)
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        // The reservation was just taken on this limiter and key: only a reset or a policy
        // change in between can void its refund, as for any reservation.
        let _ = self.cancel(key, reservation);
        if created {
            self.generations.forget_at_rest(key);
        }
    }

    /// Takes `n` permits for `key` now, for a request whose real cost is known only after it
    /// ran: the tokens an LLM call really used, an order that may fail. Decided exactly as
    /// [`try_acquire_n`](RateLimiter::try_acquire_n), except on a contended key spread over
    /// stripes (see [`striping`](RateLimiter::striping)): a reservation takes from the key's
    /// own state only, where a request of cost 1 also takes what the stripes hold. The
    /// [`Reservation`] remembers where its admission stands in each band, so that
    /// [`settle`](RateLimiter::settle) can give back what the request did not use, or charge
    /// what it used on top.
    ///
    /// An allowed reservation's permits are spent at once, so every other request sees
    /// them. A refused one holds nothing (its decision says when to retry). A reservation
    /// dropped unsettled keeps its permits spent.
    ///
    /// # Errors
    ///
    /// As [`try_acquire_n`](RateLimiter::try_acquire_n): [`CostError::Zero`] and
    /// [`CostError::ExceedsLimit`]; nothing changes.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, RateLimiter};
    ///
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("10000/min".parse()?, FakeClock::new());
    /// let r = limiter.reserve_n("tenant-1", 4000)?; // the most the completion may use
    /// assert_eq!(r.decision().remaining(), 6000);
    /// limiter.settle("tenant-1", r, 1200)?; // it used 1,200: 2,800 come back
    /// assert_eq!(limiter.peek("tenant-1").remaining(), 8799);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve_n<Q>(&self, key: &Q, n: u64) -> Result<Reservation, CostError>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        self.take_part(key, n, &mut Reading::default(), |decision, held| {
            self.part_reservation(key, decision, n, held)
        })
    }

    /// [`reserve_n`](RateLimiter::reserve_n), guarded: the [`ReservationGuard`] cancels the
    /// reservation when it is dropped unsettled (an early return, a `?`, a panic), so only a
    /// [`settle`](ReservationGuard::settle) keeps permits spent. Decided exactly as
    /// `reserve_n`.
    ///
    /// # Errors
    ///
    /// As [`reserve_n`](RateLimiter::reserve_n): [`CostError::Zero`] and
    /// [`CostError::ExceedsLimit`]; nothing changes.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, RateLimiter};
    ///
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("100/min".parse()?, FakeClock::new());
    /// {
    ///     let _guard = limiter.reserve_guarded("tenant-7", 40)?;
    ///     assert_eq!(limiter.available("tenant-7"), 60);
    /// } // dropped unsettled: the 40 come back
    /// assert_eq!(limiter.available("tenant-7"), 100);
    /// limiter.reserve_guarded("tenant-7", 40)?.settle(25)?;
    /// assert_eq!(limiter.available("tenant-7"), 75);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve_guarded<'a, Q>(
        &'a self,
        key: &'a Q,
        n: u64,
    ) -> Result<ReservationGuard<'a, Self, Q>, CostError>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        let reservation = self.reserve_n(key, n)?;
        Ok(ReservationGuard::new(
            self,
            key,
            reservation,
            |limiter, key, r, actual| limiter.settle(key, r, actual),
        ))
    }

    /// Settles a reservation of `key` at what the request really cost.
    ///
    /// * `actual` below the reservation: the difference comes back, as if those permits had
    ///   never been admitted, but never more than the reservation still holds (a token
    ///   bucket's refill or a window's passing may already have given some back) and never
    ///   more than a fresh state has. While the key is [striped](RateLimiter::striping), a
    ///   refund stops at the end of the latest run its stripes leased: it may give back
    ///   less, or nothing.
    /// * `actual` above it: the difference is charged at once, even past the limit. A token
    ///   bucket and a sliding counter carry the debt, so later requests wait it out (a token
    ///   bucket up to one more full burst, a counter up to twice its permits in a window); a
    ///   sliding log saturates at its limit within the window, as it holds one entry per
    ///   permit.
    /// * `actual` equal: nothing to do.
    ///
    /// If the key's state is gone by then (evicted at rest), nothing is given back and a
    /// charge is made on its new state. After a [`reset`](RateLimiter::reset) or a
    /// [`set_policy`](RateLimiter::set_policy) (of any key), reservations made before get
    /// no refund, since the state that held their permits is gone, but are still charged.
    /// A reservation decided by the shared overflow state of a full limiter
    /// ([`max_keys`](RateLimiter::max_keys)) is refunded there, on the shared state of the
    /// policy it was decided under, whatever a resolver answers for the key by then; a charge
    /// on it goes where the key's next request would (its own state if it has one by now).
    /// A refund is checked against resets and policy changes once the state it would write
    /// to is found, so a settle racing a `reset` of its key never gives back to the fresh
    /// state. See `docs/ALGORITHMS.md`.
    ///
    /// # Errors
    ///
    /// [`SettleError::Refused`] for a reservation that holds nothing,
    /// [`SettleError::OtherKey`] and [`SettleError::OtherLimiter`] for one made for another
    /// key or by another limiter. A failed settle changes nothing: the permits stay spent.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, RateLimiter};
    ///
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("10/s".parse()?, FakeClock::new());
    /// let r = limiter.reserve_n("alice", 10)?;
    /// limiter.settle("alice", r, 3)?; // 7 come back
    /// assert_eq!(limiter.peek("alice").remaining(), 6);
    /// let r = limiter.reserve_n("alice", 2)?;
    /// limiter.settle("alice", r, 10)?; // 8 more than reserved: a debt
    /// assert!(!limiter.peek("alice").is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn settle<Q>(
        &self,
        key: &Q,
        reservation: Reservation,
        actual: u64,
    ) -> Result<(), SettleError>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        self.generations.settle(key, reservation, actual)
    }

    /// Gives back everything a reservation holds: [`settle`](RateLimiter::settle) at 0.
    ///
    /// # Errors
    ///
    /// As [`settle`](RateLimiter::settle).
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, RateLimiter};
    ///
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("3/s".parse()?, FakeClock::new());
    /// let global = limiter.reserve_n("global", 1)?;
    /// // ... an inner limit refused the request: the global permit comes back.
    /// limiter.cancel("global", global)?;
    /// assert_eq!(limiter.peek("global").remaining(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cancel<Q>(&self, key: &Q, reservation: Reservation) -> Result<(), SettleError>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        self.settle(key, reservation, 0)
    }

    /// Enforces `policy` on every key from now on, without a restart.
    ///
    /// The rule for keys already tracked: **permits already spent stay spent, and no key
    /// gains more than the new policy allows.** Each key moves to the new policy on its next
    /// request (or stays behind until eviction finds it at rest): its state under the old
    /// policy is retired, the permits it has in use are counted (for the token bucket, the
    /// permits not yet refilled, rounded up; for the log, the live entries; for the counter,
    /// the weighted estimate, rounded up), and its new state starts with that many spent at
    /// that instant, capped at the new limit. A band of the new policy counts the permits of
    /// old bands whose window is no longer than its own (those were all spent within its
    /// window); a longer old window says nothing about a shorter new one and is not counted.
    /// Counted as spent at the instant of the change, they are held for the new policy's
    /// window from then: a change refuses more for a while, never less (a policy changed
    /// again every window keeps a counter's last partly counted permit spent).
    /// A limiter built with a resolver enforces the one `policy` from then on.
    ///
    /// **A round trip gives nothing back.** The cap at the new limit, and a new band that
    /// does not count a longer old window, leave part of what a key spent uncounted by its
    /// new state. That part is kept beside the states, band by band, until a window after
    /// it was counted, and every state built for the key meanwhile (after another change, or
    /// after eviction) counts it too; at `max_keys`, where a new key shares the overflow
    /// state, it refuses the key first. So a key that spent 1,000 of `1000/1h`, moved to
    /// `10/1h` and back within the hour, gets nothing more until those 1,000 have come back.
    /// What is kept was spent apart from what the key's state counts, and the two add up;
    /// a permit the state counts in a band of a longer window is kept only for the windows
    /// below that band's, so however often the windows grow, it is counted once.
    /// A permit the state in between counts in a band of a shorter window than the one it
    /// was spent under is not kept: it comes back with that band, so a round trip through
    /// a policy of shorter bands (`10/1h & 10/1min`, then `5/1min`) may give back, once the
    /// shorter window has passed, what that band counted.
    /// A state built from kept permits alone holds them from when they were counted; one
    /// built with permits the key has in use as it moves counts both as spent then (so a key
    /// that moves long after a change may be held up to a window past its move). A key
    /// [`reset`](RateLimiter::reset) forgets them; the same holds for a resolver's new
    /// answers ([`set_resolver`](RateLimiter::set_resolver)). Only keys a change moved
    /// without counting all they spent cost memory for it, for one window of the old policy.
    ///
    /// Reloads cost nothing over time: re-applying the policy in force changes nothing (a
    /// service may apply its configuration every minute), and the map of a replaced policy
    /// is dropped as soon as it holds no key (at once if it never held one, else by
    /// [`evict_idle`](RateLimiter::evict_idle) or the automatic sweep once its keys have
    /// moved or come to rest), so new keys never pay for past reloads.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, RateLimiter};
    ///
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("10/min".parse()?, FakeClock::new());
    /// for _ in 0..4 {
    ///     limiter.try_acquire("alice");
    /// }
    /// limiter.set_policy("5/min".parse()?); // tighter: alice has 4 of 5 spent
    /// assert_eq!(limiter.try_acquire("alice").remaining(), 0);
    /// assert!(!limiter.try_acquire("alice").is_allowed());
    /// assert_eq!(limiter.try_acquire("bob").remaining(), 4); // new keys: the new policy
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn set_policy(&self, policy: Policy) {
        self.generations.replace_rules(Rules::Uniform(policy));
    }

    /// Moves every key still under a policy replaced by [`set_policy`](RateLimiter::set_policy)
    /// to the policy in force now, rather than on its next request: what each key has in use
    /// is counted at this instant (for a client throttle whose log widens, the calls its old
    /// log still counts now, which on their next request it might no longer). A walk over
    /// every key, each under its bucket's lock for its move only.
    #[cfg_attr(
        not(feature = "tower"),
        allow(dead_code, reason = "the client throttle's, behind `tower`")
    )]
    pub(crate) fn move_every_key_now(&self) {
        self.generations.move_every_key();
    }

    /// Chooses every key's policy with `resolver` from now on, under the same rule for keys
    /// already tracked as [`set_policy`](RateLimiter::set_policy).
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, Policy, RateLimiter};
    ///
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("10/min".parse()?, FakeClock::new());
    /// let vip: Policy = "100/min".parse()?;
    /// let rest: Policy = "10/min".parse()?;
    /// limiter.set_resolver(move |user: &String| if user == "vip" { vip } else { rest });
    /// assert_eq!(limiter.try_acquire("vip").limit(), 100);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn set_resolver(&self, resolver: impl Fn(&K) -> Policy + Send + Sync + 'static) {
        self.generations
            .replace_rules(Rules::PerKey(Arc::new(resolver)));
    }

    /// Removes every key whose state is at rest (it would decide exactly as a key never seen),
    /// and returns how many it removed.
    ///
    /// Safe to run while requests are being decided, from any thread: no request racing it is
    /// ever admitted beyond the policy. It visits the whole map, locking one bucket at a time,
    /// so call it from a timer rather than per request. It also drops the maps of replaced
    /// policies once they hold no key.
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
        self.generations.evict_idle()
    }

    /// Forgets `key`'s state, in whatever generation it is: its next request starts fresh
    /// under the policy in force (or that the resolver now returns for it), but for what a
    /// full limiter's shared overflow state still counts (see
    /// [`max_keys`](RateLimiter::max_keys)). Returns whether a state was removed. Use it to move a key to another tier, or to clear a record (a
    /// successful login clearing failed attempts).
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, RateLimiter};
    ///
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("1/min".parse()?, FakeClock::new());
    /// limiter.try_acquire("alice");
    /// assert!(!limiter.try_acquire("alice").is_allowed());
    /// assert!(limiter.reset("alice"));
    /// assert!(limiter.try_acquire("alice").is_allowed());
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn reset<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.generations.reset(key)
    }

    /// Counts allowed, refused and overflowed decisions, read with
    /// [`stats`](RateLimiter::stats). The counters are striped across cache lines, so
    /// threads do not contend on them, but each decision still pays one atomic add.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, RateLimiter};
    ///
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("1/min".parse()?, FakeClock::new()).with_stats();
    /// let _ = limiter.try_acquire("a");
    /// let _ = limiter.try_acquire("a");
    /// assert_eq!(limiter.stats().refused, 1);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn with_stats(mut self) -> Self {
        self.extras.get_or_insert_with(Box::default).counters = Some(Counters::new());
        self
    }

    /// Shadow mode, for rolling out a policy safely: every request is decided and counted
    /// as usual, but a refusal is let through, marked by [`Decision::would_refuse`]. Permits
    /// are spent only by the requests the policy itself admits, so the limiter's state is
    /// exactly what enforcing the policy would have produced.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, RateLimiter};
    ///
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("1/min".parse()?, FakeClock::new()).shadow().with_stats();
    /// assert!(limiter.try_acquire("a").is_allowed());
    /// let second = limiter.try_acquire("a");
    /// assert!(second.is_allowed() && second.would_refuse());
    /// assert_eq!(limiter.stats().refused, 1);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn shadow(mut self) -> Self {
        self.extras.get_or_insert_with(Box::default).shadow = true;
        self
    }

    /// The decision counters and the number of keys tracked.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, RateLimiter};
    ///
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("5/s".parse()?, FakeClock::new());
    /// let _ = limiter.try_acquire("a");
    /// let stats = limiter.stats();
    /// assert_eq!(stats.keys, 1);
    /// assert!(!stats.counting); // built without `with_stats`
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn stats(&self) -> Stats {
        Extras::stats(self.extras.as_deref(), self.len())
    }

    /// A peek's `decision` as a request would get it, counting nothing: in shadow mode a
    /// refusal let through (where a peek stands in for a decision: the parts of an `AllOf`
    /// after a refusal, a route's rules).
    #[inline]
    pub(crate) fn as_decided(&self, decision: Decision) -> Decision {
        match &self.extras {
            Some(extras) if extras.shadow => decision.shadowed(),
            _ => decision,
        }
    }

    /// Counts a decision and applies shadow mode.
    #[inline(always)]
    fn finish(&self, decision: Decision) -> Decision {
        match &self.extras {
            None => decision,
            Some(extras) if extras.count(Counted::of(&decision)) => decision.shadowed(),
            Some(_) => decision,
        }
    }
}

impl<K, C, S: BuildHasher> fmt::Debug for RateLimiter<K, C, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiter")
            .field("keys", &self.generations.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
