//! The layer around a scripted upstream: pauses, the rate-limit fields, malformed values,
//! keys, costs and settling.

use std::sync::Arc;
use std::time::Duration;

use http::Request;
use tokio::time::Instant;
use tollgate::client::{Throttle, ThrottleError, ThrottleLayer};
use tollgate::clock::TokioClock;
use tollgate::{DirectLimiter, RateLimiter};
use tower_layer::Layer;
use tower_service::Service;

use crate::upstream::{get, Answer, Upstream};

fn generous() -> Throttle {
    Throttle::new(DirectLimiter::with_clock(
        "100/1s".parse().unwrap(),
        TokioClock::new(),
    ))
}

/// Sends `requests` calls at once, each from its own task.
async fn send_all(
    layer: &ThrottleLayer,
    upstream: &Upstream,
    requests: Vec<Request<()>>,
) -> Vec<Result<u16, ThrottleError>> {
    let tasks: Vec<_> = requests
        .into_iter()
        .map(|request| {
            let mut client = layer.layer(upstream.clone());
            tokio::spawn(async move { client.call(request).await.map(|r| r.status().as_u16()) })
        })
        .collect();
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.unwrap());
    }
    out
}

#[tokio::test(start_paused = true)]
async fn a_429_pauses_every_waiter_for_its_retry_after() {
    let upstream = Upstream::new(
        vec![Answer::ok().status(429).field("retry-after", "3")],
        |_| Answer::ok(),
    );
    let layer = ThrottleLayer::new(generous());
    let statuses = send_all(
        &layer,
        &upstream,
        (0..4).map(|_| get("api.example.com")).collect(),
    )
    .await;
    let statuses: Vec<u16> = statuses.into_iter().map(Result::unwrap).collect();
    assert_eq!(statuses, [429, 200, 200, 200]);
    let secs = |s| Duration::from_secs(s);
    assert_eq!(upstream.arrived(), [secs(0), secs(3), secs(3), secs(3)]);
    assert_eq!(layer.throttle().stats().pauses, 1);
}

#[tokio::test(start_paused = true)]
async fn a_503_pauses_only_with_retry_after() {
    let upstream = Upstream::new(
        vec![
            Answer::ok().status(503),
            Answer::ok().status(503).field("retry-after", "2"),
        ],
        |_| Answer::ok(),
    );
    let layer = ThrottleLayer::new(generous());
    let mut client = layer.layer(upstream.clone());
    for _ in 0..3 {
        client.call(get("api.example.com")).await.unwrap();
    }
    let secs = |s| Duration::from_secs(s);
    assert_eq!(upstream.arrived(), [secs(0), secs(0), secs(2)]);
}

#[tokio::test(start_paused = true)]
async fn the_rate_limit_fields_cap_what_is_left_and_never_raise_the_budget() {
    // The upstream has 1 left for 5 s, then none: the third call waits for its reset.
    let upstream = Upstream::new(vec![], |i| {
        Answer::ok().field("ratelimit", &format!("\"default\";r={};t=5", 1 - i.min(1)))
    });
    let layer = ThrottleLayer::new(generous());
    let mut client = layer.layer(upstream.clone());
    for _ in 0..3 {
        client.call(get("api.example.com")).await.unwrap();
    }
    let secs = |s| Duration::from_secs(s);
    assert_eq!(upstream.arrived(), [secs(0), secs(0), secs(5)]);

    // An upstream that claims 1000 left does not lift the budget of 2 per second.
    let boastful = Upstream::new(vec![], |_| {
        Answer::ok()
            .field("x-ratelimit-remaining", "1000")
            .field("x-ratelimit-reset", "1")
    });
    let tight = Throttle::new(DirectLimiter::with_clock(
        "2/1s".parse().unwrap(),
        TokioClock::new(),
    ));
    let layer = ThrottleLayer::new(tight);
    let mut client = layer.layer(boastful.clone());
    for _ in 0..3 {
        client.call(get("api.example.com")).await.unwrap();
    }
    assert_eq!(
        boastful.arrived(),
        [secs(0), secs(0), Duration::from_millis(500)]
    );
    assert_eq!(layer.throttle().stats().adjustments, 3);
}

