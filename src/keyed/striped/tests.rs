//! Keys of the keyed limiter striped from the start (as contention would stripe them), so
//! that these tests do not depend on the scheduler making threads collide.

use std::sync::Arc;
use std::time::Duration;

use scc::Guard;

use crate::clock::Clock;
use crate::clock::FakeClock;
use crate::engine::dispatch::PerAlgorithm;
use crate::engine::token_bucket::GcraCell;
use crate::keyed::key_state::{AnyKeys, Keys};
use crate::keyed::RateLimiter;
use crate::keys::KeyHasher;

use super::{losses_count, place_of, spot, IDLE_SPAN, LOST_BEFORE_STRIPING, PROBES};
use crate::race::race;

type Limiter = RateLimiter<u64, FakeClock>;

fn limiter(policy: &str) -> (Arc<Limiter>, FakeClock) {
    let clock = FakeClock::new();
    let limiter = RateLimiter::with_clock(policy.parse().unwrap(), clock.clone());
    (Arc::new(limiter), clock)
}

/// Runs `look` on the token bucket table of `limiter`'s current generation.
fn with_table<R>(
    limiter: &Limiter,
    look: impl FnOnce(&Keys<u64, GcraCell, KeyHasher>, &Guard) -> R,
) -> R {
    let guard = Guard::new();
    let generation = limiter.generations.generation(&guard);
    let AnyKeys::Uniform(PerAlgorithm::TokenBucket(keyed)) = &generation.keys else {
        panic!("a token bucket's table");
    };
    look(keyed, &guard)
}

/// Stripes `key` if it is tracked; whether it was.
fn try_stripe(limiter: &Limiter, key: u64) -> bool {
    with_table(limiter, |keyed, guard| {
        keyed
            .table
            .read(&key, guard, |cell| {
                keyed
                    .hot
                    .stripe(cell, &keyed.params, limiter.generations.clock.now());
                Some(())
            })
            .is_some()
    })
}

/// Stripes `key`, which must be tracked.
fn stripe(limiter: &Limiter, key: u64) {
    assert!(try_stripe(limiter, key), "key {key} is tracked");
    assert!(limiter.is_striped(&key));
}

/// Lost compare-and-swaps count towards striping whenever striping is on, by the builder's
/// setting or by a marked spot, and never when it is off.
#[test]
fn losses_count_when_striping_is_on() {
    assert!(
        losses_count(false, true),
        "a key not striped yet, striping on"
    );
    assert!(losses_count(true, true));
    assert!(losses_count(true, false), "a spot marked: striping was on");
    assert!(!losses_count(false, false), "striping off");
}

/// A striped key's decisions, on every path a request of cost 1 takes (a slot of its home
/// stripe, inline; a lease taken, and the refusals once the key is spent, out of line; the
/// miss after a reset), are each counted once, with the policy's answer, and shadow mode lets
/// the refusals through.
#[test]
fn a_striped_keys_decisions_are_counted_once_and_shadowed() {
    let clock = FakeClock::new();
    let limiter: Limiter = RateLimiter::with_clock("100/1h".parse().unwrap(), clock)
        .with_stats()
        .shadow();
    assert!(limiter.try_acquire(&1).is_allowed());
    stripe(&limiter, 1);
    let decisions: Vec<_> = (0..149).map(|_| limiter.try_acquire(&1)).collect();
    assert!(limiter.is_striped(&1), "a frozen clock never goes quiet");
    assert!(decisions.iter().all(|d| d.is_allowed()));
    assert_eq!(decisions.iter().filter(|d| d.would_refuse()).count(), 50);
    assert!(limiter.reset(&1));
    let after = limiter.try_acquire(&1);
    assert!(
        after.is_allowed() && !after.would_refuse(),
        "a reset key starts afresh"
    );
    let stats = limiter.stats();
    assert_eq!((stats.allowed, stats.refused), (101, 50));
}

