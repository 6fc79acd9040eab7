//! `algorithms`: the three state machines on the allowed path, as a `DirectLimiter` and as
//! one hot `u64` key of a keyed limiter, with governor's GCRA as the common yardstick.
//!
//! Policies are chosen so that every decision is admitted and the state is in its steady
//! shape: the token bucket at one permit per ns; the sliding log with N = 100 over a 1 us
//! window (a decision takes tens of ns, so the ring holds some tens of live entries and
//! each decision binary-searches it, then writes one entry under its sequence word); the
//! sliding counter at 10^9 per second (its 128-bit word is updated by a 16-byte CAS).

use std::hint::black_box;

use criterion::Criterion;
use tollgate::{DirectLimiter, RateLimiter};

use crate::common;

const POLICIES: [(&str, &str); 3] = [
    ("tollgate_token_bucket", "token-bucket 1000000000/1s"),
    ("tollgate_sliding_log_100", "sliding-log 100/1us"),
    ("tollgate_sliding_counter", "sliding-counter 1000000000/1s"),
];

pub fn bench(c: &mut Criterion) {
    let mut g = common::group(c, "algorithms_direct");
    for (name, text) in POLICIES {
        let limiter = DirectLimiter::new(common::policy(text));
        g.bench_function(name, |b| {
            b.iter(|| black_box(limiter.try_acquire()).is_allowed())
        });
    }
    let governor = governor::RateLimiter::direct(common::governor_fast());
    g.bench_function("governor", |b| {
        b.iter(|| black_box(governor.check()).is_ok())
    });
    g.finish();

    let key = 0x5eed_u64;
    let mut g = common::group(c, "algorithms_keyed_hot");
    for (name, text) in POLICIES {
        let limiter: RateLimiter<u64> = RateLimiter::new(common::policy(text));
        g.bench_function(name, |b| {
            b.iter(|| black_box(limiter.try_acquire(black_box(&key))).is_allowed())
        });
    }
    let governor = governor::RateLimiter::<u64, _, _>::keyed(common::governor_fast());
    g.bench_function("governor", |b| {
        b.iter(|| black_box(governor.check_key(black_box(&key))).is_ok())
    });
    g.finish();
}
