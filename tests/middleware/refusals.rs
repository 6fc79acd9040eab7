//! Every layer's refusal handler (`on_refusal`): called with what was decided, its response
//! sent instead of the default, and not called for requests that pass.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::in_place::{body_text, call};
use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, Response, StatusCode};
use tollgate::concurrency::ConcurrencyLimiter;
use tollgate::login::LoginGuard;
use tollgate::middleware::{
    ConcurrencyLimitLayer, GlobalKey, LoginLayer, RateLimitLayer, Refusal, Refused, Route,
};
use tollgate::RateLimiter;
use tower_layer::Layer;

const PEER: &str = "192.0.2.1:5000";

fn request(path: &str) -> Request<Body> {
    let mut request = Request::get(path).body(Body::empty()).unwrap();
    request
        .extensions_mut()
        .insert(PEER.parse::<SocketAddr>().unwrap());
    request
}

/// A handler that counts its calls, keeps the last refusal and answers 503 in plain text.
fn recording_handler(
    calls: &Arc<AtomicUsize>,
    seen: &Arc<Mutex<Option<Refusal>>>,
) -> impl Fn(&Refusal) -> Response<String> + Send + Sync + 'static {
    let (calls, seen) = (Arc::clone(calls), Arc::clone(seen));
    move |refusal: &Refusal| {
        calls.fetch_add(1, Ordering::SeqCst);
        *seen.lock().unwrap() = Some(refusal.clone());
        let mut response = Response::new(format!("custom: {:?}", refusal.limit()));
        *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        response
    }
}

#[test]
fn the_rate_layer_answers_refusals_with_the_handler() {
    let (calls, seen) = Default::default();
    let reports = Route::any("/reports").name("reports").unwrap();
    let layer = RateLimitLayer::new(RateLimiter::new("100/min".parse().unwrap()))
        .key(GlobalKey)
        .route(reports, RateLimiter::new("2/min".parse().unwrap()))
        .on_refusal(recording_handler(&calls, &seen));
    let router = Router::new().route("/reports", get(|| async { "report" }));
    let mut service = layer.layer(router);

    for _ in 0..2 {
        let response = call(&mut service, request("/reports"));
        assert_eq!(response.status(), StatusCode::OK);
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "not called for allowed requests"
    );

    let refused = call(&mut service, request("/reports"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    // The layer adds its rate-limit fields to the handler's answer, and nothing else.
    assert_eq!(refused.headers()["ratelimit"], "\"reports\";r=0;t=60");
    assert!(!refused.headers().contains_key("retry-after"));
    assert_eq!(body_text(refused), "custom: Some(2)");

    let refusal = seen.lock().unwrap().take().unwrap();
    assert_eq!(refusal.rule(), Some("reports"));
    assert_eq!((refusal.limit(), refusal.remaining()), (Some(2), 0));
    let wait = refusal.retry_after().unwrap();
    assert!(
        wait > Duration::from_secs(29) && wait <= Duration::from_secs(30),
        "{wait:?}"
    );
    assert!(!refusal.is_grpc());
    assert!(matches!(refusal.refused(), Refused::Rate { decision, .. } if !decision.is_allowed()));
    // What the layer sends without a handler.
    let default = refusal.default_response();
    assert_eq!(default.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(default.headers()["retry-after"], "30");
    assert_eq!(
        default.headers()["content-type"],
        "application/problem+json"
    );
}

#[test]
fn the_concurrency_layer_answers_refusals_with_the_handler() {
    let (calls, seen) = Default::default();
    let limiter = Arc::new(ConcurrencyLimiter::new(1));
    let mut service = ConcurrencyLimitLayer::new(Arc::clone(&limiter))
        .on_refusal(recording_handler(&calls, &seen))
        .layer(Router::new().route("/", get(|| async { "ok" })));

    // The first response's body holds the client's only place while it is kept.
    let held = call(&mut service, request("/"));
    assert_eq!(held.status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    let refused = call(&mut service, request("/"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body_text(refused), "custom: Some(1)");
    let refusal = seen.lock().unwrap().take().unwrap();
    assert_eq!(refusal.refused(), &Refused::Concurrency { limit: 1 });
    assert_eq!(refusal.retry_after(), None);

    drop(held);
    assert_eq!(call(&mut service, request("/")).status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn the_login_layer_answers_refusals_with_the_handler() {
    let (calls, seen) = Default::default();
    let guard = Arc::new(LoginGuard::new());
    let peer: SocketAddr = PEER.parse().unwrap();
    let client: IpAddr = peer.ip();
    // Fail until the guard refuses the account for this client.
    for _ in 0..1_000 {
        if !guard.check("alice", client).is_allowed() {
            break;
        }
        let _ = guard.record_failure("alice", client);
    }
    assert!(!guard.check("alice", client).is_allowed());

    let mut service = LoginLayer::new(Arc::clone(&guard), |_| Some("alice".to_owned()))
        .on_refusal(recording_handler(&calls, &seen))
        .layer(Router::new().route("/login", get(|| async { "welcome" })));
    let refused = call(&mut service, request("/login"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body_text(refused), "custom: None");
    let refusal = seen.lock().unwrap().take().unwrap();
    let Refused::Login(decision) = refusal.refused() else {
        panic!("refused by {:?}", refusal.refused());
    };
    assert_eq!(refusal.retry_after(), Some(decision.retry_after()));
    assert!(refusal.retry_after().unwrap() > Duration::ZERO);

    // Another account is not refused, and the handler is not called.
    let mut bob = LoginLayer::new(guard, |_| Some("bob".to_owned()))
        .on_refusal(recording_handler(&calls, &seen))
        .layer(Router::new().route("/login", get(|| async { "welcome" })));
    assert_eq!(call(&mut bob, request("/login")).status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
