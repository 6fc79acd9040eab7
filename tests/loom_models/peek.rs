//! Loom models of `peek` on every state machine: token bucket, sliding log, sliding counter
//! and the composite of several bands. A peek reads a snapshot and writes nothing, so racing
//! an admission it must report exactly what a request would have been told either before or
//! after that admission, never a mixture (a torn read of the log's ring or of the
//! composite's bands taken as consistent), and it must never change what later requests get.
//!
//! Run with:
//!
//! ```text
//! LOOM_MAX_PREEMPTIONS=3 RUSTFLAGS="--cfg tollgate_loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test --release --test loom_models peek::
//! ```
//!
//! As in `windowed.rs`, the clock is frozen at 10 s and each state first holds a
//! full window admitted at time 0, long expired: the admission racing the peek then
//! overwrites words (log slots, the counter's window, a TAT) that the peek may be reading.

use loom::sync::Arc;
use loom::thread;
use tollgate::model::ModelCell;
use tollgate::{Decision, FakeClock, Policy};

use crate::support::{frozen_clock, STATE_MACHINES as POLICIES};

/// A state of `policy` holding 2 permits admitted at time 0.
fn expired_state(policy: &str) -> ModelCell {
    let cell = ModelCell::new(&policy.parse::<Policy>().unwrap());
    let admitted = cell.try_acquire(&FakeClock::new(), 2).unwrap();
    assert!(admitted.is_allowed(), "{policy}");
    cell
}

/// What a peek reports before and after one admission of cost 2 at `NOW`, computed on a
/// state nobody races.
fn before_and_after(policy: &str, clock: &FakeClock) -> (Decision, Decision) {
    let alone = expired_state(policy);
    let before = alone.peek(clock, 1).unwrap();
    assert!(
        alone.try_acquire(clock, 2).unwrap().is_allowed(),
        "{policy}"
    );
    let after = alone.peek(clock, 1).unwrap();
    assert_ne!(before, after, "{policy}");
    (before, after)
}

/// A peek racing an admission sees one side of it, whole; the admission is unaffected.
///
/// The peek runs in the spawned thread and the admission in the main one, not the other way
/// round: loom 0.7 explores only one interleaving when a spawned thread starts with an
/// atomic load and the main thread only loads (tokio-rs/loom#392). The test also checks
/// that loom did show the peek both sides, so a model that stops exploring fails here.
#[test]
fn peek_racing_an_admission_sees_one_side() {
    for policy in POLICIES {
        let sides = std::sync::Arc::new(std::sync::Mutex::new([false; 2]));
        let seen_sides = sides.clone();
        loom::model(move || {
            let clock = frozen_clock();
            let (before, after) = before_and_after(policy, &clock);
            let state = Arc::new(expired_state(policy));
            let peeker = {
                let (state, clock) = (state.clone(), clock.clone());
                thread::spawn(move || state.peek(&clock, 1).unwrap())
            };
            assert!(
                state.try_acquire(&clock, 2).unwrap().is_allowed(),
                "{policy}"
            );
            let seen = peeker.join().unwrap();
            assert!(seen == before || seen == after, "{policy}: {seen:?}");
            seen_sides.lock().unwrap()[usize::from(seen == after)] = true;
            assert_eq!(state.peek(&clock, 1).unwrap(), after, "{policy}");
        });
        assert_eq!(
            *sides.lock().unwrap(),
            [true; 2],
            "{policy}: both sides explored"
        );
    }
}

/// Two peeks racing each other and nothing else change nothing: a request afterwards gets
/// exactly what it would have got with no peek at all.
#[test]
fn peeks_never_write() {
    for policy in POLICIES {
        loom::model(move || {
            let clock = frozen_clock();
            let (before, _) = before_and_after(policy, &clock);
            let state = Arc::new(expired_state(policy));
            let peeker = {
                let (state, clock) = (state.clone(), clock.clone());
                thread::spawn(move || state.peek(&clock, 1).unwrap())
            };
            assert_eq!(state.peek(&clock, 1).unwrap(), before, "{policy}");
            assert_eq!(peeker.join().unwrap(), before, "{policy}");
            assert!(
                state.try_acquire(&clock, 2).unwrap().is_allowed(),
                "{policy}"
            );
            assert!(
                !state.try_acquire(&clock, 1).unwrap().is_allowed(),
                "{policy}"
            );
        });
    }
}
