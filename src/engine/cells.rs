//! Where a table whose readers take no lock keeps its states: each in a box of its own, or,
//! for the one-word states, in a slab of cells reused in place.
//!
//! Both give a state an address that never moves while a reader may hold it, which is what a
//! lock-free reader needs: the index the reader went through may move its entries, so it
//! holds only what [`Cells::Handle`] says, and the state stays put. The slab saves the
//! allocation per key (and the allocator's overhead with it) for the token bucket and the
//! sliding counter: a freed cell is taken again only once every epoch guard that could have
//! seen it is gone and no thread has it pinned (see [`Pinned`]), and is then overwritten with
//! the new key's state before that state is published. The sliding log and the composite own
//! a heap block of words anyway, and a state with its own parameters (a per-key policy)
//! differs in layout from key to key, so those keep one box per key.

use std::collections::HashMap;
use std::ops::DerefMut;
use std::sync::{Arc, OnceLock, PoisonError, Weak};

use crate::engine::sync::{Guard, Mutex};

/// How a table keeps its states of type `St`.
pub(crate) trait Cells<St>: Send + Sync + 'static {
    /// What the table's index stores for a key: where its state is.
    type Handle: Send + Sync + 'static;
    /// What a removal hands back so that the state's place can be given again.
    type Vacated: Send + 'static;

    fn new() -> Self;
    /// The state `held` points at.
    fn get<'a>(&'a self, held: &'a Self::Handle) -> &'a St;
    /// A place holding `state`, not yet seen by anyone; `None` when there is no place left.
    fn hold(&self, state: St) -> Option<Self::Handle>;
    /// What to hand back once `held` has left the index.
    fn freed(held: &Self::Handle) -> Self::Vacated;
    /// `true` when [`Cells::hold`] would find no place now.
    fn is_full(&self) -> bool;
    /// Gives the places of `freed` back, once every reader that could hold them is gone. To
    /// be called only after their entries have left the index.
    fn release(&self, freed: Vec<Self::Vacated>);
}

/// One box per state; the index frees it through its own epoch-based reclamation.
pub(crate) struct Boxed;

impl<St: Send + Sync + 'static> Cells<St> for Boxed {
    type Handle = Box<St>;
    type Vacated = ();

    fn new() -> Self {
        Boxed
    }

    #[inline(always)]
    fn get<'a>(&'a self, held: &'a Box<St>) -> &'a St {
        held
    }

    fn hold(&self, state: St) -> Option<Box<St>> {
        Some(Box::new(state))
    }

    fn freed(_: &Box<St>) {}

    fn is_full(&self) -> bool {
        false
    }

    fn release(&self, _: Vec<()>) {}
}

/// A state that can be reused in place: its whole value is its atomic words.
pub(crate) trait Reusable: Send + Sync + Sized + 'static {
    /// A placeholder for a cell not handed out yet.
    fn blank() -> Self;
    /// Takes `from`'s value. Called only on a cell no reader can reach: never handed out,
    /// or released after every guard that could have seen it; the index entry that then
    /// publishes the cell orders these stores before any reader's loads.
    fn reuse(&self, from: Self);
}

/// Slots `0 .. 2^FIRST_SHIFT` make the first segments; from there on each power of two of
/// slots (counted from `2^FIRST_SHIFT`) is cut into four segments, so that the slab grows by
/// a quarter at a time, never more than a third above what is in use, where doubling left up
/// to half of it unused.
const FIRST_SHIFT: u32 = 5;
/// A cell's place is its segment and its offset in it, packed in one `u32` (see [`Place`]):
/// the offset in the low `OFFSET_BITS` bits, so a segment holds at most `2^OFFSET_BITS` cells.
const OFFSET_BITS: u32 = 25;
/// The highest power of two of slots (counted from `2^FIRST_SHIFT`) whose quarters still fit
/// `OFFSET_BITS`: each quarter of `[2^p, 2^(p+1))` has `2^(p-2)` cells.
const LAST_POWER: u32 = OFFSET_BITS + 2;
/// Segments: four per power of two from `2^FIRST_SHIFT` to `2^LAST_POWER`.
const SEGMENTS: usize = 4 * (LAST_POWER - FIRST_SHIFT + 1) as usize;
/// Slots the slab can hand out: every slot whose `slot + 2^FIRST_SHIFT` lies below
/// `2^(LAST_POWER + 1)` (about 268 million cells; past them a new key shares the overflow
/// state, as when no place is left).
const MAX_SLOTS: u64 = (1 << (LAST_POWER + 1)) - (1 << FIRST_SHIFT);

