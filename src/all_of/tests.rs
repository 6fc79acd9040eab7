//! `AllOf` on real limiters: all or nothing, the combined answer, bad costs, peek,
//! reservations, racing threads on a frozen clock.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::FakeClock;
use crate::error::CostError;
use crate::race::race;
use crate::reservation::SettleError;
use crate::{AllOf, DirectLimiter, RateLimiter};

use super::PartError;

type Keyed = RateLimiter<String, FakeClock>;

fn keyed(policy: &str, clock: &FakeClock) -> Keyed {
    RateLimiter::with_clock(policy.parse().unwrap(), clock.clone())
}

fn direct(policy: &str, clock: &FakeClock) -> DirectLimiter<FakeClock> {
    DirectLimiter::with_clock(policy.parse().unwrap(), clock.clone())
}

#[test]
fn an_admission_spends_every_part_and_reports_the_tightest() {
    let clock = FakeClock::new();
    let (user, tokens, global) = (
        keyed("10/1s", &clock),
        keyed("1000/1s", &clock),
        direct("5/1s", &clock),
    );
    let all = AllOf::new()
        .key(&user, "alice")
        .key_n(&tokens, "alice", 300)
        .direct(&global);
    assert_eq!(all.len(), 3);
    let decision = all.try_acquire();
    assert!(decision.is_allowed());
    // Left: 9 of 10, 700 of 1000, 4 of 5: the global part is tightest.
    assert_eq!(
        (decision.part(), decision.remaining(), decision.limit()),
        (2, 4, 5)
    );
    assert_eq!(user.available("alice"), 9);
    assert_eq!(tokens.available("alice"), 700);
    assert_eq!(global.available(), 4);
    let decision = all.try_acquire();
    // Left: 8, 400, 3: still the global part.
    assert_eq!((decision.part(), decision.remaining()), (2, 3));
    let decision = all.try_acquire();
    // Left: 7, 100, 2: the least left is the global part's 2.
    assert_eq!(
        (decision.part(), decision.remaining(), decision.limit()),
        (2, 2, 5)
    );
    // 300 tokens asked, 100 left: refused by the tokens, for 200 ms; the least any part has
    // is the global part's 2.
    let refused = all.try_acquire();
    assert!(!refused.is_allowed());
    assert_eq!((refused.part(), refused.remaining()), (1, 2));
    assert_eq!(refused.retry_after(), Duration::from_millis(200));
}

#[test]
fn a_refusal_by_one_part_leaves_every_other_part_as_it_was() {
    let clock = FakeClock::new();
    let (user, per_ip, global) = (
        keyed("10/1s", &clock),
        keyed("2/1s", &clock),
        direct("100/1s", &clock),
    );
    let all = AllOf::new()
        .key(&user, "alice")
        .key(&per_ip, "10.0.0.1")
        .named("per-ip")
        .direct(&global)
        .named("global");
    assert!(all.try_acquire().is_allowed());
    assert!(all.try_acquire().is_allowed());
    for _ in 0..3 {
        let refused = all.try_acquire();
        assert!(!refused.is_allowed());
        assert_eq!(refused.part(), 1);
        assert_eq!(all.name(refused.part()), Some("per-ip"));
        assert_eq!(refused.retry_after(), Duration::from_millis(500));
        assert_eq!(refused.remaining(), 0);
        assert_eq!(refused.limit(), 2);
    }
    // Nothing spent by the refusals, on the parts before the refusing one or after it.
    assert_eq!(user.available("alice"), 8);
    assert_eq!(global.available(), 98);
    assert_eq!(all.name(0), None);
    assert_eq!(all.name(2), Some("global"));
    assert_eq!(all.name(3), None);
}

