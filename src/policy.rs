//! What a limiter enforces: [`Policy`], one or more [`Band`]s (an [`Algorithm`], a number of
//! permits and a window), validated once at construction, and [`PolicyError`] for one that
//! cannot be built, naming the field and the value. A policy is usually written as a string
//! (in code or a config file) and parsed; it prints back as a string that parses to it.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::policy::{Algorithm, Policy, PolicyError};
//!
//! let api: Policy = "10/s & 1000/day".parse()?; // two bands, decided all or nothing
//! assert_eq!(api.bands().count(), 2);
//! let login = Policy::new(Algorithm::SlidingLog, 5, Duration::from_secs(15 * 60))?;
//! assert_eq!(login.to_string(), "sliding-log 5/15m");
//! assert_eq!("0/s".parse::<Policy>(), Err(PolicyError::ZeroPermits));
//! # Ok::<(), PolicyError>(())
//! ```

mod parse;
#[cfg(feature = "serde")]
mod serialize;

use std::fmt;
use std::time::Duration;

use crate::clock::duration_to_nanos;

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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
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

/// A validated rate limit: `permits` per `window`, decided by one [`Algorithm`], or several
/// such limits ([`Band`]s) that must all allow a request.
///
/// Build it with [`Policy::new`] or parse it from a string such as `"5/1s"`, `"100/min"`,
/// `"5 per 15m"`, `"token-bucket 5/1s"` or `"sliding-log 3/s"`. Units: `ns`, `us`, `ms`,
/// `s`/`sec`, `m`/`min`, `h`/`hour`, `d`/`day` (plurals and long names such as `minutes` too).
/// Combine limits with [`Policy::and`] or `&` in a string: `"10/s & 1000/day"`.
/// `Display` prints a string that parses back to the same policy.
///
/// A policy is `Copy`: its bands (at most [`Policy::MAX_BANDS`]) are kept inline, in a
/// canonical order (shortest window first), so the same limits compare equal however they
/// were combined.
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
///
/// let both: Policy = "1000/day & 10/s".parse()?;
/// assert_eq!(both, "10/s".parse::<Policy>()?.and("1000/day".parse()?)?);
/// assert_eq!(both.to_string(), "token-bucket 10/1s & token-bucket 1000/1d");
/// # Ok::<(), tollgate::PolicyError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Policy {
    /// `bands[..len]` are the limits, sorted and without duplicates; the rest are
    /// `Band::UNUSED`, so derived equality compares only what matters.
    bands: [Band; Policy::MAX_BANDS],
    len: u8,
}

/// One limit of a [`Policy`]: `permits` per `window`, decided by one [`Algorithm`].
///
/// A policy built by [`Policy::new`] (or parsed from a string without `&`) has exactly one
/// band; [`Policy::and`] combines several, and [`Policy::bands`] lists them. A band is valid
/// by construction: it only comes out of a validated policy. `Display` prints it as a
/// single-band policy prints, and [`Policy::from`] turns it back into one.
///
/// Bands order by window (shortest first), then permits, then algorithm: the order in which
/// [`Policy::bands`] yields them. Equality, hashing and order compare only what decides: a
/// token bucket written as a rate and a burst (`"10/s burst 100"`) equals the same bucket
/// written plainly (`"100/10s"`), and only prints differently.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Algorithm, Policy};
/// use tollgate::policy::Band;
///
/// let policy: Policy = "1000/day & sliding-log 10/s".parse()?;
/// let band: Band = policy.first_band();
/// assert_eq!(band.algorithm(), Algorithm::SlidingLog);
/// assert_eq!(band.permits(), 10);
/// assert_eq!(band.window(), Duration::from_secs(1));
/// assert_eq!(band.to_string(), "sliding-log 10/1s");
/// assert_eq!(format!("{band:?}"), "Band(\"sliding-log 10/1s\")");
/// assert_eq!(Policy::from(band), "sliding-log 10/s".parse()?);
/// # Ok::<(), tollgate::PolicyError>(())
/// ```
#[derive(Clone, Copy)]
pub struct Band {
    window_nanos: u64,
    permits: u64,
    algorithm: Algorithm,
    /// How a token bucket written as a rate and a burst (`10/s burst 100`) was written, so
    /// that it prints back that way. Not part of equality: it decides nothing.
    rate: Option<Rate>,
}

