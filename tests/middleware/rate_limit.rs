//! The HTTP middleware (feature `tower`), end to end: an axum router served on 127.0.0.1:0 and
//! a real HTTP/1.1 client over loopback (plain `std::net::TcpStream`, so nothing here depends
//! on a client library's view of HTTP). A few properties that need no socket (gRPC answers,
//! IPv6 masking) call the service directly.
//!
//! `cargo test --features tower --test middleware rate_limit::`; the load test is ignored by
//! default:
//! `cargo test --release --features tower --test middleware -- --ignored --nocapture load`.

use std::io::{BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::{get, post};
use axum::{Extension, Router};
use http::{Method, Request, StatusCode};
use tollgate::middleware::{
    ClientIp, ConfigError, GlobalKey, HeaderKey, HeaderStyle, LimitKey, MissingKey, PeerIp,
    RateLimitLayer, Route,
};
use tollgate::{Decision, FakeClock, RateLimiter};
use tower_layer::Layer;
use tower_service::Service;

// A server on loopback and a minimal HTTP/1.1 client: tests/support/http.rs.
use crate::http_support::{get_path, read_reply, send, serve, serve_with, Reply};

/// A limiter on the real clock.
fn limiter(policy: &str) -> Arc<RateLimiter<LimitKey>> {
    Arc::new(RateLimiter::new(policy.parse().unwrap()))
}

/// The peer-IP extractor for axum's connect info.
fn axum_peer() -> PeerIp {
    PeerIp::new().connect_info(|c: &ConnectInfo<SocketAddr>| c.0.ip())
}

fn ok_router() -> Router {
    Router::new().route("/", get(|| async { "ok" }))
}

/// `r` of a `RateLimit` field value such as `"default";r=42;t=17`.
fn param(field: &str, name: &str) -> u64 {
    field
        .split(';')
        .find_map(|p| p.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} in {field:?}"))
        .parse()
        .unwrap()
}

// ---------------------------------------------------------------------------------------
// Acceptance.

#[test]
fn three_allowed_with_remaining_counting_down_then_429() {
    let addr = serve(ok_router().layer(RateLimitLayer::new(limiter("3/min")).key(axum_peer())));
    for expected in [2, 1, 0] {
        let reply = get_path(addr, "/");
        assert_eq!(reply.status, 200, "{reply:?}");
        assert_eq!(reply.body, "ok");
        assert_eq!(
            reply.header("ratelimit-policy"),
            Some("\"default\";q=3;w=60")
        );
        let state = reply.header("ratelimit").expect("RateLimit field");
        assert!(state.starts_with("\"default\";"), "{state}");
        assert_eq!(param(state, "r"), expected, "{state}");
        // A token bucket of 3 per minute refills one permit every 20 s: t is the time until
        // the bucket is full again.
        let t = param(state, "t");
        assert!((1..=60).contains(&t), "{state}");
        assert!(!reply.has("retry-after"));
    }
    let refused = get_path(addr, "/");
    assert_eq!(refused.status, 429, "{refused:?}");
    let retry: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=20).contains(&retry), "Retry-After {retry}");
    assert_eq!(
        refused.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(
        refused.header("ratelimit-policy"),
        Some("\"default\";q=3;w=60")
    );
    let state = refused.header("ratelimit").unwrap();
    assert_eq!(param(state, "r"), 0);
    assert!(refused
        .body
        .starts_with("{\"type\":\"about:blank\",\"title\":\"Too Many Requests\",\"status\":429,"));
    assert!(
        refused
            .body
            .ends_with(&format!(",\"retry_after\":{retry}}}")),
        "{}",
        refused.body
    );
}

#[test]
fn sub_second_waits_give_retry_after_1_never_0() {
    // 1 permit per 200 ms: every refusal waits less than a second.
    let addr = serve(ok_router().layer(RateLimitLayer::new(limiter("1/200ms")).key(axum_peer())));
    let mut refusals = 0;
    for _ in 0..20 {
        let reply = get_path(addr, "/");
        if reply.status == 429 {
            refusals += 1;
            assert_eq!(reply.header("retry-after"), Some("1"), "{reply:?}");
            // w is an integer number of seconds: a 200 ms window shows as 1.
            assert_eq!(
                reply.header("ratelimit-policy"),
                Some("\"default\";q=1;w=1")
            );
            assert_eq!(param(reply.header("ratelimit").unwrap(), "t"), 1);
        } else {
            assert_eq!(reply.status, 200);
        }
    }
    assert!(
        refusals > 0,
        "a 1/200ms policy refused none of 20 back-to-back requests"
    );
}

