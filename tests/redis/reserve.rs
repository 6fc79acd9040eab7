//! Reserve now, settle later, on the Redis backend: `reserve_n` decides as `try_acquire_n`
//! does, `settle` gives back what a request did not use or charges what it used on top, and
//! `cancel` gives everything back; each is one script call. Per algorithm and a composite,
//! the errors, four instances racing on one key, the deny cache, the failure policies, and
//! key expiry after a settle.
//!
//! Needs `redis-server` on PATH (`scripts/install-redis.sh`); without it every test fails
//! saying so.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tollgate::redis::{BackendError, FailurePolicy, RedisLimiter};
use tollgate::{Algorithm, CostError, FakeClock, Policy, RateLimiter, Reservation, SettleError};

use crate::clocked::{at, limiter_at};
use crate::redis_server::{RedisServer, Reply};

/// A frozen test clock's reading, in microseconds: ten whole minutes, so every window of
/// these tests starts at it.
const T0: u64 = 600_000_000;

/// A limiter on `server` deciding on Redis's own clock (so its keys get real expiries),
/// without the deny cache.
async fn on_redis_time(server: &RedisServer, policy: &str, prefix: &str) -> RedisLimiter {
    RedisLimiter::builder(policy.parse().unwrap())
        .prefix(prefix)
        .deny_cache(0)
        .connect(&server.url())
        .await
        .unwrap()
}

/// Everything Redis holds for `key` under `limiter`, band by band, as text.
fn dump(server: &RedisServer, limiter: &RedisLimiter, key: &str) -> Vec<String> {
    limiter
        .redis_keys(key)
        .iter()
        .map(|k| {
            let kind = server.command(&["TYPE", k]).text();
            let value = match kind.as_str() {
                "string" => server.command(&["GET", k]),
                "zset" => server.command(&["ZRANGE", k, "0", "-1", "WITHSCORES"]),
                "hash" => server.command(&["HGETALL", k]),
                _ => Reply::Bulk(None),
            };
            format!("{k} {kind} {value:?}")
        })
        .collect()
}

/// What a request of cost 1 would have left now.
async fn left(limiter: &RedisLimiter, key: &str) -> u64 {
    limiter.peek(key).await.unwrap().remaining()
}

const TOKEN_BUCKET: &str = "20/1s";
const SLIDING_LOG: &str = "sliding-log 20/1s";
const SLIDING_COUNTER: &str = "sliding-counter 20/1min";
/// Every band has 20 permits, so a peek's remaining shows any band that missed a refund.
const COMPOSITE: &str = "20/1s & sliding-log 20/2s & sliding-counter 20/1min";

/// Reserve 10, settle at 3: 7 come back; reserve 10, settle at 15: 5 more are charged;
/// then, at the limit, a settle charges past it. Returns the limiter, its clock and key
/// `"k"` 5 permits past its limit at `T0`.
async fn give_back_then_charge(
    server: &RedisServer,
    policy: &str,
    prefix: &str,
) -> (RedisLimiter, FakeClock) {
    let clock = FakeClock::new();
    at(&clock, T0);
    let limiter = limiter_at(server, policy, prefix, &clock).await;
    assert_eq!(left(&limiter, "k").await, 19, "{policy}");

    let r = limiter.reserve_n("k", 10).await.unwrap();
    assert!(r.decision().is_allowed(), "{policy}");
    assert_eq!(r.decision().remaining(), 10, "{policy}");
    assert_eq!(r.held(), 10);
    assert_eq!(left(&limiter, "k").await, 9, "{policy}");
    limiter.settle("k", r, 3).await.unwrap();
    assert_eq!(left(&limiter, "k").await, 16, "{policy}: 7 come back");

    let r = limiter.reserve_n("k", 10).await.unwrap();
    assert_eq!(r.decision().remaining(), 7, "{policy}");
    limiter.settle("k", r, 15).await.unwrap();
    assert_eq!(left(&limiter, "k").await, 1, "{policy}: 5 more charged");

    // 18 spent: the last 2 reserved, and the request really costs 7: 5 past the limit.
    let r = limiter.reserve_n("k", 2).await.unwrap();
    assert!(r.decision().is_allowed() && r.decision().remaining() == 0);
    limiter.settle("k", r, 7).await.unwrap();
    let refused = limiter.peek("k").await.unwrap();
    assert!(!refused.is_allowed(), "{policy}: {refused:?}");
    assert_eq!(refused.remaining(), 0, "{policy}");
    (limiter, clock)
}

