//! Where time comes from: the [`Clock`] trait, the real [`SystemClock`] and the test
//! [`FakeClock`].
//!
//! Limiters read the clock once per decision (again only when a compare-and-swap has to be
//! retried). Readings are nanoseconds since an arbitrary zero chosen by the clock; only
//! differences between readings of one clock matter.

use std::sync::atomic::{AtomicU64, Ordering};
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
    /// [`FakeClock`] moves its own time forward instead, so waiting logic runs instantly and
    /// deterministically in tests.
    fn sleep(&self, duration: Duration) {
        std::thread::sleep(duration);
    }

    /// How far this clock's readings may trail real time: the step in which its time moves.
    /// Zero (the default) for a clock read afresh every time; a cached clock's refresh
    /// period for [`CoarseClock`](crate::CoarseClock). Waiting acquires add it to each
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

/// The real monotonic clock, read through `quanta` (the CPU's time-stamp counter where it is
/// reliable, the OS monotonic clock elsewhere).
///
/// Its zero is the moment it was created. Cloning is cheap and keeps the zero.
///
/// # Examples
///
/// ```
/// use tollgate::{Clock, SystemClock};
///
/// let clock = SystemClock::new();
/// let a = clock.now();
/// let b = clock.now();
/// assert!(b >= a);
/// ```
#[derive(Clone, Debug)]
pub struct SystemClock {
    clock: quanta::Clock,
    origin: u64,
}

impl SystemClock {
    /// A clock whose zero is now.
    ///
    /// # Examples
    ///
    /// ```
    /// let clock = tollgate::SystemClock::new();
    /// # let _ = clock;
    /// ```
    #[must_use]
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        SystemClock { clock, origin }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    #[inline]
    fn now(&self) -> u64 {
        // `delta_as_nanos` scales raw counter ticks to nanoseconds and returns 0 for a reading
        // below the origin, so the result never goes below zero.
        self.clock.delta_as_nanos(self.origin, self.clock.raw())
    }
}

/// A clock that moves only when told to: for tests, simulations and the reference traces.
///
/// Clones share one time, so a test keeps a clone and moves the limiter's clock from outside.
/// It starts at zero.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tollgate::{Clock, FakeClock};
///
/// let clock = FakeClock::new();
/// let shared = clock.clone();
/// clock.advance(Duration::from_millis(100));
/// assert_eq!(shared.now(), 100_000_000);
/// shared.set(Duration::from_millis(1300));
/// assert_eq!(clock.now(), 1_300_000_000);
/// ```
#[derive(Clone, Debug, Default)]
pub struct FakeClock {
    nanos: Arc<AtomicU64>,
}

impl FakeClock {
    /// A clock at zero.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{Clock, FakeClock};
    /// assert_eq!(FakeClock::new().now(), 0);
    /// ```
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves time forward by `by` (saturating at `u64::MAX` nanoseconds).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Clock, FakeClock};
    ///
    /// let clock = FakeClock::new();
    /// clock.advance(Duration::from_micros(3));
    /// assert_eq!(clock.now(), 3_000);
    /// ```
    pub fn advance(&self, by: Duration) {
        let by = duration_to_nanos(by);
        // Relaxed: the clock is a single word and carries no other data; readers only need
        // some value in its modification order.
        let _ = self
            .nanos
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(t.saturating_add(by))
            });
    }

    /// Sets the time to `to` after the clock's zero. It may go backwards, to simulate a
    /// faulty clock.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{Clock, FakeClock};
    ///
    /// let clock = FakeClock::new();
    /// clock.set(Duration::from_secs(2));
    /// clock.set(Duration::from_secs(1));
    /// assert_eq!(clock.now(), 1_000_000_000);
    /// ```
    pub fn set(&self, to: Duration) {
        // Relaxed: see `advance`.
        self.nanos.store(duration_to_nanos(to), Ordering::Relaxed);
    }
}

impl Clock for FakeClock {
    #[inline]
    fn now(&self) -> u64 {
        // Relaxed: see `advance`.
        self.nanos.load(Ordering::Relaxed)
    }

    /// Simulated sleep: moves the shared time forward by `duration` and returns at once.
    fn sleep(&self, duration: Duration) {
        self.advance(duration);
    }
}

/// A clock that follows tokio's time (feature `tokio`): real time normally, and paused or
/// advanced time in tests (`#[tokio::test(start_paused = true)]`,
/// `tokio::time::advance`), so async waiting can be tested without real sleeping.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use std::time::Duration;
/// use tollgate::{Clock, TokioClock};
///
/// let clock = TokioClock::new();
/// tokio::time::advance(Duration::from_millis(5)).await;
/// assert_eq!(clock.now(), 5_000_000);
/// # }
/// ```
#[cfg(feature = "tokio")]
#[derive(Clone, Copy, Debug)]
pub struct TokioClock {
    origin: tokio::time::Instant,
}

#[cfg(feature = "tokio")]
impl TokioClock {
    /// A clock whose zero is tokio's now.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let clock = tollgate::TokioClock::new();
    /// # let _ = clock;
    /// # }
    /// ```
    #[must_use]
    pub fn new() -> Self {
        TokioClock {
            origin: tokio::time::Instant::now(),
        }
    }
}

#[cfg(feature = "tokio")]
impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(feature = "tokio")]
impl Clock for TokioClock {
    fn now(&self) -> u64 {
        duration_to_nanos(self.origin.elapsed())
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
