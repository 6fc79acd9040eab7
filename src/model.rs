//! Entry points for the loom models in `tests/loom_models/`; compiled only under
//! `--cfg tollgate_loom`, never part of the public API.
//!
//! [`ModelCell`] exposes one per-key state machine with its raw retire step, so a model can
//! race requests against eviction on the very code the limiters run. [`ModelSlab`] exposes
//! the slab a keyed limiter keeps its token-bucket states in, with the epoch guard that holds
//! back the reuse of a freed cell ([`ModelGuard`]), and a cell pinned as a thread's last hit
//! pins it ([`ModelPinned`]). [`ModelGauge`] is a concurrency limiter's gauge of one key,
//! [`ModelStrikes`] a login guard's strike record of one account, [`ModelStripes`] a hot key
//! spread over stripes.

use std::sync::Arc;

use crate::clock::Clock;
use crate::concurrency::gauge::{acquire_on, acquire_shared, AtCapacity, Gauge, Permit};
use crate::decision::Decision;
use crate::engine::any_state::{any_state, AnyState};
use crate::engine::cells::{Cells, Pinned, Slab};
use crate::engine::rebuilds::Rebuilds;
use crate::engine::state::Decides;
use crate::engine::state::RateState;
use crate::engine::stripes::{Home, Stripes};
use crate::engine::sync::{Guard, Mutex};
use crate::engine::token_bucket::{Gcra, GcraCell};
use crate::engine::word::Once;
use crate::login::strikes::{Escalation, StrikeCell};
use crate::login::LoginConfig;
use crate::policy::Policy;
use crate::reservation::Marks;

/// One per-key state machine of any algorithm: the state a per-key policy stores, built by
/// the same dispatch as every limiter's.
#[derive(Debug)]
pub struct ModelCell(AnyState);

impl ModelCell {
    /// A fresh state for `policy`: the composite state machine when it has several bands.
    pub fn new(policy: &Policy) -> Self {
        ModelCell(any_state(policy, None, 0))
    }

    /// Decides a request; `None` when the state was retired.
    pub fn try_acquire<C: Clock>(&self, clock: &C, cost: u64) -> Option<Decision> {
        self.0.try_acquire(clock, cost)
    }

    /// Reserves `cost` permits: decided as [`ModelCell::try_acquire`], with what a settle
    /// needs later (the permits held, 0 for a refusal, and where the admission stands in
    /// each band). `None` when the state was retired.
    pub fn reserve<C: Clock>(&self, clock: &C, cost: u64) -> Option<(Decision, ModelHeld)> {
        self.0.reserve(clock, cost).map(|(decision, marks)| {
            let held = if decision.is_allowed() { cost } else { 0 };
            (decision, ModelHeld { held, marks })
        })
    }

    /// Settles at `now` a reservation that really cost `actual`: gives back what it held
    /// beyond that, or charges the difference (`RateState::settle`). `None` when the state
    /// was retired.
    pub fn settle(&self, held: &ModelHeld, actual: u64, now: u64) -> Option<()> {
        self.0.settle(held.held, &held.marks, actual, now)
    }

    /// What a request would get now, changing nothing; `None` when the state was retired.
    pub fn peek<C: Clock>(&self, clock: &C, cost: u64) -> Option<Decision> {
        self.0.peek(clock, cost)
    }

    /// Retires the state if it is at rest at `now`.
    pub fn try_retire(&self, now: u64) -> bool {
        self.0.try_retire(now)
    }

    /// Retires the state for a policy change (`set_policy`), from one consistent snapshot
    /// whatever it holds, and returns the most permits in use at `now` in any of its bands:
    /// what the new policy's state will count as spent. `None` when it was already retired.
    pub fn retire_for_change(&self, now: u64) -> Option<u64> {
        self.0
            .retire_with_carry(now)
            .map(|carry| carry.spent_within(u64::MAX))
    }

    /// Whether the state is at rest at `now`.
    pub fn is_at_rest(&self, now: u64) -> bool {
        self.0.is_at_rest(now)
    }
}

/// What a reservation on a [`ModelCell`] holds: its permits and its bands' marks.
#[derive(Clone, Copy, Debug)]
pub struct ModelHeld {
    held: u64,
    marks: Marks,
}

impl ModelHeld {
    /// The permits held: the cost when admitted, 0 when refused.
    pub fn held(&self) -> u64 {
        self.held
    }
}

/// The cells of a keyed limiter's table for a token-bucket policy: a slab whose freed cells
/// are given to new keys once no reader can hold them.
pub struct ModelSlab {
    cells: Slab<GcraCell>,
    gcra: Gcra,
}

