//! The Redis backend against a real `redis-server` started by each test: the reference
//! traces, differential tests against the in-process limiter on random traces, one global
//! limit across four limiter instances, key expiry, peek, costs, and the deny cache.
//!
//! Needs `redis-server` on PATH (`scripts/install-redis.sh`); without it every test fails
//! saying so.

use std::time::Duration;

use tollgate::redis::{BackendError, RedisLimiter};
use tollgate::{CostError, Decision, FakeClock, Policy, RateLimiter};

use crate::clocked::{at, limiter_at};
use crate::hammer::hammer;
use crate::redis_server::{self, RedisServer};

const MS: u64 = 1_000; // in microseconds

/// A decision as plain numbers: allowed, remaining, limit, retry_after ns, reset_after ns.
type Fields = (bool, u64, u64, u128, u128);

fn fields(d: &Decision) -> Fields {
    (
        d.is_allowed(),
        d.remaining(),
        d.limit(),
        d.retry_after().as_nanos(),
        d.reset_after().as_nanos(),
    )
}

/// What the in-process limiter decided in ticks (1 tick = 1 ns of its FakeClock), read as
/// microseconds: the Redis script's unit.
fn in_micros(d: &Decision) -> Fields {
    let (allowed, remaining, limit, retry, reset) = fields(d);
    (allowed, remaining, limit, retry * 1_000, reset * 1_000)
}

/// `policy` with every window rounded up to whole microseconds and written in ticks: the
/// policy the Redis scripts decide, for an in-process limiter whose clock counts
/// microseconds as nanoseconds.
fn tick_policy(policy: &Policy) -> Policy {
    let mut out: Option<Policy> = None;
    for band in policy.bands() {
        let micros = u64::try_from(band.window().as_nanos().div_ceil(1_000)).unwrap();
        let band = Policy::new(
            band.algorithm(),
            band.permits(),
            Duration::from_nanos(micros),
        )
        .unwrap();
        out = Some(match out {
            None => band,
            Some(policy) => policy.and(band).unwrap(),
        });
    }
    out.unwrap()
}

/// SplitMix64: small, seedable, good enough for traces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..=max`.
    fn upto(&mut self, max: u64) -> u64 {
        if max == u64::MAX {
            self.next()
        } else {
            self.next() % (max + 1)
        }
    }
}

#[tokio::test]
async fn reference_trace_token_bucket() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    let limiter = limiter_at(&server, "5/1s", "ref", &clock).await;
    for left in (0..5).rev() {
        let d = limiter.try_acquire("alice").await.unwrap();
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), left);
    }
    let d = limiter.try_acquire("alice").await.unwrap();
    assert!(!d.is_allowed());
    assert_eq!(d.retry_after(), Duration::from_millis(200));
    at(&clock, 100 * MS);
    let d = limiter.try_acquire("alice").await.unwrap();
    assert_eq!(d.retry_after(), Duration::from_millis(100));
    at(&clock, 300 * MS);
    let d = limiter.try_acquire("alice").await.unwrap();
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 0);
    let d = limiter.try_acquire("alice").await.unwrap();
    assert_eq!(d.retry_after(), Duration::from_millis(100));
    assert_eq!(limiter.try_acquire("bob").await.unwrap().remaining(), 4);
    at(&clock, 1300 * MS);
    let d = limiter.try_acquire("alice").await.unwrap();
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 4);
}

#[tokio::test]
async fn reference_trace_sliding_log() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    let limiter = limiter_at(&server, "sliding-log 3/1s", "ref", &clock).await;
    for (t, left) in [(0, 2), (400, 1), (800, 0)] {
        at(&clock, t * MS);
        let d = limiter.try_acquire("k").await.unwrap();
        assert!(d.is_allowed(), "at {t} ms");
        assert_eq!(d.remaining(), left);
    }
    at(&clock, 900 * MS);
    let d = limiter.try_acquire("k").await.unwrap();
    assert!(!d.is_allowed());
    assert_eq!(d.retry_after(), Duration::from_millis(100));
    at(&clock, 1000 * MS);
    let d = limiter.try_acquire("k").await.unwrap();
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 0);
    at(&clock, 1050 * MS);
    let d = limiter.try_acquire("k").await.unwrap();
    assert!(!d.is_allowed());
    assert_eq!(d.retry_after(), Duration::from_millis(350));
}

