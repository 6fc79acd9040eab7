//! The composite state's unit tests: its layout and memory, how a decision merges the bands,
//! refusals that write nothing, peeks, retirement, carrying, and agreement with the bands alone.

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
    assert!(matches!(
        bands[0].band,
        BandMath::SlidingLog { ring: 3, .. }
    ));
    assert!(matches!(bands[1].band, BandMath::SlidingCounter(_)));
    assert!(matches!(bands[2].band, BandMath::TokenBucket(_)));
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
    let bands: Vec<_> = policy.bands().collect();
    let (p0, p1, p2) = (
        Log::new(bands[0]),
        Counter::new(bands[1]),
        Gcra::new(bands[2]),
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
