//! Reserving now and settling later on Redis, each one script call: a reservation's serial
//! number and token, and a settle as a refund or a charge.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::reservation::Reservation;

use super::error::BackendError;
use super::script::{self, Ask};
use super::shared::{Shared, NOT_IN_REDIS};
use super::tiers::{Choice, Chosen, Tier};

impl Shared {
    /// Reserves `n` permits for `key`, decided as a request of cost `n`; an admission
    /// writes the reservation's token next to the key's state.
    pub(super) async fn reserve(&self, key: &str, n: u64) -> Result<Reservation, BackendError> {
        self.check_cost(key, n).await?;
        // The origin first: its count of resets must not be newer than the state the
        // reservation is decided on.
        let origin = self.origin(key);
        // Relaxed: only uniqueness matters, and a read-modify-write gives every call its own.
        let serial = self.reservations.fetch_add(1, Ordering::Relaxed) + 1;
        let ask = Ask::Reserve { cost: n, serial };
        let (decision, marks, _, policy) = self.decide(key, ask).await?;
        // A refusal shadow mode lets through holds nothing (see `Reservation::new`).
        let decision = self.finish(decision);
        let reservation = Reservation::new(decision, n, marks, origin).with_token(serial);
        // With records (per-key or live policies), the settle takes this policy's bands,
        // whatever policy this server has by then, and applies only while the key's record
        // names it.
        Ok(if self.recorded() {
            reservation.decided_under(Some(Box::new(policy)))
        } else {
            reservation
        })
    }

    /// Settles `r`, a reservation of this limiter for `key`, at `actual` permits: a refund
    /// (never resent) or a charge; nothing is sent for a reservation the failure policy
    /// made or one settled at what it holds.
    pub(super) async fn settle(
        &self,
        key: &str,
        r: Reservation,
        actual: u64,
    ) -> Result<(), BackendError> {
        let decided = r.decided_policy();
        let taken = r.take(self.origin(key))?;
        let (held, marks, serial) = (taken.held, taken.marks, taken.token);
        if marks == NOT_IN_REDIS || !taken.changes(actual) {
            return Ok(());
        }
        let ask = if actual < held {
            Ask::Refund {
                permits: held - actual,
                marks,
                serial,
            }
        } else {
            Ask::Charge {
                permits: (actual - held).min(script::MAX_CHARGE),
                marks,
                serial,
            }
        };
        let now_micros = self.test_micros()?;
        if !self.breaker.should_try() {
            return Err(BackendError::Unavailable);
        }
        let refund = matches!(ask, Ask::Refund { .. });
        // Under the policy the reservation was decided under: its marks are that state's.
        let choice = match decided {
            Some(policy) => Choice {
                tier: Arc::new(Tier::new(*policy)?),
                // A settle is never checked against when its policy was chosen.
                chosen: Chosen::At(0),
            },
            None => self.tier_of(key)?,
        };
        let (keys, args) = self.call_for(&choice, key, ask, (now_micros, self.clock.now()));
        // A refund is never sent twice: applied twice, it would give back more than was
        // held. A charge is resent once on a fresh connection, as a decision is: applied
        // twice it only refuses sooner, and dropped it would forgive a debt.
        let reply = self
            .script
            .call(
                &keys,
                &args,
                &self.counters.script_reloads,
                !refund,
                self.timeout,
            )
            .await;
        if let Some(cache) = &self.cache {
            if refund {
                // As for a reset: a refusal Redis made before the refund, still on its way,
                // must not be cached after it (see `DenyCache::forget`).
                cache.forget(key);
            } else {
                // A charge may lengthen a cached refusal, as an admission may.
                cache.remove(key);
            }
        }
        match reply {
            Ok(Ok(reply)) => {
                // `false`: a refund Redis did not apply, the reservation's token being gone
                // (settled already, or lost with the state: nothing of it to give back).
                let _applied = script::settled(&reply)?;
                self.recovered();
                Ok(())
            }
            Ok(Err(err)) => Err(self.settle_failed(BackendError::Redis(err))),
            Err(_) => Err(self.settle_failed(BackendError::Timeout(self.timeout))),
        }
    }
}
