//! HTTP middleware (feature `tower`): a tower [`Layer`](tower_layer::Layer) for axum, hyper
//! and tonic that turns each request's [`Decision`](crate::Decision) into the right response.
//!
//! | item | role |
//! |---|---|
//! | [`RateLimitLayer`] | the configuration: default limiter, per-route rules, key extractor, header style |
//! | [`RateLimit`], [`ResponseFuture`], [`RateLimitBody`] | the service it builds, its future and its response body |
//! | [`KeyExtractor`], [`RequestHead`], [`LimitKey`] | how a request becomes a key |
//! | [`PeerIp`], [`ClientIp`], [`HeaderKey`], [`GlobalKey`] | the built-in extractors |
//! | [`Backend`] | what decides a rule: an in-process `RateLimiter<LimitKey>`, or a `RedisLimiter` (feature `redis`) |
//! | [`Route`], [`MissingKey`], [`HeaderStyle`] | rules and answers |
//! | [`KeyError`], [`ConfigError`] | what can go wrong |
//! | [`ConcurrencyLimitLayer`], [`ConcurrencyLimit`], [`ConcurrencyFuture`], [`ConcurrencyBody`] | requests in flight per key, from a [`ConcurrencyLimiter`](crate::ConcurrencyLimiter), each held until its response body ends |
//! | [`LoginLayer`], [`Login`], [`LoginFuture`], [`LoginOutcome`] | a [`LoginGuard`](crate::LoginGuard) in front of a login route: check before, record the outcome from the status |
//!
//! What a client sees, for a policy of `3/1s` keyed by peer IP:
//!
//! ```text
//! 200  RateLimit-Policy: "default";q=3;w=1   RateLimit: "default";r=2;t=1
//! 200  RateLimit-Policy: "default";q=3;w=1   RateLimit: "default";r=1;t=1
//! 200  RateLimit-Policy: "default";q=3;w=1   RateLimit: "default";r=0;t=1
//! 429  Retry-After: 1   RateLimit-Policy: ...   RateLimit: "default";r=0;t=1
//!      content-type: application/problem+json
//!      {"type":"about:blank","title":"Too Many Requests","status":429,
//!       "detail":"Rate limit exceeded: retry after 1 second","retry_after":1}
//! ```
//!
//! # Examples
//!
//! ```
//! use std::net::SocketAddr;
//! use axum::{extract::ConnectInfo, routing::get, Extension, Router};
//! use tollgate::middleware::{LimitKey, PeerIp, RateLimitLayer};
//! use tollgate::{Decision, RateLimiter};
//!
//! let limiter: RateLimiter<LimitKey> = RateLimiter::new("5/1s".parse()?).max_keys(100_000);
//! let layer = RateLimitLayer::new(limiter)
//!     .key(PeerIp::new().connect_info(|c: &ConnectInfo<SocketAddr>| c.0.ip()));
//! let app: Router = Router::new()
//!     .route("/", get(|Extension(d): Extension<Decision>| async move {
//!         format!("ok, {} left", d.remaining())
//!     }))
//!     .layer(layer);
//! // axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! See `docs/MIDDLEWARE.md` for the choices behind each default and how to deploy behind
//! proxies.

mod backend;
mod body;
mod concurrency;
mod error;
mod forwarded;
mod future;
mod header_key;
mod headers;
mod key;
mod layer;
mod login;
mod route;
mod rules;
mod service;
mod settlement;

pub use backend::Backend;
pub use body::RateLimitBody;
pub use concurrency::{
    ConcurrencyBody, ConcurrencyFuture, ConcurrencyLimit, ConcurrencyLimitLayer,
};
pub use error::{ConfigError, KeyError};
pub use forwarded::ClientIp;
pub use future::ResponseFuture;
pub use header_key::HeaderKey;
pub use headers::HeaderStyle;
pub use key::{GlobalKey, KeyExtractor, LimitKey, PeerIp, RequestHead};
pub use layer::RateLimitLayer;
pub use login::{Login, LoginFuture, LoginLayer, LoginOutcome};
pub use route::{MissingKey, Route};
pub use service::RateLimit;
