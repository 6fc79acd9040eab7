//! [`LoginLayer`]: a [`LoginGuard`] in front of a login handler, checking each attempt before
//! the handler runs and recording its outcome from the response status.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use super::body::RateLimitBody;
use super::future::ResponseFuture;
use super::headers::{self, Fields};
use super::key::{KeyExtractor, LimitKey, PeerIp, RequestHead};
use super::rules::MissingKey;
use crate::clock::Clock;
use crate::login::{LoginClient, LoginDecision, LoginGuard};

/// A login guard as the layer sees it: any clock.
trait Guard: Send + Sync {
    fn check(&self, account: &str, client: LoginClient<'_>) -> LoginDecision;
    fn record(&self, account: &str, client: LoginClient<'_>, outcome: LoginOutcome);
}

impl<C: Clock + Send + Sync + 'static> Guard for LoginGuard<C> {
    fn check(&self, account: &str, client: LoginClient<'_>) -> LoginDecision {
        LoginGuard::check(self, account, client)
    }

    fn record(&self, account: &str, client: LoginClient<'_>, outcome: LoginOutcome) {
        match outcome {
            LoginOutcome::Failure => {
                let _next = self.record_failure(account, client);
            }
            LoginOutcome::Success => self.record_success(account, client),
            LoginOutcome::Ignore => {}
        }
    }
}

/// What a login response says about the attempt, as
/// [`LoginLayer::classify`] reads it from the status.
///
/// # Examples
///
/// ```
/// use http::StatusCode;
/// use tollgate::middleware::LoginOutcome;
///
/// assert_eq!(LoginOutcome::from_status(StatusCode::UNAUTHORIZED), LoginOutcome::Failure);
/// assert_eq!(LoginOutcome::from_status(StatusCode::OK), LoginOutcome::Success);
/// assert_eq!(LoginOutcome::from_status(StatusCode::BAD_REQUEST), LoginOutcome::Ignore);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LoginOutcome {
    /// A wrong password: [`LoginGuard::record_failure`].
    Failure,
    /// A right password: [`LoginGuard::record_success`] (the client becomes known).
    Success,
    /// Neither (a malformed request, a server error): nothing is recorded.
    Ignore,
}

impl LoginOutcome {
    /// The default classification: `401` and `403` are failures, any `2xx` a success,
    /// anything else ignored.
    ///
    /// # Examples
    ///
    /// ```
    /// use http::StatusCode;
    /// use tollgate::middleware::LoginOutcome;
    ///
    /// assert_eq!(LoginOutcome::from_status(StatusCode::FORBIDDEN), LoginOutcome::Failure);
    /// assert_eq!(LoginOutcome::from_status(StatusCode::NO_CONTENT), LoginOutcome::Success);
    /// ```
    #[must_use]
    pub fn from_status(status: StatusCode) -> Self {
        match status {
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => LoginOutcome::Failure,
            status if status.is_success() => LoginOutcome::Success,
            _ => LoginOutcome::Ignore,
        }
    }
}

/// Reads the account an attempt is for from the request's head.
type AccountOf = dyn Fn(&RequestHead<'_>) -> Option<String> + Send + Sync;

/// Classifies a response status.
type Classify = dyn Fn(StatusCode) -> LoginOutcome + Send + Sync;

#[derive(Clone)]
struct Config {
    guard: Arc<dyn Guard>,
    account: Arc<AccountOf>,
    client: Arc<dyn KeyExtractor>,
    missing: MissingKey,
    classify: Arc<Classify>,
    grpc: bool,
}

/// An attempt let through: whom to record its outcome for.
struct Attempt {
    config: Arc<Config>,
    account: String,
    client: LimitKey,
}

impl Attempt {
    /// `client` as the guard takes it: an address (the guard masks it) or, for any other
    /// key, its stable text form as a token.
    fn with_client<R>(&self, f: impl FnOnce(LoginClient<'_>) -> R) -> R {
        match self.client {
            LimitKey::Ip(ip) => f(LoginClient::from(ip)),
            key => f(LoginClient::Token(&key.to_string())),
        }
    }
}

impl Config {
    /// The attempt `request` makes (`None`: not guarded, for a missing client under
    /// [`MissingKey::Allow`]), or the answer refusing it.
    #[allow(
        clippy::result_large_err,
        reason = "the answer is returned once per request and sent as is; boxing it would allocate"
    )]
    fn admit<B>(
        config: &Arc<Config>,
        request: &Request<B>,
    ) -> Result<Option<Attempt>, Response<Bytes>> {
        let grpc = config.grpc && headers::is_grpc(request.headers());
        let head = RequestHead::new(request);
        let Some(account) = (config.account)(&head).filter(|a| !a.is_empty()) else {
            // Letting it through would let a client that leaves the account out guess
            // without limit if the handler reads it from elsewhere.
            return Err(headers::error_response(
                StatusCode::BAD_REQUEST,
                "no account in the login request",
                None,
                grpc,
            ));
        };
        let Some(client) = config.missing.key(&*config.client, &head, grpc)? else {
            return Ok(None);
        };
        let attempt = Attempt {
            config: Arc::clone(config),
            account,
            client,
        };
        let decision = attempt.with_client(|client| config.guard.check(&attempt.account, client));
        if decision.is_allowed() {
            return Ok(Some(attempt));
        }
        let secs = decision.retry_after_secs();
        let detail = format!(
            "Too many failed login attempts: retry after {secs} second{}",
            if secs == 1 { "" } else { "s" }
        );
        Err(headers::error_response(
            StatusCode::TOO_MANY_REQUESTS,
            &detail,
            Some(secs),
            grpc,
        ))
    }
}

