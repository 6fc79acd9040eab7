//! The direct limiter: [`DirectLimiter`], one state and no map, for one very hot key.

use std::fmt;

use crossbeam_utils::CachePadded;

use crate::error::check_cost;
use crate::sliding_counter::CounterCell;
use crate::sliding_log::LogCell;
use crate::state::RateState;
use crate::token_bucket::GcraCell;
use crate::{Algorithm, Clock, CostError, Decision, Policy, SystemClock};

/// A rate limiter for a single key: a global limit, one upstream's quota, one hot tenant.
///
/// It is the keyed limiter's state machine without the map: a decision is a clock read and
/// a compare-and-swap on a word that sits alone on its cache line, so a neighbour's writes
/// never slow it down. Share it through an `Arc` or a `static`.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use tollgate::{DirectLimiter, FakeClock};
///
/// let clock = FakeClock::new();
/// let limiter = DirectLimiter::with_clock("10/1s".parse()?, clock.clone());
/// for _ in 0..10 {
///     assert!(limiter.try_acquire().is_allowed());
/// }
/// assert_eq!(limiter.try_acquire().retry_after(), Duration::from_millis(100));
/// clock.advance(Duration::from_secs(1));
/// assert!(limiter.is_at_rest());
/// # Ok::<(), tollgate::PolicyError>(())
/// ```
pub struct DirectLimiter<C = SystemClock> {
    state: State,
    clock: C,
    policy: Policy,
}

enum State {
    TokenBucket(Direct<GcraCell>),
    SlidingLog(Direct<LogCell>),
    SlidingCounter(Direct<CounterCell>),
}

macro_rules! with_direct {
    ($state:expr, $direct:ident => $body:expr) => {
        match $state {
            State::TokenBucket($direct) => $body,
            State::SlidingLog($direct) => $body,
            State::SlidingCounter($direct) => $body,
        }
    };
}

struct Direct<St: RateState> {
    cell: CachePadded<St>,
    params: St::Params,
}

impl<St: RateState> Direct<St> {
    fn new(policy: &Policy) -> Self {
        let params = St::params(policy);
        Direct {
            cell: CachePadded::new(St::fresh(&params)),
            params,
        }
    }

    #[inline]
    fn try_acquire<C: Clock>(&self, clock: &C, cost: u64) -> Decision {
        match self.cell.try_acquire(&self.params, clock, cost) {
            Some(decision) => decision,
            // Only eviction retires a state, and a direct limiter never evicts.
            None => unreachable!("a direct limiter's state is never retired"),
        }
    }
}

impl DirectLimiter<SystemClock> {
    /// A limiter enforcing `policy` on the real clock.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = tollgate::DirectLimiter::new("1000/s".parse()?);
    /// assert!(limiter.try_acquire().is_allowed());
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn new(policy: Policy) -> Self {
        Self::with_clock(policy, SystemClock::new())
    }
}

impl<C: Clock> DirectLimiter<C> {
    /// A limiter enforcing `policy`, reading time from `clock`.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{DirectLimiter, FakeClock};
    ///
    /// let limiter = DirectLimiter::with_clock("sliding-log 3/s".parse()?, FakeClock::new());
    /// assert_eq!(limiter.try_acquire().remaining(), 2);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn with_clock(policy: Policy, clock: C) -> Self {
        let state = match policy.algorithm() {
            Algorithm::TokenBucket => State::TokenBucket(Direct::new(&policy)),
            Algorithm::SlidingLog => State::SlidingLog(Direct::new(&policy)),
            Algorithm::SlidingCounter => State::SlidingCounter(Direct::new(&policy)),
        };
        DirectLimiter {
            state,
            clock,
            policy,
        }
    }

    /// Decides a request of cost 1.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = tollgate::DirectLimiter::with_clock("1/s".parse()?, tollgate::FakeClock::new());
    /// assert!(limiter.try_acquire().is_allowed());
    /// assert!(!limiter.try_acquire().is_allowed());
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[inline]
    pub fn try_acquire(&self) -> Decision {
        with_direct!(&self.state, direct => direct.try_acquire(&self.clock, 1))
    }

    /// Decides a request of cost `n`: allowed only if `n` permits are available, and then all
    /// `n` are spent.
    ///
    /// # Errors
    ///
    /// [`CostError::Zero`] for `n == 0` and [`CostError::ExceedsLimit`] for `n` above the
    /// policy's permits; nothing changes.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = tollgate::DirectLimiter::with_clock("5/s".parse()?, tollgate::FakeClock::new());
    /// assert_eq!(limiter.try_acquire_n(4)?.remaining(), 1);
    /// assert!(limiter.try_acquire_n(6).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn try_acquire_n(&self, n: u64) -> Result<Decision, CostError> {
        check_cost(n, self.policy.permits())?;
        Ok(with_direct!(&self.state, direct => direct.try_acquire(&self.clock, n)))
    }

    /// `true` when the state decides exactly as a fresh one would: a full bucket or an empty
    /// window.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = tollgate::DirectLimiter::with_clock("5/s".parse()?, tollgate::FakeClock::new());
    /// assert!(limiter.is_at_rest());
    /// limiter.try_acquire();
    /// assert!(!limiter.is_at_rest());
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn is_at_rest(&self) -> bool {
        let now = self.clock.now();
        with_direct!(&self.state, direct => direct.cell.is_at_rest(&direct.params, now))
    }

    /// The policy enforced.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = tollgate::DirectLimiter::with_clock("5/s".parse()?, tollgate::FakeClock::new());
    /// assert_eq!(limiter.policy().permits(), 5);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// The clock the limiter reads.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::Clock;
    /// let limiter = tollgate::DirectLimiter::with_clock("5/s".parse()?, tollgate::FakeClock::new());
    /// assert_eq!(limiter.clock().now(), 0);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn clock(&self) -> &C {
        &self.clock
    }
}

impl<C> fmt::Debug for DirectLimiter<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DirectLimiter")
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}
