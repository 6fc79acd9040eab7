//! Per-key policies on Redis (`RedisLimiterBuilder::resolver`): tiers exact across
//! instances, a tier change that carries spent permits exactly as the in-process
//! `set_policy` does, servers that disagree, reservations across a move, `reset`, the
//! settings refused, and tiered parts of a `RedisAllOf`.
//!
//! Needs `redis-server` on PATH (`scripts/install-redis.sh`); without it every test fails
//! saying so.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tollgate::redis::{BackendError, RedisAllOf, RedisLimiter, RedisLimiterBuilder};
use tollgate::{Decision, FakeClock, Policy, RateLimiter};

use crate::clocked::{at, limiter_at};
use crate::redis_server::RedisServer;

/// A frozen test clock's reading, in microseconds: ten whole minutes.
const T0: u64 = 600_000_000;

fn policy(text: &str) -> Policy {
    text.parse().unwrap()
}

/// A limiter on `server` at `clock`'s readings, without the deny cache, choosing each key's
/// policy with `resolver`, asked again on every request.
fn tiered(
    prefix: &str,
    clock: &FakeClock,
    resolver: impl Fn(&str) -> Policy + Send + Sync + 'static,
) -> RedisLimiterBuilder {
    RedisLimiter::builder(policy("1/1s"))
        .prefix(prefix)
        .test_clock(clock.clone())
        .deny_cache(0)
        .timeout(Duration::from_secs(10))
        .resolver(resolver)
        .resolver_cache(1_000, Duration::ZERO)
}

/// How many script calls the server has run (`FCALL`, `EVALSHA` and `EVAL`).
fn script_calls(server: &RedisServer) -> u64 {
    ["fcall", "evalsha", "eval"]
        .iter()
        .map(|command| server.command_stat(command, "calls") as u64)
        .sum()
}

/// What can be compared between a decision made in Redis and one made in process (Redis
/// counts in microseconds).
fn fields(d: &Decision) -> (bool, u64, u64, u128, u128) {
    let micros = |t: Duration| t.as_nanos().div_ceil(1_000);
    (
        d.is_allowed(),
        d.remaining(),
        d.limit(),
        micros(d.retry_after()),
        micros(d.reset_after()),
    )
}

/// Key "k"'s peek, then its request of `cost`, on Redis and in process: the same fields.
async fn decide_alike(
    remote: &RedisLimiter,
    near: &RateLimiter<String, FakeClock>,
    cost: u64,
    label: &str,
) {
    assert_eq!(
        fields(&remote.peek("k").await.unwrap()),
        fields(&near.peek("k")),
        "{label}: peek"
    );
    let r = remote.try_acquire_n("k", cost).await.unwrap();
    let l = near.try_acquire_n("k", cost).unwrap();
    assert_eq!(fields(&r), fields(&l), "{label}, cost {cost}");
}

