//! [`RedisLimiterBuilder`]: the settings of a [`RedisLimiter`](super::RedisLimiter), their
//! defaults and checks, and the connection and shared state they build. Its `connect` and
//! `connect_cluster`, which return the limiter, are with the limiter's methods in the parent
//! module.

use std::fmt;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster::ClusterClientBuilder;

use crate::clock::{Clock, SystemClock};
use crate::keys::KeyHasher;
use crate::policy::{Algorithm, Policy};
use crate::reservation::next_limiter_id;

use super::cache::DenyCache;
use super::conn::{Conn, Script};
use super::error::BackendError;
use super::failure::{Breaker, Counters, FailurePolicy};
use super::give_back::Returner;
use super::lease::{self, Leases};
use super::leased::sweeper;
use super::live::Live;
use super::shared::Shared;
use super::tiers::{Resolver, Tier, Tiers};

/// Builds a [`RedisLimiter`](super::RedisLimiter): start with
/// [`RedisLimiter::builder`](super::RedisLimiter::builder), finish with
/// [`connect`](RedisLimiterBuilder::connect) or
/// [`connect_cluster`](RedisLimiterBuilder::connect_cluster).
///
/// | setting | default |
/// |---|---|
/// | [`prefix`](RedisLimiterBuilder::prefix) | `"tollgate"` |
/// | [`timeout`](RedisLimiterBuilder::timeout) | 100 ms per call |
/// | [`connect_timeout`](RedisLimiterBuilder::connect_timeout) | 2 s |
/// | [`failure_policy`](RedisLimiterBuilder::failure_policy) | [`FailurePolicy::Error`] |
/// | [`probe_interval`](RedisLimiterBuilder::probe_interval) | 1 s |
/// | [`deny_cache`](RedisLimiterBuilder::deny_cache) | on, up to 100,000 keys |
/// | [`lease`](RedisLimiterBuilder::lease) | off |
/// | [`shadow`](RedisLimiterBuilder::shadow) | off |
/// | [`resolver`](RedisLimiterBuilder::resolver) | none: the builder's policy for every key |
/// | [`live_policy`](RedisLimiterBuilder::live_policy) | off |
///
/// [`connect`](RedisLimiterBuilder::connect) checks the settings before it connects, and
/// refuses with [`BackendError::InvalidSetting`] (naming the setting and the value) a zero
/// timeout, connect timeout or probe interval, `lease(0)`, a lease of more than one permit
/// under a policy with a sliding log band, a lease with a resolver or live policies, and
/// `resolver_cache(0, _)`. A timeout, connect timeout or probe interval above
/// [`MAX_TIMEOUT`](RedisLimiterBuilder::MAX_TIMEOUT) (an hour) counts as an hour, so that
/// `Duration::MAX` means "as long as it takes" without overflowing any deadline, and a Redis
/// back up is asked again within the hour.
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use tollgate::redis::{FailurePolicy, RedisLimiter};
///
/// let limiter = RedisLimiter::builder("10/s".parse()?)
///     .prefix("login")
///     .timeout(Duration::from_millis(25))
///     .failure_policy(FailurePolicy::Closed)
///     .connect("redis://127.0.0.1:6379")
///     .await?;
/// # Ok(())
/// # }
/// ```
#[must_use = "a builder does nothing until it connects"]
pub struct RedisLimiterBuilder {
    policy: Policy,
    prefix: String,
    timeout: Duration,
    connect_timeout: Duration,
    probe_interval: Duration,
    failure: FailurePolicy,
    deny_cache: usize,
    /// The largest lease (`None`: no leases).
    lease: Option<u64>,
    /// Set only by `test_clock` (feature `test-util`).
    test_clock: Option<Arc<dyn Clock>>,
    /// The one hash tag of every key (`None`: each key's own).
    hash_tag: Option<String>,
    /// Shadow mode: refusals counted and let through.
    shadow: bool,
    /// Per-key policies, chosen by the caller.
    resolver: Option<Resolver>,
    /// How many keys' policies are cached, and for how long.
    resolver_cache: (usize, Duration),
    /// Policies set live reach every server.
    live_policy: bool,
    /// Whether `prefix` was given (a limiter with records needs its own).
    prefix_given: bool,
}

