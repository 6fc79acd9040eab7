//! [`LoginLayer`]: the builder of a login guard in front of a handler, and the [`Layer`] that
//! wraps a service with it.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode};
use tower_layer::Layer;

use super::config::Config;
use super::outcome::LoginOutcome;
use super::service::Login;
use crate::clock::Clock;
use crate::login::LoginGuard;
use crate::middleware::key::{KeyExtractor, RequestHead};
use crate::middleware::missing_key::{KeyTaker, MissingKey};
use crate::middleware::peer::PeerIp;
use crate::middleware::refusal::{Refusal, RefusalHandler};

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
///    (which masks IPv6 to its /64), any other key (a [`HeaderKey`](crate::middleware::HeaderKey)
///    digest of a device cookie, say) as a device token. A token alone is a weak client
///    key: the client limit then counts per token, and a client that sends a fresh one with
///    each attempt gets a fresh budget each time (the guard's `(token, address)` pair is not
///    supported here yet); prefer the address. A request without one is
///    answered as [`on_missing_key`](LoginLayer::on_missing_key) says (default `400`; no
///    peer address at all is the server's mistake: `500`, logged once).
/// 3. [`LoginGuard::check`]: a refusal is answered `429 Too Many Requests` with
///    `Retry-After` and a problem document (gRPC: `RESOURCE_EXHAUSTED`), or what your
///    [`on_refusal`](LoginLayer::on_refusal) handler answers, and the handler is not called.
///
/// When the inner service's response arrives, its status is
/// [classified](LoginLayer::classify) (default [`LoginOutcome::from_status`]: 401/403 a
/// failure, 2xx a success) and recorded with [`LoginGuard::record_failure`] or
/// [`LoginGuard::record_success`]. A gRPC response's outcome (a response with a gRPC media
/// type or a `grpc-status` header) is read from its `grpc-status` header instead
/// ([`LoginOutcome::from_grpc_status`]), since a failed RPC answers HTTP 200. The response
/// decides, not the request: a client could otherwise pick, by the content type it sends,
/// the reading that records nothing. An attempt that ends without a response (the client cancelled it, a
/// timeout dropped it, the handler failed or panicked) counts as a **failure**, so that
/// cancelling a guess whose answer is slow cannot make it free. The default classification
/// suits APIs that answer a wrong password with 401; a page that re-renders its form with
/// 200, or redirects, needs its own [`classify`](LoginLayer::classify).
///
/// The guard's check-then-record race applies (see [`LoginGuard`]): attempts on one account
/// that run in parallel all pass the check before the first records its failure, so an
/// attacker running many at once verifies about as many guesses per window as it runs in
/// parallel. Put a [`ConcurrencyLimitLayer`](crate::middleware::ConcurrencyLimitLayer) keyed by the
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
/// use std::sync::Arc;
/// use axum::{routing::post, Router};
/// use http::StatusCode;
/// use tollgate::middleware::LoginLayer;
/// use tollgate::login::LoginGuard;
///
/// // The client is the peer address (the default, `PeerIp`).
/// let guard = Arc::new(LoginGuard::new().max_keys(1_000_000));
/// let layer = LoginLayer::new(Arc::clone(&guard), |head| {
///     head.headers().get("x-user")?.to_str().ok().map(str::to_owned)
/// });
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
    /// let layer = LoginLayer::new(Arc::new(tollgate::login::LoginGuard::new()), |head| {
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
                keys: KeyTaker::new(MissingKey::default()),
                classify: Arc::new(LoginOutcome::from_status),
                grpc: true,
                max_account_len: Self::DEFAULT_MAX_ACCOUNT_LEN,
                on_refusal: RefusalHandler::default_response(),
            }),
        }
    }

    /// Takes each attempt's client with `extractor` (default [`PeerIp::new()`]; behind a
    /// proxy, [`ClientIp`](crate::middleware::ClientIp)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::middleware::{ClientIp, LoginLayer};
    ///
    /// let layer = LoginLayer::new(Arc::new(tollgate::login::LoginGuard::new()), |_| None)
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
    /// let layer = LoginLayer::new(Arc::new(tollgate::login::LoginGuard::new()), |_| None)
    ///     .on_missing_key(MissingKey::Shared);
    /// ```
    #[must_use]
    pub fn on_missing_key(mut self, answer: MissingKey) -> Self {
        Arc::make_mut(&mut self.config).keys.set_missing(answer);
        self
    }

    /// Answers attempts the guard refuses with `handler` instead of the default
    /// ([`Refusal::default_response`]: `429` with `Retry-After` and a problem+json body), as
    /// [`RateLimitLayer::on_refusal`](crate::middleware::RateLimitLayer::on_refusal)
    /// describes. [`Refusal::refused`] is [`Refused::Login`](crate::middleware::Refused::Login)
    /// with the guard's decision: which limit refused (the account's, the client's, a
    /// lockout) and for how long.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use http::{Response, StatusCode};
    /// use tollgate::middleware::{LoginLayer, Refusal};
    ///
    /// // A login page answers with a page, not a problem document.
    /// let layer = LoginLayer::new(Arc::new(tollgate::login::LoginGuard::new()), |_| None)
    ///     .on_refusal(|refusal: &Refusal| {
    ///         let minutes = refusal.retry_after().unwrap_or_default().as_secs().div_ceil(60);
    ///         let mut page = Response::new(format!("<p>Too many attempts. Try again in {minutes} min.</p>"));
    ///         *page.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    ///         page
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
    /// let layer = LoginLayer::new(Arc::new(tollgate::login::LoginGuard::new()), |_| None)
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
    /// use tollgate::login::LoginGuard;
    ///
    /// let layer = LoginLayer::new(Arc::new(LoginGuard::new()), |_| None).max_account_len(64);
    /// ```
    #[must_use]
    pub fn max_account_len(mut self, max: usize) -> Self {
        Arc::make_mut(&mut self.config).max_account_len = max;
        self
    }

    /// Whether gRPC requests are refused the gRPC way and gRPC responses classified by
    /// their `grpc-status` (default `true`), as
    /// [`RateLimitLayer::grpc`](crate::middleware::RateLimitLayer::grpc) describes. Off,
    /// every response is classified by its HTTP status, which records a failed RPC (HTTP
    /// 200) as a success: turn it off only where no gRPC service sits behind the layer.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::middleware::LoginLayer;
    ///
    /// let layer = LoginLayer::new(Arc::new(tollgate::login::LoginGuard::new()), |_| None).grpc(false);
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
        Login::from_parts(inner, Arc::clone(&self.config))
    }
}

impl fmt::Debug for LoginLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoginLayer")
            .field("missing", &self.config.keys.missing())
            .field("grpc", &self.config.grpc)
            .finish_non_exhaustive()
    }
}
