//! Policy reloads cost no memory over time: a limiter whose policy is re-applied over and
//! over keeps the heap of a fresh limiter tracking the same keys.

use tollgate::{FakeClock, Policy, RateLimiter};

use crate::{collect_retired, ALLOC};

const KEYS: u64 = 1_000;

/// A limiter on `policy` with `KEYS` keys tracked.
fn tracking(policy: Policy) -> RateLimiter<u64, FakeClock> {
    let limiter = RateLimiter::with_clock(policy, FakeClock::new());
    for key in 0..KEYS {
        assert!(limiter.try_acquire(&key).is_allowed());
    }
    limiter
}

#[test]
fn alternating_reloads_keep_the_heap_of_a_fresh_limiter() {
    let _serial = crate::one_at_a_time();
    let (a, b): (Policy, Policy) = (
        "token-bucket 5/1h".parse().unwrap(),
        "sliding-log 5/1h".parse().unwrap(),
    );
    // Nothing is dropped between the measurements: the map frees through an epoch collector,
    // so a drop's bytes would come back at an unknown later point.
    collect_retired();
    let before = ALLOC.live();
    let fresh = tracking(a);
    collect_retired();
    let fresh_bytes = ALLOC.live().saturating_sub(before);

    let before = ALLOC.live();
    let reloaded = tracking(a);
    for i in 0..100_000 {
        reloaded.set_policy(if i % 2 == 0 { b } else { a });
    }
    assert_eq!(reloaded.len(), KEYS as usize);
    collect_retired();
    let reloaded_bytes = ALLOC.live().saturating_sub(before);
    // The same keys, in the map they were created in, the current generation's empty map,
    // and what the epoch collector has not freed yet (a few generations' worth, depending on
    // when each thread last passed an epoch): within twice a fresh limiter's heap, where an
    // unbounded chain would hold tens of megabytes.
    assert!(
        reloaded_bytes <= 2 * fresh_bytes,
        "{reloaded_bytes} bytes live after 100,000 reloads; a fresh limiter: {fresh_bytes}"
    );
    assert_eq!(
        reloaded.try_acquire(&0).remaining(),
        3,
        "spent permits kept"
    );
    assert_eq!(fresh.try_acquire(&0).remaining(), 3);
}