/// Cells that never move: segments allocated as the table grows, and the places free for
/// reuse.
pub(crate) struct Slab<St> {
    /// Inline, so a lookup goes from the table straight to a segment's cells. Each segment
    /// in an `Arc`, so that a [`Pinned`] cell keeps its segment alive after the slab.
    segments: [OnceLock<Arc<[St]>>; SEGMENTS],
    /// Slots handed out so far, and the released places (a cold path: taken to create a
    /// key). Behind an `Arc` of its own, so a release deferred past the readers can still
    /// reach it, or find it gone with the slab.
    slots: Arc<Mutex<Slots>>,
}

#[derive(Default)]
struct Slots {
    next: u64,
    free: Vec<u32>,
    /// The places pinned now, with how many pins each has and whether it was released
    /// meanwhile (then it joins `free` when its last pin goes).
    pinned: HashMap<u32, Pins>,
}

/// The pins of one place.
struct Pins {
    count: u32,
    released: bool,
}

impl Slots {
    /// Takes `freed` back once no reader's guard can hold them: each joins the free places,
    /// or waits for its last pin.
    fn take_back(&mut self, freed: Vec<u32>) {
        if self.pinned.is_empty() {
            self.free.extend(freed);
            return;
        }
        for place in freed {
            match self.pinned.get_mut(&place) {
                Some(pins) => pins.released = true,
                None => self.free.push(place),
            }
        }
    }
}

/// A slab's cell held outside any epoch guard, by a thread that keeps deciding on it (a
/// keyed limiter's thread-local last hit, `keyed::last_hit`). While a `Pinned` lives, its
/// cell's segment stays allocated and its place is not given to another key: a place
/// released while pinned is taken back when the last pin goes. So a request on a pinned cell
/// decides on its key's state or on that state retired (which refuses to decide), never on
/// another key's. Pinning is for a cell found in the index under a guard: the guard keeps the
/// release of the place from running before the pin is counted.
pub(crate) struct Pinned<St> {
    segment: Arc<[St]>,
    offset: usize,
    place: u32,
    /// Weak, as the slab's own deferred releases hold it: a pin outliving its slab keeps the
    /// one segment it needs, not the slab's books (a free list of every key it held).
    slots: Weak<Mutex<Slots>>,
}

impl<St> Pinned<St> {
    /// The cell.
    #[inline(always)]
    pub(crate) fn get(&self) -> &St {
        &self.segment[self.offset]
    }

    /// Where the cell is in its slab.
    pub(crate) fn place(&self) -> u32 {
        self.place
    }
}

impl<St> Drop for Pinned<St> {
    fn drop(&mut self) {
        // A slab gone has no place to give again.
        let Some(slots) = self.slots.upgrade() else {
            return;
        };
        let mut slots = lock(&slots);
        let Some(pins) = slots.pinned.get_mut(&self.place) else {
            return;
        };
        pins.count -= 1;
        if pins.count == 0 {
            let released = pins.released;
            slots.pinned.remove(&self.place);
            if released {
                // The mutex orders this thread's last use of the cell before the write of
                // whichever key `hold` gives the place to next.
                slots.free.push(self.place);
            }
        }
    }
}

/// Where a cell is: its segment in the high bits of a `u32`, its offset in the low
/// [`OFFSET_BITS`], so that finding it is a shift and a mask (the slot's number is turned
/// into a place once, when the cell is handed out).
struct Place;

/// Cells of 8 bytes (a token bucket's TAT) in 64 bytes, a cache line's length.
const CELLS_PER_LINE_BITS: u32 = 3;

/// The offset of the `nth` cell handed out in a segment of `2^bits` cells: consecutive ones
/// go round the segment by 8 cells (a rotation of the bits), so keys created one after another
/// from fresh cells (two hot keys of a start-up, each then decided by a thread of its own)
/// do not share a cache line, where side by side every write to one would take the line from
/// the other's core. In a segment of 32 cells or more, two in a row are 64 bytes apart or
/// more (a sliding counter's 16-byte cells, 128), on different lines wherever the segment
/// starts. The first eight segments, the first 96 cells, are the exception: segments of 8
/// cells keep their order, and in one of 16 the step from its first 8 cells back to its
/// second is 56 bytes; a segment starts where its allocation does, not on a line's boundary,
/// so such neighbours may share a line. A cell given back is handed out again before any
/// fresh one (`Slab::hold`), wherever it is. The price: keys created close together, which a
/// workload may go on deciding on together, sit on up to 8 times as many lines (and pages)
/// as side by side, until their segment has gone round once; a full segment is as dense.
#[inline(always)]
fn spread(nth: u32, bits: u32) -> u32 {
    let line_bits = bits.saturating_sub(CELLS_PER_LINE_BITS);
    let lines = (1 << line_bits) - 1;
    ((nth & lines) << CELLS_PER_LINE_BITS) | (nth >> line_bits)
}

