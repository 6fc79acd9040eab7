//! [`RateLimitLayer`]: the builder of the rules, and the [`Layer`] that wraps a service with
//! them.

use std::fmt;
use std::sync::Arc;

use tower_layer::Layer;

use bytes::Bytes;
use http::Response;

use super::config::{Config, Target};
use super::limit::Limit;
use super::route::Route;
use super::rule::Rule;
use super::service::RateLimit;
#[cfg(doc)]
use crate::decision::Decision;
use crate::middleware::backend::Backend;
use crate::middleware::error::ConfigError;
use crate::middleware::headers::{self, HeaderStyle};
use crate::middleware::key::KeyExtractor;
use crate::middleware::missing_key::{KeyTaker, MissingKey};
use crate::middleware::peer::PeerIp;
use crate::middleware::refusal::{Refusal, RefusalHandler};

/// A tower [`Layer`] that rate-limits requests before they reach the service it wraps, for
/// axum, hyper, tonic or any tower stack.
///
/// Each request is matched to its rules (the first matching [`route`](RateLimitLayer::route),
/// else the default limiter given to [`new`](RateLimitLayer::new), each with the limiters
/// [`and`](RateLimitLayer::and) added to it, decided all or nothing), keyed by each rule's
/// [`KeyExtractor`] ([`PeerIp`] unless set), and decided by the rules' limiters: at once by
/// in-process `RateLimiter<LimitKey>`s, or by one Redis call awaited in the response
/// future for `RedisLimiter`s ([`Backend`]). There is no waiting for permits and no
/// backpressure through `poll_ready`.
///
/// * **Allowed**: the request goes on with its [`Decision`] in its extensions, and the
///   response gets the rate-limit fields ([`HeaderStyle`]).
/// * **Refused**: `429 Too Many Requests` at once, with `Retry-After` (whole seconds,
///   rounded up, at least 1), the same fields, and an `application/problem+json` body. A gRPC
///   request (`content-type: application/grpc...`) gets a trailers-only response with
///   `grpc-status: 8` (`RESOURCE_EXHAUSTED`) instead. Your own answer:
///   [`on_refusal`](RateLimitLayer::on_refusal).
/// * **No key**: answered as [`on_missing_key`](RateLimitLayer::on_missing_key) says
///   (default `400 Bad Request`), never a panic. A request without a peer address is the
///   server's mistake (with axum: served without `into_make_service_with_connect_info`):
///   `500`, logged once per layer ([`PeerIp`]).
/// * `OPTIONS` requests (CORS preflights) pass unlimited unless
///   [`exempt_options(false)`](RateLimitLayer::exempt_options).
///
/// The layer is cheap to clone; every service it builds shares one configuration and the
/// limiters through `Arc`s. Keep your own `Arc` of each limiter to call `evict_idle`, read
/// `stats` or change its policy live (the fields follow a `set_policy`); give it
/// `max_keys` so that clients inventing keys cannot grow memory without bound.
///
/// The service it builds is [`RateLimit<S>`](super::RateLimit); its response body is
/// [`ResponseBody<B>`](crate::middleware::ResponseBody): the inner body, or the refusal's
/// bytes.
///
/// # Examples
///
/// ```
/// use axum::{routing::get, Router};
/// use http::Method;
/// use tollgate::middleware::{LimitKey, RateLimitLayer, Route};
/// use tollgate::RateLimiter;
///
/// // Keyed by peer address: with feature `axum`, read from axum's `ConnectInfo`.
/// let per_ip: RateLimiter<LimitKey> = RateLimiter::new("100/min".parse()?).max_keys(1_000_000);
/// let logins: RateLimiter<LimitKey> = RateLimiter::new("sliding-log 5 per 15m".parse()?);
/// let layer = RateLimitLayer::new(per_ip)
///     .route(Route::new(Method::POST, "/login").name("login")?, logins)
///     .exempt(Route::any("/health"));
///
/// let app: Router = Router::new()
///     .route("/", get(|| async { "ok" }))
///     .layer(layer);
/// // axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct RateLimitLayer {
    config: Arc<Config>,
}

