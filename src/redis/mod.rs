//! Per-key state in Redis or a Redis Cluster, so that one limit holds across every server
//! (feature `redis`): [`RedisLimiter`].
//!
//! The same [`Policy`] and [`Decision`] as the in-process limiters, decided by one Lua script
//! per request that runs the same integer arithmetic (GCRA, the sliding window counter, the
//! sliding window log, and composite policies all or nothing) on state kept in Redis, with
//! time from Redis `TIME`: no clock skew between application servers.
//!
//! | type | role |
//! |---|---|
//! | [`RedisLimiter`] | `try_acquire`, `try_acquire_n`, `peek`, `reserve_n`/`settle`/`cancel` against Redis, `close`; cheap to clone |
//! | [`RedisLimiterBuilder`] | prefix, timeout, failure policy, deny cache, probe interval, leases for hot keys |
//! | [`FailurePolicy`] | what decides while Redis is slow or down: error, open, closed, local limiter |
//! | [`BackendStats`] | decisions by source, switches, timeouts, script reloads |
//! | [`BackendError`] | why a decision could not be made |
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use tollgate::redis::{FailurePolicy, RedisLimiter};
//! use tollgate::RateLimiter;
//!
//! let limiter = RedisLimiter::builder("100/min & 1000/day".parse()?)
//!     .prefix("api")
//!     .timeout(Duration::from_millis(20))
//!     .failure_policy(FailurePolicy::Local(RateLimiter::new("25/min".parse()?)))
//!     .connect("redis://127.0.0.1:6379")
//!     .await?;
//! let decision = limiter.try_acquire("alice").await?;
//! if !decision.is_allowed() {
//!     println!("429, Retry-After: {}", decision.retry_after_secs());
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Time and exactness
//!
//! Lua numbers in Redis are doubles, exact for integers below 2^53; nanoseconds since the Unix
//! epoch are beyond that, so the scripts count in **microseconds** (what `TIME` gives). Each
//! band's window is rounded up to whole microseconds, and the scripts then run exactly the
//! in-process arithmetic with one tick = 1 µs: a policy decides in Redis as the same policy
//! with its window in µs decides in process with a clock in µs. Windows must be at most 2^50
//! µs (about 35.7 years) and ask for at most one permit per microsecond
//! ([`BackendError::UnsupportedPolicy`] otherwise). See `docs/REDIS.md`.
//!
//! # Keys
//!
//! A limiter key `alice` under a policy `"10/s & sliding-counter 1000/day"` and the default
//! prefix keeps its state in `tollgate:{alice}:tb:10/1s` and `tollgate:{alice}:sc:1000/1d`: one
//! Redis key per band, sharing the `{alice}` hash tag, so a Redis Cluster keeps them in one
//! slot and decides them in one script call. Every key expires when its state is at rest
//! again (its `reset_after`), so idle keys vanish by themselves.

mod builder;
mod cache;
mod conn;
mod error;
mod failure;
mod lease;
mod reserve;
mod script;

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::CostError;
use crate::hasher::KeyHasher;
use crate::policy::Policy;
use crate::reservation::Marks;

pub use self::builder::RedisLimiterBuilder;
use self::cache::DenyCache;
use self::conn::Script;
pub use self::error::BackendError;
use self::failure::{bump, Breaker, Counters};
pub use self::failure::{BackendStats, FailurePolicy};
use self::lease::Leases;
use self::script::{Ask, Bands};

