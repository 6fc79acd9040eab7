//! The count of a limiter's rebuilds (a `reset` that removed a state, a policy change), and the
//! one rule that keeps a reservation's refund off every state built after one.
//!
//! A reservation remembers the count it was made under. A rebuild advances the count *before*
//! it retires the state it replaces, and a refund reads the count *after* it has found the
//! state it is about to write: so a settle that finds a state built after the rebuild (which
//! became reachable only after the retirement, and so after the advance) sees the new count
//! and gives nothing back, whatever the interleaving. A settle that found the old state and
//! read the old count either writes before the retirement (the refund lands where the
//! permits were, and is then forgotten with it) or meets the state retired and looks again.

use crate::engine::sync::{AtomicU64, Ordering};

/// How many times a limiter has forgotten or rebuilt states.
#[derive(Debug)]
pub(crate) struct Rebuilds(AtomicU64);

impl Rebuilds {
    /// No rebuild yet.
    pub(crate) fn new() -> Self {
        Rebuilds(AtomicU64::new(0))
    }

    /// The count now: read when a reservation is made, before it is decided.
    #[inline]
    pub(crate) fn read(&self) -> u64 {
        // Acquire: a reservation's count must not be newer than the state it is decided on;
        // pairs with the Release of `advance`. (What keeps a refund off a rebuilt state is
        // not this ordering but the one in `advance`: see there.)
        self.0.load(Ordering::Acquire)
    }

    /// Counts a rebuild. Call it *before* retiring the state it replaces: every path that
    /// makes the new state reachable (a table's bucket lock taken after the removal, a
    /// pointer published after the retirement) then carries the new count with it.
    pub(crate) fn advance(&self) {
        // Release, for readers of the count alone. The rule above needs no more from this
        // write: it is sequenced before the retirement and the publication that follow it,
        // which release (a bucket lock let go, a pointer swapped with AcqRel); a settle that
        // finds the new state acquired that release, so the write happens before its `read`,
        // which by coherence cannot return an older count.
        self.0.fetch_add(1, Ordering::Release);
    }

    /// Settles a reservation made under count `made`, holding `held` permits, at `actual`,
    /// on a state just found: `settle` runs unless the settle is a refund and a rebuild came
    /// in since `made`, in which case nothing is given back (the state found never held the
    /// reservation's permits) and `Some(())` says it is done. A charge always runs: it reads
    /// no mark of the old state. `settle` returns `None` for a retired state: the caller
    /// looks the key up again and comes back here, reading the count again.
    #[inline]
    pub(crate) fn settle_unless_rebuilt(
        &self,
        made: u64,
        held: u64,
        actual: u64,
        settle: impl FnOnce() -> Option<()>,
    ) -> Option<()> {
        if actual < held && self.read() != made {
            return Some(());
        }
        settle()
    }
}
