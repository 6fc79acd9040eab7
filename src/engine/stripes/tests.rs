//! The stripes' unit tests: leases, takes, steals, give-backs, refunds, quiet keys, the end of
//! the clock's range, 16 racing threads, and GCRA's bound on random steps.

use std::sync::{Arc, Barrier};

use super::*;
use crate::engine::state::RateState;
use crate::policy::Policy;

const S: u64 = 1_000_000_000;

fn parts(policy: &str) -> (GcraCell, Gcra) {
    let policy: Policy = policy.parse().unwrap();
    let gcra = GcraCell::params(&policy);
    (GcraCell::fresh(&gcra), gcra)
}

fn admits(stripes: &Stripes, central: &GcraCell, gcra: &Gcra, now: u64, home: usize) -> bool {
    stripes
        .acquire_from(home, central, gcra, now)
        .unwrap()
        .decision
        .is_allowed()
}

#[test]
fn each_thread_has_an_index_of_its_own_and_moves_on_when_it_meets_another() {
    let mine = std::thread::spawn(|| {
        let first = thread_index();
        assert_eq!(thread_index(), first, "an index stays with its thread");
        rehome();
        (first, thread_index())
    })
    .join()
    .unwrap();
    assert_eq!(mine.1, mine.0.wrapping_add(1), "moved to the next stripe");
    let theirs = std::thread::spawn(thread_index).join().unwrap();
    assert_ne!(theirs, mine.0, "another thread, another index");
}

#[test]
fn a_lease_covers_ten_microseconds_of_the_timeline_and_never_half_the_burst() {
    let (_, fast) = parts("1000000000/1s"); // T = 1 ns
    assert_eq!(Stripes::lease_for(&fast, 2), 10_000);
    let (_, tight) = parts("100000/1ms"); // T = 10 ns, a burst of 100,000
    assert_eq!(Stripes::lease_for(&tight, 64), 781, "100,000 / 128");
    let (_, slow) = parts("10/1s"); // T = 100 ms
    assert_eq!(Stripes::lease_for(&slow, 2), 1);
}

#[test]
fn the_fast_path_takes_from_the_stripe_its_thread_leased_on() {
    let (central, gcra) = parts("10/1s");
    let stripes = Stripes::new(2, 3);
    INDEX.with(|index| index.set(0)); // this thread's home: stripe 0
    assert!(
        stripes.try_home(&central, &gcra, 0).is_none(),
        "no lease yet"
    );
    let striped = stripes.acquire(&central, &gcra, 0).unwrap();
    assert!(striped.decision.is_allowed());
    assert_eq!(striped.home, 0);
    assert!(stripes.try_home(&central, &gcra, 0).unwrap().is_allowed());
    assert!(stripes.try_home(&central, &gcra, 0).unwrap().is_allowed());
    assert!(
        stripes.try_home(&central, &gcra, 0).is_none(),
        "the lease is used up"
    );
}

#[test]
fn a_clock_past_the_last_leased_instant_is_refused() {
    let (central, gcra) = parts("10/1s");
    let stripes = Stripes::new(2, 4);
    for now in [u64::MAX - 1, LAST_LEASED] {
        assert!(!admits(&stripes, &central, &gcra, now, 0), "{now}");
    }
}

#[test]
fn a_look_that_changes_nothing_counts_what_only_the_stripes_hold() {
    let (central, gcra) = parts("4/1s");
    let stripes = Stripes::new(2, 4);
    assert!(admits(&stripes, &central, &gcra, 0, 0)); // the whole burst leased, one used
    let peeked = stripes.peek(&central, &gcra, 0).unwrap();
    assert!(peeked.is_allowed());
    assert_eq!(
        peeked.remaining(),
        2,
        "three in stripe 0, one taken by the look"
    );
    assert_eq!(peeked.available_before(1), 3);
}

#[test]
fn a_frozen_clock_admits_exactly_the_burst_over_every_stripe() {
    let (central, gcra) = parts("10/1s");
    let stripes = Stripes::new(4, 3);
    let admitted = (0..40)
        .filter(|i| admits(&stripes, &central, &gcra, 0, i % 4))
        .count();
    assert_eq!(admitted, 10);
    assert_eq!(stripes.usable(&gcra, 0), 0);
}

