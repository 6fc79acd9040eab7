//! Loom model of a settle racing a rebuild (a `reset`, or a policy change): a reservation made
//! before the rebuild must never give anything back to the state built after it, whatever
//! the interleaving (`Rebuilds` in the crate: the rebuild counts itself before it retires the
//! old state, and the settle reads the count after it has found the state it writes to).
//!
//! Run with:
//!
//! ```text
//! LOOM_MAX_PREEMPTIONS=3 RUSTFLAGS="--cfg tollgate_loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test --release --test loom_models rebuild::
//! ```
//!
//! The key's table is one atomic index (0: the old state, 1: the new one), published with
//! Release and read with Acquire, as the map's bucket lock and the generation pointer publish
//! a state. The rebuilder begins the rebuild, retires the old state, publishes the new one,
//! ends the rebuild and spends the new state's two permits. In the first model the settler
//! cancels a reservation of the old state's two permits, made before, on whichever state it
//! finds (looking again when the one it found was retired); in the second the reservation
//! itself races the rebuild: it reads the count, finds a state and reserves on it, then
//! cancels.

use loom::sync::atomic::{AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread::{self, JoinHandle};
use tollgate::model::{ModelCell, ModelHeld, ModelRebuilds};
use tollgate::{FakeClock, Policy};

use crate::support::{frozen_clock, NOW, STATE_MACHINES as POLICIES};

/// How the settle ended: on the old state before its retirement, or with nothing given back.
#[derive(Clone, Copy, Default)]
struct Seen {
    refunded_old: bool,
    withheld: bool,
}

/// One key: its old and new states, the table index a lookup reads (0: the old state, 1:
/// the new one) and the limiter's count of rebuilds.
#[derive(Clone)]
struct Key {
    states: Arc<[ModelCell; 2]>,
    table: Arc<AtomicUsize>,
    rebuilds: Arc<ModelRebuilds>,
}

impl Key {
    fn new(policy: &Policy) -> Self {
        Key {
            states: Arc::new([ModelCell::new(policy), ModelCell::new(policy)]),
            table: Arc::new(AtomicUsize::new(0)),
            rebuilds: Arc::new(ModelRebuilds::new()),
        }
    }

    /// The state a lookup finds now.
    fn found(&self) -> usize {
        self.table.load(Ordering::Acquire)
    }

    /// The rebuilder: retires the old state and publishes the new one inside a rebuild, then
    /// spends the new state's two permits; whether it got them.
    fn rebuild(&self, clock: &FakeClock) -> JoinHandle<bool> {
        let (key, clock) = (self.clone(), clock.clone());
        thread::spawn(move || {
            key.rebuilds.around(|| {
                assert!(key.states[0].retire_for_change(NOW).is_some());
                key.table.store(1, Ordering::Release);
            });
            key.states[1].try_acquire(&clock, 2).unwrap().is_allowed()
        })
    }

    /// Cancels a reservation made under count `made` on whichever state a lookup finds,
    /// looking again while the one found was retired; whether it gave back to the old state.
    fn cancel(&self, made: u64, held: &ModelHeld) -> bool {
        loop {
            let found = self.found();
            let mut refunded_old = false;
            let settled = self
                .rebuilds
                .settle_unless_rebuilt(made, held.held(), 0, || {
                    let settled = self.states[found].settle(held, 0, NOW);
                    refunded_old = found == 0 && settled.is_some();
                    settled
                });
            if settled.is_some() {
                return refunded_old;
            }
            thread::yield_now();
        }
    }
}

#[test]
fn a_refund_never_lands_on_the_state_built_after_a_rebuild() {
    for policy in POLICIES {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Seen::default()));
        let seen_in = seen.clone();
        loom::model(move || {
            let policy: Policy = policy.parse().unwrap();
            let clock = frozen_clock();
            let key = Key::new(&policy);
            let made = key.rebuilds.read();
            let (decision, held) = key.states[0].reserve(&clock, 2).unwrap();
            assert!(decision.is_allowed(), "{policy}");

            let rebuilder = key.rebuild(&clock);
            let refunded_old = key.cancel(made, &held);
            assert!(
                rebuilder.join().unwrap(),
                "{policy}: the new state was fresh"
            );

            // The new state holds exactly its own two permits: nothing came back to it.
            assert!(
                !key.states[1].peek(&clock, 1).unwrap().is_allowed(),
                "{policy}: the new state was given the old reservation's permits"
            );
            let mut seen = seen_in.lock().unwrap();
            seen.refunded_old |= refunded_old;
            seen.withheld |= !refunded_old;
        });
        let seen = *seen.lock().unwrap();
        assert!(
            seen.refunded_old && seen.withheld,
            "{policy}: both orders explored"
        );
    }
}

/// The reservation races the rebuild too: made on either state, with whatever count it read.
/// Its refund may land only on the state that held its permits: when the rebuilder spent the
/// new state's two permits, the new state must still count them afterwards (unless the
/// reservation itself took them first, in which case the rebuilder got nothing).
#[test]
fn a_reservation_racing_a_rebuild_refunds_only_the_state_it_was_decided_on() {
    for policy in POLICIES {
        let seen = std::sync::Arc::new(std::sync::Mutex::new([false; 2]));
        let seen_in = seen.clone();
        loom::model(move || {
            let policy: Policy = policy.parse().unwrap();
            let clock = frozen_clock();
            let key = Key::new(&policy);
            let rebuilder = key.rebuild(&clock);

            // Reserve: the count first, then the state found (a retired one: look again).
            let (made, found, held) = loop {
                let made = key.rebuilds.read();
                let found = key.found();
                if let Some((decision, held)) = key.states[found].reserve(&clock, 2) {
                    assert!(decision.is_allowed() || found == 1);
                    break (made, found, held);
                }
                thread::yield_now();
            };
            if held.held() > 0 {
                key.cancel(made, &held);
            }
            if rebuilder.join().unwrap() {
                assert!(
                    !key.states[1].peek(&clock, 1).unwrap().is_allowed(),
                    "{policy}: made {made} on state {found}: the new state was given back \
                     permits it never held"
                );
            }
            seen_in.lock().unwrap()[found] = true;
        });
        assert_eq!(
            *seen.lock().unwrap(),
            [true; 2],
            "{policy}: both states reserved on"
        );
    }
}
