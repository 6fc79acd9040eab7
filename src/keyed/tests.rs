//! Tests of what `RateLimiter` does across its paths: stats and shadow mode on every cost and
//! reservation, a full table's overflow, `len` and `Debug`, moving every key.

use std::time::Duration;

use scc::Guard;

use super::key_state::AnyKeys;
use super::RateLimiter;
use crate::clock::FakeClock;
use crate::engine::dispatch::PerAlgorithm;

/// Requests of any cost and reservations go through the stats and shadow mode, as requests
/// of cost 1 do.
#[test]
fn costs_and_reservations_are_counted_and_shadowed() {
    let limiter: RateLimiter<u64, FakeClock> =
        RateLimiter::with_clock("3/1h".parse().unwrap(), FakeClock::new())
            .with_stats()
            .shadow();
    let first = limiter.try_acquire_n(&1, 2).unwrap();
    assert!(first.is_allowed() && !first.would_refuse());
    // One permit left: the policy refuses a cost of 2, shadow mode lets it through.
    let second = limiter.try_acquire_n(&1, 2).unwrap();
    assert!(second.is_allowed() && second.would_refuse());
    let reservation = limiter.reserve_n(&1, 2).unwrap();
    assert!(reservation.decision().is_allowed() && reservation.decision().would_refuse());
    let stats = limiter.stats();
    assert_eq!((stats.allowed, stats.refused), (1, 2));
}

/// Every algorithm's cost-1 request is counted once, with the policy's answer, and shadow
/// mode lets its refusals through: the token bucket's on its inline hit, the others on
/// the out-of-line path, and every first request on the miss.
#[test]
fn each_algorithms_cost_one_decisions_are_counted_once_and_shadowed() {
    for policy in [
        "5/1h",
        "sliding-counter 5/1h",
        "sliding-log 5/1h",
        "5/1h & 10/1d",
    ] {
        let limiter: RateLimiter<u64, FakeClock> =
            RateLimiter::with_clock(policy.parse().unwrap(), FakeClock::new())
                .with_stats()
                .shadow();
        let decisions: Vec<_> = (0..8).map(|_| limiter.try_acquire(&1)).collect();
        assert!(decisions.iter().all(|d| d.is_allowed()), "{policy}");
        let refused = decisions.iter().filter(|d| d.would_refuse()).count();
        assert_eq!(refused, 3, "{policy}: the policy admits 5 of 8");
        let stats = limiter.stats();
        assert_eq!((stats.allowed, stats.refused), (5, 3), "{policy}");
    }
}

/// A limiter with no cap whose table runs out of places sends new keys to the shared
/// overflow state, and a key that spent there starts with that spent once it gets a
/// place: never twice its policy.
#[test]
fn an_uncapped_limiter_whose_table_is_full_carries_the_overflow_as_a_capped_one() {
    let limiter: RateLimiter<u64, FakeClock> =
        RateLimiter::with_clock("3/1h".parse().unwrap(), FakeClock::new()).sweep_per_insert(0);
    let _ = limiter.try_acquire(&1);
    {
        let guard = Guard::new();
        match &limiter.generations.generation(&guard).keys {
            AnyKeys::Uniform(PerAlgorithm::TokenBucket(keys)) => keys.table.cells().exhaust(),
            _ => unreachable!("a token bucket policy"),
        }
    }
    // No place left: key 2 is decided by the shared state, and a peek says so.
    assert!(limiter.peek(&2).is_overflow());
    let first = limiter.try_acquire(&2);
    assert!(first.is_overflow() && first.is_allowed());
    assert!(limiter.try_acquire(&2).is_overflow());
    // Key 1's place comes back once no reader can hold it; key 2 then gets it, starting
    // with the two permits it spent on the shared state: one more, then refused.
    assert!(limiter.reset(&1));
    let freed = (0..100_000).any(|_| {
        drop(Guard::new());
        !limiter.peek(&2).is_overflow()
    });
    assert!(freed, "the freed place is handed out again");
    let own = limiter.try_acquire(&2);
    assert!(
        own.is_allowed() && !own.is_overflow() && own.remaining() == 0,
        "{own:?}"
    );
    assert_eq!(limiter.len(), 1);
    assert!(!limiter.try_acquire(&2).is_allowed(), "key 2 spent its 3");
}

#[test]
fn len_is_empty_and_debug_count_the_keys_tracked() {
    let limiter: RateLimiter<u64, FakeClock> =
        RateLimiter::with_clock("1/1h".parse().unwrap(), FakeClock::new());
    assert!(limiter.is_empty());
    assert_eq!(format!("{limiter:?}"), "RateLimiter { keys: 0, .. }");
    let _ = limiter.try_acquire(&1);
    let _ = limiter.try_acquire(&2);
    assert!(!limiter.is_empty());
    assert_eq!(limiter.len(), 2);
    assert_eq!(format!("{limiter:?}"), "RateLimiter { keys: 2, .. }");
}

#[test]
fn moving_every_key_now_counts_what_each_has_in_use_at_once() {
    let clock = FakeClock::new();
    let limiter: RateLimiter<u64, FakeClock> =
        RateLimiter::with_clock("sliding-log 2/1020ms".parse().unwrap(), clock.clone());
    assert!(limiter.try_acquire(&1).is_allowed());
    assert!(limiter.try_acquire(&1).is_allowed());
    assert!(limiter.try_acquire(&2).is_allowed());
    clock.set(Duration::from_millis(110));
    limiter.set_policy("sliding-log 2/1170ms".parse().unwrap());
    limiter.move_every_key_now();
    assert_eq!(limiter.len(), 2, "moved, not copied");
    // At 1,020 ms the narrower log no longer counts the calls made at 0: moved on its
    // next request, key 1 would have carried nothing. Moved at 110 ms, it carried both,
    // counted until 110 + 1,170 ms.
    clock.set(Duration::from_millis(1_020));
    assert!(!limiter.try_acquire(&1).is_allowed());
    assert_eq!(
        limiter.try_acquire(&2).remaining(),
        0,
        "one carried, one now"
    );
    clock.set(Duration::from_millis(1_281));
    assert!(limiter.try_acquire(&1).is_allowed());
    assert_eq!(limiter.len(), 2);
}
