//! Loom models of one key's token bucket spread over stripes (`tollgate::model::ModelStripes`):
//! leases taken from the central word, permits taken from a stripe, steals from another
//! stripe before a refusal, and a stripe's lease given back to the central word, raced by two
//! threads. On a frozen clock a request is refused only when every permit has been used, so
//! the key admits exactly its permits.

use loom::sync::Arc;
use loom::thread;
use tollgate::model::ModelStripes;
use tollgate::Policy;

const S: u64 = 1_000_000_000;

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
        assert_eq!(key.available(0), 0);
    });
}

/// A thread holding the key's stripes pinned (no guard) takes `takes` times from its home
/// stripe, 0, while the key goes quiet: that stripe's lease, leased by a first request of
/// `policy` (runs of `lease`), is given back to the key's word, the stripes are retired, and
/// requests decide on the word. What each take found, and how many the word admitted; the
/// stripes are retired at once for a take after the retirement.
fn pinned_takes_racing_a_quiet_key(
    policy: &str,
    lease: u64,
    takes: usize,
) -> (Vec<Option<bool>>, usize) {
    let key = key(policy, 2, lease);
    assert!(key.acquire(0, 0));
    let pinned = {
        let key = key.clone();
        thread::spawn(move || (0..takes).map(|_| key.take_home(0, 0)).collect::<Vec<_>>())
    };
    key.give_back(0, 0);
    key.retire();
    assert_eq!(key.take_home(0, 0), None, "retired at once");
    let on_word = (0..4).filter(|_| key.reserve(0, 1).is_some()).count();
    (pinned.join().unwrap(), on_word)
}

/// One permit left on the stripe and one on the word (a lease of two, one used): whichever
/// way the takes, the give-back's claim and the retirement interleave, exactly two are
/// admitted in all (a take that beat the give-back keeps its permit out of the word; one after
/// it finds the stripe empty or retired), and a take that found the stripes retired never
/// admits again.
#[test]
fn a_pinned_take_racing_a_quiet_key_s_give_back_uses_no_permit_twice() {
    loom::model(|| {
        let (taken, on_word) = pinned_takes_racing_a_quiet_key("3/1s", 2, 2);
        let from_stripe = taken.iter().filter(|&&took| took == Some(true)).count();
        assert_eq!(from_stripe + on_word, 2, "{taken:?}, {on_word} on the word");
        if taken[0].is_none() {
            assert_eq!(taken[1], None, "retired stays retired");
        }
    });
}

/// As above with a longer run left on the stripe (a lease of three, one used), taken twice by
/// the pinned thread: never more than the three permits left. One fewer when a take beat the
/// give-back's claim: the give-back then leaves the run on the stripe, and the retirement
/// loses what is left of it (the under-admission a quiet key may cost).
#[test]
fn a_pinned_take_racing_the_give_back_of_a_longer_run_never_over_admits() {
    loom::model(|| {
        let (taken, on_word) = pinned_takes_racing_a_quiet_key("4/1s", 3, 2);
        let total = taken.iter().filter(|&&took| took == Some(true)).count() + on_word;
        assert!(
            (2..=3).contains(&total),
            "{total} admitted of the three left"
        );
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

/// A stripe gives its lease back while a request on the other stripe looks for a permit: the
/// request finds the permit in the stripe or back in the central word, never nowhere.
#[test]
fn a_give_back_racing_a_refusal_loses_no_permit() {
    loom::model(|| {
        let key = key("2/1s", 2, 2);
        assert!(key.acquire(0, 0)); // stripe 0 holds the second permit
        let other = {
            let key = key.clone();
            thread::spawn(move || key.acquire(0, 1))
        };
        key.give_back(0, 0);
        assert!(
            other.join().unwrap(),
            "one permit left, one request: admitted"
        );
        assert_eq!(key.available(0), 0);
    });
}

/// Time moves one step while two threads decide: the permits the clock gives back are used,
/// and no more than the policy allows at the later instant are admitted.
#[test]
fn time_moving_one_step_admits_what_it_gives_back_and_no_more() {
    loom::model(|| {
        let key = key("2/1s", 2, 2); // T = 500 ms
        assert!(key.acquire(0, 0));
        assert!(key.acquire(0, 0)); // the burst spent on stripe 0
        let other = {
            let key = key.clone();
            thread::spawn(move || key.acquire(S / 2, 1))
        };
        let mine = key.acquire(S / 2, 0);
        let admitted = usize::from(mine) + usize::from(other.join().unwrap());
        assert_eq!(admitted, 1, "half a second gives back one permit");
        assert_eq!(key.available(S / 2), 0);
    });
}

/// A refund races a lease taken above the reservation: the refund never moves the TAT back
/// under the run the stripe keeps, so once time has given the key its burst back it admits
/// the burst and not one permit more (without the floor, the word's full burst and the run
/// would both be there).
#[test]
fn a_refund_racing_a_lease_never_gives_back_the_run_a_stripe_holds() {
    loom::model(|| {
        let key = key("4/1s", 2, 2); // T = 250 ms, B = 1 s
        let reservation = key.reserve(0, 2).unwrap(); // (0, 2T]
        let refund = {
            let key = key.clone();
            thread::spawn(move || key.cancel(0, 2, reservation))
        };
        // A lease above the reservation, or from where the refund left the TAT.
        assert!(key.acquire(0, 0));
        refund.join().unwrap();
        let later = 2 * S / 4; // 2T on
        let mut admitted = 0;
        while key.acquire(later, 1) {
            admitted += 1;
        }
        assert!(admitted <= 4, "{admitted} admitted at one instant, burst 4");
    });
}
