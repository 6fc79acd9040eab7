//! [`BackendError`]: why a Redis-backed decision could not be made.

use std::fmt;
use std::time::Duration;

use crate::all_of::PartError;
use crate::error::CostError;
use crate::policy::Band;
use crate::reservation::SettleError;

/// Why a [`RedisLimiter`](super::RedisLimiter) could not be built or could not decide.
///
/// A request decides with a [`Decision`](crate::Decision) whenever it can: when Redis is
/// slow or down, the limiter's [`FailurePolicy`](super::FailurePolicy) decides instead, and
/// only [`FailurePolicy::Error`](super::FailurePolicy::Error) turns that into
/// [`BackendError::Timeout`] or [`BackendError::Redis`].
///
/// # Examples
///
/// ```
/// use tollgate::redis::BackendError;
/// use tollgate::CostError;
///
/// let err = BackendError::from(CostError::Zero);
/// assert_eq!(err.to_string(), "cost must be at least 1, got 0");
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub enum BackendError {
    /// The cost of a request can never be admitted (0, or above the smallest band's
    /// permits). Nothing was sent to Redis.
    Cost(CostError),
    /// A band of the policy cannot be decided by the Redis scripts, which count in whole
    /// microseconds with exact integers below 2^53 (see `docs/REDIS.md`).
    UnsupportedPolicy {
        /// The band.
        band: Band,
        /// Why.
        reason: &'static str,
    },
    /// The key prefix contains `{` or `}`, which would change the keys' hash tag.
    InvalidPrefix {
        /// The prefix given.
        prefix: String,
    },
    /// A builder setting that cannot work: zero for a duration, a lease of no permit, or a
    /// lease of more than one permit under a sliding log. Nothing was connected.
    InvalidSetting {
        /// The setting: the name of the [`RedisLimiterBuilder`](super::RedisLimiterBuilder)
        /// method that took it.
        setting: &'static str,
        /// The value given, as `Debug` writes it.
        value: String,
        /// Why it cannot work.
        reason: &'static str,
    },
    /// The test clock read beyond what the script supports (2^52 us, about 142 years).
    ClockOutOfRange {
        /// The reading.
        now: Duration,
    },
    /// Redis answered with an error, or could not be reached.
    Redis(::redis::RedisError),
    /// Redis did not answer within the limiter's timeout.
    Timeout(Duration),
    /// A recent call to Redis failed, and calls skip Redis until the next probe (see
    /// [`FailurePolicy`](super::FailurePolicy)).
    Unavailable,
    /// Redis answered with something the script never returns (another program wrote the
    /// script's keys, or a different script answered to its SHA).
    Reply(String),
    /// A [`Reservation`](crate::Reservation) could not be settled: it was refused, or made
    /// for another key or by another limiter. Nothing was sent to Redis.
    Settle(SettleError),
    /// A part of a [`RedisAllOf`](super::RedisAllOf) has a cost no state of its policy could
    /// admit (from [`RedisAllOf::reserve`](super::RedisAllOf::reserve)). Nothing was sent.
    Part(PartError),
    /// A part of a [`RedisAllOf`](super::RedisAllOf) has a limiter on another connection
    /// than the first part's: one script call cannot decide both. Build the limiters with
    /// [`connect_shared`](super::RedisLimiterBuilder::connect_shared). Nothing was sent.
    OtherConnection {
        /// The part's position, in the order added.
        part: usize,
    },
    /// A part of a [`RedisAllOf`](super::RedisAllOf) names a Redis key that an earlier part
    /// names too (the same limiter and key twice, or two limiters with one prefix and a band
    /// in common, for one key): a script reads every key before it writes any, so it would
    /// spend that state once for two parts. Nothing was sent.
    SharedKey {
        /// The part's position, in the order added.
        part: usize,
        /// The Redis key.
        key: String,
    },
    /// On a Redis Cluster, a part of a [`RedisAllOf`](super::RedisAllOf) has a key in another
    /// slot than the first part's: one script call runs on one node, over one slot. Give
    /// every limiter of the `RedisAllOf` the same
    /// [`hash_tag`](super::RedisLimiterBuilder::hash_tag). Nothing was sent.
    CrossSlot {
        /// The part's position, in the order added.
        part: usize,
        /// The part's Redis key in another slot.
        key: String,
        /// The first part's Redis key, in the slot the others must share.
        first: String,
    },
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendError::Cost(err) => err.fmt(f),
            BackendError::UnsupportedPolicy { band, reason } => {
                write!(f, "policy band `{band}` is not supported by the Redis backend: {reason}")
            }
            BackendError::InvalidPrefix { prefix } => write!(
                f,
                "prefix `{prefix}` contains `{{` or `}}`, which would change the keys' hash tag"
            ),
            BackendError::InvalidSetting {
                setting,
                value,
                reason,
            } => write!(f, "invalid `{setting}` setting {value}: {reason}"),
            BackendError::ClockOutOfRange { now } => write!(
                f,
                "test clock reading {now:?} is beyond the Redis backend's range of 2^52 us"
            ),
            BackendError::Redis(err) => write!(f, "redis: {err}"),
            BackendError::Timeout(timeout) => {
                write!(f, "redis did not answer within the timeout of {timeout:?}")
            }
            BackendError::Unavailable => f.write_str(
                "redis is unavailable: a recent call failed, and calls skip redis until the next probe",
            ),
            BackendError::Reply(reply) => write!(f, "unexpected reply from redis: {reply}"),
            BackendError::Settle(err) => err.fmt(f),
            BackendError::Part(err) => err.fmt(f),
            BackendError::OtherConnection { part } => write!(
                f,
                "part {part}'s limiter is on another connection than part 0's: one script call cannot decide both (build it with `connect_shared`)"
            ),
            BackendError::SharedKey { part, key } => write!(
                f,
                "part {part} decides redis key `{key}`, which an earlier part decides too: use another prefix for one of the limiters"
            ),
            BackendError::CrossSlot { part, key, first } => write!(
                f,
                "part {part}'s redis key `{key}` is in another cluster slot than part 0's `{first}`: give the limiters one `hash_tag`"
            ),
        }
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BackendError::Cost(err) => Some(err),
            BackendError::Redis(err) => Some(err),
            BackendError::Settle(err) => Some(err),
            BackendError::Part(err) => Some(err),
            _ => None,
        }
    }
}

impl From<CostError> for BackendError {
    fn from(err: CostError) -> Self {
        BackendError::Cost(err)
    }
}

impl From<SettleError> for BackendError {
    fn from(err: SettleError) -> Self {
        BackendError::Settle(err)
    }
}

impl From<::redis::RedisError> for BackendError {
    fn from(err: ::redis::RedisError) -> Self {
        BackendError::Redis(err)
    }
}
