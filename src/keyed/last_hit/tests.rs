//! Each thread's last hit: pinning, the runs and their backoff, and every change that must
//! reach a pinned key (a policy change, a reset, an eviction, striping).

use std::time::Duration;

use scc::Guard;

use super::{has_slot, holds_pin, holds_stripes, run_needed, streaking, FIRST_RUN, LONGEST_RUN};
use crate::clock::{Clock, FakeClock};
use crate::engine::dispatch::PerAlgorithm;
use crate::engine::token_bucket::GcraCell;
use crate::keyed::key_state::AnyKeys;
use crate::keyed::RateLimiter;
use crate::race::race;

type Limiter = RateLimiter<u64, FakeClock>;

fn limiter(policy: &str) -> Limiter {
    RateLimiter::with_clock(policy.parse().unwrap(), FakeClock::new())
}

/// Decides `key` until it is pinned for this thread: a first decision that creates the key
/// (or moves it to a new generation), then two in a row through the table. Three permits.
fn pin(limiter: &Limiter, key: u64) {
    for _ in 0..3 {
        assert!(!streaking(limiter.generations.id), "key {key} pinned early");
        let _ = limiter.try_acquire(&key);
    }
    assert!(streaking(limiter.generations.id), "key {key} pinned");
}

#[test]
fn a_pinned_key_decides_exactly_as_the_table() {
    let limiter = limiter("6/1h");
    pin(&limiter, 1);
    let remaining: Vec<u64> = (0..3)
        .map(|_| limiter.try_acquire(&1).remaining())
        .collect();
    assert_eq!(remaining, [2, 1, 0]);
    let refused = limiter.try_acquire(&1);
    assert!(!refused.is_allowed());
    assert_eq!(refused.retry_after(), Duration::from_secs(600));
    assert!(
        streaking(limiter.generations.id),
        "a refusal keeps the streak"
    );
    limiter.clock().advance(Duration::from_secs(600));
    assert_eq!(limiter.try_acquire(&1).remaining(), 0);
    assert_eq!(limiter.peek(&1).remaining(), 0);
}

#[test]
fn another_key_ends_the_streak_and_the_pinned_key_takes_it_up_again() {
    let limiter = limiter("6/1h");
    pin(&limiter, 1);
    assert_eq!(limiter.try_acquire(&2).remaining(), 5);
    assert!(!streaking(limiter.generations.id));
    // Through the table once, then from its slot again.
    assert_eq!(limiter.try_acquire(&1).remaining(), 2);
    assert!(streaking(limiter.generations.id));
    assert_eq!(limiter.try_acquire(&1).remaining(), 1);
    assert_eq!(limiter.try_acquire(&2).remaining(), 4);
}

#[test]
fn a_policy_change_reaches_a_pinned_key() {
    let limiter = limiter("6/1h");
    pin(&limiter, 1);
    assert_eq!(limiter.try_acquire(&1).remaining(), 2);
    limiter.set_policy("20/1h".parse().unwrap());
    // Moved to the new generation with its 4 permits in use.
    let decision = limiter.try_acquire(&1);
    assert_eq!((decision.limit(), decision.remaining()), (20, 15));
    assert!(!streaking(limiter.generations.id));
    // Pinned again in the new generation, under the new policy.
    for remaining in [14, 13] {
        assert_eq!(limiter.try_acquire(&1).remaining(), remaining);
    }
    assert!(streaking(limiter.generations.id));
    assert_eq!(limiter.try_acquire(&1).remaining(), 12);
}

#[test]
fn a_stale_pin_is_let_go_of_though_the_thread_went_on_to_other_keys() {
    let limiter = limiter("100/1h");
    pin(&limiter, 1);
    // Another key ends the streak; then the policy changes.
    let _ = limiter.try_acquire(&2);
    limiter.set_policy("200/1h".parse().unwrap());
    assert!(holds_pin(&limiter.generations.last_hits));
    for key in 3..6 {
        let _ = limiter.try_acquire(&key);
    }
    assert!(
        !holds_pin(&limiter.generations.last_hits),
        "the pin of a replaced generation is still held"
    );
}

