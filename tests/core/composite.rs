//! Composite policies ("3 per second and 5 per hour") through the public API: a request is
//! allowed only if every band allows it, a refused request spends nothing in any band, and
//! the decision merges the bands (`src/engine/composite.rs` has the table).
//!
//! Exactness under racing threads and eviction follows tests/core/races.rs, with composite
//! policies of one and of mixed algorithms.

use std::sync::Arc;
use std::time::Duration;

use tollgate::{Decision, DirectLimiter, FakeClock, Policy, RateLimiter};

use crate::support::{eviction_race, race};

const MS: u64 = 1_000_000;
const SEC: u64 = 1_000 * MS;

fn policy(text: &str) -> Policy {
    text.parse().unwrap()
}

/// (allowed, remaining, limit, retry_after ns, reset_after ns).
fn fields(d: Decision) -> (bool, u64, u64, u64, u64) {
    (
        d.is_allowed(),
        d.remaining(),
        d.limit(),
        d.retry_after().as_nanos() as u64,
        d.reset_after().as_nanos() as u64,
    )
}

/// The trace of "3/1s & 5/1h" (token buckets: T = 333,333,334 ns and 720 s), on any limiter.
fn short_band_refusals_spend_nothing_in_the_long_band(
    clock: &FakeClock,
    mut acquire: impl FnMut() -> Decision,
) {
    // t = 0: the short band's burst of 3. The smaller remaining is the short band's.
    for remaining in [2, 1, 0] {
        assert_eq!(
            fields(acquire()),
            (true, remaining, 3, 0, 720 * SEC * (3 - remaining))
        );
    }
    // 100 refusals by the short band, at 0 and at 100 ms. The long band would allow each one
    // (it has 2 left): had it spent them, it would be empty for days.
    for i in 0..100u64 {
        let t = if i < 50 { 0 } else { 100 * MS };
        clock.set(Duration::from_nanos(t));
        let d = acquire();
        // Available now: 0 in the short band, 2 in the long one. Retry: when the short band's
        // first permit is back. Reset: the long band's TAT as it stands, 3 * 720 s.
        assert_eq!(
            fields(d),
            (false, 0, 3, 333_333_334 - t, 3 * 720 * SEC - t),
            "refusal {i}"
        );
    }
    // t = 2 s: the short band is full again; the long band still has exactly 2 (it refills
    // one permit per 720 s), so exactly two more pass, and the third is refused by the long
    // band alone.
    clock.set(Duration::from_secs(2));
    assert_eq!(fields(acquire()), (true, 1, 5, 0, 4 * 720 * SEC - 2 * SEC));
    assert_eq!(fields(acquire()), (true, 0, 5, 0, 5 * 720 * SEC - 2 * SEC));
    // Available now: 1 in the short band, 0 in the long one, whose TAT is now 3,600 s (its
    // whole burst ahead): its next permit is back one interval after 0, at 720 s.
    assert_eq!(
        fields(acquire()),
        (false, 0, 5, 720 * SEC - 2 * SEC, 5 * 720 * SEC - 2 * SEC)
    );
}

#[test]
fn direct_refused_by_the_short_band_leaves_the_long_band_untouched() {
    let clock = FakeClock::new();
    let limiter = DirectLimiter::with_clock(policy("3/1s & 5/1h"), clock.clone());
    short_band_refusals_spend_nothing_in_the_long_band(&clock, || limiter.try_acquire());
}

#[test]
fn keyed_refused_by_the_short_band_leaves_the_long_band_untouched() {
    let clock = FakeClock::new();
    let limiter: RateLimiter<String, FakeClock> =
        RateLimiter::with_clock(policy("3/1s & 5/1h"), clock.clone());
    short_band_refusals_spend_nothing_in_the_long_band(&clock, || limiter.try_acquire("alice"));
    // Another key has all its permits.
    assert_eq!(limiter.try_acquire("bob").remaining(), 2);
}

#[test]
fn mixed_algorithms_refused_by_the_long_band_leave_the_short_band_untouched() {
    // Band 0: sliding log, 5 per second. Band 1: sliding counter, 2 per minute.
    let clock = FakeClock::new();
    let limiter = DirectLimiter::with_clock(
        policy("sliding-log 5/1s & sliding-counter 2/1m"),
        clock.clone(),
    );
    assert_eq!(
        fields(limiter.try_acquire_n(2).unwrap()),
        (true, 0, 2, 0, 120 * SEC)
    );
    for _ in 0..50 {
        // The counter refuses; the log would allow: it still has 3, the counter none.
        let d = limiter.try_acquire();
        assert!(!d.is_allowed());
        assert_eq!((d.remaining(), d.limit()), (0, 2));
    }
    // The counter allows again from the second nanosecond of the next window (its previous
    // count of 2 then weighs less than 2). The log's two entries are long gone by then, so
    // it leaves 4, and the counter 0: the smaller is the counter's.
    clock.set(Duration::from_nanos(60 * SEC + 1));
    let d = limiter.try_acquire();
    assert_eq!((d.is_allowed(), d.remaining(), d.limit()), (true, 0, 2));
}

