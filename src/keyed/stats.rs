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
    /// Counts a decision and applies shadow mode. Out of line: a limiter with neither
    /// extra never runs it.
    #[inline(never)]
    pub(super) fn finish(&self, decision: Decision) -> Decision {
        if let Some(counters) = &self.counters {
            counters.record(&decision);
        }
        if self.shadow {
            decision.shadowed()
        } else {
            decision
        }
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