impl std::fmt::Debug for ModelSlab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelSlab").finish_non_exhaustive()
    }
}

impl ModelSlab {
    /// An empty slab for `policy`'s first band, decided as a token bucket.
    pub fn new(policy: &Policy) -> Self {
        ModelSlab {
            cells: Slab::new(),
            gcra: GcraCell::params(policy),
        }
    }

    /// A cell holding a fresh state, not yet published: its place (a freed one if any has
    /// come back). `None` when the slab is full.
    pub fn hold_fresh(&self) -> Option<u32> {
        self.cells.hold(GcraCell::fresh(&self.gcra))
    }

    /// Decides a request on the state at `slot` (a place `hold_fresh` gave); `None` when it is
    /// retired.
    pub fn try_acquire<C: Clock>(&self, slot: u32, clock: &C, cost: u64) -> Option<Decision> {
        self.cells.get(&slot).try_acquire(&self.gcra, clock, cost)
    }

    /// Retires the state in `slot` if it is at rest at `now`.
    pub fn try_retire(&self, slot: u32, now: u64) -> bool {
        self.cells.get(&slot).try_retire(&self.gcra, now)
    }

    /// Hands `slot` back, once its entry has left the index: it is given again once every
    /// guard present now is gone.
    pub fn release(&self, slot: u32) {
        self.cells.release(vec![slot]);
    }

    /// Pins the cell at `slot`, as a keyed limiter's thread pins its last hit: to be called
    /// under a [`ModelGuard`] taken before the lookup that found `slot`, so that the guard
    /// keeps a release of the place from running before the pin is counted. While the
    /// [`ModelPinned`] lives, the place is not given to another key.
    pub fn pin(&self, slot: u32) -> ModelPinned {
        ModelPinned {
            cell: self.cells.pin(slot),
            gcra: self.gcra,
        }
    }
}

/// A cell of a [`ModelSlab`] pinned by a thread that decides on it with no guard, as a keyed
/// limiter's last hit does (`keyed::last_hit`). Dropping it unpins the cell.
pub struct ModelPinned {
    cell: Pinned<GcraCell>,
    gcra: Gcra,
}

impl std::fmt::Debug for ModelPinned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelPinned").finish_non_exhaustive()
    }
}

impl ModelPinned {
    /// Decides a request of cost 1 at `now` on the pinned cell in one compare-and-swap, with
    /// no guard; `None` when the state is retired or another thread wrote it first.
    pub fn try_acquire_once(&self, now: u64) -> Option<Decision> {
        match self.cell.get().reserve_once(&self.gcra, now, 1) {
            Once::Done((decision, _)) => Some(decision),
            Once::Retired | Once::Lost => None,
        }
    }
}

/// What a reader holds from its lookup of a key to its decision on the key's cell.
pub struct ModelGuard(#[allow(dead_code)] Guard);

impl std::fmt::Debug for ModelGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelGuard").finish_non_exhaustive()
    }
}

impl ModelGuard {
    /// A guard.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        ModelGuard(Guard::new())
    }
}

/// A limiter's count of rebuilds (resets, policy changes) and the rule that keeps a refund off
/// every state built after one, as the keyed and direct limiters run it.
#[derive(Debug)]
pub struct ModelRebuilds(Rebuilds);

impl ModelRebuilds {
    /// No rebuild yet.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        ModelRebuilds(Rebuilds::new())
    }

    /// The count now, as a reservation records it.
    pub fn read(&self) -> u64 {
        self.0.read()
    }

    /// Runs `rebuild` as one rebuild: begun before it (which retires the old state and
    /// publishes the new one), ended after.
    pub fn around<R>(&self, rebuild: impl FnOnce() -> R) -> R {
        self.0.around(rebuild)
    }

    /// Runs `settle` on a state just found, unless it is a refund of a reservation made
    /// under `made` and a rebuild came in since (then `Some(())`: nothing given back).
    pub fn settle_unless_rebuilt(
        &self,
        made: u64,
        held: u64,
        actual: u64,
        settle: impl FnOnce() -> Option<()>,
    ) -> Option<()> {
        self.0.settle_unless_rebuilt(made, held, actual, settle)
    }
}

/// One gauge of a concurrency limiter, for the models in `tests/loom_models/concurrency.rs`.
#[doc(hidden)]
#[derive(Debug)]
pub struct ModelGauge(Arc<Gauge>);

impl ModelGauge {
    /// A gauge with nothing in flight.
    pub fn new(limit: u64) -> Self {
        ModelGauge(Arc::new(Gauge::new(limit)))
    }

    /// What the limiter's hit path does on this gauge.
    pub fn try_acquire(&self) -> Result<Permit, AtCapacity> {
        acquire_on(&self.0)
    }

