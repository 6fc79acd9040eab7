//! The HTTP layer deciding through Redis (features `tower` and `redis`): axum routers served
//! on loopback, each with its own `RedisLimiter`, against a `redis-server` each test starts.
//! Two layers share one limit exactly; a killed Redis gets each failure policy's answer;
//! peer-address and header keys reach Redis as their stable text form.
//!
//! Needs `redis-server` on PATH (`scripts/install-redis.sh`); without it every test fails
//! saying so.
#![cfg(feature = "tower")]

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::Router;
use http::Method;
use tollgate::middleware::{HeaderKey, Limit, LimitKey, PeerIp, RateLimitLayer, Route};
use tollgate::redis::{FailurePolicy, RedisLimiter};
use tollgate::RateLimiter;

use crate::http_support::{self, get_path, send, serve};
use crate::redis_server::RedisServer;

/// Every test is bounded: a hang becomes a failure.
async fn bounded(test: impl Future<Output = ()>) {
    tokio::time::timeout(Duration::from_secs(60), test)
        .await
        .expect("the test did not finish within 60 s");
}

async fn redis_limiter(
    server: &RedisServer,
    policy: &str,
    prefix: &str,
    failure: FailurePolicy,
) -> RedisLimiter {
    RedisLimiter::builder(policy.parse().unwrap())
        .prefix(prefix)
        .timeout(Duration::from_millis(300))
        .probe_interval(Duration::from_secs(5))
        .failure_policy(failure)
        .connect(&server.url())
        .await
        .unwrap()
}

fn peer() -> PeerIp {
    PeerIp::new().connect_info(|c: &ConnectInfo<SocketAddr>| c.0.ip())
}

fn ok_router() -> Router {
    Router::new().route("/", get(|| async { "ok" }))
}

const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// Two servers, each with its own layer and its own connection to one Redis: ten requests
/// alternating between them get exactly the policy's five 200s, then 429s with Retry-After.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_layers_share_one_limit_exactly() {
    bounded(async {
        let server = RedisServer::start();
        let mut addrs = Vec::new();
        for _ in 0..2 {
            let limiter = redis_limiter(&server, "5/1h", "shared", FailurePolicy::Error).await;
            addrs.push(serve(
                ok_router().layer(RateLimitLayer::new(limiter).key(peer())),
            ));
        }
        let mut statuses = Vec::new();
        for i in 0..10 {
            let reply = get_path(addrs[i % 2], "/");
            if reply.status == 429 {
                let retry: u64 = reply.header("retry-after").unwrap().parse().unwrap();
                assert!((1..=720).contains(&retry), "{reply:?}");
                assert_eq!(
                    reply.header("ratelimit-policy"),
                    Some("\"default\";q=5;w=3600")
                );
            } else {
                assert_eq!(reply.status, 200, "{reply:?}");
                assert_eq!(reply.body, "ok");
            }
            statuses.push(reply.status);
        }
        assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429, 429, 429]);
    })
    .await;
}

