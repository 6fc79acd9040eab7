//! Loom model of two `AllOf`s racing over two shared parts, taking them in opposite orders
//! (`ModelAllOf`, the crate's own protocol on two token buckets of one permit each, the
//! clock frozen): whatever the interleaving, at most one of the two is allowed; an allowed
//! one has spent exactly one permit on each part; a refused one has left both parts as they
//! were, so once both are done each part has exactly its permit less the admissions. Both
//! may be refused (each took the part the other needed next, then gave it back): the
//! spurious refusal the protocol allows while a racing request holds a permit it gives back.
//!
//! ```text
//! LOOM_MAX_PREEMPTIONS=3 RUSTFLAGS="--cfg tollgate_loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test --release --test loom_models all_of::
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};

use loom::sync::Arc;
use loom::thread;
use tollgate::model::ModelAllOf;
use tollgate::Policy;

use crate::support::frozen_clock;

#[test]
fn two_all_ofs_over_two_parts_spend_all_or_nothing() {
    // How often each ending was seen, across loom's interleavings (std atomics: outside the
    // model).
    static ONE_ADMITTED: AtomicUsize = AtomicUsize::new(0);
    static BOTH_REFUSED: AtomicUsize = AtomicUsize::new(0);
    let policy: Policy = "1/1h".parse().unwrap();
    loom::model(move || {
        let both = Arc::new(ModelAllOf::new(&policy));
        let other = both.clone();
        let racer = thread::spawn(move || other.try_acquire(&frozen_clock(), 1).is_allowed());
        let mine = both.try_acquire(&frozen_clock(), 0).is_allowed();
        let theirs = racer.join().unwrap();
        assert!(
            !(mine && theirs),
            "one permit per part: at most one admission"
        );
        let admitted = u64::from(mine || theirs);
        let seen = if admitted == 1 {
            &ONE_ADMITTED
        } else {
            &BOTH_REFUSED
        };
        seen.fetch_add(1, Ordering::Relaxed);
        for part in 0..2 {
            let left = both.peek(&frozen_clock(), part);
            assert_eq!(
                u64::from(left.is_allowed()),
                1 - admitted,
                "part {part}: its permit less the admissions ({mine}, {theirs})"
            );
        }
    });
    // Loom showed both endings: one admitted (one ran ahead), both refused (they crossed).
    assert!(ONE_ADMITTED.load(Ordering::Relaxed) > 0);
    assert!(BOTH_REFUSED.load(Ordering::Relaxed) > 0);
}

#[test]
fn an_all_of_racing_a_request_on_one_part_never_leaves_it_spent() {
    // Two permits a part: the racer takes one on part 0 alone (as another limiter's user
    // would); the AllOf takes part 0 then part 1. Both always fit: both are admitted.
    let policy: Policy = "2/1h".parse().unwrap();
    loom::model(move || {
        let both = Arc::new(ModelAllOf::new(&policy));
        let other = both.clone();
        let racer = thread::spawn(move || other.try_acquire_one(&frozen_clock(), 0).is_allowed());
        let all = both.try_acquire(&frozen_clock(), 0);
        assert!(racer.join().unwrap());
        assert!(all.is_allowed(), "{all:?}");
        assert_eq!(both.peek(&frozen_clock(), 0).remaining(), 0);
        assert_eq!(both.peek(&frozen_clock(), 1).remaining(), 0);
    });
}
