//! The keyed registry: [`RateLimiter`], one state per key in a concurrent map.
//!
//! The request path is a shared-lock map lookup, then the key's own lock-free state machine.
//! A key seen for the first time goes through the map's entry API, out of line. Eviction
//! removes states that are at rest, exactly, while requests run. A policy change starts a new
//! *generation* (a new map); keys move into it one by one, carrying the permits they have in
//! use (see `docs/ARCHITECTURE.md`).

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::marker::PhantomData;
use std::sync::atomic::{fence, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_utils::CachePadded;
use scc::hash_map::Entry;
use scc::{AtomicShared, Guard, Shared, Tag};

use crate::bounded::{sweep_step, Swept};
use crate::clock::Fixed;
use crate::engine::any_state::AnyState;
use crate::engine::dispatch::{with_state, Build, Erased, Family};
use crate::engine::state::{Carry, RateState};
use crate::stats::Counters;
use crate::{Clock, CostError, Decision, KeyHasher, Policy, Stats, SystemClock, Wait};

/// How a limiter built with [`RateLimiter::with_resolver`] chooses each key's policy.
pub type Resolver<K> = dyn Fn(&K) -> Policy + Send + Sync;

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
/// | [`peek`](RateLimiter::peek) | what a request would get now, changing nothing |
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
/// tracked key costs. For string keys, `Box<str>` is the lean choice: it is looked up by
/// `&str` exactly as `String` is, but it is 16 bytes in the map where `String` is 24 (no
/// capacity word). With 1,000,000 11-byte keys on a token bucket that is 65.5 instead of
/// 82.3 heap bytes per key (`cargo run --release --example memory`, docs/BENCHMARKS.md).
/// Fixed-size keys (`u64`, `IpAddr`, `[u8; 16]`) allocate nothing besides the map.
///
/// ```
/// use tollgate::{FakeClock, RateLimiter};
///
/// let limiter: RateLimiter<Box<str>, FakeClock> =
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
    /// Keys tracked now, over all generations: incremented on creation, decremented on
    /// removal, each under the bucket's exclusive lock, so it never drifts from the maps.
    tracked: CachePadded<AtomicUsize>,
    /// Serialises policy changes and the unlinking of drained generations (cold paths only).
    config: Mutex<()>,
    /// The most keys tracked at once; new keys past it share an overflow state.
    max_keys: usize,
    /// How many entries each new key's insertion sweeps for idle states (0: never).
    sweep_slice: usize,
    /// Decision counters, when enabled with [`RateLimiter::with_stats`].
    counters: Option<Box<Counters>>,
    /// Shadow mode: refusals are counted and marked, then let through.
    shadow: bool,
}

/// The keys' states under one policy (or one resolver), and the generation it replaced.
struct Generation<K, S: BuildHasher> {
    rules: Rules<K>,
    registry: Registry<K, S>,
    /// The previous generation while it may still hold states; null once it has drained.
    older: AtomicShared<Generation<K, S>>,
    /// Where the incremental sweep stopped: the next step starts at this key (or at the
    /// beginning). `try_lock`ed, so one thread sweeps a generation at a time.
    sweep_cursor: Mutex<Option<K>>,
    /// How long a state must have been at rest before routine sweeping removes it: the
    /// policy's longest window, so a key used now and then is not removed and re-created
    /// over and over. (`evict_idle` and a full limiter remove any state at rest.)
    sweep_grace: u64,
}

/// How far one attempt at a decision got.
enum Step {
    /// Decided (or the cost refused).
    Done(Result<Decision, CostError>),
    /// Decided on a state just created for the key.
    Created(Result<Decision, CostError>),
    /// The generation was replaced: start over in the new one.
    Stale,
}

/// The first answer `found` gives for the generations older than `generation`, newest first.
fn first_in_older<K, S: BuildHasher, R>(
    generation: &Generation<K, S>,
    guard: &Guard,
    mut found: impl FnMut(&Generation<K, S>) -> Option<R>,
) -> Option<R> {
    // Acquire: pairs with the Release swap that linked each older generation.
    let mut older = generation.older.load(Ordering::Acquire, guard);
    while let Some(old) = older.as_ref() {
        if let Some(answer) = found(old) {
            return Some(answer);
        }
        older = old.older.load(Ordering::Acquire, guard);
    }
    None
}

/// The routine sweep's grace period for `rules`: the longest band window of a uniform
/// policy; a minute for per-key policies, whose windows vary.
fn sweep_grace<K>(rules: &Rules<K>) -> u64 {
    match rules {
        Rules::Uniform(policy) => policy
            .bands()
            .map(|band| band.window().as_nanos() as u64)
            .max()
            .unwrap_or(0),
        Rules::PerKey(_) => 60_000_000_000,
    }
}

/// Entries each new key's insertion sweeps by default.
const DEFAULT_SWEEP_SLICE: usize = 8;
/// Entries swept when a new key finds the limiter full.
const FULL_SWEEP_SLICE: usize = 64;

enum Rules<K> {
    Uniform(Policy),
    PerKey(Arc<Resolver<K>>),
}

/// One map per kind of state, chosen once per generation: a single predictable branch per
/// call, and each map stores its state inline with no enum padding.
enum Registry<K, S: BuildHasher> {
    /// One policy for every key: the map of its algorithm's state.
    Uniform(Erased<Maps<K, S>>),
    /// A policy per key: each state keeps its parameters.
    PerKey(Keyed<K, AnyState, S>),
}

