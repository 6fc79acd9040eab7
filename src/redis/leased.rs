//! Requests decided from leases, and the calls to Redis that take, replace and give back
//! leases: a key's refill, the sweeper, and closing. The lease map and its rules are in
//! `lease`.

use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::decision::Decision;

use super::error::BackendError;
use super::give_back::Held;
use super::lease::{Claim, Found, Lease, Leases, Until, Waited};
use super::script::Ask;
use super::shared::{Shared, NOT_IN_REDIS};

impl Shared {
    /// Decides a request of cost `n` for `key` from its lease, taking or replacing the lease
    /// as needed; a cost above 1 that the lease does not hold goes to Redis.
    pub(super) async fn acquire_leased(
        &self,
        leases: &Leases,
        key: &str,
        n: u64,
    ) -> Result<Decision, BackendError> {
        // Set when the lease is first found spent: waiting for other tasks' refills ends
        // there, and Redis decides the request itself.
        let mut deadline = None;
        loop {
            let now = self.clock.now();
            let lease = match leases.find(key, n, now) {
                Found::Admitted(decision) => return Ok(decision),
                Found::Stale(lease) => lease,
                Found::Absent => {
                    if leases.is_closed() || n > 1 || leases.is_full() {
                        break;
                    }
                    if let Some(first) = leases.insert_first(key, now) {
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
                now.checked_add(self.timeout).unwrap_or(now)
            });
            match leases.wait(key, &lease, Until::Deadline(deadline)).await {
                Waited::TimedOut => break,
                // Refused as this request would have been, at the same time.
                Waited::Done(Some(refusal)) => return Ok(refusal),
                Waited::Done(None) => {}
                Waited::Gone if tokio::time::Instant::now() >= deadline => break,
                Waited::Gone => tokio::task::yield_now().await,
            }
        }
        let (decision, marks, _, _) = self.decide(key, Ask::Acquire(n)).await?;
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
        let ticket = leases.ticket();
        let serial = leases.next_serial();
        let ask = Ask::Lease {
            max: size,
            serial,
            ttl_ms: leases.ttl_ms(),
        };
        let outcome = self.decide(key, ask).await;
        let next = match &outcome {
            Ok((decision, marks, granted, _)) if *granted > 0 => {
                // From a reading after the reply: Redis measured its reset_after then, and a
                // reading from before the round trip would report it shorter than Redis.
                let reset_at = self.clock.now().saturating_add(
                    u64::try_from(decision.reset_after().as_nanos()).unwrap_or(u64::MAX),
                );
                let held = Held {
                    marks: *marks,
                    serial,
                };
                leases.grant(size, now, *granted, decision, reset_at, held)
            }
            // Refused, decided by the failure policy, or failed: no lease; the next request
            // asks again, for the same size.
            _ => Arc::new(Lease::placeholder(size, now, false)),
        };
        let installed = leases.install(key, &old, &next, ticket);
        if let Ok((decision, _, _, _)) = &outcome {
            if !decision.is_allowed() {
                claim.refuse(*decision);
            }
        }
        claim.finish();
        if !installed {
            // The lease may predate a reset (its permits are gone with the state) or the
            // limiter is closing: give it back now (a lease the token no longer names is
            // left as it is).
            let _ = self.retire(leases, key, &next).await;
        }
        match outcome {
            Ok((_, _, granted, _)) if granted > 0 => Ok(next.admitted(granted - 1, now)),
            Ok((decision, _, _, _)) => Ok(decision),
            Err(err) => Err(err),
        }
    }

    /// Gives back what `lease` (claimed by this task) did not use, and counts what it
    /// admitted locally.
    async fn retire(&self, leases: &Leases, key: &str, lease: &Lease) -> Result<(), BackendError> {
        match leases.retire(lease) {
            (Some(held), unused) if unused > 0 => self.give_back(leases, key, held, unused).await,
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
        let now_micros = self.test_micros()?;
        if !self.breaker.should_try() {
            return Err(BackendError::Unavailable);
        }
        let reply = leases
            .returner
            .send(
                key,
                held,
                permits,
                now_micros,
                &self.counters.script_reloads,
            )
            .await;
        if let Some(cache) = &self.cache {
            // As for a settle's refund (see `Shared::settle`).
            cache.forget(key);
        }
        match reply {
            Ok(applied) => {
                self.recovered();
                if applied {
                    leases.count_returned(permits);
                }
                Ok(())
            }
            Err(err) => Err(self.settle_failed(err)),
        }
    }

    /// Gives back every lease whose time is up or whose key went quiet (untouched since the
    /// last sweep). Run by the sweeper.
    async fn sweep(&self, leases: &Leases) {
        let now = self.clock.now();
        for (key, lease, quiet) in leases.due(now) {
            // A placeholder holds nothing: it goes once its key is quiet.
            if (lease.is_placeholder() && !quiet) || !lease.claim() {
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

    /// Gives back every lease, and takes no more: the first error met giving one back.
    pub(super) async fn close(&self) -> Result<(), BackendError> {
        let Some(leases) = &self.leases else {
            return Ok(());
        };
        // The sweeper sees the flag and ends; a sweep under way finishes what it claimed.
        leases.close();
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
                    let _ = leases
                        .wait(&key, &lease, Until::Timeout(self.timeout))
                        .await;
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Runs the sweep of the limiter behind `shared` every `period` until it is dropped.
pub(super) async fn sweeper(shared: Weak<Shared>, period: Duration) {
    let mut interval = tokio::time::interval(period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval.tick().await;
    loop {
        interval.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let Some(leases) = &shared.leases else {
            return;
        };
        if leases.is_closed() {
            return;
        }
        shared.sweep(leases).await;
    }
}
