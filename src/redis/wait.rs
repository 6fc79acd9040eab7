//! Waiting instead of refusing on Redis: `acquire` and its variants, each a loop of
//! [`wait`](crate::wait) over the limiter's own `try_acquire_n`, so that no caller writes a
//! try-and-sleep loop by hand.

use super::{BackendError, RedisLimiter};
use crate::clock::TokioClock;
use crate::decision::Decision;
use crate::wait::Wait;

impl RedisLimiter {
    /// Waits until a request of cost 1 for `key` is admitted: tries, and when refused sleeps
    /// the refusal's `retry_after` on tokio's timer and tries again. Every attempt is one
    /// [`try_acquire`](RedisLimiter::try_acquire), so waiters on every server share the
    /// key's one budget; a refusal spends nothing, so waiting is as exact as deciding. While
    /// Redis is down, a [`FailurePolicy::Closed`](super::FailurePolicy::Closed) refusal
    /// waits the failure policy's probe interval between attempts.
    ///
    /// # Errors
    ///
    /// As for [`try_acquire`](RedisLimiter::try_acquire): an error ends the wait at once.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tollgate::redis::BackendError> {
    /// let limiter = tollgate::redis::RedisLimiter::connect(
    ///     "redis://127.0.0.1:6379",
    ///     "1/s".parse().unwrap(),
    /// )
    /// .await?;
    /// limiter.acquire("upstream").await?;
    /// limiter.acquire("upstream").await?; // a second later, whichever server spent the first
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire(&self, key: &str) -> Result<Decision, BackendError> {
        self.acquire_n(key, 1).await
    }

    /// Like [`acquire`](RedisLimiter::acquire), with a timeout and jitter: the inner `Err`
    /// is the last refusal, as soon as admission cannot come before the timeout.
    ///
    /// # Errors
    ///
    /// As for [`try_acquire`](RedisLimiter::try_acquire).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tollgate::redis::BackendError> {
    /// use std::time::Duration;
    /// use tollgate::wait::Wait;
    ///
    /// let limiter = tollgate::redis::RedisLimiter::connect(
    ///     "redis://127.0.0.1:6379",
    ///     "1/min".parse().unwrap(),
    /// )
    /// .await?;
    /// let wait = Wait::new().timeout(Duration::from_secs(2));
    /// assert!(limiter.acquire_with("report", wait).await?.is_ok());
    /// assert!(limiter.acquire_with("report", wait).await?.is_err()); // a minute away
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire_with(
        &self,
        key: &str,
        wait: Wait,
    ) -> Result<Result<Decision, Decision>, BackendError> {
        self.acquire_n_with(key, 1, wait).await
    }

    /// Waits until a request of cost `n` for `key` is admitted: all `n` permits at once,
    /// never one by one.
    ///
    /// # Errors
    ///
    /// [`BackendError::Cost`] at once (nothing sent) for a cost the policy can never admit;
    /// otherwise as for [`try_acquire`](RedisLimiter::try_acquire).
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
    /// limiter.acquire_n("tokens", 700).await?;
    /// limiter.acquire_n("tokens", 700).await?; // when 700 are back
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire_n(&self, key: &str, n: u64) -> Result<Decision, BackendError> {
        Ok(match self.acquire_n_with(key, n, Wait::new()).await? {
            Ok(decision) | Err(decision) => decision,
        })
    }

    /// Like [`acquire_n`](RedisLimiter::acquire_n), with a timeout and jitter: the inner
    /// `Err` is the last refusal.
    ///
    /// # Errors
    ///
    /// As for [`acquire_n`](RedisLimiter::acquire_n).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tollgate::redis::BackendError> {
    /// use std::time::Duration;
    /// use tollgate::wait::Wait;
    ///
    /// let limiter = tollgate::redis::RedisLimiter::connect(
    ///     "redis://127.0.0.1:6379",
    ///     "10/s".parse().unwrap(),
    /// )
    /// .await?;
    /// let wait = Wait::new().timeout(Duration::from_millis(500)).jitter(Duration::from_millis(5));
    /// assert!(limiter.acquire_n_with("batch", 10, wait).await?.is_ok());
    /// assert!(limiter.acquire_n_with("batch", 10, wait).await?.is_err()); // 1 s away
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire_n_with(
        &self,
        key: &str,
        n: u64,
        wait: Wait,
    ) -> Result<Result<Decision, Decision>, BackendError> {
        // The schedule's deadline runs on tokio's time, the time its sleeps take; a refusal's
        // `retry_after` is a length, the same on Redis's clock.
        crate::wait::wait_async(&TokioClock::new(), &wait, || self.try_acquire_n(key, n)).await
    }
}
