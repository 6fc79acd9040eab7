//! What a generation enforces: one policy for every key, or a resolver that picks each key's.

use std::sync::Arc;

use crate::policy::Policy;

/// How a limiter built with [`RateLimiter::with_resolver`](super::RateLimiter::with_resolver)
/// chooses each key's policy.
pub(super) type Resolver<K> = dyn Fn(&K) -> Policy + Send + Sync;

/// The rules of one generation.
pub(super) enum Rules<K> {
    Uniform(Policy),
    PerKey(Arc<Resolver<K>>),
}

/// A resolver's answer for one key, with the resolver that gave it.
pub(super) struct Resolved<K> {
    pub(super) resolver: Arc<Resolver<K>>,
    pub(super) policy: Policy,
}

impl<K> Rules<K> {
    /// How long a state must have been at rest before the routine sweep removes it: the
    /// longest band window of a uniform policy, so a key used now and then is not removed
    /// and re-created over and over; a minute for per-key policies, whose windows vary.
    pub(super) fn sweep_grace(&self) -> u64 {
        match self {
            Rules::Uniform(policy) => policy
                .bands()
                .map(|band| band.window().as_nanos() as u64)
                .max()
                .unwrap_or(0),
            Rules::PerKey(_) => 60_000_000_000,
        }
    }
}