/// A thread whose notes for the limiter were taken by four others, after a change to rules
/// that never pin (a sliding log): its requests never come back through a token bucket's
/// table to take a way again, and still let go of the stale pin, with its slab segment.
#[test]
fn a_stale_pin_is_let_go_of_by_a_thread_with_no_notes_for_the_limiter() {
    let limiter = limiter("100/1h");
    pin(&limiter, 1);
    let others: Vec<Limiter> = (0..4).map(|_| self::limiter("100/1h")).collect();
    for other in &others {
        for _ in 0..2 {
            let _ = other.try_acquire(&1);
        }
    }
    limiter.set_policy("sliding-log 100/1h".parse().unwrap());
    assert!(holds_pin(&limiter.generations.last_hits));
    let _ = limiter.try_acquire(&1);
    assert!(
        !holds_pin(&limiter.generations.last_hits),
        "the pin of a replaced generation is still held"
    );
}

/// A thread that never decides on one key twice in a row has no slot made for it, though
/// its decisions through the table take its notes' way (which looks for a slot to restore).
#[test]
fn a_thread_that_never_pins_has_no_slot() {
    let limiter = limiter("100/1h");
    for key in 0..100 {
        let _ = limiter.try_acquire(&key); // creates the key
    }
    for key in 0..100 {
        let _ = limiter.try_acquire(&key); // through the table, a run of one
    }
    assert!(!has_slot(&limiter.generations.last_hits));
    pin(&limiter, 1_000);
    assert!(has_slot(&limiter.generations.last_hits));
}

#[test]
fn a_reset_reaches_a_pinned_key_and_lets_go_of_its_pin() {
    let limiter = limiter("5/1h");
    pin(&limiter, 1);
    assert!(limiter.reset(&1));
    assert!(holds_pin(&limiter.generations.last_hits));
    // The pinned state is retired: the request goes through the table and the pin goes.
    assert_eq!(limiter.try_acquire(&1).remaining(), 4);
    assert!(!holds_pin(&limiter.generations.last_hits));
}

#[test]
fn a_reset_reaches_a_pinned_key() {
    let limiter = limiter("3/1h");
    pin(&limiter, 1);
    assert!(!limiter.try_acquire(&1).is_allowed());
    assert!(limiter.reset(&1));
    assert_eq!(limiter.try_acquire(&1).remaining(), 2);
}

/// Runs `on` on `key`'s cell in `limiter`'s token bucket table, with the table's parts.
fn on_cell(
    limiter: &Limiter,
    key: u64,
    on: impl FnOnce(&crate::keyed::striped::Hot, &GcraCell, &crate::engine::token_bucket::Gcra),
) {
    let guard = Guard::new();
    let generation = limiter.generations.generation(&guard);
    let AnyKeys::Uniform(PerAlgorithm::TokenBucket(keyed)) = &generation.keys else {
        panic!("a token bucket's table");
    };
    keyed.table.read(&key, &guard, |cell| {
        on(&keyed.hot, cell, &keyed.params);
        Some(())
    });
}

/// Stripes `key`, tracked in `limiter`, by hand.
fn stripe(limiter: &Limiter, key: u64) {
    on_cell(limiter, key, |hot, cell, gcra| {
        hot.stripe(cell, gcra, limiter.generations.clock.now());
    });
    assert!(limiter.is_striped(&key));
}

#[test]
fn striping_a_pinned_key_sends_its_requests_through_the_table() {
    let limiter = limiter("100/1h");
    pin(&limiter, 1);
    stripe(&limiter, 1);
    // The count of changes moved: the slot's hit is not used, and the key's requests
    // take the stripes' way, all 100 permits exactly.
    let admitted = (0..150)
        .filter(|_| limiter.try_acquire(&1).is_allowed())
        .count();
    assert_eq!(admitted, 97);
    assert!(!streaking(limiter.generations.id));
}

