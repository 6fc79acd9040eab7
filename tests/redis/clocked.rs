//! What the scenarios on a test clock share: a limiter deciding at a `FakeClock`'s readings,
//! and setting that clock.

use std::time::Duration;

use tollgate::redis::RedisLimiter;
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
    RedisLimiter::builder(policy.parse().unwrap())
        .prefix(prefix)
        .test_clock(clock.clone())
        .deny_cache(0)
        .timeout(Duration::from_secs(10))
        .connect(&server.url())
        .await
        .unwrap()
}