/// A token bucket's refill rate as written: `permits` per `window_nanos`.
#[derive(Clone, Copy, Debug)]
struct Rate {
    permits: u64,
    window_nanos: u64,
}

impl Band {
    /// The filler of a policy's unused band slots.
    const UNUSED: Band = Band {
        window_nanos: 0,
        permits: 0,
        algorithm: Algorithm::TokenBucket,
        rate: None,
    };

    /// What decides, in the canonical band order: shortest window first, then permits, then
    /// algorithm.
    fn key(&self) -> (u64, u64, Algorithm) {
        (self.window_nanos, self.permits, self.algorithm)
    }

    /// The algorithm that decides this band.
    ///
    /// # Examples
    ///
    /// ```
    /// let p: tollgate::Policy = "sliding-counter 100/min".parse()?;
    /// assert_eq!(p.first_band().algorithm(), tollgate::Algorithm::SlidingCounter);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub const fn algorithm(self) -> Algorithm {
        self.algorithm
    }

    /// The permits per window (N): the burst size of a token bucket, the most admissions in
    /// any window for the windowed algorithms.
    ///
    /// # Examples
    ///
    /// ```
    /// let p: tollgate::Policy = "100/min".parse()?;
    /// assert_eq!(p.first_band().permits(), 100);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub const fn permits(self) -> u64 {
        self.permits
    }

    /// The window (W).
    ///
    /// # Examples
    ///
    /// ```
    /// let p: tollgate::Policy = "5 per 15m".parse()?;
    /// assert_eq!(p.first_band().window(), std::time::Duration::from_secs(900));
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub const fn window(self) -> Duration {
        Duration::from_nanos(self.window_nanos)
    }

    /// This band printed in its plain form (`token-bucket 100/10s`, never the rate and
    /// burst it may have been written as): what names its state where equal bands must
    /// share it (the Redis backend's keys).
    #[cfg(feature = "redis")]
    pub(crate) fn plain(self) -> Band {
        Band { rate: None, ..self }
    }

    /// The window in nanoseconds.
    pub(crate) const fn window_nanos(self) -> u64 {
        self.window_nanos
    }
}

impl PartialEq for Band {
    fn eq(&self, other: &Band) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Band {}

impl std::hash::Hash for Band {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

impl PartialOrd for Band {
    fn partial_cmp(&self, other: &Band) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Band {
    fn cmp(&self, other: &Band) -> std::cmp::Ordering {
        self.key().cmp(&other.key())
    }
}

/// A window in the largest unit that divides it: `(count, unit)`.
pub(crate) fn window_in_units(nanos: u64) -> (u64, &'static str) {
    const UNITS: [(u64, &str); 7] = [
        (86_400_000_000_000, "d"),
        (3_600_000_000_000, "h"),
        (60_000_000_000, "m"),
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
        (1_000, "us"),
        (1, "ns"),
    ];
    // The last unit divides everything, so the search always succeeds.
    let (size, unit) = UNITS
        .iter()
        .copied()
        .find(|(size, _)| nanos.is_multiple_of(*size))
        .unwrap_or((1, "ns"));
    (nanos / size, unit)
}

impl fmt::Display for Band {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(rate) = self.rate {
            let (count, unit) = window_in_units(rate.window_nanos);
            return write!(
                f,
                "{} {}/{count}{unit} burst {}",
                self.algorithm, rate.permits, self.permits
            );
        }
        let (count, unit) = window_in_units(self.window_nanos);
        write!(f, "{} {}/{count}{unit}", self.algorithm, self.permits)
    }
}

impl fmt::Debug for Band {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Band(\"{self}\")")
    }
}

/// The single-band policy of `band`.
///
/// # Examples
///
/// ```
/// use tollgate::Policy;
///
/// let policy: Policy = "10/s & 1000/day".parse()?;
/// let singles: Vec<Policy> = policy.bands().map(Policy::from).collect();
/// assert_eq!(singles, ["10/s".parse::<Policy>()?, "1000/day".parse()?]);
/// # Ok::<(), tollgate::PolicyError>(())
/// ```
impl From<Band> for Policy {
    fn from(band: Band) -> Policy {
        let mut bands = [Band::UNUSED; Policy::MAX_BANDS];
        bands[0] = band;
        Policy { bands, len: 1 }
    }
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

