//! The sequence word of the states that span several atomic words (the sliding log's ring,
//! a composite policy's bands): the seqlock of H.-J. Boehm ("Can seqlocks get along with
//! programming language memory models?", MSPC 2012) with a compare-and-swap in place of the
//! writer's lock, and one more value for a state that was retired.
//!
//! | value | meaning |
//! |---|---|
//! | even | the data published by the last writer is complete; readers may read it |
//! | odd, below `u64::MAX` | a writer is between its compare-and-swap and its publishing store |
//! | `u64::MAX` (`u64::RETIRED`, odd) | retired (see `RateState`): never read or written again |
//!
//! Even values only grow (each writer publishes a larger even value than the one it started
//! from, or the same one when it stored nothing), so a sequence read twice with the same value
//! proves no writer's store came in between. The cells own the data and decide what "larger"
//! means (each counts its writes: admissions and settles); this module owns the orderings.
//!
//! A writer holds a [`WriteGuard`] from its entry to its exit, and the guard's drop is the
//! exit: it publishes an even value on every path out of the write section, a panic's
//! unwinding included, so no reader or writer ever waits on a sequence left odd. The value is
//! the one the writer last named (at first the value it entered from, exact while nothing is
//! stored). Each cell names, at every point of its stores, a value under which readers see a
//! state its algorithm accepts (`LogCell`, `CompositeCell`). Putting the old value back over
//! changed data, as crossbeam's `SeqLockWriteGuard::abort` does, would not do: a reader that
//! read some of the new words before the panic would find the sequence unchanged and take
//! its torn read as consistent. No user code runs inside a write section (a request reads
//! its clock before entering).

use crate::engine::retry::Retry;
use crate::engine::sync::{fence, AtomicU64, Ordering};
use crate::engine::word::Retired;

/// How one read section ended.
enum Read<R> {
    /// A consistent snapshot at this even sequence value, and what was read from it.
    Consistent(u64, R),
    /// A writer was inside when the section began.
    Writing,
    /// A writer came in during the section: the reads may be torn.
    Changed,
    /// The state was retired.
    Retired,
}

/// A sequence word; see the module docs.
#[derive(Debug)]
pub(crate) struct SeqLock {
    seq: AtomicU64,
}

impl SeqLock {
    /// A sequence at 0: nothing written yet, readable.
    pub(crate) fn new() -> Self {
        SeqLock {
            seq: AtomicU64::new(0),
        }
    }

    /// One read section: runs `f` with the sequence value it reads under, and says whether
    /// what `f` read was consistent. `f` must read the data with `Relaxed` loads only.
    #[inline]
    fn read<R>(&self, f: impl FnOnce(u64) -> R) -> Read<R> {
        // Acquire: pairs with the Release store that published this value, so every word
        // stored before it is visible to the Relaxed loads in `f`.
        let seq = self.seq.load(Ordering::Acquire);
        if seq == u64::RETIRED {
            return Read::Retired;
        }
        if seq & 1 == 1 {
            return Read::Writing;
        }
        let result = f(seq);
        // Acquire fence: if any load in `f` read a word stored by a writer that came after
        // `seq`, this fence synchronises with that writer's Release fence, which follows its
        // compare-and-swap to an odd value (`try_enter`); the re-load below then sees that
        // value or a later one, never `seq` again (values only grow). So an unchanged sequence
        // proves `f` saw no words but those published by `seq`.
        fence(Ordering::Acquire);
        // Relaxed: ordered after the loads in `f` by the fence above.
        if self.seq.load(Ordering::Relaxed) == seq {
            Read::Consistent(seq, result)
        } else {
            Read::Changed
        }
    }

    /// Reads until a read is consistent: `f`'s result and the even sequence value it was read
    /// at, or `None` once the state is retired. Waits (with backoff) while a writer is inside
    /// its few stores; a torn read is simply repeated. Each attempt calls `f` afresh, so a
    /// clock read inside `f` is taken after the sequence. A debug build panics rather than
    /// wait for ever on a sequence that never reads as complete ([`Retry`]).
    #[inline]
    pub(crate) fn read_consistent<R>(&self, mut f: impl FnMut(u64) -> R) -> Option<(u64, R)> {
        let mut retry = Retry::new();
        loop {
            match self.read(&mut f) {
                Read::Consistent(seq, result) => return Some((seq, result)),
                Read::Retired => return None,
                Read::Writing => retry.snooze(),
                Read::Changed => retry.again(),
            }
        }
    }

    /// The even sequence value at which `holds` was seen true on a consistent read; `None`
    /// when it was false, the state is retired, or a writer is inside (never waits for one:
    /// a state being written is not at rest, which is what the callers ask).
    pub(crate) fn seq_where(&self, mut holds: impl FnMut(u64) -> bool) -> Option<u64> {
        let mut retry = Retry::new();
        loop {
            match self.read(&mut holds) {
                Read::Consistent(seq, holds) => return holds.then_some(seq),
                Read::Retired | Read::Writing => return None,
                // A writer finished meanwhile: look again.
                Read::Changed => retry.again(),
            }
        }
    }