/// One request through a layer whose limiter has `failure` as its failure policy, after
/// Redis was killed; returns the status and the reply.
async fn killed(failure: FailurePolicy, requests: usize) -> Vec<http_support::Reply> {
    let mut server = RedisServer::start();
    let limiter = redis_limiter(&server, "5/1h", "killed", failure).await;
    let addr = serve(ok_router().layer(RateLimitLayer::new(limiter).key(peer())));
    assert_eq!(get_path(addr, "/").status, 200, "decided by Redis");
    server.kill();
    (0..requests).map(|_| get_path(addr, "/")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_redis_with_the_error_policy_answers_503_with_a_problem_document() {
    bounded(async {
        for reply in killed(FailurePolicy::Error, 3).await {
            assert_eq!(reply.status, 503, "{reply:?}");
            assert_eq!(
                reply.header("content-type"),
                Some("application/problem+json")
            );
            assert!(reply.body.contains("\"status\":503"), "{}", reply.body);
            assert!(
                reply.body.contains("the rate limiter cannot decide"),
                "{}",
                reply.body
            );
            assert!(!reply.has("ratelimit"), "{reply:?}");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_redis_fails_open() {
    bounded(async {
        for reply in killed(FailurePolicy::Open, 3).await {
            assert_eq!(reply.status, 200, "{reply:?}");
            assert_eq!(reply.body, "ok");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_redis_fails_closed() {
    bounded(async {
        for reply in killed(FailurePolicy::Closed, 3).await {
            assert_eq!(reply.status, 429, "{reply:?}");
            // The probe interval.
            assert_eq!(reply.header("retry-after"), Some("5"), "{reply:?}");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_redis_falls_back_to_the_local_limiter() {
    bounded(async {
        let local = RateLimiter::new("2/1h".parse().unwrap());
        let statuses: Vec<u16> = killed(FailurePolicy::Local(local), 4)
            .await
            .iter()
            .map(|r| r.status)
            .collect();
        assert_eq!(statuses, [200, 200, 429, 429]);
    })
    .await;
}

/// The peer's address and a header's digest arrive in Redis as `LimitKey`'s text form, on a
/// Redis-backed route and a Redis-backed default rule alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_and_header_keys_reach_redis_as_their_text_form() {
    bounded(async {
        let server = RedisServer::start();
        let by_ip = redis_limiter(&server, "10/1h", "ip", FailurePolicy::Error).await;
        let by_header = redis_limiter(&server, "10/1h", "hdr", FailurePolicy::Error).await;
        let layer = RateLimitLayer::new(by_ip.clone()).key(peer()).route(
            Route::new(Method::GET, "/api").key(HeaderKey::new("x-api-key").unwrap()),
            by_header.clone(),
        );
        let addr = serve(
            ok_router()
                .route("/api", get(|| async { "api" }))
                .layer(layer),
        );

        assert_eq!(get_path(addr, "/").status, 200);
        let ip_keys = by_ip.redis_keys(&LimitKey::Ip(LOOPBACK).to_string());
        assert_eq!(ip_keys, ["ip:{ip:127.0.0.1}:tb:10/1h"]);
        assert_eq!(server.command(&["EXISTS", &ip_keys[0]]).int(), 1);

        let reply = send(addr, "GET", "/api", &[("x-api-key", "k-123")]);
        assert_eq!((reply.status, reply.body.as_str()), (200, "api"));
        // The same digest on every server, with no shared secret configured.
        let digest =
            LimitKey::digest_with_secret(&HeaderKey::PUBLIC_DIGEST_KEY, b"k-123").to_string();
        assert!(
            digest.starts_with("digest:") && digest.len() == 7 + 32,
            "{digest}"
        );
        let header_keys = by_header.redis_keys(&digest);
        assert_eq!(server.command(&["EXISTS", &header_keys[0]]).int(), 1);
        // Only these two keys: the route's request did not touch the default rule's.
        assert_eq!(server.command(&["DBSIZE"]).int(), 2);
        assert_eq!(
            by_ip
                .peek(&LimitKey::Ip(LOOPBACK).to_string())
                .await
                .unwrap()
                .remaining(),
            8
        );
    })
    .await;
}

/// A Redis-backed route spends the cost computed from each request (`Route::cost_with`);
/// one that settles from the response (`Route::settle_with`) reserves the estimate in Redis
/// and settles it at what the response reports, on a task of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn computed_costs_reach_redis_and_settling_routes_settle_there() {
    bounded(async {
        let server = RedisServer::start();
        let limiter = redis_limiter(&server, "100/1h", "cost", FailurePolicy::Error).await;
        let weight = |head: &tollgate::middleware::RequestHead<'_>| {
            head.headers()["x-weight"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap()
        };
        let used = |parts: &http::response::Parts| {
            parts.headers.get("x-used")?.to_str().ok()?.parse().ok()
        };
        let layer = RateLimitLayer::new(limiter.clone())
            .key(peer())
            .route(Route::any("/weighed").cost_with(weight), limiter.clone())
            .route(
                Route::any("/settled").cost_with(weight).settle_with(used),
                limiter.clone(),
            );
        let addr = serve(
            Router::new()
                .route("/weighed", get(|| async { "weighed" }))
                .route("/settled", get(|| async { ([("x-used", "4")], "settled") }))
                .layer(layer),
        );
        let key = LimitKey::Ip(LOOPBACK).to_string();

        let reply = send(addr, "GET", "/weighed", &[("x-weight", "30")]);
        assert_eq!((reply.status, reply.body.as_str()), (200, "weighed"));
        assert_eq!(reply.header("ratelimit"), Some("\"default\";r=70;t=1080"));

        // 30 reserved at the request (the fields say so), 4 used: 26 come back.
        let reply = send(addr, "GET", "/settled", &[("x-weight", "30")]);
        assert_eq!((reply.status, reply.body.as_str()), (200, "settled"));
        assert_eq!(reply.header("ratelimit"), Some("\"default\";r=40;t=2160"));
        // The settle runs on its own task: wait for it (bounded by the test's timeout).
        loop {
            // 34 spent, 66 available: a peek (a request of 1) would leave 65.
            if limiter.peek(&key).await.unwrap().remaining() == 65 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        // A reservation that does not fit is refused and holds nothing.
        let reply = send(addr, "GET", "/settled", &[("x-weight", "80")]);
        assert_eq!(reply.status, 429, "{reply:?}");
        assert_eq!(limiter.peek(&key).await.unwrap().remaining(), 65);
    })
    .await;
}

/// A route decided by several rules on Redis (`RateLimitLayer::and`), in one script call:
/// requests and tokens per address, the tokens reserved and settled from the response; a
/// refusal by the tokens spends no request; in-process and Redis rules do not mix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_rules_on_redis_decide_in_one_call_and_settle() {
    bounded(async {
        let server = RedisServer::start();
        let requests = redis_limiter(&server, "10/1h", "all-req", FailurePolicy::Error).await;
        let tokens = RedisLimiter::builder("1000/1h".parse().unwrap())
            .prefix("all-tok")
            .timeout(Duration::from_millis(300))
            .connect_shared(&requests)
            .await
            .unwrap();
        let weight = |head: &tollgate::middleware::RequestHead<'_>| {
            head.headers()["x-max"].to_str().unwrap().parse().unwrap()
        };
        let used = |parts: &http::response::Parts| {
            parts.headers.get("x-used")?.to_str().ok()?.parse().ok()
        };
        let layer = RateLimitLayer::new(requests.clone())
            .key(peer())
            .policy_name("requests")
            .unwrap()
            .and(
                Limit::new(tokens.clone())
                    .key(peer())
                    .name("tokens")
                    .unwrap()
                    .cost_with(weight)
                    .settle_with(used),
            )
            .unwrap();
        let addr = serve(
            Router::new()
                .route("/", get(|| async { ([("x-used", "100")], "ok") }))
                .layer(layer),
        );
        let key = LimitKey::Ip(LOOPBACK).to_string();
        let available = |limiter: &RedisLimiter| {
            let (limiter, key) = (limiter.clone(), key.clone());
            async move { limiter.available(&key).await.unwrap() }
        };

        // 600 reserved, 100 used: 500 come back, on a task of the settle's own.
        let reply = send(addr, "GET", "/", &[("x-max", "600")]);
        assert_eq!(reply.status, 200, "{reply:?}");
        assert_eq!(
            reply.header("ratelimit-policy"),
            Some("\"requests\";q=10;w=3600, \"tokens\";q=1000;w=3600")
        );
        assert_eq!(reply.header("ratelimit"), Some("\"requests\";r=9;t=360"));
        while available(&tokens).await != 900 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(available(&requests).await, 9);

        // 950 asked for, 900 left: refused by the tokens, and no request is spent.
        let reply = send(addr, "GET", "/", &[("x-max", "950")]);
        assert_eq!(reply.status, 429, "{reply:?}");
        assert!(
            reply
                .header("ratelimit")
                .unwrap()
                .starts_with("\"tokens\";r=900;"),
            "{reply:?}"
        );
        assert_eq!(available(&requests).await, 9);
        assert_eq!(available(&tokens).await, 900);
        // Only the settling rule was reserved: no reservation token waits next to the
        // requests' key for a settle that never comes.
        let tokens_of = |prefix: &str| format!("{prefix}:{{{key}}}:reserved");
        assert_eq!(server.command(&["EXISTS", &tokens_of("all-req")]).int(), 0);

        // The same limiter and key twice name one Redis key: a configuration error, 500.
        let twice = RateLimitLayer::new(requests.clone())
            .key(peer())
            .and(
                Limit::new(requests.clone())
                    .key(peer())
                    .name("again")
                    .unwrap(),
            )
            .unwrap();
        let addr = serve(ok_router().layer(twice));
        let reply = get_path(addr, "/");
        assert_eq!(reply.status, 500, "{reply:?}");
        assert_eq!(available(&requests).await, 9, "nothing spent");

        // Limiters on different connections cannot be decided in one call.
        let apart = redis_limiter(&server, "5/1h", "apart", FailurePolicy::Error).await;
        let err = RateLimitLayer::new(requests.clone())
            .and(Limit::new(apart).name("apart").unwrap())
            .unwrap_err();
        assert!(err.to_string().contains("connect_shared"), "{err}");

        let local: RateLimiter<LimitKey> = RateLimiter::new("5/min".parse().unwrap());
        let err = RateLimitLayer::new(requests.clone())
            .and(Limit::new(local).name("local").unwrap())
            .unwrap_err();
        assert!(
            err.to_string().contains("all in process or all on Redis"),
            "{err}"
        );
    })
    .await;
}

/// A route on a Redis limiter in shadow mode lets every request through with the fields of
/// the policy's answer, and counts its refusals; as one rule of several, it refuses nothing
/// while the other rule still does, and spends only what its policy admits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_limiters_on_redis_let_through_and_count() {
    bounded(async {
        let server = RedisServer::start();
        let shadow = RedisLimiter::builder("2/1h".parse().unwrap())
            .prefix("shadow-route")
            .timeout(Duration::from_millis(300))
            .shadow()
            .connect(&server.url())
            .await
            .unwrap();
        let addr = serve(ok_router().layer(RateLimitLayer::new(shadow.clone()).key(peer())));
        for i in 0..5 {
            let reply = get_path(addr, "/");
            assert_eq!(reply.status, 200, "#{i}: {reply:?}");
            assert!(reply.header("retry-after").is_none(), "#{i}: {reply:?}");
            let left = if i == 0 { 1 } else { 0 };
            let field = reply.header("ratelimit").unwrap();
            assert!(
                field.starts_with(&format!("\"default\";r={left};t=")),
                "#{i}: {field}"
            );
        }
        let stats = shadow.stats();
        assert_eq!((stats.allowed, stats.refused), (2, 3), "{stats:?}");

        let enforced = redis_limiter(&server, "3/1h", "enforced-route", FailurePolicy::Error).await;
        let shadowed = RedisLimiter::builder("1/1h".parse().unwrap())
            .prefix("shadowed-route")
            .timeout(Duration::from_millis(300))
            .shadow()
            .connect_shared(&enforced)
            .await
            .unwrap();
        let layer = RateLimitLayer::new(enforced.clone())
            .key(peer())
            .policy_name("enforced")
            .unwrap()
            .and(
                Limit::new(shadowed.clone())
                    .key(peer())
                    .name("shadowed")
                    .unwrap(),
            )
            .unwrap();
        let addr = serve(ok_router().layer(layer));
        let statuses: Vec<u16> = (0..5).map(|_| get_path(addr, "/").status).collect();
        assert_eq!(statuses, [200, 200, 200, 429, 429]);
        let key = LimitKey::Ip(LOOPBACK).to_string();
        assert_eq!(enforced.available(&key).await.unwrap(), 0);
        let stats = shadowed.stats();
        assert_eq!((stats.allowed, stats.refused), (1, 4), "{stats:?}");
        let fresh = redis_limiter(&server, "1/1h", "shadowed-route", FailurePolicy::Error).await;
        assert_eq!(fresh.available(&key).await.unwrap(), 0, "spent once");
    })
    .await;
}

/// A route on a Redis limiter with a resolver holds each user to their tier, with the
/// tier's fields, and a user whose tier changes keeps the permits already spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiers_on_a_redis_route() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    bounded(async {
        let server = RedisServer::start();
        let upgraded = Arc::new(AtomicBool::new(false));
        let paid = Arc::clone(&upgraded);
        let limiter = RedisLimiter::builder("1/1h".parse().unwrap())
            .prefix("tiered-route")
            .timeout(Duration::from_millis(300))
            .resolver(move |user: &str| {
                let tier = if user == "id:7" || paid.load(Ordering::Relaxed) {
                    "3/1h"
                } else {
                    "1/1h"
                };
                tier.parse().unwrap()
            })
            .resolver_cache(100, Duration::ZERO)
            .connect(&server.url())
            .await
            .unwrap();
        let user = |head: &tollgate::middleware::RequestHead<'_>| {
            let id = head.headers().get("x-user")?.to_str().ok()?.parse().ok()?;
            Some(LimitKey::Id(id))
        };
        let addr = serve(ok_router().layer(RateLimitLayer::new(limiter.clone()).key(user)));
        let statuses = |id: &'static str, n: usize| -> Vec<u16> {
            (0..n)
                .map(|_| send(addr, "GET", "/", &[("x-user", id)]).status)
                .collect()
        };
        let reply = send(addr, "GET", "/", &[("x-user", "7")]);
        assert_eq!(reply.status, 200);
        let field = reply.header("ratelimit").unwrap();
        assert!(field.contains(";r=2;"), "{field}");
        assert_eq!(statuses("7", 3), [200, 200, 429]);
        assert_eq!(statuses("8", 2), [200, 429]);
        // User 8 upgrades: 1 of the 3 already spent.
        upgraded.store(true, Ordering::Relaxed);
        assert_eq!(statuses("8", 3), [200, 200, 429]);
        assert_eq!(limiter.stats().policy_moves, 1);
    })
    .await;
}

/// A route on a Redis limiter with live policies follows a `set_policy` made on another
/// server: its `RateLimit-Policy` field and its decisions change, the permits spent kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_policy_changes_reach_a_redis_route() {
    bounded(async {
        let server = RedisServer::start();
        let url = server.url();
        let build = || {
            RedisLimiter::builder("2/1h".parse().unwrap())
                .prefix("live-route")
                .timeout(Duration::from_millis(300))
                .live_policy()
                .connect(&url)
        };
        let serving = build().await.unwrap();
        let admin = build().await.unwrap();
        let addr = serve(ok_router().layer(RateLimitLayer::new(serving).key(peer())));
        let reply = get_path(addr, "/");
        assert_eq!(
            reply.header("ratelimit-policy"),
            Some("\"default\";q=2;w=3600")
        );
        assert_eq!(get_path(addr, "/").status, 200);
        assert_eq!(get_path(addr, "/").status, 429);
        admin.set_policy("4/1h".parse().unwrap()).await.unwrap();
        // The serving limiter reads the stored policy within a second.
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        let reply = get_path(addr, "/");
        assert_eq!(reply.status, 200, "{reply:?}");
        assert_eq!(
            reply.header("ratelimit-policy"),
            Some("\"default\";q=4;w=3600")
        );
        assert_eq!(get_path(addr, "/").status, 200);
        assert_eq!(get_path(addr, "/").status, 429, "2 spent before, 2 after");
    })
    .await;
}

/// A route of several Redis rules whose rule's key follows a later policy (another server
/// chose it, and it is smaller than the route's cost) answers as for any cost the policy
/// cannot admit, naming no missing rule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_a_followed_policy_cannot_admit_is_a_cost_error() {
    bounded(async {
        let server = RedisServer::start();
        let tiered = |answer: &'static str| {
            RedisLimiter::builder("10000/1h".parse().unwrap())
                .prefix("followed-tokens")
                .timeout(Duration::from_millis(300))
                .resolver(move |_: &str| answer.parse().unwrap())
        };
        let requests =
            redis_limiter(&server, "100/1h", "followed-requests", FailurePolicy::Error).await;
        let tokens = tiered("10000/1h").connect_shared(&requests).await.unwrap();
        let layer = RateLimitLayer::new(requests.clone())
            .key(peer())
            .policy_name("requests")
            .unwrap()
            .and(
                Limit::new(tokens.clone())
                    .key(peer())
                    .name("tokens")
                    .unwrap()
                    .cost(5_000)
                    .unwrap(),
            )
            .unwrap();
        let addr = serve(ok_router().layer(layer));
        assert_eq!(get_path(addr, "/").status, 200);
        // Another server's answer for the key, chosen later: 100 an hour.
        tokio::time::sleep(Duration::from_millis(5)).await;
        let other = tiered("100/1h").connect(&server.url()).await.unwrap();
        let key = LimitKey::Ip(LOOPBACK).to_string();
        assert!(other.try_acquire(&key).await.unwrap().limit() == 100);
        let reply = get_path(addr, "/");
        assert_eq!(reply.status, 500, "{reply:?}");
        assert!(reply.body.contains("cost"), "{reply:?}");
    })
    .await;
}

/// A request dropped while its reservation is on its way to Redis (an outer timeout, Redis
/// slow): the decision finishes on a task of its own, and finding no one to take it, gives
/// the reservation back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_dropped_while_redis_decides_gives_its_reservation_back() {
    use tower_layer::Layer;
    use tower_service::Service;
    bounded(async {
        let server = RedisServer::start();
        let limiter = redis_limiter(&server, "1000/1h", "dropped", FailurePolicy::Error).await;
        let mut service = RateLimitLayer::new(limiter.clone())
            .key(tollgate::middleware::GlobalKey)
            .route(
                Route::any("/").cost(400).unwrap().settle_with(|_| Some(1)),
                limiter.clone(),
            )
            .layer(ok_router());
        // The connection made, Redis held while the request's reservation is in flight.
        let _ = limiter.peek("global").await.unwrap();
        server.pause();
        let future = service.call(
            http::Request::get("/")
                .body(axum::body::Body::empty())
                .unwrap(),
        );
        assert!(tokio::time::timeout(Duration::from_millis(150), future)
            .await
            .is_err());
        server.resume();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let peek = limiter.peek("global").await.unwrap();
            let left = peek.remaining() + u64::from(peek.is_allowed());
            if left == 1000 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{left} left: a request that got no response kept its reservation"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}
