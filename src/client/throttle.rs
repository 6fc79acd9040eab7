//! [`Throttle`]: waits for a permit per call, first come first served per key, and learns
//! from the upstream's answers; [`Admission`], one admitted call.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, StatusCode};
use tokio::time::Instant;

use super::budget::{Budget, Taken};
use super::error::ThrottleError;
use super::heard::{hear, Heard};
use super::lane::{Lane, Lanes};
use super::quota::Quota;
use crate::decision::Decision;
use crate::policy::{Policy, PolicyError};
use crate::reservation::Reservation;

/// How long a pause or a reset learned from one answer may last at most, by default: an
/// hour, the longest window providers commonly report (GitHub's).
const MAX_PAUSE: Duration = Duration::from_secs(3_600);

/// The most [`Throttle::max_pause`] accepts: a day, far from any overflow of an instant.
const LONGEST_PAUSE: Duration = Duration::from_secs(86_400);

/// The client side: before each outgoing call, waits for a permit from a [`Budget`] for the
/// call's key (the upstream's host, an API key), and after it, learns from the answer.
///
/// * **Waits, up to a maximum.** A call waits until its permit comes, behind the calls for
///   the same key that came first (first come, first served), and fails with
///   [`ThrottleError::TimedOut`] when it cannot get one within
///   [`max_wait`](Throttle::max_wait). A call dropped while it waits gives its place up and
///   has taken nothing: on a Redis budget, a permit taken in a round trip its caller left
///   is given back.
/// * **Listens to the upstream.** [`Admission::heard`] reads the answer: a `429` (or a `503`
///   with `Retry-After`) pauses the key for every waiter until the time it names; the
///   `RateLimit` field of the IETF draft, `RateLimit-Remaining`/`-Reset` and
///   `X-RateLimit-Remaining`/`-Reset` cap the calls the key may still make until their
///   reset, less the calls still in flight (in the unit of cost with
///   [`fields_count_cost`](Throttle::fields_count_cost)). What an upstream says can only
///   hold calls back, never let more through than the budget's own policy; a value that
///   does not parse is ignored and counted in [`ThrottleStats::malformed`]. A call whose
///   permit is being taken when a pause is heard still goes.
/// * **Respects a provider's quota by default.** [`Throttle::quota`] builds the budget a
///   strict provider needs: an exact sliding window of the quota, widened by a margin that
///   follows the delays it measures between admitting a call and its answer.
///
/// A `Throttle` is cheap to clone; clones share the budget, the queues and what was learned.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use http::{HeaderMap, StatusCode};
/// use tollgate::client::Throttle;
///
/// let throttle = Throttle::quota("20/1s".parse()?)?.max_wait(Duration::from_secs(30));
/// let mut call = throttle.acquire("api.example.com").await?;
/// // ... send the request; the upstream refuses it with `Retry-After: 2` ...
/// let mut headers = HeaderMap::new();
/// headers.insert("retry-after", "2".parse()?);
/// call.heard(StatusCode::TOO_MANY_REQUESTS, &headers);
/// let start = tokio::time::Instant::now();
/// let _next = throttle.acquire("api.example.com").await?; // waits out the pause
/// assert_eq!(start.elapsed(), Duration::from_secs(2));
/// assert_eq!(throttle.stats().pauses, 1);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Throttle {
    shared: Arc<Shared>,
    max_wait: Option<Duration>,
    max_pause: Duration,
    /// The upstream's fields count in the unit of the calls' cost, not in calls.
    fields_count_cost: bool,
}

struct Shared {
    budget: Budget,
    lanes: Lanes,
    quota: Option<Arc<Quota>>,
    counts: Counts,
}

#[derive(Default)]
struct Counts {
    admitted: AtomicU64,
    waited: AtomicU64,
    timed_out: AtomicU64,
    pauses: AtomicU64,
    adjustments: AtomicU64,
    malformed: AtomicU64,
}

