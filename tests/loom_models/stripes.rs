//! Loom models of one key's token bucket spread over stripes (`tollgate::model::ModelStripes`):
//! leases taken from the central word, slots taken from a stripe, and steals from another
//! stripe before a refusal, raced by two threads on a frozen clock. A request is refused
//! only when every slot has been used, so the key admits exactly its permits.

use loom::sync::Arc;
use loom::thread;
use tollgate::model::ModelStripes;
use tollgate::Policy;

fn key(policy: &str, stripes: usize, lease: u64) -> Arc<ModelStripes> {
    Arc::new(ModelStripes::new(
        &policy.parse::<Policy>().unwrap(),
        stripes,
        lease,
    ))
}

/// Two threads, each on its own stripe, two requests each, three permits: exactly three
/// admitted, however the leases, takes and steals interleave.
#[test]
fn two_stripes_admit_exactly_the_permits() {
    loom::model(|| {
        let key = key("3/1s", 2, 2);
        let other = {
            let key = key.clone();
            thread::spawn(move || (0..2).filter(|_| key.acquire(0, 1)).count())
        };
        let mine = (0..2).filter(|_| key.acquire(0, 0)).count();
        assert_eq!(mine + other.join().unwrap(), 3);
        assert_eq!(key.held(), 0);
    });
}

/// One thread leases both permits on its stripe and uses one; the other, finding the central
/// word empty, must take the one left on the first stripe rather than refuse.
#[test]
fn a_refusal_waits_for_a_lease_being_stored_and_steals_it() {
    loom::model(|| {
        let key = key("2/1s", 2, 2);
        let other = {
            let key = key.clone();
            thread::spawn(move || key.acquire(0, 1))
        };
        let mine = key.acquire(0, 0);
        let theirs = other.join().unwrap();
        assert!(mine && theirs, "two permits, two requests: both admitted");
        assert!(!key.acquire(0, 0) && !key.acquire(0, 1));
    });
}
