//! [`Budget`]: the limiter a [`Throttle`](super::Throttle) takes its permits from, in
//! process (keyed or direct) or on Redis.

use std::fmt;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Duration;

use super::error::ThrottleError;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::direct::DirectLimiter;
use crate::error::CostError;
use crate::keyed::RateLimiter;
use crate::policy::Policy;
use crate::reservation::{Reservation, SettleError};

/// An in-process limiter as the throttle sees it: keyed by the call's key, or one budget
/// for every key.
trait Local: Send + Sync {
    /// What a request of `cost` for `key` would get now, changing nothing: its error is the
    /// one `try_acquire_n` would return for that cost.
    fn peek_n(&self, key: &str, cost: u64) -> Result<Decision, CostError>;
    fn try_acquire_n(&self, key: &str, cost: u64) -> Result<Decision, CostError>;
    fn reserve_n(&self, key: &str, cost: u64) -> Result<Reservation, CostError>;
    fn settle(&self, key: &str, reservation: Reservation, actual: u64) -> Result<(), SettleError>;
    fn policy(&self) -> Option<Policy>;
}

impl<C, S> Local for RateLimiter<String, C, S>
where
    C: Clock + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    fn peek_n(&self, key: &str, cost: u64) -> Result<Decision, CostError> {
        RateLimiter::peek_n(self, key, cost)
    }

    fn try_acquire_n(&self, key: &str, cost: u64) -> Result<Decision, CostError> {
        RateLimiter::try_acquire_n(self, key, cost)
    }

    fn reserve_n(&self, key: &str, cost: u64) -> Result<Reservation, CostError> {
        RateLimiter::reserve_n(self, key, cost)
    }

    fn settle(&self, key: &str, reservation: Reservation, actual: u64) -> Result<(), SettleError> {
        RateLimiter::settle(self, key, reservation, actual)
    }

    fn policy(&self) -> Option<Policy> {
        RateLimiter::policy(self)
    }
}

impl<C: Clock + 'static> Local for DirectLimiter<C> {
    fn peek_n(&self, _: &str, cost: u64) -> Result<Decision, CostError> {
        DirectLimiter::peek_n(self, cost)
    }

    fn try_acquire_n(&self, _: &str, cost: u64) -> Result<Decision, CostError> {
        DirectLimiter::try_acquire_n(self, cost)
    }

    fn reserve_n(&self, _: &str, cost: u64) -> Result<Reservation, CostError> {
        DirectLimiter::reserve_n(self, cost)
    }

    fn settle(&self, _: &str, reservation: Reservation, actual: u64) -> Result<(), SettleError> {
        DirectLimiter::settle(self, reservation, actual)
    }

    fn policy(&self) -> Option<Policy> {
        Some(DirectLimiter::policy(self))
    }
}

/// What a [`Throttle`](super::Throttle) takes permits from, converted from
///
/// * a `RateLimiter<String, C, S>` or an `Arc` of one: one budget per key (per upstream
///   host by default), in this process;
/// * a `DirectLimiter<C>` or an `Arc` of one: one budget for every call, whatever its key
///   (one provider's account-wide quota);
/// * with feature `redis`, a [`RedisLimiter`](crate::redis::RedisLimiter): one budget per
///   key shared by every process that uses the same Redis and prefix. With leases
///   ([`RedisLimiterBuilder::lease`](crate::redis::RedisLimiterBuilder::lease)) each
///   process takes permits in batches, for throughput. A pause one process learns from a
///   `429` is written to Redis ([`RedisLimiter::pause`](crate::redis::RedisLimiter::pause))
///   and every process's throttle reads it before each call (one more round trip per
///   call, [`RedisLimiter::paused`](crate::redis::RedisLimiter::paused)).
///
/// The throttle sleeps on tokio's timer for the `retry_after` the limiter's refusals name, so
/// the limiter's clock must move with tokio's time: the default `SystemClock` does while
/// time runs; under tokio's paused time (tests) only
/// [`TokioClock`](crate::clock::TokioClock) does. A `FakeClock` that nobody advances never
/// lets a waiter through: give such a throttle a [`max_wait`](super::Throttle::max_wait).
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use tollgate::client::Budget;
/// use tollgate::{DirectLimiter, RateLimiter};
///
/// let per_host: Arc<RateLimiter<String>> = Arc::new(RateLimiter::new("20/1s".parse()?));
/// let one = Budget::from(Arc::clone(&per_host));
/// let account = Budget::from(DirectLimiter::new("sliding-log 500/min".parse()?));
/// # let _ = (one, account);
/// # Ok::<(), tollgate::PolicyError>(())
/// ```
#[derive(Clone)]
pub struct Budget(Source);

#[derive(Clone)]
enum Source {
    Local(Arc<dyn Local>),
    #[cfg(feature = "redis")]
    Redis(crate::redis::RedisLimiter),
}

/// A permit taken for a call: its decision, and its reservation when the call's cost is
/// settled from the answer.
pub(super) struct Taken {
    pub(super) decision: Decision,
    pub(super) reservation: Option<Reservation>,
}

