//! Memory per tracked key, and the cost of `evict_idle`, measured with a counting allocator.
//!
//! ```text
//! cargo run --release --example memory                  # prints the tables
//! cargo run --release --example memory -- memory.csv    # and writes them as CSV
//! cargo run --release --example memory -- --rss tollgate # resident memory per key instead
//! cargo run --release --example memory -- --rss governor
//! cargo run --release --example memory -- --rss papaya   # a map with each state inline
//! cargo run --release --example memory -- --rss papaya 1600000   # at another number of keys
//! ```
//!
//! Bytes per key = (heap bytes live after inserting `n` keys - before) / `n`: the map's
//! table, each entry, the state (a sliding log's ring is a heap block of its own) and the
//! limiter's own copy of each key (the caller's keys are allocated before measuring). Sizes are
//! what the code asked the allocator for, not what the allocator rounded them up to. Maps grow
//! by doubling, so bytes per key follow a sawtooth: compare at several sizes. Memory that the
//! map or the limiter retires through epoch-based reclamation is let go (see `settle`) before
//! each reading.
//!
//! `--rss`: what the counting allocator cannot see, the allocator's own overhead per block:
//! the growth of the process's resident memory (`/proc/self/statm`, Linux) while 1,000,000
//! `u64` keys (or the number given) are tracked on a token bucket, per key, in a process that
//! does nothing else. Maps grow by doubling, so compare at several numbers of keys.
//! `papaya` is not a limiter: papaya's lock-free map holding each key's 8-byte state inline
//! in its entry, what a keyed table would hold at least with a papaya index (see "Levers
//! measured and not taken" in docs/BENCHMARKS.md), its tables outgrown freed before the
//! reading (its collector frees retired memory one block at a time, not in batches).
//!
//! Eviction: 1,000,000 `u64` keys are made to rest on a fake clock, then one `evict_idle`
//! (governor: `retain_recent`) is timed; "peak" is the most heap it held above what was live
//! when it started.

use std::borrow::Borrow;
use std::fmt::Write as _;
use std::hash::Hash;
use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use count_alloc::CountingAlloc;
use tollgate::keys::InlineKey;
use tollgate::{FakeClock, RateLimiter};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc::new();

const SIZES: [usize; 5] = [10_000, 100_000, 300_000, 700_000, 1_000_000];
const EVICT_KEYS: u64 = 1_000_000;

/// The limiters compared: a name and, for tollgate, the policy.
const LIMITERS: [(&str, Option<&str>); 5] = [
    ("tollgate token-bucket", Some("token-bucket 1000/1s")),
    ("tollgate sliding-counter", Some("sliding-counter 1000/1s")),
    ("tollgate sliding-log N=5", Some("sliding-log 5/1s")),
    ("tollgate sliding-log N=100", Some("sliding-log 100/1s")),
    ("governor (dashmap)", None),
];

/// One line of the results: `case, limiter, key, keys, value, unit`.
struct Row {
    case: &'static str,
    limiter: String,
    key: &'static str,
    keys: usize,
    value: f64,
    unit: &'static str,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let csv_path = std::env::args().nth(1);
    if csv_path.as_deref() == Some("--rss") {
        let keys = match std::env::args().nth(3) {
            Some(n) => n.parse()?,
            None => EVICT_KEYS,
        };
        return resident_per_key(std::env::args().nth(2).as_deref(), keys);
    }
    let mut rows = Vec::new();

    let u64_keys: Vec<u64> = (0..SIZES[SIZES.len() - 1] as u64).collect();
    let string_keys: Vec<String> = (0..SIZES[SIZES.len() - 1])
        .map(|i| format!("user-{i:06}"))
        .collect();
    let str_keys: Vec<&str> = string_keys.iter().map(String::as_str).collect();
    let boxed_keys: Vec<Box<str>> = string_keys.iter().map(|s| s.as_str().into()).collect();
    let inline_keys: Vec<InlineKey> = string_keys.iter().map(InlineKey::from).collect();

    for (name, policy) in LIMITERS {
        for n in SIZES {
            let per_key = match policy {
                Some(p) => tollgate_bytes::<u64, u64, _>(p, &u64_keys[..n]),
                None => governor_bytes(&u64_keys[..n]),
            };
            rows.push(memory_row(name, "u64", n, per_key));
            let per_key = match policy {
                Some(p) => tollgate_bytes::<String, str, _>(p, &str_keys[..n]),
                None => governor_bytes(&string_keys[..n]),
            };
            rows.push(memory_row(name, "String (11 B)", n, per_key));
            // The same strings held as `Box<str>` (pointer and length, no capacity word):
            // both limiters take any key type, and both are still looked up by `&str`.
            let per_key = match policy {
                Some(p) => tollgate_bytes::<Box<str>, str, _>(p, &str_keys[..n]),
                None => governor_bytes(&boxed_keys[..n]),
            };
            rows.push(memory_row(name, "Box<str> (11 B)", n, per_key));
            // The same strings as tollgate's `InlineKey` (16 bytes, the string inside it),
            // still looked up by `&str` in tollgate; governor takes it as any key type.
            let per_key = match policy {
                Some(p) => tollgate_bytes::<InlineKey, str, _>(p, &str_keys[..n]),
                None => governor_bytes(&inline_keys[..n]),
            };
            rows.push(memory_row(name, "InlineKey (11 B)", n, per_key));
        }
    }
    print_memory(&rows);

