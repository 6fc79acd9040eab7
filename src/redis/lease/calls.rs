//! The calls that use leases: admitting from a key's lease and replacing it, giving leases
//! back (to Redis, once), the sweeper, and [`RedisLimiter::close`]. The lease map and its
//! rules are in the parent module.

use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use tokio::sync::Notify;

use crate::decision::Decision;

use super::{Claim, Found, Held, Lease, Leases, Returner, FIRST_SIZE};
use crate::redis::script::{self, Ask, Bands};
use crate::redis::{BackendError, Inner, RedisLimiter, NOT_IN_REDIS};

impl Returner {
    /// The keys of a lease call for `key`: the bands', then the lease token's.
    pub(crate) fn keys(&self, key: &str) -> Vec<String> {
        let mut keys = self.bands.keys(&self.prefix, key);
        keys.push(Bands::lease_key(&self.prefix, key));
        keys
    }

    /// The keys of a lease call (`lease` or `return`) for `key`, with this limiter's field in
    /// the key's hash of lease tokens appended to the call's `args`.
    pub(crate) fn token_call(&self, key: &str, args: &mut Vec<String>) -> Vec<String> {
        args.push(self.instance.clone());
        self.keys(key)
    }

    /// Gives `permits` of the lease `held` back, once, never resent: `true` when applied,
    /// `false` when the token no longer named the lease.
    async fn send(
        &self,
        key: &str,
        held: Held,
        permits: u64,
        now_micros: Option<u64>,
        reloads: &AtomicU64,
    ) -> Result<bool, BackendError> {
        let ask = Ask::Return {
            permits,
            marks: held.marks,
            serial: held.serial,
        };
        let mut args = self.bands.args(now_micros, ask);
        let keys = self.token_call(key, &mut args);
        let call = self.script.call(&keys, &args, reloads, false, self.timeout);
        match call.await {
            Ok(Ok(reply)) => script::returned(&reply),
            Ok(Err(err)) => Err(BackendError::Redis(err)),
            Err(_) => Err(BackendError::Timeout(self.timeout)),
        }
    }

    /// Gives back each of `leases` in turn (a dropped limiter's, from a task of its own).
    pub(crate) async fn give_back_all(
        self: Arc<Self>,
        leases: Vec<(String, Held, u64)>,
        clock: Option<Arc<dyn crate::clock::Clock>>,
    ) {
        let reloads = AtomicU64::new(0);
        for (key, held, unused) in leases {
            let now_micros = match &clock {
                Some(clock) => match script::micros(clock.now()) {
                    Ok(micros) => Some(micros),
                    Err(_) => return,
                },
                None => None,
            };
            if let Err(err) = self.send(&key, held, unused, now_micros, &reloads).await {
                log::warn!(
                    "tollgate: a dropped limiter could not give back {unused} leased permits of a key: {err}"
                );
            }
        }
    }
}

impl RedisLimiter {
    /// Decides a request of cost `n` for `key` from its lease, taking or replacing the lease
    /// as needed; a cost above 1 that the lease does not hold goes to Redis.
    pub(crate) async fn acquire_leased(
        &self,
        leases: &Leases,
        key: &str,
        n: u64,
    ) -> Result<Decision, BackendError> {
        let inner = &*self.inner;
        // Set when the lease is first found spent: waiting for other tasks' refills ends
        // there, and Redis decides the request itself.
        let mut deadline = None;
        loop {
            let now = inner.clock.now();
            let lease = match leases.find(key, n, now) {
                Found::Admitted(decision) => return Ok(decision),
                Found::Stale(lease) => lease,
                Found::Absent => {
                    if leases.is_closed() || n > 1 || leases.is_full() {
                        break;
                    }
                    let first = Arc::new(Lease::placeholder(FIRST_SIZE, now, true));
                    if leases.insert(key, Arc::clone(&first)) {
                        return self.refill(leases, key, first, now).await;
                    }
                    continue;
                }
            };
            if leases.is_closed() || n > 1 {
                break;
            }
            if lease.claim() {
                return self.refill(leases, key, lease, now).await;
            }
            // Another task is replacing the lease: wait for it, then read again. The builder
            // keeps the timeout within an hour; should the sum still overflow, the request
            // does not wait and asks Redis itself.
            let deadline = *deadline.get_or_insert_with(|| {
                let now = tokio::time::Instant::now();
                now.checked_add(inner.timeout).unwrap_or(now)
            });
            let mut done = pin!(lease.done.notified());
            done.as_mut().enable();
            if leases.is_current(key, &lease) {
                if tokio::time::timeout_at(deadline, done).await.is_err() {
                    break;
                }
                if let Some(refusal) = lease.refused.get() {
                    // Refused as this request would have been, at the same time.
                    return Ok(*refusal);
                }
            } else if tokio::time::Instant::now() >= deadline {
                break;
            } else {
                tokio::task::yield_now().await;
            }
        }
        let (decision, marks, _) = self.decide(key, Ask::Acquire(n)).await?;
        if marks != NOT_IN_REDIS {
            leases.lower(key, decision.remaining());
        }
        Ok(decision)
    }

