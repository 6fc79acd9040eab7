//! Leases for hot keys (`RedisLimiterBuilder::lease`) against a real `redis-server`: the
//! decisions a lease makes against those Redis makes alone, how leases grow from one permit,
//! four instances hammering one key (never more admitted than the limit, at most the
//! outstanding leases fewer), leases given back when they expire, when their key goes quiet,
//! on `close` and on drop, a lease in hand while Redis is down, a Redis restarted mid-run, and
//! peek, costs above 1 and reset.
//!
//! Needs `redis-server` on PATH (`scripts/install-redis.sh`); without it every test fails
//! saying so.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::redis::{FailurePolicy, RedisLimiter};
use tollgate::{FakeClock, Policy};

use crate::clocked::at;
use crate::dying::in_a_process_that_dies;
use crate::redis_server::{RedisServer, Reply};

/// A frozen test clock's reading, in microseconds: one whole day, so every window of these
/// tests starts at it.
const T0: u64 = 86_400_000_000;

/// A limiter on `server` with leases of at most `max` permits, deciding at `clock`'s
/// readings when given; with `max` 0, no leases and no deny cache.
async fn limiter(
    server: &RedisServer,
    policy: &str,
    prefix: &str,
    max: u64,
    clock: Option<&FakeClock>,
) -> RedisLimiter {
    let mut builder = RedisLimiter::builder(policy.parse().unwrap())
        .prefix(prefix)
        .timeout(Duration::from_secs(10));
    if max == 0 {
        // A view of what Redis holds: no refusal remembered.
        builder = builder.deny_cache(0);
    } else {
        builder = builder.lease(max);
    }
    if let Some(clock) = clock {
        builder = builder.test_clock(clock.clone());
    }
    builder.connect(&server.url()).await.unwrap()
}

/// Permits of `key` that Redis counts spent, read through `plain`, a limiter without leases
/// on the same prefix, for a policy whose bands all have `permits` (on a frozen clock, or
/// a window long enough that nothing refills meanwhile).
async fn spent(plain: &RedisLimiter, key: &str, permits: u64) -> u64 {
    let d = plain.peek(key).await.unwrap();
    if d.is_allowed() {
        permits - 1 - d.remaining()
    } else {
        permits - d.remaining()
    }
}

/// Each algorithm that takes leases of more than one permit (a sliding log refuses them: see
/// `settings.rs`) and a composite, every band of 100 permits over at least an hour.
const POLICIES: &[&str] = &[
    "100/1h",
    "sliding-counter 100/1h",
    "100/1h & 100/2h & sliding-counter 100/1d",
];

