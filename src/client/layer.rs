//! [`ThrottleLayer`]: a tower layer for outgoing requests, and its service [`Throttled`].

use std::fmt;
use std::future::Future;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{request, response, Request, Response};
use tower_layer::Layer;
use tower_service::Service;

use super::error::{BoxError, ThrottleError};
use super::throttle::Throttle;

type KeyFn = Arc<dyn Fn(&request::Parts) -> Option<String> + Send + Sync>;
type CostFn = Arc<dyn Fn(&request::Parts) -> u64 + Send + Sync>;
type SettleFn = Arc<dyn Fn(&response::Parts) -> Option<u64> + Send + Sync>;

/// A tower layer for a client: every outgoing request waits for its permit from a
/// [`Throttle`], goes out, and its answer teaches the throttle what the upstream said
/// (`429` and `Retry-After`, the `RateLimit` fields). Works with any tower client whose
/// requests are `http::Request`s: hyper-util's client, a tonic `Channel`, or a `Service`
/// written around another client.
///
/// * Key: the request's host (from its URI, else its `Host` field) unless
///   [`key_with`](ThrottleLayer::key_with) says otherwise; a request with neither fails
///   with [`ThrottleError::NoKey`]. Every spelling of one host is one key: a name in
///   lowercase without one trailing dot (`API.example.com.` is `api.example.com`), an IP
///   address in its canonical text (`[2001:DB8:0:0:0:0:0:1]` is `[2001:db8::1]`), an
///   IPv4-mapped IPv6 address as its IPv4 address (`[::ffff:192.0.2.1]` is `192.0.2.1`).
///   The port is not part of the key. A host that the standard library does not read as
///   an address (`127.1`, an IPv6 zone) is keyed as a name, as written.
/// * Cost: 1, or [`cost_with`](ThrottleLayer::cost_with) (estimated tokens).
/// * Settled from the answer with [`settle_with`](ThrottleLayer::settle_with) (the tokens
///   the provider reports in a header); for a cost reported in the body, use the
///   [`Throttle`] directly ([`Throttle::reserve_n`], then [`Admission::settle`](super::Admission::settle)).
///
/// The service's error is [`ThrottleError`]: the inner client's errors come as
/// [`ThrottleError::Upstream`]. The inner service must be `Clone` (clients are: they share a
/// connection pool); each call is sent on a clone readied by `poll_ready`.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::convert::Infallible;
/// use http::{Request, Response};
/// use tower_layer::Layer;
/// use tower_service::Service;
/// use tollgate::client::{Throttle, ThrottleLayer};
///
/// // Any tower client: here one that answers every request itself.
/// #[derive(Clone)]
/// struct Upstream;
/// impl Service<Request<()>> for Upstream {
///     type Response = Response<()>;
///     type Error = Infallible;
///     type Future = std::future::Ready<Result<Response<()>, Infallible>>;
///     fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Infallible>> {
///         std::task::Poll::Ready(Ok(()))
///     }
///     fn call(&mut self, _: Request<()>) -> Self::Future {
///         std::future::ready(Ok(Response::builder().header("ratelimit", "\"d\";r=9;t=1").body(()).unwrap()))
///     }
/// }
///
/// let layer = ThrottleLayer::new(Throttle::quota("10/1s".parse()?)?);
/// let mut client = layer.layer(Upstream);
/// let response = client.call(Request::get("https://api.example.com/v1/items").body(())?).await?;
/// assert_eq!(response.status(), 200);
/// assert_eq!(layer.throttle().stats().adjustments, 1);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct ThrottleLayer {
    throttle: Throttle,
    key: KeyFn,
    cost: Option<CostFn>,
    settle: Option<SettleFn>,
}

impl ThrottleLayer {
    /// A layer taking each request's permit from `throttle`, keyed by the request's host,
    /// one key for every spelling of it (see [`ThrottleLayer`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::client::{Throttle, ThrottleLayer};
    /// let layer = ThrottleLayer::new(Throttle::quota("20/1s".parse()?)?);
    /// # let _ = layer;
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub fn new(throttle: Throttle) -> Self {
        ThrottleLayer {
            throttle,
            key: Arc::new(host),
            cost: None,
            settle: None,
        }
    }