#[test]
fn a_refusal_waits_for_the_slowest_refusing_part_and_counts_the_least_available() {
    let clock = FakeClock::new();
    // A part that refuses for 100 ms, one that refuses for 1 s, one with 3 left.
    let (fast, slow, roomy) = (
        direct("10/1s", &clock),
        direct("1/1s", &clock),
        direct("5/1s", &clock),
    );
    assert!(fast.try_acquire_n(10).unwrap().is_allowed());
    assert!(slow.try_acquire().is_allowed());
    assert!(roomy.try_acquire_n(2).unwrap().is_allowed());
    let refused = AllOf::new()
        .direct(&roomy)
        .direct(&fast)
        .direct(&slow)
        .try_acquire();
    assert!(!refused.is_allowed());
    assert_eq!(refused.part(), 2);
    assert_eq!(refused.retry_after(), Duration::from_secs(1));
    assert_eq!(refused.remaining(), 0);
    assert_eq!(roomy.available(), 3, "taken and given back");
}

#[test]
fn a_cost_no_policy_could_admit_is_refused_and_spends_nothing() {
    let clock = FakeClock::new();
    let (user, tokens) = (keyed("10/1s", &clock), keyed("1000/1s", &clock));
    for (cost, error) in [
        (
            1001,
            CostError::ExceedsLimit {
                cost: 1001,
                limit: 1000,
            },
        ),
        (0, CostError::Zero),
    ] {
        let all = AllOf::new()
            .key(&user, "alice")
            .key_n(&tokens, "alice", cost)
            .named("tokens");
        let expected = PartError {
            part: 1,
            name: Some("tokens"),
            error,
        };
        assert_eq!(all.check(), Err(expected));
        assert_eq!(all.reserve().unwrap_err(), expected);
        let refused = all.try_acquire();
        assert!(!refused.is_allowed());
        assert_eq!(refused.part(), 1);
        assert_eq!(refused.retry_after(), Duration::from_nanos(u64::MAX));
        assert!(!all.peek().is_allowed());
        assert_eq!(user.available("alice"), 10, "cost {cost}: nothing spent");
        assert_eq!(tokens.available("alice"), 1000);
    }
    let message = AllOf::new()
        .key_n(&tokens, "bob", 0)
        .named("tokens")
        .check();
    assert_eq!(
        message.unwrap_err().to_string(),
        "part 0 (\"tokens\"): cost must be at least 1, got 0"
    );
}

#[test]
fn a_peek_is_what_try_acquire_would_decide_and_spends_nothing() {
    let clock = FakeClock::new();
    let (user, tokens) = (keyed("3/1s", &clock), keyed("1000/1s", &clock));
    let all = AllOf::new()
        .key(&user, "alice")
        .key_n(&tokens, "alice", 400);
    for _ in 0..2 {
        let peeked = all.peek();
        assert_eq!(peeked, all.peek(), "a peek changes nothing");
        assert_eq!(peeked, all.try_acquire());
    }
    // 200 tokens left: a third request of 400 is refused, as the peek says.
    let peeked = all.peek();
    assert!(!peeked.is_allowed());
    assert_eq!(peeked.part(), 1);
    assert_eq!(peeked, all.try_acquire());
    assert_eq!(user.available("alice"), 1);
    assert!(AllOf::new().peek().is_allowed(), "no part: nothing limits");
    assert!(AllOf::new().try_acquire().is_allowed());
}

