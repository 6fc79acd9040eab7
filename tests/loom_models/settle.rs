//! Loom models of settling a reservation while an admission races it, on every state
//! machine: token bucket, sliding log, sliding counter and the composite of several bands.
//! A settle is a writer like an admission (a compare-and-swap of the one word, or a write
//! section of the seqlock), so the race must end exactly as one of the two sequential orders
//! does: the admission gets the decision it would get before the settle or after it, and the
//! state is left as that same order leaves it. A refund seen by an admission that was then
//! lost (or the other way round) would show up as an ending of neither order.
//!
//! Run with:
//!
//! ```text
//! LOOM_MAX_PREEMPTIONS=3 RUSTFLAGS="--cfg tollgate_loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test --release --test loom_models settle::
//! ```
//!
//! As in `windowed.rs`, the clock is frozen at 10 s, and each state admits 2 in its tightest
//! band. With `expired`, the state first holds a full window admitted at time 0, long gone:
//! the reservation then overwrites its words (a log's ring wraps, so a refund fills the slots
//! it reaches back over), and the settle and the admission write words the other may be
//! reading. The settler is the spawned thread, the admission the main one; each model also
//! checks that loom showed it both orders.

use loom::sync::Arc;
use loom::thread;
use tollgate::model::{ModelCell, ModelHeld};
use tollgate::{Decision, FakeClock, Policy};

use crate::support::{frozen_clock, NOW};

/// How one order of the race ends: the admission's decision, then what a request of 1 would
/// get once both are done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ending {
    admission: Decision,
    after: Decision,
}

/// A state of `policy` holding a reservation of `held` made at `NOW` (after a full window
/// admitted at time 0, with `expired`).
fn reserved(policy: &Policy, held: u64, expired: bool) -> (ModelCell, ModelHeld) {
    let state = ModelCell::new(policy);
    if expired {
        let old = state.try_acquire(&FakeClock::new(), 2).unwrap();
        assert!(old.is_allowed(), "{policy}");
    }
    let (decision, reservation) = state.reserve(&frozen_clock(), held).unwrap();
    assert!(decision.is_allowed(), "{policy}");
    assert_eq!(reservation.held(), held, "{policy}");
    (state, reservation)
}

/// The endings of the two sequential orders, on states nobody races: the settle first, then
/// the admission first. They differ, so the race's ending names its order.
fn orders(policy: &Policy, held: u64, actual: u64, expired: bool) -> [Ending; 2] {
    let clock = frozen_clock();
    let settle_first = {
        let (state, reservation) = reserved(policy, held, expired);
        state.settle(&reservation, actual, NOW).unwrap();
        let admission = state.try_acquire(&clock, 1).unwrap();
        Ending {
            admission,
            after: state.peek(&clock, 1).unwrap(),
        }
    };
    let admission_first = {
        let (state, reservation) = reserved(policy, held, expired);
        let admission = state.try_acquire(&clock, 1).unwrap();
        state.settle(&reservation, actual, NOW).unwrap();
        Ending {
            admission,
            after: state.peek(&clock, 1).unwrap(),
        }
    };
    assert_ne!(settle_first, admission_first, "{policy}");
    [settle_first, admission_first]
}

/// A reservation of `held` on a state of `policy` is settled at `actual` while a request of 1
/// races it: the race ends as one of the sequential orders, and loom shows both.
///
/// Each runs twice, with the settler on the spawned thread and then on the main one: an
/// admission that comes first and is refused only loads, and loom 0.7 explores a single
/// interleaving when the main thread only loads against a spawned thread that starts with a
/// load (tokio-rs/loom#392), so one orientation alone may never show one of the orders.
fn settle_racing_an_admission(policy: &str, held: u64, actual: u64, expired: bool) {
    let policy: Policy = policy.parse().unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new([false; 2]));
    for settler_spawned in [true, false] {
        let seen_in_model = seen.clone();
        loom::model(move || {
            let endings = orders(&policy, held, actual, expired);
            let clock = frozen_clock();
            let (state, reservation) = reserved(&policy, held, expired);
            let state = Arc::new(state);
            let settle = {
                let state = state.clone();
                move || state.settle(&reservation, actual, NOW).unwrap()
            };
            let admit = {
                let state = state.clone();
                move || state.try_acquire(&clock, 1).unwrap()
            };
            let admission = if settler_spawned {
                let settler = thread::spawn(settle);
                let admission = admit();
                settler.join().unwrap();
                admission
            } else {
                let admitter = thread::spawn(admit);
                settle();
                admitter.join().unwrap()
            };
            let ending = Ending {
                admission,
                after: state.peek(&frozen_clock(), 1).unwrap(),
            };
            let Some(order) = endings.iter().position(|e| *e == ending) else {
                panic!(
                    "{policy}, {held} settled at {actual}, expired: {expired}: {ending:?} \
                     ends neither order {endings:?}"
                );
            };
            seen_in_model.lock().unwrap()[order] = true;
        });
    }
    assert_eq!(
        *seen.lock().unwrap(),
        [true; 2],
        "{policy}, {held} settled at {actual}, expired: {expired}: both orders explored"
    );
}

/// A refund racing an admission, on a state of capacity 2: a cancel of a reservation of 2
/// (the admission succeeds iff it comes after, and then leaves 1 available, else 2), a
/// settle of 2 at 1 (succeeds iff after, leaving 0, else 1), and a cancel of a reservation
/// of 1, which the admission succeeds either way: it then writes before the refund does or
/// after, so a refund that stored what it computed from the state before the admission
/// would lose it (2 available at the end instead of 1).
fn refunds(policy: &str, expired: bool) {
    settle_racing_an_admission(policy, 2, 0, expired);
    settle_racing_an_admission(policy, 2, 1, expired);
    settle_racing_an_admission(policy, 1, 0, expired);
}

/// A charge racing an admission, on a state of capacity 2: a reservation of 1 settled at 2
/// (the admission succeeds iff it comes first, and the charge then lands on top of it).
fn charges(policy: &str, expired: bool) {
    settle_racing_an_admission(policy, 1, 2, expired);
}

#[test]
fn token_bucket_refund_racing_an_admission() {
    refunds("token-bucket 2/1s", false);
}

#[test]
fn token_bucket_charge_racing_an_admission() {
    charges("token-bucket 2/1s", false);
}

#[test]
fn sliding_log_refund_racing_an_admission() {
    for expired in [false, true] {
        refunds("sliding-log 2/1s", expired);
    }
}

#[test]
fn sliding_log_charge_racing_an_admission() {
    for expired in [false, true] {
        charges("sliding-log 2/1s", expired);
    }
}

#[test]
fn sliding_counter_refund_racing_an_admission() {
    for expired in [false, true] {
        refunds("sliding-counter 2/1s", expired);
    }
}

#[test]
fn sliding_counter_charge_racing_an_admission() {
    for expired in [false, true] {
        charges("sliding-counter 2/1s", expired);
    }
}

/// Two bands behind one seqlock, each settled by its own rule in one write section: the
/// tightest band first or last, every algorithm in some band.
const COMPOSITES: [&str; 2] = [
    "sliding-log 2/1s & token-bucket 3/2s",
    "token-bucket 4/1s & sliding-counter 2/2s",
];

#[test]
fn composite_refund_racing_an_admission() {
    for policy in COMPOSITES {
        for expired in [false, true] {
            refunds(policy, expired);
        }
    }
}

#[test]
fn composite_charge_racing_an_admission() {
    for policy in COMPOSITES {
        for expired in [false, true] {
            charges(policy, expired);
        }
    }
}