#[tokio::test]
async fn token_bucket_gives_back_and_charges_a_debt() {
    let server = RedisServer::start();
    let (limiter, clock) = give_back_then_charge(&server, TOKEN_BUCKET, "tb").await;
    // T = 50 ms, B = 1 s: a debt of 25 intervals, 5 beyond the burst. The next request
    // waits out the 5 and its own interval.
    let tat = server.command(&["GET", &limiter.redis_keys("k")[0]]).text();
    assert_eq!(tat, (T0 + 25 * 50_000).to_string());
    let d = limiter.try_acquire("k").await.unwrap();
    assert!(!d.is_allowed());
    assert_eq!(d.retry_after(), Duration::from_millis(300));
    assert_eq!(d.reset_after(), Duration::from_millis(1250));
    at(&clock, T0 + 300_000 - 1);
    assert!(!limiter.try_acquire("k").await.unwrap().is_allowed());
    at(&clock, T0 + 300_000);
    let d = limiter.try_acquire("k").await.unwrap();
    assert!(d.is_allowed() && d.remaining() == 0, "{d:?}");
}

#[tokio::test]
async fn token_bucket_debt_stops_at_twice_the_burst() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let limiter = limiter_at(&server, TOKEN_BUCKET, "cap", &clock).await;
    let r = limiter.reserve_n("k", 20).await.unwrap();
    limiter.settle("k", r, u64::MAX).await.unwrap();
    let tat = server.command(&["GET", &limiter.redis_keys("k")[0]]).text();
    assert_eq!(tat, (T0 + 2_000_000).to_string(), "now + 2B");
    let d = limiter.try_acquire("k").await.unwrap();
    assert_eq!(d.retry_after(), Duration::from_millis(1050));
    assert_eq!(d.reset_after(), Duration::from_secs(2));
}

#[tokio::test]
async fn sliding_log_gives_back_and_saturates_at_its_permits() {
    let server = RedisServer::start();
    let (limiter, clock) = give_back_then_charge(&server, SLIDING_LOG, "sl").await;
    // The charge past the limit found 20 live entries: nothing more fits in the log.
    let key = &limiter.redis_keys("k")[0];
    assert_eq!(server.command(&["ZCARD", key]).int(), 20);
    let d = limiter.try_acquire("k").await.unwrap();
    assert!(!d.is_allowed());
    assert_eq!(d.retry_after(), Duration::from_secs(1));
    at(&clock, T0 + 1_000_000);
    assert_eq!(limiter.try_acquire("k").await.unwrap().remaining(), 19);
}

#[tokio::test]
async fn sliding_counter_gives_back_and_charges_past_its_permits() {
    let server = RedisServer::start();
    let (limiter, clock) = give_back_then_charge(&server, SLIDING_COUNTER, "sc").await;
    let key = &limiter.redis_keys("k")[0];
    assert_eq!(server.command(&["HGET", key, "c"]).text(), "25");
    // Half-way through the next window the 25 weigh 12: 8 available, where 20 would have
    // left 10.
    at(&clock, T0 + 90_000_000);
    assert_eq!(left(&limiter, "k").await, 7);
}

#[tokio::test]
async fn composite_settles_every_band() {
    let server = RedisServer::start();
    let (limiter, _clock) = give_back_then_charge(&server, COMPOSITE, "all").await;
    let keys = limiter.redis_keys("k");
    assert_eq!(
        server.command(&["GET", &keys[0]]).text(),
        (T0 + 25 * 50_000).to_string()
    );
    assert_eq!(server.command(&["ZCARD", &keys[1]]).int(), 20);
    assert_eq!(server.command(&["HGET", &keys[2], "c"]).text(), "25");
}

/// On a frozen clock, a cancelled reservation leaves the key with its full capacity, and a
/// cancel gives back only its own reservation's permits.
#[tokio::test]
async fn cancel_restores_full_capacity() {
    let server = RedisServer::start();
    for (i, policy) in [TOKEN_BUCKET, SLIDING_LOG, SLIDING_COUNTER, COMPOSITE]
        .into_iter()
        .enumerate()
    {
        let clock = FakeClock::new();
        at(&clock, T0);
        let limiter = limiter_at(&server, policy, &format!("cancel{i}"), &clock).await;
        let fresh = limiter.peek("k").await.unwrap();
        let r = limiter.reserve_n("k", 10).await.unwrap();
        limiter.cancel("k", r).await.unwrap();
        assert_eq!(limiter.peek("k").await.unwrap(), fresh, "{policy}");

        let first = limiter.reserve_n("k", 10).await.unwrap();
        let second = limiter.reserve_n("k", 6).await.unwrap();
        assert_eq!(second.decision().remaining(), 4, "{policy}");
        limiter.cancel("k", first).await.unwrap();
        assert_eq!(left(&limiter, "k").await, 13, "{policy}");
        limiter.cancel("k", second).await.unwrap();
        assert_eq!(limiter.peek("k").await.unwrap(), fresh, "{policy}");
        // Full again in every band: 20 fit at once.
        let all = limiter.try_acquire_n("k", 20).await.unwrap();
        assert!(all.is_allowed(), "{policy}: {all:?}");
    }
}

