//! Loom models of the step a policy change takes on every state machine: retire the old
//! state from one consistent snapshot and carry the permits it holds into the new policy's
//! state (`RateLimiter::set_policy`, `DirectLimiter::set_policy`). Racing an admission, the
//! count carried must include the admission exactly when the admission succeeded: a permit
//! admitted and not carried would be spent twice under the new policy, a permit carried and
//! refused would be lost. After the retirement, the old state admits nothing.
//!
//! Run with:
//!
//! ```text
//! LOOM_MAX_PREEMPTIONS=3 RUSTFLAGS="--cfg tollgate_loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test --release --test loom_models carry::
//! ```

use loom::sync::Arc;
use loom::thread;
use tollgate::model::ModelCell;
use tollgate::Policy;

use crate::support::{frozen_clock, NOW, STATE_MACHINES as POLICIES};

/// A request racing the retirement either got in first, and is carried (2 in use), or met
/// the retired state (`None`), and is not (1 in use): never both, never neither.
#[test]
fn a_racing_admission_is_carried_exactly_when_it_succeeded() {
    for policy in POLICIES {
        let sides = std::sync::Arc::new(std::sync::Mutex::new([false; 2]));
        let seen_sides = sides.clone();
        loom::model(move || {
            let clock = frozen_clock();
            let state = Arc::new(ModelCell::new(&policy.parse::<Policy>().unwrap()));
            // One permit already spent at NOW, so the carry is 1 or 2, never a default 0.
            assert!(
                state.try_acquire(&clock, 1).unwrap().is_allowed(),
                "{policy}"
            );
            let request = {
                let (state, clock) = (state.clone(), clock.clone());
                thread::spawn(move || state.try_acquire(&clock, 1))
            };
            let carried = state.retire_for_change(NOW).expect("retired once");
            let admitted = match request.join().unwrap() {
                Some(decision) => {
                    assert!(decision.is_allowed(), "{policy}: room for one more");
                    true
                }
                None => false,
            };
            assert_eq!(carried, if admitted { 2 } else { 1 }, "{policy}");
            seen_sides.lock().unwrap()[usize::from(admitted)] = true;
            // Retired for good: no second carry, no admission.
            assert_eq!(state.retire_for_change(NOW), None, "{policy}");
            assert!(state.try_acquire(&clock, 1).is_none(), "{policy}");
            assert!(state.peek(&clock, 1).is_none(), "{policy}");
        });
        assert_eq!(
            *sides.lock().unwrap(),
            [true; 2],
            "{policy}: both orders explored"
        );
    }
}

/// Two retirements racing: exactly one carries (the other sees the state retired), and it
/// carries every permit in use.
#[test]
fn only_one_retirement_carries() {
    for policy in POLICIES {
        loom::model(move || {
            let clock = frozen_clock();
            let state = Arc::new(ModelCell::new(&policy.parse::<Policy>().unwrap()));
            assert!(
                state.try_acquire(&clock, 2).unwrap().is_allowed(),
                "{policy}"
            );
            let other = {
                let state = state.clone();
                thread::spawn(move || state.retire_for_change(NOW))
            };
            let mine = state.retire_for_change(NOW);
            let theirs = other.join().unwrap();
            let carried: Vec<u64> = [mine, theirs].into_iter().flatten().collect();
            assert_eq!(carried, vec![2], "{policy}: {mine:?} / {theirs:?}");
        });
    }
}