#[test]
fn a_reservation_settles_each_part_at_what_it_really_cost() {
    let clock = FakeClock::new();
    let (requests, tokens, global) = (
        keyed("10/1h", &clock),
        keyed("10000/1h", &clock),
        direct("100/1h", &clock),
    );
    let call = AllOf::new()
        .key(&requests, "alice")
        .key_n(&tokens, "alice", 700)
        .direct(&global);
    let reservation = call.reserve().unwrap();
    assert!(reservation.decision().is_allowed());
    assert_eq!(tokens.available("alice"), 9_300);
    call.settle(reservation, &[1, 250]).unwrap(); // the global part keeps what it reserved
    assert_eq!(tokens.available("alice"), 9_750);
    assert_eq!(requests.available("alice"), 9);
    assert_eq!(global.available(), 99);
    // A charge above the reservation.
    let reservation = call.reserve().unwrap();
    call.settle(reservation, &[1, 900, 1]).unwrap();
    assert_eq!(tokens.available("alice"), 8_850);
    // Cancelled: every part as it was.
    let reservation = call.reserve().unwrap();
    call.cancel(reservation).unwrap();
    assert_eq!(
        (
            requests.available("alice"),
            tokens.available("alice"),
            global.available()
        ),
        (8, 8_850, 98)
    );
    // Refused reservations hold nothing; another AllOf's cannot be settled here.
    let greedy = AllOf::new().key_n(&tokens, "alice", 9_000);
    let refused = greedy.reserve().unwrap();
    assert!(!refused.decision().is_allowed());
    assert_eq!(greedy.settle(refused, &[0]), Err(SettleError::Refused));
    let bob = AllOf::new().key(&requests, "bob");
    let of_bob = bob.reserve().unwrap();
    assert_eq!(
        AllOf::new().key(&requests, "carol").settle(of_bob, &[0]),
        Err(SettleError::OtherKey)
    );
    assert_eq!(
        requests.available("bob"),
        9,
        "bob's reservation keeps its permit"
    );
}

/// Threads racing `AllOf`s over two shared parts (in both orders) and each a part of its own,
/// on a frozen clock: no part ever admits more than its capacity, and every refusal gives
/// back all it took, so the admissions are exactly what the tightest shared part holds and
/// each part has exactly its capacity less the admissions left.
#[test]
fn racing_all_ofs_spend_exactly_what_they_admit() {
    for trial in 0..10 {
        let clock = FakeClock::new();
        let shared = Arc::new((keyed("300/1h", &clock), direct("500/1h", &clock)));
        let own: Arc<Vec<DirectLimiter<FakeClock>>> =
            Arc::new((0..8).map(|_| direct("1000/1h", &clock)).collect());
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (s, o, n) = (shared.clone(), own.clone(), next.clone());
        let admitted = race(8, move || {
            let me = n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let (per_key, global) = &*s;
            let mut admitted = 0;
            let mut refused_in_a_row = 0;
            // Bounded: an `AllOf` that admitted without end would fail below, not hang.
            for _ in 0..100_000 {
                if refused_in_a_row == 200 {
                    break;
                }
                let decision = if me % 2 == 0 {
                    AllOf::new()
                        .key(per_key, "k")
                        .direct(global)
                        .direct(&o[me])
                        .try_acquire()
                } else {
                    AllOf::new()
                        .direct(&o[me])
                        .direct(global)
                        .key(per_key, "k")
                        .try_acquire()
                };
                if decision.is_allowed() {
                    admitted += 1;
                    refused_in_a_row = 0;
                } else {
                    refused_in_a_row += 1;
                }
            }
            admitted
        });
        let (per_key, global) = &*shared;
        assert_eq!(
            admitted, 300,
            "trial {trial}: the tightest shared part's capacity"
        );
        assert_eq!(per_key.available("k"), 0, "trial {trial}");
        assert_eq!(
            global.available(),
            500 - admitted,
            "trial {trial}: every refusal gave back"
        );
        let own_left: u64 = own.iter().map(DirectLimiter::available).sum();
        assert_eq!(own_left, 8 * 1000 - admitted, "trial {trial}");
    }
}

/// A part in shadow mode that would refuse lets the request through and spends nothing, and
/// the other parts still enforce their limits: shadow mode turns off one limit, not all.
#[test]
fn a_shadow_part_lets_through_only_what_the_others_allow() {
    let clock = FakeClock::new();
    let enforced = direct("5/1h", &clock);
    let shadowed: Keyed = keyed("1/1h", &clock).shadow();
    for first in [true, false] {
        let enforced = direct("5/1h", &clock);
        let mut admitted = 0;
        for _ in 0..20 {
            let decision = if first {
                AllOf::new()
                    .key(&shadowed, "a")
                    .direct(&enforced)
                    .try_acquire()
            } else {
                AllOf::new()
                    .direct(&enforced)
                    .key(&shadowed, "a")
                    .try_acquire()
            };
            if decision.is_allowed() {
                admitted += 1;
                assert!(admitted == 1 || decision.would_refuse(), "{decision:?}");
            }
        }
        assert_eq!(admitted, 5, "the enforced part's 5");
        assert_eq!(enforced.available(), 0);
    }
    let all = AllOf::new().direct(&enforced).key(&shadowed, "a");
    let reservation = all.reserve().unwrap();
    assert!(reservation.decision().would_refuse());
    assert_eq!(enforced.available(), 4);
    all.settle(reservation, &[3, 3]).unwrap(); // the shadow part held nothing to settle
    assert_eq!(enforced.available(), 2);
}

