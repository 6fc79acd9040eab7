//! The Redis backend on a 3-node Redis Cluster started by the test: composite policies
//! decided in one script call per key without CROSSSLOT errors, keys spread over every
//! node, exact limits per key, one global limit across instances, script reloads after
//! `FUNCTION FLUSH` on every node, leases, several keys in one decision (`RedisAllOf`)
//! with one hash tag (refused without it), shadow mode, per-key policies and live policy
//! changes.
//!
//! Needs `redis-server` and `redis-cli` on PATH (`scripts/install-redis.sh`); without them
//! the test fails saying so.

use std::time::Duration;

use redis::cluster_routing::Slot;
use tollgate::redis::{BackendError, RedisAllOf, RedisLimiter};
use tollgate::FakeClock;

use crate::hammer::hammer;
use crate::redis_server::RedisCluster;

const POLICY: &str = "10/s & sliding-log 5/1s & sliding-counter 100/1h";

async fn connect(
    cluster: &RedisCluster,
    policy: &str,
    prefix: &str,
    clock: Option<&FakeClock>,
) -> RedisLimiter {
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let mut builder = RedisLimiter::builder(policy.parse().unwrap())
        .prefix(prefix)
        .timeout(Duration::from_secs(10));
    if let Some(clock) = clock {
        builder = builder.test_clock(clock.clone()).deny_cache(0);
    }
    builder.connect_cluster(&nodes).await.unwrap()
}

