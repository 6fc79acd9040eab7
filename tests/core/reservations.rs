//! Reserve now, settle later: refunds and charges per algorithm, the errors, and exactness
//! under racing threads on a frozen clock.

use std::sync::Arc;
use std::time::Duration;

use tollgate::{Algorithm, DirectLimiter, FakeClock, Policy, RateLimiter, SettleError};

use crate::support::race;

/// One policy of each algorithm, and a composite of all three, of 10 permits per second in
/// their shortest band.
const POLICIES: [&str; 4] = [
    "token-bucket 10/1s",
    "sliding-log 10/1s",
    "sliding-counter 10/1s",
    "10/1s & sliding-log 20/1min & sliding-counter 100/1h",
];

fn keyed(policy: &str) -> (RateLimiter<String, FakeClock>, FakeClock) {
    let clock = FakeClock::new();
    let policy: Policy = policy.parse().unwrap();
    (RateLimiter::with_clock(policy, clock.clone()), clock)
}

/// [`keyed`], and the same policy given to every key by a resolver (a policy per key: each
/// state keeps its own parameters).
fn keyed_both_ways(policy: &str) -> [(RateLimiter<String, FakeClock>, FakeClock); 2] {
    let clock = FakeClock::new();
    let parsed: Policy = policy.parse().unwrap();
    let per_key = RateLimiter::with_resolver(move |_: &String| parsed, clock.clone());
    [keyed(policy), (per_key, clock)]
}

#[test]
fn a_refund_gives_back_what_the_request_did_not_use() {
    for (policy, (limiter, clock)) in POLICIES
        .into_iter()
        .flat_map(|policy| keyed_both_ways(policy).map(|limiter| (policy, limiter)))
    {
        clock.set(Duration::from_secs(5));
        let r = limiter.reserve_n("k", 10).unwrap();
        assert!(r.decision().is_allowed(), "{policy}");
        assert_eq!(r.held(), 10);
        assert!(!limiter.peek("k").is_allowed(), "{policy}");
        limiter.settle("k", r, 3).unwrap();
        // 3 spent, 7 available: a request of 1 would leave 6.
        assert_eq!(limiter.peek("k").remaining(), 6, "{policy}");
        assert_eq!(
            limiter.try_acquire_n("k", 7).unwrap().remaining(),
            0,
            "{policy}"
        );
        assert!(!limiter.try_acquire("k").is_allowed(), "{policy}");
    }
}

#[test]
fn a_cancel_restores_full_capacity() {
    for policy in POLICIES {
        let (limiter, clock) = keyed(policy);
        clock.set(Duration::from_millis(1_700));
        let _ = limiter.try_acquire_n("k", 2).unwrap();
        let r = limiter.reserve_n("k", 8).unwrap();
        limiter.cancel("k", r).unwrap();
        assert_eq!(limiter.peek("k").remaining(), 7, "{policy}");
        let direct = DirectLimiter::with_clock(policy.parse().unwrap(), clock.clone());
        let r = direct.reserve_n(10).unwrap();
        direct.cancel(r).unwrap();
        assert!(direct.is_at_rest(), "{policy}");
    }
}

#[test]
fn a_charge_beyond_the_reservation_is_a_debt() {
    // Token bucket 10/s (T = 100 ms): 5 reserved, 15 used, so 15 permits are spent at 0 and
    // the next permit comes back 600 ms later.
    for (limiter, _) in keyed_both_ways("10/1s") {
        let r = limiter.reserve_n("k", 5).unwrap();
        limiter.settle("k", r, 15).unwrap();
        let d = limiter.try_acquire("k");
        assert!(!d.is_allowed());
        assert_eq!(d.retry_after(), Duration::from_millis(600));
        assert_eq!(d.reset_after(), Duration::from_millis(1_500));
    }
    // A counter carries it too: 15 counted in this window, nothing before the next one's
    // estimate drops below 10.
    let (limiter, _) = keyed("sliding-counter 10/1s");
    let r = limiter.reserve_n("k", 5).unwrap();
    limiter.settle("k", r, 15).unwrap();
    let d = limiter.try_acquire("k");
    assert!(!d.is_allowed());
    assert!(d.retry_after() > Duration::from_secs(1), "{d:?}");
    // A log saturates at its limit within the window.
    let (limiter, clock) = keyed("sliding-log 10/1s");
    let r = limiter.reserve_n("k", 5).unwrap();
    limiter.settle("k", r, 15).unwrap();
    let d = limiter.try_acquire("k");
    assert_eq!(d.retry_after(), Duration::from_secs(1));
    clock.set(Duration::from_secs(1));
    assert_eq!(limiter.try_acquire_n("k", 10).unwrap().remaining(), 0);
}