/// A part in shadow mode answers its peeks as its requests: a refusal let through. So a
/// request refused by an enforcing part waits only for that part (the shadow part, only
/// peeked after the refusal, neither sets the wait nor is named), and `peek` agrees with
/// `try_acquire`.
#[test]
fn a_shadow_part_peeked_is_let_through_as_when_it_decides() {
    let clock = FakeClock::new();
    let real = keyed("1/1s", &clock);
    let rollout = keyed("1/1h", &clock).shadow();
    assert!(real.try_acquire("alice").is_allowed());
    assert!(rollout.try_acquire("alice").is_allowed());
    let request = AllOf::new().key(&real, "alice").key(&rollout, "alice");
    let refused = request.try_acquire();
    assert!(!refused.is_allowed());
    assert_eq!(
        (refused.retry_after(), refused.part()),
        (Duration::from_secs(1), 0),
        "{refused:?}"
    );
    let peeked = request.peek();
    assert_eq!(
        (peeked.is_allowed(), peeked.retry_after(), peeked.part()),
        (false, Duration::from_secs(1), 0)
    );
    clock.advance(Duration::from_secs(1));
    let alone = AllOf::new().key(&rollout, "alice");
    let peeked = alone.peek();
    assert!(peeked.is_allowed() && peeked.would_refuse(), "{peeked:?}");
    let decided = request.try_acquire();
    assert!(
        decided.is_allowed() && decided.would_refuse(),
        "{decided:?}"
    );
}

/// A panic in a part decided after others (a per-key resolver that fails on a key) leaves
/// the parts taken before as they were: their permits given back and a key the request
/// created gone, for `try_acquire` and `reserve` alike.
#[test]
fn a_panic_in_a_later_part_gives_back_what_the_earlier_ones_took() {
    let clock = FakeClock::new();
    let users = keyed("5/1h", &clock);
    let global = direct("5/1h", &clock);
    let tenants: Keyed = RateLimiter::with_resolver(
        |tenant: &String| {
            assert!(tenant.starts_with("t-"), "no tier for {tenant}");
            "10/1h".parse().unwrap()
        },
        clock.clone(),
    );
    let request = AllOf::new()
        .key(&users, "alice")
        .direct(&global)
        .key(&tenants, "unknown");
    for reserve in [false, true] {
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if reserve {
                let _ = request.reserve();
            } else {
                let _ = request.try_acquire();
            }
        }));
        assert!(outcome.is_err());
        assert_eq!(
            (users.available("alice"), users.len(), global.available()),
            (5, 0, 5),
            "reserve: {reserve}"
        );
    }
}

/// A refusal reports its part's own flags and band: a key of a full limiter decided by its
/// shared overflow state says so.
#[test]
fn a_refusal_keeps_the_refusing_parts_flags() {
    let clock = FakeClock::new();
    let full: Keyed = keyed("1/1h", &clock).max_keys(1);
    let _ = full.try_acquire("tracked");
    assert!(full.try_acquire("newcomer").is_overflow());
    let global = direct("10/1h", &clock);
    let refused = AllOf::new()
        .direct(&global)
        .key(&full, "another")
        .try_acquire();
    assert!(!refused.is_allowed());
    assert!(refused.is_overflow(), "{refused:?}");
    assert_eq!(global.available(), 10);
}

