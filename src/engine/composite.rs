//! Composite policies: several bands ("10 per second and 1,000 per day") that must all allow
//! a request, each decided by its own algorithm, all-or-nothing.
//!
//! A request is allowed only if every band allows it, and a refused request spends nothing in
//! any band: every band is decided on one consistent snapshot of the key's state, and only
//! when all of them allow are their new states written, together. Each band is decided by its
//! algorithm's own pure arithmetic ([`Gcra::decide`], [`Log::decide`], [`Counter::decide`]),
//! unchanged, so a band behaves exactly as the same policy alone would, except that it spends
//! nothing on a request another band refuses.
//!
//! The [`Decision`] merges the bands' decisions. "Available now" is what a band's refusal
//! would report as remaining: for a band that allows, its remaining after the admission plus
//! the cost. The band "with the smallest remaining" is the first such band in the policy's
//! order (shortest window first) when several tie.
//!
//! | decision | allowed | remaining | limit | retry_after | reset_after |
//! |---|---|---|---|---|---|
//! | every band allows | yes; every band spends the cost | min over bands of remaining after the admission | that band's permits | 0 | max over bands of reset_after after the admission |
//! | some band refuses | no; nothing is written in any band | min over bands of the permits available now | that band's permits | max over the refusing bands of retry_after | max over bands of reset_after now, without the admission |
//!
//! On a refusal, the retry_after is exact: with nothing else admitted, no band's availability
//! shrinks as time passes, so every band allows the same request from the latest of the
//! refusing bands' retry times on, and the band refusing longest refuses until then.
//!
//! [`Composite`] holds the bands' parameters inline (so it is `Copy`); [`CompositeCell`]
//! holds every band's state in one array of words behind one sequence word: the sliding
//! log's seqlock ([`LogCell`](crate::engine::sliding_log::LogCell)), generalised to several bands.
//! Its type docs give the word layout; memory per key is 24 bytes inline plus 8 bytes per
//! word on the heap (1 word per token bucket band, 2 per sliding counter band, `N + 1` per
//! sliding log band of N permits).

use crate::clock::Clock;
use crate::decision::Decision;
use crate::engine::seqlock::{SeqLock, WriteGuard};
use crate::engine::sliding_counter::{Counter, Snapshot};
use crate::engine::sliding_log::{self, Log, Ring};
use crate::engine::state::{in_use, Carry, RateState, Verdict};
use crate::engine::sync::{AtomicU64, Ordering};
use crate::engine::token_bucket::Gcra;
use crate::policy::{Algorithm, Policy};

/// One band's parameters: its algorithm's pure arithmetic.
#[derive(Clone, Copy, Debug)]
enum Band {
    /// A token bucket: one word, the TAT.
    TokenBucket(Gcra),
    /// A sliding log of `ring` permits: a count word, then `ring` entry words.
    SlidingLog {
        /// The arithmetic.
        log: Log,
        /// N, the ring's length (at most `Policy::MAX_LOG_PERMITS`).
        ring: u32,
    },
    /// A sliding counter: the window index word, then the counts word.
    SlidingCounter(Counter),
}

/// A band and where its words start in the cell's array.
#[derive(Clone, Copy, Debug)]
struct Placed {
    band: Band,
    /// Index of the band's first word.
    offset: u32,
    /// N, the band's permits.
    limit: u64,
    /// W, the band's window in ns.
    window: u64,
}

/// The parameters of a composite policy: every band's arithmetic, inline (so `Copy`), and
/// where each band's words sit in a [`CompositeCell`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Composite {
    /// `bands[..len]` are the policy's bands, shortest window first; the rest repeat the
    /// first and are never read.
    bands: [Placed; Policy::MAX_BANDS],
    /// How many bands: `1..=Policy::MAX_BANDS`.
    len: u8,
    /// The number of state words all bands take together.
    words: u32,
}

/// What one band would write on an admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Write {
    /// A token bucket's new TAT.
    Tat(u64),
    /// A sliding counter's new snapshot.
    Counter(Snapshot),
    /// A sliding log's `cost` new entries, all holding `stamp`, after the `written` entries
    /// it held.
    Log {
        /// Entries written before this admission.
        written: u64,
        /// The timestamp of the new entries.
        stamp: u64,
    },
}

/// One band's state as seen inside a read section.
enum View<'a> {
    /// A token bucket's TAT.
    Tat(u64),
    /// A sliding counter's snapshot.
    Counter(Snapshot),
    /// A sliding log's entries, and how many were ever written.
    Log(Ring<'a>, u64),
}

/// The running merge of the bands' decisions (see the module's table).
struct Merge {
    remaining: u64,
    limit: u64,
    /// The position of the band `remaining` and `limit` are from.
    index: usize,
    retry: u64,
    reset: u64,
}

