//! Several limits in one decision, all or nothing: [`AllOf`].

use std::fmt;
use std::hash::{BuildHasher, Hash};

use crate::clock::Reading;
use crate::decision::Decision;
use crate::direct::DirectLimiter;
use crate::error::CostError;
use crate::keyed::RateLimiter;
use crate::reservation::{Origin, SettleError};

#[cfg(any(feature = "redis", feature = "tower"))]
pub(crate) use self::in_order::take_in_order;
pub(crate) use self::parts::Chain;
#[cfg(tollgate_loom)]
pub(crate) use self::parts::{record, record_error, record_look, Part};
use self::parts::{GiveBackOnUnwind, PartSlot};
pub(crate) use self::tally::Tally;

#[cfg(any(feature = "redis", feature = "tower"))]
mod in_order;
mod parts;
mod tally;

pub use self::parts::{DirectPart, KeyPart};

/// One decision over several limits (per user, per client address, one global budget, a
/// budget of tokens): allowed only if every part allows, and then every part has spent its
/// permits; refused, and nothing was spent anywhere.
///
/// Parts are keys of [`RateLimiter`]s (of any key type, each with its own key) and
/// [`DirectLimiter`]s, each with a cost (1 unless given):
///
/// ```
/// use tollgate::{AllOf, DirectLimiter, FakeClock, RateLimiter};
///
/// let clock = FakeClock::new();
/// let per_user: RateLimiter<String, FakeClock> = RateLimiter::with_clock("100/min".parse()?, clock.clone());
/// let tokens: RateLimiter<String, FakeClock> = RateLimiter::with_clock("10000/min".parse()?, clock.clone());
/// let per_ip: RateLimiter<u32, FakeClock> = RateLimiter::with_clock("2/min".parse()?, clock.clone());
/// let global = DirectLimiter::with_clock("1000/s".parse()?, clock.clone());
/// let ip = 0x0a00_0001;
///
/// let request = AllOf::new()
///     .key(&per_user, "alice")
///     .key_n(&tokens, "alice", 700)
///     .key(&per_ip, &ip)
///     .named("per-ip")
///     .direct(&global);
/// assert!(request.try_acquire().is_allowed());
/// assert!(request.try_acquire().is_allowed());
/// let refused = request.try_acquire(); // the third from this address in a minute
/// assert!(!refused.is_allowed());
/// assert_eq!(request.name(refused.part()), Some("per-ip"));
/// // The refusal spent nothing: the user, the tokens and the global budget are as they were.
/// assert_eq!(per_user.available("alice"), 98);
/// assert_eq!(tokens.available("alice"), 10_000 - 1_400);
/// assert_eq!(global.available(), 998);
/// # Ok::<(), tollgate::PolicyError>(())
/// ```
///
/// **The protocol.** The parts are taken in the order they were added, each exactly as its
/// limiter takes a reservation (`reserve_n`), but the part added last, which is never given
/// back: [`try_acquire`](AllOf::try_acquire) decides it as its limiter decides a request
/// alone (`try_acquire_n`, the faster path, which counts a contended key's stripes), and
/// [`peek`](AllOf::peek) looks at it as its limiter's `peek` does. At the first refusal, the
/// parts already taken are given back at once, the last taken first, each by a refund of
/// every permit it took (`cancel`), and the parts after the refusing one are only looked at
/// (`peek_n`). A key the refused request was the first to ask a part's limiter about is
/// removed again with the give-back, unless another request spent from it meanwhile (or a
/// policy change came in between, or the key started with permits a full limiter's shared
/// state had counted for it: then it holds real state, and stays), and
/// a give-back to a full limiter's shared overflow state (`max_keys`) goes to that state. So
/// a part never admits more than its own policy, under any number of racing threads, and a
/// refused request leaves every part as it was, keys included, except for time: a request racing the refused one
/// on a part it took and gave back may be refused in between (it saw those permits taken),
/// at most as many permits as the refused request's cost on that part, for as long as the
/// give-back takes (a few compare-and-swaps).
///
/// **Where a give-back falls short.** The last part is never given back (when it allows,
/// every part has), so put last the part most likely to be hot or to change: a global
/// limit, a key that threads contend for (its stripes then serve it, as they serve its
/// limiter's own requests). A refund is the limiter's own, with its limits:
/// - a key spread over stripes (a hot, contended key: see `RateLimiter::striping`) gives back
///   nothing above a run a stripe leased after the part was taken, so a refusal may leave
///   that part's cost spent until time returns it;
/// - a `reset` of any key of the limiter, or a policy change, between the take and the
///   give-back voids the refund (the state may be another by then), as for any reservation;
/// - a token bucket charged above its burst by another reservation's settle in between gets
///   back less (a refund never gives back time the bucket no longer owes).
///
/// Each of these spends less than a refusal should have left, never more than a policy
/// allows. A part in shadow mode that would refuse lets the request through and spends
/// nothing; the whole decision is then that refusal, let through (`would_refuse`). Each
/// limiter's stats count its part's own decision: an admission later given back counts as
/// one. One limiter and key in two places of one `AllOf` count as one request of their costs
/// added: a total above their policy's permits is bad input as a cost above it is (see
/// **Costs**, named after the last of those places), and a refusal waits for the total.
///
/// **The answer.** Allowed: the decision of the part with the least left (its `remaining`,
/// `limit` and `reset_after`). Refused: the `retry_after` of the refusing part with the
/// longest wait, and as `remaining` the least any part has available. Either way
/// [`Decision::part`] says which part decided (its position, in the order added), and
/// [`AllOf::name`] its name if [`named`](AllOf::named) gave one.
///
/// **Costs.** A cost no state of its part's policy could admit (0, or above the policy's
/// permits) is bad input: [`check`](AllOf::check) and [`reserve`](AllOf::reserve) return it
/// as a [`PartError`] naming the part; [`try_acquire`](AllOf::try_acquire) and
/// [`peek`](AllOf::peek) refuse such a request, spending nothing, with a `retry_after` of
/// `u64::MAX` nanoseconds (never) and [`Decision::part`] naming the part. Check costs that
/// come from input with `check` or `reserve`.
///
/// **One instant.** [`try_acquire`](AllOf::try_acquire) and [`reserve`](AllOf::reserve)
/// read the time once: the parts on the system clock decide at that one reading of the
/// machine's counter, each from its own clock's zero (see
/// [`Clock::now_in`](crate::Clock::now_in)), so they agree on when the request came and the
/// decision pays for one clock read, not one per part. A part on a clock of another kind
/// ([`FakeClock`](crate::FakeClock), a clock of your own) reads its own. A key its limiter
/// does not track yet is decided at its limiter's own time, and the parts after it read the
/// time afresh: creating a key may take long (a resolver's lookup, its bucket's lock, a
/// sweep), and a part decided at an instant that long past could admit, in real time, more
/// than its policy. Give-backs and peeks read each limiter's own clock.
///
/// An `AllOf` borrows its limiters and keys and allocates nothing to decide; build one per
/// request. With no part it allows everything.
#[derive(Clone, Copy, Debug, Default)]
pub struct AllOf<P = ()> {
    /// The parts, the last added first: `(C, (B, (A, ())))`.
    parts: P,
}

