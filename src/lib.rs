//! # tollgate
//!
//! Exact, lock-free rate limiting for hot paths. A service asks before it handles each
//! request: *may this key go ahead?* The answer comes back at once, never blocks, and carries
//! what an HTTP 429 needs: remaining permits, how long to wait, when the key is fresh again.
//!
//! At the root, what a first use needs:
//!
//! | item | role |
//! |---|---|
//! | [`Policy`], [`Algorithm`] | `permits` per `window` under an algorithm, or several limits at once; parsed from `"5/1s"`, `"100/min"`, `"sliding-log 5 per 15m"`, `"10/s & 1000/day"`, `"10/s burst 100"` |
//! | [`RateLimiter`] | one state per key (user, API key, IP) in a concurrent map |
//! | [`DirectLimiter`] | one state, no map: a global limit or a single hot key |
//! | [`Decision`] | allowed, remaining, retry_after, reset_after, limit |
//! | [`Reservation`], [`ReservationGuard`], [`SettleError`] | reserve an estimate now, settle at the real cost later; the guard gives the estimate back if it is never settled |
//! | [`Clock`], [`SystemClock`], [`FakeClock`] | where time comes from; the fake one for tests |
//! | [`PolicyError`], [`CostError`] | typed errors naming the field and the value |
//!
//! And a module for each of the rest:
//!
//! | module | what it holds |
//! |---|---|
//! | [`policy`] | the policy types, with [`Band`](policy::Band), one limit of a policy |
//! | [`clock`] | every clock: the cached [`CoarseClock`](clock::CoarseClock), tokio's, and their errors |
//! | [`keys`] | the default key hasher and [`InlineKey`](keys::InlineKey), a lean string key |
//! | [`stats`], [`wait`] | decision counters; how a waiting acquire waits |
//! | [`login`] | failed-login limits per account and per client, escalating lockouts, known clients that keep the owner in |
//! | [`concurrency`] | how many requests of a key may be in flight at once |
//! | `middleware` | (feature `tower`) HTTP layers for axum, hyper and tonic: rate, concurrency, login |
//! | `client` | (feature `tower`) the client side: wait for a provider's quota, learn from its answers |
//! | `redis` | (feature `redis`) the same policies with their state in Redis, for many servers |
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

pub mod all_of;
mod bounded;
#[cfg(feature = "tower")]
pub mod client;
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
#[cfg(test)]
mod race;
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

/// The client guide's examples, compiled and run as doc tests (feature `tower`).
#[cfg(all(doctest, feature = "tower"))]
#[doc = include_str!("../docs/CLIENT.md")]
struct ClientDoctests;

/// The Redis guide's examples, compiled as doc tests (feature `redis`).
#[cfg(all(doctest, feature = "redis"))]
#[doc = include_str!("../docs/REDIS.md")]
struct RedisDoctests;

pub use all_of::AllOf;
pub use clock::{Clock, FakeClock, SystemClock};
pub use decision::Decision;
pub use direct::DirectLimiter;
pub use error::CostError;
pub use keyed::RateLimiter;
pub use policy::{Algorithm, Policy, PolicyError};
pub use reservation::{Reservation, SettleError};
pub use reservation_guard::ReservationGuard;
