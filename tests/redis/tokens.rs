//! What the tokens next to a key's state protect, and how they go, against a real
//! `redis-server`: the hash of lease tokens of a hot key stays bounded while limiter
//! instances come and go (closed with their lease spent, dropped, or dead), because each
//! token carries its own deadline and later leases drop the expired ones; a reservation's
//! refund gives nothing back to a Redis that lost the reservation (a `FLUSHALL` between
//! reserve and settle), and the hash of reservation tokens of a key whose reservations are
//! dropped unsettled stays bounded too.
//!
//! Needs `redis-server` on PATH (`scripts/install-redis.sh`); without it every test fails
//! saying so.

use std::time::Duration;

use tollgate::redis::{RedisAllOf, RedisLimiter};
use tollgate::FakeClock;

use crate::clocked::{clocked, limiter_at, shared_at};
use crate::dying::in_a_process_that_dies;
use crate::redis_server::{RedisServer, Reply};

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
                in_a_process_that_dies(move || async move {
                    let limiter = leasing(&url, &clock).await;
                    take(&limiter, 5).await;
                    limiter
                });
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

/// How many requests of cost 1 `limiter` admits of `key` now.
async fn admit_all(limiter: &RedisLimiter, key: &str) -> u64 {
    let mut admitted = 0;
    while limiter.try_acquire(key).await.unwrap().is_allowed() {
        admitted += 1;
    }
    admitted
}

/// Redis loses the key's state between a reservation and its refund (a `FLUSHALL`, as a
/// restart without persistence, a failover to a replica that never had it, or an eviction
/// would): the refund gives back nothing to the fresh state, which never held the
/// reservation's permits, so that state admits exactly its limit. Before, each algorithm gave
/// the 50 back (a token bucket's TAT and a counter's window count moved back by them; on a
/// frozen clock, fresh log entries share the reservation's stamp) and the key admitted 150 of
/// 100. A charge is still made: it only spends more. A reset by another limiter deletes the
/// reservation's token too. Without a loss, a refund gives back.
#[tokio::test]
async fn a_refund_gives_nothing_back_to_a_redis_that_lost_the_reservation() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    clock.set(T0);
    for (i, policy) in [
        "100/1h",
        "sliding-log 100/1h",
        "sliding-counter 100/1h",
        "100/1h & sliding-log 100/2h & sliding-counter 100/1d",
    ]
    .into_iter()
    .enumerate()
    {
        let limiter = limiter_at(&server, policy, &format!("lost{i}"), &clock).await;
        let r = limiter.reserve_n("k", 50).await.unwrap();
        assert!(r.decision().is_allowed(), "{policy}");
        assert_eq!(server.command(&["FLUSHALL"]), Reply::Status("OK".into()));
        assert!(limiter.try_acquire_n("k", 60).await.unwrap().is_allowed());
        limiter.cancel("k", r).await.unwrap();
        assert_eq!(
            admit_all(&limiter, "k").await,
            40,
            "{policy}: only what the fresh state has left"
        );

        // A charge after the loss: 10 reserved, 15 used, 5 spent in the fresh state.
        limiter.reset("k").await.unwrap();
        let r = limiter.reserve_n("k", 10).await.unwrap();
        server.command(&["FLUSHALL"]);
        limiter.settle("k", r, 15).await.unwrap();
        assert_eq!(admit_all(&limiter, "k").await, 95, "{policy}");

        // A reset by another limiter deletes the reservation's token with the state.
        limiter.reset("k").await.unwrap();
        let other = limiter_at(&server, policy, &format!("lost{i}"), &clock).await;
        let r = limiter.reserve_n("k", 50).await.unwrap();
        assert!(other.reset("k").await.unwrap());
        assert!(other.try_acquire_n("k", 60).await.unwrap().is_allowed());
        limiter.cancel("k", r).await.unwrap();
        assert_eq!(
            admit_all(&limiter, "k").await,
            40,
            "{policy}: after a reset"
        );

        // No loss: the refund applies, once.
        limiter.reset("k").await.unwrap();
        let r = limiter.reserve_n("k", 50).await.unwrap();
        limiter.settle("k", r, 20).await.unwrap();
        assert_eq!(admit_all(&limiter, "k").await, 80, "{policy}");
    }
}