#[test]
fn a_debt_is_carried_up_to_one_more_burst() {
    // 10/s: a charge of 1,000 more than reserved leaves at most one burst of debt.
    let (limiter, _) = keyed("10/1s");
    let r = limiter.reserve_n("k", 10).unwrap();
    limiter.settle("k", r, 1_000_000).unwrap();
    let d = limiter.try_acquire("k");
    assert_eq!(d.retry_after(), Duration::from_millis(1_100));
    assert_eq!(d.reset_after(), Duration::from_secs(2));
}

#[test]
fn a_refund_never_gives_back_what_time_already_returned() {
    // Token bucket 10/s: 10 reserved at 0; by 600 ms six have refilled. Cancelling then gives
    // back only the four still outstanding: the bucket is full, not more.
    let (limiter, clock) = keyed("10/1s");
    let r = limiter.reserve_n("k", 10).unwrap();
    clock.set(Duration::from_millis(600));
    limiter.cancel("k", r).unwrap();
    assert_eq!(limiter.peek("k").remaining(), 9);
    // Another request spent on top of a reservation keeps its own cost when the
    // reservation comes back partly refilled.
    let (limiter, clock) = keyed("10/1s");
    let r = limiter.reserve_n("k", 10).unwrap();
    clock.set(Duration::from_millis(500));
    assert!(limiter.try_acquire_n("k", 5).unwrap().is_allowed());
    clock.set(Duration::from_millis(600));
    limiter.cancel("k", r).unwrap();
    // The reservation's debt ran to 1 s, so 400 ms of it was left to give back; the 5 taken
    // at 500 ms keep theirs: 5 are available, and a request of 1 would leave 4.
    assert_eq!(limiter.peek("k").remaining(), 4);
    // A sliding log gives back nothing once the reservation's entries have left the window.
    let (limiter, clock) = keyed("sliding-log 10/1s");
    let r = limiter.reserve_n("k", 10).unwrap();
    clock.set(Duration::from_millis(1_000));
    assert_eq!(limiter.try_acquire_n("k", 10).unwrap().remaining(), 0);
    limiter.cancel("k", r).unwrap();
    assert!(!limiter.try_acquire("k").is_allowed());
    // A counter gives back nothing once the reservation's window is two windows back.
    let (limiter, clock) = keyed("sliding-counter 10/1s");
    let r = limiter.reserve_n("k", 10).unwrap();
    clock.set(Duration::from_secs(2));
    assert_eq!(limiter.try_acquire_n("k", 10).unwrap().remaining(), 0);
    limiter.cancel("k", r).unwrap();
    assert!(!limiter.try_acquire("k").is_allowed());
}

#[test]
fn a_log_refund_removes_the_reservations_entries_and_keeps_the_others() {
    let (limiter, clock) = keyed("sliding-log 5/1s");
    assert!(limiter.try_acquire_n("k", 2).unwrap().is_allowed());
    clock.set(Duration::from_millis(100));
    let r = limiter.reserve_n("k", 2).unwrap();
    clock.set(Duration::from_millis(200));
    assert!(limiter.try_acquire("k").is_allowed());
    limiter.cancel("k", r).unwrap();
    // Entries at 0, 0 and 200 remain: two free now, and the next frees at 1,000 ms.
    assert_eq!(limiter.try_acquire_n("k", 2).unwrap().remaining(), 0);
    let d = limiter.try_acquire("k");
    assert_eq!(d.retry_after(), Duration::from_millis(800));
    clock.set(Duration::from_millis(1_000));
    assert_eq!(limiter.try_acquire_n("k", 2).unwrap().remaining(), 0);
}

