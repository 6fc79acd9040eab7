//! The contract every per-key state machine meets, so that the keyed registry and the direct
//! limiter are written once for all algorithms.
//!
//! A state machine is split in two, as `docs/ARCHITECTURE.md` explains: pure arithmetic
//! (snapshot, now, cost) -> (decision, new snapshot), and a cell that owns the atomic word(s)
//! and runs the compare-and-swap loop. This trait is the cell's side.

use std::borrow::Borrow;

use crate::clock::Clock;
use crate::clock::Fixed;
use crate::decision::Decision;
use crate::engine::cells::Cells;
use crate::error::CostError;
use crate::policy::Policy;
use crate::reservation::Marks;

/// What an algorithm's pure arithmetic concluded about a request: the one verdict of the
/// token bucket, the sliding log, the sliding counter and the composite.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict<W> {
    /// Admit, and write `W` (the algorithm's new state: a TAT, the stamp of new log
    /// entries, a counter snapshot, every band's write).
    Allow(Decision, W),
    /// Refuse; the state stays as it was.
    Deny(Decision),
}

impl<W> Verdict<W> {
    /// The decision, whichever way it went.
    #[inline]
    pub(crate) fn decision(self) -> Decision {
        match self {
            Verdict::Allow(decision, _) | Verdict::Deny(decision) => decision,
        }
    }

    /// The same verdict, with `f` applied to what an admission writes.
    #[inline]
    pub(crate) fn map<X>(self, f: impl FnOnce(W) -> X) -> Verdict<X> {
        match self {
            Verdict::Allow(decision, write) => Verdict::Allow(decision, f(write)),
            Verdict::Deny(decision) => Verdict::Deny(decision),
        }
    }
}