/// The parts an [`AllOf`] holds: nested pairs, made by its builder methods (sealed).
pub trait Parts: Chain {}

impl<T: Chain> Parts for T {}

impl AllOf {
    /// No part yet.
    #[must_use]
    pub fn new() -> Self {
        AllOf { parts: () }
    }
}

impl<P: Parts> AllOf<P> {
    /// Adds `limiter`'s `key`, at a cost of 1.
    #[must_use]
    pub fn key<'a, K, C, S, Q>(
        self,
        limiter: &'a RateLimiter<K, C, S>,
        key: &'a Q,
    ) -> AllOf<(KeyPart<'a, K, C, S, Q>, P)>
    where
        K: Hash + Eq + Clone + std::borrow::Borrow<Q> + From<Q::Owned> + 'static,
        C: crate::clock::Clock,
        S: BuildHasher + Clone + 'static,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        self.key_n(limiter, key, 1)
    }

    /// Adds `limiter`'s `key`, at a cost of `n` permits.
    #[must_use]
    pub fn key_n<'a, K, C, S, Q>(
        self,
        limiter: &'a RateLimiter<K, C, S>,
        key: &'a Q,
        n: u64,
    ) -> AllOf<(KeyPart<'a, K, C, S, Q>, P)>
    where
        K: Hash + Eq + Clone + std::borrow::Borrow<Q> + From<Q::Owned> + 'static,
        C: crate::clock::Clock,
        S: BuildHasher + Clone + 'static,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        AllOf {
            parts: (KeyPart::new(limiter, key, n), self.parts),
        }
    }

    /// Adds `limiter`, at a cost of 1.
    #[must_use]
    pub fn direct<C: crate::clock::Clock>(
        self,
        limiter: &DirectLimiter<C>,
    ) -> AllOf<(DirectPart<'_, C>, P)> {
        self.direct_n(limiter, 1)
    }

    /// Adds `limiter`, at a cost of `n` permits.
    #[must_use]
    pub fn direct_n<C: crate::clock::Clock>(
        self,
        limiter: &DirectLimiter<C>,
        n: u64,
    ) -> AllOf<(DirectPart<'_, C>, P)> {
        AllOf {
            parts: (DirectPart::new(limiter, n), self.parts),
        }
    }

    /// How many parts.
    #[must_use]
    pub const fn len(&self) -> usize {
        P::LEN
    }

    /// Whether there is no part (such an `AllOf` allows everything).
    #[must_use]
    pub const fn is_empty(&self) -> bool {
        P::LEN == 0
    }

    /// The name of part `part` (its position, in the order added), if it was
    /// [`named`](AllOf::named).
    #[must_use]
    pub fn name(&self, part: usize) -> Option<&'static str> {
        self.parts.name_of(part)
    }

    /// Decides a request on every part at once: allowed, with every part's permits spent, or
    /// refused, with nothing spent (see the type's docs for the answer's fields).
    pub fn try_acquire(&self) -> Decision {
        let mut tally = Tally::default();
        // An admission keeps its permits: what each part holds is dropped unsettled.
        self.parts.acquire_all(&mut tally, &mut Reading::default());
        let decision = tally.decision();
        if decision.is_allowed() {
            return decision;
        }
        self.check_together(&mut tally);
        tally.decision()
    }

    /// What [`try_acquire`](AllOf::try_acquire) would decide now, changing nothing: each part
    /// looked at in turn (a snapshot of each, not of all at one instant).
    pub fn peek(&self) -> Decision {
        let mut tally = Tally::default();
        self.parts.peek_all(&mut tally);
        self.check_together(&mut tally);
        tally.decision()
    }

    /// Whether every part's cost is one its policy could ever admit, changing nothing.
    ///
    /// # Errors
    ///
    /// The first part whose cost is 0 or above its policy's permits, with its name.
    pub fn check(&self) -> Result<(), PartError> {
        let mut tally = Tally::default();
        self.parts.look_all(&mut tally);
        self.check_together(&mut tally);
        self.error(&tally)
    }

    /// Records in `tally` what the parts of one limiter and key decide together: such parts
    /// are taken one after the other, as one request of their costs added, which their
    /// policy must admit at once. A total above the policy's permits is refused for good, as
    /// a cost above them is; a total the key cannot take now waits as long as that request
    /// would. Recorded as the last part of the limiter and key. On the paths that refuse,
    /// and for `check` and `peek`: never on an admission.
    #[cold]
    fn check_together(&self, tally: &mut Tally) {
        if P::LEN < 2 {
            return;
        }
        let mut costs = Vec::with_capacity(P::LEN);
        self.parts.costs(&mut costs);
        for (last, (origin, _)) in costs.iter().enumerate() {
            let same = |(other, _): &&(Origin, u64)| other.check_place(*origin).is_ok();
            if costs[last + 1..].iter().any(|part| same(&part)) {
                continue;
            }
            let together = costs[..=last].iter().filter(same);
            if together.clone().count() < 2 {
                continue;
            }
            let total = together.fold(0_u64, |total, (_, cost)| total.saturating_add(*cost));
            match self.parts.look_at_of(last, total) {
                Err(error) => tally.failed(last, error),
                Ok(decision) if !decision.is_allowed() => tally.decided(last, &decision, total),
                Ok(_) => {}
            }
        }
    }

    /// Takes every part's permits now, for a request whose real costs are known only after
    /// it ran (the tokens an LLM call really used), all or nothing as
    /// [`try_acquire`](AllOf::try_acquire); [`settle`](AllOf::settle) then gives back what a
    /// part did not use, or charges what it used on top.
    ///
    /// Every part is taken as a reservation, the last one too, where `try_acquire` decides
    /// the last as a request alone: on a key spread over stripes (a hot, contended key: see
    /// `RateLimiter::striping`), a reservation takes from the key's word only, so `reserve`
    /// may refuse what `try_acquire` would admit from the stripes.
    ///
    /// # Errors
    ///
    /// As [`check`](AllOf::check); nothing is spent.
    pub fn reserve(&self) -> Result<AllOfReservation, PartError> {
        let mut tally = Tally::default();
        let mut held = P::Held::default();
        let unwinding = GiveBackOnUnwind::new(&self.parts, &mut held);
        let admitted = self
            .parts
            .take_all(&mut tally, unwinding.held, &mut Reading::default());
        unwinding.disarm();
        if !admitted {
            self.check_together(&mut tally);
        }
        self.error(&tally)?;
        let mut parts = Vec::with_capacity(P::LEN);
        if admitted {
            self.parts.flatten(held, &mut parts);
        }
        let parts = Parted {
            reservations: parts,
            len: P::LEN,
        };
        Ok(AllOfReservation {
            decision: tally.decision(),
            parts,
        })
    }

    /// Settles `reservation` at what each part really cost: `actual[i]` for part `i` (a part
    /// with no entry cost what it reserved), each part as its limiter's `settle`, the last
    /// added first. Every part is checked first: a settle that fails changes nothing.
    ///
    /// # Errors
    ///
    /// [`SettleError::Refused`] for a refused reservation, which holds nothing;
    /// [`SettleError::Parts`] for more costs than parts, or a reservation of an `AllOf` of
    /// another number of parts; [`SettleError::OtherLimiter`] or [`SettleError::OtherKey`]
    /// for one made by an `AllOf` of other parts.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{AllOf, FakeClock, RateLimiter};
    ///
    /// let clock = FakeClock::new();
    /// let requests: RateLimiter<String, FakeClock> = RateLimiter::with_clock("10/min".parse()?, clock.clone());
    /// let tokens: RateLimiter<String, FakeClock> = RateLimiter::with_clock("10000/min".parse()?, clock);
    /// let call = AllOf::new().key(&requests, "alice").key_n(&tokens, "alice", 700);
    /// let reservation = call.reserve()?;
    /// assert!(reservation.decision().is_allowed());
    /// call.settle(reservation, &[1, 250])?; // the call used 250 tokens: 450 come back
    /// assert_eq!(tokens.available("alice"), 9_750);
    /// assert_eq!(requests.available("alice"), 9);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn settle(&self, reservation: AllOfReservation, actual: &[u64]) -> Result<(), SettleError> {
        let Parted {
            mut reservations,
            len,
        } = reservation.parts;
        if len != P::LEN {
            return Err(SettleError::Parts {
                parts: len,
                given: P::LEN,
            });
        }
        if actual.len() > len {
            return Err(SettleError::Parts {
                parts: len,
                given: actual.len(),
            });
        }
        if !reservation.decision.is_allowed() {
            return Err(SettleError::Refused);
        }
        // Every part checked before any is settled: a settle that fails changes nothing.
        self.parts.owns_all(&reservations)?;
        self.parts.settle_all(&mut reservations, actual)
    }

    /// Gives back every permit of `reservation`: [`settle`](AllOf::settle) at 0 on every part.
    ///
    /// # Errors
    ///
    /// As [`settle`](AllOf::settle).
    pub fn cancel(&self, reservation: AllOfReservation) -> Result<(), SettleError> {
        self.settle(reservation, &vec![0; P::LEN])
    }

    fn error(&self, tally: &Tally) -> Result<(), PartError> {
        match tally.error() {
            Some((part, error)) => Err(PartError {
                part,
                name: self.name(part),
                error,
            }),
            None => Ok(()),
        }
    }
}

