//! The sliding window counter: a weighted estimate from two fixed windows, `O(1)` state.
//!
//! Windows are aligned to multiples of `W` from the clock's zero: window `i` covers
//! `[i*W, (i+1)*W)`. A key keeps the count of its current window and of the previous one; at
//! `elapsed = now - i*W` into window `i` the estimate of the last `W` is
//!
//! ```text
//! estimate = previous * (W - elapsed) / W + current
//! ```
//!
//! and a request of cost `n` is allowed iff `estimate + n - 1 < N`. A window two or more back
//! counts for nothing.
//!
//! Everything is exact integer arithmetic. Since `current` and `N` are whole numbers,
//! `estimate < N - n + 1` holds iff `used + n <= N` with
//! `used = current + floor(previous * (W - elapsed) / W)`, so:
//!
//! | decision | remaining | retry_after | reset_after |
//! |---|---|---|---|
//! | allowed | `N - used - n` | 0 | until both counts roll out: the start of window `i + 2`, minus now |
//! | denied | `max(0, N - used)` | the first nanosecond at which `used + n <= N`, solved exactly | window `i + 2` if `current > 0`, else `i + 1` if `previous > 0` |
//!
//! `remaining` is what a request could take right after the decision, `max(0, ceil(N -
//! estimate))` on the estimate that includes an admitted request; for an admission of cost 1
//! that is `max(0, ceil(N - estimate - 1))` on the estimate before it. A refusal
//! reports the same quantity on the unchanged estimate: the permits available now.
//!
//! `retry_after` is exact: the estimate must drop strictly below the bound, so it is the
//! solution of the formula (a real number of nanoseconds) rounded to the first whole
//! nanosecond past it; when the current window alone is full it is solved in the next window,
//! where the current count has become the previous one. It is never more than `2W`.
//!
//! A clock reading before the start of the stored window (the clock went backwards, or another
//! thread read it a moment later and admitted first) counts as zero elapsed: the request is
//! decided at the start of the stored window, where its counts weigh the most.
//!
//! [`Counter`] is the pure arithmetic on a [`Snapshot`]; [`CounterCell`] packs the snapshot
//! into one 128-bit atomic word and runs the compare-and-swap loop.

use crate::clock::Clock;
use crate::decision::Decision;
use crate::engine::cells::{Reusable, Slab};
use crate::engine::state::{band_stamp, one_mark, single_from_carry, Carry, RateState, Verdict};
use crate::engine::sync::{AtomicU128, Ordering};
use crate::engine::word::{live, update, Retired, Update};
use crate::policy::{Band, Policy};
use crate::reservation::Marks;

/// Where the current window's count sits in the packed word.
const CURRENT_SHIFT: u32 = 64;
/// Where the previous window's count sits in the packed word.
const PREVIOUS_SHIFT: u32 = 96;
/// A count's width.
const COUNT_MASK: u128 = u32::MAX as u128;

/// One key's counter state, unpacked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Snapshot {
    /// The window the counts belong to: `now / W` when they were last written.
    index: u64,
    /// Permits admitted in window `index`.
    current: u32,
    /// Permits admitted in window `index - 1`.
    previous: u32,
}

impl Snapshot {
    /// The 128-bit word holding this snapshot (see [`CounterCell`] for the layout; the
    /// composite policy stores it as two 64-bit words).
    #[inline]
    pub(crate) const fn pack(self) -> u128 {
        self.index as u128
            | (self.current as u128) << CURRENT_SHIFT
            | (self.previous as u128) << PREVIOUS_SHIFT
    }

    /// The snapshot a word holds.
    #[inline]
    pub(crate) const fn unpack(word: u128) -> Self {
        Snapshot {
            index: word as u64,
            current: ((word >> CURRENT_SHIFT) & COUNT_MASK) as u32,
            previous: ((word >> PREVIOUS_SHIFT) & COUNT_MASK) as u32,
        }
    }
}

/// Sliding counter parameters derived from a policy, and the pure decision function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Counter {
    /// N, the policy's permits: at most `Policy::MAX_COUNTER_PERMITS`, so every count fits
    /// in 31 bits.
    limit: u64,
    /// W in nanoseconds: at least 1 (and at least N), at most 2^62.
    window: u64,
}

