//! An axum server behind tollgate's HTTP middleware: `GET /` answers 200 "ok", keyed by the
//! peer's IP address (IPv6 masked to /64), under the policy in `TOLLGATE_POLICY`.
//!
//! ```text
//! cargo run --release --features tower --example http_server
//! cargo run --release --features tower,axum --example http_server   # the same, no glue code
//! TOLLGATE_POLICY="10/s & 1000/day" PORT=8080 cargo run --release --features tower --example http_server
//! curl -i http://127.0.0.1:3000/
//! ```
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `PORT` | `3000` | port on 127.0.0.1 |
//! | `TOLLGATE_POLICY` | `5/1s` | any policy string (`"100/min"`, `"sliding-log 5 per 15m"`, `"10/s & 1000/day"`), or `off` for the same router without the layer (the baseline of the load test in docs/BENCHMARKS.md) |
//! | `TOLLGATE_MAX_KEYS` | `100000` | most client addresses tracked at once |
//! | `TOLLGATE_REDIS` | unset | a Redis URL: decide through Redis (needs feature `redis`), so that every server sharing it shares one limit per address |
//!
//! Two servers, one limit:
//!
//! ```text
//! TOLLGATE_REDIS=redis://127.0.0.1:6379/ TOLLGATE_POLICY=5/10s PORT=3001 cargo run --release --features tower,redis --example http_server
//! TOLLGATE_REDIS=redis://127.0.0.1:6379/ TOLLGATE_POLICY=5/10s PORT=3002 cargo run --release --features tower,redis --example http_server
//! for i in 1 2 3 4 5; do curl -s -o /dev/null -w '%{http_code} ' localhost:3001/; curl -s -o /dev/null -w '%{http_code} ' localhost:3002/; done
//! ```

#[cfg(feature = "tower")]
mod server {
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::time::Duration;

    #[cfg(not(feature = "axum"))]
    use axum::extract::ConnectInfo;
    use axum::routing::get;
    use axum::Router;
    use tollgate::middleware::{LimitKey, PeerIp, RateLimitLayer};
    use tollgate::{Policy, RateLimiter};

    pub(crate) fn main() -> Result<(), Box<dyn std::error::Error>> {
        let policy_text = env_or("TOLLGATE_POLICY", "5/1s");
        let policy: Option<Policy> = match policy_text.as_str() {
            "off" => None,
            text => Some(text.parse().map_err(|e| format!("TOLLGATE_POLICY: {e}"))?),
        };
        let port: u16 = env_or("PORT", "3000")
            .parse()
            .map_err(|e| format!("PORT: {e}"))?;
        let max_keys: usize = env_or("TOLLGATE_MAX_KEYS", "100000")
            .parse()
            .map_err(|e| format!("TOLLGATE_MAX_KEYS: {e}"))?;

        let redis_url = std::env::var("TOLLGATE_REDIS").ok();

        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async move {
            let app = Router::new().route("/", get(|| async { "ok" }));
            // With feature `axum`, `PeerIp` reads axum's `ConnectInfo` by itself; without it,
            // the connection-info type is registered here.
            #[cfg(feature = "axum")]
            let peer = PeerIp::new();
            #[cfg(not(feature = "axum"))]
            let peer = PeerIp::new().connect_info(|c: &ConnectInfo<SocketAddr>| c.0.ip());
            let mut limiter: Option<Arc<RateLimiter<LimitKey>>> = None;
            let app = match (policy, redis_url) {
                (None, _) => app,
                (Some(policy), Some(url)) => {
                    app.layer(RateLimitLayer::new(redis_limiter(policy, &url).await?).key(peer))
                }
                (Some(policy), None) => {
                    let local = Arc::new(RateLimiter::new(policy).max_keys(max_keys));
                    limiter = Some(Arc::clone(&local));
                    app.layer(RateLimitLayer::new(local).key(peer))
                }
            };

            // Reclaim idle clients' memory now and then (new keys also sweep as they arrive).
            if let Some(evictor) = limiter {
                tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(Duration::from_secs(30)).await;
                        evictor.evict_idle();
                    }
                });
            }
            let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
            match policy {
                Some(policy) => eprintln!(
                    "listening on http://{} with policy {policy}",
                    listener.local_addr()?
                ),
                None => eprintln!(
                    "listening on http://{} without rate limiting",
                    listener.local_addr()?
                ),
            }
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await?;
            Ok(())
        })
    }

    /// The limiter deciding through the Redis at `url` (`TOLLGATE_REDIS`).
    #[cfg(feature = "redis")]
    async fn redis_limiter(
        policy: Policy,
        url: &str,
    ) -> Result<tollgate::redis::RedisLimiter, Box<dyn std::error::Error>> {
        let limiter = tollgate::redis::RedisLimiter::builder(policy)
            .prefix("http_server")
            .connect(url)
            .await
            .map_err(|e| format!("TOLLGATE_REDIS={url}: {e}"))?;
        eprintln!("deciding through redis at {url}");
        Ok(limiter)
    }

    #[cfg(not(feature = "redis"))]
    async fn redis_limiter(
        _: Policy,
        _: &str,
    ) -> Result<Arc<RateLimiter<LimitKey>>, Box<dyn std::error::Error>> {
        Err("TOLLGATE_REDIS needs the `redis` feature: \
             cargo run --release --features tower,redis --example http_server"
            .into())
    }

    fn env_or(name: &str, default: &str) -> String {
        std::env::var(name).unwrap_or_else(|_| default.to_owned())
    }
}

#[cfg(feature = "tower")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    server::main()
}

#[cfg(not(feature = "tower"))]
fn main() {
    eprintln!(
        "this example needs the `tower` feature: \
         cargo run --release --features tower --example http_server"
    );
    std::process::exit(2);
}
