//! The direct limiter: [`DirectLimiter`], one state and no map, for one very hot key.

use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock};

use crossbeam_utils::CachePadded;
use scc::{AtomicShared, Guard, Shared, Tag};

use crate::clock::{Clock, Fixed, Reading, SystemClock};
use crate::decision::Decision;
use crate::engine::dispatch::{Builder, Holds, PerAlgorithm, Storage};
use crate::engine::rebuilds::Rebuilds;
use crate::engine::retry::Retry;
use crate::engine::state::{built_from, to_keep, Bound, Carry, Decides, KeptCarry, RateState};
use crate::engine::stripes::Stripes;
use crate::engine::sync;
use crate::error::CostError;
use crate::policy::Policy;
use crate::reservation::{next_limiter_id, Marks, Origin, PartHeld, Reservation, SettleError};
use crate::reservation_guard::ReservationGuard;

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
    /// The state for the policy the limiter was built with, inline: the fast path reads no
    /// pointer. Retired for good by the first [`set_policy`](DirectLimiter::set_policy).
    first: Generation,
    /// How requests find the state: [`PLAIN`], or any of [`REPLACED`] and [`STRIPED`]. One
    /// word, so the hottest path reads one flag.
    mode: AtomicU8,
    /// The state for the latest policy, once replaced.
    current: AtomicShared<Generation>,
    clock: C,
    /// Serialises policy changes, and holds what the latest could not carry, until it
    /// would have come back (see `engine::state::KeptCarry`).
    config: Mutex<Option<KeptCarry>>,
    /// Tells this limiter's reservations from another's.
    id: u64,
    /// Policy changes so far: a reservation made before one gets no refund (see `Rebuilds`).
    rebuilds: Rebuilds,
    /// Compare-and-swaps lost on the token bucket's word since it was last striped or quiet.
    lost: AtomicU32,
    /// Whether a contended token bucket may be striped ([`DirectLimiter::striping`]).
    may_stripe: bool,
}

/// The first policy's state, on one word.
const PLAIN: u8 = 0;
/// Set (once, never cleared) when the policy was changed: requests then use `current`.
const REPLACED: u8 = 1;
/// Set while cost-1 requests decide on the stripes of the state in force (a contended token
/// bucket, see `engine::stripes`); cleared when the key goes quiet or the policy changes.
const STRIPED: u8 = 2;
/// Compare-and-swaps lost on the state's word, counted across requests, after which the
/// key is striped: a few losses are chance, this many a key that threads keep meeting on.
const LOST_BEFORE_STRIPING: u32 = 16;

/// A policy and the state deciding for it.
struct Generation {
    policy: Policy,
    state: State,
    /// The token bucket's stripes, made when the key is first striped.
    stripes: OnceLock<Stripes>,
    /// Held by whatever moves the token bucket's TAT back: refunds and give-backs (see
    /// `Stripes::settle`).
    lowering: sync::Mutex<()>,
}

impl Generation {
    fn new(policy: Policy, state: State) -> Self {
        Generation {
            policy,
            state,
            stripes: OnceLock::new(),
            lowering: sync::Mutex::new(()),
        }
    }
}

/// The state deciding for one policy: inline, so the fast path chases no pointer.
type State = PerAlgorithm<Padded>;

/// A state alone on its cache line, beside its parameters.
struct Padded;

impl Storage for Padded {
    type Stored<St: RateState> = Direct<St>;
}

impl Holds for Padded {
    #[inline(always)]
    fn bound<St: RateState>(direct: &Direct<St>) -> Bound<'_, St> {
        Bound {
            state: &direct.cell,
            params: &direct.params,
        }
    }
}

struct Direct<St: RateState> {
    cell: CachePadded<St>,
    params: St::Params,
}

