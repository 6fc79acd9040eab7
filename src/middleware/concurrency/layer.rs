//! [`ConcurrencyLimitLayer`]: the builder of a concurrency limit, and the [`Layer`] that
//! wraps a service with it.

use std::fmt;
use std::hash::BuildHasher;
use std::sync::Arc;

use bytes::Bytes;
use http::Response;
use tower_layer::Layer;

use super::config::Config;
use super::service::ConcurrencyLimit;
use crate::concurrency::ConcurrencyLimiter;
#[cfg(doc)]
use crate::concurrency::Permit;
use crate::middleware::key::{KeyExtractor, LimitKey};
use crate::middleware::missing_key::{KeyTaker, MissingKey};
use crate::middleware::peer::PeerIp;
use crate::middleware::refusal::{Refusal, RefusalHandler};

/// A tower [`Layer`] capping how many requests of each key are in flight at once, from a
/// [`ConcurrencyLimiter<LimitKey>`]: a client may not hold more than its share of the
/// server's workers, however slowly it reads.
///
/// Each request is keyed by a [`KeyExtractor`] (the same ones as
/// [`RateLimitLayer`](crate::middleware::RateLimitLayer)'s; [`PeerIp`] unless set) and takes a
/// [`Permit`] before the inner service is called. The permit is held until the **response
/// body** has ended (its last frame read, or an error) or been dropped (the client went
/// away), not merely until the handler returns: a streamed download is in flight as long as
/// it streams. If the inner service fails or its future is dropped, the permit goes with it.
///
/// * **At the limit**: `429 Too Many Requests` at once, with an `application/problem+json`
///   body naming the limit (gRPC requests: `grpc-status: 8`, `RESOURCE_EXHAUSTED`). 429
///   rather than 503, because it is this client that has too much in flight, not the server
///   that is overloaded; there is no `Retry-After`, since nobody knows when a request in
///   flight will end. Requests are never queued. Your own answer:
///   [`on_refusal`](ConcurrencyLimitLayer::on_refusal).
/// * **No key**: answered as [`on_missing_key`](ConcurrencyLimitLayer::on_missing_key)
///   says (default `400 Bad Request`), as by the rate layer; no peer address at all is the
///   server's mistake: `500`, logged once ([`PeerIp`]).
///
/// Keep an `Arc` of the limiter to read `in_flight` or run `evict_idle`, and give it
/// `max_keys` so that clients inventing keys cannot grow memory without bound.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use axum::{routing::get, Router};
/// use tollgate::middleware::{ConcurrencyLimitLayer, LimitKey};
/// use tollgate::concurrency::ConcurrencyLimiter;
///
/// // At most 8 requests in flight per client address (the default key, `PeerIp`).
/// let limiter: Arc<ConcurrencyLimiter<LimitKey>> =
///     Arc::new(ConcurrencyLimiter::new(8).max_keys(100_000));
/// let layer = ConcurrencyLimitLayer::new(Arc::clone(&limiter));
/// let app: Router = Router::new().route("/", get(|| async { "ok" })).layer(layer);
/// ```
#[derive(Clone)]
pub struct ConcurrencyLimitLayer {
    config: Arc<Config>,
}

impl ConcurrencyLimitLayer {
    /// A layer limiting each key's requests in flight with `limiter`, keyed by [`PeerIp`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::middleware::ConcurrencyLimitLayer;
    /// use tollgate::concurrency::ConcurrencyLimiter;
    ///
    /// let layer = ConcurrencyLimitLayer::new(Arc::new(ConcurrencyLimiter::new(4)));
    /// ```
    #[must_use]
    pub fn new<S>(limiter: Arc<ConcurrencyLimiter<LimitKey, S>>) -> Self
    where
        S: BuildHasher + Send + Sync + 'static,
    {
        ConcurrencyLimitLayer {
            config: Arc::new(Config {
                limiter,
                extractor: Arc::new(PeerIp::new()),
                keys: KeyTaker::new(MissingKey::default()),
                grpc: true,
                on_refusal: RefusalHandler::default_response(),
            }),
        }
    }

    /// Takes keys with `extractor` (default [`PeerIp::new()`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::middleware::{ConcurrencyLimitLayer, HeaderKey};
    /// use tollgate::concurrency::ConcurrencyLimiter;
    ///
    /// let layer = ConcurrencyLimitLayer::new(Arc::new(ConcurrencyLimiter::new(4)))
    ///     .key(HeaderKey::bearer());
    /// ```
    #[must_use]
    pub fn key(mut self, extractor: impl KeyExtractor) -> Self {
        Arc::make_mut(&mut self.config).extractor = Arc::new(extractor);
        self
    }

    /// How to answer a request whose key cannot be extracted (default
    /// [`MissingKey::Reject`]`(400)`); [`MissingKey::Shared`] puts all such requests under
    /// one key, [`MissingKey::Allow`] lets them through without a permit.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::middleware::{ConcurrencyLimitLayer, MissingKey};
    /// use tollgate::concurrency::ConcurrencyLimiter;
    ///
    /// let layer = ConcurrencyLimitLayer::new(Arc::new(ConcurrencyLimiter::new(4)))
    ///     .on_missing_key(MissingKey::Shared);
    /// ```
    #[must_use]
    pub fn on_missing_key(mut self, answer: MissingKey) -> Self {
        Arc::make_mut(&mut self.config).keys.set_missing(answer);
        self
    }

    /// Answers requests refused at the limit with `handler` instead of the default
    /// ([`Refusal::default_response`]: `429` with a problem+json body), as
    /// [`RateLimitLayer::on_refusal`](crate::middleware::RateLimitLayer::on_refusal)
    /// describes. [`Refusal::limit`] is the number of requests a key may have in flight;
    /// [`Refusal::retry_after`] is `None`.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use http::{Response, StatusCode};
    /// use tollgate::middleware::{ConcurrencyLimitLayer, Refusal};
    /// use tollgate::concurrency::ConcurrencyLimiter;
    ///
    /// let layer = ConcurrencyLimitLayer::new(Arc::new(ConcurrencyLimiter::new(4)))
    ///     .on_refusal(|refusal: &Refusal| {
    ///         let mut busy = Response::new("one download at a time, please");
    ///         *busy.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    ///         busy
    ///     });
    /// ```
    #[must_use]
    pub fn on_refusal<F, T>(mut self, handler: F) -> Self
    where
        F: Fn(&Refusal) -> Response<T> + Send + Sync + 'static,
        T: Into<Bytes>,
    {
        Arc::make_mut(&mut self.config).on_refusal = RefusalHandler::custom(handler);
        self
    }

    /// Whether gRPC requests are refused the gRPC way (default `true`), as
    /// [`RateLimitLayer::grpc`](crate::middleware::RateLimitLayer::grpc) describes.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::middleware::ConcurrencyLimitLayer;
    /// use tollgate::concurrency::ConcurrencyLimiter;
    ///
    /// let layer = ConcurrencyLimitLayer::new(Arc::new(ConcurrencyLimiter::new(4))).grpc(false);
    /// ```
    #[must_use]
    pub fn grpc(mut self, detect: bool) -> Self {
        Arc::make_mut(&mut self.config).grpc = detect;
        self
    }
}

impl<S> Layer<S> for ConcurrencyLimitLayer {
    type Service = ConcurrencyLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ConcurrencyLimit::from_parts(inner, Arc::clone(&self.config))
    }
}

impl fmt::Debug for ConcurrencyLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimitLayer")
            .field("missing", &self.config.keys.missing())
            .field("grpc", &self.config.grpc)
            .finish_non_exhaustive()
    }
}