#[test]
fn spoofed_leftmost_forwarded_for_does_not_change_the_key() {
    let app =
        ok_router().layer(RateLimitLayer::new(limiter("2/min")).key(ClientIp::trusted_hops(1)));
    let addr = serve(app);
    let xff = |value: &str| get_path_with(addr, &[("X-Forwarded-For", value)]);
    // The proxy appended 203.0.113.5; the client made up everything left of it.
    assert_eq!(xff("1.1.1.1, 203.0.113.5").status, 200);
    assert_eq!(xff("2.2.2.2, 203.0.113.5").status, 200);
    assert_eq!(xff("3.3.3.3, 4.4.4.4, 203.0.113.5").status, 429);
    assert_eq!(xff("203.0.113.5").status, 429);
    // Repeated header lines form one list: the last line's last entry is the proxy's.
    let split = send(
        addr,
        "GET",
        "/",
        &[
            ("X-Forwarded-For", "5.5.5.5"),
            ("X-Forwarded-For", "203.0.113.5"),
        ],
    );
    assert_eq!(split.status, 429);
    // Another client behind the same proxy has its own budget.
    assert_eq!(xff("1.1.1.1, 203.0.113.6").status, 200);
}

#[test]
fn spoofed_entries_do_not_change_the_key_with_trusted_networks() {
    // The test client connects from 127.0.0.1, which plays the trusted proxy.
    let extractor = ClientIp::trusted_proxies(["127.0.0.0/8", "10.0.0.0/8"])
        .unwrap()
        .connect_info(|c: &ConnectInfo<SocketAddr>| c.0.ip());
    let app = ok_router().layer(RateLimitLayer::new(limiter("1/min")).key(extractor));
    let addr = serve(app);
    let xff = |value: &str| get_path_with(addr, &[("X-Forwarded-For", value)]);
    // 10.1.1.1 is a trusted inner proxy; 198.51.100.7 the client it saw.
    assert_eq!(xff("6.6.6.6, 198.51.100.7, 10.1.1.1").status, 200);
    assert_eq!(xff("7.7.7.7, 198.51.100.7, 10.1.1.1").status, 429);
    assert_eq!(xff("198.51.100.7").status, 429);
    // Forwarded is not read unless configured: it cannot change the key either.
    let reply = send(
        addr,
        "GET",
        "/",
        &[
            ("Forwarded", "for=8.8.8.8"),
            ("X-Forwarded-For", "198.51.100.7"),
        ],
    );
    assert_eq!(reply.status, 429);
}

fn get_path_with(addr: SocketAddr, headers: &[(&str, &str)]) -> Reply {
    send(addr, "GET", "/", headers)
}

#[test]
fn unextractable_key_gets_400_problem_json() {
    let app = ok_router().layer(RateLimitLayer::new(limiter("5/min")).key(HeaderKey::bearer()));
    let addr = serve(app);
    let reply = get_path(addr, "/");
    assert_eq!(reply.status, 400, "{reply:?}");
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(
        reply.body,
        "{\"type\":\"about:blank\",\"title\":\"Bad Request\",\"status\":400,\
         \"detail\":\"no rate-limit key: header `authorization` is missing\"}"
    );
    assert!(!reply.has("ratelimit"));
    // Another scheme, a repeated header, an over-long token: 400 too, never a panic.
    let basic = get_path_with(addr, &[("Authorization", "Basic dXNlcjpwdw==")]);
    assert_eq!(basic.status, 400);
    let long = "x".repeat(HeaderKey::DEFAULT_MAX_LEN + 1);
    let too_long = get_path_with(addr, &[("Authorization", &format!("Bearer {long}"))]);
    assert_eq!(too_long.status, 400);
    assert!(
        too_long.body.contains("4097 bytes long"),
        "{}",
        too_long.body
    );
    let twice = send(
        addr,
        "GET",
        "/",
        &[("Authorization", "Bearer a"), ("Authorization", "Bearer b")],
    );
    assert_eq!(twice.status, 400);
    // A token is a key: 200, with fields.
    let ok = get_path_with(addr, &[("Authorization", "Bearer t-1")]);
    assert_eq!(ok.status, 200);
    assert_eq!(param(ok.header("ratelimit").unwrap(), "r"), 4);

    // Behind two trusted proxies, a request with one entry did not pass through both.
    let app =
        ok_router().layer(RateLimitLayer::new(limiter("5/min")).key(ClientIp::trusted_hops(2)));
    let addr = serve(app);
    let short = get_path_with(addr, &[("X-Forwarded-For", "203.0.113.5")]);
    assert_eq!(short.status, 400);
    assert!(
        short.body.contains("fewer than the 2 trusted hops"),
        "{}",
        short.body
    );
    let garbage = get_path_with(addr, &[("X-Forwarded-For", "unknown, 10.0.0.1")]);
    assert_eq!(garbage.status, 400);
    assert_eq!(
        get_path_with(addr, &[("X-Forwarded-For", "203.0.113.5, 10.0.0.1")]).status,
        200
    );
}

