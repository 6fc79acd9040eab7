//! tollgate's benchmarks: one criterion entry, one module per scenario, tollgate next to its
//! peers in every group so that reports compare side by side.
//!
//! ```text
//! cargo bench --bench limiters                 # everything (under 10 minutes on 2 cores)
//! cargo bench --bench limiters -- keyed_hot    # one scenario (a regex on the ids)
//! cargo bench --bench limiters -- --quick      # a fast, rough pass while iterating
//! python3 scripts/bench-report.py              # medians and ratios to governor, chart
//! ```
//!
//! | module | groups |
//! |---|---|
//! | `direct` | `direct`, `direct_denied` |
//! | `keyed_hot` | `keyed_hot_u64`, `keyed_hot_str` |
//! | `keyed_many` | `keyed_many_{u64_100k,u64_1m}_{seq,random}`, `keyed_many_string_100k_random` |
//! | `threads` | `threads_direct`, `threads_one_key`, `threads_many_keys` (1, 2, 4, 8 threads) |
//! | `algorithms` | `algorithms_direct`, `algorithms_keyed_hot` |
//! | `evict` | `evict_1m` |
//! | `cached_clock` | `cached_clock_direct`, `cached_clock_keyed_hot_str`: both on their opt-in cached clocks |
//! | `primitives` | `primitives`, `maps_hot_u64`, `maps_random_u64_100k`: the parts, timed alone |
//! | `all_of` | `all_of`: three hot parts in one `AllOf`, beside three calls |
//!
//! Contestant names are the same everywhere: `tollgate`, `tollgate_foldhash`, `governor`,
//! `std_mutex`, `parking_lot` (the same GCRA behind a lock, keyed ones in a SipHash
//! `HashMap`, in `baseline`), `mutex_fast` (in `keyed_hot`, `keyed_many` and `threads`: the
//! version a user would write by hand, `parking_lot::Mutex<HashMap>` with foldhash), `floor`
//! (one clock read, one load, one compare-and-swap). See docs/BENCHMARKS.md for the results.

mod algorithms;
mod all_of;
mod baseline;
mod cached_clock;
mod common;
mod direct;
mod evict;
mod keyed_hot;
mod keyed_many;
mod order;
mod primitives;
mod threads;

criterion::criterion_group!(
    limiters,
    direct::bench,
    keyed_hot::bench,
    keyed_many::bench,
    threads::bench,
    algorithms::bench,
    evict::bench,
    cached_clock::bench,
    primitives::bench,
    all_of::bench
);
criterion::criterion_main!(limiters);
