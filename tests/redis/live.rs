//! Live policy changes on Redis (`RedisLimiterBuilder::live_policy`, `RedisLimiter::set_policy`):
//! a change while 32 tasks on 4 instances hammer a key admits exactly what the carried rule
//! allows; the newest change of any server wins; servers read the stored policy when they
//! connect and once a second; limiters built without it refuse to set one.
//!
//! Needs `redis-server` on PATH (`scripts/install-redis.sh`); without it every test fails
//! saying so.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;

use tollgate::redis::{BackendError, RedisAllOf, RedisLimiter};
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
                // Until the change is made, and 20 requests more (a change that never comes
                // fails the test, rather than hanging it).
                let mut after = 0;
                for _ in 0..100_000 {
                    if after == 20 {
                        break;
                    }
                    let d = limiter.try_acquire("hot").await.unwrap();
                    if d.is_allowed() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    if changed.load(Ordering::Acquire) {
                        after += 1;
                    }
                    tokio::task::yield_now().await;
                }
                assert_eq!(after, 20, "the change never came");
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
    // B moves the key with its 3 spent; A, not having read B's policy, follows the key, and
    // takes the policy from its record.
    assert_eq!(b.available("k").await.unwrap(), 3);
    let d = a.try_acquire("k").await.unwrap();
    assert!(d.is_allowed() && d.limit() == 6, "{d:?}");
    assert_eq!(a.policy(), policy("6/1h"), "learned from the key's record");
    let c = live(&server, "newest", &clock).await;
    assert_eq!(c.policy(), policy("6/1h"), "read when it connected");
    assert_eq!(c.available("k").await.unwrap(), 2);
    // A's clock is behind B's: its change is older than the one stored, which it takes.
    at(&clock, T0);
    assert_eq!(a.set_policy(policy("9/1h")).await.unwrap(), policy("6/1h"));
    assert_eq!(a.policy(), policy("6/1h"));
    assert_eq!(
        server.command(&["GET", "newest:live-policy"]).text(),
        // Dated 2^52 us later than its instant: after every resolver's answer.
        format!("{}|token-bucket 6/1h", (1u64 << 52) + T0 + 1_000)
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
    // The default prefix is allowed (a warning is logged): a limiter alone on it works.
    let unnamed = RedisLimiter::builder(policy("10/1h"))
        .live_policy()
        .connect(&server.url())
        .await
        .unwrap();
    assert_eq!(
        unnamed.set_policy(policy("5/1h")).await.unwrap(),
        policy("5/1h")
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

/// Decisions through a `RedisAllOf` (and so a route of several rules) follow the keys'
/// records under live policies too: a change carries the permits spent, and a server that
/// has not read it follows a key already moved.
#[tokio::test]
async fn redis_all_of_follows_live_changes() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let url = server.url();
    let fresh = || {
        RedisLimiter::builder(policy("5/1min"))
            .prefix("all-live")
            .test_clock(clock.clone())
            .deny_cache(0)
            .live_policy()
            .connect(&url)
    };
    let first = fresh().await.unwrap();
    let stale = fresh().await.unwrap();
    for _ in 0..5 {
        assert!(first.try_acquire("k").await.unwrap().is_allowed());
    }
    clock.advance(Duration::from_millis(1));
    first.set_policy(policy("5/1h")).await.unwrap();
    let d = RedisAllOf::new()
        .key(&first, "k")
        .try_acquire()
        .await
        .unwrap();
    assert!(
        !d.is_allowed() && d.limit() == 5,
        "the 5 spent carried: {d:?}"
    );
    // Past the old minute: the stale server, not having read the change, follows the key.
    clock.advance(Duration::from_secs(61));
    let d = RedisAllOf::new()
        .key(&stale, "k")
        .try_acquire()
        .await
        .unwrap();
    assert!(!d.is_allowed(), "{d:?}");
    assert_eq!(
        stale.policy(),
        policy("5/1h"),
        "learned from the key's record"
    );
}

/// A policy set live outranks every resolver's answer, as `set_policy` replaces the resolver
/// in process: a server that has not read it yet may decide a new key under its resolver
/// for that moment, but once a server with the live policy moves the key, it stays there.
#[tokio::test]
async fn a_live_policy_outranks_resolvers() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let url = server.url();
    let fresh = || {
        RedisLimiter::builder(policy("100/1h"))
            .prefix("outrank")
            .test_clock(clock.clone())
            .deny_cache(0)
            .live_policy()
            .resolver(|_: &str| policy("100/1h"))
            .connect(&url)
    };
    let s1 = fresh().await.unwrap();
    let s2 = fresh().await.unwrap();
    s1.set_policy(policy("3/1h")).await.unwrap();
    clock.advance(Duration::from_millis(100));
    let mut admitted = 0;
    for _ in 0..10 {
        admitted += u64::from(s2.try_acquire("n").await.unwrap().is_allowed());
    }
    assert_eq!(
        admitted, 10,
        "s2 has not read the change: its resolver's answer"
    );
    assert!(
        !s1.try_acquire("n").await.unwrap().is_allowed(),
        "moved, 10 in use as 3"
    );
    for _ in 0..10 {
        let d = s2.try_acquire("n").await.unwrap();
        assert!(!d.is_allowed() && d.limit() == 3, "{d:?}");
    }
    assert_eq!(s2.policy(), policy("3/1h"));
    assert_eq!(s1.stats().policy_moves + s2.stats().policy_moves, 1);
}

