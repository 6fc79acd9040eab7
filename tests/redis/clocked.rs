//! What the scenarios on a test clock share: a limiter deciding at a `FakeClock`'s readings,
//! and setting that clock.

use std::time::Duration;

use tollgate::redis::{RedisLimiter, RedisLimiterBuilder};
use tollgate::FakeClock;

use crate::redis_server::RedisServer;

/// Sets `clock` to `micros` microseconds.
pub fn at(clock: &FakeClock, micros: u64) {
    clock.set(Duration::from_micros(micros));
}

/// A limiter on `server` deciding at `clock`'s readings, without the deny cache.
pub async fn limiter_at(
    server: &RedisServer,
    policy: &str,
    prefix: &str,
    clock: &FakeClock,
) -> RedisLimiter {
    clocked(policy, prefix, clock)
        .connect(&server.url())
        .await
        .unwrap()
}

/// A limiter as [`limiter_at`] makes one, on `lead`'s connection (for a `RedisAllOf`).
pub async fn shared_at(
    lead: &RedisLimiter,
    policy: &str,
    prefix: &str,
    clock: &FakeClock,
) -> RedisLimiter {
    clocked(policy, prefix, clock)
        .connect_shared(lead)
        .await
        .unwrap()
}

/// The builder of [`limiter_at`] and [`shared_at`].
pub fn clocked(policy: &str, prefix: &str, clock: &FakeClock) -> RedisLimiterBuilder {
    RedisLimiter::builder(policy.parse().unwrap())
        .prefix(prefix)
        .test_clock(clock.clone())
        .deny_cache(0)
        .timeout(Duration::from_secs(10))
}
