//! Waiting on Redis: `acquire` and its variants wait for a budget every instance shares, and
//! client throttles on several instances keep one provider quota between them.
//!
//! Needs `redis-server` on PATH (`scripts/install-redis.sh`); without it every test fails
//! saying so.

use std::time::{Duration, Instant};

use tollgate::redis::{BackendError, RedisLimiter};
use tollgate::wait::Wait;

use crate::redis_server::RedisServer;

async fn instance(server: &RedisServer, policy: &str) -> RedisLimiter {
    RedisLimiter::builder(policy.parse().unwrap())
        .prefix("client")
        .deny_cache(0)
        .connect(&server.url())
        .await
        .unwrap()
}

#[tokio::test]
async fn acquire_waits_for_a_permit_another_instance_spent() {
    let server = RedisServer::start();
    let (one, other) = (
        instance(&server, "sliding-log 2/1s").await,
        instance(&server, "sliding-log 2/1s").await,
    );
    assert!(one.try_acquire_n("upstream", 2).await.unwrap().is_allowed());
    let start = Instant::now();
    assert!(other.acquire("upstream").await.unwrap().is_allowed());
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    // The second permit of the window; then a timeout shorter than the next permit gives up
    // at once with the refusal.
    assert!(one.try_acquire("upstream").await.unwrap().is_allowed());
    let start = Instant::now();
    let hurried = Wait::new().timeout(Duration::from_millis(100));
    let refused = other
        .acquire_with("upstream", hurried)
        .await
        .unwrap()
        .unwrap_err();
    assert!(refused.retry_after() > Duration::from_millis(100));
    assert!(start.elapsed() < Duration::from_millis(100));
    // A cost no policy admits fails before anything is sent.
    assert!(matches!(
        other.acquire_n("upstream", 3).await,
        Err(BackendError::Cost(_))
    ));
    let both = other
        .acquire_n_with("fresh", 2, Wait::new())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(both.remaining(), 0);
}

