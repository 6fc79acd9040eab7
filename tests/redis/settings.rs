//! The builder's settings against a real `redis-server`: settings that cannot work are
//! refused at connect with a typed error naming the setting and the value (before anything
//! is connected), a sliding log refuses leases of more than one permit, and a timeout of
//! `Duration::MAX` works, leases included.
//!
//! Needs `redis-server` on PATH (`scripts/install-redis.sh`); without it every test fails
//! saying so.

use std::time::Duration;

use tollgate::redis::{BackendError, RedisLimiter, RedisLimiterBuilder};
use tollgate::FakeClock;

use crate::redis_server::RedisServer;

/// Connecting `builder` to `url` fails with `InvalidSetting` for `setting` and `value`, and
/// the message names both.
async fn refused(builder: RedisLimiterBuilder, url: &str, setting: &str, value: &str) {
    let err = builder.connect(url).await.expect_err(setting);
    let text = err.to_string();
    match err {
        BackendError::InvalidSetting {
            setting: named,
            value: given,
            ..
        } => {
            assert_eq!((named, given.as_str()), (setting, value), "{text}");
        }
        other => panic!("{setting} {value}: expected InvalidSetting, got {other:?}"),
    }
    assert!(
        text.contains(&format!("`{setting}`")) && text.contains(value),
        "{text}"
    );
}

/// Zero durations and `lease(0)` are refused before anything is connected: the URL's port
/// has no server, and the error is the setting's, not a connection's.
#[tokio::test]
async fn settings_that_cannot_work_are_refused_naming_the_setting_and_the_value() {
    let nowhere = "redis://127.0.0.1:1";
    let builder = || RedisLimiter::builder("5/s".parse().unwrap());
    refused(builder().timeout(Duration::ZERO), nowhere, "timeout", "0ns").await;
    refused(
        builder().connect_timeout(Duration::ZERO),
        nowhere,
        "connect_timeout",
        "0ns",
    )
    .await;
    refused(
        builder().probe_interval(Duration::ZERO),
        nowhere,
        "probe_interval",
        "0ns",
    )
    .await;
    refused(builder().lease(0), nowhere, "lease", "0").await;
    // The same settings, valid, get as far as the connection (which fails: no server).
    let err = builder()
        .timeout(Duration::from_millis(1))
        .connect_timeout(Duration::from_millis(200))
        .probe_interval(Duration::from_millis(1))
        .lease(1)
        .connect(nowhere)
        .await
        .expect_err("no server on port 1");
    assert!(
        matches!(err, BackendError::Redis(_) | BackendError::Timeout(_)),
        "{err:?}"
    );
}

/// A lease of more than one permit would stamp its permits in a sliding log when it is
/// taken, and admit them up to a tenth of the window later, so that more than `N` could be
/// admitted within one window of real time: refused at connect, for a sliding log alone or
/// as any band of a composite. `lease(1)` is accepted, and each request is stamped when it
/// is admitted: the window stays exact.
#[tokio::test]
async fn a_sliding_log_refuses_leases_of_more_than_one_permit() {
    let server = RedisServer::start();
    for policy in ["sliding-log 100/1s", "100/1h & sliding-log 5/1min"] {
        for lease in [2, 50] {
            let builder = RedisLimiter::builder(policy.parse().unwrap()).lease(lease);
            refused(builder, &server.url(), "lease", &lease.to_string()).await;
        }
    }

    // The trace that a lease of 50 would break: 50 admitted at 0.099 s, then at 1.0 s no
    // more than the 50 that fit in (0 s, 1.0 s].
    let clock = FakeClock::new();
    let t0 = Duration::from_secs(86_400);
    clock.set(t0);
    let leasing = RedisLimiter::builder("sliding-log 100/1s".parse().unwrap())
        .prefix("log1")
        .test_clock(clock.clone())
        .lease(1)
        .connect(&server.url())
        .await
        .unwrap();
    assert!(leasing.try_acquire("k").await.unwrap().is_allowed());
    clock.set(t0 + Duration::from_millis(99));
    for _ in 0..49 {
        assert!(leasing.try_acquire("k").await.unwrap().is_allowed());
    }
    clock.set(t0 + Duration::from_secs(1));
    let mut admitted = 0;
    while leasing.try_acquire("k").await.unwrap().is_allowed() {
        admitted += 1;
    }
    assert_eq!(admitted, 51, "the 49 of 0.099 s are still in the window");
    assert_eq!(
        leasing.stats().local_permits,
        0,
        "a lease of one admits locally nothing"
    );
}

/// `timeout(Duration::MAX)` with leases: a second request waiting for the first one's lease
/// computes its deadline without overflowing, leases of several permits are taken and
/// admit locally, and the key's hash of lease tokens gets a finite expiry (twice the hold
/// time, plus the timeout clamped to an hour, plus a second).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_of_duration_max_works_with_leases_and_concurrent_waiters() {
    let server = RedisServer::start();
    let limiter = RedisLimiter::builder("100000/1h".parse().unwrap())
        .prefix("forever")
        .timeout(Duration::MAX)
        .connect_timeout(Duration::MAX)
        .lease(8)
        .connect(&server.url())
        .await
        .unwrap();
    // Paused, so that the first request is still taking the key's lease when the second
    // one arrives and waits for it.
    server.pause();
    let request = || {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.try_acquire("k").await })
    };
    let first = request();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let second = request();
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.resume();
    for waiter in [first, second] {
        let decision = waiter.await.expect("no panic").expect("decided by Redis");
        assert!(decision.is_allowed(), "{decision:?}");
    }
    for i in 0..40 {
        let decision = limiter.try_acquire("k").await.unwrap();
        assert!(decision.is_allowed(), "#{i}: {decision:?}");
    }
    let stats = limiter.stats();
    assert!(
        stats.leased_permits >= 42 && stats.local_permits > 20,
        "{stats:?}"
    );
    // The hold time of 1h is 6 min: 2 x 360 s + 3600 s + 1 s.
    let ttl = server.command(&["PTTL", "forever:{k}:lease"]).int();
    assert!(ttl > 0 && ttl <= 4_321_000, "PTTL {ttl}");
    limiter.close().await.unwrap();
}