#[test]
fn missing_key_answers_are_configurable() {
    // The requests below carry no `x-api-key`.
    let api_key = || HeaderKey::new("x-api-key").unwrap();
    let no_key = Router::new().route("/", get(|| async { "ok" }));
    let addr = serve(
        no_key.clone().layer(
            RateLimitLayer::new(limiter("5/min"))
                .key(api_key())
                .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED)),
        ),
    );
    let reply = get_path(addr, "/");
    assert_eq!(reply.status, 401);
    assert!(reply.body.contains("header `x-api-key` is missing"));

    let addr = serve(
        no_key.clone().layer(
            RateLimitLayer::new(limiter("1/min"))
                .key(api_key())
                .on_missing_key(MissingKey::Shared),
        ),
    );
    assert_eq!(get_path(addr, "/").status, 200);
    assert_eq!(get_path(addr, "/").status, 429); // one shared budget

    let addr = serve(
        no_key.layer(
            RateLimitLayer::new(limiter("1/min"))
                .key(api_key())
                .on_missing_key(MissingKey::Allow),
        ),
    );
    for _ in 0..3 {
        let reply = get_path(addr, "/");
        assert_eq!(reply.status, 200);
        assert!(!reply.has("ratelimit"));
    }
}

// ---------------------------------------------------------------------------------------
// Rules, styles, shadow mode, extensions.

#[test]
fn options_preflights_are_exempt_by_default() {
    let app = Router::new()
        .route(
            "/",
            get(|| async { "ok" }).options(|| async { "preflight" }),
        )
        .layer(RateLimitLayer::new(limiter("1/min")).key(axum_peer()));
    let addr = serve(app);
    for _ in 0..3 {
        let reply = send(
            addr,
            "OPTIONS",
            "/",
            &[("Access-Control-Request-Method", "GET")],
        );
        assert_eq!(reply.status, 200);
        assert_eq!(reply.body, "preflight");
        assert!(!reply.has("ratelimit"));
    }
    assert_eq!(get_path(addr, "/").status, 200);
    assert_eq!(get_path(addr, "/").status, 429);

    let app = Router::new()
        .route(
            "/",
            get(|| async { "ok" }).options(|| async { "preflight" }),
        )
        .layer(
            RateLimitLayer::new(limiter("1/min"))
                .key(axum_peer())
                .exempt_options(false),
        );
    let addr = serve(app);
    assert_eq!(send(addr, "OPTIONS", "/", &[]).status, 200);
    assert_eq!(send(addr, "OPTIONS", "/", &[]).status, 429);
}

#[test]
fn per_route_and_per_method_policies() {
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route(
            "/login",
            post(|| async { "welcome" }).get(|| async { "form" }),
        )
        .route("/health", get(|| async { "up" }))
        .layer(
            RateLimitLayer::new(limiter("100/hour"))
                .key(axum_peer())
                .route(
                    Route::new(Method::POST, "/login").name("login").unwrap(),
                    limiter("1/min"),
                )
                .exempt(Route::any("/health")),
        );
    let addr = serve(app);
    let login = send(addr, "POST", "/login", &[]);
    assert_eq!(login.status, 200);
    assert_eq!(login.header("ratelimit-policy"), Some("\"login\";q=1;w=60"));
    assert_eq!(send(addr, "POST", "/login", &[]).status, 429);
    // GET /login and / fall to the default rule.
    let form = get_path(addr, "/login");
    assert_eq!(form.status, 200);
    assert_eq!(
        form.header("ratelimit-policy"),
        Some("\"default\";q=100;w=3600")
    );
    assert_eq!(
        param(get_path(addr, "/").header("ratelimit").unwrap(), "r"),
        98
    );
    // Exempt: no fields, not counted.
    let health = get_path(addr, "/health");
    assert_eq!(health.status, 200);
    assert!(!health.has("ratelimit"));
    assert_eq!(
        param(get_path(addr, "/").header("ratelimit").unwrap(), "r"),
        97
    );
}