impl RateLimitLayer {
    /// A layer limiting every request with `limiter` (a `RateLimiter<LimitKey, C, S>`, an
    /// `Arc` of one, or a `RedisLimiter`: see [`Backend`]), keyed by [`PeerIp`], with draft
    /// header fields.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::middleware::{LimitKey, RateLimitLayer};
    /// use tollgate::RateLimiter;
    ///
    /// let limiter: Arc<RateLimiter<LimitKey>> = Arc::new(RateLimiter::new("5/1s".parse()?));
    /// let layer = RateLimitLayer::new(Arc::clone(&limiter));
    /// // `limiter` is still yours: evict_idle, stats, set_policy...
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn new(limiter: impl Into<Backend>) -> Self {
        let name = "\"default\"".to_owned();
        let style = HeaderStyle::default();
        RateLimitLayer {
            config: Arc::new(Config {
                default: vec![Arc::new(Rule::new(limiter.into().0, &name, style))],
                routes: Vec::new(),
                extractor: Arc::new(PeerIp::new()),
                name,
                style,
                keys: KeyTaker::new(MissingKey::default()),
                exempt_options: true,
                shadow: false,
                grpc: true,
                on_refusal: RefusalHandler::default_response(),
            }),
        }
    }

    fn config(&mut self) -> &mut Config {
        Arc::make_mut(&mut self.config)
    }

    /// Takes keys with `extractor` (default [`PeerIp::new()`]) for every rule without its own
    /// ([`Route::key`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::middleware::{ClientIp, RateLimitLayer};
    /// use tollgate::RateLimiter;
    ///
    /// let layer = RateLimitLayer::new(RateLimiter::new("100/min".parse()?))
    ///     .key(ClientIp::trusted_hops(1));
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn key(mut self, extractor: impl KeyExtractor) -> Self {
        self.config().extractor = Arc::new(extractor);
        self
    }

    /// Limits requests matching `route` with `limiter` (any [`Backend`]) instead of the
    /// default one. Routes are tried in the order they were added,
    /// [`exempt`](RateLimitLayer::exempt) ones included; the first match decides, except
    /// that a `HEAD` request takes a matching route built for `HEAD` before any other
    /// ([`Route::new`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use http::Method;
    /// use tollgate::middleware::{RateLimitLayer, Route};
    /// use tollgate::RateLimiter;
    ///
    /// let layer = RateLimitLayer::new(RateLimiter::new("100/min".parse()?))
    ///     .route(Route::new(Method::POST, "/login"), RateLimiter::new("5/15m".parse()?))
    ///     .route(Route::any("/search"), RateLimiter::new("10/s & 1000/day".parse()?));
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn route(mut self, route: Route, limiter: impl Into<Backend>) -> Self {
        let config = self.config();
        let rule = Rule::with_terms(&route.terms, limiter.into().0, &config.name, config.style);
        config
            .routes
            .push((route, Target::Limit(vec![Arc::new(rule)])));
        self
    }

