//! An opt-in cached clock: [`CoarseClock`] reads one shared word that a background thread
//! refreshes from the [`SystemClock`] at a fixed resolution.
//!
//! Reading the time-stamp counter is most of a direct decision (docs/BENCHMARKS.md measures
//! it); loading a word that stays in the reader's cache between refreshes costs far less. The price is precision: every reading lags real
//! time by up to one resolution (more if the refreshing thread is not scheduled in time).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use super::source::Clock;
use super::system::SystemClock;

/// A clock that trades precision for speed: readings come from a word that a background
/// thread refreshes every `resolution`, so reading it is one load instead of a counter read.
///
/// Opt in where the clock read dominates (a direct decision is mostly the clock read) and
/// where decisions that trail real time a little are harmless. The *lag* is how far the
/// reading trails real time: up to one resolution plus the operating system's wake-up
/// latency, more while the refreshing thread waits for a core (the clock then jumps forward;
/// readings never go backwards). What it means for decisions:
///
/// * **Decisions stay exact in the clock's time**: between refreshes racing requests all
///   see one instant, which the limiters handle exactly (what the frozen-clock race tests
///   check).
/// * **Refills are seen late.** A request is judged as if it came at the last refresh, so a
///   refill that fell due since then is not seen yet, and `retry_after` counts from that
///   refresh: a client that retries exactly when told may be refused once more. Waiting
///   acquires add the resolution to each sleep ([`Clock::granularity`]), so they usually
///   wake once (twice when the refresh itself runs late), not in a loop of short sleeps.
/// * **In real time, limits loosen by the lag**, differently per algorithm, because the lag
///   varies between refreshes:
///   - token bucket and sliding counter limit a *rate*: any span of real time admits at
///     most what the policy allows over that span plus one lag. At a 1 ms resolution that is
///     a tenth of a permit at 100 per second (at most one whole permit in a given span) and
///     100 permits at 100,000 per second. Choose a resolution well under the policy's
///     interval (`window / permits`); above about 10,000 per second, where even the finest
///     resolution is not, keep [`SystemClock`].
///   - the sliding log promises *at most N in any window*, and the lag shortens the window:
///     in real time it keeps at most N in any window of `window` minus the lag. A burst
///     stamped just before a refresh leaves the log up to one lag early, so a real-time
///     window of full length can see up to 2N. Where the log's promise must hold in real
///     time (login attempts, one-time codes), keep [`SystemClock`].
///   - a combined policy loosens band by band, as its algorithms do.
///
/// The refreshing thread (named `tollgate-clock`) starts in [`CoarseClock::new`]; clones
/// share it and its reading, and it stops when the last clone is dropped. If that thread
/// were gone (in a child process after `fork`, which copies only the forking thread), the
/// reading would stand still and limiters on it would stop refilling: make the clock after
/// forking. Its zero is the
/// moment it was created, like [`SystemClock`]'s.
///
/// The resolution must lie between [`MIN_RESOLUTION`](Self::MIN_RESOLUTION) (100 µs; finer
/// than that, the refreshing thread would keep a good share of a core busy, and
/// [`SystemClock`] is the better choice) and [`MAX_RESOLUTION`](Self::MAX_RESOLUTION) (1 s).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tollgate::{DirectLimiter, Policy};
/// use tollgate::clock::CoarseClock;
///
/// let clock = CoarseClock::new(Duration::from_millis(1))?;
/// let limiter = DirectLimiter::with_clock("100/1s".parse::<Policy>()?, clock.clone());
/// assert!(limiter.try_acquire().is_allowed());
///
/// let err = CoarseClock::new(Duration::ZERO).unwrap_err();
/// assert_eq!(err.to_string(), "resolution 0ns is outside the supported range of 100µs to 1s");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct CoarseClock {
    /// The reading: the only thing a decision touches.
    reading: Arc<Reading>,
    /// Stops the refreshing thread when the last clone goes.
    _ticker: Arc<Ticker>,
    resolution: Duration,
}