/// One cluster for the whole file (starting one takes a few seconds); each part uses its
/// own prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn composite_policies_on_a_three_node_cluster() {
    let cluster = RedisCluster::start();

    // 1. Many keys, spread over every node's slots: each decided in one call, no CROSSSLOT.
    let clock = FakeClock::new();
    let limiter = connect(&cluster, POLICY, "spread", Some(&clock)).await;
    for i in 0..300 {
        let key = format!("user-{i}");
        let d = limiter
            .try_acquire(&key)
            .await
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        assert!(d.is_allowed() && d.remaining() == 4, "{key}: {d:?}");
    }
    for node in cluster.nodes() {
        let keys = node.command(&["DBSIZE"]).int();
        // 300 keys x 3 bands over 3 nodes: every node holds a share.
        assert!(keys > 100, "node {} holds only {keys} keys", node.port());
    }

    // 2. Exact per key: with time frozen, each key admits exactly what its smallest band
    //    (5) allows: five of cost 1, or two of cost 2 (one permit left over).
    for i in 0..20 {
        let key = format!("exact-{i}");
        let cost = 1 + i % 2;
        let mut admitted = 0;
        for _ in 0..8 {
            if limiter
                .try_acquire_n(&key, cost)
                .await
                .unwrap()
                .is_allowed()
            {
                admitted += cost;
            }
        }
        assert_eq!(admitted, 5 - (cost - 1), "{key}");
        // A peek is a request of cost 1: it fits only where one permit was left over.
        let peeked = limiter.peek(&key).await.unwrap();
        assert_eq!(peeked.is_allowed(), admitted == 4, "{key}: {peeked:?}");
        assert_eq!(peeked.remaining(), 0, "{key}: {peeked:?}");
    }

    // 3. One global limit: three instances with their own cluster connections and eight
    //    tasks each hammer one key whose composite policy admits 600 and refills nothing.
    let policy = "600/3650d & sliding-counter 800/3650d & sliding-log 700/3650d";
    let mut limiters = Vec::new();
    for _ in 0..3 {
        limiters.push(connect(&cluster, policy, "global", None).await);
    }
    let admitted = hammer(&limiters, 8, 40).await;
    assert_eq!(admitted, 600);

    // 4. FUNCTION FLUSH on every node: the next call loads the function again (on every
    //    primary: one reload, or a few if calls race).
    for node in cluster.nodes() {
        assert_eq!(node.command(&["FUNCTION", "FLUSH"]).text(), "OK");
    }
    let before = limiter.stats().script_reloads;
    for i in 0..30 {
        let key = format!("after-flush-{i}");
        assert!(limiter.try_acquire(&key).await.unwrap().is_allowed());
    }
    let reloads = limiter.stats().script_reloads - before;
    assert!((1..=3).contains(&reloads), "{reloads} reloads for 3 nodes");
    assert_eq!(limiter.stats().failure_decisions, 0);

    // 5. Leases: the lease token lives in the key's slot, so taking and giving back a lease
    //    is one call too. Three instances leasing up to 20 admit at most the 600, at least
    //    600 less the 3 x 20 outstanding, and once they close Redis counts exactly what they
    //    admitted.
    //    (Without the sliding log band, which refuses leases of more than one permit.)
    let policy = "600/3650d & sliding-counter 800/3650d & 700/3650d";
    let mut leasing = Vec::new();
    for _ in 0..3 {
        let urls = cluster.urls();
        let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
        leasing.push(
            RedisLimiter::builder(policy.parse().unwrap())
                .prefix("leased")
                .timeout(Duration::from_secs(10))
                .lease(20)
                .connect_cluster(&nodes)
                .await
                .unwrap(),
        );
    }
    let admitted = hammer(&leasing, 8, 40).await;
    assert!((540..=600).contains(&admitted), "{admitted} admitted");
    assert!(leasing.iter().map(|l| l.stats().local_permits).sum::<u64>() > 0);
    for limiter in &leasing {
        limiter.close().await.unwrap();
    }
    let view = connect(&cluster, policy, "leased", None).await;
    let d = view.peek("hot").await.unwrap();
    let available = d.remaining() + u64::from(d.is_allowed());
    assert_eq!(available, 600 - admitted, "{d:?}");

    // 6. Several keys in one decision: limiters with one hash tag keep every key in one
    //    slot, so one call decides them, all or nothing; without it the keys are spread, and
    //    the call is refused before it is sent, naming the part.
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let tagged = |policy: &str, prefix: &str| {
        RedisLimiter::builder(policy.parse().unwrap())
            .prefix(prefix)
            .hash_tag("api")
            .test_clock(clock.clone())
            .deny_cache(0)
            .timeout(Duration::from_secs(10))
    };
    let per_user = tagged("5/1h", "all-user")
        .connect_cluster(&nodes)
        .await
        .unwrap();
    let per_ip = tagged("3/1h", "all-ip")
        .connect_shared(&per_user)
        .await
        .unwrap();
    for i in 0..3 {
        let user = format!("user-{i}");
        let request = RedisAllOf::new()
            .key(&per_user, &user)
            .key(&per_ip, "10.0.0.1");
        assert!(request.try_acquire().await.unwrap().is_allowed(), "{user}");
    }
    let refused = RedisAllOf::new()
        .key(&per_user, "user-0")
        .key(&per_ip, "10.0.0.1")
        .try_acquire()
        .await
        .unwrap();
    assert!(!refused.is_allowed() && refused.part() == 1, "{refused:?}");
    assert_eq!(
        per_user.available("user-0").await.unwrap(),
        4,
        "the refusal spent nothing"
    );
    let spread = connect(&cluster, "3/1h", "all-spread", Some(&clock)).await;
    let other = RedisLimiter::builder("5/1h".parse().unwrap())
        .prefix("all-spread-user")
        .test_clock(clock.clone())
        .connect_shared(&spread)
        .await
        .unwrap();
    // Keys whose own tags land in different slots (most pairs do; these are found so).
    let apart = (0..100)
        .map(|i| format!("user-{i}"))
        .find(|user| {
            Slot::for_key(&other.redis_keys(user)[0])
                != Slot::for_key(&spread.redis_keys("10.0.0.1")[0])
        })
        .unwrap();
    let err = RedisAllOf::new()
        .key(&spread, "10.0.0.1")
        .key(&other, &apart)
        .try_acquire()
        .await
        .unwrap_err();
    match err {
        BackendError::CrossSlot { part, key, first } => {
            assert_eq!(part, 1);
            assert_eq!(key, other.redis_keys(&apart)[0]);
            assert_eq!(first, spread.redis_keys("10.0.0.1")[0]);
        }
        other => panic!("{other}"),
    }
    assert_eq!(spread.stats().redis_decisions, 0, "nothing was sent");

    // 7. Shadow mode on the cluster: three instances in shadow mode hammer one key of 100;
    //    every call is let through, exactly 100 are counted as admitted, and the key is then
    //    exactly spent for an enforcing limiter.
    let mut shadows = Vec::new();
    for _ in 0..3 {
        shadows.push(
            RedisLimiter::builder("100/3650d".parse().unwrap())
                .prefix("shadow")
                .timeout(Duration::from_secs(10))
                .shadow()
                .connect_cluster(&nodes)
                .await
                .unwrap(),
        );
    }
    let let_through = hammer(&shadows, 8, 20).await;
    assert_eq!(let_through, 3 * 8 * 20);
    let allowed: u64 = shadows.iter().map(|l| l.stats().allowed).sum();
    let refused: u64 = shadows.iter().map(|l| l.stats().refused).sum();
    assert_eq!((allowed, refused), (100, 480 - 100));
    let enforcing = connect(&cluster, "100/3650d", "shadow", None).await;
    assert!(!enforcing.try_acquire("hot").await.unwrap().is_allowed());

    // 8. Per-key policies on the cluster: the record sits in its key's slot, so deciding
    //    and moving a key to a new tier are one call each, on whichever node holds it.
    let upgraded = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let paid = std::sync::Arc::clone(&upgraded);
    let tiered = RedisLimiter::builder("2/1h".parse().unwrap())
        .prefix("tiers")
        .test_clock(clock.clone())
        .deny_cache(0)
        .timeout(Duration::from_secs(10))
        .resolver(move |_: &str| {
            let upgraded = paid.load(std::sync::atomic::Ordering::Relaxed);
            if upgraded { "5/1h" } else { "2/1h" }.parse().unwrap()
        })
        .resolver_cache(1_000, Duration::ZERO)
        .connect_cluster(&nodes)
        .await
        .unwrap();
    for i in 0..30 {
        let key = format!("user-{i}");
        assert!(
            tiered.try_acquire_n(&key, 2).await.unwrap().is_allowed(),
            "{key}"
        );
    }
    clock.advance(Duration::from_millis(1));
    upgraded.store(true, std::sync::atomic::Ordering::Relaxed);
    for i in 0..30 {
        let key = format!("user-{i}");
        assert_eq!(
            tiered.available(&key).await.unwrap(),
            3,
            "{key}: 2 of 5 spent"
        );
    }
    assert_eq!(tiered.stats().policy_moves, 30);

    // 9. Live policy changes on the cluster: the stored policy sits in a slot of its own,
    //    read and written in calls of its own; a second instance reads it when it connects,
    //    and keys on every node move to it with their spent permits.
    let live = || {
        RedisLimiter::builder("2/1h".parse().unwrap())
            .prefix("live")
            .test_clock(clock.clone())
            .deny_cache(0)
            .timeout(Duration::from_secs(10))
            .live_policy()
            .connect_cluster(&nodes)
    };
    let first = live().await.unwrap();
    for i in 0..30 {
        let key = format!("user-{i}");
        assert!(first.try_acquire(&key).await.unwrap().is_allowed(), "{key}");
    }
    clock.advance(Duration::from_millis(1));
    first.set_policy("6/1h".parse().unwrap()).await.unwrap();
    let second = live().await.unwrap();
    assert_eq!(second.policy().to_string(), "token-bucket 6/1h");
    for i in 0..30 {
        let key = format!("user-{i}");
        assert_eq!(
            second.available(&key).await.unwrap(),
            5,
            "{key}: 1 of 6 spent"
        );
    }
    assert_eq!(second.stats().policy_moves, 30);
}