/// On a frozen clock, one server with leases makes the decisions Redis alone makes, request
/// for request (allowed, remaining, limit; a lease's reset_after is no shorter, and its
/// refusals are Redis's), while Redis counts at most one lease more than was admitted; once
/// the leases are given back, Redis holds exactly the state it holds without them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_decides_as_redis_alone_would() {
    let server = RedisServer::start();
    for (i, policy) in POLICIES.iter().enumerate() {
        let clock = FakeClock::new();
        at(&clock, T0);
        let leasing = limiter(&server, policy, &format!("l{i}"), 16, Some(&clock)).await;
        let view = limiter(&server, policy, &format!("l{i}"), 0, Some(&clock)).await;
        let alone = limiter(&server, policy, &format!("a{i}"), 0, Some(&clock)).await;
        let mut admitted = 0;
        for call in 0..130 {
            if call == 20 {
                // Lease tokens exist where leases were taken, and only there.
                assert!(!keys(&server, &format!("l{i}:*:lease")).is_empty());
                assert!(keys(&server, &format!("a{i}:*:lease")).is_empty());
            }
            let with = leasing.try_acquire("k").await.unwrap();
            let without = alone.try_acquire("k").await.unwrap();
            assert_eq!(with.is_allowed(), without.is_allowed(), "{policy} #{call}");
            assert_eq!(with.remaining(), without.remaining(), "{policy} #{call}");
            assert_eq!(with.limit(), without.limit(), "{policy} #{call}");
            if with.is_allowed() {
                admitted += 1;
                assert!(
                    with.reset_after() >= without.reset_after(),
                    "{policy} #{call}: {with:?} {without:?}"
                );
            } else {
                assert_eq!(with, without, "{policy} #{call}: refusals are Redis's");
            }
            let counted = spent(&view, "k", 100).await;
            assert!(
                counted >= admitted && counted - admitted <= 16,
                "{policy} #{call}: Redis counts {counted}, {admitted} admitted"
            );
        }
        assert_eq!(admitted, 100, "{policy}");
        leasing.close().await.unwrap();
        assert_eq!(
            view.peek("k").await.unwrap(),
            alone.peek("k").await.unwrap(),
            "{policy}"
        );
        // Closed: no more leases, every request is Redis's.
        leasing.reset("k").await.unwrap();
        alone.reset("k").await.unwrap();
        for _ in 0..5 {
            assert_eq!(
                leasing.try_acquire("k").await.unwrap(),
                alone.try_acquire("k").await.unwrap()
            );
        }
        assert_eq!(spent(&view, "k", 100).await, 5, "{policy}");
    }
}

/// The Redis keys matching `pattern`.
fn keys(server: &RedisServer, pattern: &str) -> Vec<String> {
    match server.command(&["KEYS", pattern]) {
        Reply::Array(keys) => keys.iter().map(Reply::text).collect(),
        other => panic!("{other:?}"),
    }
}

/// A key's first request leases one permit and uses it: a cold key holds nothing. Leases
/// then double while each is spent within half the hold time, up to the maximum.
#[tokio::test]
async fn leases_start_at_one_permit_and_double_up_to_the_maximum() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let leasing = limiter(&server, "1000/1h", "grow", 64, Some(&clock)).await;
    let view = limiter(&server, "1000/1h", "grow", 0, Some(&clock)).await;
    let mut sizes = Vec::new();
    let mut leased = 0;
    for admitted in 1..=300 {
        assert!(leasing.try_acquire("k").await.unwrap().is_allowed());
        let now = leasing.stats().leased_permits;
        if now > leased {
            sizes.push(now - leased);
            leased = now;
        }
        let held = spent(&view, "k", 1000).await - admitted;
        assert!(held < 64, "{admitted}: {held} held");
        if admitted == 1 {
            assert_eq!(held, 0, "a cold key holds nothing");
        }
    }
    assert_eq!(sizes, [1, 2, 4, 8, 16, 32, 64, 64, 64, 64]);
    let stats = leasing.stats();
    assert_eq!(
        stats.redis_decisions, 10,
        "one round trip per lease: {stats:?}"
    );
    assert_eq!(stats.local_permits, 290, "{stats:?}");
    // A lease is never larger than the smallest band's permits.
    let small = limiter(&server, "5/1h", "small", 64, Some(&clock)).await;
    for _ in 0..5 {
        assert!(small.try_acquire("k").await.unwrap().is_allowed());
    }
    assert!(!small.try_acquire("k").await.unwrap().is_allowed());
}

