//! `keyed_hot`: one hot key in a keyed limiter, one thread. The map lookup is the whole
//! difference from `direct`.
//!
//! Groups: `keyed_hot_u64` (a `u64` key) and `keyed_hot_str` (a `String` key looked up by
//! `&str`; governor's `check_key` takes `&K`, so it gets a `&String`, the best it can do).
//! Contestants: tollgate with its default hasher (aHash) and with foldhash (and, for the
//! string key, with the key held as tollgate's `InlineKey`), governor keyed
//! (its default: DashMap + SipHash), the same GCRA in one `HashMap` (SipHash) behind
//! `std::sync::Mutex` and `parking_lot::Mutex`, the hand-written mutex version with a fast
//! hash (`mutex_fast`: `parking_lot::Mutex` around a `HashMap` with foldhash), and the
//! direct floor for reference.

use std::hint::black_box;

use criterion::Criterion;
use tollgate::keys::InlineKey;
use tollgate::{RateLimiter, SystemClock};

use crate::baseline::{Floor, LockedKeyed, MutexFast, PlMutex, StdMutex};
use crate::common::{self, FAST, FAST_PERMITS, FAST_WINDOW_NANOS};

pub fn bench(c: &mut Criterion) {
    hot_u64(c);
    hot_str(c);
}

fn hot_u64(c: &mut Criterion) {
    let key = 0x5eed_u64;
    let mut g = common::group(c, "keyed_hot_u64");

    let tollgate: RateLimiter<u64> = RateLimiter::new(common::policy(FAST));
    g.bench_function("tollgate", |b| {
        b.iter(|| black_box(tollgate.try_acquire(black_box(&key))).is_allowed())
    });

    let foldhash = RateLimiter::<u64, _, _>::with_hasher(
        common::policy(FAST),
        SystemClock::new(),
        foldhash::fast::RandomState::default(),
    );
    g.bench_function("tollgate_foldhash", |b| {
        b.iter(|| black_box(foldhash.try_acquire(black_box(&key))).is_allowed())
    });

    let governor = governor::RateLimiter::<u64, _, _>::keyed(common::governor_fast());
    g.bench_function("governor", |b| {
        b.iter(|| black_box(governor.check_key(black_box(&key))).is_ok())
    });

    let std_mutex = LockedKeyed::<u64, StdMutex<_>>::new(FAST_PERMITS, FAST_WINDOW_NANOS);
    g.bench_function("std_mutex", |b| {
        b.iter(|| black_box(std_mutex.check(black_box(&key))).allowed)
    });

    let parking_lot = LockedKeyed::<u64, PlMutex<_>>::new(FAST_PERMITS, FAST_WINDOW_NANOS);
    g.bench_function("parking_lot", |b| {
        b.iter(|| black_box(parking_lot.check(black_box(&key))).allowed)
    });

    let mutex_fast = MutexFast::<u64>::new(FAST_PERMITS, FAST_WINDOW_NANOS);
    g.bench_function("mutex_fast", |b| {
        b.iter(|| black_box(mutex_fast.check(black_box(&key))).allowed)
    });

    let floor = Floor::new();
    g.bench_function("floor", |b| b.iter(|| black_box(floor.check())));
    g.finish();
}

fn hot_str(c: &mut Criterion) {
    let owned = common::string_key(42);
    let key: &str = &owned;
    let mut g = common::group(c, "keyed_hot_str");

    let tollgate: RateLimiter<String> = RateLimiter::new(common::policy(FAST));
    g.bench_function("tollgate", |b| {
        b.iter(|| black_box(tollgate.try_acquire(black_box(key))).is_allowed())
    });

    // The same string as tollgate's `InlineKey`, still looked up by `&str`: what keeping
    // the key inside the entry costs at each comparison (a UTF-8 check of its bytes).
    let inline: RateLimiter<InlineKey> = RateLimiter::new(common::policy(FAST));
    g.bench_function("tollgate_inline_key", |b| {
        b.iter(|| black_box(inline.try_acquire(black_box(key))).is_allowed())
    });

    let foldhash = RateLimiter::<String, _, _>::with_hasher(
        common::policy(FAST),
        SystemClock::new(),
        foldhash::fast::RandomState::default(),
    );
    g.bench_function("tollgate_foldhash", |b| {
        b.iter(|| black_box(foldhash.try_acquire(black_box(key))).is_allowed())
    });

    let governor = governor::RateLimiter::<String, _, _>::keyed(common::governor_fast());
    g.bench_function("governor", |b| {
        b.iter(|| black_box(governor.check_key(black_box(&owned))).is_ok())
    });

    let std_mutex = LockedKeyed::<String, StdMutex<_>>::new(FAST_PERMITS, FAST_WINDOW_NANOS);
    g.bench_function("std_mutex", |b| {
        b.iter(|| black_box(std_mutex.check(black_box(key))).allowed)
    });

    let parking_lot = LockedKeyed::<String, PlMutex<_>>::new(FAST_PERMITS, FAST_WINDOW_NANOS);
    g.bench_function("parking_lot", |b| {
        b.iter(|| black_box(parking_lot.check(black_box(key))).allowed)
    });

    let mutex_fast = MutexFast::<String>::new(FAST_PERMITS, FAST_WINDOW_NANOS);
    g.bench_function("mutex_fast", |b| {
        b.iter(|| black_box(mutex_fast.check(black_box(key))).allowed)
    });

    let floor = Floor::new();
    g.bench_function("floor", |b| b.iter(|| black_box(floor.check())));
    g.finish();
}
