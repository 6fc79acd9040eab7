//! Where a table whose readers take no lock keeps its states: each in a box of its own, or,
//! for the one-word states, in a slab of cells reused in place.
//!
//! Both give a state an address that never moves while a reader may hold it, which is what a
//! lock-free reader needs: the index the reader went through may move its entries, so it
//! holds only what [`Cells::Handle`] says, and the state stays put. The slab saves the
//! allocation per key (and the allocator's overhead with it) for the token bucket and the
//! sliding counter: a freed cell is taken again only once every epoch guard that could have
//! seen it is gone, and is then overwritten with the new key's state before that state is
//! published. The sliding log and the composite own a heap block of words anyway, and a
//! state with its own parameters (a per-key policy) differs in layout from key to key, so
//! those keep one box per key.

use std::ops::DerefMut;
use std::sync::{Arc, OnceLock, PoisonError};

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
/// Segments: four per power of two up to the one `u32::MAX` falls in (`2^32 + 31` lies in
/// the first quarter of `[2^32, 2^33)`).
const SEGMENTS: usize = 4 * (u32::BITS - FIRST_SHIFT) as usize + 1;

/// Cells that never move: segments allocated as the table grows, and the slots free for
/// reuse.
pub(crate) struct Slab<St>(Arc<Segments<St>>);

struct Segments<St> {
    segments: [OnceLock<Box<[St]>>; SEGMENTS],
    /// Slots handed out so far, and the released ones (a cold path: taken to create a key).
    slots: Mutex<Slots>,
}

#[derive(Default)]
struct Slots {
    next: u64,
    free: Vec<u32>,
}

/// The segment of `slot`, its offset in it, and the segment's length.
#[inline(always)]
fn locate(slot: u32) -> (usize, usize, usize) {
    // `at` lies in [2^p, 2^(p+1)) with p >= FIRST_SHIFT; its quarter of that range is the
    // segment.
    let at = u64::from(slot) + (1 << FIRST_SHIFT);
    let p = u64::BITS - 1 - at.leading_zeros();
    let quarter = p - 2;
    let segment = 4 * (p - FIRST_SHIFT) as usize + ((at >> quarter) & 3) as usize;
    let offset = (at & ((1 << quarter) - 1)) as usize;
    (segment, offset, 1 << quarter)
}

impl<St> Segments<St> {
    fn slots(&self) -> impl DerefMut<Target = Slots> + '_ {
        // Each change to `Slots` is one push, pop or increment: a panic cannot leave it torn.
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<St: Reusable> Cells<St> for Slab<St> {
    type Handle = u32;
    type Vacated = u32;

    fn new() -> Self {
        Slab(Arc::new(Segments {
            segments: std::array::from_fn(|_| OnceLock::new()),
            slots: Mutex::new(Slots::default()),
        }))
    }

    #[inline(always)]
    fn get<'a>(&'a self, held: &'a u32) -> &'a St {
        let (segment, offset, _) = locate(*held);
        match self.0.segments[segment].get() {
            Some(cells) => &cells[offset],
            None => unreachable!("slot {held} was handed out, so its segment exists"),
        }
    }

    fn hold(&self, state: St) -> Option<u32> {
        let mut slots = self.0.slots();
        let slot = match slots.free.pop() {
            Some(slot) => slot,
            None => {
                let slot = u32::try_from(slots.next).ok()?;
                slots.next += 1;
                slot
            }
        };
        let (segment, offset, len) = locate(slot);
        let cells =
            self.0.segments[segment].get_or_init(|| (0..len).map(|_| St::blank()).collect());
        cells[offset].reuse(state);
        Some(slot)
    }

    fn freed(held: &u32) -> u32 {
        *held
    }

    fn release(&self, freed: Vec<u32>) {
        if freed.is_empty() {
            return;
        }
        // Called once the slots' entries have left the index. The closure runs after every
        // guard present now is gone, so after every reader that could have found these slots
        // in the index: no request decides on another key's state. Weak: a slab dropped
        // meanwhile (its generation gone) is not kept alive for its free list.
        let segments = Arc::downgrade(&self.0);
        let guard = Guard::new();
        // Asks the collector to advance the epoch soon, so that freed slots come back while
        // the table still grows, not only after this thread's next hundred guards.
        guard.accelerate();
        guard.defer_execute(move || {
            if let Some(segments) = segments.upgrade() {
                segments.slots().free.extend(freed);
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
        // Every slot in order: offsets run through each segment, whose length grows by a
        // quarter of a power of two.
        let mut slot = 0u32;
        for segment in 0..24 {
            let len = (1usize << (FIRST_SHIFT + segment as u32 / 4)) / 4;
            for offset in 0..len {
                assert_eq!(locate(slot), (segment, offset, len), "slot {slot}");
                slot += 1;
            }
        }
        assert_eq!(locate(0), (0, 0, 8));
        assert_eq!(locate(u32::MAX), (SEGMENTS - 1, 31, 1 << 30));
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

    #[test]
    fn a_released_slot_is_reused_only_after_the_guards_of_its_time() {
        let slab = Slab::<Word>::new();
        let first: Vec<u32> = (0..40)
            .map(|v| slab.hold(Word(AtomicU64::new(v))).unwrap())
            .collect();
        assert_eq!(first, (0..40).collect::<Vec<_>>());
        assert_eq!(slab.get(&33).0.load(Ordering::Relaxed), 33);
        let reader = Guard::new();
        slab.release(vec![7]);
        // A reader from before the release still holds slot 7: it is not handed out again.
        assert_eq!(slab.hold(Word(AtomicU64::new(100))), Some(40));
        assert_eq!(slab.get(&7).0.load(Ordering::Relaxed), 7);
        drop(reader);
        // Once the guards are gone (the collector runs the release after a few epochs), the
        // slot is reused and takes the new state.
        let mut reused = None;
        for _ in 0..100_000 {
            drop(Guard::new());
            let slot = slab.hold(Word(AtomicU64::new(200))).unwrap();
            if slot == 7 {
                reused = Some(slot);
                break;
            }
        }
        assert_eq!(reused, Some(7));
        assert_eq!(slab.get(&7).0.load(Ordering::Relaxed), 200);
    }
}
