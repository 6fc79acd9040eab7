//! `keyed_many`: many keys, all inserted before timing starts, visited one after another in
//! a precomputed order (the timed loop only steps an index through it). Past the caches,
//! this is the cost of finding a key's state in a big map: cache misses, then hashing.
//!
//! Groups: `keyed_many_u64_100k_seq`, `keyed_many_u64_100k_random`,
//! `keyed_many_u64_1m_seq`, `keyed_many_u64_1m_random` (keys `0..n`, visited in key order or
//! in a fixed shuffle) and `keyed_many_string_100k_random` (11-byte `user-000042` keys,
//! shuffled; tollgate looks up by `&str`, governor by `&String`).
//! Contestants: tollgate with aHash and with foldhash (and, for the String keys, with the
//! keys held as tollgate's `InlineKey`), governor keyed, and the same GCRA in
//! one `HashMap` behind `parking_lot::Mutex`, with SipHash (`parking_lot`) and with foldhash
//! (`mutex_fast`, the hand-written mutex version with a fast hash; `&str` lookups).
//!
//! tollgate's automatic sweep is off here (`sweep_per_insert(0)`), as governor has none: the
//! groups time lookups of tracked keys. With it on, a key left idle for longer than the
//! policy's window (1 s) is legitimately swept and re-created on its next visit, and one pass
//! over 1M keys can take longer than that on a slow machine, which turns the group into a
//! measure of key creation.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::hint::black_box;

use criterion::{BenchmarkGroup, Criterion};
use tollgate::keys::InlineKey;
use tollgate::{RateLimiter, SystemClock};

use crate::baseline::{LockedKeyed, MutexFast, PlMutex};
use crate::common::{self, Cycle, FAST, FAST_PERMITS, FAST_WINDOW_NANOS};

type Group<'a> = BenchmarkGroup<'a, criterion::measurement::WallTime>;

pub fn bench(c: &mut Criterion) {
    for (n, label) in [(100_000, "100k"), (1_000_000, "1m")] {
        let keys: Vec<u64> = (0..n as u64).collect();
        let random: Vec<u64> = common::shuffled(n, 0xC0FFEE)
            .into_iter()
            .map(|i| keys[i])
            .collect();
        let mut g = common::slow_group(c, &format!("keyed_many_u64_{label}_seq"), 50);
        u64_keys(&mut g, &keys, &keys);
        g.finish();
        let mut g = common::slow_group(c, &format!("keyed_many_u64_{label}_random"), 50);
        u64_keys(&mut g, &keys, &random);
        g.finish();
    }

    let n = 100_000;
    let keys: Vec<String> = (0..n).map(common::string_key).collect();
    let random: Vec<&str> = common::shuffled(n, 0xBEEF)
        .into_iter()
        .map(|i| keys[i].as_str())
        .collect();
    let random_owned: Vec<&String> = common::shuffled(n, 0xBEEF)
        .into_iter()
        .map(|i| &keys[i])
        .collect();
    let mut g = common::slow_group(c, "keyed_many_string_100k_random", 50);
    string_keys(&mut g, &keys, &random, &random_owned);
    g.finish();
}

/// Tracks every key of `keys` in tollgate's `limiter` (its automatic sweep off), then times
/// its decisions on the keys of `order` in turn, each looked up as a `&Q`.
fn tollgate<Q, K, S>(
    g: &mut Group<'_>,
    name: &str,
    limiter: RateLimiter<K, SystemClock, S>,
    keys: &[impl Borrow<Q>],
    order: &[impl Borrow<Q>],
) where
    Q: Hash + Eq + ToOwned + ?Sized,
    K: Hash + Eq + Clone + Borrow<Q> + From<Q::Owned> + 'static,
    S: BuildHasher + Clone + 'static,
{
    let limiter = limiter.sweep_per_insert(0);
    keys.iter()
        .for_each(|k| assert!(limiter.try_acquire(k.borrow()).is_allowed()));
    let mut walk = Cycle::new(order, 0);
    g.bench_function(name, |b| {
        b.iter(|| black_box(limiter.try_acquire(walk.next().borrow())).is_allowed())
    });
}

