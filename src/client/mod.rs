//! The client side (feature `tower`): stay under someone else's quota. A service or an SDK
//! calling a provider's API (a model provider, a payment API, GitHub) must not exceed the
//! provider's limit, should wait rather than fail, and should slow down when the provider
//! says so.
//!
//! | item | role |
//! |---|---|
//! | [`Throttle`] | waits for a permit per call, first come first served per key, up to a maximum wait; learns from each answer (`429` and `Retry-After`, the `RateLimit` fields); [`Throttle::quota`] shapes a budget for a strict provider |
//! | [`ThrottleLayer`], [`Throttled`] | the same as a tower layer around any HTTP client |
//! | [`Budget`] | what permits come from: a `RateLimiter<String>`, a `DirectLimiter`, or a `RedisLimiter` shared by every instance |
//! | [`pace`], [`Paced`] | a `Stream` whose items come no faster than the throttle admits |
//! | [`Admission`] | one admitted call: its answer, its settled cost |
//! | [`ThrottleError`], [`ThrottleStats`] | what went wrong, what was done |
//!
//! The limiters' own `acquire` methods wait too (`RateLimiter::acquire_n`,
//! `DirectLimiter::acquire_n`, `RedisLimiter::acquire_n`); a `Throttle` adds the queue, the
//! maximum wait and what the upstream says. See `docs/CLIENT.md`.
//!
//! # Examples
//!
//! ```
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use http::{HeaderMap, StatusCode};
//! use tollgate::client::Throttle;
//!
//! // The provider refuses more than 3 calls in any second.
//! let throttle = Throttle::quota("3/1s".parse()?)?.max_wait(Duration::from_secs(10));
//! let start = tokio::time::Instant::now();
//! for _ in 0..6 {
//!     let mut call = throttle.acquire("api.example.com").await?;
//!     // ... the call, answered at once ...
//!     call.heard(StatusCode::OK, &HeaderMap::new());
//! }
//! // Three at once, three more a second and a margin later.
//! assert_eq!(start.elapsed(), Duration::from_millis(1_020));
//! # Ok(())
//! # }
//! ```

mod budget;
mod error;
mod heard;
mod lane;
mod layer;
mod pace;
mod quota;
mod throttle;

pub use budget::Budget;
pub use error::{BoxError, ThrottleError};
pub use layer::{ResponseFuture, ThrottleLayer, Throttled};
pub use pace::{pace, Paced};
pub use throttle::{Admission, Throttle, ThrottleStats};
