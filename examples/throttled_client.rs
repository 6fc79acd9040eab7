//! A client that keeps a provider's quota: 200 requests from 8 concurrent tasks through
//! `tollgate::client::ThrottleLayer` around hyper-util's client, against a local upstream
//! that refuses more than 20 requests in any second (`429` with `Retry-After`, and the IETF
//! `RateLimit` fields on every answer).
//!
//! ```text
//! cargo run --release --features tower --example throttled_client
//! ```
//!
//! Two runs, one line each:
//!
//! 1. the throttle set to the quota (`Throttle::quota("20/1s")`);
//! 2. set 2x too generous (`"40/1s"`): what the upstream says holds it back.
//!
//! Each line reads `upstream saw N requests, R refused with 429, in S s (Q per second)`:
//! N requests reached the upstream (a refused request is sent again once the throttle lets
//! it, so N = 200 + R), S seconds from the first to the last answer, and Q the requests it
//! accepted per second (200 / S).

use std::convert::Infallible;
use std::future::poll_fn;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::Request;
use axum::middleware::{from_fn, Next};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tollgate::client::{Throttle, ThrottleLayer};
use tollgate::middleware::{GlobalKey, LimitKey, RateLimitLayer};
use tollgate::RateLimiter;
use tower_layer::Layer;
use tower_service::Service;

const REQUESTS: usize = 200;
const TASKS: usize = 8;

/// What the upstream saw.
#[derive(Default)]
struct Seen {
    requests: AtomicU64,
    refused: AtomicU64,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        for quota in ["20/1s", "40/1s"] {
            let seen = Arc::new(Seen::default());
            let address = upstream(Arc::clone(&seen)).await?;
            let elapsed = send(address, quota).await?;
            let requests = seen.requests.load(Ordering::Relaxed);
            let refused = seen.refused.load(Ordering::Relaxed);
            let seconds = elapsed.as_secs_f64();
            println!(
                "upstream saw {requests} requests, {refused} refused with 429, in {seconds:.2} s ({:.1} per second)",
                REQUESTS as f64 / seconds
            );
        }
        Ok(())
    })
}

/// A provider that refuses more than 20 requests in any second: tollgate's own server
/// middleware with an exact sliding window, one budget for every caller.
async fn upstream(seen: Arc<Seen>) -> Result<SocketAddr, Box<dyn std::error::Error>> {
    let strict: RateLimiter<LimitKey> = RateLimiter::new("sliding-log 20/1s".parse()?);
    let count = move |request: Request, next: Next| {
        let seen = Arc::clone(&seen);
        async move {
            seen.requests.fetch_add(1, Ordering::Relaxed);
            let response: Response = next.run(request).await;
            if response.status() == 429 {
                seen.refused.fetch_add(1, Ordering::Relaxed);
            }
            Ok::<_, Infallible>(response)
        }
    };
    let app = Router::new()
        .route("/v1/work", get(|| async { "done" }))
        .layer(RateLimitLayer::new(strict).key(GlobalKey))
        .layer(from_fn(count));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let address = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(address)
}

/// Sends the requests from the tasks through the throttle; the time from the first request
/// to the last answer.
async fn send(address: SocketAddr, quota: &str) -> Result<Duration, Box<dyn std::error::Error>> {
    let layer =
        ThrottleLayer::new(Throttle::quota(quota.parse()?)?.max_wait(Duration::from_secs(60)));
    let client =
        layer.layer(Client::builder(TokioExecutor::new()).build_http::<Empty<bytes::Bytes>>());
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let mut client = client.clone();
        let next = Arc::clone(&next);
        tasks.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < REQUESTS {
                // A refused request is sent again: the throttle holds it until the upstream's
                // pause is over.
                loop {
                    poll_fn(|cx| client.poll_ready(cx)).await?;
                    let request = http::Request::get(format!("http://{address}/v1/work"))
                        .body(Empty::new())?;
                    let response = client.call(request).await?;
                    let status = response.status();
                    response.into_body().collect().await?;
                    if status != 429 {
                        break;
                    }
                }
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }));
    }
    for task in tasks {
        task.await?.map_err(|err| err.to_string())?;
    }
    Ok(start.elapsed())
}
