//! [`SystemClock`]: the real monotonic clock.

use super::source::{Clock, Reading};

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

    #[inline]
    fn now_in(&self, reading: &mut Reading) -> u64 {
        let raw = reading.ticks(|| self.clock.raw());
        self.clock.delta_as_nanos(self.origin, raw)
    }
}