fn u64_keys(g: &mut Group<'_>, keys: &[u64], order: &[u64]) {
    tollgate::<u64, _, _>(
        g,
        "tollgate",
        RateLimiter::<u64>::new(common::policy(FAST)),
        keys,
        order,
    );
    tollgate::<u64, _, _>(
        g,
        "tollgate_foldhash",
        RateLimiter::<u64, _, _>::with_hasher(
            common::policy(FAST),
            SystemClock::new(),
            foldhash::fast::RandomState::default(),
        ),
        keys,
        order,
    );
    {
        let governor = governor::RateLimiter::<u64, _, _>::keyed(common::governor_fast());
        keys.iter()
            .for_each(|k| assert!(governor.check_key(k).is_ok()));
        let mut walk = Cycle::new(order, 0);
        g.bench_function("governor", |b| {
            b.iter(|| black_box(governor.check_key(walk.next())).is_ok())
        });
    }
    {
        let parking_lot = LockedKeyed::<u64, PlMutex<_>>::new(FAST_PERMITS, FAST_WINDOW_NANOS);
        keys.iter()
            .for_each(|k| assert!(parking_lot.check(k).allowed));
        let mut walk = Cycle::new(order, 0);
        g.bench_function("parking_lot", |b| {
            b.iter(|| black_box(parking_lot.check(walk.next())).allowed)
        });
    }
    {
        let mutex_fast = MutexFast::<u64>::new(FAST_PERMITS, FAST_WINDOW_NANOS);
        keys.iter()
            .for_each(|k| assert!(mutex_fast.check(k).allowed));
        let mut walk = Cycle::new(order, 0);
        g.bench_function("mutex_fast", |b| {
            b.iter(|| black_box(mutex_fast.check(walk.next())).allowed)
        });
    }
}

fn string_keys(g: &mut Group<'_>, keys: &[String], order: &[&str], order_owned: &[&String]) {
    tollgate::<str, _, _>(
        g,
        "tollgate",
        RateLimiter::<String>::new(common::policy(FAST)),
        keys,
        order,
    );
    // The same strings as tollgate's `InlineKey`: compared inside the entry, with no heap
    // block to follow.
    tollgate::<str, _, _>(
        g,
        "tollgate_inline_key",
        RateLimiter::<InlineKey>::new(common::policy(FAST)),
        keys,
        order,
    );
    tollgate::<str, _, _>(
        g,
        "tollgate_foldhash",
        RateLimiter::<String, _, _>::with_hasher(
            common::policy(FAST),
            SystemClock::new(),
            foldhash::fast::RandomState::default(),
        ),
        keys,
        order,
    );
    {
        let governor = governor::RateLimiter::<String, _, _>::keyed(common::governor_fast());
        keys.iter()
            .for_each(|k| assert!(governor.check_key(k).is_ok()));
        let mut walk = Cycle::new(order_owned, 0);
        g.bench_function("governor", |b| {
            b.iter(|| black_box(governor.check_key(walk.next())).is_ok())
        });
    }
    {
        let parking_lot = LockedKeyed::<String, PlMutex<_>>::new(FAST_PERMITS, FAST_WINDOW_NANOS);
        keys.iter()
            .for_each(|k| assert!(parking_lot.check(k.as_str()).allowed));
        let mut walk = Cycle::new(order, 0);
        g.bench_function("parking_lot", |b| {
            b.iter(|| black_box(parking_lot.check(*walk.next())).allowed)
        });
    }
    {
        let mutex_fast = MutexFast::<String>::new(FAST_PERMITS, FAST_WINDOW_NANOS);
        keys.iter()
            .for_each(|k| assert!(mutex_fast.check(k.as_str()).allowed));
        let mut walk = Cycle::new(order, 0);
        g.bench_function("mutex_fast", |b| {
            b.iter(|| black_box(mutex_fast.check(*walk.next())).allowed)
        });
    }
}