#[test]
fn a_stripe_steals_before_it_refuses() {
    let (central, gcra) = parts("4/1s");
    let stripes = Stripes::new(2, 4);
    // Stripe 0 leases all four permits and uses one.
    assert!(admits(&stripes, &central, &gcra, 0, 0));
    assert_eq!(stripes.usable(&gcra, 0), 3);
    // Stripe 1 finds the central word empty and takes stripe 0's permits.
    for _ in 0..3 {
        assert!(admits(&stripes, &central, &gcra, 0, 1));
    }
    assert!(!admits(&stripes, &central, &gcra, 0, 1));
    assert!(!admits(&stripes, &central, &gcra, 0, 0));
}

#[test]
fn the_part_of_a_lease_time_has_passed_is_dropped_not_spent() {
    let (central, gcra) = parts("4/4s"); // T = 1 s, B = 4 s
    let stripes = Stripes::new(1, 4);
    assert!(admits(&stripes, &central, &gcra, 0, 0)); // lease (0, 4 s], first stretch (0, 1 s]
                                                      // At 2.5 s the run from 1 s to 2.5 s lies in the past: the next stretch is (2.5, 3.5].
    let striped = stripes.acquire_from(0, &central, &gcra, 5 * S / 2).unwrap();
    assert!(striped.decision.is_allowed());
    assert_eq!(
        stripes.usable(&gcra, 5 * S / 2),
        0,
        "half an interval is not a permit"
    );
    // The central word, at 4 s, has two permits at 2.5 s (B = 4 s): the next lease.
    assert_eq!(striped.decision.remaining(), 2);
    assert!(admits(&stripes, &central, &gcra, 5 * S / 2, 0));
    assert!(admits(&stripes, &central, &gcra, 5 * S / 2, 0));
    assert!(!admits(&stripes, &central, &gcra, 5 * S / 2, 0));
}

#[test]
fn a_refusal_says_when_the_central_word_has_a_permit_again() {
    let (central, gcra) = parts("2/1s");
    let stripes = Stripes::new(2, 1);
    assert!(admits(&stripes, &central, &gcra, 0, 0));
    assert!(admits(&stripes, &central, &gcra, 0, 1));
    let refused = stripes
        .acquire_from(0, &central, &gcra, 0)
        .unwrap()
        .decision;
    assert!(!refused.is_allowed());
    assert_eq!(refused.retry_after_nanos(), S / 2);
    assert_eq!(refused.reset_after_nanos(), S);
}

#[test]
fn the_newest_lease_is_given_back_and_an_older_one_stays() {
    let (central, gcra) = parts("10/1s");
    let stripes = Stripes::new(2, 4);
    assert!(admits(&stripes, &central, &gcra, 0, 0)); // stripe 0: (0, 0.4 s]
    assert!(admits(&stripes, &central, &gcra, 0, 1)); // stripe 1: (0.4, 0.8 s], the newest
    stripes.give_back(0, &Mutex::new(()), &central, 0);
    assert_eq!(
        stripes.usable(&gcra, 0),
        6,
        "not the newest: stays with its stripe"
    );
    stripes.give_back(1, &Mutex::new(()), &central, 0);
    assert_eq!(stripes.usable(&gcra, 0), 3);
    assert_eq!(
        central.tat_relaxed(),
        Some(S / 2),
        "stripe 1's three unused permits back"
    );
    let peeked = stripes.peek(&central, &gcra, 0).unwrap();
    assert_eq!(
        peeked.remaining(),
        7,
        "5 central + 3 in stripe 0, one taken by the peek"
    );
    let admitted = (0..20)
        .filter(|i| admits(&stripes, &central, &gcra, 0, i % 2))
        .count();
    assert_eq!(admitted, 8, "two used, eight left");
}

#[test]
fn a_key_is_quiet_once_one_stripe_alone_took_leases_for_the_whole_span() {
    let stripes = Stripes::new(2, 1);
    assert!(!stripes.note_lease(0, QUIET_SPAN), "the first span starts");
    assert!(!stripes.note_lease(1, QUIET_SPAN + 1));
    assert!(
        !stripes.note_lease(0, 2 * QUIET_SPAN + 1),
        "two stripes took leases"
    );
    assert!(!stripes.note_lease(0, 2 * QUIET_SPAN + 2));
    assert!(stripes.note_lease(0, 3 * QUIET_SPAN + 2), "stripe 0 alone");
    // Striped again later: judged on a span of its own, not on the one before.
    assert!(!stripes.note_lease(0, 100 * QUIET_SPAN));
    assert!(
        stripes.note_lease(0, 102 * QUIET_SPAN),
        "stripe 0 alone again"
    );
}