/// A generation's map for one algorithm's state.
struct Maps<K, S>(PhantomData<(K, S)>);

impl<K, S: BuildHasher> Family for Maps<K, S> {
    type Of<St: RateState> = Keyed<K, St, S>;
}

/// Runs `$body` with `$keyed` bound to whichever map the registry holds.
macro_rules! with_keyed {
    ($registry:expr, $keyed:ident => $body:expr) => {
        match $registry {
            Registry::Uniform(uniform) => with_state!(uniform, $keyed => $body),
            Registry::PerKey($keyed) => $body,
        }
    };
}

struct Keyed<K, St: Slot<K>, S: BuildHasher> {
    map: scc::HashMap<K, St, S>,
    params: St::Params,
    /// What new keys share once the limiter tracks `max_keys` keys.
    overflow: St::Overflow,
}

/// What the registry stores per key: a state machine and how to build one for a key.
trait Slot<K>: Sized + Send + Sync {
    /// Shared by every key of the map: the policy's parameters, or the resolver.
    type Params: Send + Sync;

    fn max_cost(&self, params: &Self::Params) -> u64;
    fn try_acquire<C: Clock + ?Sized>(
        &self,
        params: &Self::Params,
        clock: &C,
        cost: u64,
    ) -> Option<Decision>;
    fn peek<C: Clock + ?Sized>(&self, params: &Self::Params, clock: &C) -> Option<Decision>;
    fn is_at_rest(&self, params: &Self::Params, now: u64) -> bool;
    /// The permits in use at `now` (see `RateState::carry`).
    fn carry(&self, params: &Self::Params, now: u64) -> Option<Carry>;

    /// What a new state for a key is built from: nothing for a uniform policy, the key's
    /// policy under a resolver.
    type Spec;
    /// The spec of a new state for `key`. Runs the resolver, if any: called before any
    /// bucket is taken, once per creation attempt, and the result passed on.
    fn resolve(params: &Self::Params, key: &K) -> Self::Spec;
    /// The most a new state of `spec` would accept: checked before anything is created.
    fn max_cost_for(params: &Self::Params, spec: &Self::Spec) -> u64;
    /// A new state of `spec`: fresh, or carrying permits from an older generation.
    fn build(params: &Self::Params, spec: &Self::Spec, carry: Option<&Carry>, now: u64) -> Self;

    /// The state(s) shared by new keys that find the limiter full.
    type Overflow: Send + Sync;
    fn new_overflow(params: &Self::Params) -> Self::Overflow;
    /// Decides a request of a new key of `spec` on the shared overflow state.
    fn overflow_acquire<C: Clock + ?Sized>(
        overflow: &Self::Overflow,
        params: &Self::Params,
        spec: &Self::Spec,
        clock: &C,
        cost: u64,
    ) -> Result<Decision, CostError>;
    /// What a request of a new key of `spec` would get from the overflow state now.
    fn overflow_peek<C: Clock + ?Sized>(
        overflow: &Self::Overflow,
        params: &Self::Params,
        spec: &Self::Spec,
        clock: &C,
    ) -> Decision;
}

/// Decides on a state that is never retired (an overflow state), checking the cost first.
fn decide_live<St: RateState, C: Clock + ?Sized>(
    state: &St,
    params: &St::Params,
    clock: &C,
    cost: u64,
) -> Result<Decision, CostError> {
    let limit = St::max_cost(params);
    if cost > limit {
        return Err(CostError::ExceedsLimit { cost, limit });
    }
    match state.try_acquire(params, clock, cost) {
        Some(decision) => Ok(decision),
        None => unreachable!("overflow states are never retired"),
    }
}

impl<K, St: RateState> Slot<K> for St {
    type Params = St::Params;

    #[inline(always)]
    fn max_cost(&self, params: &St::Params) -> u64 {
        St::max_cost(params)
    }

    #[inline(always)]
    fn try_acquire<C: Clock + ?Sized>(
        &self,
        params: &St::Params,
        clock: &C,
        cost: u64,
    ) -> Option<Decision> {
        RateState::try_acquire(self, params, clock, cost)
    }

    fn peek<C: Clock + ?Sized>(&self, params: &St::Params, clock: &C) -> Option<Decision> {
        RateState::peek(self, params, clock, 1)
    }

    fn is_at_rest(&self, params: &St::Params, now: u64) -> bool {
        RateState::is_at_rest(self, params, now)
    }

    fn carry(&self, params: &St::Params, now: u64) -> Option<Carry> {
        RateState::carry(self, params, now)
    }

    /// Every key's state is built from the policy's parameters alone.
    type Spec = ();

    #[inline(always)]
    fn resolve(_: &St::Params, _: &K) {}

    fn max_cost_for(params: &St::Params, (): &()) -> u64 {
        St::max_cost(params)
    }

    fn build(params: &St::Params, (): &(), carry: Option<&Carry>, now: u64) -> Self {
        St::new(params, carry, now)
    }

    /// One state shared by every overflowing key.
    type Overflow = CachePadded<St>;

    fn new_overflow(params: &St::Params) -> CachePadded<St> {
        CachePadded::new(St::fresh(params))
    }