/// A striped key whose stripes were retired (unstriped under a request that found them)
/// decides on its word, one permit at a time, and exactly its policy's permits.
#[test]
fn stripes_retired_but_still_linked_send_requests_to_the_word() {
    let (limiter, _) = limiter("10/1h");
    assert!(limiter.try_acquire(&1).is_allowed());
    stripe(&limiter, 1);
    with_table(&limiter, |keyed, guard| {
        keyed.table.read(&1, guard, |cell| {
            let hot = keyed.hot.find(place_of(cell), guard).expect("striped");
            hot.stripes.retire();
            Some(())
        })
    })
    .expect("tracked");
    for left in (0..9).rev() {
        let decision = limiter.try_acquire(&1);
        assert!(decision.is_allowed());
        assert_eq!(
            decision.remaining(),
            left,
            "one permit of the word each time"
        );
    }
    assert!(
        !limiter.try_acquire(&1).is_allowed(),
        "exactly the policy's 10"
    );
}

#[test]
fn sixteen_threads_on_a_striped_key_admit_exactly_its_permits() {
    for trial in 0..20 {
        let (limiter, _) = limiter("20000/1h");
        assert!(limiter.try_acquire(&7).is_allowed());
        stripe(&limiter, 7);
        let l = limiter.clone();
        let admitted = race(16, move || {
            let mut admitted = 0;
            while l.try_acquire(&7).is_allowed() {
                admitted += 1;
            }
            admitted
        });
        assert!(
            limiter.is_striped(&7),
            "trial {trial}: a frozen clock never goes quiet"
        );
        assert_eq!(admitted, 19_999, "trial {trial}");
        assert_eq!(limiter.peek(&7).remaining(), 0, "trial {trial}");
        assert_eq!(limiter.available(&7), 0, "trial {trial}");
        // Another key is untouched.
        assert_eq!(limiter.try_acquire(&8).remaining(), 19_999);
    }
}

#[test]
fn a_peek_counts_what_the_stripes_hold() {
    // 1,000 ns a permit: a lease holds 10 permits, which the stripe keeps after its first.
    let (limiter, _) = limiter("10000/10ms");
    assert!(limiter.try_acquire(&1).is_allowed());
    stripe(&limiter, 1);
    assert!(limiter.try_acquire(&1).is_allowed());
    assert_eq!(limiter.available(&1), 9_998, "the stripe's 9 counted");
    assert_eq!(limiter.peek(&1).remaining(), 9_997);
    // A request of cost above 1 takes only from the key's word.
    assert!(!limiter.try_acquire_n(&1, 9_998).unwrap().is_allowed());
    assert!(limiter.try_acquire_n(&1, 9_989).unwrap().is_allowed());
    for _ in 0..9 {
        assert!(limiter.try_acquire(&1).is_allowed(), "from the stripe");
    }
    assert!(!limiter.try_acquire(&1).is_allowed());
    assert_eq!(limiter.available(&1), 0);
}

#[test]
fn a_refund_under_a_stripes_lease_gives_back_nothing_twice() {
    let (limiter, clock) = limiter("1000000/1s");
    assert!(limiter.try_acquire(&1).is_allowed());
    stripe(&limiter, 1);
    let reservation = limiter.reserve_n(&1, 500_000).unwrap();
    assert!(limiter.try_acquire(&1).is_allowed()); // this thread's stripe leases above it
    limiter.cancel(&1, reservation).unwrap();
    clock.advance(Duration::from_micros(10));
    let mut admitted = 0u64;
    while limiter.try_acquire(&1).is_allowed() {
        admitted += 1;
    }
    assert!(
        admitted <= 1_000_000,
        "{admitted} admitted, burst 1,000,000"
    );
    // The refund stops at the run the stripe leased above the reservation: what was never
    // reserved is all still there.
    assert!(admitted >= 499_998, "{admitted}");
}

/// The refund's floor is the end of the latest run a stripe leased, used up or not: a
/// reservation of a slow key cancelled after a request of cost 1 leased one permit above it
/// gets nothing back, where it gets everything back before any lease. Less is admitted than
/// an exact refund would allow, never more.
#[test]
fn a_refund_stops_at_a_used_up_lease_above_it() {
    let (limiter, _clock) = limiter("100/1h");
    assert!(limiter.try_acquire(&1).is_allowed());
    stripe(&limiter, 1);
    let reservation = limiter.reserve_n(&1, 50).unwrap();
    limiter.cancel(&1, reservation).unwrap();
    assert_eq!(
        limiter.available(&1),
        99,
        "no lease above it: all of it back"
    );

    let reservation = limiter.reserve_n(&1, 50).unwrap();
    assert!(limiter.try_acquire(&1).is_allowed()); // a lease of one permit, used up
    limiter.cancel(&1, reservation).unwrap();
    assert_eq!(
        limiter.available(&1),
        48,
        "the used-up lease's end holds the refund"
    );
}

