//! The answer to one request: [`Decision`].

use std::time::Duration;

/// Whether a request may go ahead, with everything an HTTP 429 and its rate-limit headers need.
///
/// | accessor | meaning |
/// |---|---|
/// | [`is_allowed`](Decision::is_allowed) | the request was admitted and its permits spent |
/// | [`remaining`](Decision::remaining) | permits that could be taken right now, after this decision |
/// | [`retry_after`](Decision::retry_after) | zero when allowed; otherwise the wait after which the same request would be allowed, if nothing else is admitted meanwhile |
/// | [`reset_after`](Decision::reset_after) | time until the key's state is at rest again (full bucket, empty window) |
/// | [`limit`](Decision::limit) | the policy's permits |
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tollgate::{DirectLimiter, FakeClock};
///
/// let limiter = DirectLimiter::with_clock("2/1s".parse()?, FakeClock::new());
/// let first = limiter.try_acquire();
/// assert!(first.is_allowed());
/// assert_eq!(first.remaining(), 1);
/// assert_eq!(first.limit(), 2);
/// limiter.try_acquire();
/// let third = limiter.try_acquire();
/// assert!(!third.is_allowed());
/// assert_eq!(third.retry_after(), Duration::from_millis(500));
/// assert_eq!(third.reset_after(), Duration::from_secs(1));
/// # Ok::<(), tollgate::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[must_use = "a Decision says whether the request may go ahead"]
pub struct Decision {
    remaining: u64,
    limit: u64,
    retry_after_nanos: u64,
    reset_after_nanos: u64,
    allowed: bool,
    /// `OVERFLOW` and `SHADOW` bits.
    flags: u8,
}

impl Decision {
    /// Decided by a shared overflow state: the limiter was tracking its `max_keys`.
    const OVERFLOW: u8 = 1;
    /// Allowed only because the limiter is in shadow mode: the policy refused it.
    const SHADOW: u8 = 2;

    /// The same decision, marked as made by the shared overflow state.
    #[inline]
    pub(crate) const fn overflowed(mut self) -> Self {
        self.flags |= Self::OVERFLOW;
        self
    }

    /// Shadow mode: a refusal is let through, marked as one.
    #[inline]
    pub(crate) const fn shadowed(mut self) -> Self {
        if !self.allowed {
            self.allowed = true;
            self.flags |= Self::SHADOW;
        }
        self
    }

    /// The retry_after in nanoseconds.
    #[inline]
    pub(crate) const fn retry_after_nanos(&self) -> u64 {
        self.retry_after_nanos
    }

