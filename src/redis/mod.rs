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
//! | [`RedisLimiter`] | `try_acquire`, `try_acquire_n`, `peek`, `reserve_n`/`settle`/`cancel` against Redis, `set_policy` on every server, `close`; cheap to clone |
//! | [`RedisLimiterBuilder`] | prefix, hash tag, timeout, failure policy, deny cache, probe interval, leases for hot keys, shadow mode, per-key policies (a resolver), live policy changes, a shared connection |
//! | [`RedisAllOf`] | several keys of several limiters in one decision, all or nothing, in one script call |
//! | [`FailurePolicy`] | what decides while Redis is slow or down: error, open, closed, local limiter |
//! | [`BackendStats`] | decisions allowed and refused, by source, switches, timeouts, script reloads |
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
//!
//! # Modules
//!
//! Each importing only those above it:
//!
//! | module | job |
//! |---|---|
//! | `error` | [`BackendError`]: why a decision could not be made |
//! | `failure` | what decides while Redis is down ([`FailurePolicy`]), the switch to it and back, the counters ([`BackendStats`]) |
//! | `source` | the Lua code as Redis runs it: one script, or one function library |
//! | `script` | the Lua script, its arguments for a policy, the key names, its replies |
//! | `conn` | the connection and the script call on it: `NOSCRIPT`, redirects, which errors are retried |
//! | `cache` | the deny cache: refusals answered without a round trip |
//! | `tiers` | per-key policies: a policy as the scripts take it, the resolver and its cache of answers |
//! | `live` | a policy set live for every server: where it is stored, this instance's copy of it |
//! | `give_back` | giving a lease back to Redis, once, and a dropped limiter's leases |
//! | `lease` | the lease map: each hot key's lease, its size and hold time, claims and waits |
//! | `shared` | what the clones share, and the path of a decision: deny cache, Redis (moving a key to its policy first), failure policy; a key's reset |
//! | `reserve` | reserving and settling on Redis |
//! | `set_policy` | storing a policy set live for the other servers, and reading theirs |
//! | `all_of` | [`RedisAllOf`]: several keys in one script call, and the failure policies' decision of them |
//! | `leased` | requests decided from leases; taking, replacing and giving back leases, the sweeper, closing |
//! | `builder` | [`RedisLimiterBuilder`]: the settings, their checks, the connection and shared state they build |
//! | this one | [`RedisLimiter`]: every public method, over the modules above; the builder's `connect` and `connect_cluster` |

mod all_of;
mod builder;
mod cache;
mod conn;
mod error;
mod failure;
mod give_back;
mod lease;
mod leased;
mod live;
mod pause;
mod reserve;
mod script;
mod set_policy;
mod shared;
mod source;
mod tiers;
mod wait;

use std::fmt;
use std::sync::Arc;

use crate::decision::Decision;
use crate::policy::Policy;
use crate::reservation::Reservation;

pub use self::all_of::{RedisAllOf, RedisAllOfReservation};
pub use self::builder::RedisLimiterBuilder;
pub use self::error::BackendError;
pub use self::failure::{BackendStats, FailurePolicy};
use self::script::Ask;
use self::shared::Shared;

