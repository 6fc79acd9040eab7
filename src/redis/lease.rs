//! Leases: permits taken from Redis ahead, in one script call, and admitted locally. This
//! module is the lease map and its rules, with no call to Redis; the calls that take,
//! replace and give back leases are in `leased`, and the call that gives one back is in
//! `give_back`.
//!
//! With [`RedisLimiterBuilder::lease`](super::RedisLimiterBuilder::lease), a key that is hot
//! on this server takes several permits at once (a reservation: Redis counts them spent at
//! once), then admits requests from them without a round trip, until they are spent or the
//! lease expires. What a lease did not use is given back.
//!
//! # One lease per key, read without a lock
//!
//! Each key has at most one [`Lease`] on this limiter, in a [`HashIndex`] whose reads take no
//! lock. A request reads the key's lease and takes a permit by decrementing its count of
//! permits left (a compare-and-swap that never goes below zero): each permit is taken once.
//! The rest of a lease is fixed when it is made, but for the `remaining` it reports (which
//! only goes down, to what Redis reported since for requests that did not use the lease) and
//! the flags of the task that replaces it. At most [`MAX_KEYS`] keys are in the map.
//!
//! A lease that is spent or expired is replaced by exactly one task: the one that sets its
//! `busy` flag. That task first gives back what the old lease did not use (the count is
//! swapped to zero, so no request takes a permit after it is counted as unused), then asks
//! Redis for the next lease, installs it, and wakes the requests that waited for it: they
//! read the new lease (and wait again if it is spent already), or, when Redis refused the
//! lease, get that refusal, which Redis would have given them too. A request that waited for
//! longer than the limiter's timeout asks Redis itself. The sweeper (every quarter of the hold
//! time, at most every second) and [`RedisLimiter::close`](super::RedisLimiter::close) claim a
//! lease the same way before giving it back. A claim whose task is cancelled before it
//! finishes removes the lease and wakes the waiters ([`Claim`]), so no key is left with a
//! lease nobody may replace. Both sides of that hand-over are here: the claim, the wait
//! ([`Leases::wait`]) and the wake-up.
//!
//! # Given back once, and only to the state that counts it
//!
//! A lease of more than one permit writes a token next to the key's state in Redis (one per
//! limiter and key, naming the lease by its serial number). Giving a lease back is one script
//! call that applies only while the token names that lease, and deletes it: so a lease is
//! given back once at most, and never to a Redis that lost its data since (a restart without
//! persistence forgets the token with the counts), where a refund would give back permits
//! counted for other requests.
//!
//! A token also carries its own deadline (twice the hold time, plus the timeout and a
//! second, after its lease was taken), and every lease of the key that writes a token first
//! drops a bounded number of tokens whose deadline has passed: those of instances that closed
//! with their lease spent (nothing to give back, so nothing sent) or died. So a hot key's hash
//! of tokens holds about one token per instance that leased it recently, however many came
//! and went.
//!
//! # Size and hold time
//!
//! A key's first lease is of one permit: the request that takes it uses it, and nothing is
//! held. Each next lease doubles (up to the limiter's maximum) when the previous one was
//! spent within half the hold time, keeps its size when it lasted longer, and halves when it
//! expired with more than half of it unused. A lease expires after the hold time, a tenth of
//! the policy's shortest window, so that permits held by one server are back in Redis within
//! that time (sooner when its key goes quiet: a lease untouched for a sweep period is given
//! back).

use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use scc::hash_index::Entry;
use scc::HashIndex;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::decision::Decision;
use crate::keys::KeyHasher;

use super::give_back::{Held, Returner};

/// The longest a lease token is kept, in ms: 2^40 ms, about 34.8 years (twice the longest
/// hold time of a supported policy, plus an hour's timeout, is below it). Keeps the token's
/// deadline, `now + ttl` in microseconds, below 2^53, where Lua's numbers are exact.
pub(super) const MAX_TOKEN_TTL_MS: u64 = 1 << 40;

/// A lease is held at most this fraction of the policy's shortest window: 1/10.
pub(super) const HOLD_FRACTION: u64 = 10;

/// The first lease of a key: one permit, which the request taking it uses.
const FIRST_SIZE: u64 = 1;

