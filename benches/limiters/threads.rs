//! `threads`: 1, 2, 4 and 8 threads deciding at once (the machine the numbers in
//! docs/BENCHMARKS.md come from has 2 cores, so 4 and 8 threads measure oversubscription:
//! threads preempted while they hold a lock or between a load and its compare-and-swap).
//!
//! Convention: each sample spawns `T` threads that wait on a barrier, then each makes
//! `iters` decisions. The wall time from the first thread's start to the last thread's end
//! is returned divided by `T`, so criterion (which divides by `iters`) reports **nanoseconds
//! per decision of aggregate throughput**: `1000 / value` is millions of decisions per second
//! for all threads together. Thread creation is outside the timed span.
//!
//! Groups: `threads_direct` (every thread on one `DirectLimiter`: tollgate as it is, which
//! stripes the contended key over per-core leases; tollgate with `striping(false)`, one word;
//! governor's direct limiter; the same GCRA behind `parking_lot::Mutex`),
//! `threads_one_key` (every thread on one `u64` key: the key's state word and its
//! map bucket are shared by all; tollgate as it is, which stripes the contended key, and with
//! `striping(false)`) and `threads_many_keys` (100,000 `u64` keys pre-inserted,
//! each thread walking the same shuffled order from its own offset). The value in each
//! benchmark id is the thread count. Contestants: tollgate (default hasher), governor keyed,
//! the hand-written mutex version with a fast hash (`mutex_fast`: the same GCRA in one
//! `HashMap` with foldhash behind `parking_lot::Mutex`), and, on one key, the same with
//! SipHash (`parking_lot`).

use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion};
use tollgate::{DirectLimiter, RateLimiter};

use crate::baseline::{LockedDirect, LockedKeyed, MutexFast, PlMutex};
use crate::common::{self, Cycle, FAST, FAST_PERMITS, FAST_WINDOW_NANOS};

const THREADS: [usize; 4] = [1, 2, 4, 8];
const MANY: usize = 100_000;

/// Runs `work(thread, iters)` on `threads` threads started together; returns the wall time
/// of the whole run divided by `threads` (see the module docs).
fn run<F>(threads: usize, iters: u64, work: F) -> Duration
where
    F: Fn(usize, u64) + Sync,
{
    let barrier = Barrier::new(threads);
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, work) = (&barrier, &work);
                s.spawn(move || {
                    barrier.wait();
                    let start = Instant::now();
                    work(t, iters);
                    (start, Instant::now())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread panicked"))
            .collect()
    });
    let start = spans
        .iter()
        .map(|s| s.0)
        .min()
        .expect("one thread at least");
    let end = spans
        .iter()
        .map(|s| s.1)
        .max()
        .expect("one thread at least");
    (end - start) / u32::try_from(threads).expect("few threads")
}

pub fn bench(c: &mut Criterion) {
    direct(c);
    one_key(c);
    many_keys(c);
}

fn direct(c: &mut Criterion) {
    let mut g = common::slow_group(c, "threads_direct", 30);
    for threads in THREADS {
        for (name, striping) in [("tollgate", true), ("tollgate_one_word", false)] {
            let tollgate = DirectLimiter::new(common::policy(FAST)).striping(striping);
            g.bench_function(BenchmarkId::new(name, threads), |b| {
                b.iter_custom(|iters| {
                    run(threads, iters, |_, iters| {
                        for _ in 0..iters {
                            black_box(tollgate.try_acquire().is_allowed());
                        }
                    })
                })
            });
        }

        let governor = governor::RateLimiter::direct(common::governor_fast());
        g.bench_function(BenchmarkId::new("governor", threads), |b| {
            b.iter_custom(|iters| {
                run(threads, iters, |_, iters| {
                    for _ in 0..iters {
                        black_box(governor.check().is_ok());
                    }
                })
            })
        });

        let parking_lot = LockedDirect::<PlMutex<u64>>::new(FAST_PERMITS, FAST_WINDOW_NANOS);
        g.bench_function(BenchmarkId::new("parking_lot", threads), |b| {
            b.iter_custom(|iters| {
                run(threads, iters, |_, iters| {
                    for _ in 0..iters {
                        black_box(parking_lot.check().allowed);
                    }
                })
            })
        });
    }
    g.finish();
}