/// A snapshot rolled forward to the window holding `now`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Rolled {
    /// The window decided in, and the index to store: now's, or the snapshot's if later.
    index: u64,
    /// Nanoseconds since the start of that window: `0..W`.
    elapsed: u64,
    /// The current window's count.
    current: u64,
    /// The previous window's count.
    previous: u64,
}

impl Counter {
    /// Parameters for `band` (any algorithm; only permits and window are read).
    pub(crate) fn new(band: Band) -> Self {
        Counter {
            limit: band.permits(),
            window: band.window_nanos(),
        }
    }

    /// Rolls `snap` to now's window.
    ///
    /// A snapshot from a later window than now's means this clock reading is behind one
    /// already acted on: the clock went backwards, or another thread read it a moment later
    /// and admitted first, across a window boundary. Time that runs backwards counts as zero
    /// elapsed, so `now` is taken as the start of the snapshot's window: its counts stay in
    /// the windows they were admitted in, weighed at their heaviest (never admitting more
    /// than at that instant), and retry_after and reset_after are measured from that instant,
    /// so they stay within `2W`.
    #[inline]
    fn roll(&self, snap: Snapshot, now: u64) -> Rolled {
        let index = now / self.window;
        let (current, previous, elapsed) = if snap.index > index {
            (snap.current, snap.previous, 0)
        } else if snap.index == index {
            (snap.current, snap.previous, now % self.window)
        } else if snap.index + 1 == index {
            (0, snap.current, now % self.window)
        } else {
            (0, 0, now % self.window)
        };
        Rolled {
            index: snap.index.max(index),
            elapsed,
            current: u64::from(current),
            previous: u64::from(previous),
        }
    }

    /// `floor(previous * left / W)`: the previous window's weight in whole permits with `left`
    /// nanoseconds of the current window to go. At most `previous`.
    #[inline]
    fn carried(&self, previous: u64, left: u64) -> u64 {
        match previous.checked_mul(left) {
            Some(product) => product / self.window,
            // previous <= 2N < 2^32 and left <= W <= 2^62: the product fits in u128, the quotient
            // (at most previous) in u64.
            None => (u128::from(previous) * u128::from(left) / u128::from(self.window)) as u64,
        }
    }

    /// The longest `left` (nanoseconds to the end of a window) at which
    /// `floor(previous * left / W) <= spare`: `ceil((spare + 1) * W / previous) - 1`, or
    /// `u64::MAX` when `previous` is 0 (every `left` will do).
    #[inline]
    fn longest_left(&self, previous: u64, spare: u64) -> u64 {
        if previous == 0 {
            return u64::MAX;
        }
        // spare < 2^31 and W <= 2^62: no overflow in u128.
        let bound = (u128::from(spare) + 1) * u128::from(self.window);
        u64::try_from(bound.div_ceil(u128::from(previous)) - 1).unwrap_or(u64::MAX)
    }

    /// Decides a request of `cost` (1..=limit) at `now` against `snap`.
    #[inline]
    pub(crate) fn decide(&self, snap: Snapshot, now: u64, cost: u64) -> Verdict<Snapshot> {
        let r = self.roll(snap, now);
        let left = self.window - r.elapsed;
        let used = r.current + self.carried(r.previous, left);
        // `used` may exceed N after a settle charged past the limit, or after a backwards
        // clock within one window (a smaller elapsed weighs the previous count more); it then
        // admits nothing.
        let available = self.limit.saturating_sub(used);
        if cost <= available {
            let next = Snapshot {
                index: r.index,
                // current + cost <= used + cost <= N < 2^31.
                current: (r.current + cost) as u32,
                previous: r.previous as u32,
            };
            // Both counts are zero from the start of window i + 2.
            let reset = left + self.window;
            Verdict::Allow(Decision::allow(available - cost, self.limit, reset), next)
        } else {
            let reset = self.settles_in(r, left);
            let retry = self.retry_after(r, left, cost);
            Verdict::Deny(Decision::deny(available, self.limit, retry, reset))
        }
    }

    /// Nanoseconds until `snap` is at rest, seen at `now` with nothing more admitted: what a
    /// refusal at `now` reports as its reset_after. The composite policy reports it for a
    /// band that would allow.
    #[inline]
    pub(crate) fn reset_after(&self, snap: Snapshot, now: u64) -> u64 {
        let r = self.roll(snap, now);
        self.settles_in(r, self.window - r.elapsed)
    }

