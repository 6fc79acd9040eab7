//! A reservation made before a `reset` or a policy change gives nothing back to the state
//! built after it, whatever the interleaving: here the change runs *inside* the settle, from
//! the clock reading it takes once it has found the state it would write to (the widest
//! window such a race has).

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tollgate::{Clock, DirectLimiter, FakeClock, RateLimiter};

type Hook = Box<dyn FnOnce() + Send>;

/// A frozen clock that runs a hook (once) at the next reading taken after it is armed.
#[derive(Clone, Default)]
struct HookClock {
    time: FakeClock,
    hook: Arc<Mutex<Option<Hook>>>,
}

impl HookClock {
    fn arm(&self, hook: impl FnOnce() + Send + 'static) {
        *self.hook.lock().unwrap() = Some(Box::new(hook));
    }
}

impl Clock for HookClock {
    fn now(&self) -> u64 {
        let hook = self.hook.lock().unwrap().take();
        if let Some(hook) = hook {
            hook();
        }
        self.time.now()
    }

    fn sleep(&self, duration: Duration) {
        self.time.sleep(duration);
    }
}

/// Admissions of `try_acquire` until the first refusal.
fn admissions(mut try_acquire: impl FnMut() -> bool) -> u64 {
    let mut admitted = 0;
    while try_acquire() {
        admitted += 1;
        assert!(admitted <= 1_000, "never refused");
    }
    admitted
}

/// A limiter built by `build` on a clock with a hook, shared so that the hook can reach it.
fn hooked<L: Send + Sync + 'static>(
    build: impl FnOnce(HookClock) -> L,
) -> (Arc<OnceLock<L>>, HookClock) {
    let clock = HookClock::default();
    let cell = Arc::new(OnceLock::new());
    assert!(cell.set(build(clock.clone())).is_ok());
    (cell, clock)
}

#[test]
fn a_reset_inside_a_settle_gets_no_refund_of_what_came_before_it() {
    for policy in [
        "token-bucket 10/1h",
        "sliding-log 10/1h",
        "sliding-counter 10/1h",
        "10/1h & sliding-log 20/1d",
    ] {
        let (cell, clock) = hooked(|clock| {
            RateLimiter::<u64, HookClock>::with_clock(policy.parse().unwrap(), clock)
        });
        let limiter = cell.get().unwrap();
        let reservation = limiter.reserve_n(&1, 10).unwrap();
        assert!(reservation.decision().is_allowed(), "{policy}");
        let inside = Arc::clone(&cell);
        clock.arm(move || {
            let limiter = inside.get().unwrap();
            assert!(limiter.reset(&1));
            for _ in 0..10 {
                assert!(limiter.try_acquire(&1).is_allowed());
            }
        });
        limiter.cancel(&1, reservation).unwrap();
        // The reset's fresh state admitted its 10 inside the settle, and the reservation's
        // 10 were never its own to give back.
        assert_eq!(
            admissions(|| limiter.try_acquire(&1).is_allowed()),
            0,
            "{policy}"
        );
    }
}

#[test]
fn a_policy_change_inside_a_settle_gets_no_refund_of_what_came_before_it() {
    // The new policy has the old one's rate and twice its burst: the 10 reserved move over
    // spent, the hook spends the 10 left, and a refund would hand 10 more.
    for (old, new) in [
        ("token-bucket 10/1h", "token-bucket 20/2h"),
        ("sliding-log 10/1h", "sliding-log 20/1h"),
        ("sliding-counter 10/1h", "sliding-counter 20/1h"),
    ] {
        // The keyed limiter: the key moves to the new generation inside the settle.
        let (cell, clock) =
            hooked(|clock| RateLimiter::<u64, HookClock>::with_clock(old.parse().unwrap(), clock));
        let limiter = cell.get().unwrap();
        let reservation = limiter.reserve_n(&1, 10).unwrap();
        let inside = Arc::clone(&cell);
        let new_policy = new.parse().unwrap();
        clock.arm(move || {
            let limiter = inside.get().unwrap();
            limiter.set_policy(new_policy);
            for _ in 0..10 {
                assert!(limiter.try_acquire(&1).is_allowed());
            }
        });
        limiter.cancel(&1, reservation).unwrap();
        assert_eq!(
            admissions(|| limiter.try_acquire(&1).is_allowed()),
            0,
            "{old} -> {new}"
        );

        // The direct limiter.
        let (cell, clock) = hooked(|clock| DirectLimiter::with_clock(old.parse().unwrap(), clock));
        let limiter = cell.get().unwrap();
        let reservation = limiter.reserve_n(10).unwrap();
        let inside = Arc::clone(&cell);
        clock.arm(move || {
            let limiter = inside.get().unwrap();
            limiter.set_policy(new_policy);
            for _ in 0..10 {
                assert!(limiter.try_acquire().is_allowed());
            }
        });
        limiter.cancel(reservation).unwrap();
        assert_eq!(
            admissions(|| limiter.try_acquire().is_allowed()),
            0,
            "{old} -> {new}"
        );
    }
}

#[test]
fn a_refund_before_the_change_still_counts() {
    // The control: a settle that lands before the change gives back, and the change then
    // carries the state as the settle left it.
    let clock = FakeClock::new();
    let limiter: RateLimiter<u64, FakeClock> =
        RateLimiter::with_clock("10/1h".parse().unwrap(), clock);
    let reservation = limiter.reserve_n(&1, 10).unwrap();
    limiter.settle(&1, reservation, 4).unwrap();
    limiter.set_policy("20/2h".parse().unwrap());
    assert_eq!(admissions(|| limiter.try_acquire(&1).is_allowed()), 16);
}

#[test]
fn a_reservation_made_while_a_policy_change_is_under_way_gets_no_refund() {
    // The reservation is made from inside the change (its first clock reading), on the state
    // the key still has: a refund could not tell that state from the one the key moves to.
    let (cell, clock) =
        hooked(|clock| RateLimiter::<u64, HookClock>::with_clock("100/1h".parse().unwrap(), clock));
    let limiter = cell.get().unwrap();
    for _ in 0..90 {
        assert!(limiter.try_acquire(&1).is_allowed());
    }
    let reserved: Arc<Mutex<Option<tollgate::Reservation>>> = Arc::new(Mutex::new(None));
    let (inside, slot) = (Arc::clone(&cell), Arc::clone(&reserved));
    clock.arm(move || {
        let reservation = inside.get().unwrap().reserve_n(&1, 10).unwrap();
        assert!(reservation.decision().is_allowed());
        *slot.lock().unwrap() = Some(reservation);
    });
    limiter.set_policy("10/1h".parse().unwrap());
    let reservation = reserved
        .lock()
        .unwrap()
        .take()
        .expect("reserved inside the change");
    limiter.cancel(&1, reservation).unwrap();
    // 100 spent, carried into a policy of 10: nothing left, and nothing given back.
    assert_eq!(admissions(|| limiter.try_acquire(&1).is_allowed()), 0);
}