    /// Keys each request by `key` instead of its host (the API key in use, the account);
    /// `None` fails the request with [`ThrottleError::NoKey`].
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::client::{Throttle, ThrottleLayer};
    /// let layer = ThrottleLayer::new(Throttle::quota("20/1s".parse()?)?).key_with(|request| {
    ///     let key = request.headers.get("x-api-key")?.to_str().ok()?;
    ///     Some(key.to_owned())
    /// });
    /// # let _ = layer;
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn key_with(
        mut self,
        key: impl Fn(&request::Parts) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.key = Arc::new(key);
        self
    }

    /// Each request costs `cost` of it (estimated tokens) instead of 1.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::client::{Throttle, ThrottleLayer};
    /// let layer = ThrottleLayer::new(Throttle::quota("20/1s".parse()?)?).cost_with(|request| {
    ///     request.headers.get("x-estimated-tokens")
    ///         .and_then(|v| v.to_str().ok()?.parse().ok())
    ///         .unwrap_or(1)
    /// });
    /// # let _ = layer;
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn cost_with(
        mut self,
        cost: impl Fn(&request::Parts) -> u64 + Send + Sync + 'static,
    ) -> Self {
        self.cost = Some(Arc::new(cost));
        self
    }

    /// Reserves each request's cost and settles it at what `settle` reads from the answer
    /// (the tokens the provider reports it used); `None` leaves the estimate spent.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::client::{Throttle, ThrottleLayer};
    /// let layer = ThrottleLayer::new(Throttle::quota("20/1s".parse()?)?)
    ///     .settle_with(|answer| answer.headers.get("x-tokens-used")?.to_str().ok()?.parse().ok());
    /// # let _ = layer;
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn settle_with(
        mut self,
        settle: impl Fn(&response::Parts) -> Option<u64> + Send + Sync + 'static,
    ) -> Self {
        self.settle = Some(Arc::new(settle));
        self
    }

    /// The throttle the layer takes permits from: for its [`stats`](Throttle::stats), or to
    /// take permits outside the layer from the same budget.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::client::{Throttle, ThrottleLayer};
    /// let layer = ThrottleLayer::new(Throttle::quota("20/1s".parse()?)?);
    /// assert_eq!(layer.throttle().stats().admitted, 0);
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    #[must_use]
    pub fn throttle(&self) -> &Throttle {
        &self.throttle
    }
}

/// The default key: the host the request goes to, from its URI, else its `Host` field, as
/// [`host_key`] writes it.
fn host(request: &request::Parts) -> Option<String> {
    if let Some(host) = request.uri.host() {
        return Some(host_key(host));
    }
    let field = request.headers.get(http::header::HOST)?.to_str().ok()?;
    let authority: http::uri::Authority = field.parse().ok()?;
    Some(host_key(authority.host()))
}

/// One key for every spelling of a host that reaches the same place, so that no upstream
/// gets a quota per spelling: a name in lowercase without one trailing dot
/// (`API.example.com.` is `api.example.com`), an IP address in its canonical text (std's:
/// `[2001:DB8:0:0:0:0:0:1]` is `[2001:db8::1]`), an IPv4-mapped IPv6 address as its IPv4
/// address (`[::ffff:192.0.2.1]` is `192.0.2.1`, the host it reaches). A host that std
/// does not read as an address (`127.1`, a zone in brackets) is kept as a name.
fn host_key(host: &str) -> String {
    let lower = host.to_ascii_lowercase();
    let name = match lower.strip_suffix('.') {
        // A name of a dot alone stays itself: an empty key would be no host.
        Some(name) if !name.is_empty() => name,
        _ => &lower,
    };
    if let Some(literal) = name
        .strip_prefix('[')
        .and_then(|rest| rest.strip_suffix(']'))
    {
        return match literal.parse::<Ipv6Addr>() {
            Ok(ip) => match ip.to_ipv4_mapped() {
                Some(ip) => ip.to_string(),
                None => format!("[{ip}]"),
            },
            Err(_) => name.to_owned(),
        };
    }
    match name.parse::<Ipv4Addr>() {
        Ok(ip) => ip.to_string(),
        Err(_) => name.to_owned(),
    }
}

