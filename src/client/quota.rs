//! [`Quota`]: the budget [`Throttle::quota`](super::Throttle::quota) builds, an exact sliding
//! log of the provider's quota over each window plus a margin, and the margin's upkeep: it
//! follows the longest round trip measured, and covers the calls still under way.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::budget::Budget;
use crate::clock::TokioClock;
use crate::keyed::RateLimiter;
use crate::policy::{Algorithm, Policy, PolicyError};

/// The margin a [`Throttle::quota`](super::Throttle::quota) adds to each window before it
/// has measured anything.
const FIRST_MARGIN: Duration = Duration::from_millis(20);

/// The budget [`Throttle::quota`] built, the margin it has added so far, and when each call
/// not answered yet was admitted.
pub(super) struct Quota {
    limiter: Arc<RateLimiter<String, TokioClock>>,
    policy: Policy,
    margin: Mutex<Duration>,
    /// The calls admitted and not answered (nor dropped), by the instant of their admission:
    /// the oldest is a round trip at least that long under way, which the margin must cover
    /// before another call is admitted.
    unanswered: Mutex<BTreeMap<Instant, usize>>,
    /// Whether a task watches the calls under way ([`Quota::watch`]).
    watching: AtomicBool,
}

impl Quota {
    /// The budget of `quota` at the first margin, and its upkeep.
    pub(super) fn new(quota: Policy) -> Result<(Budget, Quota), PolicyError> {
        let limiter = Arc::new(RateLimiter::with_clock(
            widened(quota, FIRST_MARGIN)?,
            TokioClock::new(),
        ));
        let budget = Budget::from(Arc::clone(&limiter));
        let upkeep = Quota {
            limiter,
            policy: quota,
            margin: Mutex::new(FIRST_MARGIN),
            unanswered: Mutex::new(BTreeMap::new()),
            watching: AtomicBool::new(false),
        };
        Ok((budget, upkeep))
    }

