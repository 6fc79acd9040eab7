//! Observability and shadow mode: counters exact under racing threads, and a shadow limiter
//! that counts refusals but lets everything through without changing what it enforces.

use std::sync::{Arc, Barrier};
use std::thread;

use tollgate::{FakeClock, RateLimiter};

fn hammer(limiter: Arc<RateLimiter<String, FakeClock>>) -> (u64, u64) {
    let start = Arc::new(Barrier::new(16));
    let handles: Vec<_> = (0..16)
        .map(|t| {
            let (limiter, start) = (limiter.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                let (mut allowed, mut flagged) = (0, 0);
                for i in 0..2_000 {
                    // Half the threads share a hot key; the others spread over 8 keys.
                    let key = if t % 2 == 0 {
                        "hot".to_owned()
                    } else {
                        format!("k{}", i % 8)
                    };
                    let d = limiter.try_acquire(key.as_str());
                    allowed += u64::from(d.is_allowed());
                    flagged += u64::from(d.would_refuse());
                }
                (allowed, flagged)
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .fold((0, 0), |(a, f), (x, y)| (a + x, f + y))
}

#[test]
fn counters_are_exact_under_racing_threads() {
    for _ in 0..5 {
        let limiter = Arc::new(
            RateLimiter::with_clock("100/1h".parse().unwrap(), FakeClock::new()).with_stats(),
        );
        let (allowed, flagged) = hammer(limiter.clone());
        let stats = limiter.stats();
        // 9 keys of 100 permits each, with the clock frozen.
        assert_eq!(allowed, 900);
        assert_eq!(flagged, 0);
        assert_eq!(stats.allowed, 900);
        assert_eq!(stats.refused, 32_000 - 900);
        assert_eq!(stats.keys, 9);
        assert!(stats.counting);
    }
}

#[test]
fn shadow_mode_counts_refusals_and_lets_them_through() {
    let limiter = Arc::new(
        RateLimiter::with_clock("100/1h".parse().unwrap(), FakeClock::new())
            .shadow()
            .with_stats(),
    );
    let (allowed, flagged) = hammer(limiter.clone());
    assert_eq!(allowed, 32_000, "nothing is refused");
    assert_eq!(
        flagged,
        32_000 - 900,
        "what enforcing would have refused is marked"
    );
    let stats = limiter.stats();
    assert_eq!((stats.allowed, stats.refused), (900, 32_000 - 900));
    // The state is what enforcing would have left: the hot key has nothing left.
    let d = limiter.peek("hot");
    assert!(!d.is_allowed() && d.remaining() == 0, "{d:?}");
}

#[test]
fn without_stats_nothing_is_counted() {
    let limiter: RateLimiter<String, FakeClock> =
        RateLimiter::with_clock("1/1h".parse().unwrap(), FakeClock::new());
    let _ = limiter.try_acquire("a");
    let _ = limiter.try_acquire("a");
    let stats = limiter.stats();
    assert_eq!(
        (stats.allowed, stats.refused, stats.keys, stats.counting),
        (0, 0, 1, false)
    );
}
