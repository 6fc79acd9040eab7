//! The peer address as a key: read from axum's `ConnectInfo<SocketAddr>` (feature `axum`) or
//! a plain `SocketAddr` with no closure, and a request without one answered `500` (the
//! server's mistake), logged once per layer.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Once};
use std::thread::{self, ThreadId};

use crate::in_place::{body_text, call};
use axum::body::Body;
use axum::routing::get;
use axum::Router;
use http::{Request, StatusCode};
use tollgate::concurrency::ConcurrencyLimiter;
use tollgate::login::LoginGuard;
use tollgate::middleware::{
    ConcurrencyLimitLayer, KeyExtractor, LimitKey, LoginLayer, MissingKey, PeerIp, RateLimitLayer,
    RequestHead,
};
use tollgate::RateLimiter;
use tower_layer::Layer;

/// Every log record, with the thread it was logged on: tests running in parallel tell
/// their own records apart by thread.
static RECORDS: Mutex<Vec<(ThreadId, log::Level, String)>> = Mutex::new(Vec::new());

struct Recorder;

impl log::Log for Recorder {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let entry = (
            thread::current().id(),
            record.level(),
            record.args().to_string(),
        );
        RECORDS.lock().unwrap().push(entry);
    }

    fn flush(&self) {}
}

fn install_recorder() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        log::set_logger(&Recorder).unwrap();
        log::set_max_level(log::LevelFilter::Trace);
    });
}

/// Errors logged on this thread that name the missing peer address.
fn peer_errors_logged_here() -> usize {
    let here = thread::current().id();
    RECORDS
        .lock()
        .unwrap()
        .iter()
        .filter(|(thread, level, message)| {
            *thread == here
                && *level == log::Level::Error
                && message.contains("no peer address")
                && message.contains("into_make_service_with_connect_info")
        })
        .count()
}

fn ok_router() -> Router {
    Router::new().route("/", get(|| async { "ok" }))
}

fn bare_request() -> Request<Body> {
    Request::get("/").body(Body::empty()).unwrap()
}

#[test]
fn a_plain_socket_addr_extension_is_the_peer_address() {
    let peer: SocketAddr = "192.0.2.7:9000".parse().unwrap();
    let mut request = Request::new(());
    request.extensions_mut().insert(peer);
    let key = PeerIp::new().extract(&RequestHead::new(&request));
    assert_eq!(key, Ok(LimitKey::Ip(peer.ip())));

    let mut service =
        RateLimitLayer::new(RateLimiter::new("1/min".parse().unwrap())).layer(ok_router());
    let with_peer = || {
        let mut request = bare_request();
        request.extensions_mut().insert(peer);
        request
    };
    assert_eq!(call(&mut service, with_peer()).status(), StatusCode::OK);
    assert_eq!(
        call(&mut service, with_peer()).status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// With feature `axum`, a server built with `into_make_service_with_connect_info` needs
/// nothing more: the default `PeerIp` reads `ConnectInfo<SocketAddr>`.
#[cfg(feature = "axum")]
#[test]
fn axum_connect_info_is_the_peer_address_without_a_closure() {
    use axum::extract::ConnectInfo;

    let peer: SocketAddr = "[2001:db8:1:2:3:4:5:6]:4711".parse().unwrap();
    let mut request = Request::new(());
    request.extensions_mut().insert(ConnectInfo(peer));
    let key = PeerIp::new().extract(&RequestHead::new(&request));
    assert_eq!(key, Ok(LimitKey::Ip("2001:db8:1:2::".parse().unwrap())));

    // Through a real server: the loopback client is one key, limited to 2 a minute.
    let app = ok_router().layer(RateLimitLayer::new(RateLimiter::new(
        "2/min".parse().unwrap(),
    )));
    let addr = crate::http_support::serve(app);
    let statuses: Vec<u16> = (0..3)
        .map(|_| crate::http_support::get_path(addr, "/").status)
        .collect();
    assert_eq!(statuses, [200, 200, 429]);
}

#[test]
fn a_request_without_a_peer_address_is_a_500_logged_once_per_layer() {
    install_recorder();
    let before = peer_errors_logged_here();
    // Even with answers for missing keys that would let the request through: the server,
    // not the client, is at fault, and every request would be lumped together.
    let layer = RateLimitLayer::new(RateLimiter::new("100/min".parse().unwrap()))
        .on_missing_key(MissingKey::Shared);
    // Two services the layer built, and a clone of one: all the same layer.
    let mut services = vec![layer.layer(ok_router()), layer.layer(ok_router())];
    services.push(services[0].clone());
    for service in &mut services {
        let response = call(service, bare_request());
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = body_text(response);
        assert!(body.contains("\"status\":500"), "{body}");
        assert!(
            !body.contains("peer address"),
            "the cause is for the log: {body}"
        );
    }
    assert_eq!(peer_errors_logged_here() - before, 1, "once for the layer");

    // Another layer logs once too; the concurrency and login layers answer alike.
    let mut other =
        RateLimitLayer::new(RateLimiter::new("100/min".parse().unwrap())).layer(ok_router());
    let mut concurrency = ConcurrencyLimitLayer::new(Arc::new(ConcurrencyLimiter::new(1)))
        .on_missing_key(MissingKey::Allow)
        .layer(ok_router());
    let mut login =
        LoginLayer::new(Arc::new(LoginGuard::new()), |_| Some("alice".into())).layer(ok_router());
    for _ in 0..2 {
        let statuses = [
            call(&mut other, bare_request()).status(),
            call(&mut concurrency, bare_request()).status(),
            call(&mut login, bare_request()).status(),
        ];
        assert_eq!(statuses, [StatusCode::INTERNAL_SERVER_ERROR; 3]);
    }
    assert_eq!(
        peer_errors_logged_here() - before,
        4,
        "once for each of four layers"
    );
}