    pub(super) fn margin(&self) -> Duration {
        *self.margin.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn unanswered(&self) -> MutexGuard<'_, BTreeMap<Instant, usize>> {
        self.unanswered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A call was admitted at `at`.
    pub(super) fn sent(&self, at: Instant) {
        *self.unanswered().entry(at).or_default() += 1;
    }

    /// The call admitted at `at` was answered at `now`: no longer under way, and its round
    /// trip measured.
    pub(super) fn answered(&self, at: Instant, now: Instant) {
        self.settled(at);
        self.measured(now - at);
    }

    /// The call admitted at `at` will never be answered here (its caller dropped it: a
    /// timeout or a cancellation around the call, an item of `pace`), yet it may have been
    /// sent, and may still arrive at any time: no longer watched, and counted as the longest
    /// round trip the margin covers, so the margin goes to its cap at once.
    pub(super) fn abandoned(&self, at: Instant) {
        self.settled(at);
        self.measured(self.cap());
    }

    /// The call admitted at `at` is no longer under way.
    fn settled(&self, at: Instant) {
        let mut unanswered = self.unanswered();
        if let Some(count) = unanswered.get_mut(&at) {
            *count -= 1;
            if *count == 0 {
                unanswered.remove(&at);
            }
        }
    }

    /// The widest margin: a quarter of the quota's shortest window.
    fn cap(&self) -> Duration {
        self.policy
            .bands()
            .map(|band| band.window() / 4)
            .min()
            .unwrap_or(Duration::ZERO)
    }

    /// Before a call is admitted at `now`: the margin covers every round trip still under
    /// way, as long as it has lasted so far. An arrival comes before its answer, so a call
    /// not answered yet may still arrive; learned only from answers, the margin would let
    /// the next calls be admitted as if the slow ones had arrived within it (four arrivals
    /// in one second of a `2/1s` quota whose first round trips were slower than the margin).
    ///
    /// Widened only while the log still counts the call (a wider log carries only what the
    /// narrower one counts at that instant), so a caller asleep in the queue wakes for it
    /// ([`Quota::next_check`]).
    pub(super) fn cover_unanswered(&self, now: Instant) {
        let oldest = self.unanswered().keys().next().copied();
        if let Some(oldest) = oldest {
            self.measured(now - oldest);
        }
    }

    /// Widens the margin over the calls under way even when no caller is waiting to (one
    /// admitted later would find a slow call already gone from the narrower log, which a
    /// wider one no longer carries): a task that sleeps until the oldest
    /// call under way outlasts the margin ([`Quota::next_check`]), widens it, and ends once
    /// none needs it (no call under way, or the margin at its cap). One at a time; a call
    /// admitted after it ended starts another, and so does one admitted after it was dropped
    /// unfinished with its runtime (a throttle used from one runtime, then another).
    pub(super) fn watch(self: &Arc<Self>) {
        let quota = Arc::clone(self);
        // AcqRel: one watcher at a time; the store that ends one is ordered before the
        // check that starts the next.
        if quota.watching.swap(true, Ordering::AcqRel) {
            return;
        }
        // Made here, not in the task: a task dropped before its first poll drops it too.
        let on_duty = OnDuty {
            quota: Arc::clone(&quota),
            armed: true,
        };
        tokio::spawn(async move {
            // The whole guard moved in (a field alone would be captured otherwise).
            let mut on_duty = on_duty;
            loop {
                match quota.next_check(Instant::now()) {
                    Some(at) => {
                        tokio::time::sleep_until(at).await;
                        quota.cover_unanswered(Instant::now());
                    }
                    None => {
                        quota.watching.store(false, Ordering::Release);
                        // A call admitted meanwhile found the watch on: look once more.
                        if quota.next_check(Instant::now()).is_none()
                            || quota.watching.swap(true, Ordering::AcqRel)
                        {
                            // The watch is off already, or another task's.
                            on_duty.armed = false;
                            return;
                        }
                    }
                }
            }
        });
    }

    /// When the oldest call under way will have outlasted the margin (by a millisecond),
    /// while the log still counts it: the time to widen the margin again. `None` when no
    /// call is under way, or the margin can grow no more for it (past that time already).
    pub(super) fn next_check(&self, now: Instant) -> Option<Instant> {
        let oldest = self.unanswered().keys().next().copied()?;
        let at = oldest + self.margin() + Duration::from_millis(1);
        (at > now).then_some(at)
    }

    /// A call was answered `delay` after it was admitted: widen the margin if it no longer
    /// covers that.
    fn measured(&self, delay: Duration) {
        let mut margin = self.margin.lock().unwrap_or_else(PoisonError::into_inner);
        if delay <= *margin {
            return;
        }
        let cap = self.cap();
        let step = Duration::from_millis(10).as_nanos();
        let wanted = (delay.as_nanos() * 3 / 2).div_ceil(step) * step;
        let wanted = Duration::from_nanos(u64::try_from(wanted).unwrap_or(u64::MAX)).min(cap);
        if wanted <= *margin {
            return;
        }
        // The widened policy was valid at a smaller margin and only its windows grow, up to
        // the longest window a policy may have: never an error, but keep the old one if so.
        if let Ok(policy) = widened(self.policy, wanted) {
            self.limiter.set_policy(policy);
            *margin = wanted;
            // Every key moved now, out of the lock that answers wait on: the calls the
            // narrower log counts at this instant stay counted by the wider one (moved on
            // its next call, a key would carry only those its narrower log still counted
            // then). A later widening meanwhile moves them to its own policy.
            drop(margin);
            self.limiter.move_every_key_now();
        }
    }
}

/// Turns the watch off when its task is dropped before it ended on its own (its runtime shut
/// down, maybe before the task first ran), so that a later call starts another; disarmed
/// where the task turned it off itself.
struct OnDuty {
    quota: Arc<Quota>,
    armed: bool,
}

impl Drop for OnDuty {
    fn drop(&mut self) {
        if self.armed {
            // Release: as the store of a watcher that ends on its own.
            self.quota.watching.store(false, Ordering::Release);
        }
    }
}

/// `quota` with every band a sliding log over its window plus `margin`, at most
/// [`Policy::MAX_WINDOW`]: a window already near it widens only up to it, so every valid
/// quota stays valid widened (its only error is a band of more permits than a log holds).
fn widened(quota: Policy, margin: Duration) -> Result<Policy, PolicyError> {
    let mut bands = quota.bands().map(|band| {
        let window = band.window().saturating_add(margin).min(Policy::MAX_WINDOW);
        Policy::new(Algorithm::SlidingLog, band.permits(), window)
    });
    let first = bands.next().unwrap_or(Ok(quota))?;
    bands.try_fold(first, |policy, band| policy.and(band?))
}
