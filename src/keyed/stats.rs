//! Decision counters and shadow mode.

use std::hash::{BuildHasher, Hash};

use crate::clock::Clock;
use crate::decision::Decision;
use crate::stats::Counters;
use crate::stats::Stats;

use super::RateLimiter;

/// What a limiter does with each decision beyond deciding it, when asked to: count it, let
/// refusals through (shadow mode). Kept behind one pointer, so the hot path of a limiter
/// with neither tests one word.
#[derive(Default)]
pub(super) struct Extras {
    counters: Option<Counters>,
    shadow: bool,
}

impl<K: Hash + Eq + Clone + 'static, C: Clock, S: BuildHasher + Clone + 'static>
    RateLimiter<K, C, S>
{
    /// Counts allowed, refused and overflowed decisions, read with
    /// [`stats`](RateLimiter::stats). The counters are striped across cache lines, so
    /// threads do not contend on them, but each decision still pays one atomic add.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, RateLimiter};
    ///
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("1/min".parse()?, FakeClock::new()).with_stats();
    /// let _ = limiter.try_acquire("a");
    /// let _ = limiter.try_acquire("a");
    /// assert_eq!(limiter.stats().refused, 1);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn with_stats(mut self) -> Self {
        self.extras.get_or_insert_with(Box::default).counters = Some(Counters::new());
        self
    }

    /// Shadow mode, for rolling out a policy safely: every request is decided and counted
    /// as usual, but a refusal is let through, marked by [`Decision::would_refuse`]. Permits
    /// are spent only by the requests the policy itself admits, so the limiter's state is
    /// exactly what enforcing the policy would have produced.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, RateLimiter};
    ///
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("1/min".parse()?, FakeClock::new()).shadow().with_stats();
    /// assert!(limiter.try_acquire("a").is_allowed());
    /// let second = limiter.try_acquire("a");
    /// assert!(second.is_allowed() && second.would_refuse());
    /// assert_eq!(limiter.stats().refused, 1);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn shadow(mut self) -> Self {
        self.extras.get_or_insert_with(Box::default).shadow = true;
        self
    }

    /// The decision counters and the number of keys tracked.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, RateLimiter};
    ///
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("5/s".parse()?, FakeClock::new());
    /// let _ = limiter.try_acquire("a");
    /// let stats = limiter.stats();
    /// assert_eq!(stats.keys, 1);
    /// assert!(!stats.counting); // built without `with_stats`
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn stats(&self) -> Stats {
        let keys = self.len();
        match self
            .extras
            .as_ref()
            .and_then(|extras| extras.counters.as_ref())
        {
            Some(counters) => counters.read(keys),
            None => Stats {
                keys,
                ..Stats::default()
            },
        }
    }

    /// Counts a decision and applies shadow mode.
    #[inline(always)]
    pub(super) fn finish(&self, decision: Decision) -> Decision {
        match &self.extras {
            None => decision,
            Some(extras) => extras.finish(decision),
        }
    }
}

impl Extras {
    /// Out of line: a limiter with neither extra never runs it.
    #[inline(never)]
    fn finish(&self, decision: Decision) -> Decision {
        if let Some(counters) = &self.counters {
            counters.record(&decision);
        }
        if self.shadow {
            decision.shadowed()
        } else {
            decision
        }
    }
}