#[test]
fn a_refund_stops_at_the_runs_the_stripes_hold() {
    let (central, gcra) = parts("10000/1ms");
    let lock = std::sync::OnceLock::new();
    let stripes = lock.get_or_init(|| Stripes::new(64, Stripes::lease_for(&gcra, 64)));
    // A reservation, then a lease on every stripe above it; the reservation is cancelled.
    let (_, mark) = central.reserve_at(&gcra, 0, 5008, || {}).unwrap();
    for home in 0..64 {
        assert!(admits(stripes, &central, &gcra, 0, home));
    }
    let before = central.tat_relaxed().unwrap();
    Stripes::settle(
        || lock.get(),
        &Mutex::new(()),
        &central,
        &gcra,
        (5008, mark, 0),
        0,
    )
    .unwrap();
    assert_eq!(
        central.tat_relaxed(),
        Some(before),
        "the runs above the reservation are the stripes': nothing to give back under them"
    );
    // When the key is full again, it admits its burst and no more.
    let admitted = (0..30_000)
        .filter(|i| admits(stripes, &central, &gcra, before, i % 64))
        .count();
    assert_eq!(admitted, 10_000);
}

#[test]
fn a_refund_above_every_run_gives_back_and_a_racing_refusal_looks_again() {
    let (central, gcra) = parts("10/1s");
    let lock = std::sync::OnceLock::new();
    let stripes = lock.get_or_init(|| Stripes::new(2, 2));
    assert!(admits(stripes, &central, &gcra, 0, 0)); // stripe 0: (0.1, 0.2 s]
    let (_, mark) = central.reserve_at(&gcra, 0, 5, || {}).unwrap(); // (0.2, 0.7 s]
    let returns = stripes.leasing.returns.load(Ordering::Relaxed);
    Stripes::settle(
        || lock.get(),
        &Mutex::new(()),
        &central,
        &gcra,
        (5, mark, 2),
        0,
    )
    .unwrap();
    assert_eq!(
        central.tat_relaxed(),
        Some(S * 4 / 10),
        "three of five back"
    );
    assert_eq!(stripes.leasing.returns.load(Ordering::Relaxed), returns + 1);
    assert_eq!(stripes.peek(&central, &gcra, 0).unwrap().remaining(), 6);
}

#[test]
fn a_lease_at_the_end_of_the_clocks_range_stays_live() {
    let (central, gcra) = parts("10/1s");
    let stripes = Stripes::new(2, 4);
    let now = LAST_LEASED - gcra.interval();
    assert!(admits(&stripes, &central, &gcra, now, 0));
    assert!(central.tat_relaxed().is_some(), "not retired");
    // Every request there is answered, none sent round for ever (a debug build panics
    // after `Retry::LIMIT` rounds): by the stripes, or handed back to decide on the word
    // once no lease fits.
    for i in 0..20 {
        let _ = stripes.acquire_from(i % 2, &central, &gcra, now);
    }
}

#[test]
fn retired_stripes_send_requests_back() {
    let (central, gcra) = parts("4/1s");
    let stripes = Stripes::new(2, 2);
    assert!(admits(&stripes, &central, &gcra, 0, 0));
    stripes.retire();
    assert!(stripes.acquire_from(0, &central, &gcra, 0).is_none());
}

