//! Waiting instead of refusing: [`Wait`], how a waiting acquire waits (a timeout, jitter),
//! and the loops behind `acquire_blocking` (threads) and, with the `tokio` feature,
//! `acquire` (async), for a client that must stay under someone else's quota.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::wait::Wait;
//! use tollgate::{Clock, FakeClock, RateLimiter};
//!
//! let clock = FakeClock::new(); // its sleeps move its own time
//! let limiter: RateLimiter<String, FakeClock> =
//!     RateLimiter::with_clock("1/s".parse()?, clock.clone());
//! let patient = Wait::new().timeout(Duration::from_secs(5));
//! assert!(limiter.acquire_blocking_with("upstream", patient).is_ok());
//! assert!(limiter.acquire_blocking_with("upstream", patient).is_ok()); // waited 1 s
//! assert_eq!(clock.now(), 1_000_000_000);
//! let hurried = Wait::new().timeout(Duration::from_millis(100));
//! assert!(limiter.acquire_blocking_with("upstream", hurried).is_err()); // would wait 1 s
//! # Ok::<(), tollgate::PolicyError>(())
//! ```
//!
//! A waiter tries, and when refused sleeps the decision's `retry_after` (plus the clock's
//! [`granularity`](Clock::granularity), zero except for cached clocks, and optional jitter, so
//! that waiters refused together do not all retry at the same instant) on the limiter's own
//! clock, then tries again. A refusal spends nothing, so waiting is exactly as
//! exact as deciding: N waiters on one key are admitted at the policy's rate, never faster.
//! With a timeout, a waiter gives up as soon as the next possible admission would come after
//! its deadline, or once the deadline has passed, and returns the last refusal. That
//! admission is counted from a reading of the clock taken just before the attempt, so a
//! waiter never gives up on an admission that would come in time; its sleep is counted
//! from a reading taken after the attempt, so it never sleeps past its deadline (when an
//! admission misses the deadline by less than the attempt took, a round trip to Redis,
//! the waiter sleeps to its deadline and gives up after one more refusal). With or without
//! a timeout, a waiter whose clock has reached the end of its range (where no admission
//! can come) gives up at once.

use std::cell::Cell;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::time::Duration;

use crate::clock::duration_to_nanos;
use crate::clock::Clock;
use crate::decision::Decision;

/// How a waiting acquire waits: an optional timeout and optional jitter.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tollgate::{DirectLimiter, FakeClock};
/// use tollgate::wait::Wait;
///
/// let clock = FakeClock::new();
/// let limiter = DirectLimiter::with_clock("1/s".parse()?, clock.clone());
/// let _ = limiter.try_acquire();
/// // The next permit comes in 1 s: a 100 ms timeout gives up at once with the refusal.
/// let gave_up = limiter.acquire_blocking_with(Wait::new().timeout(Duration::from_millis(100)));
/// assert_eq!(gave_up.unwrap_err().retry_after(), Duration::from_secs(1));
/// // Without one it waits (on the fake clock: instantly) and is admitted at 1 s.
/// assert!(limiter.acquire_blocking().is_allowed());
/// assert_eq!(tollgate::Clock::now(&clock), 1_000_000_000);
/// # Ok::<(), tollgate::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Wait {
    timeout: Option<Duration>,
    jitter: Duration,
}

impl Wait {
    /// Wait as long as it takes, with no jitter.
    ///
    /// # Examples
    ///
    /// ```
    /// assert_eq!(tollgate::wait::Wait::new(), tollgate::wait::Wait::default());
    /// ```
    #[must_use]
    pub const fn new() -> Self {
        Wait {
            timeout: None,
            jitter: Duration::ZERO,
        }
    }

    /// Give up when admission cannot come within `timeout` of the call, returning the last
    /// refusal.
    ///
    /// # Examples
    ///
    /// ```
    /// let wait = tollgate::wait::Wait::new().timeout(std::time::Duration::from_secs(2));
    /// # let _ = wait;
    /// ```
    #[must_use]
    pub const fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Add a random delay in `[0, jitter)` to every sleep, so that waiters refused together
    /// spread out instead of retrying in lockstep.
    ///
    /// # Examples
    ///
    /// ```
    /// let wait = tollgate::wait::Wait::new().jitter(std::time::Duration::from_millis(5));
    /// # let _ = wait;
    /// ```
    #[must_use]
    pub const fn jitter(mut self, jitter: Duration) -> Self {
        self.jitter = jitter;
        self
    }
}

