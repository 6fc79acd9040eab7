//! `ConcurrencyLimiter`: never more than the limit in flight, checked by the guarded work
//! itself, under racing threads, eviction and panics.

use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

use tollgate::concurrency::{AtCapacity, ConcurrencyLimiter, Permit};

use crate::support::race;

/// What the guarded work sees: how many are inside right now, and the most ever seen.
#[derive(Default)]
struct Inside {
    now: AtomicU64,
    max: AtomicU64,
}

impl Inside {
    /// The guarded work: enter, check the count, stay a moment, leave.
    fn work(&self, limit: u64) {
        // SeqCst: the checker's own count, independent of the limiter's orderings.
        let inside = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        assert!(inside <= limit, "{inside} in flight, limit {limit}");
        self.max.fetch_max(inside, Ordering::SeqCst);
        for _ in 0..20 {
            std::hint::spin_loop();
        }
        thread::yield_now();
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

#[test]
fn sixteen_threads_never_exceed_four_in_flight() {
    for trial in 0..10 {
        let limiter: Arc<ConcurrencyLimiter<String>> = Arc::new(ConcurrencyLimiter::new(4));
        let inside = Arc::new(Inside::default());
        let (l, i) = (limiter.clone(), inside.clone());
        let done = race(16, move |_| {
            let mut done = 0;
            for _ in 0..2_000 {
                if let Ok(_permit) = l.try_acquire("hot") {
                    i.work(4);
                    done += 1;
                }
            }
            done
        });
        assert!(done > 0);
        assert!(inside.max.load(Ordering::SeqCst) <= 4);
        // Every permit came back: the count is 0 and the key evictable.
        assert_eq!(limiter.in_flight("hot"), 0, "trial {trial}");
        assert_eq!(limiter.len(), 1);
        assert_eq!(limiter.evict_idle(), 1);
        assert!(limiter.is_empty());
    }
}

/// With the evictor racing in a loop, a key still never has more than its limit in flight
/// (a second gauge for the key, or a revived one, would let more through), and every
/// permit returns to the gauge it came from.
#[test]
fn eviction_racing_acquires_stays_exact() {
    for _ in 0..3 {
        let limiter: Arc<ConcurrencyLimiter<String>> = Arc::new(ConcurrencyLimiter::new(2));
        // Two hot keys (most of the threads on them at once, rarely idle) and 14 cold ones
        // (idle often, evicted and recreated all the time).
        let keys: Vec<String> = (0..16).map(|k| format!("key-{k}")).collect();
        let keys = Arc::new(keys);
        let inside: Arc<Vec<Inside>> = Arc::new(keys.iter().map(|_| Inside::default()).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let passes = Arc::new(AtomicU64::new(0));
        let evicted = Arc::new(AtomicU64::new(0));
        let evictor = {
            let (limiter, stop, passes, evicted) = (
                limiter.clone(),
                stop.clone(),
                passes.clone(),
                evicted.clone(),
            );
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    evicted.fetch_add(limiter.evict_idle() as u64, Ordering::Relaxed);
                    passes.fetch_add(1, Ordering::Relaxed);
                    thread::yield_now();
                }
            })
        };
        // The evictor is looping before the workers start, so the two really overlap.
        while passes.load(Ordering::Relaxed) == 0 {
            thread::yield_now();
        }
        let (l, i, ks, e) = (
            limiter.clone(),
            inside.clone(),
            keys.clone(),
            evicted.clone(),
        );
        race(8, move |t| {
            // At least 2,000 requests each, and on until the evictor has removed a key (a
            // busy machine may not schedule it in between), within a bound.
            for n in 0..2_000_000 {
                if n >= 2_000 && e.load(Ordering::Relaxed) > 0 {
                    break;
                }
                let k = if n % 2 == 0 {
                    t % 2
                } else {
                    2 + (t * 7 + n) % 14
                };
                if let Ok(_permit) = l.try_acquire(ks[k].as_str()) {
                    i[k].work(2);
                }
            }
            0
        });
        stop.store(true, Ordering::Relaxed);
        evictor.join().unwrap();
        assert!(
            evicted.load(Ordering::Relaxed) > 0,
            "the evictor never removed a key: the race was not exercised"
        );
        for (k, key) in keys.iter().enumerate() {
            assert!(inside[k].max.load(Ordering::SeqCst) <= 2);
            assert_eq!(limiter.in_flight(key.as_str()), 0);
        }
        limiter.evict_idle();
        assert!(limiter.is_empty(), "{} keys left", limiter.len());
    }
}

