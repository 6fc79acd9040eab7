//! Policies as data: peek, per-key policies (resolver), live reconfiguration, and the HTTP
//! helpers of `Decision`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use proptest::prelude::*;
use tollgate::{CostError, Decision, DirectLimiter, FakeClock, Policy, RateLimiter};

fn policy(s: &str) -> Policy {
    s.parse().unwrap()
}

fn keyed(p: &str) -> (RateLimiter<String, FakeClock>, FakeClock) {
    let clock = FakeClock::new();
    (RateLimiter::with_clock(policy(p), clock.clone()), clock)
}

// ---------------------------------------------------------------- peek

const PEEK_POLICIES: [&str; 5] = [
    "token-bucket 3/100ms",
    "sliding-log 3/100ms",
    "sliding-counter 3/100ms",
    "2/30ms & 5/100ms",
    "sliding-log 2/30ms & sliding-counter 4/100ms",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Two limiters see the same requests at the same times; one is also peeked at, any
    /// number of times, between them. Every decision is identical, and every peek equals the
    /// decision the next request at that instant gets.
    #[test]
    fn peeks_change_no_later_decision(
        which in 0..PEEK_POLICIES.len(),
        steps in prop::collection::vec((0u64..40_000_000, 0u8..3, 0usize..3), 1..120),
    ) {
        let p = policy(PEEK_POLICIES[which]);
        let clock = FakeClock::new();
        let plain: RateLimiter<u8, FakeClock> = RateLimiter::with_clock(p, clock.clone());
        let peeked: RateLimiter<u8, FakeClock> = RateLimiter::with_clock(p, clock.clone());
        let direct_plain = DirectLimiter::with_clock(p, clock.clone());
        let direct_peeked = DirectLimiter::with_clock(p, clock.clone());
        let mut now = 0;
        for (advance, key, peeks) in steps {
            now += advance;
            clock.set(Duration::from_nanos(now));
            let mut seen: Option<Decision> = None;
            for _ in 0..peeks {
                let look = peeked.peek(&key);
                prop_assert_eq!(direct_peeked.peek(), direct_peeked.peek());
                if let Some(before) = seen {
                    prop_assert_eq!(before, look, "peeks at one instant agree");
                }
                seen = Some(look);
            }
            let expected = plain.try_acquire(&key);
            let got = peeked.try_acquire(&key);
            prop_assert_eq!(got, expected);
            if let Some(look) = seen {
                prop_assert_eq!(look, got, "a peek is what the request then got");
            }
            let _ = direct_peeked.peek();
            prop_assert_eq!(direct_peeked.try_acquire(), direct_plain.try_acquire());
        }
        prop_assert_eq!(peeked.len(), plain.len(), "peeks create no state");
    }
}

#[test]
fn peek_creates_no_state_and_reports_what_a_first_request_would_get() {
    let (limiter, _clock) = keyed("5/1s");
    let look = limiter.peek("nobody");
    assert!(look.is_allowed());
    assert_eq!(look.remaining(), 4);
    assert_eq!(limiter.len(), 0);
    assert_eq!(limiter.try_acquire("nobody"), look);
}

// ---------------------------------------------------------------- per-key policies

fn tiers() -> RateLimiter<String, FakeClock> {
    let free = policy("2/min");
    let paid = policy("sliding-log 5/min");
    RateLimiter::with_resolver(
        move |user: &String| {
            if user.starts_with("paid:") {
                paid
            } else {
                free
            }
        },
        FakeClock::new(),
    )
}

#[test]
fn each_key_gets_the_policy_its_resolver_chooses() {
    let limiter = tiers();
    let free: Vec<bool> = (0..3)
        .map(|_| limiter.try_acquire("free:ann").is_allowed())
        .collect();
    let paid: Vec<bool> = (0..6)
        .map(|_| limiter.try_acquire("paid:bob").is_allowed())
        .collect();
    assert_eq!(free, [true, true, false]);
    assert_eq!(paid, [true, true, true, true, true, false]);
    assert_eq!(limiter.try_acquire("paid:bob").limit(), 5);
    assert_eq!(limiter.policy(), None);
    // A cost is checked against the key's own policy, and a refused one creates nothing.
    assert_eq!(
        limiter.try_acquire_n("free:new", 3),
        Err(CostError::ExceedsLimit { cost: 3, limit: 2 })
    );
    assert_eq!(limiter.len(), 2);
    assert!(limiter.try_acquire_n("paid:new", 3).unwrap().is_allowed());
}

#[test]
fn a_key_moves_tier_through_reset() {
    let upgraded = Arc::new(AtomicBool::new(false));
    let flag = upgraded.clone();
    let (free, paid) = (policy("1/min"), policy("100/min"));
    let limiter: RateLimiter<String, FakeClock> = RateLimiter::with_resolver(
        move |_: &String| {
            if flag.load(Ordering::Relaxed) {
                paid
            } else {
                free
            }
        },
        FakeClock::new(),
    );
    assert!(limiter.try_acquire("carol").is_allowed());
    assert!(!limiter.try_acquire("carol").is_allowed());
    upgraded.store(true, Ordering::Relaxed);
    // The state keeps the policy it was created under until it is reset or evicted.
    assert!(!limiter.try_acquire("carol").is_allowed());
    assert!(limiter.reset("carol"));
    assert_eq!(limiter.try_acquire("carol").remaining(), 99);
    assert!(!limiter.reset("nobody"));
}

/// A hasher that sends every key to the same bucket of the map, so that two keys' requests
/// meet on one bucket lock.
#[derive(Clone, Default)]
struct SameBucket;

impl std::hash::BuildHasher for SameBucket {
    type Hasher = ConstHasher;
    fn build_hasher(&self) -> ConstHasher {
        ConstHasher
    }
}