/// The most keys with a lease (or the size of their next one) at once: beyond, a new key's
/// requests are decided by Redis without a lease until the sweeper makes room.
pub(super) const MAX_KEYS: usize = 100_000;

/// Permits of one key taken from Redis ahead.
#[derive(Debug)]
pub(super) struct Lease {
    /// Permits left to admit locally.
    left: AtomicU64,
    /// Permits Redis granted (0 for a placeholder that only carries the next size).
    granted: u64,
    /// The size asked for; the next lease's size is derived from it.
    asked: u64,
    /// The clock reading at which the lease was asked for.
    start: u64,
    /// The clock reading from which the lease admits nothing.
    expires: u64,
    /// What Redis reported as remaining once the lease was taken, lowered by what Redis
    /// reported since for requests of this key that did not use the lease.
    remaining: AtomicU64,
    limit: u64,
    /// The clock reading at which Redis said the key's state would be at rest.
    reset_at: u64,
    /// Set by the one task that replaces or gives back this lease.
    busy: AtomicBool,
    /// Permits left when the sweeper last saw the lease (`u64::MAX` before it did).
    seen: AtomicU64,
    /// What to give back with; taken by whoever gives the lease back (so once). `None` for
    /// a lease of one permit (nothing held beyond its first request) and for placeholders.
    held: Mutex<Option<Held>>,
    /// Wakes the requests that wait while the lease is replaced.
    done: Notify,
    /// The refusal of the request that tried to replace the lease, for those that waited.
    refused: OnceLock<Decision>,
}

impl Lease {
    /// A placeholder: holds nothing, and tells the next lease's size.
    pub(super) fn placeholder(size: u64, now: u64, busy: bool) -> Self {
        Lease {
            left: AtomicU64::new(0),
            granted: 0,
            asked: size,
            start: now,
            expires: now,
            remaining: AtomicU64::new(0),
            limit: 0,
            reset_at: now,
            busy: AtomicBool::new(busy),
            seen: AtomicU64::new(u64::MAX),
            held: Mutex::new(None),
            done: Notify::new(),
            refused: OnceLock::new(),
        }
    }

    /// Takes `n` permits: the permits left after, or `None` when fewer than `n` are left.
    fn take(&self, n: u64) -> Option<u64> {
        // Relaxed: the count is its own and only datum; its read-modify-writes give every
        // permit to one caller. The lease's other fields were published with the lease.
        self.left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                left.checked_sub(n)
            })
            .ok()
            .map(|before| before - n)
    }

    /// The decision of a request admitted from the lease, `left` permits left after it, at
    /// `now`: remaining what Redis reported once the lease was taken plus what the lease has
    /// left (what Redis would have reported had the lease's requests so far gone to it one
    /// by one at that instant); `reset_after` Redis's, counted down.
    pub(super) fn admitted(&self, left: u64, now: u64) -> Decision {
        Decision::allow(
            // Relaxed: a figure for the report; see `Leases::lower`.
            self.remaining.load(Ordering::Relaxed).saturating_add(left),
            self.limit,
            self.reset_at.saturating_sub(now),
        )
    }

    /// Claims the lease for this task: `true` for the one task that sets its `busy` flag,
    /// which then replaces or gives back the lease.
    pub(super) fn claim(&self) -> bool {
        // Relaxed: the flag elects one task; what it then reads of the lease was published
        // with the lease, and the count is read by read-modify-writes.
        self.busy
            .compare_exchange(false, true, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// Ends the lease: what it holds to give back (taken once), and the permits it had not
    /// admitted, swapped to zero so that no request takes one of them any more.
    fn end(&self) -> (Option<Held>, u64) {
        let held = self
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        // Relaxed: see `Lease::take`; after the swap no request takes a permit of it.
        let unused = self.left.swap(0, Ordering::Relaxed);
        (held, unused)
    }

    /// Permits this lease admitted locally, once it can admit no more (its first went to
    /// the request that took it, decided by Redis).
    fn local(&self, unused: u64) -> u64 {
        self.granted.saturating_sub(1).saturating_sub(unused)
    }

    /// `true` for a placeholder: a lease that holds nothing and only tells the next one's
    /// size.
    pub(super) fn is_placeholder(&self) -> bool {
        self.granted == 0
    }
}

/// A lease claimed by this task (its `busy` flag set): if the task is cancelled before it
/// has replaced or given back the lease, the lease leaves the map (the key's next request
/// starts afresh) and the requests waiting for it wake, so that a key is never left with a
/// lease nobody may replace. Permits the task had in hand are then lost, counted spent.
pub(super) struct Claim<'a> {
    leases: &'a Leases,
    key: &'a str,
    lease: &'a Arc<Lease>,
    finished: bool,
}

