//! A key cap (`max_keys`) never lets a key past its policy: what a key spent on the shared
//! overflow state while the limiter was full follows it into the state it gets later, for
//! every algorithm, and a reservation decided by the overflow state of a per-key policy is
//! settled on that same state whatever the resolver answers by then.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tollgate::{FakeClock, Policy, RateLimiter};

use crate::support::race;

const MINUTE: Duration = Duration::from_secs(60);

/// Admissions of `key` until the first refusal.
fn admissions(limiter: &RateLimiter<u64, FakeClock>, key: u64) -> u64 {
    let mut admitted = 0;
    while limiter.try_acquire(&key).is_allowed() {
        admitted += 1;
        assert!(admitted <= 1_000, "never refused");
    }
    admitted
}

/// Key 0 fills a cap of 1 at time 0; key 1 spends the shared state's 10 at `overflow_at`;
/// at `rest_at` key 0 is at rest and evicted, and key 1 gets a state of its own once it is
/// admitted (a refusal is the shared state's, and creates nothing). Returns what key 1 is
/// admitted then (a peek first must agree).
fn after_overflow(policy: &str, overflow_at: Duration, rest_at: Duration) -> u64 {
    let clock = FakeClock::new();
    let limiter: RateLimiter<u64, FakeClock> =
        RateLimiter::with_clock(policy.parse().unwrap(), clock.clone()).max_keys(1);
    assert!(limiter.try_acquire(&0).is_allowed());
    clock.set(overflow_at);
    for _ in 0..10 {
        let decision = limiter.try_acquire(&1);
        assert!(decision.is_allowed() && decision.is_overflow(), "{policy}");
    }
    assert!(!limiter.try_acquire(&1).is_allowed(), "{policy}");
    clock.set(rest_at);
    assert_eq!(limiter.evict_idle(), 1, "{policy}: key 0 at rest");
    let peeked = limiter.peek(&1);
    let admitted = admissions(&limiter, 1);
    assert_eq!(
        peeked.is_allowed(),
        admitted > 0,
        "{policy}: the peek agrees"
    );
    assert_eq!(
        limiter.len(),
        usize::from(admitted > 0),
        "{policy}: key 1 is tracked once admitted"
    );
    admitted
}

#[test]
fn what_a_key_spent_on_the_shared_state_follows_it_into_its_own() {
    // Token bucket 10/1h (a permit every 6 minutes): 10 at time 0, then one refill by the
    // time key 0 is at rest. The policy allows 11 in those 6 minutes; a fresh state would
    // give 10 more.
    assert_eq!(
        after_overflow("token-bucket 10/1h", Duration::ZERO, 6 * MINUTE),
        1
    );
    // Sliding log: the 10 at 1 minute stay in the window until 61 minutes.
    assert_eq!(after_overflow("sliding-log 10/1h", MINUTE, 60 * MINUTE), 0);
    // Sliding counter: the 10 of the window [1 h, 2 h) weigh fully at 2 h.
    assert_eq!(
        after_overflow("sliding-counter 10/1h", 60 * MINUTE, 120 * MINUTE),
        0
    );
    // A composite: its tightest band's 10 carry.
    assert_eq!(
        after_overflow("10/1h & 20/2h", Duration::ZERO, 6 * MINUTE),
        1
    );
}

#[test]
fn a_key_that_shared_under_a_per_key_policy_carries_it_too() {
    let clock = FakeClock::new();
    let limiter: RateLimiter<u64, FakeClock> =
        RateLimiter::with_resolver(|_: &u64| "10/1h".parse().unwrap(), clock.clone()).max_keys(1);
    assert!(limiter.try_acquire(&0).is_allowed());
    assert_eq!(admissions(&limiter, 1), 10);
    clock.set(6 * MINUTE);
    assert_eq!(limiter.evict_idle(), 1);
    assert_eq!(admissions(&limiter, 1), 1);
}

