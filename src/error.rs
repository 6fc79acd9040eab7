//! The typed errors of deciding: [`CostError`] for a request cost that can never be admitted,
//! [`ClockError`] for a clock that cannot be started. Each message names the field and the
//! value. (A policy that cannot be built is a [`PolicyError`](crate::PolicyError), beside
//! the policy.)

use std::fmt;
use std::time::Duration;

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

impl CostError {
    /// `cost` as a request's cost: at least 1. Checked where a request comes in, before its
    /// key's policy (and so its limit) is known.
    #[inline(always)]
    pub(crate) fn nonzero(cost: u64) -> Result<(), CostError> {
        if cost == 0 {
            return Err(CostError::Zero);
        }
        Ok(())
    }

    /// `cost` against a policy whose largest acceptable cost is `limit`: what no state of that
    /// policy could ever admit is refused before any state is touched.
    #[inline(always)]
    pub(crate) fn within(cost: u64, limit: u64) -> Result<(), CostError> {
        if cost > limit {
            return Err(CostError::ExceedsLimit { cost, limit });
        }
        Ok(())
    }
}

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