    /// Adds `limit` to the rules of the route added last (or, before any route, of the
    /// layer's default rule): the route's requests are then decided by all its limiters at
    /// once, **all or nothing**. Per user, per client address and one global budget; requests
    /// and tokens.
    ///
    /// * Allowed only if every rule allows, and then every rule has spent its cost. Refused
    ///   by one, nothing is spent anywhere: in process, the rules are taken in order and, at
    ///   the first refusal, those taken are given back at once (see
    ///   [`AllOf`](crate::AllOf)); on Redis, one script call decides them all
    ///   ([`RedisAllOf`](crate::redis::RedisAllOf)).
    /// * The answer is that of the tightest rule: the refusing rule with the longest wait
    ///   (its `Retry-After`, its name in the refusal), or, allowed, the rule with the least
    ///   left; its `RateLimit` item reports it, and `RateLimit-Policy` lists every rule's
    ///   policy (draft style).
    /// * Each rule takes its own key ([`Limit::key`], else the layer's): a rule whose key is
    ///   missing follows [`on_missing_key`](RateLimitLayer::on_missing_key), and a rule a
    ///   missing key lets through does not limit the request.
    /// * A rule with [`settle_with`](Limit::settle_with) reserves its cost and is settled
    ///   from the response; the others keep their cost spent, answered or not.
    ///
    /// The rules of one route are all in process or all on Redis (on one connection and, on
    /// a cluster, one slot: see [`RedisAllOf`](crate::redis::RedisAllOf)); put the most
    /// contended rule (a global limit) last.
    ///
    /// # Errors
    ///
    /// [`ConfigError::CannotCombine`] when the route added last is exempt; when `limit`'s
    /// limiter is in process and the route's on Redis, or the other way round, or both on
    /// Redis but on different connections; when `limit` has the name of a rule of the route
    /// already (each rule but one needs its own name: [`Limit::name`]), or a name that a
    /// composite rule's items take (`<name>-<window>`), or the other way round.
    ///
    /// Some combinations show only on a request, and are answered `500` with the cause in the
    /// log: on Redis, rules whose keys name one Redis key (the same limiter and key twice),
    /// and, on a Redis Cluster, rules whose keys are in different slots (give their limiters
    /// one [`hash_tag`](crate::redis::RedisLimiterBuilder::hash_tag)). A combination the
    /// layer cannot decide is never let through silently, except in shadow mode, which lets
    /// every request through.
    ///
    /// # Examples
    ///
    /// ```
    /// use http::Method;
    /// use tollgate::middleware::{ClientIp, HeaderKey, Limit, LimitKey, RateLimitLayer, Route};
    /// use tollgate::RateLimiter;
    ///
    /// let per_user: RateLimiter<LimitKey> = RateLimiter::new("60/min".parse()?);
    /// let per_ip: RateLimiter<LimitKey> = RateLimiter::new("100/min".parse()?);
    /// let layer = RateLimitLayer::new(RateLimiter::new("1000/min".parse()?))
    ///     .route(Route::new(Method::POST, "/v1/chat").key(HeaderKey::bearer()).name("per-user")?, per_user)
    ///     .and(Limit::new(per_ip).key(ClientIp::trusted_hops(1)).name("per-ip")?)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn and(mut self, limit: Limit) -> Result<Self, ConfigError> {
        let config = self.config();
        let (name, style) = (config.name.clone(), config.style);
        let rules = match config.routes.last_mut() {
            None => &mut config.default,
            Some((_, Target::Limit(rules))) => rules,
            Some((_, Target::Exempt)) => {
                return Err(cannot_combine(
                    limit.terms.name.as_deref(),
                    &name,
                    "the route added last is exempt",
                ));
            }
        };
        if let Some(reason) = rules
            .iter()
            .find_map(|r| r.limiter.apart_from(&limit.backend.0))
        {
            return Err(cannot_combine(limit.terms.name.as_deref(), &name, reason));
        }
        let limit_name = limit.terms.name.clone();
        let rule = Rule::with_terms(&limit.terms, limit.backend.0, &name, style);
        if rules.iter().any(|r| r.clashes_with(&rule)) {
            let reason = "one route's rules have distinct names, so that RateLimit-Policy tells them apart (Limit::name)";
            return Err(cannot_combine(limit_name.as_deref(), &name, reason));
        }
        rules.push(Arc::new(rule));
        Ok(self)
    }

    /// Lets requests matching `route` through unlimited, without fields or a `Decision`
    /// (health checks, metrics scrapes).
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::middleware::{RateLimitLayer, Route};
    /// use tollgate::RateLimiter;
    ///
    /// let layer = RateLimitLayer::new(RateLimiter::new("100/min".parse()?))
    ///     .exempt(Route::any("/health"));
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn exempt(mut self, route: Route) -> Self {
        self.config().routes.push((route, Target::Exempt));
        self
    }

    /// Which rate-limit fields responses carry (default [`HeaderStyle::Draft`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::middleware::{HeaderStyle, RateLimitLayer};
    /// use tollgate::RateLimiter;
    ///
    /// let layer = RateLimitLayer::new(RateLimiter::new("100/min".parse()?))
    ///     .headers(HeaderStyle::Legacy);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        let config = self.config();
        config.style = style;
        for rule in config.rules_mut() {
            Arc::make_mut(rule).set_style(style);
        }
        self
    }

    /// The policy name in draft fields (default `"default"`), for rules without their own
    /// ([`Route::name`]). A composite policy's bands are named `name-<window>`
    /// (`"default-1s"`, `"default-1d"`).
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidPolicyName`] unless `name` is non-empty printable ASCII;
    /// [`ConfigError::CannotCombine`] when a rule added with [`and`](RateLimitLayer::and) has
    /// this name already, beside a rule that takes the layer's name.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::middleware::RateLimitLayer;
    /// use tollgate::RateLimiter;
    ///
    /// let layer = RateLimitLayer::new(RateLimiter::new("100/min".parse()?)).policy_name("api")?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn policy_name(mut self, name: &str) -> Result<Self, ConfigError> {
        let name = headers::sf_string(name)?;
        let config = self.config();
        for rule in config.rules_mut() {
            Arc::make_mut(rule).rename(&name);
        }
        config.name = name;
        if let Some(shared) = config.shared_name() {
            return Err(ConfigError::CannotCombine {
                limit: shared,
                reason: "a rule added with `and` has this name already: rules decided together need distinct names",
            });
        }
        Ok(self)
    }

    /// How to answer a request whose key cannot be extracted (default
    /// [`MissingKey::Reject`]`(400)`).
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::middleware::{HeaderKey, MissingKey, RateLimitLayer};
    /// use tollgate::RateLimiter;
    ///
    /// // Anonymous requests share one budget; each token gets its own.
    /// let layer = RateLimitLayer::new(RateLimiter::new("100/min".parse()?))
    ///     .key(HeaderKey::bearer())
    ///     .on_missing_key(MissingKey::Shared);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn on_missing_key(mut self, answer: MissingKey) -> Self {
        self.config().keys.set_missing(answer);
        self
    }

    /// Answers refused requests with `handler` instead of the default
    /// ([`Refusal::default_response`]: `429` with `Retry-After` and a problem+json body).
    /// The handler gets what was decided (the rule's name, its limit, what remains, when to
    /// retry, whether the request was gRPC) and returns the whole response: status, headers
    /// and a body of any type that converts into [`Bytes`] (`String`, `&'static str`,
    /// `Vec<u8>`). The layer adds its rate-limit fields ([`headers`](RateLimitLayer::headers))
    /// to it and nothing else: `Retry-After` is the handler's to set.
    ///
    /// Only refusals by the limit reach the handler; a request without a key is answered as
    /// [`on_missing_key`](RateLimitLayer::on_missing_key) says, and a misconfigured cost or
    /// an unreachable Redis with their own status.
    ///
    /// # Examples
    ///
    /// ```
    /// use http::{Response, StatusCode};
    /// use tollgate::middleware::{RateLimitLayer, Refusal};
    /// use tollgate::RateLimiter;
    ///
    /// let layer = RateLimitLayer::new(RateLimiter::new("100/min".parse()?))
    ///     .on_refusal(|refusal: &Refusal| {
    ///         if refusal.is_grpc() {
    ///             return refusal.default_response();
    ///         }
    ///         let secs = refusal.retry_after().unwrap_or_default().as_secs().max(1);
    ///         let mut response = Response::new(format!("Too fast. Try again in {secs} s.").into());
    ///         *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    ///         response.headers_mut().insert("retry-after", secs.into());
    ///         response
    ///     });
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn on_refusal<F, T>(mut self, handler: F) -> Self
    where
        F: Fn(&Refusal) -> Response<T> + Send + Sync + 'static,
        T: Into<Bytes>,
    {
        self.config().on_refusal = RefusalHandler::custom(handler);
        self
    }

    /// Whether `OPTIONS` requests (CORS preflights, which browsers send on their own) pass
    /// unlimited (default `true`).
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::middleware::RateLimitLayer;
    /// use tollgate::RateLimiter;
    ///
    /// let layer = RateLimitLayer::new(RateLimiter::new("100/min".parse()?)).exempt_options(false);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn exempt_options(mut self, exempt: bool) -> Self {
        self.config().exempt_options = exempt;
        self
    }

    /// Shadow mode, to roll a limit out safely: every request is decided (spending permits
    /// exactly as enforcement would) and its [`Decision`] put in the extensions, but nothing
    /// is refused and no fields are added, so clients see no change. A handler or logging
    /// middleware finds the would-be refusals with `!decision.is_allowed()`.
    ///
    /// (A limiter built with `RateLimiter::shadow()` is different: its refusals arrive as
    /// allowed decisions marked [`would_refuse`](Decision::would_refuse), pass through, and
    /// carry the fields.)
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::middleware::RateLimitLayer;
    /// use tollgate::RateLimiter;
    ///
    /// let layer = RateLimitLayer::new(RateLimiter::new("100/min".parse()?)).shadow();
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn shadow(mut self) -> Self {
        self.config().shadow = true;
        self
    }

    /// Whether requests with `content-type: application/grpc...` are refused the gRPC way
    /// (default `true`): HTTP 200 with `grpc-status: 8` (`RESOURCE_EXHAUSTED`),
    /// `grpc-message`, `Retry-After` and the fields, and no body, which gRPC clients read as
    /// a status. With `false` they get the plain 429, which gRPC clients map to `UNAVAILABLE`.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::middleware::RateLimitLayer;
    /// use tollgate::RateLimiter;
    ///
    /// let layer = RateLimitLayer::new(RateLimiter::new("100/min".parse()?)).grpc(false);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn grpc(mut self, detect: bool) -> Self {
        self.config().grpc = detect;
        self
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::from_parts(inner, Arc::clone(&self.config))
    }
}

impl fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("config", &self.config)
            .finish()
    }
}

/// The error of a limit that [`RateLimitLayer::and`] cannot add, named by its own name
/// (`limit`) or the layer's (`layer_name`), quoted.
fn cannot_combine(limit: Option<&str>, layer_name: &str, reason: &'static str) -> ConfigError {
    ConfigError::CannotCombine {
        limit: limit.unwrap_or(layer_name).to_owned(),
        reason,
    }
}