#[test]
fn a_panicking_holder_releases() {
    let limiter: Arc<ConcurrencyLimiter<String>> = Arc::new(ConcurrencyLimiter::new(4));
    // Panics in threads: each takes a permit, then panics while holding it.
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let limiter = limiter.clone();
            thread::spawn(move || {
                let _permit = limiter.try_acquire("jobs").unwrap();
                if i % 2 == 0 {
                    panic!("guarded work failed");
                }
            })
        })
        .collect();
    let panicked = handles
        .into_iter()
        .map(|h| h.join())
        .filter(Result::is_err)
        .count();
    assert_eq!(panicked, 2);
    assert_eq!(limiter.in_flight("jobs"), 0);

    // And on this thread, with the permit held at the limit.
    let held: Vec<Permit> = (0..3)
        .map(|_| limiter.try_acquire("jobs").unwrap())
        .collect();
    let caught = panic::catch_unwind(AssertUnwindSafe(|| {
        let _last = limiter.try_acquire("jobs").unwrap();
        assert!(limiter.try_acquire("jobs").is_err());
        panic!("guarded work failed");
    }));
    assert!(caught.is_err());
    assert_eq!(limiter.in_flight("jobs"), 3);
    assert!(limiter.try_acquire("jobs").is_ok());
    drop(held);
    assert_eq!(limiter.in_flight("jobs"), 0);
    assert_eq!(limiter.evict_idle(), 1);
}

#[test]
fn a_refusal_changes_nothing() {
    let limiter: ConcurrencyLimiter<String> = ConcurrencyLimiter::new(1);
    let permit = limiter.try_acquire("k").unwrap();
    for _ in 0..100 {
        assert_eq!(limiter.try_acquire("k").unwrap_err().limit(), 1);
    }
    assert_eq!(limiter.in_flight("k"), 1);
    assert_eq!(permit.in_flight(), 1);
    drop(permit);
    assert_eq!(limiter.in_flight("k"), 0);

    // A limit of 0 refuses and tracks nothing.
    let closed: ConcurrencyLimiter<String> = ConcurrencyLimiter::new(0);
    assert_eq!(
        closed.try_acquire("k").unwrap_err(),
        closed.try_acquire("x").unwrap_err()
    );
    assert!(closed.is_empty());
}

#[test]
fn evict_idle_keeps_keys_with_permits_out() {
    let limiter: ConcurrencyLimiter<u64> = ConcurrencyLimiter::new(3);
    let held: Vec<Permit> = (0..10u64)
        .filter_map(|k| limiter.try_acquire(&k).ok())
        .collect();
    drop(limiter.try_acquire(&100).unwrap());
    assert_eq!(limiter.len(), 11);
    assert_eq!(limiter.evict_idle(), 1);
    assert_eq!(limiter.len(), 10);
    // A permit released after its key was considered by the evictor still returns home.
    drop(held);
    for k in 0..10u64 {
        assert_eq!(limiter.in_flight(&k), 0);
    }
    assert_eq!(limiter.evict_idle(), 10);
    assert!(limiter.is_empty());
}

