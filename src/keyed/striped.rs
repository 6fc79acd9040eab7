//! The keyed limiter's striped hot keys: a token bucket key that threads keep meeting on is
//! spread over stripes (`engine::stripes`), as the direct limiter's one key is.
//!
//! Each table of token buckets keeps a small side table of its striped keys, found by the
//! place of the key's state (a cell that never moves while the key is tracked), so a key costs
//! no memory until it is striped. A request reads one bit of a 64-bit filter beside the table,
//! one bit per hash of a place (its *spot*); only a set bit sends it to the side table and the
//! stripes. A clear bit (the case of every key with one caller) decides on the key's word as
//! before, and counts a lost compare-and-swap on the retry path only.
//!
//! **Entering and leaving.** Lost compare-and-swaps are counted per spot and tick (about a
//! millisecond): the sixteenth within one tick stripes the key that lost it, if a slot of its
//! spot is free or holds a key that has taken no lease for [`IDLE_SPAN`]. A key leaves the
//! side table when it goes quiet (its stripe gives its lease back first), when another key
//! takes its slot after it went idle, and when its state leaves the table (evicted at rest,
//! reset, moved to a new policy). Either way its stripes are retired before they are
//! unlinked, so no request takes from them afterwards and no refund needs to know them: a
//! request that meets them retired decides on the key's word, which is exact whether or not
//! the key is striped (the stripes only ever hold runs the word handed out). What the other
//! stripes still held is lost once time passes it: under-admission of at most one lease per
//! stripe, as when the direct limiter's key goes quiet. Installing and removing take one lock
//! per table: a request takes it only when it stripes a key or finds it quiet.
//!
//! **A state that leaves while it is being striped.** A removal retires the state's word
//! before it looks for its stripes, and an installation publishes the stripes before it looks
//! at the word; a `SeqCst` fence on each side between the two makes one of them see the other,
//! so stripes are never left behind for a place a new key may take. (The side table lives in
//! `scc`'s epoch-reclaimed pointers, which loom cannot run; the race is tested by resets
//! racing installations in `striped/tests.rs`.)

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError};

use scc::{AtomicShared, Guard, Shared, Tag};

use crate::decision::Decision;
use crate::engine::stripes::{Home, Stripes, QUIET_SPAN};
use crate::engine::sync::Mutex;
use crate::engine::token_bucket::{Gcra, GcraCell};

/// Places a table may have striped at once (each probes [`PROBES`] slots from its spot).
const SLOTS: usize = 64;
/// Slots a place may take, from the one its spot names.
const PROBES: usize = 4;
/// Locks for whatever moves a key's TAT back (refunds and give-backs), shared by spot.
const LOCKS: usize = 16;
/// Compare-and-swaps lost on keys of one spot within one tick, after which the key that lost
/// the last one is striped (the direct limiter's count).
pub(super) const LOST_BEFORE_STRIPING: u64 = 16;
/// A tick of the lost count: `now >> TICK` ns, about a millisecond.
const TICK: u32 = 20;
/// How long a striped key may go without a lease before another key of its spot may take
/// its slot.
const IDLE_SPAN: u64 = 4 * QUIET_SPAN;

/// Where a state lives: its address, stable while the state is in the table.
#[inline(always)]
fn place_of<T>(state: &T) -> usize {
    std::ptr::from_ref(state).addr()
}