#[test]
fn once_the_shared_state_is_at_rest_new_keys_start_fresh() {
    let clock = FakeClock::new();
    let limiter: RateLimiter<u64, FakeClock> =
        RateLimiter::with_clock("10/1h".parse().unwrap(), clock.clone()).max_keys(1);
    assert!(limiter.try_acquire(&0).is_allowed());
    assert_eq!(admissions(&limiter, 1), 10);
    clock.set(60 * MINUTE);
    assert_eq!(limiter.evict_idle(), 1);
    assert_eq!(admissions(&limiter, 1), 10);
}

#[test]
fn racing_threads_never_take_more_than_one_policy_for_a_key_across_the_cap() {
    // A frozen clock and a capacity of 10: whatever the interleaving of key 1's requests,
    // other keys' floods and the reset that frees the only place, key 1 gets at most 10.
    for trial in 0..20 {
        let limiter: Arc<RateLimiter<u64, FakeClock>> = Arc::new(
            RateLimiter::with_clock("10/1h".parse().unwrap(), FakeClock::new()).max_keys(1),
        );
        assert!(limiter.try_acquire(&0).is_allowed());
        let shared = Arc::clone(&limiter);
        let admitted = race(16, move |thread| {
            let mut admitted = 0;
            for i in 0..200 {
                if thread == 0 && i == 20 {
                    // Frees the place: key 1, or a flooding key, takes it.
                    shared.reset(&0);
                }
                let key = if thread % 2 == 0 {
                    1
                } else {
                    2 + (i % 3) as u64
                };
                let allowed = shared.try_acquire(&key).is_allowed();
                admitted += u64::from(allowed && key == 1);
            }
            admitted
        });
        assert!(admitted <= 10, "trial {trial}: key 1 admitted {admitted}");
    }
}

#[test]
fn an_overflow_reservation_settles_on_the_state_that_decided_it() {
    // Key 2's policy changes after its reservation was decided by the shared state of the
    // token bucket: the refund goes back there, not to the sliding log's shared state.
    let moved = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&moved);
    let bucket: Policy = "token-bucket 3/1h".parse().unwrap();
    let log: Policy = "sliding-log 3/1h".parse().unwrap();
    let limiter: RateLimiter<u64, FakeClock> = RateLimiter::with_resolver(
        move |key: &u64| {
            if *key >= 3 || (*key == 2 && flag.load(Ordering::SeqCst)) {
                log
            } else {
                bucket
            }
        },
        FakeClock::new(),
    )
    .max_keys(1);
    assert!(limiter.try_acquire(&0).is_allowed());
    let reservation = limiter.reserve_n(&2, 3).unwrap();
    assert!(reservation.decision().is_overflow() && reservation.decision().is_allowed());
    // The sliding log's shared state is spent by other keys.
    assert_eq!(admissions(&limiter, 3), 3);
    moved.store(true, Ordering::SeqCst);
    limiter.cancel(&2, reservation).unwrap();
    // The log's shared state gained nothing; the bucket's got its 3 back.
    assert!(!limiter.try_acquire(&4).is_allowed());
    assert_eq!(admissions(&limiter, 1), 3);
}

#[test]
fn a_policy_change_keeps_what_the_shared_state_spent() {
    // Key 0 holds the only place; keys 1 and 2 spend the shared state's 10. A new policy of
    // the same burst then has nothing more for them, as a tracked key would have nothing.
    for (old, new) in [
        ("token-bucket 10/1h", "token-bucket 10/2h"),
        ("sliding-log 10/1h", "sliding-counter 10/1h"),
        ("sliding-counter 10/1h", "10/1h & 100/1d"),
    ] {
        let limiter: RateLimiter<u64, FakeClock> =
            RateLimiter::with_clock(old.parse().unwrap(), FakeClock::new()).max_keys(1);
        assert!(limiter.try_acquire(&0).is_allowed());
        assert_eq!(admissions(&limiter, 1), 10, "{old}");
        limiter.set_policy(new.parse().unwrap());
        assert_eq!(admissions(&limiter, 2), 0, "{old} -> {new}");
        assert_eq!(
            admissions(&limiter, 0),
            9,
            "{old} -> {new}: the tracked key"
        );
    }
}