#[test]
fn a_get_route_limits_head_requests_too() {
    // axum answers HEAD with the GET handler: the GET route's limit must count it.
    runtime().block_on(async {
        let router = Router::new().route("/export", get(|| async { "csv" }));
        let mut service = RateLimitLayer::new(limiter("100/hour"))
            .key(GlobalKey)
            .route(Route::new(Method::GET, "/export"), limiter("1/hour"))
            .layer(router);
        for (method, status) in [
            (Method::GET, StatusCode::OK),
            (Method::HEAD, StatusCode::TOO_MANY_REQUESTS),
        ] {
            let request = Request::builder()
                .method(method.clone())
                .uri("/export")
                .body(Body::empty())
                .unwrap();
            std::future::poll_fn(|cx| Service::<Request<Body>>::poll_ready(&mut service, cx))
                .await
                .unwrap();
            let response = service.call(request).await.unwrap();
            assert_eq!(response.status(), status, "{method}");
            // The route's policy, not the default's.
            assert_eq!(
                response.headers()["ratelimit-policy"],
                "\"default\";q=1;w=3600",
                "{method}"
            );
        }
    });
}

#[test]
fn an_explicit_head_route_wins_over_the_get_routes_fallback() {
    // The GET rule comes first, yet the HEAD rule (limited, then exempt) decides HEAD.
    runtime().block_on(async {
        let call = |service: &mut tollgate::middleware::rate::RateLimit<Router>, method: Method| {
            let request = Request::builder()
                .method(method)
                .uri("/export")
                .body(Body::empty())
                .unwrap();
            let mut service = service.clone();
            async move {
                std::future::poll_fn(|cx| Service::<Request<Body>>::poll_ready(&mut service, cx))
                    .await
                    .unwrap();
                service.call(request).await.unwrap()
            }
        };
        let router = || Router::new().route("/export", get(|| async { "csv" }));

        let mut limited = RateLimitLayer::new(limiter("100/hour"))
            .key(GlobalKey)
            .route(Route::new(Method::GET, "/export"), limiter("1/hour"))
            .route(
                Route::new(Method::HEAD, "/export").name("head").unwrap(),
                limiter("2/hour"),
            )
            .layer(router());
        for status in [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
        ] {
            let response = call(&mut limited, Method::HEAD).await;
            assert_eq!(response.status(), status);
            assert_eq!(
                response.headers()["ratelimit-policy"],
                "\"head\";q=2;w=3600"
            );
        }
        // GET still takes the GET rule, untouched by the HEADs.
        let response = call(&mut limited, Method::GET).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()["ratelimit-policy"],
            "\"default\";q=1;w=3600"
        );

        let mut exempt = RateLimitLayer::new(limiter("100/hour"))
            .key(GlobalKey)
            .route(Route::new(Method::GET, "/export"), limiter("1/hour"))
            .exempt(Route::new(Method::HEAD, "/export"))
            .layer(router());
        for _ in 0..3 {
            let response = call(&mut exempt, Method::HEAD).await;
            assert_eq!(response.status(), StatusCode::OK);
            assert!(!response.headers().contains_key("ratelimit"));
        }
        assert_eq!(
            call(&mut exempt, Method::GET).await.status(),
            StatusCode::OK
        );
        assert_eq!(
            call(&mut exempt, Method::GET).await.status(),
            StatusCode::TOO_MANY_REQUESTS
        );
    });
}