/// A reservation made before a live change settles under the policy it was made under,
/// while the key's record still names it, and not after the key moved.
#[tokio::test]
async fn reservations_across_a_live_change() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let limiter = live(&server, "reserve-live", &clock).await;
    let before_move = limiter.reserve_n("k", 1).await.unwrap();
    let after_move = limiter.reserve_n("j", 1).await.unwrap();
    clock.advance(Duration::from_millis(1));
    limiter.set_policy(policy("20/1h")).await.unwrap();
    // k has not moved: the charge lands on its 10/1h state, then moves with it.
    limiter.settle("k", before_move, 9).await.unwrap();
    assert_eq!(limiter.available("k").await.unwrap(), 20 - 9);
    // j moves first: the charge no longer applies.
    assert_eq!(limiter.available("j").await.unwrap(), 19);
    limiter.settle("j", after_move, 9).await.unwrap();
    assert_eq!(limiter.available("j").await.unwrap(), 19);
}

/// Setting live a policy that is one of the resolver's tiers dates the keys' records anew:
/// a server that has not read the change, whose resolver answers another tier, follows it
/// rather than moving the keys away.
#[tokio::test]
async fn a_live_policy_equal_to_a_tier_outranks_the_resolvers() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let url = server.url();
    let fresh = |answer: &'static str| {
        RedisLimiter::builder(policy("100/1h"))
            .prefix("equal-tier")
            .test_clock(clock.clone())
            .deny_cache(0)
            .live_policy()
            .resolver(move |_: &str| policy(answer))
            .resolver_cache(100, Duration::from_secs(3600))
            .connect(&url)
    };
    let setter = fresh("3/1h").await.unwrap();
    assert!(setter.try_acquire("k").await.unwrap().is_allowed());
    let other = fresh("50/1h").await.unwrap();
    clock.advance(Duration::from_millis(1));
    setter.set_policy(policy("3/1h")).await.unwrap();
    assert!(setter.try_acquire("k").await.unwrap().is_allowed());
    clock.advance(Duration::from_millis(1));
    // `other` has not read the change; its answer (50/1h) dates from its first request,
    // later than the record's first date, but not than the policy set live.
    let d = other.try_acquire("k").await.unwrap();
    assert!(d.is_allowed() && d.limit() == 3, "{d:?}");
    assert!(!other.try_acquire("k").await.unwrap().is_allowed());
    assert_eq!(other.stats().policy_moves, 0);
}

/// With nothing set live, a limiter's configured policy is dated from when it was built: a
/// server deployed later with another policy moves the keys it serves, and the older
/// servers follow it and take it for every key; a stored policy that cannot be read is
/// counted, and changes nothing.
#[tokio::test]
async fn a_later_deploys_policy_wins_and_bad_stored_policies_are_counted() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let url = server.url();
    let deployed = |configured: &'static str| {
        RedisLimiter::builder(policy(configured))
            .prefix("deploys")
            .test_clock(clock.clone())
            .deny_cache(0)
            .live_policy()
            .connect(&url)
    };
    let old = deployed("4/1h").await.unwrap();
    for key in ["a", "b"] {
        assert!(old.try_acquire_n(key, 3).await.unwrap().is_allowed());
    }
    clock.advance(Duration::from_millis(1));
    let new = deployed("6/1h").await.unwrap();
    assert_eq!(new.available("a").await.unwrap(), 3, "moved, 3 of 6 spent");
    let d = old.try_acquire("a").await.unwrap();
    assert!(
        d.is_allowed() && d.limit() == 6,
        "the older server follows: {d:?}"
    );
    assert_eq!(old.policy(), policy("6/1h"), "and takes it");
    // It moves the keys it serves to it too.
    assert_eq!(old.available("b").await.unwrap(), 3);
    assert_eq!(old.stats().policy_moves, 1);

    server.command(&["SET", "deploys:live-policy", "not a policy"]);
    let third = deployed("6/1h").await.unwrap();
    assert_eq!(third.stats().policy_read_failures, 1);
    assert_eq!(third.policy(), policy("6/1h"));
}