/// Six bits of a place's hash (below [`SLOTS`]): its bit in the filter, and where its slots
/// start.
#[inline(always)]
fn spot(place: usize) -> usize {
    // Fibonacci hashing of the address without its alignment bits.
    ((place as u64 >> 3).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize
}

/// Whether a compare-and-swap lost on a key's word counts towards striping the key: when
/// striping is on, by the builder's setting (`may_stripe`) or because the key's spot is
/// `marked` (only striping marks a spot; the two differ only for a key a test striped by
/// hand).
#[inline(always)]
fn losses_count(marked: bool, may_stripe: bool) -> bool {
    marked || may_stripe
}

/// A striped key: its place and its stripes.
struct HotKey {
    place: usize,
    stripes: Stripes,
}

/// A striped key's stripes, held outside any guard by a thread that keeps deciding on them
/// (`keyed::last_hit`). Exact as a request holding a guard is: the stripes only ever hold
/// runs the key's word handed out, and once retired (the key left the table or went back to
/// its word) no request takes from them, so a thread that finds them retired lets go.
pub(super) struct PinnedStripes(Shared<HotKey>);

impl PinnedStripes {
    /// A request of cost 1 at `now` from the calling thread's home stripe (see
    /// `Stripes::home`); `cell` is the key's state.
    #[inline(always)]
    pub(super) fn home(&self, cell: &GcraCell, gcra: &Gcra, now: u64) -> Home {
        self.0.stripes.home(cell, gcra, now)
    }

    /// Whether the stripes are retired: no request takes from them again.
    pub(super) fn retired(&self) -> bool {
        self.0.stripes.is_retired()
    }
}

/// A table's striped keys: the filter inline, read by every request; the rest in a box of
/// its own, read only by requests on striped keys and by the cold paths.
pub(super) struct Hot {
    /// One bit per [`spot`]: set while a key of that spot is striped. Read by every request,
    /// which looks no further when its spot's bit is clear.
    marks: AtomicU64,
    /// Whether the table's states are token buckets, the one state that is striped: the
    /// other tables' removals skip [`Hot::forget`]'s fence.
    buckets: bool,
    side: Box<Side>,
    /// The limiter's count of the changes after which a thread's last hit is decided again
    /// through the table (`keyed::last_hit`): a key striped here is one.
    changes: Arc<AtomicU64>,
}

/// What [`Hot`] keeps beside its filter.
struct Side {
    /// The striped keys, by spot, probed linearly.
    slots: [AtomicShared<HotKey>; SLOTS],
    /// Compare-and-swaps lost, by spot: the tick of the latest (`now >> TICK`) above eight
    /// bits of count.
    lost: [AtomicU64; SLOTS],
    /// Held by whatever moves a key's TAT back, by spot (see `Stripes::settle`).
    lowering: [Mutex<()>; LOCKS],
    /// Held to install or remove a striped key.
    writing: std::sync::Mutex<()>,
}

impl Hot {
    /// The side table of a table whose states are token buckets (`buckets`) or not.
    pub(super) fn new(buckets: bool, changes: Arc<AtomicU64>) -> Self {
        Hot {
            changes,
            marks: AtomicU64::new(0),
            buckets,
            side: Box::new(Side {
                slots: std::array::from_fn(|_| AtomicShared::null()),
                lost: std::array::from_fn(|_| AtomicU64::new(0)),
                lowering: std::array::from_fn(|_| Mutex::new(())),
                writing: std::sync::Mutex::new(()),
            }),
        }
    }

    /// Whether a key of `place`'s spot is striped (a snapshot).
    #[inline(always)]
    fn is_marked(&self, place: usize) -> bool {
        // Relaxed: a stale bit sends a request to the key's word, or to a side table that
        // does not have it (and then to the word): both exact.
        let marks = self.marks.load(Ordering::Relaxed);
        marks != 0 && marks & (1 << spot(place)) != 0
    }

    /// Decides a request of cost 1 at `now` on `cell`, a token bucket of this table found
    /// under `guard`, where that takes no more than a few registers: from a slot of its home
    /// stripe's lease when the key is striped, on its word otherwise (and when its spot is
    /// marked for another key). `None` when it is not decided here (a striped key's home
    /// stripe has nothing, or the state was retired): `Generations::acquire_slow` looks the
    /// key up again and [`Hot::acquire_rest`] decides, out of line. `on_hit` runs after a
    /// decision, told whether it was made on the key's stripes (`true`) or on its word.
    ///
    /// A striped key's side-table lookup is inline: a request on a key not striped runs the
    /// same instructions as with it out of line (callgrind), and a striped key's decision
    /// saves the call (two threads on one key, 15.0 to 14.2 ns a decision in aggregate).
    #[inline(always)]
    pub(super) fn acquire(
        &self,
        cell: &GcraCell,
        gcra: &Gcra,
        now: u64,
        may_stripe: bool,
        guard: &Guard,
        on_hit: impl FnOnce(bool),
    ) -> Option<Decision> {
        let place = place_of(cell);
        let marked = self.is_marked(place);
        if marked {
            if let Some(hot) = self.find(place, guard) {
                let decision = hot.stripes.try_home(cell, gcra, now);
                if decision.is_some() {
                    on_hit(true);
                }
                return decision;
            }
        }
        let decision = self.on_word(cell, gcra, now, place, losses_count(marked, may_stripe));
        if decision.is_some() {
            on_hit(false);
        }
        decision
    }

    /// A request of cost 1 on `cell` at `now` that [`Hot::acquire`] left: for a striped key,
    /// a new lease, a steal or a refusal (`Stripes::acquire`); on the key's word when the key
    /// is not striped (after all: another key of its spot is) or its stripes were retired
    /// (unstriped meanwhile). `None` when the state itself was retired: the caller looks the
    /// key up again.
    pub(super) fn acquire_rest(
        &self,
        cell: &GcraCell,
        gcra: &Gcra,
        now: u64,
        may_stripe: bool,
        guard: &Guard,
    ) -> Option<Decision> {
        let place = place_of(cell);
        let marked = self.is_marked(place);
        if marked {
            if let Some(hot) = self.find(place, guard) {
                if let Some(striped) = hot.stripes.acquire(cell, gcra, now) {
                    if striped.quiet {
                        hot.stripes
                            .give_back(striped.home, self.lock_of(place), cell, now);
                        self.remove(place, Some(hot));
                    }
                    return Some(striped.decision);
                }
            }
        }
        self.on_word(cell, gcra, now, place, losses_count(marked, may_stripe))
    }

    /// A request of cost 1 at `now` on `cell`'s word, at `place`: a compare-and-swap lost
    /// there counts towards striping the key when `counts` (see [`losses_count`]). `None`
    /// when the state was retired.
    #[inline(always)]
    fn on_word(
        &self,
        cell: &GcraCell,
        gcra: &Gcra,
        now: u64,
        place: usize,
        counts: bool,
    ) -> Option<Decision> {
        let lost = || {
            if counts {
                self.lost_one(place, cell, gcra, now);
            }
        };
        cell.reserve_at(gcra, now, 1, lost)
            .map(|(decision, _)| decision)
    }

    /// Counts a compare-and-swap lost on `cell`'s word at `now` by a request that did not go
    /// through the table (a thread's last hit, `keyed::last_hit`), as [`Hot::acquire`] counts
    /// its own.
    #[cold]
    #[inline(never)]
    pub(super) fn lost_elsewhere(&self, cell: &GcraCell, gcra: &Gcra, now: u64, may_stripe: bool) {
        let place = place_of(cell);
        if losses_count(self.is_marked(place), may_stripe) {
            self.lost_one(place, cell, gcra, now);
        }
    }

    /// Whether the key whose state is `cell` may be pinned by a thread (`keyed::last_hit`)
    /// after a decision on its word (a reservation's): not while its spot is marked, as a
    /// striped key's permits sit partly in its stripes, which only [`Hot::acquire`]'s
    /// decisions pin.
    #[inline(always)]
    pub(super) fn may_pin(&self, cell: &GcraCell) -> bool {
        !self.is_marked(place_of(cell))
    }

    /// The stripes of the key whose state is `cell`, found under `guard`, held for a thread
    /// that decides on them with no guard (`keyed::last_hit`); `None` if the key is not
    /// striped now.
    #[cold]
    #[inline(never)]
    pub(super) fn pin_stripes(&self, cell: &GcraCell, guard: &Guard) -> Option<PinnedStripes> {
        let place = place_of(cell);
        let start = spot(place);
        (0..PROBES).find_map(|i| {
            let slot = &self.side.slots[(start + i) % SLOTS];
            // Acquire: as every read of a slot. The place checked before a reference is taken,
            // so that the other keys' stripes probed past are left alone.
            let mine = |hot: &HotKey| hot.place == place;
            if !slot
                .load(Ordering::Acquire, guard)
                .as_ref()
                .is_some_and(mine)
            {
                return None;
            }
            slot.get_shared(Ordering::Acquire, guard)
                .filter(|hot| mine(hot))
                .map(PinnedStripes)
        })
    }

    /// The striped key at `place`, if it is striped.
    #[inline(always)]
    fn find<'g>(&self, place: usize, guard: &'g Guard) -> Option<&'g HotKey> {
        let start = spot(place);
        (0..PROBES).find_map(|i| {
            // Acquire: pairs with the Release swap that published the key's stripes.
            let hot = self.side.slots[(start + i) % SLOTS].load(Ordering::Acquire, guard);
            hot.as_ref().filter(|hot| hot.place == place)
        })
    }

    /// The stripes of the key at `place`, if it is striped.
    fn stripes_of<'g>(&self, place: usize, guard: &'g Guard) -> Option<&'g Stripes> {
        if !self.is_marked(place) {
            return None;
        }
        self.find(place, guard).map(|hot| &hot.stripes)
    }

    /// The lock of whatever moves the TAT of the key at `place` back.
    fn lock_of(&self, place: usize) -> &Mutex<()> {
        &self.side.lowering[spot(place) % LOCKS]
    }

    /// Counts a compare-and-swap lost on `cell`'s word at `now`; the last of
    /// [`LOST_BEFORE_STRIPING`] within a tick stripes the key.
    #[cold]
    #[inline(never)]
    fn lost_one(&self, place: usize, cell: &GcraCell, gcra: &Gcra, now: u64) {
        let lost = &self.side.lost[spot(place)];
        let tick = now >> TICK;
        // Relaxed, here and below: a count for a heuristic; no memory is published through
        // it. Racing updates may drop a loss or two, which only delays striping.
        let seen = lost.load(Ordering::Relaxed);
        if seen >> 8 != tick {
            lost.store(tick << 8 | 1, Ordering::Relaxed);
        } else if (seen & 0xFF) + 1 < LOST_BEFORE_STRIPING {
            lost.fetch_add(1, Ordering::Relaxed);
        } else {
            lost.store(tick << 8, Ordering::Relaxed);
            self.install(place, cell, gcra, now);
        }
    }

    /// Stripes the key at `place` (whose state is `cell`) at `now`, if a slot of its spot is
    /// free or holds a key that has taken no lease for [`IDLE_SPAN`] (which is unstriped).
    fn install(&self, place: usize, cell: &GcraCell, gcra: &Gcra, now: u64) {
        let guard = Guard::new();
        {
            let _writing = self.lock_writing();
            let start = spot(place);
            let mut free = None;
            let mut idle = None;
            for i in 0..PROBES {
                let slot = (start + i) % SLOTS;
                // Acquire: as every read of a slot.
                match self.side.slots[slot]
                    .load(Ordering::Acquire, &guard)
                    .as_ref()
                {
                    Some(hot) if hot.place == place => return,
                    Some(hot) if now.saturating_sub(hot.stripes.last_span()) > IDLE_SPAN => {
                        idle.get_or_insert((slot, hot));
                    }
                    Some(_) => {}
                    None => {
                        free.get_or_insert(slot);
                    }
                }
            }
            let slot = match (free, idle) {
                (Some(slot), _) => slot,
                // The idle key's stripes are retired before its slot is taken (see `remove`).
                (None, Some((slot, idle))) => {
                    idle.stripes.retire();
                    slot
                }
                // Every slot of the spot held by a key in use: this one stays on its word.
                (None, None) => return,
            };
            let hot = HotKey {
                place,
                stripes: Stripes::for_machine(gcra, now),
            };
            // Release: publishes the stripes to requests that find them (Acquire).
            self.side.slots[slot].swap((Some(Shared::new(hot)), Tag::None), Ordering::Release);
            self.remark(slot, &guard);
            // Release: a thread that sees the count move decides through the table, where it
            // finds the stripes. Until then it decides on the key's word: exact, as every
            // request that read the filter before the mark.
            self.changes.fetch_add(1, Ordering::Release);
        }
        // SeqCst: the installing side of the module's "A state that leaves" (the stripes
        // published, then the state read; a removal does the opposite).
        fence(Ordering::SeqCst);
        if cell.tat_relaxed().is_none() {
            self.remove(place, None);
        }
    }

    /// Sets the filter's bit of every spot whose window holds `slot` and still has a key
    /// striped, and clears the others' (under the writing lock): the slot just changed hands,
    /// and may have held the last striped key of its spot.
    fn remark(&self, slot: usize, guard: &Guard) {
        for spot_of in (0..PROBES).map(|back| (slot + SLOTS - back) % SLOTS) {
            let striped = (0..PROBES).any(|i| {
                // Acquire: as every read of a slot.
                self.side.slots[(spot_of + i) % SLOTS]
                    .load(Ordering::Acquire, guard)
                    .as_ref()
                    .is_some_and(|hot| spot(hot.place) == spot_of)
            });
            // Relaxed: see `is_marked`; the fences of `install` and `forget` order what
            // needs it.
            if striped {
                self.marks.fetch_or(1 << spot_of, Ordering::Relaxed);
            } else {
                self.marks.fetch_and(!(1 << spot_of), Ordering::Relaxed);
            }
        }
    }

    fn lock_writing(&self) -> std::sync::MutexGuard<'_, ()> {
        // Nothing a panic could leave half-written is guarded: the slots are atomics.
        self.side
            .writing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Forgets the stripes of `state`, which the caller has just retired (it leaves the
    /// table): after the retiring compare-and-swap, so an installation racing it either is
    /// seen here or sees the state retired (see the module docs).
    pub(super) fn forget<T>(&self, state: &T) {
        if !self.buckets {
            return;
        }
        // SeqCst: the removing side of the module's "A state that leaves".
        fence(Ordering::SeqCst);
        let place = place_of(state);
        if self.is_marked(place) {
            self.remove(place, None);
        }
    }

    /// Retires and unlinks the stripes of the key at `place`, if it has any (only `only`,
    /// when given: a request that found those stripes quiet must not unlink newer ones).
    #[cold]
    fn remove(&self, place: usize, only: Option<&HotKey>) {
        let guard = Guard::new();
        let _writing = self.lock_writing();
        let start = spot(place);
        for slot in (0..PROBES).map(|i| (start + i) % SLOTS) {
            let held = &self.side.slots[slot];
            // Acquire: as every read of a slot.
            if let Some(hot) = held.load(Ordering::Acquire, &guard).as_ref() {
                if hot.place == place && only.is_none_or(|only| std::ptr::eq(only, hot)) {
                    hot.stripes.retire();
                    held.swap((None, Tag::None), Ordering::Release);
                    self.remark(slot, &guard);
                }
            }
        }
    }

    /// Settles a reservation on `cell` at `now` (see `Stripes::settle`): a refund stops at
    /// what the key's stripes hold, and holds the lock of the key's spot for lowering its TAT
    /// whether or not the key is striped now (it may be by the time the refund's
    /// compare-and-swap comes). `None` when retired.
    pub(super) fn settle(
        &self,
        cell: &GcraCell,
        gcra: &Gcra,
        settled: (u64, u64, u64),
        now: u64,
    ) -> Option<()> {
        let guard = Guard::new();
        let place = place_of(cell);
        Stripes::settle(
            || self.stripes_of(place, &guard),
            self.lock_of(place),
            cell,
            gcra,
            settled,
            now,
        )
    }

    /// What a request of cost 1 on `cell` would get at `now`: the key's word, with what its
    /// stripes hold (each read in turn, see `Stripes::peek`). `None` when retired.
    pub(super) fn peek(&self, cell: &GcraCell, gcra: &Gcra, now: u64) -> Option<Decision> {
        let guard = Guard::new();
        match self.stripes_of(place_of(cell), &guard) {
            Some(stripes) => stripes.peek(cell, gcra, now),
            None => cell
                .tat_relaxed()
                .map(|tat| gcra.decide(tat, now, 1).decision()),
        }
    }

    /// Whether the key whose state is `cell` is striped now.
    pub(super) fn is_striped(&self, cell: &GcraCell) -> bool {
        let guard = Guard::new();
        self.stripes_of(place_of(cell), &guard).is_some()
    }

    /// Stripes the key whose state is `cell` at `now`, as contention would.
    #[cfg(test)]
    pub(super) fn stripe(&self, cell: &GcraCell, gcra: &Gcra, now: u64) {
        self.install(place_of(cell), cell, gcra, now);
    }

    /// Retires and unlinks the stripes of the key whose state is `cell`, as its going quiet
    /// does (less the give-back of its lease).
    #[cfg(test)]
    pub(super) fn unstripe(&self, cell: &GcraCell) {
        self.remove(place_of(cell), None);
    }

    /// How many keys are striped, and whether the filter marks exactly their spots.
    #[cfg(test)]
    pub(super) fn census(&self) -> (usize, bool) {
        let guard = Guard::new();
        let places: Vec<usize> = self
            .side
            .slots
            .iter()
            .filter_map(|slot| {
                slot.load(Ordering::Acquire, &guard)
                    .as_ref()
                    .map(|hot| hot.place)
            })
            .collect();
        let marks = places
            .iter()
            .fold(0u64, |marks, &place| marks | 1 << spot(place));
        (places.len(), marks == self.marks.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests;
