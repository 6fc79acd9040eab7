//! Decision counters: [`Stats`], read from a limiter built with `with_stats` (allowed,
//! refused and overflowed decisions, and the keys tracked), for dashboards and for shadow
//! mode's report of what a policy would have refused.
//!
//! ```
//! use tollgate::stats::Stats;
//! use tollgate::{FakeClock, RateLimiter};
//!
//! let limiter: RateLimiter<String, FakeClock> =
//!     RateLimiter::with_clock("1/min".parse()?, FakeClock::new()).with_stats();
//! let _ = limiter.try_acquire("a");
//! let _ = limiter.try_acquire("a");
//! let stats: Stats = limiter.stats();
//! assert_eq!((stats.allowed, stats.refused, stats.keys), (1, 1, 1));
//! # Ok::<(), tollgate::PolicyError>(())
//! ```
//!
//! Counting every decision on one shared atomic would make all threads write one cache line
//! on every request. The counters are **striped** instead: each thread adds to one of a few
//! cache-padded stripes (chosen once per thread), and a reader sums them. Increments are
//! atomic, so once the counting threads are done the sums are exact.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crossbeam_utils::CachePadded;

use crate::decision::Decision;

/// What a limiter has decided since it was built, and how many keys it tracks.
///
/// Counters are kept only by limiters built with `with_stats()` (they cost one uncontended
/// atomic add per decision); otherwise they read zero and
/// [`counting`](Stats::counting) is `false`.
///
/// # Examples
///
/// ```
/// use tollgate::{FakeClock, RateLimiter};
///
/// let limiter: RateLimiter<String, FakeClock> =
///     RateLimiter::with_clock("2/min".parse()?, FakeClock::new()).with_stats();
/// for _ in 0..3 {
///     let _ = limiter.try_acquire("alice");
/// }
/// let stats = limiter.stats();
/// assert_eq!((stats.allowed, stats.refused, stats.keys), (2, 1, 1));
/// # Ok::<(), tollgate::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Requests admitted (in shadow mode: admitted by the policy).
    pub allowed: u64,
    /// Requests the policy refused (in shadow mode these were let through anyway). A
    /// waiting acquire (`acquire_blocking`, `acquire`) counts each refused attempt on its
    /// way, then its admission.
    pub refused: u64,
    /// Decisions made by the shared overflow state for new keys past `max_keys` (and the
    /// refusals it makes for a new key starting with its permits).
    pub overflowed: u64,
    /// Keys tracked now.
    pub keys: usize,
    /// `true` when the limiter counts decisions.
    pub counting: bool,
}

const STRIPES: usize = 16;

#[derive(Default)]
struct Stripe {
    allowed: AtomicU64,
    refused: AtomicU64,
    overflowed: AtomicU64,
}

/// The striped counters of one limiter.
pub(crate) struct Counters {
    stripes: [CachePadded<Stripe>; STRIPES],
}

/// What the counters read of a decision: whether it was allowed, and whether a shared
/// overflow state decided it. Two bits that travel in registers, where the decision itself,
/// handed to a call, is first copied to memory (and read back past store forwarding).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Counted {
    allowed: bool,
    overflow: bool,
}

impl Counted {
    /// What the counters read of `decision`.
    #[inline(always)]
    pub(crate) fn of(decision: &Decision) -> Self {
        Counted {
            allowed: decision.is_allowed(),
            overflow: decision.is_overflow(),
        }
    }
}

impl Counters {
    pub(crate) fn new() -> Self {
        Counters {
            stripes: std::array::from_fn(|_| CachePadded::new(Stripe::default())),
        }
    }

    /// Counts one decision, as the policy made it (before shadow mode).
    #[inline]
    pub(crate) fn record(&self, Counted { allowed, overflow }: Counted) {
        let stripe = &self.stripes[stripe_index()];
        // Relaxed: independent counters; readers sum them once the counting is done, and an
        // atomic add never loses an increment.
        if allowed {
            stripe.allowed.fetch_add(1, Ordering::Relaxed);
        } else {
            stripe.refused.fetch_add(1, Ordering::Relaxed);
        }
        if overflow {
            stripe.overflowed.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn read(&self, keys: usize) -> Stats {
        let sum = |f: fn(&Stripe) -> &AtomicU64| {
            self.stripes
                .iter()
                .map(|s| f(s).load(Ordering::Relaxed))
                .sum()
        };
        Stats {
            allowed: sum(|s| &s.allowed),
            refused: sum(|s| &s.refused),
            overflowed: sum(|s| &s.overflowed),
            keys,
            counting: true,
        }
    }
}

/// This thread's stripe: threads are dealt stripes in turn as they first count.
#[inline]
fn stripe_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        // Relaxed: any distribution of stripes is correct; turns only spread the load.
        static STRIPE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
    }
    STRIPE.with(|s| *s)
}

#[cfg(feature = "metrics")]
impl Stats {
    /// Publishes these figures through the [`metrics`](https://docs.rs/metrics) facade
    /// (feature `metrics`), to whatever recorder the application installed (Prometheus,
    /// StatsD...): counters `{prefix}_decisions_total` with label `outcome` = `allowed` or
    /// `refused`, `{prefix}_overflowed_total`, and the gauge `{prefix}_keys`. Call it from a
    /// timer: it publishes a snapshot and costs nothing on the request path.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, RateLimiter};
    ///
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("5/s".parse()?, FakeClock::new()).with_stats();
    /// let _ = limiter.try_acquire("a");
    /// limiter.stats().publish("api_limiter"); // no recorder installed: a no-op
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn publish(&self, prefix: &str) {
        let decisions = format!("{prefix}_decisions_total");
        metrics::counter!(decisions.clone(), "outcome" => "allowed").absolute(self.allowed);
        metrics::counter!(decisions, "outcome" => "refused").absolute(self.refused);
        metrics::counter!(format!("{prefix}_overflowed_total")).absolute(self.overflowed);
        metrics::gauge!(format!("{prefix}_keys")).set(self.keys as f64);
    }
}
