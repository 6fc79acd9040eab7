//! The Redis backend when Redis fails: killed mid-run (each failure policy, then recovery
//! after a restart), paused (timeouts), and `FUNCTION FLUSH` / `SCRIPT FLUSH` mid-run, on a
//! server with functions and on one whose user may not use them (nothing lost or counted
//! twice). Each test starts its own `redis-server`.
//!
//! Needs `redis-server` on PATH (`scripts/install-redis.sh`); without it every test fails
//! saying so.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tollgate::redis::{BackendError, FailurePolicy, RedisLimiter};
use tollgate::{Decision, RateLimiter};

use crate::hammer::hammer;
use crate::redis_server::{self, RedisServer};

const TIMEOUT: Duration = Duration::from_millis(300);
/// Long enough that the six calls after a kill all fall inside one probe interval.
const PROBE: Duration = Duration::from_secs(1);
/// Slack for scheduling on a busy machine, on top of the timeout.
const SLACK: Duration = Duration::from_millis(250);

/// Every message logged through the `log` facade by this test binary.
fn logged() -> &'static Mutex<Vec<String>> {
    struct Capture;
    impl log::Log for Capture {
        fn enabled(&self, _: &log::Metadata<'_>) -> bool {
            true
        }
        fn log(&self, record: &log::Record<'_>) {
            if record.target().starts_with("tollgate") {
                logged()
                    .lock()
                    .unwrap()
                    .push(format!("{} {}", record.level(), record.args()));
            }
        }
        fn flush(&self) {}
    }
    static LOGGED: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    static INIT: OnceLock<()> = OnceLock::new();
    INIT.get_or_init(|| {
        static CAPTURE: Capture = Capture;
        let _ = log::set_logger(&CAPTURE);
        log::set_max_level(log::LevelFilter::Info);
    });
    LOGGED.get_or_init(|| Mutex::new(Vec::new()))
}

fn was_logged(prefix: &str, level: &str, text: &str) -> bool {
    logged()
        .lock()
        .unwrap()
        .iter()
        .any(|m| m.starts_with(level) && m.contains(text) && m.contains(prefix))
}

async fn limiter(
    server: &RedisServer,
    policy: &str,
    prefix: &str,
    failure: FailurePolicy,
    probe: Duration,
) -> RedisLimiter {
    let _ = logged();
    RedisLimiter::builder(policy.parse().unwrap())
        .prefix(prefix)
        .timeout(TIMEOUT)
        .probe_interval(probe)
        .failure_policy(failure)
        .deny_cache(0)
        .connect(&server.url())
        .await
        .unwrap()
}