/// Four instances, eight tasks each, hammer one key of 2,000 per hour for two seconds on
/// Redis's own clock: never more admitted than the 2,000 plus what refills meanwhile, and at
/// least the 2,000 minus the leases outstanding at the end (4 x 50). Then the leases go
/// back, and Redis counts exactly what was admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_instances_on_one_hot_key_admit_the_limit_less_the_outstanding_leases() {
    const RUN: Duration = Duration::from_secs(2);
    const MAX: u64 = 50;
    let server = RedisServer::start();
    for (i, policy) in [
        "2000/1h",
        "sliding-counter 2000/1h",
        "2000/1h & 2000/2h & sliding-counter 2000/1h",
    ]
    .into_iter()
    .enumerate()
    {
        let prefix = format!("hot{i}");
        let mut limiters = Vec::new();
        for _ in 0..4 {
            limiters.push(limiter(&server, policy, &prefix, MAX, None).await);
        }
        let start = Instant::now();
        let admitted = Arc::new(AtomicU64::new(0));
        let calls = Arc::new(AtomicU64::new(0));
        let mut handles = Vec::new();
        for limiter in &limiters {
            for _ in 0..8 {
                let limiter = limiter.clone();
                let (admitted, calls) = (Arc::clone(&admitted), Arc::clone(&calls));
                handles.push(tokio::spawn(async move {
                    while start.elapsed() < RUN {
                        if limiter.try_acquire("hot").await.unwrap().is_allowed() {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                        calls.fetch_add(1, Ordering::Relaxed);
                    }
                }));
            }
        }
        for handle in handles {
            handle.await.unwrap();
        }
        let elapsed = start.elapsed();
        let admitted = admitted.load(Ordering::Relaxed);
        // A permit every 1.8 s refills (the counter's previous window fades as fast), one
        // more for the rounding.
        let refill = elapsed.as_millis() as u64 / 1_800 + 1;
        assert!(
            admitted <= 2000 + refill,
            "{policy}: {admitted} admitted in {elapsed:?}"
        );
        let outstanding = 4 * MAX;
        assert!(
            admitted + outstanding >= 2000,
            "{policy}: only {admitted} admitted"
        );
        let stats: Vec<_> = limiters.iter().map(RedisLimiter::stats).collect();
        let local: u64 = stats.iter().map(|s| s.local_permits).sum();
        assert!(
            local * 2 > admitted,
            "{policy}: most admissions are local: {stats:?}"
        );
        for limiter in &limiters {
            limiter.close().await.unwrap();
        }
        let view = limiter(&server, policy, &prefix, 0, None).await;
        let d = view.peek("hot").await.unwrap();
        let available = d.remaining() + u64::from(d.is_allowed());
        assert!(
            available + admitted >= 2000 && available + admitted <= 2000 + 2 * refill,
            "{policy}: {available} available after {admitted} admitted"
        );
        println!(
            "{policy}: {admitted} admitted of {} calls, {local} from leases",
            calls.load(Ordering::Relaxed)
        );
    }
}

/// A lease untouched for a sweep or two is given back: on a frozen clock, Redis then counts
/// exactly what was admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_key_gives_its_lease_back() {
    let server = RedisServer::start();
    for (i, policy) in POLICIES.iter().enumerate() {
        let clock = FakeClock::new();
        at(&clock, T0);
        let leasing = limiter(&server, policy, &format!("quiet{i}"), 32, Some(&clock)).await;
        let view = limiter(&server, policy, &format!("quiet{i}"), 0, Some(&clock)).await;
        for _ in 0..40 {
            assert!(leasing.try_acquire("k").await.unwrap().is_allowed());
        }
        // Leases of 1, 2, 4, 8, 16 and 32: 63 taken, 23 held.
        assert_eq!(spent(&view, "k", 100).await, 63, "{policy}");
        let start = Instant::now();
        while spent(&view, "k", 100).await != 40 || leasing.stats().returned_permits != 23 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{policy}: the lease was not given back: {:?}",
                leasing.stats()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let stats = leasing.stats();
        assert_eq!(
            (
                stats.leased_permits,
                stats.returned_permits,
                stats.local_permits
            ),
            (63, 23, 34),
            "{policy}: {stats:?}"
        );
    }
}

