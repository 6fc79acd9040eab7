//! Loom models of the GCRA state machine: every interleaving of two threads is explored.
//!
//! Run with `RUSTFLAGS="--cfg tollgate_loom" cargo test --release --test loom_models gcra::`. The models
//! drive `tollgate::model::ModelCell`, which wraps the very cell the limiters use, with its
//! atomics swapped for loom's by the crate's `sync` shim.

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;
use tollgate::model::ModelCell;
use tollgate::{Clock, FakeClock, Policy};

fn cell(policy: &str) -> Arc<ModelCell> {
    Arc::new(ModelCell::new(&policy.parse::<Policy>().unwrap()))
}

fn admitted(cell: &ModelCell, clock: &FakeClock, cost: u64) -> u64 {
    let d = cell.try_acquire(clock, cost).expect("not retired");
    u64::from(d.is_allowed()) * cost
}

/// Two threads race for the last permit: exactly one gets it.
#[test]
fn two_acquires_race_for_one_permit() {
    loom::model(|| {
        let clock = FakeClock::new();
        let cell = cell("token-bucket 1/1s");
        let other = {
            let (cell, clock) = (cell.clone(), clock.clone());
            thread::spawn(move || admitted(&cell, &clock, 1))
        };
        let mine = admitted(&cell, &clock, 1);
        assert_eq!(mine + other.join().unwrap(), 1);
    });
}

/// Two threads each take one of two permits: both succeed, then the state is empty.
#[test]
fn two_acquires_share_two_permits() {
    loom::model(|| {
        let clock = FakeClock::new();
        let cell = cell("token-bucket 2/1s");
        let other = {
            let (cell, clock) = (cell.clone(), clock.clone());
            thread::spawn(move || admitted(&cell, &clock, 1))
        };
        let mine = admitted(&cell, &clock, 1);
        assert_eq!(mine + other.join().unwrap(), 2);
        assert_eq!(admitted(&cell, &clock, 1), 0);
    });
}

/// Costs 1 and 2 race on capacity 2: never more than 2 permits spent.
#[test]
fn costs_race_within_capacity() {
    loom::model(|| {
        let clock = FakeClock::new();
        let cell = cell("token-bucket 2/1s");
        let other = {
            let (cell, clock) = (cell.clone(), clock.clone());
            thread::spawn(move || admitted(&cell, &clock, 2))
        };
        let mine = admitted(&cell, &clock, 1);
        let spent = mine + other.join().unwrap();
        assert!(spent == 1 || spent == 2, "spent {spent}");
        assert_eq!(admitted(&cell, &clock, 1), 2 - spent);
    });
}

/// A request races the evictor on a state at rest. Whatever the interleaving, the retire and
/// an admission on the same state never both succeed, and a request that finds the state
/// retired is served by a fresh one (the registry's replacement), so the key admits exactly
/// its capacity.
#[test]
fn acquire_races_eviction() {
    loom::model(|| {
        let clock = FakeClock::new();
        clock.set(Duration::from_secs(5));
        // One permit used long ago: the state is at rest now.
        let cell = cell("token-bucket 1/1s");
        let earlier = FakeClock::new();
        assert_eq!(admitted(&cell, &earlier, 1), 1);
        let now = clock.now();
        let evictor = {
            let cell = cell.clone();
            thread::spawn(move || cell.try_retire(now))
        };
        let replacement = ModelCell::new(&"token-bucket 1/1s".parse::<Policy>().unwrap());
        let (on_old, on_new) = match cell.try_acquire(&clock, 1) {
            Some(d) => (u64::from(d.is_allowed()), 0),
            None => (0, admitted(&replacement, &clock, 1)),
        };
        let retired = evictor.join().unwrap();
        assert!(
            !(retired && on_old > 0),
            "an admission on a retired state would be lost"
        );
        assert_eq!(on_old + on_new, 1);
        if retired {
            // A retired state refuses to decide, forever.
            assert!(cell.try_acquire(&clock, 1).is_none());
        } else {
            // Not retired: the admission happened first and the state is no longer at rest.
            assert!(!cell.is_at_rest(now));
        }
    });
}