    /// A writer's entry: moves the sequence from the even `seq` its decision was read at to
    /// `seq + 1`. `None` when any writer (or a retirement) came first: decide again.
    /// The caller owns the data until the guard drops, which publishes (see [`WriteGuard`]).
    #[inline]
    pub(crate) fn try_enter(&self, seq: u64) -> Option<WriteGuard<'_>> {
        // Acquire on success: pairs with the Release store that published `seq`, so the
        // caller's stores come after the previous writer's in every word's modification order.
        // Success from exactly `seq` also proves nobody wrote since the consistent read (even
        // values only grow), so the decision made on it still holds. Relaxed on failure: the
        // caller starts over with a fresh Acquire read.
        if self
            .seq
            .compare_exchange(seq, seq + 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return None;
        }
        // Release fence: any reader whose Relaxed load sees one of the caller's stores, and
        // then issues its Acquire fence, synchronises with this fence and so sees the odd
        // sequence (or later) when it re-checks. This is Boehm's writer-side fence.
        fence(Ordering::Release);
        Some(WriteGuard {
            seq: &self.seq,
            next: seq,
        })
    }

    /// Retires the state from the exact even value `seq` a consistent read was taken at;
    /// `false` when a writer came in between.
    pub(crate) fn try_retire(&self, seq: u64) -> bool {
        // Relaxed: success from the exact even value the snapshot was read at proves no
        // writer came in between (a writer first moves the sequence to `seq + 1`), and after
        // the retired value nobody reads or writes the data again, so nothing is published.
        self.seq
            .compare_exchange(seq, u64::RETIRED, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// The current value (tests only: a snapshot, not a read section).
    #[cfg(test)]
    pub(crate) fn value(&self) -> u64 {
        self.seq.load(Ordering::Relaxed)
    }
}

/// A writer's hold on a [`SeqLock`], from [`SeqLock::try_enter`] until it drops. Dropping it
/// is the writer's exit: it publishes the even value last named with
/// [`WriteGuard::publish_at`], at first the value the writer entered from. The drop runs on
/// every path out of the write section, a panic's unwinding included (see the module docs).
#[must_use = "dropping the guard publishes at once"]
pub(crate) struct WriteGuard<'a> {
    seq: &'a AtomicU64,
    /// The even value the drop publishes.
    next: u64,
}

impl WriteGuard<'_> {
    /// Names the value to publish: even, at least the one named before, above the entered
    /// one once any data word was stored (so values only grow), and describing what the data
    /// hold at this point of the writer's stores. The data stores may all be `Relaxed`. Only
    /// the last value named is ever stored.
    #[inline]
    pub(crate) fn publish_at(&mut self, next: u64) {
        // Even, so never the odd retired value.
        debug_assert!(next & 1 == 0 && next >= self.next);
        self.next = next;
    }
}

impl Drop for WriteGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        // Release: publishes the words to every reader whose Acquire load sees this value.
        self.seq.store(self.next, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    /// One read attempt, which never waits: `Some(seq)` when it was consistent at `seq`.
    fn read_once(lock: &SeqLock) -> Option<u64> {
        match lock.read(|_| ()) {
            Read::Consistent(seq, ()) => Some(seq),
            Read::Writing | Read::Changed | Read::Retired => None,
        }
    }

    #[test]
    fn a_writer_that_panics_before_naming_a_value_puts_back_the_one_it_entered_from() {
        let lock = SeqLock::new();
        let written = catch_unwind(AssertUnwindSafe(|| {
            let _guard = lock.try_enter(0).expect("no other writer");
            panic!("a writer panics between its entry and its exit");
        }));
        assert!(written.is_err());
        assert_eq!(
            read_once(&lock),
            Some(0),
            "sequence left at {}",
            lock.value()
        );
    }

    #[test]
    fn a_writer_that_panics_publishes_the_value_it_named() {
        let lock = SeqLock::new();
        let written = catch_unwind(AssertUnwindSafe(|| {
            let mut guard = lock.try_enter(0).expect("no other writer");
            guard.publish_at(2);
            panic!("a writer panics between its entry and its exit");
        }));
        assert!(written.is_err());
        assert_eq!(
            read_once(&lock),
            Some(2),
            "sequence left at {}",
            lock.value()
        );
        // The next writer enters from there; one from the old value is refused.
        assert!(lock.try_enter(0).is_none());
        let mut guard = lock.try_enter(2).expect("no other writer");
        guard.publish_at(4);
        drop(guard);
        assert_eq!(read_once(&lock), Some(4));
    }
}
