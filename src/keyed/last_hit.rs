//! Each thread's last hit: the token bucket key a thread keeps deciding on, decided with no
//! epoch guard and no index lookup.
//!
//! A request through the table pays for an epoch guard (a full fence) and a lookup in the
//! index before it reaches the key's word. A thread that keeps deciding on one key (one hot
//! user, a tenant, a global budget behind a keyed limiter) can skip both: after a run of
//! decisions in a row on one place through the table, the limiter keeps for that thread a
//! copy of the key, the key's cell pinned (`engine::cells::Pinned`: its place is not given
//! to another key while pinned, and its memory stays allocated), and the policy's
//! parameters. The thread's next request for that key compares the key, checks that
//! nothing changed, and decides on the cell in one compare-and-swap. A key pinned while
//! striped (`keyed::striped`) is pinned with its stripes, and its requests of cost 1 take
//! from the thread's home stripe instead, in one compare-and-swap on the stripe's line.
//!
//! **Why it is exact.** The cell holds the key's state, or that state retired (evicted, reset,
//! moved to a new policy), never another key's: the pin keeps its place from reuse. A retired
//! state refuses to decide, and the request goes through the table, which finds the key's
//! state wherever it is now. What the cell does not show is a change around it: a new
//! generation (a policy change), or the key striped (its permits then sit partly in its
//! stripes). Both count themselves in the limiter's `changes` with a Release increment after
//! the change is published, and a key is pinned with the count read (Acquire) before the
//! request loaded its generation: a count that includes a change comes with it, so a key
//! pinned under the current count is of the current generation, and striped only if pinned
//! with its stripes. A hit pinned under another count is not used, and is let go of. A
//! request that reads the count just before it moves decides on the key's word, exactly as a
//! request through the table that read the current generation or the stripes' filter just
//! before the change. Stripes held by a pin are exact as stripes found under a guard are:
//! they only hold runs the key's word handed out, and once retired (the key evicted, reset,
//! moved, or gone back to its word) no request takes from them; a pin that finds them
//! retired is let go of. A compare-and-swap lost to another thread is not retried here: the
//! request goes through the table, which counts the loss (as its own), backs off, and
//! stripes a key that keeps losing.
//!
//! **What pinning costs, and who pays.** A pin copies the key (a `String` key allocates) and
//! takes the slab's lock twice (its own, and the unpinning of the key it replaces); a striped
//! key's pin probes the side table again for the stripes and takes a reference to them. The
//! copy (`K::from`) and the replaced key's `Drop` run in the request that pins, after its
//! decision, under its lookup's epoch guard: a key type whose conversion panics panics there,
//! and one whose `Drop` is slow holds back the reclamation of freed states meanwhile. A
//! run of two decisions in a row on one place pins at first. A thread whose pins go to waste (its
//! pinned key decided fewer than [`PAID`] requests, or fewer than the run that pinned it:
//! clients that send a few requests at a time, or an attacker who does) asks for twice as
//! long a run each time, up to [`LONGEST_RUN`]; a pin that pays for itself brings the run
//! back to the first. The run a pin needs is kept in the limiter's slot as well as in the
//! thread's notes, which hold four limiters: a thread of more limiters does not forget it.
//!
//! **What it keeps.** One key per thread and limiter, dropped with the limiter, and with it the
//! slab segment its cell is in (a quarter of the slab's cells at most), after a policy
//! change too, until the thread's next request in the limiter lets go of the stale pin
//! (from its notes, or, once others took its way there, from its slot). A key
//! pinned with its stripes keeps them (up to 64 stripes on lines of their own, about 8 KiB)
//! until its pin is let go of: once they are retired, by the thread's next request that
//! reaches the pin, whatever its path. A thread that has exited, or never decides in the
//! limiter again, keeps its key until the limiter is dropped or a new thread takes its number
//! (thread numbers are reused). A thread that decides on a different key each time never
//! pins one, has no slot made for it, and reads and writes only its own notes
//! (`WAYS_OF_THREAD`), unless it decides in more limiters than its notes hold: a request in a
//! limiter whose way others took takes it back, and reads the thread's slot there if it has
//! one.

use std::borrow::Borrow;
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crossbeam_utils::CachePadded;
use thread_local::ThreadLocal;

use crate::decision::Decision;
use crate::engine::cells::Pinned;
use crate::engine::stripes::Home;
use crate::engine::token_bucket::{Gcra, GcraCell};
use crate::engine::word::Once;

