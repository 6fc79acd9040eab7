//! The token bucket, computed as GCRA (the generic cell rate algorithm).
//!
//! The whole state of a key is one number, the theoretical arrival time (TAT): the instant at
//! which the bucket would be full again. With emission interval `T = window / permits`
//! (rounded up to whole nanoseconds) and burst allowance `B = permits * T`, a request of cost
//! `n` at `now` computes `new = max(tat, now) + n*T` and is allowed iff `new - now <= B`.
//!
//! Rounding `T` up keeps every admission within the exact policy (the steady rate is at most
//! `permits / window`) while `B = permits * T` still lets a full burst of `permits` through.
//! For 1 s / 3 the interval is 333,333,334 ns instead of 333,333,333.3: the steady rate is
//! lower than exact by one part in 333 million.
//!
//! [`Gcra`] is the pure arithmetic; [`GcraCell`] owns the atomic word and the CAS loop.

use crate::clock::Clock;
use crate::decision::Decision;
use crate::engine::cells::{Reusable, Slab};
use crate::engine::divide::Divisor;
use crate::engine::retry::Retry;
use crate::engine::state::{
    band_stamp, in_use, one_mark, single_from_carry, Carry, RateState, Verdict,
};
use crate::engine::sync::{AtomicU64, Ordering};
use crate::engine::word::{live, update, update_noting, update_once, Once, Retired, Update};
use crate::policy::{Band, Policy};
use crate::reservation::Marks;

/// The furthest instant a lease (`GcraCell::lease`) reaches: below the retired value, and
/// below the two values a stripe keeps as markers (`engine::stripes`).
pub(crate) const LAST_LEASED: u64 = u64::MAX - 2;

/// GCRA parameters derived from a policy, and the pure decision function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Gcra {
    /// T: nanoseconds one permit takes to refill, rounded up; at least 1.
    interval: u64,
    /// B = permits * T: how far the TAT may run ahead of now. Below 2^63 because
    /// `Policy` keeps `window <= 2^62` and `permits <= window`.
    burst: u64,
    /// N, the policy's permits.
    limit: u64,
    /// W, the policy's window in ns (what a policy change compares bands by).
    window: u64,
    /// Division by T, as a multiplication: every decision divides by it.
    per_interval: Divisor,
}

impl Gcra {
    /// Parameters for `band` (any algorithm; only permits and window are read).
    pub(crate) fn new(band: Band) -> Self {
        let limit = band.permits();
        // Policy guarantees 1 <= permits <= window_nanos <= 2^62, so interval >= 1 and
        // burst = limit * interval < window + limit <= 2^63: no overflow.
        let interval = band.window_nanos().div_ceil(limit);
        Gcra {
            interval,
            burst: limit * interval,
            limit,
            window: band.window_nanos(),
            per_interval: Divisor::new(interval),
        }
    }

    /// Decides a request of `cost` (1..=limit) at `now` against stored `tat`.
    ///
    /// A TAT further ahead of now than `2B` (the clock went backwards) is treated as
    /// `now + 2B`, the furthest a valid state can be (a burst spent, then a reservation
    /// settled a burst's worth above its cost: [`Gcra::settle`]), so a faulty clock never
    /// stretches a retry_after beyond what the policy could need.
    #[inline(always)]
    pub(crate) fn decide(&self, tat: u64, now: u64, cost: u64) -> Verdict<u64> {
        // debt = max(tat, now) - now, clamped to the furthest a valid state can be.
        let debt = tat.saturating_sub(now).min(self.max_debt());
        // debt <= 2B and cost * T <= B: saturating only guards B close to 2^63.
        let new_debt = debt.saturating_add(cost.saturating_mul(self.interval).min(self.burst));
        // The new TAT must stay at or below `LAST_LEASED`, under the retired value and the
        // stripes' markers. A clock reading that close to `u64::MAX` (584 years from its
        // zero: a clock gone wrong, or a `FakeClock` set to the end of its range) cannot
        // store the debt, and a debt not stored would let the next request through as if
        // the bucket were full: refused instead, as a request beyond the burst is. The sum
        // wraps exactly when it would not fit in u64 (then it is below `now`).
        let new_tat = now.wrapping_add(new_debt);
        if new_debt <= self.burst && new_tat <= LAST_LEASED && new_tat >= now {
            let remaining = self.per_interval.divide(self.burst - new_debt);
            Verdict::Allow(Decision::allow(remaining, self.limit, new_debt), new_tat)
        } else if new_debt <= self.burst {
            // No time comes at which the TAT fits: the wait is the request's own interval.
            // (`room` would say what still fits; computed here, inline in every decision,
            // it cost a keyed hit 4 ns in `examples/hot_path.rs`, for a clock 584 years on.)
            Verdict::Deny(Decision::deny(0, self.limit, self.interval, debt))
        } else {
            // A settled charge may leave more debt than the burst: nothing is available.
            let remaining = self.per_interval.divide(self.burst.saturating_sub(debt));
            Verdict::Deny(Decision::deny(
                remaining,
                self.limit,
                new_debt - self.burst,
                debt,
            ))
        }
    }

