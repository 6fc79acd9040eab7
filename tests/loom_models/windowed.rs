//! Loom models of the windowed state machines: the sliding log's seqlock and the sliding
//! counter's 128-bit compare-and-swap (checked as a protocol over an indivisible word; see
//! `src/engine/sync.rs`).
//!
//! Run with:
//!
//! ```text
//! RUSTFLAGS="--cfg tollgate_loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test --release --test loom_models windowed::
//! ```
//!
//! (A target directory of its own keeps the cfg change from rebuilding the main one.)
//!
//! The clock is a frozen `FakeClock` (a plain atomic loom does not track: it never moves),
//! so every admission stays live and capacities are exact. It reads 10 s, not 0: a log
//! entry read stale (its slot's initial 0) would then look expired, so a missing ordering
//! shows up as an extra admission.

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use tollgate::{Algorithm, FakeClock, Policy};

use crate::support::{admitted, cell, frozen_clock, race_for_capacity, NOW};

const WINDOWED: [Algorithm; 2] = [Algorithm::SlidingLog, Algorithm::SlidingCounter];

fn windowed(algorithm: Algorithm, permits: u64) -> Policy {
    Policy::new(algorithm, permits, Duration::from_secs(1)).unwrap()
}

#[test]
fn sliding_log_capacity_is_exact() {
    for (permits, expired) in [(1, false), (2, false), (1, true), (2, true)] {
        race_for_capacity(windowed(Algorithm::SlidingLog, permits), permits, expired);
    }
}

#[test]
fn sliding_counter_capacity_is_exact() {
    for (permits, expired) in [(1, false), (2, false), (1, true), (2, true)] {
        race_for_capacity(
            windowed(Algorithm::SlidingCounter, permits),
            permits,
            expired,
        );
    }
}

/// Two requests of cost 2 race on a state of capacity 2 whose full window has expired: one
/// is admitted, and the other is refused as it would be after it, with nothing left. For
/// the log, the refused reader may have read the ring while the writer was overwriting both
/// slots; a torn read taken as consistent would see one live entry and report 1 remaining.
#[test]
fn a_refusal_is_never_decided_on_a_torn_read() {
    for algorithm in WINDOWED {
        loom::model(move || {
            let state = Arc::new(cell(&windowed(algorithm, 2)));
            assert_eq!(admitted(state.try_acquire(&FakeClock::new(), 2)), 1);
            let clock = frozen_clock();
            let other = {
                let (state, clock) = (state.clone(), clock.clone());
                thread::spawn(move || state.try_acquire(&clock, 2).unwrap())
            };
            let mine = state.try_acquire(&clock, 2).unwrap();
            let theirs = other.join().unwrap();
            assert!(mine.is_allowed() != theirs.is_allowed(), "{algorithm}");
            for d in [mine, theirs] {
                assert_eq!(d.remaining(), 0, "{algorithm}: {d:?}");
            }
        });
    }
}

/// Thread A requests; if it meets a retired state it requests on a fresh one standing in for
/// the registry's replacement. Thread B tries to retire the state, which is at rest. A retire
/// that succeeds must never coincide with an admission on the retired state, and a last
/// request on whichever state is current checks the capacity of 1 was spent exactly once.
/// With `expired`, the state at rest holds an admission from time 0, long expired: the
/// request overwrites the very ring slot (or counter window) the evictor is checking.
fn acquire_racing_eviction(algorithm: Algorithm, expired: bool) {
    loom::model(move || {
        let state = Arc::new(cell(&windowed(algorithm, 1)));
        if expired {
            assert_eq!(admitted(state.try_acquire(&FakeClock::new(), 1)), 1);
        }
        let replacement = Arc::new(cell(&windowed(algorithm, 1)));
        let clock = frozen_clock();
        let requester = {
            let (state, replacement, clock) = (state.clone(), replacement.clone(), clock.clone());
            thread::spawn(move || match state.try_acquire(&clock, 1) {
                Some(d) => (u64::from(d.is_allowed()), 0),
                None => (0, admitted(replacement.try_acquire(&clock, 1))),
            })
        };
        let retired = state.try_retire(NOW);
        let (on_old, on_replacement) = requester.join().unwrap();
        assert!(
            !(retired && on_old == 1),
            "{algorithm}, expired: {expired}: admitted on a retired state"
        );
        let current = if retired { &replacement } else { &state };
        let last = admitted(current.try_acquire(&clock, 1));
        assert_eq!(
            on_old + on_replacement + last,
            1,
            "{algorithm}, expired: {expired}"
        );
        // A retired state stays retired; a live one with an admission is not at rest.
        assert!(!state.is_at_rest(NOW), "{algorithm}, expired: {expired}");
    });
}

#[test]
fn acquire_racing_eviction_never_admits_extra() {
    for algorithm in WINDOWED {
        acquire_racing_eviction(algorithm, false);
    }
}

#[test]
fn acquire_racing_eviction_over_expired_entries_never_admits_extra() {
    for algorithm in WINDOWED {
        acquire_racing_eviction(algorithm, true);
    }
}

/// A reader (`is_at_rest`, eviction) racing a writer never blocks and sees either side of
/// the admission, never a torn state. The reader is the spawned thread and the writer the
/// main one: the other way round, loom 0.7 explores a single interleaving (a spawned thread
/// that starts with an atomic load against a main thread that only loads,
/// tokio-rs/loom#392), so the test also checks that both sides were seen.
#[test]
fn at_rest_check_racing_an_admission() {
    for algorithm in WINDOWED {
        for expired in [false, true] {
            let sides = std::sync::Arc::new(std::sync::Mutex::new([false; 2]));
            let seen_sides = sides.clone();
            loom::model(move || {
                let state = Arc::new(cell(&windowed(algorithm, 2)));
                if expired {
                    assert_eq!(admitted(state.try_acquire(&FakeClock::new(), 2)), 1);
                }
                let clock = frozen_clock();
                let reader = {
                    let state = state.clone();
                    thread::spawn(move || state.is_at_rest(NOW))
                };
                assert_eq!(admitted(state.try_acquire(&clock, 2)), 1, "{algorithm}");
                let at_rest = reader.join().unwrap();
                seen_sides.lock().unwrap()[usize::from(at_rest)] = true;
                assert!(!state.is_at_rest(NOW), "{algorithm}");
                assert!(!state.try_retire(NOW), "{algorithm}");
                assert_eq!(admitted(state.try_acquire(&clock, 1)), 0, "{algorithm}");
            });
            assert_eq!(
                *sides.lock().unwrap(),
                [true; 2],
                "{algorithm}, expired: {expired}: both sides explored"
            );
        }
    }
}
