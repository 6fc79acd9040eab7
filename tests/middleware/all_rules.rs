//! A route decided by several rules at once (`RateLimitLayer::and`), end to end through
//! axum on loopback: per user, per client address and one global budget, all or nothing; the
//! fields of the tightest rule with every rule's policy; an LLM route of requests and tokens
//! in one layer, the tokens reserved and settled from the response; and the combinations the
//! builder refuses. Every limiter runs on a frozen clock, so each budget is exact.
//!
//! `cargo test --features tower --test middleware all_rules::`

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use axum::extract::ConnectInfo;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use http::{HeaderMap, Method};
use tollgate::middleware::{
    ConfigError, GlobalKey, HeaderKey, KeyExtractor, Limit, LimitKey, PeerIp, RateLimitLayer,
    RequestHead, Route,
};
use tollgate::{FakeClock, RateLimiter};

use crate::http_support::{send, serve, Reply};
use crate::settle::{max_tokens, tokens_used};

type Limiter = Arc<RateLimiter<LimitKey, FakeClock>>;

fn frozen(policy: &str, clock: &FakeClock) -> Limiter {
    Arc::new(RateLimiter::with_clock(
        policy.parse().unwrap(),
        clock.clone(),
    ))
}

fn peer() -> PeerIp {
    PeerIp::new().connect_info(|c: &ConnectInfo<SocketAddr>| c.0.ip())
}

const LOOPBACK: LimitKey = LimitKey::Ip(IpAddr::V4(Ipv4Addr::LOCALHOST));

/// The permits `key` has left now.
fn left(limiter: &Limiter, key: &LimitKey) -> u64 {
    let peek = limiter.peek(key);
    peek.remaining() + u64::from(peek.is_allowed())
}

/// The `RateLimit` items of `reply`, each `name;r=..;t=..`.
fn items(reply: &Reply) -> Vec<String> {
    reply
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("ratelimit"))
        .flat_map(|(_, v)| v.split(", ").map(str::to_owned).collect::<Vec<_>>())
        .collect()
}

fn as_user(addr: SocketAddr, user: &str) -> Reply {
    send(addr, "GET", "/", &[("x-user", user)])
}

/// Per user 5, per address 3, global 100 a minute, one layer: the address limit refuses the
/// fourth request from it, whoever sends it, and the refusal spends nothing anywhere.
#[test]
fn one_layer_decides_per_user_per_address_and_global_all_or_nothing() {
    let clock = FakeClock::new();
    let per_user = frozen("5/min", &clock);
    let per_ip = frozen("3/min", &clock);
    let global = frozen("100/min", &clock);
    let layer = RateLimitLayer::new(Arc::clone(&per_user))
        .key(HeaderKey::new("x-user").unwrap())
        .policy_name("per-user")
        .unwrap()
        .and(
            Limit::new(Arc::clone(&per_ip))
                .key(peer())
                .name("per-ip")
                .unwrap(),
        )
        .unwrap()
        .and(
            Limit::new(Arc::clone(&global))
                .key(GlobalKey)
                .name("global")
                .unwrap(),
        )
        .unwrap();
    let addr = serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer),
    );

    let first = as_user(addr, "alice");
    assert_eq!(first.status, 200, "{first:?}");
    // The tightest rule reports: the address's 2 left, not the user's 4 or the global 99.
    assert_eq!(items(&first), ["\"per-ip\";r=2;t=20"]);
    assert_eq!(
        first.header("ratelimit-policy"),
        Some("\"per-user\";q=5;w=60, \"per-ip\";q=3;w=60, \"global\";q=100;w=60")
    );
    assert_eq!(as_user(addr, "alice").status, 200);
    assert_eq!(as_user(addr, "bob").status, 200);

    let refused = as_user(addr, "alice");
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(items(&refused), ["\"per-ip\";r=0;t=60"]);
    assert_eq!(refused.header("retry-after"), Some("20"));
    assert_eq!(
        left(&per_user, &user_key("alice")),
        3,
        "the refusal spent nothing"
    );
    assert_eq!(left(&per_user, &user_key("bob")), 4);
    assert_eq!(left(&global, &LimitKey::Global), 97);
    assert_eq!(left(&per_ip, &LOOPBACK), 0);
}

