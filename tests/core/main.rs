//! The crate's behaviour through its public API: one test binary, a module per scenario, so
//! the shared reference models and race harnesses are compiled once.

#[path = "../models/mod.rs"]
mod models;
#[path = "../support/races.rs"]
mod support;

mod available;
mod bad_input;
mod composite;
mod concurrency;
mod key_cap;
mod login;
mod metrics_publish;
mod policies;
mod proptest_all_of;
mod proptest_composite;
mod proptest_gcra;
mod proptest_settle;
mod proptest_windowed;
mod races;
mod rebuilt_refunds;
mod reservation_guard;
mod reservations;
mod serde_config;
mod stats;
mod striping;
mod traces;
mod waiting;
