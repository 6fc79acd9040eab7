//! [`RateLimit`]: the service a [`RateLimitLayer`](super::RateLimitLayer) wraps around another.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::config::{Config, Handling, Outcome};
use super::future::ResponseFuture;
#[cfg(feature = "redis")]
use super::future::Step;
use crate::middleware::body::ResponseBody;

/// Rate-limits requests before they reach `S`; built by
/// [`RateLimitLayer`](super::RateLimitLayer).
///
/// `poll_ready` is the inner service's: the limit itself never makes a caller wait. A refused
/// request is answered at once without calling the inner service (its readiness is simply
/// not used). Cloning is cheap: the configuration and limiters are shared through `Arc`s.
///
/// # Examples
///
/// Wrapping a service directly and calling it, as hyper or any tower stack would:
///
/// ```
/// use axum::{body::Body, routing::get, Router};
/// use http::{Request, StatusCode};
/// use tollgate::middleware::rate::RateLimit;
/// use tollgate::middleware::{GlobalKey, RateLimitLayer};
/// use tollgate::RateLimiter;
/// use tower_layer::Layer;
/// use tower_service::Service;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let layer = RateLimitLayer::new(RateLimiter::new("1/min".parse()?)).key(GlobalKey);
/// let mut service: RateLimit<Router> = layer.layer(Router::new().route("/", get(|| async { "ok" })));
///
/// std::future::poll_fn(|cx| Service::<Request<Body>>::poll_ready(&mut service, cx)).await?;
/// let first = service.call(Request::new(Body::empty())).await?;
/// assert_eq!(first.status(), StatusCode::OK);
/// assert_eq!(first.headers()["ratelimit"], "\"default\";r=0;t=60");
///
/// std::future::poll_fn(|cx| Service::<Request<Body>>::poll_ready(&mut service, cx)).await?;
/// let second = service.call(Request::new(Body::empty())).await?;
/// assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
/// assert_eq!(second.headers()["retry-after"], "60");
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RateLimit<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> RateLimit<S> {
    pub(super) fn from_parts(inner: S, config: Arc<Config>) -> Self {
        RateLimit { inner, config }
    }

    /// The wrapped service.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::middleware::RateLimitLayer;
    /// use tower_layer::Layer;
    ///
    /// let service = RateLimitLayer::new(tollgate::RateLimiter::new("1/s".parse()?)).layer(7u8);
    /// assert_eq!(*service.get_ref(), 7);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::middleware::RateLimitLayer;
    /// use tower_layer::Layer;
    ///
    /// let mut service = RateLimitLayer::new(tollgate::RateLimiter::new("1/s".parse()?)).layer(7u8);
    /// *service.get_mut() += 1;
    /// assert_eq!(*service.get_ref(), 8);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The wrapped service, unwrapped.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::middleware::RateLimitLayer;
    /// use tower_layer::Layer;
    ///
    /// let service = RateLimitLayer::new(tollgate::RateLimiter::new("1/s".parse()?)).layer(7u8);
    /// assert_eq!(service.into_inner(), 7);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn into_inner(self) -> S {
        self.inner
    }
}

/// `S: Clone + Send + 'static` and `ReqBody: Send + 'static` (as axum's, hyper's and tonic's
/// services and bodies are) let a rule decided by Redis move the ready service and the
/// request into the response future, which calls the service once Redis has decided.
impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    ReqBody: Send + 'static,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        match self.config.decide(&request) {
            Outcome::Now(Handling::Pass(decision, fields, settlement)) => {
                if let Some(decision) = decision {
                    request.extensions_mut().insert(decision);
                }
                ResponseFuture::inner(self.inner.call(request), fields, settlement)
            }
            Outcome::Now(Handling::Respond(response)) => ResponseFuture::ready(response),
            #[cfg(feature = "redis")]
            Outcome::Remote(remote) => {
                // `self.inner` is the service `poll_ready` readied: the future takes it and
                // leaves a clone (not yet ready) in its place, as tower middleware does.
                let ready = self.inner.clone();
                let mut inner = std::mem::replace(&mut self.inner, ready);
                let config = Arc::clone(&self.config);
                ResponseFuture::deciding(Box::pin(async move {
                    match config.decide_remote_detached(remote).await {
                        Handling::Pass(decision, fields, settlement) => {
                            if let Some(decision) = decision {
                                request.extensions_mut().insert(decision);
                            }
                            Step::Call(inner.call(request), fields, settlement)
                        }
                        Handling::Respond(response) => Step::Respond(response),
                    }
                }))
            }
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for RateLimit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish()
    }
}
