//! Several keys in one decision on Redis (`RedisAllOf`): the same answers as the in-process
//! `AllOf` over the same policies and clock, a refusal that spends nothing, exact budgets
//! while instances race, the parts one call cannot decide (typed errors, nothing sent), bad
//! costs, and the failure policies deciding all or nothing while Redis is down.
//!
//! Needs `redis-server` on PATH (`scripts/install-redis.sh`); without it every test fails
//! saying so.

use std::sync::Arc;
use std::time::Duration;

use tollgate::redis::{BackendError, FailurePolicy, RedisAllOf, RedisLimiter};
use tollgate::{AllOf, CostError, Decision, FakeClock, RateLimiter, SettleError};

use crate::clocked::{at, limiter_at, shared_at};
use crate::redis_server::RedisServer;

/// A frozen test clock's reading, in microseconds: ten whole minutes, so every window of
/// these tests starts at it.
const T0: u64 = 600_000_000;

/// What can be compared between a decision made in Redis and one made in process: a
/// composite's band index is not reported by Redis, and Redis counts in microseconds, where
/// a wait computed in nanoseconds in process (a sliding counter's) is rounded up.
fn fields(d: &Decision) -> (bool, u64, u64, u128, u128, usize) {
    let micros = |t: Duration| t.as_nanos().div_ceil(1_000);
    (
        d.is_allowed(),
        d.remaining(),
        d.limit(),
        micros(d.retry_after()),
        micros(d.reset_after()),
        d.part(),
    )
}

const POLICIES: [&str; 3] = [
    "10/1s",
    "sliding-counter 600/1min",
    "sliding-log 10/2s & 500/1min",
];

/// A request sequence of varying costs and pauses decided by a `RedisAllOf` and by an
/// in-process `AllOf` over the same policies on the same clock: every decision the same,
/// and so is every peek.
#[tokio::test]
async fn answers_as_the_in_process_all_of_does() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let lead = limiter_at(&server, POLICIES[0], "same-0", &clock).await;
    let second = shared_at(&lead, POLICIES[1], "same-1", &clock).await;
    let third = shared_at(&lead, POLICIES[2], "same-2", &clock).await;
    let local: Vec<RateLimiter<String, FakeClock>> = POLICIES
        .iter()
        .map(|p| RateLimiter::with_clock(p.parse().unwrap(), clock.clone()))
        .collect();

    let mut seed = 7u64;
    let mut next = |bound: u64| {
        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (seed >> 33) % bound
    };
    let (mut allowed, mut refused) = (0, 0);
    let mut parts = [false; 3];
    for step in 0..300 {
        let costs = [1 + next(4), 1 + next(6), 1 + next(3)];
        let remote = RedisAllOf::new()
            .key_n(&lead, "alice", costs[0])
            .key_n(&second, "alice", costs[1])
            .key_n(&third, "10.0.0.1", costs[2]);
        let near = AllOf::new()
            .key_n(&local[0], "alice", costs[0])
            .key_n(&local[1], "alice", costs[1])
            .key_n(&local[2], "10.0.0.1", costs[2]);
        assert_eq!(
            fields(&remote.peek().await.unwrap()),
            fields(&near.peek()),
            "peek at step {step}, costs {costs:?}"
        );
        let (r, n) = (remote.try_acquire().await.unwrap(), near.try_acquire());
        assert_eq!(fields(&r), fields(&n), "step {step}, costs {costs:?}");
        if r.is_allowed() {
            allowed += 1;
        } else {
            refused += 1;
            parts[r.part()] = true;
        }
        // Whole milliseconds: the Redis scripts count in microseconds.
        clock.advance(Duration::from_millis(next(400)));
    }
    assert!(
        allowed > 50 && refused > 50,
        "{allowed} allowed, {refused} refused"
    );
}