impl Budget {
    /// Whether the budget's policy for `key` can ever admit `cost`, by the limiter's own
    /// check (the one [`take`](Budget::take) meets), before any wait: a cost it can never
    /// admit is an error at once, not after a pause or a queue. A cost of 1 is within every
    /// policy (each has a permit at least), and is not asked about.
    pub(super) async fn check_cost(&self, key: &str, cost: u64) -> Result<(), ThrottleError> {
        if cost == 1 {
            return Ok(());
        }
        match &self.0 {
            Source::Local(limiter) => {
                limiter
                    .peek_n(key, cost)
                    .map(drop)
                    .map_err(|source| ThrottleError::Cost {
                        key: key.to_owned(),
                        source,
                    })
            }
            #[cfg(feature = "redis")]
            Source::Redis(limiter) => limiter
                .check_cost(key, cost)
                .await
                .map_err(|source| redis_error(key, source)),
        }
    }

    /// Takes `cost` permits for `key` now, or refuses; `reserve` keeps a reservation to
    /// settle later.
    pub(super) async fn take(
        &self,
        key: &str,
        cost: u64,
        reserve: bool,
    ) -> Result<Taken, ThrottleError> {
        let cost_error = |source| ThrottleError::Cost {
            key: key.to_owned(),
            source,
        };
        match &self.0 {
            Source::Local(limiter) if reserve => {
                let reservation = limiter.reserve_n(key, cost).map_err(cost_error)?;
                Ok(Taken {
                    decision: reservation.decision(),
                    reservation: Some(reservation),
                })
            }
            Source::Local(limiter) => Ok(Taken {
                decision: limiter.try_acquire_n(key, cost).map_err(cost_error)?,
                reservation: None,
            }),
            #[cfg(feature = "redis")]
            Source::Redis(limiter) => redis_take(limiter, key, cost, reserve).await,
        }
    }

    /// Settles a reservation made by [`take`](Budget::take) at `actual`. A reservation the
    /// limiter no longer recognises (a policy change or a reset came in between) is settled
    /// as the limiter's own `settle` decides: nothing is given back to a state that never
    /// held it.
    pub(super) async fn settle(
        &self,
        key: &str,
        reservation: Reservation,
        actual: u64,
    ) -> Result<(), ThrottleError> {
        match &self.0 {
            Source::Local(limiter) => {
                // The throttle settles only admitted reservations, on the key and the limiter
                // that made them: no case of `SettleError` can arise.
                let _ = limiter.settle(key, reservation, actual);
                Ok(())
            }
            #[cfg(feature = "redis")]
            Source::Redis(limiter) => {
                // A reservation that holds nothing (a refusal a limiter in shadow mode let
                // through) has nothing to settle, as in process.
                if reservation.held() == 0 {
                    return Ok(());
                }
                limiter
                    .settle(key, reservation, actual)
                    .await
                    .map_err(|source| ThrottleError::Backend {
                        key: key.to_owned(),
                        source,
                    })
            }
        }
    }

    /// How much longer another process paused `key` (a Redis budget's shared pause); always
    /// `None` in process, where the throttle's own lanes hold every pause, and while Redis
    /// cannot be read.
    #[cfg_attr(not(feature = "redis"), allow(unused_variables))]
    pub(super) async fn paused(&self, key: &str) -> Option<Duration> {
        match &self.0 {
            Source::Local(_) => None,
            #[cfg(feature = "redis")]
            // A pause that cannot be read is no reason to stop: the decision that follows
            // goes to Redis or, while it is down, to the limiter's failure policy.
            Source::Redis(limiter) => limiter.paused(key).await.ok().flatten(),
        }
    }

    /// Tells every process sharing a Redis budget that `key` is paused for `pause`: written
    /// in the background, so that the answer that brought it is not held up; a failure is
    /// logged (each process still learns the pause from its own answers). Nothing to do in
    /// process.
    #[cfg_attr(not(feature = "redis"), allow(unused_variables))]
    pub(super) fn share_pause(&self, key: &str, pause: Duration) {
        match &self.0 {
            Source::Local(_) => {}
            #[cfg(feature = "redis")]
            Source::Redis(limiter) => {
                let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                    log::warn!("tollgate: a pause for `{key}` was not shared: no tokio runtime");
                    return;
                };
                let (limiter, key) = (limiter.clone(), key.to_owned());
                runtime.spawn(async move {
                    if let Err(err) = limiter.pause(&key, pause).await {
                        log::warn!("tollgate: a pause for `{key}` was not shared: {err}");
                    }
                });
            }
        }
    }

    /// The policy the budget enforces now, if it has one for every key.
    pub(super) fn policy(&self) -> Option<Policy> {
        match &self.0 {
            Source::Local(limiter) => limiter.policy(),
            #[cfg(feature = "redis")]
            Source::Redis(limiter) => limiter.uniform_policy(),
        }
    }
}