/// What a [`Throttle`] has done since it was built.
///
/// # Examples
///
/// ```
/// let throttle = tollgate::client::Throttle::quota("10/1s".parse()?)?;
/// let stats = throttle.stats();
/// assert_eq!(stats.admitted, 0);
/// assert_eq!(stats.margin, Some(std::time::Duration::from_millis(20)));
/// # Ok::<(), tollgate::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ThrottleStats {
    /// Calls admitted.
    pub admitted: u64,
    /// Of those, the calls that had to wait (in the queue, for the budget or for a pause).
    pub waited: u64,
    /// Calls that gave up at their maximum wait.
    pub timed_out: u64,
    /// Answers that paused their key (`429`, or `503` with `Retry-After`).
    pub pauses: u64,
    /// Answers whose rate-limit fields capped what their key may still spend.
    pub adjustments: u64,
    /// Rate-limit values in answers that were present but ignored: unparsable, negative,
    /// out of range, or repeated.
    pub malformed: u64,
    /// The margin a [`Throttle::quota`] adds to each window now; `None` for a budget given
    /// as it is.
    pub margin: Option<Duration>,
}

impl Throttle {
    /// A throttle that takes its permits from `budget`, as it is: a `RateLimiter<String>`
    /// (one budget per key), a `DirectLimiter` (one for every key) or a `RedisLimiter` (one
    /// per key, shared by every process). Waits as long as it takes; see
    /// [`max_wait`](Throttle::max_wait).
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::client::Throttle;
    /// use tollgate::DirectLimiter;
    ///
    /// let throttle = Throttle::new(DirectLimiter::new("sliding-log 500/min".parse()?));
    /// # let _ = throttle;
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn new(budget: impl Into<Budget>) -> Self {
        Throttle::with(budget.into(), None)
    }

    fn with(budget: Budget, quota: Option<Arc<Quota>>) -> Self {
        Throttle {
            shared: Arc::new(Shared {
                budget,
                lanes: Lanes::default(),
                quota,
                counts: Counts::default(),
            }),
            max_wait: None,
            max_pause: MAX_PAUSE,
            fields_count_cost: false,
        }
    }

    /// A throttle that keeps each key under a provider's `quota` (per host by default), in
    /// the shape a strict provider needs: every band becomes an exact sliding window of its
    /// permits ([`Algorithm::SlidingLog`](crate::Algorithm::SlidingLog)) over its window **plus a margin**.
    ///
    /// Why: a provider that refuses more than N calls in any window W counts calls when they
    /// arrive, and a call arrives some time after it was admitted, anywhere between nothing
    /// and its round trip. Two calls admitted W apart may arrive less than W apart; widening
    /// the window by the longest round trip seen keeps every window of arrivals within N. The
    /// margin starts at 20 ms and follows the longest delay measured between admitting a
    /// call and its answer (times 1.5, rounded up to 10 ms, at most a quarter of the window;
    /// it never shrinks). Its clock is tokio's ([`TokioClock`](crate::clock::TokioClock)), the time its waits take,
    /// so it follows paused time in tests. A token bucket of the same numbers (`"N/W"`) is refused by such
    /// providers: it lets a full burst through at the end of one window and refills during
    /// the next, up to 2N - 1 calls in one window.
    ///
    /// No window is widened past [`Policy::MAX_WINDOW`]: a quota whose window is that long
    /// (about 146 years) keeps it as it is, its margin cut away, and any valid quota is
    /// accepted but for the permits of a log.
    ///
    /// # Errors
    ///
    /// [`PolicyError`] when a band cannot be a sliding log: more than
    /// [`Policy::MAX_LOG_PERMITS`] permits (count the quota in coarser units).
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::client::Throttle;
    ///
    /// let throttle = Throttle::quota("60/min & 1000/day".parse()?)?;
    /// assert!(Throttle::quota("100000/min".parse()?).is_err());
    /// # let _ = throttle;
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn quota(quota: Policy) -> Result<Self, PolicyError> {
        let (budget, quota) = Quota::new(quota)?;
        Ok(Throttle::with(budget, Some(Arc::new(quota))))
    }