impl<'a> Claim<'a> {
    pub(super) fn new(leases: &'a Leases, key: &'a str, lease: &'a Arc<Lease>) -> Self {
        Claim {
            leases,
            key,
            lease,
            finished: false,
        }
    }

    /// Redis refused the lease meant to replace this one: the requests waiting for it get
    /// `refusal`, which Redis would have given them too (read once [`finish`](Claim::finish)
    /// wakes them, see [`Leases::wait`]).
    pub(super) fn refuse(&self, refusal: Decision) {
        let _ = self.lease.refused.set(refusal);
    }

    /// The lease was replaced or given back: wake the requests waiting for it.
    pub(super) fn finish(mut self) {
        self.finished = true;
        self.lease.done.notify_waiters();
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.leases.remove(self.key, self.lease);
            self.lease.done.notify_waiters();
        }
    }
}

/// What a read of a key's lease found.
pub(super) enum Found {
    /// The request was admitted from the lease.
    Admitted(Decision),
    /// The lease is spent or expired (or holds fewer than asked).
    Stale(Arc<Lease>),
    /// The key has no lease.
    Absent,
}

/// How long [`Leases::wait`] waits at most.
#[derive(Clone, Copy, Debug)]
pub(super) enum Until {
    /// Until this instant.
    Deadline(Instant),
    /// For this long from the wait's start.
    Timeout(Duration),
}

/// What [`Leases::wait`] found.
#[derive(Clone, Copy, Debug)]
pub(super) enum Waited {
    /// The lease was replaced or given back, with the refusal of the request that tried to
    /// replace it, if Redis refused it.
    Done(Option<Decision>),
    /// The lease was still being replaced when the wait ended.
    TimedOut,
    /// The lease was no longer the key's lease: nothing to wait for.
    Gone,
}

/// The leases of one limiter, by key.
pub(super) struct Leases {
    map: HashIndex<String, Arc<Lease>, KeyHasher>,
    /// Entries in `map` (its own `len` reads the whole table).
    keys: AtomicUsize,
    /// The largest lease.
    max: u64,
    /// How long a lease may be held, in the limiter's clock's nanoseconds.
    hold: u64,
    /// How long a lease token is kept, in ms: the token's own deadline in the key's hash of
    /// tokens, and (on Redis `TIME`) the hash's expiry.
    ttl_ms: u64,
    serial: AtomicU64,
    /// Bumped by `reset`: a lease asked for before a reset is not installed after it.
    resets: AtomicU64,
    /// Set by `close`: no lease is taken any more.
    closed: AtomicBool,
    sweeper: Mutex<Option<tokio::task::AbortHandle>>,
    pub(super) returner: Arc<Returner>,
    /// Permits taken in leases, given back, and admitted locally by leases no longer in use.
    leased: AtomicU64,
    returned: AtomicU64,
    local: AtomicU64,
}

/// Lease counters for [`BackendStats`](super::BackendStats).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct LeaseCounts {
    pub(super) leased: u64,
    pub(super) returned: u64,
    pub(super) local: u64,
}

impl Leases {
    /// Leases of at most `max` permits, held at most `hold` ns of the limiter's clock, given
    /// back through `returner`.
    pub(super) fn new(max: u64, hold: u64, returner: Returner) -> Self {
        // The token outlives the lease: it is needed until the lease is given back, at its
        // expiry plus a sweep and a call. Clamped, so that the script's deadline arithmetic
        // stays exact and `PEXPIRE` accepts it whatever the settings (the hold time of a
        // supported policy, and a timeout clamped by the builder, keep it far below anyway).
        let nanos = u128::from(hold) * 2 + returner.timeout().as_nanos();
        let ttl_ms = u64::try_from(nanos.div_ceil(1_000_000))
            .unwrap_or(u64::MAX)
            .saturating_add(1_000)
            .min(MAX_TOKEN_TTL_MS);
        Leases {
            map: HashIndex::with_hasher(KeyHasher::default()),
            keys: AtomicUsize::new(0),
            max,
            hold,
            ttl_ms,
            serial: AtomicU64::new(0),
            resets: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            sweeper: Mutex::new(None),
            returner: Arc::new(returner),
            leased: AtomicU64::new(0),
            returned: AtomicU64::new(0),
            local: AtomicU64::new(0),
        }
    }

