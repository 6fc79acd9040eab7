//! The count of a limiter's rebuilds (a `reset` that removed a state, a policy change), and the
//! one rule that keeps a reservation's refund off every state built after one.
//!
//! A rebuild counts itself twice: [`Rebuilds::begin`] makes the count odd *before* it retires
//! the state it replaces, [`Rebuilds::end`] makes it even again *after* the new state is
//! published. A reservation remembers the count it read before it was decided; a refund
//! reads the count again *after* it has found the state it is about to write to, and gives
//! nothing back unless the two are equal and even:
//!
//! * made before a rebuild began (even `e`): any state found once the old one could be gone
//!   was published after `begin`, so the refund reads at least `e + 1`;
//! * made while a rebuild was under way (odd): it may have been decided on either state, so
//!   it never refunds (it gives back less, never more);
//! * made after a rebuild ended (`e + 2`): the old state was retired before `end`, so the
//!   reservation was decided on a state built after the rebuild, which is where its refund
//!   lands.
//!
//! A settle that found the old state and read the old count either writes before the
//! retirement (the refund lands where the permits were, and is forgotten with it) or meets
//! the state retired and looks again, reading the count again.

use crate::engine::sync::{AtomicU64, Ordering};

/// How many times a limiter has forgotten or rebuilt states, counted twice per rebuild (odd
/// while one is under way).
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
        // Acquire: pairs with the Release of `end`, so a reservation that reads an ended
        // rebuild's count decides after the old state's retirement and meets it retired.
        self.0.load(Ordering::Acquire)
    }

    /// Starts a rebuild: call it *before* retiring the state it replaces.
    pub(crate) fn begin(&self) {
        // Relaxed is enough for the rule: this write is sequenced before the retirement and
        // the publication that follow, which release (a bucket lock let go, a pointer swapped
        // with AcqRel); a settle that finds the new state acquired that release, so this write
        // happens before its `read`, which by coherence cannot return an older count. Release
        // costs nothing more on a cold path, and keeps the count's own readers simple.
        self.0.fetch_add(1, Ordering::Release);
    }

    /// Ends a rebuild: call it *after* the old state is retired and the new one published.
    pub(crate) fn end(&self) {
        // Release: a reservation that reads this count (Acquire) sees the old state retired.
        self.0.fetch_add(1, Ordering::Release);
    }

    /// Runs `rebuild` between [`Rebuilds::begin`] and [`Rebuilds::end`]: the guard that keeps
    /// the two paired on every exit.
    pub(crate) fn around<R>(&self, rebuild: impl FnOnce() -> R) -> R {
        struct End<'a>(&'a Rebuilds);
        impl Drop for End<'_> {
            fn drop(&mut self) {
                self.0.end();
            }
        }
        self.begin();
        let _end = End(self);
        rebuild()
    }

    /// Settles a reservation made under count `made`, holding `held` permits, at `actual`,
    /// on a state just found: `settle` runs unless the settle is a refund and the reservation
    /// may not have been decided on the state found (a rebuild came in since `made`, or was
    /// under way then); then nothing is given back and `Some(())` says it is done. A charge
    /// always runs: it reads no mark of the old state. `settle` returns `None` for a retired
    /// state: the caller looks the key up again and comes back here, reading the count again.
    #[inline]
    pub(crate) fn settle_unless_rebuilt(
        &self,
        made: u64,
        held: u64,
        actual: u64,
        settle: impl FnOnce() -> Option<()>,
    ) -> Option<()> {
        if actual < held && (made % 2 == 1 || self.read() != made) {
            return Some(());
        }
        settle()
    }
}