/// The per-address limit refuses the third request: it names that part, and the user's and
/// the global budget are as they were.
#[tokio::test]
async fn a_refused_request_spends_nothing_anywhere() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let per_user = limiter_at(&server, "100/1min", "user", &clock).await;
    let per_ip = shared_at(&per_user, "2/1min", "ip", &clock).await;
    let tokens = shared_at(&per_user, "10000/1min", "tokens", &clock).await;
    let global = shared_at(&per_user, "1000/1s", "global", &clock).await;
    let request = RedisAllOf::new()
        .key(&per_user, "alice")
        .key(&per_ip, "203.0.113.9")
        .named("per-ip")
        .key_n(&tokens, "alice", 700)
        .key(&global, "all");
    assert_eq!(request.len(), 4);
    assert_eq!(request.name(1), Some("per-ip"));

    for left in [1, 0] {
        let d = request.try_acquire().await.unwrap();
        assert!(d.is_allowed(), "{d:?}");
        assert_eq!(d.part(), 1, "the part with the least left decides");
        assert_eq!(d.remaining(), left);
    }
    let refused = request.try_acquire().await.unwrap();
    assert!(!refused.is_allowed());
    assert_eq!(request.name(refused.part()), Some("per-ip"));
    assert_eq!(refused.retry_after(), Duration::from_secs(30));
    assert_eq!(per_user.available("alice").await.unwrap(), 98);
    assert_eq!(tokens.available("alice").await.unwrap(), 10_000 - 1_400);
    assert_eq!(global.available("all").await.unwrap(), 998);
    let stats = per_user.stats();
    assert_eq!(
        stats.redis_decisions,
        3 + 1,
        "three decisions and a peek: {stats:?}"
    );
}

/// Two shapes of request race from four instances (each its own connection) on a frozen
/// clock: alice's and bob's, each also spending one global key. The global limit binds:
/// exactly its 40 are admitted, and each user's state shows exactly what it was admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_instances_admit_exactly_the_tightest_budget() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let mut instances = Vec::new();
    for _ in 0..4 {
        let users = limiter_at(&server, "25/1h", "race-user", &clock).await;
        let global = shared_at(&users, "40/1h", "race-global", &clock).await;
        instances.push(Arc::new((users, global)));
    }
    let mut tasks = Vec::new();
    for task in 0..32 {
        let instance = Arc::clone(&instances[task % 4]);
        let user = if task % 2 == 0 { "alice" } else { "bob" };
        tasks.push(tokio::spawn(async move {
            let (users, global) = &*instance;
            let mut admitted = 0u64;
            for _ in 0..10 {
                let d = RedisAllOf::new()
                    .key(users, user)
                    .key(global, "all")
                    .try_acquire()
                    .await
                    .unwrap();
                admitted += u64::from(d.is_allowed());
            }
            (user, admitted)
        }));
    }
    let (mut alice, mut bob) = (0, 0);
    for task in tasks {
        match task.await.unwrap() {
            ("alice", n) => alice += n,
            (_, n) => bob += n,
        }
    }
    assert_eq!(alice + bob, 40, "alice {alice}, bob {bob}");
    assert!(alice <= 25 && bob <= 25, "alice {alice}, bob {bob}");
    let (users, global) = &*instances[0];
    assert_eq!(global.available("all").await.unwrap(), 0);
    assert_eq!(users.available("alice").await.unwrap(), 25 - alice);
    assert_eq!(users.available("bob").await.unwrap(), 25 - bob);
}

/// Parts one script call cannot decide are refused before anything is sent, naming the part;
/// a cost no policy state admits is refused as `AllOf` refuses it, and `check` names it.
#[tokio::test]
async fn parts_one_call_cannot_decide_and_bad_costs() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let lead = limiter_at(&server, "5/1min", "parts", &clock).await;
    let apart = limiter_at(&server, "5/1min", "apart", &clock).await;
    let twin = shared_at(&lead, "5/1min & 9/1h", "parts", &clock).await;

    let err = RedisAllOf::new()
        .key(&lead, "a")
        .key(&apart, "a")
        .try_acquire()
        .await
        .unwrap_err();
    assert!(
        matches!(err, BackendError::OtherConnection { part: 1 }),
        "{err}"
    );

    let err = RedisAllOf::new()
        .key(&lead, "a")
        .key_n(&lead, "a", 2)
        .peek()
        .await
        .unwrap_err();
    match &err {
        BackendError::SharedKey { part: 1, key } => assert_eq!(key, "parts:{a}:tb:5/1m"),
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains("parts:{a}:tb:5/1m"), "{err}");
    let err = RedisAllOf::new()
        .key(&lead, "a")
        .key(&twin, "a")
        .try_acquire()
        .await
        .unwrap_err();
    assert!(
        matches!(err, BackendError::SharedKey { part: 1, .. }),
        "a band in common: {err}"
    );
    assert_eq!(lead.available("a").await.unwrap(), 5, "nothing was spent");

    let bad = RedisAllOf::new()
        .key(&lead, "a")
        .key_n(&twin, "b", 6)
        .named("big");
    let refused = bad.try_acquire().await.unwrap();
    assert!(!refused.is_allowed());
    assert_eq!(refused.part(), 1);
    assert_eq!(
        refused.retry_after(),
        Duration::from_nanos(u64::MAX),
        "never"
    );
    let err = bad.check().unwrap_err();
    assert_eq!((err.part(), err.name()), (1, Some("big")));
    assert_eq!(err.error(), CostError::ExceedsLimit { cost: 6, limit: 5 });
    assert!(RedisAllOf::new().key_n(&lead, "a", 0).check().is_err());
    assert_eq!(
        lead.stats().redis_decisions,
        1,
        "only the peek of `available` was sent"
    );

    let nothing = RedisAllOf::new().try_acquire().await.unwrap();
    assert!(nothing.is_allowed() && RedisAllOf::new().is_empty());

    let err = RedisLimiter::builder("5/s".parse().unwrap())
        .hash_tag("a}b")
        .connect_shared(&lead)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            BackendError::InvalidSetting {
                setting: "hash_tag",
                ..
            }
        ),
        "{err}"
    );
    let tagged = RedisLimiter::builder("5/s".parse().unwrap())
        .prefix("t")
        .hash_tag("api")
        .connect_shared(&lead)
        .await
        .unwrap();
    assert_eq!(tagged.redis_keys("a"), ["t:{api}:{a}:tb:5/1s"]);
}

