//! Loom models of a keyed table's cells being reused: a request that found a key's cell races
//! the eviction that retires and unlinks the key, and the creation of another key that may be
//! given the freed cell.
//!
//! The index is modelled by one atomic word per key (0 for no entry, else the slot plus one),
//! published with a Release store and read with an Acquire load, as `scc::HashIndex` publishes
//! and reads its entries. The cells, their reuse and the guard that holds it back are the
//! crate's own (`tollgate::model::ModelSlab`, `ModelGuard`, and `ModelPinned` for a cell a
//! thread pins as its last hit and then decides on with no guard).

use std::time::Duration;

use loom::sync::atomic::{AtomicU32, Ordering};
use loom::sync::Arc;
use loom::thread;
use tollgate::model::{ModelGuard, ModelPinned, ModelSlab};
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

/// The frozen clock of the models of a pinned cell, in nanoseconds: what a state at rest
/// (a TAT of 0) is at rest at, and what a decision on a pinned cell is made at.
const NOW: u64 = 5_000_000_000;

/// A model's slab for one permit per key, with key `a` at rest in its first cell, `a`'s
/// entry pointing at it and no entry for `b`.
fn slab_with_a() -> (Arc<ModelSlab>, Arc<AtomicU32>, Arc<AtomicU32>, FakeClock) {
    let clock = FakeClock::new();
    clock.set(Duration::from_nanos(NOW));
    let slab = Arc::new(ModelSlab::new(
        &"token-bucket 1/1s".parse::<Policy>().unwrap(),
    ));
    let a = Arc::new(AtomicU32::new(slab.hold_fresh().unwrap() + 1));
    let b = Arc::new(AtomicU32::new(0));
    (slab, a, b, clock)
}

/// What a thread's last hit on `a` saw: nothing pinned (`a`'s entry was gone when it looked),
/// or the place it pinned and its decisions there (`Some(admitted)`, `None` for a retired
/// state or a compare-and-swap lost).
type LastHit = Option<(u32, Vec<Option<bool>>)>;

/// A thread's last hit, as the keyed limiter makes and uses it: under a guard, look `a` up
/// and pin its cell; drop the guard; decide `decisions` times on the pinned cell with no
/// guard; unpin.
fn last_hit(entry: &AtomicU32, slab: &ModelSlab, decisions: usize) -> LastHit {
    let (slot, pinned): (u32, ModelPinned) = {
        let _guard = ModelGuard::new();
        // Acquire: pairs with the Release that published the entry, as the index's lookup.
        match entry.load(Ordering::Acquire) {
            0 => return None,
            held => (held - 1, slab.pin(held - 1)),
        }
    };
    let seen = (0..decisions)
        .map(|_| {
            pinned
                .try_acquire_once(NOW)
                .map(|decision| decision.is_allowed())
        })
        .collect();
    drop(pinned);
    Some((slot, seen))
}

/// Eviction of `a` (as under its bucket lock: retire at rest, unlink, release the cell), then
/// the creation of `b` (a cell holding a fresh state, published) and a request for `b`: the
/// place `b` was given, and what its request saw.
fn evict_a_create_b(
    a: &AtomicU32,
    b: &AtomicU32,
    slab: &ModelSlab,
    clock: &FakeClock,
) -> (u32, Seen) {
    let slot = a.load(Ordering::Relaxed) - 1;
    if slab.try_retire(slot, NOW) {
        a.store(0, Ordering::Relaxed);
        slab.release(slot);
    }
    let slot = slab.hold_fresh().unwrap();
    b.store(slot + 1, Ordering::Release);
    (slot, request(b, slab, clock))
}

/// What the pinned thread may see, on `a`'s state alone: the first decision admits on `a`'s
/// state at rest (which then stays, no longer at rest, and refuses the second), or `a` was
/// retired first and every decision finds it retired. A decision on `b`'s state would
/// admit, or refuse, after a retired one.
fn assert_only_a(hit: &LastHit) {
    if let Some((_, seen)) = hit {
        let on_a = seen.iter().enumerate().all(|(i, d)| *d == Some(i == 0))
            || seen.iter().all(Option::is_none);
        assert!(on_a, "the pinned cell of a decided {seen:?}");
    }
}

/// `b` admits exactly one of its requests, and none of them meets a retired value.
fn assert_b_admits_once(seen_b: &[&Seen]) {
    let admitted = seen_b
        .iter()
        .filter(|seen| ***seen == Seen::Decided(true))
        .count();
    assert_eq!(admitted, 1, "b's requests saw {seen_b:?}");
    assert!(
        seen_b.iter().all(|seen| **seen != Seen::Retired),
        "a request of b met the retired value of a's cell: {seen_b:?}"
    );
}

/// Key `a` is at rest in its cell. One thread pins `a`'s cell as its last hit (found under a
/// guard, the guard then dropped) and decides twice on it with no guard before it unpins;
/// another evicts `a` and then creates `b`, which may be given `a`'s place, and sends a
/// request for `b`; a third sends a request for `b` once it sees `b`'s entry. With one permit
/// per key:
/// - the pinned thread decides on `a`'s state or finds it retired, never on `b`'s, which
///   would spend `b`'s permit or be refused by it: the place of a pinned cell goes to `b`
///   only once it is unpinned;
/// - `b` admits exactly one of its two requests, whichever cell it was given, and neither
///   meets the retired value `a`'s eviction left in the cell.
#[test]
fn a_pinned_cell_is_not_given_to_another_key_while_pinned() {
    // Set when an execution gave `b` the place the pinned thread found retired, after the
    // unpin: the reuse the pin holds back was explored, not only runs where `b` took a new
    // cell.
    static REUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    loom::model(|| {
        let (slab, a, b, clock) = slab_with_a();
        let pinned = {
            let (slab, a) = (slab.clone(), a.clone());
            thread::spawn(move || last_hit(&a, &slab, 2))
        };
        let evict_and_create = {
            let (slab, a, b, clock) = (slab.clone(), a.clone(), b.clone(), clock.clone());
            thread::spawn(move || evict_a_create_b(&a, &b, &slab, &clock))
        };
        let request_b = {
            let (slab, b) = (slab.clone(), b.clone());
            thread::spawn(move || request(&b, &slab, &clock))
        };
        let hit = pinned.join().unwrap();
        let (slot_b, creator_b) = evict_and_create.join().unwrap();
        let seen_b = request_b.join().unwrap();
        assert_only_a(&hit);
        assert_b_admits_once(&[&creator_b, &seen_b]);
        if let Some((slot_a, seen)) = &hit {
            if *slot_a == slot_b && seen.iter().all(Option::is_none) {
                REUSED.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
    });
    assert!(
        REUSED.load(std::sync::atomic::Ordering::Relaxed),
        "no execution gave b the place of the cell pinned as a's"
    );
}
