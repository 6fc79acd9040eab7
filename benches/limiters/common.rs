//! Settings and inputs shared by every scenario.

use std::num::NonZeroU32;
use std::time::Duration;

use criterion::{BenchmarkGroup, Criterion};
use tollgate::Policy;

/// The allowed path: a rate no benchmark can exhaust (one permit per nanosecond).
pub const FAST: &str = "token-bucket 1000000000/1s";
pub const FAST_PERMITS: u64 = 1_000_000_000;
pub const FAST_WINDOW_NANOS: u64 = 1_000_000_000;

/// The denied path: one permit per hour, spent before timing starts.
pub const SLOW: &str = "token-bucket 1/1h";

pub fn policy(text: &str) -> Policy {
    text.parse()
        .unwrap_or_else(|e| panic!("policy {text:?}: {e}"))
}

/// governor's quota for [`FAST`].
pub fn governor_fast() -> governor::Quota {
    governor::Quota::per_second(NonZeroU32::new(1_000_000_000).expect("non-zero"))
}

/// governor's quota for [`SLOW`].
pub fn governor_slow() -> governor::Quota {
    governor::Quota::per_hour(NonZeroU32::new(1).expect("non-zero"))
}

/// Times for the fast groups: about 3.5 s per contestant with the analysis.
pub fn group<'a>(
    c: &'a mut Criterion,
    name: &str,
) -> BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let mut g = c.benchmark_group(name);
    g.warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_millis(2500));
    g
}

/// Times for groups whose iterations are slow or whose setup is heavy.
pub fn slow_group<'a>(
    c: &'a mut Criterion,
    name: &str,
    samples: usize,
) -> BenchmarkGroup<'a, criterion::measurement::WallTime> {
    let mut g = group(c, name);
    g.sample_size(samples);
    g
}

pub use crate::order::shuffled;

/// The 11-byte string key for index `i`: `user-000042`.
pub fn string_key(i: usize) -> String {
    format!("user-{i:06}")
}

/// Walks `items` cyclically: the timed loop pays one index increment and one compare.
pub struct Cycle<'a, T> {
    items: &'a [T],
    at: usize,
}

impl<'a, T> Cycle<'a, T> {
    pub fn new(items: &'a [T], start: usize) -> Self {
        Cycle {
            items,
            at: start % items.len(),
        }
    }

    #[inline]
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> &'a T {
        let item = &self.items[self.at];
        self.at += 1;
        if self.at == self.items.len() {
            self.at = 0;
        }
        item
    }
}
