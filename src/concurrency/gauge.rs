//! One key's in-flight count ([`Gauge`]), the [`Permit`] that holds a place in it until it
//! is dropped, and the refusal when it is full ([`AtCapacity`]).

use std::fmt;
use std::sync::Arc;

use crate::engine::retry::Retry;
use crate::engine::sync::{AtomicU64, Ordering};

/// One key's in-flight count and its limit. See [`ConcurrencyLimiter`](super::ConcurrencyLimiter) for the
/// value table.
///
/// Orderings: a successful acquire is `Acquire` and a release is `Release`, as for a lock:
/// whatever a holder did before dropping its permit happens-before whatever the thread that
/// takes the freed place does after acquiring, so a permit can guard a resource (a
/// connection, a slot of a buffer), not only a count. Everything else is `Relaxed`: a
/// refusal publishes nothing, and exactness comes from the compare-and-swap alone (all
/// writes to the count form one modification order, and a CAS succeeds only on the latest
/// value, so two acquirers never take the same place).
#[derive(Debug)]
pub(crate) struct Gauge {
    count: AtomicU64,
    pub(crate) limit: u64,
}

/// What [`Gauge::try_acquire`] concluded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Acquire {
    /// One more in flight: the caller now owns a place and must release it.
    Acquired,
    /// At the limit; nothing was written.
    Full,
}

impl Gauge {
    pub(crate) fn new(limit: u64) -> Self {
        Gauge {
            count: AtomicU64::new(0),
            limit,
        }
    }

    #[inline]
    pub(crate) fn try_acquire(&self) -> Acquire {
        // Relaxed: a snapshot to decide from. A stale value only makes the CAS below fail
        // (and retry with the fresh one) or refuses from a count the key really had.
        let mut count = self.count.load(Ordering::Relaxed);
        let mut retry = Retry::new();
        loop {
            if count >= self.limit {
                return Acquire::Full;
            }
            // Acquire on success: pairs with the Release in `release`, so the work of the
            // permit whose place we take happens-before ours. Relaxed on failure: we only
            // retry from the value read. `count < limit`: no overflow.
            match self.count.compare_exchange_weak(
                count,
                count + 1,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Acquire::Acquired,
                Err(_) => {
                    // Another holder came or went first: let its core keep the line a
                    // little, then read the count afresh (the value the CAS saw is stale
                    // by then). Relaxed: as the first read.
                    retry.spin();
                    count = self.count.load(Ordering::Relaxed);
                }
            }
        }
    }

    /// Gives back one place. Called exactly once per `Acquired`, by the permit's `Drop`.
    #[inline]
    fn release(&self) {
        // Release: publishes the holder's work to the next acquirer (see the type's docs).
        // The count is at least 1 here (this permit's place), so it never wraps.
        let before = self.count.fetch_sub(1, Ordering::Release);
        debug_assert!(before >= 1, "release of count {before}");
    }

    /// Permits held now.
    pub(crate) fn in_flight(&self) -> u64 {
        // Relaxed: a snapshot for statistics and tests; under the bucket's exclusive lock
        // (eviction), a 0 read here cannot be raised by anyone (see the type's docs).
        self.count.load(Ordering::Relaxed)
    }
}

/// Decides on a tracked key's gauge.
#[inline]
pub(crate) fn acquire_on(gauge: &Arc<Gauge>) -> Result<Permit, AtCapacity> {
    match gauge.try_acquire() {
        Acquire::Acquired => Ok(Permit {
            gauge: Arc::clone(gauge),
            shared: None,
        }),
        Acquire::Full => Err(AtCapacity {
            limit: gauge.limit,
            overflow: false,
        }),
    }
}