/// The state for `policy`: fresh, or with the permits of `carry` spent at `now`.
fn state_for(policy: &Policy, carry: Option<&Carry>, now: u64) -> State {
    struct New<'a>(Option<&'a Carry>, u64);
    impl Builder<Padded> for New<'_> {
        fn build<St: RateState>(self, params: St::Params) -> Direct<St> {
            Direct {
                cell: CachePadded::new(St::new(&params, self.0, self.1)),
                params,
            }
        }
    }
    PerAlgorithm::new(policy, New(carry, now))
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
        DirectLimiter {
            first: Generation::new(policy, state_for(&policy, None, 0)),
            mode: AtomicU8::new(PLAIN),
            current: AtomicShared::null(),
            clock,
            config: Mutex::new(None),
            id: next_limiter_id(),
            rebuilds: Rebuilds::new(),
            lost: AtomicU32::new(0),
            may_stripe: true,
        }
    }

    /// Whether a key that threads keep contending for may be *striped* (on by default): its
    /// requests of cost 1 then take permits from per-thread stripes, each on its own cache
    /// line, leased in runs from the key's state, so that threads on different cores stop
    /// writing one line and the limiter's throughput grows with them. The decisions stay
    /// exact: a key of `N` permits admits exactly `N` requests of cost 1 on a frozen clock
    /// however many threads race, and never more than the policy allows in any interval on a
    /// moving one (see `docs/ARCHITECTURE.md`, "Striped hot keys"). A key with one caller is
    /// never striped, and a striped key that goes quiet returns to one word.
    ///
    /// What changes while the key is striped, each time toward refusing, never toward
    /// admitting more: a request of cost above 1 or a reservation takes only from the key's
    /// word, so it may be refused while stripes hold permits; a refund stops at the end of
    /// the latest run a stripe leased, used up or not, so a reservation settled after a
    /// stripe leased a run above it gets back less than it held, or nothing (the rest
    /// returns as time refills the bucket); and what other stripes hold when the key goes
    /// quiet is lost once time passes it (one lease per stripe at most).
    ///
    /// Off, every request is one compare-and-swap on one word: the choice when the memory of
    /// the stripes (a cache line per core) matters more than throughput under contention.
    /// Only the token bucket is striped.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = tollgate::DirectLimiter::new("1000000/s".parse()?).striping(false);
    /// assert!(limiter.try_acquire().is_allowed());
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn striping(mut self, on: bool) -> Self {
        self.may_stripe = on;
        self
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
    #[inline(always)]
    pub fn try_acquire(&self) -> Decision {
        self.acquire_at(&mut Reading::default())
    }

    /// [`try_acquire`](DirectLimiter::try_acquire) at `reading`'s instant (see
    /// [`Clock::now_in`]): a fresh one, or the one reading of an `AllOf`.
    #[inline(always)]
    pub(crate) fn acquire_at(&self, reading: &mut Reading) -> Decision {
        self.acquire_on(&Fixed(self.clock.now_in(reading)))
    }

    /// [`DirectLimiter::acquire_at`], at `clock`'s time.
    #[inline(always)]
    fn acquire_on(&self, clock: &impl Clock) -> Decision {
        // Relaxed: a stale `PLAIN` sends the request to the first state's word, which decides
        // exactly whether or not the key is striped (stripes only hold runs the word handed
        // out), and which a policy change retires before it changes the mode (see
        // `reserve_cost`).
        if self.mode.load(Ordering::Relaxed) == PLAIN {
            // The token bucket's cost-1 check is the hottest path of the crate: straight to
            // the cell, with no cost check (1 is within every policy) and no Result to unwrap.
            if let PerAlgorithm::TokenBucket(direct) = &self.first.state {
                let now = clock.now();
                let lost = || self.lost_one();
                if let Some((decision, _)) = direct.cell.reserve_at(&direct.params, now, 1, lost) {
                    return decision;
                }
            }
        }
        self.acquire_one(clock)
    }

    /// A striped key's hot path: a permit of the calling thread's own stripe, on the first
    /// state (no guard to take).
    #[inline(always)]
    fn striped_home(&self, clock: &impl Clock) -> Option<Decision> {
        let (PerAlgorithm::TokenBucket(direct), Some(stripes)) =
            (&self.first.state, self.first.stripes.get())
        else {
            return None;
        };
        let now = clock.now();
        stripes.try_home(&direct.cell, &direct.params, now)
    }

    /// Counts a compare-and-swap lost on the first state's word: enough of them, and the key
    /// is striped.
    #[cold]
    #[inline(never)]
    fn lost_one(&self) {
        // Relaxed: a count for a heuristic; no memory is published through it.
        if self.may_stripe && self.lost.fetch_add(1, Ordering::Relaxed) + 1 >= LOST_BEFORE_STRIPING
        {
            self.lost.store(0, Ordering::Relaxed);
            // Relaxed: requests that read the bit late decide on the word, which is exact.
            self.mode.fetch_or(STRIPED, Ordering::Relaxed);
        }
    }

    /// [`DirectLimiter::try_acquire`] for a striped key, every other algorithm and after a
    /// policy change: a striped key's own stripe first, in a small frame; the rest in
    /// [`DirectLimiter::acquire_rest`].
    #[inline(never)]
    fn acquire_one(&self, clock: &impl Clock) -> Decision {
        // Relaxed: as in `try_acquire`; a stale mode only moves the request between the
        // stripes and the word, both exact.
        if self.mode.load(Ordering::Relaxed) == STRIPED {
            if let Some(decision) = self.striped_home(clock) {
                return decision;
            }
        }
        self.acquire_rest(clock)
    }

    /// [`DirectLimiter::acquire_one`] past a striped key's own stripe.
    #[inline(never)]
    fn acquire_rest(&self, clock: &impl Clock) -> Decision {
        let mode = self.mode.load(Ordering::Relaxed);
        if mode == STRIPED {
            if let Some(decision) = self.striped(&self.first, clock) {
                return decision;
            }
        } else if mode & STRIPED != 0 {
            let guard = Guard::new();
            if let Some(generation) = self.latest(&guard) {
                if let Some(decision) = self.striped(generation, clock) {
                    return decision;
                }
            }
        }
        match self.decide(1, clock) {
            Ok(decision) => decision,
            // Every policy has at least one permit, so a cost of 1 is always acceptable.
            Err(_) => unreachable!("a cost of 1 is within every policy"),
        }
    }

    /// A request of cost 1 on the stripes of `generation`'s token bucket. `None` for another
    /// algorithm or a retired state: the caller decides on the state as for any request.
    fn striped(&self, generation: &Generation, clock: &impl Clock) -> Option<Decision> {
        let PerAlgorithm::TokenBucket(direct) = &generation.state else {
            return None;
        };
        let now = clock.now();
        let stripes = generation
            .stripes
            .get_or_init(|| Stripes::for_machine(&direct.params, now));
        let striped = stripes.acquire(&direct.cell, &direct.params, now)?;
        if striped.quiet {
            // Relaxed: as when the bit is set.
            self.mode.fetch_and(!STRIPED, Ordering::Relaxed);
            stripes.give_back(striped.home, &generation.lowering, &direct.cell, now);
        }
        Some(striped.decision)
    }

    /// Decides a request of cost `n`: allowed only if `n` permits are available, and then all
    /// `n` are spent.
    ///
    /// # Errors
    ///
    /// [`CostError::Zero`] for `n == 0` and [`CostError::ExceedsLimit`] for `n` above the
    /// policy's permits (the smallest band's, for a composite policy); nothing changes.
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
        self.acquire_n_at(n, &mut Reading::default())
    }

    /// [`try_acquire_n`](DirectLimiter::try_acquire_n) at `reading`'s instant, as
    /// [`acquire_at`](DirectLimiter::acquire_at).
    #[inline(always)]
    pub(crate) fn acquire_n_at(
        &self,
        n: u64,
        reading: &mut Reading,
    ) -> Result<Decision, CostError> {
        if n == 1 {
            // The path that knows the stripes.
            return Ok(self.acquire_at(reading));
        }
        CostError::nonzero(n)?;
        self.decide(n, &Fixed(self.clock.now_in(reading)))
    }

    #[inline(always)]
    fn decide(&self, cost: u64, clock: &impl Clock) -> Result<Decision, CostError> {
        // Inlined, the marks are never stored.
        self.reserve_cost(cost, clock).map(|(decision, _)| decision)
    }

    /// Takes `n` permits now for a request whose real cost is known later: decided exactly as
    /// [`try_acquire_n`](DirectLimiter::try_acquire_n) (but for a contended limiter's stripes,
    /// which a reservation never takes from, as for
    /// [`RateLimiter::reserve_n`](crate::RateLimiter::reserve_n)), and the [`Reservation`] remembers
    /// what it took, so that [`settle`](DirectLimiter::settle) can give back what the request
    /// did not use or charge what it used on top. See [`RateLimiter::reserve_n`](crate::RateLimiter::reserve_n) for the
    /// rules.
    ///
    /// # Errors
    ///
    /// As [`try_acquire_n`](DirectLimiter::try_acquire_n): nothing changes.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{DirectLimiter, FakeClock};
    ///
    /// let limiter = DirectLimiter::with_clock("1000/min".parse()?, FakeClock::new());
    /// let r = limiter.reserve_n(500)?; // a completion of at most 500 tokens
    /// limiter.settle(r, 120)?; // it used 120
    /// assert_eq!(limiter.peek().remaining(), 879);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve_n(&self, n: u64) -> Result<Reservation, CostError> {
        self.take_part(n, &mut Reading::default(), |decision, held| {
            self.part_reservation(decision, n, held)
        })
    }

    /// [`reserve_n`](DirectLimiter::reserve_n), guarded: the [`ReservationGuard`] cancels the
    /// reservation when it is dropped unsettled, so only a
    /// [`settle`](ReservationGuard::settle) keeps permits spent. See
    /// [`RateLimiter::reserve_guarded`](crate::RateLimiter::reserve_guarded).
    ///
    /// # Errors
    ///
    /// As [`reserve_n`](DirectLimiter::reserve_n); nothing changes.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{DirectLimiter, FakeClock};
    ///
    /// let limiter = DirectLimiter::with_clock("1000/min".parse()?, FakeClock::new());
    /// let guard = limiter.reserve_guarded(500)?;
    /// drop(guard); // never settled: all 500 come back
    /// assert!(limiter.is_at_rest());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve_guarded(&self, n: u64) -> Result<ReservationGuard<'_, Self>, CostError> {
        let reservation = self.reserve_n(n)?;
        Ok(ReservationGuard::new(
            self,
            &(),
            reservation,
            |limiter, (), r, actual| limiter.settle(r, actual),
        ))
    }

    /// Settles a reservation at what the request really cost: gives back `reserved - actual`
    /// permits, or charges `actual - reserved` more, even past the limit (see
    /// [`RateLimiter::settle`](crate::RateLimiter::settle)). While the key is
    /// [striped](DirectLimiter::striping), a refund stops at the end of the latest run its
    /// stripes leased: it may give back less, or nothing.
    ///
    /// # Errors
    ///
    /// [`SettleError`] names a reservation that holds nothing (it was refused) or was made
    /// by another limiter; nothing changes.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{DirectLimiter, FakeClock};
    ///
    /// let limiter = DirectLimiter::with_clock("10/s".parse()?, FakeClock::new());
    /// let r = limiter.reserve_n(4)?;
    /// limiter.settle(r, 9)?; // 5 more than reserved: charged
    /// assert_eq!(limiter.peek().remaining(), 0); // the last permit, and none after it
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn settle(&self, reservation: Reservation, actual: u64) -> Result<(), SettleError> {
        let taken = reservation.take(self.origin())?;
        if !taken.changes(actual) {
            return Ok(());
        }
        let guard = Guard::new();
        let mut retry = Retry::new();
        loop {
            // After a policy change a refund gives nothing back, checked once the state is
            // found (see `Rebuilds`); a charge reads no mark, so the state in force takes it,
            // whatever its policy.
            if let Some(generation) = self.latest(&guard) {
                let now = self.clock.now();
                let settled =
                    self.rebuilds
                        .settle_unless_rebuilt(taken.made, taken.held, actual, || {
                            match &generation.state {
                                // A refund stops at what the stripes hold.
                                PerAlgorithm::TokenBucket(direct) => Stripes::settle(
                                    || generation.stripes.get(),
                                    &generation.lowering,
                                    &direct.cell,
                                    &direct.params,
                                    (taken.held, taken.marks[0], actual),
                                    now,
                                ),
                                state => state.settle(taken.held, &taken.marks, actual, now),
                            }
                        });
                if settled.is_some() {
                    return Ok(());
                }
            }
            // A policy change is between retiring the old state and publishing the new one.
            retry.snooze();
        }
    }

    /// Gives back everything a reservation holds: [`settle`](DirectLimiter::settle) at 0.
    ///
    /// # Errors
    ///
    /// As [`settle`](DirectLimiter::settle).
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{DirectLimiter, FakeClock};
    ///
    /// let limiter = DirectLimiter::with_clock("10/s".parse()?, FakeClock::new());
    /// let r = limiter.reserve_n(10)?;
    /// limiter.cancel(r)?;
    /// assert!(limiter.is_at_rest());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cancel(&self, reservation: Reservation) -> Result<(), SettleError> {
        self.settle(reservation, 0)
    }

    /// A request of `cost` decided as [`reserve_n`](DirectLimiter::reserve_n) decides it, for
    /// a part of an `AllOf`: the decision and what a reservation of it keeps. Decided at
    /// `reading`'s instant, as [`acquire_at`](DirectLimiter::acquire_at).
    #[inline]
    pub(crate) fn take_part<R>(
        &self,
        cost: u64,
        reading: &mut Reading,
        on: impl FnOnce(Decision, PartHeld) -> R,
    ) -> Result<R, CostError> {
        CostError::nonzero(cost)?;
        // Read before the decision, as `reserve_n`'s origin.
        let made = self.rebuilds.read();
        let (decision, marks) = self.reserve_cost(cost, &Fixed(self.clock.now_in(reading)))?;
        let held = PartHeld {
            marks,
            made,
            overflow: None,
            overflowed: false,
            created: false,
        };
        Ok(on(decision, held))
    }

    /// The reservation that [`DirectLimiter::take_part`] took, `decision` on `cost`.
    pub(crate) fn part_reservation(
        &self,
        decision: Decision,
        cost: u64,
        held: PartHeld,
    ) -> Reservation {
        let origin = Origin {
            rebuilds: held.made,
            ..self.origin()
        };
        Reservation::new(decision, cost, held.marks, origin)
    }

    /// Stripes the key now, as contention would.
    #[cfg(test)]
    pub(crate) fn stripe_now(&self) {
        self.mode.store(STRIPED, Ordering::Relaxed);
    }

    /// What a reservation made here is marked with.
    pub(crate) fn origin(&self) -> Origin {
        Origin {
            limiter: self.id,
            key: 0,
            // Read before the reservation is decided: the count must not be newer than the
            // state it is decided on.
            rebuilds: self.rebuilds.read(),
        }
    }

    /// A request of `cost`, and where its admission stands.
    #[inline(always)]
    fn reserve_cost(&self, cost: u64, clock: &impl Clock) -> Result<(Decision, Marks), CostError> {
        // Relaxed: a stale `REPLACED` bit only sends us to the first state, which a policy
        // change retires before it sets the bit, so we then get `None` and take the slow path.
        if self.mode.load(Ordering::Relaxed) & REPLACED == 0 {
            if let Some(result) = self.first.state.reserve_checked(clock, cost) {
                return result;
            }
        }
        self.acquire_replaced(cost, clock)
    }

    /// The path after a policy change: the latest generation, behind a pointer.
    #[cold]
    #[inline(never)]
    fn acquire_replaced(
        &self,
        cost: u64,
        clock: &impl Clock,
    ) -> Result<(Decision, Marks), CostError> {
        let guard = Guard::new();
        let mut retry = Retry::new();
        loop {
            if let Some(generation) = self.latest(&guard) {
                if let Some(result) = generation.state.reserve_checked(clock, cost) {
                    return result;
                }
            }
            // A policy change is between retiring the old state and publishing the new one.
            retry.snooze();
        }
    }

    /// The generation in force, or `None` while a policy change is being published.
    fn latest<'g>(&'g self, guard: &'g Guard) -> Option<&'g Generation> {
        // Acquire: pairs with the Release store of the bit, which follows the publication
        // of the new generation.
        if self.mode.load(Ordering::Acquire) & REPLACED != 0 {
            // Acquire: pairs with the Release swap that published the generation.
            self.current.load(Ordering::Acquire, guard).as_ref()
        } else {
            Some(&self.first)
        }
    }

    /// The generation in force, waiting out a policy change being published.
    fn settled<'g>(&'g self, guard: &'g Guard) -> &'g Generation {
        let mut retry = Retry::new();
        loop {
            if let Some(generation) = self.latest(guard) {
                return generation;
            }
            retry.snooze();
        }
    }

    /// What a request of cost 1 would get now, changing nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = tollgate::DirectLimiter::with_clock("1/s".parse()?, tollgate::FakeClock::new());
    /// assert!(limiter.peek().is_allowed());
    /// assert!(limiter.peek().is_allowed()); // peeking spends nothing
    /// assert!(limiter.try_acquire().is_allowed());
    /// assert!(!limiter.peek().is_allowed());
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn peek(&self) -> Decision {
        let guard = Guard::new();
        let mut retry = Retry::new();
        loop {
            let generation = self.settled(&guard);
            let peeked = match (&generation.state, generation.stripes.get()) {
                // While the key is striped, what the stripes hold counts with what the word
                // has: a request of cost 1 takes it from them.
                (PerAlgorithm::TokenBucket(direct), Some(stripes)) if self.is_striped() => {
                    stripes.peek(&direct.cell, &direct.params, self.clock.now())
                }
                (state, _) => state.peek(&self.clock, 1),
            };
            if let Some(decision) = peeked {
                return decision;
            }
            retry.snooze();
        }
    }

    /// What a request of cost `n` would get now, changing nothing: [`peek`](DirectLimiter::peek)
    /// for a request of several permits, as [`try_acquire_n`](DirectLimiter::try_acquire_n)
    /// would decide it at this instant.
    ///
    /// # Errors
    ///
    /// As `try_acquire_n`: [`CostError::Zero`] and [`CostError::ExceedsLimit`].
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = tollgate::DirectLimiter::with_clock("10/s".parse()?, tollgate::FakeClock::new());
    /// limiter.try_acquire_n(8)?;
    /// assert!(!limiter.peek_n(5)?.is_allowed());
    /// assert!(limiter.peek_n(2)?.is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn peek_n(&self, n: u64) -> Result<Decision, CostError> {
        if n == 1 {
            // The path that knows the stripes.
            return Ok(self.peek());
        }
        self.peek_part(n)
    }

    /// What [`DirectLimiter::take_part`] would decide now, changing nothing: the state's word
    /// alone, as a reservation takes from it.
    pub(crate) fn peek_part(&self, n: u64) -> Result<Decision, CostError> {
        CostError::nonzero(n)?;
        let guard = Guard::new();
        let mut retry = Retry::new();
        loop {
            if let Some(peeked) = self.settled(&guard).state.peek_checked(&self.clock, n) {
                return peeked;
            }
            // A policy change is between retiring the old state and publishing the new one.
            retry.snooze();
        }
    }

    /// The permits the limiter has now: the largest cost `n` for which
    /// [`try_acquire_n(n)`](DirectLimiter::try_acquire_n) would be allowed at this instant, 0
    /// when even one request would be refused. Changes nothing, as
    /// [`peek`](DirectLimiter::peek).
    ///
    /// **Not `peek().remaining()`**: that is what would remain *after* one more request.
    /// While anything is left, `available` is one more; when nothing is, both are 0. See
    /// [`RateLimiter::available`](crate::RateLimiter::available).
    ///
    /// While the key is [striped](DirectLimiter::striping), the count includes permits the
    /// stripes hold, which only requests of cost 1 take: at most one lease per stripe of it
    /// may be out of reach of a larger request.
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
        let guard = Guard::new();
        let now = self.clock.now();
        self.settled(&guard).state.is_at_rest(now)
    }

    /// Whether requests of cost 1 are now spread over stripes: the key was contended, and has
    /// not gone quiet since (see [`striping`](DirectLimiter::striping)).
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = tollgate::DirectLimiter::new("10/s".parse()?);
    /// limiter.try_acquire();
    /// assert!(!limiter.is_striped(), "one caller: one word");
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn is_striped(&self) -> bool {
        // Relaxed: a snapshot of the mode.
        self.mode.load(Ordering::Relaxed) & STRIPED != 0
    }

    /// Enforces `policy` from now on, under the keyed limiter's rule: permits already spent
    /// stay spent (counted at this instant, capped at the new limit), the limiter never
    /// gains more than the new policy allows, and re-applying the policy in force changes
    /// nothing; a change undone within a window gives nothing back (see
    /// [`RateLimiter::set_policy`](crate::RateLimiter::set_policy)).
    ///
    /// Requests racing the change wait for it (a few hundred nanoseconds) rather than decide
    /// on either side of it. After the first change, each decision reads the state through one
    /// more pointer, guarded by the epoch-based reclamation of `scc`: a few nanoseconds more
    /// per decision (see `docs/BENCHMARKS.md`).
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = tollgate::DirectLimiter::with_clock("10/s".parse()?, tollgate::FakeClock::new());
    /// for _ in 0..8 {
    ///     limiter.try_acquire();
    /// }
    /// limiter.set_policy("20/s".parse()?); // looser: the 8 spent stay spent
    /// assert_eq!(limiter.try_acquire().remaining(), 11);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn set_policy(&self, policy: Policy) {
        let mut kept = self
            .config
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let guard = Guard::new();
        let now = self.clock.now();
        // Retire the state in force, taking the permits it has in use. Only this call (under
        // the mutex) retires states, so it is live and the carry is there.
        let old = self.settled(&guard);
        if old.policy == policy {
            // Re-applying the policy in force changes nothing: no state rebuilt, no
            // reservation's refund voided (a service may apply its configuration every
            // minute), as for the keyed limiter.
            return;
        }
        // Counted from before the old state is retired to after the new one is published: a
        // refund never lands on the new state for a reservation made before (see `Rebuilds`).
        self.rebuilds.around(|| {
            // What the old state's stripes hold was handed out by its word: the carry counts
            // it as spent, and the stripes are retired with the word.
            let carry = old.state.retire_with_carry(now);
            if let Some(stripes) = old.stripes.get() {
                stripes.retire();
            }
            // What an earlier change could not carry counts too, until it would have come
            // back: a change undone within a window gives nothing back.
            let earlier = kept.and_then(|earlier| earlier.live(now));
            let (built, at) = built_from(carry, earlier.as_ref(), now);
            let state = state_for(&policy, built.as_ref(), at);
            *kept = to_keep((carry.as_ref(), earlier.as_ref()), state.carry(now), now);
            let generation = Generation::new(policy, state);
            // AcqRel: the Release half publishes the new generation (see `latest`).
            self.current
                .swap((Some(Shared::new(generation)), Tag::None), Ordering::AcqRel);
            // Release: orders the publication above before the bit; readers pair with
            // Acquire. The new state starts on one word.
            self.mode.store(REPLACED, Ordering::Release);
        });
    }

    /// The policy enforced.
    ///
    /// # Examples
    ///
    /// ```
    /// let limiter = tollgate::DirectLimiter::with_clock("5/s".parse()?, tollgate::FakeClock::new());
    /// assert_eq!(limiter.policy().first_band().permits(), 5);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn policy(&self) -> Policy {
        let guard = Guard::new();
        self.settled(&guard).policy
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
        f.debug_struct("DirectLimiter").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
mod wait;