#[test]
fn a_change_of_resolver_keeps_what_the_shared_states_spent() {
    let limiter: RateLimiter<u64, FakeClock> =
        RateLimiter::with_resolver(|_: &u64| "10/1h".parse().unwrap(), FakeClock::new())
            .max_keys(1);
    assert!(limiter.try_acquire(&0).is_allowed());
    assert_eq!(admissions(&limiter, 1), 10);
    limiter.set_resolver(|_: &u64| "sliding-log 10/1h".parse().unwrap());
    assert_eq!(admissions(&limiter, 2), 0);
    limiter.set_policy("10/1h".parse().unwrap());
    assert_eq!(admissions(&limiter, 3), 0);
}

#[test]
fn racing_policy_changes_never_hand_the_shared_state_a_new_budget() {
    // A frozen clock: whatever the interleaving of overflowing requests and policy changes
    // between two policies of 10 in the same window (so each counts what the other spent),
    // the keys sharing the overflow state get 10 in all.
    let policies: [Policy; 2] = [
        "token-bucket 10/1h".parse().unwrap(),
        "sliding-log 10/1h".parse().unwrap(),
    ];
    for trial in 0..20 {
        let limiter: Arc<RateLimiter<u64, FakeClock>> =
            Arc::new(RateLimiter::with_clock(policies[0], FakeClock::new()).max_keys(1));
        assert!(limiter.try_acquire(&0).is_allowed());
        let shared = Arc::clone(&limiter);
        let admitted = race(8, move |thread| {
            let mut admitted = 0;
            for i in 0..200_u64 {
                if thread == 0 && i % 20 == 0 {
                    shared.set_policy(policies[(i / 20 % 2) as usize]);
                }
                let decision = shared.try_acquire(&(1 + i % 5));
                admitted += u64::from(decision.is_allowed());
            }
            admitted
        });
        assert_eq!(admitted, 10, "trial {trial}");
    }
}

#[test]
fn a_charge_lands_on_the_state_the_key_has_by_then() {
    let limiter: RateLimiter<u64, FakeClock> =
        RateLimiter::with_clock("10/1h".parse().unwrap(), FakeClock::new()).max_keys(1);
    assert!(limiter.try_acquire(&0).is_allowed());
    let reservation = limiter.reserve_n(&1, 1).unwrap();
    assert!(reservation.decision().is_overflow());
    assert!(limiter.reset(&0));
    // Key 1 takes the freed place, starting with the shared state's 1, and spends 1 more.
    let own = limiter.try_acquire(&1);
    assert!(own.is_allowed() && !own.is_overflow());
    limiter.settle(&1, reservation, 10).unwrap();
    assert_eq!(
        admissions(&limiter, 1),
        0,
        "the 9 charged on top reached key 1's state"
    );
}

#[test]
fn frequent_reloads_do_not_keep_a_flood_alive() {
    // A flood spends the shared state at time 0; the resolver is reloaded every 30 minutes.
    // What the flood spent ages as it would without reloads: an hour later it is gone.
    let clock = FakeClock::new();
    let limiter: RateLimiter<u64, FakeClock> = RateLimiter::with_resolver(
        |_: &u64| "token-bucket 10/1h".parse().unwrap(),
        clock.clone(),
    )
    .max_keys(1);
    assert!(limiter.try_acquire(&0).is_allowed());
    assert_eq!(admissions(&limiter, 1), 10);
    for half_hours in 1..=10 {
        clock.set(30 * MINUTE * half_hours);
        limiter.set_resolver(|_: &u64| "token-bucket 10/1h".parse().unwrap());
    }
    assert_eq!(limiter.evict_idle(), 1, "key 0 at rest");
    assert_eq!(
        admissions(&limiter, 3),
        10,
        "a new key starts fresh five hours on"
    );
}