/// One key's state: created at rest, updated lock-free, retired at most once: by a policy
/// change that moves its permits elsewhere (`retire_with_carry`), or, with a map whose
/// readers take no lock, by eviction (`try_retire`).
pub(crate) trait RateState: Sized + Send + Sync + std::fmt::Debug + 'static {
    /// Everything the arithmetic needs from the policy, computed once per limiter.
    type Params: Copy + Send + Sync + std::fmt::Debug;

    /// How a state keeps its parameters beside it when every key has its own policy
    /// (`AnyState`): inline, or boxed when they are large (a composite's).
    type OwnParams: From<Self::Params> + Borrow<Self::Params> + Send + Sync + std::fmt::Debug;

    /// How the keyed registry's table keeps this state (`engine::cells`): in a slab, for a
    /// state that is its atomic words alone, else in a box of its own.
    type Cells: Cells<Self>;

    /// Whether a contended state of this kind is spread over stripes (`engine::stripes`):
    /// the token bucket's alone.
    const STRIPED: bool = false;

    /// Derives the parameters from a policy whose algorithm matches this state.
    fn params(policy: &Policy) -> Self::Params;

    /// The most permits one request may cost under these parameters.
    fn max_cost(params: &Self::Params) -> u64;

    /// A stamp of these parameters (never 0): the same for the same policy, and different
    /// for different ones but by a 64-bit hash's chance (see `reservation::STAMP`).
    fn stamp(params: &Self::Params) -> u64;

    /// A state at rest: it decides exactly as a key never seen before.
    fn fresh(params: &Self::Params) -> Self;

    /// A new state: fresh, or with the permits of `carry` already spent at `now`.
    #[inline]
    fn new(params: &Self::Params, carry: Option<&Carry>, now: u64) -> Self {
        match carry {
            Some(carry) => Self::from_carry(params, carry, now),
            None => Self::fresh(params),
        }
    }

    /// Decides a request of `cost` permits (already checked to be within
    /// `1..=max_cost`), reading `clock` once per call, before the state (a retry after a
    /// lost compare-and-swap decides again with the same reading: an older reading can only
    /// refuse more).
    ///
    /// Returns `None` when the state has been retired: the caller must look the key up
    /// again (a retired state never admits anything, and is never revived in place).
    #[inline(always)]
    fn try_acquire<C: Clock + ?Sized>(
        &self,
        params: &Self::Params,
        clock: &C,
        cost: u64,
    ) -> Option<Decision> {
        // Inlined, the marks are never stored: the hit path is the same as without them.
        self.reserve(params, clock, cost)
            .map(|(decision, _)| decision)
    }

    /// [`RateState::try_acquire`], also returning where an admission stands in each band
    /// (see [`Marks`]), for a reservation to be settled later. The marks of a refusal are
    /// meaningless.
    fn reserve<C: Clock + ?Sized>(
        &self,
        params: &Self::Params,
        clock: &C,
        cost: u64,
    ) -> Option<(Decision, Marks)>;

    /// Settles, at `now`, an admission of `held` permits that stood at `marks` and really
    /// cost `actual`: gives back `held - actual` (never more than the admission still holds,
    /// never below a fresh state), or charges `actual - held` on top, even past the limit, up
    /// to each algorithm's bound (`docs/ALGORITHMS.md`). `None` when the state was retired.
    fn settle(
        &self,
        params: &Self::Params,
        held: u64,
        marks: &Marks,
        actual: u64,
        now: u64,
    ) -> Option<()>;

    /// What `try_acquire` would decide now, changing nothing: the decision is computed from a
    /// consistent snapshot and never written. `None` when the state has been retired.
    fn peek<C: Clock + ?Sized>(
        &self,
        params: &Self::Params,
        clock: &C,
        cost: u64,
    ) -> Option<Decision>;

    /// `true` when the state decides exactly as a fresh one from `now` on.
    fn is_at_rest(&self, params: &Self::Params, now: u64) -> bool;

    /// Atomically moves a state that is at rest at `now` to its retired value. Returns `true`
    /// when it did; from then on every `try_acquire` returns `None`. Returns `false` (and
    /// changes nothing) when the state is not at rest or a request changed it first.
    ///
    /// This is the keyed registry's eviction step: its requests take no lock, so a state
    /// is retired before it is unlinked, and a request that meets a retired state looks the
    /// key up again.
    fn try_retire(&self, params: &Self::Params, now: u64) -> bool;

    /// The permits in use at `now`, band by band, read from one consistent snapshot, changing
    /// nothing: for a state its caller only looks at (a peek).
    /// `None` when the state was retired.
    fn carry(&self, params: &Self::Params, now: u64) -> Option<Carry>;

    /// [`RateState::carry`], and the state atomically retired from exactly the snapshot
    /// counted (whatever it holds), so the permits counted are never spent again behind the
    /// caller's back: a policy change of a state that requests may still reach (the direct
    /// limiter's, a key moving to the keyed registry's new generation), or a reset. `None`
    /// when the state was already retired.
    fn retire_with_carry(&self, params: &Self::Params, now: u64) -> Option<Carry>;

    /// A state with the permits of `carry` already spent at `now`: each band takes the
    /// permits its own window can vouch for ([`Carry::spent_within`]), capped at its limit.
    fn from_carry(params: &Self::Params, carry: &Carry, now: u64) -> Self;
}

/// A state bound to the parameters it is decided under: how every user of a state decides,
/// whatever it stores the two in (a keyed table keeps one set of parameters for all its
/// states, a per-key state keeps its own beside it, the direct limiter one of each). Each
/// method is [`RateState`]'s of the same name (see there), with the parameters supplied.
pub(crate) trait Decides {
    /// The most permits one request may cost.
    fn max_cost(&self) -> u64;

    /// See [`RateState::reserve`].
    fn reserve<C: Clock + ?Sized>(&self, clock: &C, cost: u64) -> Option<(Decision, Marks)>;

    /// See [`RateState::try_acquire`].
    #[inline(always)]
    fn try_acquire<C: Clock + ?Sized>(&self, clock: &C, cost: u64) -> Option<Decision> {
        // Inlined, the marks are never stored.
        self.reserve(clock, cost).map(|(decision, _)| decision)
    }