    /// What a request does while the map is full, this gauge being the key's (in the
    /// overflow ledger, its map bucket held) and `shared` the shared gauge of its limit.
    pub fn try_acquire_overflow(&self, shared: &ModelGauge) -> Result<Permit, AtCapacity> {
        acquire_shared(&self.0, &shared.0)
    }

    /// Permits held now.
    pub fn in_flight(&self) -> u64 {
        self.0.in_flight()
    }
}

/// A strike record of a login guard with the escalation of a config, for the loom models.
#[doc(hidden)]
#[derive(Debug)]
pub struct ModelStrikes(StrikeCell, Escalation);

impl ModelStrikes {
    /// A record with no strike, escalating as `config` says.
    pub fn new(config: &LoginConfig) -> Self {
        ModelStrikes(StrikeCell::fresh(), config.escalation())
    }

    /// Strikes at `now`; returns the streak after it.
    pub fn strike(&self, now: u64) -> u32 {
        self.0.strike(&self.1, now).strikes()
    }

    /// ns of lockout left at `now`, if locked out.
    pub fn locked_for(&self, now: u64) -> Option<u64> {
        self.1.locked_for(self.0.load(), now)
    }
}

/// One key's token bucket spread over stripes (`engine::stripes`): the central TAT word, its
/// parameters, the stripes and the lock of whatever lowers the TAT, for the loom models of
/// leases, steals, give-backs and refunds.
#[derive(Debug)]
pub struct ModelStripes {
    central: GcraCell,
    gcra: Gcra,
    stripes: std::sync::OnceLock<Stripes>,
    lowering: Mutex<()>,
}

impl ModelStripes {
    /// A fresh key under `policy`'s first band as a token bucket, with `stripes` stripes whose
    /// leases take up to `lease` permits.
    pub fn new(policy: &Policy, stripes: usize, lease: u64) -> Self {
        let gcra = GcraCell::params(policy);
        let lock = std::sync::OnceLock::new();
        let _ = lock.set(Stripes::new(stripes, lease));
        ModelStripes {
            central: GcraCell::fresh(&gcra),
            gcra,
            stripes: lock,
            lowering: Mutex::new(()),
        }
    }

    fn stripes(&self) -> &Stripes {
        self.stripes.get().expect("set at creation")
    }

    /// Decides a request of cost 1 at `now` from stripe `home`: whether it was admitted.
    pub fn acquire(&self, now: u64, home: usize) -> bool {
        self.stripes()
            .acquire_from(home, &self.central, &self.gcra, now)
            .is_some_and(|striped| striped.decision.is_allowed())
    }

    /// A request of cost 1 at `now` on stripe `home` alone, as a thread that holds the key's
    /// stripes pinned decides (`keyed::last_hit`): `Some(true)` admitted from the stripe,
    /// `Some(false)` nothing there (the request would go through the table), `None` the
    /// stripes retired.
    pub fn take_home(&self, now: u64, home: usize) -> Option<bool> {
        match self
            .stripes()
            .home_from(home, &self.central, &self.gcra, now)
        {
            Home::Decided(decision) => Some(decision.is_allowed()),
            Home::Empty => Some(false),
            Home::Retired => None,
        }
    }

    /// Retires the stripes, as a key leaving the table or going back to its word does: no
    /// request takes from them afterwards, and what they held is lost to the key.
    pub fn retire(&self) {
        self.stripes().retire();
    }

    /// Reserves `cost` permits at `now` on the central word: the mark a refund needs, `None`
    /// when refused.
    pub fn reserve(&self, now: u64, cost: u64) -> Option<u64> {
        let (decision, mark) = self.central.reserve_at(&self.gcra, now, cost, || {})?;
        decision.is_allowed().then_some(mark)
    }

    /// Gives back every permit of a reservation of `held` that left the TAT at `mark`, at
    /// `now`.
    pub fn cancel(&self, now: u64, held: u64, mark: u64) {
        let _ = Stripes::settle(
            || self.stripes.get(),
            &self.lowering,
            &self.central,
            &self.gcra,
            (held, mark, 0),
            now,
        );
    }

    /// Gives the unused end of stripe `home`'s lease back to the central word, at `now`.
    pub fn give_back(&self, now: u64, home: usize) {
        self.stripes()
            .give_back(home, &self.lowering, &self.central, now);
    }

    /// The permits the central word and the stripes have at `now`, as a look that changes
    /// nothing counts them (`available`).
    pub fn available(&self, now: u64) -> u64 {
        self.stripes()
            .peek(&self.central, &self.gcra, now)
            .map_or(0, |decision| decision.available_before(1))
    }
}

