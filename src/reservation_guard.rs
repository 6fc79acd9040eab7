//! A reservation that gives its permits back unless it is settled: [`ReservationGuard`], made
//! by [`RateLimiter::reserve_guarded`](crate::RateLimiter::reserve_guarded) and
//! [`DirectLimiter::reserve_guarded`](crate::DirectLimiter::reserve_guarded).
//!
//! A plain [`Reservation`] dropped unsettled keeps its whole estimate spent, so an early `?`
//! or a panic between the reservation and its settle wastes it. The guard borrows the limiter
//! (and the key) and cancels on drop: the crossbeam habit of a guard whose `Drop` finishes the
//! protocol, so no path out of the request forgets it. It is built only on the public
//! `reserve_n`, `settle` and `cancel`, and behaves exactly as they do.

use std::fmt;

use crate::decision::Decision;
use crate::reservation::{Reservation, SettleError};

/// How a guard settles its reservation on its limiter `L` for its key `Q`.
type SettleFn<L, Q> = fn(&L, &Q, Reservation, u64) -> Result<(), SettleError>;

/// A [`Reservation`] that is cancelled when dropped unless it was settled.
///
/// Made by [`RateLimiter::reserve_guarded`](crate::RateLimiter::reserve_guarded) (`Q` the borrowed key type, `str` for `String`
/// keys) and [`DirectLimiter::reserve_guarded`](crate::DirectLimiter::reserve_guarded) (`Q = ()`). It borrows the limiter and the key,
/// so it lives inside the request that made it.
///
/// * [`settle(actual)`](ReservationGuard::settle) settles at what the request really cost and
///   consumes the guard: nothing more happens on drop.
/// * Dropped unsettled (an early return, an error passed on with `?`, a panic unwinding), it
///   [`cancel`](crate::RateLimiter::cancel)s: every permit the reservation still holds comes back,
///   under the same rules as a cancel: nothing comes back after a `reset` of *any* key of
///   the limiter or a policy change made since the reservation (the limiter counts them
///   all, not per key), as the state that held them may be gone.
/// * [`into_reservation`](ReservationGuard::into_reservation) hands back the plain
///   [`Reservation`], which keeps its permits spent if dropped.
///
/// A refused reservation holds nothing: dropping its guard changes nothing, and settling it
/// is [`SettleError::Refused`], as for a plain reservation.
///
/// # Examples
///
/// ```
/// use tollgate::{FakeClock, RateLimiter};
///
/// fn call_model(prompt: &str) -> Result<u64, String> {
///     if prompt.is_empty() {
///         return Err("empty prompt".into());
///     }
///     Ok(1_250) // the tokens it used
/// }
///
/// fn complete(
///     limiter: &RateLimiter<String, FakeClock>,
///     tenant: &str,
///     prompt: &str,
/// ) -> Result<(), String> {
///     let guard = limiter.reserve_guarded(tenant, 4_000).map_err(|e| e.to_string())?;
///     if !guard.decision().is_allowed() {
///         return Err("429".into()); // holds nothing
///     }
///     let used = call_model(prompt)?; // on an error the guard cancels: all 4,000 come back
///     guard.settle(used).map_err(|e| e.to_string())
/// }
///
/// let limiter: RateLimiter<String, FakeClock> =
///     RateLimiter::with_clock("10000/min".parse()?, FakeClock::new());
/// assert!(complete(&limiter, "tenant-7", "").is_err());
/// assert_eq!(limiter.available("tenant-7"), 10_000);
/// complete(&limiter, "tenant-7", "hello")?;
/// assert_eq!(limiter.available("tenant-7"), 10_000 - 1_250);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "a ReservationGuard dropped at once gives its permits straight back"]
pub struct ReservationGuard<'a, L, Q: ?Sized = ()> {
    limiter: &'a L,
    key: &'a Q,
    /// `Some` until the guard is settled or handed back.
    reservation: Option<Reservation>,
    settle: SettleFn<L, Q>,
}

impl<'a, L, Q: ?Sized> ReservationGuard<'a, L, Q> {
    /// A guard over `reservation`, made by `limiter` for `key`; `settle` settles it there.
    pub(crate) fn new(
        limiter: &'a L,
        key: &'a Q,
        reservation: Reservation,
        settle: SettleFn<L, Q>,
    ) -> Self {
        ReservationGuard {
            limiter,
            key,
            reservation: Some(reservation),
            settle,
        }
    }

    /// The reservation, present until the guard is consumed.
    fn reservation(&self) -> &Reservation {
        match &self.reservation {
            Some(reservation) => reservation,
            None => unreachable!("only the consuming methods and drop take the reservation"),
        }
    }

    /// Takes the reservation out, so that the drop that follows cancels nothing.
    fn take(&mut self) -> Reservation {
        match self.reservation.take() {
            Some(reservation) => reservation,
            None => unreachable!("only the consuming methods and drop take the reservation"),
        }
    }