/// A policy whose stripes lease 10 permits at a time (a lease covers 10 µs of its timeline),
/// 1,000 at once.
const STRIPED: &str = "1000/1ms";

/// Stripes `key` in `limiter` by hand, and pins it for this thread with its stripes: a
/// decision that leases the home stripe its first run, then two in a row from that run
/// through the table. Three permits.
fn pin_striped(limiter: &Limiter, key: u64) {
    stripe(limiter, key);
    for _ in 0..3 {
        assert!(!streaking(limiter.generations.id), "key {key} pinned early");
        assert!(limiter.try_acquire(&key).is_allowed());
    }
    assert!(streaking(limiter.generations.id), "key {key} pinned");
    assert!(holds_stripes(&limiter.generations.last_hits));
}

#[test]
fn a_striped_key_is_pinned_with_its_stripes_and_decides_exactly_there() {
    let limiter = limiter(STRIPED);
    assert!(limiter.try_acquire(&1).is_allowed());
    pin_striped(&limiter, 1);
    // 996 left, taken from the thread's home stripe through the pin, refilled through the
    // table when the stripe runs dry, then refused: never one more.
    let admitted = (0..1500)
        .filter(|_| limiter.try_acquire(&1).is_allowed())
        .count();
    assert_eq!(admitted, 996);
    assert_eq!(limiter.available(&1), 0);
    // A reservation on the pinned key decides on its word, as through the table.
    assert!(!limiter.reserve_n(&1, 1).unwrap().decision().is_allowed());
}

#[test]
fn a_pin_lets_go_of_stripes_retired_and_decides_on_the_key_s_word_again() {
    let limiter = limiter(STRIPED);
    assert!(limiter.try_acquire(&1).is_allowed());
    pin_striped(&limiter, 1);
    let before = limiter.available(&1);
    on_cell(&limiter, 1, |hot, cell, _| hot.unstripe(cell));
    assert!(!limiter.is_striped(&1));
    // The stripes retired, the pin is of no more use: through the table, on the word.
    assert!(limiter.try_acquire(&1).is_allowed());
    assert!(!holds_pin(&limiter.generations.last_hits));
    // Pinned again, on the word this time; what the retired stripes held is lost to the
    // key until time passes it (never more than the policy).
    for _ in 0..2 {
        assert!(limiter.try_acquire(&1).is_allowed());
    }
    assert!(holds_pin(&limiter.generations.last_hits));
    assert!(!holds_stripes(&limiter.generations.last_hits));
    let rest = (0..1500)
        .filter(|_| limiter.try_acquire(&1).is_allowed())
        .count() as u64;
    assert!(3 + rest <= before, "{rest} more after {before} available");
}

#[test]
fn a_reservation_lets_go_of_stripes_retired_under_a_pin() {
    let limiter = limiter(STRIPED);
    assert!(limiter.try_acquire(&1).is_allowed());
    pin_striped(&limiter, 1);
    on_cell(&limiter, 1, |hot, cell, _| hot.unstripe(cell));
    // Requests that decide on the key's word only: the first lets go of the retired
    // stripes (and of the pin), and they decide exactly as through the table.
    assert!(limiter.reserve_n(&1, 1).unwrap().decision().is_allowed());
    assert!(!holds_stripes(&limiter.generations.last_hits));
    for _ in 0..10 {
        assert!(limiter.reserve_n(&1, 1).unwrap().decision().is_allowed());
    }
    assert!(!holds_stripes(&limiter.generations.last_hits));
}

#[test]
fn a_reset_reaches_a_key_pinned_with_its_stripes() {
    let limiter = limiter(STRIPED);
    assert!(limiter.try_acquire(&1).is_allowed());
    pin_striped(&limiter, 1);
    assert!(limiter.reset(&1));
    assert!(!limiter.is_striped(&1));
    // The pin's stripes are retired with the key's state: the key starts afresh, on its
    // word, with all 1,000 permits.
    let admitted = (0..1500)
        .filter(|_| limiter.try_acquire(&1).is_allowed())
        .count();
    assert_eq!(admitted, 1000);
}

