//! HTTP middleware (feature `tower`): a tower [`Layer`](tower_layer::Layer) for axum, hyper
//! and tonic that turns each request's [`Decision`](crate::Decision) into the right response.
//!
//! Three layers, each a module laid out as tower lays out its own (`layer.rs`, `service.rs`,
//! `future.rs`), over shared pieces: keys, header fields, refusals, the response body.
//!
//! | item | role |
//! |---|---|
//! | [`RateLimitLayer`], [`Route`] | requests per key and window: default limiter, per-route rules, key extractor, header style; module [`rate`] with its service and future |
//! | [`ConcurrencyLimitLayer`] | requests in flight per key, from a [`ConcurrencyLimiter`](crate::concurrency::ConcurrencyLimiter), each held until its response body ends; module [`concurrency`] |
//! | [`LoginLayer`], [`LoginOutcome`] | a [`LoginGuard`](crate::login::LoginGuard) in front of a login route: check before, record the outcome from the status; module [`login`] |
//! | [`KeyExtractor`], [`RequestHead`], [`LimitKey`] | how a request becomes a key |
//! | [`PeerIp`], [`ClientIp`], [`HeaderKey`], [`GlobalKey`] | the built-in extractors |
//! | [`MissingKey`] | the answer to a request without a key, for every layer |
//! | [`Refusal`], [`Refused`] | what a layer decided when it refuses: what every layer's `on_refusal` handler gets |
//! | [`Backend`] | what decides a rate rule: an in-process `RateLimiter<LimitKey>`, or a `RedisLimiter` (feature `redis`) |
//! | [`HeaderStyle`] | which rate-limit fields responses carry |
//! | [`ResponseBody`] | the response body of every layer's service: the inner body, or the layer's own answer |
//! | [`KeyError`], [`ConfigError`] | what can go wrong |
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
//! use axum::{routing::get, Extension, Router};
//! use tollgate::middleware::{LimitKey, RateLimitLayer};
//! use tollgate::{Decision, RateLimiter};
//!
//! // Keyed by peer address (`PeerIp`, the default), which axum provides with
//! // `into_make_service_with_connect_info` and tollgate reads with feature `axum`.
//! let limiter: RateLimiter<LimitKey> = RateLimiter::new("5/1s".parse()?).max_keys(100_000);
//! let layer = RateLimitLayer::new(limiter);
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

pub mod concurrency;
pub mod login;
pub mod rate;

mod backend;
mod body;
mod error;
mod forwarded;
mod header_key;
mod headers;
mod key;
mod missing_key;
mod peer;
mod refusal;

pub use backend::Backend;
pub use body::ResponseBody;
pub use concurrency::ConcurrencyLimitLayer;
pub use error::{ConfigError, KeyError};
pub use forwarded::ClientIp;
pub use header_key::HeaderKey;
pub use headers::HeaderStyle;
pub use key::{GlobalKey, KeyExtractor, LimitKey, RequestHead};
pub use login::{LoginLayer, LoginOutcome};
pub use missing_key::MissingKey;
pub use peer::PeerIp;
pub use rate::{Limit, RateLimitLayer, Route};
pub use refusal::{Refusal, Refused};
