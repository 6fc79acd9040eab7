//! Reserve now, settle later on Redis: [`RedisLimiter::reserve_n`],
//! [`settle`](RedisLimiter::settle) and [`cancel`](RedisLimiter::cancel), each one script call.

use std::sync::atomic::Ordering;

use std::hash::BuildHasher;

use crate::reservation::{Origin, Reservation};

use super::failure::bump;
use super::script::{self, Ask};
use super::{conn, BackendError, RedisLimiter, NOT_IN_REDIS};

impl RedisLimiter {
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
        self.check_cost(n)?;
        // The origin first: its count of resets must not be newer than the state the
        // reservation is decided on.
        let origin = self.origin(key);
        // Relaxed: only uniqueness matters, and a read-modify-write gives every call its own.
        let serial = self.inner.reservations.fetch_add(1, Ordering::Relaxed) + 1;
        let ask = Ask::Reserve { cost: n, serial };
        let (decision, marks, _) = self.decide(key, ask).await?;
        Ok(Reservation::new(decision, n, marks, origin).with_token(serial))
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
        let inner = &*self.inner;
        let taken = r.take(self.origin(key))?;
        let (held, marks, serial) = (taken.held, taken.marks, taken.token);
        if marks == NOT_IN_REDIS || !taken.changes(actual) {
            return Ok(());
        }
        let ask = if actual < held {
            Ask::Refund {
                permits: held - actual,
                marks,
                serial,
            }
        } else {
            Ask::Charge {
                permits: (actual - held).min(script::MAX_CHARGE),
                marks,
                serial,
            }
        };
        let now_micros = self.test_micros()?;
        if !inner.breaker.should_try() {
            return Err(BackendError::Unavailable);
        }
        let refund = matches!(ask, Ask::Refund { .. });
        let mut args = inner.bands.args(now_micros, ask);
        let keys = inner
            .bands
            .call_keys(&inner.prefix, key, ask, &inner.instance, &mut args);
        // A refund is never sent twice: applied twice, it would give back more than was
        // held. A charge is resent once on a fresh connection, as a decision is: applied
        // twice it only refuses sooner, and dropped it would forgive a debt.
        let reply = inner
            .script
            .call(
                &keys,
                &args,
                &inner.counters.script_reloads,
                !refund,
                inner.timeout,
            )
            .await;
        if let Some(cache) = &inner.cache {
            if refund {
                // As for a reset: a refusal Redis made before the refund, still on its way,
                // must not be cached after it (see `DenyCache::forget`).
                cache.forget(key);
            } else {
                // A charge may lengthen a cached refusal, as an admission may.
                cache.remove(key);
            }
        }
        match reply {
            Ok(Ok(reply)) => {
                // `false`: a refund Redis did not apply, the reservation's token being gone
                // (settled already, or lost with the state: nothing of it to give back).
                let _applied = script::settled(&reply)?;
                self.recovered();
                Ok(())
            }
            Ok(Err(err)) => Err(self.settle_failed(BackendError::Redis(err))),
            Err(_) => Err(self.settle_failed(BackendError::Timeout(inner.timeout))),
        }
    }

    /// A settle (or a lease given back) failed with `err`: counted, but the limiter does not
    /// switch to its failure policy for it. A settle is often the first call after a long
    /// request, on a connection Redis dropped meanwhile, and says nothing the next decision
    /// will not find out for itself. Returns `err`.
    pub(super) fn settle_failed(&self, err: BackendError) -> BackendError {
        let inner = &*self.inner;
        match &err {
            BackendError::Redis(redis) if conn::is_unavailable(redis) => {
                bump(&inner.counters.unavailable);
            }
            // Redis answered: it is up, and the error is about this call.
            BackendError::Redis(_) => self.recovered(),
            BackendError::Timeout(_) => bump(&inner.counters.timeouts),
            _ => {}
        }
        err
    }

    /// The test clock's reading in microseconds (`None`: Redis `TIME` decides).
    pub(super) fn test_micros(&self) -> Result<Option<u64>, BackendError> {
        match &self.inner.test_clock {
            Some(clock) => Ok(Some(script::micros(clock.now())?)),
            None => Ok(None),
        }
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

    /// Where a reservation for `key` on this limiter comes from.
    fn origin(&self, key: &str) -> Origin {
        Origin {
            limiter: self.inner.id,
            key: self.inner.hasher.hash_one(key),
            // Acquire: pairs with the Release increment in `reset`, read before the
            // reservation is decided.
            rebuilds: self.inner.resets.load(Ordering::Acquire),
        }
    }
}