    let evictions = vec![evict_tollgate(), evict_governor()];
    print_evictions(&evictions);
    rows.extend(evictions.into_iter().flatten());

    if let Some(path) = csv_path {
        let mut csv = String::from("case,limiter,key,keys,value,unit\n");
        for r in &rows {
            writeln!(
                csv,
                "{},{},{},{},{:.3},{}",
                r.case, r.limiter, r.key, r.keys, r.value, r.unit
            )?;
        }
        std::fs::write(&path, csv)?;
        println!("\nwrote {path}");
    }
    Ok(())
}

/// Resident memory per key of one limiter holding `count` `u64` keys.
fn resident_per_key(limiter: Option<&str>, count: u64) -> Result<(), Box<dyn std::error::Error>> {
    fn resident() -> Result<u64, Box<dyn std::error::Error>> {
        let statm = std::fs::read_to_string("/proc/self/statm")?;
        let pages: u64 = statm.split_whitespace().nth(1).ok_or("statm")?.parse()?;
        Ok(pages * 4096)
    }
    let keys: Vec<u64> = (0..count).collect();
    let before = resident()?;
    let after = match limiter {
        Some("tollgate") => {
            let limiter: RateLimiter<u64> =
                RateLimiter::new("1000/1h".parse()?).sweep_per_insert(0);
            keys.iter()
                .for_each(|k| assert!(limiter.try_acquire(k).is_allowed()));
            resident()?
        }
        Some("governor") => {
            let quota = governor::Quota::per_hour(NonZeroU32::new(1000).ok_or("quota")?);
            let limiter = governor::RateLimiter::<u64, _, _>::keyed(quota);
            keys.iter()
                .for_each(|k| assert!(limiter.check_key(k).is_ok()));
            resident()?
        }
        Some("papaya") => {
            let map = papaya::HashMap::builder()
                .hasher(ahash::RandomState::new())
                .collector(seize::Collector::new().batch_size(1))
                .build();
            let pinned = map.pin();
            keys.iter().for_each(|k| {
                pinned.insert(*k, std::sync::atomic::AtomicU64::new(0));
            });
            // Unpinned, so the tables it outgrew are freed.
            drop(pinned);
            resident()?
        }
        _ => return Err("--rss takes tollgate, governor or papaya".into()),
    };
    println!(
        "{}: {:.1} resident bytes per u64 key ({} keys, {})",
        limiter.unwrap_or_default(),
        (after - before) as f64 / count as f64,
        count,
        if limiter == Some("papaya") {
            "an 8-byte state inline"
        } else {
            "token bucket"
        }
    );
    Ok(())
}

fn memory_row(limiter: &str, key: &'static str, keys: usize, per_key: f64) -> Row {
    Row {
        case: "memory",
        limiter: limiter.to_owned(),
        key,
        keys,
        value: per_key,
        unit: "bytes/key",
    }
}

/// Lets deferred frees happen: the map (scc) and tollgate's policy generations free retired
/// memory through epoch-based reclamation, some guards after it became garbage. Reading the
/// live bytes before that would count garbage as memory in use (or, after a drop, count the
/// previous limiter's late frees against the next one).
fn settle() -> usize {
    let mut live = ALLOC.live();
    let mut stable = 0;
    while stable < 8 {
        let guard = scc::Guard::new();
        guard.accelerate();
        drop(guard);
        let now = ALLOC.live();
        stable = if now == live { stable + 1 } else { 0 };
        live = now;
    }
    live
}

/// Heap bytes per key of a tollgate limiter holding `keys`.
fn tollgate_bytes<K, Q, T>(policy: &str, keys: &[T]) -> f64
where
    K: Hash + Eq + Clone + Send + Borrow<Q> + From<Q::Owned> + 'static,
    Q: Hash + Eq + ToOwned + ?Sized,
    T: Borrow<Q>,
{
    let before = settle();
    let limiter: RateLimiter<K, FakeClock> =
        RateLimiter::with_clock(policy.parse().expect("valid policy"), FakeClock::new());
    for key in keys {
        assert!(limiter.try_acquire(key.borrow()).is_allowed());
    }
    assert_eq!(limiter.len(), keys.len());
    let bytes = settle() - before;
    drop(limiter);
    settle();
    bytes as f64 / keys.len() as f64
}

