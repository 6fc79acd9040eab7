//! The sliding window log: exact, one timestamp per admitted permit.
//!
//! A key may be admitted at most `N` times in any half-open window `(now - W, now]`: an entry
//! exactly `W` old has left. The log keeps the timestamps of the last `N` admitted permits, in
//! admission order; a request of cost `n` is allowed iff `live + n <= N`, and then stamps `n`
//! entries. Only the last `N` entries can matter: with time running forwards at most `N` of
//! them are live at once.
//!
//! | decision | remaining | retry_after | reset_after |
//! |---|---|---|---|
//! | allowed | `N - live - n` | 0 | `W` (the new entries are the newest) |
//! | denied | `N - live` (unchanged) | until the `(live + n - N)`-th oldest live entry leaves | until the newest live entry leaves |
//!
//! Timestamps are kept non-decreasing in ring order, which makes "how many are live" a binary
//! search (`O(log N)` loads): a clock that went backwards stamps new entries with
//! `max(now, newest)`, and an entry later than `now` is decided as if it were stamped `now`,
//! the furthest a valid entry can be, so a retry_after never exceeds `W`.
//!
//! [`Log`] is the pure arithmetic over any time-ordered [`Entries`]; [`LogCell`] owns the
//! ring and serialises its writers with a sequence word (a seqlock).

use crate::clock::Clock;
use crate::decision::Decision;
use crate::engine::cells::Boxed;
use crate::engine::retry::Retry;
use crate::engine::seqlock::SeqLock;
use crate::engine::state::{
    band_stamp, in_use, one_mark, single_from_carry, Carry, RateState, Verdict,
};
use crate::engine::sync::{AtomicU64, Ordering};
use crate::policy::{Band, Policy};
use crate::reservation::Marks;

/// A read-only view of a log: its entries oldest first, in non-decreasing time order.
pub(crate) trait Entries {
    /// How many entries there are (at most the policy's permits).
    fn count(&self) -> u64;
    /// The `i`-th entry, oldest first (`i < count()`).
    fn get(&self, i: u64) -> u64;
}

/// Sliding log parameters derived from a policy, and the pure decision function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Log {
    /// N, the policy's permits: the ring's length. At most `Policy::MAX_LOG_PERMITS`.
    limit: u64,
    /// W in nanoseconds: at least 1, at most 2^62.
    window: u64,
}

impl Log {
    /// Parameters for `band` (any algorithm; only permits and window are read).
    pub(crate) fn new(band: Band) -> Self {
        Log {
            limit: band.permits(),
            window: band.window_nanos(),
        }
    }

    /// How long ago `entry` was stamped, as seen at `now`: an entry in the future (the clock
    /// went backwards) counts as stamped `now`.
    #[inline]
    fn age(entry: u64, now: u64) -> u64 {
        now - entry.min(now)
    }

    /// Decides a request of `cost` (1..=limit) at `now` against `entries`.
    ///
    /// `entries` may come from a torn read of a ring being written: the result is then
    /// garbage that the caller discards, but this never panics or loops: every index it
    /// reads stays below `entries.count() <= limit`, and no subtraction can underflow.
    #[inline]
    pub(crate) fn decide<E: Entries + ?Sized>(
        &self,
        entries: &E,
        now: u64,
        cost: u64,
    ) -> Verdict<u64> {
        let len = entries.count().min(self.limit);
        let lo = self.first_live(entries, len, now);
        let live = len - lo;
        if live + cost <= self.limit {
            // Keep the ring time-ordered even when the clock went backwards.
            let stamp = match len {
                0 => now,
                _ => entries.get(len - 1).max(now),
            };
            let remaining = self.limit - live - cost;
            // The newest entry is now one of ours, decided as stamped `now`.
            Verdict::Allow(Decision::allow(remaining, self.limit, self.window), stamp)
        } else {
            // `cost <= limit` makes 1 <= leave <= live: the entry that must leave for the
            // request to fit is live, and so is the newest one, so their ages are below W
            // (saturating only guards a torn read, which may load a slot twice and differ).
            let leave = live + cost.min(self.limit) - self.limit;
            let retry = self
                .window
                .saturating_sub(Self::age(entries.get(lo + leave - 1), now));
            let reset = self
                .window
                .saturating_sub(Self::age(entries.get(len - 1), now));
            Verdict::Deny(Decision::deny(self.limit - live, self.limit, retry, reset))
        }
    }