#[tokio::test(start_paused = true)]
async fn calls_in_flight_are_taken_off_what_the_upstream_says_is_left() {
    // Each call takes 100 ms to answer; the upstream says 3 are left for 10 s after the first.
    let upstream = Upstream::new(
        vec![Answer::ok()
            .field("ratelimit", "\"default\";r=3;t=10")
            .delays(Duration::ZERO, Duration::from_millis(100))],
        |_| Answer::ok().delays(Duration::ZERO, Duration::from_millis(100)),
    );
    let layer = ThrottleLayer::new(generous());
    let statuses = send_all(
        &layer,
        &upstream,
        (0..6).map(|_| get("api.example.com")).collect(),
    )
    .await;
    assert!(statuses.iter().all(|s| matches!(s, Ok(200))));
    // Six went at once (nothing was known yet); when the first answer came, five were in
    // flight, more than the 3 left: nothing more until the reset.
    let more = send_all(&layer, &upstream, vec![get("api.example.com")]).await;
    assert!(matches!(more[0], Ok(200)));
    let arrived = upstream.arrived();
    assert_eq!(arrived[..6], [Duration::ZERO; 6]);
    assert_eq!(arrived[6], Duration::from_millis(10_100));
}

#[tokio::test(start_paused = true)]
async fn malformed_fields_are_counted_and_ignored() {
    let upstream = Upstream::new(
        vec![
            Answer::ok().field("ratelimit", "\"d\";r=-5;t=1"),
            Answer::ok()
                .field("x-ratelimit-remaining", "NaN")
                .field("x-ratelimit-reset", "1"),
            Answer::ok().status(429).field("retry-after", "soon"),
        ],
        |_| Answer::ok(),
    );
    let layer = ThrottleLayer::new(generous());
    let mut client = layer.layer(upstream.clone());
    for _ in 0..4 {
        client.call(get("api.example.com")).await.unwrap();
    }
    let stats = layer.throttle().stats();
    assert_eq!(
        (stats.malformed, stats.adjustments, stats.pauses),
        (3, 0, 1)
    );
    // The 429's unusable Retry-After pauses for the default second.
    let arrived = upstream.arrived();
    assert_eq!(arrived[3], Duration::from_secs(1));
}

/// `Retry-After` in the obsolete date formats (RFC 850, asctime) is a date like the
/// IMF-fixdate, not a malformed value paused for the default second: one in the past
/// pauses for nothing.
#[tokio::test(start_paused = true)]
async fn a_retry_after_in_an_obsolete_date_format_is_heard() {
    for date in ["Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994"] {
        let upstream = Upstream::new(
            vec![Answer::ok().status(429).field("retry-after", date)],
            |_| Answer::ok(),
        );
        let layer = ThrottleLayer::new(generous());
        let mut client = layer.layer(upstream.clone());
        for _ in 0..2 {
            client.call(get("api.example.com")).await.unwrap();
        }
        assert_eq!(upstream.arrived(), [Duration::ZERO; 2], "{date}");
        let stats = layer.throttle().stats();
        assert_eq!((stats.malformed, stats.pauses), (0, 1), "{date}");
    }
}

#[tokio::test(start_paused = true)]
async fn keys_come_from_the_host_or_a_closure() {
    let upstream = Upstream::new(vec![], |_| Answer::ok());
    let per_key: RateLimiter<String, TokioClock> =
        RateLimiter::with_clock("1/1s".parse().unwrap(), TokioClock::new());
    let per_key = Arc::new(per_key);
    let layer = ThrottleLayer::new(Throttle::new(Arc::clone(&per_key)));
    let mut client = layer.layer(upstream.clone());
    client.call(get("one.example.com")).await.unwrap();
    client.call(get("Two.Example.com")).await.unwrap();
    let host_only = Request::get("/relative")
        .header("host", "one.example.com:8443")
        .body(())
        .unwrap();
    client.call(host_only).await.unwrap();
    let secs = |s| Duration::from_secs(s);
    assert_eq!(upstream.arrived(), [secs(0), secs(0), secs(1)]);
    assert!(per_key.peek("two.example.com").remaining() == 0);
    let nowhere = Request::get("/relative").body(()).unwrap();
    assert!(matches!(
        client.call(nowhere).await,
        Err(ThrottleError::NoKey)
    ));

    let by_api_key = layer
        .clone()
        .key_with(|request| Some(request.headers.get("x-api-key")?.to_str().ok()?.to_owned()));
    let mut client = by_api_key.layer(upstream.clone());
    let with_key = |key: &str| {
        Request::get("https://api.example.com/")
            .header("x-api-key", key)
            .body(())
            .unwrap()
    };
    let start = Instant::now();
    client.call(with_key("k1")).await.unwrap();
    client.call(with_key("k2")).await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert!(matches!(
        client.call(get("api.example.com")).await,
        Err(ThrottleError::NoKey)
    ));
}