#[test]
fn a_log_refund_after_the_ring_wrapped_keeps_gone_entries_gone() {
    // 3 per second: 3 at 0 and 3 at 1 s (the ring has wrapped), 1 at 2 s, then 2 reserved
    // at 2.5 s and cancelled: the entry of 2 s remains, two places are free.
    let (limiter, clock) = keyed("sliding-log 3/1s");
    for t in [0, 1_000] {
        clock.set(Duration::from_millis(t));
        assert!(limiter.try_acquire_n("k", 3).unwrap().is_allowed());
    }
    clock.set(Duration::from_millis(2_000));
    assert!(limiter.try_acquire("k").is_allowed());
    clock.set(Duration::from_millis(2_500));
    let r = limiter.reserve_n("k", 2).unwrap();
    limiter.cancel("k", r).unwrap();
    assert_eq!(limiter.try_acquire_n("k", 2).unwrap().remaining(), 0);
    assert_eq!(
        limiter.try_acquire("k").retry_after(),
        Duration::from_millis(500)
    );
}

#[test]
fn settle_errors_name_what_was_wrong_and_change_nothing() {
    let (limiter, _) = keyed("5/1s");
    let (other, _) = keyed("5/1s");
    let r = limiter.reserve_n("alice", 3).unwrap();
    assert_eq!(limiter.settle("bob", r, 0), Err(SettleError::OtherKey));
    assert_eq!(limiter.peek("alice").remaining(), 1);
    let r = limiter.reserve_n("carol", 3).unwrap();
    assert_eq!(other.cancel("carol", r), Err(SettleError::OtherLimiter));
    assert_eq!(limiter.peek("carol").remaining(), 1);
    let refused = limiter.reserve_n("alice", 3).unwrap();
    assert!(!refused.decision().is_allowed());
    assert_eq!(refused.held(), 0);
    assert_eq!(
        limiter.settle("alice", refused, 1),
        Err(SettleError::Refused)
    );
    assert_eq!(limiter.peek("alice").remaining(), 1);
    assert_eq!(
        limiter.reserve_n("alice", 0).unwrap_err(),
        tollgate::CostError::Zero
    );
    assert!(limiter.reserve_n("alice", 6).is_err());
    assert_eq!(
        SettleError::OtherKey.to_string(),
        "key: the reservation was made for another key"
    );
    let direct = DirectLimiter::with_clock("5/1s".parse().unwrap(), FakeClock::new());
    let r = direct.reserve_n(2).unwrap();
    let other = DirectLimiter::with_clock("5/1s".parse().unwrap(), FakeClock::new());
    assert_eq!(other.settle(r, 0), Err(SettleError::OtherLimiter));
    assert!(other.is_at_rest() && !direct.is_at_rest());
}

#[test]
fn a_key_evicted_or_reset_before_the_settle_gets_nothing_back_and_pays_a_charge() {
    let (limiter, _) = keyed("10/1s");
    let r = limiter.reserve_n("k", 4).unwrap();
    assert!(limiter.reset("k"));
    limiter.cancel("k", r).unwrap();
    assert_eq!(limiter.len(), 0, "a refund creates no state");
    let r = limiter.reserve_n("k", 4).unwrap();
    assert!(limiter.reset("k"));
    limiter.settle("k", r, 6).unwrap();
    assert_eq!(
        limiter.peek("k").remaining(),
        7,
        "the 2 charged on top land on the new state"
    );
}

#[test]
fn a_charge_on_a_key_no_longer_tracked_lands_on_a_new_state_for_every_algorithm() {
    // The state created for the charge is at rest until the charge lands on it (a sliding
    // log or counter without entries is at rest at any instant), so the incremental sweep
    // that follows a new key must not take it away first.
    for policy in POLICIES {
        for at in [Duration::ZERO, Duration::from_secs(5)] {
            let (limiter, clock) = keyed(policy);
            clock.set(at);
            let r = limiter.reserve_n("k", 4).unwrap();
            assert!(limiter.reset("k"));
            limiter.settle("k", r, 6).unwrap();
            assert_eq!(limiter.len(), 1, "{policy} at {at:?}");
            // The 2 charged on top are spent: a request of 1 would leave 7.
            assert_eq!(limiter.peek("k").remaining(), 7, "{policy} at {at:?}");
        }
    }
}