    /// Gives up on a call that cannot get its permit within `max_wait` of asking, with
    /// [`ThrottleError::TimedOut`]: as soon as the next possible permit (the budget's, or the
    /// end of a pause) comes after that, or when it is still queued behind other calls then.
    /// Without it a call waits as long as it takes.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let throttle = tollgate::client::Throttle::quota("10/1s".parse()?)?
    ///     .max_wait(Duration::from_secs(5));
    /// # let _ = throttle;
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = Some(max_wait);
        self
    }

    /// The longest pause one answer can impose (an hour by default, a day at most): a
    /// `Retry-After` or a reset beyond it counts as this long, so that a hostile or broken
    /// upstream cannot stop the key for days. A provider whose window is longer than this
    /// (a daily quota) is then trusted only this long: raise it for such a provider.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let throttle = tollgate::client::Throttle::quota("10/1s".parse()?)?
    ///     .max_pause(Duration::from_secs(60));
    /// # let _ = throttle;
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn max_pause(mut self, max_pause: Duration) -> Self {
        self.max_pause = max_pause.min(LONGEST_PAUSE);
        self
    }

    /// Reads the upstream's `RateLimit` fields as counting in the unit of the calls' cost
    /// (tokens, when each call costs its tokens), rather than in calls, the default: most
    /// providers report requests in them, and a separate quota of tokens under other names.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use http::{HeaderMap, StatusCode};
    /// use tollgate::client::Throttle;
    ///
    /// let tokens = Throttle::quota("60000/min".parse()?)?.fields_count_cost();
    /// let mut call = tokens.acquire_n("llm", 1_500).await?;
    /// let mut headers = HeaderMap::new();
    /// headers.insert("ratelimit", "\"tokens\";r=2000;t=20".parse()?);
    /// call.heard(StatusCode::OK, &headers);
    /// tokens.acquire_n("llm", 1_500).await?; // 2,000 tokens left upstream: goes at once
    /// let start = tokio::time::Instant::now();
    /// tokens.acquire_n("llm", 1_500).await?; // 500 left: waits for the reset
    /// assert_eq!(start.elapsed(), std::time::Duration::from_secs(20));
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn fields_count_cost(mut self) -> Self {
        self.fields_count_cost = true;
        self
    }

    /// Waits for one permit for `key`; see [`acquire_n`](Throttle::acquire_n).
    ///
    /// # Errors
    ///
    /// As for [`acquire_n`](Throttle::acquire_n).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let throttle = tollgate::client::Throttle::quota("2/1s".parse()?)?;
    /// let start = tokio::time::Instant::now();
    /// for _ in 0..3 {
    ///     throttle.acquire("api.example.com").await?;
    /// }
    /// // The third waited for the first to leave the window (1 s and the margin).
    /// assert!(start.elapsed() >= std::time::Duration::from_secs(1));
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire(&self, key: &str) -> Result<Admission, ThrottleError> {
        self.acquire_n(key, 1).await
    }

    /// Waits until `cost` permits for `key` are there at once, behind the calls for `key`
    /// that asked first, and takes them.
    ///
    /// A call waiting must be polled to its end or dropped: at the head of the key's queue,
    /// its future holds its place while it lives, so one polled and then kept unpolled (past
    /// a `select!` that chose another branch) holds every later call of the key until it is
    /// polled again or dropped ([`max_wait`](Throttle::max_wait) bounds their wait).
    ///
    /// # Errors
    ///
    /// [`ThrottleError::Cost`] at once for a cost the budget's policy can never admit;
    /// [`ThrottleError::TimedOut`] past the [`max_wait`](Throttle::max_wait);
    /// [`ThrottleError::Backend`] when a Redis budget fails.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let throttle = tollgate::client::Throttle::quota("100/1s".parse()?)?;
    /// let call = throttle.acquire_n("batch", 40).await?;
    /// assert_eq!(call.decision().remaining(), 60);
    /// assert!(throttle.acquire_n("batch", 101).await.is_err());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn acquire_n(&self, key: &str, cost: u64) -> Result<Admission, ThrottleError> {
        self.take(key, cost, false).await
    }

    /// Like [`acquire_n`](Throttle::acquire_n), for a call whose real cost is known only from
    /// its answer (the tokens a model really used): `cost` is the estimate, and
    /// [`Admission::settle`] gives back or charges the difference.
    ///
    /// # Errors
    ///
    /// As for [`acquire_n`](Throttle::acquire_n).
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use tollgate::{client::Throttle, clock::TokioClock, RateLimiter};
    ///
    /// let tokens: RateLimiter<String, TokioClock> =
    ///     RateLimiter::with_clock("10000/min".parse()?, TokioClock::new());
    /// let throttle = Throttle::new(tokens);
    /// let call = throttle.reserve_n("llm", 2_000).await?;
    /// // ... the answer reports 700 tokens used ...
    /// call.settle(700).await?;
    /// assert_eq!(throttle.acquire_n("llm", 9_300).await?.decision().remaining(), 0);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn reserve_n(&self, key: &str, cost: u64) -> Result<Admission, ThrottleError> {
        self.take(key, cost, true).await
    }

    async fn take(&self, key: &str, cost: u64, reserve: bool) -> Result<Admission, ThrottleError> {
        let shared = &self.shared;
        // Before the queue and any pause: a cost the budget can never admit fails at once.
        shared.budget.check_cost(key, cost).await?;
        let units = if self.fields_count_cost { cost } else { 1 };
        let start = Instant::now();
        let deadline = self.max_wait.and_then(|wait| start.checked_add(wait));
        let lane = shared.lanes.get(key);
        // First come, first served: behind whoever holds the turn, in the order they asked.
        let (turn, mut waited) = match lane.turn.try_lock() {
            Ok(turn) => (turn, false),
            Err(_) => match deadline {
                Some(deadline) => match tokio::time::timeout_at(deadline, lane.turn.lock()).await {
                    Ok(turn) => (turn, true),
                    Err(_) => {
                        let ahead = lane.told().head_ready_in(Instant::now());
                        return Err(self.timed_out(key, start, ahead.unwrap_or(Duration::ZERO)));
                    }
                },
                None => (lane.turn.lock().await, true),
            },
        };
        loop {
            // A pause another process learned, through a shared budget.
            if let Some(pause) = shared.budget.paused(key).await {
                lane.told().pause(Instant::now(), pause.min(self.max_pause));
            }
            let now = Instant::now();
            if let Some(quota) = &shared.quota {
                quota.cover_unanswered(now);
            }
            let held_back = lane.told().holds_back(now, units);
            let ready = match held_back {
                Some(until) => until,
                None => {
                    let taken = shared.budget.take(key, cost, reserve).await?;
                    let now = Instant::now();
                    if taken.decision.is_allowed() {
                        // Counted in flight before the turn goes: the next caller in the
                        // lane reads the cap with this call in it.
                        let admission =
                            self.admitted(key, units, Arc::clone(&lane), taken, now, waited);
                        drop(turn);
                        return Ok(admission);
                    }
                    now + taken.decision.retry_after().max(Duration::from_nanos(1))
                }
            };
            if deadline.is_some_and(|deadline| ready > deadline) {
                return Err(self.timed_out(key, start, ready - Instant::now()));
            }
            // Awake before then if a call under way outlasts the margin: the margin is widened
            // while the log still counts it (see `Quota::cover_unanswered`).
            let wake = match &shared.quota {
                Some(quota) => quota
                    .next_check(Instant::now())
                    .map_or(ready, |at| at.min(ready)),
                None => ready,
            };
            waited = true;
            // Cleared when this sleep ends, however it ends (woken, or the caller gone):
            // a caller that gives up in the queue is told how long the head waits now for its
            // permit (not for an earlier look at the margin), not how long a head that left
            // once did.
            let _asleep = lane.head_sleeps(ready);
            tokio::time::sleep_until(wake).await;
        }
    }

    fn admitted(
        &self,
        key: &str,
        units: u64,
        lane: Arc<Lane>,
        taken: Taken,
        now: Instant,
        waited: bool,
    ) -> Admission {
        let counts = &self.shared.counts;
        // Relaxed: statistics, read on their own.
        counts.admitted.fetch_add(1, Ordering::Relaxed);
        if waited {
            counts.waited.fetch_add(1, Ordering::Relaxed);
        }
        lane.told().admit(now, units);
        if let Some(quota) = &self.shared.quota {
            quota.sent(now);
            quota.watch();
        }
        Admission {
            throttle: self.clone(),
            key: key.to_owned(),
            lane,
            units,
            at: now,
            decision: taken.decision,
            reservation: taken.reservation,
            answered: false,
        }
    }

    fn timed_out(&self, key: &str, start: Instant, retry_after: Duration) -> ThrottleError {
        // Relaxed: a statistic.
        self.shared.counts.timed_out.fetch_add(1, Ordering::Relaxed);
        ThrottleError::TimedOut {
            key: key.to_owned(),
            waited: start.elapsed(),
            retry_after,
        }
    }

    /// The answer to an admitted call: what it says about the key's quota, and how long it
    /// took (a quota's margin).
    fn hear(&self, admission: &Admission, status: StatusCode, headers: &HeaderMap) {
        let now = Instant::now();
        let (heard, malformed) = hear(status, headers, self.max_pause);
        let counts = &self.shared.counts;
        // Relaxed: statistics.
        counts.malformed.fetch_add(malformed, Ordering::Relaxed);
        let mut told = admission.lane.told();
        match heard {
            // Counted upstream, but no report says so.
            Heard::Nothing => told.unreported(admission.units),
            // Refused: not counted.
            Heard::Pause(pause) => {
                counts.pauses.fetch_add(1, Ordering::Relaxed);
                told.answered(admission.units);
                told.pause(now, pause);
                self.shared.budget.share_pause(&admission.key, pause);
            }
            Heard::Left(lefts) => {
                counts.adjustments.fetch_add(1, Ordering::Relaxed);
                told.answered(admission.units);
                for left in lefts.into_iter().flatten() {
                    told.reported(now, left);
                }
            }
        }
        drop(told);
        if let Some(quota) = &self.shared.quota {
            quota.answered(admission.at, now);
        }
    }

    /// The admitted call was answered now, and the answer is not read: as an answer without
    /// rate-limit fields, it may have been counted upstream with no report saying so, and
    /// its round trip is measured.
    fn answered_without_fields(&self, admission: &Admission) {
        admission.lane.told().unreported(admission.units);
        if let Some(quota) = &self.shared.quota {
            quota.answered(admission.at, Instant::now());
        }
    }

    /// What this throttle has done since it was built.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let throttle = tollgate::client::Throttle::quota("10/1s".parse()?)?;
    /// throttle.acquire("a").await?;
    /// assert_eq!(throttle.stats().admitted, 1);
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn stats(&self) -> ThrottleStats {
        let counts = &self.shared.counts;
        // Relaxed: each count is read on its own.
        let read = |count: &AtomicU64| count.load(Ordering::Relaxed);
        ThrottleStats {
            admitted: read(&counts.admitted),
            waited: read(&counts.waited),
            timed_out: read(&counts.timed_out),
            pauses: read(&counts.pauses),
            adjustments: read(&counts.adjustments),
            malformed: read(&counts.malformed),
            margin: self.shared.quota.as_ref().map(|quota| quota.margin()),
        }
    }

    /// The budget's policy now, if it has one for every key.
    ///
    /// # Examples
    ///
    /// ```
    /// let throttle = tollgate::client::Throttle::quota("10/1s".parse()?)?;
    /// assert_eq!(throttle.policy().unwrap().to_string(), "sliding-log 10/1020ms");
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn policy(&self) -> Option<Policy> {
        self.shared.budget.policy()
    }
}