/// A settle checks the whole reservation first: more costs than parts, a reservation of an
/// `AllOf` of another number of parts or of other parts are refused, and nothing is settled.
#[test]
fn a_settle_that_fails_settles_nothing() {
    let clock = FakeClock::new();
    let (x, y) = (keyed("10/1h", &clock), keyed("10/1h", &clock));
    let two = AllOf::new().key(&x, "alice").key(&y, "alice");
    let reservation = two.reserve().unwrap();
    assert_eq!(
        two.settle(reservation, &[0, 0, 0]),
        Err(SettleError::Parts { parts: 2, given: 3 })
    );
    let reservation = two.reserve().unwrap();
    let three = AllOf::new()
        .key(&x, "alice")
        .key(&y, "alice")
        .key(&y, "bob");
    assert_eq!(
        three.settle(reservation, &[0, 0]),
        Err(SettleError::Parts { parts: 2, given: 3 })
    );
    let reservation = two.reserve().unwrap();
    let other = AllOf::new().key(&x, "bob").key(&y, "alice");
    assert_eq!(
        other.settle(reservation, &[0, 0]),
        Err(SettleError::OtherKey)
    );
    // Three reservations of one permit on each part, none given back.
    assert_eq!((x.available("alice"), y.available("alice")), (7, 7));
}

/// On a striped key, a part taken before others reads the key's word (it may be given
/// back), and the part added last is decided as its limiter decides alone (it never is),
/// stripes included: a peek of the whole says what `try_acquire` then decides, either way.
#[test]
fn a_striped_part_is_peeked_as_it_is_taken() {
    let clock = FakeClock::new();
    // 5 µs a permit: a lease takes 2, and the stripe keeps the one its request did not use.
    let hot = direct("1000/5ms", &clock);
    let other = direct("10/1h", &clock);
    hot.stripe_now();
    assert!(hot.try_acquire().is_allowed());
    assert!(hot.try_acquire_n(998).unwrap().is_allowed());
    assert_eq!(hot.available(), 1, "the stripe's permit");

    let first = AllOf::new().direct(&hot).direct(&other);
    let peeked = first.peek();
    assert!(
        !peeked.is_allowed(),
        "a part taken first takes from the word, which is empty"
    );
    assert_eq!(peeked, first.try_acquire());
    assert_eq!(other.available(), 10, "the refusal spent nothing");

    let last = AllOf::new().direct(&other).direct(&hot);
    let peeked = last.peek();
    assert!(peeked.is_allowed(), "the part added last counts the stripe");
    assert_eq!(peeked, last.try_acquire());
    assert!(
        !hot.try_acquire().is_allowed(),
        "the stripe's permit went to the AllOf"
    );
    assert_eq!(other.available(), 9);
}

/// A direct part checks its reservation too: one of another direct limiter is refused, and
/// nothing is settled.
#[test]
fn a_direct_part_refuses_another_limiters_reservation() {
    let clock = FakeClock::new();
    let (x, a, b) = (
        keyed("10/1h", &clock),
        direct("10/1h", &clock),
        direct("10/1h", &clock),
    );
    let on_a = AllOf::new().key(&x, "alice").direct(&a);
    let reservation = on_a.reserve().unwrap();
    let on_b = AllOf::new().key(&x, "alice").direct(&b);
    assert_eq!(
        on_b.settle(reservation, &[0, 0]),
        Err(SettleError::OtherLimiter)
    );
    assert_eq!(
        (x.available("alice"), a.available(), b.available()),
        (9, 9, 10)
    );
    // The direct part first, so settled last: its check comes before the key's refund.
    let first_a = AllOf::new().direct(&a).key(&x, "alice");
    let reservation = first_a.reserve().unwrap();
    let first_b = AllOf::new().direct(&b).key(&x, "alice");
    assert_eq!(
        first_b.settle(reservation, &[0, 0]),
        Err(SettleError::OtherLimiter)
    );
    assert_eq!(
        (x.available("alice"), a.available()),
        (8, 8),
        "nothing settled"
    );
}