#[test]
fn decision_fields_when_allowed_and_refused() {
    // Band 0: sliding log, 1 per second. Band 1: token bucket, 5 per hour (T = 720 s).
    let clock = FakeClock::new();
    let limiter = DirectLimiter::with_clock(policy("sliding-log 1/1s & 5/1h"), clock.clone());
    assert_eq!(limiter.policy(), policy("5/1h & sliding-log 1/s"));
    // Allowed: remaining min(0, 4) with band 0's limit; reset max(1 s, 720 s).
    assert_eq!(fields(limiter.try_acquire()), (true, 0, 1, 0, 720 * SEC));
    // Refused by band 0 at 500 ms: band 1 would allow (4 available now). Reset: band 1's
    // TAT as it stands, not with the refused request.
    clock.set(Duration::from_millis(500));
    assert_eq!(
        fields(limiter.try_acquire()),
        (false, 0, 1, 500 * MS, 720 * SEC - 500 * MS)
    );
    // One request a second (band 0's pace) drains band 1: at 1 s it has 3 left after, ...
    clock.set(Duration::from_secs(1));
    assert_eq!(
        fields(limiter.try_acquire()),
        (true, 0, 1, 0, 2 * 720 * SEC - SEC)
    );
    for (t, remaining) in [(2, 2), (3, 1), (4, 0)] {
        clock.set(Duration::from_secs(t));
        let d = limiter.try_acquire();
        assert_eq!((d.is_allowed(), d.remaining(), d.limit()), (true, 0, 1));
        assert_eq!(
            d.reset_after(),
            Duration::from_secs(720 * (5 - remaining) - t)
        );
    }
    // t = 4.5 s: both refuse, with 0 available each: the tie goes to band 0's limit; the
    // retry is the larger one (band 1's next permit, back at 720 s), and so is the reset
    // (band 1's TAT, 3,600 s).
    clock.set(Duration::from_millis(4_500));
    assert_eq!(
        fields(limiter.try_acquire()),
        (
            false,
            0,
            1,
            720 * SEC - 4_500 * MS,
            3_600 * SEC - 4_500 * MS
        )
    );
    // t = 5 s: band 0 has 1 again, band 1 has 0: refused by band 1 alone, which reports the
    // smaller remaining and its limit, its retry and the larger reset.
    clock.set(Duration::from_secs(5));
    assert_eq!(
        fields(limiter.try_acquire()),
        (false, 0, 5, 720 * SEC - 5 * SEC, 3_600 * SEC - 5 * SEC)
    );
}

/// A refusal's reset_after counts a sliding counter band that would allow, and whose counts
/// have both rolled out, as at rest now: it adds nothing to the refusing band's reset.
#[test]
fn an_allowing_counter_band_with_nothing_counted_adds_nothing_to_the_reset() {
    // Band 0: sliding counter, 10 per second. Band 1: token bucket, 1 per 10.5 s.
    let clock = FakeClock::new();
    let limiter =
        DirectLimiter::with_clock(policy("sliding-counter 10/1s & 1/10500ms"), clock.clone());
    // Allowed at 0: the bucket has 0 left, its TAT is 10.5 s (the counter's reset, 2 s, is
    // the smaller).
    assert_eq!(fields(limiter.try_acquire()), (true, 0, 1, 0, 10_500 * MS));
    // Refused by the bucket at 10 s, 500 ms before its TAT. The counter would allow: its one
    // request is in window 0, so window 10 sees neither a current nor a previous count, and
    // it is at rest now. The reset is the bucket's alone, not the end of window 10 (1 s).
    clock.set(Duration::from_secs(10));
    assert_eq!(
        fields(limiter.try_acquire()),
        (false, 0, 1, 500 * MS, 500 * MS)
    );
}

/// A refusal's reset_after counts a sliding log band that would allow until its newest entry
/// leaves the window, when that is later than the refusing band's reset.
#[test]
fn an_allowing_log_band_reports_when_its_newest_entry_leaves() {
    // Band 0: token bucket, 1 per second. Band 1: sliding log, 5 per hour. The first request
    // comes at 10 s, so the log's entry is not the 0 an unwritten slot holds.
    let clock = FakeClock::new();
    clock.set(Duration::from_secs(10));
    let limiter = DirectLimiter::with_clock(policy("1/1s & sliding-log 5/1h"), clock.clone());
    // Allowed: the bucket has 0 left; the reset is the log's, its entry leaving at 3,610 s.
    assert_eq!(fields(limiter.try_acquire()), (true, 0, 1, 0, 3_600 * SEC));
    // Refused by the bucket at 10.5 s (its TAT is 11 s). The log would allow (4 available);
    // its one entry, 500 ms old, leaves 3,600 s after it was stamped, which is the larger
    // reset.
    clock.set(Duration::from_millis(10_500));
    assert_eq!(
        fields(limiter.try_acquire()),
        (false, 0, 1, 500 * MS, 3_600 * SEC - 500 * MS)
    );
}