/// A tower [`Layer`] guarding a login endpoint with a [`LoginGuard`]: failed attempts
/// limited per account and per client, escalating lockouts, known clients kept in.
///
/// For each request, before the inner service:
///
/// 1. The **account** comes from your closure over the request's head (a header, the path,
///    the query, or an extension an earlier middleware set). The layer never reads the
///    body: if the account is in a form or JSON body, parse it in a middleware before this
///    one and leave it in the extensions, or key the route by it (`/login/{user}`). A
///    request without an account is answered `400` with a problem document.
/// 2. The **client** comes from a [`KeyExtractor`] ([`PeerIp`] unless set with
///    [`client`](LoginLayer::client)): an address is passed to the guard as an address
///    (which masks IPv6 to its /64), any other key (a [`HeaderKey`](super::HeaderKey)
///    digest of a device cookie, say) as a device token. A request without one is
///    answered as [`on_missing_key`](LoginLayer::on_missing_key) says (default `400`).
/// 3. [`LoginGuard::check`]: a refusal is answered `429 Too Many Requests` with
///    `Retry-After` and a problem document (gRPC: `RESOURCE_EXHAUSTED`), and the handler
///    is not called.
///
/// When the inner service's response arrives, its status is
/// [classified](LoginLayer::classify) (default [`LoginOutcome::from_status`]: 401/403 a
/// failure, 2xx a success) and recorded with [`LoginGuard::record_failure`] or
/// [`LoginGuard::record_success`]. The guard's check-then-record race applies (see
/// [`LoginGuard`]): attempts racing on one account may verify a few more passwords than
/// the limit.
///
/// Put it on the login route only (axum's `route_layer`): every response it sees is read
/// as a login attempt.
///
/// # Examples
///
/// ```
/// use std::net::SocketAddr;
/// use std::sync::Arc;
/// use axum::{extract::ConnectInfo, routing::post, Router};
/// use http::StatusCode;
/// use tollgate::middleware::{LoginLayer, PeerIp};
/// use tollgate::LoginGuard;
///
/// let guard = Arc::new(LoginGuard::new().max_keys(1_000_000));
/// let layer = LoginLayer::new(Arc::clone(&guard), |head| {
///     head.headers().get("x-user")?.to_str().ok().map(str::to_owned)
/// })
/// .client(PeerIp::new().connect_info(|c: &ConnectInfo<SocketAddr>| c.0.ip()));
/// let app: Router = Router::new()
///     .route("/login", post(|| async { StatusCode::UNAUTHORIZED }))
///     .route_layer(layer);
/// ```
#[derive(Clone)]
pub struct LoginLayer {
    config: Arc<Config>,
}