use super::striped::PinnedStripes;

/// Each thread's last hit on one limiter.
pub(super) struct LastHits<K> {
    threads: Box<dyn Threads<K>>,
    /// Whether a thread has ever pinned a key here: until one has, a request from a thread
    /// with no notes for the limiter has no pin to check (see [`LastHits::start`]). Set once,
    /// by a thread as it pins, and read by that thread's later requests.
    pinned: AtomicBool,
}

/// The threads' slots, behind a trait object so that only the constructor needs `K: Send`
/// (a slot holds a key, and `ThreadLocal` requires its values to be `Send`).
trait Threads<K>: Send + Sync {
    /// This thread's slot, made if it has none.
    fn mine_or_new(&self) -> &RefCell<Last<K>>;
    /// This thread's slot, if it has one.
    fn mine(&self) -> Option<&RefCell<Last<K>>>;
}

/// A thread's slot is on cache lines of its own: each decision writes its borrow flag.
type Slot<K> = CachePadded<RefCell<Last<K>>>;

impl<K: Send> Threads<K> for ThreadLocal<Slot<K>> {
    fn mine_or_new(&self) -> &RefCell<Last<K>> {
        match self.get() {
            Some(mine) => mine,
            None => new_slot(self),
        }
    }

    fn mine(&self) -> Option<&RefCell<Last<K>>> {
        self.get().map(|mine| &**mine)
    }
}

/// This thread's first slot in `threads`: out of line, so that the path of every other
/// request does not set up the frame that builds a slot (aligned to its cache lines).
#[cold]
#[inline(never)]
fn new_slot<K: Send>(threads: &ThreadLocal<Slot<K>>) -> &RefCell<Last<K>> {
    threads.get_or(|| {
        CachePadded::new(RefCell::new(Last {
            hit: None,
            served: Cell::new(u64::MAX),
            needed: Cell::new(FIRST_RUN),
        }))
    })
}

/// What a thread keeps in one limiter's slot.
struct Last<K> {
    /// The pinned key, if any.
    hit: Option<Hit<K>>,
    /// Requests the last key pinned decided since it was pinned (`u64::MAX` before the first
    /// pin, which counts as paid for; counted only while a key is pinned, from 0, so it
    /// never wraps: 2^64 decisions take centuries).
    served: Cell<u64>,
    /// The run the next pin needs (see `Ways::needed`), kept here too so that it outlives
    /// the limiter's way in the thread's notes.
    needed: Cell<u16>,
}

/// A key pinned by a thread.
struct Hit<K> {
    /// The limiter's count of changes read before the key's state was found.
    changes: u64,
    key: K,
    cell: Pinned<GcraCell>,
    gcra: Gcra,
    /// The key's stripes, when it was striped as it was pinned.
    stripes: Option<PinnedStripes>,
}

/// What [`LastHits::seen`] pins: the key, its cell, the policy's parameters and the key's
/// stripes if it is striped.
pub(super) struct ToPin<K> {
    pub(super) key: K,
    pub(super) cell: Pinned<GcraCell>,
    pub(super) gcra: Gcra,
    pub(super) stripes: Option<PinnedStripes>,
}

/// The limiter's count of changes, read before the request loads the current generation: a
/// key pinned under it is of that generation or a newer one, whose change moves the count.
#[inline(always)]
pub(super) fn changes(changes: &AtomicU64) -> u64 {
    // Acquire: pairs with the Release increment of each change (see the module docs), so a
    // count that has moved comes with the generation and the stripes it counts.
    changes.load(Ordering::Acquire)
}

impl<K: Send + 'static> LastHits<K> {
    pub(super) fn new() -> Self {
        LastHits {
            threads: Box::new(ThreadLocal::<Slot<K>>::new()),
            pinned: AtomicBool::new(false),
        }
    }
}

/// Limiters a thread notes its last decision in at once (see [`WAYS_OF_THREAD`]).
const WAYS: usize = 4;