/// Reservations dropped unsettled (or settled at what they hold, which sends nothing) leave
/// their tokens behind; each token's deadline is twice the longest window and a second after
/// its reservation, and later reservations drop the expired ones: 200 of them, one every
/// 100 ms of a 1 s policy, never leave more than about 3 s worth (30) in the hash.
#[tokio::test]
async fn reservation_tokens_left_behind_expire() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    clock.set(T0);
    let limiter = limiter_at(&server, "1000/1s", "left", &clock).await;
    let hash = "left:{k}:reserved";
    let mut largest = 0;
    for i in 0..200u64 {
        clock.set(T0 + Duration::from_millis(100 * i));
        let r = limiter.reserve_n("k", 1).await.unwrap();
        assert!(r.decision().is_allowed());
        if i % 2 == 0 {
            drop(r);
        } else {
            limiter.settle("k", r, 1).await.unwrap();
        }
        let fields = server.command(&["HLEN", hash]).int();
        largest = largest.max(fields);
        assert!(fields <= 32, "reservation #{i}: {fields} tokens");
    }
    assert!(largest >= 20, "tokens were written: at most {largest}");
    // A settle that gives back deletes its token; a reset deletes the hash.
    let before = server.command(&["HLEN", hash]).int();
    let r = limiter.reserve_n("k", 2).await.unwrap();
    limiter.settle("k", r, 1).await.unwrap();
    assert!(server.command(&["HLEN", hash]).int() <= before);
    limiter.reset("k").await.unwrap();
    assert_eq!(server.command(&["EXISTS", hash]).int(), 0);
}

/// A key's hash of tokens holding another type (written by another program under the
/// limiter's names) fails the call that would write a token, and the call spends nothing:
/// a reservation, a lease of several permits, and a `RedisAllOf` reservation whose first
/// part's token is the wrong one (its bands would have been written before the failure).
#[tokio::test]
async fn a_token_of_the_wrong_type_fails_the_call_whole() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    clock.set(T0);
    let plain = limiter_at(&server, "100/1h", "w", &clock).await;
    assert!(plain.try_acquire("k").await.unwrap().is_allowed());
    let left = || async { plain.peek("k").await.unwrap().remaining() };
    assert_eq!(left().await, 98);

    server.command(&["SET", "w:{k}:reserved", "not-a-hash"]);
    assert!(plain.reserve_n("k", 4).await.is_err());
    assert_eq!(left().await, 98, "a failed reservation spent permits");

    let leasing = clocked("100/1h", "w", &clock)
        .lease(8)
        .connect(&server.url())
        .await
        .unwrap();
    server.command(&["SET", "w:{k}:lease", "not-a-hash"]);
    let (mut admitted, mut failed) = (0, 0);
    for _ in 0..4 {
        match leasing.try_acquire("k").await {
            Ok(decision) => admitted += u64::from(decision.is_allowed()),
            Err(_) => failed += 1,
        }
    }
    assert!(failed > 0, "no lease of several permits was tried");
    assert_eq!(left().await, 98 - admitted, "failed leases spent permits");
    let left_now = left().await;

    let other = shared_at(&plain, "100/1h", "v", &clock).await;
    let both = RedisAllOf::new()
        .key_n(&plain, "k", 5)
        .key_n(&other, "k", 5);
    assert!(both.reserve().await.is_err());
    assert_eq!(
        left().await,
        left_now,
        "the failed RedisAllOf spent on its first part"
    );
    assert_eq!(other.peek("k").await.unwrap().remaining(), 99);
}