/// A rate limiter whose per-key state lives in Redis or a Redis Cluster: every server that
/// shares the Redis and the key prefix shares one limit per key.
///
/// Cheap to clone (the clones share the connection, the deny cache and the counters) and
/// `Send + Sync`. Calls are async, on tokio; every round trip to Redis is bounded by the
/// limiter's timeout. With a [resolver](RedisLimiterBuilder::resolver) or
/// [live policies](RedisLimiterBuilder::live_policy) a request may make more than one: a
/// read of the policy set live (at most once a second), and the move of a key to its
/// policy (once per change), each bounded so.
///
/// | call | Redis round trips |
/// |---|---|
/// | [`try_acquire`](RedisLimiter::try_acquire), [`try_acquire_n`](RedisLimiter::try_acquire_n), [`peek`](RedisLimiter::peek) | one `FCALL` (none when the deny cache answers; a `FUNCTION LOAD` and a second `FCALL` when Redis lost the function; `EVALSHA` where Redis has no functions) |
/// | [`reserve_n`](RedisLimiter::reserve_n) | as `try_acquire_n` |
/// | [`settle`](RedisLimiter::settle), [`cancel`](RedisLimiter::cancel) | one `FCALL` (none when the reservation was refused, made by the failure policy, or is settled at what it holds) |
/// | [`reset`](RedisLimiter::reset) | one `DEL` (with a resolver or live policies, a `GET` of the key's record first) |
///
/// With [leases](RedisLimiterBuilder::lease), `try_acquire` (and `try_acquire_n` and `peek`
/// when the lease holds enough) answer from a lease without a round trip; taking a lease and
/// giving one back are one `FCALL` each.
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
    /// What the clones share: the script on its connection, the settings, the switch to the
    /// failure policy, the deny cache, the counters and the leases.
    shared: Arc<Shared>,
}

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
        self.acquire_now(key, 1).await
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
        self.shared.check_cost(key, n).await?;
        self.acquire_now(key, n).await
    }

    /// A request of cost `n` (checked) for `key`, from a lease or by Redis, counted and
    /// shadowed as every request is.
    async fn acquire_now(&self, key: &str, n: u64) -> Result<Decision, BackendError> {
        let decision = match &self.shared.leases {
            Some(leases) => self.shared.acquire_leased(leases, key, n).await?,
            None => self.shared.decide(key, Ask::Acquire(n)).await?.0,
        };
        Ok(self.shared.finish(decision))
    }

    /// What a request of cost 1 for `key` would get now, changing nothing in Redis (the script
    /// decides and writes nothing). With a [resolver](RedisLimiterBuilder::resolver) or
    /// [live policies](RedisLimiterBuilder::live_policy), a key whose record names an older
    /// policy is moved to this server's first, as the request would be, so that the answer
    /// is the request's: the one write a peek may make.
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
        if let Some(leases) = &self.shared.leases {
            if let Some(decision) = leases.peek(key, self.shared.clock.now()) {
                return Ok(decision);
            }
        }
        Ok(self.shared.decide(key, Ask::Peek).await?.0)
    }

    /// The permits `key` has now: the largest cost `n` for which
    /// [`try_acquire_n(key, n)`](RedisLimiter::try_acquire_n) would be allowed at this
    /// instant, 0 when even one request would be refused. One [`peek`](RedisLimiter::peek):
    /// it changes nothing (but for moving a key to this server's policy, as a peek may).
    ///
    /// **Not `peek(key).remaining()`**: that is what would remain *after* one more request.
    /// While anything is left, `available` is one more; when nothing is, both are 0 (see
    /// [`RateLimiter::available`](crate::RateLimiter::available)).
    ///
    /// With [leases](RedisLimiterBuilder::lease), a key this instance holds a lease for is
    /// peeked locally, as `peek` is: what Redis counted when the lease was taken, plus what the
    /// lease has left. Other servers may have spent since (it may say more than Redis would
    /// admit now), and a cost above the lease goes to Redis (it may say less): an estimate,
    /// exact only without leases.
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
    /// cache: the key starts fresh. Returns `true` when Redis held anything of the key to
    /// delete: its state, a record of its policy and what its moves between policies kept,
    /// or the tokens of leases or reservations taken on it (which may outlive a state that
    /// expired at rest). Other
    /// limiters' deny caches may still refuse the key until their cached retry_after.
    ///
    /// The key's reservation tokens are deleted with it: a reservation made before, by any
    /// limiter, gets no refund. The hashes of tokens are one per prefix and key, whatever
    /// the policy: a reset also voids the refunds and lease give-backs of a limiter of
    /// another policy on the same prefix, whose state it leaves alone (those permits stay
    /// spent until time returns them). Give limiters of different policies prefixes of
    /// their own.
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
        self.shared.reset(key).await
    }

    /// The Redis keys holding `key`'s state, one per band of the policy, in the policy's
    /// band order (see the module docs, "Keys"); with a
    /// [resolver](RedisLimiterBuilder::resolver), those of the key's policy here, and its
    /// record last (with [`live_policy`](RedisLimiterBuilder::live_policy) too, under the
    /// policy in force here). Empty when the resolver answers a policy the backend cannot
    /// decide.
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
        let shared = &self.shared;
        match shared.tier_of(key) {
            Ok(choice) => {
                let mut keys = choice.tier.bands.keys(&shared.prefix, key);
                if shared.recorded() {
                    keys.push(script::Bands::record_key(&shared.prefix, key));
                }
                keys
            }
            Err(_) => Vec::new(),
        }
    }

    /// Whether requests are decided from leases (see [`RedisLimiterBuilder::lease`]).
    #[cfg(feature = "tower")]
    pub(crate) fn is_leasing(&self) -> bool {
        self.shared.leases.is_some()
    }

    /// Whether `other` decides on this limiter's connection (one was built from the other
    /// with `connect_shared`, or both from a third): one script call can decide both.
    #[cfg(feature = "tower")]
    pub(crate) fn same_connection(&self, other: &RedisLimiter) -> bool {
        self.shared.script.same_connection(&other.shared.script)
    }

    /// The policy this limiter enforces: the builder's, or the latest policy set
    /// [live](RedisLimiterBuilder::live_policy) that this server knows. Under a
    /// [resolver](RedisLimiterBuilder::resolver), the builder's, which decides nothing (see
    /// [`policy_of`](RedisLimiter::policy_of)).
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
        match self
            .shared
            .live
            .as_ref()
            .and_then(self::live::Live::current)
        {
            Some(choice) => choice.tier.policy,
            None => self.shared.tier.policy,
        }
    }

    /// Enforces `policy` on every key, on every server, from now on (a limiter built with
    /// [`live_policy`](RedisLimiterBuilder::live_policy), as every server's of the prefix
    /// must be): stored in Redis for the other servers, which read it within a second, and
    /// in force here at once. Returns the policy in force: `policy`, or a policy another
    /// server set no earlier (the newest wins).
    ///
    /// The rule for keys already in Redis is that of
    /// [`RateLimiter::set_policy`](crate::RateLimiter::set_policy): **permits already spent
    /// stay spent, and no key gains more than the new policy allows.** Each key moves on its
    /// next request, in one script call more: its state under the old policy is deleted,
    /// and each band of the new one starts with the most permits in use among the old
    /// bands whose window is no longer than its own. A server that has not read the new
    /// policy yet decides the keys already moved under it. A reservation made before its key
    /// moves gets no refund after, nor a charge. It replaces a
    /// [resolver](RedisLimiterBuilder::resolver).
    ///
    /// # Errors
    ///
    /// [`BackendError::InvalidSetting`] for a limiter built without `live_policy`,
    /// [`BackendError::UnsupportedPolicy`] for a policy the scripts cannot decide, and
    /// [`BackendError::Timeout`] or [`BackendError::Redis`] when Redis cannot store it:
    /// nothing changed here then, though after a timeout Redis may have stored it, and the
    /// other servers would read it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use tollgate::redis::RedisLimiter;
    ///
    /// let limiter = RedisLimiter::builder("100/min".parse()?)
    ///     .prefix("api")
    ///     .live_policy()
    ///     .connect("redis://127.0.0.1:6379")
    ///     .await?;
    /// limiter.set_policy("50/min".parse()?).await?; // every server, within a second
    /// assert_eq!(limiter.policy().to_string(), "token-bucket 50/1m");
    /// # Ok(())
    /// # }
    /// ```
    pub async fn set_policy(&self, policy: Policy) -> Result<Policy, BackendError> {
        self.shared.set_policy(policy).await
    }

    /// The policy this server decides `key` under: [`policy`](RedisLimiter::policy), or with
    /// a [resolver](RedisLimiterBuilder::resolver) its answer for `key` (cached, as for a
    /// request), or the policy it follows for `key` (a later answer of another server, which
    /// the key's record named).
    ///
    /// # Errors
    ///
    /// [`BackendError::UnsupportedPolicy`] when the resolver answers a policy the Redis
    /// backend cannot decide.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use tollgate::redis::RedisLimiter;
    ///
    /// let limiter = RedisLimiter::builder("100/min".parse()?)
    ///     .prefix("api")
    ///     .resolver(|user: &str| {
    ///         let tier = if user.starts_with("paid-") { "1000/min" } else { "100/min" };
    ///         tier.parse().unwrap()
    ///     })
    ///     .connect("redis://127.0.0.1:6379")
    ///     .await?;
    /// assert_eq!(limiter.policy_of("paid-7")?.to_string(), "token-bucket 1000/1m");
    /// # Ok(())
    /// # }
    /// ```
    pub fn policy_of(&self, key: &str) -> Result<Policy, BackendError> {
        Ok(self.shared.tier_of(key)?.tier.policy)
    }

    /// `n` as a request's cost for `key`, checked as each request checks it (the policy set
    /// live read first, when due), and nothing decided: a cost its policy can never admit is
    /// [`BackendError::Cost`].
    #[cfg(feature = "tower")]
    pub(crate) async fn check_cost(&self, key: &str, n: u64) -> Result<(), BackendError> {
        self.shared.check_cost(key, n).await
    }

    /// The policy every key is held to, `None` under a resolver (each key has its own).
    #[cfg(feature = "tower")]
    pub(crate) fn uniform_policy(&self) -> Option<Policy> {
        let live = self
            .shared
            .live
            .as_ref()
            .and_then(self::live::Live::current);
        match live {
            Some(choice) => Some(choice.tier.policy),
            None => self
                .shared
                .tiers
                .is_none()
                .then_some(self.shared.tier.policy),
        }
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
        let mut stats = self.shared.counters.snapshot();
        if let Some(leases) = &self.shared.leases {
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
        self.shared.breaker.is_failing()
    }

    /// Reserves `n` permits for `key` for a request whose real cost is known only later:
    /// decided and spent exactly as [`try_acquire_n`](RedisLimiter::try_acquire_n) would, in
    /// one script call, and returned as a [`Reservation`] to
    /// [`settle`](RedisLimiter::settle) (or [`cancel`](RedisLimiter::cancel)) once the cost
    /// is known. A refused reservation holds nothing.
    ///
    /// An admitted reservation also writes its *token* next to the key's state (a field of
    /// the hash `<prefix>:{<key>}:reserved`, in the key's cluster slot, written by the same
    /// script call): its refund applies only while the token is there, so never to a Redis
    /// that lost the reservation since (see [`settle`](RedisLimiter::settle)). The token is
    /// deleted by the settle, or dropped by a later reservation of the key once no band can
    /// count the reservation any more (twice the longest window, and a second).
    ///
    /// While the failure policy decides, the reservation gets its decision (an
    /// [`Open`](crate::redis::FailurePolicy::Open) or [`Local`](crate::redis::FailurePolicy::Local) admission holds its
    /// permits), but nothing of it is in Redis: settling or cancelling it returns `Ok(())`
    /// and changes nothing anywhere (a `Local` limiter keeps the permits spent).
    ///
    /// # Errors
    ///
    /// As for [`try_acquire_n`](RedisLimiter::try_acquire_n).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tollgate::redis::BackendError> {
    /// let limiter = tollgate::redis::RedisLimiter::connect(
    ///     "redis://127.0.0.1:6379",
    ///     "1000/min".parse().unwrap(),
    /// )
    /// .await?;
    /// let r = limiter.reserve_n("tenant-7", 400).await?; // an estimate
    /// assert!(r.decision().is_allowed());
    /// limiter.settle("tenant-7", r, 250).await?; // it really cost 250: 150 come back
    /// # Ok(())
    /// # }
    /// ```
    pub async fn reserve_n(&self, key: &str, n: u64) -> Result<Reservation, BackendError> {
        self.shared.reserve(key, n).await
    }

    /// Settles `r`, a reservation made by [`reserve_n`](RedisLimiter::reserve_n) of this
    /// limiter for `key`, at the `actual` permits the request used, in one script call: below
    /// what it holds, the difference is given back; above, the excess is charged on top
    /// whatever the key has left, a debt its next requests wait out (a token bucket's up to
    /// twice its burst, a sliding counter's up to twice its permits; a sliding log fills up
    /// to its permits, as it cannot hold more). Each band gives back only what it still
    /// counts of the reservation (nothing once those permits have refilled or left its
    /// window).
    ///
    /// **After Redis lost the reservation** (a restart without persistence, a `FLUSHALL`, a
    /// failover to a replica that never received it), its token is gone with it, and a refund
    /// gives back nothing: the state in Redis never held those permits. A charge is still
    /// made (it only spends more). Under `maxmemory` eviction, which removes keys one by
    /// one, the token may outlive a band's state: the refund then lands on that band's fresh
    /// state under the rules above, at most the permits given back, once; a token evicted
    /// before the state makes the refund give back nothing.
    ///
    /// A settle that gives permits back drops the key's refusal from this limiter's deny
    /// cache (other limiters' caches may still refuse the key until their cached
    /// retry_after). Settling at what the reservation holds, or a reservation made while the
    /// failure policy decided, sends nothing.
    ///
    /// # Errors
    ///
    /// [`BackendError::Settle`] for a refused reservation ([`SettleError::Refused`]), one made
    /// for another key ([`SettleError::OtherKey`]) or by another limiter
    /// ([`SettleError::OtherLimiter`]): nothing is sent, and its permits stay spent. When
    /// Redis cannot be reached, [`BackendError::Timeout`], [`BackendError::Redis`] or
    /// [`BackendError::Unavailable`], whatever the failure policy: the reservation is gone and
    /// its permits stay spent (after a timeout, Redis may have applied the settle, once).
    /// [`BackendError::ClockOutOfRange`] for a test clock beyond range.
    ///
    /// [`SettleError::Refused`]: crate::SettleError::Refused
    /// [`SettleError::OtherKey`]: crate::SettleError::OtherKey
    /// [`SettleError::OtherLimiter`]: crate::SettleError::OtherLimiter
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tollgate::redis::BackendError> {
    /// let limiter = tollgate::redis::RedisLimiter::connect(
    ///     "redis://127.0.0.1:6379",
    ///     "100/min".parse().unwrap(),
    /// )
    /// .await?;
    /// let r = limiter.reserve_n("tenant-7", 40).await?;
    /// assert_eq!(r.decision().remaining(), 60);
    /// limiter.settle("tenant-7", r, 25).await?; // 15 come back
    /// assert_eq!(limiter.peek("tenant-7").await?.remaining(), 74);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn settle(&self, key: &str, r: Reservation, actual: u64) -> Result<(), BackendError> {
        self.shared.settle(key, r, actual).await
    }

    /// Cancels `r`, a reservation of this limiter for `key`: settles it at 0, giving back
    /// every permit it holds that the key still counts.
    ///
    /// # Errors
    ///
    /// As for [`settle`](RedisLimiter::settle).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tollgate::redis::BackendError> {
    /// let limiter = tollgate::redis::RedisLimiter::connect(
    ///     "redis://127.0.0.1:6379",
    ///     "10/s".parse().unwrap(),
    /// )
    /// .await?;
    /// let r = limiter.reserve_n("upload", 4).await?;
    /// limiter.cancel("upload", r).await?; // the upload never started
    /// # Ok(())
    /// # }
    /// ```
    pub async fn cancel(&self, key: &str, r: Reservation) -> Result<(), BackendError> {
        self.settle(key, r, 0).await
    }

    /// Gives back every lease this limiter holds, and takes no more: from now on every
    /// request is decided by Redis. For a graceful shutdown: a limiter dropped with leases
    /// gives them back from a task of its own when a tokio runtime is running, and otherwise
    /// not at all.
    ///
    /// Does nothing for a limiter without leases, or when called again.
    ///
    /// # Errors
    ///
    /// The first error met giving a lease back ([`BackendError::Timeout`],
    /// [`BackendError::Redis`] or [`BackendError::Unavailable`]); every other lease is still
    /// given back. The permits of a lease that could not be given back stay spent in Redis,
    /// as if admitted.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tollgate::redis::BackendError> {
    /// let limiter = tollgate::redis::RedisLimiter::builder("10000/min".parse().unwrap())
    ///     .lease(100)
    ///     .connect("redis://127.0.0.1:6379")
    ///     .await?;
    /// limiter.try_acquire("tenant-7").await?;
    /// limiter.close().await?; // before the process exits
    /// # Ok(())
    /// # }
    /// ```
    pub async fn close(&self) -> Result<(), BackendError> {
        self.shared.close().await
    }
}

