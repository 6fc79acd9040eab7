//! The parts of an [`AllOf`](super::AllOf) and the one protocol that decides them together:
//! take each part in the order it was added, and at the first refusal give back, newest
//! first, what the parts before it took.
//!
//! A chain of parts is a nested pair, the part added last first: `(C, (B, (A, ())))`. Deciding
//! it recurses to `A`, so the parts are taken in the order they were added, and each level
//! keeps what its part holds on the stack until the whole chain is decided: nothing is
//! allocated. A part that refuses ends the taking; the parts after it are only looked at
//! (a peek, for the longest wait), and the parts before it are given back from the newest
//! one down, the order in which a refund of each is exact (see `Gcra::settle`).

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};

use crate::clock::{Clock, Reading};
use crate::decision::Decision;
use crate::direct::DirectLimiter;
use crate::error::CostError;
use crate::keyed::RateLimiter;
use crate::reservation::{Origin, PartHeld, Reservation, SettleError};

use super::tally::Tally;

/// One limit of an [`AllOf`](super::AllOf): a limiter, the key it decides (for a keyed
/// limiter) and the cost. Public in name only, as [`Chain`].
#[allow(unreachable_pub)]
pub trait Part {
    /// What the part keeps of permits it took, until they are given back or settled: `None`
    /// when it let the request through without spending (a refusal of a limiter in shadow
    /// mode).
    type Held;

    /// Takes the part's permits at the decision's one `reading` of the time (see
    /// [`Clock::now_in`]; a part that took a path that may take long, a key new to its
    /// limiter, clears it, so that the parts after it read the time afresh), recording its
    /// decision in `tally` as part `index`: whether the part let the request through, and in
    /// `slot` what holds the permits (`None` when it refused, or let the request through
    /// without spending). Written where the decision is made, what holds them is never moved
    /// through the request path's results (moved, it costs store-forwarding stalls).
    fn take(
        &self,
        index: usize,
        tally: &mut Tally,
        slot: &mut Option<Self::Held>,
        reading: &mut Reading,
    ) -> bool;
    /// Spends the part's permits for good, recording its decision in `tally` as part
    /// `index`: whether it let the request through. For the part added last, which is never
    /// given back: by the limiter's own request path, which is faster than a reservation's
    /// (and spreads a contended key over stripes). At `reading`, as `take`.
    fn acquire(&self, index: usize, tally: &mut Tally, reading: &mut Reading) -> bool;
    /// Records in `tally`, as part `index`, what `acquire` would decide now, taking nothing:
    /// by the limiter's own peek (which counts a striped key's stripes for a cost of 1).
    fn look_own(&self, index: usize, tally: &mut Tally);
    /// Gives back every permit of `held` (a refund of all of them, as `cancel`).
    fn give_back(&self, held: Self::Held);
    /// `held` as the reservation it is, for `AllOf::reserve`.
    fn reservation(&self, held: Self::Held) -> Reservation;
    /// Where this part's reservations are made: its limiter and key.
    fn origin(&self) -> Origin;
    /// Settles `held`, what `take` took, at `actual` permits: 0 gives every permit back.
    fn settle(&self, held: Reservation, actual: u64) -> Result<(), SettleError>;
    /// Records in `tally`, as part `index`, what `take` would decide now, taking nothing.
    fn look(&self, index: usize, tally: &mut Tally);
    /// The part's cost.
    fn cost(&self) -> u64;
    /// What `take` would decide now on a request of `cost` (not the part's own), taking
    /// nothing.
    fn look_at(&self, cost: u64) -> Result<Decision, CostError>;
    /// The name given with `AllOf::named`.
    fn name(&self) -> Option<&'static str>;
    /// Gives the part a name.
    fn set_name(&mut self, name: &'static str);
}

/// Records part `index`'s `decision` of a request of `cost` in `tally`, and in `slot` what
/// holds its permits, `held`, when they were spent (not for a refusal, nor for a refusal
/// shadow mode let through): whether the part let the request through. Called where the
/// decision is made, so that neither is moved through the request path's results.
#[inline(always)]
pub(crate) fn record<H>(
    index: usize,
    cost: u64,
    (decision, held): (Decision, H),
    slot: &mut Option<H>,
    tally: &mut Tally,
) -> bool {
    tally.decided(index, &decision, cost);
    if decision.spent() {
        // Each part is taken once, into an empty slot: nothing to drop there first.
        debug_assert!(slot.is_none(), "a part is taken once");
        slot.get_or_insert(held);
    }
    decision.is_allowed()
}

/// Records part `index`'s cost no state could admit (`taken`'s error) in `tally`; the
/// part's answer otherwise.
#[inline(always)]
pub(crate) fn record_error(
    index: usize,
    taken: Result<bool, CostError>,
    tally: &mut Tally,
) -> bool {
    taken.unwrap_or_else(|error| {
        tally.failed(index, error);
        false
    })
}

/// The decision a part's reservation carries: an admission (what it holds is its cost). The
/// part's own decision went into the tally; only the whole's is ever shown.
const TOOK: Decision = Decision::allow(0, 0, 0);

/// Records a peek of part `index` of cost `cost` in `tally`.
pub(crate) fn record_look(
    index: usize,
    cost: u64,
    peeked: Result<Decision, CostError>,
    tally: &mut Tally,
) {
    match peeked {
        Ok(decision) => tally.decided(index, &decision, cost),
        Err(error) => tally.failed(index, error),
    }
}

/// A key of a [`RateLimiter`] with its cost: made by [`AllOf::key`](super::AllOf::key) and
/// [`AllOf::key_n`](super::AllOf::key_n).
pub struct KeyPart<'a, K, C, S: BuildHasher, Q: ?Sized> {
    limiter: &'a RateLimiter<K, C, S>,
    key: &'a Q,
    cost: u64,
    name: Option<&'static str>,
}

