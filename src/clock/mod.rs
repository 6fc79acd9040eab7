//! Where time comes from: the [`Clock`] trait every limiter reads, the real [`SystemClock`]
//! (the default), the test [`FakeClock`], the cached [`CoarseClock`] and, with the `tokio`
//! feature, `TokioClock`, which follows tokio's paused and advanced time in tests.
//!
//! Limiters read the clock once per decision (again only when a compare-and-swap has to be
//! retried). Readings are nanoseconds since an arbitrary zero chosen by the clock; only
//! differences between readings of one clock matter, and a reading that goes backwards
//! counts as no time passing.
//!
//! ```
//! use std::time::Duration;
//! use tollgate::clock::{Clock, FakeClock};
//! use tollgate::RateLimiter;
//!
//! let clock = FakeClock::new(); // clones share one time
//! let limiter: RateLimiter<String, FakeClock> =
//!     RateLimiter::with_clock("1/s".parse()?, clock.clone());
//! assert!(limiter.try_acquire("alice").is_allowed());
//! assert!(!limiter.try_acquire("alice").is_allowed());
//! clock.advance(Duration::from_secs(1));
//! assert_eq!(clock.now(), 1_000_000_000);
//! assert!(limiter.try_acquire("alice").is_allowed());
//! # Ok::<(), tollgate::PolicyError>(())
//! ```

mod coarse;
mod fake;
mod source;
mod system;
#[cfg(feature = "tokio")]
mod tokio_clock;

pub use coarse::{ClockError, CoarseClock};
pub use fake::FakeClock;
pub use source::{Clock, Reading};
pub use system::SystemClock;
#[cfg(feature = "tokio")]
pub use tokio_clock::TokioClock;

pub(crate) use source::{duration_to_nanos, Fixed};