/// Redis killed: each part decided by its limiter's failure policy, the local limiters all or
/// nothing; a part whose policy is `Error` makes the call fail.
#[tokio::test]
async fn while_redis_is_down_the_failure_policies_decide_all_or_nothing() {
    let mut server = RedisServer::start();
    let connect = |prefix: &'static str, failure: FailurePolicy| {
        RedisLimiter::builder("100/1h".parse().unwrap())
            .prefix(prefix)
            .timeout(Duration::from_millis(200))
            .probe_interval(Duration::from_secs(3600))
            .failure_policy(failure)
    };
    let roomy = RateLimiter::new("10/1h".parse().unwrap());
    let tight = RateLimiter::new("1/1h".parse().unwrap());
    let lead = connect("down-a", FailurePolicy::Local(roomy))
        .connect(&server.url())
        .await
        .unwrap();
    let second = connect("down-b", FailurePolicy::Local(tight))
        .connect_shared(&lead)
        .await
        .unwrap();
    let open = connect("down-c", FailurePolicy::Open)
        .connect_shared(&lead)
        .await
        .unwrap();
    let failing = connect("down-d", FailurePolicy::Error)
        .connect_shared(&lead)
        .await
        .unwrap();
    let request = RedisAllOf::new()
        .key(&lead, "k")
        .key(&open, "k")
        .key(&second, "k");
    assert!(request.try_acquire().await.unwrap().is_allowed());

    server.kill();
    let first = request.try_acquire().await.unwrap();
    assert!(first.is_allowed(), "{first:?}");
    assert_eq!(
        (first.part(), first.remaining()),
        (2, 0),
        "a part that reads a state answers, not the open one"
    );
    assert!(lead.is_failing() && second.is_failing() && open.is_failing());
    let refused = request.try_acquire().await.unwrap();
    assert!(!refused.is_allowed());
    assert_eq!(refused.part(), 2, "the tight local limiter refuses");
    // What a request would leave, peeked from the local limiters: the roomy one spent one
    // permit (the admission), not two (the refusal gave its permit back).
    let left = |limiter| async move {
        let d = RedisAllOf::new().key(limiter, "k").peek().await.unwrap();
        (d.is_allowed(), d.remaining())
    };
    assert_eq!(left(&lead).await, (true, 8));
    assert_eq!(left(&second).await, (false, 0));
    assert_eq!(lead.stats().failure_decisions, 2 + 1);

    let err = RedisAllOf::new()
        .key(&lead, "j")
        .key(&failing, "j")
        .try_acquire()
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            BackendError::Unavailable | BackendError::Redis(_) | BackendError::Timeout(_)
        ),
        "{err}"
    );
    assert_eq!(
        failing.stats().failure_decisions,
        1,
        "an error is the failure policy's decision, counted"
    );
    let d = RedisAllOf::new().key(&lead, "j").peek().await.unwrap();
    assert_eq!(d.remaining(), 9, "an error spends nothing locally");
}