/// A lease admits nothing after its hold time (a tenth of the shortest window): the next
/// request gives it back and takes a new one. Redis then counts exactly what a server without
/// leases would have.
#[tokio::test]
async fn an_expired_lease_is_given_back_by_the_next_request() {
    let server = RedisServer::start();
    for (i, policy) in POLICIES.iter().enumerate() {
        let clock = FakeClock::new();
        at(&clock, T0);
        let leasing = limiter(&server, policy, &format!("exp{i}"), 32, Some(&clock)).await;
        let view = limiter(&server, policy, &format!("exp{i}"), 0, Some(&clock)).await;
        let alone = limiter(&server, policy, &format!("alone{i}"), 0, Some(&clock)).await;
        for _ in 0..40 {
            assert!(leasing.try_acquire("k").await.unwrap().is_allowed());
            assert!(alone.try_acquire("k").await.unwrap().is_allowed());
        }
        assert_eq!(spent(&view, "k", 100).await, 63, "{policy}");
        // The shortest window is an hour: the hold time 6 minutes.
        at(&clock, T0 + 360_000_000 - 1);
        let from_lease = leasing.peek("k").await.unwrap();
        assert!(from_lease.is_allowed(), "{policy}: still live, 23 held");
        // What Redis reported when the lease was taken, counted down by the lease: never
        // more than Redis reports now (a token bucket has refilled meanwhile).
        assert!(
            from_lease.remaining() <= alone.peek("k").await.unwrap().remaining(),
            "{policy}"
        );
        at(&clock, T0 + 360_000_000);
        assert_eq!(
            leasing.peek("k").await.unwrap(),
            view.peek("k").await.unwrap(),
            "{policy}: expired, a peek asks Redis"
        );
        let with = leasing.try_acquire("k").await.unwrap();
        let without = alone.try_acquire("k").await.unwrap();
        assert_eq!(with.remaining(), without.remaining(), "{policy}");
        // 23 of the 32 came back; the next lease is half as large (16), 15 of it held.
        assert_eq!(
            view.peek("k").await.unwrap().remaining() + 15,
            alone.peek("k").await.unwrap().remaining(),
            "{policy}"
        );
        leasing.close().await.unwrap();
        assert_eq!(
            view.peek("k").await.unwrap(),
            alone.peek("k").await.unwrap(),
            "{policy}"
        );
    }
}

/// While Redis is down a lease keeps admitting within its own permits, and only until it
/// expires; then the failure policy decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_in_hand_admits_within_its_permits_while_redis_is_down() {
    let mut server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let leasing = RedisLimiter::builder("sliding-counter 100/1h".parse().unwrap())
        .prefix("down")
        .timeout(Duration::from_millis(300))
        .probe_interval(Duration::from_millis(100))
        .failure_policy(FailurePolicy::Closed)
        .test_clock(clock.clone())
        .lease(32)
        .connect(&server.url())
        .await
        .unwrap();
    for key in ["a", "b"] {
        for _ in 0..40 {
            assert!(leasing.try_acquire(key).await.unwrap().is_allowed());
        }
    }
    server.kill();
    // "a": its 23 held permits, then the failure policy's refusals.
    for i in 0..23 {
        let d = leasing.try_acquire("a").await.unwrap();
        assert!(d.is_allowed(), "#{i}: {d:?}");
    }
    let d = leasing.try_acquire("a").await.unwrap();
    assert!(!d.is_allowed(), "{d:?}");
    assert!(leasing.is_failing());
    // "b" still holds 23, but its lease has expired.
    at(&clock, T0 + 360_000_000);
    let d = leasing.try_acquire("b").await.unwrap();
    assert!(!d.is_allowed(), "{d:?}");
    let stats = leasing.stats();
    assert_eq!(stats.returned_permits, 0, "{stats:?}");
    assert_eq!(stats.local_permits, 2 * 34 + 23, "{stats:?}");
}