/// Four instances x eight tasks, started together on a frozen clock, hammer a free user's
/// key and a paid user's: each admits exactly its tier's permits, and every decision
/// reports its tier's limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tiers_are_exact_across_four_instances() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let resolve = |user: &str| {
        if user.starts_with("paid-") {
            policy("25/1h & sliding-log 40/1d")
        } else {
            policy("7/1h")
        }
    };
    let mut limiters = Vec::new();
    for _ in 0..4 {
        let limiter = tiered("tiers", &clock, resolve)
            .resolver_cache(100, Duration::from_secs(60))
            .connect(&server.url())
            .await
            .unwrap();
        limiters.push(limiter);
    }
    let admitted = [Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0))];
    let start = Arc::new(tokio::sync::Barrier::new(32));
    let mut handles = Vec::new();
    for limiter in &limiters {
        for _ in 0..8 {
            let (limiter, admitted, start) =
                (limiter.clone(), admitted.clone(), Arc::clone(&start));
            handles.push(tokio::spawn(async move {
                start.wait().await;
                for i in 0..10 {
                    let (key, limit, counter) = if i % 2 == 0 {
                        ("free-1", 7, &admitted[0])
                    } else {
                        ("paid-1", 25, &admitted[1])
                    };
                    let d = limiter.try_acquire(key).await.unwrap();
                    assert_eq!(d.limit(), limit, "{key}: {d:?}");
                    if d.is_allowed() {
                        counter.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
    }
    for handle in handles {
        handle.await.unwrap();
    }
    assert_eq!(admitted[0].load(Ordering::Relaxed), 7);
    assert_eq!(admitted[1].load(Ordering::Relaxed), 25);
    assert_eq!(
        limiters[0].policy_of("paid-2").unwrap(),
        policy("25/1h & sliding-log 40/1d")
    );
    assert!(limiters.iter().all(|l| l.stats().policy_moves == 0));
    let keys = limiters[0].redis_keys("free-1");
    assert_eq!(keys, ["tiers:{free-1}:tb:7/1h", "tiers:{free-1}:policy"]);
    // The record: when the policy was chosen (us), and the policy.
    assert_eq!(
        server.command(&["GET", &keys[1]]).text(),
        format!("{T0}|token-bucket 7/1h")
    );
}

/// The policy pairs a key is moved between: every algorithm on each side, composites, a
/// band kept, shorter and longer windows.
const MOVES: [(&str, &str); 7] = [
    ("10/1s", "4/1s"),
    ("10/1s", "20/2s"),
    ("sliding-log 8/1s", "5/1s & 100/1h"),
    ("sliding-counter 30/1min", "10/1s"),
    ("5/1s & 50/1min", "5/1s & sliding-counter 20/10s"),
    ("5/1s", "sliding-log 12/1s"),
    ("4/100ms & 40/10s", "sliding-counter 9/1s"),
];

/// A key spends under one policy, then its resolver's answer changes: its next requests
/// decide exactly as an in-process limiter whose `set_policy` moved it at that instant,
/// step by step, for requests of varying costs and pauses (and so does every peek).
#[tokio::test]
async fn a_tier_change_carries_spent_permits_as_set_policy_does() {
    let server = RedisServer::start();
    for (n, (from, to)) in MOVES.iter().enumerate() {
        let clock = FakeClock::new();
        at(&clock, T0);
        let tier = Arc::new(AtomicUsize::new(0));
        let (p, q) = (policy(from), policy(to));
        let answer = Arc::clone(&tier);
        let remote = tiered(&format!("move-{n}"), &clock, move |_: &str| {
            if answer.load(Ordering::Relaxed) == 0 {
                p
            } else {
                q
            }
        })
        .connect(&server.url())
        .await
        .unwrap();
        let near: RateLimiter<String, FakeClock> = RateLimiter::with_clock(p, clock.clone());
        let mut seed = 11 + n as u64;
        let mut next = |bound: u64| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (seed >> 33) % bound
        };
        for step in 0..120 {
            if step == 40 {
                // The new answer is chosen later than the record was written.
                clock.advance(Duration::from_millis(1));
                tier.store(1, Ordering::Relaxed);
                near.set_policy(q);
            }
            let least = |p: Policy| p.bands().map(|band| band.permits()).min().unwrap();
            let max = if step < 40 { least(p) } else { least(q) };
            let cost = 1 + next(max.min(3));
            decide_alike(
                &remote,
                &near,
                cost,
                &format!("{from} -> {to}: step {step}"),
            )
            .await;
            clock.advance(Duration::from_millis(next(150)));
        }
        assert_eq!(remote.stats().policy_moves, 1, "{from} -> {to}");
    }
}

/// A key moved back and forth between two policies decides, request by request, exactly
/// as an in-process limiter whose `set_policy` made the same moves at the same instants:
/// what a move could not carry (above the new limit, or in an old band of a longer window)
/// is kept, and counted again by the next move, so a change undone within a window gives
/// nothing back (every pair of `MOVES` and more, each way, four moves).
#[tokio::test]
async fn round_trips_keep_what_a_move_could_not_carry_as_set_policy_does() {
    let server = RedisServer::start();
    let pairs = MOVES.iter().copied().chain([
        ("10/1h", "3/1h"),
        ("10/1h & 20/1d", "3/1min"),
        ("sliding-counter 30/1s", "50/2s"),
        ("sliding-counter 12/400ms", "sliding-log 20/1s"),
        ("sliding-log 6/1s & 8/10s", "4/500ms & sliding-counter 7/5s"),
        // Windows a little apart: each move counts a permit in use once.
        ("sliding-log 5/1s", "sliding-log 5/1100ms"),
        ("5/1s", "5/1250ms"),
    ]);
    for (n, (from, to)) in pairs.enumerate() {
        for (first, second) in [(from, to), (to, from)] {
            let clock = FakeClock::new();
            at(&clock, T0);
            let tier = Arc::new(AtomicUsize::new(0));
            let policies = [policy(first), policy(second)];
            let answer = Arc::clone(&tier);
            let remote = tiered(&format!("trip-{n}-{first}"), &clock, move |_: &str| {
                policies[answer.load(Ordering::Relaxed) % 2]
            })
            .connect(&server.url())
            .await
            .unwrap();
            let near: RateLimiter<String, FakeClock> =
                RateLimiter::with_clock(policies[0], clock.clone());
            let mut seed = 7 + n as u64;
            let mut next = |bound: u64| {
                seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                (seed >> 33) % bound
            };
            for step in 0..150 {
                if step > 0 && step % 30 == 0 {
                    // Each answer is chosen later than the record was written.
                    clock.advance(Duration::from_millis(1));
                    let moves = tier.fetch_add(1, Ordering::Relaxed) + 1;
                    near.set_policy(policies[moves % 2]);
                }
                let now = policies[tier.load(Ordering::Relaxed) % 2];
                let least = now.bands().map(|band| band.permits()).min().unwrap();
                let cost = 1 + next(least.min(3));
                let label = format!("{first} <-> {second}: step {step}");
                decide_alike(&remote, &near, cost, &label).await;
                clock.advance(Duration::from_millis(next(40)));
            }
            assert_eq!(remote.stats().policy_moves, 4, "{first} <-> {second}");
        }
    }
}

/// On a frozen clock, a key that spent its 10 of `10/1h` and was moved to `3/1h` and back
/// three times has nothing left: no move gives back what the policy in between could not
/// count. After a reset it has its 10 again (what was kept goes with the state).
#[tokio::test]
async fn a_round_trip_gives_nothing_back_and_a_reset_forgets_what_was_kept() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let tier = Arc::new(AtomicUsize::new(0));
    let answer = Arc::clone(&tier);
    let limiter = tiered("frozen-trip", &clock, move |_: &str| {
        policy(["10/1h", "3/1h"][answer.load(Ordering::Relaxed) % 2])
    })
    .connect(&server.url())
    .await
    .unwrap();
    let mut admitted = 0;
    for _ in 0..4 {
        for _ in 0..20 {
            admitted += u64::from(limiter.try_acquire("k").await.unwrap().is_allowed());
        }
        clock.advance(Duration::from_micros(1));
        tier.fetch_add(1, Ordering::Relaxed);
        for _ in 0..20 {
            admitted += u64::from(limiter.try_acquire("k").await.unwrap().is_allowed());
        }
        clock.advance(Duration::from_micros(1));
        tier.fetch_add(1, Ordering::Relaxed);
    }
    assert_eq!(admitted, 10);
    assert_eq!(limiter.stats().policy_moves, 7);
    assert!(limiter.reset("k").await.unwrap());
    let kept = "frozen-trip:{k}:kept";
    assert_eq!(server.command(&["EXISTS", kept]).int(), 0);
    assert_eq!(limiter.available("k").await.unwrap(), 10);
}

/// On Redis's own clock, a key's record outlives what its move kept: moved from
/// `sliding-log 10/10s` to `3/10ms`, whose record alone would expire after about two
/// seconds, and back after three, it still has nothing left.
#[tokio::test]
async fn the_record_outlives_what_was_kept() {
    let server = RedisServer::start();
    let tier = Arc::new(AtomicUsize::new(0));
    let answer = Arc::clone(&tier);
    let limiter = RedisLimiter::builder(policy("1/1s"))
        .prefix("kept-ttl")
        .deny_cache(0)
        .timeout(Duration::from_secs(10))
        .resolver(move |_: &str| {
            policy(["sliding-log 10/10s", "3/10ms"][answer.load(Ordering::Relaxed)])
        })
        .resolver_cache(1_000, Duration::ZERO)
        .connect(&server.url())
        .await
        .unwrap();
    for _ in 0..10 {
        assert!(limiter.try_acquire("k").await.unwrap().is_allowed());
    }
    tier.store(1, Ordering::Relaxed);
    // Moved: the 3/10ms band cannot count the 10s band's permits; they are kept.
    assert!(limiter.try_acquire("k").await.unwrap().is_allowed());
    let kept = server.command(&["PTTL", "kept-ttl:{k}:kept"]).int();
    let record = server.command(&["PTTL", "kept-ttl:{k}:policy"]).int();
    assert!(kept > 9_000, "kept for {kept} ms");
    assert!(record >= kept, "record {record} ms, kept {kept} ms");
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    tier.store(0, Ordering::Relaxed);
    let d = limiter.try_acquire("k").await.unwrap();
    assert!(!d.is_allowed(), "{d:?}");
    assert_eq!(limiter.stats().policy_moves, 2);
}

/// Two servers whose resolvers disagree about a key (each caches its own answer for a
/// minute): the answer that changed last wins. The server whose answer is older decides
/// under the newer policy, never moving the key back, also when it asks its resolver again
/// and gets the same answer; when its answer changes, that newer answer moves the key, once,
/// carrying the permits in use (at most the new policy's).
#[tokio::test]
async fn the_latest_answer_wins_between_servers() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let small_answer = Arc::new(AtomicUsize::new(0));
    let answer = Arc::clone(&small_answer);
    let small = tiered("disagree", &clock, move |_: &str| {
        policy(["5/1h", "3/1h"][answer.load(Ordering::Relaxed)])
    })
    .resolver_cache(100, Duration::from_secs(60))
    .connect(&server.url())
    .await
    .unwrap();
    let large = tiered("disagree", &clock, |_: &str| policy("8/1h"))
        .resolver_cache(100, Duration::from_secs(60))
        .connect(&server.url())
        .await
        .unwrap();
    assert!(small.try_acquire("k").await.unwrap().is_allowed());
    clock.advance(Duration::from_millis(1));
    let mut admitted = 1;
    for i in 0..20 {
        let limiter = if i % 2 == 0 { &large } else { &small };
        let d = limiter.try_acquire("k").await.unwrap();
        assert_eq!(d.limit(), 8, "#{i}: decided under the newer policy: {d:?}");
        admitted += u64::from(d.is_allowed());
    }
    assert_eq!(admitted, 8);
    // Both ask their resolvers again: the same answers, so nothing moves.
    clock.advance(Duration::from_secs(61));
    for limiter in [&small, &large] {
        let d = limiter.try_acquire("k").await.unwrap();
        assert!(!d.is_allowed() && d.limit() == 8, "{d:?}");
    }
    assert_eq!(
        (small.stats().policy_moves, large.stats().policy_moves),
        (0, 1)
    );
    // The small server's answer changes: it is the latest, and moves the key back, once: 8
    // in use, carried as 3 (all of the new policy).
    small_answer.store(1, Ordering::Relaxed);
    clock.advance(Duration::from_secs(61));
    let d = small.try_acquire("k").await.unwrap();
    assert!(!d.is_allowed() && d.limit() == 3, "{d:?}");
    let d = large.try_acquire("k").await.unwrap();
    assert!(
        !d.is_allowed() && d.limit() == 3,
        "an older answer follows: {d:?}"
    );
    assert_eq!(
        (small.stats().policy_moves, large.stats().policy_moves),
        (1, 1)
    );
}

/// Two servers whose answers differ for good, each asking its resolver again every minute
/// and draining the key every 30 seconds for an hour: the key moves once (to the answer
/// that came last), so a long window is never wiped by moves back and forth, and no more is
/// admitted than that policy allows in the hour.
#[tokio::test]
async fn servers_that_keep_disagreeing_do_not_move_the_key_back_and_forth() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let cached = |answer: &'static str| {
        tiered("flap", &clock, move |_: &str| policy(answer))
            .resolver_cache(100, Duration::from_secs(60))
    };
    let hourly = cached("sliding-log 100/1h")
        .connect(&server.url())
        .await
        .unwrap();
    let per_minute = cached("10/1min").connect(&server.url()).await.unwrap();
    let mut admitted = 0u64;
    for step in 0..120 {
        for (second, limiter) in [&hourly, &per_minute].into_iter().enumerate() {
            if step == 0 && second == 1 {
                // The per-minute answer comes second: it is the one both servers apply.
                clock.advance(Duration::from_millis(1));
            }
            for _ in 0..20 {
                admitted += u64::from(limiter.try_acquire("k").await.unwrap().is_allowed());
            }
        }
        clock.advance(Duration::from_secs(30));
    }
    let moves = hourly.stats().policy_moves + per_minute.stats().policy_moves;
    assert_eq!(moves, 1, "{:?} {:?}", hourly.stats(), per_minute.stats());
    // The hourly policy's first 20, then 10 a minute for the hour (and the start's burst).
    assert!(admitted <= 20 + 10 + 60 * 10, "{admitted} admitted");
}

