//! `cached_clock`: both limiters on their opt-in cached clocks, refreshed every millisecond
//! by a background thread (tollgate's `CoarseClock`, governor's `QuantaUpkeepClock`), next
//! to both on their default clocks in the same group.
//!
//! Groups: `cached_clock_direct` (direct limiter, allowed path) and
//! `cached_clock_keyed_hot_str` (one hot `String` key looked up by `&str`; governor by
//! `&String`). Contestants: `tollgate` and `governor` on cached clocks (the like-for-like
//! pair the ratios use), `tollgate_default_clock` and `governor_default_clock`.

use std::hint::black_box;
use std::time::Duration;

use criterion::Criterion;
use governor::clock::QuantaUpkeepClock;
use tollgate::clock::CoarseClock;
use tollgate::{DirectLimiter, RateLimiter};

use crate::common::{self, FAST};

const RESOLUTION: Duration = Duration::from_millis(1);

pub fn bench(c: &mut Criterion) {
    let coarse = CoarseClock::new(RESOLUTION).expect("a valid resolution");
    // quanta runs one upkeep thread per process: start it once, clone the clock.
    let upkeep = QuantaUpkeepClock::from_interval(RESOLUTION).expect("quanta's upkeep thread");
    direct(c, &coarse, &upkeep);
    keyed_hot_str(c, &coarse, &upkeep);
}

fn direct(c: &mut Criterion, coarse: &CoarseClock, upkeep: &QuantaUpkeepClock) {
    let mut g = common::group(c, "cached_clock_direct");

    let tollgate = DirectLimiter::with_clock(common::policy(FAST), coarse.clone());
    g.bench_function("tollgate", |b| {
        b.iter(|| black_box(tollgate.try_acquire()).is_allowed())
    });

    let governor =
        governor::RateLimiter::direct_with_clock(common::governor_fast(), upkeep.clone());
    g.bench_function("governor", |b| {
        b.iter(|| black_box(governor.check()).is_ok())
    });

    let tollgate_default = DirectLimiter::new(common::policy(FAST));
    g.bench_function("tollgate_default_clock", |b| {
        b.iter(|| black_box(tollgate_default.try_acquire()).is_allowed())
    });

    let governor_default = governor::RateLimiter::direct(common::governor_fast());
    g.bench_function("governor_default_clock", |b| {
        b.iter(|| black_box(governor_default.check()).is_ok())
    });
    g.finish();
}

fn keyed_hot_str(c: &mut Criterion, coarse: &CoarseClock, upkeep: &QuantaUpkeepClock) {
    let owned = common::string_key(42);
    let key: &str = &owned;
    let mut g = common::group(c, "cached_clock_keyed_hot_str");

    let tollgate: RateLimiter<String, CoarseClock> =
        RateLimiter::with_clock(common::policy(FAST), coarse.clone());
    g.bench_function("tollgate", |b| {
        b.iter(|| black_box(tollgate.try_acquire(black_box(key))).is_allowed())
    });

    let governor = governor::RateLimiter::<String, _, _>::dashmap_with_clock(
        common::governor_fast(),
        upkeep.clone(),
    );
    g.bench_function("governor", |b| {
        b.iter(|| black_box(governor.check_key(black_box(&owned))).is_ok())
    });

    let tollgate_default: RateLimiter<String> = RateLimiter::new(common::policy(FAST));
    g.bench_function("tollgate_default_clock", |b| {
        b.iter(|| black_box(tollgate_default.try_acquire(black_box(key))).is_allowed())
    });

    let governor_default = governor::RateLimiter::<String, _, _>::keyed(common::governor_fast());
    g.bench_function("governor_default_clock", |b| {
        b.iter(|| black_box(governor_default.check_key(black_box(&owned))).is_ok())
    });
    g.finish();
}