#[test]
fn routes_spend_their_cost_from_a_shared_budget() {
    // One budget of 10 per hour: a read costs 1, an export 4; a cost above the policy's
    // permits is a configuration error, answered 500 and spending nothing.
    let quota = limiter("10/hour");
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/export", get(|| async { "csv" }))
        .route("/bulk", get(|| async { "all" }))
        .layer(
            RateLimitLayer::new(quota.clone())
                .key(axum_peer())
                .route(Route::any("/export").cost(4).unwrap(), quota.clone())
                .route(Route::any("/bulk").cost(11).unwrap(), quota),
        );
    let addr = serve(app);
    let remaining = |reply: &Reply| param(reply.header("ratelimit").unwrap(), "r");

    let read = get_path(addr, "/");
    assert_eq!((read.status, remaining(&read)), (200, 9));
    for expected in [5, 1] {
        let export = get_path(addr, "/export");
        assert_eq!(export.status, 200, "{export:?}");
        assert_eq!(export.body, "csv");
        assert_eq!(remaining(&export), expected);
    }
    // 1 left: an export (4) is refused and spends nothing; a read still gets the last one.
    let refused = get_path(addr, "/export");
    assert_eq!(refused.status, 429, "{refused:?}");
    let retry: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    // A token bucket of 10 per hour refills one permit every 360 s; 3 more are missing.
    assert!((1_000..=1_080).contains(&retry), "Retry-After {retry}");
    assert_eq!(remaining(&refused), 1);

    let bulk = get_path(addr, "/bulk");
    assert_eq!(bulk.status, 500, "{bulk:?}");
    assert_eq!(
        bulk.header("content-type"),
        Some("application/problem+json")
    );
    assert!(bulk.body.contains("cost 11"), "{}", bulk.body);

    let last = get_path(addr, "/");
    assert_eq!((last.status, remaining(&last)), (200, 0));
    assert_eq!(get_path(addr, "/").status, 429);
}

#[test]
fn a_cost_of_zero_is_a_config_error() {
    let error = Route::any("/export").cost(0).unwrap_err();
    assert_eq!(error, ConfigError::InvalidCost { cost: 0 });
    assert_eq!(
        error.to_string(),
        "a route's cost must be at least 1 permit, got 0"
    );
}

#[test]
fn decision_reaches_the_handler() {
    let app = Router::new()
        .route(
            "/",
            get(|Extension(decision): Extension<Decision>| async move {
                format!("{} left of {}", decision.remaining(), decision.limit())
            }),
        )
        .layer(RateLimitLayer::new(limiter("5/min")).key(axum_peer()));
    let addr = serve(app);
    assert_eq!(get_path(addr, "/").body, "4 left of 5");
    assert_eq!(get_path(addr, "/").body, "3 left of 5");
}

#[test]
fn shadow_mode_refuses_nothing_and_shows_nothing() {
    let app = Router::new()
        .route(
            "/",
            get(|Extension(decision): Extension<Decision>| async move {
                if decision.is_allowed() {
                    "allowed"
                } else {
                    "would refuse"
                }
            }),
        )
        .layer(
            RateLimitLayer::new(limiter("1/min"))
                .key(axum_peer())
                .shadow(),
        );
    let addr = serve(app);
    let first = get_path(addr, "/");
    assert_eq!((first.status, first.body.as_str()), (200, "allowed"));
    for _ in 0..2 {
        let reply = get_path(addr, "/");
        assert_eq!((reply.status, reply.body.as_str()), (200, "would refuse"));
        assert!(!reply.has("ratelimit") && !reply.has("retry-after"));
    }

    // A limiter in shadow mode: allowed, flagged, with the fields.
    let shadow_limiter: Arc<RateLimiter<LimitKey>> =
        Arc::new(RateLimiter::new("1/min".parse().unwrap()).shadow());
    let app = Router::new()
        .route(
            "/",
            get(|Extension(d): Extension<Decision>| async move { d.would_refuse().to_string() }),
        )
        .layer(RateLimitLayer::new(shadow_limiter).key(axum_peer()));
    let addr = serve(app);
    assert_eq!(get_path(addr, "/").body, "false");
    let flagged = get_path(addr, "/");
    assert_eq!((flagged.status, flagged.body.as_str()), (200, "true"));
    assert_eq!(param(flagged.header("ratelimit").unwrap(), "r"), 0);

    // Shadow mode lets even a route whose cost can never be admitted through (no 500).
    let app = Router::new().route("/bulk", get(|| async { "all" })).layer(
        RateLimitLayer::new(limiter("1/min"))
            .key(axum_peer())
            .route(Route::any("/bulk").cost(5).unwrap(), limiter("1/min"))
            .shadow(),
    );
    let addr = serve(app);
    let bulk = get_path(addr, "/bulk");
    assert_eq!((bulk.status, bulk.body.as_str()), (200, "all"), "{bulk:?}");
}