/// Heap bytes per key of governor's default keyed limiter holding `keys`.
fn governor_bytes<K: Hash + Eq + Clone>(keys: &[K]) -> f64 {
    let before = settle();
    let limiter = governor::RateLimiter::<K, _, _>::keyed(governor::Quota::per_second(
        NonZeroU32::new(1000).expect("non-zero"),
    ));
    for key in keys {
        assert!(limiter.check_key(key).is_ok());
    }
    assert_eq!(limiter.len(), keys.len());
    let bytes = settle() - before;
    drop(limiter);
    settle();
    bytes as f64 / keys.len() as f64
}

/// Times one sweep and its extra heap: returns (duration, peak above start, live after - before).
fn sweep(f: impl FnOnce() -> usize, expect: usize) -> (Duration, usize, isize) {
    let live = settle();
    ALLOC.reset_peak();
    let start = Instant::now();
    let removed = f();
    let took = start.elapsed();
    assert_eq!(removed, expect);
    let peak = ALLOC.peak() - live;
    let after = settle() as isize - live as isize;
    (took, peak, after)
}

fn evict_rows(limiter: &str, (took, peak, after): (Duration, usize, isize)) -> Vec<Row> {
    let row = |case, value, unit| Row {
        case,
        limiter: limiter.to_owned(),
        key: "u64",
        keys: EVICT_KEYS as usize,
        value,
        unit,
    };
    vec![
        row("evict_time", took.as_secs_f64() * 1e3, "ms"),
        row("evict_peak", peak as f64, "bytes"),
        row("evict_live_change", after as f64, "bytes"),
    ]
}

fn evict_tollgate() -> Vec<Row> {
    let clock = FakeClock::new();
    let limiter: RateLimiter<u64, FakeClock> =
        RateLimiter::with_clock("10/1s".parse().expect("valid policy"), clock.clone());
    for k in 0..EVICT_KEYS {
        assert!(limiter.try_acquire(&k).is_allowed());
    }
    clock.advance(Duration::from_secs(2));
    evict_rows(
        "tollgate evict_idle",
        sweep(|| limiter.evict_idle(), EVICT_KEYS as usize),
    )
}

fn evict_governor() -> Vec<Row> {
    let clock = governor::clock::FakeRelativeClock::default();
    let limiter = governor::RateLimiter::<u64, _, _, _>::dashmap_with_clock(
        governor::Quota::per_second(NonZeroU32::new(10).expect("non-zero")),
        clock.clone(),
    );
    for k in 0..EVICT_KEYS {
        assert!(limiter.check_key(&k).is_ok());
    }
    clock.advance(Duration::from_secs(2));
    evict_rows(
        "governor retain_recent",
        sweep(
            || {
                let before = limiter.len();
                limiter.retain_recent();
                before - limiter.len()
            },
            EVICT_KEYS as usize,
        ),
    )
}

fn print_memory(rows: &[Row]) {
    println!("Heap bytes per tracked key (counting allocator; requested sizes)\n");
    let header: String = SIZES
        .iter()
        .map(|n| format!("{:>10}", format!("{}k", n / 1000)))
        .collect();
    println!("{:<28} {:<16}{header}", "limiter", "key");
    for key in [
        "u64",
        "String (11 B)",
        "Box<str> (11 B)",
        "InlineKey (11 B)",
    ] {
        for (name, _) in LIMITERS {
            let cells: String = SIZES
                .iter()
                .map(|&n| {
                    let v = rows
                        .iter()
                        .find(|r| r.limiter == name && r.key == key && r.keys == n)
                        .map_or(f64::NAN, |r| r.value);
                    format!("{v:>10.1}")
                })
                .collect();
            println!("{name:<28} {key:<16}{cells}");
        }
    }
}

fn print_evictions(evictions: &[Vec<Row>]) {
    println!("\nOne sweep over {EVICT_KEYS} at-rest u64 keys\n");
    println!(
        "{:<26}{:>10}{:>16}{:>20}",
        "sweep", "ms", "peak extra B", "live change B"
    );
    for rows in evictions {
        let get = |case: &str| {
            rows.iter()
                .find(|r| r.case == case)
                .map_or(f64::NAN, |r| r.value)
        };
        println!(
            "{:<26}{:>10.2}{:>16.0}{:>20.0}",
            rows[0].limiter,
            get("evict_time"),
            get("evict_peak"),
            get("evict_live_change")
        );
    }
}