    /// Nanoseconds until both counts of `r` have rolled out, `left` nanoseconds before the
    /// end of its window: the start of window `i + 2` if the current count is not zero, else
    /// of window `i + 1` if the previous one is not, else now.
    #[inline]
    fn settles_in(&self, r: Rolled, left: u64) -> u64 {
        if r.current > 0 {
            left + self.window
        } else if r.previous > 0 {
            left
        } else {
            0
        }
    }

    /// For a request refused at `r`: nanoseconds until `used + cost <= N`, if nothing else is
    /// admitted meanwhile. `used` never grows with time, so the first such instant is the
    /// retry time. At most `2W`.
    fn retry_after(&self, r: Rolled, left: u64, cost: u64) -> u64 {
        // In this window: needs floor(previous * left' / W) <= N - current - cost, that is
        // left' <= longest. The refusal means left > longest; a later instant of this window
        // has left' >= 1.
        if let Some(spare) = self.limit.checked_sub(r.current + cost) {
            let longest = self.longest_left(r.previous, spare);
            if longest >= 1 {
                return left - longest;
            }
        }
        // In the next window the current count is the previous one and nothing is current.
        let longest = self.longest_left(r.current, self.limit.saturating_sub(cost));
        if longest >= self.window {
            // Fits from the window's first nanosecond.
            left
        } else if longest >= 1 {
            left + self.window - longest
        } else {
            // Only the window after: both counts have rolled out.
            left + self.window
        }
    }

    /// `true` when `snap` decides exactly as a fresh state from `now` on: both counts are zero
    /// once rolled to now's window.
    #[inline]
    pub(crate) fn is_at_rest(&self, snap: Snapshot, now: u64) -> bool {
        let r = self.roll(snap, now);
        r.current == 0 && r.previous == 0
    }

    /// The start of the window `snap`'s current count belongs to: a reservation's mark.
    #[inline]
    pub(crate) fn mark(&self, snap: Snapshot) -> u64 {
        // The index was some clock reading divided by W: the product fits.
        snap.index.saturating_mul(self.window)
    }

    /// The snapshot after settling, at `now`, an admission of `held` permits counted in the
    /// window starting at `mark`, whose real cost was `actual`.
    ///
    /// A refund of `k` takes `k` from the count of that window if it is still the current or
    /// the previous one (never below zero); an older window counts for nothing any more. A
    /// charge of `k` more adds `k` to the current window, admitted whatever the estimate: a
    /// debt later requests wait out, with the count capped at `2N` (both windows roll out
    /// within `2W` whatever they hold).
    pub(crate) fn settle(
        &self,
        snap: Snapshot,
        held: u64,
        mark: u64,
        actual: u64,
        now: u64,
    ) -> Snapshot {
        let r = self.roll(snap, now);
        let (mut current, mut previous) = (r.current, r.previous);
        if actual <= held {
            let give = held - actual;
            let at = mark / self.window;
            if at == r.index {
                current -= give.min(current);
            } else if at.saturating_add(1) == r.index {
                previous -= give.min(previous);
            }
        } else {
            // 2N <= 2^32 - 2: below the retired value's all-ones count.
            current = current
                .saturating_add(actual - held)
                .min(2 * self.limit)
                .max(current);
        }
        Snapshot {
            index: r.index,
            current: current as u32,
            previous: previous as u32,
        }
    }

    /// The permits `snap` has in use at `now`, as a policy change carries them: the weighted
    /// estimate rounded up (a decision rounds the previous window's share down, admitting
    /// what it has room for; a move to another policy counts every permit partly in use as
    /// spent), at most N.
    pub(crate) fn in_use(&self, snap: Snapshot, now: u64) -> u64 {
        let r = self.roll(snap, now);
        let left = self.window - r.elapsed;
        // previous <= 2N < 2^32 and left <= W <= 2^62: the product fits in u128, the quotient
        // (at most previous) in u64.
        let share = (u128::from(r.previous) * u128::from(left)).div_ceil(u128::from(self.window));
        (r.current + share as u64).min(self.limit)
    }

    /// The permits `snap` has in use at `now` ([`Counter::in_use`]).
    fn carry(&self, snap: Snapshot, now: u64) -> Carry {
        Carry::single(self.window, self.in_use(snap, now))
    }
}