/// A permit on a key's gauge and on the shared gauge of its limit (what a request decides
/// while the map is full), or a refusal that leaves both as they were.
///
/// The key's gauge is tried first: a refusal by the shared gauge then gives the key's place
/// back, so no other key's request ever sees a shared place taken and returned. The key's
/// own gauge is raised here only while its map bucket is held (see `Overflow`), so no
/// other request of the key decides while the place is out either; only a snapshot
/// ([`Permit::in_flight`]) can see it.
#[inline]
pub(crate) fn acquire_shared(
    gauge: &Arc<Gauge>,
    shared: &Arc<Gauge>,
) -> Result<Permit, AtCapacity> {
    let refused = Err(AtCapacity {
        limit: gauge.limit,
        overflow: true,
    });
    if gauge.try_acquire() == Acquire::Full {
        return refused;
    }
    if shared.try_acquire() == Acquire::Full {
        // The `Release` of `release` is more than this needs (the request did nothing to
        // publish); a `Relaxed` RMW would keep the count exact as well.
        gauge.release();
        return refused;
    }
    Ok(Permit {
        gauge: Arc::clone(gauge),
        shared: Some(Arc::clone(shared)),
    })
}

/// One place in flight for a key of a [`ConcurrencyLimiter`](super::ConcurrencyLimiter), given
/// back when dropped.
///
/// Keep it alive for exactly as long as the guarded work runs (bind it: `let _permit = ...`,
/// not `let _ = ...`, which drops it at once). It releases on every way out of its scope,
/// including unwinding from a panic. (A panic in a build with `panic = "abort"` ends the
/// process, and with it every count.)
///
/// A permit owns its place: it borrows neither the limiter nor the key, so it can move into
/// another thread or an async task and be dropped there (`Permit: Send + Sync + 'static`).
///
/// # Examples
///
/// ```
/// use tollgate::concurrency::ConcurrencyLimiter;
///
/// let limiter: ConcurrencyLimiter<String> = ConcurrencyLimiter::new(1);
/// let permit = limiter.try_acquire("db")?;
/// let worker = std::thread::spawn(move || {
///     let _permit = permit; // released when the worker finishes
///     // ... use the connection ...
/// });
/// worker.join().unwrap();
/// assert_eq!(limiter.in_flight("db"), 0);
/// # Ok::<(), tollgate::concurrency::AtCapacity>(())
/// ```
#[must_use = "the place is given back as soon as the permit is dropped"]
pub struct Permit {
    /// The key's gauge: the one in the map, or the key's ledger gauge while it overflows.
    gauge: Arc<Gauge>,
    /// The shared gauge of the key's limit, for a permit taken while the map was full.
    shared: Option<Arc<Gauge>>,
}

impl Permit {
    /// The limit of the permit's key.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter: tollgate::concurrency::ConcurrencyLimiter<String> = tollgate::concurrency::ConcurrencyLimiter::new(3);
    /// assert_eq!(limiter.try_acquire("k")?.limit(), 3);
    /// # Ok::<(), tollgate::concurrency::AtCapacity>(())
    /// ```
    #[must_use]
    pub fn limit(&self) -> u64 {
        self.gauge.limit
    }

    /// How many permits of this key are held now, this one included, shared permits of
    /// the key counted with its own (a snapshot).
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter: tollgate::concurrency::ConcurrencyLimiter<String> = tollgate::concurrency::ConcurrencyLimiter::new(3);
    /// let first = limiter.try_acquire("k")?;
    /// let second = limiter.try_acquire("k")?;
    /// assert_eq!(first.in_flight(), 2);
    /// drop(second);
    /// assert_eq!(first.in_flight(), 1);
    /// # Ok::<(), tollgate::concurrency::AtCapacity>(())
    /// ```
    #[must_use]
    pub fn in_flight(&self) -> u64 {
        self.gauge.in_flight()
    }