#[test]
fn a_settle_after_a_policy_change_never_creates_permits() {
    for policy in POLICIES {
        let (limiter, _) = keyed(policy);
        let r = limiter.reserve_n("k", 6).unwrap();
        limiter.set_policy("sliding-log 4/1s".parse().unwrap());
        // The 6 carried over as 4 spent (capped at the new limit); the refund frees at most
        // what the new state holds.
        limiter.cancel("k", r).unwrap();
        let d = limiter.peek("k");
        assert!(d.remaining() <= 3, "{policy}: {d:?}");
    }
}

#[test]
fn an_overflowed_reservation_is_settled_on_the_shared_state() {
    let (limiter, _) = keyed("5/1s");
    let limiter = limiter.max_keys(1);
    let _ = limiter.try_acquire("alice");
    let r = limiter.reserve_n("mallory", 5).unwrap();
    assert!(r.decision().is_overflow());
    assert!(!limiter.try_acquire("eve").is_allowed());
    limiter.cancel("mallory", r).unwrap();
    assert!(limiter.try_acquire("eve").is_allowed());
}

#[test]
fn reserve_and_cancel_racing_leave_exactly_full_capacity() {
    for policy in POLICIES {
        for direct in [false, true] {
            let policy: Policy = policy.parse().unwrap();
            let clock = FakeClock::new();
            let keyed = Arc::new(RateLimiter::<String, FakeClock>::with_clock(
                policy,
                clock.clone(),
            ));
            let one = Arc::new(DirectLimiter::with_clock(policy, clock.clone()));
            let (k, o) = (keyed.clone(), one.clone());
            race(8, move |t| {
                for i in 0..10_000u64 {
                    let cost = 1 + (i + t as u64) % 3;
                    if direct {
                        let r = o.reserve_n(cost).unwrap();
                        if r.held() > 0 {
                            o.cancel(r).unwrap();
                        }
                    } else {
                        let r = k.reserve_n("hot", cost).unwrap();
                        if r.held() > 0 {
                            k.cancel("hot", r).unwrap();
                        }
                    }
                }
                0
            });
            if direct {
                assert!(one.is_at_rest(), "{policy}");
            } else {
                assert_eq!(
                    keyed.try_acquire_n("hot", 10).unwrap().remaining(),
                    0,
                    "{policy}"
                );
            }
        }
    }
}

/// With striping off, exactly what was not kept or charged is left. With it on (8 threads on
/// one key may stripe it), a refund stops at what the stripes hold (`RateLimiter::striping`):
/// less may be left, never more.
#[test]
fn settles_racing_admissions_never_admit_more_than_the_policy_plus_the_charges() {
    for striping in [false, true] {
        settles_racing_admissions(striping);
    }
}

fn settles_racing_admissions(striping: bool) {
    for policy in POLICIES {
        for trial in 0..5u64 {
            let policy: Policy = match policy.replace("10/1s", "200/1h") {
                // The first band binds: the others never fill up in this test.
                p if p.contains('&') => {
                    "200/1h & sliding-log 300/1d & sliding-counter 500/1d".into()
                }
                p => p,
            }
            .parse()
            .unwrap();
            let limiter = Arc::new(
                RateLimiter::<String, FakeClock>::with_clock(policy, FakeClock::new())
                    .striping(striping),
            );
            // The tightest band binds: its permits are the capacity.
            let capacity = policy.bands().map(|band| band.permits()).min().unwrap();
            let log = policy
                .bands()
                .any(|band| band.algorithm() == Algorithm::SlidingLog);
            let l = limiter.clone();
            // Each thread returns (permits it kept, charges beyond its reservations) packed.
            let total = race(8, move |t| {
                let mut kept = 0;
                let mut charged = 0;
                for i in 0..500u64 {
                    let seed = (t as u64 * 7_919 + i * 104_729 + trial) % 1_000;
                    if t.is_multiple_of(2) {
                        kept += u64::from(l.try_acquire("hot").is_allowed());
                        continue;
                    }
                    let held = 1 + seed % 4;
                    let r = l.reserve_n("hot", held).unwrap();
                    if r.held() == 0 {
                        continue;
                    }
                    // Mostly refunds; now and then one more than reserved (never for a log,
                    // whose charges saturate instead of counting).
                    let actual = if !log && seed.is_multiple_of(10) {
                        held + 1
                    } else {
                        seed % (held + 1)
                    };
                    l.settle("hot", r, actual).unwrap();
                    kept += actual.min(held);
                    charged += actual.saturating_sub(held);
                }
                kept | charged << 32
            });
            let (kept, charged) = (total & 0xffff_ffff, total >> 32);
            assert!(kept <= capacity, "{policy}: kept {kept}, charged {charged}");
            // Nothing was lost either: what is left is exactly what was not kept or charged.
            let left = capacity.saturating_sub(kept + charged);
            let d = limiter.peek("hot");
            let available = if d.is_allowed() { d.remaining() + 1 } else { 0 };
            if striping {
                assert!(
                    available <= left,
                    "{policy}: kept {kept}, charged {charged}"
                );
            } else {
                assert_eq!(available, left, "{policy}: kept {kept}, charged {charged}");
            }
        }
    }
}