/// One key's sliding counter: window index and both counts packed in one 128-bit atomic word,
/// updated by compare-and-swap.
///
/// | bits | field | meaning |
/// |---|---|---|
/// | `0..64` | index | the window the counts belong to (`now / W` at the last admission) |
/// | `64..96` | current | permits admitted in window `index` |
/// | `96..128` | previous | permits admitted in window `index - 1` |
/// | all ones | retired | retired: never admits, never revived (no live state packs to it: its counts, `u32::MAX`, are above any valid policy's permits, `Policy::MAX_COUNTER_PERMITS = 2^31 - 1`) |
///
/// A fresh state is all zeros. 64 bits cannot hold a full window index and both counts for
/// every valid policy: `W` may be 1 ns, so the index needs all 64 bits of a nanosecond clock,
/// and it must never wrap, or a key idle for a whole wrap would look current again. Hence
/// 128 bits (`portable-atomic`: one `cmpxchg16b` on x86-64, `casp` on AArch64 with LSE).
/// Memory per key: 16 bytes, aligned to 16.
///
/// Orderings: the word is the whole state, so every access is `Relaxed` and the
/// compare-and-swap loop is [`update`]'s (see `crate::engine::word` for why that is exact).
#[derive(Debug)]
pub(crate) struct CounterCell {
    word: AtomicU128,
}

impl Reusable for CounterCell {
    fn blank() -> Self {
        CounterCell {
            word: AtomicU128::new(0),
        }
    }