/// A server whose requests cost more than its old policy allows still reads the policy set
/// live (at most a second late), rather than refuse every such cost for good: through
/// `try_acquire_n`, `reserve_n` and a `RedisAllOf`'s `try_acquire` and `reserve`.
#[tokio::test]
async fn a_cost_above_the_old_policy_reaches_the_new_one() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let url = server.url();
    for (case, prefix) in [
        (0, "lc-one"),
        (1, "lc-reserve"),
        (2, "lc-all"),
        (3, "lc-all-reserve"),
    ] {
        let five = || {
            RedisLimiter::builder(policy("5/1h"))
                .prefix(prefix)
                .test_clock(clock.clone())
                .timeout(Duration::from_secs(10))
                .deny_cache(0)
                .live_policy()
                .connect(&url)
        };
        let (a, b) = (five().await.unwrap(), five().await.unwrap());
        clock.advance(Duration::from_millis(1));
        assert_eq!(
            b.set_policy(policy("10/1h")).await.unwrap(),
            policy("10/1h")
        );
        assert!(
            b.try_acquire("k").await.unwrap().is_allowed(),
            "B moves k to 10/1h"
        );
        clock.advance(Duration::from_secs(5));
        let allowed = match case {
            0 => a.try_acquire_n("k", 8).await.unwrap().is_allowed(),
            1 => a.reserve_n("k", 8).await.unwrap().decision().is_allowed(),
            2 => RedisAllOf::new()
                .key_n(&a, "k", 8)
                .try_acquire()
                .await
                .unwrap()
                .is_allowed(),
            _ => RedisAllOf::new()
                .key_n(&a, "k", 8)
                .reserve()
                .await
                .unwrap()
                .decision()
                .is_allowed(),
        };
        assert!(allowed, "case {case}: 8 of the new 10, one spent");
    }
}

/// A request that chose its policy just before a live change (its resolver slow), and was
/// refused by Redis under the old one, does not cache that refusal after the change emptied
/// the deny cache: the key is not refused for the old policy's hour under the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refusal_under_the_old_policy_is_not_cached_across_a_live_change() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let armed = Arc::new(AtomicBool::new(false));
    let gate = Arc::new(Barrier::new(2));
    let (a2, g2) = (Arc::clone(&armed), Arc::clone(&gate));
    let a = RedisLimiter::builder(policy("1/1h"))
        .prefix("dc-race")
        .test_clock(clock.clone())
        .timeout(Duration::from_secs(10))
        .deny_cache(1_000)
        .live_policy()
        .resolver(move |_: &str| {
            if a2.swap(false, Ordering::SeqCst) {
                g2.wait(); // the request is inside tier_of
                g2.wait(); // set_policy has run
            }
            "1/1h".parse().unwrap()
        })
        .resolver_cache(1_000, Duration::ZERO)
        .connect(&server.url())
        .await
        .unwrap();
    assert!(a.try_acquire("k").await.unwrap().is_allowed());
    armed.store(true, Ordering::SeqCst);
    let racing = {
        let a = a.clone();
        tokio::spawn(async move { a.try_acquire("k").await.unwrap() })
    };
    let g = Arc::clone(&gate);
    tokio::task::spawn_blocking(move || g.wait()).await.unwrap();
    a.set_policy(policy("100/1h")).await.unwrap();
    let g = Arc::clone(&gate);
    tokio::task::spawn_blocking(move || g.wait()).await.unwrap();
    let raced = racing.await.unwrap();
    assert!(
        !raced.is_allowed(),
        "decided under the old policy: {raced:?}"
    );
    let after = a.try_acquire("k").await.unwrap();
    // Another server, without a deny cache, started after the change: what Redis answers.
    let plain = RedisLimiter::builder(policy("1/1h"))
        .prefix("dc-race")
        .test_clock(clock.clone())
        .timeout(Duration::from_secs(10))
        .deny_cache(0)
        .live_policy()
        .connect(&server.url())
        .await
        .unwrap();
    let redis = plain.peek("k").await.unwrap();
    assert!(redis.is_allowed());
    assert!(
        after.is_allowed(),
        "the deny cache refuses what the new policy admits: {after:?}, Redis: {redis:?}"
    );
}
