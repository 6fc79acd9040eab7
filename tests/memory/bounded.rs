//! Bounded memory and automatic eviction: a limiter fed endless new keys stays within its
//! `max_keys`, its allocated memory stays bounded, overflowing keys share one budget, and
//! idle keys vanish without anyone calling `evict_idle`.

use std::time::Duration;

use tollgate::{FakeClock, Policy, RateLimiter};

use crate::{Keys, ALLOC};

#[test]
fn a_million_random_keys_never_exceed_the_cap_or_grow_memory() {
    let _serial = crate::one_at_a_time();
    const CAP: usize = 10_000;
    let clock = FakeClock::new();
    let policy: Policy = "5/1s".parse().unwrap();
    let limiter: RateLimiter<u64, FakeClock> = RateLimiter::with_clock(policy, clock.clone())
        .max_keys(CAP)
        .with_stats();
    let mut keys = Keys(0x9E37_79B9_7F4A_7C15);
    let before = ALLOC.live();
    ALLOC.reset_peak();
    // Each key's state is at rest 200 ms after its one request. Phase 1: 10,000 new keys
    // per second, so about 2,000 states are live at once and sweeping frees places as fast
    // as the flood needs them. Phase 2: 100,000 per second, so every tracked state is still
    // live when the cap is reached: a new key gets a place only as one comes to rest, one
    // every 20 microseconds (CAP / 200 ms), that is every other request; the rest overflow.
    // The flood spends the shared overflow state, and a key that then gets a place starts
    // with what the shared state counts (what it may have spent there itself), so in phase 2
    // new keys are refused too: by the shared state, taking no place.
    let mut overflowed = [0u64; 2];
    let mut refused_with_a_place = [0u64; 2];
    for (phase, step) in [Duration::from_micros(100), Duration::from_micros(10)]
        .into_iter()
        .enumerate()
    {
        for i in 0..500_000u64 {
            clock.advance(step);
            let d = limiter.try_acquire(&keys.next().unwrap());
            overflowed[phase] += u64::from(d.is_overflow());
            refused_with_a_place[phase] += u64::from(!d.is_allowed() && !d.is_overflow());
            if i % 1_000 == 0 {
                assert!(limiter.len() <= CAP, "{} keys tracked", limiter.len());
            }
        }
    }
    assert!(limiter.len() <= CAP);
    assert_eq!(overflowed[0], 0, "sweeping kept up in phase 1");
    assert_eq!(
        refused_with_a_place[0], 0,
        "with the shared state at rest, every new key starts fresh"
    );
    // A key that gets a place while the flood keeps the shared state spent starts with its
    // permits spent, so its state stays live for the whole window (1 s, not 200 ms), places
    // free up five times slower, and most of phase 2 overflows (about 456,000 of 500,000).
    // Every request is one of the three outcomes, and the phase overflows far more than
    // phase 1 (none).
    assert!(
        (200_000..=490_000).contains(&overflowed[1]),
        "phase 2: most of 500,000 overflow, some get a place, got {}",
        overflowed[1]
    );
    // A key that would get a place while the flood keeps the shared state spent starts
    // with those permits spent: refused, and by the shared state, so it takes no place.
    assert_eq!(
        refused_with_a_place[1], 0,
        "phase 2: a refusal of a key starting spent is the shared state's"
    );
    assert!(
        limiter.stats().refused > 0,
        "phase 2: keys starting spent are refused"
    );
    assert_eq!(limiter.stats().overflowed, overflowed[0] + overflowed[1]);
    // A million keys tracked without a cap would take tens of megabytes; with it, the peak
    // stays within a small multiple of the cap (the map's tables double, so allow 100 bytes
    // per place for a state of 16).
    let peak = ALLOC.peak() - before;
    assert!(
        peak <= 100 * CAP,
        "peak memory {peak} bytes for {CAP} places over a million keys"
    );
}