    /// T: the nanoseconds one permit takes to refill.
    #[inline(always)]
    pub(crate) const fn interval(&self) -> u64 {
        self.interval
    }

    /// B: how far the TAT may run ahead of now.
    #[inline(always)]
    pub(crate) const fn burst(&self) -> u64 {
        self.burst
    }

    /// Whole intervals in `nanos`: `nanos / T`, by multiplication.
    #[inline(always)]
    pub(crate) fn intervals(&self, nanos: u64) -> u64 {
        self.per_interval.divide(nanos)
    }

    /// N: the policy's permits.
    #[inline(always)]
    pub(crate) const fn limit(&self) -> u64 {
        self.limit
    }

    /// Permits a state holding `tat` has available at `now` (clamped like
    /// [`Gcra::decide`], and, like it, none past what fits below `LAST_LEASED`).
    #[inline(always)]
    pub(crate) fn room(&self, tat: u64, now: u64) -> u64 {
        let room = self
            .per_interval
            .divide(self.burst.saturating_sub(self.reset_after(tat, now)));
        let start = tat.max(now);
        if start <= LAST_LEASED - self.burst {
            room
        } else {
            // Near the end of the clock's range: only what still fits below `LAST_LEASED`,
            // as `decide` admits.
            room.min(self.per_interval.divide(LAST_LEASED.saturating_sub(start)))
        }
    }

    /// Nanoseconds until a state holding `tat` is at rest, seen at `now` with nothing more
    /// admitted: what a refusal at `now` reports as its reset_after (clamped to `B` like
    /// [`Gcra::decide`]). The composite policy reports it for a band that would allow.
    #[inline]
    pub(crate) fn reset_after(&self, tat: u64, now: u64) -> u64 {
        tat.saturating_sub(now).min(self.max_debt())
    }

    /// The most a TAT may run ahead of now: `2B`, a full burst plus a burst of debt charged by
    /// settling reservations. `B < 2^63`, so it fits.
    #[inline(always)]
    fn max_debt(&self) -> u64 {
        2 * self.burst
    }

    /// The TAT after settling, at `now`, an admission of `held` permits that wrote the TAT
    /// `mark`, whose real cost was `actual`, from a state holding `tat`.
    ///
    /// A refund of `k` permits moves the TAT back by `k*T`, but never by more than
    /// `mark - now`, what is left of the debt the admission ran up (time has already given
    /// back the rest), and never below now (a full bucket). `now` is read as at least
    /// `tat - B`, a lower bound of the latest clock reading an admission decided at, so a
    /// clock set back does not make a refund larger. The bucket keeps one number, so it
    /// cannot tell which permits came back first: the rule is exact when no reservation
    /// taken before this one was refunded since it was taken (in particular when
    /// reservations are settled newest first), or before time has returned any of their
    /// permits. When an earlier reservation is refunded while a later one is outstanding
    /// (settling oldest first does this), the later one's mark still counts the time the
    /// earlier refund gave back, so its refund may give back permits time already
    /// returned, at most its own (see `docs/ALGORITHMS.md`). A charge of `k` more moves the TAT on by `k*T`, admitted
    /// whatever the state: a debt later requests wait out, up to `now + 2B`.
    pub(crate) fn settle(&self, tat: u64, held: u64, mark: u64, actual: u64, now: u64) -> u64 {
        if actual <= held {
            if tat <= now {
                return tat;
            }
            let latest = now.max(tat.saturating_sub(self.burst));
            let give = (held - actual)
                .saturating_mul(self.interval)
                .min(mark.saturating_sub(latest));
            tat.saturating_sub(give).max(now)
        } else {
            // Below the retired value, as in `decide`.
            let ceiling = now.saturating_add(self.max_debt()).min(u64::RETIRED - 1);
            let charged = tat
                .max(now)
                .min(ceiling)
                .saturating_add((actual - held).saturating_mul(self.interval));
            tat.max(charged.min(ceiling))
        }
    }

