//! The contract every per-key state machine meets, so that the keyed registry and the direct
//! limiter are written once for all algorithms.
//!
//! A state machine is split in two, as `docs/ARCHITECTURE.md` explains: pure arithmetic
//! (snapshot, now, cost) -> (decision, new snapshot), and a cell that owns the atomic word(s)
//! and runs the compare-and-swap loop. This trait is the cell's side.

use crate::{Clock, Decision, Policy};

/// One key's state: created at rest, updated lock-free, retired exactly once by eviction.
pub(crate) trait RateState: Sized + Send + Sync {
    /// Everything the arithmetic needs from the policy, computed once per limiter.
    type Params: Copy + Send + Sync + std::fmt::Debug;

    /// Derives the parameters from a policy whose algorithm matches this state.
    fn params(policy: &Policy) -> Self::Params;

    /// A state at rest: it decides exactly as a key never seen before.
    fn fresh(params: &Self::Params) -> Self;

    /// Decides a request of `cost` permits (already checked to be within `1..=permits`),
    /// reading `clock` once per attempt.
    ///
    /// Returns `None` when the state has been retired by eviction: the caller must look the
    /// key up again (a retired state never admits anything, and is never revived in place).
    fn try_acquire<C: Clock + ?Sized>(
        &self,
        params: &Self::Params,
        clock: &C,
        cost: u64,
    ) -> Option<Decision>;

    /// What `try_acquire` would decide now, changing nothing: the decision is computed from a
    /// consistent snapshot and never written. `None` when the state has been retired.
    fn peek<C: Clock + ?Sized>(
        &self,
        params: &Self::Params,
        clock: &C,
        cost: u64,
    ) -> Option<Decision>;

    /// `true` when the state decides exactly as a fresh one from `now` on.
    fn is_at_rest(&self, params: &Self::Params, now: u64) -> bool;

    /// Atomically moves a state that is at rest at `now` to its retired value. Returns `true`
    /// when it did; from then on every `try_acquire` returns `None`. Returns `false` (and
    /// changes nothing) when the state is not at rest or a request changed it first.
    fn try_retire(&self, params: &Self::Params, now: u64) -> bool;
}
