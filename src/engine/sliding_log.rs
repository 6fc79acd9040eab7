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
use crate::engine::seqlock::{SeqLock, WriteGuard};
use crate::engine::state::{in_use, single_from_carry, Carry, RateState, Verdict};
use crate::engine::sync::{AtomicU64, Ordering};
use crate::policy::{Band, Policy};

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
        // The first live entry: liveness is monotone in ring order because the entries are.
        let (mut lo, mut hi) = (0, len);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if Self::age(entries.get(mid), now) >= self.window {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
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
    /// `min(written, N)`, where `written` counts the entries ever written.
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

/// One key's sliding log: a sequence word and a ring of the last `N` entries' timestamps.
///
/// | field | holds |
/// |---|---|
/// | `seq` even `2k` | published, no writer inside: `k` entries were ever written; the last `min(k, N)` of them are in the ring, entry `j` in slot `j mod N` |
/// | `seq` odd `2k + 1` | a writer is appending entries after the first `k`; readers wait |
/// | `seq == u64::MAX` | retired: never admits, never revived |
/// | `ring[j]` | a timestamp (ns on the limiter's clock); non-decreasing from the oldest entry to the newest |
///
/// Slots not yet written hold 0 and are never read: the sequence says how many are valid.
/// Memory per key: 24 bytes in the cell (the 8-byte sequence word, then the ring's pointer
/// and length) plus `8 * N` bytes on the heap.
///
/// Protocol (the seqlock of H.-J. Boehm, "Can seqlocks get along with programming language
/// memory models?", MSPC 2012, with a compare-and-swap in place of the writer's lock; the
/// orderings are in [`SeqLock`], shared with the composite state):
///
/// * A reader loads `seq` (Acquire), waits while it is odd, reads what it needs with
///   `Relaxed` loads, issues an Acquire fence and re-loads `seq` (Relaxed). If it changed,
///   the reads may be torn and it starts over.
/// * A request reads the clock once, then decides as such a reader; a refusal returns
///   without writing anything.
/// * An admission then compare-and-swaps `seq` from the exact even value `2k` it read to
///   `2k + 1`; failure means another writer got there first, so it reads and decides again
///   (with the same clock reading). It issues a Release fence, stores its `n` entries
///   (Relaxed), and publishes `2(k + n)` with a Release store.
/// * That store is the drop of the writer's guard ([`WriteGuard`]), so it happens on every
///   path out of the write section, a panic's unwinding included. Until the last entry is
///   stored the guard counts only the entries stored so far, all holding the new stamp, so
///   even a panic part-way publishes a log: the request's admission of fewer entries, which
///   the policy allowed. Readers never wait on a sequence left odd.
/// * Retiring at rest (`try_retire`, the eviction step for a map whose readers take no lock;
///   the registry's bucket locks make it unnecessary there) reads like a reader, checks the
///   log is at rest, and compare-and-swaps the even value it read to `RETIRED`: any admission
///   in between moved `seq` on and makes it fail.
///
/// Keys never wait on each other, and a reader of one key waits only for a writer that is
/// inside its few stores.
#[derive(Debug)]
pub(crate) struct LogCell {
    seq: SeqLock,
    ring: Box<[AtomicU64]>,
}

impl LogCell {
    /// The ring as published at the even sequence value `seq` (which counts entries twice).
    fn ring(&self, seq: u64) -> Ring<'_> {
        Ring::new(&self.ring, seq / 2)
    }

    /// The writer's side, holding the `guard` that [`SeqLock::try_enter`] gave from
    /// `2 * written`: entries `written..written + cost` get `stamp`, and the guard's drop
    /// publishes them.
    ///
    /// After each store the guard names the count of entries the ring then holds, `written +
    /// k` with the `k` new ones all `stamp`: the log an admission of cost `k` at `stamp`
    /// leaves, so a panic at any point publishes a log, never a count over stale slots. A
    /// cost above N stores each slot once (see [`slots_after`]).
    #[inline]
    fn append(&self, mut guard: WriteGuard<'_>, written: u64, cost: u64, stamp: u64) {
        for (slot, k) in slots_after(&self.ring, written).zip(1..=cost) {
            // Relaxed: ordered for readers by the fence in `try_enter` and the Release store
            // of the guard's drop; ordered after the previous writer's stores because our
            // entry read the sequence value that writer published with Release.
            slot.store(stamp, Ordering::Relaxed);
            guard.publish_at(2 * (written + k));
        }
        guard.publish_at(2 * (written + cost));
    }

    /// The even sequence value at which the log was seen at rest at `now`; `None` when it is
    /// not at rest, retired, or a writer is inside (an admission in flight: not at rest).
    fn at_rest_seq(&self, log: &Log, now: u64) -> Option<u64> {
        self.seq
            .seq_where(|seq| log.is_at_rest(&self.ring(seq), now))
    }
}