/// Policy changes that follow one another with no new admission on the shared state hand on
/// what the flood spent as it was counted, so it ages out as it would without them.
#[test]
fn policy_changes_without_new_admissions_do_not_keep_a_flood_alive() {
    for (a, b, every) in [
        ("sliding-log 10/1h", "sliding-log 11/1h", 50 * MINUTE),
        ("token-bucket 10/1h", "sliding-log 10/1h", 5 * MINUTE),
        ("sliding-counter 10/1h", "token-bucket 10/1h", 5 * MINUTE),
    ] {
        let clock = FakeClock::new();
        let limiter: RateLimiter<u64, FakeClock> =
            RateLimiter::with_clock(a.parse().unwrap(), clock.clone()).max_keys(1);
        assert!(limiter.try_acquire(&0).is_allowed());
        assert_eq!(admissions(&limiter, 1), 10, "{a}");
        let mut at = Duration::ZERO;
        for change in 0..40 {
            at += every;
            clock.set(at);
            limiter.set_policy(if change % 2 == 0 { b } else { a }.parse().unwrap());
        }
        // A minute after the last change, hours after the flood: had each change counted the
        // flood's permits as spent at its own instant, they would still be in use now.
        clock.set(at + MINUTE);
        assert_eq!(limiter.evict_idle(), 1, "{a} <-> {b}: key 0 at rest");
        assert!(
            limiter.try_acquire(&3).remaining() >= 9,
            "{a} <-> {b}: a new key starts fresh once the flood has aged out"
        );
    }
}

#[test]
fn a_key_moved_to_a_tier_others_shared_under_keeps_what_it_spent() {
    let limiter: RateLimiter<u64, FakeClock> = RateLimiter::with_resolver(
        |key: &u64| if *key == 2 { "5/1h" } else { "10/1h" }.parse().unwrap(),
        FakeClock::new(),
    )
    .max_keys(1);
    assert!(limiter.try_acquire(&0).is_allowed());
    assert_eq!(admissions(&limiter, 1), 10);
    assert!(limiter.try_acquire(&2).is_allowed());
    limiter.set_resolver(|_: &u64| "5/1h".parse().unwrap());
    assert_eq!(admissions(&limiter, 1), 0, "key 1 spent 10 within the hour");
}

/// A charge on a reservation of the shared state, settled after a change of resolver, lands
/// where the key's next request goes: the shared state of its policy now, rebuilt, whether
/// the policy stayed the same or changed.
#[test]
fn a_charge_after_a_change_of_resolver_lands_where_the_keys_next_request_goes() {
    for tier in ["10/1h", "sliding-log 10/1h"] {
        let limiter: RateLimiter<u64, FakeClock> =
            RateLimiter::with_resolver(|_: &u64| "10/1h".parse().unwrap(), FakeClock::new())
                .max_keys(1);
        assert!(limiter.try_acquire(&0).is_allowed());
        let reservation = limiter.reserve_n(&1, 1).unwrap();
        assert!(reservation.decision().is_overflow());
        let policy: Policy = tier.parse().unwrap();
        limiter.set_resolver(move |_: &u64| policy);
        // It cost 10: the 9 on top are charged to the shared state the key now gets.
        limiter.settle(&1, reservation, 10).unwrap();
        assert_eq!(
            admissions(&limiter, 1),
            0,
            "{tier}: 10 spent within the hour, whatever the tier"
        );
        assert_eq!(
            admissions(&limiter, 2),
            0,
            "{tier}: the shared state is spent"
        );
    }
}

/// A hasher whose next clone panics when asked to.
struct Fragile;

static PANIC_ON_CLONE: AtomicBool = AtomicBool::new(false);

impl Clone for Fragile {
    fn clone(&self) -> Self {
        if PANIC_ON_CLONE.swap(false, Ordering::SeqCst) {
            panic!("the hasher's clone failed");
        }
        Fragile
    }
}

impl std::hash::BuildHasher for Fragile {
    type Hasher = std::collections::hash_map::DefaultHasher;
    fn build_hasher(&self) -> Self::Hasher {
        std::collections::hash_map::DefaultHasher::new()
    }
}

