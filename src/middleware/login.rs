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
use super::route::MissingKey;
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

    /// How a gRPC response is classified, from its `grpc-status` code: `UNAUTHENTICATED`
    /// (16) and `PERMISSION_DENIED` (7) are failures, `OK` (0) a success, anything else
    /// ignored. A gRPC response without `grpc-status` in its headers (the status comes in the
    /// trailers, after the body) is ignored: its HTTP status is 200 whatever happened.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::middleware::LoginOutcome;
    ///
    /// assert_eq!(LoginOutcome::from_grpc_status(Some("16")), LoginOutcome::Failure);
    /// assert_eq!(LoginOutcome::from_grpc_status(Some("0")), LoginOutcome::Success);
    /// assert_eq!(LoginOutcome::from_grpc_status(None), LoginOutcome::Ignore);
    /// ```
    #[must_use]
    pub fn from_grpc_status(code: Option<&str>) -> Self {
        match code.map(str::trim) {
            Some("16" | "7") => LoginOutcome::Failure,
            Some("0") => LoginOutcome::Success,
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
    max_account_len: usize,
}

/// An attempt let through: whom to record its outcome for.
struct Attempt {
    config: Arc<Config>,
    account: String,
    client: LimitKey,
    /// The request was gRPC: its outcome is read from `grpc-status`.
    grpc: bool,
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

    /// Records `outcome` for the attempt.
    fn record(&self, outcome: LoginOutcome) {
        self.with_client(|client| self.config.guard.record(&self.account, client, outcome));
    }

    /// The attempt's outcome as `response` tells it.
    fn outcome_of<B>(&self, response: &Response<B>) -> LoginOutcome {
        if self.grpc {
            let code = response.headers().get("grpc-status");
            LoginOutcome::from_grpc_status(code.and_then(|code| code.to_str().ok()))
        } else {
            (self.config.classify)(response.status())
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
        if account.len() > config.max_account_len {
            // The guard keeps the account as a key: a bound keeps each key's memory bounded.
            return Err(headers::error_response(
                StatusCode::BAD_REQUEST,
                "the account in the login request is too long",
                None,
                grpc,
            ));
        }
        let Some(client) = config.missing.key(&*config.client, &head, grpc)? else {
            return Ok(None);
        };
        let attempt = Attempt {
            config: Arc::clone(config),
            account,
            client,
            grpc,
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
/// [`LoginGuard::record_success`]. A gRPC request's outcome is read from the response's
/// `grpc-status` header instead ([`LoginOutcome::from_grpc_status`]), since a failed RPC
/// answers HTTP 200. An attempt that ends without a response (the client cancelled it, a
/// timeout dropped it, the handler failed or panicked) counts as a **failure**, so that
/// cancelling a guess whose answer is slow cannot make it free. The default classification
/// suits APIs that answer a wrong password with 401; a page that re-renders its form with
/// 200, or redirects, needs its own [`classify`](LoginLayer::classify).
///
/// The guard's check-then-record race applies (see [`LoginGuard`]): attempts on one account
/// that run in parallel all pass the check before the first records its failure, so an
/// attacker running many at once verifies about as many guesses per window as it runs in
/// parallel. Put a [`ConcurrencyLimitLayer`](super::ConcurrencyLimitLayer) keyed by the
/// account, with a limit of 1, in front of this layer to run one attempt per account at a
/// time. Accounts longer than
/// [`max_account_len`](LoginLayer::max_account_len) are refused with `400`.
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
    /// The default bound on an account's length, in bytes (an e-mail address is at most 254).
    pub const DEFAULT_MAX_ACCOUNT_LEN: usize = 256;

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
                max_account_len: Self::DEFAULT_MAX_ACCOUNT_LEN,
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

    /// Refuses (with `400`) an account longer than `max` bytes (default
    /// [`DEFAULT_MAX_ACCOUNT_LEN`](LoginLayer::DEFAULT_MAX_ACCOUNT_LEN)): the guard keeps each
    /// account it records as a key, so the bound is what one key can cost.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::middleware::LoginLayer;
    /// use tollgate::LoginGuard;
    ///
    /// let layer = LoginLayer::new(Arc::new(LoginGuard::new()), |_| None).max_account_len(64);
    /// ```
    #[must_use]
    pub fn max_account_len(mut self, max: usize) -> Self {
        Arc::make_mut(&mut self.config).max_account_len = max;
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

    impl<F> PinnedDrop for LoginFuture<F> {
        fn drop(this: Pin<&mut Self>) {
            // Dropped before its response: the client went away, a timeout fired, the
            // handler panicked. Counted as a failure, so that cancelling an attempt whose
            // answer is slow to come (a wrong password, often) cannot make a guess free.
            if let Some(attempt) = this.project().attempt.take() {
                attempt.record(LoginOutcome::Failure);
            }
        }
    }
}

impl<F, B, E> Future for LoginFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<RateLimitBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = ready!(this.inner.poll(cx));
        if let Some(attempt) = this.attempt.take() {
            // An error instead of a response counts as a failure, as a dropped attempt does:
            // otherwise a guess that makes the service fail would cost nothing.
            let outcome = match &response {
                Ok(response) => attempt.outcome_of(response),
                Err(_) => LoginOutcome::Failure,
            };
            attempt.record(outcome);
        }
        Poll::Ready(response)
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
