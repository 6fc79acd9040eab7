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
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[must_use = "a Decision says whether the request may go ahead"]
pub struct Decision {
    remaining: u64,
    limit: u64,
    retry_after_nanos: u64,
    reset_after_nanos: u64,
    /// The `ALLOWED`, `OVERFLOW` and `SHADOW` bits and the band's position, in one whole
    /// word: five whole words leave no padding, which a copy of a `Decision` would move in
    /// pieces and a later whole-word load would read back past store forwarding (the
    /// measurement is in docs/BENCHMARKS.md).
    flags: u64,
}

impl Decision {
    /// Admitted: its permits were spent (or shadow mode let a refusal through).
    const ALLOWED: u64 = 1;
    /// Decided by a shared overflow state: the limiter was tracking its `max_keys`.
    const OVERFLOW: u64 = 2;
    /// Allowed only because the limiter is in shadow mode: the policy refused it.
    const SHADOW: u64 = 4;
    /// Where the position of the band that decided sits in `flags`.
    const BAND_SHIFT: u32 = 8;
    /// The position's bits (a policy has at most `Policy::MAX_BANDS` = 4 bands).
    const BAND_MASK: u64 = 0xff << Self::BAND_SHIFT;
    /// Where the position of the part of an `AllOf` that decided sits in `flags`.
    const PART_SHIFT: u32 = 16;
    /// The part's bits: up to 2^16 parts.
    const PART_MASK: u64 = 0xffff << Self::PART_SHIFT;

    /// The same decision, reported by band `band` of a composite policy (its position in
    /// `Policy::bands`): the band whose `remaining` and `limit` it carries.
    #[inline]
    pub(crate) const fn in_band(mut self, band: usize) -> Self {
        self.flags = (self.flags & !Self::BAND_MASK) | (((band as u64) & 0xff) << Self::BAND_SHIFT);
        self
    }

    /// The position in `Policy::bands` of the band whose `remaining` and `limit` this
    /// decision reports: 0 for a single-band policy. (Read by the HTTP middleware's fields,
    /// and shown by `Debug`.)
    #[inline]
    pub(crate) const fn band(&self) -> usize {
        ((self.flags & Self::BAND_MASK) >> Self::BAND_SHIFT) as usize
    }

    /// The same decision, reported by part `part` of an `AllOf` (its position among the
    /// parts, in the order they were added).
    #[inline]
    pub(crate) const fn in_part(mut self, part: usize) -> Self {
        self.flags =
            (self.flags & !Self::PART_MASK) | (((part as u64) & 0xffff) << Self::PART_SHIFT);
        self
    }

    /// The part of an [`AllOf`](crate::AllOf) that decided: the refusing part with the
    /// longest wait, or, when every part allowed, the one with the least left (its position
    /// among the parts, in the order they were added; the first of equals). 0 for a decision
    /// of one limiter.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{AllOf, DirectLimiter, FakeClock};
    ///
    /// let roomy = DirectLimiter::with_clock("100/s".parse()?, FakeClock::new());
    /// let tight = DirectLimiter::with_clock("2/s".parse()?, FakeClock::new());
    /// let decision = AllOf::new().direct(&roomy).direct(&tight).try_acquire();
    /// assert_eq!((decision.part(), decision.remaining()), (1, 1));
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[inline]
    #[must_use]
    pub const fn part(&self) -> usize {
        ((self.flags & Self::PART_MASK) >> Self::PART_SHIFT) as usize
    }

    /// The same decision, marked as made by the shared overflow state.
    #[inline]
    pub(crate) const fn overflowed(mut self) -> Self {
        self.flags |= Self::OVERFLOW;
        self
    }

    /// Shadow mode: a refusal is let through, marked as one.
    #[inline]
    pub(crate) const fn shadowed(mut self) -> Self {
        if self.flags & Self::ALLOWED == 0 {
            self.flags |= Self::ALLOWED | Self::SHADOW;
        }
        self
    }

    /// The permits that were available when this decision on a request of `cost` was made,
    /// before it: an admission's remaining plus the cost it took, a refusal's remaining (a
    /// refusal takes nothing, and its remaining already counts what is available). A
    /// refusal let through by shadow mode took nothing either.
    #[inline]
    pub(crate) const fn available_before(&self, cost: u64) -> u64 {
        if self.spent() {
            self.remaining.saturating_add(cost)
        } else {
            self.remaining
        }
    }

    /// Whether the request's permits were spent: admitted, and not a refusal that shadow mode
    /// let through (which spends nothing).
    #[inline]
    pub(crate) const fn spent(&self) -> bool {
        self.is_allowed() && !self.would_refuse()
    }

    /// The same decision with `remaining` replaced.
    #[inline]
    pub(crate) const fn with_remaining(mut self, remaining: u64) -> Self {
        self.remaining = remaining;
        self
    }

    /// The retry_after in nanoseconds.
    #[inline]
    pub(crate) const fn retry_after_nanos(&self) -> u64 {
        self.retry_after_nanos
    }

    /// The reset_after in nanoseconds.
    #[inline]
    pub(crate) const fn reset_after_nanos(&self) -> u64 {
        self.reset_after_nanos
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
            flags: Self::ALLOWED,
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
        self.flags & Self::ALLOWED != 0
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
        if self.is_allowed() {
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

/// Field by field, with the flags spelled out (`allowed`, `overflow`, `would_refuse`).
impl std::fmt::Debug for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decision")
            .field("allowed", &self.is_allowed())
            .field("remaining", &self.remaining)
            .field("limit", &self.limit)
            .field("retry_after_nanos", &self.retry_after_nanos)
            .field("reset_after_nanos", &self.reset_after_nanos)
            .field("overflow", &self.is_overflow())
            .field("would_refuse", &self.would_refuse())
            // Part of equality: two decisions of one composite policy that name different
            // bands differ, and the output says why.
            .field("band", &self.band())
            .field("part", &self.part())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::Decision;

    #[test]
    fn flags_are_independent_and_debug_names_them() {
        let allowed = Decision::allow(3, 5, 7);
        let denied = Decision::deny(0, 5, 11, 13);
        assert!(allowed.is_allowed() && !allowed.is_overflow() && !allowed.would_refuse());
        assert!(!denied.is_allowed() && !denied.would_refuse());

        let shadowed = denied.shadowed();
        assert!(shadowed.is_allowed() && shadowed.would_refuse() && !shadowed.is_overflow());
        // Shadow mode marks refusals only.
        assert!(!allowed.shadowed().would_refuse());
        let overflowed = shadowed.overflowed();
        assert!(overflowed.is_allowed() && overflowed.would_refuse() && overflowed.is_overflow());
        assert_eq!(overflowed.retry_after_nanos(), 11);

        assert_eq!(
            format!("{denied:?}"),
            "Decision { allowed: false, remaining: 0, limit: 5, retry_after_nanos: 11, \
             reset_after_nanos: 13, overflow: false, would_refuse: false, band: 0, part: 0 }"
        );
        assert_ne!(denied, denied.in_band(1), "the band is part of equality");
        assert!(format!("{:?}", denied.in_band(1)).ends_with("band: 1, part: 0 }"));
        assert_eq!(denied.in_band(1).in_part(300).part(), 300);
        assert_eq!(denied.in_part(300).in_band(1).band(), 1);
    }
}