struct ConstHasher;

impl std::hash::Hasher for ConstHasher {
    fn finish(&self) -> u64 {
        0x5151_5151_5151_5151
    }
    fn write(&mut self, _: &[u8]) {}
}

/// Bounds every wait of the resolver tests: a deadlock fails the test instead of hanging it.
const PATIENCE: Duration = Duration::from_secs(10);

#[test]
fn the_resolver_runs_once_per_new_key() {
    let calls = Arc::new(AtomicU64::new(0));
    let counted = calls.clone();
    let limiter: RateLimiter<String, FakeClock> = RateLimiter::with_resolver(
        move |_: &String| {
            counted.fetch_add(1, Ordering::Relaxed);
            policy("2/1h")
        },
        FakeClock::new(),
    )
    .max_keys(2);
    let calls_for = |what: &dyn Fn()| {
        let before = calls.load(Ordering::Relaxed);
        what();
        calls.load(Ordering::Relaxed) - before
    };
    assert_eq!(
        calls_for(&|| assert!(limiter.try_acquire("a").is_allowed())),
        1
    );
    assert_eq!(
        calls_for(&|| assert!(limiter.try_acquire("a").is_allowed())),
        0
    );
    assert_eq!(
        calls_for(&|| assert_eq!(limiter.peek("b").remaining(), 1)),
        1
    );
    let refused = || {
        assert_eq!(
            limiter.try_acquire_n("b", 3),
            Err(CostError::ExceedsLimit { cost: 3, limit: 2 })
        );
    };
    assert_eq!(calls_for(&refused), 1);
    assert_eq!(
        calls_for(&|| assert!(limiter.try_acquire("b").is_allowed())),
        1
    );
    // Full (2 keys, none at rest): the new key sweeps, tries again, then overflows.
    let overflowed = || assert!(limiter.try_acquire("c").is_overflow());
    assert_eq!(calls_for(&overflowed), 1);
    assert_eq!(calls_for(&|| assert!(limiter.peek("c").is_overflow())), 1);
}

#[test]
fn a_resolver_may_ask_its_own_limiter_about_another_key() {
    type Limiter = RateLimiter<String, FakeClock, SameBucket>;
    let cell: Arc<std::sync::OnceLock<std::sync::Weak<Limiter>>> = Arc::default();
    let own = cell.clone();
    let limiter: Arc<Limiter> = Arc::new(RateLimiter::with_hasher(
        policy("5/1h"),
        FakeClock::new(),
        SameBucket,
    ));
    limiter.set_resolver(move |user: &String| {
        let base = policy("5/1h");
        if user == "probe" {
            return base;
        }
        // "probe" shares the bucket of every other key.
        match own.get().and_then(std::sync::Weak::upgrade) {
            Some(limiter) if limiter.peek("probe").remaining() == 3 => policy("9/1h"),
            _ => base,
        }
    });
    assert!(cell.set(Arc::downgrade(&limiter)).is_ok());
    assert!(limiter.try_acquire("probe").is_allowed());
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let creating = {
        let limiter = limiter.clone();
        thread::spawn(move || {
            let _ = done_tx.send(limiter.try_acquire("alice"));
        })
    };
    let decided = done_rx.recv_timeout(PATIENCE);
    let Ok(decision) = decided else {
        // The creation is stuck on its own bucket: fail without waiting for it.
        panic!("a resolver peeking its own limiter did not return");
    };
    creating.join().unwrap();
    assert_eq!(
        decision.limit(),
        9,
        "the resolver saw the probe: {decision:?}"
    );
}

