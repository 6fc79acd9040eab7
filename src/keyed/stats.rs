//! Decision counters and shadow mode.

use std::hash::{BuildHasher, Hash};

use crate::clock::Clock;
use crate::decision::Decision;
use crate::stats::Counters;
use crate::stats::Stats;

use super::RateLimiter;

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
        self.counters = Some(Box::new(Counters::new()));
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
        self.shadow = true;
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
        match &self.counters {
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
