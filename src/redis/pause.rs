//! A pause every instance sees: an upstream said to stop sending for a while (a `429` with
//! `Retry-After`), and every process calling it through this Redis should hear it. Used by
//! the client throttle (`tollgate::client`); decisions of `try_acquire` do not read it.

use std::time::Duration;

use super::conn::is_unavailable;
use super::script::Bands;
use super::{BackendError, RedisLimiter};

/// Sets the pause's expiry to `ARGV[1]` ms unless it already ends later.
const LENGTHEN: &str = "local left = redis.call('PTTL', KEYS[1]) \
    if left < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], '1', 'PX', ARGV[1]) end \
    return 0";

/// The longest pause Redis is asked to keep, in ms: about 10,000 years. A longer one (a
/// `Duration::MAX` meant as "until told otherwise") counts as this: Redis refuses an expiry
/// whose date passes a signed 64-bit count of milliseconds.
const MAX_PAUSE_MILLIS: u64 = 10_000 * 365 * 24 * 3_600 * 1_000;

impl RedisLimiter {
    /// Pauses `key` for every instance on this Redis and prefix for `pause` from now (at
    /// least 1 ms, at most about 10,000 years: a longer one counts as that); a pause that
    /// already ends later is kept. One script call.
    ///
    /// # Errors
    ///
    /// [`BackendError::Timeout`] or [`BackendError::Redis`] when Redis does not take it;
    /// [`BackendError::Unavailable`] at once while the failure policy decides.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tollgate::redis::BackendError> {
    /// use std::time::Duration;
    /// let limiter = tollgate::redis::RedisLimiter::connect(
    ///     "redis://127.0.0.1:6379",
    ///     "20/1s".parse().unwrap(),
    /// )
    /// .await?;
    /// limiter.pause("api.example.com", Duration::from_secs(30)).await?;
    /// assert!(limiter.paused("api.example.com").await?.is_some());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn pause(&self, key: &str, pause: Duration) -> Result<(), BackendError> {
        let millis = u64::try_from(pause.as_millis())
            .unwrap_or(u64::MAX)
            .clamp(1, MAX_PAUSE_MILLIS);
        let mut eval = ::redis::cmd("EVAL");
        eval.arg(LENGTHEN)
            .arg(1)
            .arg(Bands::pause_key(&self.shared.prefix, key))
            .arg(millis);
        self.query(&eval).await.map(drop)
    }

    /// How much longer `key` is paused, if it is (see [`pause`](RedisLimiter::pause)).
    ///
    /// # Errors
    ///
    /// [`BackendError::Timeout`] or [`BackendError::Redis`] when Redis does not answer (and
    /// the limiter switches to its failure policy, as a decision would);
    /// [`BackendError::Unavailable`] at once, with nothing sent, while it is there.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tollgate::redis::BackendError> {
    /// let limiter = tollgate::redis::RedisLimiter::connect(
    ///     "redis://127.0.0.1:6379",
    ///     "20/1s".parse().unwrap(),
    /// )
    /// .await?;
    /// assert_eq!(limiter.paused("never-paused").await?, None);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn paused(&self, key: &str) -> Result<Option<Duration>, BackendError> {
        let mut pttl = ::redis::cmd("PTTL");
        pttl.arg(Bands::pause_key(&self.shared.prefix, key));
        match self.query(&pttl).await? {
            // -2: no pause; -1 cannot happen (every pause expires), and would mean none.
            ::redis::Value::Int(left) if left > 0 => {
                Ok(Some(Duration::from_millis(left.unsigned_abs())))
            }
            ::redis::Value::Int(_) => Ok(None),
            other => Err(BackendError::Reply(format!("PTTL: {other:?}"))),
        }
    }

    /// `cmd` sent to Redis, within the timeout, unless a recent failure makes calls skip
    /// Redis; a Redis that cannot be reached switches the limiter to its failure policy, as
    /// a decision would.
    async fn query(&self, cmd: &::redis::Cmd) -> Result<::redis::Value, BackendError> {
        let shared = &self.shared;
        if shared.breaker.is_failing() {
            return Err(BackendError::Unavailable);
        }
        match tokio::time::timeout(shared.timeout, shared.script.conn().query(cmd)).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(err)) if is_unavailable(&err) => {
                let err = BackendError::Redis(err);
                shared.switch_to_failure(&err);
                Err(err)
            }
            Ok(Err(err)) => Err(BackendError::Redis(err)),
            Err(_) => {
                let err = BackendError::Timeout(shared.timeout);
                shared.switch_to_failure(&err);
                Err(err)
            }
        }
    }
}