// The parts of a `RedisAllOf` are limiters' keys; it decides them in `all_of`.
impl<'a> RedisAllOf<'a> {
    /// Adds `limiter`'s `key`, at a cost of 1.
    #[must_use]
    pub fn key(self, limiter: &'a RedisLimiter, key: &'a str) -> Self {
        self.key_n(limiter, key, 1)
    }

    /// Adds `limiter`'s `key`, at a cost of `n` permits.
    #[must_use]
    pub fn key_n(self, limiter: &'a RedisLimiter, key: &'a str, n: u64) -> Self {
        self.push(&limiter.shared, key, n)
    }
}

// The builder's last step, which makes the limiter; its settings are in `builder`.
impl RedisLimiterBuilder {
    /// Connects to one Redis server at `url` (`redis://host:port/db`, `rediss://` for TLS
    /// when the `redis` crate is built with it, `redis+unix:///path`), loads the script, and
    /// builds the limiter. The connection reconnects by itself whenever it drops.
    ///
    /// # Errors
    ///
    /// [`BackendError::UnsupportedPolicy`] for a policy the scripts cannot decide,
    /// [`BackendError::InvalidPrefix`] for a prefix with `{` or `}`,
    /// [`BackendError::Redis`] for a bad URL or a failed connection or script load, and
    /// [`BackendError::Timeout`] when that takes longer than the connect timeout.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = tollgate::redis::RedisLimiter::builder("5/s".parse()?)
    ///     .connect("redis://127.0.0.1:6379")
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect(self, url: &str) -> Result<RedisLimiter, BackendError> {
        let shared = self.open(url).await?;
        shared.read_live().await;
        Ok(RedisLimiter { shared })
    }