impl<X, R> AllOf<(X, R)>
where
    (X, R): Parts,
{
    /// Names the part added last, for [`AllOf::name`] and [`PartError`] (the limiter's
    /// role: "per-ip", "tokens").
    #[must_use]
    pub fn named(mut self, name: &'static str) -> Self {
        self.parts.name_last(name);
        self
    }
}

/// The permits an [`AllOf::reserve`] took on every part, until [`AllOf::settle`] or
/// [`AllOf::cancel`]; dropped unsettled, they stay spent.
#[must_use = "an AllOfReservation holds permits until it is settled or cancelled"]
#[derive(Debug)]
pub struct AllOfReservation {
    decision: Decision,
    parts: Parted,
}

/// What each part of an [`AllOfReservation`] holds, in the order added (none at all when
/// refused), and how many parts its `AllOf` had.
#[derive(Debug)]
struct Parted {
    reservations: Vec<PartSlot>,
    len: usize,
}

impl AllOfReservation {
    /// The combined decision, made as [`AllOf::try_acquire`] makes its own (but for a last
    /// part spread over stripes: see [`AllOf::reserve`]).
    pub const fn decision(&self) -> Decision {
        self.decision
    }
}

/// A part of an [`AllOf`] whose cost no state of its policy could admit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartError {
    part: usize,
    name: Option<&'static str>,
    error: CostError,
}

impl PartError {
    #[cfg(feature = "redis")]
    pub(crate) const fn new(part: usize, name: Option<&'static str>, error: CostError) -> Self {
        PartError { part, name, error }
    }

    /// The part's position, in the order the parts were added.
    #[must_use]
    pub const fn part(&self) -> usize {
        self.part
    }

    /// The part's name, if it was [`named`](AllOf::named).
    #[must_use]
    pub const fn name(&self) -> Option<&'static str> {
        self.name
    }

    /// What is wrong with the part's cost.
    #[must_use]
    pub const fn error(&self) -> CostError {
        self.error
    }
}

impl fmt::Display for PartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name {
            Some(name) => write!(f, "part {} ({name:?}): {}", self.part, self.error),
            None => write!(f, "part {}: {}", self.part, self.error),
        }
    }
}

impl std::error::Error for PartError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

#[cfg(test)]
mod tests;
