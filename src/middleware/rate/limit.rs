//! [`Limit`]: one more limiter deciding a route's requests together with the route's own,
//! all or nothing ([`RateLimitLayer::and`](super::RateLimitLayer::and)).

use std::fmt;
use std::sync::Arc;

use http::response;

use super::route::Terms;
use crate::middleware::backend::Backend;
use crate::middleware::error::ConfigError;
use crate::middleware::key::{KeyExtractor, RequestHead};

/// A limiter and how it keys, costs, names and settles requests, added to a route (or to the
/// layer's default rule) by [`RateLimitLayer::and`](super::RateLimitLayer::and): the route's
/// requests are then decided by every one of its limiters at once, all or nothing.
///
/// Its settings are those of a [`Route`](super::Route), with the same defaults (the layer's
/// key extractor and name, a cost of 1) and the same rules.
///
/// # Examples
///
/// ```
/// use tollgate::middleware::{ClientIp, GlobalKey, HeaderKey, Limit, LimitKey, RateLimitLayer};
/// use tollgate::RateLimiter;
///
/// let per_user: RateLimiter<LimitKey> = RateLimiter::new("100/min".parse()?);
/// let per_ip: RateLimiter<LimitKey> = RateLimiter::new("300/min".parse()?);
/// let global: RateLimiter<LimitKey> = RateLimiter::new("5000/s".parse()?);
/// let layer = RateLimitLayer::new(per_user)
///     .key(HeaderKey::bearer())
///     .policy_name("per-user")?
///     .and(Limit::new(per_ip).key(ClientIp::trusted_hops(1)).name("per-ip")?)?
///     .and(Limit::new(global).key(GlobalKey).name("global")?)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Limit {
    pub(super) backend: Backend,
    pub(super) terms: Terms,
}

impl Limit {
    /// `limiter` (see [`Backend`]), with the layer's key extractor and name and a cost of 1.
    #[must_use]
    pub fn new(limiter: impl Into<Backend>) -> Self {
        Limit {
            backend: limiter.into(),
            terms: Terms::default(),
        }
    }

    /// Names this limit's policy in the `RateLimit-Policy` field and in refusals, as
    /// [`Route::name`](super::Route::name).
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidPolicyName`] unless `name` is non-empty printable ASCII.
    pub fn name(mut self, name: &str) -> Result<Self, ConfigError> {
        self.terms.name(name)?;
        Ok(self)
    }

    /// Takes this limit's keys with `extractor` instead of the layer's, as
    /// [`Route::key`](super::Route::key).
    #[must_use]
    pub fn key(mut self, extractor: impl KeyExtractor) -> Self {
        self.terms.extractor = Some(Arc::new(extractor));
        self
    }

    /// Makes each request spend `permits` of this limit, as [`Route::cost`](super::Route::cost).
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidCost`] for 0.
    pub fn cost(mut self, permits: u64) -> Result<Self, ConfigError> {
        self.terms.cost(permits)?;
        Ok(self)
    }

    /// Makes each request spend what `cost` computes from its head, as
    /// [`Route::cost_with`](super::Route::cost_with).
    #[must_use]
    pub fn cost_with(
        mut self,
        cost: impl Fn(&RequestHead<'_>) -> u64 + Send + Sync + 'static,
    ) -> Self {
        self.terms.cost_with = Some(Arc::new(cost));
        self
    }

    /// Reserves each request's cost and settles it at what the response says, as
    /// [`Route::settle_with`](super::Route::settle_with).
    #[must_use]
    pub fn settle_with(
        mut self,
        actual: impl Fn(&response::Parts) -> Option<u64> + Send + Sync + 'static,
    ) -> Self {
        self.terms.settle = Some(Arc::new(actual));
        self
    }
}

impl fmt::Debug for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Limit")
            .field("backend", &self.backend)
            .field("terms", &self.terms)
            .finish()
    }
}