impl Place {
    /// The place of the `slot`th cell handed out, and its segment's length.
    fn of_slot(slot: u64) -> (u32, usize) {
        // `at` lies in [2^p, 2^(p+1)) with FIRST_SHIFT <= p <= LAST_POWER; its quarter of
        // that range is the segment.
        let at = slot + (1 << FIRST_SHIFT);
        let p = u64::BITS - 1 - at.leading_zeros();
        debug_assert!(
            (FIRST_SHIFT..=LAST_POWER).contains(&p),
            "slot {slot} out of range"
        );
        let quarter = p - 2;
        let segment = 4 * (p - FIRST_SHIFT) + ((at >> quarter) & 3) as u32;
        let offset = spread((at & ((1 << quarter) - 1)) as u32, quarter);
        ((segment << OFFSET_BITS) | offset, 1 << quarter)
    }

    /// The segment and the offset of `place`.
    #[inline(always)]
    fn split(place: u32) -> (usize, usize) {
        (
            (place >> OFFSET_BITS) as usize,
            (place & ((1 << OFFSET_BITS) - 1)) as usize,
        )
    }
}

impl<St> Slab<St> {
    /// Pins the cell at `place`, found in the index under a guard still held (see
    /// [`Pinned`]).
    pub(crate) fn pin(&self, place: u32) -> Pinned<St> {
        let (segment, offset) = Place::split(place);
        let Some(cells) = self.segments[segment].get() else {
            unreachable!("place {place:#x} was handed out, so its segment exists")
        };
        let mut slots = lock(&self.slots);
        slots
            .pinned
            .entry(place)
            .or_insert(Pins {
                count: 0,
                released: false,
            })
            .count += 1;
        Pinned {
            segment: Arc::clone(cells),
            offset,
            place,
            slots: Arc::downgrade(&self.slots),
        }
    }

    /// Hands out every place not yet handed out, as a slab of `MAX_SLOTS` cells would have.
    #[cfg(test)]
    pub(crate) fn exhaust(&self) {
        let mut slots = lock(&self.slots);
        slots.next = MAX_SLOTS;
        slots.free.clear();
    }
}