#[tokio::test]
async fn reference_trace_sliding_counter() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    let limiter = limiter_at(&server, "sliding-counter 10/min", "ref", &clock).await;
    at(&clock, 50_000 * MS);
    for _ in 0..8 {
        assert!(limiter.try_acquire("k").await.unwrap().is_allowed());
    }
    at(&clock, 69_000 * MS);
    for left in [3, 2, 1, 0] {
        let d = limiter.try_acquire("k").await.unwrap();
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), left);
    }
    let d = limiter.try_acquire("k").await.unwrap();
    assert!(!d.is_allowed());
    // 6 s and one tick: the script's tick is a microsecond.
    assert_eq!(d.retry_after(), Duration::from_micros(6_000_001));
    at(&clock, 75_001 * MS);
    let d = limiter.try_acquire("k").await.unwrap();
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 0);
}

/// Runs `ops` random requests (random keys, costs, peeks and clock steps, backwards too when
/// `backwards`) through the Redis limiter and the in-process limiter of the same policy in
/// ticks, and checks every decision is the same.
async fn differential(server: &RedisServer, policy: &str, seed: u64, ops: usize, backwards: bool) {
    let parsed: Policy = policy.parse().unwrap();
    let tick = tick_policy(&parsed);
    let local_clock = FakeClock::new();
    let local: RateLimiter<String, FakeClock> =
        RateLimiter::with_clock(tick, local_clock.clone()).sweep_per_insert(0);
    let redis_clock = FakeClock::new();
    let limiter = limiter_at(server, policy, &format!("diff{seed}"), &redis_clock).await;

    let windows: Vec<u64> = tick.bands().map(|b| b.window().as_nanos() as u64).collect();
    let intervals: Vec<u64> = tick
        .bands()
        .map(|b| (b.window().as_nanos() as u64) / b.permits())
        .collect();
    let (w_min, w_max) = (
        *windows.iter().min().unwrap(),
        *windows.iter().max().unwrap(),
    );
    let t_min = *intervals.iter().min().unwrap();
    let max_cost = tick.bands().map(|b| b.permits()).min().unwrap();

    // The edges where an off-by-one would show: each band's interval and window, and one
    // tick either side. Odd seeds step by these exactly; even seeds step at random.
    let mut edges = vec![0, 1];
    for band in tick.bands() {
        let w = band.window().as_nanos() as u64;
        let t = w.div_ceil(band.permits());
        edges.extend([t - 1, t, t + 1, w - 1, w, w + 1, 2 * w]);
    }
    let exact = seed % 2 == 1;

    let mut rng = Rng(seed);
    let mut t = rng.upto(3 * w_max);
    let mut allowed = 0;
    for op in 0..ops {
        match rng.upto(99) {
            0..=69 if exact => t += edges[rng.upto(edges.len() as u64 - 1) as usize],
            0..=49 => t += rng.upto(3 * t_min),
            50..=69 => t += rng.upto(2 * w_min),
            70..=77 => t += rng.upto(2 * w_max),
            78..=85 if backwards => {
                t = t.saturating_sub(if exact {
                    edges[rng.upto(edges.len() as u64 - 1) as usize].min(w_min)
                } else {
                    rng.upto(w_min)
                })
            }
            _ => {}
        }
        assert!(t < 1 << 52, "trace ran beyond the script's clock range");
        local_clock.set(Duration::from_nanos(t));
        redis_clock.set(Duration::from_micros(t));
        let key = format!("k{}", rng.upto(2));
        let (what, got, want) = if rng.upto(9) == 0 {
            (
                "peek".to_owned(),
                limiter.peek(&key).await,
                local.peek(&key),
            )
        } else {
            let cost = if rng.upto(3) == 0 {
                1 + rng.upto(max_cost - 1)
            } else {
                1
            };
            (
                format!("cost {cost}"),
                limiter.try_acquire_n(&key, cost).await,
                local.try_acquire_n(&key, cost).unwrap(),
            )
        };
        let got = got.unwrap_or_else(|e| panic!("{policy}, seed {seed}, op {op}: {e}"));
        allowed += u64::from(got.is_allowed());
        assert_eq!(
            fields(&got),
            in_micros(&want),
            "{policy}, seed {seed}, op {op}: {what} for {key} at {t} us"
        );
    }
    // The trace exercised both outcomes.
    assert!(
        allowed > 0 && allowed < ops as u64,
        "{policy}: {allowed} of {ops} allowed"
    );
}

