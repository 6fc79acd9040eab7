//! [`Refusal`]: what a layer decided when it refuses a request, handed to the refusal
//! handler every layer takes (`on_refusal`), and the default answer made from it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};

use super::headers;
use crate::decision::Decision;
use crate::login::LoginDecision;

/// Which limit refused a request, with what it decided.
///
/// # Examples
///
/// ```
/// use tollgate::middleware::{Refusal, Refused};
///
/// fn describe(refusal: &Refusal) -> String {
///     match refusal.refused() {
///         Refused::Rate { rule, .. } => format!("rate limit {rule}"),
///         Refused::Concurrency { limit } => format!("{limit} requests in flight"),
///         Refused::Login(decision) => format!("login guard: {decision:?}"),
///         _ => "another limit".to_owned(),
///     }
/// }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refused {
    /// A [`RateLimitLayer`](super::RateLimitLayer) rule: its limiter's decision, refused.
    Rate {
        /// The limiter's decision (`is_allowed()` is `false`).
        decision: Decision,
        /// The rule's policy name, unquoted: the route's [`name`](super::Route::name), else
        /// the layer's [`policy_name`](super::RateLimitLayer::policy_name) (`default`). The
        /// `RateLimit` field names a composite policy's bands after it (`default-1s`).
        rule: String,
    },
    /// A [`ConcurrencyLimitLayer`](super::ConcurrencyLimitLayer): the key already has
    /// `limit` requests in flight.
    Concurrency {
        /// Requests of one key allowed in flight at once.
        limit: u64,
    },
    /// A [`LoginLayer`](super::LoginLayer): the guard's decision, refused.
    Login(LoginDecision),
}

/// A refused request, as a refusal handler sees it: which limit refused it and what it
/// decided (limit, remaining, retry-after, rule), and whether the request was gRPC.
///
/// Every layer takes a handler, `on_refusal(|refusal: &Refusal| -> Response<_>)`
/// ([`RateLimitLayer::on_refusal`](super::RateLimitLayer::on_refusal),
/// [`ConcurrencyLimitLayer::on_refusal`](super::ConcurrencyLimitLayer::on_refusal),
/// [`LoginLayer::on_refusal`](super::LoginLayer::on_refusal)); without one, the answer is
/// [`default_response`](Refusal::default_response).
///
/// # Examples
///
/// ```
/// use http::{Response, StatusCode};
/// use tollgate::middleware::{GlobalKey, RateLimitLayer, Refusal};
/// use tollgate::RateLimiter;
///
/// let layer = RateLimitLayer::new(RateLimiter::new("100/min".parse()?))
///     .key(GlobalKey)
///     .on_refusal(|refusal: &Refusal| {
///         let wait = refusal.retry_after().unwrap_or_default().as_secs().max(1);
///         let limit = refusal.limit().unwrap_or_default();
///         let mut response = Response::new(format!("{limit} requests allowed; retry in {wait} s"));
///         *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
///         response.headers_mut().insert("retry-after", wait.into());
///         response
///     });
/// # Ok::<(), tollgate::PolicyError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    refused: Refused,
    grpc: bool,
}

impl Refusal {
    pub(crate) fn new(refused: Refused, grpc: bool) -> Self {
        Refusal { refused, grpc }
    }

    /// Which limit refused the request, with its decision.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::middleware::{Refusal, Refused};
    ///
    /// fn in_flight(refusal: &Refusal) -> bool {
    ///     matches!(refusal.refused(), Refused::Concurrency { .. })
    /// }
    /// ```
    #[must_use]
    pub fn refused(&self) -> &Refused {
        &self.refused
    }

    /// The limit that refused: the policy's permits (the band that refused, for a
    /// composite policy), or the requests allowed in flight; `None` for the login guard,
    /// whose limits are several.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn f(refusal: &tollgate::middleware::Refusal) {
    /// let limit: Option<u64> = refusal.limit();
    /// # }
    /// ```
    #[must_use]
    pub fn limit(&self) -> Option<u64> {
        match &self.refused {
            Refused::Rate { decision, .. } => Some(decision.limit()),
            Refused::Concurrency { limit } => Some(*limit),
            Refused::Login(_) => None,
        }
    }

    /// Permits left in the rule's window (0 unless a request of a higher cost was refused
    /// while cheaper ones would still pass); 0 for the other limits.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn f(refusal: &tollgate::middleware::Refusal) {
    /// let left: u64 = refusal.remaining();
    /// # }
    /// ```
    #[must_use]
    pub fn remaining(&self) -> u64 {
        match &self.refused {
            Refused::Rate { decision, .. } => decision.remaining(),
            Refused::Concurrency { .. } | Refused::Login(_) => 0,
        }
    }

