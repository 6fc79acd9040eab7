//! Shared by the loom models of the multi-word and windowed states (tests/loom_models/:
//! windowed, composite, peek, carry).
//!
//! The clock is a frozen `FakeClock` (a plain atomic loom does not track: it never moves),
//! so every admission stays live and capacities are exact. It reads 10 s, not 0: an entry or
//! word read stale (its initial 0) would then look expired, so a missing ordering shows up
//! as an extra admission.

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use tollgate::model::ModelCell;
use tollgate::{Decision, FakeClock, Policy};

/// The frozen clock's reading, in nanoseconds.
pub const NOW: u64 = 10_000_000_000;

/// Every state machine, each admitting 2 per window (windows of at most 2 s, so what was
/// admitted at 0 has expired by [`NOW`]): the three algorithms and two composites.
pub const STATE_MACHINES: [&str; 5] = [
    "token-bucket 2/1s",
    "sliding-log 2/1s",
    "sliding-counter 2/1s",
    "sliding-log 2/1s & token-bucket 3/2s",
    "sliding-counter 2/1s & sliding-log 3/2s",
];

/// A clock frozen at [`NOW`].
pub fn frozen_clock() -> FakeClock {
    let clock = FakeClock::new();
    clock.set(Duration::from_nanos(NOW));
    clock
}

/// A fresh state for `policy`.
pub fn cell(policy: &Policy) -> ModelCell {
    ModelCell::new(policy)
}

/// 1 for an admission, 0 for a refusal; panics on a retired state.
pub fn admitted(decision: Option<Decision>) -> u64 {
    u64::from(decision.expect("the state was never retired").is_allowed())
}

/// Two threads race one request each on a state of `policy`, whose tightest band admits
/// `capacity` (1 or 2), then a last request checks nothing was lost: exactly `capacity`
/// admissions in all. With `expired`, the state first holds a full window admitted at time 0
/// (windows of at most 2 s, long gone at [`NOW`]): writers then overwrite words (log slots,
/// the counter's window) that racing readers may be reading.
pub fn race_for_capacity(policy: Policy, capacity: u64, expired: bool) {
    loom::model(move || {
        let state = Arc::new(cell(&policy));
        if expired {
            assert_eq!(admitted(state.try_acquire(&FakeClock::new(), capacity)), 1);
        }
        let clock = frozen_clock();
        let other = {
            let (state, clock) = (state.clone(), clock.clone());
            thread::spawn(move || admitted(state.try_acquire(&clock, 1)))
        };
        let mine = admitted(state.try_acquire(&clock, 1));
        let theirs = other.join().unwrap();
        let last = admitted(state.try_acquire(&clock, 1));
        assert_eq!(
            mine + theirs + last,
            capacity,
            "{policy}, expired: {expired}"
        );
    });
}