#[test]
fn cost_is_capped_at_the_smallest_band() {
    let limiter = DirectLimiter::with_clock(policy("10/1s & 3/1h"), FakeClock::new());
    assert!(limiter.try_acquire_n(4).is_err());
    assert!(limiter.try_acquire_n(0).is_err());
    let d = limiter.try_acquire_n(3).unwrap();
    assert_eq!((d.is_allowed(), d.remaining(), d.limit()), (true, 0, 3));
    let keyed: RateLimiter<u64, FakeClock> =
        RateLimiter::with_clock(policy("10/1s & 3/1h"), FakeClock::new());
    assert!(keyed.try_acquire_n(&1, 4).is_err());
    assert!(keyed.try_acquire_n(&1, 3).unwrap().is_allowed());
}

#[test]
fn a_key_is_evicted_only_when_every_band_is_at_rest() {
    let clock = FakeClock::new();
    let limiter: RateLimiter<u64, FakeClock> =
        RateLimiter::with_clock(policy("sliding-log 1/1s & 2/1h"), clock.clone());
    assert!(limiter.try_acquire(&7).is_allowed());
    // The log band is at rest after 1 s; the bucket band's TAT is 30 min.
    clock.set(Duration::from_secs(1));
    assert_eq!(limiter.evict_idle(), 0);
    assert_eq!(limiter.len(), 1);
    clock.set(Duration::from_secs(1_800) - Duration::from_nanos(1));
    assert_eq!(limiter.evict_idle(), 0);
    clock.set(Duration::from_secs(1_800));
    assert_eq!(limiter.evict_idle(), 1);
    assert_eq!(limiter.len(), 0);
    // A new state for the key: full again in both bands.
    assert_eq!(limiter.try_acquire(&7).remaining(), 0);
    let direct = DirectLimiter::with_clock(policy("sliding-log 1/1s & 2/1h"), clock.clone());
    assert!(direct.is_at_rest());
    assert!(direct.try_acquire().is_allowed());
    clock.advance(Duration::from_secs(1));
    assert!(!direct.is_at_rest());
    clock.advance(Duration::from_secs(1_799));
    assert!(direct.is_at_rest());
}

/// Composite policies whose tightest band admits 1,000 at one instant: one algorithm, mixed
/// algorithms, and the tightest band last (longest window).
const RACED: [&str; 3] = [
    "1000/1h & 5000/1d",
    "sliding-log 1000/1h & sliding-counter 3000/1d",
    "sliding-counter 4000/1m & token-bucket 2000/1h & sliding-log 1000/1d",
];

#[test]
fn keyed_capacity_is_exact_under_16_threads() {
    for text in RACED {
        for trial in 0..20 {
            let limiter: Arc<RateLimiter<String, FakeClock>> =
                Arc::new(RateLimiter::with_clock(policy(text), FakeClock::new()));
            let admitted = race(16, move |_| {
                (0..2_000)
                    .filter(|_| limiter.try_acquire("hot").is_allowed())
                    .count() as u64
            });
            assert_eq!(admitted, 1_000, "{text}, trial {trial}");
        }
    }
}

#[test]
fn direct_capacity_is_exact_under_16_threads() {
    for text in RACED {
        for trial in 0..20 {
            let limiter = Arc::new(DirectLimiter::with_clock(policy(text), FakeClock::new()));
            let l = limiter.clone();
            let admitted = race(16, move |_| {
                (0..2_000).filter(|_| l.try_acquire().is_allowed()).count() as u64
            });
            assert_eq!(admitted, 1_000, "{text}, trial {trial}");
            // Refusals spent nothing: the other bands hold exactly what 1,000 admissions
            // took from them (the tightest band refuses first, so none is at 0 before it).
            assert!(!limiter.try_acquire().is_allowed(), "{text}");
        }
    }
}

#[test]
fn costs_are_exact_under_racing_threads() {
    // Costs 1, 2 and 3 racing on a tightest capacity of 1,000: the permits spent never exceed
    // it, and whatever was not spent is still there in every band.
    for text in RACED {
        let limiter = Arc::new(DirectLimiter::with_clock(policy(text), FakeClock::new()));
        let l = limiter.clone();
        let spent = race(12, move |i| {
            let cost = (i % 3) as u64 + 1;
            (0..500)
                .filter(|_| l.try_acquire_n(cost).unwrap().is_allowed())
                .count() as u64
                * cost
        });
        assert!(spent <= 1_000, "{text}: spent {spent}");
        let mut drained = 0;
        while limiter.try_acquire().is_allowed() {
            drained += 1;
        }
        assert_eq!(
            drained,
            1_000 - spent,
            "{text}: the permits not spent are all still there"
        );
    }
}

#[test]
fn eviction_racing_requests_never_admits_extra() {
    // As tests/core/races.rs, with composite policies whose longest window is under the 2 s
    // between phases; each key admits exactly its tightest capacity per phase.
    for text in [
        "sliding-counter 80/500ms & sliding-log 50/1s",
        "50/1s & sliding-log 60/1500ms",
    ] {
        eviction_race(text, policy(text), 50);
    }
}