impl Merge {
    fn new() -> Self {
        Merge {
            remaining: u64::MAX,
            limit: 0,
            index: 0,
            retry: 0,
            reset: 0,
        }
    }

    /// Takes band `index`'s part, in band order: `remaining` (strictly smaller wins, so the
    /// first band wins a tie), its `limit`, `retry` and `reset`.
    #[inline]
    fn band(&mut self, index: usize, remaining: u64, limit: u64, retry: u64, reset: u64) {
        if remaining < self.remaining {
            self.remaining = remaining;
            self.limit = limit;
            self.index = index;
        }
        self.retry = self.retry.max(retry);
        self.reset = self.reset.max(reset);
    }
}

/// The nanoseconds a decision's duration holds (decisions are built from `u64` nanoseconds).
#[inline]
fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Composite {
    /// Parameters for every band of `policy`, words laid out in band order.
    pub(crate) fn new(policy: &Policy) -> Self {
        let mut words = 0u32;
        let mut bands = [None; Policy::MAX_BANDS];
        for (slot, band) in bands.iter_mut().zip(policy.bands()) {
            let (params, size) = match band.algorithm() {
                Algorithm::TokenBucket => (Band::TokenBucket(Gcra::new(&band)), 1),
                // permits <= Policy::MAX_LOG_PERMITS = 2^16: fits in u32.
                Algorithm::SlidingLog => (
                    Band::SlidingLog {
                        log: Log::new(&band),
                        ring: band.permits() as u32,
                    },
                    1 + band.permits() as u32,
                ),
                Algorithm::SlidingCounter => (Band::SlidingCounter(Counter::new(&band)), 2),
            };
            *slot = Some(Placed {
                band: params,
                offset: words,
                limit: band.permits(),
                window: band.window_nanos(),
            });
            // At most 4 bands of at most 2^16 + 1 words: no overflow.
            words += size;
        }
        let first = bands[0].expect("a policy has at least one band");
        Composite {
            bands: bands.map(|band| band.unwrap_or(first)),
            len: policy.bands().len() as u8,
            words,
        }
    }

    /// The policy's bands, shortest window first.
    #[inline]
    fn bands(&self) -> &[Placed] {
        &self.bands[..usize::from(self.len)]
    }

    /// The most permits one request may cost: the smallest band's permits.
    pub(crate) fn max_cost(&self) -> u64 {
        self.bands().iter().map(|b| b.limit).min().unwrap_or(0)
    }

    /// Decides a request of `cost` (`1..=` the smallest band's permits) at `now` against the
    /// state in `words`.
    ///
    /// `words` may be read torn (a writer storing meanwhile): the result is then garbage the
    /// caller discards, but this never panics or loops, as each band's arithmetic accepts any
    /// snapshot and every index stays inside the band's words.
    #[inline]
    fn decide(
        &self,
        words: &[AtomicU64],
        now: u64,
        cost: u64,
    ) -> Verdict<[Write; Policy::MAX_BANDS]> {
        let mut writes = [Write::Tat(0); Policy::MAX_BANDS];
        let mut merge = Merge::new();
        for (i, placed) in self.bands().iter().enumerate() {
            match placed.decide(&placed.view(words), now, cost) {
                Verdict::Allow(decision, write) => {
                    writes[i] = write;
                    merge.band(
                        i,
                        decision.remaining(),
                        decision.limit(),
                        0,
                        nanos(decision.reset_after()),
                    );
                }
                // Some band refuses: nothing will be written; merge the refusal.
                Verdict::Deny(_) => return Verdict::Deny(self.refusal(words, now, cost)),
            }
        }
        Verdict::Allow(
            Decision::allow(merge.remaining, merge.limit, merge.reset).in_band(merge.index),
            writes,
        )
    }

    /// The merged refusal of a request of `cost` at `now` that some band refuses (see the
    /// module's table): bands that would allow report what they have now, unspent.
    fn refusal(&self, words: &[AtomicU64], now: u64, cost: u64) -> Decision {
        let mut merge = Merge::new();
        for (i, placed) in self.bands().iter().enumerate() {
            let view = placed.view(words);
            match placed.decide(&view, now, cost) {
                // Available now: what the admission would have left, plus what it would
                // take; and the band's reset_after as it stands, without the admission.
                Verdict::Allow(decision, _) => merge.band(
                    i,
                    decision.remaining() + cost,
                    decision.limit(),
                    0,
                    placed.reset_after(&view, now),
                ),
                Verdict::Deny(decision) => merge.band(
                    i,
                    decision.remaining(),
                    decision.limit(),
                    nanos(decision.retry_after()),
                    nanos(decision.reset_after()),
                ),
            }
        }
        Decision::deny(merge.remaining, merge.limit, merge.retry, merge.reset).in_band(merge.index)
    }

    /// `true` when every band of the state in `words` is at rest at `now`.
    #[inline]
    fn is_at_rest(&self, words: &[AtomicU64], now: u64) -> bool {
        self.bands()
            .iter()
            .all(|placed| placed.is_at_rest(&placed.view(words), now))
    }

    /// The permits in use at `now` in each band of the state in `words`.
    fn carry(&self, words: &[AtomicU64], now: u64) -> Carry {
        let mut carry = Carry::default();
        for placed in self.bands() {
            let probe = placed.decide(&placed.view(words), now, 1).decision();
            carry.push(placed.window, in_use(placed.limit, &probe));
        }
        carry
    }
}

