//! Waiting instead of refusing: `acquire` and its variants, each a loop of
//! [`wait`](crate::wait) over the limiter's own `try_acquire`.

use std::borrow::Borrow;
use std::convert::Infallible;
use std::hash::{BuildHasher, Hash};

use super::RateLimiter;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::CostError;
use crate::wait::Wait;

impl<K: Hash + Eq + Clone + 'static, C: Clock, S: BuildHasher + Clone + 'static>
    RateLimiter<K, C, S>
{
    /// Waits until a request of cost 1 for `key` is admitted: tries, and when refused sleeps
    /// its `retry_after` (plus the clock's [`granularity`](Clock::granularity)) on the
    /// limiter's clock ([`Clock::sleep`]) and tries again. For a
    /// client that must not exceed a provider's quota. Blocks the thread: in async code use
    /// `acquire` (feature `tokio`). Only a clock at the end of its range, where no admission
    /// can come, makes it return a refusal (see [`wait`](crate::wait)).
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
    /// use tollgate::{FakeClock, RateLimiter};
    /// use tollgate::wait::Wait;
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
        let Ok(waited) = crate::wait::block(self.clock(), &wait, || {
            Ok::<_, Infallible>(self.try_acquire(key))
        });
        waited
    }

    /// Waits asynchronously until a request of cost 1 for `key` is admitted (feature
    /// `tokio`): the async twin of [`acquire_blocking`](RateLimiter::acquire_blocking),
    /// sleeping with tokio's timer. Give the limiter a clock that follows tokio's time
    /// ([`SystemClock`](crate::SystemClock) in production, [`TokioClock`](crate::clock::TokioClock) in tests with paused
    /// time).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), tollgate::PolicyError> {
    /// use tollgate::RateLimiter;
    /// use tollgate::clock::TokioClock;
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
    /// use tollgate::RateLimiter;
    /// use tollgate::clock::TokioClock;
    /// use tollgate::wait::Wait;
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
        let Ok(waited) = crate::wait::wait_async(self.clock(), &wait, || async {
            Ok::<_, Infallible>(self.try_acquire(key))
        })
        .await;
        waited
    }

    /// Waits until a request of cost `n` for `key` is admitted, blocking the thread: the
    /// cost-`n` twin of [`acquire_blocking`](RateLimiter::acquire_blocking). A request of
    /// cost `n` waits until all `n` permits are there at once; it never takes them one by one.
    ///
    /// # Errors
    ///
    /// [`CostError`] at once, before any wait, for a cost the policy can never admit (0, or
    /// more than its smallest band's permits), and if the policy is replaced by one that
    /// cannot admit it while it waits.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{Clock, FakeClock, RateLimiter};
    ///
    /// let clock = FakeClock::new();
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("4/1s".parse()?, clock.clone());
    /// assert!(limiter.acquire_n_blocking("export", 3)?.is_allowed());
    /// assert!(limiter.acquire_n_blocking("export", 3)?.is_allowed()); // waited for 2 more
    /// assert_eq!(clock.now(), 500_000_000);
    /// assert!(limiter.acquire_n_blocking("export", 5).is_err()); // never admissible
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_n_blocking<Q>(&self, key: &Q, n: u64) -> Result<Decision, CostError>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        Ok(match self.acquire_n_blocking_with(key, n, Wait::new())? {
            Ok(decision) | Err(decision) => decision,
        })
    }

    /// Like [`acquire_n_blocking`](RateLimiter::acquire_n_blocking), with a timeout and
    /// jitter: the inner `Err` is the last refusal, as soon as admission cannot come before
    /// the timeout.
    ///
    /// # Errors
    ///
    /// As for [`acquire_n_blocking`](RateLimiter::acquire_n_blocking).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{FakeClock, RateLimiter};
    /// use tollgate::wait::Wait;
    ///
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("4/min".parse()?, FakeClock::new());
    /// let wait = Wait::new().timeout(Duration::from_secs(5));
    /// assert!(limiter.acquire_n_blocking_with("a", 4, wait)?.is_ok());
    /// assert!(limiter.acquire_n_blocking_with("a", 1, wait)?.is_err()); // 15 s away
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_n_blocking_with<Q>(
        &self,
        key: &Q,
        n: u64,
        wait: Wait,
    ) -> Result<Result<Decision, Decision>, CostError>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        crate::wait::block(self.clock(), &wait, || self.try_acquire_n(key, n))
    }

    /// Waits asynchronously until a request of cost `n` for `key` is admitted (feature
    /// `tokio`): the async twin of [`acquire_n_blocking`](RateLimiter::acquire_n_blocking).
    ///
    /// # Errors
    ///
    /// As for [`acquire_n_blocking`](RateLimiter::acquire_n_blocking).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use tollgate::RateLimiter;
    /// use tollgate::clock::TokioClock;
    ///
    /// let limiter: RateLimiter<String, TokioClock> =
    ///     RateLimiter::with_clock("10/s".parse()?, TokioClock::new());
    /// assert!(limiter.acquire_n("tokens", 10).await?.is_allowed());
    /// assert!(limiter.acquire_n("tokens", 5).await?.is_allowed()); // half a second later
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn acquire_n<Q>(&self, key: &Q, n: u64) -> Result<Decision, CostError>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        Ok(match self.acquire_n_with(key, n, Wait::new()).await? {
            Ok(decision) | Err(decision) => decision,
        })
    }

    /// The async twin of [`acquire_n_blocking_with`](RateLimiter::acquire_n_blocking_with)
    /// (feature `tokio`).
    ///
    /// # Errors
    ///
    /// As for [`acquire_n_blocking`](RateLimiter::acquire_n_blocking).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use tollgate::RateLimiter;
    /// use tollgate::clock::TokioClock;
    /// use tollgate::wait::Wait;
    ///
    /// let limiter: RateLimiter<String, TokioClock> =
    ///     RateLimiter::with_clock("2/min".parse()?, TokioClock::new());
    /// let wait = Wait::new().timeout(Duration::from_secs(1));
    /// assert!(limiter.acquire_n_with("a", 2, wait).await?.is_ok());
    /// assert!(limiter.acquire_n_with("a", 2, wait).await?.is_err());
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn acquire_n_with<Q>(
        &self,
        key: &Q,
        n: u64,
        wait: Wait,
    ) -> Result<Result<Decision, Decision>, CostError>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        crate::wait::wait_async(self.clock(), &wait, || async { self.try_acquire_n(key, n) }).await
    }
}
