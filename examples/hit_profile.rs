//! One contestant of the keyed hot path, called a fixed number of times, for a profiler:
//! instruction counts under callgrind and `perf stat` are steady where time is not, so they
//! show where a keyed hit's work goes (docs/BENCHMARKS.md, "Where a keyed hit goes").
//!
//! ```text
//! cargo build --release --example hit_profile
//! valgrind --tool=callgrind target/release/examples/hit_profile tollgate 1000000
//! perf stat -e instructions,cycles target/release/examples/hit_profile mutex_fast 10000000
//! ```
//!
//! Contestants: `tollgate` (a `RateLimiter<u64>`, one hot key), `tollgate_str` and
//! `mutex_fast_str` (`hot_path`'s hot `String` key, looked up by `&str`), `direct` (a
//! `DirectLimiter`),
//! `all_of` and `three_calls` (the criterion `all_of` group's two: three hot parts in one
//! `AllOf`, and the same three decided one after another),
//! `mutex_fast` (the same GCRA in a `parking_lot::Mutex<HashMap<u64, u64>>` with foldhash:
//! benches/limiters/baseline.rs), `floor` (a clock read, a load and a compare-and-swap) and
//! `clock` (a clock read alone). `tollgate_many` and `mutex_fast_many` decide on 100,000
//! `u64` keys in `hot_path`'s shuffled order, each tracked before the calls counted (pass
//! `--cache-sim=yes` to callgrind for the cache misses). Each call goes through a function
//! that is never inlined.

use std::hint::black_box;

use tollgate::{AllOf, Clock, Decision, DirectLimiter, RateLimiter, SystemClock};

#[path = "../benches/limiters/baseline.rs"]
#[allow(dead_code)]
mod baseline;

use baseline::{Floor, MutexFast, Verdict};

// The benchmarks' order of many keys.
#[path = "../benches/limiters/order.rs"]
mod order;

#[inline(never)]
fn keyed(l: &RateLimiter<u64>, k: &u64) -> Decision {
    l.try_acquire(k)
}

#[inline(never)]
fn keyed_str(l: &RateLimiter<String>, k: &str) -> Decision {
    l.try_acquire(k)
}

#[inline(never)]
fn direct(l: &DirectLimiter) -> Decision {
    l.try_acquire()
}

/// The `all_of` benchmark's three parts: a user's key, a budget of tokens at a cost of 100
/// and a global direct limiter.
struct Three {
    users: RateLimiter<u64>,
    tokens: RateLimiter<u64>,
    global: DirectLimiter,
}

#[inline(never)]
fn all_of(t: &Three, k: &u64) -> bool {
    AllOf::new()
        .key(&t.users, k)
        .key_n(&t.tokens, k, 100)
        .direct(&t.global)
        .try_acquire()
        .is_allowed()
}

#[inline(never)]
fn three_calls(t: &Three, k: &u64) -> bool {
    t.users.try_acquire(k).is_allowed()
        & t.tokens.try_acquire_n(k, 100).is_ok_and(|d| d.is_allowed())
        & t.global.try_acquire().is_allowed()
}

#[inline(never)]
fn mutex_fast(l: &MutexFast<u64>, k: &u64) -> Verdict {
    l.check(k)
}

#[inline(never)]
fn mutex_fast_str(l: &MutexFast<String>, k: &str) -> Verdict {
    l.check(k)
}

#[inline(never)]
fn floor(f: &Floor) -> bool {
    f.check()
}

#[inline(never)]
fn clock(c: &SystemClock) -> u64 {
    c.now()
}

/// `hot_path`'s 100,000 keys in its order (the same shuffle, the same seed).
fn many_keys() -> Vec<u64> {
    order::shuffled(100_000, 0x5eed)
        .into_iter()
        .map(|i| i as u64)
        .collect()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let which = args.next().unwrap_or_else(|| "tollgate".into());
    let calls: u64 = args.next().map_or(1_000_000, |n| n.parse().expect("calls"));
    // A policy that never refuses in the run, so every call is an admission.
    let (permits, window_nanos) = (1_000_000_000_u64, 1_000_000_000_u64);
    let policy = format!("{permits}/1s").parse().expect("policy");
    let key = 42_u64;
    match which.as_str() {
        "tollgate" => {
            let l: RateLimiter<u64> = RateLimiter::new(policy);
            for _ in 0..calls {
                let _ = black_box(keyed(black_box(&l), black_box(&key)));
            }
        }
        "tollgate_str" => {
            let l: RateLimiter<String> = RateLimiter::new(policy);
            let key = String::from("user-000042");
            for _ in 0..calls {
                let _ = black_box(keyed_str(black_box(&l), black_box(key.as_str())));
            }
        }
        "mutex_fast_str" => {
            let l: MutexFast<String> = MutexFast::new(permits, window_nanos);
            let key = String::from("user-000042");
            for _ in 0..calls {
                black_box(mutex_fast_str(black_box(&l), black_box(key.as_str())));
            }
        }
        "direct" => {
            let l = DirectLimiter::new(policy);
            for _ in 0..calls {
                let _ = black_box(direct(black_box(&l)));
            }
        }
        "all_of" | "three_calls" => {
            let t = Three {
                users: RateLimiter::new(policy),
                // As the benchmark's: 10^12 tokens at once, never exhausted at a cost of 100.
                tokens: RateLimiter::new(
                    "token-bucket 1000000000000/1000s".parse().expect("policy"),
                ),
                global: DirectLimiter::new(policy),
            };
            let decide = if which == "all_of" { all_of } else { three_calls };
            for _ in 0..calls {
                black_box(decide(black_box(&t), black_box(&key)));
            }
        }
        "tollgate_many" => {
            // No sweep: under callgrind a pass over the keys outlasts the policy's window,
            // and the sweep would remove keys at rest, so the calls would create them again.
            let l: RateLimiter<u64> = RateLimiter::new(policy).sweep_per_insert(0);
            let keys = many_keys();
            for key in &keys {
                let _ = black_box(keyed(&l, key));
            }
            for i in 0..calls {
                let _ = black_box(keyed(black_box(&l), &keys[i as usize % keys.len()]));
            }
        }
        "mutex_fast_many" => {
            let l: MutexFast<u64> = MutexFast::new(permits, window_nanos);
            let keys = many_keys();
            for key in &keys {
                black_box(mutex_fast(&l, key));
            }
            for i in 0..calls {
                black_box(mutex_fast(black_box(&l), &keys[i as usize % keys.len()]));
            }
        }
        "mutex_fast" => {
            let l: MutexFast<u64> = MutexFast::new(permits, window_nanos);
            for _ in 0..calls {
                black_box(mutex_fast(black_box(&l), black_box(&key)));
            }
        }
        "floor" => {
            let f = Floor::new();
            for _ in 0..calls {
                black_box(floor(black_box(&f)));
            }
        }
        "clock" => {
            let c = SystemClock::new();
            for _ in 0..calls {
                black_box(clock(black_box(&c)));
            }
        }
        other => panic!("unknown contestant {other}: tollgate, tollgate_str, direct, all_of, three_calls, tollgate_many, mutex_fast_many, mutex_fast, mutex_fast_str, floor, clock"),
    }
}