    /// [`Decides::reserve`] of a cost not yet checked against the policy: a cost no state
    /// of it could ever admit is refused, changing nothing. `None` when the state was retired.
    #[inline(always)]
    fn reserve_checked<C: Clock + ?Sized>(
        &self,
        clock: &C,
        cost: u64,
    ) -> Option<Result<(Decision, Marks), CostError>> {
        if let Err(refused) = CostError::within(cost, self.max_cost()) {
            return Some(Err(refused));
        }
        self.reserve(clock, cost).map(Ok)
    }

    /// [`Decides::peek`] of a cost not yet checked against the policy, as
    /// [`Decides::reserve_checked`]. `None` when the state was retired.
    #[inline]
    fn peek_checked<C: Clock + ?Sized>(
        &self,
        clock: &C,
        cost: u64,
    ) -> Option<Result<Decision, CostError>> {
        if let Err(refused) = CostError::within(cost, self.max_cost()) {
            return Some(Err(refused));
        }
        self.peek(clock, cost).map(Ok)
    }

    /// See [`RateState::settle`].
    fn settle(&self, held: u64, marks: &Marks, actual: u64, now: u64) -> Option<()>;

    /// See [`RateState::peek`].
    fn peek<C: Clock + ?Sized>(&self, clock: &C, cost: u64) -> Option<Decision>;

    /// See [`RateState::is_at_rest`].
    fn is_at_rest(&self, now: u64) -> bool;

    /// See [`RateState::carry`].
    fn carry(&self, now: u64) -> Option<Carry>;

    /// See [`RateState::try_retire`].
    fn try_retire(&self, now: u64) -> bool;

    /// See [`RateState::retire_with_carry`].
    fn retire_with_carry(&self, now: u64) -> Option<Carry>;
}

impl<D: Decides + ?Sized> Decides for &D {
    #[inline(always)]
    fn max_cost(&self) -> u64 {
        (**self).max_cost()
    }

    #[inline(always)]
    fn reserve<C: Clock + ?Sized>(&self, clock: &C, cost: u64) -> Option<(Decision, Marks)> {
        (**self).reserve(clock, cost)
    }

    #[inline(always)]
    fn reserve_checked<C: Clock + ?Sized>(
        &self,
        clock: &C,
        cost: u64,
    ) -> Option<Result<(Decision, Marks), CostError>> {
        (**self).reserve_checked(clock, cost)
    }

    fn settle(&self, held: u64, marks: &Marks, actual: u64, now: u64) -> Option<()> {
        (**self).settle(held, marks, actual, now)
    }

    fn peek<C: Clock + ?Sized>(&self, clock: &C, cost: u64) -> Option<Decision> {
        (**self).peek(clock, cost)
    }

    fn is_at_rest(&self, now: u64) -> bool {
        (**self).is_at_rest(now)
    }

    fn carry(&self, now: u64) -> Option<Carry> {
        (**self).carry(now)
    }

    fn try_retire(&self, now: u64) -> bool {
        (**self).try_retire(now)
    }

    fn retire_with_carry(&self, now: u64) -> Option<Carry> {
        (**self).retire_with_carry(now)
    }
}

/// One algorithm's state and its parameters, borrowed together.
pub(crate) struct Bound<'a, St: RateState> {
    pub(crate) state: &'a St,
    pub(crate) params: &'a St::Params,
}

impl<St: RateState> Bound<'_, St> {
    /// The stamp of the parameters ([`RateState::stamp`]).
    #[inline]
    pub(crate) fn stamp(&self) -> u64 {
        St::stamp(self.params)
    }
}

impl<St: RateState> Decides for Bound<'_, St> {
    #[inline(always)]
    fn max_cost(&self) -> u64 {
        St::max_cost(self.params)
    }

    #[inline(always)]
    fn reserve<C: Clock + ?Sized>(&self, clock: &C, cost: u64) -> Option<(Decision, Marks)> {
        self.state.reserve(self.params, clock, cost)
    }

    #[inline(always)]
    fn settle(&self, held: u64, marks: &Marks, actual: u64, now: u64) -> Option<()> {
        self.state.settle(self.params, held, marks, actual, now)
    }

    #[inline(always)]
    fn peek<C: Clock + ?Sized>(&self, clock: &C, cost: u64) -> Option<Decision> {
        self.state.peek(self.params, clock, cost)
    }

    #[inline(always)]
    fn is_at_rest(&self, now: u64) -> bool {
        self.state.is_at_rest(self.params, now)
    }

    #[inline(always)]
    fn carry(&self, now: u64) -> Option<Carry> {
        self.state.carry(self.params, now)
    }

    #[inline(always)]
    fn try_retire(&self, now: u64) -> bool {
        self.state.try_retire(self.params, now)
    }

    #[inline(always)]
    fn retire_with_carry(&self, now: u64) -> Option<Carry> {
        self.state.retire_with_carry(self.params, now)
    }
}