/// A reservation made before its key moved to another policy settles nothing after the
/// move (its marks belong to the old state): neither a refund nor a charge.
#[tokio::test]
async fn reservations_made_before_a_move_settle_nothing() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let tier = Arc::new(AtomicUsize::new(0));
    let answer = Arc::clone(&tier);
    let limiter = tiered("settle", &clock, move |_: &str| {
        policy(["10/1h", "20/1h"][answer.load(Ordering::Relaxed)])
    })
    .connect(&server.url())
    .await
    .unwrap();
    let refunded = limiter.reserve_n("k", 6).await.unwrap();
    let charged = limiter.reserve_n("k", 2).await.unwrap();
    // The new answer is chosen after the record's.
    clock.advance(Duration::from_millis(1));
    tier.store(1, Ordering::Relaxed);
    assert_eq!(
        limiter.available("k").await.unwrap(),
        20 - 8,
        "moved, 8 carried"
    );
    limiter.settle("k", refunded, 1).await.unwrap();
    limiter.settle("k", charged, 7).await.unwrap();
    assert_eq!(
        limiter.available("k").await.unwrap(),
        12,
        "neither settle applied"
    );
    // A reservation made after the move settles as usual.
    let r = limiter.reserve_n("k", 4).await.unwrap();
    limiter.settle("k", r, 1).await.unwrap();
    assert_eq!(limiter.available("k").await.unwrap(), 11);
}

