//! Waiting instead of refusing: waiters are admitted no earlier than the policy allows, N
//! waiters on one key are admitted at the policy's rate, and a deadline gives up on time.
//! Time is simulated: no test sleeps for real.

use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

use tollgate::wait::Wait;
use tollgate::{Clock, DirectLimiter, FakeClock, Policy, RateLimiter};

const MS: u64 = 1_000_000;

/// A discrete-event clock for many threads: time stands still while any thread runs, and
/// when every live thread sleeps it jumps to the earliest wake-up. So each admission is
/// observed at exactly the instant it happened.
#[derive(Clone)]
struct SimClock(Arc<(Mutex<Sim>, Condvar)>);

struct Sim {
    now: u64,
    running: usize,
    wakes: Vec<u64>,
}

impl SimClock {
    fn new(threads: usize) -> Self {
        SimClock(Arc::new((
            Mutex::new(Sim {
                now: 0,
                running: threads,
                wakes: Vec::new(),
            }),
            Condvar::new(),
        )))
    }

    /// A thread is done: it no longer holds time back.
    fn exit(&self) {
        let (lock, cvar) = &*self.0;
        let mut sim = lock.lock().unwrap();
        sim.running -= 1;
        Self::advance_if_idle(&mut sim);
        cvar.notify_all();
    }

    fn advance_if_idle(sim: &mut Sim) {
        if sim.running == 0 {
            if let Some(&next) = sim.wakes.iter().min() {
                sim.now = sim.now.max(next);
            }
        }
    }
}

impl Clock for SimClock {
    fn now(&self) -> u64 {
        self.0 .0.lock().unwrap().now
    }

    fn sleep(&self, duration: Duration) {
        let (lock, cvar) = &*self.0;
        let mut sim = lock.lock().unwrap();
        let wake = sim.now + duration.as_nanos() as u64;
        sim.wakes.push(wake);
        sim.running -= 1;
        Self::advance_if_idle(&mut sim);
        cvar.notify_all();
        while sim.now < wake {
            sim = cvar.wait(sim).unwrap();
        }
        let i = sim.wakes.iter().position(|&w| w == wake).unwrap();
        sim.wakes.swap_remove(i);
        sim.running += 1;
    }
}

#[test]
fn a_single_waiter_is_admitted_exactly_when_allowed() {
    let clock = FakeClock::new();
    let limiter = DirectLimiter::with_clock("5/1s".parse().unwrap(), clock.clone());
    for k in 0..20u64 {
        assert!(limiter.acquire_blocking().is_allowed());
        // Burst of 5 at 0, then one every 200 ms: never earlier, and no later either.
        assert_eq!(clock.now(), k.saturating_sub(4) * 200 * MS, "admission {k}");
    }
}

