//! Reserve now, settle later: [`Reservation`] and [`SettleError`].
//!
//! A request whose cost is known only after it ran (the tokens an LLM really used, an order
//! that failed) reserves an estimate, runs, then settles the reservation at what it really
//! cost: the difference is given back, or charged on top. `docs/ALGORITHMS.md` gives each
//! algorithm's rules.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::decision::Decision;
use crate::policy::Policy;

/// Per band of the policy, the instant the reservation's admission stood for, in nanoseconds
/// on the limiter's clock: a token bucket's theoretical arrival time after it, a sliding
/// log's stamp of its entries, a sliding counter's start of the window it counted in. Then,
/// at [`STAMP`], the stamp of the policy it was decided under, where a key's state keeps its
/// own policy.
pub(crate) type Marks = [u64; Policy::MAX_BANDS + 1];

/// Where [`Marks`] keep the stamp of the policy a reservation was decided under
/// (`RateState::stamp`), for a state that keeps its own policy (a per-key policy): a key
/// evicted at rest and created again may get another policy from its resolver, and a
/// refund read against it would give back what that state never held (a sliding counter
/// reading another policy's window start as one of its own). A refund applies only on a
/// state of the same stamp. 0: not checked (a uniform policy: a policy change rebuilds
/// every state, and `Rebuilds` keeps refunds off the new ones).
pub(crate) const STAMP: usize = Policy::MAX_BANDS;

/// Which limiter, and which key of it, a reservation was made on, and when. Public in name
/// only, for the sealed `all_of::Part`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(unreachable_pub)]
pub struct Origin {
    /// The limiter's serial number ([`next_limiter_id`]).
    pub(crate) limiter: u64,
    /// The key's hash under the limiter's hasher (0 for a limiter of one key).
    pub(crate) key: u64,
    /// How many times the limiter had forgotten or rebuilt states (a `reset`, a policy
    /// change) when the reservation was made: a refund after one of those would land on a
    /// state that never held the reservation's permits.
    pub(crate) rebuilds: u64,
}

impl Origin {
    /// Whether `other` names the same limiter and key as this origin.
    pub(crate) fn check_place(&self, other: Origin) -> Result<(), SettleError> {
        if self.limiter != other.limiter {
            return Err(SettleError::OtherLimiter);
        }
        if self.key != other.key {
            return Err(SettleError::OtherKey);
        }
        Ok(())
    }
}

/// A reservation being settled, once checked against where it was made.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Taken {
    /// The permits it holds.
    pub(crate) held: u64,
    /// Where its admission stands in each band.
    pub(crate) marks: Marks,
    /// `true` when a `reset` or a policy change came in between: nothing is given back (the
    /// state that held the permits is gone), though a charge still is made.
    pub(crate) stale: bool,
    /// The limiter's count of resets and policy changes when the reservation was made: a
    /// refund checks it again once it has found the state it would write to.
    pub(crate) made: u64,
    /// The Redis backend's serial number of the reservation's token (0 in process).
    #[cfg(feature = "redis")]
    pub(crate) token: u64,
}

impl Taken {
    /// Whether settling at `actual` changes anything: a charge always does, a refund only on
    /// the state that holds the reservation.
    pub(crate) fn changes(&self, actual: u64) -> bool {
        actual > self.held || (actual < self.held && !self.stale)
    }
}

