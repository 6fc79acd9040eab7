//! What a limiter enforces: [`Policy`] (an [`Algorithm`], a number of permits and a window),
//! validated once at construction.

mod parse;

use std::fmt;
use std::time::Duration;

use crate::clock::duration_to_nanos;
use crate::PolicyError;

/// Which algorithm decides.
///
/// | algorithm | state per key | guarantee |
/// |---|---|---|
/// | [`TokenBucket`](Algorithm::TokenBucket) (default) | one `u64` | burst of N, then N per window on average |
/// | [`SlidingLog`](Algorithm::SlidingLog) | N timestamps | at most N in any window, exactly |
/// | [`SlidingCounter`](Algorithm::SlidingCounter) | one packed word | at most about N in any window (weighted estimate) |
///
/// See `docs/ALGORITHMS.md` for when to choose which.
///
/// # Examples
///
/// ```
/// use tollgate::Algorithm;
///
/// assert_eq!(Algorithm::default(), Algorithm::TokenBucket);
/// assert_eq!("sliding-log".parse::<Algorithm>().unwrap(), Algorithm::SlidingLog);
/// assert_eq!(Algorithm::SlidingCounter.to_string(), "sliding-counter");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// The token bucket, computed as GCRA: a burst of up to N, refilled at one permit every
    /// `window / permits`.
    #[default]
    TokenBucket,
    /// The exact sliding window log: at most N admissions in any window `(now - W, now]`.
    SlidingLog,
    /// The sliding window counter: a weighted estimate from the previous and current fixed
    /// windows, O(1) state.
    SlidingCounter,
}

impl Algorithm {
    /// The name used in policy strings: `token-bucket`, `sliding-log` or `sliding-counter`.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(tollgate::Algorithm::TokenBucket.name(), "token-bucket");
    /// ```
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::TokenBucket => "token-bucket",
            Algorithm::SlidingLog => "sliding-log",
            Algorithm::SlidingCounter => "sliding-counter",
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A validated rate limit: `permits` per `window`, decided by one [`Algorithm`].
///
/// Build it with [`Policy::new`] or parse it from a string such as `"5/1s"`, `"100/min"`,
/// `"5 per 15m"`, `"token-bucket 5/1s"` or `"sliding-log 3/s"`. Units: `ns`, `us`, `ms`,
/// `s`/`sec`, `m`/`min`, `h`/`hour`, `d`/`day` (plurals and long names such as `minutes` too).
/// `Display` prints a string that parses back to the same policy.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Algorithm, Policy};
///
/// let built = Policy::new(Algorithm::TokenBucket, 5, Duration::from_secs(1))?;
/// let parsed: Policy = "5/1s".parse()?;
/// assert_eq!(built, parsed);
/// assert_eq!(parsed.to_string(), "token-bucket 5/1s");
/// assert_eq!(parsed.to_string().parse::<Policy>()?, parsed);
/// # Ok::<(), tollgate::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Policy {
    algorithm: Algorithm,
    permits: u64,
    window_nanos: u64,
}

impl Policy {
    /// The longest window a policy may have: 2^62 ns, about 146 years. Keeping every window
    /// below it leaves headroom so that no decision's arithmetic can overflow `u64`
    /// nanoseconds.
    pub const MAX_WINDOW: Duration = Duration::from_nanos(1 << 62);

    /// The most permits a [`SlidingLog`](Algorithm::SlidingLog) policy may have: the log
    /// keeps one 8-byte timestamp per permit for every key.
    pub const MAX_LOG_PERMITS: u64 = 1 << 16;

    /// The most permits a [`SlidingCounter`](Algorithm::SlidingCounter) policy may have:
    /// the counter packs each window's count into 32 bits of its one 128-bit word, and
    /// keeps the top bit clear so that no live state can look like a retired one.
    pub const MAX_COUNTER_PERMITS: u64 = (1 << 31) - 1;

