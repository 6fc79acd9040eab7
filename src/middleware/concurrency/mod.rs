//! The concurrency layer: [`ConcurrencyLimitLayer`] builds [`ConcurrencyLimit`] services,
//! which cap each key's requests in flight with a
//! [`ConcurrencyLimiter`](crate::concurrency::ConcurrencyLimiter) and answer through a
//! [`ResponseFuture`]. Each request's place is held by its response body
//! ([`ResponseBody`](crate::middleware::ResponseBody)) until the body ends.
//!
//! # Examples
//!
//! ```
//! use std::sync::Arc;
//! use tollgate::middleware::concurrency::{ConcurrencyLimit, ConcurrencyLimitLayer};
//! use tollgate::concurrency::ConcurrencyLimiter;
//! use tower_layer::Layer;
//!
//! let layer = ConcurrencyLimitLayer::new(Arc::new(ConcurrencyLimiter::new(8)));
//! let service: ConcurrencyLimit<()> = layer.layer(());
//! ```

mod config;
mod future;
mod layer;
mod service;

pub use future::ResponseFuture;
pub use layer::ConcurrencyLimitLayer;
pub use service::ConcurrencyLimit;
