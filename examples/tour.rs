//! A guided tour of tollgate: real decisions and real figures.
//!
//! ```text
//! cargo run --release --example tour
//! ```
//!
//! 1. The token-bucket reference trace, replayed on a fake clock.
//! 2. The three algorithms side by side on the same burst.
//! 3. Sixteen threads racing for 1,000 permits, twenty times.
//! 4. `&str` lookups into `String` keys, and eviction of idle keys.
//! 5. Policies as data: several limits at once, peek, tiers per key, a live policy change.
//! 6. One second of decisions on the real clock, and on the opt-in cached clock.
//! 7. Login protection with escalating lockouts; per-key concurrency limits.
//! 8. Reserve now, settle later: an LLM token budget settled lower and higher than reserved.
//! 9. Several limits in one decision: per user, per client address, global and tokens, all or
//!    nothing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use tollgate::clock::CoarseClock;
use tollgate::{AllOf, Decision, DirectLimiter, FakeClock, Policy, RateLimiter};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    trace()?;
    algorithms_side_by_side()?;
    race()?;
    lookups_and_eviction()?;
    policies_as_data()?;
    throughput()?;
    login_and_concurrency()?;
    reserve_and_settle()?;
    all_or_nothing()?;
    Ok(())
}

fn describe(d: &Decision) -> String {
    if d.is_allowed() {
        format!("allowed, remaining {}", d.remaining())
    } else {
        // Rounded up, as a Retry-After header would be: never "retry after 0".
        let ms = d.retry_after().as_nanos().div_ceil(1_000_000);
        format!("denied, retry after {ms} ms")
    }
}

fn heading(title: &str) {
    println!("\n== {title} ==");
}

/// The token bucket reference trace (docs/ALGORITHMS.md): 5 per second.
fn trace() -> Result<(), Box<dyn std::error::Error>> {
    heading("1. Token bucket, 5 per second (burst 5, one permit back every 200 ms)");
    let policy: Policy = "5/1s".parse()?;
    let clock = FakeClock::new();
    let limiter: RateLimiter<String, FakeClock> = RateLimiter::with_clock(policy, clock.clone());
    println!("policy: {policy}");
    let mut alice = 0;
    let mut request = |t_ms: u64, key: &str| {
        clock.set(Duration::from_millis(t_ms));
        let d = limiter.try_acquire(key);
        let n = if key == "alice" {
            alice += 1;
            format!("#{alice}")
        } else {
            "#1".to_owned()
        };
        println!("  t={t_ms:>5} ms  {key:<5} {n:<4} {}", describe(&d));
    };
    for _ in 0..6 {
        request(0, "alice");
    }
    request(100, "alice");
    request(300, "alice");
    request(300, "alice");
    request(300, "bob");
    request(1300, "alice");
    for t in [1300, 1500] {
        clock.set(Duration::from_millis(t));
        let removed = limiter.evict_idle();
        println!(
            "  t={t:>5} ms  evict_idle removed {removed}, {} key(s) left",
            limiter.len()
        );
    }
    Ok(())
}

/// The same burst of requests through each algorithm.
fn algorithms_side_by_side() -> Result<(), Box<dyn std::error::Error>> {
    heading("2. Three algorithms, 3 per second, the same requests");
    let times_ms = [0, 100, 200, 300, 900, 1000, 1050, 1400, 2000, 2100];
    let names = ["token-bucket", "sliding-log", "sliding-counter"];
    let limiters: Vec<(DirectLimiter<FakeClock>, FakeClock)> = names
        .iter()
        .map(|name| {
            let clock = FakeClock::new();
            let policy: Policy = format!("{name} 3/1s").parse().expect("valid policy");
            (DirectLimiter::with_clock(policy, clock.clone()), clock)
        })
        .collect();
    println!(
        "  {:>7}  {:<29}{:<29}{:<29}",
        "t (ms)", names[0], names[1], names[2]
    );
    for t in times_ms {
        let cells: Vec<String> = limiters
            .iter()
            .map(|(limiter, clock)| {
                clock.set(Duration::from_millis(t));
                describe(&limiter.try_acquire())
            })
            .collect();
        println!("  {t:>7}  {:<29}{:<29}{:<29}", cells[0], cells[1], cells[2]);
    }
    println!("  token bucket: a burst of 3, then one every 333 ms;");
    println!("  sliding log: never more than 3 in any second, exactly;");
    println!("  sliding counter: the previous second weighted by how much of it is still in view.");
    Ok(())
}