/// `Debug` shows each part's name and cost (not its limiter's whole state).
#[test]
fn debug_shows_each_parts_name_and_cost() {
    let clock = FakeClock::new();
    let (x, a) = (keyed("10/1h", &clock), direct("10/1h", &clock));
    let all = AllOf::new()
        .key_n(&x, "alice", 3)
        .named("tokens")
        .direct(&a);
    assert_eq!(
        format!("{all:?}"),
        "AllOf { parts: (DirectPart { name: None, cost: 1, .. }, \
         (KeyPart { name: Some(\"tokens\"), cost: 3, .. }, ())) }"
    );
}

/// A part whose key is new to its limiter may take long (here a resolver that sleeps 300 ms):
/// the parts after it decide at a fresh reading of the time, not at the one taken before it,
/// which would see 300 ms less of a refill (and could admit more, in real time, than a
/// policy allows).
#[test]
fn a_part_after_a_key_new_to_its_limiter_reads_the_time_afresh() {
    use crate::clock::SystemClock;

    let slow: RateLimiter<String, SystemClock> = RateLimiter::with_resolver(
        |_: &String| {
            std::thread::sleep(Duration::from_millis(300));
            "10/1s".parse().unwrap()
        },
        SystemClock::new(),
    );
    let global = DirectLimiter::new("1/1s".parse().unwrap());
    assert!(global.try_acquire().is_allowed());
    let refused = AllOf::new().key(&slow, "new").direct(&global).try_acquire();
    assert!(!refused.is_allowed());
    assert_eq!(refused.part(), 1);
    // Decided at least 300 ms after the global permit was spent: at most 700 ms to wait
    // (decided at the reading taken before the slow part, it would be about 1 s).
    assert!(
        refused.retry_after() <= Duration::from_millis(700),
        "retry after {:?}",
        refused.retry_after()
    );
    // The refusal gave the new key's permit back.
    assert_eq!(slow.available("new"), 10);
}

/// A system clock that notes, each time a part asks it for the time at the decision's
/// reading, whether the reading was already taken.
#[derive(Default)]
struct Probe {
    clock: crate::clock::SystemClock,
    found_taken: std::sync::Mutex<Vec<bool>>,
}

impl crate::Clock for Probe {
    fn now(&self) -> u64 {
        self.clock.now()
    }

    fn now_in(&self, reading: &mut crate::clock::Reading) -> u64 {
        self.found_taken.lock().unwrap().push(reading.is_taken());
        self.clock.now_in(reading)
    }
}

/// The first part takes the decision's one reading of the time and every later part
/// decides at it; a key new to its limiter clears it, and the part after it takes a new one.
#[test]
fn the_parts_share_one_reading_until_a_key_is_new() {
    let probe = Arc::new(Probe::default());
    let direct = |policy: &str| DirectLimiter::with_clock(policy.parse().unwrap(), probe.clone());
    let (first, second) = (direct("10/1h"), direct("10/1h"));
    let users: RateLimiter<String, Arc<Probe>> =
        RateLimiter::with_clock("10/1h".parse().unwrap(), probe.clone());
    let all = || {
        AllOf::new()
            .direct(&first)
            .key(&users, "ann")
            .direct(&second)
    };

    assert!(all().try_acquire().is_allowed());
    // "ann" was new: the part after it read afresh.
    assert_eq!(*probe.found_taken.lock().unwrap(), [false, true, false]);
    probe.found_taken.lock().unwrap().clear();
    assert!(all().try_acquire().is_allowed());
    assert_eq!(*probe.found_taken.lock().unwrap(), [false, true, true]);
    probe.found_taken.lock().unwrap().clear();
    assert!(all().reserve().unwrap().decision().is_allowed());
    assert_eq!(*probe.found_taken.lock().unwrap(), [false, true, true]);
}