/// A lease taken before Redis restarted empty is not given back to the restarted Redis: it
/// never counted it, and a refund would take from what it counted since (a sliding
/// counter's refund takes from the count of the lease's window).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_never_given_back_to_a_restarted_redis() {
    let mut server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let policy = "sliding-counter 100/1h";
    let leasing = limiter(&server, policy, "restarted", 32, Some(&clock)).await;
    for _ in 0..40 {
        assert!(leasing.try_acquire("k").await.unwrap().is_allowed());
    }
    server.restart();
    let view = limiter(&server, policy, "restarted", 0, Some(&clock)).await;
    for _ in 0..50 {
        assert!(view.try_acquire("k").await.unwrap().is_allowed());
    }
    // The limiter's connection is the restarted Redis's again (the first call after a
    // dropped connection is sent once more on a fresh one).
    assert!(leasing.try_acquire("other").await.unwrap().is_allowed());
    assert!(!leasing.is_failing());
    leasing.close().await.unwrap();
    assert_eq!(
        spent(&view, "k", 100).await,
        50,
        "nothing taken from the 50"
    );
    assert_eq!(leasing.stats().returned_permits, 0);
}

/// Two instances, eight tasks each (a request a millisecond each, so the key never runs
/// out), on one key of a sliding counter of 50,000 per ten years (one window for the whole
/// test, whose count is every admission), with Redis killed and restarted
/// between runs: every admission is counted by exactly one Redis
/// (the one before the restart, or the one after), none twice and none beyond: while Redis is
/// down the leases admit exactly what they held, and after the restart the new leases are
/// given back exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_killed_and_restarted_mid_run_over_admits_nothing() {
    let mut server = RedisServer::start();
    let policy = "sliding-counter 50000/3650d";
    let mut limiters = Vec::new();
    for _ in 0..2 {
        limiters.push(
            RedisLimiter::builder(policy.parse().unwrap())
                .prefix("restart")
                .timeout(Duration::from_millis(300))
                .probe_interval(Duration::from_millis(100))
                .failure_policy(FailurePolicy::Error)
                .lease(50)
                .connect(&server.url())
                .await
                .unwrap(),
        );
    }
    let key = limiters[0].redis_keys("hot")[0].clone();
    let run = |limiters: &[RedisLimiter], time: Duration| {
        let admitted = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let mut handles = Vec::new();
        for limiter in limiters {
            for _ in 0..8 {
                let limiter = limiter.clone();
                let (admitted, stop) = (Arc::clone(&admitted), Arc::clone(&stop));
                handles.push(tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        match limiter.try_acquire("hot").await {
                            Ok(d) if d.is_allowed() => {
                                admitted.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(_) | Err(_) => {}
                        }
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }));
            }
        }
        async move {
            tokio::time::sleep(time).await;
            stop.store(true, Ordering::Relaxed);
            for handle in handles {
                handle.await.unwrap();
            }
            admitted.load(Ordering::Relaxed)
        }
    };
    let before = run(&limiters, Duration::from_millis(300)).await;
    let counted_before = counted(&server, &key);
    let held = counted_before - before;
    assert!(
        before > 0 && held <= 2 * 50,
        "{before} admitted, {held} held"
    );

    server.kill();
    let down = run(&limiters, Duration::from_millis(500)).await;
    assert_eq!(down, held, "the leases admit what they held, no more");

    server.restart();
    let after = run(&limiters, Duration::from_millis(1500)).await;
    assert!(
        after > 0,
        "Redis decides again: {:?}",
        limiters.iter().map(RedisLimiter::stats).collect::<Vec<_>>()
    );
    for limiter in &limiters {
        limiter.close().await.unwrap();
    }
    let counted_after = counted(&server, &key);
    assert_eq!(
        before + down + after,
        counted_before + counted_after,
        "every admission counted once"
    );
    assert_eq!(after, counted_after, "the new leases came back exactly");
    println!("{before} admitted before the kill ({held} held), {down} while down, {after} after");
}

/// The current window's count of the sliding counter at `key` (0 for no key).
fn counted(server: &RedisServer, key: &str) -> u64 {
    match server.command(&["HGET", key, "c"]) {
        Reply::Bulk(None) => 0,
        reply => reply.text().parse().unwrap(),
    }
}