#[test]
fn overflowing_keys_share_one_budget_and_tracked_keys_stay_exact() {
    let _serial = crate::one_at_a_time();
    let clock = FakeClock::new();
    let limiter: RateLimiter<String, FakeClock> =
        RateLimiter::with_clock("5/1h".parse().unwrap(), clock.clone()).max_keys(3);
    for user in ["ann", "bob", "cat"] {
        assert!(limiter.try_acquire(user).is_allowed());
    }
    // Full, and nothing is at rest (the clock is frozen): new keys share one state.
    let mut shared_allowed = 0;
    for i in 0..20 {
        let d = limiter.try_acquire(format!("mallory-{i}").as_str());
        assert!(d.is_overflow(), "{d:?}");
        shared_allowed += u64::from(d.is_allowed());
    }
    assert_eq!(
        shared_allowed, 5,
        "the overflowing keys together get one key's budget"
    );
    assert_eq!(limiter.len(), 3);
    assert!(limiter.peek("mallory-99").is_overflow());
    // Tracked keys are untouched: each still has exactly 4 left.
    for user in ["ann", "bob", "cat"] {
        let d = limiter.try_acquire(user);
        assert!(!d.is_overflow());
        assert_eq!(d.remaining(), 3, "{user}");
    }
    // Once tracked keys come to rest, a new key takes a freed place.
    clock.advance(Duration::from_secs(3600));
    let d = limiter.try_acquire("dan");
    assert!(!d.is_overflow() && d.is_allowed(), "{d:?}");
    assert!(limiter.len() <= 3);
}

#[test]
fn per_key_policies_overflow_into_one_state_per_policy() {
    let _serial = crate::one_at_a_time();
    let (free, paid): (Policy, Policy) = ("1/1h".parse().unwrap(), "3/1h".parse().unwrap());
    let limiter: RateLimiter<String, FakeClock> = RateLimiter::with_resolver(
        move |k: &String| if k.starts_with("paid") { paid } else { free },
        FakeClock::new(),
    )
    .max_keys(1);
    assert!(limiter.try_acquire("seed").is_allowed());
    let free_ok = (0..5)
        .filter(|i| {
            limiter
                .try_acquire(format!("free{i}").as_str())
                .is_allowed()
        })
        .count();
    let paid_ok = (0..5)
        .filter(|i| {
            limiter
                .try_acquire(format!("paid{i}").as_str())
                .is_allowed()
        })
        .count();
    assert_eq!((free_ok, paid_ok), (1, 3));
}

#[test]
fn idle_keys_vanish_without_explicit_calls() {
    let _serial = crate::one_at_a_time();
    let clock = FakeClock::new();
    let limiter: RateLimiter<u64, FakeClock> =
        RateLimiter::with_clock("2/1s".parse().unwrap(), clock.clone());
    for key in 0..1_000 {
        let _ = limiter.try_acquire(&key);
    }
    assert_eq!(limiter.len(), 1_000);
    // Every state is at rest after 500 ms; routine sweeping waits a further window (1 s).
    clock.advance(Duration::from_millis(1400));
    for key in 1_000..1_010 {
        let _ = limiter.try_acquire(&key);
    }
    assert_eq!(
        limiter.len(),
        1_010,
        "at rest, but not yet for a whole window: kept"
    );
    clock.advance(Duration::from_millis(100));
    for key in 1_010..2_000 {
        let _ = limiter.try_acquire(&key);
    }
    // 1,000 insertions sweeping 8 entries each walked the whole map several times over.
    assert_eq!(limiter.len(), 1_000, "only the new keys are left");
    // Sweeping removed only states at rest: the new keys kept their spent permits.
    assert_eq!(limiter.try_acquire(&1_500).remaining(), 0);
    assert_eq!(limiter.try_acquire(&1_005).remaining(), 0);
}

#[test]
fn sweeping_can_be_turned_off() {
    let _serial = crate::one_at_a_time();
    let clock = FakeClock::new();
    let limiter: RateLimiter<u64, FakeClock> =
        RateLimiter::with_clock("2/1s".parse().unwrap(), clock.clone()).sweep_per_insert(0);
    for key in 0..100 {
        let _ = limiter.try_acquire(&key);
    }
    clock.advance(Duration::from_secs(1));
    for key in 100..200 {
        let _ = limiter.try_acquire(&key);
    }
    assert_eq!(limiter.len(), 200);
    assert_eq!(limiter.evict_idle(), 100);
}