#[test]
fn refunds_out_of_order_under_a_moving_clock_give_back_at_most_their_own_permits_again() {
    // `a` and then `b` reserve 5; `a` is cancelled at once, so `b`'s 5 are the whole debt and
    // have refilled by 500 ms. The bucket cannot tell: cancelling `b` then gives its 5 back
    // again. The documented bound: at most the refunded reservation's own permits.
    let (limiter, clock) = keyed("10/1s");
    let ra = limiter.reserve_n("k", 5).unwrap();
    let rb = limiter.reserve_n("k", 5).unwrap();
    limiter.cancel("k", ra).unwrap();
    clock.set(Duration::from_millis(500));
    assert!(limiter.try_acquire_n("k", 10).unwrap().is_allowed());
    limiter.cancel("k", rb).unwrap();
    assert!(limiter.try_acquire_n("k", 5).unwrap().is_allowed());
    assert!(!limiter.try_acquire("k").is_allowed());
    // Settled newest first, the same reservations are exact: at 200 ms `b`'s 5 are still
    // owed, and `a`'s 3 that time has not returned yet.
    let (limiter, clock) = keyed("10/1s");
    let ra = limiter.reserve_n("k", 5).unwrap();
    let rb = limiter.reserve_n("k", 5).unwrap();
    clock.set(Duration::from_millis(200));
    limiter.cancel("k", rb).unwrap();
    assert_eq!(limiter.peek("k").remaining(), 6);
    limiter.cancel("k", ra).unwrap();
    assert_eq!(limiter.try_acquire_n("k", 10).unwrap().remaining(), 0);
    assert!(!limiter.try_acquire("k").is_allowed());
}

#[test]
fn a_refund_after_a_reset_never_lands_on_the_fresh_state() {
    for policy in POLICIES {
        let (limiter, _) = keyed(policy);
        let r = limiter.reserve_n("k", 10).unwrap();
        assert!(limiter.reset("k"));
        assert!(
            limiter.try_acquire_n("k", 10).unwrap().is_allowed(),
            "{policy}"
        );
        limiter.cancel("k", r).unwrap();
        assert!(!limiter.try_acquire("k").is_allowed(), "{policy}");
    }
}

#[test]
fn a_refund_after_a_policy_change_gives_nothing_back_but_a_charge_still_lands() {
    for policy in POLICIES {
        let clock = FakeClock::new();
        let direct = DirectLimiter::with_clock(policy.parse().unwrap(), clock.clone());
        let (keyed, _) = keyed(policy);
        let (kr, dr) = (
            keyed.reserve_n("k", 10).unwrap(),
            direct.reserve_n(10).unwrap(),
        );
        let changed: Policy = "sliding-counter 20/1s".parse().unwrap();
        keyed.set_policy(changed);
        direct.set_policy(changed);
        let (kp, dp) = (keyed.peek("k"), direct.peek());
        keyed.cancel("k", kr).unwrap();
        direct.cancel(dr).unwrap();
        assert_eq!((keyed.peek("k"), direct.peek()), (kp, dp), "{policy}");
        // A charge reads no mark: it lands on the state under the new policy.
        let (kr, dr) = (
            keyed.reserve_n("k", 1).unwrap(),
            direct.reserve_n(1).unwrap(),
        );
        keyed.set_policy("sliding-counter 30/1s".parse().unwrap());
        direct.set_policy("sliding-counter 30/1s".parse().unwrap());
        let (kp, dp) = (keyed.peek("k"), direct.peek());
        keyed.settle("k", kr, 5).unwrap();
        direct.settle(dr, 5).unwrap();
        assert_eq!(keyed.peek("k").remaining(), kp.remaining() - 4, "{policy}");
        assert_eq!(direct.peek().remaining(), dp.remaining() - 4, "{policy}");
    }
}