#[test]
fn a_policy_change_that_panics_leaves_the_limiter_deciding() {
    let limiter: RateLimiter<u64, FakeClock, Fragile> =
        RateLimiter::with_hasher("10/1h".parse().unwrap(), FakeClock::new(), Fragile).max_keys(1);
    assert!(limiter.try_acquire(&0).is_allowed());
    assert!(limiter.try_acquire(&1).is_overflow());
    PANIC_ON_CLONE.store(true, Ordering::SeqCst);
    let changed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        limiter.set_policy("20/1h".parse().unwrap());
    }));
    assert!(changed.is_err());
    // Nothing was retired: overflowing keys are still decided on the shared state.
    let decision = limiter.try_acquire(&2);
    assert!(decision.is_overflow() && decision.is_allowed());
    assert_eq!(limiter.peek(&3).remaining(), 7);
}

/// On a full limiter, what a new key may have comes from the shared overflow state: a
/// request that a sweep lets have a state of its own is still admitted what `available`
/// (which reads the shared state) said, and a refusal there creates nothing and moves no
/// permit, so the key's `retry_after` is what `peek` said.
#[test]
fn a_key_leaving_a_full_limiter_gets_what_peek_said_and_a_refusal_changes_nothing() {
    let nanos = Duration::from_nanos;
    // A counter's share of the shared state, rounded up in a state of the key's own, would
    // refuse the 3 that `available` reports.
    let clock = FakeClock::new();
    let limiter: RateLimiter<u64, FakeClock> =
        RateLimiter::with_clock("sliding-counter 5/100ns".parse().unwrap(), clock.clone())
            .max_keys(1)
            .sweep_per_insert(0);
    assert!(limiter.try_acquire(&0).is_allowed());
    clock.set(nanos(120));
    let flood = limiter.try_acquire_n(&9, 5).unwrap();
    assert!(flood.is_allowed() && flood.is_overflow(), "{flood:?}");
    // Key 0 is at rest: a request sweeps it away and may take its place.
    clock.set(nanos(250));
    let available = limiter.available(&1);
    assert!(available > 0);
    let asked = limiter.try_acquire_n(&1, available).unwrap();
    assert!(asked.is_allowed(), "available {available}: {asked:?}");

    // A log's permits, stamped again when a key takes a state of its own, would push a
    // refused key's wait back: a refusal must leave the key as `peek` saw it.
    let full = || {
        let clock = FakeClock::new();
        let limiter: RateLimiter<u64, FakeClock> =
            RateLimiter::with_clock("sliding-log 5/100ns".parse().unwrap(), clock.clone())
                .max_keys(1)
                .sweep_per_insert(0);
        clock.set(nanos(100));
        assert!(limiter.try_acquire(&0).is_allowed());
        clock.set(nanos(120));
        assert!(limiter.try_acquire_n(&9, 5).unwrap().is_overflow());
        clock.set(nanos(210));
        (clock, limiter)
    };
    let (clock, refused_once) = full();
    let peeked = refused_once.peek(&1);
    let refused = refused_once.try_acquire(&1);
    assert!(!refused.is_allowed());
    assert_eq!(
        refused.retry_after(),
        peeked.retry_after(),
        "{refused:?} {peeked:?}"
    );
    clock.set(nanos(220));
    let (other, untouched) = full();
    other.set(nanos(220));
    let after = refused_once.try_acquire(&1);
    let without = untouched.try_acquire(&1);
    assert_eq!(
        (after.is_allowed(), after.remaining()),
        (without.is_allowed(), without.remaining()),
        "{after:?} {without:?}"
    );
    assert!(after.is_allowed(), "{after:?}");
}

/// Below the cap, a new key's own state decides, even where the busy shared state would
/// admit what that state (counting the shared permits rounded up) refuses: admissions on the
/// shared state with places free would keep it busy, and every later new key on it.
#[test]
fn below_the_cap_a_new_key_is_decided_by_its_own_state() {
    let nanos = Duration::from_nanos;
    let clock = FakeClock::new();
    let limiter: RateLimiter<u64, FakeClock> =
        RateLimiter::with_clock("sliding-counter 10/100ns".parse().unwrap(), clock.clone())
            .max_keys(1)
            .sweep_per_insert(0);
    assert!(limiter.try_acquire(&0).is_allowed());
    clock.set(nanos(150));
    assert!(limiter.try_acquire_n(&9, 10).unwrap().is_overflow());
    clock.set(nanos(205));
    assert_eq!(limiter.evict_idle(), 1, "key 0 at rest");
    // The shared state weighs its 10 at 0.95: 9.5 in use, so it would admit one more; a
    // state of the key's own counts 10.
    for _ in 0..3 {
        let peeked = limiter.peek(&1);
        let decided = limiter.try_acquire(&1);
        assert!(
            !decided.is_allowed() && !decided.is_overflow(),
            "{decided:?}"
        );
        assert_eq!(peeked.retry_after(), decided.retry_after());
        assert_eq!(limiter.len(), 1);
    }
}