/// What a waiter does after one attempt.
pub(crate) enum Next {
    Admitted(Decision),
    GiveUp(Decision),
    Sleep(Duration),
}

/// A waiter's schedule: when it started and what it may wait for.
pub(crate) struct Schedule {
    deadline: Option<u64>,
    jitter: u64,
    /// The clock's [`granularity`](Clock::granularity), added to every sleep: a refusal's
    /// `retry_after` counts from a reading that may trail real time by that much, so a
    /// sleep of `retry_after` alone can wake before the reading has reached the refill.
    granularity: u64,
}

impl Schedule {
    pub(crate) fn start<C: Clock>(clock: &C, wait: &Wait) -> Self {
        Schedule {
            deadline: wait
                .timeout
                .map(|t| clock.now().saturating_add(duration_to_nanos(t))),
            jitter: duration_to_nanos(wait.jitter),
            granularity: duration_to_nanos(clock.granularity()),
        }
    }

    /// The step after an attempt that got `decision`, the clock having read `before` just
    /// before the attempt, and reading `after` it: the attempt decided at `before` or later,
    /// so `before` plus its `retry_after` is never after the admission it names, and a
    /// waiter never gives up on one that would come in time; the sleep starts at `after`.
    pub(crate) fn next(
        &self,
        decision: Decision,
        before: u64,
        after: impl FnOnce() -> u64,
    ) -> Next {
        if decision.is_allowed() {
            return Next::Admitted(decision);
        }
        // A refusal always names a wait of at least 1 ns.
        let wait = decision.retry_after_nanos().max(1);
        let ready = before.saturating_add(wait);
        // A wait that reaches the end of the clock's range never ends: no admission comes
        // there (and a deadline saturated there too would never be passed), so the waiter
        // would sleep and retry for ever.
        if ready == u64::MAX {
            return Next::GiveUp(decision);
        }
        let mut pause = wait
            .saturating_add(self.granularity)
            .saturating_add(random_below(self.jitter));
        if let Some(deadline) = self.deadline {
            let now = after().max(before);
            // An admission after the deadline, or a deadline passed during the attempt.
            if ready > deadline || now >= deadline {
                return Next::GiveUp(decision);
            }
            // Neither the wait nor jitter carries a waiter past its deadline, give or take
            // the clock's granularity: on a cached clock the reading may trail by that much,
            // and capping at the bare remainder would re-sleep it in short steps until the
            // next refresh.
            pause = pause.min((deadline - now).saturating_add(self.granularity));
        }
        Next::Sleep(Duration::from_nanos(pause))
    }
}

/// Tries with `attempt` until admitted or out of time, sleeping on `clock`. The outer
/// `Err` is an attempt's own error (a cost the policy cannot admit), returned at once:
/// waiting cannot cure it.
pub(crate) fn block<C: Clock, E>(
    clock: &C,
    wait: &Wait,
    mut attempt: impl FnMut() -> Result<Decision, E>,
) -> Result<Result<Decision, Decision>, E> {
    let schedule = Schedule::start(clock, wait);
    loop {
        let before = clock.now();
        match schedule.next(attempt()?, before, || clock.now()) {
            Next::Admitted(decision) => return Ok(Ok(decision)),
            Next::GiveUp(decision) => return Ok(Err(decision)),
            Next::Sleep(pause) => clock.sleep(pause),
        }
    }
}

/// The async twin of [`block`]: sleeps with tokio's timer, and an attempt may itself be
/// awaited (a Redis round trip).
#[cfg(feature = "tokio")]
pub(crate) async fn wait_async<C: Clock, E, F>(
    clock: &C,
    wait: &Wait,
    mut attempt: impl FnMut() -> F,
) -> Result<Result<Decision, Decision>, E>
where
    F: std::future::Future<Output = Result<Decision, E>>,
{
    let schedule = Schedule::start(clock, wait);
    loop {
        let before = clock.now();
        match schedule.next(attempt().await?, before, || clock.now()) {
            Next::Admitted(decision) => return Ok(Ok(decision)),
            Next::GiveUp(decision) => return Ok(Err(decision)),
            Next::Sleep(pause) => tokio::time::sleep(pause).await,
        }
    }
}

