//! [`ThrottleError`]: why a throttled call did not go out, or did not come back.

use std::error::Error;
use std::fmt;
use std::time::Duration;

use crate::error::CostError;

/// The error type of anything that can go wrong around an outgoing call, boxed.
pub type BoxError = Box<dyn Error + Send + Sync>;

/// Why a call through a [`Throttle`](super::Throttle) or a
/// [`ThrottleLayer`](super::ThrottleLayer) failed. A call is never dropped silently: it is
/// sent, or it fails with one of these.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use tollgate::client::{Throttle, ThrottleError};
/// use tollgate::{clock::TokioClock, DirectLimiter};
///
/// let throttle = Throttle::new(DirectLimiter::with_clock("1/min".parse()?, TokioClock::new()))
///     .max_wait(Duration::from_secs(1));
/// let _first = throttle.acquire("api.example.com").await?;
/// let err = throttle.acquire("api.example.com").await.unwrap_err();
/// assert!(matches!(err, ThrottleError::TimedOut { .. }));
/// assert_eq!(err.retry_after(), Some(Duration::from_secs(60)));
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum ThrottleError {
    /// No permit could come within the maximum wait
    /// ([`Throttle::max_wait`](super::Throttle::max_wait)); the call was not sent.
    TimedOut {
        /// The key whose budget was short.
        key: String,
        /// How long the call had waited when it gave up.
        waited: Duration,
        /// How long after giving up a permit would have come, as far as the throttle knew;
        /// for a call that gave up still queued behind others, how long the call at the
        /// head was still to wait (zero when it was not sleeping): the least it would have
        /// had to wait.
        retry_after: Duration,
    },
    /// The call's cost can never be admitted by the budget's policy (0, or above its
    /// permits); the call was not sent.
    Cost {
        /// The key the call was for.
        key: String,
        /// What the budget said.
        source: CostError,
    },
    /// [`Admission::settle`](super::Admission::settle) on a call admitted whole, by
    /// [`acquire_n`](super::Throttle::acquire_n): only a call taken with
    /// [`reserve_n`](super::Throttle::reserve_n) has a cost to settle.
    NotReserved {
        /// The key the call was for.
        key: String,
    },
    /// The request gave no key: the default key is the request's host, and it had none.
    NoKey,
    /// The Redis budget failed (feature `redis`); the call was not sent, or, from a settle,
    /// was answered but its cost could not be settled.
    #[cfg(feature = "redis")]
    Backend {
        /// The key the call was for.
        key: String,
        /// What the Redis limiter said.
        source: crate::redis::BackendError,
    },
    /// The inner service failed: the call may have reached the upstream, so its permit stays
    /// spent.
    Upstream(BoxError),
}

impl ThrottleError {
    /// How long to wait before trying again, for [`TimedOut`](ThrottleError::TimedOut).
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ThrottleError::TimedOut { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }
}

impl fmt::Display for ThrottleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ThrottleError::TimedOut {
                key,
                waited,
                retry_after,
            } => write!(
                f,
                "no permit for `{key}` within the maximum wait: waited {waited:?}, the next in {retry_after:?}"
            ),
            ThrottleError::Cost { key, source } => write!(f, "cost for `{key}`: {source}"),
            ThrottleError::NotReserved { key } => write!(
                f,
                "reservation: the call for `{key}` was admitted whole, with nothing to settle"
            ),
            ThrottleError::NoKey => f.write_str("the request has no host to throttle by"),
            #[cfg(feature = "redis")]
            ThrottleError::Backend { key, source } => {
                write!(f, "the Redis budget for `{key}` failed: {source}")
            }
            ThrottleError::Upstream(source) => write!(f, "the upstream call failed: {source}"),
        }
    }
}

impl Error for ThrottleError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            ThrottleError::Cost { source, .. } => Some(source),
            #[cfg(feature = "redis")]
            ThrottleError::Backend { source, .. } => Some(source),
            ThrottleError::Upstream(source) => Some(source.as_ref()),
            ThrottleError::TimedOut { .. }
            | ThrottleError::NotReserved { .. }
            | ThrottleError::NoKey => None,
        }
    }
}