/// A band gives back only what it still counts of the reservation: nothing once the permits
/// have refilled or left the window.
#[tokio::test]
async fn a_late_cancel_gives_back_only_what_is_still_counted() {
    let server = RedisServer::start();
    let clock = FakeClock::new();

    // Token bucket: 8 of the 10 intervals have drained; only 2 are still owed.
    at(&clock, T0);
    let tb = limiter_at(&server, TOKEN_BUCKET, "late", &clock).await;
    let earlier = tb.reserve_n("k", 5).await.unwrap();
    let r = tb.reserve_n("k", 10).await.unwrap();
    at(&clock, T0 + 8 * 50_000);
    // Debt 7 intervals: 13 available, 12 after a request.
    assert_eq!(left(&tb, "k").await, 12);
    tb.cancel("k", earlier).await.unwrap();
    // The earlier reservation's TAT is behind now: its permits have refilled already.
    assert_eq!(left(&tb, "k").await, 12);
    tb.cancel("k", r).await.unwrap();
    assert_eq!(left(&tb, "k").await, 19);

    // Sliding log: the entries have left the window; a cancel then changes nothing.
    at(&clock, T0);
    let sl = limiter_at(&server, SLIDING_LOG, "late", &clock).await;
    let r = sl.reserve_n("k", 10).await.unwrap();
    at(&clock, T0 + 1_000_000);
    let _ = sl.try_acquire("k").await.unwrap();
    let state = dump(&server, &sl, "k");
    sl.cancel("k", r).await.unwrap();
    assert_eq!(dump(&server, &sl, "k"), state);

    // Sliding counter: the window counted in is the previous one, then older still.
    at(&clock, T0);
    let sc = limiter_at(&server, SLIDING_COUNTER, "late", &clock).await;
    let previous = sc.reserve_n("k", 10).await.unwrap();
    let older = sc.reserve_n("k", 4).await.unwrap();
    at(&clock, T0 + 60_000_000 + 30_000_000);
    // 14 in the previous window weigh 7 half-way through this one.
    assert_eq!(left(&sc, "k").await, 12);
    sc.cancel("k", previous).await.unwrap();
    // 4 weigh 2.
    assert_eq!(left(&sc, "k").await, 17);
    at(&clock, T0 + 120_000_000);
    let _ = sc.try_acquire("k").await.unwrap();
    let state = dump(&server, &sc, "k");
    sc.cancel("k", older).await.unwrap();
    assert_eq!(dump(&server, &sc, "k"), state);
}

#[tokio::test]
async fn settle_errors_change_nothing() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let limiter = limiter_at(&server, COMPOSITE, "errors", &clock).await;
    let r = limiter.reserve_n("alice", 5).await.unwrap();
    let state = dump(&server, &limiter, "alice");
    let peeked = limiter.peek("alice").await.unwrap();
    let err = limiter.settle("bob", r, 1).await.unwrap_err();
    assert!(
        matches!(err, BackendError::Settle(SettleError::OtherKey)),
        "{err}"
    );
    assert_eq!(dump(&server, &limiter, "alice"), state);
    assert_eq!(limiter.peek("alice").await.unwrap(), peeked);
    assert_eq!(
        server
            .command(&["EXISTS", &limiter.redis_keys("bob")[0]])
            .int(),
        0
    );

    // Only 15 left: a reservation of 16 is refused and holds nothing.
    let refused = limiter.reserve_n("alice", 16).await.unwrap();
    assert!(!refused.decision().is_allowed());
    assert_eq!(refused.held(), 0);
    let err = limiter.cancel("alice", refused).await.unwrap_err();
    assert!(
        matches!(err, BackendError::Settle(SettleError::Refused)),
        "{err}"
    );
    assert_eq!(dump(&server, &limiter, "alice"), state);

    // Another limiter, even on the same keys, does not settle this one's reservations.
    let other = limiter_at(&server, COMPOSITE, "errors", &clock).await;
    let r = limiter.reserve_n("alice", 5).await.unwrap();
    let state = dump(&server, &limiter, "alice");
    let err = other.cancel("alice", r).await.unwrap_err();
    assert!(
        matches!(err, BackendError::Settle(SettleError::OtherLimiter)),
        "{err}"
    );
    assert_eq!(dump(&server, &limiter, "alice"), state);

    assert!(matches!(
        limiter.reserve_n("alice", 0).await,
        Err(BackendError::Cost(CostError::Zero))
    ));
    assert!(matches!(
        limiter.reserve_n("alice", 21).await,
        Err(BackendError::Cost(CostError::ExceedsLimit {
            cost: 21,
            limit: 20
        }))
    ));
    // Settled at what it holds: nothing to send.
    let r = limiter.reserve_n("alice", 3).await.unwrap();
    let state = dump(&server, &limiter, "alice");
    limiter.settle("alice", r, 3).await.unwrap();
    assert_eq!(dump(&server, &limiter, "alice"), state);
}