/// What the clock's clones and its refreshing thread share.
#[derive(Debug)]
struct Reading {
    /// Nanoseconds since the clock's zero at the last refresh. On its own cache line: it is
    /// written once per resolution and read by every decision, and nothing else written
    /// should invalidate the readers' copy of it.
    nanos: CachePadded<AtomicU64>,
    /// Set when the last clone is dropped; the thread waits on `wake` between refreshes.
    stop: Mutex<bool>,
    wake: Condvar,
}

/// Owns the refreshing thread; dropped with the last clone of the clock.
#[derive(Debug)]
struct Ticker {
    reading: Arc<Reading>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Ticker {
    fn drop(&mut self) {
        *self
            .reading
            .stop
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = true;
        self.reading.wake.notify_all();
        if let Some(thread) = self.thread.take() {
            // The thread holds no clone of the clock, only the `Reading`, so it never runs
            // this drop itself; it exits at its next wake-up, which `notify_all` makes now.
            let _ = thread.join();
        }
    }
}

impl CoarseClock {
    /// The finest supported resolution: 100 µs.
    pub const MIN_RESOLUTION: Duration = Duration::from_micros(100);
    /// The coarsest supported resolution: 1 s.
    pub const MAX_RESOLUTION: Duration = Duration::from_secs(1);

    /// A clock refreshed every `resolution`, whose zero is now. Starts the refreshing thread.
    ///
    /// # Errors
    ///
    /// [`ClockError::Resolution`] when `resolution` is outside
    /// [`MIN_RESOLUTION`](Self::MIN_RESOLUTION)..=[`MAX_RESOLUTION`](Self::MAX_RESOLUTION);
    /// [`ClockError::Spawn`] when the operating system refuses the thread.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::clock::{ClockError, CoarseClock};
    ///
    /// let clock = CoarseClock::new(Duration::from_millis(1))?;
    /// assert_eq!(clock.resolution(), Duration::from_millis(1));
    /// assert_eq!(
    ///     CoarseClock::new(Duration::from_secs(2)).unwrap_err(),
    ///     ClockError::Resolution { resolution: Duration::from_secs(2) },
    /// );
    /// # Ok::<(), ClockError>(())
    /// ```
    pub fn new(resolution: Duration) -> Result<Self, ClockError> {
        Self::following(resolution, SystemClock::new())
    }

    /// A clock refreshed every `resolution` from `source`, with `source`'s zero.
    fn following<S: Clock + Send + 'static>(
        resolution: Duration,
        source: S,
    ) -> Result<Self, ClockError> {
        if !(Self::MIN_RESOLUTION..=Self::MAX_RESOLUTION).contains(&resolution) {
            return Err(ClockError::Resolution { resolution });
        }
        let reading = Arc::new(Reading {
            nanos: CachePadded::new(AtomicU64::new(source.now())),
            stop: Mutex::new(false),
            wake: Condvar::new(),
        });
        let thread = std::thread::Builder::new()
            .name("tollgate-clock".into())
            .spawn({
                let reading = Arc::clone(&reading);
                move || refresh(&reading, &source, resolution)
            })
            .map_err(|err| ClockError::Spawn {
                message: err.to_string(),
            })?;
        Ok(CoarseClock {
            _ticker: Arc::new(Ticker {
                reading: Arc::clone(&reading),
                thread: Some(thread),
            }),
            reading,
            resolution,
        })
    }

    /// How often the reading is refreshed: the most it lags real time while the refreshing
    /// thread keeps up.
    ///
    /// # Examples
    ///
    /// ```
    /// # use std::time::Duration;
    /// let clock = tollgate::clock::CoarseClock::new(Duration::from_millis(5))?;
    /// assert_eq!(clock.resolution(), Duration::from_millis(5));
    /// # Ok::<(), tollgate::clock::ClockError>(())
    /// ```
    #[must_use]
    pub fn resolution(&self) -> Duration {
        self.resolution
    }
}