    /// `true` when the limiter was already tracking its maximum number of keys
    /// (`RateLimiter::max_keys`) and this new key was decided by a state shared by all such
    /// keys (see `docs/ARCHITECTURE.md`, "Bounded memory").
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, RateLimiter};
    ///
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("3/min".parse()?, FakeClock::new()).max_keys(1);
    /// assert!(!limiter.try_acquire("alice").is_overflow());
    /// assert!(limiter.try_acquire("mallory-1").is_overflow());
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[inline]
    #[must_use]
    pub const fn is_overflow(&self) -> bool {
        self.flags & Self::OVERFLOW != 0
    }

    /// `true` when the policy refused the request but the limiter is in shadow mode
    /// (`RateLimiter::shadow`), so it was allowed anyway: [`is_allowed`](Decision::is_allowed)
    /// is `true`, and the other fields are those of the refusal.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, RateLimiter};
    ///
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("1/min".parse()?, FakeClock::new()).shadow();
    /// assert!(!limiter.try_acquire("alice").would_refuse());
    /// let second = limiter.try_acquire("alice");
    /// assert!(second.is_allowed() && second.would_refuse());
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[inline]
    #[must_use]
    pub const fn would_refuse(&self) -> bool {
        self.flags & Self::SHADOW != 0
    }
    /// An admission.
    #[inline]
    pub(crate) const fn allow(remaining: u64, limit: u64, reset_after_nanos: u64) -> Self {
        Decision {
            remaining,
            limit,
            retry_after_nanos: 0,
            reset_after_nanos,
            allowed: true,
            flags: 0,
        }
    }

    /// A refusal.
    #[inline]
    pub(crate) const fn deny(
        remaining: u64,
        limit: u64,
        retry_after_nanos: u64,
        reset_after_nanos: u64,
    ) -> Self {
        Decision {
            remaining,
            limit,
            retry_after_nanos,
            reset_after_nanos,
            allowed: false,
            flags: 0,
        }
    }

    /// `true` when the request was admitted (its permits are spent).
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = tollgate::DirectLimiter::with_clock("1/s".parse()?, tollgate::FakeClock::new());
    /// assert!(limiter.try_acquire().is_allowed());
    /// assert!(!limiter.try_acquire().is_allowed());
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[inline]
    #[must_use]
    pub const fn is_allowed(&self) -> bool {
        self.allowed
    }

    /// Permits a request could take right now, after this decision.
    ///
    /// For an admission this counts what is left after it; for a refusal it counts what is
    /// available now (which may be above zero when a request of cost n was refused because
    /// fewer than n were left).
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = tollgate::DirectLimiter::with_clock("3/s".parse()?, tollgate::FakeClock::new());
    /// assert_eq!(limiter.try_acquire().remaining(), 2);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[inline]
    #[must_use]
    pub const fn remaining(&self) -> u64 {
        self.remaining
    }

    /// Zero when allowed; otherwise how long until the same request would be allowed, if
    /// nothing else is admitted meanwhile. The value for a `Retry-After` header (round up).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let limiter = tollgate::DirectLimiter::with_clock("1/s".parse()?, tollgate::FakeClock::new());
    /// assert_eq!(limiter.try_acquire().retry_after(), Duration::ZERO);
    /// assert_eq!(limiter.try_acquire().retry_after(), Duration::from_secs(1));
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[inline]
    #[must_use]
    pub const fn retry_after(&self) -> Duration {
        Duration::from_nanos(self.retry_after_nanos)
    }

    /// Time until this key's state is at rest again after this decision: a full bucket or an
    /// empty window, the point from which an evicted state would decide the same.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let limiter = tollgate::DirectLimiter::with_clock("4/s".parse()?, tollgate::FakeClock::new());
    /// assert_eq!(limiter.try_acquire().reset_after(), Duration::from_millis(250));
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[inline]
    #[must_use]
    pub const fn reset_after(&self) -> Duration {
        Duration::from_nanos(self.reset_after_nanos)
    }

    /// [`retry_after`](Decision::retry_after) in whole seconds for an HTTP `Retry-After`
    /// header: rounded up, and at least 1 when the request was refused (a client told
    /// "retry after 0" retries at once and is refused again). 0 when allowed.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = tollgate::DirectLimiter::with_clock("5/s".parse()?, tollgate::FakeClock::new());
    /// let allowed = limiter.try_acquire_n(5)?;
    /// assert_eq!(allowed.retry_after_secs(), 0);
    /// let refused = limiter.try_acquire(); // retry after 200 ms
    /// assert_eq!(refused.retry_after_secs(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    #[must_use]
    pub const fn retry_after_secs(&self) -> u64 {
        if self.allowed {
            0
        } else {
            let secs = self.retry_after_nanos.div_ceil(1_000_000_000);
            if secs == 0 {
                1
            } else {
                secs
            }
        }
    }

    /// [`reset_after`](Decision::reset_after) in whole seconds, rounded up: the value of a
    /// `RateLimit-Reset` header.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = tollgate::DirectLimiter::with_clock("2/3s".parse()?, tollgate::FakeClock::new());
    /// assert_eq!(limiter.try_acquire().reset_after_secs(), 2); // 1.5 s
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[inline]
    #[must_use]
    pub const fn reset_after_secs(&self) -> u64 {
        self.reset_after_nanos.div_ceil(1_000_000_000)
    }

    /// The policy's permits (N).
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = tollgate::DirectLimiter::with_clock("4/s".parse()?, tollgate::FakeClock::new());
    /// assert_eq!(limiter.try_acquire().limit(), 4);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[inline]
    #[must_use]
    pub const fn limit(&self) -> u64 {
        self.limit
    }
}
