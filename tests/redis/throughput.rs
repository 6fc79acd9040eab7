//! Throughput of the Redis backend against a local `redis-server`, side by side in one run:
//! decisions per second with and without the deny cache under one hammering key, admissions
//! of one hot key with and without leases, and for comparison admissions over many keys, a
//! composite policy, per-key policies (a resolver), several keys in one decision
//! (`RedisAllOf`), and the in-process limiter.
//! The figures in `docs/BENCHMARKS.md` ("Redis backend") come from this run:
//!
//! ```text
//! cargo test --release --features redis,test-util --test redis throughput:: -- --ignored --nocapture
//! ```
//!
//! A measurement, not a check: it is `#[ignore]`d so that the test suite never times
//! anything (it still needs `redis-server`, like every Redis test).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tollgate::redis::{RedisAllOf, RedisLimiter};
use tollgate::RateLimiter;

use crate::redis_server::RedisServer;

/// How long each case runs.
const RUN: Duration = Duration::from_secs(3);

/// Runs `tasks` tasks calling `call(task, i)` in a loop for [`RUN`]; returns decisions per
/// second and the share of them that were allowed.
async fn measure<F, Fut>(tasks: usize, call: F) -> (f64, f64)
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let call = Arc::new(call);
    let done = Arc::new(AtomicU64::new(0));
    let allowed = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut handles = Vec::new();
    for task in 0..tasks {
        let (call, done, allowed) = (Arc::clone(&call), Arc::clone(&done), Arc::clone(&allowed));
        handles.push(tokio::spawn(async move {
            let mut i = 0;
            while start.elapsed() < RUN {
                if call(task, i).await {
                    allowed.fetch_add(1, Ordering::Relaxed);
                }
                done.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        }));
    }
    for handle in handles {
        handle.await.unwrap();
    }
    let secs = start.elapsed().as_secs_f64();
    let done = done.load(Ordering::Relaxed) as f64;
    (
        done / secs,
        allowed.load(Ordering::Relaxed) as f64 / done.max(1.0),
    )
}

/// 64 tasks deciding on 10,000 keys of `single`, one key a decision.
async fn one_key(single: RedisLimiter) -> (f64, f64) {
    measure(64, move |task, i| {
        let single = single.clone();
        async move {
            let key = format!("user-{}", (task as u64 * 7919 + i) % 10_000);
            single.try_acquire(&key).await.unwrap().is_allowed()
        }
    })
    .await
}

/// 64 tasks deciding a user's key, an address's key and one global key at once, over
/// 10,000 users and addresses.
async fn three_parts(parts: (RedisLimiter, RedisLimiter, RedisLimiter)) -> (f64, f64) {
    measure(64, move |task, i| {
        let (user, ip, global) = parts.clone();
        async move {
            let n = (task as u64 * 7919 + i) % 10_000;
            let (key, address) = (format!("user-{n}"), format!("10.0.{}.{}", n / 250, n % 250));
            RedisAllOf::new()
                .key(&user, &key)
                .key(&ip, &address)
                .key(&global, "all")
                .try_acquire()
                .await
                .unwrap()
                .is_allowed()
        }
    })
    .await
}

/// One key alone, then a `RedisAllOf` of three parts, through limiters connected to `url`
/// (their prefixes start with `prefix`), each row with the server's time per call of
/// `command` (`fcall` or `evalsha`); returns the one-key figures.
async fn one_and_three(server: &RedisServer, url: &str, prefix: &str, command: &str) -> (f64, f64) {
    let policy = "1000000/1s";
    let builder = |name: &str, policy: &str| {
        RedisLimiter::builder(policy.parse().unwrap())
            .prefix(&format!("{prefix}{name}"))
            .timeout(Duration::from_secs(5))
            .deny_cache(100_000)
    };
    let how = command.to_uppercase();
    let single = builder("single", policy).connect(url).await.unwrap();
    server.command(&["CONFIG", "RESETSTAT"]);
    let alone = one_key(single).await;
    println!(
        "| distinct keys, token bucket, one key (admissions), {how} | 64 | {:.0} | {:.1} % |",
        alone.0,
        alone.1 * 100.0
    );
    println!(
        "<!-- one key, {how}: {:.2} us of server time a call -->",
        server.command_stat(command, "usec_per_call")
    );
    let user = builder("all-user", policy).connect(url).await.unwrap();
    let parts = (
        user.clone(),
        builder("all-ip", policy)
            .connect_shared(&user)
            .await
            .unwrap(),
        builder("all-global", "1000000000/1h")
            .connect_shared(&user)
            .await
            .unwrap(),
    );
    server.command(&["CONFIG", "RESETSTAT"]);
    let three = three_parts(parts).await;
    println!(
        "| distinct keys, RedisAllOf of 3 parts (admissions), {how} | 64 | {:.0} | {:.1} % |",
        three.0,
        three.1 * 100.0
    );
    println!(
        "<!-- RedisAllOf of 3 parts, {how}: {:.2} us of server time a call; {:.2}x the \
         admissions per second of one key -->",
        server.command_stat(command, "usec_per_call"),
        three.0 / alone.0
    );
    server.command(&["FLUSHALL"]);
    alone
}

async fn limiter(server: &RedisServer, policy: &str, prefix: &str, cache: bool) -> RedisLimiter {
    leasing(server, policy, prefix, cache, 0).await
}