#[test]
fn a_key_judged_quiet_returns_to_one_word() {
    let (limiter, clock) = limiter("1000000/1s");
    assert!(limiter.try_acquire(&1).is_allowed());
    stripe(&limiter, 1);
    // One thread alone takes leases for more than a millisecond.
    for _ in 0..3 {
        clock.advance(Duration::from_micros(600));
        for _ in 0..1000 {
            assert!(limiter.try_acquire(&1).is_allowed());
        }
    }
    assert!(
        !limiter.is_striped(&1),
        "one thread for over a millisecond: quiet"
    );
    clock.advance(Duration::from_secs(2));
    assert_eq!(limiter.available(&1), 1_000_000, "nothing lost");
}

#[test]
fn a_reset_forgets_the_stripes_and_the_key_starts_afresh() {
    let (limiter, _) = limiter("100/1h");
    assert!(limiter.try_acquire(&1).is_allowed());
    stripe(&limiter, 1);
    for _ in 0..10 {
        assert!(limiter.try_acquire(&1).is_allowed());
    }
    assert!(limiter.reset(&1));
    // The key's next state (in the place its old one had, or another) is not striped, and
    // admits its policy's permits, none of the old stripes' runs besides.
    let mut admitted = 0;
    while limiter.try_acquire(&1).is_allowed() {
        admitted += 1;
    }
    assert_eq!(admitted, 100);
    assert!(!limiter.is_striped(&1));
}

#[test]
fn eviction_forgets_the_stripes_of_a_key_at_rest() {
    let (limiter, clock) = limiter("100/1s");
    assert!(limiter.try_acquire(&1).is_allowed());
    stripe(&limiter, 1);
    assert!(limiter.try_acquire(&1).is_allowed());
    clock.advance(Duration::from_secs(1));
    assert_eq!(limiter.evict_idle(), 1);
    for key in 2..50 {
        let _ = limiter.try_acquire(&key);
        assert!(
            !limiter.is_striped(&key),
            "key {key} has no stripes of its own"
        );
    }
}

#[test]
fn a_policy_change_carries_what_the_stripes_held_as_spent() {
    // Leases of 10 permits: the stripe holds runs it has not used when the policy changes.
    let (limiter, _) = limiter("10000/10ms");
    assert!(limiter.try_acquire(&1).is_allowed());
    stripe(&limiter, 1);
    for _ in 0..95 {
        assert!(limiter.try_acquire(&1).is_allowed());
    }
    limiter.set_policy("10000/20ms".parse().unwrap());
    assert_eq!(limiter.generations.linked(), 2, "a new generation");
    let mut admitted = 96;
    while limiter.try_acquire(&1).is_allowed() {
        admitted += 1;
    }
    // What the stripe held unused was handed out by the old state: spent, never twice.
    assert!(admitted <= 10_000, "{admitted}");
    assert!(
        admitted >= 10_000 - 64 * 10,
        "at most a lease per stripe lost: {admitted}"
    );
    assert!(
        !limiter.is_striped(&1),
        "the key's new state starts on one word"
    );
}

/// Threads stripe a key as fast as they can while another resets it over and over: an
/// installation racing the removal of the state it is for never leaves stripes behind (a new
/// state in the same place would decide on them), and the filter marks the striped keys'
/// spots and nothing else.
#[test]
fn resets_racing_striping_leave_no_stripes_behind() {
    for trial in 0..20 {
        let (limiter, _) = limiter("1000/1h");
        let roles = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let l = limiter.clone();
        race(3, move || {
            let resets = roles.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0;
            for _ in 0..2_000 {
                if resets {
                    l.reset(&1);
                } else {
                    let _ = l.try_acquire(&1);
                    try_stripe(&l, 1);
                }
            }
            0
        });
        limiter.reset(&1);
        let (striped, marked) = with_table(&limiter, |keyed, _| keyed.hot.census());
        assert_eq!(
            striped, 0,
            "trial {trial}: stripes left for a removed state"
        );
        assert!(marked, "trial {trial}: the filter marks what is striped");
        let mut admitted = 0;
        while limiter.try_acquire(&1).is_allowed() {
            admitted += 1;
        }
        assert_eq!(admitted, 1000, "trial {trial}");
    }
}

