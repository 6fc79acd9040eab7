//! Reserve at the request, settle from the response (`Route::cost_with` and
//! `Route::settle_with`), end to end: an LLM-style route behind two stacked layers (requests
//! per minute outside, tokens per minute inside) on loopback, its handler reporting the
//! tokens it used in a header; and, through direct calls, what happens to a reservation
//! whose request gets no response. Every limiter runs on a frozen clock, so each remaining
//! budget is exact.
//!
//! `cargo test --features tower --test middleware settle::`

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Router};
use http::{HeaderMap, Method, Request, StatusCode};
use tollgate::middleware::{GlobalKey, LimitKey, PeerIp, RateLimitLayer, RequestHead, Route};
use tollgate::{Decision, FakeClock, RateLimiter};
use tower_layer::Layer;
use tower_service::Service;

use crate::http_support::{send, serve, Reply};

type Limiter = Arc<RateLimiter<LimitKey, FakeClock>>;

fn frozen(policy: &str, clock: &FakeClock) -> Limiter {
    Arc::new(RateLimiter::with_clock(
        policy.parse().unwrap(),
        clock.clone(),
    ))
}

/// The estimate: the request's `x-max-tokens` (standing in for the `max_tokens` of a JSON
/// body), 100 when it does not say.
pub fn max_tokens(head: &RequestHead<'_>) -> u64 {
    head.headers()
        .get("x-max-tokens")
        .map_or(100, |v| v.to_str().unwrap().parse().unwrap())
}

