//! What is left now: [`RateLimiter::available`] and [`DirectLimiter::available`].
//!
//! `peek().remaining()` answers "what would remain after one more request", the number a
//! `RateLimit` header carries with an admission. A caller who asks "how many permits does
//! this key have?" wants the count before that request: `available`. Both are read from the
//! same peek, so they never disagree: while anything is left, `available` is one more than
//! `peek().remaining()`; when nothing is, both are 0.
//!
//! A [`Decision`](crate::Decision) cannot answer this itself: it does not record the cost
//! it was made for, and a word more in every decision would cost the hot path.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

use crate::clock::Clock;
use crate::direct::DirectLimiter;
use crate::keyed::RateLimiter;

impl<K: Hash + Eq + Clone + 'static, C: Clock, S: BuildHasher + Clone + 'static>
    RateLimiter<K, C, S>
{
    /// The permits `key` has now: the largest cost `n` for which
    /// [`try_acquire_n(key, n)`](RateLimiter::try_acquire_n) would be allowed at this
    /// instant, 0 when even one request would be refused. Changes nothing and creates no
    /// state, as [`peek`](RateLimiter::peek).
    ///
    /// **Not `peek(key).remaining()`**: that is what would remain *after* one more request,
    /// the number an admission reports. While anything is left, `available` is one more;
    /// when nothing is, both are 0.
    ///
    /// Under a policy of several limits it is the smallest over them; for a key decided by
    /// the shared overflow state of a full limiter ([`max_keys`](RateLimiter::max_keys)), the
    /// shared state's. In shadow mode it is what the policy has (shadow mode lets requests
    /// through, it does not add permits).
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, RateLimiter};
    ///
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("5/1s".parse()?, FakeClock::new());
    /// assert_eq!(limiter.available("alice"), 5); // a fresh key has all 5
    /// assert_eq!(limiter.peek("alice").remaining(), 4); // what one more request would leave
    /// limiter.try_acquire_n("alice", 3)?;
    /// assert_eq!(limiter.available("alice"), 2);
    /// assert!(!limiter.try_acquire_n("alice", 3)?.is_allowed()); // 3 > 2: refused
    /// assert!(limiter.try_acquire_n("alice", 2)?.is_allowed());
    /// assert_eq!(limiter.available("alice"), 0);
    /// assert_eq!(limiter.peek("alice").remaining(), 0); // both 0 when nothing is left
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn available<Q>(&self, key: &Q) -> u64
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        // A peek decides a request of cost 1 without taking it.
        self.peek(key).available_before(1)
    }
}

impl<C: Clock> DirectLimiter<C> {
    /// The permits the limiter has now: the largest cost `n` for which
    /// [`try_acquire_n(n)`](DirectLimiter::try_acquire_n) would be allowed at this instant, 0
    /// when even one request would be refused. Changes nothing, as
    /// [`peek`](DirectLimiter::peek).
    ///
    /// **Not `peek().remaining()`**: that is what would remain *after* one more request.
    /// While anything is left, `available` is one more; when nothing is, both are 0. See
    /// [`RateLimiter::available`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use tollgate::{DirectLimiter, FakeClock};
    ///
    /// let clock = FakeClock::new();
    /// let limiter = DirectLimiter::with_clock("10/1s".parse()?, clock.clone());
    /// limiter.try_acquire_n(10)?;
    /// assert_eq!(limiter.available(), 0);
    /// clock.advance(Duration::from_millis(350)); // one permit back every 100 ms
    /// assert_eq!(limiter.available(), 3);
    /// assert_eq!(limiter.peek().remaining(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn available(&self) -> u64 {
        self.peek().available_before(1)
    }
}
