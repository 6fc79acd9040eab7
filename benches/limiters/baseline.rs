//! What tollgate is measured against besides governor: the same GCRA behind a lock, and the
//! physical floor no limiter can beat.
//!
//! Every contestant reads the same clock (`tollgate::SystemClock`, i.e. `quanta`) and the
//! lock baselines run tollgate's own arithmetic (debt clamped to the burst, remaining permits
//! computed on every admission), so the only difference left is how the state is shared.
//!
//! The keyed baselines are one `HashMap` of TATs behind one lock: with SipHash (the standard
//! default) behind `std::sync::Mutex` or `parking_lot::Mutex` (`std_mutex`, `parking_lot`),
//! and [`MutexFast`] (`mutex_fast`), the version a user would write by hand with a fast hash:
//! `parking_lot::Mutex<HashMap<K, u64, foldhash::fast::RandomState>>`.

use std::borrow::Borrow;
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;
use tollgate::{Clock, SystemClock};

/// What a baseline decided: enough to build an HTTP 429, like `tollgate::Decision`.
/// The benches hand a whole `Verdict` to `black_box`, so every field is computed.
#[derive(Clone, Copy, Debug)]
#[allow(dead_code)]
pub struct Verdict {
    pub allowed: bool,
    pub remaining: u64,
    pub wait: u64,
}

/// GCRA parameters: emission interval T (rounded up) and burst allowance B = N * T.
#[derive(Clone, Copy, Debug)]
pub struct Gcra {
    interval: u64,
    burst: u64,
}

impl Gcra {
    /// `permits` per `window_nanos`, as tollgate derives them.
    pub fn new(permits: u64, window_nanos: u64) -> Self {
        let interval = window_nanos.div_ceil(permits);
        Gcra {
            interval,
            burst: permits * interval,
        }
    }

    /// Decides one request against `tat` at `now`, updating `tat` when it is admitted.
    #[inline]
    pub fn decide(&self, tat: &mut u64, now: u64) -> Verdict {
        let debt = tat.saturating_sub(now).min(self.burst);
        let new_debt = debt + self.interval;
        if new_debt <= self.burst {
            *tat = now + new_debt;
            Verdict {
                allowed: true,
                remaining: (self.burst - new_debt) / self.interval,
                wait: 0,
            }
        } else {
            Verdict {
                allowed: false,
                remaining: (self.burst - debt) / self.interval,
                wait: new_debt - self.burst,
            }
        }
    }
}

/// A mutual-exclusion lock, so each baseline is written once for both mutexes.
pub trait Lock<T>: Send + Sync {
    fn new(value: T) -> Self;
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R;
}

impl<T: Send> Lock<T> for std::sync::Mutex<T> {
    fn new(value: T) -> Self {
        std::sync::Mutex::new(value)
    }

    #[inline]
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        f(&mut self
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}

impl<T: Send> Lock<T> for parking_lot::Mutex<T> {
    fn new(value: T) -> Self {
        parking_lot::Mutex::new(value)
    }

    #[inline]
    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        f(&mut self.lock())
    }
}

pub type StdMutex<T> = std::sync::Mutex<T>;
pub type PlMutex<T> = parking_lot::Mutex<T>;

/// A direct GCRA whose TAT sits in a `Mutex<u64>` (on its own cache line, like tollgate's).
pub struct LockedDirect<L> {
    tat: CachePadded<L>,
    gcra: Gcra,
    clock: SystemClock,
}

impl<L: Lock<u64>> LockedDirect<L> {
    pub fn new(permits: u64, window_nanos: u64) -> Self {
        LockedDirect {
            tat: CachePadded::new(L::new(0)),
            gcra: Gcra::new(permits, window_nanos),
            clock: SystemClock::new(),
        }
    }

    #[inline]
    pub fn check(&self) -> Verdict {
        // The clock is read under the lock, as a decision must be made at one instant.
        self.tat.with(|tat| self.gcra.decide(tat, self.clock.now()))
    }
}

/// A keyed GCRA: one `HashMap` of TATs behind one lock, the limiter most services write
/// first. `S` is the map's hasher: SipHash (`std`'s `RandomState`, the standard default)
/// unless given.
pub struct LockedKeyed<K, L, S = RandomState> {
    map: L,
    gcra: Gcra,
    clock: SystemClock,
    _key: std::marker::PhantomData<(K, S)>,
}

/// The hasher of [`MutexFast`]: foldhash's fast variant, randomly seeded.
pub type FastHash = foldhash::fast::RandomState;

/// The hand-written mutex version with a fast hash (`mutex_fast` in the `keyed_hot`,
/// `keyed_many` and `threads` groups): a `HashMap` of TATs with [`FastHash`] behind
/// `parking_lot::Mutex`, String keys looked up by `&str`.
pub type MutexFast<K> = LockedKeyed<K, PlMutex<HashMap<K, u64, FastHash>>, FastHash>;

impl<K, L, S> LockedKeyed<K, L, S>
where
    K: Hash + Eq + Send,
    L: Lock<HashMap<K, u64, S>>,
    S: BuildHasher + Default,
{
    pub fn new(permits: u64, window_nanos: u64) -> Self {
        LockedKeyed {
            map: L::new(HashMap::with_hasher(S::default())),
            gcra: Gcra::new(permits, window_nanos),
            clock: SystemClock::new(),
            _key: std::marker::PhantomData,
        }
    }

    /// Decides for `key`, inserting it on its first request. Any borrowed form of the key
    /// will do (`&str` for `String` and `Box<str>` keys), as with tollgate's `try_acquire`.
    #[inline]
    pub fn check<Q>(&self, key: &Q) -> Verdict
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        self.map.with(|map| {
            let now = self.clock.now();
            match map.get_mut(key) {
                Some(tat) => self.gcra.decide(tat, now),
                None => self
                    .gcra
                    .decide(map.entry(K::from(key.to_owned())).or_insert(0), now),
            }
        })
    }
}

/// The physical floor of a decision on one state: one clock read, one atomic load and one
/// compare-and-swap whose new value depends on the clock. No limiter can do less and still
/// be exact under concurrency.
pub struct Floor {
    word: CachePadded<AtomicU64>,
    clock: SystemClock,
}

impl Floor {
    pub fn new() -> Self {
        Floor {
            word: CachePadded::new(AtomicU64::new(0)),
            clock: SystemClock::new(),
        }
    }

    #[inline]
    pub fn check(&self) -> bool {
        let now = self.clock.now();
        let cur = self.word.load(Ordering::Relaxed);
        self.word
            .compare_exchange(cur, cur.max(now) + 1, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }
}
