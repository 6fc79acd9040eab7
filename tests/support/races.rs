//! Race harnesses shared by tests/core/races.rs, tests/core/composite.rs and tests/core/concurrency.rs:
//! threads started together on a barrier, and requests racing a thread that evicts in a
//! loop while a frozen `FakeClock` moves in phases.

#![allow(dead_code, unreachable_pub)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use tollgate::{FakeClock, Policy, RateLimiter};

/// Runs `threads` copies of `work` started together and sums what they return.
pub fn race(threads: usize, work: impl Fn(usize) -> u64 + Send + Sync + 'static) -> u64 {
    let work = Arc::new(work);
    let start = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let (work, start) = (work.clone(), start.clone());
            thread::spawn(move || {
                start.wait();
                work(i)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).sum()
}

/// A thread calling `evict_idle` in a loop until stopped, counting the states it removed.
struct Evictor {
    stop: Arc<AtomicBool>,
    evicted: Arc<AtomicU64>,
    thread: thread::JoinHandle<()>,
}

impl Evictor {
    fn start(limiter: &Arc<RateLimiter<u64, FakeClock>>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let evicted = Arc::new(AtomicU64::new(0));
        let thread = {
            let (limiter, stop, evicted) = (limiter.clone(), stop.clone(), evicted.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    evicted.fetch_add(limiter.evict_idle() as u64, Ordering::Relaxed);
                }
            })
        };
        Evictor {
            stop,
            evicted,
            thread,
        }
    }

    /// States removed so far.
    fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    /// Stops the thread; the states it removed in all.
    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap();
        self.evicted.load(Ordering::Relaxed)
    }
}

/// Requests racing eviction never admit extra.
///
/// Time moves in phases two seconds apart, so every state of `policy` (whose longest window
/// must be under two seconds) is at rest when a phase starts. During a phase the clock is
/// frozen: each of 4 keys must admit exactly `capacity` (the policy's tightest band), however
/// 6 request threads interleave with a thread that evicts in a loop. An eviction that
/// unlinked a state while a request still used it would let a key admit more than that.
pub fn eviction_race(label: &str, policy: Policy, capacity: u64) {
    const KEYS: u64 = 4;
    const WORKERS: usize = 6;
    const PHASES: u64 = 150;
    let clock = FakeClock::new();
    let limiter: Arc<RateLimiter<u64, FakeClock>> =
        Arc::new(RateLimiter::with_clock(policy, clock.clone()));
    let evictor = Evictor::start(&limiter);
    let phase_start = Arc::new(Barrier::new(WORKERS + 1));
    let phase_end = Arc::new(Barrier::new(WORKERS + 1));
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (limiter, counts) = (limiter.clone(), counts.clone());
            let (phase_start, phase_end) = (phase_start.clone(), phase_end.clone());
            thread::spawn(move || {
                for _ in 0..PHASES {
                    phase_start.wait();
                    for i in 0..(capacity * 3) {
                        let key = (i + w as u64) % KEYS;
                        if limiter.try_acquire(&key).is_allowed() {
                            counts[key as usize].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    phase_end.wait();
                }
            })
        })
        .collect();
    for phase in 0..PHASES {
        let before = evictor.evicted();
        clock.set(Duration::from_secs(2 * phase + 2));
        if phase % 10 == 0 {
            // Now and then, let the evictor find the at-rest states before the requests
            // start, so removal and re-creation are exercised for certain; the other phases
            // race them.
            while phase > 0 && evictor.evicted() == before {
                thread::yield_now();
            }
        }
        phase_start.wait();
        phase_end.wait();
        for (key, count) in counts.iter().enumerate() {
            let admitted = count.swap(0, Ordering::Relaxed);
            assert_eq!(
                admitted, capacity,
                "{label}, phase {phase}, key {key}: admitted {admitted}"
            );
        }
    }
    let evicted = evictor.stop();
    for w in workers {
        w.join().unwrap();
    }
    assert!(
        evicted > 0,
        "{label}: the evictor must actually have removed states for the race to mean anything"
    );
}

/// [`eviction_race`] at scale, the shape of the keyed registry's stress test: `keys` keys of
/// a policy admitting 1 per second, 2 request threads that each walk every key twice per
/// phase (from opposite ends), and a thread evicting in a loop, for `phases` phases. Every
/// phase starts with every state at rest, so each key's first admission of the phase races
/// the evictor retiring and removing its state, and a request may meet the state retired
/// and create it again. Each key must admit exactly 1 per phase: `keys * phases` races, none
/// of them allowed a lost or an extra admission.
pub fn eviction_stress(keys: u64, phases: u64) {
    const WORKERS: usize = 2;
    let clock = FakeClock::new();
    let policy: Policy = "token-bucket 1/1s".parse().unwrap();
    let limiter: Arc<RateLimiter<u64, FakeClock>> =
        Arc::new(RateLimiter::with_clock(policy, clock.clone()));
    let evictor = Evictor::start(&limiter);
    let phase_start = Arc::new(Barrier::new(WORKERS + 1));
    let phase_end = Arc::new(Barrier::new(WORKERS + 1));
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..keys).map(|_| AtomicU64::new(0)).collect());
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (limiter, counts) = (limiter.clone(), counts.clone());
            let (phase_start, phase_end) = (phase_start.clone(), phase_end.clone());
            thread::spawn(move || {
                for _ in 0..phases {
                    phase_start.wait();
                    for i in 0..2 * keys {
                        let key = if w == 0 {
                            i % keys
                        } else {
                            keys - 1 - i % keys
                        };
                        if limiter.try_acquire(&key).is_allowed() {
                            counts[key as usize].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    phase_end.wait();
                }
            })
        })
        .collect();
    for phase in 0..phases {
        clock.set(Duration::from_secs(2 * phase + 2));
        phase_start.wait();
        phase_end.wait();
        for (key, count) in counts.iter().enumerate() {
            let admitted = count.swap(0, Ordering::Relaxed);
            assert_eq!(admitted, 1, "phase {phase}, key {key}: admitted {admitted}");
        }
    }
    let evicted = evictor.stop();
    for w in workers {
        w.join().unwrap();
    }
    assert!(
        evicted > keys,
        "the evictor must actually have removed states for the race to mean anything"
    );
}