/// What the response says the request used: its `x-tokens-used`, if any.
pub fn tokens_used(response: &http::response::Parts) -> Option<u64> {
    response
        .headers
        .get("x-tokens-used")?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// The upstream: reports the tokens it used (the request's `x-use`, none without it) and
/// answers with what its `Decision` said was left.
async fn completion(headers: HeaderMap, Extension(decision): Extension<Decision>) -> Response {
    let mut response = format!("{} left", decision.remaining()).into_response();
    if let Some(used) = headers.get("x-use") {
        response.headers_mut().insert("x-tokens-used", used.clone());
    }
    response
}

/// `POST /v1/chat`: 10 requests a minute (cost 1), and 1,000 tokens a minute reserved at the
/// estimate and settled from the response; keyed by peer address.
fn llm_app(requests: &Limiter, tokens: &Limiter) -> Router {
    let peer = || PeerIp::new().connect_info(|c: &ConnectInfo<SocketAddr>| c.0.ip());
    let tokens_layer = RateLimitLayer::new(Arc::clone(tokens))
        .key(peer())
        .policy_name("tokens")
        .unwrap()
        .route(
            Route::new(Method::POST, "/v1/chat")
                .cost_with(max_tokens)
                .settle_with(tokens_used),
            Arc::clone(tokens),
        )
        .exempt(Route::any("/"));
    let requests_layer = RateLimitLayer::new(Arc::clone(requests))
        .key(peer())
        .policy_name("requests")
        .unwrap();
    Router::new()
        .route("/v1/chat", post(completion))
        .layer(tokens_layer)
        .layer(requests_layer)
}

fn chat(addr: SocketAddr, max: Option<&str>, used: Option<&str>) -> Reply {
    let mut headers = Vec::new();
    if let Some(max) = max {
        headers.push(("x-max-tokens", max));
    }
    if let Some(used) = used {
        headers.push(("x-use", used));
    }
    send(addr, "POST", "/v1/chat", &headers)
}

/// `r` of the `RateLimit` item named `name` (each layer appends its own).
fn remaining(reply: &Reply, name: &str) -> u64 {
    let prefix = format!("\"{name}\";");
    let item = reply
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("ratelimit"))
        .flat_map(|(_, v)| v.split(", "))
        .find(|item| item.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no {name} item: {reply:?}"));
    item.split(';')
        .find_map(|p| p.strip_prefix("r="))
        .unwrap()
        .parse()
        .unwrap()
}

/// The permits `key` has left now. A peek is what a request of 1 would get: allowed, it
/// counts that permit as taken.
fn left(limiter: &Limiter, key: &LimitKey) -> u64 {
    let peek = limiter.peek(key);
    peek.remaining() + u64::from(peek.is_allowed())
}

const LOOPBACK: LimitKey = LimitKey::Ip(IpAddr::V4(Ipv4Addr::LOCALHOST));

#[test]
fn reservations_settle_lower_and_higher_and_refusals_get_429_with_retry_after() {
    let clock = FakeClock::new();
    let (requests, tokens) = (frozen("10/min", &clock), frozen("1000/min", &clock));
    let addr = serve(llm_app(&requests, &tokens));
    let left = || left(&tokens, &LOOPBACK);

    // Reserved 300, used 120: 180 come back. The handler saw the reservation's decision
    // (700 left); the response's field reports the budget after the settle.
    let lower = chat(addr, Some("300"), Some("120"));
    assert_eq!(lower.status, 200, "{lower:?}");
    assert_eq!(lower.body, "700 left");
    assert_eq!(remaining(&lower, "tokens"), 880);
    assert_eq!(remaining(&lower, "requests"), 9);
    assert_eq!(lower.header("x-tokens-used"), Some("120"));
    assert_eq!(left(), 880);

    // Reserved 100, used 250: 150 more are charged.
    let higher = chat(addr, Some("100"), Some("250"));
    assert_eq!(higher.status, 200, "{higher:?}");
    assert_eq!(higher.body, "780 left");
    assert_eq!(remaining(&higher, "tokens"), 630);
    assert_eq!(left(), 630);

    // Exactly as estimated: nothing to settle.
    let exact = chat(addr, Some("30"), Some("30"));
    assert_eq!(remaining(&exact, "tokens"), 600);
    assert_eq!(left(), 600);

    // The response does not say: the estimate stays spent.
    let silent = chat(addr, Some("200"), None);
    assert_eq!(silent.status, 200, "{silent:?}");
    assert!(!silent.has("x-tokens-used"));
    assert_eq!(remaining(&silent, "tokens"), 400);
    assert_eq!(left(), 400);

    // Used 0: everything comes back. No estimate in the request: 100.
    let unused = chat(addr, None, Some("0"));
    assert_eq!(unused.body, "300 left");
    assert_eq!(remaining(&unused, "tokens"), 400);
    assert_eq!(left(), 400);

    // 400 left, 500 asked for: refused, the handler is not called, nothing is held. A token
    // bucket of 1,000 a minute refills one token per 60 ms: 100 missing is 6 s.
    let refused = chat(addr, Some("500"), Some("1"));
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(refused.header("retry-after"), Some("6"));
    assert_eq!(
        refused.header("content-type"),
        Some("application/problem+json")
    );
    assert!(
        refused.body.contains("\"retry_after\":6"),
        "{}",
        refused.body
    );
    assert_eq!(remaining(&refused, "tokens"), 400);
    assert!(!refused.has("x-tokens-used"));
    assert_eq!(left(), 400);
    // The outer layer let the request in before the inner one refused it: it counts there.
    assert_eq!(remaining(&refused, "requests"), 4);

    // An estimate no budget could ever admit is the request's fault: 400, nothing spent.
    let too_large = chat(addr, Some("5000"), None);
    assert_eq!(too_large.status, 400, "{too_large:?}");
    assert!(
        too_large
            .body
            .contains("cost 5000 is above the policy's limit of 1000"),
        "{}",
        too_large.body
    );
    assert_eq!(left(), 400);

    // Six seconds on, the 500 fit: a debt charged by a settle is waited out like any spend.
    clock.advance(std::time::Duration::from_secs(6));
    let later = chat(addr, Some("500"), Some("900"));
    assert_eq!(later.status, 200, "{later:?}");
    assert_eq!(later.body, "0 left");
    assert_eq!(remaining(&later, "tokens"), 0);
    assert!(!tokens.peek(&LOOPBACK).is_allowed());
    let in_debt = chat(addr, Some("1"), None);
    assert_eq!(in_debt.status, 429, "{in_debt:?}");
    // 400 over the limit plus the 1 asked for: 401 tokens at 60 ms each, 24.06 s.
    assert_eq!(in_debt.header("retry-after"), Some("25"));
}

// ---------------------------------------------------------------------------------------
// No response: an inner service that fails, a future dropped before the answer.

/// Answers `Err` for `POST /fail`, never for anything else.
#[derive(Clone)]
struct Upstream;

impl Service<Request<Body>> for Upstream {
    type Response = http::Response<Body>;
    type Error = &'static str;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        if request.uri().path() == "/fail" {
            Box::pin(std::future::ready(Err("upstream unreachable")))
        } else {
            Box::pin(std::future::pending())
        }
    }
}