/// Four limiter instances on `server`, each with its own connection and deny cache, deciding
/// at `clock`'s readings.
async fn four(
    server: &RedisServer,
    policy: &str,
    prefix: &str,
    clock: &FakeClock,
) -> Vec<RedisLimiter> {
    let mut limiters = Vec::new();
    for _ in 0..4 {
        limiters.push(
            RedisLimiter::builder(policy.parse().unwrap())
                .prefix(prefix)
                .test_clock(clock.clone())
                .timeout(Duration::from_secs(10))
                .connect(&server.url())
                .await
                .unwrap(),
        );
    }
    limiters
}

const RACED: &[&str] = &[
    "1000/3650d",
    "sliding-log 1000/3650d",
    "sliding-counter 1000/3650d",
    "1000/3650d & sliding-counter 1500/3650d & sliding-log 1200/3650d",
];

/// Four limiter instances (each its own connection and deny cache), eight tasks each,
/// reserve and cancel on one key of a frozen clock, all at once: afterwards the key has
/// exactly its full capacity in every band.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_reserve_and_cancel_leaves_full_capacity() {
    let server = RedisServer::start();
    for (i, policy) in RACED.iter().enumerate() {
        let clock = FakeClock::new();
        at(&clock, T0);
        let prefix = format!("race{i}");
        let limiters = four(&server, policy, &prefix, &clock).await;
        let reserved = Arc::new(AtomicU64::new(0));
        let refused = Arc::new(AtomicU64::new(0));
        let mut handles = Vec::new();
        for (l, limiter) in limiters.iter().enumerate() {
            for t in 0..8u64 {
                let limiter = limiter.clone();
                let (reserved, refused) = (Arc::clone(&reserved), Arc::clone(&refused));
                handles.push(tokio::spawn(async move {
                    let mut seed = 1 + 8 * l as u64 + t;
                    for _ in 0..40 {
                        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                        let cost = 1 + (seed >> 33) % 300;
                        let r = limiter.reserve_n("hot", cost).await.unwrap();
                        if r.held() > 0 {
                            reserved.fetch_add(1, Ordering::Relaxed);
                            tokio::task::yield_now().await;
                            limiter.cancel("hot", r).await.unwrap();
                        } else {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }));
            }
        }
        for handle in handles {
            handle.await.unwrap();
        }
        // Both outcomes happened: reservations overlapped up to the limit.
        let (reserved, refused) = (
            reserved.load(Ordering::Relaxed),
            refused.load(Ordering::Relaxed),
        );
        assert!(
            reserved > 0 && refused > 0,
            "{policy}: {reserved} reserved, {refused} refused"
        );
        let plain = limiter_at(&server, policy, &prefix, &clock).await;
        let d = plain.peek("hot").await.unwrap();
        assert_eq!(d, plain.peek("never-used").await.unwrap(), "{policy}");
        assert_eq!(d.remaining(), 999, "{policy}: {d:?}");
        // Every band at rest: the whole capacity fits at once.
        assert!(plain.try_acquire_n("hot", 1000).await.unwrap().is_allowed());
    }
}

/// Reservations settled at random costs race plain requests on one key of a frozen clock
/// through four instances: what was admitted (the requests, and each reservation's real
/// cost) never exceeds the limit plus what the settles charged beyond their reservations.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_settles_never_admit_beyond_the_limit_and_the_charges() {
    let server = RedisServer::start();
    for (i, policy) in RACED.iter().enumerate() {
        let clock = FakeClock::new();
        at(&clock, T0);
        let limiters = four(&server, policy, &format!("mixed{i}"), &clock).await;
        let admitted = Arc::new(AtomicU64::new(0));
        let charged = Arc::new(AtomicU64::new(0));
        let refused = Arc::new(AtomicU64::new(0));
        let mut handles = Vec::new();
        for (l, limiter) in limiters.iter().enumerate() {
            for t in 0..8u64 {
                let limiter = limiter.clone();
                let (admitted, charged, refused) = (
                    Arc::clone(&admitted),
                    Arc::clone(&charged),
                    Arc::clone(&refused),
                );
                handles.push(tokio::spawn(async move {
                    let mut seed = 100 + 8 * l as u64 + t;
                    for _ in 0..40 {
                        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                        let roll = seed >> 33;
                        if roll.is_multiple_of(2) {
                            if limiter.try_acquire("hot").await.unwrap().is_allowed() {
                                admitted.fetch_add(1, Ordering::Relaxed);
                            } else {
                                refused.fetch_add(1, Ordering::Relaxed);
                            }
                            continue;
                        }
                        let cost = 1 + (roll >> 1) % 40;
                        let actual = (roll >> 8) % (2 * cost + 1);
                        let r = limiter.reserve_n("hot", cost).await.unwrap();
                        if r.held() == 0 {
                            refused.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        tokio::task::yield_now().await;
                        limiter.settle("hot", r, actual).await.unwrap();
                        admitted.fetch_add(actual, Ordering::Relaxed);
                        charged.fetch_add(actual.saturating_sub(cost), Ordering::Relaxed);
                    }
                }));
            }
        }
        for handle in handles {
            handle.await.unwrap();
        }
        let (admitted, charged) = (
            admitted.load(Ordering::Relaxed),
            charged.load(Ordering::Relaxed),
        );
        assert!(
            admitted <= 1000 + charged,
            "{policy}: {admitted} admitted, {charged} charged"
        );
        // The key did fill up: the race was at the limit.
        assert!(
            refused.load(Ordering::Relaxed) > 0,
            "{policy}: nothing refused"
        );
    }
}

/// A refusal in the deny cache does not outlive a refund: once a cancel frees permits, the
/// next request goes to Redis and is admitted.
#[tokio::test]
async fn a_refund_clears_the_deny_cache() {
    let server = RedisServer::start();
    for (i, policy) in [TOKEN_BUCKET, SLIDING_LOG, SLIDING_COUNTER, COMPOSITE]
        .into_iter()
        .enumerate()
    {
        let clock = FakeClock::new();
        at(&clock, T0);
        let limiter = RedisLimiter::builder(policy.parse().unwrap())
            .prefix(&format!("cache{i}"))
            .test_clock(clock.clone())
            .timeout(Duration::from_secs(10))
            .connect(&server.url())
            .await
            .unwrap();
        let r = limiter.reserve_n("k", 20).await.unwrap();
        assert!(r.decision().is_allowed());
        assert!(!limiter.try_acquire("k").await.unwrap().is_allowed());
        assert!(!limiter.try_acquire("k").await.unwrap().is_allowed());
        assert_eq!(
            limiter.stats().cached_refusals,
            1,
            "{policy}: the refusal is cached"
        );
        // Cancelled elsewhere: another task, through a clone of the limiter.
        let elsewhere = limiter.clone();
        tokio::spawn(async move { elsewhere.cancel("k", r).await })
            .await
            .unwrap()
            .unwrap();
        let d = limiter.try_acquire("k").await.unwrap();
        assert!(d.is_allowed(), "{policy}: {d:?}");
        assert_eq!(d.remaining(), 19, "{policy}");
        assert_eq!(limiter.stats().cached_refusals, 1, "{policy}");
    }
}

/// With Redis down, a reservation is decided as `try_acquire_n` would be by the failure
/// policy; one the failure policy admitted settles as a no-op, and a reservation Redis made
/// cannot be settled: the error, and its permits stay spent, without switching the limiter
/// to its failure policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failure_policies_decide_reservations_and_settles_report_the_failure() {
    let timeout = Duration::from_millis(300);
    for (name, failure) in [
        ("open", FailurePolicy::Open),
        ("closed", FailurePolicy::Closed),
        ("error", FailurePolicy::Error),
        (
            "local",
            FailurePolicy::Local(RateLimiter::new("3/1h".parse().unwrap())),
        ),
    ] {
        let mut server = RedisServer::start();
        let limiter = RedisLimiter::builder("5/1h".parse().unwrap())
            .prefix(name)
            .timeout(timeout)
            .deny_cache(0)
            .failure_policy(failure)
            .connect(&server.url())
            .await
            .unwrap();
        let in_redis = limiter.reserve_n("k", 2).await.unwrap();
        assert_eq!(in_redis.held(), 2);
        server.kill();
        let err = limiter.cancel("k", in_redis).await.unwrap_err();
        assert!(
            matches!(err, BackendError::Redis(_) | BackendError::Timeout(_)),
            "{name}: {err}"
        );
        // A failed settle does not switch the limiter to its failure policy: the next
        // decision finds the outage for itself.
        assert!(!limiter.is_failing(), "{name}");
        let got = limiter.reserve_n("k", 2).await;
        assert!(limiter.is_failing(), "{name}");
        match name {
            "open" | "local" => {
                let r = got.unwrap();
                assert!(r.decision().is_allowed(), "{name}");
                assert_eq!(r.held(), 2, "{name}");
                // Nothing of it is in Redis: settling it changes nothing and succeeds.
                limiter.settle("k", r, 1).await.unwrap();
                let r = limiter.reserve_n("k", 1).await.unwrap();
                limiter.settle("k", r, 9).await.unwrap();
            }
            "closed" => {
                let r = got.unwrap();
                assert!(!r.decision().is_allowed(), "{name}");
                assert!(matches!(
                    limiter.cancel("k", r).await,
                    Err(BackendError::Settle(SettleError::Refused))
                ));
            }
            // The call that finds the outage reports it as it is.
            _ => assert!(
                matches!(got, Err(BackendError::Timeout(_) | BackendError::Redis(_))),
                "{name}: {got:?}"
            ),
        }
        let stats = limiter.stats();
        assert_eq!(stats.switches_to_failure, 1, "{name}: {stats:?}");
    }
}