/// Permits in use, per band window, moved from a state under one policy to a state under
/// another (see `RateLimiter::set_policy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Carry {
    /// `(window in ns, permits in use)` for each band of the old state.
    bands: [(u64, u64); Policy::MAX_BANDS],
    len: usize,
}

impl Carry {
    /// Records `in_use` permits for a band of `window` ns.
    pub(crate) fn push(&mut self, window: u64, in_use: u64) {
        // Once per band of a policy, which has at most `MAX_BANDS`.
        self.bands[self.len] = (window, in_use);
        self.len += 1;
    }

    /// One band's carry.
    pub(crate) fn single(window: u64, in_use: u64) -> Self {
        let mut carry = Carry::default();
        carry.push(window, in_use);
        carry
    }

    /// Counts `other`'s permits too: afterwards, for every window, [`Carry::spent_within`] is
    /// at least what either said before (the states of several policies folded into one).
    /// A band of a window already here keeps the larger count; a new window takes a free
    /// place, or, when every place is taken, is folded into the band of the shortest window
    /// (the shorter of the two windows, the larger of the two counts), which can only count
    /// more, never less.
    pub(crate) fn merge(&mut self, other: &Carry) {
        for &(window, in_use) in &other.bands[..other.len] {
            if let Some(band) = self.bands[..self.len]
                .iter_mut()
                .find(|(w, _)| *w == window)
            {
                band.1 = band.1.max(in_use);
            } else if self.len < Policy::MAX_BANDS {
                self.push(window, in_use);
            } else if let Some(band) = self.bands[..self.len].iter_mut().min_by_key(|(w, _)| *w) {
                *band = (band.0.min(window), band.1.max(in_use));
            }
        }
    }

    /// The bands whose window is longer than `elapsed` (those whose permits may still be in
    /// use after that long); `None` when none is.
    pub(crate) fn within(&self, elapsed: u64) -> Option<Carry> {
        let mut live = Carry::default();
        for &(window, in_use) in &self.bands[..self.len] {
            if window > elapsed && in_use > 0 {
                live.push(window, in_use);
            }
        }
        (live.len > 0).then_some(live)
    }

    /// The permits a new band of `window` ns must count as spent: the most in use in any old
    /// band whose window is no longer (those permits were all spent within the last `window`).
    /// An old band with a longer window says nothing about the last `window` ns, so it is not
    /// counted.
    pub(crate) fn spent_within(&self, window: u64) -> u64 {
        self.bands[..self.len]
            .iter()
            .filter(|(w, _)| *w <= window)
            .map(|&(_, n)| n)
            .max()
            .unwrap_or(0)
    }
}

/// What a new state could not count of what it was built from, window by window: kept
/// beside the states until those permits have come back, so that the next state built for
/// the key counts them too (a change undone within a window must not give back what the
/// policy in between could not count; `keyed::kept` keeps one per key, the direct limiter
/// its own).
///
/// A step function of the window: what a new band of window `w` must count of it is the
/// count of the kept band of the longest window no longer than `w` (see
/// [`KeptCarry::spent_within`]). Unlike a carry's, it may step *down*: permits spent within
/// a short window that the state built then counted in a longer band are kept for the
/// windows below that band's, and not for the band's own and longer ones, where the state
/// counts them (and the next move carries them from it: kept for those too, they would be
/// counted twice).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct KeptCarry {
    bands: [KeptBand; KEPT_BANDS],
    len: usize,
}