/// `reset` deletes the state under the policy the record names (not only this server's
/// answer) and the record, and asks the resolver again; the settings a resolver cannot work
/// with are refused at connect, and an answer the scripts cannot decide is the request's
/// error.
#[tokio::test]
async fn reset_settings_and_unsupported_answers() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let asked = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&asked);
    let limiter = tiered("reset", &clock, move |key: &str| {
        counter.fetch_add(1, Ordering::Relaxed);
        if key == "odd" {
            // More than one permit per microsecond: beyond the backend's resolution.
            Policy::new(
                tollgate::Algorithm::TokenBucket,
                5,
                Duration::from_micros(2),
            )
            .unwrap()
        } else {
            policy("3/1h")
        }
    })
    .resolver_cache(10, Duration::from_secs(3600))
    .connect(&server.url())
    .await
    .unwrap();
    let other = tiered("reset", &clock, |_: &str| policy("5/1h"))
        .connect(&server.url())
        .await
        .unwrap();
    assert!(limiter.try_acquire_n("k", 2).await.unwrap().is_allowed());
    clock.advance(Duration::from_millis(1));
    // Moved to 5/1h, 3 in use.
    assert!(other.try_acquire("k").await.unwrap().is_allowed());
    assert_eq!(
        server.command(&["GET", "reset:{k}:policy"]).text(),
        format!("{}|token-bucket 5/1h", T0 + 1_000)
    );
    let before = asked.load(Ordering::Relaxed);
    assert!(limiter.reset("k").await.unwrap());
    assert_eq!(server.command(&["EXISTS", "reset:{k}:tb:5/1h"]).int(), 0);
    assert_eq!(server.command(&["EXISTS", "reset:{k}:tb:3/1h"]).int(), 0);
    assert_eq!(server.command(&["EXISTS", "reset:{k}:policy"]).int(), 0);
    assert_eq!(limiter.available("k").await.unwrap(), 3);
    assert_eq!(
        asked.load(Ordering::Relaxed),
        before + 1,
        "asked again after the reset"
    );

    let err = limiter.try_acquire("odd").await.unwrap_err();
    assert!(
        matches!(err, BackendError::UnsupportedPolicy { .. }),
        "{err}"
    );

    let leased = tiered("x", &clock, |_: &str| policy("3/1h"))
        .lease(10)
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
    let zero = tiered("x", &clock, |_: &str| policy("3/1h"))
        .resolver_cache(0, Duration::from_secs(1))
        .connect(&server.url())
        .await
        .unwrap_err();
    assert!(
        matches!(
            zero,
            BackendError::InvalidSetting {
                setting: "resolver_cache",
                ..
            }
        ),
        "{zero}"
    );
}