/// The key `HeaderKey::new("x-user")` takes from the header value `user`.
fn user_key(user: &str) -> LimitKey {
    let request = http::Request::get("/")
        .header("x-user", user)
        .body(())
        .unwrap();
    HeaderKey::new("x-user")
        .unwrap()
        .extract(&RequestHead::new(&request))
        .unwrap()
}

/// The upstream: reports the tokens it used (the request's `x-use`).
async fn completion(headers: HeaderMap) -> Response {
    let mut response = "done".into_response();
    if let Some(used) = headers.get("x-use") {
        response.headers_mut().insert("x-tokens-used", used.clone());
    }
    response
}

/// An LLM route in one layer: 10 requests and 1,000 tokens a minute per address, the tokens
/// reserved at the estimate and settled from the response. A request the tokens refuse is
/// not counted as a request (with two stacked layers it was).
#[test]
fn requests_and_tokens_in_one_layer_settle_and_refuse_together() {
    let clock = FakeClock::new();
    let (requests, tokens) = (frozen("10/min", &clock), frozen("1000/min", &clock));
    let completions = Route::new(Method::POST, "/v1/chat")
        .key(peer())
        .name("requests")
        .unwrap();
    let layer = RateLimitLayer::new(Arc::clone(&requests))
        .key(peer())
        .route(completions, Arc::clone(&requests))
        .and(
            Limit::new(Arc::clone(&tokens))
                .key(peer())
                .name("tokens")
                .unwrap()
                .cost_with(max_tokens)
                .settle_with(tokens_used),
        )
        .unwrap();
    let addr = serve(
        Router::new()
            .route("/v1/chat", post(completion))
            .layer(layer),
    );
    let chat = |max: &str, used: &str| {
        send(
            addr,
            "POST",
            "/v1/chat",
            &[("x-max-tokens", max), ("x-use", used)],
        )
    };

    // Reserved 300, used 120: 180 came back; the requests rule is the tightest (9 left).
    let lower = chat("300", "120");
    assert_eq!(lower.status, 200, "{lower:?}");
    assert_eq!(left(&tokens, &LOOPBACK), 880);
    assert_eq!(left(&requests, &LOOPBACK), 9);
    assert_eq!(items(&lower), ["\"requests\";r=9;t=6"]);
    assert_eq!(
        lower.header("ratelimit-policy"),
        Some("\"requests\";q=10;w=60, \"tokens\";q=1000;w=60")
    );

    // Reserved 800, used 875: 75 charged on top; now the tokens are the tightest (5 left,
    // against 8 requests).
    let higher = chat("800", "875");
    assert_eq!(higher.status, 200, "{higher:?}");
    assert_eq!(left(&tokens, &LOOPBACK), 5);
    assert_eq!(items(&higher), ["\"tokens\";r=5;t=60"]);

    // 5 tokens left, 50 asked for: refused by the tokens rule (45 missing, 60 ms each), and
    // the request is not counted as one (8 left, as before).
    let refused = chat("50", "1");
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(items(&refused), ["\"tokens\";r=5;t=60"]);
    assert_eq!(refused.header("retry-after"), Some("3"));
    assert_eq!(left(&requests, &LOOPBACK), 8);
    assert_eq!(left(&tokens, &LOOPBACK), 5);

    // An estimate no budget could ever admit: 400, nothing spent anywhere.
    let too_large = chat("5000", "1");
    assert_eq!(too_large.status, 400, "{too_large:?}");
    assert_eq!(left(&requests, &LOOPBACK), 8);
}