impl<'a, K, C, S: BuildHasher, Q: ?Sized> KeyPart<'a, K, C, S, Q> {
    pub(super) fn new(limiter: &'a RateLimiter<K, C, S>, key: &'a Q, cost: u64) -> Self {
        KeyPart {
            limiter,
            key,
            cost,
            name: None,
        }
    }
}

impl<K, C, S: BuildHasher, Q: ?Sized> Clone for KeyPart<'_, K, C, S, Q> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K, C, S: BuildHasher, Q: ?Sized> Copy for KeyPart<'_, K, C, S, Q> {}

/// The part's name and cost (a limiter's `Debug` says more than a part needs).
impl<K, C, S: BuildHasher, Q: ?Sized> fmt::Debug for KeyPart<'_, K, C, S, Q> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyPart")
            .field("name", &self.name)
            .field("cost", &self.cost)
            .finish_non_exhaustive()
    }
}

impl<K, C, S, Q> Part for KeyPart<'_, K, C, S, Q>
where
    K: Hash + Eq + Clone + Borrow<Q> + From<Q::Owned> + 'static,
    C: Clock,
    S: BuildHasher + Clone + 'static,
    Q: Hash + Eq + ToOwned + ?Sized,
{
    type Held = PartHeld;

    #[inline]
    fn take(
        &self,
        index: usize,
        tally: &mut Tally,
        slot: &mut Option<PartHeld>,
        reading: &mut Reading,
    ) -> bool {
        let cost = self.cost;
        let taken = self.limiter.take_part(
            self.key,
            cost,
            reading,
            #[inline(always)]
            |decision, held| record(index, cost, (decision, held), slot, tally),
        );
        record_error(index, taken, tally)
    }

    #[inline]
    fn acquire(&self, index: usize, tally: &mut Tally, reading: &mut Reading) -> bool {
        let decided = self.limiter.acquire_n_at(self.key, self.cost, reading);
        let taken =
            decided.map(|decision| record(index, self.cost, (decision, ()), &mut None, tally));
        record_error(index, taken, tally)
    }

    fn look_own(&self, index: usize, tally: &mut Tally) {
        let peeked = self.limiter.peek_n(self.key, self.cost);
        let peeked = peeked.map(|decision| self.limiter.as_decided(decision));
        record_look(index, self.cost, peeked, tally);
    }

    fn give_back(&self, held: PartHeld) {
        let created = held.created;
        self.limiter
            .give_back_part(self.key, self.reservation(held), created);
    }

    fn reservation(&self, held: PartHeld) -> Reservation {
        self.limiter
            .part_reservation(self.key, TOOK, self.cost, held)
    }

    fn origin(&self) -> Origin {
        self.limiter.origin(self.key)
    }

    fn settle(&self, held: Reservation, actual: u64) -> Result<(), SettleError> {
        self.limiter.settle(self.key, held, actual)
    }

    fn look(&self, index: usize, tally: &mut Tally) {
        record_look(index, self.cost, self.look_at(self.cost), tally);
    }

    fn cost(&self) -> u64 {
        self.cost
    }

    fn look_at(&self, cost: u64) -> Result<Decision, CostError> {
        let peeked = self.limiter.peek_part(self.key, cost);
        peeked.map(|decision| self.limiter.as_decided(decision))
    }

    fn name(&self) -> Option<&'static str> {
        self.name
    }

    fn set_name(&mut self, name: &'static str) {
        self.name = Some(name);
    }
}