/// A limiter dropped while a tokio runtime runs gives its leases back from a task; one
/// whose process dies gives nothing back, and its key is short by at most that lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_instances_give_back_and_killed_ones_are_bounded() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let policy = "sliding-counter 1000/1h";
    let view = limiter(&server, policy, "drop", 0, Some(&clock)).await;
    let dropped = limiter(&server, policy, "drop", 32, Some(&clock)).await;
    for _ in 0..40 {
        assert!(dropped.try_acquire("k").await.unwrap().is_allowed());
    }
    assert_eq!(spent(&view, "k", 1000).await, 63);
    drop(dropped);
    let start = Instant::now();
    while spent(&view, "k", 1000).await != 40 {
        assert!(start.elapsed() < Duration::from_secs(10), "not given back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A process that dies: its runtime is gone, and the limiter never drops.
    let (url, killed_clock) = (server.url(), clock.clone());
    in_a_process_that_dies(move || async move {
        let limiter = RedisLimiter::builder(policy.parse().unwrap())
            .prefix("drop")
            .test_clock(killed_clock)
            .lease(32)
            .connect(&url)
            .await
            .unwrap();
        for _ in 0..40 {
            assert!(limiter.try_acquire("k").await.unwrap().is_allowed());
        }
        limiter
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // 80 admitted; the dead instance's last lease (32) holds 23 nobody will use.
    assert_eq!(spent(&view, "k", 1000).await, 80 + 23);
    // The others admit the rest: the policy less that lease.
    let other = limiter(&server, policy, "drop", 0, Some(&clock)).await;
    let mut more = 0;
    while other.try_acquire("k").await.unwrap().is_allowed() {
        more += 1;
    }
    assert_eq!(more, 1000 - 80 - 23);
}

/// `peek` answers from a live lease and takes nothing; `try_acquire_n` takes several
/// permits from the lease when it holds them, and otherwise asks Redis, leaving the lease
/// as it is; `reset` drops the key's lease with its state.
#[tokio::test]
async fn peek_costs_above_one_and_reset() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let policy = "100/1h";
    let leasing = limiter(&server, policy, "misc", 32, Some(&clock)).await;
    let view = limiter(&server, policy, "misc", 0, Some(&clock)).await;
    for _ in 0..40 {
        assert!(leasing.try_acquire("k").await.unwrap().is_allowed());
    }
    // 63 counted, 23 held.
    let peeked = leasing.peek("k").await.unwrap();
    assert_eq!(peeked.remaining(), 100 - 40 - 1);
    assert_eq!(
        leasing.peek("k").await.unwrap(),
        peeked,
        "a peek takes nothing"
    );
    let d = leasing.try_acquire("k").await.unwrap();
    assert_eq!(d.remaining(), peeked.remaining());
    assert_eq!(spent(&view, "k", 100).await, 63);

    let d = leasing.try_acquire_n("k", 10).await.unwrap();
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 100 - 51);
    assert_eq!(spent(&view, "k", 100).await, 63, "from the lease");
    // 12 left in the lease: a cost of 20 goes to Redis.
    let d = leasing.try_acquire_n("k", 20).await.unwrap();
    assert!(d.is_allowed());
    assert_eq!(spent(&view, "k", 100).await, 83);
    assert_eq!(
        d.remaining(),
        17,
        "Redis's figure (the lease's 12 counted spent)"
    );
    // From now on the lease reports from Redis's latest figure: 17 beyond its 12.
    assert_eq!(leasing.peek("k").await.unwrap().remaining(), 17 + 11);

    assert!(leasing.reset("k").await.unwrap());
    assert_eq!(spent(&view, "k", 100).await, 0);
    let d = leasing.try_acquire("k").await.unwrap();
    assert_eq!(d.remaining(), 99);
    assert_eq!(
        spent(&view, "k", 100).await,
        1,
        "a fresh key: a lease of one"
    );
    let keys: Vec<String> = view.redis_keys("k");
    assert_eq!(keys.len(), 1);
}

/// Leases need a policy the scripts can decide; every band's window sets the hold time.
#[tokio::test]
async fn the_hold_time_is_a_tenth_of_the_shortest_window() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let policy: Policy = "sliding-counter 100/1d & 100/10min".parse().unwrap();
    let leasing = RedisLimiter::builder(policy)
        .prefix("hold")
        .test_clock(clock.clone())
        .lease(8)
        .connect(&server.url())
        .await
        .unwrap();
    for _ in 0..4 {
        let _ = leasing.try_acquire("k").await.unwrap();
    }
    // Leases of 1, 2 and 4: three permits held, for a minute.
    at(&clock, T0 + 60_000_000 - 1);
    assert!(leasing.peek("k").await.unwrap().is_allowed());
    let before = leasing.stats().redis_decisions;
    let _ = leasing.try_acquire("k").await.unwrap();
    assert_eq!(leasing.stats().redis_decisions, before, "from the lease");
    let _ = leasing.try_acquire("k").await.unwrap();
    at(&clock, T0 + 60_000_000 + 1);
    let before = leasing.stats().redis_decisions;
    let _ = leasing.try_acquire("k").await.unwrap();
    let _ = leasing.try_acquire("k").await.unwrap();
    assert!(leasing.stats().redis_decisions > before);
}

