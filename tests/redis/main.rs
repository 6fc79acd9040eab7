//! The Redis backend (feature `redis`) against real `redis-server` processes that each test
//! starts on free loopback ports: one test binary, a module per scenario (`standalone`,
//! `reserve`, `all_of`, `lease`, `settings`, `shadow`, `tiers`, `live`, `tokens`, `cluster`, `faults`,
//! `middleware`, `throughput`), the server harness, the limiters on a test clock (`clocked`) and the
//! instance in a process that dies (`dying`) compiled once.
//! The harness needs feature `test-util` too (`standalone` and `cluster` drive time with
//! `test_clock`); `middleware`, the HTTP layer deciding through Redis, needs `tower` as well.
//!
//! Needs `redis-server` (and `redis-cli` for `cluster`) on PATH (`scripts/install-redis.sh`);
//! without it every test fails saying so.
//!
//! ```text
//! cargo test --features redis,test-util --test redis
//! cargo test --features redis,test-util --test redis faults::
//! cargo test --features redis,test-util,tower --test redis middleware::
//! ```

#[path = "../support/hammer.rs"]
mod hammer;
#[cfg(feature = "tower")]
#[path = "../support/http.rs"]
mod http_support;
#[path = "../support/redis_server.rs"]
mod redis_server;

mod all_of;
mod client;
mod clocked;
mod cluster;
mod dying;
mod faults;
mod lease;
mod live;
mod middleware;
mod reserve;
mod settings;
mod shadow;
mod standalone;
mod throughput;
mod tiers;
mod tokens;