/// Of equal answers the first part's is reported: among admissions the first with the least
/// left, among refusals the first with the longest wait.
#[test]
fn the_first_of_equal_parts_is_reported() {
    let clock = FakeClock::new();
    let (a, b) = (direct("5/1s", &clock), direct("5/1s", &clock));
    let allowed = AllOf::new().direct(&a).direct(&b).try_acquire();
    assert!(allowed.is_allowed());
    assert_eq!((allowed.part(), allowed.remaining()), (0, 4));
    for _ in 0..4 {
        assert!(AllOf::new()
            .direct(&a)
            .direct(&b)
            .try_acquire()
            .is_allowed());
    }
    let refused = AllOf::new().direct(&a).direct(&b).try_acquire();
    assert!(!refused.is_allowed());
    assert_eq!(refused.part(), 0);
    assert_eq!(refused.retry_after(), Duration::from_millis(200));
}

/// A part on a clock of its own decides at that clock's time, not at zero.
#[test]
fn a_part_on_a_fake_clock_decides_at_its_time() {
    let clock = FakeClock::new();
    let (a, b) = (direct("1/1s", &clock), keyed("1/1s", &clock));
    assert!(AllOf::new()
        .direct(&a)
        .key(&b, "k")
        .try_acquire()
        .is_allowed());
    clock.advance(Duration::from_millis(600));
    let refused = AllOf::new().direct(&a).key(&b, "k").try_acquire();
    assert_eq!(refused.retry_after(), Duration::from_millis(400));
    clock.advance(Duration::from_millis(400));
    assert!(AllOf::new()
        .direct(&a)
        .key(&b, "k")
        .try_acquire()
        .is_allowed());
    assert!(AllOf::new()
        .key(&b, "k")
        .direct(&a)
        .reserve()
        .is_ok_and(|r| !r.decision().is_allowed()));
}

/// A part that always refuses: its one permit spent for a thousand hours.
fn spent(clock: &FakeClock) -> DirectLimiter<FakeClock> {
    let limiter = direct("1/1000h", clock);
    assert!(limiter.try_acquire().is_allowed());
    limiter
}

#[test]
fn a_refusal_gives_back_what_a_full_limiters_shared_state_took() {
    let clock = FakeClock::new();
    let full = keyed("3/1h", &clock).max_keys(1);
    assert!(full.try_acquire("tracked").is_allowed());
    let closed = spent(&clock);
    // "newcomer" finds the limiter full: its requests are decided by the shared state.
    for _ in 0..3 {
        let all = AllOf::new().key(&full, "newcomer").direct(&closed);
        assert!(!all.try_acquire().is_allowed());
    }
    assert_eq!(
        full.available("newcomer"),
        3,
        "the shared state got its permits back"
    );
    assert!(full.try_acquire("someone-else").is_allowed());
}

#[test]
fn a_cancel_gives_back_what_a_full_limiters_shared_state_took() {
    let clock = FakeClock::new();
    let full = keyed("3/1h", &clock).max_keys(1);
    assert!(full.try_acquire("tracked").is_allowed());
    let global = direct("100/1h", &clock);
    let all = AllOf::new().key_n(&full, "newcomer", 3).direct(&global);
    let reservation = all.reserve().unwrap();
    assert!(reservation.decision().is_allowed());
    assert_eq!(full.available("newcomer"), 0);
    all.cancel(reservation).unwrap();
    assert_eq!((full.available("newcomer"), global.available()), (3, 100));
}

#[test]
fn a_refusal_leaves_no_key_behind() {
    let clock = FakeClock::new();
    let users = keyed("5/1h", &clock).sweep_per_insert(0).with_stats();
    let closed = spent(&clock);
    for i in 0..100 {
        let key = format!("user-{i}");
        let all = AllOf::new().key(&users, key.as_str()).direct(&closed);
        assert!(!all.try_acquire().is_allowed());
    }
    assert_eq!((users.len(), users.stats().keys), (0, 0));
    // A key that was there before stays, at rest or not.
    assert!(users.try_acquire("known").is_allowed());
    users
        .cancel("known", users.reserve_n("known", 1).unwrap())
        .unwrap();
    let all = AllOf::new().key(&users, "known").direct(&closed);
    assert!(!all.try_acquire().is_allowed());
    assert_eq!((users.len(), users.available("known")), (1, 4));
}