/// A part of a `RedisAllOf` whose limiter has a resolver is decided under its key's tier,
/// moved first when its record names another, in the same one decision.
#[tokio::test]
async fn tiered_parts_of_a_redis_all_of() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let global = limiter_at(&server, "100/1h", "global", &clock).await;
    let tier = Arc::new(AtomicUsize::new(0));
    let answer = Arc::clone(&tier);
    let per_user = tiered("user", &clock, move |_: &str| {
        policy(["2/1h", "4/1h"][answer.load(Ordering::Relaxed)])
    })
    .connect_shared(&global)
    .await
    .unwrap();
    let all = RedisAllOf::new()
        .key(&per_user, "alice")
        .key(&global, "all");
    assert!(all.try_acquire().await.unwrap().is_allowed());
    assert!(all.try_acquire().await.unwrap().is_allowed());
    let refused = all.try_acquire().await.unwrap();
    assert!(!refused.is_allowed() && refused.part() == 0, "{refused:?}");
    clock.advance(Duration::from_millis(1));
    tier.store(1, Ordering::Relaxed);
    let moved = all.try_acquire().await.unwrap();
    assert!(moved.is_allowed() && moved.limit() == 4, "{moved:?}");
    assert_eq!(per_user.stats().policy_moves, 1);
    assert!(all.try_acquire().await.unwrap().is_allowed());
    assert!(!all.try_acquire().await.unwrap().is_allowed());
    assert_eq!(
        global.available("all").await.unwrap(),
        96,
        "refusals spent nothing"
    );
}

/// Settles under per-key policies: a charge lands even when the reservation's token is gone
/// (as without a resolver: it only spends more), but not on a state another policy now
/// holds; a settle never writes a record for a policy the key is not under.
#[tokio::test]
async fn settles_apply_to_the_reservations_own_state_only() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let limiter = tiered("charges", &clock, |_: &str| policy("10/1h"))
        .connect(&server.url())
        .await
        .unwrap();
    let r = limiter.reserve_n("k", 1).await.unwrap();
    // The token is lost (an eviction, say); the record and state remain.
    server.command(&["DEL", "charges:{k}:reserved"]);
    limiter.settle("k", r, 10).await.unwrap();
    assert_eq!(
        limiter.available("k").await.unwrap(),
        0,
        "the charge landed"
    );

    let r = limiter.reserve_n("j", 2).await.unwrap();
    clock.advance(Duration::from_millis(1));
    let other = tiered("charges", &clock, |_: &str| policy("4/1h"))
        .connect(&server.url())
        .await
        .unwrap();
    assert!(
        other.try_acquire("j").await.unwrap().is_allowed(),
        "moved, 3 in use"
    );
    limiter.settle("j", r, 10).await.unwrap();
    assert_eq!(
        other.available("j").await.unwrap(),
        1,
        "no charge on the other's state"
    );
    assert!(
        server
            .command(&["GET", "charges:{j}:policy"])
            .text()
            .ends_with("|token-bucket 4/1h"),
        "the record still names the policy the key is under"
    );

    // A record lost while a reservation's token lives: the settle applies, and makes up no
    // record.
    let r = limiter.reserve_n("i", 3).await.unwrap();
    server.command(&["DEL", "charges:{i}:policy"]);
    limiter.settle("i", r, 1).await.unwrap();
    assert_eq!(server.command(&["EXISTS", "charges:{i}:policy"]).int(), 0);
}