    /// The position of the first of the `len` first `entries` still live at `now` (`len`
    /// when none is): liveness is monotone in ring order because the entries are.
    #[inline]
    fn first_live<E: Entries + ?Sized>(&self, entries: &E, len: u64, now: u64) -> u64 {
        Self::partition(len, |entry| {
            Self::age(entries.get(entry), now) >= self.window
        })
    }

    /// The first position in `0..len` where `before` is false, for a `before` that holds on a
    /// prefix (a binary search, `O(log len)`).
    #[inline]
    fn partition(len: u64, before: impl Fn(u64) -> bool) -> u64 {
        let (mut lo, mut hi) = (0, len);
        // Each look at least halves `hi - lo`, so 64 looks end any search. The bound turns a
        // broken search into a wrong answer, which every test of the log then sees, instead
        // of a loop that never ends.
        for _ in 0..u64::BITS {
            if lo >= hi {
                break;
            }
            let mid = lo + (hi - lo) / 2;
            if before(mid) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// What settling, at `now`, an admission of `held` permits stamped `mark` does to
    /// `entries`, when it really cost `actual`.
    ///
    /// A refund of `k` removes `k` of the entries stamped `mark`, as if they had never been
    /// admitted: only entries still in the ring and still live (gone ones no longer count),
    /// so never more than the admission left. A charge of `k` more appends `k` entries at
    /// `max(now, newest)`, but no more than the log has room for: it saturates at `N` live
    /// entries, the most the exact window can hold.
    pub(crate) fn settle<E: Entries + ?Sized>(
        &self,
        entries: &E,
        held: u64,
        mark: u64,
        actual: u64,
        now: u64,
    ) -> Fix {
        let len = entries.count().min(self.limit);
        if actual <= held {
            if len == 0 || Self::age(mark, now) >= self.window {
                return Fix::Keep;
            }
            // The run of entries stamped `mark`: contiguous, as the entries are ordered.
            let first = Self::partition(len, |i| entries.get(i) < mark);
            let end = Self::partition(len, |i| entries.get(i) <= mark);
            let take = (held - actual).min(end.saturating_sub(first));
            if take == 0 {
                return Fix::Keep;
            }
            Fix::Remove {
                at: end - take,
                take,
                filler: entries.get(0).min(now.saturating_sub(self.window)),
            }
        } else {
            let live = len - self.first_live(entries, len, now);
            let cost = (actual - held).min(self.limit - live);
            if cost == 0 {
                return Fix::Keep;
            }
            let stamp = match len {
                0 => now,
                _ => entries.get(len - 1).max(now),
            };
            Fix::Append { cost, stamp }
        }
    }

    /// Nanoseconds until `entries` are at rest, seen at `now` with nothing more admitted:
    /// until the newest live entry leaves, or 0. What a refusal at `now` reports as its
    /// reset_after; the composite policy reports it for a band that would allow.
    #[inline]
    pub(crate) fn reset_after<E: Entries + ?Sized>(&self, entries: &E, now: u64) -> u64 {
        match entries.count().min(self.limit) {
            0 => 0,
            len => self
                .window
                .saturating_sub(Self::age(entries.get(len - 1), now)),
        }
    }

    /// The permits `entries` have in use at `now`.
    fn carry<E: Entries + ?Sized>(&self, entries: &E, now: u64) -> Carry {
        let probe = self.decide(entries, now, 1).decision();
        Carry::single(self.window, in_use(self.limit, &probe))
    }

    /// `true` when `entries` decide exactly as an empty log from `now` on: no entry, or the
    /// newest one at least `W` old.
    #[inline]
    pub(crate) fn is_at_rest<E: Entries + ?Sized>(&self, entries: &E, now: u64) -> bool {
        match entries.count() {
            0 => true,
            len => {
                let newest = entries.get(len - 1);
                newest <= now && now - newest >= self.window
            }
        }
    }
}

/// The last `min(written, N)` entries of a ring, read with `Relaxed` loads inside a seqlock
/// read section: a sliding log's, alone ([`LogCell`]) or as a band of a composite policy.
pub(crate) struct Ring<'a> {
    slots: &'a [AtomicU64],
    /// `min(written, N)`, where `written` counts the entries ever written (less those a
    /// settle gave back).
    count: u64,
    /// The slot of the oldest of those entries.
    oldest: u64,
}

impl<'a> Ring<'a> {
    /// The view of `slots` after `written` entries. Any `written` gives a view whose indices
    /// stay in the ring, so a torn read of the count is harmless (and discarded).
    #[inline]
    pub(crate) fn new(slots: &'a [AtomicU64], written: u64) -> Self {
        let count = written.min(slots.len() as u64);
        Ring {
            slots,
            count,
            oldest: (written - count) % slots.len() as u64,
        }
    }
}

/// The slot `i` places after slot `first` in a ring of `slots`, wrapping around; `first` and
/// `i` are below the ring's length.
#[inline]
fn slot(slots: &[AtomicU64], first: u64, i: u64) -> &AtomicU64 {
    let len = slots.len() as u64;
    // first < len and i < len, so the sum is below 2 * len and one subtraction wraps it.
    let mut index = first + i;
    if index >= len {
        index -= len;
    }
    &slots[index as usize]
}

/// The slots of the entries after the first `written` of a ring of `slots` (entry `j` lives in
/// slot `j mod N`), in entry order from entry `written`, each slot once. A ring keeps only the
/// last N entries and an admission stamps all its entries alike, so storing at most N of them
/// from there leaves every kept entry right for any cost; no index can leave the ring.
#[inline]
pub(crate) fn slots_after(slots: &[AtomicU64], written: u64) -> impl Iterator<Item = &AtomicU64> {
    // `written % N < N`: the split is inside the ring.
    let (older, from_first) = slots.split_at((written % slots.len() as u64) as usize);
    from_first.iter().chain(older)
}

impl Entries for Ring<'_> {
    #[inline]
    fn count(&self) -> u64 {
        self.count
    }

