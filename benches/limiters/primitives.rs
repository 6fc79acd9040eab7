//! `primitives`: the parts a decision is built from, timed alone, so that the other groups
//! can be read as sums (see "Where the time goes" in docs/BENCHMARKS.md).
//!
//! Group `primitives`: one clock read, an atomic load, a load + compare-and-swap, a
//! `fetch_add`, a dependent 64-bit division, an epoch guard (`scc::Guard`, what every scc
//! lookup opens), and each hasher on a `u64` and on an 11-byte string. Group `maps_hot_u64`:
//! one lookup of a hot `u64` key whose value is an `AtomicU64` (read with one load) in scc's
//! `HashMap::read_sync` (shared bucket lock) and `HashIndex::peek_with` (no lock, value behind
//! an `Arc`), DashMap (governor's store) and a `parking_lot::RwLock<HashMap>`; and the two
//! lock-free indexes a keyed hit could use: scc's `HashIndex::peek` under an epoch guard
//! opened per lookup, its value a `u32` place in an array of states (tollgate's table), and
//! papaya's `HashMap` (seize's reclamation, the state inline in the entry). Group
//! `maps_random_u64_100k`: the last two, a `parking_lot::Mutex<HashMap>` and DashMap on 100,000
//! keys in random order, each lookup followed by a load of the key's state, beside a floor
//! that only picks the next key. Lookups of one loop overlap: this is throughput, where
//! independent cache misses run side by side, not the latency of one lookup.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use criterion::{BenchmarkGroup, Criterion};
use crossbeam_utils::CachePadded;
use tollgate::{Clock, SystemClock};

use crate::common;

type Group<'a> = BenchmarkGroup<'a, criterion::measurement::WallTime>;

const KEY: u64 = 0x5eed;
const STR: &str = "user-000042";

pub fn bench(c: &mut Criterion) {
    primitives(c);
    maps(c);
    maps_random(c);
}

fn short<'a>(c: &'a mut Criterion, name: &str) -> Group<'a> {
    let mut g = common::group(c, name);
    g.warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(1));
    g
}