/// Exactness under a race: 16 threads x 2,000 tries on capacity 1,000, 20 trials.
fn race() -> Result<(), Box<dyn std::error::Error>> {
    heading("3. Exactness: 16 threads x 2,000 tries on 1,000 permits, frozen clock, 20 trials");
    for name in ["token-bucket", "sliding-log", "sliding-counter"] {
        let policy: Policy = format!("{name} 1000/1h").parse()?;
        let mut results = Vec::new();
        for _ in 0..20 {
            let limiter: Arc<RateLimiter<String, FakeClock>> =
                Arc::new(RateLimiter::with_clock(policy, FakeClock::new()));
            let admitted = Arc::new(AtomicU64::new(0));
            let start = Arc::new(Barrier::new(16));
            let handles: Vec<_> = (0..16)
                .map(|_| {
                    let (limiter, admitted, start) =
                        (limiter.clone(), admitted.clone(), start.clone());
                    thread::spawn(move || {
                        start.wait();
                        for _ in 0..2_000 {
                            if limiter.try_acquire("hot").is_allowed() {
                                admitted.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join().expect("worker");
            }
            results.push(admitted.load(Ordering::Relaxed));
        }
        let exact = results.iter().all(|&n| n == 1_000);
        println!(
            "  {name:<16} admitted per trial: min {}, max {} -> {}",
            results.iter().min().unwrap_or(&0),
            results.iter().max().unwrap_or(&0),
            if exact {
                "exactly 1,000 every time"
            } else {
                "NOT EXACT"
            }
        );
    }
    Ok(())
}

fn lookups_and_eviction() -> Result<(), Box<dyn std::error::Error>> {
    heading("4. Keys: &str lookups into String keys, and eviction");
    let clock = FakeClock::new();
    let limiter: RateLimiter<String, FakeClock> =
        RateLimiter::with_clock("10/1s".parse()?, clock.clone());
    let header_value: &str = "api-key-7f3a"; // borrowed from a request, never copied on a hit
    for _ in 0..3 {
        let _ = limiter.try_acquire(header_value);
    }
    println!(
        "  three requests for {header_value:?} (a &str): {} key tracked, next gets {}",
        limiter.len(),
        describe(&limiter.try_acquire(header_value))
    );
    for i in 0..10_000 {
        let _ = limiter.try_acquire(format!("user-{i}").as_str());
    }
    println!("  after 10,000 more users: {} keys tracked", limiter.len());
    clock.advance(Duration::from_millis(100));
    println!(
        "  100 ms later evict_idle removes {} (those with a full bucket again); {} left",
        limiter.evict_idle(),
        limiter.len()
    );
    clock.advance(Duration::from_millis(400));
    println!(
        "  400 ms later evict_idle removes {}; {} left",
        limiter.evict_idle(),
        limiter.len()
    );
    Ok(())
}

fn policies_as_data() -> Result<(), Box<dyn std::error::Error>> {
    heading("5. Policies as data");
    let clock = FakeClock::new();
    let both: Policy = "3/1s & 5/1h".parse()?;
    let limiter: RateLimiter<String, FakeClock> = RateLimiter::with_clock(both, clock.clone());
    println!("  policy {both}: a burst limit and an hourly quota, all or nothing");
    for t in [0, 0, 0, 0, 1000, 1000, 1000, 2000] {
        clock.set(Duration::from_millis(t));
        let d = limiter.try_acquire("carol");
        println!("    t={t:>5} ms  carol  {}", describe(&d));
    }
    println!("    (the refusal at 0 ms spent nothing in the hourly band: two more pass at 1 s)");
    println!(
        "  peek(\"carol\") at 2 s: {} -- and it changed nothing: {} key(s) tracked",
        describe(&limiter.peek("carol")),
        limiter.len()
    );

    let (free, paid): (Policy, Policy) = ("2/min".parse()?, "sliding-log 5/min".parse()?);
    let tiers: RateLimiter<String, FakeClock> = RateLimiter::with_resolver(
        move |user: &String| {
            if user.starts_with("paid:") {
                paid
            } else {
                free
            }
        },
        FakeClock::new(),
    );
    let count = |user: &str| {
        (0..10)
            .filter(|_| tiers.try_acquire(user).is_allowed())
            .count()
    };
    println!(
        "  tiers by resolver: free:ann gets {} of 10 requests, paid:bob gets {} of 10",
        count("free:ann"),
        count("paid:bob")
    );

    let clock = FakeClock::new();
    let live: RateLimiter<String, FakeClock> = RateLimiter::with_clock("10/min".parse()?, clock);
    for _ in 0..6 {
        let _ = live.try_acquire("dave");
    }
    live.set_policy("4/min".parse()?);
    println!(
        "  set_policy 10/min -> 4/min after dave spent 6: dave {}; erin (new) {}",
        describe(&live.try_acquire("dave")),
        describe(&live.try_acquire("erin"))
    );
    live.set_policy("100/min".parse()?);
    println!(
        "  set_policy -> 100/min: dave {} (spent permits stay spent)",
        describe(&live.try_acquire("dave"))
    );
    Ok(())
}

fn throughput() -> Result<(), Box<dyn std::error::Error>> {
    heading("6. One second on the real clock (quanta), single thread");
    let direct = DirectLimiter::new("1000000000/1s".parse()?);
    let (n, allowed) = for_one_second(|| direct.try_acquire().is_allowed());
    println!(
        "  direct limiter:        {:>6.1} M decisions/s ({:.1} ns each), {allowed} allowed",
        n as f64 / 1e6,
        1e9 / n as f64
    );
    let clock = CoarseClock::new(Duration::from_millis(1))?;
    let cached = DirectLimiter::with_clock("1000000000/1s".parse()?, clock);
    let (n, allowed) = for_one_second(|| cached.try_acquire().is_allowed());
    println!(
        "  direct, CoarseClock:   {:>6.1} M decisions/s ({:.1} ns each), {allowed} allowed \
         (opt-in cached clock, 1 ms resolution)",
        n as f64 / 1e6,
        1e9 / n as f64
    );
    let keyed: RateLimiter<String> = RateLimiter::new("1000000000/1s".parse()?);
    let (n, _) = for_one_second(|| keyed.try_acquire("alice").is_allowed());
    println!(
        "  keyed, one hot key:    {:>6.1} M decisions/s ({:.1} ns each)",
        n as f64 / 1e6,
        1e9 / n as f64
    );
    let keyed: RateLimiter<u64> = RateLimiter::new("100/1s".parse()?);
    let mut key = 0u64;
    let (n, _) = for_one_second(|| {
        key = (key + 1) % 100_000;
        keyed.try_acquire(&key).is_allowed()
    });
    println!(
        "  keyed, 100,000 keys:   {:>6.1} M decisions/s ({:.1} ns each), {} keys tracked",
        n as f64 / 1e6,
        1e9 / n as f64,
        keyed.len()
    );
    println!("  (criterion benchmarks against governor: cargo bench; see docs/BENCHMARKS.md)");
    Ok(())
}

/// Runs `f` in a loop for one second; returns (calls, calls that returned true).
fn for_one_second(mut f: impl FnMut() -> bool) -> (u64, u64) {
    let start = Instant::now();
    let (mut n, mut yes) = (0u64, 0u64);
    while start.elapsed() < Duration::from_secs(1) {
        for _ in 0..1_000 {
            yes += u64::from(f());
        }
        n += 1_000;
    }
    (n, yes)
}

/// Login protection with escalating lockouts, and per-key concurrency limits.
fn login_and_concurrency() -> Result<(), Box<dyn std::error::Error>> {
    use tollgate::concurrency::ConcurrencyLimiter;
    use tollgate::login::{LoginDecision, LoginGuard};
    use tollgate::Clock;
    heading("7. Login protection and per-key concurrency limits");
    let clock = FakeClock::new();
    let guard = LoginGuard::with_clock(clock.clone()); // failures: 5/15m per account, 20/1h per IP
    guard.record_success("alice", "alice-laptop"); // alice logged in before: her device is known
    println!("  a botnet bursts 5 wrong passwords for alice whenever allowed, from fresh IPs:");
    for round in 0..7 {
        let ip = format!("10.0.0.{round}");
        let mut last = guard.check("alice", &ip);
        for _ in 0..5 {
            last = guard.record_failure("alice", &ip);
        }
        let outcome = match last {
            LoginDecision::Account { retry_after } => {
                format!(
                    "account limit reached, retry in {} min",
                    retry_after.as_secs() / 60
                )
            }
            LoginDecision::LockedOut {
                retry_after,
                strikes,
            } => {
                format!(
                    "strike {strikes}: locked out for {} min",
                    retry_after.as_secs() / 60
                )
            }
            other => format!("{other:?}"),
        };
        println!("    t={:>4} min  {outcome}", clock.now() / 60_000_000_000);
        if round == 6 {
            // During the latest lockout: the owner's device is judged by its own budget.
            println!(
                "    during this lockout, alice's own laptop (known): {:?}",
                guard.check("alice", "alice-laptop")
            );
            println!(
                "    and a client never seen before: {:?}",
                guard.check("alice", "192.0.2.1")
            );
        }
        clock.advance(last.retry_after());
    }
    let cap = guard.config().lockout_after(10).unwrap_or_default();
    println!(
        "    ... doubling with each strike, up to {} h",
        cap.as_secs() / 3600
    );

    let jobs: ConcurrencyLimiter<String> = ConcurrencyLimiter::new(2); // 2 running per tenant
    let (first, second) = (jobs.try_acquire("tenant-a")?, jobs.try_acquire("tenant-a")?);
    let third = match jobs.try_acquire("tenant-a") {
        Ok(_) => "permit".to_owned(),
        Err(refused) => format!("refused ({refused})"),
    };
    let other = jobs.try_acquire("tenant-b").map_or("refused", |_| "permit");
    println!("  concurrency: a third job for tenant-a -> {third}; tenant-b -> {other}");
    drop(first);
    let quiet = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {})); // the panic below is on purpose
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _permit = jobs.try_acquire("tenant-a");
        panic!("job failed");
    }));
    std::panic::set_hook(quiet);
    println!(
        "  a job that panicked ({}) gave its permit back: tenant-a has {} in flight",
        if panicked.is_err() {
            "caught"
        } else {
            "not caught"
        },
        jobs.in_flight("tenant-a")
    );
    drop(second);
    println!(
        "  all finished: evict_idle removes {} tenants, {} left",
        jobs.evict_idle(),
        jobs.len()
    );
    Ok(())
}

