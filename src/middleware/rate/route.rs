//! Which rule a request takes: [`Route`], a method and a path prefix, with the rule's key,
//! name and cost.

use std::fmt;
use std::sync::Arc;

use http::{response, Method};

use crate::middleware::error::ConfigError;
use crate::middleware::headers;
use crate::middleware::key::{KeyExtractor, RequestHead};
#[cfg(doc)]
use crate::{Decision, RateLimiter};

/// A route's cost computed from each request ([`Route::cost_with`]).
pub(super) type CostFn = dyn Fn(&RequestHead<'_>) -> u64 + Send + Sync;

/// What a response says its request really cost ([`Route::settle_with`]).
pub(super) type SettleFn = dyn Fn(&response::Parts) -> Option<u64> + Send + Sync;

/// Which requests a per-route rule applies to: an optional method and a path prefix.
///
/// The prefix matches whole path segments: `/api` matches `/api`, `/api/` and `/api/users`,
/// not `/apix`; a prefix ending in `/` matches any path that starts with it. Matching is on
/// the path exactly as received (case-sensitive, percent-escapes not decoded), so if your
/// router normalises paths, attach the layer to the route itself (axum's `route_layer`)
/// rather than relying on prefixes.
///
/// # Examples
///
/// ```
/// use http::Method;
/// use tollgate::middleware::{ClientIp, Route};
///
/// let login = Route::new(Method::POST, "/login").key(ClientIp::trusted_hops(1));
/// let api = Route::any("/api").name("api")?;
/// # Ok::<(), tollgate::middleware::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct Route {
    pub(super) method: Option<Method>,
    pub(super) prefix: String,
    /// The rule's name, key, cost and settle.
    pub(super) terms: Terms,
}

/// How a rule keys, costs, names and settles its requests: a [`Route`]'s, or a
/// [`Limit`](super::Limit)'s decided with it. Each setter checks its value here, once.
#[derive(Clone)]
pub(super) struct Terms {
    pub(super) name: Option<String>,
    pub(super) extractor: Option<Arc<dyn KeyExtractor>>,
    /// Permits each request spends (1 unless `cost` says otherwise).
    pub(super) cost: u64,
    /// The cost computed from each request instead of `cost`.
    pub(super) cost_with: Option<Arc<CostFn>>,
    /// Settles each request's cost from its response.
    pub(super) settle: Option<Arc<SettleFn>>,
}

impl Default for Terms {
    fn default() -> Self {
        Terms {
            name: None,
            extractor: None,
            cost: 1,
            cost_with: None,
            settle: None,
        }
    }
}

impl Terms {
    pub(super) fn name(&mut self, name: &str) -> Result<(), ConfigError> {
        self.name = Some(headers::sf_string(name)?);
        Ok(())
    }

    pub(super) fn cost(&mut self, permits: u64) -> Result<(), ConfigError> {
        if permits == 0 {
            return Err(ConfigError::InvalidCost { cost: permits });
        }
        self.cost = permits;
        self.cost_with = None;
        Ok(())
    }
}

impl fmt::Debug for Terms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Terms")
            .field("name", &self.name)
            .field("custom_key", &self.extractor.is_some())
            .field("cost", &self.cost)
            .field("cost_with", &self.cost_with.is_some())
            .field("settles", &self.settle.is_some())
            .finish()
    }
}

impl Route {
    /// Requests with this method under `prefix`.
    ///
    /// A `GET` route also matches `HEAD` requests: axum and hyper routers answer `HEAD` with
    /// the `GET` handler, so a `HEAD` costs what the `GET` does, counted against the same
    /// limiter, and cannot reach the resource around the route's limit. A route built for
    /// `HEAD` matches `HEAD` only, and wins over every `GET` (or any-method) route for a
    /// `HEAD` request whatever the order they were added in: the exception to "the first
    /// match decides".
    ///
    /// # Examples
    ///
    /// ```
    /// use http::Method;
    /// use tollgate::middleware::Route;
    ///
    /// let login = Route::new(Method::POST, "/login");
    /// // Limits `GET /export` and `HEAD /export` alike.
    /// let export = Route::new(Method::GET, "/export");
    /// ```
    #[must_use]
    pub fn new(method: Method, prefix: &str) -> Self {
        Route {
            method: Some(method),
            ..Route::any(prefix)
        }
    }

    /// Requests of any method under `prefix`.
    ///
    /// # Examples
    ///
    /// ```
    /// let api = tollgate::middleware::Route::any("/api");
    /// ```
    #[must_use]
    pub fn any(prefix: &str) -> Self {
        let prefix = if prefix.starts_with('/') {
            prefix.to_owned()
        } else {
            format!("/{prefix}")
        };
        Route {
            method: None,
            prefix,
            terms: Terms::default(),
        }
    }

