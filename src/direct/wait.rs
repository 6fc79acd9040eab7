//! Waiting instead of refusing: `acquire` and its variants, each a loop of
//! [`wait`](crate::wait) over the limiter's own `try_acquire`.

use std::convert::Infallible;

use super::DirectLimiter;
use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::CostError;
use crate::wait::Wait;

impl<C: Clock> DirectLimiter<C> {
    /// Waits until a request of cost 1 is admitted, sleeping each refusal's `retry_after`
    /// (plus the clock's [`granularity`](Clock::granularity)) on the limiter's clock
    /// ([`Clock::sleep`]). See
    /// [`RateLimiter::acquire_blocking`](crate::RateLimiter::acquire_blocking).
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{Clock, DirectLimiter, FakeClock};
    ///
    /// let clock = FakeClock::new();
    /// let limiter = DirectLimiter::with_clock("5/1s".parse()?, clock.clone());
    /// for _ in 0..6 {
    ///     let _ = limiter.acquire_blocking();
    /// }
    /// assert_eq!(clock.now(), 200_000_000); // the sixth waited one interval
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn acquire_blocking(&self) -> Decision {
        match self.acquire_blocking_with(Wait::new()) {
            Ok(decision) | Err(decision) => decision,
        }
    }

    /// Like [`acquire_blocking`](DirectLimiter::acquire_blocking), with a timeout and jitter.
    ///
    /// # Errors
    ///
    /// The last refusal, as soon as admission cannot come before the timeout.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{DirectLimiter, FakeClock};
    /// use tollgate::wait::Wait;
    ///
    /// let limiter = DirectLimiter::with_clock("1/min".parse()?, FakeClock::new());
    /// let _ = limiter.try_acquire();
    /// assert!(limiter.acquire_blocking_with(Wait::new().timeout(Duration::from_secs(1))).is_err());
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn acquire_blocking_with(&self, wait: Wait) -> Result<Decision, Decision> {
        let Ok(waited) = crate::wait::block(&self.clock, &wait, || {
            Ok::<_, Infallible>(self.try_acquire())
        });
        waited
    }

    /// Waits asynchronously until a request of cost 1 is admitted (feature `tokio`); see
    /// [`RateLimiter::acquire`](crate::RateLimiter::acquire).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), tollgate::PolicyError> {
    /// let limiter = tollgate::DirectLimiter::with_clock("1/s".parse()?, tollgate::clock::TokioClock::new());
    /// assert!(limiter.acquire().await.is_allowed());
    /// assert!(limiter.acquire().await.is_allowed());
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn acquire(&self) -> Decision {
        match self.acquire_with(Wait::new()).await {
            Ok(decision) | Err(decision) => decision,
        }
    }

    /// The async twin of [`acquire_blocking_with`](DirectLimiter::acquire_blocking_with)
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
    /// let limiter = tollgate::DirectLimiter::with_clock("1/min".parse()?, tollgate::clock::TokioClock::new());
    /// let _ = limiter.try_acquire();
    /// assert!(limiter.acquire_with(tollgate::wait::Wait::new().timeout(Duration::from_secs(1))).await.is_err());
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn acquire_with(&self, wait: Wait) -> Result<Decision, Decision> {
        let Ok(waited) = crate::wait::wait_async(&self.clock, &wait, || async {
            Ok::<_, Infallible>(self.try_acquire())
        })
        .await;
        waited
    }

    /// Waits until a request of cost `n` is admitted, blocking the thread; see
    /// [`RateLimiter::acquire_n_blocking`](crate::RateLimiter::acquire_n_blocking).
    ///
    /// # Errors
    ///
    /// [`CostError`] at once for a cost the policy can never admit.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{Clock, DirectLimiter, FakeClock};
    ///
    /// let clock = FakeClock::new();
    /// let limiter = DirectLimiter::with_clock("4/1s".parse()?, clock.clone());
    /// assert!(limiter.acquire_n_blocking(4)?.is_allowed());
    /// assert!(limiter.acquire_n_blocking(2)?.is_allowed());
    /// assert_eq!(clock.now(), 500_000_000);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_n_blocking(&self, n: u64) -> Result<Decision, CostError> {
        Ok(match self.acquire_n_blocking_with(n, Wait::new())? {
            Ok(decision) | Err(decision) => decision,
        })
    }

    /// Like [`acquire_n_blocking`](DirectLimiter::acquire_n_blocking), with a timeout and
    /// jitter: the inner `Err` is the last refusal.
    ///
    /// # Errors
    ///
    /// [`CostError`] at once for a cost the policy can never admit.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{DirectLimiter, FakeClock};
    /// use tollgate::wait::Wait;
    ///
    /// let limiter = DirectLimiter::with_clock("2/min".parse()?, FakeClock::new());
    /// let wait = Wait::new().timeout(Duration::from_secs(1));
    /// assert!(limiter.acquire_n_blocking_with(2, wait)?.is_ok());
    /// assert!(limiter.acquire_n_blocking_with(1, wait)?.is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn acquire_n_blocking_with(
        &self,
        n: u64,
        wait: Wait,
    ) -> Result<Result<Decision, Decision>, CostError> {
        crate::wait::block(&self.clock, &wait, || self.try_acquire_n(n))
    }

    /// Waits asynchronously until a request of cost `n` is admitted (feature `tokio`); see
    /// [`RateLimiter::acquire_n`](crate::RateLimiter::acquire_n).
    ///
    /// # Errors
    ///
    /// [`CostError`] at once for a cost the policy can never admit.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = tollgate::DirectLimiter::with_clock("10/s".parse()?, tollgate::clock::TokioClock::new());
    /// assert!(limiter.acquire_n(10).await?.is_allowed());
    /// assert!(limiter.acquire_n(10).await?.is_allowed()); // a second later
    /// assert!(limiter.acquire_n(11).await.is_err());
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn acquire_n(&self, n: u64) -> Result<Decision, CostError> {
        Ok(match self.acquire_n_with(n, Wait::new()).await? {
            Ok(decision) | Err(decision) => decision,
        })
    }

    /// The async twin of [`acquire_n_blocking_with`](DirectLimiter::acquire_n_blocking_with)
    /// (feature `tokio`).
    ///
    /// # Errors
    ///
    /// [`CostError`] at once for a cost the policy can never admit.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// let limiter = tollgate::DirectLimiter::with_clock("2/min".parse()?, tollgate::clock::TokioClock::new());
    /// let wait = tollgate::wait::Wait::new().timeout(Duration::from_secs(1));
    /// assert!(limiter.acquire_n_with(2, wait).await?.is_ok());
    /// assert!(limiter.acquire_n_with(2, wait).await?.is_err());
    /// # Ok(())
    /// # }
    /// ```
    #[cfg(feature = "tokio")]
    pub async fn acquire_n_with(
        &self,
        n: u64,
        wait: Wait,
    ) -> Result<Result<Decision, Decision>, CostError> {
        crate::wait::wait_async(&self.clock, &wait, || async { self.try_acquire_n(n) }).await
    }
}
