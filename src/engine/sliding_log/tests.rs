//! The sliding log's unit tests: the binary search's bounds, the reference trace and the
//! arithmetic's boundaries, the ring's memory, appends past N, and the cell with its retirement.

use super::*;
use crate::policy::Algorithm;
use std::time::Duration;

const MS: u64 = 1_000_000;

/// The binary search finds the end of the prefix wherever it is, in at most
/// `ceil(log2(len + 1))` looks, only ever inside the range, and looks at nothing in an
/// empty range.
#[test]
fn partition_finds_the_end_of_the_prefix() {
    for len in 1..=9u64 {
        let most = u64::BITS - len.leading_zeros();
        for end in 0..=len {
            let looks = std::cell::Cell::new(0);
            let before = |i| {
                looks.set(looks.get() + 1);
                assert!(looks.get() <= most, "{len} {end}: more than {most} looks");
                assert!(i < len, "{len} {end}: looked at {i}");
                i < end
            };
            assert_eq!(Log::partition(len, before), end, "{len} {end}");
        }
    }
    assert_eq!(Log::partition(0, |_| panic!("no entry to look at")), 0);
}

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
    // The count and the ring are 8 * (N + 1) bytes on the heap.
}

/// Enters the cell's sequence from its current value, as an admission does, and appends
/// `cost` entries holding `stamp`.
fn enter_and_append(cell: &LogCell, cost: u64, stamp: u64) {
    let seq = cell.seq.value();
    let mut guard = cell.seq.try_enter(seq).expect("no other writer");
    guard.publish_at(seq + 2);
    let (_, written) = cell.log().view();
    cell.log().append(written, cost, stamp);
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
    assert_eq!(cell.seq.value(), 2 * 2, "appended: {appended:?}");
    assert_eq!(cell.log().view().1, 7);
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