    fn reuse(&self, from: Self) {
        // Relaxed: the cell is unreachable until the index publishes it (see `Reusable`).
        self.word
            .store(from.word.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

impl RateState for CounterCell {
    type Cells = Slab<Self>;
    type Params = Counter;
    type OwnParams = Counter;

    fn params(policy: &Policy) -> Counter {
        Counter::new(policy.first_band())
    }

    fn max_cost(counter: &Counter) -> u64 {
        counter.limit
    }

    fn stamp(counter: &Counter) -> u64 {
        band_stamp(2, counter.limit, counter.window)
    }

    #[inline]
    fn fresh(_: &Counter) -> Self {
        CounterCell {
            word: AtomicU128::new(Snapshot::default().pack()),
        }
    }

    #[inline(always)]
    fn reserve<C: Clock + ?Sized>(
        &self,
        counter: &Counter,
        clock: &C,
        cost: u64,
    ) -> Option<(Decision, Marks)> {
        // The clock is read once, before the word, as in the token bucket (a retry then only
        // recomputes from the word the failed CAS returned). A `now` in a window the word has
        // already moved past counts as zero time elapsed in the word's window (see
        // `Counter::decide`), which can only refuse more, never admit more.
        let now = clock.now();
        update(&self.word, |word| {
            match counter.decide(Snapshot::unpack(word), now, cost) {
                Verdict::Deny(decision) => Update::keep((decision, 0)),
                Verdict::Allow(decision, next) => {
                    Update::write(next.pack(), (decision, counter.mark(next)))
                }
            }
        })
        .map(|(decision, mark)| (decision, one_mark(mark)))
    }

    fn settle(
        &self,
        counter: &Counter,
        held: u64,
        marks: &Marks,
        actual: u64,
        now: u64,
    ) -> Option<()> {
        update(&self.word, |word| {
            let next = counter.settle(Snapshot::unpack(word), held, marks[0], actual, now);
            Update::write(next.pack(), ())
        })
    }

    #[inline]
    fn peek<C: Clock + ?Sized>(&self, counter: &Counter, clock: &C, cost: u64) -> Option<Decision> {
        // The one word is the whole snapshot; nothing is written.
        let word = live(&self.word)?;
        Some(
            counter
                .decide(Snapshot::unpack(word), clock.now(), cost)
                .decision(),
        )
    }

    #[inline]
    fn is_at_rest(&self, counter: &Counter, now: u64) -> bool {
        // A snapshot is all a reader needs: eviction uses it to skip states not at rest, and
        // `try_retire` re-checks with a CAS before a state is removed.
        live(&self.word).is_some_and(|word| counter.is_at_rest(Snapshot::unpack(word), now))
    }

    fn carry(&self, counter: &Counter, now: u64) -> Option<Carry> {
        live(&self.word).map(|word| counter.carry(Snapshot::unpack(word), now))
    }

    fn retire_with_carry(&self, counter: &Counter, now: u64) -> Option<Carry> {
        // A CAS to the retired value from the exact word the carry was counted from.
        update(&self.word, |word| {
            Update::write(u128::RETIRED, counter.carry(Snapshot::unpack(word), now))
        })
    }

    fn from_carry(counter: &Counter, carry: &Carry, now: u64) -> Self {
        single_from_carry(counter, counter.window, counter.limit, carry, now)
    }

    fn try_retire(&self, counter: &Counter, now: u64) -> bool {
        // The CAS from the exact at-rest word read is what makes retiring exact: a request
        // that admitted in between changed the word, and the word it left is not at rest.
        update(&self.word, |word| {
            if counter.is_at_rest(Snapshot::unpack(word), now) {
                Update::write(u128::RETIRED, true)
            } else {
                Update::keep(false)
            }
        })
        .unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Algorithm;
    use std::time::Duration;

    const SEC: u64 = 1_000_000_000;

    fn counter(permits: u64, window: u64) -> Counter {
        let policy = Policy::new(
            Algorithm::SlidingCounter,
            permits,
            Duration::from_nanos(window),
        );
        Counter::new(policy.unwrap().first_band())
    }

    /// The pure arithmetic driving a plain snapshot.
    struct Sim {
        counter: Counter,
        snap: Snapshot,
    }

    impl Sim {
        fn new(permits: u64, window: u64) -> Self {
            Sim {
                counter: counter(permits, window),
                snap: Snapshot::default(),
            }
        }

        fn decide(&mut self, now: u64, cost: u64) -> Verdict<Snapshot> {
            let verdict = self.counter.decide(self.snap, now, cost);
            if let Verdict::Allow(_, next) = verdict {
                self.snap = next;
            }
            verdict
        }

        /// Expects an admission; returns its remaining permits.
        #[track_caller]
        fn allowed(&mut self, now: u64, cost: u64) -> u64 {
            match self.decide(now, cost) {
                Verdict::Allow(d, _) => d.remaining(),
                Verdict::Deny(d) => panic!("expected an admission at {now}, got {d:?}"),
            }
        }

        /// Expects a refusal; checks that its retry_after is exact and returns the decision.
        #[track_caller]
        fn denied(&mut self, now: u64, cost: u64) -> Decision {
            let d = match self.decide(now, cost) {
                Verdict::Deny(d) => d,
                Verdict::Allow(d, _) => panic!("expected a refusal at {now}, got {d:?}"),
            };
            let retry = d.retry_after().as_nanos() as u64;
            assert!(retry >= 1 && retry <= 2 * self.counter.window, "{d:?}");
            let fits = |t| matches!(self.counter.decide(self.snap, t, cost), Verdict::Allow(..));
            assert!(
                !fits(now + retry - 1),
                "retry_after {retry} is too long: {d:?}"
            );
            assert!(fits(now + retry), "retry_after {retry} is too short: {d:?}");
            d
        }
    }

    #[test]
    fn pack_round_trips_and_never_meets_the_tombstone() {
        let snap = Snapshot {
            index: u64::MAX,
            current: Policy::MAX_COUNTER_PERMITS as u32,
            previous: Policy::MAX_COUNTER_PERMITS as u32,
        };
        assert_eq!(Snapshot::unpack(snap.pack()), snap);
        assert_ne!(snap.pack(), u128::RETIRED);
        assert_eq!(Snapshot::default().pack(), 0);
        let snap = Snapshot {
            index: 7,
            current: 3,
            previous: 9,
        };
        assert_eq!(snap.pack(), 7 | 3 << 64 | 9 << 96);
    }

    #[test]
    fn reference_trace() {
        let mut sim = Sim::new(10, 60 * SEC);
        for left in (2..=9).rev() {
            assert_eq!(sim.allowed(50 * SEC, 1), left);
        }
        for left in [3, 2, 1, 0] {
            assert_eq!(sim.allowed(69 * SEC, 1), left);
        }
        let d = sim.denied(69 * SEC, 1);
        // previous 8 * (60 - e) / 60 + 4 < 10 first holds at e = 15 s + 1 ns.
        assert_eq!(d.retry_after(), Duration::from_nanos(6 * SEC + 1));
        assert_eq!(d.remaining(), 0);
        assert_eq!(d.reset_after(), Duration::from_secs(111));
        assert_eq!(sim.denied(75 * SEC, 1).remaining(), 0);
        assert_eq!(sim.allowed(75 * SEC + 1_000_000, 1), 0);
    }

    #[test]
    fn remaining_and_refusal_with_cost() {
        let mut sim = Sim::new(10, 60 * SEC);
        assert_eq!(sim.allowed(50 * SEC, 8), 2);
        // At 69 s the estimate is 6.8: four more fit.
        let d = sim.denied(69 * SEC, 5);
        assert_eq!(d.remaining(), 4);
        assert_eq!(d.reset_after(), Duration::from_secs(51));
        assert_eq!(sim.allowed(69 * SEC, 4), 0);
    }

    #[test]
    fn full_current_window_is_solved_in_the_next() {
        let mut sim = Sim::new(4, 100);
        assert_eq!(sim.allowed(10, 4), 0);
        // The current window alone is full: at 100 + e the estimate is 4 * (100 - e) / 100,
        // below 4 - 2 + 1 = 3 from e = 26 on.
        let d = sim.denied(10, 2);
        assert_eq!(d.retry_after(), Duration::from_nanos(116));
        assert_eq!(d.reset_after(), Duration::from_nanos(190));
        // Cost 4 needs the estimate below 1: from e = 76 on.
        assert_eq!(sim.denied(10, 4).retry_after(), Duration::from_nanos(166));
        // Cost 1 at the end of the window: 4 * 99 / 100 < 4 a nanosecond into the next.
        assert_eq!(sim.denied(99, 1).retry_after(), Duration::from_nanos(2));
    }

    #[test]
    fn a_window_two_back_counts_for_nothing() {
        let mut sim = Sim::new(3, 10);
        assert_eq!(sim.allowed(5, 3), 0);
        // At 10 + e the previous window weighs 3 * (10 - e) / 10.
        assert_eq!(sim.denied(10, 1).retry_after(), Duration::from_nanos(1));
        assert_eq!(sim.denied(10, 3).retry_after(), Duration::from_nanos(7));
        assert!(!sim.counter.is_at_rest(sim.snap, 19));
        assert!(sim.counter.is_at_rest(sim.snap, 20));
        assert_eq!(sim.allowed(20, 3), 0);
    }

    #[test]
    fn window_of_one_nanosecond() {
        let mut sim = Sim::new(1, 1);
        assert_eq!(sim.allowed(7, 1), 0);
        // At 8 the previous window still weighs fully (elapsed 0): free again at 9.
        let d = sim.denied(7, 1);
        assert_eq!(
            (d.retry_after(), d.reset_after()),
            (Duration::from_nanos(2), Duration::from_nanos(2))
        );
        let d = sim.denied(8, 1);
        assert_eq!(
            (d.retry_after(), d.reset_after()),
            (Duration::from_nanos(1), Duration::from_nanos(1))
        );
        assert!(sim.counter.is_at_rest(sim.snap, 9));
        assert_eq!(sim.allowed(9, 1), 0);
    }

    #[test]
    fn one_permit_per_nanosecond() {
        // N == W: the densest valid policy. A full window needs both counts to roll out.
        let mut sim = Sim::new(4, 4);
        assert_eq!(sim.allowed(0, 4), 0);
        assert_eq!(sim.denied(0, 4).retry_after(), Duration::from_nanos(8));
        assert_eq!(sim.denied(0, 1).retry_after(), Duration::from_nanos(5));
    }

    #[test]
    fn huge_permits_and_windows_stay_exact() {
        let n = Policy::MAX_COUNTER_PERMITS;
        let w = Policy::MAX_WINDOW.as_nanos() as u64;
        let mut sim = Sim::new(n, w);
        assert_eq!(sim.allowed(w - 1, n), 0);
        // Next window, one ns in: previous weighs n * (w - 1) / w, just under n.
        assert_eq!(sim.allowed(w + 1, 1), 0);
        let d = sim.denied(w + 1, 1);
        assert_eq!(d.remaining(), 0);
        let d = sim.denied(w + 1, n);
        // In window 2 the previous count is 1, weighing nothing from its second nanosecond.
        assert_eq!(d.retry_after().as_nanos() as u64, w);
        assert!(!sim.counter.is_at_rest(sim.snap, 3 * w - 1));
        assert!(sim.counter.is_at_rest(sim.snap, 3 * w));
    }

    #[test]
    fn extreme_clock_readings_do_not_overflow() {
        let mut sim = Sim::new(1, 1);
        assert_eq!(sim.allowed(u64::MAX, 1), 0);
        assert_eq!(sim.snap.index, u64::MAX);
        match sim.decide(u64::MAX, 1) {
            Verdict::Deny(d) => assert_eq!(d.retry_after(), Duration::from_nanos(2)),
            Verdict::Allow(d, _) => panic!("{d:?}"),
        }
        let mut sim = Sim::new(5, 1 << 62);
        assert_eq!(sim.allowed(u64::MAX, 5), 0);
        assert!(matches!(sim.decide(u64::MAX, 1), Verdict::Deny(_)));
    }

    #[test]
    fn backwards_clock_counts_as_zero_elapsed() {
        let mut sim = Sim::new(4, 100);
        assert_eq!(sim.allowed(550, 3), 1);
        // Back to window 2: decided as at the start of window 5, where the counts belong.
        assert_eq!(sim.allowed(250, 1), 0);
        assert_eq!(sim.snap.index, 5);
        assert!(!sim.counter.is_at_rest(sim.snap, 250));
        // Measured from 500: the count of 4 rolls to previous at 600 and weighs less than 3
        // from 601 on; from 250 the real wait would be longer, but never reported above 2W.
        match sim.decide(250, 1) {
            Verdict::Deny(d) => {
                assert_eq!(d.retry_after(), Duration::from_nanos(101));
                assert_eq!(d.reset_after(), Duration::from_nanos(200));
            }
            Verdict::Allow(d, _) => panic!("{d:?}"),
        }
        // Back in window 5 proper, nothing was forgotten.
        assert_eq!(sim.denied(599, 1).remaining(), 0);
        assert_eq!(sim.allowed(601, 1), 0);
    }

    #[test]
    fn a_reading_just_behind_another_threads_admission_admits_nothing_extra() {
        // Window 0 holds 5. A thread reading 100 admits 1 in window 1; another that read 99
        // (a moment earlier) decides after it. It must see what a reading of 100 sees: 5
        // carried in full plus 1, so 4 left, not the 9 that weighing the carried 5 by the
        // 1 ns left of window 0 would give.
        let mut sim = Sim::new(10, 100);
        assert_eq!(sim.allowed(50, 5), 5);
        assert_eq!(sim.allowed(100, 1), 4);
        match sim.decide(99, 5) {
            Verdict::Deny(d) => assert_eq!(d.remaining(), 4),
            Verdict::Allow(d, _) => panic!("{d:?}"),
        }
        assert_eq!(sim.allowed(99, 4), 0);
    }

    #[test]
    #[cfg(not(tollgate_loom))]
    fn memory_per_key_is_as_documented() {
        assert_eq!(std::mem::size_of::<CounterCell>(), 16);
    }

    #[test]
    fn cell_follows_the_arithmetic_and_retires_exactly() {
        let clock = crate::FakeClock::new();
        let counter = Counter::new(
            "sliding-counter 10/min"
                .parse::<Policy>()
                .unwrap()
                .first_band(),
        );
        let cell = CounterCell::fresh(&counter);
        assert!(cell.is_at_rest(&counter, 0));
        clock.set(Duration::from_secs(50));
        for _ in 0..8 {
            assert!(cell.try_acquire(&counter, &clock, 1).unwrap().is_allowed());
        }
        clock.set(Duration::from_secs(69));
        for left in [3, 2, 1, 0] {
            assert_eq!(
                cell.try_acquire(&counter, &clock, 1).unwrap().remaining(),
                left
            );
        }
        let d = cell.try_acquire(&counter, &clock, 1).unwrap();
        assert_eq!(d.retry_after(), Duration::from_nanos(6 * SEC + 1));
        assert!(!cell.try_retire(&counter, 180 * SEC - 1));
        assert!(cell.is_at_rest(&counter, 180 * SEC));
        assert!(cell.try_retire(&counter, 180 * SEC));
        assert!(!cell.is_at_rest(&counter, 180 * SEC));
        assert!(!cell.try_retire(&counter, 180 * SEC));
        assert_eq!(cell.try_acquire(&counter, &clock, 1), None);
    }
}