/// A [`DirectLimiter`] with its cost: made by [`AllOf::direct`](super::AllOf::direct) and
/// [`AllOf::direct_n`](super::AllOf::direct_n).
pub struct DirectPart<'a, C> {
    limiter: &'a DirectLimiter<C>,
    cost: u64,
    name: Option<&'static str>,
}

impl<'a, C> DirectPart<'a, C> {
    pub(super) fn new(limiter: &'a DirectLimiter<C>, cost: u64) -> Self {
        DirectPart {
            limiter,
            cost,
            name: None,
        }
    }
}

impl<C> Clone for DirectPart<'_, C> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<C> Copy for DirectPart<'_, C> {}

/// The part's name and cost, as [`KeyPart`]'s.
impl<C> fmt::Debug for DirectPart<'_, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DirectPart")
            .field("name", &self.name)
            .field("cost", &self.cost)
            .finish_non_exhaustive()
    }
}

impl<C: Clock> Part for DirectPart<'_, C> {
    type Held = PartHeld;

    #[inline]
    fn take(
        &self,
        index: usize,
        tally: &mut Tally,
        slot: &mut Option<PartHeld>,
        reading: &mut Reading,
    ) -> bool {
        let cost = self.cost;
        let taken = self.limiter.take_part(
            cost,
            reading,
            #[inline(always)]
            |decision, held| record(index, cost, (decision, held), slot, tally),
        );
        record_error(index, taken, tally)
    }

    #[inline]
    fn acquire(&self, index: usize, tally: &mut Tally, reading: &mut Reading) -> bool {
        let decided = self.limiter.acquire_n_at(self.cost, reading);
        let taken =
            decided.map(|decision| record(index, self.cost, (decision, ()), &mut None, tally));
        record_error(index, taken, tally)
    }

    fn look_own(&self, index: usize, tally: &mut Tally) {
        let peeked = self.limiter.peek_n(self.cost);
        record_look(index, self.cost, peeked, tally);
    }

    fn give_back(&self, held: PartHeld) {
        // As for a key's part.
        let _ = self.limiter.cancel(self.reservation(held));
    }

    fn reservation(&self, held: PartHeld) -> Reservation {
        self.limiter.part_reservation(TOOK, self.cost, held)
    }

    fn origin(&self) -> Origin {
        self.limiter.origin()
    }

    fn settle(&self, held: Reservation, actual: u64) -> Result<(), SettleError> {
        self.limiter.settle(held, actual)
    }

    fn look(&self, index: usize, tally: &mut Tally) {
        record_look(index, self.cost, self.limiter.peek_part(self.cost), tally);
    }

    fn cost(&self) -> u64 {
        self.cost
    }

    fn look_at(&self, cost: u64) -> Result<Decision, CostError> {
        self.limiter.peek_part(cost)
    }

    fn name(&self) -> Option<&'static str> {
        self.name
    }

    fn set_name(&mut self, name: &'static str) {
        self.name = Some(name);
    }
}

/// What one part of an [`AllOfReservation`](super::AllOfReservation) holds. Public in name
/// only, as [`Chain`].
#[derive(Debug)]
#[allow(unreachable_pub)]
pub enum PartSlot {
    /// The part's reservation.
    Held(Reservation),
    /// Nothing (a refusal that shadow mode let through): only where it would have been
    /// made, so that a settle can tell a reservation of other parts.
    Nothing(Origin),
}