/// A `RedisAllOf` checks each part's cost against the policy it is decided under when it
/// sends the call (the resolver may have answered another since the cost was first
/// checked), and follows or moves as many tiered parts as it has, each up to the limit of
/// one key.
#[tokio::test]
async fn tiered_parts_are_checked_and_moved_each_on_its_own() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let asked = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&asked);
    let shrinking = tiered("shrink", &clock, move |_: &str| {
        let first = counter.fetch_add(1, Ordering::Relaxed) == 0;
        policy(if first { "10/1h" } else { "2/1h" })
    })
    .connect(&server.url())
    .await
    .unwrap();
    let refused = RedisAllOf::new()
        .key_n(&shrinking, "k", 5)
        .try_acquire()
        .await
        .unwrap();
    assert!(!refused.is_allowed(), "{refused:?}");
    assert!(asked.load(Ordering::Relaxed) >= 2);
    assert_eq!(
        server.command(&["EXISTS", "shrink:{k}:policy"]).int(),
        0,
        "nothing sent"
    );

    // Four parts whose keys another server moved to its policy, chosen later: each is
    // followed, in one decision.
    let mut mine = Vec::new();
    let mut theirs = Vec::new();
    for i in 0..4 {
        let prefix = format!("four-{i}");
        mine.push(
            tiered(&prefix, &clock, |_: &str| policy("5/1h"))
                .resolver_cache(100, Duration::from_secs(3600))
                .connect(&server.url())
                .await
                .unwrap(),
        );
        assert!(mine[i].try_acquire("k").await.unwrap().is_allowed());
    }
    clock.advance(Duration::from_millis(1));
    for i in 0..4 {
        let other = tiered(&format!("four-{i}"), &clock, |_: &str| policy("7/1h"))
            .connect(&server.url())
            .await
            .unwrap();
        assert!(other.try_acquire("k").await.unwrap().is_allowed());
        theirs.push(other);
    }
    let lead = &mine[0];
    let mut shared = Vec::new();
    for i in 1..4 {
        shared.push(
            tiered(&format!("four-{i}"), &clock, |_: &str| policy("5/1h"))
                .resolver_cache(100, Duration::from_secs(3600))
                .connect_shared(lead)
                .await
                .unwrap(),
        );
    }
    let mut all = RedisAllOf::new().key(lead, "k");
    for limiter in &shared {
        all = all.key(limiter, "k");
    }
    let d = all.try_acquire().await.unwrap();
    assert!(d.is_allowed() && d.limit() == 7, "{d:?}");
    // Followed from now on: one script call, no failed call first.
    let before = script_calls(&server);
    assert!(all.try_acquire().await.unwrap().is_allowed());
    assert_eq!(script_calls(&server), before + 1);
    assert_eq!(theirs[0].available("k").await.unwrap(), 3);
}

/// Two servers configured with the same policy written two ways agree: a key's record names
/// a policy by its plain form, so nothing moves.
#[tokio::test]
async fn equal_policies_written_differently_are_one() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let a = tiered("same", &clock, |_: &str| policy("10/s burst 100"))
        .connect(&server.url())
        .await
        .unwrap();
    clock.advance(Duration::from_millis(1));
    let b = tiered("same", &clock, |_: &str| policy("100/10s"))
        .connect(&server.url())
        .await
        .unwrap();
    for i in 0..20 {
        clock.advance(Duration::from_millis(1));
        let limiter = if i % 2 == 0 { &a } else { &b };
        assert!(limiter.try_acquire("k").await.unwrap().is_allowed());
    }
    assert_eq!(a.stats().policy_moves + b.stats().policy_moves, 0);
}

/// On Redis's own clock, a key's record outlives its state, even a token bucket charged to
/// twice its burst (whose interval, rounded up to microseconds, makes the burst up to twice
/// the window).
#[tokio::test]
async fn records_outlive_their_states() {
    let server = RedisServer::start();
    let limiter = RedisLimiter::builder(policy("1/1s"))
        .prefix("ttl")
        .deny_cache(0)
        .resolver(|_: &str| policy("900000/1s"))
        .connect(&server.url())
        .await
        .unwrap();
    let r = limiter.reserve_n("k", 1).await.unwrap();
    // The record, written with the reservation, has aged when the charge lands: the charge
    // does not rewrite it while it has a state's life left.
    tokio::time::sleep(Duration::from_millis(2_900)).await;
    limiter.settle("k", r, 4_000_000).await.unwrap();
    let keys = limiter.redis_keys("k");
    let state = server.command(&["PTTL", &keys[0]]).int();
    let record = server.command(&["PTTL", &keys[1]]).int();
    assert!(state > 3_000, "the state counts for {state} ms");
    assert!(record > state, "record {record} ms, state {state} ms");
}

/// A peek answers what a request would get, as in process: for a key whose record names an
/// older policy, it moves the key first (the one write a peek makes), so that a reservation
/// made before gets no refund after it.
#[tokio::test]
async fn a_peek_moves_a_key_as_a_request_would() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let tier = Arc::new(AtomicUsize::new(0));
    let answer = Arc::clone(&tier);
    let limiter = tiered("peeks", &clock, move |_: &str| {
        policy(["4/1h", "8/1h"][answer.load(Ordering::Relaxed)])
    })
    .connect(&server.url())
    .await
    .unwrap();
    let r = limiter.reserve_n("k", 3).await.unwrap();
    clock.advance(Duration::from_millis(1));
    tier.store(1, Ordering::Relaxed);
    let peeked = limiter.peek("k").await.unwrap();
    assert_eq!((peeked.limit(), peeked.remaining()), (8, 4), "{peeked:?}");
    assert_eq!(limiter.stats().policy_moves, 1);
    limiter.settle("k", r, 1).await.unwrap();
    assert_eq!(
        limiter.available("k").await.unwrap(),
        5,
        "no refund after the move"
    );
}