/// The refreshing thread: stores the source's time once per resolution, on a fixed
/// schedule, until told to stop.
fn refresh<S: Clock>(reading: &Reading, source: &S, resolution: Duration) {
    let mut last = reading.nanos.load(Ordering::Relaxed);
    let mut due = Instant::now();
    let mut stop = reading.stop.lock().unwrap_or_else(PoisonError::into_inner);
    while !*stop {
        // Never store less than before, even if the counter read on another core is a
        // little behind: readers must never see time go backwards.
        last = last.max(source.now());
        // Relaxed: the word carries no other data, so readers need only some value in its
        // modification order; per-location coherence keeps each reader's successive loads
        // from going backwards, and this thread is the only writer, storing a non-decreasing
        // sequence.
        reading.nanos.store(last, Ordering::Relaxed);
        // Wake at fixed instants, so that the time spent waking and refreshing does not add
        // up into a longer period; after a stall, start again from now instead of catching
        // up with a burst of refreshes.
        due += resolution;
        let started = Instant::now();
        if due <= started {
            due = started + resolution;
        }
        // `wait_timeout_while` sleeps through spurious wake-ups, so a refresh is never
        // skipped by one; it returns at the deadline or as soon as `stop` is set.
        stop = reading
            .wake
            .wait_timeout_while(stop, due - started, |stop| !*stop)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}

impl Clock for CoarseClock {
    #[inline]
    fn now(&self) -> u64 {
        // Relaxed: see `refresh`.
        self.reading.nanos.load(Ordering::Relaxed)
    }

    /// The resolution: how far a reading may trail real time while the refreshing thread
    /// keeps up.
    fn granularity(&self) -> Duration {
        self.resolution
    }
}

/// Why a [`CoarseClock`](CoarseClock) could not be started.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tollgate::clock::{ClockError, CoarseClock};
///
/// let err = CoarseClock::new(Duration::from_micros(10)).unwrap_err();
/// assert_eq!(err, ClockError::Resolution { resolution: Duration::from_micros(10) });
/// assert_eq!(err.to_string(), "resolution 10µs is outside the supported range of 100µs to 1s");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClockError {
    /// `resolution` is outside
    /// [`CoarseClock::MIN_RESOLUTION`](CoarseClock::MIN_RESOLUTION)..=[`CoarseClock::MAX_RESOLUTION`](CoarseClock::MAX_RESOLUTION).
    Resolution {
        /// The resolution asked for.
        resolution: Duration,
    },
    /// The operating system refused to start the refreshing thread.
    Spawn {
        /// The operating system's error, as text.
        message: String,
    },
}

impl fmt::Display for ClockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClockError::Resolution { resolution } => write!(
                f,
                "resolution {resolution:?} is outside the supported range of {:?} to {:?}",
                CoarseClock::MIN_RESOLUTION,
                CoarseClock::MAX_RESOLUTION
            ),
            ClockError::Spawn { message } => {
                write!(f, "the clock's refreshing thread did not start: {message}")
            }
        }
    }
}

