//! Decision counters and shadow mode.

use crate::stats::{Counted, Counters, Stats};

/// What a limiter does with each decision beyond deciding it, when asked to: count it, let
/// refusals through (shadow mode). Kept behind one pointer, so the hot path of a limiter
/// with neither tests one word.
#[derive(Default)]
pub(super) struct Extras {
    pub(super) counters: Option<Counters>,
    pub(super) shadow: bool,
}

impl Extras {
    /// Counts a decision, given what the counters read of it: whether shadow mode lets it
    /// through. Out of line, given two bits and answering one, so that the hot path of a
    /// limiter with neither extra keeps its decision in registers: given the decision, by
    /// value or by reference, the caller would first copy it to memory, and read it back
    /// past store forwarding.
    #[inline(never)]
    pub(super) fn count(&self, counted: Counted) -> bool {
        if let Some(counters) = &self.counters {
            counters.record(counted);
        }
        self.shadow
    }

    /// What `extras` counted, with `keys` tracked now.
    pub(super) fn stats(extras: Option<&Extras>, keys: usize) -> Stats {
        match extras.and_then(|extras| extras.counters.as_ref()) {
            Some(counters) => counters.read(keys),
            None => Stats {
                keys,
                ..Stats::default()
            },
        }
    }
}