#[test]
fn header_styles() {
    let styled = |style| {
        serve(
            ok_router().layer(
                RateLimitLayer::new(limiter("10/min"))
                    .key(axum_peer())
                    .headers(style),
            ),
        )
    };
    let legacy = get_path(styled(HeaderStyle::Legacy), "/");
    assert_eq!(legacy.header("ratelimit-limit"), Some("10"));
    assert_eq!(legacy.header("ratelimit-remaining"), Some("9"));
    assert_eq!(legacy.header("ratelimit-reset"), Some("6"));
    assert!(!legacy.has("ratelimit") && !legacy.has("x-ratelimit-limit"));

    let x = get_path(styled(HeaderStyle::XRateLimit), "/");
    assert_eq!(x.header("x-ratelimit-limit"), Some("10"));
    assert_eq!(x.header("x-ratelimit-remaining"), Some("9"));
    assert_eq!(x.header("x-ratelimit-reset"), Some("6"));

    let addr = serve(
        ok_router().layer(
            RateLimitLayer::new(limiter("1/min"))
                .key(axum_peer())
                .headers(HeaderStyle::None),
        ),
    );
    let allowed = get_path(addr, "/");
    assert_eq!(allowed.status, 200);
    assert!(!allowed
        .headers
        .iter()
        .any(|(n, _)| n.to_ascii_lowercase().contains("ratelimit")));
    let refused = get_path(addr, "/");
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("retry-after"), Some("60"));
}

#[test]
fn composite_policies_name_each_band_and_report_the_tightest() {
    let addr = serve(
        ok_router().layer(
            RateLimitLayer::new(limiter("2/s & 100/day"))
                .key(axum_peer())
                .policy_name("api")
                .unwrap(),
        ),
    );
    let reply = get_path(addr, "/");
    assert_eq!(
        reply.header("ratelimit-policy"),
        Some("\"api-1s\";q=2;w=1, \"api-1d\";q=100;w=86400")
    );
    let state = reply.header("ratelimit").unwrap();
    assert!(state.starts_with("\"api-1s\";r=1;"), "{state}");
}

#[test]
fn field_integers_fit_in_fifteen_digits() {
    // A token bucket may have up to u64::MAX permits; RFC 8941 integers have at most 15
    // digits, and a parser rejects a whole field with a longer one.
    let huge = "10000000000000000/200d";
    let addr = serve(ok_router().layer(RateLimitLayer::new(limiter(huge)).key(axum_peer())));
    let reply = get_path(addr, "/");
    assert_eq!(
        reply.header("ratelimit-policy"),
        Some("\"default\";q=999999999999999;w=17280000")
    );
    assert_eq!(
        reply.header("ratelimit"),
        Some("\"default\";r=999999999999999;t=1")
    );
    let addr = serve(
        ok_router().layer(
            RateLimitLayer::new(limiter(huge))
                .key(axum_peer())
                .headers(HeaderStyle::Legacy),
        ),
    );
    let reply = get_path(addr, "/");
    assert_eq!(reply.header("ratelimit-limit"), Some("999999999999999"));
    assert_eq!(reply.header("ratelimit-remaining"), Some("999999999999999"));
}

#[test]
fn composite_bands_of_equal_permits_are_named_by_position() {
    // "2/s & 2/min": two bands of 2 permits. After one request and a second's wait the
    // per-second band is full again, and the per-minute band is the one with 0 left.
    let clock = FakeClock::new();
    let limiter: RateLimiter<LimitKey, FakeClock> =
        RateLimiter::with_clock("2/s & 2/min".parse().unwrap(), clock.clone());
    let addr = serve(
        ok_router().layer(
            RateLimitLayer::new(limiter)
                .key(axum_peer())
                .policy_name("api")
                .unwrap(),
        ),
    );
    let first = get_path(addr, "/");
    assert_eq!(
        first.header("ratelimit-policy"),
        Some("\"api-1s\";q=2;w=1, \"api-1m\";q=2;w=60")
    );
    // A tie: the first band is named.
    let state = first.header("ratelimit").unwrap();
    assert!(state.starts_with("\"api-1s\";r=1;"), "{state}");
    clock.advance(Duration::from_secs(1));
    let second = get_path(addr, "/");
    assert_eq!(second.status, 200);
    let state = second.header("ratelimit").unwrap();
    assert!(state.starts_with("\"api-1m\";r=0;"), "{state}");
    // Refused by the per-minute band alone: it is the one named.
    let third = get_path(addr, "/");
    assert_eq!(third.status, 429);
    let state = third.header("ratelimit").unwrap();
    assert!(state.starts_with("\"api-1m\";r=0;"), "{state}");
}

#[test]
fn fields_follow_a_live_policy_change() {
    let shared = limiter("10/min");
    let addr = serve(ok_router().layer(RateLimitLayer::new(Arc::clone(&shared)).key(axum_peer())));
    assert_eq!(
        get_path(addr, "/").header("ratelimit-policy"),
        Some("\"default\";q=10;w=60")
    );
    shared.set_policy("20/min".parse().unwrap());
    assert_eq!(
        get_path(addr, "/").header("ratelimit-policy"),
        Some("\"default\";q=20;w=60")
    );
}