/// An LLM gateway's tokens-per-minute budget: each completion reserves its `max_tokens`, then
/// settles at the tokens it really used.
fn reserve_and_settle() -> Result<(), Box<dyn std::error::Error>> {
    heading("8. Reserve now, settle later: 10,000 tokens per minute per tenant");
    let clock = FakeClock::new();
    let tokens: RateLimiter<String, FakeClock> =
        RateLimiter::with_clock("10000/min".parse()?, clock.clone());
    let available = |limiter: &RateLimiter<String, FakeClock>| {
        let d = limiter.peek("tenant-7");
        if d.is_allowed() {
            d.remaining() + 1
        } else {
            0
        }
    };
    for (max_tokens, used) in [(4_000, 1_250), (4_000, 3_990), (2_000, 2_600)] {
        let r = tokens.reserve_n("tenant-7", max_tokens)?;
        println!(
            "reserve {max_tokens:>5}: {:<32} available while it runs: {:>5}",
            describe(&r.decision()),
            available(&tokens)
        );
        tokens.settle("tenant-7", r, used)?;
        let change = if used <= max_tokens {
            format!("{} back", max_tokens - used)
        } else {
            format!("{} more charged", used - max_tokens)
        };
        println!(
            "  used {used:>5} ({change:<17}) available after: {:>5}",
            available(&tokens)
        );
    }
    let r = tokens.reserve_n("tenant-7", 4_000)?;
    println!("reserve  4000: {}", describe(&r.decision()));
    clock.advance(Duration::from_secs(30));
    let r = tokens.reserve_n("tenant-7", 4_000)?;
    println!("30 s later, reserve 4000: {}", describe(&r.decision()));
    tokens.cancel("tenant-7", r)?;
    println!(
        "  the model call failed, cancel: available {:>5} again",
        available(&tokens)
    );
    Ok(())
}

