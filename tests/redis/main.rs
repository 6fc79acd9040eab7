//! The Redis backend (feature `redis`) against real `redis-server` processes that each test
//! starts on free loopback ports: one test binary, a module per scenario (`standalone`,
//! `cluster`, `faults`, `middleware`, `throughput`), the server harness compiled once.
//! `middleware`, the HTTP layer deciding through Redis, needs feature `tower` too;
//! `standalone` and `cluster` drive time with `test_clock`, which needs feature `test-util`.
//!
//! Needs `redis-server` (and `redis-cli` for `cluster`) on PATH (`scripts/install-redis.sh`);
//! without it every test fails saying so.
//!
//! ```text
//! cargo test --features redis,test-util --test redis
//! cargo test --features redis --test redis faults::
//! cargo test --features redis,tower --test redis middleware::
//! ```

#![cfg(feature = "redis")]

#[path = "../support/hammer.rs"]
mod hammer;
#[cfg(feature = "tower")]
#[path = "../support/http.rs"]
mod http_support;
#[path = "../support/redis_server.rs"]
mod redis_server;

#[cfg(feature = "test-util")]
mod cluster;
mod faults;
mod middleware;
#[cfg(feature = "test-util")]
mod standalone;
mod throughput;
