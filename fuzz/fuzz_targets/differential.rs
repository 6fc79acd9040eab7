//! Arbitrary policies and sequences of (advance or set back the clock, acquire for a key at
//! a cost, evict) through the keyed and direct limiters, against the reference models of
//! `tests/models/mod.rs`: see `tollgate_fuzz::differential`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_fuzz::differential::{run, Input};

fuzz_target!(|input: Input| run(&input));
