//! [`ConcurrencyLimitLayer`]: how many requests of each key may be in flight at once, each
//! holding its place until its response body has ended or been dropped.

use std::fmt;
use std::future::Future;
use std::hash::BuildHasher;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::body::RateLimitBody;
use super::future::ResponseFuture;
use super::headers::{self, Fields};
use super::key::{KeyExtractor, LimitKey, PeerIp, RequestHead};
use super::route::MissingKey;
use crate::concurrency::{AtCapacity, ConcurrencyLimiter, Permit};

/// A concurrency limiter as the layer sees it: any hasher.
trait Gate: Send + Sync {
    fn try_acquire(&self, key: &LimitKey) -> Result<Permit, AtCapacity>;
}

impl<S> Gate for ConcurrencyLimiter<LimitKey, S>
where
    S: BuildHasher + Send + Sync + 'static,
{
    fn try_acquire(&self, key: &LimitKey) -> Result<Permit, AtCapacity> {
        ConcurrencyLimiter::try_acquire(self, key)
    }
}

#[derive(Clone)]
struct Config {
    limiter: Arc<dyn Gate>,
    extractor: Arc<dyn KeyExtractor>,
    missing: MissingKey,
    grpc: bool,
}

impl Config {
    /// The permit `request` holds while in flight (`None`: unlimited, for a missing key
    /// under [`MissingKey::Allow`]), or the answer refusing it.
    #[allow(
        clippy::result_large_err,
        reason = "the answer is returned once per request and sent as is; boxing it would allocate"
    )]
    fn admit<B>(&self, request: &Request<B>) -> Result<Option<Permit>, Response<Bytes>> {
        let grpc = self.grpc && headers::is_grpc(request.headers());
        let Some(key) = self
            .missing
            .key(&*self.extractor, &RequestHead::new(request), grpc)?
        else {
            return Ok(None);
        };
        self.limiter.try_acquire(&key).map(Some).map_err(|full| {
            let detail = format!(
                "Concurrency limit exceeded: {} requests of this client already in flight",
                full.limit()
            );
            headers::error_response(StatusCode::TOO_MANY_REQUESTS, &detail, None, grpc)
        })
    }
}

/// A tower [`Layer`] capping how many requests of each key are in flight at once, from a
/// [`ConcurrencyLimiter<LimitKey>`]: a client may not hold more than its share of the
/// server's workers, however slowly it reads.
///
/// Each request is keyed by a [`KeyExtractor`] (the same ones as
/// [`RateLimitLayer`](super::RateLimitLayer)'s; [`PeerIp`] unless set) and takes a
/// [`Permit`] before the inner service is called. The permit is held until the **response
/// body** has ended (its last frame read, or an error) or been dropped (the client went
/// away), not merely until the handler returns: a streamed download is in flight as long as
/// it streams. If the inner service fails or its future is dropped, the permit goes with it.
///
/// * **At the limit**: `429 Too Many Requests` at once, with an `application/problem+json`
///   body naming the limit (gRPC requests: `grpc-status: 8`, `RESOURCE_EXHAUSTED`). 429
///   rather than 503, because it is this client that has too much in flight, not the server
///   that is overloaded; there is no `Retry-After`, since nobody knows when a request in
///   flight will end. Requests are never queued.
/// * **No key**: answered as [`on_missing_key`](ConcurrencyLimitLayer::on_missing_key)
///   says (default `400 Bad Request`), as by the rate layer.
///
/// Keep an `Arc` of the limiter to read `in_flight` or run `evict_idle`, and give it
/// `max_keys` so that clients inventing keys cannot grow memory without bound.
///
/// # Examples
///
/// ```
/// use std::net::SocketAddr;
/// use std::sync::Arc;
/// use axum::{extract::ConnectInfo, routing::get, Router};
/// use tollgate::middleware::{ConcurrencyLimitLayer, LimitKey, PeerIp};
/// use tollgate::ConcurrencyLimiter;
///
/// // At most 8 requests in flight per client address.
/// let limiter: Arc<ConcurrencyLimiter<LimitKey>> =
///     Arc::new(ConcurrencyLimiter::new(8).max_keys(100_000));
/// let layer = ConcurrencyLimitLayer::new(Arc::clone(&limiter))
///     .key(PeerIp::new().connect_info(|c: &ConnectInfo<SocketAddr>| c.0.ip()));
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
    /// use tollgate::ConcurrencyLimiter;
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
                missing: MissingKey::default(),
                grpc: true,
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
    /// use tollgate::ConcurrencyLimiter;
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
    /// use tollgate::ConcurrencyLimiter;
    ///
    /// let layer = ConcurrencyLimitLayer::new(Arc::new(ConcurrencyLimiter::new(4)))
    ///     .on_missing_key(MissingKey::Shared);
    /// ```
    #[must_use]
    pub fn on_missing_key(mut self, answer: MissingKey) -> Self {
        Arc::make_mut(&mut self.config).missing = answer;
        self
    }

    /// Whether gRPC requests are refused the gRPC way (default `true`), as
    /// [`RateLimitLayer::grpc`](super::RateLimitLayer::grpc) describes.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::middleware::ConcurrencyLimitLayer;
    /// use tollgate::ConcurrencyLimiter;
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
        ConcurrencyLimit {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

impl fmt::Debug for ConcurrencyLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimitLayer")
            .field("missing", &self.config.missing)
            .field("grpc", &self.config.grpc)
            .finish_non_exhaustive()
    }
}