/// A serial number for a new limiter, so a reservation settled on another limiter is
/// recognised.
pub(crate) fn next_limiter_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    // Relaxed: only uniqueness matters, and a read-modify-write gives every caller its own.
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Permits taken now for a request whose real cost is known later.
///
/// Made by `reserve_n` on [`RateLimiter`](crate::RateLimiter),
/// [`DirectLimiter`](crate::DirectLimiter) and, with the `redis` feature, the Redis limiter.
/// An allowed reservation holds its permits until it is settled: `settle(r, actual)` gives
/// back what the request did not use, or charges what it used on top, even past the limit;
/// `cancel(r)` gives everything back. A refused one holds nothing.
///
/// A reservation is neither `Copy` nor `Clone`, and settling consumes it, so nothing can be
/// given back twice. One that is dropped unsettled keeps its permits spent, as the same
/// `try_acquire_n` would.
///
/// # Examples
///
/// ```
/// use tollgate::{FakeClock, RateLimiter};
///
/// let limiter: RateLimiter<String, FakeClock> =
///     RateLimiter::with_clock("100/min".parse()?, FakeClock::new());
/// let r = limiter.reserve_n("tenant-7", 40)?; // an estimate
/// assert!(r.decision().is_allowed());
/// assert_eq!(limiter.peek("tenant-7").remaining(), 59);
/// limiter.settle("tenant-7", r, 25)?; // it really cost 25: 15 come back
/// assert_eq!(limiter.peek("tenant-7").remaining(), 74);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "a Reservation holds permits until it is settled or cancelled"]
pub struct Reservation {
    decision: Decision,
    /// The permits held: the cost asked for when allowed, 0 when refused (or let through by
    /// shadow mode only).
    held: u64,
    marks: Marks,
    origin: Origin,
    /// The policy the reservation was decided under, where its limiter would not know it
    /// from the key by the time it settles: in process, a per-key policy whose shared
    /// overflow state decided it (the settle goes to the same state, whatever the resolver
    /// answers by then); on Redis, a key's policy chosen by a resolver (the settle's bands).
    overflow: Option<Box<Policy>>,
    /// The Redis backend's serial number of the reservation's token (0 in process).
    #[cfg(feature = "redis")]
    token: u64,
}

/// What a reservation taken for an `AllOf` part keeps until it is given back or becomes a
/// [`Reservation`]: the reservation less its decision, cost and key, which the part has.
/// Public in name only, as the parts' trait.
#[derive(Debug)]
#[allow(unreachable_pub)]
pub struct PartHeld {
    /// Where the admission stands in each band.
    pub(crate) marks: Marks,
    /// The limiter's count of rebuilds, read before the decision (as `Origin::rebuilds`).
    pub(crate) made: u64,
    /// As `Reservation::overflow`.
    pub(crate) overflow: Option<Box<Policy>>,
    /// Whether the shared overflow state of a full limiter decided it: a refund goes there.
    pub(crate) overflowed: bool,
    /// Whether deciding it created the key's state: given back, the state is removed again
    /// if nothing else has spent from it (`AllOf` leaves a refused request's keys as it
    /// found them).
    pub(crate) created: bool,
}

impl Reservation {
    /// A reservation of `cost` permits that `decision` admitted, the bands' admissions standing
    /// at `marks`.
    pub(crate) fn new(decision: Decision, cost: u64, marks: Marks, origin: Origin) -> Self {
        // Shadow mode lets a refusal through, but the policy spent nothing for it.
        let held = if decision.spent() { cost } else { 0 };
        Reservation {
            decision,
            held,
            marks,
            origin,
            overflow: None,
            #[cfg(feature = "redis")]
            token: 0,
        }
    }

    /// This reservation, decided under `policy` (see `Reservation::overflow`).
    pub(crate) fn decided_under(self, policy: Option<Box<Policy>>) -> Self {
        Reservation {
            // Boxed: only these few reservations pay for a policy's size.
            overflow: policy,
            ..self
        }
    }

    /// The policy this reservation was decided under, if it was recorded.
    pub(crate) fn decided_policy(&self) -> Option<Box<Policy>> {
        self.overflow.clone()
    }

    /// The reservation, naming its token in Redis by `token`.
    #[cfg(feature = "redis")]
    pub(crate) fn with_token(mut self, token: u64) -> Self {
        self.token = token;
        self
    }

