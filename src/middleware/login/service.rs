//! [`Login`]: the service a [`LoginLayer`](super::LoginLayer) wraps around another.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use tower_service::Service;

use super::config::Config;
use super::future::ResponseFuture;
use crate::middleware::body::ResponseBody;

/// Guards login attempts before they reach `S` and records their outcomes; built by
/// [`LoginLayer`](super::LoginLayer). `poll_ready` is the inner service's.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use tollgate::middleware::login::{Login, LoginLayer};
/// use tower_layer::Layer;
///
/// let layer = LoginLayer::new(Arc::new(tollgate::login::LoginGuard::new()), |_| None);
/// let service: Login<u8> = layer.layer(7u8);
/// assert_eq!(*service.get_ref(), 7);
/// ```
#[derive(Clone)]
pub struct Login<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> Login<S> {
    pub(super) fn from_parts(inner: S, config: Arc<Config>) -> Self {
        Login { inner, config }
    }

    /// The wrapped service.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::middleware::LoginLayer;
    /// use tower_layer::Layer;
    ///
    /// let layer = LoginLayer::new(Arc::new(tollgate::login::LoginGuard::new()), |_| None);
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
    /// use tollgate::middleware::LoginLayer;
    /// use tower_layer::Layer;
    ///
    /// let layer = LoginLayer::new(Arc::new(tollgate::login::LoginGuard::new()), |_| None);
    /// assert_eq!(layer.layer(7u8).into_inner(), 7);
    /// ```
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Login<S>
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
        match Config::admit(&self.config, &request) {
            Ok(attempt) => ResponseFuture::inner(self.inner.call(request), attempt),
            Err(answer) => ResponseFuture::answered(answer),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for Login<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Login")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}