/// A settle while the limiter is switched to the failure policy does not wait on Redis: it
/// fails at once, unless it is the call that probes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settles_skip_a_known_down_redis() {
    let mut server = RedisServer::start();
    let limiter = RedisLimiter::builder("5/1h".parse().unwrap())
        .prefix("down")
        .timeout(Duration::from_millis(300))
        .probe_interval(Duration::from_secs(60))
        .deny_cache(0)
        .failure_policy(FailurePolicy::Open)
        .connect(&server.url())
        .await
        .unwrap();
    let r = limiter.reserve_n("k", 2).await.unwrap();
    server.kill();
    // Switches to the failure policy.
    assert!(limiter.try_acquire("k").await.unwrap().is_allowed());
    assert!(limiter.is_failing());
    let err = limiter.cancel("k", r).await.unwrap_err();
    assert!(matches!(err, BackendError::Unavailable), "{err}");
}

/// On Redis TIME (keys with expiries): a charged debt keeps the key alive until it has
/// drained, and a bucket given everything back is deleted.
#[tokio::test]
async fn settles_keep_key_expiry_right() {
    let server = RedisServer::start();
    let limiter = on_redis_time(&server, "2/200ms & sliding-counter 5/1s", "ttl").await;
    let keys = limiter.redis_keys("k");
    let pttl = |key: &str| server.command(&["PTTL", key]).int();
    let r = limiter.reserve_n("k", 2).await.unwrap();
    assert!((100..=200).contains(&pttl(&keys[0])), "{}", pttl(&keys[0]));
    // 2 more: a debt of 4 intervals (400 ms), twice the burst.
    limiter.settle("k", r, 4).await.unwrap();
    assert!((300..=400).contains(&pttl(&keys[0])), "{}", pttl(&keys[0]));
    assert_eq!(server.command(&["HGET", &keys[1], "c"]).text(), "4");
    assert!((900..=2000).contains(&pttl(&keys[1])), "{}", pttl(&keys[1]));

    let limiter = on_redis_time(&server, "2/200ms & sliding-log 3/300ms", "gone").await;
    let keys = limiter.redis_keys("k");
    let r = limiter.reserve_n("k", 2).await.unwrap();
    limiter.cancel("k", r).await.unwrap();
    // Both at rest: the bucket full again, the log empty.
    for key in &keys {
        assert_eq!(server.command(&["EXISTS", key]).int(), 0, "{key}");
    }

    // A refund that leaves older entries: the log lives until the newest one left has gone,
    // no longer than the refunded ones would have kept it.
    let limiter = on_redis_time(&server, "sliding-log 3/1s", "partly").await;
    let key = &limiter.redis_keys("k")[0];
    let _kept = limiter.reserve_n("k", 1).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = limiter.reserve_n("k", 1).await.unwrap();
    assert!((800..=1000).contains(&pttl(key)), "{}", pttl(key));
    limiter.cancel("k", r).await.unwrap();
    assert_eq!(server.command(&["ZCARD", key]).int(), 1);
    assert!((1..=700).contains(&pttl(key)), "{}", pttl(key));
}

