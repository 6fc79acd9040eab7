//! Decision counters and shadow mode.

use crate::decision::Decision;
use crate::stats::{Counters, Stats};

/// What a limiter does with each decision beyond deciding it, when asked to: count it, let
/// refusals through (shadow mode). Kept behind one pointer, so the hot path of a limiter
/// with neither tests one word.
#[derive(Default)]
pub(super) struct Extras {
    pub(super) counters: Option<Counters>,
    pub(super) shadow: bool,
}

impl Extras {
    /// Counts `decision`: whether shadow mode lets it through. Out of line, and given the
    /// decision by reference and answering one bit, so that the hot path of a limiter with
    /// neither extra keeps its decision in registers (returned whole from here, it would be
    /// merged with that path's through memory, and read back past store forwarding).
    #[inline(never)]
    pub(super) fn count(&self, decision: &Decision) -> bool {
        if let Some(counters) = &self.counters {
            counters.record(decision);
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
