//! Bounded memory for the login guard and the concurrency limiter: a million distinct
//! client-chosen keys through a guard capped at 10,000 keep the heap within a few hundred
//! bytes per place, and the keys tracked before the flood keep their exact state throughout.
//!
//! One test per guard.

use std::collections::VecDeque;
use std::time::Duration;

use tollgate::concurrency::ConcurrencyLimiter;
use tollgate::login::{LoginDecision, LoginGuard};
use tollgate::FakeClock;

use crate::{Keys, ALLOC};

const CAP: usize = 10_000;
const FLOOD: u64 = 1_000_000;

fn ip_of(n: u64) -> String {
    format!(
        "{}.{}.{}.{}",
        n >> 24 & 255,
        n >> 16 & 255,
        n >> 8 & 255,
        n & 255
    )
}

#[test]
fn a_million_accounts_and_addresses_through_a_capped_login_guard() {
    let _serial = crate::one_at_a_time();
    let clock = FakeClock::new();
    let guard = LoginGuard::with_clock(clock.clone()).max_keys(CAP);
    // Before the flood: the victim's account has 3 failures from one address, and the
    // owner of another account logged in from a device.
    for _ in 0..3 {
        let _ = guard.record_failure("victim", "192.0.2.1");
    }
    guard.record_success("owner", "device-0wn3r");
    let victim = LoginDecision::Allowed {
        account_left: 2,
        ip_left: 17,
    };
    let owner = LoginDecision::Allowed {
        account_left: 5,
        ip_left: 5,
    };
    assert_eq!(guard.check("victim", "192.0.2.1"), victim);

    let before = ALLOC.live();
    ALLOC.reset_peak();
    let mut keys = Keys(0x9E37_79B9_7F4A_7C15);
    // 1,000,000 attempts, 0.5 ms apart (500 s, inside the 15-minute windows, so nothing
    // the flood records comes to rest): a failure for a new account from a new address,
    // and every tenth a success for yet another (account, device), which makes it known.
    for i in 0..FLOOD {
        clock.advance(Duration::from_micros(500));
        let n = keys.next().unwrap();
        let account = format!("user{n:x}");
        if i % 10 == 0 {
            guard.record_success(&account, &format!("device{n:x}"));
        } else {
            let _ = guard.record_failure(&account, &ip_of(n));
        }
        if i % 1_000 == 0 {
            assert_eq!(guard.check("victim", "192.0.2.1"), victim, "at {i}");
            assert_eq!(guard.check("owner", "device-0wn3r"), owner, "at {i}");
        }
    }
    let peak = ALLOC.peak().saturating_sub(before);
    // Four maps (account logs, address logs, strike records, known clients) of CAP places.
    let per_place = peak / (4 * CAP);
    println!("peak {peak} B above the start, {per_place} B per place");
    assert!(
        per_place <= 400,
        "{peak} B at the peak: {per_place} B per place"
    );
    // The flood's untracked accounts shared one exhausted budget: refused, not let through.
    assert!(!guard.check("someone-new", "198.51.100.1").is_allowed());
    assert_eq!(guard.check("victim", "192.0.2.1"), victim);
    assert_eq!(guard.check("owner", "device-0wn3r"), owner);
}

#[test]
fn a_million_keys_through_a_capped_concurrency_limiter() {
    let _serial = crate::one_at_a_time();
    let limiter: ConcurrencyLimiter<u64> = ConcurrencyLimiter::new(3).max_keys(CAP);
    let tracked = u64::MAX;
    let held = (limiter.try_acquire(&tracked), limiter.try_acquire(&tracked));
    assert!(held.0.is_ok() && held.1.is_ok());

    let before = ALLOC.live();
    ALLOC.reset_peak();
    let mut keys = Keys(0x2545_F491_4F6C_DD1D);
    // Each request holds its permit while the next 15,000 requests arrive: more work in
    // flight than the cap, so the limiter is full most of the time and new keys overflow,
    // while finished keys come to rest and are swept to make room.
    let mut in_flight = VecDeque::new();
    let (mut overflowed, mut refused) = (0u64, 0u64);
    for i in 0..FLOOD {
        while in_flight
            .front()
            .is_some_and(|&(start, _)| start + 15_000 <= i)
        {
            in_flight.pop_front();
        }
        match limiter.try_acquire(&keys.next().unwrap()) {
            Ok(permit) => {
                overflowed += u64::from(permit.is_overflow());
                in_flight.push_back((i, permit));
            }
            Err(full) => {
                assert!(full.is_overflow(), "a new key refused on its own gauge");
                refused += 1;
            }
        }
        if i % 1_000 == 0 {
            assert!(limiter.len() <= CAP, "{} keys at {i}", limiter.len());
            assert_eq!(limiter.in_flight(&tracked), 2, "at {i}");
        }
    }
    let peak = ALLOC.peak().saturating_sub(before);
    // The map's places, plus the permits this test itself holds (at most 15,000 of 24
    // bytes in its queue).
    let per_place = peak.saturating_sub(15_000 * 24) / CAP;
    println!("peak {peak} B above the start, {per_place} B per place; {overflowed} overflowed, {refused} refused");
    assert!(
        per_place <= 300,
        "{peak} B at the peak: {per_place} B per place"
    );
    assert!(overflowed > 0 && refused > 0, "the cap was never reached");
    // The tracked key kept its exact count: one place left, then refused.
    let third = limiter.try_acquire(&tracked).expect("the third place");
    assert!(!third.is_overflow());
    assert!(limiter.try_acquire(&tracked).is_err());
}