impl RedisLimiterBuilder {
    /// The longest [`timeout`](RedisLimiterBuilder::timeout),
    /// [`connect_timeout`](RedisLimiterBuilder::connect_timeout) and
    /// [`probe_interval`](RedisLimiterBuilder::probe_interval): one hour. A longer one
    /// counts as this, which keeps every deadline computed from it, and the lease tokens'
    /// expiry derived from it, far from overflowing.
    pub const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

    /// A builder for a limiter enforcing `policy`, with every setting at its default.
    pub(super) fn new(policy: Policy) -> Self {
        RedisLimiterBuilder {
            policy,
            prefix: "tollgate".to_owned(),
            timeout: Duration::from_millis(100),
            connect_timeout: Duration::from_secs(2),
            probe_interval: Duration::from_secs(1),
            failure: FailurePolicy::Error,
            deny_cache: 100_000,
            lease: None,
            test_clock: None,
            hash_tag: None,
            shadow: false,
            resolver: None,
            resolver_cache: (100_000, Duration::from_secs(60)),
            live_policy: false,
            prefix_given: false,
        }
    }

    /// The prefix of every Redis key this limiter writes (default `"tollgate"`); an empty
    /// prefix writes keys that start with the `{key}` hash tag. Limiters share state exactly
    /// when they share the Redis, the prefix, the [`hash_tag`](RedisLimiterBuilder::hash_tag)
    /// (or its absence) and the policy's bands; limiters with a
    /// [`resolver`](RedisLimiterBuilder::resolver) or [`live_policy`](RedisLimiterBuilder::live_policy)
    /// share each key's record of its policy by prefix alone, and move and follow each other's
    /// keys: each needs a prefix of its own, given here (connect warns when it is left at the
    /// default; it cannot tell whether another limiter uses a prefix).
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = tollgate::redis::RedisLimiter::builder("5/s".parse()?).prefix("api:v2");
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn prefix(mut self, prefix: &str) -> Self {
        prefix.clone_into(&mut self.prefix);
        self.prefix_given = true;
        self
    }

    /// Puts every key of this limiter in one Redis Cluster slot, that of the hash tag `tag`:
    /// keys are then named `<prefix>:{<tag>}:{<key>}:<band>`. **This renames every key**:
    /// limiters with and without the tag (or with different tags) count in different keys,
    /// so setting or changing it starts every key afresh, and during a rolling deploy old and
    /// new servers each admit a whole budget. For a
    /// [`RedisAllOf`](super::RedisAllOf) on a cluster, whose parts must all be in one slot:
    /// give each of its limiters the same tag. By default each key has its own tag (its own
    /// slot), which spreads keys over the cluster's nodes; with one tag, the node holding
    /// that slot decides every key of the limiter, and bounds its throughput. A single Redis
    /// server has no slots: the tag only renames the keys.
    ///
    /// An empty tag, or one with `{` or `}`, is refused at connect
    /// ([`BackendError::InvalidSetting`]).
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = tollgate::redis::RedisLimiter::builder("100/min".parse()?).hash_tag("api");
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn hash_tag(mut self, tag: &str) -> Self {
        self.hash_tag = Some(tag.to_owned());
        self
    }