    /// Names this rule's policy in the `RateLimit-Policy` field (default: the layer's
    /// [`policy_name`](super::RateLimitLayer::policy_name)).
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidPolicyName`] unless `name` is non-empty printable ASCII.
    ///
    /// # Examples
    ///
    /// ```
    /// let uploads = tollgate::middleware::Route::any("/upload").name("uploads")?;
    /// # Ok::<(), tollgate::middleware::ConfigError>(())
    /// ```
    pub fn name(mut self, name: &str) -> Result<Self, ConfigError> {
        self.terms.name(name)?;
        Ok(self)
    }

    /// Takes this rule's keys with `extractor` instead of the layer's.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::middleware::{HeaderKey, Route};
    ///
    /// let api = Route::any("/api").key(HeaderKey::bearer());
    /// ```
    #[must_use]
    pub fn key(mut self, extractor: impl KeyExtractor) -> Self {
        self.terms.extractor = Some(Arc::new(extractor));
        self
    }

    /// Makes each request of this rule spend `permits` instead of 1: an export or a search
    /// that costs the backend ten times a plain read can cost ten times the quota. Give
    /// several routes the same limiter (one `Arc`) for one budget that requests draw on by
    /// weight. The last of `cost` and [`cost_with`](Route::cost_with) called decides.
    /// Ignored for exempt routes.
    ///
    /// A request is refused (429, `Retry-After` saying when `permits` are available) unless
    /// all of them are; a refusal spends none. A cost above the policy's permits (the
    /// smallest band's, for a composite policy) could never be admitted: such a request is
    /// answered `500 Internal Server Error` with a problem+json naming the cost and the
    /// limit, since it is the configuration, not the client, that is wrong (in shadow mode
    /// it is let through, like every request).
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidCost`] for 0.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use tollgate::middleware::{LimitKey, RateLimitLayer, Route};
    /// use tollgate::RateLimiter;
    ///
    /// // One budget of 600 per minute: a read costs 1, an export 20.
    /// let quota: Arc<RateLimiter<LimitKey>> = Arc::new(RateLimiter::new("600/min".parse()?));
    /// let layer = RateLimitLayer::new(quota.clone())
    ///     .route(Route::any("/export").cost(20)?, quota);
    /// assert!(Route::any("/export").cost(0).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cost(mut self, permits: u64) -> Result<Self, ConfigError> {
        self.terms.cost(permits)?;
        Ok(self)
    }

    /// Makes each request of this rule spend what `cost` computes from the request's head,
    /// instead of a fixed [`cost`](Route::cost): the `max_tokens` an LLM request asks for, an
    /// upload's `content-length`. The layer never reads the body: to cost a request by
    /// something in its body, parse it in a middleware before this layer and put the number
    /// in the extensions. The last of `cost` and `cost_with` called decides. Ignored for
    /// exempt routes.
    ///
    /// A computed cost of 0 counts as 1. A request is refused (429, `Retry-After` saying when
    /// its cost is available) unless all of it is; a refusal spends none. A cost above the
    /// policy's permits (the smallest band's, for a composite policy) could never be
    /// admitted: the request asks for more than the limit allows, so it is answered
    /// `400 Bad Request` with a problem+json naming its cost and the limit (gRPC
    /// `INVALID_ARGUMENT`; in shadow mode it is let through).
    ///
    /// With [`settle_with`](Route::settle_with), the cost is an estimate: reserved at the
    /// request, settled at what the response reports.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::middleware::{RateLimitLayer, RequestHead, Route};
    /// use tollgate::RateLimiter;
    ///
    /// // An upload spends its size in KiB (1 MiB when it does not say) out of 100 MiB a minute.
    /// let kib = |head: &RequestHead<'_>| {
    ///     let length = head.headers().get("content-length").and_then(|v| v.to_str().ok());
    ///     length.and_then(|v| v.parse::<u64>().ok()).map_or(1024, |bytes| bytes.div_ceil(1024))
    /// };
    /// let layer = RateLimitLayer::new(RateLimiter::new("100/min".parse()?))
    ///     .route(Route::any("/upload").cost_with(kib), RateLimiter::new("102400/min".parse()?));
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn cost_with(
        mut self,
        cost: impl Fn(&RequestHead<'_>) -> u64 + Send + Sync + 'static,
    ) -> Self {
        self.terms.cost_with = Some(Arc::new(cost));
        self
    }

    /// Settles each request of this rule at what its response says it really cost: the
    /// request's cost ([`cost`](Route::cost), [`cost_with`](Route::cost_with), 1 by default)
    /// becomes an estimate, reserved before the inner service is called
    /// ([`RateLimiter::reserve_n`]) and settled when the response arrives
    /// ([`RateLimiter::settle`]). The tokens an LLM call used are known only once it ran:
    /// reserve the request's `max_tokens`, settle at the usage the upstream reports.
    ///
    /// * The reservation is decided as the cost would be: refused, the request gets the
    ///   usual 429 with `Retry-After`, the inner service is not called, nothing is held.
    /// * `actual` returns `Some(n)`: the reservation is settled at `n`. What the request did
    ///   not use comes back; what it used on top is charged at once, even past the limit, and
    ///   later requests wait the debt out. `Some(0)` gives everything back.
    /// * `None` (the response does not say: an upstream error without a usage header): the
    ///   estimate stays spent, as for a route without `settle_with`. Return `Some(0)` for
    ///   the answers you know cost nothing.
    /// * The inner service fails (`Err`), or the response future is dropped before the
    ///   response arrived (the client went away, an outer timeout fired): the reservation is
    ///   cancelled and everything comes back. A request that got no answer is not counted,
    ///   so a client that hangs up early gets its estimate back even if the upstream did
    ///   some work: pair the route with a per-request limit (a second layer) to bound that.
    ///
    /// `actual` sees the response's head (status, headers, extensions) as the inner service
    /// returned it, when the response future completes: a usage reported only in the body or
    /// the trailers (the last event of a streamed completion) comes too late for it. An
    /// allowed response's rate-limit fields report the budget after the settle (`r` exact,
    /// `t` an upper bound by one permit's time at most); when nothing was settled (`None`),
    /// the budget as the request was decided. The
    /// [`Decision`] in the request's extensions is the reservation's, at the estimate.
    ///
    /// A rule decided by a `RedisLimiter` settles too: the estimate is reserved in Redis
    /// (`RedisLimiter::reserve_n`) before the inner service is called, and settled there
    /// from the response on a task of its own, on the tokio runtime the response is polled
    /// on, so that no response waits for a Redis round trip. Its fields stay those decided
    /// at the request. A settle that cannot reach Redis (or a response polled outside a
    /// tokio runtime) leaves the estimate spent, which never admits more than the policy.
    /// Ignored for exempt routes.
    ///
    /// # Examples
    ///
    /// ```
    /// use http::Method;
    /// use tollgate::middleware::{RateLimitLayer, Route};
    /// use tollgate::RateLimiter;
    ///
    /// // A report costs 1 to 50 units: reserve 50, settle at the `x-units` it answers with.
    /// let reports = Route::new(Method::POST, "/report")
    ///     .cost(50)?
    ///     .settle_with(|response| response.headers.get("x-units")?.to_str().ok()?.parse().ok());
    /// let layer = RateLimitLayer::new(RateLimiter::new("100/min".parse()?))
    ///     .route(reports, RateLimiter::new("1000/hour".parse()?));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[must_use]
    pub fn settle_with(
        mut self,
        actual: impl Fn(&response::Parts) -> Option<u64> + Send + Sync + 'static,
    ) -> Self {
        self.terms.settle = Some(Arc::new(actual));
        self
    }

