//! The typed errors: [`PolicyError`] for a policy that cannot be built, [`CostError`] for a
//! request cost that can never be admitted. Each message names the field and the value.

use std::fmt;
use std::time::Duration;

use crate::policy::Algorithm;

/// Why a [`Policy`](crate::Policy) could not be built or parsed.
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
    /// ([`Policy::MAX_WINDOW`](crate::Policy::MAX_WINDOW)), so nanosecond arithmetic could
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
                crate::Policy::MAX_WINDOW
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

/// Why a request cost was refused before it reached any state.
///
/// A refused cost changes nothing.
///
/// # Examples
///
/// ```
/// use tollgate::{CostError, DirectLimiter, FakeClock};
///
/// let limiter = DirectLimiter::with_clock("5/1s".parse().unwrap(), FakeClock::new());
/// let err = limiter.try_acquire_n(6).unwrap_err();
/// assert_eq!(err, CostError::ExceedsLimit { cost: 6, limit: 5 });
/// assert_eq!(err.to_string(), "cost 6 is above the policy's limit of 5 permits, so it could never be admitted");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CostError {
    /// `cost` was 0.
    Zero,
    /// `cost` is above the policy's permits: no state could ever admit it.
    ExceedsLimit {
        /// The cost asked for.
        cost: u64,
        /// The policy's permits.
        limit: u64,
    },
}

impl fmt::Display for CostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CostError::Zero => f.write_str("cost must be at least 1, got 0"),
            CostError::ExceedsLimit { cost, limit } => write!(
                f,
                "cost {cost} is above the policy's limit of {limit} permits, so it could never be admitted"
            ),
        }
    }
}

impl std::error::Error for CostError {}

/// Why a [`CoarseClock`](crate::CoarseClock) could not be started.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tollgate::{ClockError, CoarseClock};
///
/// let err = CoarseClock::new(Duration::from_micros(10)).unwrap_err();
/// assert_eq!(err, ClockError::Resolution { resolution: Duration::from_micros(10) });
/// assert_eq!(err.to_string(), "resolution 10µs is outside the supported range of 100µs to 1s");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClockError {
    /// `resolution` is outside
    /// [`CoarseClock::MIN_RESOLUTION`](crate::CoarseClock::MIN_RESOLUTION)..=[`CoarseClock::MAX_RESOLUTION`](crate::CoarseClock::MAX_RESOLUTION).
    Resolution {
        /// The resolution asked for.
        resolution: Duration,
    },
    /// The operating system refused to start the refreshing thread.
    Spawn {
        /// The operating system's error, as text.
        message: String,
    },
}

impl fmt::Display for ClockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClockError::Resolution { resolution } => write!(
                f,
                "resolution {resolution:?} is outside the supported range of {:?} to {:?}",
                crate::CoarseClock::MIN_RESOLUTION,
                crate::CoarseClock::MAX_RESOLUTION
            ),
            ClockError::Spawn { message } => {
                write!(f, "the clock's refreshing thread did not start: {message}")
            }
        }
    }
}

impl std::error::Error for ClockError {}