    /// The most bands (limits) one policy may combine with [`Policy::and`].
    pub const MAX_BANDS: usize = 4;

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
    /// assert_eq!(p.first_band().permits(), 5);
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
        Ok(Policy::from(Band {
            window_nanos,
            permits,
            algorithm,
            rate: None,
        }))
    }

    /// A token bucket written as a refill rate and a burst, as most limiters take it
    /// (governor's `Quota::per_second(10).allow_burst(100)`, nginx's `rate=10r/s burst=100`):
    /// `rate` permits come back every `per`, and up to `burst` may be spent at once. It is the
    /// token bucket of `burst` permits per `burst * per / rate` (rounded up to a nanosecond, so
    /// one permit refills in exactly the time `rate` per `per` alone gives it), and prints back
    /// in the form it was written. The string form is `"10/s burst 100"`.
    ///
    /// # Errors
    ///
    /// [`PolicyError::ZeroPermits`] for a zero `rate`, [`PolicyError::ZeroBurst`] for a zero
    /// `burst`, [`PolicyError::BurstTooLong`] when the burst takes longer than
    /// [`Policy::MAX_WINDOW`] to refill, and the errors of [`Policy::new`] for the rate.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::Policy;
    ///
    /// let policy = Policy::rate_with_burst(10, Duration::from_secs(1), 100)?;
    /// assert_eq!(policy, "100/10s".parse()?);
    /// assert_eq!(policy, "10/s burst 100".parse()?);
    /// assert_eq!(policy.to_string(), "token-bucket 10/1s burst 100");
    /// assert_eq!(policy.first_band().permits(), 100);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn rate_with_burst(rate: u64, per: Duration, burst: u64) -> Result<Self, PolicyError> {
        if rate == 0 {
            return Err(PolicyError::ZeroPermits);
        }
        if burst == 0 {
            return Err(PolicyError::ZeroBurst);
        }
        if per.is_zero() {
            return Err(PolicyError::ZeroWindow);
        }
        if per > Self::MAX_WINDOW {
            return Err(PolicyError::WindowTooLong { window: per });
        }
        let per_nanos = duration_to_nanos(per);
        if per_nanos < rate {
            // More than one permit per nanosecond, as `Policy::new` refuses for the rate alone.
            return Err(PolicyError::IntervalTooShort {
                permits: rate,
                window: per,
            });
        }
        // Below 2^62 * 2^64, so the product fits in 128 bits.
        let nanos = (u128::from(per_nanos) * u128::from(burst)).div_ceil(u128::from(rate));
        let window = match u64::try_from(nanos / 1_000_000_000) {
            // Below 10^9, so it fits.
            Ok(secs) => Duration::new(secs, (nanos % 1_000_000_000) as u32),
            Err(_) => Duration::MAX,
        };
        if window > Self::MAX_WINDOW {
            return Err(PolicyError::BurstTooLong { rate, per, burst });
        }
        let mut policy = Policy::new(Algorithm::TokenBucket, burst, window)?;
        policy.bands[0].rate = Some(Rate {
            permits: rate,
            window_nanos: per_nanos,
        });
        Ok(policy)
    }

    /// A policy that allows a request only when both `self` and `other` allow it: "10 per
    /// second and 1,000 per day". Each band keeps its own algorithm and state; a request
    /// refused by any band spends nothing in any of them.
    ///
    /// # Errors
    ///
    /// [`PolicyError::TooManyBands`] when the result would have more than
    /// [`Policy::MAX_BANDS`] distinct bands.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::Policy;
    ///
    /// let burst: Policy = "10/s".parse()?;
    /// let daily: Policy = "sliding-counter 1000/day".parse()?;
    /// let both = burst.and(daily)?;
    /// assert_eq!(both.bands().count(), 2);
    /// assert_eq!(both, "10/s & sliding-counter 1000/day".parse()?);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn and(self, other: Policy) -> Result<Policy, PolicyError> {
        let mut all: Vec<Band> = self.bands[..usize::from(self.len)]
            .iter()
            .chain(&other.bands[..usize::from(other.len)])
            .copied()
            .collect();
        // Stable, so of two equal bands written in different forms, `self`'s form is kept.
        all.sort();
        all.dedup();
        if all.len() > Self::MAX_BANDS {
            return Err(PolicyError::TooManyBands {
                bands: all.len(),
                max: Self::MAX_BANDS,
            });
        }
        let mut bands = [Band::UNUSED; Self::MAX_BANDS];
        bands[..all.len()].copy_from_slice(&all);
        Ok(Policy {
            bands,
            len: all.len() as u8,
        })
    }

    /// The policy's bands, shortest window first (see [`Band`] for the order). A policy built
    /// by [`Policy::new`] has exactly one band.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::Policy;
    ///
    /// let policy: Policy = "1000/day & 10/s".parse()?;
    /// let bands: Vec<String> = policy.bands().map(|b| b.to_string()).collect();
    /// assert_eq!(bands, ["token-bucket 10/1s", "token-bucket 1000/1d"]);
    /// let permits: Vec<u64> = policy.bands().map(|b| b.permits()).collect();
    /// assert_eq!(permits, [10, 1000]);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn bands(&self) -> impl ExactSizeIterator<Item = Band> + '_ {
        self.bands[..usize::from(self.len)].iter().copied()
    }

    /// The band with the shortest window: the first of [`Policy::bands`]. A policy built by
    /// [`Policy::new`] has exactly one band, so `first_band()` is that policy's limit; a
    /// composite policy's other bands are not described by it.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Algorithm, Policy};
    ///
    /// let single: Policy = "sliding-log 5 per 15m".parse()?;
    /// let band = single.first_band();
    /// assert_eq!(
    ///     (band.algorithm(), band.permits(), band.window()),
    ///     (Algorithm::SlidingLog, 5, Duration::from_secs(900))
    /// );
    ///
    /// let composite: Policy = "1000/day & 10/s".parse()?;
    /// assert_eq!(composite.first_band().to_string(), "token-bucket 10/1s");
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub const fn first_band(&self) -> Band {
        self.bands[0]
    }

    /// `true` when the policy combines several bands.
    ///
    /// # Examples
    ///
    /// ```
    /// let policy: tollgate::Policy = "10/s & 1000/day".parse()?;
    /// assert!(policy.is_composite());
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub const fn is_composite(&self) -> bool {
        self.len > 1
    }

    /// The most permits one request may cost: the smallest band's permits. A larger cost
    /// could never be admitted.
    pub(crate) fn max_cost(&self) -> u64 {
        self.bands[..usize::from(self.len)]
            .iter()
            .map(|b| b.permits)
            .min()
            .unwrap_or(0)
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, band) in self.bands().enumerate() {
            if i > 0 {
                f.write_str(" & ")?;
            }
            fmt::Display::fmt(&band, f)?;
        }
        Ok(())
    }
}