    /// The decision the reservation got: allowed (its permits are held) or refused (nothing
    /// is held). See [`Reservation::decision`].
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{DirectLimiter, FakeClock};
    ///
    /// let limiter = DirectLimiter::with_clock("10/s".parse()?, FakeClock::new());
    /// let guard = limiter.reserve_guarded(8)?;
    /// assert_eq!(guard.decision().remaining(), 2);
    /// assert!(!limiter.reserve_guarded(8)?.decision().is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn decision(&self) -> Decision {
        self.reservation().decision()
    }

    /// The permits the reservation holds: its cost when allowed, 0 when refused. See
    /// [`Reservation::held`].
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{DirectLimiter, FakeClock};
    ///
    /// let limiter = DirectLimiter::with_clock("10/s".parse()?, FakeClock::new());
    /// let guard = limiter.reserve_guarded(8)?;
    /// assert_eq!(guard.held(), 8);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn held(&self) -> u64 {
        self.reservation().held()
    }

    /// Settles the reservation at what the request really cost, as the limiter's `settle`
    /// does ([`RateLimiter::settle`](crate::RateLimiter::settle), [`DirectLimiter::settle`](crate::DirectLimiter::settle)): below the reservation the
    /// difference comes back, above it the excess is charged. Consumes the guard, which then
    /// cancels nothing.
    ///
    /// # Errors
    ///
    /// As the limiter's `settle`: [`SettleError::Refused`] for a reservation that holds
    /// nothing. A failed settle changes nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{DirectLimiter, FakeClock};
    ///
    /// let limiter = DirectLimiter::with_clock("10/s".parse()?, FakeClock::new());
    /// let guard = limiter.reserve_guarded(6)?;
    /// guard.settle(4)?; // 2 come back
    /// assert_eq!(limiter.available(), 6);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn settle(mut self, actual: u64) -> Result<(), SettleError> {
        let reservation = self.take();
        (self.settle)(self.limiter, self.key, reservation, actual)
    }

    /// Gives back everything the reservation holds now rather than on drop:
    /// [`settle`](ReservationGuard::settle) at 0. `Ok` also when there was nothing left to
    /// give back (the permits already refilled, or a `reset` of any key or a policy change
    /// since the reservation withheld the refund); an error only for a refused reservation.
    ///
    /// # Errors
    ///
    /// As [`settle`](ReservationGuard::settle).
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{DirectLimiter, FakeClock, SettleError};
    ///
    /// let limiter = DirectLimiter::with_clock("10/s".parse()?, FakeClock::new());
    /// limiter.reserve_guarded(6)?.cancel()?;
    /// assert_eq!(limiter.available(), 10);
    /// let _held = limiter.reserve_guarded(8)?;
    /// let refused = limiter.reserve_guarded(8)?; // only 2 left
    /// assert_eq!(refused.cancel(), Err(SettleError::Refused));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cancel(self) -> Result<(), SettleError> {
        self.settle(0)
    }

    /// The plain [`Reservation`], no longer guarded: dropped unsettled, it keeps its permits
    /// spent. Settle it with the limiter's own `settle` or `cancel`.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{DirectLimiter, FakeClock};
    ///
    /// let limiter = DirectLimiter::with_clock("10/s".parse()?, FakeClock::new());
    /// let reservation = limiter.reserve_guarded(6)?.into_reservation();
    /// assert_eq!(limiter.available(), 4);
    /// drop(reservation); // a plain reservation keeps its permits spent
    /// assert_eq!(limiter.available(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn into_reservation(mut self) -> Reservation {
        self.take()
    }
}

impl<L, Q: ?Sized> Drop for ReservationGuard<'_, L, Q> {
    /// Cancels the reservation unless it was settled or handed back. A refused one holds
    /// nothing, so its cancel's `SettleError::Refused` is expected and ignored; a cancel
    /// fails for no other reason on the limiter and key that made it.
    ///
    /// The cancel runs the key's `Hash` and `Eq` (and, for a reservation of a full limiter's
    /// shared state made before a change to per-key policies, the resolver). Dropped while
    /// the thread is already unwinding from a panic, a second panic there would abort the
    /// process: it is caught instead, and the reservation keeps its permits.
    fn drop(&mut self) {
        if let Some(reservation) = self.reservation.take() {
            let (settle, limiter, key) = (self.settle, self.limiter, self.key);
            if std::thread::panicking() {
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    settle(limiter, key, reservation, 0)
                }));
            } else {
                let _ = settle(limiter, key, reservation, 0);
            }
        }
    }
}

impl<L, Q: ?Sized> fmt::Debug for ReservationGuard<'_, L, Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReservationGuard")
            .field("reservation", &self.reservation)
            .finish_non_exhaustive()
    }
}
