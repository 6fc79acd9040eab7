//! How a loop waits for another thread: one [`Retry`] per loop, for every retry loop of the
//! engine, of the direct limiter, of the keyed registry, of the concurrency permits' count
//! and of the login guard's strike record.
//!
//! Every such loop repeats only while another thread is in the middle of something short: a
//! writer between its compare-and-swap and its publishing store, a writer that won the
//! compare-and-swap this one lost, a policy change between retiring the old state and
//! publishing the new one, or a policy change that replaced the keyed registry's generation
//! while a request looked in it. [`Retry`] says how long to wait before the next attempt
//! ([`spin`](Retry::spin) after a lost compare-and-swap, [`snooze`](Retry::snooze) while
//! another thread finishes, [`again`](Retry::again) when the next attempt can start at once)
//! and counts the attempts.
//!
//! Each of those waits is for a few stores, so a loop that retries [`Retry::LIMIT`] times in
//! a row can only be waiting for a state that never becomes readable or writable: a bug, such
//! as a retired or "writing" answer for a state that is neither. A debug build then panics at
//! the loop that went round, so the bug fails its test within about a second instead of
//! hanging it. A release build keeps no count: the hot path pays nothing for the check.

use crate::engine::sync::Backoff;

/// One retry loop's waiting and, in a debug build, its count of retries in a row (see the
/// module docs).
#[derive(Debug)]
pub(crate) struct Retry {
    /// How long the next wait is: doubles with each wait, up to a limit.
    backoff: Backoff,
    /// Retries so far.
    #[cfg(debug_assertions)]
    count: u32,
}

impl Retry {
    /// Consecutive retries after which a debug build panics (2^20): far above any legitimate
    /// run of retries. A loop that waits for a thread in the middle of its few stores (a
    /// writer inside its write section, a policy change between retiring the old state and
    /// publishing the new one) snoozes, which yields to the scheduler once its first spins
    /// are over: 2^20 retries gave that thread a million chances to run (a tenth of a second
    /// to a second of yielding on a busy two-core machine, far longer than a preempted thread
    /// waits for its turn). Every other retry follows another thread's progress (a CAS it
    /// won, a write section it finished, a policy change it made) and starts afresh: losing
    /// 2^20 times in a row is starvation far beyond anything contention on one key produces.
    /// A smaller bound would risk a spurious panic on an overloaded machine; a larger one
    /// makes every test that meets the bug take longer to fail.
    // Read only by the check, which a release build leaves out.
    #[cfg_attr(not(debug_assertions), allow(dead_code))]
    pub(crate) const LIMIT: u32 = 1 << 20;

    /// A loop's first attempt: no wait yet, no retry counted.
    #[inline(always)]
    pub(crate) fn new() -> Self {
        Retry {
            backoff: Backoff::new(),
            #[cfg(debug_assertions)]
            count: 0,
        }
    }

    /// After a lost compare-and-swap: spins a little (1 to 64 spin hints, doubling with each
    /// call) so the winner's core keeps the word's cache line for its next decision, instead
    /// of both cores pulling it back and forth on every attempt.
    #[inline(always)]
    #[track_caller]
    pub(crate) fn spin(&mut self) {
        self.backoff.spin();
        self.again();
    }

    /// While another thread finishes its few stores: spins, then yields to the scheduler once
    /// the spins grow long, so a thread preempted mid-write gets to run.
    #[inline(always)]
    #[track_caller]
    pub(crate) fn snooze(&mut self) {
        self.backoff.snooze();
        self.again();
    }

    /// A retry that starts at once: the state changed under a read, or another writer came
    /// first and the read that follows finds it (and waits for it) if it is still writing.
    /// Panics in a debug build, at the caller, once the loop has retried
    /// [`LIMIT`](Retry::LIMIT) times; counts nothing in a release build.
    #[inline(always)]
    #[track_caller]
    pub(crate) fn again(&mut self) {
        #[cfg(debug_assertions)]
        {
            self.count += 1;
            assert!(
                self.count < Self::LIMIT,
                "retried {} times in a row: waiting for a state that never becomes ready",
                self.count
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loop that has retried one time short of the limit.
    fn at_the_limit() -> Retry {
        let mut retry = Retry::new();
        for _ in 1..Retry::LIMIT {
            retry.again();
        }
        retry
    }

    #[test]
    fn retries_below_the_limit_are_allowed() {
        let _ = at_the_limit();
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "retried 1048576 times in a row")]
    fn the_retry_at_the_limit_panics_in_a_debug_build() {
        at_the_limit().spin();
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "retried 1048576 times in a row")]
    fn a_snooze_counts_as_a_retry() {
        at_the_limit().snooze();
    }
}