thread_local! {
    /// What a thread notes of its last decision through each of the last [`WAYS`] limiters'
    /// tables, in memory of its own that needs no lookup: a thread that decides on a different
    /// key each time reads and writes only this, never the limiter's slots.
    static WAYS_OF_THREAD: Ways = const {
        Ways {
            limiters: [const { Cell::new(0) }; WAYS],
            streak: [const { Cell::new(false) }; WAYS],
            seen: [const { Cell::new(NO_NOTE) }; WAYS],
            run: [const { Cell::new(0) }; WAYS],
            needed: [const { Cell::new(FIRST_RUN) }; WAYS],
            pinned: [const { Cell::new(NO_NOTE) }; WAYS],
            next: Cell::new(0),
        }
    };
}

/// A decision through the table, as a thread notes it: the low 32 bits of the count of
/// changes it was made under, and the place of the state. A note only says when to look at
/// the limiter's slot, whose hit is checked in full: two counts 2^32 apart are told apart
/// there.
#[inline(always)]
fn note(changes: u64, place: u32) -> u64 {
    changes << 32 | u64::from(place)
}

/// No note: no place is `u32::MAX` (a slab's places stop below it).
const NO_NOTE: u64 = u64::MAX;

/// Decisions in a row through the table on one place that pin its key, at first.
const FIRST_RUN: u16 = 2;

/// Requests a pinned key must decide for its pin to count as paid for, however short the run
/// that pinned it: a pin costs a copy of the key and the slab's lock twice, several lookups'
/// worth.
const PAID: u16 = 64;

/// The longest run ever asked for: a thread whose pins keep going to waste (runs of two or
/// three requests per key, from bursty clients or from an attacker) pins at most once every
/// this many decisions, so the pinning's cost (a copy of the key, the slab's lock twice)
/// spread over them is a fraction of a nanosecond.
const LONGEST_RUN: u16 = 1024;

/// A thread's notes, one way per limiter; what every request reads first (the limiters and
/// the streaks) on one cache line.
struct Ways {
    /// Each way's limiter's id (`Generations::id`, never 0); 0 for a way not used yet.
    limiters: [Cell<u64>; WAYS],
    /// Whether the thread's last request in the way's limiter was for its pinned key: only
    /// then does the next one look at the limiter's slot. A thread that decides on other
    /// keys in between pays one failed look per run of them, not one per request.
    streak: [Cell<bool>; WAYS],
    /// The [`note`] of the thread's last decision through the table.
    seen: [Cell<u64>; WAYS],
    /// How many decisions in a row through the table were on the place of `seen`.
    run: [Cell<u16>; WAYS],
    /// How long a run pins its key: [`FIRST_RUN`], doubled (up to [`LONGEST_RUN`]) each time
    /// a key is pinned in place of one that did not decide as many requests as its run was
    /// long, and [`FIRST_RUN`] again after one that did.
    needed: [Cell<u16>; WAYS],
    /// The [`note`] of the key the thread has pinned in the limiter's slot, if any.
    pinned: [Cell<u64>; WAYS],
    /// The way a limiter not noted yet takes next.
    next: Cell<usize>,
}

impl Ways {
    /// The way of `limiter`, if this thread has one.
    #[inline(always)]
    fn of(&self, limiter: u64) -> Option<usize> {
        self.limiters.iter().position(|way| way.get() == limiter)
    }

    /// The way of `limiter`, taken from the oldest if this thread has none, with the run its
    /// next pin needs and the note of its pinned key as `restore` gives them (from the
    /// limiter's slot, which outlives the way).
    fn of_or_take(&self, limiter: u64, restore: impl FnOnce() -> (u16, u64)) -> usize {
        self.of(limiter).unwrap_or_else(|| {
            let way = self.next.get();
            self.next.set((way + 1) % WAYS);
            let (needed, pinned) = restore();
            self.limiters[way].set(limiter);
            self.streak[way].set(false);
            self.seen[way].set(NO_NOTE);
            self.run[way].set(0);
            self.needed[way].set(needed);
            self.pinned[way].set(pinned);
            way
        })
    }
}

/// Where a request starts: its limiter's way in this thread's notes (`WAYS` for none), and
/// whether the thread's last request there was for its pinned key.
#[derive(Clone, Copy)]
pub(super) struct Start {
    way: usize,
    streak: bool,
}

/// This thread's notes for the limiter numbered `limiter`, read once per request under the
/// count of changes `changes` (as `changes` read it), and whether the thread's pin there is
/// stale (pinned under another count).
#[inline(always)]
fn notes(limiter: u64, changes: u64) -> (Start, bool) {
    WAYS_OF_THREAD
        .try_with(|ways| match ways.of(limiter) {
            Some(way) => {
                let pinned = ways.pinned[way].get();
                let start = Start {
                    way,
                    streak: ways.streak[way].get(),
                };
                (
                    start,
                    pinned != NO_NOTE && pinned >> 32 != note(changes, 0) >> 32,
                )
            }
            None => (NO_WAY, false),
        })
        .unwrap_or((NO_WAY, false))
}