/// One band of a policy as the scripts see it (microseconds), with its state, following the
/// settle rules as written in docs/REDIS.md: a reference for the scripts on random traces.
#[derive(Clone, Debug)]
enum ModelBand {
    Bucket {
        t: u64,
        b: u64,
        tat: u64,
    },
    Log {
        n: u64,
        w: u64,
        /// The last N stamps, oldest first.
        entries: Vec<u64>,
    },
    Counter {
        n: u64,
        w: u64,
        /// The stored window index and its counts.
        index: u64,
        current: u64,
        previous: u64,
    },
}

impl ModelBand {
    fn of(policy: &Policy) -> Vec<ModelBand> {
        policy
            .bands()
            .map(|band| {
                let n = band.permits();
                let w = u64::try_from(band.window().as_nanos().div_ceil(1_000)).unwrap();
                match band.algorithm() {
                    Algorithm::TokenBucket => {
                        let t = w.div_ceil(n);
                        ModelBand::Bucket {
                            t,
                            b: n * t,
                            tat: 0,
                        }
                    }
                    Algorithm::SlidingLog => ModelBand::Log {
                        n,
                        w,
                        entries: Vec::new(),
                    },
                    Algorithm::SlidingCounter => ModelBand::Counter {
                        n,
                        w,
                        index: 0,
                        current: 0,
                        previous: 0,
                    },
                }
            })
            .collect()
    }

    fn age(stamp: u64, now: u64) -> u64 {
        now - stamp.min(now)
    }

    fn live(entries: &[u64], n: u64, w: u64, now: u64) -> u64 {
        let live = entries.iter().filter(|&&e| Self::age(e, now) < w).count() as u64;
        live.min(n)
    }

    /// The counts rolled to now's window: index, elapsed, current, previous.
    fn roll(w: u64, index: u64, current: u64, previous: u64, now: u64) -> (u64, u64, u64, u64) {
        let at = now / w;
        if index > at {
            (index, 0, current, previous)
        } else if index == at {
            (at, now % w, current, previous)
        } else if index + 1 == at {
            (at, now % w, 0, current)
        } else {
            (at, now % w, 0, 0)
        }
    }

