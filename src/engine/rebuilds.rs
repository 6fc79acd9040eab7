//! The count of a limiter's rebuilds (a `reset` that removed a state, a policy change), and the
//! one rule that keeps a reservation's refund off every state built after one.
//!
//! A rebuild counts itself in one word: [`Rebuilds::begin`], *before* it retires the state it
//! replaces, adds one to the rebuilds started (the high bits) and one to the rebuilds open
//! (the low bits); the [`Open`] it returns, dropped *after* the new state is published, takes
//! one from the rebuilds open. Rebuilds may overlap (two resets of different keys, a reset and
//! a policy change): the word says "none open" only when every one that began has ended. A
//! reservation remembers the word it read before it was decided; a refund reads the word
//! again *after* it has found the state it is about to write to, and gives nothing back
//! unless the two are equal and no rebuild was open:
//!
//! * made before a rebuild began: any state found once the old one could be gone was
//!   published after `begin`, so the refund reads a word with more rebuilds started;
//! * made while a rebuild was open: it may have been decided on either state, so it never
//!   refunds (it gives back less, never more);
//! * made when none was open, after some ended: every state those replaced was retired
//!   before they ended, so the reservation was decided on a state built after them, which is
//!   where its refund lands.
//!
//! A settle that found the old state and read the old word either writes before the
//! retirement (the refund lands where the permits were, and is forgotten with it) or meets
//! the state retired and looks again, reading the word again.

use crate::engine::sync::{AtomicU64, Ordering};

/// How many times a limiter has forgotten or rebuilt states: rebuilds started in the high bits,
/// rebuilds open (started, not yet ended) in the low [`Rebuilds::OPEN_BITS`].
#[derive(Debug)]
pub(crate) struct Rebuilds(AtomicU64);

/// A rebuild under way: ends it when dropped, on every exit (a panic included).
#[must_use = "the rebuild ends when this is dropped: hold it until the new state is published"]
pub(crate) struct Open<'a>(&'a Rebuilds);

impl Drop for Open<'_> {
    fn drop(&mut self) {
        // Release: a reservation that reads this word (Acquire) sees the old state retired.
        self.0 .0.fetch_sub(1, Ordering::Release);
    }
}

impl Rebuilds {
    /// The bits counting the rebuilds open: far more than can overlap (each holds a lock or
    /// runs on its own thread).
    const OPEN_BITS: u32 = 20;
    const OPEN: u64 = (1 << Self::OPEN_BITS) - 1;

    /// No rebuild yet.
    pub(crate) fn new() -> Self {
        Rebuilds(AtomicU64::new(0))
    }

    /// The word now: read when a reservation is made, before it is decided.
    #[inline]
    pub(crate) fn read(&self) -> u64 {
        // Acquire: pairs with the Release of `Open::drop`, so a reservation that reads an
        // ended rebuild's word decides after the old state's retirement and meets it retired.
        self.0.load(Ordering::Acquire)
    }

    /// Starts a rebuild: call it *before* retiring the state it replaces, and hold what it
    /// returns until the new state is published.
    pub(crate) fn begin(&self) -> Open<'_> {
        // Relaxed is enough for the rule: this write is sequenced before the retirement and
        // the publication that follow, which release (a bucket lock let go, a pointer swapped
        // with AcqRel); a settle that finds the new state acquired that release, so this write
        // happens before its `read`, which by coherence cannot return an older word. Release
        // costs nothing more on a cold path.
        self.0
            .fetch_add((1 << Self::OPEN_BITS) + 1, Ordering::Release);
        Open(self)
    }

    /// Runs `rebuild` as one rebuild, from [`Rebuilds::begin`] to the end of `rebuild`.
    pub(crate) fn around<R>(&self, rebuild: impl FnOnce() -> R) -> R {
        let _open = self.begin();
        rebuild()
    }

    /// Settles a reservation made under word `made`, holding `held` permits, at `actual`,
    /// on a state just found: `settle` runs unless the settle is a refund and the reservation
    /// may not have been decided on the state found (a rebuild began since `made`, or was
    /// open then); then nothing is given back and `Some(())` says it is done. A charge
    /// always runs: it reads no mark of the old state. `settle` returns `None` for a retired
    /// state: the caller looks the key up again and comes back here, reading the word again.
    #[inline]
    pub(crate) fn settle_unless_rebuilt(
        &self,
        made: u64,
        held: u64,
        actual: u64,
        settle: impl FnOnce() -> Option<()>,
    ) -> Option<()> {
        if actual < held && (made & Self::OPEN != 0 || self.read() != made) {
            return Some(());
        }
        settle()
    }
}

#[cfg(all(test, not(tollgate_loom)))]
mod tests {
    use super::Rebuilds;

    /// Whether a refund of a reservation made under `made` is given back now.
    fn refunds(rebuilds: &Rebuilds, made: u64) -> bool {
        let mut given = false;
        let _ = rebuilds.settle_unless_rebuilt(made, 2, 0, || {
            given = true;
            Some(())
        });
        given
    }

    #[test]
    fn no_refund_while_any_of_several_overlapping_rebuilds_is_open() {
        let rebuilds = Rebuilds::new();
        let before = rebuilds.read();
        assert!(refunds(&rebuilds, before));
        let first = rebuilds.begin();
        let during_one = rebuilds.read();
        let second = rebuilds.begin();
        // Two open: a reservation made now may be decided on either side of either.
        let during_two = rebuilds.read();
        assert!(!refunds(&rebuilds, during_two));
        drop(first);
        // One still open: the word a reservation reads now is not "none open" either.
        let during_second = rebuilds.read();
        assert!(!refunds(&rebuilds, during_second));
        drop(second);
        let after = rebuilds.read();
        assert!(refunds(&rebuilds, after));
        for made in [before, during_one, during_two, during_second] {
            assert!(!refunds(&rebuilds, made), "made {made:#x}, now {after:#x}");
        }
        // A charge always lands.
        let mut charged = false;
        let _ = rebuilds.settle_unless_rebuilt(during_two, 2, 5, || {
            charged = true;
            Some(())
        });
        assert!(charged);
    }
}