#[test]
fn many_waiters_on_one_key_are_admitted_at_the_policy_rate() {
    for algorithm in ["token-bucket", "sliding-log", "sliding-counter"] {
        const THREADS: usize = 8;
        const EACH: usize = 5;
        let clock = SimClock::new(THREADS);
        let policy: Policy = format!("{algorithm} 5/1s").parse().unwrap();
        let limiter: Arc<RateLimiter<String, SimClock>> =
            Arc::new(RateLimiter::with_clock(policy, clock.clone()));
        let admitted = Arc::new(Mutex::new(Vec::new()));
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let (limiter, clock, admitted) = (limiter.clone(), clock.clone(), admitted.clone());
                thread::spawn(move || {
                    for _ in 0..EACH {
                        let wait = Wait::new().jitter(Duration::from_millis(3));
                        let d = limiter.acquire_blocking_with("upstream", wait).unwrap();
                        assert!(d.is_allowed());
                        admitted.lock().unwrap().push(clock.now());
                    }
                    clock.exit();
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let mut times = admitted.lock().unwrap().clone();
        times.sort_unstable();
        assert_eq!(times.len(), THREADS * EACH);
        for (i, &t) in times.iter().enumerate() {
            let i = i as u64;
            match algorithm {
                // Burst of 5, then one every 200 ms: admission i no earlier than (i - 4) * 200 ms.
                "token-bucket" => assert!(
                    t >= i.saturating_sub(4) * 200 * MS,
                    "{algorithm}: #{i} at {t}"
                ),
                // Never more than 5 in any second (t - 1 s, t].
                "sliding-log" => {
                    let in_window = times
                        .iter()
                        .filter(|&&u| u <= t && u + 1_000 * MS > t)
                        .count();
                    assert!(
                        in_window <= 5,
                        "{algorithm}: {in_window} in the second up to {t}"
                    );
                }
                // An estimate: at most 5 per fixed window plus the carried-over previous one.
                _ => assert!(i < 5 * (t / (1_000 * MS) + 2), "{algorithm}: #{i} at {t}"),
            }
        }
        // And the waiters keep up with the policy: 40 admissions need at least 7 s at
        // 5 per second after the first burst, and jittered waiters take less than 2 s more.
        let last = *times.last().unwrap();
        assert!(last >= 7_000 * MS, "{algorithm}: last admission at {last}");
        assert!(last < 9_000 * MS, "{algorithm}: last admission at {last}");
    }
}

#[test]
fn token_bucket_waiters_fill_every_slot_on_time() {
    // Without jitter, a token bucket's waiters take each permit the instant it refills.
    const THREADS: usize = 6;
    let clock = SimClock::new(THREADS);
    let limiter = Arc::new(DirectLimiter::with_clock(
        "5/1s".parse().unwrap(),
        clock.clone(),
    ));
    let admitted = Arc::new(Mutex::new(Vec::new()));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let (limiter, clock, admitted) = (limiter.clone(), clock.clone(), admitted.clone());
            thread::spawn(move || {
                for _ in 0..5 {
                    assert!(limiter.acquire_blocking().is_allowed());
                    admitted.lock().unwrap().push(clock.now());
                }
                clock.exit();
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let mut times = admitted.lock().unwrap().clone();
    times.sort_unstable();
    let expected: Vec<u64> = (0..30u64).map(|k| k.saturating_sub(4) * 200 * MS).collect();
    assert_eq!(times, expected);
}

#[test]
fn a_deadline_gives_up_on_time() {
    let clock = FakeClock::new();
    let limiter: RateLimiter<String, FakeClock> =
        RateLimiter::with_clock("1/min".parse().unwrap(), clock.clone());
    let _ = limiter.try_acquire("k");
    // The next permit is 60 s away: a 5 s deadline gives up at once, without sleeping.
    let refused = limiter
        .acquire_blocking_with("k", Wait::new().timeout(Duration::from_secs(5)))
        .unwrap_err();
    assert_eq!(refused.retry_after(), Duration::from_secs(60));
    assert_eq!(clock.now(), 0);
    // A 70 s deadline waits the 60 s and is admitted.
    let admitted = limiter
        .acquire_blocking_with("k", Wait::new().timeout(Duration::from_secs(70)))
        .unwrap();
    assert!(admitted.is_allowed());
    assert_eq!(clock.now(), 60_000 * MS);
    // Jitter never carries a waiter past its deadline.
    let jittery = Wait::new()
        .timeout(Duration::from_secs(61))
        .jitter(Duration::from_secs(30));
    assert!(limiter.acquire_blocking_with("k", jittery).is_ok());
    assert!(clock.now() <= 121_000 * MS);
}

#[cfg(feature = "tokio")]
mod tokio_waiting {
    use super::*;
    use tollgate::clock::TokioClock;

    #[tokio::test(start_paused = true)]
    async fn async_waiters_are_admitted_at_the_policy_rate() {
        let limiter = Arc::new(DirectLimiter::with_clock(
            "2/1s".parse().unwrap(),
            TokioClock::new(),
        ));
        let start = tokio::time::Instant::now();
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let limiter = limiter.clone();
                tokio::spawn(async move {
                    let mut at = Vec::new();
                    for _ in 0..3 {
                        assert!(limiter.acquire().await.is_allowed());
                        at.push(start.elapsed());
                    }
                    at
                })
            })
            .collect();
        let mut times = Vec::new();
        for t in tasks {
            times.extend(t.await.unwrap());
        }
        times.sort_unstable();
        let expected: Vec<Duration> = (0..12u64)
            .map(|k| Duration::from_millis(k.saturating_sub(1) * 500))
            .collect();
        assert_eq!(times, expected);
    }

    #[tokio::test(start_paused = true)]
    async fn an_async_deadline_gives_up_on_time() {
        let limiter: RateLimiter<String, TokioClock> =
            RateLimiter::with_clock("1/min".parse().unwrap(), TokioClock::new());
        let _ = limiter.try_acquire("k");
        let start = tokio::time::Instant::now();
        let wait = Wait::new().timeout(Duration::from_secs(5));
        assert!(limiter.acquire_with("k", wait).await.is_err());
        assert_eq!(start.elapsed(), Duration::ZERO);
        let wait = Wait::new().timeout(Duration::from_secs(90));
        assert!(limiter.acquire_with("k", wait).await.is_ok());
        assert_eq!(start.elapsed(), Duration::from_secs(60));
    }
}

/// A clock whose readings move in steps of `step` behind its true time (like a cached clock
/// refreshed every `step`), and says so through `granularity`. Sleeping moves the true time
/// and records the sleep.
#[derive(Default)]
struct SteppedClock {
    step: u64,
    truth: std::sync::atomic::AtomicU64,
    sleeps: Mutex<Vec<Duration>>,
}

impl Clock for SteppedClock {
    fn now(&self) -> u64 {
        let truth = self.truth.load(std::sync::atomic::Ordering::Relaxed);
        truth - truth % self.step
    }

    fn sleep(&self, duration: Duration) {
        self.sleeps.lock().unwrap().push(duration);
        self.truth.fetch_add(
            duration.as_nanos() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    fn granularity(&self) -> Duration {
        Duration::from_nanos(self.step)
    }
}

#[test]
fn a_waiter_on_a_stepped_clock_sleeps_once_per_refusal_through_any_wrapper() {
    // One permit per 100 ms, readings in 30 ms steps. Refused at reading 0, the waiter must
    // sleep 100 ms plus the step: at true time 130 the reading is 120 and admits. Sleeping
    // 100 ms alone would wake at reading 90 and then re-sleep in 10 ms steps.
    let expected = vec![Duration::from_millis(130)];

    let clock = Arc::new(SteppedClock {
        step: 30 * MS,
        ..SteppedClock::default()
    });
    // Through `Arc<C>`'s Clock impl.
    let limiter = DirectLimiter::with_clock("1/100ms".parse().unwrap(), Arc::clone(&clock));
    assert!(limiter.acquire_blocking().is_allowed());
    assert!(limiter.acquire_blocking().is_allowed());
    assert_eq!(*clock.sleeps.lock().unwrap(), expected);

    // Through `&C`'s, on the keyed limiter.
    let clock = SteppedClock {
        step: 30 * MS,
        ..SteppedClock::default()
    };
    let limiter: RateLimiter<u64, &SteppedClock> =
        RateLimiter::with_clock("1/100ms".parse().unwrap(), &clock);
    assert!(limiter.acquire_blocking(&7).is_allowed());
    assert!(limiter.acquire_blocking(&7).is_allowed());
    assert_eq!(*clock.sleeps.lock().unwrap(), expected);
}

/// A clock that moves `tick` on every reading: time passing between the reading a waiter
/// takes and the one its attempt decides at (a preempted thread, a round trip).
struct Ticking {
    nanos: std::sync::atomic::AtomicU64,
    tick: u64,
}

impl Clock for Ticking {
    fn now(&self) -> u64 {
        self.nanos
            .fetch_add(self.tick, std::sync::atomic::Ordering::Relaxed)
    }

    fn sleep(&self, duration: Duration) {
        self.nanos.fetch_add(
            duration.as_nanos() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
    }
}

#[test]
fn a_waiter_never_gives_up_on_an_admission_that_comes_before_its_deadline() {
    let clock = Ticking {
        nanos: std::sync::atomic::AtomicU64::new(0),
        tick: 10 * MS,
    };
    let limiter = DirectLimiter::with_clock("1/1s".parse().unwrap(), &clock);
    // Decided at 0: the next permit comes at 1 s.
    assert!(limiter.try_acquire().is_allowed());
    // Started at 10 ms with 995 ms to wait: the deadline is 1.005 s, after the permit.
    let waited = limiter.acquire_blocking_with(Wait::new().timeout(Duration::from_millis(995)));
    assert!(waited.is_ok(), "gave up: {waited:?}");
    // A permit after the deadline is still given up on, at once.
    let gave_up = limiter.acquire_blocking_with(Wait::new().timeout(Duration::from_millis(500)));
    assert!(gave_up.is_err(), "{gave_up:?}");
}

/// At the end of the clock's range no admission can come: a waiter without a timeout
/// returns the refusal rather than retry for ever, on every algorithm.
#[test]
fn a_waiter_without_a_timeout_at_the_end_of_the_clock_s_range_returns() {
    for policy in [
        "1/1h",
        "sliding-log 1/1h",
        "sliding-counter 1/1h",
        "1/1h & sliding-log 5/1d",
    ] {
        let (done, finished) = std::sync::mpsc::channel();
        let clock = FakeClock::new();
        clock.set(Duration::from_nanos(u64::MAX - 1_000_000_000));
        thread::spawn(move || {
            let limiter = DirectLimiter::with_clock(policy.parse().unwrap(), clock);
            // Refused or not (a token bucket there refuses every request), the next permit
            // would come past the end of the range.
            let _ = limiter.try_acquire();
            let _ = done.send(limiter.acquire_blocking());
        });
        let waited = finished
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("{policy}: still waiting after 30 s"));
        assert!(!waited.is_allowed(), "{policy}: {waited:?}");
    }
}