/// The spot of tracked `key`'s state.
fn spot_of(limiter: &Limiter, key: u64) -> usize {
    with_table(limiter, |keyed, guard| {
        keyed
            .table
            .read(&key, guard, |cell| Some(spot(place_of(cell))))
            .expect("tracked")
    })
}

/// `count` tracked keys whose states share one spot.
fn of_one_spot(limiter: &Limiter, count: usize) -> Vec<u64> {
    let mut by_spot: std::collections::HashMap<usize, Vec<u64>> = Default::default();
    for key in 100.. {
        assert!(limiter.try_acquire(&key).is_allowed());
        let keys = by_spot.entry(spot_of(limiter, key)).or_default();
        keys.push(key);
        if keys.len() == count {
            return keys.clone();
        }
    }
    unreachable!("keys run out")
}

/// Counts `losses` compare-and-swaps lost on `key`'s word at `now`.
fn lose(limiter: &Limiter, key: u64, losses: u64, now: u64) {
    with_table(limiter, |keyed, guard| {
        keyed.table.read(&key, guard, |cell| {
            for _ in 0..losses {
                keyed.hot.lost_one(place_of(cell), cell, &keyed.params, now);
            }
            Some(())
        })
    });
}

/// Sixteen compare-and-swaps lost within a tick stripe a key; losses spread over ticks, or
/// lost by other keys of its spot in another tick, do not.
#[test]
fn only_losses_close_together_stripe_a_key() {
    let (limiter, _) = limiter("1000/1h");
    let keys = of_one_spot(&limiter, 2);
    let (a, b) = (keys[0], keys[1]);
    let ms = 1_u64 << super::TICK;
    lose(&limiter, b, LOST_BEFORE_STRIPING - 1, ms);
    lose(&limiter, a, 1, 3 * ms);
    assert!(!limiter.is_striped(&a) && !limiter.is_striped(&b));
    lose(&limiter, a, LOST_BEFORE_STRIPING - 2, 3 * ms);
    assert!(!limiter.is_striped(&a), "fifteen in the tick");
    lose(&limiter, a, 1, 3 * ms);
    assert!(limiter.is_striped(&a), "the sixteenth");
    assert!(!limiter.is_striped(&b));
    // Losses a few microseconds apart, within one tick, count together.
    let tick = 5 * ms;
    lose(&limiter, b, LOST_BEFORE_STRIPING / 2, tick);
    lose(&limiter, b, LOST_BEFORE_STRIPING / 2, tick + 3_000);
    assert!(limiter.is_striped(&b), "sixteen within a tick");
}

/// A key's refunds and give-backs meet on one lock, whichever of them takes it.
#[test]
fn a_place_has_one_lowering_lock() {
    let (limiter, _) = limiter("10/1s");
    assert!(limiter.try_acquire(&1).is_allowed());
    with_table(&limiter, |keyed, guard| {
        keyed.table.read(&1, guard, |cell| {
            let place = place_of(cell);
            assert!(std::ptr::eq(
                keyed.hot.lock_of(place),
                keyed.hot.lock_of(place)
            ));
            Some(())
        })
    })
    .unwrap();
}

/// A key whose spot another striped key marks still counts its own lost compare-and-swaps
/// (on the path that finds it has no stripes) and is striped by them.
#[test]
fn a_key_of_a_striped_keys_spot_is_striped_by_its_own_contention() {
    let (limiter, _) = limiter("1000000000/1h");
    let keys = of_one_spot(&limiter, 2);
    let (a, b) = (keys[0], keys[1]);
    stripe(&limiter, a);
    for round in 0.. {
        let l = limiter.clone();
        race(4, move || {
            for _ in 0..100_000 {
                let _ = l.try_acquire(&b);
            }
            0
        });
        if limiter.is_striped(&b) {
            break;
        }
        assert!(round < 50, "four threads on one key never striped it");
    }
    let (striped, marked) = with_table(&limiter, |keyed, _| keyed.hot.census());
    assert!(striped >= 1 && marked, "{striped} striped");
}