    /// Replaces `old`, `key`'s lease, which this task claimed: gives back what it did not
    /// use, takes the next lease (whose first permit admits this request) and installs it.
    async fn refill(
        &self,
        leases: &Leases,
        key: &str,
        old: Arc<Lease>,
        now: u64,
    ) -> Result<Decision, BackendError> {
        let claim = Claim::new(leases, key, &old);
        let size = leases.next_size(&old, now);
        let _ = self.retire(leases, key, &old).await;
        let ticket = leases.resets.load(Ordering::SeqCst);
        let serial = leases.serial.fetch_add(1, Ordering::Relaxed) + 1;
        let ask = Ask::Lease {
            max: size,
            serial,
            ttl_ms: leases.ttl_ms,
        };
        let outcome = self.decide(key, ask).await;
        let next = match &outcome {
            Ok((decision, marks, granted)) if *granted > 0 => {
                leases.leased.fetch_add(*granted, Ordering::Relaxed);
                Arc::new(Lease {
                    left: AtomicU64::new(granted - 1),
                    granted: *granted,
                    asked: size,
                    start: now,
                    expires: now.saturating_add(leases.hold),
                    remaining: AtomicU64::new(decision.remaining()),
                    limit: decision.limit(),
                    // From a reading after the reply: Redis measured its reset_after then, and a
                    // reading from before the round trip would report it shorter than Redis.
                    reset_at: self.inner.clock.now().saturating_add(
                        u64::try_from(decision.reset_after().as_nanos()).unwrap_or(u64::MAX),
                    ),
                    busy: AtomicBool::new(false),
                    seen: AtomicU64::new(u64::MAX),
                    held: Mutex::new((*granted > 1).then_some(Held {
                        marks: *marks,
                        serial,
                    })),
                    done: Notify::new(),
                    refused: OnceLock::new(),
                })
            }
            // Refused, decided by the failure policy, or failed: no lease; the next request
            // asks again, for the same size.
            _ => Arc::new(Lease::placeholder(size, now, false)),
        };
        // A reset between the ticket and here changes it (see `RedisLimiter::reset`).
        let installed = !leases.is_closed()
            && leases.resets.load(Ordering::SeqCst) == ticket
            && leases.replace(key, &old, Arc::clone(&next));
        if !installed {
            leases.remove(key, &old);
        }
        if let Ok((decision, _, _)) = &outcome {
            if !decision.is_allowed() {
                let _ = old.refused.set(*decision);
            }
        }
        claim.finish();
        if !installed {
            // The lease may predate a reset (its permits are gone with the state) or the
            // limiter is closing: give it back now (a lease the token no longer names is
            // left as it is).
            next.busy.store(true, Ordering::Relaxed);
            let _ = self.retire(leases, key, &next).await;
        }
        match outcome {
            Ok((_, _, granted)) if granted > 0 => Ok(next.admitted(granted - 1, now)),
            Ok((decision, _, _)) => Ok(decision),
            Err(err) => Err(err),
        }
    }

    /// Gives back what `lease` (claimed by this task) did not use, and counts what it
    /// admitted locally.
    async fn retire(&self, leases: &Leases, key: &str, lease: &Lease) -> Result<(), BackendError> {
        let (held, unused) = lease.end();
        leases
            .local
            .fetch_add(lease.local(unused), Ordering::Relaxed);
        match held {
            Some(held) if unused > 0 => self.give_back(leases, key, held, unused).await,
            _ => Ok(()),
        }
    }

