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

    /// This clock's time, in the nanoseconds of [`now`](Clock::now), at one reading shared
    /// by the clocks of a decision over several limiters ([`AllOf`](crate::AllOf)), so that
    /// the parts decide at one instant and the decision pays for one reading, not one per
    /// part.
    ///
    /// The default is [`now`](Clock::now), read afresh; it leaves `reading` alone (a clock
    /// of its own decides at its own instant). [`SystemClock`](super::SystemClock) takes the
    /// reading of the machine's counter if `reading` holds none yet, and answers from the
    /// one it holds, which every `SystemClock` shares.
    ///
    /// An implementation must answer what `now` would have answered at some instant since
    /// `reading` was made: the same zero, never ahead of a `now` read after it. The limiters
    /// decide with it as with `now`.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::clock::{Clock, FakeClock, Reading};
    ///
    /// let clock = FakeClock::new();
    /// let mut reading = Reading::default();
    /// assert_eq!(clock.now_in(&mut reading), 0); // a clock of its own: its own time
    /// ```
    #[inline]
    fn now_in(&self, reading: &mut Reading) -> u64 {
        let _ = reading;
        self.now()
    }
}

/// One reading of the machine's monotonic counter, shared by the clocks of one decision over
/// several limiters (see [`Clock::now_in`]): empty until the first clock that can use it
/// takes it. Make one per decision: a reading kept stops time for every clock given it (it
/// is neither `Clone` nor `Copy`, so that one is not kept by mistake).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tollgate::clock::{Clock, Reading, SystemClock};
///
/// let (first, second) = (SystemClock::new(), SystemClock::new());
/// let mut reading = Reading::default();
/// let at_first = first.now_in(&mut reading); // reads the counter
/// std::thread::sleep(Duration::from_millis(2));
/// let at_second = second.now_in(&mut reading); // the same reading, from its own zero
/// assert!(at_second <= at_first, "the second clock started later, at the same instant");
/// assert_eq!(first.now_in(&mut reading), at_first);
/// assert!(first.now() > at_first);
/// ```
#[derive(Debug, Default)]
pub struct Reading {
    /// The counter's raw value, once read (`quanta::Clock::raw`: every `quanta::Clock` of
    /// the process reads the same counter, calibrated once).
    ticks: Option<u64>,
}

impl Reading {
    /// Whether a clock took the reading.
    #[cfg(test)]
    pub(crate) fn is_taken(&self) -> bool {
        self.ticks.is_some()
    }

    /// The reading, taken with `read` if there is none yet.
    #[inline]
    pub(super) fn ticks(&mut self, read: impl FnOnce() -> u64) -> u64 {
        *self.ticks.get_or_insert_with(read)
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    #[inline]
    fn now(&self) -> u64 {
        (**self).now()
    }

    #[inline]
    fn now_in(&self, reading: &mut Reading) -> u64 {
        (**self).now_in(reading)
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

    #[inline]
    fn now_in(&self, reading: &mut Reading) -> u64 {
        (**self).now_in(reading)
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::{Clock, Reading};
    use crate::clock::{CoarseClock, FakeClock, SystemClock};

    /// What a clock answers, asked through the `Clock` impl of its own type `C` (a
    /// reference, an `Arc`): its time, its time at `reading`, and its granularity.
    fn answers<C: Clock>(clock: C, reading: &mut Reading) -> (u64, u64, Duration) {
        (clock.now(), clock.now_in(reading), clock.granularity())
    }

    /// Sleeps `clock` through the `Clock` impl of its own type `C`.
    fn sleep_on<C: Clock>(clock: C, duration: Duration) {
        clock.sleep(duration);
    }

    /// A clock of its own answers its own time at any reading, and leaves the reading empty;
    /// a reference and an `Arc` answer as the clock does.
    #[test]
    fn a_clock_of_its_own_answers_its_time_through_references() {
        let clock = FakeClock::new();
        clock.advance(Duration::from_secs(5));
        let mut reading = Reading::default();
        assert_eq!(clock.now_in(&mut reading), 5_000_000_000);
        assert!(!reading.is_taken());
        let own = (5_000_000_000, 5_000_000_000, Duration::ZERO);
        assert_eq!(answers(&clock, &mut reading), own);
        assert_eq!(answers(Arc::new(clock.clone()), &mut reading), own);

        sleep_on(&clock, Duration::from_secs(1));
        sleep_on(Arc::new(clock.clone()), Duration::from_secs(1));
        assert_eq!(
            clock.now(),
            7_000_000_000,
            "both slept on the fake clock's time"
        );

        let coarse = CoarseClock::new(Duration::from_millis(2)).unwrap();
        assert_eq!(answers(&coarse, &mut reading).2, Duration::from_millis(2));
        assert_eq!(
            answers(Arc::new(coarse), &mut reading).2,
            Duration::from_millis(2)
        );
    }

    /// A clock that only says `now`: the defaults sleep the thread for real and answer `now`
    /// at any reading.
    #[test]
    fn the_defaults_sleep_for_real_and_answer_now() {
        struct Seven;
        impl Clock for Seven {
            fn now(&self) -> u64 {
                7
            }
        }
        let mut reading = Reading::default();
        assert_eq!(Seven.now_in(&mut reading), 7);
        let started = std::time::Instant::now();
        Seven.sleep(Duration::from_millis(5));
        assert!(started.elapsed() >= Duration::from_millis(5));
    }

    /// Every system clock, through a reference or an `Arc`, answers from the one reading it
    /// shares.
    #[test]
    fn system_clocks_share_one_reading_through_references() {
        let clock = SystemClock::new();
        let mut reading = Reading::default();
        let first = clock.now_in(&mut reading);
        assert!(reading.is_taken());
        std::thread::sleep(Duration::from_millis(1));
        assert_eq!(answers(&clock, &mut reading).1, first);
        assert_eq!(answers(Arc::new(clock.clone()), &mut reading).1, first);
        assert!(clock.now() > first);
    }
}