    /// Whether a request of `cost` fits now.
    fn fits(&self, now: u64, cost: u64) -> bool {
        match *self {
            ModelBand::Bucket { t, b, tat } => {
                let debt = tat.saturating_sub(now).min(2 * b);
                debt + (cost * t).min(b) <= b
            }
            ModelBand::Log { n, w, ref entries } => Self::live(entries, n, w, now) + cost <= n,
            ModelBand::Counter {
                n,
                w,
                index,
                current,
                previous,
            } => {
                let (_, elapsed, current, previous) = Self::roll(w, index, current, previous, now);
                let carried =
                    (u128::from(previous) * u128::from(w - elapsed) / u128::from(w)) as u64;
                n.saturating_sub(current + carried) >= cost
            }
        }
    }

    /// Spends `cost` (it fits); returns the band's mark.
    fn admit(&mut self, now: u64, cost: u64) -> u64 {
        match self {
            ModelBand::Bucket { t, b, tat } => {
                let debt = tat.saturating_sub(now).min(2 * *b);
                *tat = now + debt + (cost * *t).min(*b);
                *tat
            }
            ModelBand::Log { n, entries, .. } => {
                let stamp = entries.last().map_or(now, |&e| e.max(now));
                Self::append(entries, *n, stamp, cost);
                stamp
            }
            ModelBand::Counter {
                w,
                index,
                current,
                previous,
                ..
            } => {
                let (at, _, c, p) = Self::roll(*w, *index, *current, *previous, now);
                (*index, *current, *previous) = (at, c + cost, p);
                at * *w
            }
        }
    }

    fn append(entries: &mut Vec<u64>, n: u64, stamp: u64, count: u64) {
        entries.extend(std::iter::repeat_n(stamp, count as usize));
        let extra = entries.len().saturating_sub(n as usize);
        entries.drain(..extra);
    }

    /// Gives back `give` permits of a reservation marked `mark`.
    fn refund(&mut self, now: u64, mark: u64, give: u64) {
        match self {
            ModelBand::Bucket { t, b, tat } => {
                if *tat > now {
                    // At most what has not drained, from the latest clock an admission saw.
                    let latest = now.max(tat.saturating_sub(*b));
                    let back = (give * *t).min(mark.saturating_sub(latest));
                    *tat = (*tat - back).max(now);
                }
            }
            ModelBand::Log { w, entries, .. } => {
                if Self::age(mark, now) < *w {
                    for _ in 0..give {
                        match entries.iter().rposition(|&e| e == mark) {
                            Some(i) => {
                                entries.remove(i);
                            }
                            None => break,
                        }
                    }
                }
            }
            ModelBand::Counter {
                w,
                index,
                current,
                previous,
                ..
            } => {
                let (at, _, mut c, mut p) = Self::roll(*w, *index, *current, *previous, now);
                let mi = mark / *w;
                if mi == at {
                    c -= give.min(c);
                } else if mi + 1 == at {
                    p -= give.min(p);
                }
                (*index, *current, *previous) = (at, c, p);
            }
        }
    }

    /// Charges `take` more permits.
    fn charge(&mut self, now: u64, take: u64) {
        match self {
            ModelBand::Bucket { t, b, tat } => {
                let ceiling = now + 2 * *b;
                let base = (*tat).max(now).min(ceiling);
                let raised = (u128::from(base) + u128::from(take) * u128::from(*t))
                    .min(u128::from(ceiling)) as u64;
                *tat = (*tat).max(raised);
            }
            ModelBand::Log { n, w, entries } => {
                let live = Self::live(entries, *n, *w, now);
                let stamp = entries.last().map_or(now, |&e| e.max(now));
                Self::append(entries, *n, stamp, take.min(*n - live));
            }
            ModelBand::Counter {
                n,
                w,
                index,
                current,
                previous,
            } => {
                let (at, _, c, p) = Self::roll(*w, *index, *current, *previous, now);
                (*index, *current, *previous) = (at, c.saturating_add(take).min(2 * *n), p);
            }
        }
    }

    /// The band's state as comparable text: the TAT, the stamps, or the counts rolled to now.
    fn state(&self, now: u64) -> String {
        match *self {
            ModelBand::Bucket { tat, .. } => format!("tat {tat}"),
            ModelBand::Log { ref entries, .. } => format!("log {entries:?}"),
            ModelBand::Counter {
                w,
                index,
                current,
                previous,
                ..
            } => {
                let (at, _, c, p) = Self::roll(w, index, current, previous, now);
                format!("counts {at} {c} {p}")
            }
        }
    }

