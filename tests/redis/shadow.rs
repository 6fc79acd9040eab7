//! Shadow mode on Redis (`RedisLimiterBuilder::shadow`): nothing refused, every decision
//! counted as the policy made it, and the state in Redis exactly what enforcing would have
//! left, across instances, with the deny cache, leases, reservations, the failure policy and
//! `RedisAllOf` parts.
//!
//! Needs `redis-server` on PATH (`scripts/install-redis.sh`); without it every test fails
//! saying so.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tollgate::redis::{BackendError, FailurePolicy, RedisAllOf, RedisLimiter};
use tollgate::{FakeClock, SettleError};

use crate::clocked::{at, limiter_at, shared_at};
use crate::redis_server::RedisServer;

/// A frozen test clock's reading, in microseconds.
const T0: u64 = 600_000_000;

/// Four shadow instances, each with its own connection and eight tasks started together on a
/// frozen clock, hammer one key of capacity 40 (with the deny cache on, so most refusals
/// are answered locally): every call is let through, exactly 40 are counted as allowed and
/// the rest as refused (each marked `would_refuse`), and an enforcing limiter on the same
/// keys then finds the key exactly spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn refuses_nothing_and_counts_exactly_across_instances() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    for policy in [
        "40/1h",
        "sliding-log 40/1h",
        "sliding-counter 40/1h & 100/1d",
    ] {
        let mut limiters = Vec::new();
        for _ in 0..4 {
            limiters.push(
                RedisLimiter::builder(policy.parse().unwrap())
                    .prefix("shadow")
                    .test_clock(clock.clone())
                    .timeout(Duration::from_secs(10))
                    .shadow()
                    .connect(&server.url())
                    .await
                    .unwrap(),
            );
        }
        let marked = Arc::new(AtomicU64::new(0));
        let start = Arc::new(tokio::sync::Barrier::new(32));
        let mut handles = Vec::new();
        for limiter in &limiters {
            for _ in 0..8 {
                let (limiter, marked, start) =
                    (limiter.clone(), Arc::clone(&marked), Arc::clone(&start));
                handles.push(tokio::spawn(async move {
                    start.wait().await;
                    for _ in 0..25 {
                        let decision = limiter.try_acquire("hot").await.unwrap();
                        assert!(decision.is_allowed(), "{decision:?}");
                        if decision.would_refuse() {
                            marked.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }));
            }
        }
        for handle in handles {
            handle.await.unwrap();
        }
        let stats: Vec<_> = limiters.iter().map(RedisLimiter::stats).collect();
        let allowed: u64 = stats.iter().map(|s| s.allowed).sum();
        let refused: u64 = stats.iter().map(|s| s.refused).sum();
        assert_eq!((allowed, refused), (40, 800 - 40), "{policy}: {stats:?}");
        assert_eq!(marked.load(Ordering::Relaxed), refused, "{policy}");
        assert!(
            stats.iter().map(|s| s.cached_refusals).sum::<u64>() > 0,
            "{policy}: the deny cache answered no refusal: {stats:?}"
        );
        // The same requests from enforcing instances on another prefix leave the same
        // state: every peek agrees, now and as the permits come back.
        let mut enforcing = Vec::new();
        for _ in 0..4 {
            enforcing.push(limiter_at(&server, policy, "enforced", &clock).await);
        }
        let mut handles = Vec::new();
        for limiter in &enforcing {
            for _ in 0..8 {
                let limiter = limiter.clone();
                handles.push(tokio::spawn(async move {
                    for _ in 0..25 {
                        let _ = limiter.try_acquire("hot").await.unwrap();
                    }
                }));
            }
        }
        for handle in handles {
            handle.await.unwrap();
        }
        let view = limiter_at(&server, policy, "shadow", &clock).await;
        for wait in [0, 90, 1_800, 3_599, 3_601, 86_399] {
            let later = Duration::from_secs(wait);
            clock.set(Duration::from_micros(T0) + later);
            assert_eq!(
                view.peek("hot").await.unwrap(),
                enforcing[0].peek("hot").await.unwrap(),
                "{policy}, {wait} s later"
            );
        }
        at(&clock, T0);
        // Peeks are the policy's own answer, and are not counted.
        let peeked = limiters[0].peek("hot").await.unwrap();
        assert!(!view.peek("hot").await.unwrap().is_allowed());
        assert!(!peeked.is_allowed() && !peeked.would_refuse(), "{peeked:?}");
        assert_eq!(limiters[0].stats().refused, stats[0].refused);
        server.command(&["FLUSHALL"]);
    }
}

/// Costs, reservations and waiting in shadow mode: a refused cost spends nothing, a
/// reservation let through holds nothing (its settle is `Refused`), an admitted one settles
/// as usual, and `acquire` never waits.
#[tokio::test]
async fn costs_reservations_and_waits_spend_only_what_the_policy_admits() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let shadow = RedisLimiter::builder("10/1h".parse().unwrap())
        .prefix("costs")
        .test_clock(clock.clone())
        .deny_cache(0)
        .shadow()
        .connect(&server.url())
        .await
        .unwrap();
    let enforcing = limiter_at(&server, "10/1h", "costs", &clock).await;

    assert_eq!(shadow.try_acquire_n("k", 7).await.unwrap().remaining(), 3);
    let over = shadow.try_acquire_n("k", 4).await.unwrap();
    assert!(over.is_allowed() && over.would_refuse(), "{over:?}");
    assert_eq!(
        enforcing.available("k").await.unwrap(),
        3,
        "the refused 4 spent nothing"
    );

    let refused = shadow.reserve_n("k", 5).await.unwrap();
    assert!(refused.decision().would_refuse());
    assert_eq!(refused.held(), 0);
    let settled = shadow.settle("k", refused, 5).await;
    assert!(
        matches!(settled, Err(BackendError::Settle(SettleError::Refused))),
        "{settled:?}"
    );
    let admitted = shadow.reserve_n("k", 3).await.unwrap();
    assert!(!admitted.decision().would_refuse());
    shadow.settle("k", admitted, 1).await.unwrap();
    assert_eq!(
        enforcing.available("k").await.unwrap(),
        2,
        "2 of the 3 came back"
    );

    // Waiting for more than is left returns at once, let through.
    let waited = tokio::time::timeout(Duration::from_secs(5), shadow.acquire_n("k", 9))
        .await
        .expect("a shadow limiter never waits")
        .unwrap();
    assert!(waited.would_refuse(), "{waited:?}");
    assert_eq!(enforcing.available("k").await.unwrap(), 2);
    let stats = shadow.stats();
    assert_eq!((stats.allowed, stats.refused), (2, 3), "{stats:?}");
}