    /// The longest a call waits for Redis before the failure policy decides (default 100 ms).
    /// A call that timed out may still have been decided by Redis (its permits spent); it is
    /// never sent again.
    ///
    /// Zero is refused at connect ([`BackendError::InvalidSetting`]); a timeout above
    /// [`MAX_TIMEOUT`](RedisLimiterBuilder::MAX_TIMEOUT) (an hour) counts as an hour.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let builder = tollgate::redis::RedisLimiter::builder("5/s".parse()?)
    ///     .timeout(Duration::from_millis(20));
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.min(Self::MAX_TIMEOUT);
        self
    }

    /// The longest [`connect`](RedisLimiterBuilder::connect) waits for the first connection
    /// (default 2 s); later reconnections happen in the background.
    ///
    /// Zero is refused at connect ([`BackendError::InvalidSetting`]); a timeout above
    /// [`MAX_TIMEOUT`](RedisLimiterBuilder::MAX_TIMEOUT) (an hour) counts as an hour.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let builder = tollgate::redis::RedisLimiter::builder("5/s".parse()?)
    ///     .connect_timeout(Duration::from_millis(500));
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout.min(Self::MAX_TIMEOUT);
        self
    }

    /// What decides while Redis is slow or down (default [`FailurePolicy::Error`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::redis::{FailurePolicy, RedisLimiter};
    /// let builder = RedisLimiter::builder("5/s".parse()?).failure_policy(FailurePolicy::Open);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn failure_policy(mut self, failure: FailurePolicy) -> Self {
        self.failure = failure;
        self
    }

    /// While the failure policy decides, how often one call tries Redis again (default 1 s).
    /// Also the `retry_after` of [`FailurePolicy::Closed`]'s refusals. Zero is refused at
    /// connect ([`BackendError::InvalidSetting`]): every call would probe a Redis that is
    /// down, and `Closed` would tell clients to retry at once. An interval above
    /// [`MAX_TIMEOUT`](RedisLimiterBuilder::MAX_TIMEOUT) (an hour) counts as an hour: a
    /// Redis back up is seen within the hour, never left unasked for good.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let builder = tollgate::redis::RedisLimiter::builder("5/s".parse()?)
    ///     .probe_interval(Duration::from_millis(250));
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn probe_interval(mut self, interval: Duration) -> Self {
        self.probe_interval = interval.min(Self::MAX_TIMEOUT);
        self
    }

    /// The local deny cache: remember up to `max_keys` keys that Redis refused, and refuse
    /// them locally, without a round trip, until their retry_after (0 turns the cache off;
    /// default 100,000).
    ///
    /// The cache only ever refuses, and refuses only requests Redis would refuse too: of the
    /// refused cost (a peek counts as cost 1), before the refused request's retry instant
    /// (with a margin of 1 µs plus 0.1 % for the difference between the local and Redis
    /// clocks). Its refusals report the `retry_after` and `reset_after` counted down since
    /// Redis's refusal, and that refusal's `remaining` (a lower bound) and `limit`. Other servers'
    /// admissions can only lengthen a refusal, so the cache stays sound across servers.
    ///
    /// A refusal leaves the cache when it expires, or when a new one arrives with the cache
    /// full: the oldest cached refusal then makes room (its key's next request goes to Redis,
    /// which refuses it as before). Caching a refusal takes the same few steps whatever the
    /// cache holds. See `docs/REDIS.md`.
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = tollgate::redis::RedisLimiter::builder("5/s".parse()?).deny_cache(0);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn deny_cache(mut self, max_keys: usize) -> Self {
        self.deny_cache = max_keys;
        self
    }

    /// Leases for hot keys: take up to `max_permits` permits of a key from Redis in one
    /// script call (counted spent there at once), and admit this server's requests for the
    /// key from them locally, without a round trip, until they are spent or the lease
    /// expires (leases are off unless set; a value above the smallest band's permits counts
    /// as that).
    ///
    /// * **Refused at connect** ([`BackendError::InvalidSetting`], naming `lease` and the
    ///   value): `lease(0)`, and a lease of more than one permit under a policy with a
    ///   [sliding log](crate::Algorithm::SlidingLog) band. A sliding log promises at most `N`
    ///   admissions in every window of real time, but a lease's permits are stamped when it
    ///   is taken and admitted up to its hold time (a tenth of the window) later: a lease of
    ///   50 on `sliding-log 100/1s` taken at 0 s and spent at 0.099 s, then 100 admitted at
    ///   1.0 s, would put 150 admissions inside (0.0995 s, 1.0995 s]. `lease(1)` is
    ///   accepted (each lease is the request that takes it, stamped when it is admitted); the
    ///   sliding log is meant for small `N`, where a round trip per request is cheap.
    ///
    /// * **Size**: a key's first lease is one permit, used by the request that takes it, so
    ///   a cold key holds nothing. Each next lease doubles, up to `max_permits`, when the
    ///   previous one was spent within half the hold time, and halves when one expires with
    ///   most of it unused.
    /// * **Hold time**: a lease admits nothing after a tenth of the policy's shortest
    ///   window; then, or once its key has been quiet for a sweep (a quarter of the hold
    ///   time, at most 1 s), what it did not use is given back to Redis, once.
    /// * **The promise**: never more admitted across all servers than the policy allows
    ///   (every permit a lease admits was counted in Redis when the lease was taken); at most
    ///   the unused permits of the leases held fewer, `servers x max_permits` per key (with
    ///   the exceptions `docs/REDIS.md` lists: leases that could not be given back, and what
    ///   a token bucket refilled into a lease while it was held).
    /// * **Decisions** from a lease are admissions with `remaining` what Redis reported when
    ///   the lease was taken plus what the lease has left (what Redis would have reported had
    ///   the lease's requests gone to it one by one then), and `reset_after` Redis's, counted
    ///   down. Refusals always come from Redis (or the deny cache).
    /// * [`try_acquire_n`](super::RedisLimiter::try_acquire_n) of more than 1 takes from the
    ///   lease when it holds that many, and otherwise goes to Redis, leaving the lease as it
    ///   is; [`peek`](super::RedisLimiter::peek) answers from a lease that holds a permit,
    ///   taking nothing; [`reset`](super::RedisLimiter::reset) drops the key's lease;
    ///   `reserve_n`, `settle` and `cancel` never use leases.
    /// * **While Redis is down** a lease keeps admitting within its own permits until it
    ///   expires; then the failure policy decides.
    /// * [`close`](super::RedisLimiter::close) gives every lease back (for a graceful
    ///   shutdown); a limiter dropped with leases gives them back from a task when a tokio
    ///   runtime is running.
    /// * At most 100,000 keys have a lease at once; beyond, new keys go to Redis without one
    ///   until quiet keys leave.
    ///
    /// See `docs/REDIS.md`, "Leases for hot keys".
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = tollgate::redis::RedisLimiter::builder("10000/min".parse()?).lease(100);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn lease(mut self, max_permits: u64) -> Self {
        self.lease = Some(max_permits);
        self
    }

    /// Shadow mode, to roll a limit out on every server before enforcing it: each request is
    /// decided and counted as usual ([`BackendStats::allowed`](super::BackendStats::allowed)
    /// and [`refused`](super::BackendStats::refused)), but a refusal is let through, marked
    /// [`Decision::would_refuse`](crate::Decision::would_refuse). Permits are spent only by
    /// the requests the policy admits, so the state in Redis is exactly what enforcing the
    /// policy would have left there, and switching shadow mode off enforces from that state.
    ///
    /// Whatever refuses is let through: Redis, the deny cache, a lease, the failure policy
    /// ([`Closed`](super::FailurePolicy::Closed), a [`Local`](super::FailurePolicy::Local)
    /// limiter). Two things still stand in the way:
    /// - [`FailurePolicy::Error`](super::FailurePolicy::Error) (the default) still fails the
    ///   call while Redis is down, and in a [`RedisAllOf`](super::RedisAllOf) or an HTTP
    ///   route of several rules it fails the whole decision: give a shadow limiter
    ///   [`Open`](super::FailurePolicy::Open) so that adding it changes nothing during an
    ///   outage;
    /// - a cost no state of the policy (or of the policy the key's record names, with
    ///   records) could admit (0, or above its smallest band) is
    ///   [`BackendError::Cost`](super::BackendError::Cost) (in a `RedisAllOf`, a refusal
    ///   of the whole naming the part, or [`BackendError::Part`](super::BackendError::Part)
    ///   from `reserve`), as without shadow mode: it is the caller's error.
    ///
    /// So `acquire` never waits, a reservation let through holds nothing (settling it is
    /// [`SettleError::Refused`](crate::SettleError::Refused); a `RedisAllOf` reservation
    /// skips such a part), and `peek` reports the policy's own answer. In a
    /// [`RedisAllOf`](super::RedisAllOf), a shadow part that would refuse spends nothing and
    /// does not stop the others, as in [`AllOf`](crate::AllOf); the others then spend for
    /// requests the shadow limit would refuse, so the state is what enforcing would leave
    /// for each part alone, not for the whole.
    ///
    /// Shadow mode belongs to this limiter, not to the keys: another server's limiter on the
    /// same keys without it enforces the same state. Not so with a
    /// [`resolver`](RedisLimiterBuilder::resolver) or
    /// [`live_policy`](RedisLimiterBuilder::live_policy): the keys' records then name the
    /// shadow limiter's policies, which every limiter of the prefix follows (and a
    /// `set_policy` it makes is enforced by all). Give a shadow limiter with records a prefix
    /// no enforcing limiter uses.
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = tollgate::redis::RedisLimiter::builder("100/min".parse()?).shadow();
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn shadow(mut self) -> Self {
        self.shadow = true;
        self
    }

    /// Per-key policies: each key is held to the policy `resolver` answers for it (free
    /// users 100 a minute, paid 1,000), decided in the same one script call as any request.
    /// The builder's policy stays the limiter's [`policy`](super::RedisLimiter::policy), and
    /// decides nothing else.
    ///
    /// **A key's state remembers its policy.** Next to it, `<prefix>:{<key>}:policy` names
    /// the policy its state was made under. When the resolver's answer for a key changes (a
    /// user upgraded, on this server or another), the key's next request moves its state to
    /// the new policy first, with the rule of
    /// [`RateLimiter::set_policy`](crate::RateLimiter::set_policy): permits already spent
    /// stay spent, and no key gains more than the new policy allows (each new band starts
    /// with the permits in use of the old bands whose window is no longer than its own). The
    /// move is one script call more, once per change; a reservation made before it gets
    /// neither a refund nor a charge after it. State written before the limiter had a
    /// resolver has no record, and is not carried.
    ///
    /// **Answers are cached** per instance, for up to
    /// [`resolver_cache`](RedisLimiterBuilder::resolver_cache)'s time to live (default 60
    /// s) and number of keys (default 100,000): a tier change reaches a server's requests
    /// within the time to live.
    ///
    /// **Servers whose answers differ agree on the latest.** An answer dates from when it
    /// last changed on its server (dated on Redis's clock, so servers' clocks need not
    /// agree); asking again and getting the same answer does not date it anew. A request
    /// whose answer is older than the policy the key's record names is decided under the
    /// record's, and its server keeps following that policy for the key until it asks its
    /// resolver again (then its own answer, dated as before if unchanged, meets the record
    /// again). So a key moves once per changed answer (or per server that first
    /// answers for it: a start, or an answer dropped from a full cache), never back and
    /// forth on every renewal. A request that finds its key moved away three times in a row
    /// fails with [`BackendError::Reply`].
    ///
    /// **Give the limiter a [`prefix`](RedisLimiterBuilder::prefix) of its own**: the
    /// records are named by prefix and key, and another limiter with a resolver or live
    /// policies on the same prefix would take them for its own (they would be one limiter,
    /// moving each other's keys). Connect logs a warning for the default prefix.
    ///
    /// The resolver runs on the request's task, with no lock held: keep it a quick lookup,
    /// and never call the limiter from it. An answer the scripts cannot decide is the
    /// request's [`BackendError::UnsupportedPolicy`]. Not with
    /// [`lease`](RedisLimiterBuilder::lease) (refused at connect: a lease is taken under one
    /// policy for every key). A [`FailurePolicy::Local`](super::FailurePolicy::Local)
    /// limiter decides under its own policy, whatever the resolver answers.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::Policy;
    ///
    /// let free: Policy = "100/min".parse()?;
    /// let paid: Policy = "1000/min".parse()?;
    /// let builder = tollgate::redis::RedisLimiter::builder(free)
    ///     .prefix("api")
    ///     .resolver(move |user: &str| if user.starts_with("paid-") { paid } else { free });
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn resolver(mut self, resolver: impl Fn(&str) -> Policy + Send + Sync + 'static) -> Self {
        self.resolver = Some(Arc::new(resolver));
        self
    }

    /// How many keys' [resolver](RedisLimiterBuilder::resolver) answers this instance keeps
    /// (default 100,000; at least 1), and for how long each is used before the resolver is
    /// asked again (default 60 s; zero asks it at least once per request). A full cache drops expired
    /// answers first, then arbitrary ones.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let builder = tollgate::redis::RedisLimiter::builder("100/min".parse()?)
    ///     .prefix("api")
    ///     .resolver(|_: &str| "100/min".parse().unwrap())
    ///     .resolver_cache(10_000, Duration::from_secs(5));
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn resolver_cache(mut self, max_keys: usize, ttl: Duration) -> Self {
        self.resolver_cache = (max_keys, ttl);
        self
    }

    /// Lets [`RedisLimiter::set_policy`](super::RedisLimiter::set_policy) change the policy
    /// of every server at run time. Build every server's limiter of the prefix with it.
    ///
    /// The policy a `set_policy` sets is stored in Redis (`<prefix>:live-policy`, with when
    /// it was set), and each server reads it again at most once a second, on a request; a
    /// server that starts later reads it when it connects. The newest `set_policy` of any
    /// server wins. Until one is made, the builder's policy (or the resolver) applies, dated
    /// from when the limiter was built: a server deployed later with another configured
    /// policy moves the keys it serves, and older servers follow it and take it. Once one is
    /// stored it wins over every configured policy, so a deploy that changes the configured
    /// policy then calls `set_policy` with it. `set_policy` replaces a resolver for good (on
    /// the prefix). A [`FailurePolicy::Local`](super::FailurePolicy::Local) limiter keeps its
    /// own policy.
    ///
    /// Each key's state records the policy it is under, as with a
    /// [`resolver`](RedisLimiterBuilder::resolver): a key moves to the new policy on its next
    /// request (one script call more), with the rule of
    /// [`RateLimiter::set_policy`](crate::RateLimiter::set_policy), and a server that has not
    /// read the new policy yet decides the keys a newer server has used under the newer
    /// policy, and takes it from the first such key's record. So a server applies its old
    /// policy only to keys no newer server has used since the change, until it reads the
    /// change (within a second; a read that fails is counted in
    /// [`BackendStats::policy_read_failures`](super::BackendStats::policy_read_failures) and
    /// logged), as in process a key stays under the old policy until its next request. A
    /// policy set live outranks every [resolver](RedisLimiterBuilder::resolver)'s answer. The
    /// record costs one key more per decision in Redis. Keys whose state was written before
    /// `live_policy` was on, and not since, start afresh under a changed policy. Not with
    /// [`lease`](RedisLimiterBuilder::lease) (refused at connect).
    ///
    /// # Examples
    ///
    /// ```
    /// let builder = tollgate::redis::RedisLimiter::builder("100/min".parse()?)
    ///     .prefix("api")
    ///     .live_policy();
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn live_policy(mut self) -> Self {
        self.live_policy = true;
        self
    }

    /// **For tests only** (feature `test-util`). Decide at this clock's readings (rounded
    /// down to microseconds) instead of Redis `TIME`, so that a test can drive time, as with a
    /// [`FakeClock`](crate::FakeClock) in process. Every limiter that shares keys must then
    /// share this clock, and keys get no expiry (Redis expires keys on its own clock, which
    /// an injected time does not follow). Readings must stay below 2^52 µs.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::FakeClock;
    /// let builder = tollgate::redis::RedisLimiter::builder("5/s".parse()?)
    ///     .test_clock(FakeClock::new());
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[cfg(feature = "test-util")]
    pub fn test_clock(mut self, clock: impl Clock + 'static) -> Self {
        self.test_clock = Some(Arc::new(clock));
        self
    }

    /// Connects to one Redis server at `url`, loads the script, and builds what the limiter
    /// shares (see [`connect`](RedisLimiterBuilder::connect)).
    pub(super) async fn open(self, url: &str) -> Result<Arc<Shared>, BackendError> {
        let tier = self.validate()?;
        let client = ::redis::Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            // Each call is bounded by the limiter's own timeout instead.
            .set_response_timeout(None)
            // Reconnect in the background with short waits: 50, 100, 200 ms, then again on
            // the next call.
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(500))
            .set_number_of_retries(3);
        let connecting = ConnectionManager::new_with_config(client, config);
        let manager = tokio::time::timeout(self.connect_timeout, connecting)
            .await
            .map_err(|_| BackendError::Timeout(self.connect_timeout))??;
        let script = Script::load(Conn::Single(manager), self.connect_timeout).await?;
        Ok(self.finish(script, tier))
    }

    /// Connects to a Redis Cluster through any of its `nodes`, loads the script on every
    /// primary, and builds what the limiter shares (see
    /// [`connect_cluster`](RedisLimiterBuilder::connect_cluster)).
    pub(super) async fn open_cluster(self, nodes: &[&str]) -> Result<Arc<Shared>, BackendError> {
        let tier = self.validate()?;
        let client = ClusterClientBuilder::new(nodes.iter().copied())
            .retries(0)
            .connection_timeout(self.connect_timeout)
            .response_timeout(self.timeout.max(Duration::from_secs(1)))
            .build()?;
        let connecting = client.get_async_connection();
        let conn = tokio::time::timeout(self.connect_timeout, connecting)
            .await
            .map_err(|_| BackendError::Timeout(self.connect_timeout))??;
        let script = Script::load(Conn::Cluster(conn), self.connect_timeout).await?;
        Ok(self.finish(script, tier))
    }

    /// Builds what the limiter shares on `other`'s connection and script (see
    /// [`connect_shared`](RedisLimiterBuilder::connect_shared)).
    pub(super) fn open_shared(self, other: &Shared) -> Result<Arc<Shared>, BackendError> {
        let tier = self.validate()?;
        Ok(self.finish(other.script.clone(), tier))
    }

    fn validate(&self) -> Result<Tier, BackendError> {
        if self.prefix.contains(['{', '}']) {
            return Err(BackendError::InvalidPrefix {
                prefix: self.prefix.clone(),
            });
        }
        if let Some(tag) = &self.hash_tag {
            if tag.is_empty() || tag.contains(['{', '}']) {
                return Err(BackendError::InvalidSetting {
                    setting: "hash_tag",
                    value: format!("{tag:?}"),
                    reason: "a hash tag is not empty and has no `{` or `}` (Redis hashes a key by what its first `{...}` holds)",
                });
            }
        }
        let zero = |setting, value: Duration, reason| {
            if value.is_zero() {
                Err(BackendError::InvalidSetting {
                    setting,
                    value: format!("{value:?}"),
                    reason,
                })
            } else {
                Ok(())
            }
        };
        zero(
            "timeout",
            self.timeout,
            "every call would time out before Redis could answer",
        )?;
        zero(
            "connect_timeout",
            self.connect_timeout,
            "the connection would time out before it is made",
        )?;
        zero(
            "probe_interval",
            self.probe_interval,
            "while Redis is down every call would probe it, and the closed failure policy would tell clients to retry at once",
        )?;
        if (self.resolver.is_some() || self.live_policy) && !self.prefix_given {
            // Allowed (a single limiter of the kind needs no prefix), but worth a word: two
            // on one prefix are one limiter, and take each other's records for their own.
            log::warn!(
                "tollgate: a Redis limiter with a resolver or live policies on the default prefix `{}`: every such limiter on it shares the keys' policy records and the policy set live; give each a prefix of its own",
                self.prefix
            );
        }
        if self.resolver_cache.0 == 0 {
            return Err(BackendError::InvalidSetting {
                setting: "resolver_cache",
                value: "0".to_owned(),
                reason: "the cache of resolved policies holds at least one key",
            });
        }
        if let Some(lease) = self.lease {
            if self.resolver.is_some() || self.live_policy {
                return Err(BackendError::InvalidSetting {
                    setting: "lease",
                    value: lease.to_string(),
                    reason: "a limiter with a resolver or live policies takes no leases: a lease is taken under one policy for every key",
                });
            }
            let invalid = |reason| BackendError::InvalidSetting {
                setting: "lease",
                value: lease.to_string(),
                reason,
            };
            if lease == 0 {
                return Err(invalid(
                    "a lease holds at least one permit (leases are off unless set)",
                ));
            }
            let sliding_log = self
                .policy
                .bands()
                .any(|band| band.algorithm() == Algorithm::SlidingLog);
            if lease > 1 && sliding_log {
                return Err(invalid(
                    "the policy has a sliding log band, whose exact window a lease of more than one permit would break (its permits are stamped when taken, not when admitted); use lease(1) or another algorithm",
                ));
            }
        }
        Tier::new(self.policy)
    }

    /// The limiter's shared state on `script`, its sweeper of leases started (on the
    /// running tokio runtime).
    fn finish(self, script: Script, tier: Tier) -> Arc<Shared> {
        // With one hash tag, it follows the prefix: `<prefix>:{<tag>}:{<key>}:<band>`, the
        // slot being that of the first `{...}`.
        let prefix = match &self.hash_tag {
            Some(tag) if self.prefix.is_empty() => format!("{{{tag}}}"),
            Some(tag) => format!("{}:{{{tag}}}", self.prefix),
            None => self.prefix.clone(),
        };
        let clock: Arc<dyn Clock> = match &self.test_clock {
            Some(clock) => Arc::clone(clock),
            None => Arc::new(SystemClock::new()),
        };
        let exact = self.test_clock.is_some();
        let started = clock.now();
        let max_lease = self.lease.unwrap_or(0).min(self.policy.max_cost());
        // The instance's name in its tokens: random, so that servers never share one (a
        // serial number alone restarts with the process).
        let instance = format!(
            "{:016x}",
            KeyHasher::default().hash_one((
                std::process::id(),
                std::time::SystemTime::now(),
                next_limiter_id(),
            ))
        );
        let leases = (max_lease > 0).then(|| {
            let shortest = self
                .policy
                .bands()
                .map(|band| band.window_nanos())
                .min()
                .unwrap_or(1);
            let returner = Returner::new(
                script.clone(),
                tier.bands.clone(),
                prefix.clone(),
                instance.clone(),
                self.timeout,
            );
            Leases::new(
                max_lease,
                (shortest / lease::HOLD_FRACTION).max(1),
                returner,
            )
        });
        let tiers = self.resolver.map(|resolver| {
            let (max_keys, ttl) = self.resolver_cache;
            Tiers::new(resolver, max_keys, ttl)
        });
        let shared = Arc::new(Shared {
            script,
            tier: Arc::new(tier),
            tiers,
            prefix,
            timeout: self.timeout,
            failure: self.failure,
            breaker: Breaker::new(self.probe_interval),
            cache: (self.deny_cache > 0).then(|| DenyCache::new(self.deny_cache, exact)),
            test_clock: self.test_clock,
            clock,
            counters: Counters::default(),
            id: next_limiter_id(),
            instance,
            reservations: std::sync::atomic::AtomicU64::new(0),
            hasher: KeyHasher::default(),
            resets: std::sync::atomic::AtomicU64::new(0),
            leases,
            shadow: self.shadow,
            live: self.live_policy.then(Live::default),
            started,
        });
        if let Some(leases) = &shared.leases {
            let sweeper = sweeper(Arc::downgrade(&shared), leases.sweep_period());
            leases.set_sweeper(tokio::spawn(sweeper).abort_handle());
        }
        shared
    }
}

impl fmt::Debug for RedisLimiterBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLimiterBuilder")
            .field("policy", &self.policy)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("probe_interval", &self.probe_interval)
            .field("failure_policy", &self.failure)
            .field("deny_cache", &self.deny_cache)
            .field("lease", &self.lease)
            .field("test_clock", &self.test_clock.is_some())
            .field("hash_tag", &self.hash_tag)
            .field("shadow", &self.shadow)
            .field("resolver", &self.resolver.is_some())
            .field("resolver_cache", &self.resolver_cache)
            .field("live_policy", &self.live_policy)
            .finish()
    }
}