    /// How long until the request could pass; `None` for a concurrency refusal, since
    /// nobody knows when a request in flight will end.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn f(refusal: &tollgate::middleware::Refusal) {
    /// let wait = refusal.retry_after().map(|d| d.as_secs());
    /// # }
    /// ```
    #[must_use]
    pub fn retry_after(&self) -> Option<Duration> {
        match &self.refused {
            Refused::Rate { decision, .. } => Some(decision.retry_after()),
            Refused::Concurrency { .. } => None,
            Refused::Login(decision) => Some(decision.retry_after()),
        }
    }

    /// The rate rule's policy name (unquoted); `None` for the other limits.
    ///
    /// # Examples
    ///
    /// ```
    /// # fn f(refusal: &tollgate::middleware::Refusal) {
    /// let login_route = refusal.rule() == Some("login");
    /// # }
    /// ```
    #[must_use]
    pub fn rule(&self) -> Option<&str> {
        match &self.refused {
            Refused::Rate { rule, .. } => Some(rule),
            Refused::Concurrency { .. } | Refused::Login(_) => None,
        }
    }

    /// Whether the request was gRPC (`content-type: application/grpc...`, with the layer's
    /// gRPC detection on): a gRPC client reads a status from `grpc-status`, not from a 429,
    /// so a handler that answers HTTP clients its own way should usually answer these with
    /// the [`default_response`](Refusal::default_response).
    ///
    /// # Examples
    ///
    /// ```
    /// # fn f(refusal: &tollgate::middleware::Refusal) {
    /// let grpc = refusal.is_grpc();
    /// # }
    /// ```
    #[must_use]
    pub fn is_grpc(&self) -> bool {
        self.grpc
    }

    /// The answer a layer sends without a handler: `429 Too Many Requests` with
    /// `Retry-After` (whole seconds, rounded up, at least 1; none for a concurrency
    /// refusal) and an `application/problem+json` body; for a gRPC request, a trailers-only
    /// response with `grpc-status: 8` (`RESOURCE_EXHAUSTED`). The rate layer adds its
    /// rate-limit fields to this, as to any handler's answer.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::middleware::Refusal;
    ///
    /// // Answer gRPC clients as usual, everyone else with a page of your own.
    /// let handler = |refusal: &Refusal| {
    ///     if refusal.is_grpc() {
    ///         return refusal.default_response();
    ///     }
    ///     let mut page = http::Response::new(bytes::Bytes::from_static(b"<h1>Slow down</h1>"));
    ///     *page.status_mut() = http::StatusCode::TOO_MANY_REQUESTS;
    ///     page
    /// };
    /// ```
    #[must_use]
    pub fn default_response(&self) -> Response<Bytes> {
        let retry_after = self.retry_after().map(|_| self.retry_after_secs());
        let detail = match &self.refused {
            Refused::Rate { .. } => {
                format!(
                    "Rate limit exceeded: retry after {}",
                    seconds(self.retry_after_secs())
                )
            }
            Refused::Concurrency { limit } => format!(
                "Concurrency limit exceeded: {limit} requests of this client already in flight"
            ),
            Refused::Login(_) => format!(
                "Too many failed login attempts: retry after {}",
                seconds(self.retry_after_secs())
            ),
        };
        headers::error_response(
            StatusCode::TOO_MANY_REQUESTS,
            &detail,
            retry_after,
            self.grpc,
        )
    }

    /// `Retry-After` in whole seconds: rounded up, at least 1.
    fn retry_after_secs(&self) -> u64 {
        match &self.refused {
            Refused::Rate { decision, .. } => decision.retry_after_secs(),
            Refused::Login(decision) => decision.retry_after_secs(),
            Refused::Concurrency { .. } => 0,
        }
    }
}

/// `n second(s)`.
fn seconds(n: u64) -> String {
    format!("{n} second{}", if n == 1 { "" } else { "s" })
}

/// A layer's answer to its refusals: the user's handler, or the default.
#[derive(Clone)]
pub(crate) struct RefusalHandler(Option<Arc<HandlerFn>>);

type HandlerFn = dyn Fn(&Refusal) -> Response<Bytes> + Send + Sync;

impl RefusalHandler {
    /// [`Refusal::default_response`].
    pub(crate) fn default_response() -> Self {
        RefusalHandler(None)
    }

    /// `handler`, its body turned into bytes.
    pub(crate) fn custom<F, T>(handler: F) -> Self
    where
        F: Fn(&Refusal) -> Response<T> + Send + Sync + 'static,
        T: Into<Bytes>,
    {
        RefusalHandler(Some(Arc::new(move |refusal: &Refusal| {
            handler(refusal).map(Into::into)
        })))
    }

    /// The answer to `refusal`.
    pub(crate) fn answer(&self, refusal: &Refusal) -> Response<Bytes> {
        match &self.0 {
            Some(handler) => handler(refusal),
            None => refusal.default_response(),
        }
    }
}

impl fmt::Debug for RefusalHandler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "RefusalHandler::Custom"
        } else {
            "RefusalHandler::Default"
        })
    }
}
