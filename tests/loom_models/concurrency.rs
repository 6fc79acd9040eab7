//! Loom models of the concurrency limiter's per-key count (`ModelGauge` wraps the very gauge
//! and `Permit` the limiter hands out, shared permits of a full limiter included) and of the
//! login guard's strike record: every interleaving of two threads.
//!
//! Run with:
//!
//! ```text
//! LOOM_MAX_PREEMPTIONS=3 RUSTFLAGS="--cfg tollgate_loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test --release --test loom_models concurrency::
//! ```
//!
//! The gauge's count is a loom atomic (through the crate's `sync` shim); the permit's `Arc`
//! is the standard one, whose correctness is taken as given.

use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::Arc;
use loom::thread;
use tollgate::concurrency::Permit;
use tollgate::login::LoginConfig;
use tollgate::model::{ModelGauge, ModelStrikes};

fn gauge(limit: u64) -> Arc<ModelGauge> {
    Arc::new(ModelGauge::new(limit))
}

/// A permit, if the gauge handed one out.
fn acquire(gauge: &ModelGauge) -> Option<Permit> {
    gauge.try_acquire().ok()
}

/// Two threads race for the last place (limit 2, one already held): exactly one gets it,
/// and the refused one changed nothing.
#[test]
fn two_acquirers_race_for_the_last_place() {
    loom::model(|| {
        let gauge = gauge(2);
        let held = acquire(&gauge).expect("first place");
        let other = {
            let gauge = gauge.clone();
            thread::spawn(move || acquire(&gauge))
        };
        let mine = acquire(&gauge);
        let theirs = other.join().unwrap();
        assert_eq!(
            usize::from(mine.is_some()) + usize::from(theirs.is_some()),
            1
        );
        assert_eq!(gauge.in_flight(), 2);
        drop((held, mine, theirs));
        assert_eq!(gauge.in_flight(), 0);
    });
}

/// A holder releases while another thread acquires (limit 1): the acquirer gets the place
/// only from the count the release left, and every place comes back. (Eviction removes a
/// gauge only at 0 under its bucket's exclusive lock, where no acquirer can be: a race the
/// map's lock decides, not the gauge.)
#[test]
fn release_races_acquire() {
    loom::model(|| {
        let gauge = gauge(1);
        let permit = acquire(&gauge).expect("place");
        let holder = thread::spawn(move || drop(permit));
        let mine = acquire(&gauge);
        holder.join().unwrap();
        assert_eq!(gauge.in_flight(), u64::from(mine.is_some()));
        drop(mine);
        assert_eq!(gauge.in_flight(), 0, "a place was not returned");
    });
}

/// A permit of limit 1 orders the guarded work like a lock: each holder reads and then
/// writes a plain `Relaxed` counter, and no increment is lost. (With a `Relaxed` acquire or
/// release on the count, loom finds a holder that reads the counter stale.)
#[test]
fn a_permit_orders_the_guarded_work() {
    loom::model(|| {
        let gauge = gauge(1);
        let data = Arc::new(AtomicU64::new(0));
        let work = |gauge: &ModelGauge, data: &AtomicU64| -> u64 {
            match acquire(gauge) {
                Some(_permit) => {
                    let seen = data.load(Ordering::Relaxed);
                    data.store(seen + 1, Ordering::Relaxed);
                    1
                }
                None => 0,
            }
        };
        let other = {
            let (gauge, data) = (gauge.clone(), data.clone());
            thread::spawn(move || work(&gauge, &data))
        };
        let mine = work(&gauge, &data);
        let entered = mine + other.join().unwrap();
        assert!(entered >= 1);
        assert_eq!(
            data.load(Ordering::Relaxed),
            entered,
            "an increment was lost"
        );
    });
}

/// A key's permit taken while the map was full (on its ledger gauge, limit 1, and the shared
/// gauge) ends while the key, tracked again on that same gauge, takes a permit of its own:
/// the own permit is granted only from the count the shared one left, so the key never has
/// two in flight, and the guarded work of the two is ordered as by a lock. Every place, the
/// shared one included, comes back.
#[test]
fn a_shared_permit_counts_on_the_gauge_its_key_is_tracked_on() {
    loom::model(|| {
        let key = gauge(1);
        let shared = gauge(2);
        let data = Arc::new(AtomicU64::new(0));
        let permit = key.try_acquire_overflow(&shared).expect("a shared place");
        assert!(permit.is_overflow());
        let holder = {
            let data = data.clone();
            thread::spawn(move || {
                let seen = data.load(Ordering::Relaxed);
                data.store(seen + 1, Ordering::Relaxed);
                drop(permit);
            })
        };
        let mine = acquire(&key);
        if mine.is_some() {
            let seen = data.load(Ordering::Relaxed);
            assert_eq!(seen, 1, "the shared permit's work is not seen");
            data.store(seen + 1, Ordering::Relaxed);
        }
        holder.join().unwrap();
        assert!(key.in_flight() <= 1);
        drop(mine);
        assert_eq!((key.in_flight(), shared.in_flight()), (0, 0));
    });
}

/// Two untracked keys race for the last shared place (limit 1) while a third key's shared
/// permit ends: at most one place is out at a time, a refused key's own gauge is left as it
/// was (its place given back), and every place comes back.
#[test]
fn racing_overflow_requests_share_the_last_place_and_refusals_change_nothing() {
    loom::model(|| {
        let shared = gauge(1);
        let (first, second, third) = (gauge(1), gauge(1), gauge(1));
        let held = first
            .try_acquire_overflow(&shared)
            .expect("the shared place");
        assert!(second.try_acquire_overflow(&shared).is_err());
        assert_eq!(second.in_flight(), 0);
        let other = {
            let (shared, second) = (shared.clone(), second.clone());
            thread::spawn(move || {
                let got = second.try_acquire_overflow(&shared).ok();
                if got.is_none() {
                    assert_eq!(second.in_flight(), 0, "a refusal kept the key's place");
                }
                got
            })
        };
        drop(held);
        let mine = third.try_acquire_overflow(&shared).ok();
        if mine.is_none() {
            assert_eq!(third.in_flight(), 0, "a refusal kept the key's place");
        }
        let theirs = other.join().unwrap();
        assert!(mine.is_none() || theirs.is_none(), "two shared places out");
        assert!(shared.in_flight() <= 1);
        drop((mine, theirs));
        assert_eq!(
            (first.in_flight(), second.in_flight(), third.in_flight()),
            (0, 0, 0)
        );
        assert_eq!(shared.in_flight(), 0);
    });
}

/// Two failures that exhaust an account in the same window race to record the strike: it
/// counts once. A third strike in the next window then continues the streak.
#[test]
fn racing_strikes_in_one_window_count_once() {
    const MIN: u64 = 60_000_000_000;
    loom::model(|| {
        let config = LoginConfig::default().with_strikes_to_lock(2);
        let record = Arc::new(ModelStrikes::new(&config));
        let other = {
            let record = record.clone();
            thread::spawn(move || record.strike(MIN))
        };
        let mine = record.strike(MIN);
        let theirs = other.join().unwrap();
        assert_eq!((mine, theirs), (1, 1));
        assert_eq!(record.locked_for(MIN), None);
        // Window 2 is [16, 31) min: the second strike locks out for 15 min.
        assert_eq!(record.strike(20 * MIN), 2);
        assert_eq!(record.locked_for(20 * MIN), Some(15 * MIN));
    });
}