#[cfg(feature = "tower")]
#[tokio::test]
async fn throttles_on_four_instances_keep_one_quota() {
    use std::sync::{Arc, Mutex};

    use tollgate::client::Throttle;

    let server = RedisServer::start();
    let start = Instant::now();
    let admitted = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let throttle = Throttle::new(instance(&server, "sliding-log 5/1s").await);
        for _ in 0..3 {
            let (throttle, admitted) = (throttle.clone(), Arc::clone(&admitted));
            tasks.push(tokio::spawn(async move {
                throttle.acquire("provider").await.unwrap();
                admitted.lock().unwrap().push(start.elapsed());
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    let mut admitted = admitted.lock().unwrap().clone();
    admitted.sort();
    assert_eq!(admitted.len(), 12);
    // Five in the first window, five in the next, two in the third: whichever instance.
    let first = admitted[0];
    let in_window = |k: u64| {
        admitted
            .iter()
            .filter(|&&at| {
                at >= first + Duration::from_millis(1_000 * k)
                    && at < first + Duration::from_millis(1_000 * k + 900)
            })
            .count()
    };
    // Recorded when each task saw its permit, after Redis admitted it: a loaded machine
    // delays a record, never advances it, so a window never holds more than Redis admitted
    // in it, and the last permits come at least two windows after the first (less the
    // first's own delay).
    assert!(in_window(0) <= 5 && in_window(1) <= 5, "{admitted:?}");
    assert!(
        admitted[11] - first >= Duration::from_millis(1_500),
        "{admitted:?}"
    );
}

#[cfg(feature = "tower")]
#[tokio::test]
async fn a_pause_one_instance_learns_holds_every_instance() {
    use http::{HeaderMap, StatusCode};
    use tollgate::client::Throttle;

    let server = RedisServer::start();
    let one = Throttle::new(instance(&server, "100/1s").await);
    let other = Throttle::new(instance(&server, "100/1s").await);
    let mut call = one.acquire("provider").await.unwrap();
    let mut headers = HeaderMap::new();
    headers.insert("retry-after", "2".parse().unwrap());
    call.heard(StatusCode::TOO_MANY_REQUESTS, &headers);
    // Written in the background: give it a moment to land.
    let limiter = instance(&server, "100/1s").await;
    let deadline = Instant::now() + Duration::from_secs(1);
    while limiter.paused("provider").await.unwrap().is_none() {
        assert!(Instant::now() < deadline, "the pause never reached Redis");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let start = Instant::now();
    other.acquire("provider").await.unwrap();
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(1_800) && waited < Duration::from_secs(4),
        "{waited:?}"
    );
    // Another key is not paused, and a shorter pause never shortens a longer one.
    assert_eq!(limiter.paused("elsewhere").await.unwrap(), None);
    limiter
        .pause("long", Duration::from_secs(60))
        .await
        .unwrap();
    limiter.pause("long", Duration::from_secs(1)).await.unwrap();
    assert!(limiter.paused("long").await.unwrap().unwrap() > Duration::from_secs(50));
    // A pause meant as "until told otherwise" is kept as the longest one Redis takes.
    limiter.pause("forever", Duration::MAX).await.unwrap();
    let years = limiter.paused("forever").await.unwrap().unwrap().as_secs() / (365 * 86_400);
    assert!(years >= 9_999, "{years} years");
}

#[cfg(feature = "tower")]
#[tokio::test]
async fn a_throttle_on_a_redis_that_is_down_follows_the_failure_policy() {
    use tollgate::client::Throttle;
    use tollgate::redis::FailurePolicy;

    let mut server = RedisServer::start();
    let limiter = RedisLimiter::builder("100/1s".parse().unwrap())
        .prefix("client-down")
        .timeout(Duration::from_millis(200))
        .failure_policy(FailurePolicy::Open)
        .connect(&server.url())
        .await
        .unwrap();
    let throttle = Throttle::new(limiter);
    throttle.acquire("provider").await.unwrap();
    server.kill();
    // The first call finds Redis gone (one timeout at most, reading the shared pause), then
    // the failure policy lets it through; the next ones skip Redis at once.
    let start = Instant::now();
    throttle.acquire("provider").await.unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    let start = Instant::now();
    for _ in 0..5 {
        throttle.acquire("provider").await.unwrap();
    }
    assert!(
        start.elapsed() < Duration::from_millis(100),
        "{:?}",
        start.elapsed()
    );
}

#[cfg(feature = "tower")]
#[tokio::test]
async fn throttles_with_leases_keep_one_quota_between_instances() {
    use std::sync::{Arc, Mutex};

    use tollgate::client::Throttle;

    let server = RedisServer::start();
    let start = Instant::now();
    let admitted = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let leasing = RedisLimiter::builder("10/1s".parse().unwrap())
            .prefix("client-lease")
            .deny_cache(0)
            .lease(5)
            .connect(&server.url())
            .await
            .unwrap();
        let throttle = Throttle::new(leasing);
        for _ in 0..2 {
            let (throttle, admitted) = (throttle.clone(), Arc::clone(&admitted));
            tasks.push(tokio::spawn(async move {
                for _ in 0..5 {
                    throttle.acquire("provider").await.unwrap();
                    admitted.lock().unwrap().push(start.elapsed());
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    let admitted = admitted.lock().unwrap().clone();
    assert_eq!(admitted.len(), 20);
    // A burst of 10 between both instances, then one every 100 ms.
    let early = admitted
        .iter()
        .filter(|&&at| at < Duration::from_millis(500))
        .count();
    assert!((10..=14).contains(&early), "{early}: {admitted:?}");
    let last = admitted.iter().max().unwrap();
    assert!(*last >= Duration::from_millis(900), "{last:?}");
}

#[cfg(feature = "tower")]
#[tokio::test]
async fn a_call_dropped_during_its_round_trip_gives_its_permit_back() {
    use tollgate::client::Throttle;

    let server = RedisServer::start();
    let limiter = instance(&server, "sliding-log 1000/1min").await;
    let throttle = Throttle::new(limiter.clone());
    let mut admitted = 0;
    for i in 0..300u64 {
        // Give up somewhere between sending the call and reading its answer.
        let patience = Duration::from_micros(20 + (i * 37) % 400);
        if let Ok(Ok(_call)) = tokio::time::timeout(patience, throttle.acquire("provider")).await {
            admitted += 1;
        }
    }
    // Let the give-backs land.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let spent = 1_000 - limiter.available("provider").await.unwrap();
        if spent == admitted {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "spent {spent}, admitted {admitted}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        admitted < 300,
        "some calls must have been dropped mid-way: {admitted}"
    );
}

/// A throttle over a Redis limiter in shadow mode: every call goes at once, and settling a
/// call the policy would have refused (it holds nothing) is no error, as in process.
#[cfg(feature = "tower")]
#[tokio::test]
async fn a_throttle_over_a_shadow_limiter_settles_let_through_calls() {
    use tollgate::client::Throttle;

    let server = RedisServer::start();
    let limiter = RedisLimiter::builder("2/1h".parse().unwrap())
        .prefix("client-shadow")
        .deny_cache(0)
        .shadow()
        .connect(&server.url())
        .await
        .unwrap();
    let throttle = Throttle::new(limiter.clone());
    for _ in 0..4 {
        let call = tokio::time::timeout(Duration::from_secs(5), throttle.reserve_n("k", 1))
            .await
            .expect("a shadow budget never waits")
            .unwrap();
        call.settle(1).await.unwrap();
    }
    let stats = limiter.stats();
    assert_eq!((stats.allowed, stats.refused), (2, 2), "{stats:?}");
    assert_eq!(limiter.available("k").await.unwrap(), 0);
}