#[test]
fn sixteen_threads_on_a_frozen_clock_admit_exactly_the_burst() {
    for round in 0..200 {
        let (central, gcra) = parts("10/1s");
        let shared = Arc::new((central, gcra, Stripes::new(4, 3)));
        let start = Arc::new(Barrier::new(16));
        let admitted: usize = (0..16)
            .map(|thread| {
                let (shared, start) = (Arc::clone(&shared), Arc::clone(&start));
                std::thread::spawn(move || {
                    let (central, gcra, stripes) = &*shared;
                    start.wait();
                    (0..2)
                        .filter(|_| admits(stripes, central, gcra, 0, thread))
                        .count()
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|handle| handle.join().unwrap())
            .sum();
        assert_eq!(admitted, 10, "round {round}");
    }
}

proptest::proptest! {
    /// With a moving clock every admission holds a stretch of the timeline of its own,
    /// `(s, s + T]` with `now <= s` and `s + T <= now + B`, so no interval admits more than
    /// GCRA's bound; and a request is refused only when a look that changes nothing (the
    /// central word plus every stripe) finds nothing either.
    #[test]
    fn every_admission_holds_a_stretch_gcra_could_grant(
        steps in proptest::collection::vec((0usize..4, 0u64..700_000_000, proptest::bool::ANY), 1..300),
        stripes in 1usize..5,
        lease in 1u64..6,
    ) {
        let (central, gcra) = parts("5/1s"); // T = 200 ms, B = 1 s
        let striped = Stripes::new(stripes, lease);
        let (t, b) = (gcra.interval(), gcra.burst());
        let mut now = 0;
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for (home, advance, give_back) in steps {
            now += advance;
            if give_back {
                striped.give_back(home, &Mutex::new(()), &central, now);
            }
            let before = striped.peek(&central, &gcra, now).unwrap();
            let decision = striped.acquire_from(home, &central, &gcra, now).unwrap().decision;
            proptest::prop_assert_eq!(decision.is_allowed(), before.is_allowed(), "at {}", now);
            if decision.is_allowed() {
                // The stretch's end: the TAT it would leave on a lone stripe.
                let end = now + decision.reset_after_nanos().min(b);
                proptest::prop_assert!(end >= now + t, "stretch ending {end} at {now}");
                admitted.push((now, end));
            }
        }
        // GCRA's bound over every interval between two admissions: at most
        // L / T + B / T admissions in an interval of length L.
        for (i, &(from, _)) in admitted.iter().enumerate() {
            for (j, &(to, _)) in admitted.iter().enumerate().skip(i) {
                let count = (j - i + 1) as u64;
                proptest::prop_assert!(count <= (to - from) / t + b / t, "{count} in [{from}, {to}]");
            }
        }
    }
}

#[test]
fn a_refund_stops_where_a_give_back_left_the_central_word() {
    let (central, gcra) = parts("10/1s");
    let lock = std::sync::OnceLock::new();
    let stripes = lock.get_or_init(|| Stripes::new(2, 4));
    // A reservation of 2 (0, 0.2 s], then a lease on stripe 0 (0.2, 0.6 s], one taken.
    let (_, mark) = central.reserve_at(&gcra, 0, 2, || {}).unwrap();
    assert!(admits(stripes, &central, &gcra, 0, 0));
    // The stripe gives back its three unused permits: the TAT goes back to 0.3 s.
    stripes.give_back(0, &Mutex::new(()), &central, 0);
    assert_eq!(central.tat_relaxed(), Some(S * 3 / 10));
    // The reservation's refund would take the TAT below where the give-back left it, under
    // the `next` the run had: it stops there, so no later lease of the stripe starts at a
    // `next` a request may still hold from before the give-back.
    Stripes::settle(
        || lock.get(),
        &Mutex::new(()),
        &central,
        &gcra,
        (2, mark, 0),
        0,
    )
    .unwrap();
    assert_eq!(central.tat_relaxed(), Some(S * 3 / 10));
    // The point, not the end of the run given back: a reservation taken after the give-back
    // is refunded down to it.
    let (_, later) = central.reserve_at(&gcra, 0, 5, || {}).unwrap(); // (0.3, 0.8 s]
    Stripes::settle(
        || lock.get(),
        &Mutex::new(()),
        &central,
        &gcra,
        (5, later, 0),
        0,
    )
    .unwrap();
    assert_eq!(central.tat_relaxed(), Some(S * 3 / 10));
    // Once time has passed that point, a refund is no longer held back by it.
    assert!(admits(stripes, &central, &gcra, S, 1));
    let tat = central.tat_relaxed().unwrap();
    let (_, mark) = central.reserve_at(&gcra, S, 1, || {}).unwrap();
    Stripes::settle(
        || lock.get(),
        &Mutex::new(()),
        &central,
        &gcra,
        (1, mark, 0),
        S,
    )
    .unwrap();
    assert_eq!(
        central.tat_relaxed(),
        Some(tat),
        "given back above the runs"
    );
}

#[test]
fn a_take_on_retired_stripes_finds_them_retired() {
    let (central, gcra) = parts("3/1s");
    let stripes = Stripes::new(2, 2);
    assert!(admits(&stripes, &central, &gcra, 0, 0));
    assert!(matches!(
        stripes.home_from(0, &central, &gcra, 0),
        Home::Decided(_)
    ));
    stripes.retire();
    assert!(matches!(
        stripes.home_from(0, &central, &gcra, 0),
        Home::Retired
    ));
}