/// Kills Redis after one decision, checks that the next decisions come from the failure
/// policy (`check`) within the timeout, restarts Redis, and checks that decisions come from
/// Redis again. Returns the failure decisions.
async fn kill_and_restart(
    prefix: &str,
    failure: FailurePolicy,
) -> Vec<Result<Decision, BackendError>> {
    let mut server = RedisServer::start();
    let limiter = limiter(&server, "2/1h", prefix, failure, PROBE).await;
    let first = limiter.try_acquire("k").await.unwrap();
    assert!(first.is_allowed() && first.remaining() == 1);

    server.kill();
    let mut outcomes = Vec::new();
    for i in 0..6 {
        let start = Instant::now();
        outcomes.push(limiter.try_acquire("k").await);
        let took = start.elapsed();
        assert!(took <= TIMEOUT + SLACK, "call {i} took {took:?}");
        if i > 0 {
            // Switched: the failure policy decides at once, without waiting on Redis.
            assert!(
                took < TIMEOUT,
                "call {i} waited {took:?} on a known-down Redis"
            );
        }
    }
    let stats = limiter.stats();
    assert_eq!(stats.switches_to_failure, 1, "{stats:?}");
    assert_eq!(stats.failure_decisions, 6, "{stats:?}");
    assert_eq!(stats.redis_decisions, 1, "{stats:?}");
    assert!(limiter.is_failing());
    assert!(was_logged(prefix, "WARN", "deciding by the failure policy"));

    server.restart();
    let start = Instant::now();
    loop {
        let before = limiter.stats().redis_decisions;
        let outcome = limiter.try_acquire("k").await;
        if limiter.stats().redis_decisions > before {
            // Redis restarted empty (persistence off): a fresh key.
            let d = outcome.unwrap();
            assert!(d.is_allowed() && d.remaining() == 1, "{d:?}");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "decisions did not recover after the restart: {:?}",
            limiter.stats()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats = limiter.stats();
    assert_eq!(stats.switches_to_redis, 1, "{stats:?}");
    assert!(
        stats.script_reloads >= 1,
        "the restarted Redis had to get the script again"
    );
    assert!(!limiter.is_failing());
    assert!(was_logged(prefix, "INFO", "redis answers again"));
    outcomes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_fail_open() {
    for outcome in kill_and_restart("open", FailurePolicy::Open).await {
        let d = outcome.unwrap();
        assert!(d.is_allowed(), "{d:?}");
        assert_eq!(d.limit(), 2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_fail_closed() {
    for outcome in kill_and_restart("closed", FailurePolicy::Closed).await {
        let d = outcome.unwrap();
        assert!(!d.is_allowed(), "{d:?}");
        assert_eq!(d.retry_after(), PROBE);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_fall_back_to_a_local_limiter() {
    let local = RateLimiter::new("3/1h".parse().unwrap());
    let outcomes = kill_and_restart("local", FailurePolicy::Local(local)).await;
    let allowed: Vec<bool> = outcomes
        .iter()
        .map(|o| o.as_ref().unwrap().is_allowed())
        .collect();
    assert_eq!(allowed, [true, true, true, false, false, false]);
    assert_eq!(outcomes[2].as_ref().unwrap().remaining(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_fail_with_an_error() {
    let outcomes = kill_and_restart("error", FailurePolicy::Error).await;
    assert!(
        matches!(
            outcomes[0],
            Err(BackendError::Redis(_) | BackendError::Timeout(_))
        ),
        "{:?}",
        outcomes[0]
    );
    for outcome in &outcomes[1..] {
        assert!(
            matches!(outcome, Err(BackendError::Unavailable)),
            "{outcome:?}"
        );
    }
}

/// Redis killed and restarted while the limiter sits idle: the limiter's connection is dead
/// but nothing has told it so. Its first call finds the connection dropped, is sent again on
/// the fresh one, and is decided by Redis: no error, no switch to the failure policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_while_idle_first_call_is_decided_by_redis() {
    let run = async {
        let mut server = RedisServer::start();
        let limiter = limiter(&server, "2/1h", "idle", FailurePolicy::Error, PROBE).await;
        let first = limiter.try_acquire("k").await.unwrap();
        assert!(first.is_allowed() && first.remaining() == 1);

        server.restart();
        let after = limiter.try_acquire("k").await;
        // Redis restarted empty (persistence off): a fresh key.
        let after = after.unwrap_or_else(|e| panic!("first call after the restart: {e}"));
        assert!(after.is_allowed() && after.remaining() == 1, "{after:?}");
        let stats = limiter.stats();
        assert_eq!(stats.redis_decisions, 2, "{stats:?}");
        assert_eq!(stats.failure_decisions, 0, "{stats:?}");
        assert_eq!(stats.switches_to_failure, 0, "{stats:?}");
        assert!(!limiter.is_failing());
    };
    tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .expect("the test did not finish within 60 s");
}

/// A probe interval meant as "never" (`Duration::MAX`) counts as an hour: `Closed` tells
/// clients to come back within the hour, and a Redis back up is asked again by then.
#[tokio::test]
async fn a_probe_interval_above_an_hour_counts_as_an_hour() {
    let mut server = RedisServer::start();
    let limiter = limiter(
        &server,
        "3/1h",
        "probe-max",
        FailurePolicy::Closed,
        Duration::MAX,
    )
    .await;
    assert!(limiter.try_acquire("k").await.unwrap().is_allowed());
    server.kill();
    let d = limiter.try_acquire("k").await.unwrap();
    assert!(!d.is_allowed(), "{d:?}");
    assert_eq!(d.retry_after(), Duration::from_secs(3600));
}

/// A Redis that accepts connections but answers nothing (SIGSTOP): the call gives up at
/// the timeout, the failure policy decides, and Redis decides again once it resumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_redis_times_out_then_recovers() {
    let server = RedisServer::start();
    let probe = Duration::from_millis(100);
    let limiter = limiter(&server, "3/1h", "paused", FailurePolicy::Closed, probe).await;
    assert_eq!(limiter.try_acquire("k").await.unwrap().remaining(), 2);
    server.pause();
    let start = Instant::now();
    let d = limiter.try_acquire("k").await.unwrap();
    let took = start.elapsed();
    assert!(!d.is_allowed());
    assert_eq!(d.retry_after(), probe);
    assert!(took >= TIMEOUT && took <= TIMEOUT + SLACK, "took {took:?}");
    let stats = limiter.stats();
    assert_eq!(
        (stats.timeouts, stats.switches_to_failure),
        (1, 1),
        "{stats:?}"
    );
    // Calls within the probe interval do not wait at all.
    let start = Instant::now();
    assert!(!limiter.try_acquire("k").await.unwrap().is_allowed());
    assert!(start.elapsed() < TIMEOUT);
    server.resume();
    let start = Instant::now();
    while limiter.is_failing() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            limiter.stats()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        let _ = limiter.try_acquire("other").await.unwrap();
    }
    // The timed-out call was already on the wire and ran once Redis resumed: a timed-out
    // call may have spent its permits, but it is never sent twice. "k" had 3: one spent
    // before, one by the timed-out call, one left.
    let d = limiter.peek("k").await.unwrap();
    assert!(d.is_allowed() && d.remaining() == 0, "{d:?}");
    assert_eq!(limiter.stats().switches_to_redis, 1);
}

/// `FUNCTION FLUSH` and `SCRIPT FLUSH` in a loop while four limiters hammer one key of
/// capacity 1,000: every call succeeds, the code is loaded again, and exactly 1,000 are
/// admitted. Once on a server where the limiters call a function, and once where the
/// user's ACL denies `FUNCTION` and `FCALL`, so they load a script and call it with
/// `EVALSHA` (as on Redis before 7).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn script_flush_mid_run_loses_and_double_counts_nothing() {
    let server = RedisServer::start();
    for functions in [true, false] {
        let acl: &[&str] = if functions {
            &["ACL", "SETUSER", "default", "+@all"]
        } else {
            &["ACL", "SETUSER", "default", "-function", "-fcall"]
        };
        assert_eq!(server.command(acl).text(), "OK");
        for policy in [
            "1000/3650d",
            "1000/3650d & sliding-log 1000/3650d & sliding-counter 1000/3650d",
        ] {
            server.command(&["CONFIG", "RESETSTAT"]);
            let mut limiters = Vec::new();
            for _ in 0..4 {
                limiters.push(
                    RedisLimiter::builder(policy.parse().unwrap())
                        .prefix("flush")
                        .timeout(Duration::from_secs(10))
                        .deny_cache(0)
                        .connect(&server.url())
                        .await
                        .unwrap(),
                );
            }
            let stop = Arc::new(AtomicBool::new(false));
            let flushes = Arc::new(AtomicU64::new(0));
            let port = server.port();
            let flusher = {
                let (stop, flushes) = (Arc::clone(&stop), Arc::clone(&flushes));
                std::thread::spawn(move || {
                    let flush: &[&str] = if functions {
                        &["FUNCTION", "FLUSH"]
                    } else {
                        &["SCRIPT", "FLUSH"]
                    };
                    while !stop.load(Ordering::Relaxed) {
                        let reply = redis_server::command_at(port, flush).unwrap();
                        assert_eq!(reply, redis_server::Reply::Status("OK".into()));
                        flushes.fetch_add(1, Ordering::Relaxed);
                        std::thread::sleep(Duration::from_millis(2));
                    }
                })
            };
            let admitted = hammer(&limiters, 8, 60).await;
            stop.store(true, Ordering::Relaxed);
            flusher.join().unwrap();
            let reloads: u64 = limiters.iter().map(|l| l.stats().script_reloads).sum();
            let decided: u64 = limiters.iter().map(|l| l.stats().redis_decisions).sum();
            assert_eq!(admitted, 1000, "{policy}");
            assert_eq!(decided, 4 * 8 * 60, "{policy}");
            assert!(
                reloads >= 1 && flushes.load(Ordering::Relaxed) >= 1,
                "{policy}: {reloads} reloads, {flushes:?} flushes"
            );
            let (fcall, evalsha) = (
                server.command_stat("fcall", "calls") as u64,
                server.command_stat("evalsha", "calls") as u64,
            );
            if functions {
                assert!(
                    fcall >= decided && evalsha == 0,
                    "{policy}: {fcall} FCALL, {evalsha} EVALSHA"
                );
            } else {
                assert!(
                    fcall == 0 && evalsha >= 1,
                    "{policy}: {fcall} FCALL, {evalsha} EVALSHA"
                );
            }
            server.command(&["FLUSHALL"]);
        }
    }
    server.command(&["ACL", "SETUSER", "default", "+@all"]);
}

/// Every call in flight when Redis loses the function meets "function not found"; one
/// `FUNCTION LOAD` serves them all (each load compiles the whole library, blocking Redis
/// meanwhile), and every call is still decided by Redis, exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_in_flight_when_the_function_is_lost_reload_it_once() {
    let server = RedisServer::start();
    let limiter = RedisLimiter::builder("1000/1h".parse().unwrap())
        .prefix("storm")
        .timeout(Duration::from_secs(10))
        .deny_cache(0)
        .connect(&server.url())
        .await
        .unwrap();
    assert_eq!(server.command_stat("function|load", "calls"), 1.0);
    for round in 1..=3u64 {
        server.command(&["FUNCTION", "FLUSH"]);
        let calls: Vec<_> = (0..64)
            .map(|i| {
                let limiter = limiter.clone();
                tokio::spawn(async move { limiter.try_acquire(&format!("k{i}")).await })
            })
            .collect();
        for call in calls {
            let decision = call.await.unwrap().unwrap();
            assert!(decision.is_allowed(), "{decision:?}");
        }
        let loads = server.command_stat("function|load", "calls") as u64;
        assert_eq!(loads, 1 + round, "round {round}: {loads} FUNCTION LOADs");
        assert_eq!(limiter.stats().script_reloads, round);
        assert_eq!(
            server.command_stat("eval", "calls"),
            0.0,
            "no call fell back"
        );
    }
    assert_eq!(limiter.stats().redis_decisions, 3 * 64);
}

/// The function lost where it cannot be loaded again (an ACL that no longer allows
/// `FUNCTION LOAD`): the calls in flight do not each try in turn, blocking one another; one
/// refused attempt sends them all as `EVAL`, which Redis runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_reload_is_tried_once_for_the_calls_in_flight() {
    let server = RedisServer::start();
    let limiter = RedisLimiter::builder("100000/1h".parse().unwrap())
        .prefix("refused-reload")
        .timeout(Duration::from_secs(10))
        .deny_cache(0)
        .connect(&server.url())
        .await
        .unwrap();
    server.command(&["ACL", "SETUSER", "default", "-function|load"]);
    server.command(&["FUNCTION", "FLUSH"]);
    let calls: Vec<_> = (0..200)
        .map(|i| {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.try_acquire(&format!("k{i}")).await })
        })
        .collect();
    let mut decided = 0;
    for call in calls {
        decided += usize::from(call.await.unwrap().is_ok_and(|d| d.is_allowed()));
    }
    let refused = server.command_stat("function|load", "rejected_calls") as u64;
    let evals = server.command_stat("eval", "calls") as u64;
    server.command(&["ACL", "SETUSER", "default", "+@all"]);
    assert_eq!(decided, 200, "every call decided by Redis, as EVAL");
    // Calls sent after an attempt ended may meet the loss again and try once more each
    // time: a few, not one per call.
    assert!(
        (1..=5).contains(&refused),
        "{refused} FUNCTION LOADs tried for one loss"
    );
    assert!(evals >= 200 - 5, "{evals} EVAL");
    assert_eq!(limiter.stats().script_reloads, 0, "nothing was loaded");
}

/// A user whose ACL lets it load functions but not call them: the first refused `FCALL`
/// sends the call as a script, and every later call goes as one.
#[tokio::test]
async fn fcall_denied_while_function_load_is_allowed_uses_the_script() {
    let server = RedisServer::start();
    server.command(&["ACL", "SETUSER", "default", "-fcall", "-fcall_ro"]);
    let limiter = RedisLimiter::builder("2/1h".parse().unwrap())
        .prefix("no-fcall")
        .deny_cache(0)
        .connect(&server.url())
        .await
        .unwrap();
    for expected in [true, true, false] {
        let decision = limiter.try_acquire("k").await.unwrap();
        assert_eq!(decision.is_allowed(), expected, "{decision:?}");
    }
    let rejected = server.command_stat("fcall", "rejected_calls") as u64;
    let evalsha = server.command_stat("evalsha", "calls") as u64;
    server.command(&["ACL", "SETUSER", "default", "+@all"]);
    assert_eq!(rejected, 1, "FCALL tried once");
    assert!(evalsha >= 2, "{evalsha} EVALSHA");
    assert_eq!(
        limiter.stats().script_reloads,
        0,
        "a script never loaded was not lost"
    );
}

/// Redis full (`maxmemory` with `noeviction`): a limiter that connects then uses the script,
/// and one connected before, calling a function, has each call Redis refuses with `OOM`
/// sent again as a script. Either way Redis still answers a refusal, and an admission, which
/// would write, gets the failure policy.
#[tokio::test]
async fn redis_out_of_memory_still_answers_refusals() {
    let server = RedisServer::start();
    let url = server.url();
    let connect = || {
        RedisLimiter::builder("1/1h".parse().unwrap())
            .prefix("oom")
            .deny_cache(0)
            .failure_policy(FailurePolicy::Closed)
            .timeout(Duration::from_secs(2))
            .connect(&url)
    };
    let before = connect().await.unwrap();
    assert!(before.try_acquire("spent").await.unwrap().is_allowed());
    assert_eq!(
        server.command(&["CONFIG", "SET", "maxmemory", "1"]).text(),
        "OK"
    );
    server.command(&["FUNCTION", "FLUSH"]);
    let during = connect().await.unwrap();
    for limiter in [&before, &during] {
        let refused = limiter.try_acquire("spent").await.unwrap();
        assert!(
            !refused.is_allowed() && refused.retry_after() > Duration::ZERO,
            "{refused:?}"
        );
        // An admission would write: Redis refuses it, and the failure policy (closed) decides.
        let failed = limiter.try_acquire("fresh").await.unwrap();
        assert!(!failed.is_allowed());
    }
    let failures = before.stats().failure_decisions + during.stats().failure_decisions;
    server.command(&["CONFIG", "SET", "maxmemory", "0"]);
    assert_eq!(failures, 2, "the two admissions, not the refusals");
}