#[test]
fn a_key_created_by_a_refused_request_stays_when_another_spent_from_it() {
    let clock = FakeClock::new();
    let users = keyed("5/1h", &clock);
    let closed = spent(&clock);
    // The part's take creates the key; another request spends from it before the give-back.
    let racing = AllOf::new().key(&users, "alice").direct(&closed);
    assert!(!racing.try_acquire().is_allowed());
    assert!(users.try_acquire("alice").is_allowed());
    assert!(!racing.try_acquire().is_allowed());
    assert_eq!((users.len(), users.available("alice")), (1, 4));
}

#[test]
fn a_settle_refuses_another_all_ofs_reservation_with_a_shadow_part() {
    let clock = FakeClock::new();
    let shadowed = keyed("1/1h", &clock).shadow();
    assert!(shadowed.try_acquire("a").is_allowed());
    let (other, global) = (keyed("10/1h", &clock), direct("10/1h", &clock));
    let mine = AllOf::new().key(&shadowed, "a").direct(&global);
    let reservation = mine.reserve().unwrap();
    // The shadow part refused and let the request through, holding nothing.
    assert!(reservation.decision().is_allowed());
    let theirs = AllOf::new().key(&other, "z").direct(&global);
    assert_eq!(
        theirs.settle(reservation, &[5, 5]),
        Err(SettleError::OtherLimiter)
    );
    assert_eq!(global.available(), 9, "nothing settled");
}

/// The protocol over parts known at run time gives back what it took, the last taken
/// first, when a later part panics, as when one refuses or fails.
#[cfg(any(feature = "redis", feature = "tower"))]
#[test]
fn parts_in_order_are_given_back_when_a_later_one_panics() {
    use std::cell::RefCell;

    use crate::decision::Decision;

    let given_back = RefCell::new(Vec::new());
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = super::in_order::take_in_order::<usize, ()>(
            3,
            |index| {
                assert!(index < 2, "part {index} fails");
                Ok((Decision::allow(1, 2, 0), 1, Some(index)))
            },
            |_| Ok((Decision::allow(1, 2, 0), 1)),
            |index, held| given_back.borrow_mut().push((index, held)),
        );
    }));
    assert!(outcome.is_err());
    assert_eq!(*given_back.borrow(), [(1, 1), (0, 0)]);
}

/// One limiter and key in two places count as one request of their costs added: a total
/// above the policy's permits is bad input, named after the second place, refused for good
/// (never a wait after which the same request would be refused again); a total within
/// them is decided as usual, and its wait honoured.
#[test]
fn one_key_in_two_places_is_one_cost_added() {
    let clock = FakeClock::new();
    let limiter = keyed("5/1s", &clock);
    let global = direct("5/1s", &clock);
    let too_much = AllOf::new()
        .key_n(&limiter, "a", 3)
        .direct(&global)
        .key_n(&limiter, "a", 3);
    let error = too_much.check().unwrap_err();
    assert_eq!(
        (error.part(), error.error()),
        (2, CostError::ExceedsLimit { cost: 6, limit: 5 })
    );
    let refused = too_much.try_acquire();
    assert!(!refused.is_allowed());
    assert_eq!((refused.retry_after_nanos(), refused.part()), (u64::MAX, 2));
    assert_eq!(too_much.peek().retry_after_nanos(), u64::MAX);
    assert_eq!(too_much.reserve().unwrap_err().part(), 2);
    assert_eq!((limiter.available("a"), global.available()), (5, 5));
    let twice = AllOf::new().direct_n(&global, 2).direct_n(&global, 3);
    assert_eq!(twice.check(), Ok(()));
    assert!(twice.try_acquire().is_allowed());
    let refused = twice.try_acquire();
    assert!(!refused.is_allowed() && refused.retry_after_nanos() < u64::MAX);
    clock.advance(refused.retry_after());
    assert!(twice.try_acquire().is_allowed(), "the wait was honoured");
}
