//! Race harnesses shared by tests/core/races.rs, tests/core/composite.rs and tests/core/concurrency.rs:
//! threads started together on a barrier, and requests racing a thread that evicts in a
//! loop while a frozen `FakeClock` moves in phases.

#![allow(dead_code, unreachable_pub)]

use std::fmt;
use std::panic::{self, AssertUnwindSafe};
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

/// A thread calling `evict_idle` in a loop until stopped (or dropped, when a test fails),
/// counting the states it removed.
struct Evictor {
    stop: Arc<AtomicBool>,
    evicted: Arc<AtomicU64>,
    thread: Option<thread::JoinHandle<()>>,
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
            thread: Some(thread),
        }
    }

    /// Whether the thread has ended (before [`Evictor::stop`], only by panicking).
    fn has_stopped(&self) -> bool {
        self.thread
            .as_ref()
            .is_none_or(thread::JoinHandle::is_finished)
    }

    /// States removed so far.
    fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    /// Stops the thread; the states it removed in all.
    fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
        self.evicted.load(Ordering::Relaxed)
    }
}

impl Drop for Evictor {
    /// A test that failed before [`Evictor::stop`] leaves no thread evicting behind it.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Worker threads that make one pass of requests per phase, all started together, with the
/// test's thread between phases (to move the clock and check the counts). A pass that panics
/// is caught and fails the phase at [`Phases::run`], instead of leaving the other threads
/// waiting at a barrier for ever.
struct Phases {
    start: Arc<Barrier>,
    end: Arc<Barrier>,
    panicked: Arc<AtomicBool>,
    workers: Vec<thread::JoinHandle<()>>,
}

impl Phases {
    /// `workers` threads, each calling `pass(w)` once per phase for `phases` phases.
    fn start(workers: usize, phases: u64, pass: impl Fn(usize) + Send + Sync + 'static) -> Self {
        let pass = Arc::new(pass);
        let start = Arc::new(Barrier::new(workers + 1));
        let end = Arc::new(Barrier::new(workers + 1));
        let panicked = Arc::new(AtomicBool::new(false));
        let workers = (0..workers)
            .map(|w| {
                let (pass, start, end) = (pass.clone(), start.clone(), end.clone());
                let panicked = panicked.clone();
                thread::spawn(move || {
                    for _ in 0..phases {
                        start.wait();
                        // The panic's message is printed as it happens; the flag fails the
                        // phase once every thread is through it.
                        if panic::catch_unwind(AssertUnwindSafe(|| pass(w))).is_err() {
                            panicked.store(true, Ordering::Relaxed);
                        }
                        end.wait();
                    }
                })
            })
            .collect();
        Phases {
            start,
            end,
            panicked,
            workers,
        }
    }

    /// Runs one phase: every worker makes its pass. Panics when a pass panicked.
    fn run(&self, what: fmt::Arguments<'_>) {
        self.start.wait();
        self.end.wait();
        // Relaxed: the barrier orders the workers' stores before this load.
        assert!(
            !self.panicked.load(Ordering::Relaxed),
            "{what}: a request thread panicked"
        );
    }

    /// Waits for the workers, once every phase has run.
    fn join(self) {
        for worker in self.workers {
            worker.join().unwrap();
        }
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
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    let phases = {
        let (limiter, counts) = (limiter.clone(), counts.clone());
        Phases::start(WORKERS, PHASES, move |w| {
            for i in 0..(capacity * 3) {
                let key = (i + w as u64) % KEYS;
                if limiter.try_acquire(&key).is_allowed() {
                    counts[key as usize].fetch_add(1, Ordering::Relaxed);
                }
            }
        })
    };
    for phase in 0..PHASES {
        let before = evictor.evicted();
        clock.set(Duration::from_secs(2 * phase + 2));
        if phase % 10 == 0 {
            // Now and then, let the evictor find the at-rest states before the requests
            // start, so removal and re-creation are exercised for certain; the other phases
            // race them.
            while phase > 0 && evictor.evicted() == before {
                assert!(!evictor.has_stopped(), "{label}: the evictor panicked");
                thread::yield_now();
            }
        }
        phases.run(format_args!("{label}, phase {phase}"));
        for (key, count) in counts.iter().enumerate() {
            let admitted = count.swap(0, Ordering::Relaxed);
            assert_eq!(
                admitted, capacity,
                "{label}, phase {phase}, key {key}: admitted {admitted}"
            );
        }
    }
    let evicted = evictor.stop();
    phases.join();
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
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..keys).map(|_| AtomicU64::new(0)).collect());
    let passes = {
        let (limiter, counts) = (limiter.clone(), counts.clone());
        Phases::start(WORKERS, phases, move |w| {
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
        })
    };
    for phase in 0..phases {
        clock.set(Duration::from_secs(2 * phase + 2));
        passes.run(format_args!("phase {phase}"));
        for (key, count) in counts.iter().enumerate() {
            let admitted = count.swap(0, Ordering::Relaxed);
            assert_eq!(admitted, 1, "phase {phase}, key {key}: admitted {admitted}");
        }
    }
    let evicted = evictor.stop();
    passes.join();
    assert!(
        evicted > keys,
        "the evictor must actually have removed states for the race to mean anything"
    );
}