/// A striped key that has taken no lease for a while gives its slot to a key of its spot
/// that needs one (and is unstriped: its requests go to its word); while it is in use, it
/// keeps it and the newcomer stays on its word.
#[test]
fn an_idle_striped_key_gives_its_slot_to_a_contended_one() {
    let (limiter, clock) = limiter("1000/1s");
    let keys = of_one_spot(&limiter, PROBES + 1);
    for &key in &keys[..PROBES] {
        stripe(&limiter, key);
    }
    let newcomer = keys[PROBES];
    assert!(try_stripe(&limiter, newcomer));
    assert!(
        !limiter.is_striped(&newcomer),
        "the window is full of keys in use"
    );
    clock.advance(Duration::from_nanos(IDLE_SPAN + 1));
    // Three of the four take leases again: the idle one gives way.
    for &key in &keys[1..PROBES] {
        assert!(limiter.try_acquire(&key).is_allowed());
    }
    stripe(&limiter, newcomer);
    assert!(!limiter.is_striped(&keys[0]), "the idle key was unstriped");
    assert!(keys[1..PROBES].iter().all(|key| limiter.is_striped(key)));
    let (striped, marked) = with_table(&limiter, |keyed, _| keyed.hot.census());
    assert_eq!((striped, marked), (PROBES, true));
    // The unstriped key decides on its word, exactly: idle for longer than its first permit
    // took to come back, it has its 1,000, and not one more from its retired stripes.
    let mut admitted = 0;
    while limiter.try_acquire(&keys[0]).is_allowed() {
        admitted += 1;
    }
    assert_eq!(admitted, 1_000);
}

/// Places spread over the spots: 64 keys take many of them, so one striped key's bit sends
/// few others to the side table.
#[test]
fn places_spread_over_the_spots() {
    let (limiter, _) = limiter("10/1s");
    let spots: std::collections::HashSet<usize> = (0..64)
        .map(|key| {
            assert!(limiter.try_acquire(&key).is_allowed());
            spot_of(&limiter, key)
        })
        .collect();
    assert!(spots.len() >= 24, "{} spots for 64 keys", spots.len());
}

/// A striped key keeps its slot while it has taken a lease within the idle span, even when
/// the window is full and another key of its spot is contended.
#[test]
fn a_striped_key_in_use_keeps_its_slot() {
    let (limiter, clock) = limiter("1000/1s");
    let keys = of_one_spot(&limiter, PROBES + 1);
    for &key in &keys[..PROBES] {
        stripe(&limiter, key);
    }
    // Two milliseconds: idle for a while, not for the idle span.
    clock.advance(Duration::from_millis(2));
    let newcomer = keys[PROBES];
    assert!(try_stripe(&limiter, newcomer));
    assert!(!limiter.is_striped(&newcomer));
    // Idle for exactly the idle span: not longer than it, still in use.
    clock.set(Duration::from_nanos(IDLE_SPAN));
    assert!(try_stripe(&limiter, newcomer));
    assert!(!limiter.is_striped(&newcomer));
    assert!(keys[..PROBES].iter().all(|key| limiter.is_striped(key)));
}

/// Striping a key twice keeps one set of stripes in one slot.
#[test]
fn a_key_is_striped_once() {
    let (limiter, _) = limiter("10/1s");
    assert!(limiter.try_acquire(&1).is_allowed());
    stripe(&limiter, 1);
    stripe(&limiter, 1);
    let (striped, marked) = with_table(&limiter, |keyed, _| keyed.hot.census());
    assert_eq!((striped, marked), (1, true));
}

#[test]
fn a_cost_of_one_asked_as_a_cost_takes_the_stripes_permits_too() {
    // An interval of 1 us: a lease takes ten permits.
    let (limiter, _) = limiter("1000/1ms");
    assert!(limiter.try_acquire(&1).is_allowed());
    stripe(&limiter, 1);
    // A lease into this thread's home stripe: the central word lends it several permits.
    assert!(limiter.try_acquire(&1).is_allowed());
    let mut admitted = 2;
    while limiter
        .try_acquire_n(&1, 1)
        .expect("a cost of 1")
        .is_allowed()
    {
        admitted += 1;
    }
    assert_eq!(admitted, 1000, "every permit, the stripe's included");
    assert!(limiter.is_striped(&1), "a frozen clock never goes quiet");
}