/// Leases in shadow mode: the permits the policy has are admitted from leases and Redis,
/// exactly, every request past them is let through and counted as refused, and once the
/// lease is given back Redis counts exactly what was admitted.
#[tokio::test]
async fn leases_admit_exactly_the_policy_and_let_the_rest_through() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let limiter = RedisLimiter::builder("100/1h".parse().unwrap())
        .prefix("leased")
        .test_clock(clock.clone())
        .lease(8)
        .shadow()
        .connect(&server.url())
        .await
        .unwrap();
    let mut marked = 0;
    for _ in 0..130 {
        let decision = limiter.try_acquire("hot").await.unwrap();
        assert!(decision.is_allowed(), "{decision:?}");
        marked += u64::from(decision.would_refuse());
    }
    limiter.close().await.unwrap();
    let stats = limiter.stats();
    assert_eq!(
        (stats.allowed, stats.refused, marked),
        (100, 30, 30),
        "{stats:?}"
    );
    assert!(stats.local_permits > 0, "no lease was used: {stats:?}");
    let enforcing = limiter_at(&server, "100/1h", "leased", &clock).await;
    assert_eq!(enforcing.available("hot").await.unwrap(), 0);
}

/// While Redis is down, a shadow limiter lets the failure policy's refusals through too
/// (`Closed` refuses everything), counted as refused; `Error` still fails the call.
#[tokio::test]
async fn failure_policy_refusals_are_let_through_and_errors_still_fail() {
    let mut server = RedisServer::start();
    let url = server.url();
    let build = |failure| {
        RedisLimiter::builder("5/1h".parse().unwrap())
            .prefix("down")
            .timeout(Duration::from_millis(300))
            .failure_policy(failure)
            .shadow()
            .connect(&url)
    };
    let closed = build(FailurePolicy::Closed).await.unwrap();
    let error = build(FailurePolicy::Error).await.unwrap();
    assert!(!closed.try_acquire("k").await.unwrap().would_refuse());
    server.kill();
    for _ in 0..3 {
        let decision = closed.try_acquire("k").await.unwrap();
        assert!(
            decision.is_allowed() && decision.would_refuse(),
            "{decision:?}"
        );
    }
    let stats = closed.stats();
    assert_eq!((stats.allowed, stats.refused), (1, 3), "{stats:?}");
    assert!(stats.failure_decisions >= 3, "{stats:?}");
    assert!(error.try_acquire("k").await.is_err());
    assert_eq!(error.stats().refused, 0);
}