#[test]
fn threads_pinned_on_one_striped_key_admit_exactly_its_capacity() {
    for _ in 0..20 {
        let limiter = std::sync::Arc::new(limiter(STRIPED));
        assert!(limiter.try_acquire(&7).is_allowed());
        stripe(&limiter, 7);
        let racing = limiter.clone();
        // Each thread's admissions in the low 32 bits of its result, and in the high ones
        // whether it ended pinned on the stripes.
        let summed = race(16, move || {
            let admitted = (0..200)
                .filter(|_| racing.try_acquire(&7).is_allowed())
                .count() as u64;
            admitted | u64::from(holds_stripes(&racing.generations.last_hits)) << 32
        });
        let (admitted, pinned) = (summed & u64::from(u32::MAX), summed >> 32);
        assert_eq!(admitted, 999);
        assert_eq!(limiter.available(&7), 0);
        assert!(pinned > 0, "no thread pinned the stripes");
    }
}

#[test]
fn an_evicted_pinned_key_keeps_its_place_from_other_keys() {
    let limiter = limiter("3/1s");
    pin(&limiter, 1);
    limiter.clock().advance(Duration::from_secs(2));
    assert_eq!(limiter.evict_idle(), 1);
    // The release of the key's place runs once the guards of its time are gone; the place
    // stays pinned, so the keys created next all get places of their own.
    for _ in 0..10_000 {
        drop(Guard::new());
    }
    // Created on another thread, so that this thread's streak on key 1 goes on.
    std::thread::scope(|scope| {
        scope.spawn(|| {
            for key in 2..50 {
                for _ in 0..3 {
                    assert!(limiter.try_acquire(&key).is_allowed());
                }
            }
        });
    });
    assert!(streaking(limiter.generations.id));
    // The pinned cell holds the retired state: the request finds the key gone, creates
    // it afresh, and spends nothing of another key's.
    let decision = limiter.try_acquire(&1);
    assert_eq!(decision.remaining(), 2, "{decision:?}");
    for key in 2..50 {
        assert!(!limiter.try_acquire(&key).is_allowed(), "key {key}");
    }
}

#[test]
fn pins_that_go_to_waste_ask_for_longer_runs_and_one_that_pays_brings_them_back() {
    let limiter = limiter("1000000/1h");
    let id = limiter.generations.id;
    // Runs of two requests per key: a run pins its key, which decides nothing more, and
    // once a longer run is asked for, runs of two pin nothing.
    for _ in 0..4 {
        for key in [1, 2] {
            for _ in 0..2 {
                let _ = limiter.try_acquire(&key);
            }
        }
    }
    assert_eq!(run_needed(id), 2 * FIRST_RUN);
    // Runs exactly as long as asked for, each key pinned at its run's last request: twice
    // as long a run each time, up to the longest.
    for key in 10..30 {
        let _ = limiter.try_acquire(&key);
    }
    let mut needed = vec![];
    for key in 10..30 {
        for _ in 0..run_needed(id) {
            let _ = limiter.try_acquire(&key);
        }
        needed.push(run_needed(id));
    }
    assert_eq!(needed.last(), Some(&LONGEST_RUN), "{needed:?}");
    assert!(
        needed.windows(2).all(|pair| pair[0] <= pair[1]),
        "{needed:?}"
    );
    // A run as long as asked for pins its key, which then decides the rest of the run.
    for _ in 0..3 * LONGEST_RUN {
        let _ = limiter.try_acquire(&3);
    }
    assert!(streaking(id));
    assert_eq!(run_needed(id), LONGEST_RUN);
    // That pin paid for itself: the next key is pinned after the first run again.
    // (Its first request creates it, the next ones make the run.)
    for _ in 0..=LONGEST_RUN {
        let _ = limiter.try_acquire(&4);
    }
    assert_eq!(run_needed(id), FIRST_RUN);
    assert!(streaking(id));
    // Every one of its requests spent a permit, through the table or not (and a peek counts
    // the one it would spend).
    assert_eq!(
        limiter.peek(&3).remaining(),
        1_000_000 - 3 * u64::from(LONGEST_RUN) - 1
    );
}