    fn overflow_acquire<C: Clock + ?Sized>(
        overflow: &CachePadded<St>,
        params: &St::Params,
        (): &(),
        clock: &C,
        cost: u64,
    ) -> Result<Decision, CostError> {
        decide_live(&**overflow, params, clock, cost)
    }

    fn overflow_peek<C: Clock + ?Sized>(
        overflow: &CachePadded<St>,
        params: &St::Params,
        (): &(),
        clock: &C,
    ) -> Decision {
        match overflow.peek(params, clock, 1) {
            Some(decision) => decision,
            None => unreachable!("overflow states are never retired"),
        }
    }
}

impl<K> Slot<K> for AnyState {
    type Params = Arc<Resolver<K>>;

    #[inline]
    fn max_cost(&self, _: &Self::Params) -> u64 {
        AnyState::max_cost(self)
    }

    #[inline]
    fn try_acquire<C: Clock + ?Sized>(
        &self,
        _: &Self::Params,
        clock: &C,
        cost: u64,
    ) -> Option<Decision> {
        AnyState::try_acquire(self, clock, cost)
    }

    fn peek<C: Clock + ?Sized>(&self, _: &Self::Params, clock: &C) -> Option<Decision> {
        AnyState::peek(self, clock, 1)
    }

    fn is_at_rest(&self, _: &Self::Params, now: u64) -> bool {
        AnyState::is_at_rest(self, now)
    }

    fn carry(&self, _: &Self::Params, now: u64) -> Option<Carry> {
        AnyState::carry(self, now)
    }

    /// The policy the resolver chose for the key.
    type Spec = Policy;

    fn resolve(resolver: &Self::Params, key: &K) -> Policy {
        resolver(key)
    }

    fn max_cost_for(_: &Self::Params, policy: &Policy) -> u64 {
        policy.max_cost()
    }

    fn build(_: &Self::Params, policy: &Policy, carry: Option<&Carry>, now: u64) -> Self {
        AnyState::new(policy, carry, now)
    }

    /// One shared state per policy the resolver returns for overflowing keys.
    type Overflow = scc::HashMap<Policy, AnyState>;

    fn new_overflow(_: &Self::Params) -> Self::Overflow {
        scc::HashMap::new()
    }

    fn overflow_acquire<C: Clock + ?Sized>(
        overflow: &Self::Overflow,
        _: &Self::Params,
        policy: &Policy,
        clock: &C,
        cost: u64,
    ) -> Result<Decision, CostError> {
        let limit = policy.max_cost();
        if cost > limit {
            return Err(CostError::ExceedsLimit { cost, limit });
        }
        let decide = |state: &AnyState| match state.try_acquire(clock, cost) {
            Some(decision) => decision,
            None => unreachable!("overflow states are never retired"),
        };
        if let Some(decision) = overflow.read_sync(policy, |_, state| decide(state)) {
            return Ok(decision);
        }
        let entry = overflow
            .entry_sync(*policy)
            .or_insert_with(|| AnyState::new(policy, None, 0));
        Ok(decide(entry.get()))
    }

    fn overflow_peek<C: Clock + ?Sized>(
        overflow: &Self::Overflow,
        _: &Self::Params,
        policy: &Policy,
        clock: &C,
    ) -> Decision {
        let peek = |state: &AnyState| match state.peek(clock, 1) {
            Some(decision) => decision,
            None => unreachable!("overflow states are never retired"),
        };
        overflow
            .read_sync(policy, |_, state| peek(state))
            .unwrap_or_else(|| peek(&AnyState::new(policy, None, 0)))
    }
}

impl<K: Hash + Eq, St: Slot<K>, S: BuildHasher> Keyed<K, St, S> {
    fn new(params: St::Params, hasher: S) -> Self {
        Keyed {
            map: scc::HashMap::with_hasher(hasher),
            overflow: St::new_overflow(&params),
            params,
        }
    }

    /// Removes every state at rest at `now`; returns how many.
    fn evict_idle(&self, now: u64) -> usize {
        let mut removed = 0;
        // `retain_sync` holds each bucket's lock exclusively while it runs the predicate, and
        // a request touches a state only under its bucket's lock (shared in `read_sync`,
        // exclusive in `entry_sync` and `remove_sync`): no request is inside the state while
        // it is checked and unlinked, and none can reach it afterwards. So the state at rest
        // is removed as it is; retiring it first (a CAS per key) would add nothing but time.
        self.map.retain_sync(|_, state| {
            let idle = state.is_at_rest(&self.params, now);
            removed += usize::from(idle);
            !idle
        });
        removed
    }
}

impl<K: Hash + Eq + Clone, S: BuildHasher> Generation<K, S> {
    /// Up to `slice` entries of `keyed` (this generation's map) from the cursor on, removing
    /// the states at rest at `now`.
    fn sweep_step<St: Slot<K>>(&self, keyed: &Keyed<K, St, S>, slice: usize, now: u64) -> Swept {
        // Each step holds one bucket exclusively at a time (as `retain_sync` does), so, as
        // for `evict_idle`, no request is inside a state while it is checked and removed.
        sweep_step(&keyed.map, &self.sweep_cursor, slice, |state| {
            state.is_at_rest(&keyed.params, now)
        })
    }