    /// Gives `permits` of the lease `held` back to Redis, once.
    async fn give_back(
        &self,
        leases: &Leases,
        key: &str,
        held: Held,
        permits: u64,
    ) -> Result<(), BackendError> {
        let inner = &*self.inner;
        let now_micros = self.test_micros()?;
        if !inner.breaker.should_try() {
            return Err(BackendError::Unavailable);
        }
        let reply = leases
            .returner
            .send(
                key,
                held,
                permits,
                now_micros,
                &inner.counters.script_reloads,
            )
            .await;
        if let Some(cache) = &inner.cache {
            // As for a settle's refund (see `RedisLimiter::settle`).
            cache.forget(key);
        }
        match reply {
            Ok(applied) => {
                self.recovered();
                if applied {
                    leases.returned.fetch_add(permits, Ordering::Relaxed);
                }
                Ok(())
            }
            Err(err) => Err(self.settle_failed(err)),
        }
    }

    /// Gives back every lease whose time is up or whose key went quiet (untouched since the
    /// last sweep). Run by the sweeper.
    async fn sweep(&self, leases: &Leases) {
        let now = self.inner.clock.now();
        let mut due = Vec::new();
        leases.map.iter_sync(|key, lease| {
            // Relaxed: see `Lease::take`; a stale reading delays a lease by one sweep.
            let left = lease.left.load(Ordering::Relaxed);
            let quiet = lease.seen.swap(left, Ordering::Relaxed) == left;
            if quiet || now >= lease.expires {
                due.push((key.clone(), Arc::clone(lease), quiet));
            }
            true
        });
        for (key, lease, quiet) in due {
            // A placeholder holds nothing: it goes once its key is quiet.
            if (lease.granted == 0 && !quiet) || !lease.claim() {
                continue;
            }
            let claim = Claim::new(leases, &key, &lease);
            let size = leases.next_size(&lease, now);
            let _ = self.retire(leases, &key, &lease).await;
            if quiet {
                leases.remove(&key, &lease);
            } else {
                // Expired while in use: the next request takes a lease of the size this one
                // calls for.
                leases.replace(&key, &lease, Arc::new(Lease::placeholder(size, now, false)));
            }
            claim.finish();
        }
    }

    /// Gives back every lease this limiter holds, and takes no more: from now on every
    /// request is decided by Redis. For a graceful shutdown: a limiter dropped with leases
    /// gives them back from a task of its own when a tokio runtime is running, and otherwise
    /// not at all.
    ///
    /// Does nothing for a limiter without leases, or when called again.
    ///
    /// # Errors
    ///
    /// The first error met giving a lease back ([`BackendError::Timeout`],
    /// [`BackendError::Redis`] or [`BackendError::Unavailable`]); every other lease is still
    /// given back. The permits of a lease that could not be given back stay spent in Redis,
    /// as if admitted.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tollgate::redis::BackendError> {
    /// let limiter = tollgate::redis::RedisLimiter::builder("10000/min".parse().unwrap())
    ///     .lease(100)
    ///     .connect("redis://127.0.0.1:6379")
    ///     .await?;
    /// limiter.try_acquire("tenant-7").await?;
    /// limiter.close().await?; // before the process exits
    /// # Ok(())
    /// # }
    /// ```
    pub async fn close(&self) -> Result<(), BackendError> {
        let Some(leases) = &self.inner.leases else {
            return Ok(());
        };
        // The sweeper sees the flag and ends; a sweep under way finishes what it claimed.
        leases.closed.store(true, Ordering::SeqCst);
        let mut first_error = None;
        // A lease being replaced is waited for (its refill gives the new one back, seeing the
        // limiter closed); a few rounds cover any request already past the closed flag.
        for _ in 0..4 {
            let all = leases.all();
            if all.is_empty() {
                break;
            }
            for (key, lease) in all {
                if lease.claim() {
                    let claim = Claim::new(leases, &key, &lease);
                    if let Err(err) = self.retire(leases, &key, &lease).await {
                        first_error.get_or_insert(err);
                    }
                    leases.remove(&key, &lease);
                    claim.finish();
                } else {
                    let mut done = pin!(lease.done.notified());
                    done.as_mut().enable();
                    if leases.is_current(&key, &lease) {
                        let _ = tokio::time::timeout(self.inner.timeout, done).await;
                    }
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Runs the sweep of the limiter behind `inner` every `period` until it is dropped.
pub(crate) async fn sweeper(inner: Weak<Inner>, period: Duration) {
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval.tick().await;
    loop {
        interval.tick().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let limiter = RedisLimiter { inner };
        let Some(leases) = &limiter.inner.leases else {
            return;
        };
        if leases.is_closed() {
            return;
        }
        limiter.sweep(leases).await;
    }
}