/// A `RedisAllOf` with a part in shadow mode: that part never refuses the whole and spends
/// only what its policy admits, the other part still enforces its limit, and each limiter
/// counts its own part's decisions.
#[tokio::test]
async fn a_shadow_part_lets_through_only_what_the_others_allow() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let enforced = limiter_at(&server, "3/1h", "enforced", &clock).await;
    let shadow = RedisLimiter::builder("1/1h".parse().unwrap())
        .prefix("shadowed")
        .test_clock(clock.clone())
        .deny_cache(0)
        .shadow()
        .connect_shared(&enforced)
        .await
        .unwrap();
    let plain = shared_at(&enforced, "1/1h", "shadowed", &clock).await;
    let all = RedisAllOf::new().key(&enforced, "a").key(&shadow, "a");

    let first = all.try_acquire().await.unwrap();
    assert!(first.is_allowed() && !first.would_refuse(), "{first:?}");
    for _ in 0..2 {
        let decision = all.try_acquire().await.unwrap();
        assert!(
            decision.is_allowed() && decision.would_refuse(),
            "{decision:?}"
        );
        assert_eq!(decision.part(), 1, "{decision:?}");
    }
    // The enforced part has spent its 3; the whole is refused, by it.
    let refused = all.try_acquire().await.unwrap();
    assert!(!refused.is_allowed() && refused.part() == 0, "{refused:?}");
    // A peek reports each policy's own answer.
    assert!(!all.peek().await.unwrap().is_allowed());
    assert_eq!(enforced.available("a").await.unwrap(), 0);
    assert_eq!(
        plain.available("a").await.unwrap(),
        0,
        "the shadow part spent 1, once"
    );
    assert_eq!(
        (shadow.stats().allowed, shadow.stats().refused),
        (1, 3),
        "{:?}",
        shadow.stats()
    );
    assert_eq!(
        (enforced.stats().allowed, enforced.stats().refused),
        (3, 1),
        "{:?}",
        enforced.stats()
    );

    // Reserved: a shadow part let through holds nothing, and marks nothing in Redis.
    at(&clock, T0 + 3_600_000_000);
    let r = all.reserve().await.unwrap();
    assert!(!r.decision().would_refuse());
    all.cancel(r).await.unwrap();
    assert!(!shadow.try_acquire("a").await.unwrap().would_refuse());
    let r = all.reserve().await.unwrap();
    assert!(r.decision().is_allowed() && r.decision().would_refuse());
    // The shadow part wrote no reservation token; the enforced part did.
    assert_eq!(
        server.command(&["EXISTS", "shadowed:{a}:reserved"]).int(),
        0
    );
    assert_eq!(server.command(&["HLEN", "enforced:{a}:reserved"]).int(), 1);
    // Settled whole: the shadow part holds nothing to settle, and is skipped.
    all.settle(r, &[2, 5]).await.unwrap();
    assert_eq!(enforced.available("a").await.unwrap(), 1);
    assert_eq!(plain.available("a").await.unwrap(), 0);
}

