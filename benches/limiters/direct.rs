//! `direct`: one state, no map. tollgate's `DirectLimiter` next to governor's direct limiter,
//! the same GCRA behind `std::sync::Mutex` and `parking_lot::Mutex`, and the physical floor
//! (one clock read, one load, one compare-and-swap).
//!
//! Groups: `direct` (allowed path, a rate that cannot be exhausted) and `direct_denied`
//! (a spent one-per-hour policy: every decision is a refusal with its retry_after).

use std::hint::black_box;

use criterion::Criterion;
use tollgate::DirectLimiter;

use crate::baseline::{Floor, LockedDirect, PlMutex, StdMutex};
use crate::common::{self, FAST, FAST_PERMITS, FAST_WINDOW_NANOS, SLOW};

pub fn bench(c: &mut Criterion) {
    allowed(c);
    denied(c);
}

fn allowed(c: &mut Criterion) {
    let mut g = common::group(c, "direct");

    let tollgate = DirectLimiter::new(common::policy(FAST));
    g.bench_function("tollgate", |b| {
        b.iter(|| black_box(tollgate.try_acquire()).is_allowed())
    });

    let governor = governor::RateLimiter::direct(common::governor_fast());
    g.bench_function("governor", |b| {
        b.iter(|| black_box(governor.check()).is_ok())
    });

    let std_mutex = LockedDirect::<StdMutex<u64>>::new(FAST_PERMITS, FAST_WINDOW_NANOS);
    g.bench_function("std_mutex", |b| {
        b.iter(|| black_box(std_mutex.check()).allowed)
    });

    let parking_lot = LockedDirect::<PlMutex<u64>>::new(FAST_PERMITS, FAST_WINDOW_NANOS);
    g.bench_function("parking_lot", |b| {
        b.iter(|| black_box(parking_lot.check()).allowed)
    });

    let floor = Floor::new();
    g.bench_function("floor", |b| b.iter(|| black_box(floor.check())));
    g.finish();
}

fn denied(c: &mut Criterion) {
    let mut g = common::group(c, "direct_denied");

    let tollgate = DirectLimiter::new(common::policy(SLOW));
    assert!(tollgate.try_acquire().is_allowed());
    g.bench_function("tollgate", |b| {
        b.iter(|| black_box(tollgate.try_acquire()).retry_after())
    });

    let governor = governor::RateLimiter::direct(common::governor_slow());
    assert!(governor.check().is_ok());
    g.bench_function("governor", |b| {
        b.iter(|| black_box(governor.check()).is_err())
    });

    let parking_lot = LockedDirect::<PlMutex<u64>>::new(1, 3_600_000_000_000);
    assert!(parking_lot.check().allowed);
    g.bench_function("parking_lot", |b| {
        b.iter(|| black_box(parking_lot.check()).wait)
    });
    g.finish();
}