/// A tier change reaches a key whose answer was dropped from a full resolver cache: its
/// refusal cached under the old tier is forgotten with the answer it had, rather than kept
/// for the old tier's whole wait.
#[tokio::test]
async fn a_tier_change_after_the_answer_was_dropped_is_not_hidden_by_the_deny_cache() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let tier = Arc::new(AtomicUsize::new(0));
    let answer = Arc::clone(&tier);
    let limiter = RedisLimiter::builder(policy("1/1s"))
        .prefix("dropped")
        .test_clock(clock.clone())
        .timeout(Duration::from_secs(10))
        .resolver(move |key: &str| match key {
            "k" => policy(["1/1h", "100/1h"][answer.load(Ordering::Relaxed)]),
            _ => policy("100/1h"),
        })
        .resolver_cache(1, Duration::from_secs(60))
        .connect(&server.url())
        .await
        .unwrap();
    assert!(limiter.try_acquire("k").await.unwrap().is_allowed());
    assert!(
        !limiter.try_acquire("k").await.unwrap().is_allowed(),
        "1/1h spent: cached"
    );
    tier.store(1, Ordering::Relaxed);
    clock.advance(Duration::from_millis(1));
    // Another key takes the resolver cache's one place: k's answer is dropped.
    assert!(limiter.try_acquire("other").await.unwrap().is_allowed());
    clock.advance(Duration::from_millis(1));
    let decision = limiter.try_acquire("k").await.unwrap();
    assert!(
        decision.is_allowed(),
        "k under 100/1h, one spent: {decision:?}"
    );
    assert_eq!(decision.remaining(), 98);
}

/// On Redis's clock, with live policies: a key spends 10 of `sliding-log 10/20s`, is moved
/// to `3/10ms` (the 10 are kept for 20 s, the record kept as long), and `3/10ms` is applied
/// again (as a service re-applying its configuration does). The record, dated anew, keeps
/// its life: moved back 2.5 s later, the key has nothing, as in process.
#[tokio::test]
async fn a_policy_applied_again_does_not_shorten_the_record_below_what_is_kept() {
    let server = RedisServer::start();
    let (wide, tight) = (policy("sliding-log 10/20s"), policy("3/10ms"));
    let limiter = RedisLimiter::builder(wide)
        .prefix("reapply")
        .deny_cache(0)
        .timeout(Duration::from_secs(10))
        .live_policy()
        .connect(&server.url())
        .await
        .unwrap();
    let clock = FakeClock::new();
    at(&clock, T0);
    let near: RateLimiter<String, FakeClock> = RateLimiter::with_clock(wide, clock.clone());
    for _ in 0..10 {
        assert!(limiter.try_acquire("k").await.unwrap().is_allowed());
        assert!(near.try_acquire("k").is_allowed());
    }
    for _ in 0..2 {
        limiter.set_policy(tight).await.unwrap();
        near.set_policy(tight);
        assert!(limiter.try_acquire("k").await.unwrap().is_allowed());
        assert!(near.try_acquire("k").is_allowed());
    }
    let pttl = |key: &str| server.command(&["PTTL", key]).int();
    let (kept, record) = (pttl("reapply:{k}:kept"), pttl("reapply:{k}:policy"));
    assert!(
        kept > 15_000 && record >= kept,
        "kept {kept} ms, record {record} ms"
    );
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    clock.advance(Duration::from_millis(2_500));
    limiter.set_policy(wide).await.unwrap();
    near.set_policy(wide);
    let (mut remote, mut local) = (0, 0);
    for _ in 0..10 {
        remote += u64::from(limiter.try_acquire("k").await.unwrap().is_allowed());
        local += u64::from(near.try_acquire("k").is_allowed());
    }
    assert_eq!((remote, local), (0, 0));
}

/// Allowed, remaining and limit alike; times within 50 us (Redis counts a token bucket's
/// interval in whole microseconds, which alone moves them a little).
fn close(a: &Decision, b: &Decision) -> bool {
    let (x, y) = (fields(a), fields(b));
    (x.0, x.1, x.2) == (y.0, y.1, y.2) && x.3.abs_diff(y.3) <= 50 && x.4.abs_diff(y.4) <= 50
}