    #[inline]
    fn get(&self, i: u64) -> u64 {
        // Relaxed: a load inside a seqlock read section. The section's initial Acquire load
        // of the sequence makes every entry published before it visible, and the validation
        // after it (Acquire fence, then re-reading the sequence) discards any result that
        // read a writer's entry: see `SeqLock::read`.
        slot(self.slots, self.oldest, i).load(Ordering::Relaxed)
    }
}

/// A sliding log's words: the count of entries ever written, then the ring of its last `N`
/// entries (entry `j` in slot `j mod N`). A [`LogCell`]'s whole array, or a band of a
/// composite state's.
#[derive(Clone, Copy)]
pub(crate) struct LogWords<'a> {
    written: &'a AtomicU64,
    slots: &'a [AtomicU64],
}

impl<'a> LogWords<'a> {
    /// The log in `words`: `words[0]` counts the entries, the rest is the ring (at least
    /// one slot).
    #[inline]
    pub(crate) fn new(words: &'a [AtomicU64]) -> Self {
        let (written, slots) = words.split_first().expect("a log has its count word");
        LogWords { written, slots }
    }

    /// The entries and how many were ever written, read with `Relaxed` loads inside a
    /// seqlock read section (validated afterwards: see `SeqLock::read`).
    #[inline]
    pub(crate) fn view(self) -> (Ring<'a>, u64) {
        let written = self.written.load(Ordering::Relaxed);
        (Ring::new(self.slots, written), written)
    }

    /// Stores `cost` entries holding `stamp` after the `written` the log held, then their
    /// count. Called by a writer inside its write section, with `Relaxed` stores: ordered
    /// for readers by the writer's fence on entry and its Release publication on exit, and
    /// after the previous writer's stores because the entry read the sequence value that
    /// writer published with Release.
    ///
    /// The entries go first and their count last, so every prefix of the stores leaves a
    /// log that admits no more than before (see `CompositeCell` for why), which is what a
    /// panic part-way publishes. A cost above N stores each slot once (see [`slots_after`]).
    #[inline]
    pub(crate) fn append(self, written: u64, cost: u64, stamp: u64) {
        for (slot, _) in slots_after(self.slots, written).zip(0..cost) {
            slot.store(stamp, Ordering::Relaxed);
        }
        self.written.store(written + cost, Ordering::Relaxed);
    }

    /// Stores what a settle decided on the log that held `written` entries: its entries after
    /// removing some, or a charge appended. The same write section as [`LogWords::append`];
    /// every index is inside the ring, so nothing here can panic part-way.
    pub(crate) fn apply(self, written: u64, fix: Fix) {
        match fix {
            Fix::Keep => {}
            Fix::Append { cost, stamp } => self.append(written, cost, stamp),
            Fix::Remove { at, take, filler } => {
                let ring = Ring::new(self.slots, written);
                let count = ring.count;
                // Relaxed: the write section's, as in `append`.
                let at_position = |i: u64| slot(self.slots, ring.oldest, i);
                // The entries after the removed ones move down by `take`, oldest first.
                for i in at..count - take {
                    let moved = at_position(i + take).load(Ordering::Relaxed);
                    at_position(i).store(moved, Ordering::Relaxed);
                }
                // The slots left free become the oldest entries of a full ring (see `Fix`).
                for i in count - take..count {
                    at_position(i).store(filler, Ordering::Relaxed);
                }
                self.written.store(written - take, Ordering::Relaxed);
            }
        }
    }
}