/// What deciding a chain of parts needs (see the module docs). Public in name only, for the
/// bound of the sealed `all_of::Parts`; nothing outside the crate can name it.
#[allow(unreachable_pub)]
pub trait Chain {
    /// How many parts.
    const LEN: usize;
    /// What the parts hold once all of them let the request through, the last added first.
    type Held: Default;

    /// Takes every part in the order added, recording each decision in `tally` and what each
    /// part holds in `held`: whether all of them let the request through; when one refused,
    /// nothing is held anywhere (the parts after it only looked at).
    fn take_all(&self, tally: &mut Tally, held: &mut Self::Held, reading: &mut Reading) -> bool;
    /// As `take_all`, spending for good: the part added last by its limiter's own request
    /// path (`Part::acquire`), as nothing ever gives it back. The answer is in `tally`.
    fn acquire_all(&self, tally: &mut Tally, reading: &mut Reading);
    /// Gives back what `take_all` took, the last added first, leaving `held` empty.
    fn give_back_all(&self, held: &mut Self::Held);
    /// Records what every part would decide now, taking nothing.
    fn look_all(&self, tally: &mut Tally);
    /// As `look_all`, the part added last looked at as `acquire_all` decides it
    /// (`Part::look_own`).
    fn peek_all(&self, tally: &mut Tally);
    /// What every part holds, in the order added.
    fn flatten(&self, held: Self::Held, into: &mut Vec<PartSlot>);
    /// Whether every part of `held` (in the order added) was made by its part here.
    fn owns_all(&self, held: &[PartSlot]) -> Result<(), SettleError>;
    /// Settles the reservation of each part in `held` (in the order added, popped from the
    /// end) at `actual[index]`, the last added first; a part with no entry keeps what it
    /// reserved. See `AllOf::settle`.
    fn settle_all(&self, held: &mut Vec<PartSlot>, actual: &[u64]) -> Result<(), SettleError>;
    /// Where each part's reservations are made, with its cost, in the order added.
    fn costs(&self, into: &mut Vec<(Origin, u64)>);
    /// What part `index`'s `take` would decide now on a request of `cost`, taking nothing.
    fn look_at_of(&self, index: usize, cost: u64) -> Result<Decision, CostError>;
    /// The name of part `index`.
    fn name_of(&self, index: usize) -> Option<&'static str>;
    /// Names the part added last.
    fn name_last(&mut self, name: &'static str);
}

/// What the parts of `chain` taken so far hold, given back if the decision unwinds (a
/// panic in a part decided after them: a per-key resolver, a key's `Hash`, a clock), as a
/// refusal gives them back: a request never decided spends nothing. Disarmed (forgotten,
/// never dropped) on every return, it costs nothing on the paths that return.
pub(crate) struct GiveBackOnUnwind<'a, C: Chain> {
    chain: &'a C,
    /// What the parts taken hold, for the decision to fill.
    pub(crate) held: &'a mut C::Held,
}

impl<'a, C: Chain> GiveBackOnUnwind<'a, C> {
    /// Armed over `held`, what `chain`'s parts take.
    #[inline(always)]
    pub(crate) fn new(chain: &'a C, held: &'a mut C::Held) -> Self {
        GiveBackOnUnwind { chain, held }
    }

    /// The decision returned: what the parts hold is the caller's.
    #[inline(always)]
    pub(crate) fn disarm(self) {
        std::mem::forget(self);
    }
}

impl<C: Chain> Drop for GiveBackOnUnwind<'_, C> {
    fn drop(&mut self) {
        self.chain.give_back_all(self.held);
    }
}

impl Chain for () {
    const LEN: usize = 0;
    type Held = ();

    fn take_all(&self, _: &mut Tally, (): &mut (), _: &mut Reading) -> bool {
        true
    }

    fn acquire_all(&self, _: &mut Tally, _: &mut Reading) {}

    fn give_back_all(&self, (): &mut ()) {}

    fn look_all(&self, _: &mut Tally) {}

    fn peek_all(&self, _: &mut Tally) {}

