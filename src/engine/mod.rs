//! The per-key state machines behind every limiter, private to the crate.
//!
//! Each algorithm is split in two, as `docs/ARCHITECTURE.md` explains: pure arithmetic
//! (snapshot, now, cost) -> (decision, new snapshot), and a cell that owns the atomic word(s)
//! and runs the compare-and-swap loop. The limiters above see only the state contract and
//! the dispatch.
//!
//! | module | holds |
//! |---|---|
//! | [`state`] | the contract every cell meets ([`RateState`](state::RateState)), the one [`Verdict`](state::Verdict), carrying permits across a policy change |
//! | [`dispatch`] | the one enumeration of the algorithms and the one choice of a state type from a policy |
//! | [`token_bucket`] | GCRA: arithmetic and the one-word cell |
//! | [`sliding_log`] | the sliding window log: arithmetic, the ring, the seqlocked cell |
//! | [`sliding_counter`] | the sliding window counter: arithmetic and the 128-bit cell |
//! | [`composite`] | several bands decided all-or-nothing behind one sequence word |
//! | [`any_state`] | a state of any algorithm beside its own parameters (a policy per key) |
//! | [`cells`] | where a table with lock-free readers keeps its states: a box each, or a slab reused in place |
//! | [`word`] | the retired value of every state word, and the one-word compare-and-swap loop |
//! | [`seqlock`] | the sequence word of the multi-word states |
//! | [`rebuilds`] | the count of a limiter's resets and policy changes, which keeps a refund off every state built after one |
//! | [`sync`] | the atomics, from `std` or from `loom` (`--cfg tollgate_loom`) |
//! | [`retry`] | how every loop that waits for another thread waits, and a debug-build bound on its retries |

pub(crate) mod any_state;
pub(crate) mod cells;
pub(crate) mod composite;
pub(crate) mod dispatch;
pub(crate) mod divide;
pub(crate) mod rebuilds;
pub(crate) mod retry;
pub(crate) mod seqlock;
pub(crate) mod sliding_counter;
pub(crate) mod sliding_log;
pub(crate) mod state;
pub(crate) mod stripes;
pub(crate) mod sync;
pub(crate) mod token_bucket;
pub(crate) mod word;