/// As [`limiter`], with leases of at most `lease` permits (0: none).
async fn leasing(
    server: &RedisServer,
    policy: &str,
    prefix: &str,
    cache: bool,
    lease: u64,
) -> RedisLimiter {
    let builder = RedisLimiter::builder(policy.parse().unwrap())
        .prefix(prefix)
        .timeout(Duration::from_secs(5))
        .deny_cache(if cache { 100_000 } else { 0 });
    let builder = if lease > 0 {
        builder.lease(lease)
    } else {
        builder
    };
    builder.connect(&server.url()).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: run with --release -- --ignored --nocapture"]
async fn redis_throughput() {
    let server = RedisServer::start();
    let version = server.command(&["INFO", "server"]).text();
    let version = version
        .lines()
        .find(|l| l.starts_with("redis_version:"))
        .unwrap_or("redis_version:?")
        .trim()
        .to_owned();
    println!("\nredis-server {version}, loopback, one multiplexed connection per limiter");
    println!(
        "{} s per case, tokio multi-thread runtime with 2 workers\n",
        RUN.as_secs()
    );
    println!("| case | tasks | decisions/s | allowed |");
    println!("|---|---|---|---|");
    let row = |case: &str, tasks: usize, (rate, share): (f64, f64)| {
        println!("| {case} | {tasks} | {rate:.0} | {:.1} % |", share * 100.0);
    };

    // One key hammered after its burst is spent: nearly every decision is a refusal.
    let hot = "100/1h";
    for tasks in [1, 64] {
        let plain = limiter(&server, hot, &format!("plain{tasks}"), false).await;
        row(
            "one hot key, token bucket, no deny cache",
            tasks,
            measure(tasks, move |_, _| {
                let plain = plain.clone();
                async move { plain.try_acquire("hot").await.unwrap().is_allowed() }
            })
            .await,
        );
        let cached = limiter(&server, hot, &format!("cached{tasks}"), true).await;
        row(
            "one hot key, token bucket, deny cache",
            tasks,
            measure(tasks, move |_, _| {
                let cached = cached.clone();
                async move { cached.try_acquire("hot").await.unwrap().is_allowed() }
            })
            .await,
        );
    }

    // One hot key admitted, not refused: a round trip per admission without leases; with
    // leases, one per lease of up to 1,000 permits.
    let admitting = "1000000000/1h";
    let mut rates = Vec::new();
    for lease in [0, 1_000] {
        let hot = leasing(&server, admitting, &format!("lease{lease}"), true, lease).await;
        let probe = hot.clone();
        let case = if lease == 0 {
            "one hot key admitted, token bucket, no lease".to_owned()
        } else {
            format!("one hot key admitted, token bucket, **lease({lease})**")
        };
        let (rate, share) = measure(64, move |_, _| {
            let hot = hot.clone();
            async move { hot.try_acquire("hot").await.unwrap().is_allowed() }
        })
        .await;
        row(&case, 64, (rate, share));
        let stats = probe.stats();
        if lease > 0 {
            println!(
                "<!-- lease({lease}): {} Redis calls, {} permits leased, {} admitted locally -->",
                stats.redis_decisions, stats.leased_permits, stats.local_permits
            );
        }
        rates.push(rate);
        probe.close().await.unwrap();
    }
    println!(
        "<!-- leases: {:.1}x the admissions per second without -->",
        rates[1] / rates[0]
    );

    // Admissions: every decision writes, over many keys.
    for (case, policy) in [
        ("distinct keys, token bucket (admissions)", "1000000/1s"),
        (
            "distinct keys, sliding counter (admissions)",
            "sliding-counter 1000000/1s",
        ),
        ("distinct keys, sliding log 10/s", "sliding-log 10/1s"),
        (
            "distinct keys, 3-band composite",
            "1000000/1s & sliding-counter 1000000/1h & 1000000/1d",
        ),
    ] {
        let many = limiter(&server, policy, "many", true).await;
        row(
            case,
            64,
            measure(64, move |task, i| {
                let many = many.clone();
                async move {
                    let key = format!("user-{}", (task as u64 * 7919 + i) % 10_000);
                    many.try_acquire(&key).await.unwrap().is_allowed()
                }
            })
            .await,
        );
        server.command(&["FLUSHALL"]);
    }

    // The same policy under a resolver (every key's record read, and written on admission).
    let policy = "1000000/1s";
    let tiered = RedisLimiter::builder(policy.parse().unwrap())
        .prefix("tiered")
        .timeout(Duration::from_secs(5))
        .resolver(move |_: &str| policy.parse().unwrap())
        .connect(&server.url())
        .await
        .unwrap();
    let recorded = one_key(tiered).await;
    row(
        "distinct keys, token bucket, resolver (admissions)",
        64,
        recorded,
    );
    server.command(&["FLUSHALL"]);

    // Several keys in one decision, every call admitted: a user's key, an address's key and
    // one global key in one call, beside one key of the same policy alone. Through the
    // default user, which calls the code as a function; then through a user whose ACL denies
    // functions, which calls it as a script with EVALSHA, as on Redis before 7.
    let alone = one_and_three(&server, &server.url(), "", "fcall").await;
    println!(
        "<!-- a resolver's records: {:.2}x the admissions per second of one key alone -->",
        recorded.0 / alone.0
    );
    server.command(&[
        "ACL",
        "SETUSER",
        "scripts",
        "on",
        ">scripts",
        "~*",
        "&*",
        "+@all",
        "-function",
        "-fcall",
    ]);
    let url = server
        .url()
        .replacen("redis://", "redis://scripts:scripts@", 1);
    one_and_three(&server, &url, "s-", "evalsha").await;

    // The same hot key in process, for scale.
    let local: Arc<RateLimiter<String>> = Arc::new(RateLimiter::new(hot.parse().unwrap()));
    row(
        "one hot key, in-process RateLimiter (no Redis)",
        2,
        measure(2, move |_, _| {
            let local = Arc::clone(&local);
            async move { local.try_acquire("hot").is_allowed() }
        })
        .await,
    );
}