#[test]
fn permits_move_to_other_threads() {
    let limiter: ConcurrencyLimiter<String> = ConcurrencyLimiter::new(2);
    let permits: Vec<Permit> = (0..2)
        .map(|_| limiter.try_acquire("job").unwrap())
        .collect();
    let workers: Vec<_> = permits
        .into_iter()
        .map(|permit| thread::spawn(move || drop(permit)))
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(limiter.in_flight("job"), 0);
}

#[test]
fn per_key_limits_from_a_resolver() {
    let limiter: ConcurrencyLimiter<String> =
        ConcurrencyLimiter::with_resolver(|tenant: &String| match tenant.as_str() {
            "big" => 3,
            "banned" => 0,
            _ => 1,
        });
    let big: Vec<Permit> = (0..3)
        .map(|_| limiter.try_acquire("big").unwrap())
        .collect();
    assert_eq!(limiter.try_acquire("big").unwrap_err(), refused(3));
    let _small = limiter.try_acquire("small").unwrap();
    assert_eq!(limiter.try_acquire("small").unwrap_err(), refused(1));
    assert_eq!(limiter.try_acquire("banned").unwrap_err(), refused(0));
    assert_eq!(limiter.len(), 2, "a key limited to 0 is not tracked");
    assert_eq!(big[0].limit(), 3);
    assert_eq!(limiter.limit(), None);
}

fn refused(limit: u64) -> AtCapacity {
    let limiter: ConcurrencyLimiter<String> = ConcurrencyLimiter::new(limit);
    let _held: Vec<Permit> = (0..limit)
        .map(|_| limiter.try_acquire("x").unwrap())
        .collect();
    limiter.try_acquire("x").unwrap_err()
}

/// Racing first requests for many new keys create one gauge per key: with limit 1 and a
/// frozen set of holders, exactly one of the racers gets each key.
#[test]
fn racing_first_requests_create_one_gauge_per_key() {
    let limiter: Arc<ConcurrencyLimiter<u64>> = Arc::new(ConcurrencyLimiter::new(1));
    let held = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (l, h) = (limiter.clone(), held.clone());
    let admitted = race(8, move |_| {
        let mut mine = Vec::new();
        for key in 0..2_000u64 {
            if let Ok(permit) = l.try_acquire(&key) {
                mine.push(permit);
            }
        }
        let n = mine.len() as u64;
        h.lock().unwrap().extend(mine);
        n
    });
    assert_eq!(admitted, 2_000);
    assert_eq!(limiter.len(), 2_000);
    held.lock().unwrap().clear();
    assert_eq!(limiter.evict_idle(), 2_000);
}

/// A key that took shared permits while the map was full, and is tracked again once room
/// frees up, never has more than its limit in flight: the gauge it is tracked on is the one
/// that counts its shared permits still out. (A fresh gauge there would let it have its
/// limit twice: 2 shared and 2 of its own.)
#[test]
fn a_key_tracked_again_counts_its_shared_permits() {
    let limiter: ConcurrencyLimiter<u32> = ConcurrencyLimiter::new(2).max_keys(1);
    let busy = limiter.try_acquire(&1).unwrap();
    let mut shared: Vec<Permit> = (0..2).map(|_| limiter.try_acquire(&2).unwrap()).collect();
    assert!(shared.iter().all(Permit::is_overflow));
    assert!(limiter.try_acquire(&2).unwrap_err().is_overflow());
    assert_eq!(limiter.in_flight(&2), 2);

    drop(busy); // key 1 is idle: key 2's next request finds room in the map
    let third = limiter.try_acquire(&2);
    assert!(
        third.is_err(),
        "key 2, tracked again with its 2 shared permits out, got a third place"
    );
    assert!(!third.unwrap_err().is_overflow(), "key 2 is tracked now");
    assert_eq!(limiter.len(), 1);
    assert_eq!(limiter.in_flight(&2), 2);

    // Each shared permit that ends gives the key one place of its own, never more.
    drop(shared.pop());
    let own = limiter.try_acquire(&2).unwrap();
    assert!(!own.is_overflow());
    assert_eq!(own.in_flight(), 2);
    assert!(limiter.try_acquire(&2).is_err());
    drop(shared);
    let own_too = limiter.try_acquire(&2).unwrap();
    assert!(limiter.try_acquire(&2).is_err());
    drop((own, own_too));
    assert_eq!(limiter.in_flight(&2), 0);
    assert_eq!(limiter.evict_idle(), 1);
    assert!(limiter.is_empty());
}

