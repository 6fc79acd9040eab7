//! Loom models of a keyed table's cells being reused: a request that found a key's cell races
//! the eviction that retires and unlinks the key, and the creation of another key that may be
//! given the freed cell.
//!
//! The index is modelled by one atomic word per key (0 for no entry, else the slot plus one),
//! published with a Release store and read with an Acquire load, as `scc::HashIndex` publishes
//! and reads its entries. The cells, their reuse and the guard that holds it back are the
//! crate's own (`tollgate::model::ModelSlab`, `ModelGuard`).

use std::time::Duration;

use loom::sync::atomic::{AtomicU32, Ordering};
use loom::sync::Arc;
use loom::thread;
use tollgate::model::{ModelGuard, ModelSlab};
use tollgate::{FakeClock, Policy};

/// What a request on a key saw.
#[derive(Debug, PartialEq)]
enum Seen {
    /// Decided on the key's cell: admitted or not.
    Decided(bool),
    /// The key has no entry (its request would create a fresh state).
    Absent,
    /// The key's cell was retired (its request would look again, and find the key gone or
    /// about to be).
    Retired,
}

/// A request as the table serves it without a lock: under a guard, look the key up and decide
/// on its cell.
fn request(entry: &AtomicU32, slab: &ModelSlab, clock: &FakeClock) -> Seen {
    let _guard = ModelGuard::new();
    // Acquire: pairs with the Release that published the entry, as the index's lookup.
    match entry.load(Ordering::Acquire) {
        0 => Seen::Absent,
        held => match slab.try_acquire(held - 1, clock, 1) {
            Some(decision) => Seen::Decided(decision.is_allowed()),
            None => Seen::Retired,
        },
    }
}

/// Key `a` holds a state at rest in its cell. One thread sends a request for `a`; another
/// evicts `a` (retire, unlink, release the cell) and then creates key `b`, which may be given
/// `a`'s cell; a third sends a request for `b` once it sees `b`'s entry. With one permit per
/// key:
/// - the request for `a` is admitted, on `a`'s cell or, if it came after the unlink, as a new
///   key: it never decides on `b`'s state, which would refuse it or spend `b`'s permit;
/// - `b` admits exactly one of its requests, and the request that finds `b`'s entry never
///   meets the retired value `a`'s eviction left in the cell (the reuse is published with
///   the entry).
#[test]
fn a_request_never_decides_on_the_key_that_reuses_its_cell() {
    // Set when an execution gave `b` the cell freed by `a`: outside the model, so that the
    // test can check that loom explored the reuse, not only runs where `b` took a new cell.
    static REUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    loom::model(|| {
        let clock = FakeClock::new();
        clock.set(Duration::from_secs(5));
        let slab = Arc::new(ModelSlab::new(
            &"token-bucket 1/1s".parse::<Policy>().unwrap(),
        ));
        let a = Arc::new(AtomicU32::new(slab.hold_fresh().unwrap() + 1));
        let b = Arc::new(AtomicU32::new(0));

        let request_a = {
            let (slab, clock, a) = (slab.clone(), clock.clone(), a.clone());
            thread::spawn(move || request(&a, &slab, &clock))
        };
        let evict_and_create = {
            let (slab, clock, a, b) = (slab.clone(), clock.clone(), a.clone(), b.clone());
            thread::spawn(move || {
                // Eviction, as under the key's bucket lock: retire, then unlink, then release.
                let slot = a.load(Ordering::Relaxed) - 1;
                if slab.try_retire(slot, 5_000_000_000) {
                    a.store(0, Ordering::Relaxed);
                    slab.release(slot);
                }
                // Creation of `b`: a cell holding a fresh state, published, then decided on.
                let slot = slab.hold_fresh().unwrap();
                b.store(slot + 1, Ordering::Release);
                (slot, request(&b, &slab, &clock))
            })
        };
        let request_b = {
            let (slab, clock, b) = (slab.clone(), clock.clone(), b.clone());
            thread::spawn(move || request(&b, &slab, &clock))
        };

        let seen_a = request_a.join().unwrap();
        let (slot_b, creator_b) = evict_and_create.join().unwrap();
        if slot_b == 0 {
            REUSED.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let seen_b = request_b.join().unwrap();
        assert!(
            matches!(seen_a, Seen::Decided(true) | Seen::Absent | Seen::Retired),
            "a's request saw {seen_a:?}"
        );
        let admitted_b = [&creator_b, &seen_b]
            .iter()
            .filter(|seen| ***seen == Seen::Decided(true))
            .count();
        assert_eq!(
            admitted_b, 1,
            "b's creator saw {creator_b:?}, its request {seen_b:?}"
        );
        assert_ne!(
            seen_b,
            Seen::Retired,
            "b's request met the retired value of a's cell"
        );
    });
    assert!(
        REUSED.load(std::sync::atomic::Ordering::Relaxed),
        "no execution gave b the cell a left"
    );
}
