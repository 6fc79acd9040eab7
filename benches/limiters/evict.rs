//! `evict`: one sweep over 1,000,000 keys that are all at rest, removing every one.
//!
//! Each timed iteration is preceded (untimed) by a refill: the fake clock moves on, all keys
//! are requested once (a TAT 100 ms ahead), then the clock moves 2 s further so that every
//! state is at rest. Only the sweep itself is timed: tollgate's `evict_idle` (scc
//! `retain_sync`, which retires each state by CAS under the bucket's exclusive lock) next to
//! governor's `retain_recent` (DashMap `retain`, shard by shard).

use std::hint::black_box;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode};
use tollgate::{FakeClock, RateLimiter};

use crate::common;

const KEYS: u64 = 1_000_000;
const REST: Duration = Duration::from_secs(2);

pub fn bench(c: &mut Criterion) {
    let mut g = common::slow_group(c, "evict_1m", 10);
    g.sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_secs(1));

    let clock = FakeClock::new();
    let tollgate: RateLimiter<u64, FakeClock> =
        RateLimiter::with_clock(common::policy("token-bucket 10/1s"), clock.clone());
    g.bench_function("tollgate", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                clock.advance(REST);
                for k in 0..KEYS {
                    assert!(tollgate.try_acquire(&k).is_allowed());
                }
                clock.advance(REST);
                let start = Instant::now();
                let removed = black_box(tollgate.evict_idle());
                timed += start.elapsed();
                assert_eq!(removed, KEYS as usize);
            }
            timed
        })
    });
    drop(tollgate);

    let clock = governor::clock::FakeRelativeClock::default();
    let governor = governor::RateLimiter::<u64, _, _, _>::dashmap_with_clock(
        governor::Quota::per_second(NonZeroU32::new(10).expect("non-zero")),
        clock.clone(),
    );
    g.bench_function("governor", |b| {
        b.iter_custom(|iters| {
            let mut timed = Duration::ZERO;
            for _ in 0..iters {
                clock.advance(REST);
                for k in 0..KEYS {
                    assert!(governor.check_key(&k).is_ok());
                }
                clock.advance(REST);
                let start = Instant::now();
                governor.retain_recent();
                timed += start.elapsed();
                assert!(governor.is_empty());
            }
            timed
        })
    });
    g.finish();
}