impl fmt::Debug for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Policy(\"{self}\")")
    }
}

/// Why a [`Policy`] could not be built or parsed.
///
/// Every message names the offending field and its value.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Algorithm, Policy, PolicyError};
///
/// let err = Policy::new(Algorithm::TokenBucket, 0, Duration::from_secs(1)).unwrap_err();
/// assert_eq!(err, PolicyError::ZeroPermits);
/// assert_eq!(err.to_string(), "permits must be at least 1, got 0");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PolicyError {
    /// `permits` was 0: nothing could ever be admitted.
    ZeroPermits,
    /// `window` was zero.
    ZeroWindow,
    /// `window` is longer than the longest supported window
    /// ([`Policy::MAX_WINDOW`](Policy::MAX_WINDOW)), so nanosecond arithmetic could
    /// overflow.
    WindowTooLong {
        /// The window asked for.
        window: Duration,
    },
    /// `window / permits` is below one nanosecond: the policy asks for more than one permit
    /// per nanosecond, which no clock can measure.
    IntervalTooShort {
        /// The permits asked for.
        permits: u64,
        /// The window asked for.
        window: Duration,
    },
    /// `permits` is above what the algorithm can hold per key: the sliding log keeps one
    /// timestamp per permit ([`Policy::MAX_LOG_PERMITS`](crate::Policy::MAX_LOG_PERMITS)),
    /// the sliding counter packs its counts in 31 bits
    /// ([`Policy::MAX_COUNTER_PERMITS`](crate::Policy::MAX_COUNTER_PERMITS)).
    TooManyPermits {
        /// The algorithm that cannot hold them.
        algorithm: Algorithm,
        /// The permits asked for.
        permits: u64,
        /// The largest supported value for this algorithm.
        max: u64,
    },
    /// [`Policy::and`](crate::Policy::and) would combine more than
    /// [`Policy::MAX_BANDS`](crate::Policy::MAX_BANDS) distinct bands.
    TooManyBands {
        /// How many distinct bands the combination has.
        bands: usize,
        /// The most a policy may hold.
        max: usize,
    },
    /// A token bucket's `burst` was 0 ([`Policy::rate_with_burst`](crate::Policy::rate_with_burst),
    /// `"10/s burst 0"`).
    ZeroBurst,
    /// A token bucket's burst takes longer to refill at its rate than the longest supported
    /// window ([`Policy::MAX_WINDOW`](crate::Policy::MAX_WINDOW)).
    BurstTooLong {
        /// The permits of the rate.
        rate: u64,
        /// The period of the rate.
        per: Duration,
        /// The burst asked for.
        burst: u64,
    },
    /// A policy string did not parse.
    Syntax {
        /// The whole string that was parsed.
        input: String,
        /// Which part was wrong: `"algorithm"`, `"permits"`, `"separator"`, `"window"`,
        /// `"unit"` or `"burst"`.
        field: &'static str,
        /// The offending text (empty when the part is missing).
        value: String,
        /// What was expected there.
        expected: &'static str,
    },
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyError::ZeroPermits => f.write_str("permits must be at least 1, got 0"),
            PolicyError::ZeroWindow => f.write_str("window must be longer than zero, got 0ns"),
            PolicyError::WindowTooLong { window } => write!(
                f,
                "window {window:?} is longer than the supported maximum of {:?}",
                Policy::MAX_WINDOW
            ),
            PolicyError::IntervalTooShort { permits, window } => write!(
                f,
                "permits {permits} per window {window:?} is more than one permit per nanosecond"
            ),
            PolicyError::TooManyPermits {
                algorithm,
                permits,
                max,
            } => write!(
                f,
                "permits {permits} is above the maximum of {max} for {algorithm}"
            ),
            PolicyError::TooManyBands { bands, max } => write!(
                f,
                "bands {bands} is more than a policy may combine (at most {max})"
            ),
            PolicyError::ZeroBurst => f.write_str("burst must be at least 1, got 0"),
            PolicyError::BurstTooLong { rate, per, burst } => write!(
                f,
                "burst {burst} at {rate} per {per:?} takes longer to refill than the supported maximum window of {:?}",
                Policy::MAX_WINDOW
            ),
            PolicyError::Syntax {
                input,
                field,
                value,
                expected,
            } => {
                if value.is_empty() {
                    write!(
                        f,
                        "policy `{input}`: {field} is missing, expected {expected}"
                    )
                } else {
                    write!(
                        f,
                        "policy `{input}`: {field} `{value}` is not valid, expected {expected}"
                    )
                }
            }
        }
    }
}

impl std::error::Error for PolicyError {}