// ---------------------------------------------------------------------------------------
// Direct calls: gRPC refusals, IPv6 masking, a global key.

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn grpc_requests_are_refused_with_resource_exhausted() {
    runtime().block_on(async {
        let router = Router::new().route("/pkg.Svc/Call", post(|| async { "ok" }));
        let mut service = RateLimitLayer::new(limiter("1/min"))
            .key(GlobalKey)
            .layer(router);
        let grpc = || {
            Request::post("/pkg.Svc/Call")
                .header("content-type", "application/grpc+proto")
                .body(Body::empty())
                .unwrap()
        };
        std::future::poll_fn(|cx| Service::<Request<Body>>::poll_ready(&mut service, cx))
            .await
            .unwrap();
        assert_eq!(service.call(grpc()).await.unwrap().status(), StatusCode::OK);
        std::future::poll_fn(|cx| Service::<Request<Body>>::poll_ready(&mut service, cx))
            .await
            .unwrap();
        let refused = service.call(grpc()).await.unwrap();
        assert_eq!(refused.status(), StatusCode::OK);
        let headers = refused.headers();
        assert_eq!(headers["content-type"], "application/grpc");
        assert_eq!(headers["grpc-status"], "8");
        assert_eq!(headers["retry-after"], "60");
        // An HTTP 200 chosen by the request's content type: never stored by a shared cache.
        assert_eq!(headers["cache-control"], "no-store");
        assert!(headers["grpc-message"]
            .to_str()
            .unwrap()
            .starts_with("Rate limit exceeded"));
        assert!(http_body::Body::is_end_stream(refused.body()));
    });
}

#[test]
fn ipv6_clients_share_their_64() {
    runtime().block_on(async {
        let router = ok_router();
        let mut service = RateLimitLayer::new(limiter("2/min")).layer(router);
        let from = |peer: &str| {
            let mut request = Request::get("/").body(Body::empty()).unwrap();
            request
                .extensions_mut()
                .insert(peer.parse::<SocketAddr>().unwrap());
            request
        };
        let mut statuses = Vec::new();
        for peer in [
            "[2001:db8:1:2::1]:1000",
            "[2001:db8:1:2:ffff::9]:1001",
            "[2001:db8:1:2:abcd::]:1002",
            "[2001:db8:1:3::1]:1003",
            "[::ffff:192.0.2.1]:1004",
            "192.0.2.1:1005",
            "192.0.2.2:1006",
        ] {
            std::future::poll_fn(|cx| Service::<Request<Body>>::poll_ready(&mut service, cx))
                .await
                .unwrap();
            statuses.push(service.call(from(peer)).await.unwrap().status().as_u16());
        }
        // Three addresses of one /64: the third is refused. Another /64 is another key.
        // A mapped IPv4 address is that IPv4 address; IPv4 addresses are kept whole.
        assert_eq!(statuses, [200, 200, 429, 200, 200, 200, 200]);
    });
}

// ---------------------------------------------------------------------------------------
// Load: requests per second through the layer and without it, side by side.