    /// `true` when a state holding `tat` decides exactly as a fresh one from `now` on.
    #[inline]
    pub(crate) fn is_at_rest(tat: u64, now: u64) -> bool {
        tat <= now
    }

    /// The permits a state holding `tat` has in use at `now`.
    fn carry(&self, tat: u64, now: u64) -> Carry {
        let probe = self.decide(tat, now, 1).decision();
        Carry::single(self.window, in_use(self.limit, &probe))
    }
}

/// One key's GCRA state: the TAT in a single atomic word, updated by compare-and-swap.
///
/// | value | meaning |
/// |---|---|
/// | `0 ..= u64::MAX - 1` | live: the theoretical arrival time, ns on the limiter's clock |
/// | `u64::MAX` | retired: never admits, never revived |
///
/// Orderings: the TAT is the whole state, so a decision's accesses are `Relaxed` and the
/// compare-and-swap loop is [`update`]'s (see `crate::engine::word` for why that is exact).
/// The stripes of a contended key (`engine::stripes`) publish through it: their leases,
/// give-backs and refunds write it with `AcqRel` and their refusals read it with `Acquire`.
#[derive(Debug)]
pub(crate) struct GcraCell {
    tat: AtomicU64,
}

impl Reusable for GcraCell {
    fn blank() -> Self {
        GcraCell {
            tat: AtomicU64::new(0),
        }
    }