#[test]
fn a_slow_resolver_stalls_no_tracked_key() {
    use std::sync::mpsc;
    use std::sync::Mutex;
    let (entered_tx, entered_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let (entered_tx, release_rx) = (Mutex::new(entered_tx), Mutex::new(release_rx));
    let limiter: Arc<RateLimiter<String, FakeClock, SameBucket>> = Arc::new(
        RateLimiter::with_hasher(policy("5/1h"), FakeClock::new(), SameBucket),
    );
    limiter.set_resolver(move |user: &String| {
        if user == "slow" {
            // A database lookup of the customer's tier, held until the test lets it go.
            let _ = entered_tx.lock().unwrap().send(());
            let _ = release_rx.lock().unwrap().recv_timeout(PATIENCE);
        }
        policy("5/1h")
    });
    assert!(limiter.try_acquire("fast").is_allowed());
    let slow = {
        let limiter = limiter.clone();
        thread::spawn(move || limiter.try_acquire("slow").is_allowed())
    };
    entered_rx.recv_timeout(PATIENCE).unwrap();
    // The resolver is inside the creation of "slow"; "fast" shares its bucket.
    let (done_tx, done_rx) = mpsc::channel();
    let fast = {
        let limiter = limiter.clone();
        thread::spawn(move || {
            let _ = done_tx.send(limiter.try_acquire("fast"));
        })
    };
    let decided = done_rx.recv_timeout(PATIENCE);
    release_tx.send(()).unwrap();
    assert!(slow.join().unwrap());
    fast.join().unwrap();
    let decision = decided.expect("a tracked key waited for another key's resolver");
    assert_eq!(decision.remaining(), 3);
}

/// Whether the process-wide epoch of the maps' memory reclamation moves on three times while
/// another thread runs this: it cannot while any thread holds a guard of the epoch.
fn epoch_moves_on_from_another_thread() -> bool {
    thread::spawn(|| {
        // Garbage to reclaim, so the collector tries to move the epoch on.
        let churn: scc::HashIndex<u64, u64> = scc::HashIndex::default();
        let mut seen = scc::Guard::new().epoch();
        let mut moves = 0;
        for i in 0..1_000_000 {
            let _ = churn.insert_sync(i % 64, i);
            let _ = churn.remove_sync(&(i % 64));
            let now = scc::Guard::new().epoch();
            if now != seen {
                seen = now;
                moves += 1;
                if moves == 3 {
                    return true;
                }
            }
        }
        false
    })
    .join()
    .unwrap()
}

#[test]
fn a_slow_resolver_holds_back_no_memory_reclamation() {
    use std::sync::Mutex;
    assert!(
        epoch_moves_on_from_another_thread(),
        "the probe itself works"
    );
    let moved_on = Arc::new(Mutex::new(Vec::new()));
    let limiter: RateLimiter<String, FakeClock> = RateLimiter::with_resolver(
        {
            let moved_on = moved_on.clone();
            move |_: &String| {
                // While the resolver runs (a database lookup, say), memory the maps free must
                // still be reclaimed: the request holds no epoch guard here.
                moved_on
                    .lock()
                    .unwrap()
                    .push(epoch_moves_on_from_another_thread());
                policy("5/1h")
            }
        },
        FakeClock::new(),
    );
    assert!(limiter.try_acquire("new").is_allowed());
    assert!(limiter.peek("other").is_allowed());
    assert_eq!(*moved_on.lock().unwrap(), [true, true]);
}

// ---------------------------------------------------------------- live reconfiguration

#[test]
fn tightening_keeps_spent_permits_spent() {
    let (limiter, clock) = keyed("10/min");
    for _ in 0..6 {
        let _ = limiter.try_acquire("alice");
    }
    limiter.set_policy(policy("4/min"));
    // 6 spent, capped at the new limit of 4: nothing left, and the wait is the new policy's.
    let d = limiter.try_acquire("alice");
    assert!(!d.is_allowed(), "{d:?}");
    assert_eq!(d.retry_after(), Duration::from_secs(15));
    assert_eq!(limiter.try_acquire("bob").remaining(), 3);
    assert_eq!(limiter.policy(), Some(policy("4/min")));
    clock.advance(Duration::from_secs(15));
    assert!(limiter.try_acquire("alice").is_allowed());
}

#[test]
fn loosening_keeps_spent_permits_spent() {
    let (limiter, _clock) = keyed("10/min");
    for _ in 0..8 {
        let _ = limiter.try_acquire("alice");
    }
    limiter.set_policy(policy("100/min"));
    assert_eq!(limiter.try_acquire("alice").remaining(), 91);
}

#[test]
fn changing_algorithm_carries_the_permits_in_use() {
    for (from, to) in [
        ("token-bucket 10/1s", "sliding-log 10/1s"),
        ("sliding-log 10/1s", "sliding-counter 10/1s"),
        ("sliding-counter 10/1s", "token-bucket 10/1s"),
        ("token-bucket 10/1s", "10/1s & 100/1h"),
        ("10/1s & 100/1h", "sliding-log 10/1s"),
    ] {
        let (limiter, clock) = keyed(from);
        clock.set(Duration::from_millis(1500));
        for _ in 0..7 {
            assert!(limiter.try_acquire("k").is_allowed(), "{from}");
        }
        limiter.set_policy(policy(to));
        assert_eq!(
            limiter.peek("k").remaining(),
            2,
            "{from} -> {to}: peek sees the carry"
        );
        assert_eq!(limiter.try_acquire("k").remaining(), 2, "{from} -> {to}");
        assert_eq!(limiter.len(), 1);
    }
}

#[test]
fn a_longer_old_window_says_nothing_about_a_shorter_new_one() {
    let (limiter, _clock) = keyed("1000/1d");
    for _ in 0..500 {
        let _ = limiter.try_acquire("k");
    }
    limiter.set_policy(policy("10/1s & 1000/1d"));
    // The day band keeps its 500; the new second band starts fresh.
    let d = limiter.try_acquire("k");
    assert!(d.is_allowed());
    assert_eq!(d.remaining(), 9, "{d:?}");
}

#[test]
fn keys_left_behind_drain_and_the_old_map_is_dropped() {
    let (limiter, clock) = keyed("5/1s");
    for key in ["a", "b", "c"] {
        let _ = limiter.try_acquire(key);
    }
    limiter.set_policy(policy("7/1s"));
    assert_eq!(limiter.len(), 3);
    assert_eq!(limiter.evict_idle(), 0, "not at rest yet");
    clock.advance(Duration::from_secs(1));
    assert_eq!(limiter.evict_idle(), 3);
    assert_eq!(limiter.len(), 0);
    assert_eq!(limiter.try_acquire("a").remaining(), 6);
}

/// A state that keeps its own policy (a resolver's) is evicted once at rest, and carries the
/// permits in use into the policy that replaces it, as a uniform limiter's state does.
#[test]
fn a_policy_per_key_is_evicted_at_rest_and_carries_its_permits() {
    let clock = FakeClock::new();
    let limiter: RateLimiter<String, FakeClock> =
        RateLimiter::with_resolver(|_: &String| policy("5/1s"), clock.clone());
    for _ in 0..3 {
        assert!(limiter.try_acquire("a").is_allowed());
    }
    assert_eq!(limiter.evict_idle(), 0, "not at rest yet");
    clock.advance(Duration::from_secs(1));
    assert_eq!(limiter.evict_idle(), 1);
    assert_eq!(limiter.len(), 0);
    for _ in 0..3 {
        assert!(limiter.try_acquire("b").is_allowed());
    }
    limiter.set_resolver(|_: &String| policy("10/1s"));
    // The 3 in use come along: 10 less 3, less this request.
    assert_eq!(limiter.try_acquire("b").remaining(), 6);
}

#[test]
fn reconfiguring_while_threads_race_stays_exact() {
    // Capacity 1,000 under every policy the limiters switch between, clock frozen: however
    // the switches interleave with the requests, exactly 1,000 are admitted.
    let policies = [
        "token-bucket 1000/1h",
        "sliding-log 1000/1h",
        "sliding-counter 1000/1h",
        "1000/1h & 2000/1d",
    ];
    for trial in 0..5 {
        let limiter: Arc<RateLimiter<String, FakeClock>> = Arc::new(RateLimiter::with_clock(
            policy(policies[trial % 4]),
            FakeClock::new(),
        ));
        let direct = Arc::new(DirectLimiter::with_clock(
            policy(policies[trial % 4]),
            FakeClock::new(),
        ));
        let admitted = Arc::new(AtomicU64::new(0));
        let direct_admitted = Arc::new(AtomicU64::new(0));
        let start = Arc::new(Barrier::new(9));
        let workers: Vec<_> = (0..8)
            .map(|_| {
                let (limiter, direct, admitted, direct_admitted, start) = (
                    limiter.clone(),
                    direct.clone(),
                    admitted.clone(),
                    direct_admitted.clone(),
                    start.clone(),
                );
                thread::spawn(move || {
                    start.wait();
                    for _ in 0..500 {
                        if limiter.try_acquire("hot").is_allowed() {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                        if direct.try_acquire().is_allowed() {
                            direct_admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        start.wait();
        for i in 0..40 {
            limiter.set_policy(policy(policies[(trial + i + 1) % 4]));
            direct.set_policy(policy(policies[(trial + i + 1) % 4]));
            thread::yield_now();
        }
        for w in workers {
            w.join().unwrap();
        }
        // Whatever is left after the race is still there, under the last policy.
        while limiter.try_acquire("hot").is_allowed() {
            admitted.fetch_add(1, Ordering::Relaxed);
        }
        while direct.try_acquire().is_allowed() {
            direct_admitted.fetch_add(1, Ordering::Relaxed);
        }
        assert_eq!(
            admitted.load(Ordering::Relaxed),
            1_000,
            "keyed, trial {trial}"
        );
        assert_eq!(
            direct_admitted.load(Ordering::Relaxed),
            1_000,
            "direct, trial {trial}"
        );
    }
}

#[test]
fn reapplying_the_policy_in_force_changes_nothing() {
    let limiter: RateLimiter<String, FakeClock> =
        RateLimiter::with_clock(policy("1/1h"), FakeClock::new()).max_keys(1);
    assert!(limiter.try_acquire("tracked").is_allowed());
    assert!(limiter.try_acquire("flood-1").is_allowed());
    assert!(!limiter.try_acquire("flood-2").is_allowed());
    // A service re-applying its configuration: the overflowing keys' shared budget is the
    // one in force, not a new one per reload.
    for _ in 0..3 {
        limiter.set_policy(policy("1/1h"));
        let d = limiter.try_acquire("flood-3");
        assert!(d.is_overflow() && !d.is_allowed(), "{d:?}");
    }
    assert!(!limiter.try_acquire("tracked").is_allowed());
}

#[test]
fn reloads_racing_first_requests_lose_no_spent_permit() {
    // Capacity 20 under every policy, clock frozen: each key admits exactly 20 however the
    // reloads (some of them re-applying the policy in force) interleave with its requests.
    // A generation replaced while a request was creating a key in it must not be dropped
    // with that key: the key would start afresh and admit 20 more.
    const KEYS: usize = 64;
    const CAPACITY: u64 = 20;
    let policies = [
        "token-bucket 20/1h",
        "token-bucket 20/1h",
        "sliding-log 20/1h",
        "sliding-counter 20/1h",
        "sliding-counter 20/1h",
    ];
    for trial in 0..10 {
        let limiter: Arc<RateLimiter<u64, FakeClock>> = Arc::new(RateLimiter::with_clock(
            policy(policies[trial % 5]),
            FakeClock::new(),
        ));
        let admitted: Arc<Vec<AtomicU64>> =
            Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
        let start = Arc::new(Barrier::new(4));
        let workers: Vec<_> = (0..3)
            .map(|w| {
                let (limiter, admitted, start) = (limiter.clone(), admitted.clone(), start.clone());
                thread::spawn(move || {
                    start.wait();
                    for round in 0..20 {
                        for i in 0..KEYS {
                            // Each worker walks the keys in its own order.
                            let key = (i * (2 * w + 1) + round) % KEYS;
                            if limiter.try_acquire(&(key as u64)).is_allowed() {
                                admitted[key].fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                })
            })
            .collect();
        start.wait();
        for i in 0..400 {
            limiter.set_policy(policy(policies[(trial + i) % 5]));
        }
        for w in workers {
            w.join().unwrap();
        }
        // Whatever is left after the race is still there, under the last policy.
        for (key, count) in admitted.iter().enumerate() {
            let mut left = 0;
            while left <= CAPACITY && limiter.try_acquire(&(key as u64)).is_allowed() {
                left += 1;
            }
            let total = count.load(Ordering::Relaxed) + left;
            assert_eq!(total, CAPACITY, "trial {trial}, key {key}");
        }
    }
}

#[test]
fn direct_limiter_reconfigures_under_the_same_rule() {
    let clock = FakeClock::new();
    let limiter = DirectLimiter::with_clock(policy("10/min"), clock.clone());
    for _ in 0..6 {
        let _ = limiter.try_acquire();
    }
    limiter.set_policy(policy("sliding-log 4/min"));
    assert!(!limiter.try_acquire().is_allowed());
    assert_eq!(limiter.policy(), policy("sliding-log 4/min"));
    assert!(!limiter.is_at_rest());
    clock.advance(Duration::from_secs(60));
    assert!(limiter.is_at_rest());
    assert_eq!(limiter.try_acquire().remaining(), 3);
}

/// Re-applying the direct limiter's policy in force changes nothing either: the log's entries
/// keep their stamps (none is moved to now), and a reservation made before still gives back.
#[test]
fn direct_limiter_reapplying_the_policy_in_force_changes_nothing() {
    let clock = FakeClock::new();
    let limiter = DirectLimiter::with_clock(policy("sliding-log 2/1s"), clock.clone());
    assert!(limiter.try_acquire().is_allowed());
    let reservation = limiter.reserve_n(1).unwrap();
    clock.set(Duration::from_millis(900));
    limiter.set_policy(policy("sliding-log 2/1s"));
    limiter.cancel(reservation).unwrap();
    assert_eq!(limiter.available(), 1, "the refund after the reload");
    clock.set(Duration::from_millis(1000));
    let decision = limiter.try_acquire_n(2).unwrap();
    assert!(
        decision.is_allowed(),
        "the first entry left at 1 s: {decision:?}"
    );
}

/// A policy change counts a sliding counter's weighted estimate rounded up: 8 permits at 50 s
/// of a 1-minute counter weigh 8 x 51/60 = 6.8 at 69 s, so 7 are carried as spent.
#[test]
fn a_counter_carries_its_estimate_rounded_up() {
    let clock = FakeClock::new();
    let direct = DirectLimiter::with_clock(policy("sliding-counter 10/min"), clock.clone());
    let composite =
        DirectLimiter::with_clock(policy("sliding-counter 10/min & 1000/1h"), clock.clone());
    let (keyed, keyed_clock) = keyed("sliding-counter 10/min");
    clock.set(Duration::from_secs(50));
    keyed_clock.set(Duration::from_secs(50));
    assert!(direct.try_acquire_n(8).unwrap().is_allowed());
    assert!(composite.try_acquire_n(8).unwrap().is_allowed());
    assert!(keyed.try_acquire_n("k", 8).unwrap().is_allowed());
    clock.set(Duration::from_secs(69));
    keyed_clock.set(Duration::from_secs(69));
    assert_eq!(
        direct.available(),
        4,
        "the counter itself rounds its estimate down"
    );
    direct.set_policy(policy("sliding-log 10/min"));
    keyed.set_policy(policy("sliding-log 10/min"));
    composite.set_policy(policy("sliding-log 10/min & 1000/1h"));
    assert_eq!(direct.available(), 3);
    assert_eq!(keyed.available("k"), 3);
    assert_eq!(composite.available(), 3, "a composite's counter band too");
}

// ---------------------------------------------------------------- HTTP helpers

#[test]
fn retry_after_secs_rounds_up_and_is_never_zero_when_refused() {
    let clock = FakeClock::new();
    let limiter = DirectLimiter::with_clock(policy("1/1500ms"), clock.clone());
    let ok = limiter.try_acquire();
    assert_eq!((ok.retry_after_secs(), ok.reset_after_secs()), (0, 2));
    let refused = limiter.try_acquire();
    assert_eq!(refused.retry_after_secs(), 2);
    clock.set(Duration::from_nanos(1_499_999_999));
    let refused = limiter.try_acquire();
    assert_eq!(refused.retry_after(), Duration::from_nanos(1));
    assert_eq!(refused.retry_after_secs(), 1);
    assert_eq!(refused.reset_after_secs(), 1);
}

/// A hasher that stops the thread that armed it on its second hash, until released: it puts
/// a `reset` between its first and second map of a two-generation walk.
mod paused_hasher {
    use std::cell::Cell;
    use std::collections::hash_map::{DefaultHasher, RandomState};
    use std::hash::BuildHasher;
    use std::sync::mpsc::{Receiver, Sender};
    use std::sync::{Arc, Mutex};

    thread_local! {
        static ARMED: Cell<bool> = const { Cell::new(false) };
        static CALLS: Cell<u32> = const { Cell::new(0) };
    }

    /// Arms the hasher for the calling thread.
    pub fn arm() {
        ARMED.with(|a| a.set(true));
    }

    /// Tells the test "paused", then waits for "go"; taken by the one pause.
    pub type Gate = Arc<Mutex<Option<(Sender<()>, Receiver<()>)>>>;

    #[derive(Clone)]
    pub struct Paused {
        pub inner: RandomState,
        pub gate: Gate,
    }

    impl BuildHasher for Paused {
        type Hasher = DefaultHasher;
        fn build_hasher(&self) -> DefaultHasher {
            if ARMED.with(Cell::get) {
                let n = CALLS.with(|c| {
                    c.set(c.get() + 1);
                    c.get()
                });
                if n == 2 {
                    let (paused, go) = self.gate.lock().unwrap().take().unwrap();
                    paused.send(()).unwrap();
                    go.recv().unwrap();
                }
            }
            self.inner.build_hasher()
        }
    }
}

/// `reset` walks every generation; a request that moves the key from the old generation to
/// the new one in the middle of that walk must not make the key escape it.
#[test]
fn reset_catches_a_key_moving_between_generations() {
    use std::sync::mpsc;
    let (paused_tx, paused_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel();
    let hasher = paused_hasher::Paused {
        inner: std::collections::hash_map::RandomState::new(),
        gate: Arc::new(std::sync::Mutex::new(Some((paused_tx, go_rx)))),
    };
    let limiter: Arc<RateLimiter<String, FakeClock, paused_hasher::Paused>> = Arc::new(
        RateLimiter::with_hasher(policy("1/min"), FakeClock::new(), hasher),
    );
    assert!(limiter.try_acquire("k").is_allowed());
    // A new generation: "k" stays behind in the old one until its next request.
    limiter.set_policy(policy("sliding-log 1/min"));
    let resetting = {
        let limiter = limiter.clone();
        thread::spawn(move || {
            paused_hasher::arm();
            limiter.reset("k")
        })
    };
    // The reset has looked in one map and waits before the other: the request moves "k"
    // (or, if the reset already took it, starts it afresh) in between.
    paused_rx.recv().unwrap();
    let _ = limiter.try_acquire("k");
    go_tx.send(()).unwrap();
    assert!(resetting.join().unwrap(), "reset found the key");
    assert_eq!(limiter.len(), 0);
    assert!(
        limiter.try_acquire("k").is_allowed(),
        "after reset the key starts afresh"
    );
}

/// A cost above the new policy's limit moves nothing: the key stays in the old generation
/// and moves on its next admissible request, carrying what it has in use *then*.
#[test]
fn a_refused_cost_does_not_move_a_key_to_the_new_policy() {
    let (limiter, clock) = keyed("10/min"); // T = 6 s
    assert_eq!(limiter.try_acquire_n("k", 3).unwrap().remaining(), 7);
    limiter.set_policy(policy("5/min")); // T = 12 s
    clock.set(Duration::from_secs(3)); // 2.5 permits in use: a move now would carry 3
    assert_eq!(
        limiter.try_acquire_n("k", 6),
        Err(CostError::ExceedsLimit { cost: 6, limit: 5 })
    );
    // At 9 s the old state has 1.5 permits in use: the move carries 2, and this request
    // leaves 5 - 2 - 1 = 2. (Had the refused request moved the key at 3 s, carrying 3, the
    // answer here would be 1.)
    clock.set(Duration::from_secs(9));
    assert_eq!(limiter.try_acquire("k").remaining(), 2);
}

/// `"3/s burst 10"` decides as the rate and the burst say: 10 at once, then one more every
/// third of a second (rounded up to 333,333,334 ns), never two.
#[test]
fn a_rate_and_a_burst_admit_the_burst_then_the_rate() {
    let (limiter, clock) = keyed("3/s burst 10");
    for spent in 1..=10 {
        let d = limiter.try_acquire("api");
        assert!(d.is_allowed(), "burst request {spent}");
        assert_eq!(d.remaining(), 10 - spent);
    }
    let refused = limiter.try_acquire("api");
    assert!(!refused.is_allowed());
    assert_eq!(refused.retry_after(), Duration::from_nanos(333_333_334));
    for step in 1..=6 {
        clock.advance(Duration::from_nanos(333_333_334));
        assert!(limiter.try_acquire("api").is_allowed(), "step {step}");
        assert!(!limiter.try_acquire("api").is_allowed(), "step {step}");
    }
}

// ---------------------------------------------------------------- round trips

/// Admissions of `key` until the first refusal.
fn drain(limiter: &RateLimiter<String, FakeClock>, key: &str) -> u64 {
    let mut admitted = 0;
    while limiter.try_acquire(key).is_allowed() {
        admitted += 1;
        assert!(admitted <= 10_000, "never refused");
    }
    admitted
}

/// Admissions of a direct limiter until the first refusal.
fn drain_direct(limiter: &DirectLimiter<FakeClock>) -> u64 {
    let mut admitted = 0;
    while limiter.try_acquire().is_allowed() {
        admitted += 1;
        assert!(admitted <= 10_000, "never refused");
    }
    admitted
}

/// After each of `waits` on `clock`, `moved`'s request for "k" gets what `never`'s (a
/// limiter whose policy never changed) gets.
fn decides_as_never_changed(
    (moved, never, clock): (
        &RateLimiter<String, FakeClock>,
        &RateLimiter<String, FakeClock>,
        &FakeClock,
    ),
    waits: &[Duration],
    label: &str,
) {
    for (step, wait) in waits.iter().enumerate() {
        clock.advance(*wait);
        let (got, expected) = (moved.try_acquire("k"), never.try_acquire("k"));
        assert_eq!(
            (got.is_allowed(), got.remaining()),
            (expected.is_allowed(), expected.remaining()),
            "{label}, step {step}: {got:?}"
        );
    }
}

/// A change and its undoing within a window give a key nothing back: what it spent under
/// the first policy stays spent, though the tighter policy in between could count only its
/// own limit. On a frozen clock, three round trips admit the first policy's 10 and no more,
/// for every algorithm, whether the key moves on a request or waits for eviction in
/// between, and whether the change is a policy or a resolver's answers.
#[test]
fn a_round_trip_through_a_tighter_policy_gives_nothing_back() {
    for (wide, tight, expected) in [
        ("token-bucket 10/1h", "token-bucket 3/1h", 10),
        ("sliding-log 10/1h", "sliding-log 3/1h", 10),
        ("sliding-counter 10/1h", "sliding-counter 3/1h", 10),
        ("10/1h & sliding-log 20/1d", "3/1h", 10),
        // A shorter window does not count a longer one's permits (see `set_policy`): the
        // tighter policy admits its own 3 once, and the round trips nothing more.
        ("sliding-log 10/1d", "sliding-log 3/1h", 13),
    ] {
        for evict in [false, true] {
            let (limiter, _clock) = keyed(wide);
            let mut admitted = drain(&limiter, "k");
            for _ in 0..3 {
                limiter.set_policy(policy(tight));
                admitted += drain(&limiter, "k");
                if evict {
                    limiter.evict_idle();
                }
                limiter.set_policy(policy(wide));
                admitted += drain(&limiter, "k");
            }
            assert_eq!(admitted, expected, "{wide} -> {tight} (evicted: {evict})");
        }
    }

    let clock = FakeClock::new();
    let limiter: RateLimiter<String, FakeClock> =
        RateLimiter::with_resolver(|_: &String| policy("10/1h"), clock.clone());
    let mut admitted = drain(&limiter, "k");
    for _ in 0..3 {
        limiter.set_resolver(|_: &String| policy("3/1h"));
        admitted += drain(&limiter, "k");
        limiter.set_resolver(|_: &String| policy("10/1h"));
        admitted += drain(&limiter, "k");
    }
    assert_eq!(admitted, 10, "tiers");
}

/// The direct limiter under the same rule: a change undone within a window gives nothing
/// back, for every algorithm.
#[test]
fn a_direct_limiter_s_round_trip_gives_nothing_back() {
    for (wide, tight) in [
        ("token-bucket 10/1h", "token-bucket 3/1h"),
        ("sliding-log 10/1h", "sliding-log 3/1h"),
        ("sliding-counter 10/1h", "sliding-counter 3/1h"),
    ] {
        let limiter = DirectLimiter::with_clock(policy(wide), FakeClock::new());
        let drain = || drain_direct(&limiter);
        let mut admitted = drain();
        for _ in 0..3 {
            limiter.set_policy(policy(tight));
            admitted += drain();
            limiter.set_policy(policy(wide));
            admitted += drain();
        }
        assert_eq!(admitted, 10, "{wide} -> {tight}");
    }
}

/// Round trips through a policy of several short bands: what is kept of the long band is
/// never folded into a short one and dropped with it (keyed and direct).
#[test]
fn a_kept_long_band_outlives_the_short_bands_of_the_policies_in_between() {
    const WIDE: &str = "10/1h";
    let middle = [
        "5/1s & 6/1min & 7/10min & 8/30min",
        "1/1s & 2/1min & 3/10min & 4/30min",
    ];
    let (limiter, clock) = keyed(WIDE);
    let direct = DirectLimiter::with_clock(policy(WIDE), clock.clone());
    let drain_direct = || drain_direct(&direct);
    assert_eq!((drain(&limiter, "k"), drain_direct()), (10, 10));
    for tight in middle {
        limiter.set_policy(policy(tight));
        direct.set_policy(policy(tight));
        let _ = (drain(&limiter, "k"), drain_direct());
    }
    clock.advance(Duration::from_secs(2));
    limiter.set_policy(policy(WIDE));
    direct.set_policy(policy(WIDE));
    assert_eq!(
        (drain(&limiter, "k"), drain_direct()),
        (0, 0),
        "the 10 spent 2 s ago"
    );
}

/// A key whose state is built from kept permits alone (the policy in between at rest, or
/// the key evicted) holds them from when they were counted, not from when it is built: it
/// decides exactly as a key that never changed policy, for every algorithm.
#[test]
fn a_state_built_from_kept_permits_holds_them_from_when_they_were_counted() {
    let minute = Duration::from_secs(60);
    for (wide, tight) in [
        ("sliding-log 10/1h", "sliding-log 3/1s"),
        ("token-bucket 10/1h", "token-bucket 3/1s"),
        ("sliding-counter 10/1h", "sliding-counter 3/1s"),
    ] {
        for evict in [false, true] {
            let (limiter, clock) = keyed(wide);
            let control: RateLimiter<String, FakeClock> =
                RateLimiter::with_clock(policy(wide), clock.clone());
            assert_eq!((drain(&limiter, "k"), drain(&control, "k")), (10, 10));
            limiter.set_policy(policy(tight));
            // A second's band does not count the hour's permits (see `set_policy`).
            assert_eq!(drain(&limiter, "k"), 3);
            clock.advance(Duration::from_secs(2));
            if evict {
                limiter.evict_idle();
            }
            limiter.set_policy(policy(wide));
            // The key moves back at 59 minutes, then again an hour later.
            decides_as_never_changed(
                (&limiter, &control, &clock),
                &[57 * minute, 5 * minute, 60 * minute],
                &format!("{wide} (evicted: {evict})"),
            );
        }
    }
}

/// Many threads on one key while its policy flips between a wide and a tight one on a
/// frozen clock, with evictions between: nothing ever comes back, so the key is admitted
/// at most the wide policy's 10 in all.
#[test]
fn racing_requests_across_flipping_policies_get_nothing_back() {
    for (wide, tight) in [
        ("10/1h", "3/1h"),
        ("sliding-counter 10/1h", "sliding-counter 3/1h"),
        ("10/1h & 20/1d", "3/1h"),
    ] {
        for round in 0..50 {
            let (limiter, _clock) = keyed(wide);
            let admitted = AtomicU64::new(0);
            let stop = AtomicBool::new(false);
            thread::scope(|scope| {
                for _ in 0..3 {
                    scope.spawn(|| {
                        while !stop.load(Ordering::Relaxed) {
                            if limiter.try_acquire("k").is_allowed() {
                                admitted.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    });
                }
                for i in 0..50 {
                    limiter.set_policy(policy(if i % 2 == 0 { tight } else { wide }));
                    if i % 7 == 0 {
                        limiter.evict_idle();
                    }
                }
                limiter.set_policy(policy(wide));
                stop.store(true, Ordering::Relaxed);
            });
            let total = admitted.load(Ordering::Relaxed) + drain(&limiter, "k");
            assert!(
                total <= 10,
                "{wide} / {tight}, round {round}: {total} admitted"
            );
        }
    }
}

/// A reset racing a key's move to a new policy forgets what the move kept, whichever
/// comes first: after it, the key has its whole budget.
#[test]
fn a_reset_racing_a_move_forgets_what_the_move_kept() {
    for _ in 0..5_000 {
        let (limiter, _clock) = keyed("10/1h");
        assert_eq!(drain(&limiter, "k"), 10);
        limiter.set_policy(policy("3/1h"));
        let start = Barrier::new(2);
        let moved_first = thread::scope(|scope| {
            let mover = scope.spawn(|| {
                start.wait();
                !limiter.try_acquire("k").is_allowed()
            });
            start.wait();
            let removed = limiter.reset("k");
            mover.join().unwrap() && removed
        });
        if moved_first {
            // The move (refused, the key full) came first and the reset removed its state.
            limiter.set_policy(policy("10/1h"));
            assert_eq!(drain(&limiter, "k"), 10, "the reset forgot what was kept");
        }
    }
}

/// What the policy in between counted and what was kept were spent apart, and add up: 6
/// spent under `10/1h`, 3 under `3/1s` (whose second does not count the hour), and back under
/// `10/1h` at the same instant only 1 is left, keyed and direct, for every algorithm.
#[test]
fn what_the_policy_in_between_counted_and_what_was_kept_add_up() {
    for algorithm in ["token-bucket", "sliding-log", "sliding-counter"] {
        let hour = policy(&format!("{algorithm} 10/1h"));
        let second = policy(&format!("{algorithm} 3/1s"));
        let (limiter, clock) = keyed(&hour.to_string());
        let direct = DirectLimiter::with_clock(hour, clock);
        for _ in 0..6 {
            assert!(limiter.try_acquire("k").is_allowed() && direct.try_acquire().is_allowed());
        }
        limiter.set_policy(second);
        direct.set_policy(second);
        assert_eq!((drain(&limiter, "k"), drain_direct(&direct)), (3, 3));
        limiter.set_policy(hour);
        direct.set_policy(hour);
        assert_eq!(
            (drain(&limiter, "k"), drain_direct(&direct)),
            (1, 1),
            "{algorithm}"
        );
    }
}

/// Kept permits folded into a shorter band (more windows than a kept carry holds) are still
/// held from when they were counted: a key moved back decides as one that never changed.
#[test]
fn folded_kept_permits_are_held_from_when_they_were_counted() {
    let (limiter, clock) = keyed("sliding-log 10/1h");
    let control: RateLimiter<String, FakeClock> =
        RateLimiter::with_clock(policy("sliding-log 10/1h"), clock.clone());
    assert_eq!((drain(&limiter, "k"), drain(&control, "k")), (10, 10));
    for tight in [
        "sliding-log 1/1s & sliding-log 1/2s & sliding-log 1/3s & sliding-log 1/4s",
        "sliding-log 1/5s & sliding-log 1/6s & sliding-log 1/7s & sliding-log 1/8s",
        "sliding-log 1/9s & sliding-log 1/10s & sliding-log 1/11s & sliding-log 1/12s",
    ] {
        limiter.set_policy(policy(tight));
        let _ = drain(&limiter, "k");
    }
    limiter.set_policy(policy("sliding-log 10/1h"));
    decides_as_never_changed(
        (&limiter, &control, &clock),
        &[Duration::from_secs(59 * 60), Duration::from_secs(61)],
        "folded",
    );
}

/// What a round trip keeps comes back with time: once the first policy's window has passed
/// since the key moved back, the key has its whole budget again, and a reset forgets it at
/// once.
#[test]
fn what_a_round_trip_keeps_comes_back_after_its_window_or_a_reset() {
    let (limiter, clock) = keyed("sliding-log 10/1h");
    assert_eq!(drain(&limiter, "k"), 10);
    limiter.set_policy(policy("sliding-log 3/1h"));
    assert_eq!(drain(&limiter, "k"), 0);
    limiter.set_policy(policy("sliding-log 10/1h"));
    assert_eq!(drain(&limiter, "k"), 0, "moved back");
    clock.advance(Duration::from_secs(3_599));
    assert_eq!(drain(&limiter, "k"), 0, "within the hour of the change");
    clock.advance(Duration::from_secs(1));
    assert_eq!(drain(&limiter, "k"), 10, "an hour after the change");

    assert!(limiter.reset("k"));
    limiter.set_policy(policy("sliding-log 3/1h"));
    assert_eq!(drain(&limiter, "k"), 3);
    limiter.set_policy(policy("sliding-log 10/1h"));
    assert_eq!(drain(&limiter, "k"), 7);
    limiter.set_policy(policy("sliding-log 3/1h"));
    assert!(limiter.reset("k"));
    limiter.set_policy(policy("sliding-log 10/1h"));
    assert_eq!(drain(&limiter, "k"), 10, "a reset forgets what was kept");
}

/// A permit a longer window's band counts is counted once however many times the policy
/// changes: moved from `2/1h` to `2/61min` and on to `2/62min` (as a margin widened step by
/// step), a key with one permit spent has one left at every step, for every algorithm,
/// keyed and direct. A kept permit a longer band counts must not be added to it again.
#[test]
fn a_permit_is_counted_once_as_windows_grow() {
    for algorithm in ["token-bucket", "sliding-log", "sliding-counter"] {
        let steps: Vec<String> = ["1h", "61min", "62min", "63min"]
            .iter()
            .map(|window| format!("{algorithm} 2/{window}"))
            .collect();
        let (limiter, _clock) = keyed(&steps[0]);
        assert!(limiter.try_acquire("k").is_allowed());
        let direct = DirectLimiter::with_clock(policy(&steps[0]), FakeClock::new());
        assert!(direct.try_acquire().is_allowed());
        for step in &steps[1..] {
            limiter.set_policy(policy(step));
            direct.set_policy(policy(step));
            assert_eq!(limiter.available("k"), 1, "{step}");
            assert_eq!(direct.available(), 1, "{step} (direct)");
        }
        assert!(limiter.try_acquire("k").is_allowed());
        assert!(!limiter.try_acquire("k").is_allowed());
    }
}
