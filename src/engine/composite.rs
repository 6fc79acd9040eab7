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
use crate::engine::cells::Boxed;
use crate::engine::retry::Retry;
use crate::engine::seqlock::{SeqLock, WriteGuard};
use crate::engine::sliding_counter::{Counter, Snapshot};
use crate::engine::sliding_log::{Fix, Log, LogWords, Ring};
use crate::engine::state::{band_stamp, in_use, Carry, RateState, Verdict};
use crate::engine::sync::{AtomicU64, Ordering};
use crate::engine::token_bucket::Gcra;
use crate::policy::{Algorithm, Policy};
use crate::reservation::Marks;

/// One band's parameters: its algorithm's pure arithmetic.
#[derive(Clone, Copy, Debug)]
enum BandMath {
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
    band: BandMath,
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
    /// What settling a reservation does to a sliding log that held `written` entries.
    Settle {
        /// Entries written before.
        written: u64,
        /// The change.
        fix: Fix,
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
                Algorithm::TokenBucket => (BandMath::TokenBucket(Gcra::new(band)), 1),
                // permits <= Policy::MAX_LOG_PERMITS = 2^16: fits in u32.
                Algorithm::SlidingLog => (
                    BandMath::SlidingLog {
                        log: Log::new(band),
                        ring: band.permits() as u32,
                    },
                    1 + band.permits() as u32,
                ),
                Algorithm::SlidingCounter => (BandMath::SlidingCounter(Counter::new(band)), 2),
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
            let used = match (placed.band, placed.view(words)) {
                (BandMath::SlidingCounter(counter), View::Counter(snap)) => {
                    counter.in_use(snap, now)
                }
                (_, view) => in_use(placed.limit, &placed.decide(&view, now, 1).decision()),
            };
            carry.push(placed.window, used);
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
            BandMath::TokenBucket(_) => View::Tat(words[at].load(Ordering::Relaxed)),
            BandMath::SlidingCounter(_) => {
                let index = words[at].load(Ordering::Relaxed);
                let counts = words[at + 1].load(Ordering::Relaxed);
                View::Counter(Snapshot::unpack(
                    u128::from(index) | u128::from(counts) << 64,
                ))
            }
            BandMath::SlidingLog { .. } => {
                let (ring, written) = self.log_words(words).view();
                View::Log(ring, written)
            }
        }
    }

    /// A sliding log band's words (its count, then its ring).
    #[inline]
    fn log_words<'a>(&self, words: &'a [AtomicU64]) -> LogWords<'a> {
        let ring = match self.band {
            BandMath::SlidingLog { ring, .. } => ring as usize,
            _ => unreachable!("only a sliding log band has a ring"),
        };
        let at = self.offset as usize;
        LogWords::new(&words[at..at + 1 + ring])
    }

    /// Where an admission that wrote `write` stands, for a reservation (see `Marks`).
    #[inline]
    fn mark(&self, write: Write) -> u64 {
        match (self.band, write) {
            (BandMath::SlidingCounter(counter), Write::Counter(next)) => counter.mark(next),
            (_, Write::Tat(tat)) => tat,
            (_, Write::Log { stamp, .. }) => stamp,
            _ => unreachable!("an admission's write follows its band's algorithm"),
        }
    }

    /// What settling an admission of `held` permits that stood at `mark` writes to the band
    /// seen in `view`, when it really cost `actual`: each algorithm's own rule. `None` when
    /// nothing changes.
    fn settle(
        &self,
        view: &View<'_>,
        held: u64,
        mark: u64,
        actual: u64,
        now: u64,
    ) -> Option<Write> {
        match (self.band, view) {
            (BandMath::TokenBucket(gcra), &View::Tat(tat)) => {
                let next = gcra.settle(tat, held, mark, actual, now);
                (next != tat).then_some(Write::Tat(next))
            }
            (BandMath::SlidingCounter(counter), &View::Counter(snap)) => {
                let next = counter.settle(snap, held, mark, actual, now);
                (next != snap).then_some(Write::Counter(next))
            }
            (BandMath::SlidingLog { log, .. }, View::Log(ring, written)) => {
                match log.settle(ring, held, mark, actual, now) {
                    Fix::Keep => None,
                    fix => Some(Write::Settle {
                        written: *written,
                        fix,
                    }),
                }
            }
            _ => unreachable!("a band's view follows its algorithm"),
        }
    }

    /// The band's own decision on `view`, and what it would write when it allows.
    #[inline]
    fn decide(&self, view: &View<'_>, now: u64, cost: u64) -> Verdict<Write> {
        match (self.band, view) {
            (BandMath::TokenBucket(gcra), &View::Tat(tat)) => {
                gcra.decide(tat, now, cost).map(Write::Tat)
            }
            (BandMath::SlidingCounter(counter), &View::Counter(snap)) => {
                counter.decide(snap, now, cost).map(Write::Counter)
            }
            (BandMath::SlidingLog { log, .. }, View::Log(ring, written)) => {
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
            (BandMath::TokenBucket(gcra), &View::Tat(tat)) => gcra.reset_after(tat, now),
            (BandMath::SlidingCounter(counter), &View::Counter(snap)) => {
                counter.reset_after(snap, now)
            }
            (BandMath::SlidingLog { log, .. }, View::Log(ring, _)) => log.reset_after(ring, now),
            _ => unreachable!("a band's view follows its algorithm"),
        }
    }

    /// `true` when the band is at rest at `now`.
    #[inline]
    fn is_at_rest(&self, view: &View<'_>, now: u64) -> bool {
        match (self.band, view) {
            (BandMath::TokenBucket(_), &View::Tat(tat)) => Gcra::is_at_rest(tat, now),
            (BandMath::SlidingCounter(counter), &View::Counter(snap)) => {
                counter.is_at_rest(snap, now)
            }
            (BandMath::SlidingLog { log, .. }, View::Log(ring, _)) => log.is_at_rest(ring, now),
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
            (BandMath::TokenBucket(_), Write::Tat(tat)) => {
                words[at].store(tat, Ordering::Relaxed);
            }
            (BandMath::SlidingCounter(_), Write::Counter(next)) => {
                // The window index, then the counts: the new index never goes back.
                let packed = next.pack();
                words[at].store(packed as u64, Ordering::Relaxed);
                words[at + 1].store((packed >> 64) as u64, Ordering::Relaxed);
            }
            (BandMath::SlidingLog { .. }, Write::Log { written, stamp }) => {
                // The entries, then their count.
                self.log_words(words).append(written, cost, stamp);
            }
            (BandMath::SlidingLog { .. }, Write::Settle { written, fix }) => {
                self.log_words(words).apply(written, fix);
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
/// | `seq` even `2k` | all | published, no writer inside: `k` writes (admissions and settles) so far |
/// | `seq` odd | all | a writer is storing; readers wait |
/// | `seq == u64::MAX` | all | retired: never admits, never revived |
/// | `words[o]` | token bucket | the TAT (ns on the limiter's clock) |
/// | `words[o]` | sliding counter | the window index of the counts |
/// | `words[o + 1]` | sliding counter | the current window's count in bits `0..32`, the previous one's in `32..64` |
/// | `words[o]` | sliding log | `written`: entries ever written to the band, less those a settle gave back |
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
    type Cells = Boxed;
    type Params = Composite;
    /// Boxed beside a key's state: up to four bands' parameters, inline, would make every
    /// per-key state as large as the largest.
    type OwnParams = Box<Composite>;

    fn params(policy: &Policy) -> Composite {
        Composite::new(policy)
    }

    fn max_cost(params: &Composite) -> u64 {
        params.max_cost()
    }

    fn stamp(params: &Composite) -> u64 {
        params.bands().iter().fold(4, |stamp, placed| {
            let tag = match placed.band {
                BandMath::TokenBucket(_) => 1,
                BandMath::SlidingLog { .. } => 3,
                BandMath::SlidingCounter(_) => 2,
            };
            band_stamp(band_stamp(stamp, tag, 0), placed.limit, placed.window)
        })
    }

    fn fresh(params: &Composite) -> Self {
        CompositeCell {
            seq: SeqLock::new(),
            words: (0..params.words).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    #[inline]
    fn reserve<C: Clock + ?Sized>(
        &self,
        params: &Composite,
        clock: &C,
        cost: u64,
    ) -> Option<(Decision, Marks)> {
        // The clock is read once, before the sequence, as for every single-band state: each
        // band decides an older `now` than another writer's as a clock that went backwards,
        // which can only refuse more, never admit more.
        let now = clock.now();
        let mut retry = Retry::new();
        loop {
            let (seq, verdict) = self
                .seq
                .read_consistent(|_| params.decide(&self.words, now, cost))?;
            match verdict {
                Verdict::Deny(decision) => return Some((decision, [0; Policy::MAX_BANDS + 1])),
                // Entering from exactly `seq` proves every band's decision still holds.
                Verdict::Allow(decision, writes) => {
                    if let Some(guard) = self.seq.try_enter(seq) {
                        self.publish(params, guard, seq, &writes, cost);
                        let mut marks = [0; Policy::MAX_BANDS + 1];
                        for ((mark, placed), &write) in
                            marks.iter_mut().zip(params.bands()).zip(&writes)
                        {
                            *mark = placed.mark(write);
                        }
                        return Some((decision, marks));
                    }
                    // Another writer came first.
                    retry.again();
                }
            }
        }
    }

    fn settle(
        &self,
        params: &Composite,
        held: u64,
        marks: &Marks,
        actual: u64,
        now: u64,
    ) -> Option<()> {
        let mut retry = Retry::new();
        loop {
            let (seq, writes) = self.seq.read_consistent(|_| {
                let mut writes = [None; Policy::MAX_BANDS];
                for ((write, placed), &mark) in writes.iter_mut().zip(params.bands()).zip(marks) {
                    *write = placed.settle(&placed.view(&self.words), held, mark, actual, now);
                }
                writes
            })?;
            if writes.iter().all(Option::is_none) {
                return Some(());
            }
            // Entering from exactly `seq` proves every band's settle was decided on the
            // state it changes.
            if let Some(mut guard) = self.seq.try_enter(seq) {
                guard.publish_at(seq + 2);
                for (placed, write) in params.bands().iter().zip(writes) {
                    if let Some(write) = write {
                        placed.store(&self.words, write, 0);
                    }
                }
                return Some(());
            }
            // Another writer came first.
            retry.again();
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
        let mut retry = Retry::new();
        loop {
            let (seq, carry) = self
                .seq
                .read_consistent(|_| params.carry(&self.words, now))?;
            // Retired from exactly the snapshot counted, or read again.
            if self.seq.try_retire(seq) {
                return Some(carry);
            }
            retry.again();
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
mod tests;
