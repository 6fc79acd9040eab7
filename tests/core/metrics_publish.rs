//! `Stats::publish` through the `metrics` facade (feature `metrics`).
#![cfg(feature = "metrics")]

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tollgate::{FakeClock, RateLimiter};

#[test]
fn stats_are_published_as_counters_and_a_gauge() {
    let limiter: RateLimiter<String, FakeClock> =
        RateLimiter::with_clock("2/1h".parse().unwrap(), FakeClock::new()).with_stats();
    for _ in 0..5 {
        let _ = limiter.try_acquire("a");
    }
    let _ = limiter.try_acquire("b");
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || limiter.stats().publish("api"));
    let mut seen: Vec<(String, Vec<String>, String)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let (_, key) = key.into_parts();
            let labels = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let value = match value {
                DebugValue::Counter(n) => n.to_string(),
                DebugValue::Gauge(g) => g.into_inner().to_string(),
                DebugValue::Histogram(_) => "histogram".to_owned(),
            };
            (key.name().to_owned(), labels, value)
        })
        .collect();
    seen.sort();
    let expect = |name: &str, labels: &[&str], value: &str| {
        (
            name.to_owned(),
            labels.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            value.to_owned(),
        )
    };
    assert_eq!(
        seen,
        vec![
            expect("api_decisions_total", &["outcome=allowed"], "3"),
            expect("api_decisions_total", &["outcome=refused"], "3"),
            expect("api_keys", &[], "2"),
            expect("api_overflowed_total", &[], "0"),
        ]
    );
}