    /// Connects to a Redis Cluster through any of its `nodes` (URLs as for
    /// [`connect`](RedisLimiterBuilder::connect)), loads the script on every primary, and
    /// builds the limiter. The cluster client follows slot moves and reconnects by itself;
    /// it is built without request retries of its own, so that a call is resent only after
    /// replies proving it did not run, and once after a dropped connection (see
    /// `docs/REDIS.md`, "Script loading and retries").
    ///
    /// # Errors
    ///
    /// As for [`connect`](RedisLimiterBuilder::connect).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = tollgate::redis::RedisLimiter::builder("10/s & 1000/day".parse()?)
    ///     .connect_cluster(&["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect_cluster(self, nodes: &[&str]) -> Result<RedisLimiter, BackendError> {
        let shared = self.open_cluster(nodes).await?;
        shared.read_live().await;
        Ok(RedisLimiter { shared })
    }

    /// Builds the limiter on `other`'s connection (one Redis server or cluster, with the
    /// script already loaded): no new connection is made. Limiters whose keys one
    /// [`RedisAllOf`] decides must share a connection so.
    ///
    /// Async, as `connect` is, because a limiter with [leases](RedisLimiterBuilder::lease)
    /// starts its sweeper on the running tokio runtime.
    ///
    /// # Errors
    ///
    /// [`BackendError::UnsupportedPolicy`], [`BackendError::InvalidPrefix`] and
    /// [`BackendError::InvalidSetting`] as for [`connect`](RedisLimiterBuilder::connect).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// use tollgate::redis::RedisLimiter;
    ///
    /// let per_user = RedisLimiter::connect("redis://127.0.0.1:6379", "100/min".parse()?).await?;
    /// let per_ip = RedisLimiter::builder("20/min".parse()?)
    ///     .prefix("ip")
    ///     .connect_shared(&per_user)
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn connect_shared(self, other: &RedisLimiter) -> Result<RedisLimiter, BackendError> {
        let shared = self.open_shared(&other.shared)?;
        shared.read_live().await;
        Ok(RedisLimiter { shared })
    }
}

impl fmt::Debug for RedisLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shared = &*self.shared;
        f.debug_struct("RedisLimiter")
            .field("policy", &shared.tier.policy)
            .field("resolver", &shared.tiers.is_some())
            .field("prefix", &shared.prefix)
            .field("timeout", &shared.timeout)
            .field("failure_policy", &shared.failure)
            .field("deny_cache", &shared.cache.is_some())
            .field("leases", &shared.leases.is_some())
            .field("shadow", &shared.shadow)
            .field("failing", &shared.breaker.is_failing())
            .field("stats", &shared.counters.snapshot())
            .finish_non_exhaustive()
    }
}