/// `and` after an exempt route has nothing to add to; the error names the limit.
#[test]
fn the_builder_refuses_what_it_cannot_combine() {
    let err = RateLimitLayer::new(RateLimiter::<LimitKey>::new("5/min".parse().unwrap()))
        .exempt(Route::any("/health"))
        .and(
            Limit::new(RateLimiter::<LimitKey>::new("5/min".parse().unwrap()))
                .name("extra")
                .unwrap(),
        )
        .unwrap_err();
    assert!(
        matches!(&err, ConfigError::CannotCombine { limit, .. } if limit == "\"extra\""),
        "{err}"
    );
    assert!(
        Limit::new(RateLimiter::<LimitKey>::new("5/min".parse().unwrap()))
            .cost(0)
            .is_err()
    );

    // Rules decided together need distinct names, or RateLimit-Policy could not tell them
    // apart: two unnamed rules share the layer's, and a rename onto a limit's name collides.
    let limiter = || RateLimiter::<LimitKey>::new("5/min".parse().unwrap());
    let unnamed = RateLimitLayer::new(limiter()).and(Limit::new(limiter()));
    assert!(
        matches!(unnamed, Err(ConfigError::CannotCombine { ref limit, .. }) if limit == "\"default\""),
        "{unnamed:?}"
    );
    let renamed = RateLimitLayer::new(limiter())
        .and(Limit::new(limiter()).name("extra").unwrap())
        .unwrap()
        .policy_name("extra");
    assert!(
        matches!(renamed, Err(ConfigError::CannotCombine { .. })),
        "{renamed:?}"
    );
}

/// A rule named as another rule's composite band items are (`<name>-<window>`) would make
/// two `RateLimit-Policy` items alike: refused, in either order.
#[test]
fn a_rule_named_like_a_composite_rules_band_is_refused() {
    let limiter = |policy: &str| RateLimiter::<LimitKey>::new(policy.parse().unwrap());
    // The layer's rule under `first` named `name`, and a rule under `second` named `other`.
    let combined = |first: &str, name: &str, second: &str, other: &str| {
        RateLimitLayer::new(limiter(first))
            .key(GlobalKey)
            .policy_name(name)
            .unwrap()
            .and(
                Limit::new(limiter(second))
                    .key(GlobalKey)
                    .name(other)
                    .unwrap(),
            )
    };
    let (composite, single) = ("1/s & 10/min", "5/s");
    let refused = combined(composite, "api", single, "api-1s");
    assert!(matches!(refused, Err(ConfigError::CannotCombine { .. })));
    let refused = combined(single, "api-1s", composite, "api");
    assert!(matches!(refused, Err(ConfigError::CannotCombine { .. })));
    // Single-band rules may share a prefix.
    assert!(combined(single, "api", single, "api-ip").is_ok());
}

/// A route refused by a later rule leaves no state behind for an earlier rule's key: 100
/// users, each new, refused by a spent global budget, leave the per-user limiter as they
/// found it (with no sweep to remove them later), as an `AllOf` does.
#[test]
fn a_refused_route_leaves_no_key_behind() {
    let clock = FakeClock::new();
    let per_user: Limiter = Arc::new(
        RateLimiter::with_clock("5/h".parse().unwrap(), clock.clone()).sweep_per_insert(0),
    );
    let global = frozen("1/h", &clock);
    assert!(global.try_acquire(&LimitKey::Global).is_allowed());
    let layer = RateLimitLayer::new(Arc::clone(&per_user))
        .key(HeaderKey::new("x-user").unwrap())
        .and(
            Limit::new(Arc::clone(&global))
                .key(GlobalKey)
                .name("global")
                .unwrap(),
        )
        .unwrap();
    let addr = serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer),
    );
    for user in 0..100 {
        let reply = as_user(addr, &format!("user-{user}"));
        assert_eq!(reply.status, 429, "{reply:?}");
    }
    assert_eq!(per_user.len(), 0, "refused requests left keys tracked");
}

/// A rule in shadow mode that would refuse sets neither the refusal's wait nor its fields:
/// a request refused by the per-user rule waits for that rule alone.
#[test]
fn a_shadow_rule_after_a_refusing_rule_sets_no_wait() {
    let clock = FakeClock::new();
    let per_user = frozen("1/s", &clock);
    let rollout: Limiter =
        Arc::new(RateLimiter::with_clock("1/h".parse().unwrap(), clock.clone()).shadow());
    let layer = RateLimitLayer::new(Arc::clone(&per_user))
        .key(HeaderKey::new("x-user").unwrap())
        .and(
            Limit::new(Arc::clone(&rollout))
                .key(GlobalKey)
                .name("rollout")
                .unwrap(),
        )
        .unwrap();
    let addr = serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(layer),
    );
    assert_eq!(as_user(addr, "alice").status, 200);
    let refused = as_user(addr, "alice");
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(refused.header("retry-after"), Some("1"), "{refused:?}");
}