fn primitives(c: &mut Criterion) {
    let mut g = short(c, "primitives");
    let clock = SystemClock::new();
    g.bench_function("clock_read", |b| b.iter(|| black_box(clock.now())));

    let word = CachePadded::new(AtomicU64::new(0));
    g.bench_function("atomic_load", |b| {
        b.iter(|| black_box(word.load(Ordering::Relaxed)))
    });
    g.bench_function("load_cas", |b| {
        b.iter(|| {
            let cur = word.load(Ordering::Relaxed);
            black_box(
                word.compare_exchange(cur, cur + 1, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok(),
            )
        })
    });
    g.bench_function("fetch_add", |b| {
        b.iter(|| black_box(word.fetch_add(1, Ordering::Relaxed)))
    });
    let mut x = 1_000_000_007_u64;
    g.bench_function("div_u64_dependent", |b| {
        b.iter(|| {
            x = (black_box(x.wrapping_mul(0x9e37)) | (1 << 40)) / black_box(999_983);
            x
        })
    });
    g.bench_function("epoch_guard", |b| b.iter(|| black_box(scc::Guard::new())));

    hash(&mut g, "ahash", &ahash::RandomState::new());
    hash(&mut g, "foldhash", &foldhash::fast::RandomState::default());
    hash(&mut g, "siphash13", &std::hash::RandomState::new());
    g.finish();
}

fn dash<S: BuildHasher + Clone>(g: &mut Group<'_>, name: &str, s: S) {
    let map = dashmap::DashMap::with_hasher(s);
    map.insert(KEY, AtomicU64::new(0));
    g.bench_function(name, |b| {
        b.iter(|| black_box(map.get(black_box(&KEY)).map(|v| v.load(Ordering::Relaxed))))
    });
}

fn hash<S: BuildHasher>(g: &mut Group<'_>, name: &str, s: &S) {
    g.bench_function(format!("hash_u64_{name}"), |b| {
        b.iter(|| black_box(s.hash_one(black_box(&KEY))))
    });
    g.bench_function(format!("hash_str11_{name}"), |b| {
        b.iter(|| black_box(s.hash_one(black_box(STR))))
    });
}

fn maps(c: &mut Criterion) {
    let mut g = short(c, "maps_hot_u64");

    let read = |v: &AtomicU64| v.load(Ordering::Relaxed);
    let map = scc::HashMap::with_hasher(ahash::RandomState::new());
    assert!(map.insert_sync(KEY, AtomicU64::new(0)).is_ok());
    g.bench_function("scc_hashmap_read_sync", |b| {
        b.iter(|| black_box(map.read_sync(black_box(&KEY), |_, v| read(v))))
    });

    let index = scc::HashIndex::with_hasher(ahash::RandomState::new());
    assert!(index.insert_sync(KEY, Arc::new(AtomicU64::new(0))).is_ok());
    g.bench_function("scc_hashindex_peek_with", |b| {
        b.iter(|| black_box(index.peek_with(black_box(&KEY), |_, v| read(v))))
    });

    dash(&mut g, "dashmap_siphash", std::hash::RandomState::new());
    dash(&mut g, "dashmap_ahash", ahash::RandomState::new());

    let locked = parking_lot::RwLock::new(HashMap::with_hasher(ahash::RandomState::new()));
    locked.write().insert(KEY, AtomicU64::new(0));
    g.bench_function("parking_lot_rwlock_hashmap", |b| {
        b.iter(|| black_box(locked.read().get(black_box(&KEY)).map(&read)))
    });

    let places = Places::new(&[KEY]);
    g.bench_function("scc_hashindex_peek_place", |b| {
        b.iter(|| black_box(places.read(black_box(&KEY))))
    });
    let inline = Inline::new(&[KEY]);
    g.bench_function("papaya_pin_get", |b| {
        b.iter(|| black_box(inline.read(black_box(&KEY))))
    });
    g.finish();
}

/// tollgate's kind of table: a lock-free index from each key to a place in an array of
/// states, looked up under an epoch guard opened for the one lookup.
struct Places {
    index: scc::HashIndex<u64, u32, ahash::RandomState>,
    states: Vec<AtomicU64>,
}

impl Places {
    fn new(keys: &[u64]) -> Self {
        let index = scc::HashIndex::with_hasher(ahash::RandomState::new());
        for (place, key) in keys.iter().enumerate() {
            let place = u32::try_from(place).expect("fewer than 2^32 keys");
            assert!(index.insert_sync(*key, place).is_ok());
        }
        let states = keys.iter().map(|_| AtomicU64::new(0)).collect();
        Places { index, states }
    }

    fn read(&self, key: &u64) -> Option<u64> {
        let guard = scc::Guard::new();
        let place = *self.index.peek(key, &guard)?;
        Some(self.states[place as usize].load(Ordering::Relaxed))
    }
}

/// An index with each key's state inline in its entry: papaya's map, which never moves an
/// entry once made (each is a block of its own), looked up under a guard for the one lookup.
struct Inline {
    map: papaya::HashMap<u64, AtomicU64, ahash::RandomState>,
}

impl Inline {
    fn new(keys: &[u64]) -> Self {
        let map = papaya::HashMap::with_hasher(ahash::RandomState::new());
        for key in keys {
            map.pin().insert(*key, AtomicU64::new(0));
        }
        Inline { map }
    }

    fn read(&self, key: &u64) -> Option<u64> {
        self.map.pin().get(key).map(|v| v.load(Ordering::Relaxed))
    }
}

/// The same lookups over many keys in random order: where a hot key's lookup finds its lines
/// in the first-level cache, these pay for every line the lookup touches.
fn maps_random(c: &mut Criterion) {
    const KEYS: usize = 100_000;
    let mut g = short(c, "maps_random_u64_100k");
    let keys: Vec<u64> = (0..KEYS as u64)
        .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
        .collect();
    let order = common::shuffled(KEYS, 7);
    let places = Places::new(&keys);
    let inline = Inline::new(&keys);
    let locked = parking_lot::Mutex::new(keys.iter().map(|k| (*k, 0_u64)).collect::<HashMap<
        u64,
        u64,
        foldhash::fast::RandomState,
    >>());
    let mut next = cycle(&order);
    g.bench_function("floor_next_key", |b| b.iter(|| black_box(keys[next()])));
    let mut next = cycle(&order);
    g.bench_function("scc_hashindex_peek_place", |b| {
        b.iter(|| black_box(places.read(&keys[next()])))
    });
    let mut next = cycle(&order);
    g.bench_function("papaya_pin_get", |b| {
        b.iter(|| black_box(inline.read(&keys[next()])))
    });
    let mut next = cycle(&order);
    g.bench_function("mutex_hashbrown", |b| {
        b.iter(|| black_box(locked.lock().get(&keys[next()]).copied()))
    });
    let dash = dashmap::DashMap::with_hasher(ahash::RandomState::new());
    keys.iter().for_each(|k| {
        dash.insert(*k, AtomicU64::new(0));
    });
    let mut next = cycle(&order);
    g.bench_function("dashmap_ahash", |b| {
        b.iter(|| black_box(dash.get(&keys[next()]).map(|v| v.load(Ordering::Relaxed))))
    });
    g.finish();
}

/// The positions of `order`, one after another, round and round (no division: the floor
/// entry times this and the key's load alone).
fn cycle(order: &[usize]) -> impl FnMut() -> usize + '_ {
    let mut i = 0;
    move || {
        i += 1;
        if i == order.len() {
            i = 0;
        }
        order[i]
    }
}
