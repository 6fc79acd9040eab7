//! The order in which the benchmarks, `examples/hot_path.rs` and `examples/hit_profile.rs`
//! visit many keys: one deterministic shuffle, so that the same case walks the same keys in
//! each of them.

/// A deterministic permutation of `0..n` (Fisher-Yates driven by splitmix64), so every run
/// and every contestant visits the keys in the same "random" order.
pub fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut state = seed;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut order: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = usize::try_from(next() % (i as u64 + 1)).expect("fits");
        order.swap(i, j);
    }
    order
}