    /// A policy of `permits` per `window` decided by `algorithm`.
    ///
    /// # Errors
    ///
    /// [`PolicyError::ZeroPermits`], [`PolicyError::ZeroWindow`],
    /// [`PolicyError::WindowTooLong`] past [`Policy::MAX_WINDOW`],
    /// [`PolicyError::IntervalTooShort`] when `window / permits` is below one nanosecond, and
    /// [`PolicyError::TooManyPermits`] for a sliding log above [`Policy::MAX_LOG_PERMITS`]
    /// or a sliding counter above [`Policy::MAX_COUNTER_PERMITS`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Algorithm, Policy, PolicyError};
    ///
    /// let p = Policy::new(Algorithm::SlidingLog, 5, Duration::from_secs(15 * 60))?;
    /// assert_eq!(p.permits(), 5);
    /// assert!(matches!(
    ///     Policy::new(Algorithm::TokenBucket, 5, Duration::ZERO),
    ///     Err(PolicyError::ZeroWindow)
    /// ));
    /// # Ok::<(), PolicyError>(())
    /// ```
    pub fn new(algorithm: Algorithm, permits: u64, window: Duration) -> Result<Self, PolicyError> {
        if permits == 0 {
            return Err(PolicyError::ZeroPermits);
        }
        if window.is_zero() {
            return Err(PolicyError::ZeroWindow);
        }
        if window > Self::MAX_WINDOW {
            return Err(PolicyError::WindowTooLong { window });
        }
        let window_nanos = duration_to_nanos(window);
        if window_nanos < permits {
            return Err(PolicyError::IntervalTooShort { permits, window });
        }
        let max_permits = match algorithm {
            Algorithm::TokenBucket => u64::MAX,
            Algorithm::SlidingLog => Self::MAX_LOG_PERMITS,
            Algorithm::SlidingCounter => Self::MAX_COUNTER_PERMITS,
        };
        if permits > max_permits {
            return Err(PolicyError::TooManyPermits {
                algorithm,
                permits,
                max: max_permits,
            });
        }
        Ok(Policy {
            algorithm,
            permits,
            window_nanos,
        })
    }

    /// The algorithm that decides.
    ///
    /// # Examples
    ///
    /// ```
    /// let p: tollgate::Policy = "sliding-counter 100/min".parse()?;
    /// assert_eq!(p.algorithm(), tollgate::Algorithm::SlidingCounter);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub const fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The permits per window (N): the burst size of a token bucket, the most admissions in
    /// any window for the windowed algorithms.
    ///
    /// # Examples
    ///
    /// ```
    /// let p: tollgate::Policy = "100/min".parse()?;
    /// assert_eq!(p.permits(), 100);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub const fn permits(&self) -> u64 {
        self.permits
    }

    /// The window (W).
    ///
    /// # Examples
    ///
    /// ```
    /// let p: tollgate::Policy = "5 per 15m".parse()?;
    /// assert_eq!(p.window(), std::time::Duration::from_secs(900));
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub const fn window(&self) -> Duration {
        Duration::from_nanos(self.window_nanos)
    }

    /// The window in nanoseconds.
    pub(crate) const fn window_nanos(&self) -> u64 {
        self.window_nanos
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(u64, &str); 7] = [
            (86_400_000_000_000, "d"),
            (3_600_000_000_000, "h"),
            (60_000_000_000, "m"),
            (1_000_000_000, "s"),
            (1_000_000, "ms"),
            (1_000, "us"),
            (1, "ns"),
        ];
        let w = self.window_nanos;
        // The last unit divides everything, so the search always succeeds.
        let (size, unit) = UNITS
            .iter()
            .copied()
            .find(|(size, _)| w.is_multiple_of(*size))
            .unwrap_or((1, "ns"));
        write!(
            f,
            "{} {}/{}{}",
            self.algorithm,
            self.permits,
            w / size,
            unit
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windowed_algorithms_cap_their_permits() {
        let window = Duration::from_secs(3600);
        for (algorithm, max) in [
            (Algorithm::SlidingLog, Policy::MAX_LOG_PERMITS),
            (Algorithm::SlidingCounter, Policy::MAX_COUNTER_PERMITS),
        ] {
            assert_eq!(Policy::new(algorithm, max, window).unwrap().permits(), max);
            let err = Policy::new(algorithm, max + 1, window).unwrap_err();
            assert_eq!(
                err,
                PolicyError::TooManyPermits {
                    algorithm,
                    permits: max + 1,
                    max,
                }
            );
            assert!(err.to_string().contains(&(max + 1).to_string()), "{err}");
        }
        let many = Policy::MAX_COUNTER_PERMITS + 1;
        assert!(Policy::new(Algorithm::TokenBucket, many, window).is_ok());
    }
}
