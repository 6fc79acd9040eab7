//! What decides while Redis is slow or down: [`FailurePolicy`], the switch between Redis and
//! it ([`Breaker`]), and the counters ([`BackendStats`]).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::keyed::RateLimiter;

/// What decides when Redis does not answer within the limiter's timeout, or cannot be
/// reached.
///
/// The first failed call switches the limiter to its failure policy (counted in
/// [`BackendStats::switches_to_failure`] and logged at `warn` through the `log` facade). While
/// switched, calls are decided by the failure policy at once, without waiting on Redis, and
/// one call per probe interval
/// ([`RedisLimiterBuilder::probe_interval`](super::RedisLimiterBuilder::probe_interval))
/// tries Redis again; the first that succeeds switches back (counted in
/// [`BackendStats::switches_to_redis`], logged at `info`). The connection reconnects by
/// itself meanwhile.
///
/// Errors that Redis *answered* with and that do not mean it is unavailable (a key of the
/// wrong type, a script error) are returned as [`BackendError::Redis`](super::BackendError)
/// whatever the policy, and do not switch.
///
/// # Examples
///
/// ```
/// use tollgate::redis::FailurePolicy;
/// use tollgate::RateLimiter;
///
/// // Let traffic through while Redis is down:
/// let open = FailurePolicy::Open;
/// // Or keep limiting each server on its own, at a quarter of the global rate (4 servers):
/// let local = FailurePolicy::Local(RateLimiter::new("250/s".parse()?));
/// assert!(matches!(local, FailurePolicy::Local(_)));
/// # Ok::<(), tollgate::PolicyError>(())
/// ```
#[derive(Default)]
#[non_exhaustive]
#[allow(
    clippy::large_enum_variant,
    reason = "built once per limiter and kept behind its Arc; boxing would only cost callers a Box::new"
)]
pub enum FailurePolicy {
    /// Return the failure as an error: [`BackendError::Timeout`](super::BackendError) or
    /// [`BackendError::Redis`](super::BackendError). The caller decides. The default.
    #[default]
    Error,
    /// Fail open: allow every request (`remaining` 0, `reset_after` 0).
    Open,
    /// Fail closed: refuse every request (`remaining` 0, `retry_after` the probe interval).
    Closed,
    /// Decide with this in-process limiter, keyed by the same keys: each server limits on its
    /// own (give it the global limit divided by the number of servers). A cost above its
    /// policy's permits is refused.
    Local(RateLimiter<String>),
}

impl fmt::Debug for FailurePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailurePolicy::Error => f.write_str("Error"),
            FailurePolicy::Open => f.write_str("Open"),
            FailurePolicy::Closed => f.write_str("Closed"),
            FailurePolicy::Local(limiter) => f.debug_tuple("Local").field(limiter).finish(),
        }
    }
}

/// What a [`RedisLimiter`](super::RedisLimiter) has done since it connected: decisions by
/// source, switches to and from its [`FailurePolicy`], and the failures behind them.
///
/// # Examples
///
/// ```no_run
/// # async fn run() -> Result<(), tollgate::redis::BackendError> {
/// use tollgate::redis::RedisLimiter;
///
/// let limiter = RedisLimiter::connect("redis://127.0.0.1:6379", "5/s".parse().unwrap()).await?;
/// let _ = limiter.try_acquire("alice").await?;
/// let stats = limiter.stats();
/// assert_eq!(stats.redis_decisions + stats.cached_refusals + stats.failure_decisions, 1);
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BackendStats {
    /// Decisions that admitted, whatever made them (Redis, a lease, the failure policy); in
    /// [shadow mode](super::RedisLimiterBuilder::shadow), admitted by the policy. One per
    /// attempt: a request that waited (`acquire`) counts each refused attempt in `refused`
    /// and its admission here. In a [`RedisAllOf`](super::RedisAllOf), this limiter's
    /// part's own decision, even when another part refused the whole. Peeks, and costs
    /// refused before anything is decided ([`BackendError::Cost`](super::BackendError::Cost)),
    /// are not counted.
    pub allowed: u64,
    /// Decisions that refused, whatever made them (Redis, the deny cache, the failure
    /// policy); in [shadow mode](super::RedisLimiterBuilder::shadow), let through anyway.
    /// Counted as [`allowed`](BackendStats::allowed) is; when failure policies decide a
    /// `RedisAllOf`, the parts after the first refusal are only looked at, and not counted.
    pub refused: u64,
    /// Decisions made by the Redis script.
    pub redis_decisions: u64,
    /// Refusals answered by the local deny cache, without a round trip.
    pub cached_refusals: u64,
    /// Decisions made by the failure policy (including [`FailurePolicy::Error`]'s errors).
    pub failure_decisions: u64,
    /// Switches from Redis to the failure policy.
    pub switches_to_failure: u64,
    /// Switches from the failure policy back to Redis.
    pub switches_to_redis: u64,
    /// Calls that Redis did not answer within the timeout.
    pub timeouts: u64,
    /// Calls that failed because Redis could not be reached or was not ready.
    pub unavailable: u64,
    /// Times the code was loaded again because Redis had lost it: the function library (after
    /// a restart without persistence or `FUNCTION FLUSH`), or, where Redis has no functions,
    /// the script (`NOSCRIPT`: after a restart, a failover or `SCRIPT FLUSH`).
    pub script_reloads: u64,
    /// Permits taken from Redis in leases
    /// ([`RedisLimiterBuilder::lease`](super::RedisLimiterBuilder::lease)); the first
    /// permit of each went to the request that took the lease, counted in
    /// `redis_decisions`.
    pub leased_permits: u64,
    /// Permits of leases admitted locally, without a round trip (each request of cost 1 one
    /// decision).
    pub local_permits: u64,
    /// Permits of leases given back to Redis unused.
    pub returned_permits: u64,
    /// Keys this limiter moved to the policy it decides them under (its
    /// [resolver](super::RedisLimiterBuilder::resolver)'s answer, or a policy set
    /// [live](super::RedisLimiterBuilder::live_policy)), their state having been made under
    /// another.
    pub policy_moves: u64,
    /// Reads of the policy set live
    /// ([`live_policy`](super::RedisLimiterBuilder::live_policy)) that failed: this server
    /// kept the policy it had, and read again a second later.
    pub policy_read_failures: u64,
}