impl std::error::Error for ClockError {}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    fn clock() -> CoarseClock {
        CoarseClock::new(CoarseClock::MIN_RESOLUTION).expect("a valid resolution")
    }

    #[test]
    fn resolutions_outside_the_range_are_refused_with_the_value() {
        for resolution in [
            Duration::ZERO,
            Duration::from_nanos(1),
            CoarseClock::MIN_RESOLUTION - Duration::from_nanos(1),
            CoarseClock::MAX_RESOLUTION + Duration::from_nanos(1),
            Duration::MAX,
        ] {
            let err = CoarseClock::new(resolution).unwrap_err();
            assert_eq!(err, ClockError::Resolution { resolution });
            assert!(
                err.to_string()
                    .starts_with(&format!("resolution {resolution:?} ")),
                "{err}"
            );
        }
        for resolution in [CoarseClock::MIN_RESOLUTION, CoarseClock::MAX_RESOLUTION] {
            assert_eq!(
                CoarseClock::new(resolution).unwrap().resolution(),
                resolution
            );
        }
    }

    #[test]
    fn it_moves_forward_and_never_backwards() {
        let clock = clock();
        let mut last = clock.now();
        let mut changes = 0;
        until(
            || {
                let now = clock.now();
                assert!(now >= last, "went back from {last} to {now}");
                if now > last {
                    changes += 1;
                }
                last = now;
                changes >= 3
            },
            "three changes of the reading",
        );
    }

    /// Waits (30 s at most) until `done` holds.
    fn until(mut done: impl FnMut() -> bool, what: &str) {
        let give_up = Instant::now() + Duration::from_secs(30);
        while !done() {
            assert!(Instant::now() < give_up, "gave up waiting: {what}");
            std::thread::yield_now();
        }
    }

    #[test]
    fn it_is_never_ahead_of_the_clock_it_follows() {
        // A clone of the source keeps its zero, so the two read the same time scale; the
        // reading is the source's time at the last refresh, so a source read afterwards can
        // only be later, give or take the skew between the two cores' counters (allowed up
        // to 10 us). A clock that ran ahead by its resolution (100 us) fails this.
        let source = SystemClock::new();
        let clock = CoarseClock::following(CoarseClock::MIN_RESOLUTION, source.clone()).unwrap();
        let mut last = clock.now();
        let mut refreshes = 0;
        until(
            || {
                let reading = clock.now();
                let after = source.now();
                assert!(
                    reading <= after + SKEW,
                    "reading {reading} ran ahead of {after}"
                );
                if reading != last {
                    refreshes += 1;
                    last = reading;
                }
                refreshes >= 5
            },
            "five refreshes",
        );
    }

    /// How far two cores' time-stamp counters may disagree in the tests.
    const SKEW: u64 = 10_000;

    /// A source that reads 1,000 once and 500 ever after, counting its reads.
    #[derive(Default)]
    struct StepsBack(AtomicU64);

    impl Clock for StepsBack {
        fn now(&self) -> u64 {
            if self.0.fetch_add(1, Ordering::Relaxed) == 0 {
                1_000
            } else {
                500
            }
        }
    }

    #[test]
    fn a_source_going_backwards_leaves_the_reading_where_it_was() {
        let source = Arc::new(StepsBack::default());
        let clock =
            CoarseClock::following(CoarseClock::MIN_RESOLUTION, Arc::clone(&source)).unwrap();
        assert_eq!(clock.now(), 1_000);
        // Several refreshes read 500; the reading must stay at 1,000.
        until(|| source.0.load(Ordering::Relaxed) >= 5, "five refreshes");
        assert_eq!(clock.now(), 1_000);
        assert_eq!(clock.granularity(), CoarseClock::MIN_RESOLUTION);
    }

    #[test]
    fn clones_share_the_thread_which_stops_with_the_last() {
        let clock = clock();
        let reading = Arc::downgrade(&clock.reading);
        let clone = clock.clone();
        drop(clock);
        // The clone still has the reading, and it still moves.
        let first = clone.now();
        let give_up = Instant::now() + Duration::from_secs(30);
        while clone.now() == first {
            assert!(
                Instant::now() < give_up,
                "the clone's reading stopped moving"
            );
            std::thread::yield_now();
        }
        drop(clone);
        // Dropping the last clone joined the thread, which held the other reference.
        assert!(
            reading.upgrade().is_none(),
            "the refreshing thread outlived the clock"
        );
    }

    #[test]
    fn a_limiter_runs_on_it() {
        let clock = CoarseClock::new(CoarseClock::MAX_RESOLUTION).unwrap();
        let limiter = crate::DirectLimiter::with_clock("3/1h".parse().unwrap(), clock);
        let decisions: Vec<_> = (0..4).map(|_| limiter.try_acquire()).collect();
        assert_eq!(
            decisions
                .iter()
                .map(|d| (d.is_allowed(), d.remaining()))
                .collect::<Vec<_>>(),
            [(true, 2), (true, 1), (true, 0), (false, 0)]
        );
        // 3 per hour: the next permit is 20 minutes after the first admission; the reading
        // can have moved since by a refresh, not by minutes.
        let wait = decisions[3].retry_after();
        assert!(
            wait > Duration::from_secs(19 * 60) && wait <= Duration::from_secs(20 * 60),
            "{wait:?}"
        );
    }
}