/// A request dropped while it replaces its key's lease (its caller gave up waiting) does not
/// leave the key stuck: the next requests take leases again at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_cancelled_mid_refill_leaves_nothing_stuck() {
    let server = RedisServer::start();
    let leasing = RedisLimiter::builder("100000/1h".parse().unwrap())
        .prefix("cancel")
        .timeout(Duration::from_secs(5))
        .lease(8)
        .connect(&server.url())
        .await
        .unwrap();
    server.pause();
    let gave_up = tokio::time::timeout(Duration::from_millis(100), leasing.try_acquire("k")).await;
    assert!(gave_up.is_err(), "Redis is paused: {gave_up:?}");
    server.resume();
    let start = Instant::now();
    for _ in 0..40 {
        assert!(leasing.try_acquire("k").await.unwrap().is_allowed());
    }
    let took = start.elapsed();
    assert!(took < Duration::from_secs(2), "took {took:?}");
    let stats = leasing.stats();
    assert!(stats.local_permits > 20, "{stats:?}");
}

/// A `reset` deletes every limiter's lease token of the key with its state: a lease another
/// server still holds gives nothing back to the fresh state. Whether the limiter that resets
/// takes leases itself or not (an admin tool, a server configured without them).
#[tokio::test]
async fn a_reset_on_one_server_keeps_the_others_leases_from_giving_back_to_the_fresh_state() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let policies = ["100/1h", "sliding-counter 100/1h", "100/1h & 100/2h"];
    for (policy, leasing) in policies.iter().flat_map(|p| [(*p, 32), (*p, 0)]) {
        let prefix = format!("reset-{}-{leasing}", policy.len());
        let a = limiter(&server, policy, &prefix, leasing, Some(&clock)).await;
        let b = limiter(&server, policy, &prefix, 32, Some(&clock)).await;
        let view = limiter(&server, policy, &prefix, 0, Some(&clock)).await;
        for _ in 0..8 {
            assert!(b.try_acquire("k").await.unwrap().is_allowed());
        }
        assert!(
            b.stats().leased_permits > 8,
            "{policy}: b holds unused permits"
        );
        assert!(a.reset("k").await.unwrap());
        assert!(view.try_acquire_n("k", 10).await.unwrap().is_allowed());
        b.close().await.unwrap();
        assert_eq!(spent(&view, "k", 100).await, 10, "{policy}");
    }
}