/// Permits of one window kept: when they were counted (every one was spent by then, within
/// the window before), and when they have all come back (the window after, or later once
/// folded with another band).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct KeptBand {
    window: u64,
    in_use: u64,
    counted_at: u64,
    until: u64,
}

/// The most bands one kept carry holds: a step at each window of two policies' states.
const KEPT_BANDS: usize = 2 * Policy::MAX_BANDS;

impl KeptBand {
    /// Counts `other` too: the larger count, the later instants.
    fn fold(&mut self, other: &KeptBand) {
        self.in_use = self.in_use.max(other.in_use);
        self.counted_at = self.counted_at.max(other.counted_at);
        self.until = self.until.max(other.until);
    }
}

impl KeptCarry {
    /// Keeps `band`. A band of a window already kept keeps the larger count and the later
    /// instants. A new window takes a free place; when every place is taken, it is folded
    /// into the band just below it (which then counts the larger of the two from its own
    /// window on), or, with none below, the band just above it is folded into it at its
    /// window: either way more, never less, for every window, for as long as either.
    fn push(&mut self, band: KeptBand) {
        let len = self.len;
        if let Some(same) = self.bands[..len]
            .iter_mut()
            .find(|b| b.window == band.window)
        {
            same.fold(&band);
        } else if len < KEPT_BANDS {
            self.bands[len] = band;
            self.len += 1;
        } else if let Some(below) = self.bands[..len]
            .iter_mut()
            .filter(|b| b.window < band.window)
            .max_by_key(|b| b.window)
        {
            below.fold(&band);
        } else if let Some(above) = self.bands[..len].iter_mut().min_by_key(|b| b.window) {
            above.fold(&band);
            above.window = band.window;
        }
    }

    /// The bands that still count at `now` (those whose permits have not all come back);
    /// `None` when none does.
    pub(crate) fn live(&self, now: u64) -> Option<KeptCarry> {
        let mut live = KeptCarry::default();
        for band in &self.bands[..self.len] {
            if band.until > now {
                live.push(*band);
            }
        }
        live.bands[..live.len]
            .iter()
            .any(|band| band.in_use > 0)
            .then_some(live)
    }

    /// The bands a new band of `window` ns may count.
    fn within(&self, window: u64) -> impl Iterator<Item = &KeptBand> {
        self.bands[..self.len]
            .iter()
            .filter(move |band| band.window <= window)
    }

    /// The permits a new band of `window` ns must count of these: the count of the band of
    /// the longest window no longer than `window` (0 for none).
    fn spent_within(&self, window: u64) -> u64 {
        self.within(window)
            .max_by_key(|band| band.window)
            .map_or(0, |band| band.in_use)
    }

    /// The latest instant one of the bands holding permits was counted at.
    fn counted_at(&self) -> u64 {
        self.bands[..self.len]
            .iter()
            .filter(|band| band.in_use > 0)
            .map(|band| band.counted_at)
            .max()
            .unwrap_or(0)
    }

    /// The kept permits as one carry: for a new band of each window, at least what it must
    /// count (a carry cannot step down: a band above a step down counts what is below it,
    /// more than it must, never less).
    fn carry(&self) -> Carry {
        let mut carry = Carry::default();
        for band in &self.bands[..self.len] {
            carry.merge(&Carry::single(band.window, band.in_use));
        }
        carry
    }
}

/// The windows of `fresh`'s and `old`'s bands, and of `more` (a state's), each with what a
/// new band of that window must count of `fresh` and `old`: their permits added, as what is
/// kept is what a state did not count (see [`to_keep`]), spent apart from what the state it
/// replaces has in use.
fn added<'a>(
    fresh: Option<&'a Carry>,
    old: Option<&'a KeptCarry>,
    more: Option<&'a Carry>,
) -> impl Iterator<Item = (u64, u64)> + 'a {
    let carried = |carry: Option<&'a Carry>| carry.map_or(&[][..], |c| &c.bands[..c.len]);
    let old_windows = old.map_or(&[][..], |old| &old.bands[..old.len]);
    let windows = carried(fresh)
        .iter()
        .map(|band| band.0)
        .chain(old_windows.iter().map(|band| band.window))
        .chain(carried(more).iter().map(|band| band.0));
    windows.map(move |window| {
        let from_fresh = fresh.map_or(0, |fresh| fresh.spent_within(window));
        let from_old = old.map_or(0, |old| old.spent_within(window));
        (window, from_fresh.saturating_add(from_old))
    })
}