/// A request in a limiter this thread has no notes for.
const NO_WAY: Start = Start {
    way: WAYS,
    streak: false,
};

/// How [`LastHits::decide`] went.
pub(super) enum Tried {
    /// Decided on the pinned key's cell: the decision, and the TAT an admission wrote (the
    /// mark a reservation keeps; 0 for a refusal).
    Decided(Decision, u64),
    /// Another thread wrote the pinned key's state first: the request goes through the table,
    /// which counts the loss as its own (see `Hot::acquire`).
    Lost,
    /// Not decided here: the request goes through the table.
    Missed,
}

/// A request of cost 1 at `now` on the home stripe of `hit`'s key, pinned with its stripes.
/// Out of line: inline, it cost every decision on a key's word (the common pin) 15 more
/// instructions, 204 where it takes 189 (callgrind).
#[inline(never)]
fn on_stripes<K>(stripes: &PinnedStripes, hit: &Hit<K>, now: u64) -> Result<(Decision, u64), Miss> {
    match stripes.home(hit.cell.get(), &hit.gcra, now) {
        // A stripe's admission marks nothing: only a reservation keeps its mark.
        Home::Decided(decision) => Ok((decision, 0)),
        // The table refills the home stripe, or steals, or refuses.
        Home::Empty => Err(Miss::Other),
        Home::Retired => Err(Miss::Stale),
    }
}

/// Why [`LastHits::on_hit`] did not decide.
enum Miss {
    /// No pinned key, another key's request, a cost above the policy's permits, or the slot
    /// borrowed mutably (a re-entrant call from the key's own `From` or `Drop`, run while a
    /// key is pinned).
    Other,
    /// The pinned key's state is retired, or the count of changes moved: the pin is of no
    /// more use.
    Stale,
    /// Another thread wrote the state first.
    Lost,
}

impl<K> LastHits<K> {
    /// Reads this thread's notes for the limiter numbered `limiter`, once per request, under
    /// the count of changes `changes` (as [`changes`] read it, before the generation); a pin
    /// made under another count is let go of here, whether or not the thread's requests go on
    /// to use it. A thread with no notes for the limiter (others took its way) looks at its
    /// slot instead, once a key has been pinned here: its requests may never come back
    /// through a token bucket's table, the only path that takes a way again (the rules
    /// changed to another algorithm, or every key is new), and its pin would otherwise keep
    /// the key, its stripes and its slab segment until the limiter is dropped.
    #[inline(always)]
    pub(super) fn start(&self, limiter: u64, changes: u64) -> Start {
        let (start, stale) = notes(limiter, changes);
        if stale {
            self.let_go(start.way);
        } else if start.way == WAYS && self.pinned.load(Ordering::Relaxed) {
            // Relaxed: only this thread's own pin matters here, and the thread set the flag
            // itself, before it pinned, so its own later read sees it.
            self.let_go_if_stale(changes);
        }
        start
    }

    /// Lets go of this thread's pin if it was pinned under a count other than `changes`, for
    /// a request from a thread with no notes for the limiter (see [`LastHits::start`]).
    #[cold]
    #[inline(never)]
    fn let_go_if_stale(&self, changes: u64) {
        let Some(slot) = self.threads.mine() else {
            return;
        };
        if let Ok(mut last) = slot.try_borrow_mut() {
            if last.hit.as_ref().is_some_and(|hit| hit.changes != changes) {
                last.hit = None;
            }
        }
    }

