//! The rate layer: [`RateLimitLayer`] builds [`RateLimit`] services, which decide each
//! request by the first matching [`Route`]'s limiters (or the default ones), all or nothing,
//! and answer through a [`ResponseFuture`].
//!
//! | file | what it holds |
//! |---|---|
//! | `layer.rs` | [`RateLimitLayer`], the builder |
//! | `route.rs` | [`Route`]: which requests a rule takes, their key, name and cost |
//! | `limit.rs` | [`Limit`]: one more limiter deciding a route with its own, all or nothing |
//! | `rule.rs` | one rule: limiter, key, cost, name and the fields of its decisions |
//! | `config.rs` | the rules together, and the decision of one request (by one rule or several) |
//! | `settlement.rs` | a reservation on its way through the inner service |
//! | `service.rs` | [`RateLimit`] |
//! | `future.rs` | [`ResponseFuture`] |
//!
//! # Examples
//!
//! ```
//! use tollgate::middleware::rate::{RateLimit, RateLimitLayer};
//! use tollgate::RateLimiter;
//! use tower_layer::Layer;
//!
//! let layer = RateLimitLayer::new(RateLimiter::new("5/1s".parse()?));
//! let service: RateLimit<()> = layer.layer(());
//! # Ok::<(), tollgate::PolicyError>(())
//! ```

mod config;
mod future;
mod layer;
mod limit;
mod route;
mod rule;
mod service;
mod settlement;

pub use future::ResponseFuture;
pub use layer::RateLimitLayer;
pub use limit::Limit;
pub use route::Route;
pub use service::RateLimit;