#[test]
fn a_clock_set_back_never_makes_a_refund_give_more() {
    // 10 reserved at 0; at 1 s the bucket is full again and 10 more are admitted. With the
    // clock set back to 0, the cancel must not give back the 10 that time already returned.
    let (limiter, clock) = keyed("10/1s");
    let r = limiter.reserve_n("k", 10).unwrap();
    clock.set(Duration::from_secs(1));
    assert!(limiter.try_acquire_n("k", 10).unwrap().is_allowed());
    clock.set(Duration::ZERO);
    limiter.cancel("k", r).unwrap();
    clock.set(Duration::from_secs(1));
    assert!(!limiter.try_acquire("k").is_allowed());
}

/// A key evicted at rest and created again may get another policy from its resolver (a
/// tier changed meanwhile): a refund of a reservation made before gives nothing back to the
/// new state, which never held it, whatever the two algorithms. Each case: the reservation
/// under the first policy, the key idle long enough to be at rest and evicted, the second
/// policy's whole limit spent, then the cancel.
#[test]
fn a_refund_never_lands_on_a_state_created_under_another_policy() {
    use std::sync::atomic::{AtomicBool, Ordering};
    for (before, after, limit) in [
        ("sliding-counter 10/s", "sliding-counter 10/min", 10),
        ("sliding-log 5/s", "sliding-counter 5/min", 5),
        ("token-bucket 10/s", "sliding-counter 10/min", 10),
        (
            "sliding-counter 10/s",
            "10/min & sliding-counter 10/min",
            10,
        ),
    ] {
        let clock = FakeClock::new();
        let moved = Arc::new(AtomicBool::new(false));
        let tier = Arc::clone(&moved);
        let (before_policy, after_policy): (Policy, Policy) =
            (before.parse().unwrap(), after.parse().unwrap());
        let limiter: RateLimiter<u64, FakeClock> = RateLimiter::with_resolver(
            move |_: &u64| {
                if tier.load(Ordering::Relaxed) {
                    after_policy
                } else {
                    before_policy
                }
            },
            clock.clone(),
        );
        clock.set(Duration::from_millis(100));
        let reservation = limiter.reserve_n(&1, limit).unwrap();
        assert!(reservation.decision().is_allowed());
        clock.set(Duration::from_millis(2_100));
        assert_eq!(
            limiter.evict_idle(),
            1,
            "{before}: at rest after two windows"
        );
        moved.store(true, Ordering::Relaxed);
        assert!(limiter.try_acquire_n(&1, limit).unwrap().is_allowed());
        limiter.cancel(&1, reservation).unwrap();
        assert_eq!(
            limiter.available(&1),
            0,
            "{before} then {after}: the refund gave the new state what it never held"
        );
        assert!(
            !limiter.try_acquire(&1).is_allowed(),
            "{before} then {after}"
        );
    }
}

/// The same policy before and after (the resolver's answer unchanged): a refund on the
/// state that holds the reservation still gives back, stamp and all.
#[test]
fn a_refund_under_a_per_key_policy_still_gives_back() {
    for policy in POLICIES {
        let clock = FakeClock::new();
        let chosen: Policy = policy.parse().unwrap();
        let limiter: RateLimiter<u64, FakeClock> =
            RateLimiter::with_resolver(move |_: &u64| chosen, clock.clone());
        let reservation = limiter.reserve_n(&1, 4).unwrap();
        assert_eq!(limiter.available(&1), 6, "{policy}");
        limiter.settle(&1, reservation, 1).unwrap();
        assert_eq!(limiter.available(&1), 9, "{policy}");
    }
}
