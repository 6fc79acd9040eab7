//! Many tasks hammering one key through several Redis-backed limiters at once, shared by
//! the `standalone`, `cluster` and `faults` modules of tests/redis/.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tollgate::redis::RedisLimiter;

/// Starts `tasks` tokio tasks per limiter, each asking `calls` times for key `"hot"`, all
/// at once; returns how many were admitted in all. Every call must get an answer.
pub async fn hammer(limiters: &[RedisLimiter], tasks: usize, calls: usize) -> u64 {
    let admitted = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for limiter in limiters {
        for _ in 0..tasks {
            let limiter = limiter.clone();
            let admitted = Arc::clone(&admitted);
            handles.push(tokio::spawn(async move {
                for _ in 0..calls {
                    if limiter.try_acquire("hot").await.unwrap().is_allowed() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
    }
    for handle in handles {
        handle.await.unwrap();
    }
    admitted.load(Ordering::Relaxed)
}