impl RateState for LogCell {
    type Params = Log;
    type Kept = Log;

    fn params(policy: &Policy) -> Log {
        Log::new(policy.first_band())
    }

    fn max_cost(log: &Log) -> u64 {
        log.limit
    }

    fn fresh(log: &Log) -> Self {
        LogCell {
            seq: SeqLock::new(),
            ring: (0..log.limit).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    #[inline]
    fn try_acquire<C: Clock + ?Sized>(&self, log: &Log, clock: &C, cost: u64) -> Option<Decision> {
        // The clock is read once, before the sequence, as in the token bucket: a clock read
        // inside each attempt widened the window in which another writer makes our entry
        // fail. A `now` older than entries another writer just stamped is decided as a clock
        // that went backwards (those entries count as stamped `now`, ours is stamped with the
        // newest), which keeps them all live: it can only refuse more, never admit more.
        let now = clock.now();
        loop {
            let (seq, verdict) = self
                .seq
                .read_consistent(|seq| log.decide(&self.ring(seq), now, cost))?;
            match verdict {
                Verdict::Deny(decision) => return Some(decision),
                Verdict::Allow(decision, stamp) => {
                    if let Some(guard) = self.seq.try_enter(seq) {
                        self.append(guard, seq / 2, cost, stamp);
                        return Some(decision);
                    }
                }
            }
        }
    }

    fn peek<C: Clock + ?Sized>(&self, log: &Log, clock: &C, cost: u64) -> Option<Decision> {
        // The same consistent read as `try_acquire`, and nothing written.
        let (_, verdict) = self
            .seq
            .read_consistent(|seq| log.decide(&self.ring(seq), clock.now(), cost))?;
        Some(verdict.decision())
    }

    fn is_at_rest(&self, log: &Log, now: u64) -> bool {
        self.at_rest_seq(log, now).is_some()
    }

    fn carry(&self, log: &Log, now: u64) -> Option<Carry> {
        self.seq
            .read_consistent(|seq| log.carry(&self.ring(seq), now))
            .map(|(_, carry)| carry)
    }

    fn retire_with_carry(&self, log: &Log, now: u64) -> Option<Carry> {
        loop {
            let (seq, carry) = self
                .seq
                .read_consistent(|seq| log.carry(&self.ring(seq), now))?;
            // Retired from exactly the snapshot counted, or read again.
            if self.seq.try_retire(seq) {
                return Some(carry);
            }
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
mod tests {
    use super::*;
    use crate::policy::Algorithm;
    use std::time::Duration;

    const MS: u64 = 1_000_000;

    impl Entries for [u64] {
        fn count(&self) -> u64 {
            self.len() as u64
        }

        fn get(&self, i: u64) -> u64 {
            self[i as usize]
        }
    }

    /// The pure arithmetic driving a plain vector of the last N entries.
    struct Sim {
        log: Log,
        entries: Vec<u64>,
    }

    impl Sim {
        fn new(permits: u64, window: u64) -> Self {
            let policy = Policy::new(Algorithm::SlidingLog, permits, Duration::from_nanos(window));
            Sim {
                log: Log::new(policy.unwrap().first_band()),
                entries: Vec::new(),
            }
        }

        fn decide(&mut self, now: u64, cost: u64) -> Verdict<u64> {
            let verdict = self.log.decide(&self.entries[..], now, cost);
            if let Verdict::Allow(_, stamp) = verdict {
                self.entries.extend((0..cost).map(|_| stamp));
                let excess = self.entries.len().saturating_sub(self.log.limit as usize);
                self.entries.drain(..excess);
            }
            verdict
        }

        /// Expects an admission; returns its decision's remaining permits.
        #[track_caller]
        fn allowed(&mut self, now: u64, cost: u64) -> u64 {
            match self.decide(now, cost) {
                Verdict::Allow(d, _) => {
                    assert_eq!(d.reset_after().as_nanos(), u128::from(self.log.window));
                    d.remaining()
                }
                Verdict::Deny(d) => panic!("expected an admission at {now}, got {d:?}"),
            }
        }

        #[track_caller]
        fn denied(&mut self, now: u64, cost: u64) -> Decision {
            match self.decide(now, cost) {
                Verdict::Deny(d) => d,
                Verdict::Allow(d, _) => panic!("expected a refusal at {now}, got {d:?}"),
            }
        }
    }

    #[test]
    fn reference_trace() {
        let mut sim = Sim::new(3, 1000 * MS);
        for (t, remaining) in [(0, 2), (400, 1), (800, 0)] {
            assert_eq!(sim.allowed(t * MS, 1), remaining);
        }
        let d = sim.denied(900 * MS, 1);
        assert_eq!(d.retry_after(), Duration::from_millis(100));
        assert_eq!(d.reset_after(), Duration::from_millis(900));
        assert_eq!(d.remaining(), 0);
        assert_eq!(sim.allowed(1000 * MS, 1), 0);
        let d = sim.denied(1050 * MS, 1);
        assert_eq!(d.retry_after(), Duration::from_millis(350));
        assert_eq!(d.reset_after(), Duration::from_millis(950));
    }

    #[test]
    fn an_entry_exactly_one_window_old_has_left() {
        let mut sim = Sim::new(1, 10);
        sim.allowed(5, 1);
        assert_eq!(sim.denied(14, 1).retry_after(), Duration::from_nanos(1));
        assert!(!sim.log.is_at_rest(&sim.entries[..], 14));
        assert!(sim.log.is_at_rest(&sim.entries[..], 15));
        sim.allowed(15, 1);
    }

    #[test]
    fn cost_waits_for_enough_entries_to_leave() {
        let mut sim = Sim::new(5, 100);
        sim.allowed(0, 2);
        sim.allowed(10, 1);
        assert_eq!(sim.allowed(20, 1), 1);
        // Live: 0, 0, 10, 20. Cost 3 needs two to leave: both stamped 0.
        let d = sim.denied(30, 3);
        assert_eq!(d.remaining(), 1);
        assert_eq!(d.retry_after(), Duration::from_nanos(70));
        assert_eq!(d.reset_after(), Duration::from_nanos(90));
        // Cost 4 needs three to leave: the third is stamped 10.
        assert_eq!(sim.denied(30, 4).retry_after(), Duration::from_nanos(80));
        assert_eq!(sim.allowed(100, 3), 0);
        // A full-cost request waits for the newest entry.
        assert_eq!(sim.denied(100, 5).retry_after(), Duration::from_nanos(100));
    }

    #[test]
    fn window_of_one_nanosecond() {
        let mut sim = Sim::new(1, 1);
        sim.allowed(7, 1);
        let d = sim.denied(7, 1);
        assert_eq!(
            (d.retry_after(), d.reset_after()),
            (Duration::from_nanos(1), Duration::from_nanos(1))
        );
        sim.allowed(8, 1);
        assert!(sim.log.is_at_rest(&sim.entries[..], 9));
    }

    #[test]
    fn backwards_clock_keeps_entries_ordered_and_retry_within_the_window() {
        let mut sim = Sim::new(3, 1000);
        sim.allowed(5000, 1);
        // The clock jumps back: the new entry is stamped with the newest, not with now.
        sim.allowed(100, 1);
        assert_eq!(sim.entries, [5000, 5000]);
        assert_eq!(sim.allowed(200, 1), 0);
        // Future entries count as stamped now: live, and leaving one window from now.
        let d = sim.denied(300, 1);
        assert_eq!(d.retry_after(), Duration::from_nanos(1000));
        assert_eq!(d.reset_after(), Duration::from_nanos(1000));
        assert!(!sim.log.is_at_rest(&sim.entries[..], 300));
        // Once the clock is past them again, they age normally.
        assert_eq!(sim.denied(5500, 1).retry_after(), Duration::from_nanos(500));
        assert_eq!(sim.allowed(6000, 3), 0);
    }

    #[test]
    fn binary_search_over_a_large_ring() {
        let n = Policy::MAX_LOG_PERMITS;
        let policy = Policy::new(Algorithm::SlidingLog, n, Duration::from_nanos(n)).unwrap();
        let log = Log::new(policy.first_band());
        let entries: Vec<u64> = (0..n).collect();
        // At now = n + k, entries 0..=k have left.
        for k in [0, 1, 100, n / 2, n - 2] {
            match log.decide(&entries[..], n + k, 1) {
                Verdict::Allow(d, stamp) => {
                    assert_eq!(d.remaining(), k);
                    assert_eq!(stamp, n + k);
                }
                Verdict::Deny(d) => panic!("{k}: {d:?}"),
            }
        }
        match log.decide(&entries[..], n - 1, 2) {
            Verdict::Deny(d) => {
                assert_eq!(d.remaining(), 0);
                assert_eq!(d.retry_after(), Duration::from_nanos(2));
            }
            Verdict::Allow(d, _) => panic!("{d:?}"),
        }
    }

    #[test]
    fn extreme_clock_readings_do_not_overflow() {
        let mut sim = Sim::new(2, 1 << 62);
        sim.allowed(u64::MAX - 1, 2);
        let d = sim.denied(0, 1);
        assert_eq!(d.retry_after(), Duration::from_nanos(1 << 62));
    }

    #[test]
    #[cfg(not(tollgate_loom))]
    fn memory_per_key_is_as_documented() {
        assert_eq!(std::mem::size_of::<LogCell>(), 24);
        // The ring itself is 8 * N bytes on the heap.
    }

    /// Enters the cell's sequence from its current value, as an admission does, and appends
    /// `cost` entries holding `stamp`.
    fn enter_and_append(cell: &LogCell, cost: u64, stamp: u64) {
        let seq = cell.seq.value();
        let guard = cell.seq.try_enter(seq).expect("no other writer");
        cell.append(guard, seq / 2, cost, stamp);
    }

    #[test]
    fn an_append_above_n_keeps_the_last_n_and_publishes() {
        let clock = crate::FakeClock::new();
        let log = Log::new("sliding-log 3/s".parse::<Policy>().unwrap().first_band());
        let cell = LogCell::fresh(&log);
        assert!(cell.try_acquire(&log, &clock, 2).unwrap().is_allowed());
        // Two entries written, so the next ones start in the last slot and a cost of 5
        // wraps around the ring more than once.
        clock.set(Duration::from_millis(10));
        let appended = std::panic::catch_unwind(|| enter_and_append(&cell, 5, 10 * MS));
        // Checked before any read: a reader of an odd sequence waits for ever.
        assert_eq!(cell.seq.value(), 2 * 7, "appended: {appended:?}");
        assert!(appended.is_ok());
        // The last three of the seven entries hold the new stamp: a full log.
        let d = cell.peek(&log, &clock, 1).unwrap();
        assert!(!d.is_allowed());
        assert_eq!(d.retry_after(), Duration::from_secs(1));
        clock.set(Duration::from_millis(1010));
        assert!(cell.try_acquire(&log, &clock, 3).unwrap().is_allowed());
    }

    #[test]
    fn cell_follows_the_arithmetic_and_retires_exactly() {
        let clock = crate::FakeClock::new();
        let log = Log::new("sliding-log 3/s".parse::<Policy>().unwrap().first_band());
        let cell = LogCell::fresh(&log);
        assert!(cell.is_at_rest(&log, 0));
        for (t, remaining) in [(0, 2), (400, 1), (800, 0)] {
            clock.set(Duration::from_millis(t));
            assert_eq!(
                cell.try_acquire(&log, &clock, 1).unwrap().remaining(),
                remaining
            );
        }
        clock.set(Duration::from_millis(900));
        let d = cell.try_acquire(&log, &clock, 1).unwrap();
        assert_eq!(d.retry_after(), Duration::from_millis(100));
        clock.set(Duration::from_millis(1000));
        assert!(cell.try_acquire(&log, &clock, 1).unwrap().is_allowed());
        // Entries 1000 and later wrapped around the ring in place of 0.
        assert_eq!(cell.seq.value(), 8);
        clock.set(Duration::from_millis(1050));
        let d = cell.try_acquire(&log, &clock, 1).unwrap();
        assert_eq!(d.retry_after(), Duration::from_millis(350));
        assert!(!cell.try_retire(&log, 1999 * MS));
        assert!(cell.is_at_rest(&log, 2000 * MS));
        assert!(cell.try_retire(&log, 2000 * MS));
        assert!(!cell.is_at_rest(&log, 2000 * MS));
        assert!(!cell.try_retire(&log, 2000 * MS));
        assert_eq!(cell.try_acquire(&log, &clock, 1), None);
    }
}
