//! What a keyed limiter's keys are made of: [`KeyHasher`], the default hasher of its table
//! (fast, and keyed at random per process against clients who choose colliding keys), and
//! [`InlineKey`], a string key of 16 bytes that holds strings of up to 15 bytes inside
//! itself: the lean key type for a limiter tracking many string keys.
//!
//! ```
//! use tollgate::keys::InlineKey;
//! use tollgate::RateLimiter;
//!
//! // Looked up by &str, as a String key is; no heap block per key up to 15 bytes.
//! let limiter: RateLimiter<InlineKey> = RateLimiter::new("2/1s".parse()?);
//! assert_eq!(limiter.try_acquire("user-000042").remaining(), 1);
//! # Ok::<(), tollgate::PolicyError>(())
//! ```

mod hasher;
mod inline;

pub use hasher::KeyHasher;
pub use inline::InlineKey;