    fn flatten(&self, (): (), _: &mut Vec<PartSlot>) {}

    fn owns_all(&self, _: &[PartSlot]) -> Result<(), SettleError> {
        Ok(())
    }

    fn settle_all(&self, _: &mut Vec<PartSlot>, _: &[u64]) -> Result<(), SettleError> {
        Ok(())
    }

    fn costs(&self, _: &mut Vec<(Origin, u64)>) {}

    fn look_at_of(&self, _: usize, _: u64) -> Result<Decision, CostError> {
        Ok(Decision::allow(0, 0, 0))
    }

    fn name_of(&self, _: usize) -> Option<&'static str> {
        None
    }

    fn name_last(&mut self, _: &'static str) {}
}

impl<X: Part, R: Chain> Chain for (X, R) {
    const LEN: usize = R::LEN + 1;
    type Held = (Option<X::Held>, R::Held);

    #[inline]
    fn take_all(
        &self,
        tally: &mut Tally,
        (mine, before): &mut Self::Held,
        reading: &mut Reading,
    ) -> bool {
        let (part, earlier) = self;
        let index = R::LEN;
        if !earlier.take_all(tally, before, reading) {
            // An earlier part refused: this one is only looked at, for the longest wait.
            part.look(index, tally);
            return false;
        }
        if part.take(index, tally, mine, reading) {
            true
        } else {
            earlier.give_back_all(before);
            false
        }
    }

    #[inline]
    fn acquire_all(&self, tally: &mut Tally, reading: &mut Reading) {
        let (part, earlier) = self;
        let index = R::LEN;
        let mut before = R::Held::default();
        let unwinding = GiveBackOnUnwind::new(earlier, &mut before);
        if !earlier.take_all(tally, unwinding.held, reading) {
            part.look_own(index, tally);
        } else if !part.acquire(index, tally, reading) {
            earlier.give_back_all(unwinding.held);
        }
        // Admitted, what the earlier parts hold stays spent.
        unwinding.disarm();
    }

    fn give_back_all(&self, (held, before): &mut Self::Held) {
        if let Some(held) = held.take() {
            self.0.give_back(held);
        }
        self.1.give_back_all(before);
    }

    fn look_all(&self, tally: &mut Tally) {
        self.1.look_all(tally);
        self.0.look(R::LEN, tally);
    }

    fn peek_all(&self, tally: &mut Tally) {
        self.1.look_all(tally);
        self.0.look_own(R::LEN, tally);
    }

    fn flatten(&self, (held, before): Self::Held, into: &mut Vec<PartSlot>) {
        self.1.flatten(before, into);
        into.push(match held {
            Some(held) => PartSlot::Held(self.0.reservation(held)),
            None => PartSlot::Nothing(self.0.origin()),
        });
    }

    fn owns_all(&self, held: &[PartSlot]) -> Result<(), SettleError> {
        let origin = self.0.origin();
        match &held[R::LEN] {
            PartSlot::Held(reservation) => reservation.check(origin)?,
            PartSlot::Nothing(made) => made.check_place(origin)?,
        }
        self.1.owns_all(held)
    }

    fn settle_all(&self, held: &mut Vec<PartSlot>, actual: &[u64]) -> Result<(), SettleError> {
        // The last added first, as a refund of the newest reservation first is exact.
        if let (Some(PartSlot::Held(reservation)), Some(&actual)) = (held.pop(), actual.get(R::LEN))
        {
            self.0.settle(reservation, actual)?;
        }
        self.1.settle_all(held, actual)
    }

    fn costs(&self, into: &mut Vec<(Origin, u64)>) {
        self.1.costs(into);
        into.push((self.0.origin(), self.0.cost()));
    }

    fn look_at_of(&self, index: usize, cost: u64) -> Result<Decision, CostError> {
        if index == R::LEN {
            self.0.look_at(cost)
        } else {
            self.1.look_at_of(index, cost)
        }
    }

    fn name_of(&self, index: usize) -> Option<&'static str> {
        if index == R::LEN {
            self.0.name()
        } else {
            self.1.name_of(index)
        }
    }

    fn name_last(&mut self, name: &'static str) {
        self.0.set_name(name);
    }
}