/// A random number below `max` + 1 of random magnitude: small, medium and huge values alike.
fn magnitude(rng: &mut Rng, max: u64) -> u64 {
    let bits = rng.upto(64) as u32;
    let x = if bits == 0 {
        0
    } else {
        rng.next() >> (64 - bits)
    };
    x.min(max)
}

/// The script's exact integer helpers (`src/redis/lua/arith.lua`: `idiv` and `muldiv`, the
/// only operations whose double results could be inexact) against `u128` arithmetic, at the
/// edges of their ranges and at random magnitudes.
#[tokio::test]
async fn lua_arithmetic_is_exact() {
    const SCRIPT: &str = concat!(
        include_str!("../../src/redis/lua/arith.lua"),
        r#"
local out = {}
for i = 1, #ARGV, 4 do
  local op, a, b, c = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  if op == 'd' then
    out[#out + 1] = fmt(idiv(a, b))
    out[#out + 1] = '0'
  else
    local q, r = muldiv(a, b, c)
    out[#out + 1] = fmt(q)
    out[#out + 1] = fmt(r)
  end
end
return out
"#
    );
    const P52: u64 = 1 << 52;
    const P51: u64 = 1 << 51;
    const P32: u64 = 1 << 32;
    let server = RedisServer::start();
    let mut rng = Rng(7);
    let mut cases: Vec<(bool, u64, u64, u64)> = Vec::new();
    // idiv(a, b) = floor(a / b) for 0 <= a, b <= 2^52 (b >= 1), near multiples above all.
    for b in [1, 2, 3, 7, 1_000_000, P32 - 1, P51 - 1, P51, P52 - 1, P52] {
        for k in [0, 1, 2, 3, P52 / b] {
            for d in [-1i64, 0, 1] {
                let a = (k * b).saturating_add_signed(d).min(P52);
                cases.push((true, a, b, 0));
            }
        }
    }
    for _ in 0..2000 {
        let b = 1 + magnitude(&mut rng, P52 - 1);
        let a = if rng.upto(1) == 0 {
            magnitude(&mut rng, P52)
        } else {
            (rng.upto(P52 / b) * b)
                .saturating_add_signed(rng.upto(2) as i64 - 1)
                .min(P52)
        };
        cases.push((true, a, b, 0));
    }
    // muldiv(a, b, c) for 0 <= a < 2^32, 0 <= b <= 2^51, 1 <= c <= 2^51.
    let edges_a = [0, 1, 2, 3, (1 << 31) - 1, 1 << 31, P32 - 1];
    let edges_c = [1, 2, 3, 1_000_000, (1 << 31) - 1, 1 << 50, P51 - 1, P51];
    for &a in &edges_a {
        for &c in &edges_c {
            for b in [
                0,
                1,
                c - 1,
                c,
                (c + 1).min(P51),
                P51,
                P52 / a.max(1) - 1,
                P52 / a.max(1),
            ] {
                cases.push((false, a, b.min(P51), c));
            }
        }
    }
    for _ in 0..4000 {
        let a = magnitude(&mut rng, P32 - 1);
        let b = magnitude(&mut rng, P51);
        let c = 1 + magnitude(&mut rng, P51 - 1);
        cases.push((false, a, b, c));
    }
    for batch in cases.chunks(500) {
        let mut args: Vec<String> = vec!["EVAL".into(), SCRIPT.into(), "0".into()];
        for &(div, a, b, c) in batch {
            args.extend([
                if div { "d" } else { "m" }.to_owned(),
                a.to_string(),
                b.to_string(),
                c.to_string(),
            ]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let redis_server::Reply::Array(reply) = server.command(&args) else {
            panic!("the arithmetic script failed")
        };
        for (&(div, a, b, c), got) in batch.iter().zip(reply.chunks(2)) {
            let got = (got[0].text(), got[1].text());
            let want = if div {
                ((a / b).to_string(), "0".to_owned())
            } else {
                let product = u128::from(a) * u128::from(b);
                let q = product / u128::from(c);
                if q >= u128::from(P52) {
                    ((1u64 << 60).to_string(), "0".to_owned())
                } else {
                    (q.to_string(), (product % u128::from(c)).to_string())
                }
            };
            assert_eq!(
                got,
                want,
                "{} {a} {b} {c}",
                if div { "idiv" } else { "muldiv" }
            );
        }
    }
}

const TOKEN_BUCKETS: &[&str] = &[
    "5/1s",
    "3/1s",
    "7/10ms",
    "1/1ms",
    "100/1min",
    "1000000000/100d",
];
const SLIDING_LOGS: &[&str] = &[
    "sliding-log 3/1s",
    "sliding-log 5/20ms",
    "sliding-log 1/1ms",
    "sliding-log 50/1min",
];
const SLIDING_COUNTERS: &[&str] = &[
    "sliding-counter 10/min",
    "sliding-counter 4/100us",
    "sliding-counter 7/1ms",
    "sliding-counter 1/1us",
    "sliding-counter 1000000/1d",
    "sliding-counter 2000000000/100d",
];
const COMPOSITES: &[&str] = &[
    "10/s & sliding-log 3/100ms",
    "sliding-counter 5/10ms & sliding-log 20/1s & 100/1h",
    "3/1ms & sliding-counter 5/2ms",
    "sliding-log 2/1ms & sliding-counter 9/7ms & 30/50ms & sliding-log 40/1s",
];

async fn differential_all(policies: &[&str], backwards: bool) {
    let server = RedisServer::start();
    for (i, policy) in policies.iter().enumerate() {
        for seed in 0..4 {
            differential(&server, policy, 1000 * i as u64 + seed, 400, backwards).await;
        }
    }
}

#[tokio::test]
async fn differential_token_bucket() {
    differential_all(TOKEN_BUCKETS, false).await;
}

#[tokio::test]
async fn differential_sliding_log() {
    differential_all(SLIDING_LOGS, false).await;
}

#[tokio::test]
async fn differential_sliding_counter() {
    differential_all(SLIDING_COUNTERS, false).await;
}

#[tokio::test]
async fn differential_composite() {
    differential_all(COMPOSITES, false).await;
}

#[tokio::test]
async fn differential_with_backwards_clock() {
    let all: Vec<&str> = [TOKEN_BUCKETS, SLIDING_LOGS, SLIDING_COUNTERS, COMPOSITES].concat();
    differential_all(&all, true).await;
}

/// Four limiter instances, each with its own connection and eight tasks, hammer one key
/// whose policy admits 1,000 and refills nothing during the test: exactly 1,000 are
/// admitted in all, for each algorithm and a composite.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn global_limit_across_four_instances() {
    let server = RedisServer::start();
    for policy in [
        "1000/3650d",
        "sliding-log 1000/3650d",
        "sliding-counter 1000/3650d",
        "1000/3650d & sliding-counter 1500/3650d & sliding-log 1200/3650d",
    ] {
        let mut limiters = Vec::new();
        for _ in 0..4 {
            limiters.push(
                RedisLimiter::builder(policy.parse().unwrap())
                    .prefix("global")
                    .timeout(Duration::from_secs(10))
                    .connect(&server.url())
                    .await
                    .unwrap(),
            );
        }
        let admitted = hammer(&limiters, 8, 60).await;
        assert_eq!(admitted, 1000, "{policy}");
        let stats: Vec<_> = limiters.iter().map(RedisLimiter::stats).collect();
        let decided: u64 = stats
            .iter()
            .map(|s| s.redis_decisions + s.cached_refusals)
            .sum();
        assert_eq!(decided, 4 * 8 * 60, "{policy}: {stats:?}");
        assert!(stats.iter().all(|s| s.failure_decisions == 0), "{stats:?}");
        // The deny cache answered most refusals locally.
        assert!(
            stats.iter().map(|s| s.cached_refusals).sum::<u64>() > 0,
            "{stats:?}"
        );
        server.command(&["FLUSHALL"]);
    }
}

#[tokio::test]
async fn keys_expire_when_at_rest() {
    let server = RedisServer::start();
    let limiter = RedisLimiter::builder(
        "2/200ms & sliding-log 2/300ms & sliding-counter 5/1s"
            .parse()
            .unwrap(),
    )
    .prefix("ttl")
    .connect(&server.url())
    .await
    .unwrap();
    let keys = limiter.redis_keys("alice");
    assert_eq!(
        keys,
        [
            "ttl:{alice}:tb:2/200ms",
            "ttl:{alice}:sl:2/300ms",
            "ttl:{alice}:sc:5/1s"
        ]
    );
    let d = limiter.try_acquire("alice").await.unwrap();
    assert!(d.is_allowed());
    let pttl = |key: &str| server.command(&["PTTL", key]).int();
    // reset_after of each band, in ms, rounded up: the token bucket's is one interval.
    assert!((1..=100).contains(&pttl(&keys[0])), "{}", pttl(&keys[0]));
    assert!((200..=300).contains(&pttl(&keys[1])), "{}", pttl(&keys[1]));
    // The counter's lasts until its window's successor ends: between 1 and 2 s.
    assert!((900..=2000).contains(&pttl(&keys[2])), "{}", pttl(&keys[2]));
    // A refusal writes nothing, so it leaves the expiry alone.
    let _ = limiter.try_acquire("alice").await.unwrap();
    let before = pttl(&keys[1]);
    assert!(!limiter.try_acquire("alice").await.unwrap().is_allowed());
    assert!(pttl(&keys[1]) <= before);
    tokio::time::sleep(Duration::from_millis(2300)).await;
    for key in &keys {
        assert_eq!(
            server.command(&["EXISTS", key]).int(),
            0,
            "{key} outlived its state"
        );
    }
}

/// Redis `TIME` in microseconds.
fn redis_time(server: &RedisServer) -> u64 {
    let time = server.command(&["TIME"]);
    let redis_server::Reply::Array(parts) = time else {
        panic!("{time:?}")
    };
    parts[0].text().parse::<u64>().unwrap() * 1_000_000 + parts[1].text().parse::<u64>().unwrap()
}

#[tokio::test]
async fn keys_expire_from_their_newest_instant_when_the_clock_went_back() {
    // State written a minute ahead of Redis's clock (a clock stepped back since, or a
    // failover to a replica behind), then admitted on Redis TIME: each key must live until
    // its newest entry or stored window has rolled out, a minute and more, not W from now.
    let server = RedisServer::start();
    let policy = "sliding-log 2/1s & sliding-counter 5/1s";
    let ahead = FakeClock::new();
    at(&ahead, redis_time(&server) + 60_000 * MS);
    let early = limiter_at(&server, policy, "back", &ahead).await;
    assert!(early.try_acquire("k").await.unwrap().is_allowed());
    let limiter = RedisLimiter::builder(policy.parse().unwrap())
        .prefix("back")
        .deny_cache(0)
        .connect(&server.url())
        .await
        .unwrap();
    assert!(limiter.try_acquire("k").await.unwrap().is_allowed());
    let keys = limiter.redis_keys("k");
    let pttl = |key: &str| server.command(&["PTTL", key]).int();
    // The log's newest entry is stamped a minute ahead: it leaves 1 s after that.
    assert!(
        (60_000..=61_000).contains(&pttl(&keys[0])),
        "{}",
        pttl(&keys[0])
    );
    // The counter's stored window starts up to 1 s before a minute ahead: its counts roll
    // out two windows after that start.
    assert!(
        (60_000..=62_000).contains(&pttl(&keys[1])),
        "{}",
        pttl(&keys[1])
    );
}

#[tokio::test]
async fn peek_and_refusals_write_nothing() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    let policy = "2/1s & sliding-log 3/1s & sliding-counter 4/1s";
    let limiter = limiter_at(&server, policy, "peek", &clock).await;
    let keys = limiter.redis_keys("k");
    let dump = || -> Vec<String> {
        vec![
            format!("{:?}", server.command(&["GET", &keys[0]])),
            format!(
                "{:?}",
                server.command(&["ZRANGE", &keys[1], "0", "-1", "WITHSCORES"])
            ),
            format!("{:?}", server.command(&["HGETALL", &keys[2]])),
        ]
    };
    // A peek on a fresh key creates nothing.
    let peeked = limiter.peek("k").await.unwrap();
    assert_eq!(
        server
            .command(&["EXISTS", &keys[0], &keys[1], &keys[2]])
            .int(),
        0
    );
    assert_eq!(peeked, limiter.try_acquire("k").await.unwrap());
    at(&clock, 10 * MS);
    assert!(limiter.try_acquire("k").await.unwrap().is_allowed());
    let state = dump();
    let refused = limiter.try_acquire("k").await.unwrap();
    assert!(!refused.is_allowed());
    assert_eq!(dump(), state, "a refusal changed the state");
    assert_eq!(limiter.peek("k").await.unwrap(), refused);
    assert_eq!(dump(), state, "a peek changed the state");
}

#[tokio::test]
async fn costs_are_checked_before_redis() {
    let server = RedisServer::start();
    let limiter = RedisLimiter::connect(&server.url(), "5/s & 3/min".parse().unwrap())
        .await
        .unwrap();
    assert!(matches!(
        limiter.try_acquire_n("k", 0).await,
        Err(BackendError::Cost(CostError::Zero))
    ));
    let err = limiter.try_acquire_n("k", 4).await.unwrap_err();
    assert!(
        matches!(
            err,
            BackendError::Cost(CostError::ExceedsLimit { cost: 4, limit: 3 })
        ),
        "{err}"
    );
    assert_eq!(limiter.stats().redis_decisions, 0);
    assert_eq!(limiter.try_acquire_n("k", 3).await.unwrap().remaining(), 0);
}

#[tokio::test]
async fn unsupported_policies_and_prefixes_are_refused_at_connect() {
    let server = RedisServer::start();
    let err = RedisLimiter::connect(&server.url(), "5/4us".parse().unwrap())
        .await
        .unwrap_err();
    assert!(
        matches!(err, BackendError::UnsupportedPolicy { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("5/4us"), "{err}");
    let err = RedisLimiter::builder("5/s".parse().unwrap())
        .prefix("a{b}")
        .connect(&server.url())
        .await
        .unwrap_err();
    assert!(matches!(err, BackendError::InvalidPrefix { .. }), "{err}");
}

#[tokio::test]
async fn odd_keys_stay_apart_and_reset_clears_them() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    let limiter = limiter_at(&server, "1/1h & sliding-log 1/1h", "odd", &clock).await;
    let keys = ["", "%", "}", "{", "a}b", "a%7Db", "ünï", "a b:c"];
    for key in keys {
        assert!(
            limiter.try_acquire(key).await.unwrap().is_allowed(),
            "{key:?}"
        );
    }
    for key in keys {
        assert!(
            !limiter.try_acquire(key).await.unwrap().is_allowed(),
            "{key:?}"
        );
    }
    assert!(limiter.reset("a}b").await.unwrap());
    assert!(!limiter.reset("a}b").await.unwrap());
    assert!(limiter.try_acquire("a}b").await.unwrap().is_allowed());
    assert!(!limiter.try_acquire("a%7Db").await.unwrap().is_allowed());
}

/// With one clock for Redis and the cache, a cached refusal is exactly what Redis would
/// have answered at that instant (refused, with the same retry_after and reset_after;
/// remaining is a lower bound), for random traces of costs and times on one limiter.
#[tokio::test]
async fn deny_cache_refuses_only_what_redis_would() {
    let server = RedisServer::start();
    for policy in [
        "5/1s",
        "sliding-log 3/1s",
        "sliding-counter 10/min",
        "2/100ms & sliding-counter 5/1s & sliding-log 4/300ms",
    ] {
        for seed in 0..3 {
            let parsed: Policy = policy.parse().unwrap();
            let prefix = format!("cache{seed}");
            let clock = FakeClock::new();
            let cached = RedisLimiter::builder(parsed)
                .prefix(&prefix)
                .test_clock(clock.clone())
                .timeout(Duration::from_secs(10))
                .connect(&server.url())
                .await
                .unwrap();
            // The same state, seen without a cache: what Redis answers.
            let plain = limiter_at(&server, policy, &prefix, &clock).await;
            let window = parsed
                .bands()
                .map(|b| b.window().as_micros() as u64)
                .max()
                .unwrap();
            let max_cost = parsed.bands().map(|b| b.permits()).min().unwrap();
            let mut rng = Rng(seed);
            let mut t = 0;
            for op in 0..400 {
                t += match rng.upto(9) {
                    0..=5 => rng.upto(window / 50),
                    6..=7 => 0,
                    _ => rng.upto(window),
                };
                at(&clock, t);
                let cost = if rng.upto(3) == 0 {
                    1 + rng.upto(max_cost - 1)
                } else {
                    1
                };
                let before = cached.stats().cached_refusals;
                let got = cached.try_acquire_n("k", cost).await.unwrap();
                if cached.stats().cached_refusals > before {
                    // Answered locally. Redis, asked the same at the same instant, refuses it
                    // too (a refusal writes nothing), with the same retry and reset.
                    let truth = plain.try_acquire_n("k", cost).await.unwrap();
                    let (a, r, l, retry, reset) = fields(&got);
                    let (ta, tr, tl, tretry, treset) = fields(&truth);
                    assert!(
                        !a && !ta,
                        "{policy} op {op}: cached {got:?}, redis {truth:?}"
                    );
                    // Remaining (and, for a composite, the band it comes from, hence the
                    // limit) are as of Redis's refusal: a lower bound of what is available.
                    assert_eq!((retry, reset), (tretry, treset), "{policy} op {op}");
                    assert!(r <= tr, "{policy} op {op}: {got:?} {truth:?}");
                    if !parsed.is_composite() {
                        assert_eq!(l, tl, "{policy} op {op}");
                    }
                }
            }
            assert!(
                cached.stats().cached_refusals > 0,
                "{policy}: the cache never answered"
            );
        }
    }
}

/// A cached refusal stops at the refused request's retry instant, and other costs than the
/// refused one still go to Redis.
#[tokio::test]
async fn deny_cache_expires_at_retry_after_and_respects_cost() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    let limiter = RedisLimiter::builder("5/1s".parse().unwrap())
        .prefix("expiry")
        .test_clock(clock.clone())
        .connect(&server.url())
        .await
        .unwrap();
    assert_eq!(limiter.try_acquire_n("k", 4).await.unwrap().remaining(), 1);
    // Cost 3 is refused by Redis: 1 left, retry after 2 intervals (400 ms).
    let refused = limiter.try_acquire_n("k", 3).await.unwrap();
    assert_eq!(refused.retry_after(), Duration::from_millis(400));
    assert_eq!(limiter.stats().redis_decisions, 2);
    // Cost 3 again: answered locally, counted down.
    at(&clock, 100 * MS);
    let d = limiter.try_acquire_n("k", 3).await.unwrap();
    assert!(!d.is_allowed());
    assert_eq!(d.retry_after(), Duration::from_millis(300));
    assert_eq!(limiter.stats().cached_refusals, 1);
    // Cost 5 goes to Redis (its retry_after differs), and replaces the cached refusal.
    let d = limiter.try_acquire_n("k", 5).await.unwrap();
    assert_eq!(d.retry_after(), Duration::from_millis(700));
    assert_eq!(limiter.stats().redis_decisions, 3);
    // Cost 1 fits: Redis admits it.
    assert!(limiter.try_acquire("k").await.unwrap().is_allowed());
    assert_eq!(limiter.stats().redis_decisions, 4);
    // Cost 3 is refused by Redis again (its refusal cached once more).
    let d = limiter.try_acquire_n("k", 3).await.unwrap();
    assert_eq!(d.retry_after(), Duration::from_millis(500));
    assert_eq!(limiter.stats().redis_decisions, 5);
    // Just before the cached deadline (600 ms): still cached. At it: Redis admits.
    at(&clock, 600 * MS - 1);
    let d = limiter.try_acquire_n("k", 3).await.unwrap();
    assert_eq!(d.retry_after(), Duration::from_micros(1));
    assert_eq!(limiter.stats().cached_refusals, 2);
    at(&clock, 600 * MS);
    let d = limiter.try_acquire_n("k", 3).await.unwrap();
    assert!(d.is_allowed());
    assert_eq!(limiter.stats().redis_decisions, 6);
}

#[tokio::test]
async fn time_comes_from_redis() {
    let server = RedisServer::start();
    let limiter = RedisLimiter::builder("sliding-log 2/1s".parse().unwrap())
        .prefix("time")
        .connect(&server.url())
        .await
        .unwrap();
    let _ = limiter.try_acquire("k").await.unwrap();
    let key = &limiter.redis_keys("k")[0];
    let entry = server.command(&["ZRANGE", key, "0", "0", "WITHSCORES"]);
    let redis_server::Reply::Array(items) = entry else {
        panic!("{entry:?}")
    };
    let stamp: f64 = items[1].text().parse().unwrap();
    let time = server.command(&["TIME"]);
    let redis_server::Reply::Array(parts) = time else {
        panic!("{time:?}")
    };
    let now =
        parts[0].text().parse::<f64>().unwrap() * 1e6 + parts[1].text().parse::<f64>().unwrap();
    assert!(
        stamp <= now && now - stamp < 5e6,
        "stamp {stamp} us, Redis TIME {now} us"
    );
}

/// `available` on Redis: the largest cost admitted now, one more than a peek's remaining
/// while anything is left, and the same as the in-process limiter's on each algorithm.
#[tokio::test]
async fn available_is_the_largest_cost_admitted_now() {
    let server = RedisServer::start();
    for (i, policy) in [
        "10/1s",
        "sliding-log 5/1s",
        "sliding-counter 7/1s",
        "4/1s & 9/3s",
    ]
    .into_iter()
    .enumerate()
    {
        let clock = FakeClock::new();
        at(&clock, 60_000 * MS);
        let limiter = limiter_at(&server, policy, &format!("available{i}"), &clock).await;
        let limit = limiter.peek("k").await.unwrap().limit();
        assert_eq!(
            limiter.available("k").await.unwrap(),
            limit,
            "{policy}: fresh"
        );
        for (step, cost) in [3u64, 1, 2, 1].into_iter().enumerate() {
            let before = limiter.available("k").await.unwrap();
            let at_step = format!("{policy}, step {step}");
            if before < limit {
                let more = limiter.try_acquire_n("k", before + 1).await.unwrap();
                assert!(!more.is_allowed(), "{at_step}");
                assert_eq!(more.remaining(), before, "{at_step}");
            }
            let cost = cost.min(before);
            if cost > 0 {
                let d = limiter.try_acquire_n("k", cost).await.unwrap();
                assert!(d.is_allowed(), "{at_step}");
            }
            let after = limiter.available("k").await.unwrap();
            assert_eq!(after, before - cost, "{at_step}");
            let peek = limiter.peek("k").await.unwrap();
            if after > 0 {
                assert_eq!(peek.remaining(), after - 1, "{at_step}");
            } else {
                assert!(!peek.is_allowed() && peek.remaining() == 0, "{at_step}");
            }
        }
        assert!(
            limiter.available("k").await.unwrap() < limit,
            "{policy}: nothing was spent"
        );
    }
}

/// A clock set back past a cached refusal: Redis decides again, rather than the cache
/// report a wait longer than the policy could need.
#[tokio::test]
async fn a_cached_refusal_is_not_used_after_the_clock_went_back() {
    let server = RedisServer::start();
    let clock = FakeClock::new();
    at(&clock, 2 * 3_600_000_000);
    let cached = RedisLimiter::builder("1/1s".parse().unwrap())
        .prefix("back")
        .test_clock(clock.clone())
        .timeout(Duration::from_secs(10))
        .connect(&server.url())
        .await
        .unwrap();
    assert!(cached.try_acquire("k").await.unwrap().is_allowed());
    assert!(!cached.try_acquire("k").await.unwrap().is_allowed());
    clock.set(Duration::from_micros(3_600_000_000));
    let refused = cached.try_acquire("k").await.unwrap();
    assert!(!refused.is_allowed());
    assert!(
        refused.retry_after() <= Duration::from_secs(2),
        "at most what the policy could need: {refused:?}"
    );
}
