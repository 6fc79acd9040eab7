//! [`FakeClock`]: a clock moved by hand, for tests.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::source::{duration_to_nanos, Clock};

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
