//! [`CostError`]: a request cost that can never be admitted, named with its value and the
//! policy's limit. (A policy that cannot be built is a [`PolicyError`](crate::PolicyError),
//! beside the policy; a clock that cannot be started a
//! [`ClockError`](crate::clock::ClockError), beside the clock.)

use std::fmt;

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