    /// Decides a request of `cost` for `key` at `now` on this thread's last hit, if the
    /// thread's last request in this limiter was for it (`start`), it is `key`'s and it was
    /// pinned under the count `changes` holds now (read only then). A cost above the policy's
    /// permits goes through the table, which refuses it. On a key pinned with its stripes, a
    /// request that `may_take_stripes` (a request of cost 1 on `try_acquire`'s path) takes from
    /// the thread's home stripe, as through the table; the others (reservations, `AllOf`
    /// parts) decide on the key's word, as through the table.
    #[inline(always)]
    pub(super) fn decide<Q: Eq + ?Sized>(
        &self,
        start: Start,
        changes: &AtomicU64,
        key: &Q,
        now: u64,
        (cost, may_take_stripes): (u64, bool),
    ) -> Tried
    where
        K: Borrow<Q>,
    {
        if !start.streak {
            return Tried::Missed;
        }
        // Read again rather than passed from `start`'s reading, though it is the same value
        // or a newer one: with the value passed in, a hot key's decision measured 16.6 to
        // 20.8 ns over five valid `hot_path` runs, where this build reads 16.7 to 17.0. The
        // cause was not found; the second load is of a line the first just read.
        match self.on_hit(self::changes(changes), key, now, (cost, may_take_stripes)) {
            Ok((decision, mark)) => Tried::Decided(decision, mark),
            Err(miss) => self.missed(start.way, miss),
        }
    }

    /// [`LastHits::decide`] on this thread's slot.
    #[inline(always)]
    fn on_hit<Q: Eq + ?Sized>(
        &self,
        changes: u64,
        key: &Q,
        now: u64,
        (cost, may_take_stripes): (u64, bool),
    ) -> Result<(Decision, u64), Miss>
    where
        K: Borrow<Q>,
    {
        // The key's own `Borrow` and `Eq` run under this shared borrow: a call of theirs back
        // into the limiter may decide on the slot too (a shared borrow again), and a pin it
        // would make finds the slot borrowed and is skipped.
        let Ok(last) = self.threads.mine_or_new().try_borrow() else {
            return Err(Miss::Other);
        };
        let Some(hit) = last.hit.as_ref() else {
            return Err(Miss::Other);
        };
        if hit.changes != changes {
            return Err(Miss::Stale);
        }
        // Every policy has a permit at least: a cost of 1, known where the request is made,
        // needs no look at the limit.
        if (cost > 1 && cost > hit.gcra.limit()) || hit.key.borrow() != key {
            return Err(Miss::Other);
        }
        let decided = match &hit.stripes {
            Some(stripes) if may_take_stripes => on_stripes(stripes, hit, now)?,
            // A request on the word of a key pinned with stripes since retired lets go of
            // them (and of the pin), whichever requests the thread makes there.
            Some(stripes) if stripes.retired() => return Err(Miss::Stale),
            _ => match hit.cell.get().reserve_once(&hit.gcra, now, cost) {
                Once::Done(decided) => decided,
                Once::Retired => return Err(Miss::Stale),
                Once::Lost => return Err(Miss::Lost),
            },
        };
        last.served.set(last.served.get().wrapping_add(1));
        Ok(decided)
    }

    /// After a miss on the slot: the thread's next request goes through the table, and a
    /// stale pin is let go of at once (its slab segment with it).
    #[cold]
    #[inline(never)]
    fn missed(&self, way: usize, miss: Miss) -> Tried {
        let _ = WAYS_OF_THREAD.try_with(|ways| ways.streak[way].set(false));
        match miss {
            Miss::Lost => Tried::Lost,
            Miss::Other => Tried::Missed,
            Miss::Stale => {
                self.let_go(way);
                Tried::Missed
            }
        }
    }

    /// Lets go of this thread's pin in the limiter of `way`, stale (of a replaced
    /// generation, of a state retired, or from before a key was striped).
    #[cold]
    #[inline(never)]
    fn let_go(&self, way: usize) {
        let _ = WAYS_OF_THREAD.try_with(|ways| ways.pinned[way].set(NO_NOTE));
        // `served` stays: whether that pin paid for itself still counts for the next one.
        if let Some(Ok(mut last)) = self.threads.mine().map(RefCell::try_borrow_mut) {
            last.hit = None;
        }
    }

    /// The run the next pin needs and the note of the pinned key, from this thread's slot:
    /// for a way taken for this limiter. A thread that never pinned a key here has no slot,
    /// and gets none made.
    #[cold]
    #[inline(never)]
    fn restore(&self) -> (u16, u64) {
        match self.threads.mine().map(RefCell::try_borrow) {
            None => (FIRST_RUN, NO_NOTE),
            Some(Ok(last)) => (
                last.needed.get(),
                last.hit
                    .as_ref()
                    .map_or(NO_NOTE, |hit| note(hit.changes, hit.cell.place())),
            ),
            Some(Err(_)) => (LONGEST_RUN, NO_NOTE),
        }
    }