impl fmt::Debug for Throttle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Throttle")
            .field("budget", &self.shared.budget)
            .field("max_wait", &self.max_wait)
            .field("max_pause", &self.max_pause)
            .finish_non_exhaustive()
    }
}

/// One call a [`Throttle`] admitted. Tell it the answer with [`heard`](Admission::heard)
/// (the [`ThrottleLayer`](super::ThrottleLayer) does); settle a reserved cost with
/// [`settle`](Admission::settle). Dropped without an answer (the call failed, or was never
/// sent), its permits stay spent: the call may have reached the upstream.
pub struct Admission {
    throttle: Throttle,
    key: String,
    lane: Arc<Lane>,
    /// What the call counts in the upstream's fields: 1, or its cost.
    units: u64,
    at: Instant,
    decision: Decision,
    reservation: Option<Reservation>,
    answered: bool,
}

impl Admission {
    /// The budget's decision that admitted the call.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let throttle = tollgate::client::Throttle::quota("5/1s".parse()?)?;
    /// assert_eq!(throttle.acquire("a").await?.decision().remaining(), 4);
    /// # Ok(())
    /// # }
    /// ```
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// The upstream answered the call with `status` and `headers`: a pause or a cap on the
    /// key's spending, as [`Throttle`] describes. Only the first answer counts.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use http::{HeaderMap, StatusCode};
    ///
    /// let throttle = tollgate::client::Throttle::quota("100/1s".parse()?)?;
    /// let mut call = throttle.acquire("a").await?;
    /// let mut headers = HeaderMap::new();
    /// headers.insert("ratelimit", "\"default\";r=0;t=3".parse()?);
    /// call.heard(StatusCode::OK, &headers);
    /// let start = tokio::time::Instant::now();
    /// throttle.acquire("a").await?; // nothing left upstream for 3 s
    /// assert_eq!(start.elapsed(), std::time::Duration::from_secs(3));
    /// # Ok(())
    /// # }
    /// ```
    pub fn heard(&mut self, status: StatusCode, headers: &HeaderMap) {
        if std::mem::replace(&mut self.answered, true) {
            return;
        }
        self.throttle.hear(self, status, headers);
    }