    /// Whether this generation, already replaced, holds no state and never will again.
    ///
    /// Why "never again": a generation gains a state only in `acquire_slow`, from a request
    /// that holds the key's bucket exclusively and found the generation current *after*
    /// taking the bucket. This check runs after the swap that replaced the generation (the
    /// caller reached it through a newer generation's link) and takes every bucket of the map
    /// in turn (`begin_sync` on a map without entries visits them all, as `retain_sync`
    /// does). For each such request, either this pass took the bucket after the request let
    /// go of it, and then sees the state it inserted; or the pass took it first, and then the
    /// request took it after the pass, so after the swap, and found the generation replaced.
    /// The one outcome that would break this, the request's load of `current` missing the
    /// swap while this pass misses the request's hold of the bucket, is what the two SeqCst
    /// fences forbid (here between learning of the swap and the pass, in `acquire_slow`
    /// between taking the bucket and loading `current`). So a generation found drained
    /// stays empty: unlinking it loses no key's spent permits, and readers still inside it
    /// are protected by their epoch guards.
    fn is_drained(&self) -> bool {
        // SeqCst: see above; pairs with the fence in `acquire_slow`.
        fence(Ordering::SeqCst);
        with_keyed!(&self.registry, keyed => keyed.map.begin_sync().is_none())
    }

    /// Unlinks every generation older than this one that has drained, so that no request
    /// walks it again and its map is freed. The caller holds the limiter's `config` lock,
    /// which serialises every change of the links.
    fn unlink_drained(&self, guard: &Guard) {
        let mut newer = self;
        // Acquire: pairs with the Release that linked each older generation, so its map is
        // seen whole.
        while let Some(old) = newer.older.load(Ordering::Acquire, guard).as_ref() {
            if old.is_drained() {
                // AcqRel: publishes the new link to walkers that load it with Acquire. A
                // walker still on the old link reaches the same generations through `old`.
                newer.older.swap(
                    (old.older.get_shared(Ordering::Acquire, guard), Tag::None),
                    Ordering::AcqRel,
                );
            } else {
                newer = old;
            }
        }
    }
}