/// What settling a reservation does to a log (see [`Log::settle`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fix {
    /// Nothing to change.
    Keep,
    /// Remove `take` entries starting at position `at` (oldest first): the later entries move
    /// down and the count drops by `take`. When more than `N` entries were ever written, the
    /// view then reaches back over `take` slots that held long-gone entries (they were
    /// overwritten only once they had left the window); they get `filler`, no later than the
    /// oldest entry kept and at least `W` before now, so they still count as gone.
    Remove {
        /// The position of the first entry removed.
        at: u64,
        /// How many.
        take: u64,
        /// What the slots reaching back hold.
        filler: u64,
    },
    /// Append `cost` entries holding `stamp`: a charge.
    Append {
        /// How many entries.
        cost: u64,
        /// Their timestamp.
        stamp: u64,
    },
}

/// One key's sliding log: a sequence word, then the count of entries ever written and the
/// ring of the last `N` entries' timestamps.
///
/// | field | holds |
/// |---|---|
/// | `seq` even | published, no writer inside; it grows by 2 with each write |
/// | `seq` odd | a writer is storing; readers wait |
/// | `seq == u64::MAX` | retired: never admits, never revived |
/// | `words[0]` | `written`: entries ever written, less those a settle gave back |
/// | `words[1 ..= N]` | the ring: entry `j` in slot `j mod N`; the last `min(written, N)` are valid, non-decreasing oldest to newest |
///
/// Slots not yet written hold 0 and are never read: `written` says how many are valid.
/// Memory per key: 24 bytes in the cell (the 8-byte sequence word, then the array's pointer
/// and length) plus `8 * (N + 1)` bytes on the heap. The sequence word counts writes, not
/// entries, because a settle may remove entries: a count that went back would let a reader
/// or writer that read before mistake a changed log for the one it read.
///
/// Protocol (the seqlock of H.-J. Boehm, "Can seqlocks get along with programming language
/// memory models?", MSPC 2012, with a compare-and-swap in place of the writer's lock; the
/// orderings are in [`SeqLock`], shared with the composite state, whose sliding log bands
/// use these same words through [`LogWords`]):
///
/// * A reader loads `seq` (Acquire), waits while it is odd, reads the count and the entries
///   it needs with `Relaxed` loads, issues an Acquire fence and re-loads `seq` (Relaxed). If
///   it changed, the reads may be torn and it starts over.
/// * A request reads the clock once, then decides as such a reader; a refusal returns
///   without writing anything.
/// * An admission then compare-and-swaps `seq` from the exact even value `s` it read to
///   `s + 1`; failure means another writer got there first, so it reads and decides again
///   (with the same clock reading). It issues a Release fence, stores its `n` entries and
///   then the count (Relaxed), and publishes `s + 2` with a Release store.
/// * That store is the drop of the writer's guard ([`WriteGuard`](crate::engine::seqlock::WriteGuard)), so it happens on every
///   path out of the write section, a panic's unwinding included; the guard names `s + 2`
///   before the first store, and every prefix of the stores admits no more than the log at
///   `s` ([`LogWords::append`]). Readers never wait on a sequence left odd.
/// * A settle is a writer like an admission: it decides on a consistent read
///   ([`Log::settle`]) and stores the result from exactly the value it read.
/// * Retiring at rest (`try_retire`, the registry's eviction step: its readers take no
///   lock) reads like a reader, checks the
///   log is at rest, and compare-and-swaps the even value it read to `RETIRED`: any write
///   in between moved `seq` on and makes it fail.
///
/// Keys never wait on each other, and a reader of one key waits only for a writer that is
/// inside its few stores.
#[derive(Debug)]
pub(crate) struct LogCell {
    seq: SeqLock,
    words: Box<[AtomicU64]>,
}