/// While a key overflows, it is held to its own limit too, even when room frees up for
/// another key first, and a refusal there leaves its count as it was.
#[test]
fn an_overflowing_key_keeps_its_limit_while_others_take_the_room() {
    let limiter: ConcurrencyLimiter<u32> = ConcurrencyLimiter::new(3).max_keys(1);
    let busy = limiter.try_acquire(&1).unwrap();
    let shared: Vec<Permit> = (0..2).map(|_| limiter.try_acquire(&2).unwrap()).collect();
    drop(busy);
    // Key 3 takes the room; key 2 still overflows with its 2 permits counted.
    let other = limiter.try_acquire(&3).unwrap();
    assert!(!other.is_overflow());
    let third = limiter.try_acquire(&2).unwrap();
    assert!(third.is_overflow());
    assert_eq!(third.in_flight(), 3);
    let refused = limiter.try_acquire(&2).unwrap_err();
    assert!(refused.is_overflow() && refused.limit() == 3);
    assert_eq!(limiter.in_flight(&2), 3);
    drop((shared, third));
    assert_eq!(limiter.in_flight(&2), 0);
    drop(other);
    // Key 3 is idle now: key 2 is tracked on the gauge it overflowed on, with nothing out.
    assert!(!limiter.try_acquire(&2).unwrap().is_overflow());
}

/// Many threads on a few keys of limit 1, with room for two of them tracked and a thread
/// evicting in a loop: keys overflow, come to rest, are swept and tracked again all the
/// time, and the guarded work of each key never sees two inside, shared permits or not.
#[test]
fn overflowing_keys_tracked_again_never_exceed_their_limit() {
    const KEYS: usize = 5;
    for trial in 0..5 {
        let limiter: Arc<ConcurrencyLimiter<u64>> =
            Arc::new(ConcurrencyLimiter::new(1).max_keys(2));
        let inside: Arc<Vec<Inside>> = Arc::new((0..KEYS).map(|_| Inside::default()).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let evictor = {
            let (limiter, stop) = (limiter.clone(), stop.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    limiter.evict_idle();
                    thread::yield_now();
                }
            })
        };
        let shared = Arc::new(AtomicU64::new(0));
        let (l, i, s) = (limiter.clone(), inside.clone(), shared.clone());
        let own = race(8, move |t| {
            let mut own = 0;
            for n in 0..20_000 {
                let k = (t + n * 3) % KEYS;
                if let Ok(permit) = l.try_acquire(&(k as u64)) {
                    i[k].work(1);
                    if permit.is_overflow() {
                        s.fetch_add(1, Ordering::Relaxed);
                    } else {
                        own += 1;
                    }
                }
            }
            own
        });
        stop.store(true, Ordering::Relaxed);
        evictor.join().unwrap();
        let shared = shared.load(Ordering::Relaxed);
        println!("trial {trial}: {shared} shared permits, {own} own");
        assert!(
            shared > 0 && own > 0,
            "trial {trial}: {shared} shared, {own} own: the race was not exercised"
        );
        for k in 0..KEYS {
            assert!(inside[k].max.load(Ordering::SeqCst) <= 1);
            assert_eq!(limiter.in_flight(&(k as u64)), 0, "trial {trial}, key {k}");
        }
        limiter.evict_idle();
        assert!(limiter.is_empty(), "{} keys left", limiter.len());
    }
}