/// A slot migrating between nodes (resharding): once the key has moved to the importing
/// node, its old owner answers `ASK`, and the limiter follows it with `ASKING`, so the key's
/// state keeps deciding, exactly, on the node that now holds it; after the migration ends
/// (`MOVED`), the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migrating_slot_is_followed_with_asking() {
    let cluster = RedisCluster::start();
    let limiter = connect(&cluster, "10/1h", "reshard", None).await;
    let key = "alice";
    let redis_keys = limiter.redis_keys(key);
    assert_eq!(redis_keys.len(), 1);
    let redis_key = redis_keys[0].as_str();

    assert_eq!(limiter.try_acquire_n(key, 4).await.unwrap().remaining(), 6);

    let nodes = cluster.nodes();
    let slot = nodes[0]
        .command(&["CLUSTER", "KEYSLOT", redis_key])
        .int()
        .to_string();
    // Whether node `i` holds the key itself (COUNTKEYSINSLOT counts local keys and, unlike
    // EXISTS, does not redirect).
    let holds = |i: usize| {
        nodes[i]
            .command(&["CLUSTER", "COUNTKEYSINSLOT", &slot])
            .int()
            == 1
    };
    let source = (0..3).find(|&i| holds(i)).expect("one node holds the key");
    let target = (source + 1) % 3;
    let id = |i: usize| nodes[i].command(&["CLUSTER", "MYID"]).text();
    let (source_id, target_id) = (id(source), id(target));

    // Resharding, as `redis-cli --cluster reshard` does it: mark the slot importing on the
    // target and migrating on the source, then move the key.
    nodes[target].command(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &source_id]);
    nodes[source].command(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &target_id]);
    let port = nodes[target].port().to_string();
    let migrated = nodes[source].command(&[
        "MIGRATE",
        "127.0.0.1",
        &port,
        "",
        "0",
        "5000",
        "KEYS",
        redis_key,
    ]);
    assert_eq!(migrated.text(), "OK");
    assert!(holds(target) && !holds(source));

    // The slot is still the source's: it answers ASK, and the call goes to the target, whose
    // functions are flushed first: a missing function there must be loaded again, as anywhere
    // else, and the call sent again after ASKING.
    nodes[target].command(&["FUNCTION", "FLUSH"]);
    let reloads = limiter.stats().script_reloads;
    let decision = limiter.try_acquire(key).await.unwrap();
    assert_eq!(limiter.stats().script_reloads, reloads + 1);
    assert!(decision.is_allowed(), "{decision:?}");
    assert_eq!(
        decision.remaining(),
        5,
        "the 4 spent before the move stay spent"
    );
    assert!(
        holds(target) && !holds(source),
        "written on the importing node only"
    );
    for expected in (0..5).rev() {
        assert_eq!(
            limiter.try_acquire(key).await.unwrap().remaining(),
            expected
        );
    }
    assert!(!limiter.try_acquire(key).await.unwrap().is_allowed());

    // The migration ends: every node learns the target owns the slot (MOVED from now on).
    for node in nodes {
        node.command(&["CLUSTER", "SETSLOT", &slot, "NODE", &target_id]);
    }
    let after = limiter.try_acquire(key).await.unwrap();
    assert!(!after.is_allowed(), "{after:?}");
    assert_eq!(limiter.peek(key).await.unwrap().remaining(), 0);
    assert!(holds(target) && !holds(source));
}