/// Runs `connections` keep-alive client threads against `addr` for `duration`, each sending
/// `GET /` and reading the reply before the next; returns (requests per second, refused).
fn load(addr: SocketAddr, connections: usize, duration: Duration) -> (f64, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let threads: Vec<_> = (0..connections)
        .map(|_| {
            let (stop, done, refused) = (stop.clone(), done.clone(), refused.clone());
            thread::spawn(move || {
                let stream = TcpStream::connect(addr).unwrap();
                stream.set_nodelay(true).unwrap();
                stream
                    .set_read_timeout(Some(Duration::from_secs(10)))
                    .unwrap();
                let mut writer = stream.try_clone().unwrap();
                let mut reader = BufReader::new(stream);
                let request = format!("GET / HTTP/1.1\r\nHost: {addr}\r\n\r\n");
                while !stop.load(Ordering::Relaxed) {
                    writer.write_all(request.as_bytes()).unwrap();
                    let reply = read_reply(&mut reader, false);
                    if reply.status == 429 {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    thread::sleep(duration);
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        thread.join().unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    (
        done.load(Ordering::Relaxed) as f64 / secs,
        refused.load(Ordering::Relaxed),
    )
}

#[test]
#[ignore = "load test: run with --release -- --ignored --nocapture load"]
fn load_with_and_without_the_layer() {
    let connections: usize = env_or("LOAD_CONNECTIONS", 4);
    let seconds: u64 = env_or("LOAD_SECONDS", 3);
    let rounds: usize = env_or("LOAD_ROUNDS", 3);
    let workers: usize = env_or("LOAD_WORKERS", 2);
    let duration = Duration::from_secs(seconds);

    let bare = serve_with(ok_router(), workers);
    // Everything admitted: the layer's full path (key, decision, fields) on every request.
    let admitting = serve_with(
        ok_router().layer(RateLimitLayer::new(limiter("1000000000/1s")).key(axum_peer())),
        workers,
    );
    // Everything refused after the first: the 429 path (problem+json, Retry-After, fields).
    let refusing = serve_with(
        ok_router().layer(RateLimitLayer::new(limiter("1/1h")).key(axum_peer())),
        workers,
    );
    let cases = [
        ("router alone", bare),
        ("router + layer, all allowed", admitting),
        ("router + layer, all refused (429)", refusing),
    ];
    // Warm up every server and connection path once.
    for (_, addr) in cases {
        load(addr, connections, Duration::from_millis(300));
    }
    let mut results: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for _ in 0..rounds {
        for (i, (_, addr)) in cases.iter().enumerate() {
            results[i].push(load(*addr, connections, duration).0);
        }
    }
    println!(
        "loopback, {connections} keep-alive connections, {workers} server worker threads, \
         {rounds} interleaved rounds of {seconds} s per case"
    );
    println!("| case | median req/s | min | max | vs router alone |");
    println!("|---|---|---|---|---|");
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let base = median(&mut results[0].clone());
    for (i, (name, _)) in cases.iter().enumerate() {
        let runs = &mut results[i];
        let m = median(runs);
        println!(
            "| {name} | {m:.0} | {:.0} | {:.0} | {:.3} |",
            runs[0],
            runs[runs.len() - 1],
            m / base
        );
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Calls `service` `n` times in-process (no sockets) and returns nanoseconds per call.
async fn per_call_nanos<S>(service: &mut S, n: u32) -> f64
where
    S: Service<Request<Body>>,
    S::Error: std::fmt::Debug,
{
    let peer: SocketAddr = "127.0.0.1:4000".parse().unwrap();
    let start = Instant::now();
    for _ in 0..n {
        let mut request = Request::get("/").body(Body::empty()).unwrap();
        request.extensions_mut().insert(ConnectInfo(peer));
        std::future::poll_fn(|cx| service.poll_ready(cx))
            .await
            .unwrap();
        let response = service.call(request).await.unwrap();
        drop(std::hint::black_box(response));
    }
    start.elapsed().as_nanos() as f64 / f64::from(n)
}

#[test]
#[ignore = "load test: run with --release -- --ignored --nocapture load"]
fn load_in_process_cost_per_request() {
    let n: u32 = env_or("LOAD_CALLS", 200_000);
    let rounds: usize = env_or("LOAD_ROUNDS", 3);
    runtime().block_on(async {
        let mut bare = ok_router();
        let mut admitting = RateLimitLayer::new(limiter("1000000000/1s"))
            .key(axum_peer())
            .layer(ok_router());
        let mut legacy = RateLimitLayer::new(limiter("1000000000/1s"))
            .key(axum_peer())
            .headers(HeaderStyle::Legacy)
            .layer(ok_router());
        let mut refusing = RateLimitLayer::new(limiter("1/1h"))
            .key(axum_peer())
            .layer(ok_router());
        let mut results = [const { Vec::new() }; 4];
        for _ in 0..rounds {
            results[0].push(per_call_nanos(&mut bare, n).await);
            results[1].push(per_call_nanos(&mut admitting, n).await);
            results[2].push(per_call_nanos(&mut legacy, n).await);
            results[3].push(per_call_nanos(&mut refusing, n).await);
        }
        println!("in-process, one thread, {n} calls x {rounds} interleaved rounds");
        println!("| case | median ns per call | best |");
        println!("|---|---|---|");
        let names = [
            "router alone",
            "router + layer, allowed, draft fields",
            "router + layer, allowed, legacy fields",
            "router + layer, refused (429, router not called)",
        ];
        for (name, runs) in names.iter().zip(results.iter_mut()) {
            runs.sort_by(f64::total_cmp);
            println!("| {name} | {:.0} | {:.0} |", runs[runs.len() / 2], runs[0]);
        }
    });
}
