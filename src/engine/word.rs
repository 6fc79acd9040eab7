//! The retired value of every state word, and the compare-and-swap loop of every state held
//! in one atomic word (the token bucket's TAT, the sliding counter's packed counts).
//!
//! Such a word is the whole state of its key and no other memory is published through it,
//! so every access is `Relaxed`. Exactness comes from the compare-and-swap alone: all writes
//! to one atomic form a single modification order and a CAS succeeds only on the latest
//! value, so two requests never both spend the same permits, and a retiring CAS to
//! [`Retired::RETIRED`] and a request's CAS cannot both succeed from the same value.

use crate::engine::retry::Retry;
use crate::engine::sync::{AtomicU128, AtomicU64, Ordering};

/// The value of a retired state in a word of this width: all ones. A retired state never
/// decides again and is never revived; no live state of any algorithm reaches all ones (each
/// cell says why), and the sequence word of the multi-word states, odd when all ones, is
/// never published there by a writer.
pub(crate) trait Retired: Copy + Eq {
    /// All ones.
    const RETIRED: Self;
}

impl Retired for u64 {
    const RETIRED: u64 = u64::MAX;
}

impl Retired for u128 {
    const RETIRED: u128 = u128::MAX;
}

/// An atomic word holding a whole per-key state.
pub(crate) trait Word {
    /// What the word holds.
    type Value: Retired;

    /// The current value, `Relaxed` (see the module docs).
    fn load(&self) -> Self::Value;

    /// Stores `new` if the word holds `current`, `Relaxed` on both outcomes (see the module
    /// docs): `true` when it did. May fail spuriously: callers loop.
    fn swap_from(&self, current: Self::Value, new: Self::Value) -> bool;
}

impl Word for AtomicU64 {
    type Value = u64;

    #[inline(always)]
    fn load(&self) -> u64 {
        // Relaxed: see the module docs.
        AtomicU64::load(self, Ordering::Relaxed)
    }

    #[inline(always)]
    fn swap_from(&self, current: u64, new: u64) -> bool {
        // Relaxed on both outcomes: the CAS itself is the linearisation point. Weak: every
        // caller loops, and a spurious failure only costs one more step.
        self.compare_exchange_weak(current, new, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }
}

impl Word for AtomicU128 {
    type Value = u128;

    #[inline(always)]
    fn load(&self) -> u128 {
        // Relaxed: see the module docs.
        AtomicU128::load(self, Ordering::Relaxed)
    }

    #[inline(always)]
    fn swap_from(&self, current: u128, new: u128) -> bool {
        // Relaxed on both outcomes: the CAS itself is the linearisation point. Strong: a
        // 128-bit CAS is one `cmpxchg16b` (or `casp`) either way.
        self.compare_exchange(current, new, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }
}

/// What one step of [`update`] concluded from the value it read: the answer, and the value
/// to store in place of the one read, if any. A struct rather than an enum, so the answer
/// sits in one place whichever way the step went and the compiler keeps it in registers
/// (an enum made the token bucket's decision be built in memory before the CAS).
pub(crate) struct Update<V, R> {
    answer: R,
    write: Option<V>,
}

impl<V, R> Update<V, R> {
    /// Write nothing; the answer is `answer`.
    #[inline(always)]
    pub(crate) fn keep(answer: R) -> Self {
        Update {
            answer,
            write: None,
        }
    }

    /// Store `value` in place of the value read; once that succeeds, the answer is `answer`.
    #[inline(always)]
    pub(crate) fn write(value: V, answer: R) -> Self {
        Update {
            answer,
            write: Some(value),
        }
    }
}

/// The word's value, or `None` when the state is retired.
#[inline(always)]
pub(crate) fn live<W: Word>(word: &W) -> Option<W::Value> {
    let value = word.load();
    (value != W::Value::RETIRED).then_some(value)
}

/// The compare-and-swap loop of every one-word cell: reads the word, lets `step` decide from
/// its value, and stores what it asks for by a CAS from exactly that value; when another
/// writer came first, reads the word again and steps from what it holds then. `None` when
/// the word is (or becomes) retired: a retired state never decides.
///
/// After a failed CAS it backs off ([`Retry::spin`]: 1 to 64 spin hints, doubling) before
/// it reads again: two threads on one key otherwise pull the word's cache line from each
/// other on every attempt, and most attempts fail. The read comes after the wait, so the
/// retry decides from the value as it is then, not as it was when the CAS failed: a thread
/// that keeps deciding on the key cannot make every retry of the other fail. Each failure
/// means another writer succeeded; a debug build panics after [`Retry::LIMIT`] of them in
/// a row.
///
/// A stale first read only makes the CAS fail. An answer kept without writing (a refusal,
/// a state not at rest) is the answer as of the moment the value read was current.
#[inline(always)]
pub(crate) fn update<W: Word, R>(
    word: &W,
    step: impl FnMut(W::Value) -> Update<W::Value, R>,
) -> Option<R> {
    update_noting(word, step, || {})
}

/// [`update`], calling `lost` each time a compare-and-swap is lost to another writer: how a
/// limiter notices that a key is contended (`engine::stripes`). The call sits on the retry
/// path only: a decision whose first compare-and-swap succeeds runs exactly as [`update`]'s.
#[inline(always)]
pub(crate) fn update_noting<W: Word, R>(
    word: &W,
    mut step: impl FnMut(W::Value) -> Update<W::Value, R>,
    mut lost: impl FnMut(),
) -> Option<R> {
    let mut value = word.load();
    let mut retry = Retry::new();
    loop {
        if value == W::Value::RETIRED {
            return None;
        }
        let Update { answer, write } = step(value);
        match write {
            None => return Some(answer),
            Some(new) => {
                if word.swap_from(value, new) {
                    return Some(answer);
                }
                // Another writer came first: let its core keep the line a little.
                lost();
                retry.spin();
                value = word.load();
            }
        }
    }
}

/// [`update`] with no retry: [`Once::Lost`] when another writer came first, and then nothing
/// is written. For a caller with another way to decide that counts and backs off (a keyed
/// limiter's thread-local last hit, whose misses take the table's way).
///
/// This is one step of [`update_noting`]'s loop. That loop spells the step out rather than
/// calling a shared one: through a shared step, the direct limiter's decision took 18.5 ns
/// where it takes 11.6 (`examples/hot_path.rs`, two valid runs of each build, alternated).
#[inline(always)]
pub(crate) fn update_once<W: Word, R>(
    word: &W,
    step: impl FnOnce(W::Value) -> Update<W::Value, R>,
) -> Once<R> {
    let value = word.load();
    if value == W::Value::RETIRED {
        return Once::Retired;
    }
    let Update { answer, write } = step(value);
    match write {
        None => Once::Done(answer),
        Some(new) if word.swap_from(value, new) => Once::Done(answer),
        Some(_) => Once::Lost,
    }
}

/// How [`update_once`] ended.
pub(crate) enum Once<R> {
    /// Decided.
    Done(R),
    /// The state is retired.
    Retired,
    /// Another writer came first; nothing was written.
    Lost,
}