impl LogCell {
    /// The log's words.
    #[inline]
    fn log(&self) -> LogWords<'_> {
        LogWords::new(&self.words)
    }

    /// Decides on a consistent read of the log, then, if `decide` asks for a write, stores
    /// it from exactly the sequence value read, or reads and decides again when another
    /// writer came first. `None` when the state was retired.
    ///
    /// `store` makes the write: an admission's append, or a settle's [`Fix`].
    #[inline]
    fn write_with<R, W>(
        &self,
        mut decide: impl FnMut(&Ring<'_>) -> (R, Option<W>),
        store: impl FnOnce(LogWords<'_>, u64, W),
    ) -> Option<R> {
        let mut retry = Retry::new();
        loop {
            let (seq, (answer, fix, written)) = self.seq.read_consistent(|_| {
                let (ring, written) = self.log().view();
                let (answer, fix) = decide(&ring);
                (answer, fix, written)
            })?;
            let Some(write) = fix else {
                return Some(answer);
            };
            if let Some(mut guard) = self.seq.try_enter(seq) {
                // Named before the first store (see the type's docs). `seq + 2` stays even,
                // so it never meets the odd retired value.
                guard.publish_at(seq + 2);
                store(self.log(), written, write);
                return Some(answer);
            }
            // Another writer came first.
            retry.again();
        }
    }

    /// The even sequence value at which the log was seen at rest at `now`; `None` when it is
    /// not at rest, retired, or a writer is inside (an admission in flight: not at rest).
    fn at_rest_seq(&self, log: &Log, now: u64) -> Option<u64> {
        self.seq
            .seq_where(|_| log.is_at_rest(&self.log().view().0, now))
    }

    /// Reads the log consistently: `f` of its entries, and the sequence value read at.
    fn read<R>(&self, mut f: impl FnMut(&Ring<'_>) -> R) -> Option<(u64, R)> {
        self.seq.read_consistent(|_| f(&self.log().view().0))
    }
}

impl RateState for LogCell {
    type Cells = Boxed;
    type Params = Log;
    type OwnParams = Log;

    fn params(policy: &Policy) -> Log {
        Log::new(policy.first_band())
    }

    fn max_cost(log: &Log) -> u64 {
        log.limit
    }

    fn stamp(log: &Log) -> u64 {
        band_stamp(3, log.limit, log.window)
    }

    fn fresh(log: &Log) -> Self {
        LogCell {
            seq: SeqLock::new(),
            words: (0..=log.limit).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    #[inline]
    fn reserve<C: Clock + ?Sized>(
        &self,
        log: &Log,
        clock: &C,
        cost: u64,
    ) -> Option<(Decision, Marks)> {
        // The clock is read once, before the sequence, as in the token bucket: a clock read
        // inside each attempt widened the window in which another writer makes our entry
        // fail. A `now` older than entries another writer just stamped is decided as a clock
        // that went backwards (those entries count as stamped `now`, ours is stamped with the
        // newest), which keeps them all live: it can only refuse more, never admit more.
        let now = clock.now();
        self.write_with(
            |ring| match log.decide(ring, now, cost) {
                Verdict::Deny(decision) => ((decision, 0), None),
                Verdict::Allow(decision, stamp) => ((decision, stamp), Some(stamp)),
            },
            |words, written, stamp| words.append(written, cost, stamp),
        )
        .map(|(decision, stamp)| (decision, one_mark(stamp)))
    }

    fn settle(&self, log: &Log, held: u64, marks: &Marks, actual: u64, now: u64) -> Option<()> {
        self.write_with(
            |ring| match log.settle(ring, held, marks[0], actual, now) {
                Fix::Keep => ((), None),
                fix => ((), Some(fix)),
            },
            |words, written, fix| words.apply(written, fix),
        )
    }

    fn peek<C: Clock + ?Sized>(&self, log: &Log, clock: &C, cost: u64) -> Option<Decision> {
        // The same consistent read as `try_acquire`, and nothing written.
        let (_, verdict) = self.read(|ring| log.decide(ring, clock.now(), cost))?;
        Some(verdict.decision())
    }

    fn is_at_rest(&self, log: &Log, now: u64) -> bool {
        self.at_rest_seq(log, now).is_some()
    }

    fn carry(&self, log: &Log, now: u64) -> Option<Carry> {
        self.read(|ring| log.carry(ring, now))
            .map(|(_, carry)| carry)
    }

    fn retire_with_carry(&self, log: &Log, now: u64) -> Option<Carry> {
        let mut retry = Retry::new();
        loop {
            let (seq, carry) = self.read(|ring| log.carry(ring, now))?;
            // Retired from exactly the snapshot counted, or read again.
            if self.seq.try_retire(seq) {
                return Some(carry);
            }
            retry.again();
        }
    }

    fn from_carry(log: &Log, carry: &Carry, now: u64) -> Self {
        single_from_carry(log, log.window, log.limit, carry, now)
    }

    fn try_retire(&self, log: &Log, now: u64) -> bool {
        let Some(seq) = self.at_rest_seq(log, now) else {
            return false;
        };
        self.seq.try_retire(seq)
    }
}

#[cfg(test)]
mod tests;