impl LoginLayer {
    /// A layer guarding attempts with `guard`, reading each attempt's account with
    /// `account` (`None` or empty: no account, answered 400), its client with [`PeerIp`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::middleware::LoginLayer;
    ///
    /// // The account is the last path segment: POST /login/alice.
    /// let layer = LoginLayer::new(Arc::new(tollgate::LoginGuard::new()), |head| {
    ///     head.uri().path().rsplit('/').next().map(str::to_owned)
    /// });
    /// ```
    #[must_use]
    pub fn new<C>(
        guard: Arc<LoginGuard<C>>,
        account: impl Fn(&RequestHead<'_>) -> Option<String> + Send + Sync + 'static,
    ) -> Self
    where
        C: Clock + Send + Sync + 'static,
    {
        LoginLayer {
            config: Arc::new(Config {
                guard,
                account: Arc::new(account),
                client: Arc::new(PeerIp::new()),
                missing: MissingKey::default(),
                classify: Arc::new(LoginOutcome::from_status),
                grpc: true,
            }),
        }
    }

    /// Takes each attempt's client with `extractor` (default [`PeerIp::new()`]; behind a
    /// proxy, [`ClientIp`](super::ClientIp)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::middleware::{ClientIp, LoginLayer};
    ///
    /// let layer = LoginLayer::new(Arc::new(tollgate::LoginGuard::new()), |_| None)
    ///     .client(ClientIp::trusted_hops(1));
    /// ```
    #[must_use]
    pub fn client(mut self, extractor: impl KeyExtractor) -> Self {
        Arc::make_mut(&mut self.config).client = Arc::new(extractor);
        self
    }

    /// How to answer a request whose client cannot be extracted (default
    /// [`MissingKey::Reject`]`(400)`). [`MissingKey::Shared`] files all of them under one
    /// client; [`MissingKey::Allow`] lets them through unguarded.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::middleware::{LoginLayer, MissingKey};
    ///
    /// let layer = LoginLayer::new(Arc::new(tollgate::LoginGuard::new()), |_| None)
    ///     .on_missing_key(MissingKey::Shared);
    /// ```
    #[must_use]
    pub fn on_missing_key(mut self, answer: MissingKey) -> Self {
        Arc::make_mut(&mut self.config).missing = answer;
        self
    }

    /// How a response status becomes the attempt's outcome (default
    /// [`LoginOutcome::from_status`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use http::StatusCode;
    /// use tollgate::middleware::{LoginLayer, LoginOutcome};
    ///
    /// // This handler answers a wrong password with 422.
    /// let layer = LoginLayer::new(Arc::new(tollgate::LoginGuard::new()), |_| None)
    ///     .classify(|status| match status {
    ///         StatusCode::UNPROCESSABLE_ENTITY => LoginOutcome::Failure,
    ///         status => LoginOutcome::from_status(status),
    ///     });
    /// ```
    #[must_use]
    pub fn classify(
        mut self,
        classify: impl Fn(StatusCode) -> LoginOutcome + Send + Sync + 'static,
    ) -> Self {
        Arc::make_mut(&mut self.config).classify = Arc::new(classify);
        self
    }

    /// Whether gRPC requests are refused the gRPC way (default `true`), as
    /// [`RateLimitLayer::grpc`](super::RateLimitLayer::grpc) describes.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::middleware::LoginLayer;
    ///
    /// let layer = LoginLayer::new(Arc::new(tollgate::LoginGuard::new()), |_| None).grpc(false);
    /// ```
    #[must_use]
    pub fn grpc(mut self, detect: bool) -> Self {
        Arc::make_mut(&mut self.config).grpc = detect;
        self
    }
}

impl<S> Layer<S> for LoginLayer {
    type Service = Login<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Login {
            inner,
            config: Arc::clone(&self.config),
        }
    }
}

impl fmt::Debug for LoginLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoginLayer")
            .field("missing", &self.config.missing)
            .field("grpc", &self.config.grpc)
            .finish_non_exhaustive()
    }
}

/// Guards login attempts before they reach `S` and records their outcomes; built by
/// [`LoginLayer`]. `poll_ready` is the inner service's.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use tollgate::middleware::{Login, LoginLayer};
/// use tower_layer::Layer;
///
/// let layer = LoginLayer::new(Arc::new(tollgate::LoginGuard::new()), |_| None);
/// let service: Login<u8> = layer.layer(7u8);
/// assert_eq!(*service.get_ref(), 7);
/// ```
#[derive(Clone)]
pub struct Login<S> {
    inner: S,
    config: Arc<Config>,
}

impl<S> Login<S> {
    /// The wrapped service.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::middleware::LoginLayer;
    /// use tower_layer::Layer;
    ///
    /// let layer = LoginLayer::new(Arc::new(tollgate::LoginGuard::new()), |_| None);
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
    /// let layer = LoginLayer::new(Arc::new(tollgate::LoginGuard::new()), |_| None);
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
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = S::Error;
    type Future = LoginFuture<S::Future>;

    #[inline]
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        match Config::admit(&self.config, &request) {
            Ok(attempt) => LoginFuture {
                inner: ResponseFuture::inner(self.inner.call(request), Fields::default()),
                attempt,
            },
            Err(refusal) => LoginFuture {
                inner: ResponseFuture::ready(refusal),
                attempt: None,
            },
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

pin_project! {
    /// The future of a [`Login`] service's response: records the attempt's outcome when
    /// the inner service answers.
    ///
    /// # Panics
    ///
    /// Like most futures, when polled again after it completed.
    ///
    /// # Examples
    ///
    /// ```
    /// fn assert_future<F: std::future::Future>() {}
    /// assert_future::<tollgate::middleware::LoginFuture<std::future::Ready<Result<http::Response<()>, ()>>>>();
    /// ```
    pub struct LoginFuture<F> {
        #[pin]
        inner: ResponseFuture<F>,
        attempt: Option<Attempt>,
    }
}

impl<F, B, E> Future for LoginFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<RateLimitBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        // An error from the inner service says nothing about the password: nothing recorded.
        let response = ready!(this.inner.poll(cx))?;
        if let Some(attempt) = this.attempt.take() {
            let outcome = (attempt.config.classify)(response.status());
            attempt.with_client(|client| {
                attempt
                    .config
                    .guard
                    .record(&attempt.account, client, outcome);
            });
        }
        Poll::Ready(Ok(response))
    }
}

impl<F> fmt::Debug for LoginFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoginFuture")
            .field("inner", &self.inner)
            .field("guarded", &self.attempt.is_some())
            .finish()
    }
}
