//! Waiting until a request is admitted, blocking or async, on the limiter's clock.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

use crate::clock::Clock;
use crate::decision::Decision;
use crate::wait::Wait;

use super::RateLimiter;

impl<K: Hash + Eq + Clone + 'static, C: Clock, S: BuildHasher + Clone + 'static>
    RateLimiter<K, C, S>
{
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
    /// ([`SystemClock`](crate::SystemClock) in production, [`TokioClock`](crate::TokioClock) in tests with paused
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
}