/// An API limited per user, per client address and globally, with a budget of tokens per user:
/// one decision over all four, so a request the per-address limit refuses spends nothing of
/// the user's, the tokens or the global budget.
fn all_or_nothing() -> Result<(), Box<dyn std::error::Error>> {
    heading("9. Several limits in one decision: all or nothing");
    let clock = FakeClock::new();
    let per_user: RateLimiter<String, FakeClock> =
        RateLimiter::with_clock("100/min".parse()?, clock.clone());
    let tokens: RateLimiter<String, FakeClock> =
        RateLimiter::with_clock("10000/min".parse()?, clock.clone());
    let per_ip: RateLimiter<std::net::IpAddr, FakeClock> =
        RateLimiter::with_clock("3/min".parse()?, clock.clone());
    let global = DirectLimiter::with_clock("1000/s".parse()?, clock.clone());
    let ip: std::net::IpAddr = "203.0.113.7".parse()?;
    let budgets = || {
        format!(
            "user {:>3}, tokens {:>5}, address {}, global {:>4}",
            per_user.available("alice"),
            tokens.available("alice"),
            per_ip.available(&ip),
            global.available()
        )
    };
    println!("before:             {}", budgets());
    for request in 1..=5 {
        let all = AllOf::new()
            .key(&per_user, "alice")
            .named("per-user")
            .key_n(&tokens, "alice", 700)
            .named("tokens")
            .key(&per_ip, &ip)
            .named("per-ip")
            .direct(&global)
            .named("global");
        let decision = all.try_acquire();
        let by = all.name(decision.part()).unwrap_or("?");
        println!(
            "request {request}: {:<28} (tightest: {by:<8}) {}",
            describe(&decision),
            budgets()
        );
    }
    println!("the refusals by the address limit left the user's, the tokens' and the global budget as they were");
    Ok(())
}