    fn reuse(&self, from: Self) {
        // Relaxed: the cell is unreachable until the index publishes it (see `Reusable`).
        self.tat
            .store(from.tat.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

impl GcraCell {
    /// [`RateState::reserve`] at `now`, calling `lost` for each compare-and-swap lost to
    /// another thread on the way: how a limiter notices that a key is contended (see
    /// `engine::stripes`). `None` when retired.
    #[inline(always)]
    pub(crate) fn reserve_at(
        &self,
        gcra: &Gcra,
        now: u64,
        cost: u64,
        lost: impl FnMut(),
    ) -> Option<(Decision, u64)> {
        update_noting(
            &self.tat,
            |tat| match gcra.decide(tat, now, cost) {
                Verdict::Deny(decision) => Update::keep((decision, 0)),
                Verdict::Allow(decision, new_tat) => Update::write(new_tat, (decision, new_tat)),
            },
            lost,
        )
    }

    /// [`GcraCell::reserve_at`] in one compare-and-swap, not retried when another thread wrote
    /// the TAT first (nothing is written then): the decision and the TAT an admission wrote
    /// (0 for a refusal).
    #[inline(always)]
    pub(crate) fn reserve_once(&self, gcra: &Gcra, now: u64, cost: u64) -> Once<(Decision, u64)> {
        update_once(&self.tat, |tat| match gcra.decide(tat, now, cost) {
            Verdict::Deny(decision) => Update::keep((decision, 0)),
            Verdict::Allow(decision, new_tat) => Update::write(new_tat, (decision, new_tat)),
        })
    }

    /// The TAT, for an answer only (`Relaxed`: see `crate::engine::word`); `None` when
    /// retired.
    #[inline(always)]
    pub(crate) fn tat_relaxed(&self) -> Option<u64> {
        live(&self.tat)
    }

    /// The TAT, read with `Acquire` for the stripes' protocol (`engine::stripes`,
    /// "Orderings"); `None` when retired.
    #[inline]
    pub(crate) fn tat_acquire(&self) -> Option<u64> {
        // Acquire: pairs with the AcqRel compare-and-swap of every lease, so the stripe a
        // lease was claimed for is seen claimed (see `engine::stripes`).
        let tat = self.tat.load(Ordering::Acquire);
        (tat != u64::RETIRED).then_some(tat)
    }

    /// Takes up to `max` permits at once for a stripe (`engine::stripes`): the run of the
    /// timeline `(start, end]` from `start = max(tat, now)`, `end` no further than `B` ahead
    /// of `now`, a whole number of intervals long. `Some(None)` when not one permit is
    /// available at `now`; `None` when the state is retired.
    pub(crate) fn lease(&self, gcra: &Gcra, now: u64, max: u64) -> Option<Option<(u64, u64)>> {
        // Relaxed: the compare-and-swap below reads the value it replaces.
        let mut tat = self.tat.load(Ordering::Relaxed);
        let mut retry = Retry::new();
        loop {
            if tat == u64::RETIRED {
                return None;
            }
            let start = tat.max(now);
            let count = gcra.room(tat, now).min(max);
            if count == 0 {
                return Some(None);
            }
            // count * T <= B - (start - now) < 2^63, and `room` counts only what fits below
            // `LAST_LEASED`: the end stays under the retired value and the stripes' markers.
            let end = start + count * gcra.interval;
            // AcqRel: the Release half publishes the claim of the stripe the lease is for to
            // every request that reads the TAT with Acquire afterwards (`engine::stripes`).
            match self
                .tat
                .compare_exchange(tat, end, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return Some(Some((start, end))),
                Err(seen) => {
                    tat = seen;
                    retry.spin();
                }
            }
        }
    }

    /// Stores `new` if the TAT is still `current` (`AcqRel`, as a lease's): a settle or a
    /// give-back on a key with stripes (`engine::stripes`). `false` when another write came
    /// first, or the state is retired.
    pub(crate) fn replace(&self, current: u64, new: u64) -> bool {
        // AcqRel: read by requests that then look at the stripes, as a lease's.
        self.tat
            .compare_exchange(current, new, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    }
}

impl RateState for GcraCell {
    type Cells = Slab<Self>;
    const STRIPED: bool = true;
    type Params = Gcra;
    type OwnParams = Gcra;

    fn params(policy: &Policy) -> Gcra {
        Gcra::new(policy.first_band())
    }

    fn max_cost(gcra: &Gcra) -> u64 {
        gcra.limit
    }

    fn stamp(gcra: &Gcra) -> u64 {
        band_stamp(1, gcra.limit, gcra.window)
    }

    #[inline]
    fn fresh(_: &Gcra) -> Self {
        GcraCell {
            tat: AtomicU64::new(0),
        }
    }

    #[inline(always)]
    fn reserve<C: Clock + ?Sized>(
        &self,
        gcra: &Gcra,
        clock: &C,
        cost: u64,
    ) -> Option<(Decision, Marks)> {
        // The clock is read once, before the state, as governor does: a clock read inside the
        // loop would sit between every load and its CAS, the window in which another
        // thread's CAS lands under contention, and each retry would pay the clock again. A
        // retry recomputes from the TAT it loads again (see `update`), with the same `now`.
        // Deciding with a `now` older than the TAT another thread just wrote is
        // exact: the state only ever moves on from the value the CAS succeeds on, and an older
        // `now` only makes `new_tat - now` larger, so it can refuse where a later reading
        // would admit (the caller's request arrived before that reading) but never admit more.
        // A refusal made from a stale TAT is the refusal of the instant that TAT was current
        // (the CAS from it would fail, but nothing is written), an instant within the call.
        self.reserve_at(gcra, clock.now(), cost, || {})
            .map(|(decision, mark)| (decision, one_mark(mark)))
    }

    fn settle(&self, gcra: &Gcra, held: u64, marks: &Marks, actual: u64, now: u64) -> Option<()> {
        update(&self.tat, |tat| {
            Update::write(gcra.settle(tat, held, marks[0], actual, now), ())
        })
    }

    #[inline]
    fn peek<C: Clock + ?Sized>(&self, gcra: &Gcra, clock: &C, cost: u64) -> Option<Decision> {
        // The one word is the whole snapshot; nothing is written.
        let tat = live(&self.tat)?;
        Some(gcra.decide(tat, clock.now(), cost).decision())
    }

    #[inline]
    fn is_at_rest(&self, _: &Gcra, now: u64) -> bool {
        // A snapshot is all a reader needs: eviction uses it to skip states not at rest, and
        // `try_retire` re-checks with a CAS before a state is removed.
        live(&self.tat).is_some_and(|tat| Gcra::is_at_rest(tat, now))
    }

    fn carry(&self, gcra: &Gcra, now: u64) -> Option<Carry> {
        live(&self.tat).map(|tat| gcra.carry(tat, now))
    }

    fn retire_with_carry(&self, gcra: &Gcra, now: u64) -> Option<Carry> {
        // A CAS to the retired value from the exact TAT the carry was counted from.
        update(&self.tat, |tat| {
            Update::write(u64::RETIRED, gcra.carry(tat, now))
        })
    }

    fn from_carry(gcra: &Gcra, carry: &Carry, now: u64) -> Self {
        single_from_carry(gcra, gcra.window, gcra.limit, carry, now)
    }

    fn try_retire(&self, _: &Gcra, now: u64) -> bool {
        // The CAS from the exact at-rest value read is what makes retiring exact: a request
        // that admitted in between changed the value, and the value it left is not at rest.
        update(&self.tat, |tat| {
            if Gcra::is_at_rest(tat, now) {
                Update::write(u64::RETIRED, true)
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

    const MS: u64 = 1_000_000;

    fn gcra(permits: u64, window: Duration) -> Gcra {
        Gcra::new(
            Policy::new(Algorithm::TokenBucket, permits, window)
                .unwrap()
                .first_band(),
        )
    }

    fn allowed(v: Verdict<u64>) -> (u64, u64) {
        match v {
            Verdict::Allow(d, tat) => (d.remaining(), tat),
            Verdict::Deny(d) => panic!("expected an admission, got {d:?}"),
        }
    }

    fn denied(v: Verdict<u64>) -> Decision {
        match v {
            Verdict::Deny(d) => d,
            Verdict::Allow(d, _) => panic!("expected a refusal, got {d:?}"),
        }
    }

    /// A charge near the end of the clock's range saturates one below the retired value: the
    /// state stays live (and refuses), it never turns into a retired one.
    #[test]
    fn a_charge_at_the_end_of_time_stays_below_the_retired_value() {
        let g = gcra(1, Duration::from_secs(1));
        let now = u64::MAX - 5;
        assert_eq!(g.settle(now, 0, now, 3, now), u64::MAX - 1);
        assert_eq!(g.settle(u64::MAX - 1, 1, now, 4, now), u64::MAX - 1);
    }

    #[test]
    fn burst_then_interval() {
        let g = gcra(5, Duration::from_secs(1));
        assert_eq!((g.interval, g.burst), (200 * MS, 1000 * MS));
        let mut tat = 0;
        for expected in [4, 3, 2, 1, 0] {
            let (rem, t) = allowed(g.decide(tat, 0, 1));
            assert_eq!(rem, expected);
            tat = t;
        }
        let d = denied(g.decide(tat, 0, 1));
        assert_eq!(d.retry_after(), Duration::from_millis(200));
        assert_eq!(d.reset_after(), Duration::from_secs(1));
        assert_eq!(
            denied(g.decide(tat, 100 * MS, 1)).retry_after(),
            Duration::from_millis(100)
        );
        let (rem, _) = allowed(g.decide(tat, 300 * MS, 1));
        assert_eq!(rem, 0);
    }

    #[test]
    fn cost_spends_several_and_refusal_reports_what_is_left() {
        let g = gcra(5, Duration::from_secs(1));
        let (rem, tat) = allowed(g.decide(0, 0, 3));
        assert_eq!(rem, 2);
        assert_eq!(tat, 600 * MS);
        let d = denied(g.decide(tat, 0, 3));
        assert_eq!(d.remaining(), 2);
        assert_eq!(d.retry_after(), Duration::from_millis(200));
        let (rem, _) = allowed(g.decide(0, 0, 5));
        assert_eq!(rem, 0);
    }

    #[test]
    fn uneven_interval_rounds_up_and_keeps_the_full_burst() {
        let g = gcra(3, Duration::from_secs(1));
        assert_eq!(g.interval, 333_333_334);
        let mut tat = 0;
        for _ in 0..3 {
            tat = allowed(g.decide(tat, 0, 1)).1;
        }
        let _ = denied(g.decide(tat, 0, 1));
        // Never faster than exact: after one exact interval the permit is not back yet.
        let _ = denied(g.decide(tat, 333_333_333, 1));
        allowed(g.decide(tat, 333_333_334, 1));
    }

    #[test]
    fn backwards_clock_is_clamped_to_the_furthest_valid_state() {
        let g = gcra(5, Duration::from_secs(1));
        // A TAT 10 s ahead of now: treated as now + 2B, the furthest a state in debt can be.
        let d = denied(g.decide(10_000 * MS, 0, 1));
        assert_eq!(d.retry_after(), Duration::from_millis(1200));
        assert_eq!(d.reset_after(), Duration::from_secs(2));
        assert_eq!(d.remaining(), 0);
        // Now far below a stored TAT never underflows.
        let d = denied(g.decide(u64::MAX - 1, 0, 5));
        assert_eq!(d.retry_after(), Duration::from_secs(2));
    }

    #[test]
    fn extreme_clock_readings_do_not_overflow() {
        // A TAT that would not fit below the stripes' markers is not stored: refused, with a
        // wait of one interval, neither wrapped nor clamped to a smaller debt.
        let g = gcra(1, Policy::MAX_WINDOW);
        let refused = denied(g.decide(0, u64::MAX - 1, 1));
        assert_eq!(refused.retry_after_nanos(), g.interval());
        let g = gcra(u64::MAX >> 2, Policy::MAX_WINDOW);
        assert!(!denied(g.decide(0, u64::MAX - 1, u64::MAX >> 2)).is_allowed());
        // Up to the last instant that fits, admitted; the next permit is not, and the room
        // says so (a lease takes no more than fits).
        let g = gcra(10, Duration::from_secs(1));
        let now = LAST_LEASED - 2 * g.interval();
        let (remaining, tat) = allowed(g.decide(0, now, 2));
        assert_eq!((remaining, tat), (8, LAST_LEASED));
        assert_eq!(g.room(tat, now), 0);
        assert_eq!(denied(g.decide(tat, now, 1)).remaining(), 0);
        assert_eq!(g.room(0, now), 2);
        assert_eq!(g.room(0, 0), 10);
        // Refused for want of room, a request waits one interval.
        let refused = denied(g.decide(0, now, 3));
        assert_eq!(refused.retry_after_nanos(), g.interval());
    }

    /// A clock at the end of its range refuses rather than forgets a debt it cannot store:
    /// a limit of 2 admits at most 2 there, however many ask.
    #[test]
    fn a_clock_at_the_end_of_its_range_admits_no_more_than_the_burst() {
        let g = gcra(2, Duration::from_secs(1));
        for now in [
            u64::MAX,
            u64::MAX - 1,
            LAST_LEASED - g.interval(),
            u64::MAX - 900 * MS,
        ] {
            let mut tat = 0;
            let mut admitted = 0;
            for _ in 0..100 {
                if let Verdict::Allow(_, new) = g.decide(tat, now, 1) {
                    assert!(new <= LAST_LEASED);
                    tat = new;
                    admitted += 1;
                }
            }
            assert!(admitted <= 2, "{admitted} admitted at {now}");
        }
    }

    #[test]
    fn at_rest_when_tat_not_ahead() {
        assert!(Gcra::is_at_rest(5, 5));
        assert!(!Gcra::is_at_rest(6, 5));
    }

    /// The cell decides as the arithmetic does, retires only once its TAT is not ahead of
    /// now, and once retired never decides, is never at rest and is never retired again.
    #[test]
    fn cell_follows_the_arithmetic_and_retires_exactly() {
        let clock = crate::FakeClock::new();
        // 5/s: T = 200 ms, B = 1 s.
        let g = gcra(5, Duration::from_secs(1));
        let cell = GcraCell::fresh(&g);
        assert!(cell.is_at_rest(&g, 0));
        // Two at 0 move the TAT to 400 ms; one more at 100 ms to 600 ms (debt 500 ms,
        // so (1 s - 500 ms) / 200 ms = 2 left).
        for remaining in [4, 3] {
            assert_eq!(
                cell.try_acquire(&g, &clock, 1).unwrap().remaining(),
                remaining
            );
        }
        assert!(!cell.try_retire(&g, 400 * MS - 1));
        clock.set(Duration::from_millis(100));
        assert_eq!(cell.try_acquire(&g, &clock, 1).unwrap().remaining(), 2);
        // Not at rest until the TAT, 600 ms: a refused retirement changes nothing, and the
        // cell still decides from 500 ms of debt (one more would leave 1).
        assert!(!cell.is_at_rest(&g, 600 * MS - 1));
        assert!(!cell.try_retire(&g, 600 * MS - 1));
        assert_eq!(cell.peek(&g, &clock, 1).unwrap().remaining(), 1);
        assert!(cell.is_at_rest(&g, 600 * MS));
        assert!(cell.try_retire(&g, 600 * MS));
        assert!(!cell.is_at_rest(&g, 600 * MS));
        assert!(!cell.try_retire(&g, 600 * MS));
        clock.set(Duration::from_millis(600));
        assert_eq!(cell.try_acquire(&g, &clock, 1), None);
        assert_eq!(cell.peek(&g, &clock, 1), None);
    }
}
