//! # tollgate
//!
//! Exact, lock-free rate limiting for hot paths. A service asks before it handles each
//! request: *may this key go ahead?* The answer comes back at once, never blocks, and carries
//! what an HTTP 429 needs: remaining permits, how long to wait, when the key is fresh again.
//!
//! | type | role |
//! |---|---|
//! | [`Policy`], [`Band`] | `permits` per `window` under an [`Algorithm`] (a band), or several bands at once; parsed from `"5/1s"`, `"100/min"`, `"sliding-log 5 per 15m"`, `"10/s & 1000/day"`, `"10/s burst 100"` |
//! | [`RateLimiter`] | one state per key (user, API key, IP) in a concurrent map |
//! | [`DirectLimiter`] | one state, no map: a global or single hot key |
//! | [`Decision`] | allowed, remaining, retry_after, reset_after, limit |
//! | [`Reservation`], [`ReservationGuard`], [`SettleError`] | reserve an estimate now, settle at the real cost later; the guard gives the estimate back if it is never settled |
//! | [`Clock`], [`SystemClock`], [`FakeClock`] | where time comes from; the fake one for tests |
//! | [`CoarseClock`] | opt-in cached clock: one load per decision instead of a counter read, up to one resolution late |
//! | [`PolicyError`], [`CostError`], [`ClockError`] | typed errors naming the field and value |
//! | [`Stats`], [`Wait`] | decision counters; how a waiting acquire waits |
//! | [`LoginGuard`], [`LoginConfig`], [`LoginDecision`], [`LoginClient`] | failed-login limits per account and per client, escalating lockouts, known clients that keep the owner in |
//! | [`ConcurrencyLimiter`], [`Permit`], [`AtCapacity`] | how many requests of a key may be in flight at once |
//!
//! ```
//! use std::time::Duration;
//! use tollgate::{FakeClock, Policy, RateLimiter};
//!
//! let policy: Policy = "5/1s".parse()?; // token bucket: burst of 5, one more every 200 ms
//! let clock = FakeClock::new();
//! let limiter: RateLimiter<String, FakeClock> = RateLimiter::with_clock(policy, clock.clone());
//! for left in (0..5).rev() {
//!     assert_eq!(limiter.try_acquire("alice").remaining(), left);
//! }
//! let refused = limiter.try_acquire("alice");
//! assert!(!refused.is_allowed());
//! assert_eq!(refused.retry_after(), Duration::from_millis(200)); // Retry-After
//! # Ok::<(), tollgate::PolicyError>(())
//! ```
//!
//! ## Guarantees
//!
//! * **Exact under any interleaving.** With time frozen, a state that can admit K requests
//!   admits exactly K however many threads race for it. Each decision behaves as if made
//!   alone at one instant inside the call.
//! * **Lock-free per key.** A key's state is one or two atomic words updated by
//!   compare-and-swap (the sliding log serialises its writers with a per-key sequence word).
//!   Keys never wait on each other, and a request for a tracked key takes no lock at all.
//! * **A refused request changes nothing**, and neither does a refused cost.
//! * **Exact eviction.** [`RateLimiter::evict_idle`] removes only states that are at rest,
//!   and never lets a racing request through beyond the policy.
//! * **Faulty clocks are tolerated.** Time running backwards counts as zero elapsed; a stored
//!   time further ahead than any valid state is treated as the furthest valid one, so a
//!   retry_after never exceeds what the policy could need.
//!
//! See `docs/ALGORITHMS.md` for choosing an algorithm and `docs/ARCHITECTURE.md` for how the
//! state machines and the registry stay exact.

#![deny(missing_docs)]
// docs.rs builds with every feature and `--cfg docsrs`: each item behind a feature is
// shown with the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(rust_2018_idioms, unreachable_pub)]

mod bounded;
pub mod clock;
pub mod concurrency;
mod decision;
mod direct;
mod engine;
mod error;
mod ip;
mod keyed;
pub mod keys;
pub mod login;
#[cfg(feature = "tower")]
pub mod middleware;
pub mod policy;
#[cfg(feature = "redis")]
pub mod redis;
mod reservation;
mod reservation_guard;
pub mod stats;
pub mod wait;

#[cfg(tollgate_loom)]
#[doc(hidden)]
pub mod model;

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The recipes' examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/RECIPES.md")]
struct RecipesDoctests;

/// The algorithm guide's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/ALGORITHMS.md")]
struct AlgorithmsDoctests;

/// The architecture notes' examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/ARCHITECTURE.md")]
struct ArchitectureDoctests;

/// The benchmark notes' examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/BENCHMARKS.md")]
struct BenchmarksDoctests;

/// The HTTP middleware guide's examples, compiled and run as doc tests (feature `tower`).
#[cfg(all(doctest, feature = "tower"))]
#[doc = include_str!("../docs/MIDDLEWARE.md")]
struct MiddlewareDoctests;

/// The Redis guide's examples, compiled as doc tests (feature `redis`).
#[cfg(all(doctest, feature = "redis"))]
#[doc = include_str!("../docs/REDIS.md")]
struct RedisDoctests;

#[cfg(feature = "tokio")]
pub use clock::TokioClock;
pub use clock::{Clock, ClockError, CoarseClock, FakeClock, SystemClock};
pub use concurrency::{AtCapacity, ConcurrencyLimiter, Permit};
pub use decision::Decision;
pub use direct::DirectLimiter;
pub use error::CostError;
pub use keyed::RateLimiter;
pub use keys::{InlineKey, KeyHasher};
pub use login::{LoginClient, LoginConfig, LoginConfigError, LoginDecision, LoginGuard};
pub use policy::{Algorithm, Band, Policy, PolicyError};
pub use reservation::{Reservation, SettleError};
pub use reservation_guard::ReservationGuard;
pub use stats::Stats;
pub use wait::Wait;