/// A rate limiter whose per-key state lives in Redis or a Redis Cluster: every server that
/// shares the Redis and the key prefix shares one limit per key.
///
/// Cheap to clone (the clones share the connection, the deny cache and the counters) and
/// `Send + Sync`. Calls are async, on tokio; every call is bounded by the limiter's timeout.
///
/// | call | Redis round trips |
/// |---|---|
/// | [`try_acquire`](RedisLimiter::try_acquire), [`try_acquire_n`](RedisLimiter::try_acquire_n), [`peek`](RedisLimiter::peek) | one `EVALSHA` (none when the deny cache answers; one more `EVAL` after a `NOSCRIPT`) |
/// | [`reserve_n`](RedisLimiter::reserve_n) | as `try_acquire_n` |
/// | [`settle`](RedisLimiter::settle), [`cancel`](RedisLimiter::cancel) | one `EVALSHA` (none when the reservation was refused, made by the failure policy, or is settled at what it holds) |
/// | [`reset`](RedisLimiter::reset) | one `DEL` |
///
/// With [leases](RedisLimiterBuilder::lease), `try_acquire` (and `try_acquire_n` and `peek`
/// when the lease holds enough) answer from a lease without a round trip; taking a lease and
/// giving one back are one `EVALSHA` each.
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> Result<(), tollgate::redis::BackendError> {
/// use tollgate::redis::RedisLimiter;
///
/// let limiter = RedisLimiter::connect("redis://127.0.0.1:6379", "5/s".parse().unwrap()).await?;
/// let decision = limiter.try_acquire("alice").await?;
/// assert!(decision.is_allowed());
/// assert_eq!(decision.limit(), 5);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisLimiter {
    inner: Arc<Inner>,
}

struct Inner {
    script: Script,
    policy: Policy,
    bands: Bands,
    prefix: String,
    timeout: Duration,
    failure: FailurePolicy,
    breaker: Breaker,
    cache: Option<DenyCache>,
    /// The injected clock whose readings replace Redis `TIME` (tests only: see
    /// `RedisLimiterBuilder::test_clock`); always `None` without the `test-util` feature.
    test_clock: Option<Arc<dyn Clock>>,
    /// The deny cache's clock: the test clock, or a monotonic one.
    clock: Arc<dyn Clock>,
    counters: Counters,
    /// This limiter's serial number, in the origin of its reservations.
    id: u64,
    /// This limiter instance's name in the tokens it writes next to a key's state (its lease
    /// token's field, the prefix of its reservations' fields): random, so that servers never
    /// share one.
    instance: String,
    /// The serial number of this limiter's latest reservation, which its token names.
    reservations: AtomicU64,
    /// Hashes a key for the origin of its reservations.
    hasher: KeyHasher,
    /// `reset`s this limiter has made: a reservation made before one gets no refund (its
    /// state is gone; a refund would land on the fresh one). Resets by other limiters are not
    /// seen here (see docs/REDIS.md).
    resets: AtomicU64,
    /// The leases of hot keys (`None` without [`RedisLimiterBuilder::lease`]).
    leases: Option<Leases>,
}

impl Drop for Inner {
    /// Gives back the leases still held, from a task on the running tokio runtime (there is
    /// no awaiting here); without a runtime they are not given back, and stay spent in
    /// Redis as if admitted.
    fn drop(&mut self) {
        let Some(leases) = &self.leases else {
            return;
        };
        let held = leases.drain();
        if held.is_empty() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let returner = Arc::clone(&leases.returner);
            let clock = self.test_clock.clone();
            runtime.spawn(returner.give_back_all(held, clock));
        }
    }
}

/// The marks of a reservation that Redis did not make (the failure policy admitted it):
/// settling it changes nothing. No script mark comes near: they are below 2^53.
const NOT_IN_REDIS: Marks = [u64::MAX; Policy::MAX_BANDS];