/// Two per-key states decided together by an `AllOf`'s own protocol (`all_of::parts`): each
/// part a [`ModelCell`] of this pair, taken in the order given, given back at the first
/// refusal.
#[derive(Debug)]
pub struct ModelAllOf {
    cells: [ModelCell; 2],
}

/// One cell of a [`ModelAllOf`] as a part of an `AllOf`, deciding at `clock`'s time.
struct ModelPart<'a, C> {
    cell: &'a ModelCell,
    clock: &'a C,
    cost: u64,
}

/// The origin every reservation of a [`ModelPart`] carries: the parts are told apart by
/// which part settles, not by their reservations.
const MODEL_ORIGIN: crate::reservation::Origin = crate::reservation::Origin {
    limiter: 0,
    key: 0,
    rebuilds: 0,
};

impl<C: Clock> crate::all_of::Part for ModelPart<'_, C> {
    type Held = crate::reservation::Marks;

    fn take(
        &self,
        index: usize,
        tally: &mut crate::all_of::Tally,
        slot: &mut Option<Self::Held>,
        _: &mut crate::clock::Reading,
    ) -> bool {
        let taken = self
            .cell
            .0
            .reserve(self.clock, self.cost)
            .map(|reserved| crate::all_of::record(index, self.cost, reserved, slot, tally));
        crate::all_of::record_error(index, taken.ok_or(crate::CostError::Zero), tally)
    }

    /// A model cell has one way to decide: the part added last takes as the others do,
    /// and its permits stay spent.
    fn acquire(
        &self,
        index: usize,
        tally: &mut crate::all_of::Tally,
        reading: &mut crate::clock::Reading,
    ) -> bool {
        self.take(index, tally, &mut None, reading)
    }

    fn look_own(&self, index: usize, tally: &mut crate::all_of::Tally) {
        self.look(index, tally);
    }

    fn give_back(&self, held: Self::Held) {
        let _ = self.settle(self.reservation(held), 0);
    }

    fn reservation(&self, marks: Self::Held) -> crate::Reservation {
        crate::Reservation::new(Decision::allow(0, 0, 0), self.cost, marks, MODEL_ORIGIN)
    }

    fn origin(&self) -> crate::reservation::Origin {
        MODEL_ORIGIN
    }

    fn settle(&self, held: crate::Reservation, actual: u64) -> Result<(), crate::SettleError> {
        let taken = held.take(MODEL_ORIGIN)?;
        let _ = self
            .cell
            .0
            .settle(taken.held, &taken.marks, actual, self.clock.now());
        Ok(())
    }

    fn look(&self, index: usize, tally: &mut crate::all_of::Tally) {
        let peeked = self.cell.0.peek(self.clock, self.cost);
        crate::all_of::record_look(
            index,
            self.cost,
            peeked.ok_or(crate::CostError::Zero),
            tally,
        );
    }

    fn cost(&self) -> u64 {
        self.cost
    }

    fn look_at(&self, cost: u64) -> Result<Decision, crate::CostError> {
        self.cell
            .0
            .peek(self.clock, cost)
            .ok_or(crate::CostError::Zero)
    }

    fn name(&self) -> Option<&'static str> {
        None
    }

    fn set_name(&mut self, _: &'static str) {}
}

impl ModelAllOf {
    /// Two fresh states of `policy`.
    pub fn new(policy: &Policy) -> Self {
        ModelAllOf {
            cells: [ModelCell::new(policy), ModelCell::new(policy)],
        }
    }

    /// Decides a request of cost 1 on both states, all or nothing, taking state `first`
    /// first: the `AllOf` protocol on these cells.
    pub fn try_acquire<C: Clock>(&self, clock: &C, first: usize) -> Decision {
        use crate::all_of::Chain;
        let part = |i: usize| ModelPart {
            cell: &self.cells[i],
            clock,
            cost: 1,
        };
        let chain = (part(1 - first), (part(first), ()));
        let mut tally = crate::all_of::Tally::default();
        chain.acquire_all(&mut tally, &mut crate::clock::Reading::default());
        tally.decision()
    }

    /// Decides a request of cost 1 on state `i` alone, outside any `AllOf`.
    pub fn try_acquire_one<C: Clock>(&self, clock: &C, i: usize) -> Decision {
        self.cells[i]
            .try_acquire(clock, 1)
            .expect("a model's state is never retired")
    }

    /// What a request of 1 on state `i` alone would get now.
    pub fn peek<C: Clock>(&self, clock: &C, i: usize) -> Decision {
        self.cells[i]
            .peek(clock, 1)
            .expect("a model's state is never retired")
    }
}
