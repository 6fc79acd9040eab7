//! [`ConcurrencyLimit`]: the service a [`ConcurrencyLimitLayer`](super::ConcurrencyLimitLayer)
//! wraps around another.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::config::Config;
use super::future::ResponseFuture;
use crate::middleware::body::ResponseBody;

/// Caps each key's requests in flight before they reach `S`; built by
/// [`ConcurrencyLimitLayer`](super::ConcurrencyLimitLayer). `poll_ready` is the inner
/// service's.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use tollgate::middleware::concurrency::{ConcurrencyLimit, ConcurrencyLimitLayer};
/// use tollgate::concurrency::ConcurrencyLimiter;
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
    pub(super) fn from_parts(inner: S, config: Arc<Config>) -> Self {
        ConcurrencyLimit { inner, config }
    }

    /// The wrapped service.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::middleware::ConcurrencyLimitLayer;
    /// use tower_layer::Layer;
    ///
    /// let layer = ConcurrencyLimitLayer::new(Arc::new(tollgate::concurrency::ConcurrencyLimiter::new(1)));
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
    /// let layer = ConcurrencyLimitLayer::new(Arc::new(tollgate::concurrency::ConcurrencyLimiter::new(1)));
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
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        match self.config.admit(&request) {
            Ok(permit) => ResponseFuture::inner(self.inner.call(request), permit),
            Err(answer) => ResponseFuture::answered(answer),
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