    /// Whether the permit came from the gauge that keys share while the limiter tracks
    /// [`max_keys`](super::ConcurrencyLimiter::max_keys) keys (see there).
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter: tollgate::concurrency::ConcurrencyLimiter<String> = tollgate::concurrency::ConcurrencyLimiter::new(3);
    /// assert!(!limiter.try_acquire("k")?.is_overflow());
    /// # Ok::<(), tollgate::concurrency::AtCapacity>(())
    /// ```
    #[must_use]
    pub fn is_overflow(&self) -> bool {
        self.shared.is_some()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        // The shared place first: by the time the key's own place is free, and another
        // request of the key can take it, the shared one is back as well. (Either order
        // keeps every count at or above the permits really out.)
        if let Some(shared) = &self.shared {
            shared.release();
        }
        self.gauge.release();
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("in_flight", &self.gauge.in_flight())
            .field("limit", &self.gauge.limit)
            .finish()
    }
}

/// A refusal from [`ConcurrencyLimiter::try_acquire`](super::ConcurrencyLimiter::try_acquire):
/// the key already has its limit of
/// permits in flight. Nothing was changed.
///
/// It carries no retry time: places come back when holders finish, not at a known instant.
/// Callers typically answer 429 or 503, queue the work, or retry after a short backoff.
///
/// # Examples
///
/// ```
/// use tollgate::concurrency::{AtCapacity, ConcurrencyLimiter};
///
/// let limiter: ConcurrencyLimiter<String> = ConcurrencyLimiter::new(1);
/// let _held = limiter.try_acquire("k")?;
/// let refused: AtCapacity = limiter.try_acquire("k").unwrap_err();
/// assert_eq!(refused.limit(), 1);
/// assert_eq!(refused.to_string(), "at its concurrency limit: 1 in flight");
/// # Ok::<(), AtCapacity>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AtCapacity {
    pub(crate) limit: u64,
    pub(crate) overflow: bool,
}

impl AtCapacity {
    /// The key's limit, all of it in flight.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter: tollgate::concurrency::ConcurrencyLimiter<String> = tollgate::concurrency::ConcurrencyLimiter::new(0);
    /// assert_eq!(limiter.try_acquire("closed").unwrap_err().limit(), 0);
    /// ```
    #[must_use]
    pub const fn limit(&self) -> u64 {
        self.limit
    }
}

impl AtCapacity {
    /// Whether the refusal came from the gauge that keys share while the limiter tracks
    /// [`max_keys`](super::ConcurrencyLimiter::max_keys) keys (see there).
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter: tollgate::concurrency::ConcurrencyLimiter<String> = tollgate::concurrency::ConcurrencyLimiter::new(1);
    /// let _held = limiter.try_acquire("k")?;
    /// assert!(!limiter.try_acquire("k").unwrap_err().is_overflow());
    /// # Ok::<(), tollgate::concurrency::AtCapacity>(())
    /// ```
    #[must_use]
    pub const fn is_overflow(&self) -> bool {
        self.overflow
    }
}

impl fmt::Display for AtCapacity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at its concurrency limit: {} in flight", self.limit)
    }
}

impl std::error::Error for AtCapacity {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acquire_up_to_the_limit_then_refuse_without_writing() {
        let gauge = Gauge::new(2);
        assert_eq!(gauge.try_acquire(), Acquire::Acquired);
        assert_eq!(gauge.try_acquire(), Acquire::Acquired);
        assert_eq!(gauge.try_acquire(), Acquire::Full);
        assert_eq!(gauge.in_flight(), 2);
        gauge.release();
        assert_eq!(gauge.in_flight(), 1);
        assert_eq!(gauge.try_acquire(), Acquire::Acquired);
    }

    #[test]
    fn zero_limit_always_full() {
        assert_eq!(Gauge::new(0).try_acquire(), Acquire::Full);
    }

    #[test]
    fn the_largest_limit_counts_to_the_top_without_overflow() {
        let gauge = Gauge::new(u64::MAX);
        gauge.count.store(u64::MAX - 1, Ordering::Relaxed);
        assert_eq!(gauge.try_acquire(), Acquire::Acquired);
        assert_eq!(gauge.in_flight(), u64::MAX);
        assert_eq!(gauge.try_acquire(), Acquire::Full);
        gauge.release();
        assert_eq!(gauge.in_flight(), u64::MAX - 1);
    }
}