std::thread_local! {
    /// Copies of a [`Counted`] key made on this thread: creations and pins.
    static COPIES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A key that counts its copies.
#[derive(Hash, PartialEq, Eq, Clone, Debug)]
struct Counted(u64);

impl std::borrow::Borrow<u64> for Counted {
    fn borrow(&self) -> &u64 {
        &self.0
    }
}

impl From<u64> for Counted {
    fn from(key: u64) -> Self {
        COPIES.with(|copies| copies.set(copies.get() + 1));
        Counted(key)
    }
}

fn copies() -> usize {
    COPIES.with(std::cell::Cell::get)
}

/// Pins over `cycles` cycles of two requests in the first of `limiters` limiters and one
/// in each of the others: runs of two, each pin wasted.
fn pins_across(limiters: usize, cycles: usize) -> usize {
    let all: Vec<RateLimiter<Counted, FakeClock>> = (0..limiters)
        .map(|_| RateLimiter::with_clock("1000000/1h".parse().unwrap(), FakeClock::new()))
        .collect();
    let cycle = || {
        for _ in 0..2 {
            let _ = all[0].try_acquire(&7);
        }
        for limiter in &all[1..] {
            let _ = limiter.try_acquire(&7);
        }
    };
    for _ in 0..4 {
        cycle();
    }
    let before = copies();
    for _ in 0..cycles {
        cycle();
    }
    copies() - before
}

#[test]
fn wasted_pins_back_off_in_a_thread_of_more_limiters_than_it_keeps_notes_for() {
    assert_eq!(pins_across(4, 100), 0);
    // Five limiters: the first one's notes are taken by the others in every cycle, and
    // its slot remembers how long a run its next pin needs.
    let pins = pins_across(5, 100);
    assert!(pins <= 2, "{pins} pins in 100 cycles");
}

#[test]
fn short_runs_stop_pinning() {
    for run in 2..=8 {
        let limiter: RateLimiter<Counted, FakeClock> =
            RateLimiter::with_clock("1000000/1h".parse().unwrap(), FakeClock::new());
        for key in 0..100 {
            let _ = limiter.try_acquire(&key);
        }
        let before = copies();
        for _ in 0..10 {
            for key in 0..100 {
                for _ in 0..run {
                    let _ = limiter.try_acquire(&key);
                }
            }
        }
        let pins = copies() - before;
        assert!(pins <= 10, "runs of {run}: {pins} pins in 1,000 runs");
    }
}

#[test]
fn a_loss_on_the_last_hit_counts_toward_striping() {
    let limiter = limiter("1000/1h");
    pin(&limiter, 1);
    on_cell(&limiter, 1, |hot, cell, gcra| {
        for _ in 0..crate::keyed::striped::LOST_BEFORE_STRIPING {
            hot.lost_elsewhere(cell, gcra, limiter.generations.clock.now(), true);
        }
    });
    assert!(limiter.is_striped(&1));
}

#[test]
fn threads_pinned_on_one_key_admit_exactly_its_capacity() {
    for _ in 0..20 {
        let limiter = std::sync::Arc::new(limiter("1000/1h"));
        let racing = limiter.clone();
        let admitted = race(8, move || {
            (0..400)
                .filter(|_| racing.try_acquire(&7).is_allowed())
                .count() as u64
        });
        assert_eq!(admitted, 1000);
        assert_eq!(limiter.peek(&7).remaining(), 0);
    }
}