#[test]
fn a_request_without_a_response_gives_its_reservation_back() {
    let clock = FakeClock::new();
    let tokens = frozen("1000/min", &clock);
    let mut service = RateLimitLayer::new(Arc::clone(&tokens))
        .key(GlobalKey)
        .route(
            Route::any("/").cost(400).unwrap().settle_with(tokens_used),
            Arc::clone(&tokens),
        )
        .layer(Upstream);
    let request = |path: &str| Request::post(path).body(Body::empty()).unwrap();
    let left = || left(&tokens, &LimitKey::Global);
    let waker = std::task::Waker::noop();
    let mut cx = Context::from_waker(waker);

    // The inner service fails: the reservation is cancelled.
    let mut failing = Box::pin(service.call(request("/fail")));
    assert_eq!(left(), 600, "reserved before the inner service answered");
    match failing.as_mut().poll(&mut cx) {
        Poll::Ready(Err(error)) => assert_eq!(error, "upstream unreachable"),
        other => panic!("{:?}", other.map(|r| r.map(|_| ()))),
    }
    assert_eq!(left(), 1000);

    // The client went away before the answer: dropping the future cancels it too.
    let mut pending = Box::pin(service.call(request("/slow")));
    assert!(pending.as_mut().poll(&mut cx).is_pending());
    let second = service.call(request("/slow"));
    assert_eq!(left(), 200);
    drop(pending);
    assert_eq!(left(), 600);
    drop(second);
    assert_eq!(left(), 1000);
}

#[test]
fn a_settled_response_reports_the_budget_after_the_settle_in_x_ratelimit_fields_too() {
    let clock = FakeClock::new();
    let tokens = frozen("1000/min", &clock);
    let router: Router =
        Router::new().route("/", post(|| async { ([("x-tokens-used", "10")], "ok") }));
    let mut service = RateLimitLayer::new(Arc::clone(&tokens))
        .key(GlobalKey)
        .headers(tollgate::middleware::HeaderStyle::XRateLimit)
        .route(
            Route::any("/").cost(500).unwrap().settle_with(tokens_used),
            Arc::clone(&tokens),
        )
        .layer(router);
    let response = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(service.call(Request::post("/").body(Body::empty()).unwrap()))
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["x-ratelimit-limit"], "1000");
    assert_eq!(response.headers()["x-ratelimit-remaining"], "990");
    assert_eq!(left(&tokens, &LimitKey::Global), 990);
}

#[test]
fn a_computed_cost_alone_is_spent_and_shadow_mode_still_settles() {
    let clock = FakeClock::new();
    let tokens = frozen("1000/min", &clock);
    let used_10: Router =
        Router::new().route("/", post(|| async { ([("x-tokens-used", "10")], "ok") }));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let ask = |max: &str| {
        Request::post("/")
            .header("x-max-tokens", max)
            .body(Body::empty())
            .unwrap()
    };

    // `cost_with` without `settle_with`: the computed cost is spent, whatever the response
    // says; a computed 0 counts as 1.
    let mut spend = RateLimitLayer::new(Arc::clone(&tokens))
        .key(GlobalKey)
        .route(Route::any("/").cost_with(max_tokens), Arc::clone(&tokens))
        .layer(used_10.clone());
    let response = runtime.block_on(spend.call(ask("300"))).unwrap();
    assert_eq!(response.headers()["ratelimit"], "\"default\";r=700;t=18");
    runtime.block_on(spend.call(ask("0"))).unwrap();
    assert_eq!(left(&tokens, &LimitKey::Global), 699);

    // The layer's shadow mode spends and settles as enforcement would, and shows nothing.
    let mut shadow = RateLimitLayer::new(Arc::clone(&tokens))
        .key(GlobalKey)
        .shadow()
        .route(
            Route::any("/")
                .cost_with(max_tokens)
                .settle_with(tokens_used),
            Arc::clone(&tokens),
        )
        .layer(used_10);
    let response = runtime.block_on(shadow.call(ask("600"))).unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(!response.headers().contains_key("ratelimit"));
    assert_eq!(left(&tokens, &LimitKey::Global), 689);
    // Would be refused (689 left): let through, nothing held, nothing settled.
    let response = runtime.block_on(shadow.call(ask("900"))).unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(left(&tokens, &LimitKey::Global), 689);
}

/// A `settle_with` that panics on a response: no response goes out, and the reservation
/// comes back, as for any request that got no response.
#[test]
fn a_settle_with_that_panics_gives_the_reservation_back() {
    let clock = FakeClock::new();
    let tokens = frozen("1000/min", &clock);
    let router: Router = Router::new().route("/", post(|| async { "ok" }));
    let panics =
        |_: &http::response::Parts| -> Option<u64> { panic!("a usage header it cannot read") };
    let mut service = RateLimitLayer::new(Arc::clone(&tokens))
        .key(GlobalKey)
        .route(
            Route::any("/").cost(400).unwrap().settle_with(panics),
            Arc::clone(&tokens),
        )
        .layer(router);
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let mut future = Box::pin(service.call(Request::post("/").body(Body::empty()).unwrap()));
    assert_eq!(left(&tokens, &LimitKey::Global), 600);
    let polled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        (0..100).any(|_| future.as_mut().poll(&mut cx).is_ready())
    }));
    assert!(polled.is_err(), "the settle's panic reached the caller");
    drop(future);
    assert_eq!(left(&tokens, &LimitKey::Global), 1000);
}