/// While Redis is down, a shadow part of a `RedisAllOf` whose failure policy refuses
/// (`Closed`, or its `Local` limiter) lets the request through and is counted as refused,
/// while an `Open` part allows; a shadow limiter alone with a `Local` failure policy lets
/// that limiter's refusals through.
#[tokio::test]
async fn failure_policies_of_shadow_parts_let_through() {
    use tollgate::RateLimiter;

    let mut server = RedisServer::start();
    let url = server.url();
    let build = |prefix: &str, failure, shadow: bool| {
        let builder = RedisLimiter::builder("5/1h".parse().unwrap())
            .prefix(prefix)
            .timeout(Duration::from_millis(300))
            .failure_policy(failure);
        if shadow {
            builder.shadow()
        } else {
            builder
        }
    };
    let open = build("open", FailurePolicy::Open, false)
        .connect(&url)
        .await
        .unwrap();
    let closed = build("closed", FailurePolicy::Closed, true)
        .connect_shared(&open)
        .await
        .unwrap();
    let local = build(
        "local",
        FailurePolicy::Local(RateLimiter::new("1/1h".parse().unwrap())),
        true,
    )
    .connect_shared(&open)
    .await
    .unwrap();
    server.kill();
    let all = RedisAllOf::new()
        .key(&open, "a")
        .key(&closed, "a")
        .key(&local, "a");
    for i in 0..3 {
        let d = all.try_acquire().await.unwrap();
        assert!(d.is_allowed() && d.would_refuse(), "#{i}: {d:?}");
    }
    assert_eq!(closed.stats().refused, 3, "{:?}", closed.stats());
    let local_stats = local.stats();
    assert_eq!(
        (local_stats.allowed, local_stats.refused),
        (1, 2),
        "{local_stats:?}"
    );
    let alone = local.try_acquire("b").await.unwrap();
    assert!(!alone.would_refuse(), "{alone:?}");
    let alone = local.try_acquire("b").await.unwrap();
    assert!(alone.is_allowed() && alone.would_refuse(), "{alone:?}");
}

/// While Redis is down, a shadow part looked at after an enforcing part refused (its
/// failure policy refusing too) neither sets the whole refusal's wait nor is named by it.
#[tokio::test]
async fn a_shadow_part_looked_at_after_a_refusal_sets_no_wait() {
    use tollgate::RateLimiter;

    let mut server = RedisServer::start();
    let url = server.url();
    let enforced = RedisLimiter::builder("5/1h".parse().unwrap())
        .prefix("enforced")
        .timeout(Duration::from_millis(300))
        .failure_policy(FailurePolicy::Local(RateLimiter::new(
            "1/1s".parse().unwrap(),
        )))
        .connect(&url)
        .await
        .unwrap();
    let rollout = RedisLimiter::builder("5/1h".parse().unwrap())
        .prefix("rollout")
        .timeout(Duration::from_millis(300))
        .failure_policy(FailurePolicy::Closed)
        .shadow()
        .connect_shared(&enforced)
        .await
        .unwrap();
    server.kill();
    let all = RedisAllOf::new().key(&enforced, "a").key(&rollout, "a");
    let first = all.try_acquire().await.unwrap();
    assert!(first.is_allowed() && first.would_refuse(), "{first:?}");
    let refused = all.try_acquire().await.unwrap();
    assert!(!refused.is_allowed(), "{refused:?}");
    assert_eq!(refused.part(), 0, "{refused:?}");
    assert!(
        refused.retry_after() <= Duration::from_secs(1),
        "{refused:?}"
    );
}