/// The live counters behind [`BackendStats`].
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) allowed: AtomicU64,
    pub(super) refused: AtomicU64,
    pub(super) redis_decisions: AtomicU64,
    pub(super) cached_refusals: AtomicU64,
    pub(super) failure_decisions: AtomicU64,
    pub(super) switches_to_failure: AtomicU64,
    pub(super) switches_to_redis: AtomicU64,
    pub(super) timeouts: AtomicU64,
    pub(super) unavailable: AtomicU64,
    pub(super) script_reloads: AtomicU64,
    pub(super) policy_moves: AtomicU64,
    pub(super) policy_read_failures: AtomicU64,
}

/// Adds one to a counter. Relaxed: counters are independent tallies; nothing is published
/// through them.
pub(super) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    pub(super) fn snapshot(&self) -> BackendStats {
        // Relaxed: see `bump`.
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        BackendStats {
            allowed: get(&self.allowed),
            refused: get(&self.refused),
            redis_decisions: get(&self.redis_decisions),
            cached_refusals: get(&self.cached_refusals),
            failure_decisions: get(&self.failure_decisions),
            switches_to_failure: get(&self.switches_to_failure),
            switches_to_redis: get(&self.switches_to_redis),
            timeouts: get(&self.timeouts),
            unavailable: get(&self.unavailable),
            script_reloads: get(&self.script_reloads),
            policy_moves: get(&self.policy_moves),
            policy_read_failures: get(&self.policy_read_failures),
            leased_permits: 0,
            local_permits: 0,
            returned_permits: 0,
        }
    }
}

/// Whether calls go to Redis or to the failure policy: a circuit breaker.
#[derive(Debug)]
pub(super) struct Breaker {
    /// `true` while the failure policy decides.
    failing: AtomicBool,
    /// Nanoseconds after `epoch` from which the next call probes Redis (while failing).
    next_probe: AtomicU64,
    epoch: Instant,
    probe_interval: Duration,
}

impl Breaker {
    pub(super) fn new(probe_interval: Duration) -> Self {
        Breaker {
            failing: AtomicBool::new(false),
            next_probe: AtomicU64::new(0),
            epoch: Instant::now(),
            probe_interval,
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn interval(&self) -> u64 {
        u64::try_from(self.probe_interval.as_nanos()).unwrap_or(u64::MAX)
    }

    pub(super) fn probe_interval(&self) -> Duration {
        self.probe_interval
    }

    /// `true` when this call should go to Redis: always while Redis is healthy, and for one
    /// call per probe interval while failing.
    pub(super) fn should_try(&self) -> bool {
        // Relaxed throughout: the breaker's words only steer traffic; a stale read sends one
        // call more or fewer to Redis, and every outcome is decided by Redis or the policy.
        if !self.failing.load(Ordering::Relaxed) {
            return true;
        }
        let now = self.now();
        let next = self.next_probe.load(Ordering::Relaxed);
        // One prober per interval: the call that moves the next probe forward.
        now >= next
            && self
                .next_probe
                .compare_exchange(
                    next,
                    now.saturating_add(self.interval()),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// Redis answered: `true` when this switches back from the failure policy.
    pub(super) fn succeeded(&self) -> bool {
        // Relaxed: see `should_try`; the swap makes exactly one caller see each switch.
        self.failing.load(Ordering::Relaxed) && self.failing.swap(false, Ordering::Relaxed)
    }

    /// Redis failed: `true` when this switches to the failure policy.
    pub(super) fn failed(&self) -> bool {
        // Relaxed: see `should_try`.
        self.next_probe.store(
            self.now().saturating_add(self.interval()),
            Ordering::Relaxed,
        );
        !self.failing.swap(true, Ordering::Relaxed)
    }

    /// `true` while the failure policy decides.
    pub(super) fn is_failing(&self) -> bool {
        // Relaxed: see `should_try`.
        self.failing.load(Ordering::Relaxed)
    }
}