/// Caps each key's requests in flight before they reach `S`; built by
/// [`ConcurrencyLimitLayer`]. `poll_ready` is the inner service's.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use tollgate::middleware::{ConcurrencyLimit, ConcurrencyLimitLayer};
/// use tollgate::ConcurrencyLimiter;
/// use tower_layer::Layer;
///
/// let layer = ConcurrencyLimitLayer::new(Arc::new(ConcurrencyLimiter::new(4)));
/// let service: ConcurrencyLimit<u8> = layer.layer(7u8);
/// assert_eq!(*service.get_ref(), 7);
/// ```
#[derive(Clone)]
pub struct ConcurrencyLimit<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> ConcurrencyLimit<S> {
    /// The wrapped service.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::middleware::ConcurrencyLimitLayer;
    /// use tower_layer::Layer;
    ///
    /// let layer = ConcurrencyLimitLayer::new(Arc::new(tollgate::ConcurrencyLimiter::new(1)));
    /// assert_eq!(*layer.layer(7u8).get_ref(), 7);
    /// ```
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, unwrapped.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::middleware::ConcurrencyLimitLayer;
    /// use tower_layer::Layer;
    ///
    /// let layer = ConcurrencyLimitLayer::new(Arc::new(tollgate::ConcurrencyLimiter::new(1)));
    /// assert_eq!(layer.layer(7u8).into_inner(), 7);
    /// ```
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for ConcurrencyLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    type Response = Response<ConcurrencyBody<ResBody>>;
    type Error = S::Error;
    type Future = ConcurrencyFuture<S::Future>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        match self.config.admit(&request) {
            Ok(permit) => ConcurrencyFuture {
                inner: ResponseFuture::inner(self.inner.call(request), Fields::default()),
                permit,
            },
            Err(refusal) => ConcurrencyFuture {
                inner: ResponseFuture::ready(refusal),
                permit: None,
            },
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for ConcurrencyLimit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyLimit")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

pin_project! {
    /// The future of a [`ConcurrencyLimit`] service's response: it holds the request's
    /// permit and hands it to the response body.
    ///
    /// # Panics
    ///
    /// Like most futures, when polled again after it completed.
    ///
    /// # Examples
    ///
    /// ```
    /// fn assert_future<F: std::future::Future>() {}
    /// assert_future::<tollgate::middleware::ConcurrencyFuture<std::future::Ready<Result<http::Response<()>, ()>>>>();
    /// ```
    pub struct ConcurrencyFuture<F> {
        #[pin]
        inner: ResponseFuture<F>,
        permit: Option<Permit>,
    }
}

impl<F, B, E> Future for ConcurrencyFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ConcurrencyBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        // On an error the permit is dropped here: nothing is in flight any more.
        let response = ready!(this.inner.poll(cx))?;
        let permit = this.permit.take();
        Poll::Ready(Ok(response.map(|body| ConcurrencyBody { body, permit })))
    }
}

impl<F> fmt::Debug for ConcurrencyFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyFuture")
            .field("inner", &self.inner)
            .field("permit", &self.permit)
            .finish()
    }
}

pin_project! {
    /// The body of a [`ConcurrencyLimit`] service's response: the inner body, holding the
    /// request's permit until it has ended or is dropped, or the bytes of a refusal.
    ///
    /// # Examples
    ///
    /// ```
    /// use http_body::Body;
    /// use tollgate::middleware::ConcurrencyBody;
    ///
    /// fn assert_body<B: Body>() {}
    /// assert_body::<ConcurrencyBody<axum::body::Body>>();
    /// ```
    pub struct ConcurrencyBody<B> {
        #[pin]
        body: RateLimitBody<B>,
        permit: Option<Permit>,
    }
}

impl<B> Body for ConcurrencyBody<B>
where
    B: Body,
    B::Data: From<Bytes>,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        let frame = ready!(this.body.as_mut().poll_frame(cx));
        // Ended (no more frames, an error, or nothing left after this one): the request is
        // no longer in flight, even if the server keeps the body a while before dropping it.
        if !matches!(frame, Some(Ok(_))) || this.body.is_end_stream() {
            *this.permit = None;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl<B> fmt::Debug for ConcurrencyBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConcurrencyBody")
            .field("body", &self.body)
            .field("permit", &self.permit)
            .finish()
    }
}