    pub(super) fn matches(&self, method: &Method, path: &str) -> bool {
        // A GET handler serves HEAD too (see `Route::new`).
        let served_by =
            |route: &Method| route == method || (*route == Method::GET && *method == Method::HEAD);
        if self.method.as_ref().is_some_and(|m| !served_by(m)) {
            return false;
        }
        match path.strip_prefix(self.prefix.as_str()) {
            Some(rest) => self.prefix.ends_with('/') || rest.is_empty() || rest.starts_with('/'),
            None => false,
        }
    }
}

impl fmt::Debug for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Route")
            .field("method", &self.method)
            .field("prefix", &self.prefix)
            .field("terms", &self.terms)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_match_whole_segments() {
        let api = Route::any("/api");
        for path in ["/api", "/api/", "/api/users"] {
            assert!(api.matches(&Method::GET, path), "{path}");
        }
        for path in ["/apix", "/ap", "/", "/v1/api"] {
            assert!(!api.matches(&Method::GET, path), "{path}");
        }
        let slash = Route::any("/static/");
        assert!(slash.matches(&Method::GET, "/static/app.js"));
        assert!(!slash.matches(&Method::GET, "/static"));
        assert!(Route::any("/").matches(&Method::GET, "/anything"));
        assert!(Route::any("login").matches(&Method::GET, "/login"));
        let post = Route::new(Method::POST, "/login");
        assert!(post.matches(&Method::POST, "/login"));
        assert!(!post.matches(&Method::GET, "/login"));
        assert!(!post.matches(&Method::HEAD, "/login"));
    }

    #[test]
    fn get_routes_match_head_requests_and_head_routes_only_head() {
        let get = Route::new(Method::GET, "/export");
        assert!(get.matches(&Method::GET, "/export"));
        assert!(get.matches(&Method::HEAD, "/export"));
        assert!(!get.matches(&Method::POST, "/export"));
        let head = Route::new(Method::HEAD, "/export");
        assert!(head.matches(&Method::HEAD, "/export"));
        assert!(!head.matches(&Method::GET, "/export"));
    }
}