    /// The decision the reservation got: allowed (its permits are held) or refused (nothing
    /// is held), with remaining, retry_after and the rest as `try_acquire_n` reports them.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{DirectLimiter, FakeClock};
    ///
    /// let limiter = DirectLimiter::with_clock("10/s".parse()?, FakeClock::new());
    /// let r = limiter.reserve_n(8)?;
    /// assert_eq!(r.decision().remaining(), 2);
    /// assert!(!limiter.reserve_n(8)?.decision().is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// The permits the reservation holds: its cost when allowed, 0 when refused.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{DirectLimiter, FakeClock};
    ///
    /// let limiter = DirectLimiter::with_clock("10/s".parse()?, FakeClock::new());
    /// assert_eq!(limiter.reserve_n(8)?.held(), 8);
    /// assert_eq!(limiter.reserve_n(8)?.held(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn held(&self) -> u64 {
        self.held
    }

    /// Whether this reservation holds permits and was made where `origin` says (its limiter
    /// and key), without settling it.
    pub(crate) fn check(&self, origin: Origin) -> Result<(), SettleError> {
        self.check_place(origin)?;
        if self.held == 0 {
            return Err(SettleError::Refused);
        }
        Ok(())
    }

    /// Whether this reservation was made where `origin` says (its limiter and key), whether
    /// or not it holds permits.
    pub(crate) fn check_place(&self, origin: Origin) -> Result<(), SettleError> {
        self.origin.check_place(origin)
    }

    /// The permits held and the bands' marks, once `origin` is checked to be where the
    /// reservation was made; consumes it.
    pub(crate) fn take(self, origin: Origin) -> Result<Taken, SettleError> {
        self.check(origin)?;
        Ok(Taken {
            held: self.held,
            marks: self.marks,
            stale: self.origin.rebuilds != origin.rebuilds,
            made: self.origin.rebuilds,
            #[cfg(feature = "redis")]
            token: self.token,
        })
    }
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("decision", &self.decision)
            .field("held", &self.held)
            .finish_non_exhaustive()
    }
}

/// Why a [`Reservation`] could not be settled. A settle that fails changes no state: the
/// reservation's permits stay spent, as if it had been dropped.
///
/// # Examples
///
/// ```
/// use tollgate::{FakeClock, RateLimiter, SettleError};
///
/// let limiter: RateLimiter<String, FakeClock> =
///     RateLimiter::with_clock("5/s".parse()?, FakeClock::new());
/// let r = limiter.reserve_n("alice", 2)?;
/// assert_eq!(limiter.settle("bob", r, 1), Err(SettleError::OtherKey));
/// let refused = limiter.reserve_n("alice", 4)?; // only 3 left
/// assert_eq!(limiter.cancel("alice", refused), Err(SettleError::Refused));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SettleError {
    /// The reservation was refused (or let through by shadow mode only): it holds no permits,
    /// so there is nothing to give back or charge on top of.
    Refused,
    /// The reservation was made for another key of this limiter. Keys are told apart by
    /// their hash under the limiter's hasher: with the default, randomly keyed one, two keys
    /// collide with odds of 2^-64; a hasher of your own whose hashes collide (one that
    /// hashes only part of a key) cannot tell such keys apart here either.
    OtherKey,
    /// The reservation was made by another limiter.
    OtherLimiter,
    /// An `AllOf`'s reservation settled with more costs than it has parts, or on an `AllOf`
    /// of another number of parts.
    Parts {
        /// The parts of the reservation.
        parts: usize,
        /// The costs given, or the parts of the `AllOf` it was settled on.
        given: usize,
    },
}

impl fmt::Display for SettleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SettleError::Refused => "reservation: it was refused, so it holds no permits to settle",
            SettleError::OtherKey => "key: the reservation was made for another key",
            SettleError::OtherLimiter => "limiter: the reservation was made by another limiter",
            SettleError::Parts { parts, given } => {
                return write!(
                    f,
                    "parts: the reservation has {parts} parts, {given} were given"
                );
            }
        })
    }
}

impl std::error::Error for SettleError {}