fn one_key(c: &mut Criterion) {
    let key = 7_u64;
    let mut g = common::slow_group(c, "threads_one_key", 30);
    for threads in THREADS {
        for (name, striping) in [("tollgate", true), ("tollgate_one_word", false)] {
            let tollgate: RateLimiter<u64> =
                RateLimiter::new(common::policy(FAST)).striping(striping);
            g.bench_function(BenchmarkId::new(name, threads), |b| {
                b.iter_custom(|iters| {
                    run(threads, iters, |_, iters| {
                        for _ in 0..iters {
                            black_box(tollgate.try_acquire(&key).is_allowed());
                        }
                    })
                })
            });
        }

        let governor = governor::RateLimiter::<u64, _, _>::keyed(common::governor_fast());
        g.bench_function(BenchmarkId::new("governor", threads), |b| {
            b.iter_custom(|iters| {
                run(threads, iters, |_, iters| {
                    for _ in 0..iters {
                        black_box(governor.check_key(&key).is_ok());
                    }
                })
            })
        });

        let parking_lot = LockedKeyed::<u64, PlMutex<_>>::new(FAST_PERMITS, FAST_WINDOW_NANOS);
        g.bench_function(BenchmarkId::new("parking_lot", threads), |b| {
            b.iter_custom(|iters| {
                run(threads, iters, |_, iters| {
                    for _ in 0..iters {
                        black_box(parking_lot.check(&key).allowed);
                    }
                })
            })
        });

        let mutex_fast = MutexFast::<u64>::new(FAST_PERMITS, FAST_WINDOW_NANOS);
        g.bench_function(BenchmarkId::new("mutex_fast", threads), |b| {
            b.iter_custom(|iters| {
                run(threads, iters, |_, iters| {
                    for _ in 0..iters {
                        black_box(mutex_fast.check(&key).allowed);
                    }
                })
            })
        });
    }
    g.finish();
}

fn many_keys(c: &mut Criterion) {
    let order: Vec<u64> = common::shuffled(MANY, 0xFACE)
        .into_iter()
        .map(|i| i as u64)
        .collect();
    let tollgate: RateLimiter<u64> = RateLimiter::new(common::policy(FAST));
    let governor = governor::RateLimiter::<u64, _, _>::keyed(common::governor_fast());
    let mutex_fast = MutexFast::<u64>::new(FAST_PERMITS, FAST_WINDOW_NANOS);
    for k in 0..MANY as u64 {
        assert!(tollgate.try_acquire(&k).is_allowed());
        assert!(governor.check_key(&k).is_ok());
        assert!(mutex_fast.check(&k).allowed);
    }

    let mut g = common::slow_group(c, "threads_many_keys", 30);
    for threads in THREADS {
        g.bench_function(BenchmarkId::new("tollgate", threads), |b| {
            b.iter_custom(|iters| {
                run(threads, iters, |t, iters| {
                    let mut walk = Cycle::new(&order, t * MANY / threads);
                    for _ in 0..iters {
                        black_box(tollgate.try_acquire(walk.next()).is_allowed());
                    }
                })
            })
        });
        g.bench_function(BenchmarkId::new("governor", threads), |b| {
            b.iter_custom(|iters| {
                run(threads, iters, |t, iters| {
                    let mut walk = Cycle::new(&order, t * MANY / threads);
                    for _ in 0..iters {
                        black_box(governor.check_key(walk.next()).is_ok());
                    }
                })
            })
        });
        g.bench_function(BenchmarkId::new("mutex_fast", threads), |b| {
            b.iter_custom(|iters| {
                run(threads, iters, |t, iters| {
                    let mut walk = Cycle::new(&order, t * MANY / threads);
                    for _ in 0..iters {
                        black_box(mutex_fast.check(walk.next()).allowed);
                    }
                })
            })
        });
    }
    g.finish();
}