impl Placed {
    /// The band's state in `words`, read with `Relaxed` loads (inside a read section).
    #[inline]
    fn view<'a>(&self, words: &'a [AtomicU64]) -> View<'a> {
        let at = self.offset as usize;
        // Relaxed loads inside a seqlock read section, validated afterwards: see
        // `SeqLock::read`.
        match self.band {
            Band::TokenBucket(_) => View::Tat(words[at].load(Ordering::Relaxed)),
            Band::SlidingCounter(_) => {
                let index = words[at].load(Ordering::Relaxed);
                let counts = words[at + 1].load(Ordering::Relaxed);
                View::Counter(Snapshot::unpack(
                    u128::from(index) | u128::from(counts) << 64,
                ))
            }
            Band::SlidingLog { ring, .. } => {
                let written = words[at].load(Ordering::Relaxed);
                let slots = &words[at + 1..at + 1 + ring as usize];
                View::Log(Ring::new(slots, written), written)
            }
        }
    }

    /// The band's own decision on `view`, and what it would write when it allows.
    #[inline]
    fn decide(&self, view: &View<'_>, now: u64, cost: u64) -> Verdict<Write> {
        match (self.band, view) {
            (Band::TokenBucket(gcra), &View::Tat(tat)) => {
                gcra.decide(tat, now, cost).map(Write::Tat)
            }
            (Band::SlidingCounter(counter), &View::Counter(snap)) => {
                counter.decide(snap, now, cost).map(Write::Counter)
            }
            (Band::SlidingLog { log, .. }, View::Log(ring, written)) => {
                log.decide(ring, now, cost).map(|stamp| Write::Log {
                    written: *written,
                    stamp,
                })
            }
            _ => unreachable!("a band's view follows its algorithm"),
        }
    }

    /// The band's reset_after at `now` with nothing more admitted.
    fn reset_after(&self, view: &View<'_>, now: u64) -> u64 {
        match (self.band, view) {
            (Band::TokenBucket(gcra), &View::Tat(tat)) => gcra.reset_after(tat, now),
            (Band::SlidingCounter(counter), &View::Counter(snap)) => counter.reset_after(snap, now),
            (Band::SlidingLog { log, .. }, View::Log(ring, _)) => log.reset_after(ring, now),
            _ => unreachable!("a band's view follows its algorithm"),
        }
    }

    /// `true` when the band is at rest at `now`.
    #[inline]
    fn is_at_rest(&self, view: &View<'_>, now: u64) -> bool {
        match (self.band, view) {
            (Band::TokenBucket(_), &View::Tat(tat)) => Gcra::is_at_rest(tat, now),
            (Band::SlidingCounter(counter), &View::Counter(snap)) => counter.is_at_rest(snap, now),
            (Band::SlidingLog { log, .. }, View::Log(ring, _)) => log.is_at_rest(ring, now),
            _ => unreachable!("a band's view follows its algorithm"),
        }
    }

    /// Stores what the band decided to `write` for an admission of `cost`, with `Relaxed`
    /// stores: the caller owns the words (see `CompositeCell::publish`). The stores come in
    /// an order whose every prefix leaves a state that admits no more than the band's state
    /// before (see `CompositeCell`).
    #[inline]
    fn store(&self, words: &[AtomicU64], write: Write, cost: u64) {
        let at = self.offset as usize;
        // Relaxed: ordered for readers by the writer's Release fence before (in
        // `SeqLock::try_enter`) and its Release publication after (the drop of its guard).
        match (self.band, write) {
            (Band::TokenBucket(_), Write::Tat(tat)) => {
                words[at].store(tat, Ordering::Relaxed);
            }
            (Band::SlidingCounter(_), Write::Counter(next)) => {
                // The window index, then the counts: the new index never goes back.
                let packed = next.pack();
                words[at].store(packed as u64, Ordering::Relaxed);
                words[at + 1].store((packed >> 64) as u64, Ordering::Relaxed);
            }
            (Band::SlidingLog { ring, .. }, Write::Log { written, stamp }) => {
                // The entries, then their count.
                let slots = &words[at + 1..at + 1 + ring as usize];
                for (slot, _) in sliding_log::slots_after(slots, written).zip(0..cost) {
                    slot.store(stamp, Ordering::Relaxed);
                }
                words[at].store(written + cost, Ordering::Relaxed);
            }
            _ => unreachable!("a band's write follows its algorithm"),
        }
    }
}