impl<K: Hash + Eq + 'static, S: BuildHasher + 'static> Registry<K, S> {
    fn new(rules: &Rules<K>, hasher: S) -> Self {
        struct New<S>(S);
        impl<K: Hash + Eq, S: BuildHasher> Build<Maps<K, S>> for New<S> {
            fn build<St: RateState>(self, params: St::Params) -> Keyed<K, St, S> {
                Keyed::new(params, self.0)
            }
        }
        match rules {
            Rules::PerKey(resolver) => Registry::PerKey(Keyed::new(resolver.clone(), hasher)),
            Rules::Uniform(policy) => Registry::Uniform(Erased::new(policy, New(hasher))),
        }
    }
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
    /// before the limiter takes any lock, once per attempt to create the state: a slow
    /// resolver (a database lookup of the customer's tier) delays only the new key's own
    /// request, and a resolver may ask its own limiter about *other* keys. Two first requests
    /// for the same key that race each other may each call it once; the state is built from
    /// the answer of the one that creates it. A [`peek`](RateLimiter::peek) at a key not
    /// tracked calls it once too. To move a key to another tier,
    /// change what the resolver returns for it, then call `reset(&key)`: its next request
    /// starts from a fresh state under the new policy. (Eviction does the same for keys at
    /// rest.) Each key then stores its policy's parameters beside its state, so per-key
    /// memory is larger than with one policy (see `docs/ALGORITHMS.md`).
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
        let registry = Registry::new(&rules, hasher.clone());
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
            counters: None,
            shadow: false,
        }
    }

    /// Caps the keys tracked at once at `max_keys`, so that clients sending endless new keys
    /// (random IPs, forged tokens) cannot grow memory without bound.
    ///
    /// The overflow rule: when a new key finds the limiter full, the limiter first sweeps a
    /// slice of the map for states at rest and takes a freed place if there is one. If there
    /// is none, the key's request is decided by a **state shared by all overflowing keys**
    /// (one per policy), and the decision says so ([`Decision::is_overflow`]); no state is
    /// created for the key. Keys already tracked keep their exact limits. So a flood of new
    /// keys can never exceed the cap, never resets a tracked key's spent permits (as evicting
    /// live states would), and never admits any key beyond its policy: the overflowing keys
    /// together get one key's budget. Refusing every new key instead would turn the flood
    /// into a denial of service for every new legitimate user; this rule degrades them to a
    /// shared budget until the flood's keys come to rest and are swept.
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
        self.counters = Some(Box::new(Counters::new()));
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
        self.shadow = true;
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
        let keys = self.len();
        match &self.counters {
            Some(counters) => counters.read(keys),
            None => Stats {
                keys,
                ..Stats::default()
            },
        }
    }

    /// Counts a decision and applies shadow mode.
    #[inline(always)]
    fn finish(&self, decision: Decision) -> Decision {
        if let Some(counters) = &self.counters {
            counters.record(&decision);
        }
        if self.shadow {
            decision.shadowed()
        } else {
            decision
        }
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
        if let Some(decision) = self.hit_of_cost_one(key) {
            return self.finish(decision);
        }
        match self.decide(key, 1) {
            Ok(decision) => self.finish(decision),
            // Every policy has at least one permit, so a cost of 1 is always acceptable.
            Err(_) => unreachable!("a cost of 1 is within every policy"),
        }
    }

    /// The most common request, straight to the state: cost 1 (within every policy, so no
    /// cost check) for a key already tracked in the current generation. `None` for a new
    /// key or a retired state, which [`RateLimiter::decide`] then handles in full. Skipping
    /// the general path's step machinery here saved about 5 ns per decision on a hot key
    /// (docs/BENCHMARKS.md).
    #[inline(always)]
    fn hit_of_cost_one<Q>(&self, key: &Q) -> Option<Decision>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let guard = Guard::new();
        let generation = self.generation(&guard);
        with_keyed!(&generation.registry, keyed => {
            keyed
                .map
                .read_sync(key, |_, state| {
                    Slot::<K>::try_acquire(state, &keyed.params, &self.clock, 1)
                })
                .flatten()
        })
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
        if n == 0 {
            return Err(CostError::Zero);
        }
        self.decide(key, n).map(|decision| self.finish(decision))
    }

    #[inline(always)]
    fn decide<Q>(&self, key: &Q, cost: u64) -> Result<Decision, CostError>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        // Held across the lookup, so the map's own guard inside is a cheap nested one.
        let guard = Guard::new();
        loop {
            let generation = self.generation(&guard);
            let step = with_keyed!(&generation.registry, keyed => {
                self.acquire_in(generation, keyed, key, cost, &guard)
            });
            match step {
                Step::Done(result) => return result,
                Step::Created(result) => {
                    // Pay for a few steps of the incremental sweep, now that no lock is held.
                    if self.sweep_slice > 0 {
                        self.sweep(generation, self.sweep_slice, true, &guard);
                    }
                    return result;
                }
                // The generation was replaced while we looked: decide in the new one.
                Step::Stale => {}
            }
        }
    }

    /// The hit path: a shared bucket lock for the duration of the state's CAS loop.
    #[inline(always)]
    fn acquire_in<Q, St: Slot<K>>(
        &self,
        generation: &Generation<K, S>,
        keyed: &Keyed<K, St, S>,
        key: &Q,
        cost: u64,
        guard: &Guard,
    ) -> Step
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        let hit = keyed.map.read_sync(key, |_, state| {
            let limit = state.max_cost(&keyed.params);
            if cost > limit {
                return Some(Err(CostError::ExceedsLimit { cost, limit }));
            }
            state.try_acquire(&keyed.params, &self.clock, cost).map(Ok)
        });
        match hit {
            Some(Some(result)) => Step::Done(result),
            _ => self.acquire_slow(generation, keyed, key, cost, guard),
        }
    }

    /// A key not in this generation's map (or whose state was retired): create its state
    /// under the bucket's exclusive lock, carrying permits from an older generation if the
    /// key is still there, then decide. Two racing first requests meet here and the entry
    /// API gives both the same state.
    ///
    /// The resolver (if any) runs first, before any bucket is taken, and once for this
    /// attempt: a slow one delays only this request, and one that asks the limiter about
    /// other keys cannot wait on a lock its own request holds. Racing first requests for the
    /// key may each call it; the first to insert decides the state's policy.
    #[cold]
    #[inline(never)]
    fn acquire_slow<Q, St: Slot<K>>(
        &self,
        generation: &Generation<K, S>,
        keyed: &Keyed<K, St, S>,
        key: &Q,
        cost: u64,
        guard: &Guard,
    ) -> Step
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        let mut owned = K::from(key.to_owned());
        let spec = St::resolve(&keyed.params, &owned);
        let mut swept = false;
        loop {
            let entry = keyed.map.entry_sync(owned);
            // We hold the bucket exclusively. A generation found no longer current gains no
            // state from here. One that was current when checked may still gain this key after
            // a swap: the key is moved out later under this same lock, and the generation is
            // not unlinked meanwhile, because the pass that confirms it drained waits for this
            // lock (`Generation::is_drained`).
            // SeqCst: pairs with the fence in `is_drained`; either our load of `current` sees
            // the swap, or that pass sees our hold of the bucket.
            fence(Ordering::SeqCst);
            if !self.is_current(generation, guard) {
                return Step::Stale;
            }
            let decide = |state: &St| {
                let limit = state.max_cost(&keyed.params);
                if cost > limit {
                    return Err(CostError::ExceedsLimit { cost, limit });
                }
                match state.try_acquire(&keyed.params, &self.clock, cost) {
                    Some(decision) => Ok(decision),
                    // No registry path retires a state it leaves in a map: eviction and moves
                    // remove states under the bucket's exclusive lock instead.
                    None => unreachable!("a state in the map is never retired"),
                }
            };
            let entry = match entry {
                Entry::Occupied(entry) => return Step::Done(decide(entry.get())),
                Entry::Vacant(entry) => entry,
            };
            // A cost that could never be admitted creates nothing and moves nothing (a key
            // still in an older generation stays there).
            let limit = St::max_cost_for(&keyed.params, &spec);
            if cost > limit {
                return Step::Done(Err(CostError::ExceedsLimit { cost, limit }));
            }
            let now = self.clock.now();
            // A key still in an older generation moves here: its place is already counted, so
            // it takes no new one.
            let carry = self.take_from_older(generation, key, now, guard);
            if carry.is_none() && !self.reserve() {
                if !swept {
                    // Full: let go of the bucket (the sweep may need it), sweep a larger slice
                    // for states at rest, then try once more with the same spec.
                    owned = entry.into_key();
                    self.sweep(generation, FULL_SWEEP_SLICE, false, guard);
                    swept = true;
                    continue;
                }
                let shared =
                    St::overflow_acquire(&keyed.overflow, &keyed.params, &spec, &self.clock, cost);
                return Step::Done(shared.map(Decision::overflowed));
            }
            let state = St::build(&keyed.params, &spec, carry.as_ref(), now);
            let entry = entry.insert_entry(state);
            return Step::Created(decide(entry.get()));
        }
    }

    /// Takes a place for a new key, if the limiter is below `max_keys`.
    fn reserve(&self) -> bool {
        // Relaxed: `tracked` is only a count; the exclusive bucket lock held by the caller
        // orders the insertion that follows. It is incremented before an insertion and
        // decremented after a removal, so it never falls below the keys present: the cap holds
        // however requests, sweeps and evictions interleave.
        if self.max_keys == usize::MAX {
            self.tracked.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        self.tracked
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max_keys).then_some(n + 1)
            })
            .is_ok()
    }

    /// One step of the incremental sweep: up to `slice` entries of each generation, starting
    /// where the last step stopped, removing states at rest. Never blocks on
    /// another sweeper (it skips a generation someone else is sweeping).
    /// With `grace`, only states at rest for at least their generation's grace period are
    /// removed; without, any state at rest.
    fn sweep(&self, generation: &Generation<K, S>, slice: usize, grace: bool, guard: &Guard) {
        let now = self.clock.now();
        let mut removed = 0;
        let mut older_empty = false;
        let mut current = Some(generation);
        while let Some(g) = current {
            // A state at rest at an earlier instant is at rest now (time only brings states
            // closer to rest), so removing it as of that instant is exact.
            let as_of = if grace {
                now.saturating_sub(g.sweep_grace)
            } else {
                now
            };
            let swept = with_keyed!(&g.registry, keyed => g.sweep_step(keyed, slice, as_of));
            removed += swept.removed;
            older_empty |= swept.empty && !std::ptr::eq(g, generation);
            // Acquire: as every walk of the chain.
            current = g.older.load(Ordering::Acquire, guard).as_ref();
        }
        // Relaxed: a statistic, decremented after the removals.
        self.tracked.fetch_sub(removed, Ordering::Relaxed);
        if older_empty {
            // A replaced generation looked empty: unlink it, unless a reload holds the lock
            // (a request never waits for one; a later sweep sees the empty map again).
            if let Some(_config) = self.try_lock_config() {
                self.generation(guard).unlink_drained(guard);
            }
        }
    }

    fn is_current(&self, generation: &Generation<K, S>, guard: &Guard) -> bool {
        std::ptr::eq(self.generation(guard), generation)
    }

    /// Removes `key` from the older generations, if one still holds it, retiring its state
    /// and returning the permits it had in use at `now`. The caller holds the key's bucket in
    /// the current generation exclusively, so no other request can create the key meanwhile.
    fn take_from_older<Q>(
        &self,
        generation: &Generation<K, S>,
        key: &Q,
        now: u64,
        guard: &Guard,
    ) -> Option<Carry>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        first_in_older(generation, guard, |old| {
            with_keyed!(&old.registry, keyed => {
                keyed
                    .map
                    .remove_sync(key)
                    // Removed, so owned here: nothing else can reach it, and its permits
                    // are counted without retiring it (which would be a CAS for nothing).
                    .map(|(_, state)| Slot::<K>::carry(&state, &keyed.params, now))
            })
        })
        // The key keeps its place in `tracked`: the caller inserts it here.
        .flatten()
    }

    /// Waits until a request of cost 1 for `key` is admitted: tries, and when refused sleeps
    /// its `retry_after` (plus the clock's [`granularity`](Clock::granularity)) on the
    /// limiter's clock ([`Clock::sleep`]) and tries again. For a
    /// client that must not exceed a provider's quota. Blocks the thread: in async code use
    /// `acquire` (feature `tokio`).
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{Clock, FakeClock, RateLimiter};
    ///
    /// let clock = FakeClock::new();
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("2/1s".parse()?, clock.clone());
    /// for _ in 0..4 {
    ///     assert!(limiter.acquire_blocking("upstream").is_allowed());
    /// }
    /// assert_eq!(clock.now(), 1_000_000_000); // the fake clock's sleeps moved time
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn acquire_blocking<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        match self.acquire_blocking_with(key, Wait::new()) {
            Ok(decision) | Err(decision) => decision,
        }
    }

    /// Like [`acquire_blocking`](RateLimiter::acquire_blocking), with a timeout and jitter.
    ///
    /// # Errors
    ///
    /// The last refusal, as soon as admission cannot come before the timeout.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{FakeClock, RateLimiter, Wait};
    ///
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("1/min".parse()?, FakeClock::new());
    /// let _ = limiter.try_acquire("a");
    /// let wait = Wait::new().timeout(Duration::from_secs(5));
    /// assert!(limiter.acquire_blocking_with("a", wait).is_err());
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn acquire_blocking_with<Q>(&self, key: &Q, wait: Wait) -> Result<Decision, Decision>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        crate::wait::block(&self.clock, &wait, || self.try_acquire(key))
    }

    /// Waits asynchronously until a request of cost 1 for `key` is admitted (feature
    /// `tokio`): the async twin of [`acquire_blocking`](RateLimiter::acquire_blocking),
    /// sleeping with tokio's timer. Give the limiter a clock that follows tokio's time
    /// ([`SystemClock`] in production, [`TokioClock`](crate::TokioClock) in tests with paused
    /// time).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), tollgate::PolicyError> {
    /// use tollgate::{RateLimiter, TokioClock};
    ///
    /// let limiter: RateLimiter<String, TokioClock> =
    ///     RateLimiter::with_clock("1/s".parse()?, TokioClock::new());
    /// assert!(limiter.acquire("a").await.is_allowed());
    /// assert!(limiter.acquire("a").await.is_allowed()); // a second later (paused time)
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn acquire<Q>(&self, key: &Q) -> Decision
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        match self.acquire_with(key, Wait::new()).await {
            Ok(decision) | Err(decision) => decision,
        }
    }

    /// The async twin of [`acquire_blocking_with`](RateLimiter::acquire_blocking_with)
    /// (feature `tokio`).
    ///
    /// # Errors
    ///
    /// The last refusal, as soon as admission cannot come before the timeout.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), tollgate::PolicyError> {
    /// use std::time::Duration;
    /// use tollgate::{RateLimiter, TokioClock, Wait};
    ///
    /// let limiter: RateLimiter<String, TokioClock> =
    ///     RateLimiter::with_clock("1/min".parse()?, TokioClock::new());
    /// let _ = limiter.try_acquire("a");
    /// let wait = Wait::new().timeout(Duration::from_secs(1));
    /// assert!(limiter.acquire_with("a", wait).await.is_err());
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn acquire_with<Q>(&self, key: &Q, wait: Wait) -> Result<Decision, Decision>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        crate::wait::wait_async(&self.clock, &wait, || self.try_acquire(key)).await
    }

    /// What a request of cost 1 for `key` would get now, changing nothing and creating no
    /// state. Any number of peeks leave every later decision as it would have been.
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
        let guard = Guard::new();
        let generation = self.generation(&guard);
        with_keyed!(&generation.registry, keyed => self.peek_in(generation, keyed, key, &guard))
    }

    fn peek_in<Q, St: Slot<K>>(
        &self,
        generation: &Generation<K, S>,
        keyed: &Keyed<K, St, S>,
        key: &Q,
        guard: &Guard,
    ) -> Decision
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        let now = self.clock.now();
        let at_now = Fixed(now);
        if let Some(Some(decision)) = keyed
            .map
            .read_sync(key, |_, state| state.peek(&keyed.params, &at_now))
        {
            return decision;
        }
        // Not tracked here (or removed under us): decide on the state the key's next request
        // would create, built aside and dropped.
        let carry = self.peek_older(generation, key, now, guard);
        let spec = St::resolve(&keyed.params, &K::from(key.to_owned()));
        if carry.is_none() && self.len() >= self.max_keys {
            return St::overflow_peek(&keyed.overflow, &keyed.params, &spec, &at_now).overflowed();
        }
        let state = St::build(&keyed.params, &spec, carry.as_ref(), now);
        match state.peek(&keyed.params, &at_now) {
            Some(decision) => decision,
            None => unreachable!("a state just built is live"),
        }
    }

    fn peek_older<Q>(
        &self,
        generation: &Generation<K, S>,
        key: &Q,
        now: u64,
        guard: &Guard,
    ) -> Option<Carry>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        first_in_older(generation, guard, |old| {
            with_keyed!(&old.registry, keyed => {
                keyed
                    .map
                    .read_sync(key, |_, state| Slot::<K>::carry(state, &keyed.params, now))
            })
        })
        .flatten()
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
        let guard = Guard::new();
        let now = self.clock.now();
        let generation = self.generation(&guard);
        let mut removed = with_keyed!(&generation.registry, keyed => keyed.evict_idle(now));
        // Acquire: as every walk of the chain.
        let mut older = generation.older.load(Ordering::Acquire, &guard);
        let replaced = !older.is_null();
        while let Some(old) = older.as_ref() {
            removed += with_keyed!(&old.registry, keyed => keyed.evict_idle(now));
            older = old.older.load(Ordering::Acquire, &guard);
        }
        // Relaxed: a statistic.
        self.tracked.fetch_sub(removed, Ordering::Relaxed);
        if replaced {
            let _config = self.lock_config();
            self.generation(&guard).unlink_drained(&guard);
        }
        removed
    }

    /// Forgets `key`'s state, in whatever generation it is: its next request starts fresh
    /// under the policy in force (or that the resolver now returns for it). Returns whether
    /// a state was removed. Use it to move a key to another tier, or to clear a record (a
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
        let guard = Guard::new();
        let mut removed = 0;
        loop {
            let current = self.generation(&guard);
            let mut chain = vec![current];
            while let Some(older) = chain[chain.len() - 1]
                .older
                .load(Ordering::Acquire, &guard)
                .as_ref()
            {
                chain.push(older);
            }
            // Oldest first: a key only ever moves from an older generation to the current one
            // (under the current bucket's lock, see `acquire_slow`), so walking towards the
            // current generation meets it wherever it is when it moves. Walking newest first
            // could look in the current map just before the key arrives there and in the old
            // one just after it left.
            for generation in chain.iter().rev() {
                // Removal takes the bucket exclusively: no request is inside the state.
                removed += with_keyed!(&generation.registry, keyed => {
                    usize::from(keyed.map.remove_sync(key).is_some())
                });
            }
            // A policy change meanwhile made a newer generation the key could have moved to:
            // walk again.
            if std::ptr::eq(self.generation(&guard), current) {
                break;
            }
        }
        // Relaxed: a statistic.
        self.tracked.fetch_sub(removed, Ordering::Relaxed);
        removed > 0
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
    /// A limiter built with a resolver enforces the one `policy` from then on.
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
        self.replace_rules(Rules::Uniform(policy));
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
        self.replace_rules(Rules::PerKey(Arc::new(resolver)));
    }

    fn replace_rules(&self, rules: Rules<K>) {
        let _config = self.lock_config();
        let guard = Guard::new();
        if let (Rules::Uniform(new), Rules::Uniform(in_force)) =
            (&rules, &self.generation(&guard).rules)
        {
            if new == in_force {
                // Re-applying the policy in force: nothing to move, and the overflow keeps
                // its budget.
                return;
            }
        }
        let older = self.current.get_shared(Ordering::Acquire, &guard);
        let registry = Registry::new(&rules, self.hasher.clone());
        let grace = sweep_grace(&rules);
        let generation = Generation {
            rules,
            registry,
            older: older.map_or_else(AtomicShared::null, AtomicShared::from),
            sweep_cursor: Mutex::new(None),
            sweep_grace: grace,
        };
        // Release: publishes the new generation's contents to requests that load it with
        // Acquire. The old one stays reachable through `older` until it drains.
        self.current
            .swap((Some(Shared::new(generation)), Tag::None), Ordering::AcqRel);
        // A generation replaced before it held a key (a reload soon after another) is
        // unlinked now, so reloads never grow the chain new keys walk.
        self.generation(&guard).unlink_drained(&guard);
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
impl<K, C, S: BuildHasher> RateLimiter<K, C, S> {
    /// How many generations are linked now, the current one included: what a new key's
    /// request may walk.
    fn generations(&self) -> usize {
        let guard = Guard::new();
        let mut linked = 0;
        // Acquire: as every walk of the chain.
        let mut generation = self.current.load(Ordering::Acquire, &guard);
        while let Some(g) = generation.as_ref() {
            linked += 1;
            generation = g.older.load(Ordering::Acquire, &guard);
        }
        linked
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::RateLimiter;
    use crate::{FakeClock, Policy};

    fn policy(s: &str) -> Policy {
        s.parse().unwrap()
    }

    #[test]
    fn reapplying_the_policy_in_force_builds_nothing() {
        let limiter: RateLimiter<u64, FakeClock> =
            RateLimiter::with_clock(policy("5/1h"), FakeClock::new());
        let _ = limiter.try_acquire(&1);
        for _ in 0..10 {
            limiter.set_policy(policy("5/1h"));
        }
        assert_eq!(limiter.generations(), 1);
        assert_eq!(limiter.try_acquire(&1).remaining(), 3);
    }

    #[test]
    fn alternating_reloads_keep_the_chain_short() {
        let (a, b) = (policy("token-bucket 5/1h"), policy("sliding-log 5/1h"));
        let limiter: RateLimiter<u64, FakeClock> = RateLimiter::with_clock(a, FakeClock::new());
        for key in 0..1_000 {
            let _ = limiter.try_acquire(&key);
        }
        for i in 0..100_000 {
            limiter.set_policy(if i % 2 == 0 { b } else { a });
            // The current generation and the one holding the 1,000 keys; every map replaced
            // in between held nothing.
            assert!(
                limiter.generations() <= 2,
                "{} linked",
                limiter.generations()
            );
        }
        assert_eq!(limiter.len(), 1_000);
        // The keys kept their spent permit across every reload.
        assert_eq!(limiter.try_acquire(&7).remaining(), 3);
        assert_eq!(limiter.try_acquire(&1_000).remaining(), 4);
    }

    #[test]
    fn the_sweep_unlinks_a_generation_drained_by_moves() {
        let limiter: RateLimiter<u64, FakeClock> =
            RateLimiter::with_clock(policy("5/1h"), FakeClock::new());
        for key in 0..100 {
            let _ = limiter.try_acquire(&key);
        }
        limiter.set_policy(policy("6/1h"));
        assert_eq!(limiter.generations(), 2);
        // Every key moves to the new generation; the last move's sweep finds the old one
        // empty.
        for key in 0..100 {
            assert_eq!(limiter.try_acquire(&key).remaining(), 4);
        }
        let _ = limiter.try_acquire(&100);
        assert_eq!(limiter.generations(), 1);
        assert_eq!(limiter.len(), 101);
    }

    #[test]
    fn the_sweep_unlinks_a_generation_drained_by_eviction() {
        let clock = FakeClock::new();
        let limiter: RateLimiter<u64, FakeClock> =
            RateLimiter::with_clock(policy("5/1s"), clock.clone());
        for key in 0..100 {
            let _ = limiter.try_acquire(&key);
        }
        limiter.set_policy(policy("6/1s"));
        clock.advance(Duration::from_secs(3));
        // New keys sweep 8 entries each: the old keys, at rest, go; then their map does.
        for key in 100..200 {
            let _ = limiter.try_acquire(&key);
        }
        assert_eq!(limiter.len(), 100);
        assert_eq!(limiter.generations(), 1);
    }
}
