//! Live policy changes on Redis (`RedisLimiterBuilder::live_policy`, `RedisLimiter::set_policy`):
//! a change while 32 tasks on 4 instances hammer a key admits exactly what the carried rule
//! allows; the newest change of any server wins; servers read the stored policy when they
//! connect and once a second; limiters built without it refuse to set one.
//!
//! Needs `redis-server` on PATH (`scripts/install-redis.sh`); without it every test fails
//! saying so.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tollgate::redis::{BackendError, RedisLimiter};
use tollgate::{FakeClock, Policy};

use crate::clocked::at;
use crate::redis_server::RedisServer;

/// A frozen test clock's reading, in microseconds: ten whole minutes.
const T0: u64 = 600_000_000;

fn policy(text: &str) -> Policy {
    text.parse().unwrap()
}

async fn live(server: &RedisServer, prefix: &str, clock: &FakeClock) -> RedisLimiter {
    RedisLimiter::builder(policy("10/1h"))
        .prefix(prefix)
        .test_clock(clock.clone())
        .timeout(Duration::from_secs(10))
        .live_policy()
        .connect(&server.url())
        .await
        .unwrap()
}

/// Four instances x eight tasks, started together on a frozen clock, hammer one key of 10
/// per hour; once five are admitted, one instance raises the policy to 25 per hour. The
/// permits spent stay spent: exactly 25 are admitted in all, whichever instance decides
/// (those that have not read the new policy follow the key's record).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_change_while_32_tasks_hammer_admits_the_carried_rule() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let mut limiters = Vec::new();
    for _ in 0..4 {
        limiters.push(live(&server, "hammered", &clock).await);
    }
    let admitted = Arc::new(AtomicU64::new(0));
    let changed = Arc::new(AtomicBool::new(false));
    let start = Arc::new(tokio::sync::Barrier::new(33));
    let mut handles = Vec::new();
    for limiter in &limiters {
        for _ in 0..8 {
            let (limiter, admitted, changed, start) = (
                limiter.clone(),
                Arc::clone(&admitted),
                Arc::clone(&changed),
                Arc::clone(&start),
            );
            handles.push(tokio::spawn(async move {
                start.wait().await;
                // Until the change is made, and 20 requests more.
                let mut after = 0;
                while after < 20 {
                    let d = limiter.try_acquire("hot").await.unwrap();
                    if d.is_allowed() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    if changed.load(Ordering::Acquire) {
                        after += 1;
                    }
                    tokio::task::yield_now().await;
                }
            }));
        }
    }
    let changer = {
        let (limiter, admitted, changed, start) = (
            limiters[0].clone(),
            Arc::clone(&admitted),
            Arc::clone(&changed),
            Arc::clone(&start),
        );
        tokio::spawn(async move {
            start.wait().await;
            while admitted.load(Ordering::Relaxed) < 5 {
                tokio::task::yield_now().await;
            }
            let before = admitted.load(Ordering::Relaxed);
            let set = limiter.set_policy(policy("25/1h")).await.unwrap();
            assert_eq!(set, policy("25/1h"));
            changed.store(true, Ordering::Release);
            before
        })
    };
    for handle in handles {
        handle.await.unwrap();
    }
    let before = changer.await.unwrap();
    assert!(before <= 10, "{before} admitted before the change");
    assert_eq!(admitted.load(Ordering::Relaxed), 25);
    let moves: u64 = limiters.iter().map(|l| l.stats().policy_moves).sum();
    assert_eq!(moves, 1, "the key moved once");
    // A second on, every instance has read the stored policy.
    clock.advance(Duration::from_secs(1));
    for limiter in &limiters {
        let d = limiter.try_acquire("hot").await.unwrap();
        assert_eq!(d.limit(), 25, "{d:?}");
        assert_eq!(limiter.policy(), policy("25/1h"));
    }
}

/// Two servers set policies one after the other: the newer wins on every key and server,
/// a set_policy older than the one stored takes the stored one, and a server that connects
/// later starts with it.
#[tokio::test]
async fn the_newest_change_wins_everywhere() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let a = live(&server, "newest", &clock).await;
    let b = live(&server, "newest", &clock).await;
    assert_eq!(a.set_policy(policy("4/1h")).await.unwrap(), policy("4/1h"));
    assert!(a.try_acquire_n("k", 3).await.unwrap().is_allowed());
    clock.advance(Duration::from_millis(1));
    assert_eq!(b.set_policy(policy("6/1h")).await.unwrap(), policy("6/1h"));
    // B moves the key with its 3 spent; A, not having read B's policy, follows the key.
    assert_eq!(b.available("k").await.unwrap(), 3);
    let d = a.try_acquire("k").await.unwrap();
    assert!(d.is_allowed() && d.limit() == 6, "{d:?}");
    assert_eq!(a.policy(), policy("4/1h"), "not read yet");
    let c = live(&server, "newest", &clock).await;
    assert_eq!(c.policy(), policy("6/1h"), "read when it connected");
    assert_eq!(c.available("k").await.unwrap(), 2);
    // A's clock is behind B's: its change is older than the one stored, which it takes.
    at(&clock, T0);
    assert_eq!(a.set_policy(policy("9/1h")).await.unwrap(), policy("6/1h"));
    assert_eq!(a.policy(), policy("6/1h"));
    assert_eq!(
        server.command(&["GET", "newest:live-policy"]).text(),
        format!("{}|token-bucket 6/1h", T0 + 1_000)
    );

    let plain = RedisLimiter::builder(policy("10/1h"))
        .prefix("plain")
        .connect(&server.url())
        .await
        .unwrap();
    let err = plain.set_policy(policy("5/1h")).await.unwrap_err();
    assert!(
        matches!(
            err,
            BackendError::InvalidSetting {
                setting: "live_policy",
                ..
            }
        ),
        "{err}"
    );
    let unnamed = RedisLimiter::builder(policy("10/1h"))
        .live_policy()
        .connect(&server.url())
        .await
        .unwrap_err();
    assert!(
        matches!(
            unnamed,
            BackendError::InvalidSetting {
                setting: "prefix",
                ..
            }
        ),
        "{unnamed}"
    );
    let leased = RedisLimiter::builder(policy("10/1h"))
        .prefix("leased")
        .live_policy()
        .lease(5)
        .connect(&server.url())
        .await
        .unwrap_err();
    assert!(
        matches!(
            leased,
            BackendError::InvalidSetting {
                setting: "lease",
                ..
            }
        ),
        "{leased}"
    );
}