/// What a new state is built from, and as of when: `fresh` (what the state it replaces
/// had in use, or what the shared overflow state counted) and what was kept, `old`, added.
/// With permits fresh, both at `now` (the kept ones are then held a window from now, longer
/// than they were kept: more refused, never less). With only kept permits, those as of the
/// latest instant one of their bands was counted, when every one of them had been spent:
/// each is then held by every new band of its window or longer for that window from then,
/// as long as the key would have held it, and counted by no shorter one it has left.
pub(crate) fn built_from(
    fresh: Option<Carry>,
    old: Option<&KeptCarry>,
    now: u64,
) -> (Option<Carry>, u64) {
    let fresh = fresh.filter(|fresh| fresh.bands[..fresh.len].iter().any(|band| band.1 > 0));
    match (fresh, old) {
        (Some(fresh), Some(old)) => {
            let mut both = Carry::default();
            for (window, in_use) in added(Some(&fresh), Some(old), None) {
                both.merge(&Carry::single(window, in_use));
            }
            (Some(both), now)
        }
        (fresh, None) => (fresh, now),
        (None, Some(old)) => (Some(old.carry()), old.counted_at().min(now)),
    }
}

/// What to keep once a new state counting `counted` at `now` was built from `fresh` and
/// `old` ([`built_from`]): for each window of the three, what the state does not count of
/// the two added (its bands of that window or shorter), so that what is kept and what the
/// state counts are apart and add up. A window at which the state's bands count everything
/// keeps nothing from there on (a step down), where the state's own band counts the
/// permits kept below it; a permit a band of a shorter window counts is not kept, and comes
/// back with that band. Kept until a window from `now` when `fresh` had permits there,
/// else as the kept bands it comes from (so that building states again and again from
/// kept permits alone does not keep them alive); a step down lasts as long as the bands
/// below it, so that it outlives what it cuts. `None` when the state counts everything.
pub(crate) fn to_keep(
    (fresh, old): (Option<&Carry>, Option<&KeptCarry>),
    counted: Option<Carry>,
    now: u64,
) -> Option<KeptCarry> {
    let old = old.and_then(|old| old.live(now));
    let mut kept = KeptCarry::default();
    for (window, in_use) in added(fresh, old.as_ref(), counted.as_ref()) {
        let held = counted.map_or(0, |counted| counted.spent_within(window));
        let uncounted = in_use.saturating_sub(held);
        let band = if fresh.is_some_and(|fresh| fresh.spent_within(window) > 0) {
            KeptBand {
                window,
                in_use: uncounted,
                counted_at: now,
                until: now.saturating_add(window),
            }
        } else {
            let from = || old.iter().flat_map(|old| old.within(window));
            KeptBand {
                window,
                in_use: uncounted,
                counted_at: from().map(|b| b.counted_at).max().unwrap_or(0),
                until: from().map(|b| b.until).max().unwrap_or(0),
            }
        };
        kept.push(band);
    }
    // A band lasts as long as every band below it: a step down outlives what it cuts.
    let bands = &mut kept.bands[..kept.len];
    bands.sort_unstable_by_key(|band| band.window);
    let mut last = 0;
    for band in bands {
        last = last.max(band.until);
        band.until = last;
    }
    kept.live(now)
}

/// Permits in use, from the decision a request of cost 1 would get (`limit` minus what is
/// available now).
#[inline]
pub(crate) fn in_use(limit: u64, probe: &Decision) -> u64 {
    let available = if probe.is_allowed() {
        probe.remaining() + 1
    } else {
        probe.remaining()
    };
    limit.saturating_sub(available)
}