/// A key whose permits a round trip of policies kept, evicted since, meets a full limiter:
/// the shared state does not know what it spent, so what is kept refuses it first, in a
/// peek as in the request, and nothing comes back.
#[test]
fn at_the_cap_a_key_is_refused_by_what_a_round_trip_kept() {
    let policy = |text: &str| -> Policy { text.parse().unwrap() };
    let drain = |limiter: &RateLimiter<u64, FakeClock>| {
        let mut admitted = 0;
        while limiter.try_acquire(&7).is_allowed() {
            admitted += 1;
            assert!(admitted <= 1_000, "never refused");
        }
        admitted
    };
    let clock = FakeClock::new();
    let limiter: RateLimiter<u64, FakeClock> =
        RateLimiter::with_clock(policy("10/1h"), clock.clone()).max_keys(3);
    assert_eq!(drain(&limiter), 10);
    limiter.set_policy(policy("3/1s"));
    // A second's band does not count the hour's permits (see `set_policy`).
    assert_eq!(drain(&limiter), 3);
    clock.advance(Duration::from_secs(2));
    limiter.evict_idle();
    limiter.set_policy(policy("10/1h"));
    assert_eq!(limiter.available(&7), 0);
    for other in 1..=3 {
        assert!(limiter.try_acquire(&other).is_allowed());
    }
    let peeked = limiter.peek(&7);
    let decided = limiter.try_acquire(&7);
    assert!(
        !peeked.is_allowed() && !decided.is_allowed(),
        "{peeked:?} {decided:?}"
    );
    assert_eq!(peeked.retry_after(), decided.retry_after());
    assert_eq!(drain(&limiter), 0, "nothing comes back at the cap");
    assert_eq!(limiter.len(), 3);
}

/// At the cap, what a key kept and what the shared state counts add up: a key that spent 6
/// of `10/1h` (kept, as a second's policy does not count the hour) gets at most the 4 left,
/// though the shared state alone has 9, in a peek as in its requests. (The permit it spent
/// under the second's policy came back under that policy, before the eviction.)
#[test]
fn at_the_cap_kept_and_shared_permits_add_up() {
    let policy = |text: String| -> Policy { text.parse().unwrap() };
    for algorithm in ["token-bucket", "sliding-log", "sliding-counter"] {
        let clock = FakeClock::new();
        let hour = policy(format!("{algorithm} 10/1h"));
        let limiter: RateLimiter<u64, FakeClock> =
            RateLimiter::with_clock(hour, clock.clone()).max_keys(3);
        for _ in 0..6 {
            assert!(limiter.try_acquire(&7).is_allowed());
        }
        // A second's band does not count the hour's 6: kept.
        limiter.set_policy(policy(format!("{algorithm} 3/1s")));
        assert!(limiter.try_acquire(&7).is_allowed());
        clock.advance(Duration::from_secs(2));
        assert_eq!(limiter.evict_idle(), 1);
        limiter.set_policy(hour);
        for other in 1..=3 {
            assert!(limiter.try_acquire(&other).is_allowed());
        }
        let mut admitted = 0;
        while limiter.peek(&7).is_allowed() {
            assert!(
                limiter.try_acquire(&7).is_allowed(),
                "{algorithm}: the peek said so"
            );
            admitted += 1;
            assert!(admitted <= 100, "never refused");
        }
        assert!(!limiter.try_acquire(&7).is_allowed(), "{algorithm}");
        assert_eq!(admitted, 4, "{algorithm}: after 6 of 10/1h");
    }
}