    /// Notes that this thread decided, under `changes`, on the token bucket at `place` of
    /// the limiter numbered `limiter` through its table (on its word or its stripes), with
    /// the guard of that lookup still held. A run of decisions in a row on one place as long
    /// as the way asks for pins its key, with what `pin` gives.
    #[inline(always)]
    pub(super) fn seen(
        &self,
        start: Start,
        limiter: u64,
        changes: u64,
        place: u32,
        pin: impl FnOnce() -> ToPin<K>,
    ) {
        let noted = note(changes, place);
        let pin_way = WAYS_OF_THREAD
            .try_with(|ways| {
                // The way `start` found, unless a call of the key's own code (its `Hash` or
                // `Eq`, during the lookup) gave it to another limiter since.
                let way = if start.way < WAYS && ways.limiters[start.way].get() == limiter {
                    start.way
                } else {
                    ways.of_or_take(limiter, || self.restore())
                };
                if ways.pinned[way].get() == noted {
                    // The pinned key, come through the table after other keys: its next
                    // request looks at the slot again, and another key's run starts over.
                    ways.streak[way].set(true);
                    ways.seen[way].set(noted);
                    ways.run[way].set(0);
                    return None;
                }
                let run = if ways.seen[way].replace(noted) == noted {
                    ways.run[way].get().saturating_add(1)
                } else {
                    1
                };
                ways.run[way].set(run);
                (run >= ways.needed[way].get()).then_some(way)
            })
            .ok()
            .flatten();
        if let Some(way) = pin_way {
            self.pin(way, changes, place, pin);
        }
    }

    /// Pins the key at `place` for this thread, in place of the key it had pinned.
    #[cold]
    #[inline(never)]
    fn pin(&self, way: usize, changes: u64, place: u32, pin: impl FnOnce() -> ToPin<K>) {
        // `K::from` and the replaced key's `Drop` run under this borrow: a call of theirs back
        // into the limiter finds the slot borrowed and goes through the table.
        let Ok(mut last) = self.threads.mine_or_new().try_borrow_mut() else {
            return;
        };
        if !self.pinned.load(Ordering::Relaxed) {
            // Relaxed: see `LastHits::start`.
            self.pinned.store(true, Ordering::Relaxed);
        }
        let needed = last.needed.get();
        let paid = last.served.get() >= u64::from(needed.max(PAID));
        let needed = if paid {
            FIRST_RUN
        } else {
            needed.saturating_mul(2).min(LONGEST_RUN)
        };
        let ToPin {
            key,
            cell,
            gcra,
            stripes,
        } = pin();
        last.hit = Some(Hit {
            changes,
            key,
            cell,
            gcra,
            stripes,
        });
        last.served.set(0);
        last.needed.set(needed);
        let _ = WAYS_OF_THREAD.try_with(|ways| {
            ways.pinned[way].set(note(changes, place));
            ways.streak[way].set(true);
            ways.run[way].set(0);
            ways.needed[way].set(needed);
        });
    }
}

/// Whether this thread's next request in the limiter numbered `limiter` looks at its slot.
#[cfg(test)]
pub(super) fn streaking(limiter: u64) -> bool {
    notes(limiter, 0).0.streak
}

/// How long a run this thread asks for before it pins a key in the limiter numbered
/// `limiter`.
#[cfg(test)]
pub(super) fn run_needed(limiter: u64) -> u16 {
    WAYS_OF_THREAD.with(|ways| {
        ways.of(limiter)
            .map_or(FIRST_RUN, |way| ways.needed[way].get())
    })
}

/// Whether this thread holds a pin in `hits`' limiter.
#[cfg(test)]
pub(super) fn holds_pin<K>(hits: &LastHits<K>) -> bool {
    hits.threads.mine_or_new().borrow().hit.is_some()
}

/// Whether this thread has a slot in `hits`' limiter.
#[cfg(test)]
pub(super) fn has_slot<K>(hits: &LastHits<K>) -> bool {
    hits.threads.mine().is_some()
}

/// Whether this thread holds a pin in `hits`' limiter with the key's stripes.
#[cfg(test)]
pub(super) fn holds_stripes<K>(hits: &LastHits<K>) -> bool {
    hits.threads
        .mine_or_new()
        .borrow()
        .hit
        .as_ref()
        .is_some_and(|hit| hit.stripes.is_some())
}

#[cfg(test)]
mod tests;