/// The stamp of one band (see [`RateState::stamp`]): its algorithm's `tag`, permits and
/// window, mixed (the finalizer of splitmix64 after each), never 0. A composite's stamp
/// folds its bands' in, each as the `tag` of the next.
pub(crate) fn band_stamp(tag: u64, limit: u64, window: u64) -> u64 {
    let mix = |h: u64| {
        let h = (h ^ (h >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        let h = (h ^ (h >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        h ^ (h >> 31)
    };
    mix(mix(mix(tag) ^ limit) ^ window) | 1
}

/// `from_carry` for a single-band state: a fresh state that admits the carried permits at
/// `now` in one request.
pub(crate) fn single_from_carry<St: RateState>(
    params: &St::Params,
    window: u64,
    limit: u64,
    carry: &Carry,
    now: u64,
) -> St {
    let state = St::fresh(params);
    let spent = carry.spent_within(window).min(limit);
    if spent > 0 {
        // A fresh state admits any cost up to its limit, and nobody else can see it yet.
        let _ = state.try_acquire(params, &Fixed(now), spent);
    }
    state
}

/// The marks of a single-band admission that stood at `mark`.
#[inline(always)]
pub(crate) fn one_mark(mark: u64) -> Marks {
    let mut marks = [0; Policy::MAX_BANDS + 1];
    marks[0] = mark;
    marks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::sliding_counter::CounterCell;
    use crate::engine::sliding_log::LogCell;
    use crate::engine::token_bucket::GcraCell;

    const SEC: u64 = 1_000_000_000;

    /// A state built at 10 s with nothing carried decides as a fresh state, also for a
    /// request whose clock reading is earlier (a clock set back, or a request that read
    /// the clock before the state was built): nothing is admitted on its behalf.
    fn a_zero_carry_builds_a_fresh_state<St: RateState>(policy: &str) {
        let params = St::params(&policy.parse().unwrap());
        let carry = Carry::single(SEC, 0);
        let carried = St::from_carry(&params, &carry, 10 * SEC);
        let fresh = St::fresh(&params);
        for reading in [9 * SEC + SEC / 2, 10 * SEC, 11 * SEC] {
            let clock = Fixed(reading);
            let (a, b) = (
                carried.try_acquire(&params, &clock, 1).unwrap(),
                fresh.try_acquire(&params, &clock, 1).unwrap(),
            );
            assert_eq!(
                (a.remaining(), a.reset_after()),
                (b.remaining(), b.reset_after()),
                "{policy} at {reading}"
            );
        }
    }

    #[test]
    fn a_merged_carry_counts_at_least_what_either_did_for_every_window() {
        let mut merged = Carry::single(SEC, 3);
        merged.push(60 * SEC, 10);
        let mut other = Carry::single(SEC, 5);
        other.push(3_600 * SEC, 40);
        merged.merge(&other);
        assert_eq!(merged.spent_within(SEC), 5);
        assert_eq!(merged.spent_within(60 * SEC), 10);
        assert_eq!(merged.spent_within(3_600 * SEC), 40);
        // Full: a new window folds into the shortest band, counting more, never less.
        let mut full = Carry::default();
        for i in 1..=Policy::MAX_BANDS as u64 {
            full.push(i * 10 * SEC, i);
        }
        full.merge(&Carry::single(SEC / 2, 100));
        assert_eq!(full.spent_within(SEC / 2), 100);
        assert_eq!(full.spent_within(10 * SEC), 100);
        assert_eq!(full.spent_within(20 * SEC), 100);
    }

    #[test]
    fn a_zero_carry_builds_a_fresh_state_for_every_single_band_algorithm() {
        a_zero_carry_builds_a_fresh_state::<GcraCell>("token-bucket 2/1s");
        a_zero_carry_builds_a_fresh_state::<CounterCell>("sliding-counter 2/1s");
        a_zero_carry_builds_a_fresh_state::<LogCell>("sliding-log 2/1s");
    }

    /// Permits a state's longer band counts are kept only below that band's window: the
    /// next move adds what the state has in use there, and must not add them twice.
    #[test]
    fn kept_permits_step_down_where_a_longer_band_counts_them() {
        let hour = 3_600 * SEC;
        let fresh = Carry::single(hour, 1);
        let counted = Carry::single(hour + 60 * SEC, 1);
        let kept = to_keep((Some(&fresh), None), Some(counted), 0).unwrap();
        assert_eq!(kept.spent_within(hour), 1);
        assert_eq!(kept.spent_within(hour + 60 * SEC), 0);
        // The next move: the state's one permit in use, and the kept one below its window.
        let (carry, _) = built_from(Some(counted), Some(&kept), SEC);
        assert_eq!(carry.unwrap().spent_within(hour + 120 * SEC), 1);
        assert_eq!(carry.unwrap().spent_within(hour), 1);
        // The step down lasts as long as what it cuts.
        let live = kept.live(hour - SEC).unwrap();
        assert_eq!(live.spent_within(hour + 60 * SEC), 0);
    }

    /// A kept band lasts until its own end however it is merged: folded into another band
    /// when every place is taken, the fold counts it for every window at least as long and
    /// lasts as long as either; bands past their end are dropped.
    #[test]
    fn a_kept_band_lasts_until_its_own_end() {
        let band = |window, in_use, counted_at| KeptBand {
            window,
            in_use,
            counted_at,
            until: counted_at + window,
        };
        let mut kept = KeptCarry::default();
        for i in 1..=KEPT_BANDS as u64 {
            kept.push(band(i * SEC, i, 1_000 * SEC - i * SEC));
        }
        kept.push(band(3_600 * SEC, 50, 400 * SEC));
        // Full: folded into the band below, which counts at least either from its window on.
        for i in 1..=KEPT_BANDS as u64 {
            assert!(kept.spent_within(i * SEC) >= i, "{kept:?}");
        }
        assert!(kept.spent_within(3_600 * SEC) >= 50, "{kept:?}");
        assert!(kept.carry().spent_within(3_600 * SEC) >= 50);
        assert!(kept
            .live(3_999 * SEC)
            .is_some_and(|live| live.spent_within(3_600 * SEC) >= 50));
        assert_eq!(kept.live(4_000 * SEC), None);
        // With no band below, the band just above is folded into the new one's window.
        let mut low = KeptCarry::default();
        for i in 1..=KEPT_BANDS as u64 {
            low.push(band(i * 10 * SEC, i, 0));
        }
        low.push(band(SEC, 30, 0));
        assert_eq!(low.spent_within(SEC), 30);
        assert_eq!(low.spent_within(10 * SEC), 30);
        assert_eq!(low.spent_within(20 * SEC), 2);

        // Kept alone, a new state is built as of the latest instant a band was counted,
        // folded or not; with permits fresh, now.
        assert_eq!(built_from(None, Some(&kept), 3_000 * SEC).1, 999 * SEC);
        let mut kept = KeptCarry::default();
        kept.push(band(3_600 * SEC, 10, 100 * SEC));
        kept.push(band(60 * SEC, 3, 30 * SEC));
        assert_eq!(built_from(None, Some(&kept), 200 * SEC).1, 100 * SEC);
        // Fresh and kept permits were spent apart: added.
        let (carry, at) = built_from(Some(Carry::single(SEC, 1)), Some(&kept), 200 * SEC);
        assert_eq!(
            (carry.map(|c| c.spent_within(3_600 * SEC)), at),
            (Some(11), 200 * SEC)
        );
        // What the state counts is not kept; what it does not, is, to the end of its band.
        let counted = Carry::single(3_600 * SEC, 10);
        assert_eq!(to_keep((None, Some(&kept)), Some(counted), 200 * SEC), None);
        let counted = Carry::single(3_600 * SEC, 4);
        let left = to_keep((None, Some(&kept)), Some(counted), 200 * SEC).unwrap();
        assert_eq!(
            left.live(3_699 * SEC).map(|l| l.spent_within(3_600 * SEC)),
            Some(6)
        );
        assert_eq!(left.live(3_700 * SEC), None);
        // With fresh permits uncounted, the rest is kept a window from now.
        let fresh = Carry::single(3_600 * SEC, 3);
        let more = to_keep((Some(&fresh), Some(&kept)), Some(counted), 200 * SEC).unwrap();
        assert_eq!(
            more.live(3_799 * SEC).map(|l| l.spent_within(3_600 * SEC)),
            Some(9)
        );
    }
}