/// A pseudo-random number in `[0, bound)` (0 when `bound` is 0): xorshift on a per-thread
/// seed drawn from the standard library's random hasher keys. Jitter needs spread, not
/// unpredictability.
fn random_below(bound: u64) -> u64 {
    if bound == 0 {
        return 0;
    }
    thread_local! {
        static STATE: Cell<u64> = Cell::new(RandomState::new().hash_one(0u64) | 1);
    }
    STATE.with(|state| {
        let mut x = state.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        state.set(x);
        x % bound
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_below_its_bound_and_spreads() {
        let draws: Vec<u64> = (0..1000).map(|_| random_below(10)).collect();
        assert!(draws.iter().all(|&d| d < 10));
        assert!((0..10).all(|v| draws.contains(&v)), "every value appears");
        assert_eq!(random_below(0), 0);
    }

    #[test]
    fn a_waiter_gives_up_only_when_admission_comes_after_its_deadline() {
        let schedule = Schedule {
            deadline: Some(1_000),
            jitter: 0,
            granularity: 0,
        };
        let refused = |retry| Decision::deny(0, 1, retry, retry);
        assert!(
            matches!(schedule.next(refused(500), 400, || 400), Next::Sleep(d) if d == Duration::from_nanos(500))
        );
        assert!(matches!(
            schedule.next(refused(600), 400, || 400),
            Next::Sleep(_)
        ));
        assert!(matches!(
            schedule.next(refused(601), 400, || 400),
            Next::GiveUp(_)
        ));
        let jittery = Schedule {
            deadline: Some(1_000),
            jitter: 10_000,
            granularity: 0,
        };
        for _ in 0..100 {
            match jittery.next(refused(100), 400, || 400) {
                Next::Sleep(d) => assert!(d <= Duration::from_nanos(600), "{d:?}"),
                _ => panic!("expected a sleep"),
            }
        }
    }

    /// A slow attempt (a Redis call timing out) counts its refusal's wait from before it,
    /// but sleeps from after it: never past the deadline, and a deadline passed during the
    /// attempt ends the wait.
    #[test]
    fn a_slow_attempt_never_carries_a_waiter_past_its_deadline() {
        let schedule = Schedule {
            deadline: Some(1_500),
            jitter: 0,
            granularity: 0,
        };
        let refused = |retry| Decision::deny(0, 1, retry, retry);
        assert!(matches!(
            schedule.next(refused(1_000), 0, || 1_000),
            Next::Sleep(d) if d == Duration::from_nanos(500)
        ));
        assert!(matches!(
            schedule.next(refused(100), 1_000, || 1_500),
            Next::GiveUp(_)
        ));
    }

    /// At the end of the clock's range the deadline saturates as the admission does, and a
    /// waiter without one would wait for ever: either gives up rather than sleep and retry
    /// for ever.
    #[test]
    fn a_waiter_at_the_end_of_the_clock_s_range_gives_up() {
        let now = u64::MAX - 500_000_000;
        let refused = Decision::deny(0, 1, 1_000_000_000, 1_000_000_000);
        for deadline in [Some(now.saturating_add(1_000_000_000)), None] {
            let at_the_end = Schedule {
                deadline,
                jitter: 0,
                granularity: 0,
            };
            assert!(
                matches!(at_the_end.next(refused, now, || now), Next::GiveUp(_)),
                "{deadline:?}"
            );
        }
    }

    #[test]
    fn a_coarse_clock_adds_its_granularity_to_each_sleep_and_to_the_deadline_cap() {
        let coarse = Schedule {
            deadline: Some(10_000),
            jitter: 0,
            granularity: 1_000,
        };
        let refused = |retry| Decision::deny(0, 1, retry, retry);
        assert!(
            matches!(coarse.next(refused(500), 400, || 400), Next::Sleep(d) if d == Duration::from_nanos(1_500))
        );
        assert!(matches!(
            coarse.next(refused(1_001), 9_000, || 9_000),
            Next::GiveUp(_)
        ));
        // Near the deadline, jitter is capped at the remainder plus the granularity.
        let jittery = Schedule {
            deadline: Some(10_000),
            jitter: 100_000,
            granularity: 1_000,
        };
        for _ in 0..100 {
            match jittery.next(refused(500), 9_000, || 9_000) {
                Next::Sleep(d) => assert!(
                    d >= Duration::from_nanos(1_500) && d <= Duration::from_nanos(2_000),
                    "{d:?}"
                ),
                _ => panic!("expected a sleep"),
            }
        }
    }
}