/// A reservation of every part in one call, settled part by part from the real costs: what a
/// part did not use comes back, what it used on top is charged; a cancel gives everything
/// back; a refused one holds nothing; settles that cannot apply are refused, sending nothing.
#[tokio::test]
async fn reserve_then_settle_each_part() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let requests = limiter_at(&server, "10/1min", "r-requests", &clock).await;
    let tokens = shared_at(
        &requests,
        "10000/1min & sliding-counter 20000/1h",
        "r-tokens",
        &clock,
    )
    .await;
    let call = RedisAllOf::new()
        .key(&requests, "alice")
        .key_n(&tokens, "alice", 700)
        .named("tokens");

    let r = call.reserve().await.unwrap();
    assert!(r.decision().is_allowed());
    assert_eq!(requests.available("alice").await.unwrap(), 9);
    assert_eq!(tokens.available("alice").await.unwrap(), 9_300);
    call.settle(r, &[1, 250]).await.unwrap();
    assert_eq!(
        tokens.available("alice").await.unwrap(),
        9_750,
        "450 came back"
    );
    assert_eq!(requests.available("alice").await.unwrap(), 9);

    let r = call.reserve().await.unwrap();
    call.settle(r, &[1, 900]).await.unwrap();
    assert_eq!(
        tokens.available("alice").await.unwrap(),
        8_850,
        "200 charged on top"
    );
    let r = call.reserve().await.unwrap();
    call.cancel(r).await.unwrap();
    assert_eq!(requests.available("alice").await.unwrap(), 8);
    assert_eq!(tokens.available("alice").await.unwrap(), 8_850);

    // A settle that changed a part deleted its token; one at what it held sent nothing
    // (the requests part twice), and its token stays until its deadline, as for one key.
    let tokens_of = |prefix: &str| {
        server
            .command(&["HLEN", &format!("{prefix}:{{alice}}:reserved")])
            .int()
    };
    assert_eq!(tokens_of("r-tokens"), 0);
    assert_eq!(tokens_of("r-requests"), 2);

    // Refused by the tokens part: nothing held anywhere, and settling it is refused.
    let greedy = RedisAllOf::new()
        .key(&requests, "alice")
        .key_n(&tokens, "alice", 9_000);
    let refused = greedy.reserve().await.unwrap();
    assert!(!refused.decision().is_allowed());
    assert_eq!(refused.decision().part(), 1);
    assert!(matches!(
        greedy.settle(refused, &[]).await,
        Err(BackendError::Settle(SettleError::Refused))
    ));
    assert_eq!(requests.available("alice").await.unwrap(), 8);

    let r = call.reserve().await.unwrap();
    assert!(matches!(
        call.settle(r, &[1, 2, 3]).await,
        Err(BackendError::Settle(SettleError::Parts {
            parts: 2,
            given: 3
        }))
    ));
    let r = call.reserve().await.unwrap();
    let other = RedisAllOf::new().key(&requests, "bob").key(&tokens, "bob");
    assert!(matches!(
        other.settle(r, &[0, 0]).await,
        Err(BackendError::Settle(SettleError::OtherKey))
    ));
    assert_eq!(
        tokens.available("alice").await.unwrap(),
        8_850 - 1_400,
        "both kept spent"
    );

    let err = RedisAllOf::new()
        .key_n(&requests, "alice", 11)
        .named("requests")
        .reserve()
        .await
        .unwrap_err();
    match err {
        BackendError::Part(part) => assert_eq!((part.part(), part.name()), (0, Some("requests"))),
        other => panic!("{other}"),
    }
}

/// A reservation whose shadow-mode part let a refusal through (holding nothing there) is
/// still told apart from a reservation of other parts: settling it on them is refused whole.
#[tokio::test]
async fn a_settle_checks_every_part_even_one_that_holds_nothing() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, T0);
    let shadowed = crate::clocked::clocked("1/1h", "s-shadow", &clock)
        .shadow()
        .connect(&server.url())
        .await
        .unwrap();
    let global = shared_at(&shadowed, "10/1h", "s-global", &clock).await;
    let other = shared_at(&shadowed, "10/1h", "s-other", &clock).await;
    assert!(shadowed.try_acquire("a").await.unwrap().is_allowed());
    let mine = RedisAllOf::new().key(&shadowed, "a").key(&global, "g");
    let reservation = mine.reserve().await.unwrap();
    assert!(
        reservation.decision().is_allowed(),
        "the refusal let through"
    );
    let theirs = RedisAllOf::new().key(&other, "z").key(&global, "g");
    assert!(matches!(
        theirs.settle(reservation, &[5, 5]).await,
        Err(BackendError::Settle(SettleError::OtherLimiter))
    ));
    assert_eq!(global.available("g").await.unwrap(), 9, "nothing settled");
}