/// One key's state under a composite policy: every band's state in one array of words,
/// behind one sequence word (a seqlock, as [`LogCell`](crate::engine::sliding_log::LogCell)).
///
/// | word | band | holds |
/// |---|---|---|
/// | `seq` even `2k` | all | published, no writer inside: `k` admissions so far |
/// | `seq` odd | all | a writer is storing an admission; readers wait |
/// | `seq == u64::MAX` | all | retired: never admits, never revived |
/// | `words[o]` | token bucket | the TAT (ns on the limiter's clock) |
/// | `words[o]` | sliding counter | the window index of the counts |
/// | `words[o + 1]` | sliding counter | the current window's count in bits `0..32`, the previous one's in `32..64` |
/// | `words[o]` | sliding log | `written`: entries ever written to the band |
/// | `words[o + 1 ..= o + N]` | sliding log | the ring: entry `j` in slot `j mod N`; the last `min(written, N)` are valid, non-decreasing oldest to newest |
///
/// `o` is the band's offset: bands are laid out in the policy's order (shortest window
/// first), each after the previous one. A fresh state is all zeros. Memory per key: 24 bytes
/// in the cell (the 8-byte sequence word, then the array's pointer and length) plus 8 bytes
/// per word on the heap: 8 for a token bucket band, 16 for a sliding counter band, `8 * (N +
/// 1)` for a sliding log band of N permits.
///
/// Protocol (the seqlock of H.-J. Boehm, "Can seqlocks get along with programming language
/// memory models?", MSPC 2012, with a compare-and-swap in place of the writer's lock; the
/// orderings are in [`SeqLock`], shared with the sliding log):
///
/// * A reader loads `seq` (Acquire), waits while it is odd, reads every band's words with
///   `Relaxed` loads, issues an Acquire fence and re-loads `seq` (Relaxed). If it changed,
///   the reads may be torn and it starts over.
/// * A request reads the clock once, then decides every band as such a reader; a refusal
///   returns without writing.
/// * An admission then compare-and-swaps `seq` from the exact even value `s` it read to
///   `s + 1`; failure means another writer got there first, so it reads and decides again
///   (with the same clock reading). It issues a Release fence, stores every band's new
///   state (Relaxed), and publishes `s + 2` with a Release store.
/// * That store is the drop of the writer's guard ([`WriteGuard`]), so it happens on every
///   path out of the write section, a panic's unwinding included: readers never wait on a
///   sequence left odd. The guard names `s + 2` before the first store, so readers that read
///   part of a write section cut short by a panic read again, and what they read then admits
///   no more than the state at `s`: each band's words are stored in an order whose every
///   prefix keeps that promise. A token bucket's TAT is one word. A sliding counter's window
///   index goes first, and never back, so until the counts follow, the old counts stand in
///   a window at least as late as theirs, where they weigh at least as much. A sliding log's
///   entries go first and their count last, so until then the old count stands over slots
///   each holding an entry at least as new as before; the binary search for the first live
///   entry then finds at least as many live (it moves past an entry only when it has left,
///   and then so have all the entries before it in the state at `s`), and each later
///   admission decided on them stamps its entries at least as late. A band fully stored
///   counts an admission that was never granted, which only refuses more.
/// * Retiring at rest (`try_retire`, the eviction step for a map whose readers take no lock)
///   reads like a reader, checks every band is at rest, and compare-and-swaps the even value
///   it read to `RETIRED`: any admission in between moved `seq` on and makes it fail.
///
/// Keys never wait on each other, and a reader of one key waits only for a writer that is
/// inside its few stores.
#[derive(Debug)]
pub(crate) struct CompositeCell {
    seq: SeqLock,
    words: Box<[AtomicU64]>,
}

impl CompositeCell {
    /// The writer's side, holding the `guard` that [`SeqLock::try_enter`] gave from `seq`:
    /// stores every band's new state, decided on the snapshot published at `seq`, and the
    /// guard's drop publishes `seq + 2`.
    #[inline]
    fn publish(
        &self,
        params: &Composite,
        mut guard: WriteGuard<'_>,
        seq: u64,
        writes: &[Write],
        cost: u64,
    ) {
        // Named before the first store: every prefix of the stores leaves a state that admits
        // no more than the one at `seq` (see the type's docs), so a panic part-way publishes
        // it under a new value, and readers that read some of the stores read again.
        // `seq + 2` stays even, so it never meets the odd retired value, and would need 2^63
        // admissions to overflow.
        guard.publish_at(seq + 2);
        // Every store is Relaxed: ordered for readers by the fence in `try_enter` and the
        // Release store of the guard's drop; ordered after the previous writer's stores
        // because our entry read the sequence value that writer published with Release.
        for (placed, &write) in params.bands().iter().zip(writes) {
            placed.store(&self.words, write, cost);
        }
    }