    /// The sweep period: a quarter of the hold time, between 1 ms and 1 s.
    pub(super) fn sweep_period(&self) -> Duration {
        Duration::from_nanos(self.hold / 4).clamp(Duration::from_millis(1), Duration::from_secs(1))
    }

    pub(super) fn set_sweeper(&self, handle: tokio::task::AbortHandle) {
        *self.sweeper.lock().unwrap_or_else(PoisonError::into_inner) = Some(handle);
    }

    fn stop_sweeper(&self) {
        if let Some(handle) = self
            .sweeper
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            handle.abort();
        }
    }

    pub(super) fn is_full(&self) -> bool {
        // Relaxed: see `insert`.
        self.keys.load(Ordering::Relaxed) >= MAX_KEYS
    }

    pub(super) fn is_closed(&self) -> bool {
        // SeqCst, as every access to `closed` and `resets`: they order a request's lease
        // against `close` and `reset` (cold paths, read once per refill).
        self.closed.load(Ordering::SeqCst)
    }

    /// Takes no lease any more (see [`RedisLimiter::close`](super::RedisLimiter::close)): the
    /// sweeper sees the flag and ends, and a lease taken from now on is not installed.
    pub(super) fn close(&self) {
        // SeqCst: see `is_closed`.
        self.closed.store(true, Ordering::SeqCst);
    }

    /// The count of resets before a lease is asked for, for [`install`](Leases::install).
    pub(super) fn ticket(&self) -> u64 {
        // SeqCst: see `is_closed`.
        self.resets.load(Ordering::SeqCst)
    }

    /// Installs `next` in place of `old`, `key`'s lease, which this task claimed, with
    /// `ticket` read before `next` was asked for: `false` (and `old` leaves the map) when
    /// the limiter is closed, a reset came since the ticket (the lease may predate it, its
    /// permits gone with the state), or `old` is no longer `key`'s lease. A lease not
    /// installed is left claimed by this task, to be given back.
    pub(super) fn install(
        &self,
        key: &str,
        old: &Arc<Lease>,
        next: &Arc<Lease>,
        ticket: u64,
    ) -> bool {
        // A reset between the ticket and here changes it (see `forget`).
        let installed = !self.is_closed()
            && self.resets.load(Ordering::SeqCst) == ticket
            && self.replace(key, old, Arc::clone(next));
        if !installed {
            self.remove(key, old);
            // Relaxed: `next` is in no map, so no other task reads its flag.
            next.busy.store(true, Ordering::Relaxed);
        }
        installed
    }

    /// Reads `key`'s lease at `now`, taking `n` permits if it is live and holds them.
    pub(super) fn find(&self, key: &str, n: u64, now: u64) -> Found {
        self.map
            .peek_with(key, |_, lease| {
                if now < lease.expires {
                    if let Some(left) = lease.take(n) {
                        return Found::Admitted(lease.admitted(left, now));
                    }
                }
                Found::Stale(Arc::clone(lease))
            })
            .unwrap_or(Found::Absent)
    }

    /// What a request of cost 1 for `key` would get from its lease at `now`, taking nothing;
    /// `None` when the lease is not live or is spent.
    pub(super) fn peek(&self, key: &str, now: u64) -> Option<Decision> {
        self.map
            .peek_with(key, |_, lease| {
                // Relaxed: see `Lease::take`.
                let left = lease.left.load(Ordering::Relaxed);
                (now < lease.expires && left > 0).then(|| lease.admitted(left - 1, now))
            })
            .flatten()
    }

    /// Redis decided a request of `key` that did not use its lease, reporting `remaining`
    /// (the lease's permits counted spent): the lease reports no more than that from now on.
    pub(super) fn lower(&self, key: &str, remaining: u64) {
        self.map.peek_with(key, |_, lease| {
            // Relaxed: the minimum only ever goes down; a report that misses it is one Redis
            // would have made a moment earlier.
            lease.remaining.fetch_min(remaining, Ordering::Relaxed);
        });
    }

    /// `true` while `lease` is `key`'s lease.
    fn is_current(&self, key: &str, lease: &Arc<Lease>) -> bool {
        self.map
            .peek_with(key, |_, current| Arc::ptr_eq(current, lease))
            .unwrap_or(false)
    }

    /// Replaces `old`, `key`'s lease, by `new`: `false` (and nothing changes) when `old` is
    /// no longer `key`'s lease.
    pub(super) fn replace(&self, key: &str, old: &Arc<Lease>, new: Arc<Lease>) -> bool {
        match self.map.entry_sync(key.to_owned()) {
            Entry::Occupied(mut entry) if Arc::ptr_eq(entry.get(), old) => {
                entry.update(new);
                true
            }
            _ => false,
        }
    }

    /// Removes `lease` if it is still `key`'s lease.
    pub(super) fn remove(&self, key: &str, lease: &Arc<Lease>) {
        if self
            .map
            .remove_if_sync(key, |current| Arc::ptr_eq(current, lease))
        {
            self.keys.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Inserts a first lease for `key`, which has none: a placeholder of one permit claimed
    /// by this task, which replaces it by the lease it takes. `None` when another task
    /// inserted one first, or when the map is full.
    pub(super) fn insert_first(&self, key: &str, now: u64) -> Option<Arc<Lease>> {
        let first = Arc::new(Lease::placeholder(FIRST_SIZE, now, true));
        self.insert(key, Arc::clone(&first)).then_some(first)
    }

    /// Inserts `lease` for `key`, which has none: `false` when another task inserted one
    /// first, or when the map is full.
    fn insert(&self, key: &str, lease: Arc<Lease>) -> bool {
        if self.is_full() {
            return false;
        }
        let inserted = self.map.insert_sync(key.to_owned(), lease).is_ok();
        if inserted {
            // Relaxed: a count that steers; a few entries over the bound at a race are
            // harmless.
            self.keys.fetch_add(1, Ordering::Relaxed);
        }
        inserted
    }

    /// The size of the lease to follow `old` at `now` (see the module's docs).
    pub(super) fn next_size(&self, old: &Lease, now: u64) -> u64 {
        let size = if old.granted == 0 {
            old.asked
        } else if now < old.expires {
            // Spent before it expired.
            if now.saturating_sub(old.start) < self.hold / 2 {
                old.asked.saturating_mul(2)
            } else {
                old.asked
            }
        } else {
            // Relaxed: see `Lease::take`.
            let unused = old.left.load(Ordering::Relaxed);
            if unused.saturating_mul(2) > old.granted {
                old.asked / 2
            } else {
                old.asked
            }
        };
        size.clamp(1, self.max)
    }

    /// The serial number of the next lease.
    pub(super) fn next_serial(&self) -> u64 {
        // Relaxed: only uniqueness matters, and a read-modify-write gives every call its own.
        self.serial.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// How long a lease token is kept, in ms.
    pub(super) fn ttl_ms(&self) -> u64 {
        self.ttl_ms
    }

    /// A lease Redis granted for `size` asked at `now`: `granted` permits (at least 1, the
    /// first of which admits the request that took it), reporting `decision`'s remaining and
    /// limit and Redis's reset at `reset_at`, given back with `held` when it holds more than
    /// one permit. Counted as leased.
    pub(super) fn grant(
        &self,
        size: u64,
        now: u64,
        granted: u64,
        decision: &Decision,
        reset_at: u64,
        held: Held,
    ) -> Arc<Lease> {
        self.leased.fetch_add(granted, Ordering::Relaxed);
        Arc::new(Lease {
            left: AtomicU64::new(granted - 1),
            granted,
            asked: size,
            start: now,
            expires: now.saturating_add(self.hold),
            remaining: AtomicU64::new(decision.remaining()),
            limit: decision.limit(),
            reset_at,
            busy: AtomicBool::new(false),
            seen: AtomicU64::new(u64::MAX),
            held: Mutex::new((granted > 1).then_some(held)),
            done: Notify::new(),
            refused: OnceLock::new(),
        })
    }

    /// Waits for `lease`, `key`'s lease claimed by another task, to be replaced or given
    /// back, at most `until`.
    pub(super) async fn wait(&self, key: &str, lease: &Arc<Lease>, until: Until) -> Waited {
        // Registered before the lease is read as current: a `finish` after the read wakes
        // this wait, and one before it made the lease no longer current.
        let mut done = pin!(lease.done.notified());
        done.as_mut().enable();
        if !self.is_current(key, lease) {
            return Waited::Gone;
        }
        let waited = match until {
            Until::Deadline(deadline) => tokio::time::timeout_at(deadline, done).await,
            Until::Timeout(timeout) => tokio::time::timeout(timeout, done).await,
        };
        match waited {
            Ok(()) => Waited::Done(lease.refused.get().copied()),
            Err(_) => Waited::TimedOut,
        }
    }

    /// Ends `lease`, claimed by this task: what it holds to give back (taken once) and the
    /// permits it had not admitted; what it admitted locally is counted.
    pub(super) fn retire(&self, lease: &Lease) -> (Option<Held>, u64) {
        let (held, unused) = lease.end();
        // A claimed lease is counted by the task that claimed it (see `counts`).
        self.local.fetch_add(lease.local(unused), Ordering::Relaxed);
        (held, unused)
    }

    /// Counts `permits` given back to Redis.
    pub(super) fn count_returned(&self, permits: u64) {
        self.returned.fetch_add(permits, Ordering::Relaxed);
    }

    /// The leases for the sweeper to give back at `now`, with whether their key went quiet:
    /// those whose time is up, and those untouched since the last sweep.
    pub(super) fn due(&self, now: u64) -> Vec<(String, Arc<Lease>, bool)> {
        let mut due = Vec::new();
        self.map.iter_sync(|key, lease| {
            // Relaxed: see `Lease::take`; a stale reading delays a lease by one sweep.
            let left = lease.left.load(Ordering::Relaxed);
            let quiet = lease.seen.swap(left, Ordering::Relaxed) == left;
            if quiet || now >= lease.expires {
                due.push((key.clone(), Arc::clone(lease), quiet));
            }
            true
        });
        due
    }

    /// Drops `key`'s lease without giving it back (its state in Redis is being deleted): it
    /// admits nothing more, even to a request that read it just before.
    pub(super) fn forget(&self, key: &str) {
        self.resets.fetch_add(1, Ordering::SeqCst);
        let removed = self.map.remove_if_sync(key, |lease| {
            // Relaxed: see `Lease::take`.
            let unused = lease.left.swap(0, Ordering::Relaxed);
            // A claimed lease is counted by the task that claimed it (see `counts`).
            if !lease.busy.load(Ordering::Relaxed) {
                self.local.fetch_add(lease.local(unused), Ordering::Relaxed);
            }
            true
        });
        if removed {
            self.keys.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The counters, the leases in use included.
    pub(super) fn counts(&self) -> LeaseCounts {
        // Relaxed: tallies (see `failure::bump`).
        let mut local = self.local.load(Ordering::Relaxed);
        self.map.iter_sync(|_, lease| {
            // A claimed lease is being given back or replaced: counted in `local` by then.
            if !lease.busy.load(Ordering::Relaxed) {
                local += lease.local(lease.left.load(Ordering::Relaxed));
            }
            true
        });
        LeaseCounts {
            leased: self.leased.load(Ordering::Relaxed),
            returned: self.returned.load(Ordering::Relaxed),
            local,
        }
    }

    /// Every lease's key and lease.
    pub(super) fn all(&self) -> Vec<(String, Arc<Lease>)> {
        let mut all = Vec::with_capacity(self.map.len());
        self.map.iter_sync(|key, lease| {
            all.push((key.clone(), Arc::clone(lease)));
            true
        });
        all
    }

    /// Stops the sweeper and empties the map, taking what each lease holds: what a dropped
    /// limiter hands to a task to give back.
    pub(super) fn drain(&self) -> Vec<(String, Held, u64)> {
        self.stop_sweeper();
        let mut out = Vec::new();
        for (key, lease) in self.all() {
            let (held, unused) = lease.end();
            if let (Some(held), true) = (held, unused > 0) {
                out.push((key, held, unused));
            }
        }
        self.map.clear_sync();
        self.keys.store(0, Ordering::Relaxed);
        out
    }
}
