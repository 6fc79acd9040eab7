//! What a thread's last hit keeps and allocates.

use tollgate::{FakeClock, Policy, RateLimiter};

use crate::{collect_retired, ALLOC};

/// Requests on existing keys allocate nothing, runs of two requests per key included: a thread
/// whose pins go to waste stops pinning (a pin copies the key).
#[test]
fn requests_on_existing_keys_allocate_nothing() {
    let _serial = crate::one_at_a_time();
    let limiter: RateLimiter<String, FakeClock> =
        RateLimiter::with_clock("1000000/1s".parse().unwrap(), FakeClock::new());
    let a = "a".repeat(4096);
    let b = "b".repeat(4096);
    // Both keys exist (the first round), and this thread has pinned each once (the second),
    // the second time in place of a pin that decided nothing.
    for _ in 0..2 {
        for key in [&a, &a, &b, &b] {
            assert!(limiter.try_acquire(key.as_str()).is_allowed());
        }
    }
    ALLOC.reset_peak();
    let before = ALLOC.live();
    for key in [&a, &a, &b, &b] {
        assert!(limiter.try_acquire(key.as_str()).is_allowed());
    }
    let peak = ALLOC.peak() - before;
    assert!(
        peak < 4096,
        "{peak} bytes allocated by requests on existing keys"
    );
}

const KEYS: u64 = 1 << 20;

/// Live bytes a limiter of `KEYS` keys holds once its policy changed and every key moved,
/// this thread having pinned its last key before (`pin`) or not, and decided on another key
/// after that when `other_key_after` (so that its streak on the pinned key has ended at the
/// change).
fn after_a_policy_change_ending(
    pin: bool,
    other_key_after: bool,
) -> (usize, RateLimiter<u64, FakeClock>) {
    let (a, b): (Policy, Policy) = ("5/1h".parse().unwrap(), "6/1h".parse().unwrap());
    collect_retired();
    let before = ALLOC.live();
    let limiter = RateLimiter::with_clock(a, FakeClock::new());
    for key in 0..KEYS {
        assert!(limiter.try_acquire(&key).is_allowed());
    }
    if pin {
        assert!(limiter.try_acquire(&(KEYS - 1)).is_allowed());
        assert!(limiter.try_acquire(&(KEYS - 1)).is_allowed());
    }
    if other_key_after {
        assert!(limiter.try_acquire(&0).is_allowed());
    }
    limiter.set_policy(b);
    // Every key moved to the new policy (each once: nothing is pinned there).
    for key in 0..KEYS {
        assert!(limiter.try_acquire(&key).is_allowed());
    }
    limiter.set_policy(a);
    for key in 0..KEYS {
        assert!(limiter.try_acquire(&key).is_allowed());
    }
    collect_retired();
    (ALLOC.live().saturating_sub(before), limiter)
}

/// A pin of a key of a replaced policy is let go of at the thread's next request in the
/// limiter, and keeps none of the old table's books meanwhile.
#[test]
fn a_pin_keeps_no_memory_of_a_replaced_policy() {
    let _serial = crate::one_at_a_time();
    compare_after_a_policy_change(false);
}

/// As [`a_pin_keeps_no_memory_of_a_replaced_policy`], the thread's streak on its pinned key
/// ended before the change: the pin is let go of all the same.
#[test]
fn a_pin_whose_streak_ended_keeps_no_memory_of_a_replaced_policy() {
    let _serial = crate::one_at_a_time();
    compare_after_a_policy_change(true);
}

/// Live bytes after a policy change with a pin and without, each measured twice: memory of
/// an earlier limiter freed while a measurement runs makes it read low, never high, so the
/// baseline is the larger of its two and the pinned figure the smaller of its two.
fn compare_after_a_policy_change(other_key_after: bool) {
    let measure = |pin: bool| {
        let (bytes, limiter) = after_a_policy_change_ending(pin, pin && other_key_after);
        drop(limiter);
        bytes
    };
    let unpinned = measure(false).max(measure(false));
    let pinned = measure(true).min(measure(true));
    assert!(
        pinned <= unpinned + (1 << 20),
        "with a pin: {pinned} bytes; without: {unpinned}"
    );
}