    /// The same, read from Redis.
    fn redis_state(&self, server: &RedisServer, key: &str, now: u64) -> String {
        let number = |text: String| text.parse::<f64>().unwrap() as u64;
        match *self {
            ModelBand::Bucket { .. } => match server.command(&["GET", key]) {
                Reply::Bulk(None) => "tat 0".to_owned(),
                reply => format!("tat {}", number(reply.text())),
            },
            ModelBand::Log { .. } => {
                let Reply::Array(items) = server.command(&["ZRANGE", key, "0", "-1", "WITHSCORES"])
                else {
                    panic!("not a sorted set")
                };
                let stamps: Vec<u64> = items.chunks(2).map(|m| number(m[1].text())).collect();
                format!("log {stamps:?}")
            }
            ModelBand::Counter { w, .. } => {
                let Reply::Array(items) = server.command(&["HMGET", key, "i", "c", "p"]) else {
                    panic!("not a hash")
                };
                let field = |i: usize| match &items[i] {
                    Reply::Bulk(None) => 0,
                    reply => number(reply.text()),
                };
                let (at, _, c, p) = Self::roll(w, field(0), field(1), field(2), now);
                format!("counts {at} {c} {p}")
            }
        }
    }
}

/// Random traces of reservations, settles at random costs (below, at and above what they
/// hold), cancels and plain requests, with the clock stepping forwards and sometimes back:
/// after every call, each band's state in Redis is what the settle rules give, and every
/// admission is the one they allow.
#[tokio::test]
async fn settles_follow_the_rules_on_random_traces() {
    let server = RedisServer::start();
    let policies = [
        "5/1s",
        "7/10ms",
        "1000000000/100d",
        "sliding-log 3/1s",
        "sliding-log 50/1min",
        "sliding-counter 10/min",
        "sliding-counter 4/100us",
        "sliding-counter 2000000000/100d",
        "10/s & sliding-log 3/100ms",
        "sliding-counter 5/10ms & sliding-log 20/1s & 100/1h",
        "3/1ms & sliding-counter 5/2ms",
    ];
    for (p, policy) in policies.iter().enumerate() {
        let parsed: Policy = policy.parse().unwrap();
        let max_cost = parsed.bands().map(|b| b.permits()).min().unwrap();
        let w_min = parsed
            .bands()
            .map(|b| u64::try_from(b.window().as_micros()).unwrap().max(1))
            .min()
            .unwrap();
        for seed in 0..3u64 {
            let clock = FakeClock::new();
            let mut now = T0;
            at(&clock, now);
            let limiter = limiter_at(&server, policy, &format!("trace{p}-{seed}"), &clock).await;
            let keys = limiter.redis_keys("k");
            let mut model = ModelBand::of(&parsed);
            let mut open: Vec<(Reservation, u64, Vec<u64>)> = Vec::new();
            let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ p as u64;
            let mut next = move || {
                rng = rng
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                rng >> 11
            };
            let (mut settled, mut admitted) = (0, 0);
            for op in 0..300 {
                match next() % 10 {
                    0..=4 => now += next() % (w_min / 4 + 1),
                    5 => now += next() % (2 * w_min + 1),
                    6 => now = now.saturating_sub(next() % (w_min / 2 + 1)),
                    _ => {}
                }
                at(&clock, now);
                let cost = if max_cost > 1 && next().is_multiple_of(2) {
                    1 + next() % max_cost.min(40)
                } else {
                    1
                };
                let what = match next() % 8 {
                    0..=2 => {
                        let r = limiter.reserve_n("k", cost).await.unwrap();
                        let fits = model.iter().all(|band| band.fits(now, cost));
                        assert_eq!(r.decision().is_allowed(), fits, "{policy} {seed} op {op}");
                        if fits {
                            admitted += 1;
                            let marks =
                                model.iter_mut().map(|band| band.admit(now, cost)).collect();
                            open.push((r, cost, marks));
                        }
                        format!("reserve {cost}")
                    }
                    3 => {
                        let d = limiter.try_acquire_n("k", cost).await.unwrap();
                        let fits = model.iter().all(|band| band.fits(now, cost));
                        assert_eq!(d.is_allowed(), fits, "{policy} {seed} op {op}");
                        if fits {
                            for band in &mut model {
                                band.admit(now, cost);
                            }
                        }
                        format!("acquire {cost}")
                    }
                    _ if open.is_empty() => "nothing".to_owned(),
                    _ => {
                        let (r, held, marks) =
                            open.swap_remove((next() % open.len() as u64) as usize);
                        let actual = match next() % 4 {
                            0 => 0,
                            1 => held,
                            _ => next() % (2 * held + 3),
                        };
                        limiter.settle("k", r, actual).await.unwrap();
                        settled += 1;
                        for (band, &mark) in model.iter_mut().zip(&marks) {
                            if actual < held {
                                band.refund(now, mark, held - actual);
                            } else if actual > held {
                                band.charge(now, actual - held);
                            }
                        }
                        format!("settle {held} at {actual}")
                    }
                };
                for (band, key) in model.iter().zip(&keys) {
                    assert_eq!(
                        band.redis_state(&server, key, now),
                        band.state(now),
                        "{policy}, seed {seed}, op {op}: {what} at {now} us"
                    );
                }
            }
            assert!(
                settled > 5 && admitted > 5,
                "{policy}: {settled} settled, {admitted} admitted"
            );
        }
    }
}