/// A key moved at random between three policies of up to four bands each (what is kept
/// folded at eight bands, a carry at four), with pauses short and long against the
/// windows (so that states are also built from kept permits alone), decides as the
/// in-process limiter whose `set_policy` made the same moves at the same instants.
#[tokio::test]
async fn random_moves_between_policies_of_many_bands_decide_as_set_policy_does() {
    let server = RedisServer::start();
    let sets: [[&str; 3]; 6] = [
        [
            "1/10ms & 2/100ms & 3/1s & 4/10s",
            "sliding-counter 5/20ms & sliding-log 7/200ms & 9/2s & 11/20s",
            "sliding-log 2/30ms & 4/300ms & 6/3s & 8/30s",
        ],
        ["10/1h", "3/1h", "sliding-counter 5/10s & 4/1min"],
        [
            "sliding-log 6/50ms & 20/5s",
            "sliding-counter 12/40ms & 30/4s & sliding-log 40/40s",
            "3/7ms & 9/70ms & 27/700ms & 81/7s",
        ],
        [
            "sliding-counter 7/100ms",
            "sliding-counter 9/300ms & sliding-counter 20/3s",
            "sliding-log 4/100ms & 8/1s",
        ],
        [
            "5/1s & 50/1min",
            "5/1s & sliding-counter 20/10s",
            "2/250ms & 100/1h",
        ],
        [
            "8/10ms & 16/20ms & 32/40ms & 64/80ms",
            "sliding-log 3/15ms & 6/30ms & 12/60ms & 24/120ms",
            "sliding-counter 4/25ms & 8/50ms & 16/100ms & 32/200ms",
        ],
    ];
    for (s, set) in sets.iter().enumerate() {
        for run in 0..8_u64 {
            let clock = FakeClock::new();
            at(&clock, T0);
            let policies = set.map(policy);
            let tier = Arc::new(AtomicUsize::new(0));
            let answer = Arc::clone(&tier);
            let remote = tiered(&format!("random-{s}-{run}"), &clock, move |_: &str| {
                policies[answer.load(Ordering::Relaxed)]
            })
            .connect(&server.url())
            .await
            .unwrap();
            let near: RateLimiter<String, FakeClock> =
                RateLimiter::with_clock(policies[0], clock.clone());
            let mut seed = 1 + 977 * run + 31 * s as u64;
            let mut next = |bound: u64| {
                seed = seed
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                (seed >> 33) % bound
            };
            let mut moves = Vec::new();
            for step in 0..300 {
                if next(8) == 0 {
                    clock.advance(Duration::from_micros(1 + next(3)));
                    let to = (tier.load(Ordering::Relaxed) + 1 + next(2) as usize) % 3;
                    tier.store(to, Ordering::Relaxed);
                    near.set_policy(policies[to]);
                    moves.push((step, set[to]));
                }
                let now = policies[tier.load(Ordering::Relaxed)];
                let least = now.bands().map(|band| band.permits()).min().unwrap();
                let cost = 1 + next(least);
                let (r, l) = (remote.peek("k").await.unwrap(), near.peek("k"));
                assert!(
                    close(&r, &l),
                    "set {s} run {run} step {step}: peek {:?} in process {:?} after {moves:?}",
                    fields(&r),
                    fields(&l)
                );
                let r = remote.try_acquire_n("k", cost).await.unwrap();
                let l = near.try_acquire_n("k", cost).unwrap();
                assert!(
                    close(&r, &l),
                    "set {s} run {run} step {step} cost {cost}: {:?} in process {:?} after {moves:?}",
                    fields(&r),
                    fields(&l)
                );
                let pause = match next(20) {
                    0 => next(40_000_000),
                    1..=2 => next(3_000_000),
                    3..=6 => next(200_000),
                    _ => next(20_000),
                };
                clock.advance(Duration::from_micros(pause));
            }
        }
    }
}

/// A value at the kept key that this crate never writes (an instant far beyond any clock)
/// is not counted: the move goes through whole, rather than failing after its first writes
/// (the script's writes are not rolled back) and leaving the key failing on every request.
#[tokio::test]
async fn a_foreign_value_at_the_kept_key_does_not_break_a_move() {
    let server = RedisServer::start();
    let tier = Arc::new(AtomicUsize::new(0));
    let answer = Arc::clone(&tier);
    let limiter = RedisLimiter::builder(policy("1/1s"))
        .prefix("foreign")
        .deny_cache(0)
        .timeout(Duration::from_secs(10))
        .resolver(move |_: &str| policy(["7/1h", "3/1h"][answer.load(Ordering::Relaxed)]))
        .resolver_cache(1_000, Duration::ZERO)
        .connect(&server.url())
        .await
        .unwrap();
    for _ in 0..7 {
        assert!(limiter.try_acquire("k").await.unwrap().is_allowed());
    }
    server.command(&[
        "SET",
        "foreign:{k}:kept",
        "1000000:5:1:99999999999999999999999",
    ]);
    tokio::time::sleep(Duration::from_millis(2)).await;
    tier.store(1, Ordering::Relaxed);
    let moved = limiter.try_acquire("k").await.unwrap();
    assert!(!moved.is_allowed(), "7 spent: {moved:?}");
    assert!(server
        .command(&["GET", "foreign:{k}:policy"])
        .text()
        .ends_with("|token-bucket 3/1h"));
    assert_eq!(limiter.stats().policy_moves, 1);
}