fn lock(slots: &Mutex<Slots>) -> impl DerefMut<Target = Slots> + '_ {
    // Each change to `Slots` is one push, pop or increment: a panic cannot leave it torn.
    slots.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<St: Reusable> Cells<St> for Slab<St> {
    type Handle = u32;
    type Vacated = u32;

    fn new() -> Self {
        Slab {
            segments: std::array::from_fn(|_| OnceLock::new()),
            slots: Arc::new(Mutex::new(Slots::default())),
        }
    }

    #[inline(always)]
    fn get<'a>(&'a self, handle: &'a u32) -> &'a St {
        let (segment, offset) = Place::split(*handle);
        match self.segments[segment].get() {
            Some(cells) => &cells[offset],
            None => unreachable!("place {handle:#x} was handed out, so its segment exists"),
        }
    }

    fn hold(&self, state: St) -> Option<u32> {
        let mut slots = lock(&self.slots);
        let (place, len) = match slots.free.pop() {
            Some(place) => (place, 0),
            None => {
                if slots.next >= MAX_SLOTS {
                    return None;
                }
                let fresh = Place::of_slot(slots.next);
                slots.next += 1;
                fresh
            }
        };
        let (segment, offset) = Place::split(place);
        // A freed place's segment exists (`len` is not used then).
        let cells = self.segments[segment].get_or_init(|| (0..len).map(|_| St::blank()).collect());
        cells[offset].reuse(state);
        Some(place)
    }

    fn freed(held: &u32) -> u32 {
        *held
    }

    fn is_full(&self) -> bool {
        let slots = lock(&self.slots);
        slots.next >= MAX_SLOTS && slots.free.is_empty()
    }

    fn release(&self, freed: Vec<u32>) {
        if freed.is_empty() {
            return;
        }
        // Called once the slots' entries have left the index. The closure runs after every
        // guard present now is gone, so after every reader that could have found these slots
        // in the index: no request decides on another key's state. Weak: a slab dropped
        // meanwhile (its generation gone) is not kept alive for its free list.
        let slots = Arc::downgrade(&self.slots);
        let guard = Guard::new();
        // Asks the collector to advance the epoch soon, so that freed slots come back while
        // the table still grows, not only after this thread's next hundred guards.
        guard.accelerate();
        guard.defer_execute(move || {
            if let Some(slots) = slots.upgrade() {
                lock(&slots).take_back(freed);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn slots_fill_each_segment_in_turn() {
        // Every slot in order: each segment filled before the next, whose length grows by a
        // quarter of a power of two; within one, every offset once, and two slots in a row on
        // different cache lines once the segment has more than one.
        let mut slot = 0u64;
        for segment in 0..24 {
            let len = (1usize << (FIRST_SHIFT + segment as u32 / 4)) / 4;
            let mut seen = vec![false; len];
            let mut last_line = None;
            for _ in 0..len {
                let (place, length) = Place::of_slot(slot);
                let (in_segment, offset) = Place::split(place);
                assert_eq!((in_segment, length), (segment, len), "slot {slot}");
                assert!(!std::mem::replace(&mut seen[offset], true), "slot {slot}");
                let line = offset >> CELLS_PER_LINE_BITS;
                if len > 8 {
                    assert_ne!(last_line, Some(line), "slot {slot} on its neighbour's line");
                }
                last_line = Some(line);
                slot += 1;
            }
        }
        assert_eq!(Place::of_slot(0), (0, 8));
        // The last slot: the last offset of the last segment, whose length fills the bits.
        let (last, len) = Place::of_slot(MAX_SLOTS - 1);
        assert_eq!(Place::split(last), (SEGMENTS - 1, (1 << OFFSET_BITS) - 1));
        assert_eq!(len, 1 << OFFSET_BITS);
    }

    #[test]
    fn spread_hands_out_every_offset_once_lines_apart() {
        // Every segment's size: each offset once (checked whole up to 2^16 cells, at its ends
        // and round its lines above), and two in a row in different groups of 8 cells; from
        // 32 cells on, 8 cells apart or more.
        for bits in CELLS_PER_LINE_BITS..=OFFSET_BITS {
            let len = 1u32 << bits;
            let apart = |nth: u32| {
                let (a, b) = (spread(nth, bits), spread(nth + 1, bits));
                assert!(a < len && b < len, "bits {bits}, nth {nth}");
                if bits > CELLS_PER_LINE_BITS {
                    assert_ne!(
                        a / 8,
                        b / 8,
                        "bits {bits}: {nth} at {a}, {} at {b}",
                        nth + 1
                    );
                }
                if bits > CELLS_PER_LINE_BITS + 1 {
                    assert!(
                        a.abs_diff(b) >= 8,
                        "bits {bits}: {nth} at {a}, {} at {b}",
                        nth + 1
                    );
                }
            };
            if bits <= 16 {
                let mut seen = vec![false; len as usize];
                for nth in 0..len {
                    assert!(!std::mem::replace(
                        &mut seen[spread(nth, bits) as usize],
                        true
                    ));
                    if nth + 1 < len {
                        apart(nth);
                    }
                }
            } else {
                let lines = len >> CELLS_PER_LINE_BITS;
                for nth in [0, 1, lines - 1, lines, lines + 1, len - 2] {
                    apart(nth);
                }
                assert_eq!(spread(0, bits), 0);
                assert_eq!(spread(1, bits), 8);
                assert_eq!(spread(lines, bits), 1);
                assert_eq!(spread(len - 1, bits), len - 1);
            }
        }
        // Segments of 8 cells keep their order.
        assert!((0..8).all(|nth| spread(nth, CELLS_PER_LINE_BITS) == nth));
    }

    #[test]
    fn a_full_slab_hands_out_no_place() {
        let slab = Slab::<Word>::new();
        lock(&slab.slots).next = MAX_SLOTS;
        assert!(slab.hold(Word(AtomicU64::new(1))).is_none());
    }

    struct Word(AtomicU64);

    impl Reusable for Word {
        fn blank() -> Self {
            Word(AtomicU64::new(u64::MAX))
        }
        fn reuse(&self, from: Self) {
            self.0
                .store(from.0.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// A slab holding `count` cells, the `v`th holding `v`, and their places.
    fn holding(count: u64) -> (Slab<Word>, Vec<u32>) {
        let slab = Slab::<Word>::new();
        let places = (0..count)
            .map(|v| slab.hold(Word(AtomicU64::new(v))).unwrap())
            .collect();
        (slab, places)
    }

    /// Holds places until one comes back from the first segment (where `holding`'s places
    /// are, so a place given again) that is not in `kept`, and returns it.
    fn next_reused(slab: &Slab<Word>, kept: &[u32]) -> Option<u32> {
        for _ in 0..100_000 {
            drop(Guard::new());
            let handed = slab.hold(Word(AtomicU64::new(300))).unwrap();
            if Place::split(handed).0 == 0 && !kept.contains(&handed) {
                return Some(handed);
            }
        }
        None
    }

    #[test]
    fn a_pinned_place_is_given_again_only_once_its_last_pin_goes() {
        let (slab, places) = holding(8);
        let guard = Guard::new();
        let first = slab.pin(places[3]);
        let second = slab.pin(places[3]);
        drop(guard);
        assert_eq!(first.get().0.load(Ordering::Relaxed), 3);
        slab.release(vec![places[3]]);
        // Past every guard, the place is still pinned: new keys get fresh places.
        for _ in 0..100_000 {
            drop(Guard::new());
            if lock(&slab.slots)
                .pinned
                .get(&places[3])
                .is_some_and(|pins| pins.released)
            {
                break;
            }
        }
        let pins = lock(&slab.slots)
            .pinned
            .get(&places[3])
            .map(|pins| (pins.count, pins.released));
        assert_eq!(pins, Some((2, true)), "released while pinned twice");
        let fresh: Vec<u32> = (0..4)
            .map(|_| slab.hold(Word(AtomicU64::new(200))).unwrap())
            .collect();
        assert!(!fresh.contains(&places[3]), "{fresh:?}");
        assert_eq!(second.get().0.load(Ordering::Relaxed), 3);
        drop(first);
        let held = slab.hold(Word(AtomicU64::new(201))).unwrap();
        assert_ne!(held, places[3], "one pin is left");
        drop(second);
        // The last pin gone, the place is free again and taken by the next key.
        assert_eq!(slab.hold(Word(AtomicU64::new(202))), Some(places[3]));
        assert_eq!(slab.get(&places[3]).0.load(Ordering::Relaxed), 202);
    }

    #[test]
    fn a_pin_dropped_before_the_release_keeps_nothing_back() {
        let (slab, places) = holding(8);
        drop(slab.pin(places[5]));
        slab.release(vec![places[5]]);
        assert_eq!(next_reused(&slab, &places[..5]), Some(places[5]));
        assert!(lock(&slab.slots).pinned.is_empty());
    }

    #[test]
    fn a_pinned_cell_outlives_its_slab() {
        let slab = Slab::<Word>::new();
        let place = slab.hold(Word(AtomicU64::new(7))).unwrap();
        let pinned = slab.pin(place);
        drop(slab);
        assert_eq!(pinned.get().0.load(Ordering::Relaxed), 7);
    }

    #[test]
    fn a_released_slot_is_reused_only_after_the_guards_of_its_time() {
        let slab = Slab::<Word>::new();
        let place = |slot: u64| Place::of_slot(slot).0;
        let first: Vec<u32> = (0..40)
            .map(|v| slab.hold(Word(AtomicU64::new(v))).unwrap())
            .collect();
        assert_eq!(first, (0..40).map(place).collect::<Vec<_>>());
        assert_eq!(slab.get(&place(33)).0.load(Ordering::Relaxed), 33);
        let reader = Guard::new();
        slab.release(vec![place(7)]);
        // A reader from before the release still holds slot 7: it is not handed out again.
        assert_eq!(slab.hold(Word(AtomicU64::new(100))), Some(place(40)));
        assert_eq!(slab.get(&place(7)).0.load(Ordering::Relaxed), 7);
        drop(reader);
        // Once the guards are gone (the collector runs the release after a few epochs), the
        // slot is reused and takes the new state.
        let mut reused = None;
        for _ in 0..100_000 {
            drop(Guard::new());
            let handed = slab.hold(Word(AtomicU64::new(200))).unwrap();
            if handed == place(7) {
                reused = Some(handed);
                break;
            }
        }
        assert_eq!(reused, Some(place(7)));
        assert_eq!(slab.get(&place(7)).0.load(Ordering::Relaxed), 200);
    }
}