impl RedisLimiter {
    /// Connects to one Redis server at `url` with every other setting at its default (see
    /// [`RedisLimiterBuilder`]).
    ///
    /// # Errors
    ///
    /// As for [`RedisLimiterBuilder::connect`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use tollgate::redis::RedisLimiter;
    ///
    /// let limiter = RedisLimiter::connect("redis://127.0.0.1:6379", "100/min".parse()?).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect(url: &str, policy: Policy) -> Result<RedisLimiter, BackendError> {
        Self::builder(policy).connect(url).await
    }

    /// Connects to a Redis Cluster through any of its `nodes`, with every other setting at
    /// its default (see [`RedisLimiterBuilder::connect_cluster`]).
    ///
    /// # Errors
    ///
    /// As for [`RedisLimiterBuilder::connect`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use tollgate::redis::RedisLimiter;
    ///
    /// let nodes = ["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"];
    /// let limiter = RedisLimiter::connect_cluster(&nodes, "10/s & 500/h".parse()?).await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect_cluster(
        nodes: &[&str],
        policy: Policy,
    ) -> Result<RedisLimiter, BackendError> {
        Self::builder(policy).connect_cluster(nodes).await
    }

    /// A builder for a limiter enforcing `policy`, with every setting at its default.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use tollgate::redis::RedisLimiter;
    ///
    /// let limiter = RedisLimiter::builder("5/s".parse()?)
    ///     .prefix("uploads")
    ///     .connect("redis://127.0.0.1:6379")
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn builder(policy: Policy) -> RedisLimiterBuilder {
        RedisLimiterBuilder::new(policy)
    }

    /// Decides a request of cost 1 for `key`: one script call in Redis (or a local refusal
    /// from the deny cache, or the failure policy's decision while Redis is slow or down).
    ///
    /// # Errors
    ///
    /// With [`FailurePolicy::Error`]: [`BackendError::Timeout`] when Redis does not answer
    /// within the timeout, [`BackendError::Redis`] when it cannot be reached, and
    /// [`BackendError::Unavailable`] while a recent failure makes calls skip Redis. With
    /// any policy: [`BackendError::Redis`] when Redis answers with an error about this call
    /// (a key of the wrong type), [`BackendError::Reply`] for an unexpected reply, and
    /// [`BackendError::ClockOutOfRange`] for a test clock beyond range.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tollgate::redis::BackendError> {
    /// let limiter = tollgate::redis::RedisLimiter::connect(
    ///     "redis://127.0.0.1:6379",
    ///     "2/s".parse().unwrap(),
    /// )
    /// .await?;
    /// assert_eq!(limiter.try_acquire("bob").await?.remaining(), 1);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn try_acquire(&self, key: &str) -> Result<Decision, BackendError> {
        if let Some(leases) = &self.inner.leases {
            return self.acquire_leased(leases, key, 1).await;
        }
        Ok(self.decide(key, Ask::Acquire(1)).await?.0)
    }

    /// Decides a request of cost `n` for `key`: allowed only if `n` permits are available in
    /// every band, and then all `n` are spent in every band.
    ///
    /// # Errors
    ///
    /// [`BackendError::Cost`] for `n == 0` or `n` above the smallest band's permits (nothing
    /// is sent to Redis); otherwise as for [`try_acquire`](RedisLimiter::try_acquire).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tollgate::redis::BackendError> {
    /// let limiter = tollgate::redis::RedisLimiter::connect(
    ///     "redis://127.0.0.1:6379",
    ///     "5/s".parse().unwrap(),
    /// )
    /// .await?;
    /// assert_eq!(limiter.try_acquire_n("export", 3).await?.remaining(), 2);
    /// assert!(limiter.try_acquire_n("export", 0).await.is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn try_acquire_n(&self, key: &str, n: u64) -> Result<Decision, BackendError> {
        self.check_cost(n)?;
        if let Some(leases) = &self.inner.leases {
            return self.acquire_leased(leases, key, n).await;
        }
        Ok(self.decide(key, Ask::Acquire(n)).await?.0)
    }

    /// `n` as a request's cost: at least 1, at most the smallest band's permits.
    fn check_cost(&self, n: u64) -> Result<(), CostError> {
        if n == 0 {
            return Err(CostError::Zero);
        }
        let limit = self.inner.policy.max_cost();
        if n > limit {
            return Err(CostError::ExceedsLimit { cost: n, limit });
        }
        Ok(())
    }

    /// What a request of cost 1 for `key` would get now, changing nothing in Redis (the script
    /// decides and writes nothing).
    ///
    /// # Errors
    ///
    /// As for [`try_acquire`](RedisLimiter::try_acquire).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tollgate::redis::BackendError> {
    /// let limiter = tollgate::redis::RedisLimiter::connect(
    ///     "redis://127.0.0.1:6379",
    ///     "2/s".parse().unwrap(),
    /// )
    /// .await?;
    /// let peeked = limiter.peek("carol").await?;
    /// assert_eq!(peeked, limiter.try_acquire("carol").await?);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn peek(&self, key: &str) -> Result<Decision, BackendError> {
        if let Some(leases) = &self.inner.leases {
            if let Some(decision) = leases.peek(key, self.inner.clock.now()) {
                return Ok(decision);
            }
        }
        Ok(self.decide(key, Ask::Peek).await?.0)
    }

    /// The permits `key` has now: the largest cost `n` for which
    /// [`try_acquire_n(key, n)`](RedisLimiter::try_acquire_n) would be allowed at this
    /// instant, 0 when even one request would be refused. One [`peek`](RedisLimiter::peek):
    /// it changes nothing.
    ///
    /// **Not `peek(key).remaining()`**: that is what would remain *after* one more request.
    /// While anything is left, `available` is one more; when nothing is, both are 0 (see
    /// [`RateLimiter::available`](crate::RateLimiter::available)).
    ///
    /// # Errors
    ///
    /// As for [`peek`](RedisLimiter::peek).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tollgate::redis::BackendError> {
    /// let limiter = tollgate::redis::RedisLimiter::connect(
    ///     "redis://127.0.0.1:6379",
    ///     "10/min".parse().unwrap(),
    /// )
    /// .await?;
    /// limiter.try_acquire_n("erin", 4).await?;
    /// assert_eq!(limiter.available("erin").await?, 6);
    /// assert_eq!(limiter.peek("erin").await?.remaining(), 5);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn available(&self, key: &str) -> Result<u64, BackendError> {
        // A peek decides a request of cost 1 without taking it.
        Ok(self.peek(key).await?.available_before(1))
    }

    /// Deletes `key`'s state in Redis (all bands) and its refusal in this limiter's deny
    /// cache: the key starts fresh. Returns `true` when there was state to delete. Other
    /// limiters' deny caches may still refuse the key until their cached retry_after.
    ///
    /// The key's reservation tokens are deleted with it: a reservation made before, by any
    /// limiter, gets no refund.
    ///
    /// With [leases](RedisLimiterBuilder::lease), this limiter's lease of the key is dropped
    /// (its permits went with the state) and its lease token deleted with the state; other
    /// limiters keep admitting from their leases of the key until those are spent or
    /// expire.
    ///
    /// # Errors
    ///
    /// [`BackendError::Timeout`] or [`BackendError::Redis`] when Redis does not answer or
    /// cannot be reached (the failure policy does not apply).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tollgate::redis::BackendError> {
    /// let limiter = tollgate::redis::RedisLimiter::connect(
    ///     "redis://127.0.0.1:6379",
    ///     "1/h".parse().unwrap(),
    /// )
    /// .await?;
    /// limiter.try_acquire("dave").await?;
    /// assert!(limiter.reset("dave").await?);
    /// assert!(limiter.try_acquire("dave").await?.is_allowed());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn reset(&self, key: &str) -> Result<bool, BackendError> {
        let inner = &*self.inner;
        // Forgotten before the DEL and again after it returns: a decision Redis refused
        // before the DEL may still be on its way, and must not cache its refusal after the
        // reset (see `DenyCache::forget`).
        let forget = || {
            if let Some(cache) = &inner.cache {
                cache.forget(key);
            }
            if let Some(leases) = &inner.leases {
                leases.forget(key);
            }
        };
        forget();
        let mut del = ::redis::cmd("DEL");
        match &inner.leases {
            Some(leases) => del.arg(leases.returner.keys(key)),
            None => del.arg(inner.bands.keys(&inner.prefix, key)),
        };
        // The reservation tokens go with the state: a reservation made before gets no refund.
        del.arg(Bands::reserve_key(&inner.prefix, key));
        let reply = tokio::time::timeout(inner.timeout, inner.script.conn().query(&del)).await;
        forget();
        // Release, once the DEL was sent (it may have run even if no answer came): a
        // reservation made before is stale from now on and gets no refund, which would land
        // on the fresh state.
        inner
            .resets
            .fetch_add(1, std::sync::atomic::Ordering::Release);
        let reply = reply.map_err(|_| BackendError::Timeout(inner.timeout))??;
        match reply {
            ::redis::Value::Int(deleted) => Ok(deleted > 0),
            other => Err(BackendError::Reply(format!("DEL: {other:?}"))),
        }
    }

    /// The Redis keys holding `key`'s state, one per band of the policy, in the policy's
    /// band order (see the module docs, "Keys").
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use tollgate::redis::RedisLimiter;
    ///
    /// let limiter = RedisLimiter::connect("redis://127.0.0.1:6379", "10/s & 1000/day".parse()?).await?;
    /// assert_eq!(
    ///     limiter.redis_keys("alice"),
    ///     ["tollgate:{alice}:tb:10/1s", "tollgate:{alice}:tb:1000/1d"]
    /// );
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn redis_keys(&self, key: &str) -> Vec<String> {
        self.inner.bands.keys(&self.inner.prefix, key)
    }

    /// The policy this limiter enforces.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let policy = "5/s".parse()?;
    /// let limiter = tollgate::redis::RedisLimiter::connect("redis://127.0.0.1:6379", policy).await?;
    /// assert_eq!(limiter.policy(), policy);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn policy(&self) -> Policy {
        self.inner.policy
    }

    /// The counters since the limiter connected: decisions by source, switches to and from
    /// the failure policy, timeouts, script reloads.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = tollgate::redis::RedisLimiter::connect("redis://127.0.0.1:6379", "5/s".parse()?).await?;
    /// limiter.try_acquire("alice").await?;
    /// assert_eq!(limiter.stats().redis_decisions, 1);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn stats(&self) -> BackendStats {
        let mut stats = self.inner.counters.snapshot();
        if let Some(leases) = &self.inner.leases {
            let counts = leases.counts();
            stats.leased_permits = counts.leased;
            stats.local_permits = counts.local;
            stats.returned_permits = counts.returned;
        }
        stats
    }

    /// `true` while the failure policy decides (a recent call to Redis failed and no probe
    /// has succeeded since).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = tollgate::redis::RedisLimiter::connect("redis://127.0.0.1:6379", "5/s".parse()?).await?;
    /// assert!(!limiter.is_failing());
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn is_failing(&self) -> bool {
        self.inner.breaker.is_failing()
    }

    /// Decides what `ask` asks for `key`: the decision, for a reservation or a lease that
    /// Redis admitted each band's mark ([`NOT_IN_REDIS`] when the failure policy decided),
    /// and for a lease the permits it took (0 when refused or not decided by Redis).
    async fn decide(&self, key: &str, ask: Ask) -> Result<(Decision, Marks, u64), BackendError> {
        let inner = &*self.inner;
        // A peek is a request of cost 1 that writes nothing: the deny cache treats it so.
        let cover = ask.cost();
        // Read before anything is sent: the deny cache measures Redis's retry_after from here.
        let (now_micros, now) = match &inner.test_clock {
            Some(clock) => {
                let micros = script::micros(clock.now())?;
                (Some(micros), micros * 1_000)
            }
            None => (None, inner.clock.now()),
        };
        let mut ticket = 0;
        if let Some(cache) = &inner.cache {
            if let Some(refusal) = cache.check(key, cover, now) {
                bump(&inner.counters.cached_refusals);
                return Ok((refusal, NOT_IN_REDIS, 0));
            }
            ticket = cache.ticket(key);
        }
        if !inner.breaker.should_try() {
            return self.fallback(key, ask, BackendError::Unavailable);
        }
        let mut args = inner.bands.args(now_micros, ask);
        let keys = inner
            .bands
            .call_keys(&inner.prefix, key, ask, &inner.instance, &mut args);
        let call = inner.script.call(
            &keys,
            &args,
            &inner.counters.script_reloads,
            true,
            inner.timeout,
        );
        let marks = match ask {
            Ask::Reserve { .. } | Ask::Lease { .. } => inner.bands.count(),
            _ => 0,
        };
        let counted = matches!(ask, Ask::Lease { .. });
        match call.await {
            Ok(Ok(reply)) => {
                let (decision, marks, count) = script::decision(&reply, marks, counted)?;
                self.recovered();
                bump(&inner.counters.redis_decisions);
                if let Some(cache) = &inner.cache {
                    if decision.is_allowed() {
                        if let Ask::Acquire(_) | Ask::Reserve { .. } | Ask::Lease { .. } = ask {
                            // An admission may lengthen a cached refusal of another cost.
                            cache.remove(key);
                        }
                    } else {
                        cache.insert(key, cover, now, ticket, &decision);
                    }
                }
                Ok((decision, marks, count))
            }
            Ok(Err(err)) if conn::is_unavailable(&err) => {
                bump(&inner.counters.unavailable);
                self.failed(key, ask, BackendError::Redis(err))
            }
            Ok(Err(err)) => {
                // Redis answered: it is up, and the error is about this call.
                self.recovered();
                Err(BackendError::Redis(err))
            }
            Err(_) => {
                bump(&inner.counters.timeouts);
                self.failed(key, ask, BackendError::Timeout(inner.timeout))
            }
        }
    }

    /// Redis answered: switch back from the failure policy if it was deciding.
    fn recovered(&self) {
        let inner = &*self.inner;
        if inner.breaker.succeeded() {
            bump(&inner.counters.switches_to_redis);
            log::info!(
                "tollgate: redis answers again; deciding by redis (prefix `{}`)",
                inner.prefix
            );
        }
    }

    /// A call to Redis failed with `err`: switch to the failure policy and let it decide.
    fn failed(
        &self,
        key: &str,
        ask: Ask,
        err: BackendError,
    ) -> Result<(Decision, Marks, u64), BackendError> {
        self.switch_to_failure(&err);
        self.fallback(key, ask, err)
    }

    /// A call to Redis failed with `err`: the failure policy decides from now on, until a
    /// probe succeeds.
    fn switch_to_failure(&self, err: &BackendError) {
        let inner = &*self.inner;
        if inner.breaker.failed() {
            bump(&inner.counters.switches_to_failure);
            log::warn!(
                "tollgate: {err}; deciding by the failure policy {:?} (prefix `{}`), probing redis every {:?}",
                inner.failure,
                inner.prefix,
                inner.breaker.probe_interval()
            );
        }
    }

    /// The failure policy's decision of what `ask` asks for `key`, with the marks of a
    /// reservation it makes: [`NOT_IN_REDIS`].
    fn fallback(
        &self,
        key: &str,
        ask: Ask,
        err: BackendError,
    ) -> Result<(Decision, Marks, u64), BackendError> {
        let inner = &*self.inner;
        bump(&inner.counters.failure_decisions);
        // Open and Closed read no band's state: they report the shortest window's permits.
        let limit = inner.policy.first_band().permits();
        let wait = u64::try_from(inner.breaker.probe_interval().as_nanos()).unwrap_or(u64::MAX);
        let decision = match &inner.failure {
            FailurePolicy::Error => return Err(err),
            FailurePolicy::Open => Decision::allow(0, limit, 0),
            FailurePolicy::Closed => Decision::deny(0, limit, wait, 0),
            FailurePolicy::Local(local) => match ask {
                Ask::Peek => local.peek(key),
                Ask::Acquire(cost) | Ask::Reserve { cost, .. } => local
                    .try_acquire_n(key, cost)
                    .unwrap_or(Decision::deny(0, limit, wait, 0)),
                // A lease's request alone: no lease while the failure policy decides.
                Ask::Lease { .. } => local
                    .try_acquire_n(key, 1)
                    .unwrap_or(Decision::deny(0, limit, wait, 0)),
                // Settles never reach the failure policy.
                Ask::Refund { .. } | Ask::Charge { .. } | Ask::Return { .. } => return Err(err),
            },
        };
        Ok((decision, NOT_IN_REDIS, 0))
    }
}

impl fmt::Debug for RedisLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = &*self.inner;
        f.debug_struct("RedisLimiter")
            .field("policy", &inner.policy)
            .field("prefix", &inner.prefix)
            .field("timeout", &inner.timeout)
            .field("failure_policy", &inner.failure)
            .field("deny_cache", &inner.cache.is_some())
            .field("leases", &inner.leases.is_some())
            .field("failing", &inner.breaker.is_failing())
            .field("stats", &inner.counters.snapshot())
            .finish_non_exhaustive()
    }
}