/// Takes `cost` permits for `key` from a Redis budget.
///
/// From a lease, as the limiter's own `try_acquire_n` does: a lease being replaced when the
/// caller is dropped keeps its permits for the next call. Otherwise in a reservation made by
/// a task of its own, so that a caller dropped during the round trip does not lose the
/// permit: the task gives back a reservation nobody took. A reservation taken for a call
/// whose cost is not settled stays in Redis until it expires, as any unsettled one does.
#[cfg(feature = "redis")]
async fn redis_take(
    limiter: &crate::redis::RedisLimiter,
    key: &str,
    cost: u64,
    reserve: bool,
) -> Result<Taken, ThrottleError> {
    use crate::redis::BackendError;

    let backend = |source| redis_error(key, source);
    if limiter.is_leasing() && !reserve {
        return Ok(Taken {
            decision: limiter.try_acquire_n(key, cost).await.map_err(backend)?,
            reservation: None,
        });
    }
    let (sender, receiver) = tokio::sync::oneshot::channel();
    let (task_limiter, task_key) = (limiter.clone(), key.to_owned());
    tokio::spawn(async move {
        let reserved = task_limiter.reserve_n(&task_key, cost).await;
        let held = reserved.map(|reservation| Unclaimed {
            limiter: task_limiter,
            key: task_key,
            reservation: Some(reservation),
        });
        // A caller that has left drops what is sent (now, or in the channel if it leaves
        // before reading it): `Unclaimed` gives the permit back then.
        let _ = sender.send(held);
    });
    // The task ends only by sending, unless it panicked.
    let reserved = receiver
        .await
        .map_err(|_| backend(BackendError::Unavailable))?;
    let reservation = reserved
        .map_err(backend)?
        .claim()
        .ok_or_else(|| backend(BackendError::Unavailable))?;
    Ok(Taken {
        decision: reservation.decision(),
        reservation: reserve.then_some(reservation),
    })
}

/// What a Redis budget's error for `key` means to the throttle: a cost its policy can never
/// admit, or a failing backend.
#[cfg(feature = "redis")]
fn redis_error(key: &str, source: crate::redis::BackendError) -> ThrottleError {
    match source {
        crate::redis::BackendError::Cost(source) => ThrottleError::Cost {
            key: key.to_owned(),
            source,
        },
        source => ThrottleError::Backend {
            key: key.to_owned(),
            source,
        },
    }
}

/// A reservation made for a caller that has not taken it yet: dropped unclaimed, it is
/// given back (cancelled) in a task of its own.
#[cfg(feature = "redis")]
struct Unclaimed {
    limiter: crate::redis::RedisLimiter,
    key: String,
    reservation: Option<Reservation>,
}

#[cfg(feature = "redis")]
impl Unclaimed {
    /// The reservation, taken by its caller: no longer given back on drop. (`None` cannot
    /// happen: only a claim takes it, and a claim consumes the value.)
    fn claim(mut self) -> Option<Reservation> {
        self.reservation.take()
    }
}

#[cfg(feature = "redis")]
impl Drop for Unclaimed {
    fn drop(&mut self) {
        let Some(reservation) = self.reservation.take() else {
            return;
        };
        // Nothing to give back: refused, or let through by shadow mode holding nothing.
        if reservation.held() == 0 {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (limiter, key) = (self.limiter.clone(), std::mem::take(&mut self.key));
        runtime.spawn(async move {
            if let Err(err) = limiter.cancel(&key, reservation).await {
                log::warn!(
                    "tollgate: a permit for `{key}` whose caller left was not given back: {err}"
                );
            }
        });
    }
}

impl<C, S> From<RateLimiter<String, C, S>> for Budget
where
    C: Clock + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    fn from(limiter: RateLimiter<String, C, S>) -> Self {
        Budget::from(Arc::new(limiter))
    }
}

impl<C, S> From<Arc<RateLimiter<String, C, S>>> for Budget
where
    C: Clock + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    fn from(limiter: Arc<RateLimiter<String, C, S>>) -> Self {
        Budget(Source::Local(limiter))
    }
}

impl<C: Clock + 'static> From<DirectLimiter<C>> for Budget {
    fn from(limiter: DirectLimiter<C>) -> Self {
        Budget::from(Arc::new(limiter))
    }
}

impl<C: Clock + 'static> From<Arc<DirectLimiter<C>>> for Budget {
    fn from(limiter: Arc<DirectLimiter<C>>) -> Self {
        Budget(Source::Local(limiter))
    }
}

#[cfg(feature = "redis")]
impl From<crate::redis::RedisLimiter> for Budget {
    fn from(limiter: crate::redis::RedisLimiter) -> Self {
        Budget(Source::Redis(limiter))
    }
}

impl fmt::Debug for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Source::Local(limiter) => f
                .debug_struct("Budget::Local")
                .field("policy", &limiter.policy())
                .finish(),
            #[cfg(feature = "redis")]
            Source::Redis(limiter) => f.debug_tuple("Budget::Redis").field(limiter).finish(),
        }
    }
}
