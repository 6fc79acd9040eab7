//! Loom models of every per-key state machine (`RUSTFLAGS="--cfg tollgate_loom"`): every
//! interleaving of two threads (three for the reuse of a slab's cell), up to
//! `LOOM_MAX_PREEMPTIONS` preemptions. One test binary, a module per family of models, the
//! shared cells and clock compiled once.
//!
//! ```text
//! LOOM_MAX_PREEMPTIONS=3 RUSTFLAGS="--cfg tollgate_loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test --release --test loom_models
//! ```

#![cfg(tollgate_loom)]

#[path = "../support/loom_cells.rs"]
mod support;

mod all_of;
mod carry;
mod composite;
mod concurrency;
mod gcra;
mod peek;
mod rebuild;
mod reuse;
mod settle;
mod stripes;
mod windowed;