    /// The even sequence value at which every band was seen at rest at `now`; `None` when
    /// some band is not at rest, the state is retired, or a writer is inside (an admission in
    /// flight: not at rest).
    fn at_rest_seq(&self, params: &Composite, now: u64) -> Option<u64> {
        self.seq.seq_where(|_| params.is_at_rest(&self.words, now))
    }

    /// Every word's value (tests only; not a consistent read while writers run).
    #[cfg(test)]
    fn dump(&self) -> (u64, Vec<u64>) {
        (
            self.seq.value(),
            self.words
                .iter()
                .map(|w| w.load(Ordering::Relaxed))
                .collect(),
        )
    }
}

impl RateState for CompositeCell {
    type Params = Composite;
    /// Boxed beside a key's state: up to four bands' parameters, inline, would make every
    /// per-key state as large as the largest.
    type Kept = Box<Composite>;

    fn params(policy: &Policy) -> Composite {
        Composite::new(policy)
    }

    fn max_cost(params: &Composite) -> u64 {
        params.max_cost()
    }

    fn fresh(params: &Composite) -> Self {
        CompositeCell {
            seq: SeqLock::new(),
            words: (0..params.words).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    #[inline]
    fn try_acquire<C: Clock + ?Sized>(
        &self,
        params: &Composite,
        clock: &C,
        cost: u64,
    ) -> Option<Decision> {
        // The clock is read once, before the sequence, as for every single-band state: each
        // band decides an older `now` than another writer's as a clock that went backwards,
        // which can only refuse more, never admit more.
        let now = clock.now();
        loop {
            let (seq, verdict) = self
                .seq
                .read_consistent(|_| params.decide(&self.words, now, cost))?;
            match verdict {
                Verdict::Deny(decision) => return Some(decision),
                // Entering from exactly `seq` proves every band's decision still holds.
                Verdict::Allow(decision, writes) => {
                    if let Some(guard) = self.seq.try_enter(seq) {
                        self.publish(params, guard, seq, &writes, cost);
                        return Some(decision);
                    }
                }
            }
        }
    }

    fn peek<C: Clock + ?Sized>(
        &self,
        params: &Composite,
        clock: &C,
        cost: u64,
    ) -> Option<Decision> {
        // The same consistent read as `try_acquire`, and nothing written.
        let (_, verdict) = self
            .seq
            .read_consistent(|_| params.decide(&self.words, clock.now(), cost))?;
        Some(verdict.decision())
    }

    fn is_at_rest(&self, params: &Composite, now: u64) -> bool {
        self.at_rest_seq(params, now).is_some()
    }

    fn try_retire(&self, params: &Composite, now: u64) -> bool {
        self.at_rest_seq(params, now)
            .is_some_and(|seq| self.seq.try_retire(seq))
    }

    fn carry(&self, params: &Composite, now: u64) -> Option<Carry> {
        self.seq
            .read_consistent(|_| params.carry(&self.words, now))
            .map(|(_, carry)| carry)
    }

    fn retire_with_carry(&self, params: &Composite, now: u64) -> Option<Carry> {
        loop {
            let (seq, carry) = self
                .seq
                .read_consistent(|_| params.carry(&self.words, now))?;
            // Retired from exactly the snapshot counted, or read again.
            if self.seq.try_retire(seq) {
                return Some(carry);
            }
        }
    }

    fn from_carry(params: &Composite, carry: &Carry, now: u64) -> Self {
        let state = Self::fresh(params);
        for placed in params.bands() {
            let spent = carry.spent_within(placed.window).min(placed.limit);
            if spent == 0 {
                continue;
            }
            // Each band on its own: a fresh band admits any cost up to its limit. Nobody else
            // can see this state yet, so plain Relaxed stores suffice; whoever shares it
            // (the registry's map) publishes it.
            if let Verdict::Allow(_, write) = placed.decide(&placed.view(&state.words), now, spent)
            {
                placed.store(&state.words, write, spent);
            }
        }
        state
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::FakeClock;
    use std::time::Duration;

    const MS: u64 = 1_000_000;
    const SEC: u64 = 1_000 * MS;

    /// A fresh cell for `policy`, its parameters and a clock at 0.
    fn cell(policy: &str) -> (CompositeCell, Composite, FakeClock) {
        let params = Composite::new(&policy.parse().unwrap());
        (CompositeCell::fresh(&params), params, FakeClock::new())
    }

    fn at(clock: &FakeClock, nanos: u64) -> &FakeClock {
        clock.set(Duration::from_nanos(nanos));
        clock
    }

    /// (allowed, remaining, limit, retry_after ns, reset_after ns).
    fn fields(d: Decision) -> (bool, u64, u64, u64, u64) {
        (
            d.is_allowed(),
            d.remaining(),
            d.limit(),
            nanos(d.retry_after()),
            nanos(d.reset_after()),
        )
    }

    fn acquire(cell: &CompositeCell, params: &Composite, clock: &FakeClock, cost: u64) -> Decision {
        cell.try_acquire(params, clock, cost).expect("not retired")
    }

    #[test]
    fn layout_follows_the_bands_in_policy_order() {
        let params = Composite::new(
            &"5/1h & sliding-log 3/1s & sliding-counter 10/1m"
                .parse()
                .unwrap(),
        );
        let bands = params.bands();
        assert_eq!(bands.len(), 3);
        assert!(matches!(bands[0].band, Band::SlidingLog { ring: 3, .. }));
        assert!(matches!(bands[1].band, Band::SlidingCounter(_)));
        assert!(matches!(bands[2].band, Band::TokenBucket(_)));
        let offsets: Vec<u32> = bands.iter().map(|b| b.offset).collect();
        assert_eq!(offsets, [0, 4, 6]);
        assert_eq!(params.words, 7);
        assert_eq!(params.max_cost(), 3);
        let cell = CompositeCell::fresh(&params);
        assert_eq!(cell.dump(), (0, vec![0; 7]));
    }

    #[test]
    #[cfg(not(tollgate_loom))]
    fn memory_per_key_is_as_documented() {
        assert_eq!(std::mem::size_of::<CompositeCell>(), 24);
    }

    #[test]
    fn allowed_takes_the_smallest_remaining_and_the_largest_reset() {
        // Band 0: 3 per second (T = 333,333,334 ns); band 1: 5 per hour (T = 720 s).
        let (cell, params, clock) = cell("3/1s & 5/1h");
        let d = acquire(&cell, &params, &clock, 1);
        assert_eq!(fields(d), (true, 2, 3, 0, 720 * SEC));
        // Band 1 is the tighter one after a cost of 2 more: 2 left of 5, 0 of 3.
        let d = acquire(&cell, &params, &clock, 2);
        assert_eq!(fields(d), (true, 0, 3, 0, 3 * 720 * SEC));
        // Two seconds later band 0 is full again (3) and band 1 has 2: band 1's limit.
        let d = acquire(&cell, &params, at(&clock, 2 * SEC), 1);
        assert_eq!(fields(d), (true, 1, 5, 0, 4 * 720 * SEC - 2 * SEC));
    }

    #[test]
    fn allowed_tie_reports_the_first_band() {
        let (cell, params, clock) = cell("2/1s & 3/1h");
        assert_eq!(fields(acquire(&cell, &params, &clock, 1)).1, 1);
        // Band 0 is full again, band 1 has 2: both leave 1 after this request.
        let d = acquire(&cell, &params, at(&clock, SEC), 1);
        assert_eq!((d.remaining(), d.limit()), (1, 2));
    }

    #[test]
    fn refused_reports_the_state_as_it_stands() {
        // Band 0 (log, 1 per second) refuses at 500 ms; band 1 (5 per hour) would allow.
        let (cell, params, clock) = cell("sliding-log 1/1s & 5/1h");
        assert!(acquire(&cell, &params, &clock, 1).is_allowed());
        let d = acquire(&cell, &params, at(&clock, 500 * MS), 1);
        // remaining: band 0 has 0 now (band 1 has 4); retry: band 0's; reset: band 1's TAT
        // as it stands (720 s from 0), not with the refused request's 720 s more.
        assert_eq!(fields(d), (false, 0, 1, 500 * MS, 720 * SEC - 500 * MS));
    }

    #[test]
    fn refused_by_the_long_band_reports_its_limit_and_retry() {
        // Band 0 (5 per second) would allow a cost of 2; band 1 (log, 2 per hour) holds one
        // entry and refuses it until that entry leaves.
        let (cell, params, clock) = cell("5/1s & sliding-log 2/1h");
        assert!(acquire(&cell, &params, &clock, 1).is_allowed());
        let d = acquire(&cell, &params, at(&clock, 100 * MS), 2);
        // Available now: band 0 has 4 (after refilling 100 of its 200 ms), band 1 has 1.
        assert_eq!(
            fields(d),
            (false, 1, 2, 3_600 * SEC - 100 * MS, 3_600 * SEC - 100 * MS)
        );
    }

    #[test]
    fn refused_takes_the_largest_retry_of_the_refusing_bands() {
        // Both bands refuse: band 0 for 200 ms, band 1 (counter, 2 per minute) longer.
        let (cell, params, clock) = cell("2/1s & sliding-counter 2/1m");
        assert!(acquire(&cell, &params, &clock, 2).is_allowed());
        let d = acquire(&cell, &params, &clock, 1);
        assert!(!d.is_allowed());
        assert_eq!(d.remaining(), 0);
        // Band 0: the first permit is back after 500 ms. Band 1: the current window alone is
        // full; in the next one 2 * (60 s - e) / 60 s < 2 from e = 1 ns on, so 60 s + 1 ns.
        assert_eq!(nanos(d.retry_after()), 60 * SEC + 1);
        assert_eq!(nanos(d.reset_after()), 120 * SEC);
        // And at that instant the request does pass.
        let d = acquire(&cell, &params, at(&clock, 60 * SEC + 1), 1);
        assert!(d.is_allowed());
    }

    #[test]
    fn refused_counter_band_that_would_allow_reports_its_reset_now() {
        // Band 0 (1 per second) refuses at 60 s; band 1 (counter, 10 per minute) holds 1
        // admitted in window 0 and would allow.
        let (cell, params, clock) = cell("1/1s & sliding-counter 10/1m");
        assert!(acquire(&cell, &params, at(&clock, 59 * SEC + 500 * MS), 1).is_allowed());
        let d = acquire(&cell, &params, at(&clock, 60 * SEC), 1);
        // In window 1 that count is the previous one: band 1 is at rest at the start of
        // window 2, 60 s away. Counting the refused request would say window 3, 120 s.
        assert_eq!(fields(d), (false, 0, 1, 500 * MS, 60 * SEC));
    }

    #[test]
    fn a_refusal_writes_nothing_in_any_band() {
        let policy = "sliding-log 2/1s & sliding-counter 4/1m & token-bucket 6/1h";
        let (cell, params, clock) = cell(policy);
        assert!(acquire(&cell, &params, &clock, 2).is_allowed());
        let before = cell.dump();
        for (t, cost) in [(0, 1), (0, 2), (500 * MS, 1), (999 * MS, 2)] {
            let d = acquire(&cell, &params, at(&clock, t), cost);
            assert!(!d.is_allowed(), "{t} {cost}: {d:?}");
            assert_eq!(cell.dump(), before, "a refusal at {t} changed a band");
        }
        // The bands that would have allowed still hold exactly what they held: the log's
        // entries have left, the counter has 2 of 4 left, the bucket (T = 600 s) 4 of 6, so
        // its TAT goes from 1,200 s to 2,400 s.
        let d = acquire(&cell, &params, at(&clock, SEC), 2);
        assert_eq!(fields(d), (true, 0, 2, 0, 2_400 * SEC - SEC));
        // The counter is full now.
        let d = acquire(&cell, &params, at(&clock, 2 * SEC), 1);
        assert_eq!((d.is_allowed(), d.remaining(), d.limit()), (false, 0, 4));
    }

    #[test]
    fn peek_changes_nothing_and_agrees_with_the_next_request() {
        let (cell, params, clock) = cell("sliding-log 2/1s & sliding-counter 3/1m");
        for t in [0, 10 * MS, 20 * MS, SEC + 20 * MS, 70 * SEC] {
            at(&clock, t);
            let before = cell.dump();
            let peeked = cell.peek(&params, &clock, 1).unwrap();
            assert_eq!(cell.dump(), before);
            assert_eq!(acquire(&cell, &params, &clock, 1), peeked, "at {t}");
        }
    }

    #[test]
    fn retires_only_when_every_band_is_at_rest() {
        let (cell, params, clock) = cell("sliding-log 1/1s & 2/1h");
        assert!(cell.is_at_rest(&params, 0));
        assert!(acquire(&cell, &params, &clock, 1).is_allowed());
        // Band 0 is at rest after 1 s; band 1's TAT is 30 min.
        assert!(!cell.is_at_rest(&params, SEC));
        assert!(!cell.try_retire(&params, SEC));
        assert!(!cell.try_retire(&params, 1_800 * SEC - 1));
        assert!(cell.is_at_rest(&params, 1_800 * SEC));
        let before = cell.dump();
        assert!(cell.try_retire(&params, 1_800 * SEC));
        // Retired: the sequence holds `u64::MAX`, the words are untouched.
        assert_eq!(cell.dump(), (u64::MAX, before.1));
        // Retired: never decides, never at rest, never retired twice.
        assert!(!cell.is_at_rest(&params, 1_800 * SEC));
        assert!(!cell.try_retire(&params, 1_800 * SEC));
        assert_eq!(cell.try_acquire(&params, &clock, 1), None);
        assert_eq!(cell.peek(&params, &clock, 1), None);
        assert_eq!(cell.carry(&params, 0), None);
    }

    #[test]
    fn carry_counts_each_band_and_retires_from_that_snapshot() {
        let (cell, params, clock) = cell("sliding-log 3/1s & sliding-counter 10/1m");
        assert!(acquire(&cell, &params, &clock, 2).is_allowed());
        assert!(acquire(&cell, &params, at(&clock, 2 * SEC), 1).is_allowed());
        let carry = cell.carry(&params, 2 * SEC).unwrap();
        assert_eq!(carry.spent_within(SEC), 1);
        assert_eq!(carry.spent_within(60 * SEC), 3);
        let carry = cell.retire_with_carry(&params, 2 * SEC).unwrap();
        assert_eq!(cell.try_acquire(&params, &clock, 1), None);
        // A state built from it: the log band has 1 spent, the counter band 3.
        let next = CompositeCell::from_carry(&params, &carry, 2 * SEC);
        let d = acquire(&next, &params, &clock, 2);
        assert_eq!(fields(d), (true, 0, 3, 0, 2 * 60 * SEC - 2 * SEC));
        let d = acquire(&next, &params, &clock, 1);
        assert!(!d.is_allowed());
        assert_eq!((d.remaining(), d.limit()), (0, 3));
    }

    #[test]
    fn matches_the_bands_decided_alone_all_or_nothing() {
        // A pseudo-random trace against the three single-band cells, each peeked and then
        // spent only when all allow.
        use crate::engine::sliding_counter::CounterCell;
        use crate::engine::sliding_log::LogCell;
        use crate::engine::token_bucket::GcraCell;
        let policy: Policy = "sliding-log 3/1s & sliding-counter 5/3s & token-bucket 7/10s"
            .parse()
            .unwrap();
        let bands: Vec<Policy> = policy.bands().collect();
        let (p0, p1, p2) = (
            Log::new(&bands[0]),
            Counter::new(&bands[1]),
            Gcra::new(&bands[2]),
        );
        let (c0, c1, c2) = (
            LogCell::fresh(&p0),
            CounterCell::fresh(&p1),
            GcraCell::fresh(&p2),
        );
        let params = Composite::new(&policy);
        let cell = CompositeCell::fresh(&params);
        let clock = FakeClock::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for step in 0..5_000 {
            clock.advance(Duration::from_nanos(match next(4) {
                0 => 0,
                1 => next(100 * MS),
                _ => next(2 * SEC),
            }));
            let now = clock.now();
            let cost = 1 + next(3);
            let ds = [
                c0.peek(&p0, &clock, cost).unwrap(),
                c1.peek(&p1, &clock, cost).unwrap(),
                c2.peek(&p2, &clock, cost).unwrap(),
            ];
            let got = acquire(&cell, &params, &clock, cost);
            let all = ds.iter().all(|d| d.is_allowed());
            assert_eq!(got.is_allowed(), all, "step {step}");
            if all {
                assert!(c0.try_acquire(&p0, &clock, cost).unwrap().is_allowed());
                assert!(c1.try_acquire(&p1, &clock, cost).unwrap().is_allowed());
                assert!(c2.try_acquire(&p2, &clock, cost).unwrap().is_allowed());
                let min = ds.iter().map(|d| d.remaining()).min().unwrap();
                let first = ds.iter().find(|d| d.remaining() == min).unwrap();
                let reset = ds.iter().map(|d| d.reset_after()).max().unwrap();
                assert_eq!(
                    fields(got),
                    (true, min, first.limit(), 0, nanos(reset)),
                    "step {step}"
                );
            } else {
                let avail = |d: &Decision| d.remaining() + if d.is_allowed() { cost } else { 0 };
                let min = ds.iter().map(avail).min().unwrap();
                let first = ds.iter().find(|d| avail(d) == min).unwrap();
                let retry = ds.iter().map(|d| d.retry_after()).max().unwrap();
                // Reset now: the smallest wait after which a band is at rest, found by
                // bisection on the single cells (at rest never ends with nothing admitted).
                let rest = |at_rest: &dyn Fn(u64) -> bool| {
                    let (mut lo, mut hi) = (now, now + 30 * SEC);
                    if at_rest(lo) {
                        return 0;
                    }
                    while hi - lo > 1 {
                        let mid = lo + (hi - lo) / 2;
                        if at_rest(mid) {
                            hi = mid;
                        } else {
                            lo = mid;
                        }
                    }
                    hi - now
                };
                let reset = [
                    rest(&|t| c0.is_at_rest(&p0, t)),
                    rest(&|t| c1.is_at_rest(&p1, t)),
                    rest(&|t| c2.is_at_rest(&p2, t)),
                ]
                .into_iter()
                .max()
                .unwrap();
                assert_eq!(
                    fields(got),
                    (false, min, first.limit(), nanos(retry), reset),
                    "step {step}"
                );
            }
            assert_eq!(
                cell.is_at_rest(&params, now),
                c0.is_at_rest(&p0, now) && c1.is_at_rest(&p1, now) && c2.is_at_rest(&p2, now)
            );
        }
    }
}
