//! The [`Clock`] trait every limiter reads time through, and the clock stopped at one
//! reading that decisions share inside the crate.

use std::sync::Arc;
use std::time::Duration;

/// A source of monotonic time in nanoseconds since an arbitrary zero.
///
/// Implement it to drive a limiter from your own notion of time. A reading that goes
/// backwards is tolerated: elapsed time is then taken as zero, never negative (see the crate
/// docs on faulty clocks).
///
/// # Examples
///
/// ```
/// use tollgate::Clock;
///
/// /// A clock that reads a counter the application advances itself.
/// struct Ticks(std::sync::atomic::AtomicU64);
///
/// impl Clock for Ticks {
///     fn now(&self) -> u64 {
///         self.0.load(std::sync::atomic::Ordering::Relaxed)
///     }
/// }
///
/// let ticks = Ticks(7.into());
/// assert_eq!(ticks.now(), 7);
/// ```
pub trait Clock: Send + Sync {
    /// Nanoseconds since this clock's zero.
    fn now(&self) -> u64;

    /// Blocks the calling thread for `duration` of this clock's time: what the waiting
    /// acquires (`acquire_blocking`) sleep with. The default sleeps the thread for real;
    /// [`FakeClock`](super::FakeClock) moves its own time forward instead, so waiting logic runs instantly and
    /// deterministically in tests.
    fn sleep(&self, duration: Duration) {
        std::thread::sleep(duration);
    }

    /// How far this clock's readings may trail real time: the step in which its time moves.
    /// Zero (the default) for a clock read afresh every time; a cached clock's refresh
    /// period for [`CoarseClock`](super::CoarseClock). Waiting acquires add it to each
    /// sleep, so that one wake-up finds the refill the last refusal announced instead of
    /// polling a reading that has not moved yet.
    fn granularity(&self) -> Duration {
        Duration::ZERO
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    #[inline]
    fn now(&self) -> u64 {
        (**self).now()
    }

    fn sleep(&self, duration: Duration) {
        (**self).sleep(duration);
    }

    fn granularity(&self) -> Duration {
        (**self).granularity()
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    #[inline]
    fn now(&self) -> u64 {
        (**self).now()
    }

    fn sleep(&self, duration: Duration) {
        (**self).sleep(duration);
    }

    fn granularity(&self) -> Duration {
        (**self).granularity()
    }
}

/// Whole nanoseconds in `d`, saturating at `u64::MAX`.
pub(crate) fn duration_to_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A clock stopped at one reading: decisions that must all see the same instant.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fixed(pub(crate) u64);

impl Clock for Fixed {
    #[inline]
    fn now(&self) -> u64 {
        self.0
    }
}
