//! What the tokens next to a key's state protect, and how they go, against a real
//! `redis-server`: the hash of lease tokens of a hot key stays bounded while limiter
//! instances come and go (closed with their lease spent, dropped, or dead), because each
//! token carries its own deadline and later leases drop the expired ones.
//!
//! Needs `redis-server` on PATH (`scripts/install-redis.sh`); without it every test fails
//! saying so.

use std::time::Duration;

use tollgate::redis::RedisLimiter;
use tollgate::FakeClock;

use crate::redis_server::RedisServer;

/// A frozen test clock's starting reading: one whole day.
const T0: Duration = Duration::from_secs(86_400);

async fn leasing(url: &str, clock: &FakeClock) -> RedisLimiter {
    RedisLimiter::builder("1000000/1min".parse().unwrap())
        .prefix("churn")
        .timeout(Duration::from_secs(1))
        .test_clock(clock.clone())
        .lease(4)
        .connect(url)
        .await
        .unwrap()
}

/// Takes `n` permits of `k` through `limiter`: with leases of 1, 2 and 4, 7 spend them all,
/// 5 leave 2 of the last lease unused.
async fn take(limiter: &RedisLimiter, n: usize) {
    for _ in 0..n {
        assert!(limiter.try_acquire("k").await.unwrap().is_allowed());
    }
}

/// 90 instances, one a second of the test clock, each taking leases of one hot key and then
/// closed with unused permits (which deletes its token), closed with its lease spent (which
/// sends nothing), dropped (given back from a task), or dead (its runtime gone: nothing sent).
/// A token lives twice the hold time plus the timeout and a second: 2 x 6 s + 1 s + 1 s =
/// 14 s, so at most 14 of these instances' tokens are alive at once, half of them left
/// behind. The hash never holds more than those (and the cursor of its walk).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hash_of_lease_tokens_stays_bounded_under_instance_churn() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    clock.set(T0);
    let hash = "churn:{k}:lease";
    let mut largest = 0;
    for i in 0..90u64 {
        clock.set(T0 + Duration::from_secs(i));
        match i % 4 {
            0 => {
                let limiter = leasing(&server.url(), &clock).await;
                take(&limiter, 5).await;
                limiter.close().await.unwrap();
            }
            1 => {
                let limiter = leasing(&server.url(), &clock).await;
                take(&limiter, 7).await;
                limiter.close().await.unwrap();
            }
            2 => {
                let limiter = leasing(&server.url(), &clock).await;
                take(&limiter, 5).await;
                drop(limiter);
            }
            _ => {
                let (url, clock) = (server.url(), clock.clone());
                std::thread::spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    let limiter = runtime.block_on(async {
                        let limiter = leasing(&url, &clock).await;
                        take(&limiter, 5).await;
                        limiter
                    });
                    runtime.shutdown_background();
                    std::mem::forget(limiter);
                })
                .join()
                .unwrap();
            }
        }
        let fields = server.command(&["HLEN", hash]).int();
        largest = largest.max(fields);
        assert!(
            fields <= 10,
            "instance #{i}: {fields} fields: {:?}",
            server.command(&["HGETALL", hash])
        );
    }
    assert!(
        largest >= 2,
        "tokens were written: at most {largest} fields"
    );
}