impl fmt::Debug for ThrottleLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ThrottleLayer")
            .field("throttle", &self.throttle)
            .field("cost", &self.cost.is_some())
            .field("settle", &self.settle.is_some())
            .finish_non_exhaustive()
    }
}

impl<S> Layer<S> for ThrottleLayer {
    type Service = Throttled<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Throttled {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of a [`ThrottleLayer`]: waits for each request's permit, then calls the
/// inner client.
#[derive(Clone, Debug)]
pub struct Throttled<S> {
    inner: S,
    layer: ThrottleLayer,
}

/// The future of a [`Throttled`] call: the wait for a permit, then the inner call.
pub struct ResponseFuture<R> {
    inner: Pin<Box<dyn Future<Output = Result<Response<R>, ThrottleError>> + Send>>,
}

impl<R> Future for ResponseFuture<R> {
    type Output = Result<Response<R>, ThrottleError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<R> fmt::Debug for ResponseFuture<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResponseFuture")
    }
}

impl<S, B, R> Service<Request<B>> for Throttled<S>
where
    S: Service<Request<B>, Response = Response<R>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    B: Send + 'static,
    R: Send + 'static,
{
    type Response = Response<R>;
    type Error = ThrottleError;
    type Future = ResponseFuture<R>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ThrottleError>> {
        self.inner
            .poll_ready(cx)
            .map_err(|err| ThrottleError::Upstream(err.into()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let (parts, body) = request.into_parts();
        let key = (self.layer.key)(&parts);
        let cost = self.layer.cost.as_ref().map_or(1, |cost| cost(&parts));
        let request = Request::from_parts(parts, body);
        // The readied service goes with this call; the clone waits for the next.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let throttle = self.layer.throttle.clone();
        let settle = self.layer.settle.clone();
        ResponseFuture {
            inner: Box::pin(async move {
                let key = key.ok_or(ThrottleError::NoKey)?;
                let mut admission = if settle.is_some() {
                    throttle.reserve_n(&key, cost).await?
                } else {
                    throttle.acquire_n(&key, cost).await?
                };
                let response = inner
                    .call(request)
                    .await
                    .map_err(|err| ThrottleError::Upstream(err.into()))?;
                admission.heard(response.status(), response.headers());
                let Some(settle) = settle else {
                    return Ok(response);
                };
                let (parts, body) = response.into_parts();
                if let Some(actual) = settle(&parts) {
                    // The call was answered: a cost that cannot be settled (Redis down) is
                    // logged, not turned into a failed call.
                    if let Err(err) = admission.settle(actual).await {
                        log::warn!("tollgate: a throttled call's cost was not settled: {err}");
                    }
                }
                Ok(Response::from_parts(parts, body))
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::host_key;

    #[test]
    fn a_host_key_is_one_spelling_of_its_host() {
        for (host, key) in [
            ("api.example.com", "api.example.com"),
            ("API.Example.com.", "api.example.com"),
            // One trailing dot only: two are another name, and a dot alone stays a name.
            ("api.example.com..", "api.example.com."),
            (".", "."),
            ("localhost.", "localhost"),
            ("[2001:DB8:0:0:0:0:0:1]", "[2001:db8::1]"),
            ("[2001:0db8:0000::0001]", "[2001:db8::1]"),
            ("[::1]", "[::1]"),
            ("[0:0:0:0:0:0:0:1]", "[::1]"),
            ("[::ffff:192.0.2.1]", "192.0.2.1"),
            ("[::FFFF:C000:0201]", "192.0.2.1"),
            // IPv4-compatible (deprecated) is not mapped: an IPv6 address of its own.
            ("[::192.0.2.1]", "[::c000:201]"),
            ("192.0.2.1", "192.0.2.1"),
            ("192.0.2.1.", "192.0.2.1"),
            // Not an address to std: names, as written.
            ("127.1", "127.1"),
            ("127.000.000.001", "127.000.000.001"),
            ("[fe80::1%25eth0]", "[fe80::1%25eth0]"),
            ("[not an address]", "[not an address]"),
            ("", ""),
        ] {
            assert_eq!(host_key(host), key, "{host}");
        }
    }
}