/// Every spelling of one host is one key, with one quota: a trailing dot, the case, an IPv6
/// address written out or compressed, an IPv4 address mapped into IPv6, the `Host` field.
#[tokio::test(start_paused = true)]
async fn every_spelling_of_a_host_is_one_key() {
    let with_host = |host: &str| {
        Request::get("/relative")
            .header("host", host)
            .body(())
            .unwrap()
    };
    for (spellings, key) in [
        (
            vec![
                get("api.example.com"),
                get("api.example.com."),
                get("API.Example.COM."),
                with_host("api.example.com.:443"),
            ],
            "api.example.com",
        ),
        (
            vec![
                get("[2001:db8::1]"),
                get("[2001:db8:0:0:0:0:0:1]"),
                get("[2001:DB8::0:1]:8443"),
                with_host("[2001:0db8::1]"),
            ],
            "[2001:db8::1]",
        ),
        (
            vec![
                get("192.0.2.1"),
                get("[::ffff:192.0.2.1]"),
                get("[::FFFF:c000:201]"),
                with_host("192.0.2.1:80"),
            ],
            "192.0.2.1",
        ),
    ] {
        let upstream = Upstream::new(vec![], |_| Answer::ok());
        let per_key: RateLimiter<String, TokioClock> =
            RateLimiter::with_clock("1/1s".parse().unwrap(), TokioClock::new());
        let per_key = Arc::new(per_key);
        let layer = ThrottleLayer::new(Throttle::new(Arc::clone(&per_key)));
        let mut client = layer.layer(upstream.clone());
        for request in spellings {
            client.call(request).await.unwrap();
        }
        let secs = |s| Duration::from_secs(s);
        assert_eq!(
            upstream.arrived(),
            [secs(0), secs(1), secs(2), secs(3)],
            "{key}"
        );
        assert_eq!(per_key.peek(key).remaining(), 0, "{key}");
        assert_eq!(per_key.len(), 1, "{key}");
    }
}

#[tokio::test(start_paused = true)]
async fn costs_are_reserved_and_settled_from_the_answer() {
    let upstream = Upstream::new(
        vec![Answer::ok().field("x-tokens-used", "30"), Answer::ok()],
        |_| Answer::ok(),
    );
    let tokens: RateLimiter<String, TokioClock> =
        RateLimiter::with_clock("100/min".parse().unwrap(), TokioClock::new());
    let tokens = Arc::new(tokens);
    let layer = ThrottleLayer::new(Throttle::new(Arc::clone(&tokens)))
        .cost_with(|request| {
            request
                .headers
                .get("x-estimate")
                .map_or(1, |v| v.to_str().unwrap().parse().unwrap())
        })
        .settle_with(|answer| {
            answer
                .headers
                .get("x-tokens-used")?
                .to_str()
                .ok()?
                .parse()
                .ok()
        });
    let mut client = layer.layer(upstream.clone());
    let estimate = |n: u64| {
        Request::get("https://llm.example.com/v1/chat")
            .header("x-estimate", n.to_string())
            .body(())
            .unwrap()
    };
    // Reserved 10, used 30: charged 20 more.
    client.call(estimate(10)).await.unwrap();
    assert_eq!(tokens.available("llm.example.com"), 70);
    // Reserved 20, no usage reported: the estimate stands.
    client.call(estimate(20)).await.unwrap();
    assert_eq!(tokens.available("llm.example.com"), 50);
    // A cost above the budget is refused before anything is sent.
    let err = client.call(estimate(101)).await.unwrap_err();
    assert!(matches!(err, ThrottleError::Cost { .. }), "{err:?}");
    assert_eq!(upstream.arrived().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_failed_call_keeps_its_permit_and_reports_the_upstream_error() {
    #[derive(Clone)]
    struct Broken;
    impl Service<Request<()>> for Broken {
        type Response = http::Response<()>;
        type Error = std::io::Error;
        type Future = std::future::Ready<Result<http::Response<()>, std::io::Error>>;
        fn poll_ready(
            &mut self,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Result<(), std::io::Error>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: Request<()>) -> Self::Future {
            std::future::ready(Err(std::io::Error::other("connection reset")))
        }
    }
    let budget = Arc::new(DirectLimiter::with_clock(
        "2/1s".parse().unwrap(),
        TokioClock::new(),
    ));
    let layer = ThrottleLayer::new(Throttle::new(Arc::clone(&budget)));
    let mut client = layer.layer(Broken);
    let err = client.call(get("api.example.com")).await.unwrap_err();
    assert!(matches!(err, ThrottleError::Upstream(_)), "{err:?}");
    assert_eq!(
        std::error::Error::source(&err).unwrap().to_string(),
        "connection reset"
    );
    assert_eq!(budget.available(), 1, "the failed call spent one");
}