    /// Settles a reserved call at its `actual` cost: the difference from its estimate is
    /// given back, or charged on top, by the budget's rules for a reservation.
    ///
    /// A call is settled from its answer, so settling it also tells the throttle it was
    /// answered, whether or not the settle succeeds: one not [`heard`](Admission::heard)
    /// counts as answered now with no rate-limit fields, not as a call dropped unanswered
    /// (which may still arrive, and widens a [`Throttle::quota`]'s margin to its cap).
    ///
    /// # Errors
    ///
    /// [`ThrottleError::NotReserved`] for a call taken with [`acquire_n`](Throttle::acquire_n)
    /// rather than [`reserve_n`](Throttle::reserve_n) (there is nothing to settle);
    /// [`ThrottleError::Backend`] when a Redis budget fails.
    ///
    /// # Examples
    ///
    /// See [`Throttle::reserve_n`].
    pub async fn settle(mut self, actual: u64) -> Result<(), ThrottleError> {
        if !std::mem::replace(&mut self.answered, true) {
            self.throttle.answered_without_fields(&self);
        }
        match self.reservation.take() {
            Some(reservation) => {
                let throttle = self.throttle.clone();
                throttle
                    .shared
                    .budget
                    .settle(&self.key, reservation, actual)
                    .await
            }
            None => Err(ThrottleError::NotReserved {
                key: std::mem::take(&mut self.key),
            }),
        }
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        if !self.answered {
            self.lane.told().unreported(self.units);
            // Dropped unanswered, it may still arrive, at any time.
            if let Some(quota) = &self.throttle.shared.quota {
                quota.abandoned(self.at);
            }
        }
    }
}

impl fmt::Debug for Admission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admission")
            .field("key", &self.key)
            .field("units", &self.units)
            .field("decision", &self.decision)
            .field("reserved", &self.reservation.is_some())
            .finish_non_exhaustive()
    }
}
