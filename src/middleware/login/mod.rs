//! The login layer: [`LoginLayer`] builds [`Login`] services, which put a
//! [`LoginGuard`](crate::login::LoginGuard) in front of a login handler (check each attempt before
//! it, record its [`LoginOutcome`] from the response) and answer through a
//! [`ResponseFuture`].
//!
//! # Examples
//!
//! ```
//! use std::sync::Arc;
//! use tollgate::middleware::login::{Login, LoginLayer};
//! use tower_layer::Layer;
//!
//! let layer = LoginLayer::new(Arc::new(tollgate::login::LoginGuard::new()), |head| {
//!     head.headers().get("x-user")?.to_str().ok().map(str::to_owned)
//! });
//! let service: Login<()> = layer.layer(());
//! ```

mod config;
mod future;
mod layer;
mod outcome;
mod service;

pub use future::ResponseFuture;
pub use layer::LoginLayer;
pub use outcome::LoginOutcome;
pub use service::Login;
