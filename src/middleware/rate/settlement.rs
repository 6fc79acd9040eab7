//! [`Settlement`]: a route's reservations on their way through the inner service, settled at
//! what the response says each cost, or given back when no response comes.

use std::fmt;
use std::sync::Arc;

use http::response;

use super::rule::{joined_fields, Rule};
use crate::decision::Decision;
use crate::middleware::backend::Local;
use crate::middleware::headers::Fields;
use crate::middleware::key::LimitKey;
use crate::reservation::Reservation;

/// One rule of the request's route: the key it decided and what it decided (for the fields
/// after a settle), and the cost it reserved.
pub(super) struct Ruled {
    pub(super) rule: Arc<Rule>,
    pub(super) key: LimitKey,
    pub(super) decision: Decision,
    #[cfg_attr(
        not(feature = "redis"),
        allow(dead_code, reason = "read by the settles on Redis")
    )]
    pub(super) cost: u64,
}

/// The reservations a request holds, and the limiters they were made on.
pub(super) enum Held {
    /// In-process reservations, each with the position of its rule: settled at once, and the
    /// response's fields say the budget left.
    Local(Vec<(usize, Arc<dyn Local>, Reservation)>),
    /// One Redis reservation, of the route's one rule: settled by a task of its own (a
    /// response is never held back for a round trip); the response's fields stay those
    /// decided at the request.
    #[cfg(feature = "redis")]
    Redis(crate::redis::RedisLimiter, Reservation),
    /// The reservation of every rule of the route on Redis, made in one call: settled as
    /// `Redis` is, one call per rule whose cost changed.
    #[cfg(feature = "redis")]
    RedisAll(
        Vec<crate::redis::RedisLimiter>,
        crate::redis::RedisAllOfReservation,
    ),
}

/// An allowed request's reservations on their way through the inner service: settled at
/// what the response says ([`Settlement::settle`]), or cancelled when dropped unsettled (the
/// inner service failed, or the response future was dropped before the response).
pub(crate) struct Settlement {
    /// The layer is in shadow mode: settle, but add no fields.
    shadow: bool,
    /// Every rule of the route, in order.
    rules: Vec<Ruled>,
    /// `None` once settled (or kept spent).
    held: Option<Held>,
}

impl Settlement {
    pub(super) fn new(shadow: bool, rules: Vec<Ruled>, held: Held) -> Self {
        Settlement {
            shadow,
            rules,
            held: Some(held),
        }
    }

    /// Settles each reservation at what `response` says its rule cost; the fields the
    /// response should carry instead of those decided at the request, when a settle changed
    /// them. A rule whose response says nothing (or without `settle_with`) keeps its
    /// estimate spent.
    #[cfg_attr(
        not(feature = "redis"),
        allow(
            clippy::infallible_destructuring_match,
            reason = "with feature redis the reservations have more kinds"
        )
    )]
    pub(crate) fn settle(mut self, response: &response::Parts) -> Option<Fields> {
        self.held.as_ref()?;
        // Every rule's cost read from the response before the reservations are taken out: a
        // `settle_with` that panics leaves them held, and `Drop` gives them back, as for a
        // request that got no response.
        let actuals: Vec<Option<u64>> = self
            .rules
            .iter()
            .map(|ruled| {
                ruled
                    .rule
                    .settle
                    .as_ref()
                    .and_then(|actual| actual(response))
            })
            .collect();
        let held = self.held.take()?;
        let reservations = match held {
            Held::Local(reservations) => reservations,
            #[cfg(feature = "redis")]
            Held::Redis(limiter, reservation) => {
                // `None`: dropping the reservation keeps its permits spent.
                let actual = actuals[0]?;
                let key = self.rules[0].key.to_string();
                settle_in_background(
                    async move { limiter.settle(&key, reservation, actual).await },
                );
                return None;
            }
            #[cfg(feature = "redis")]
            Held::RedisAll(limiters, reservation) => {
                let costs: Vec<u64> = self
                    .rules
                    .iter()
                    .zip(&actuals)
                    .map(|(ruled, actual)| actual.unwrap_or(ruled.cost))
                    .collect();
                let keys: Vec<String> = self.rules.iter().map(|r| r.key.to_string()).collect();
                settle_all_in_background(limiters, keys, reservation, costs);
                return None;
            }
        };
        let mut changed = false;
        for (index, limiter, reservation) in reservations {
            let ruled = &mut self.rules[index];
            let Some(actual) = actuals[index] else {
                continue;
            };
            // A settle fails only for a reservation made elsewhere, which this one is not.
            if limiter.settle(&ruled.key, reservation, actual).is_ok() {
                ruled.decision = budget(limiter.peek(&ruled.key));
                changed = true;
            }
        }
        if self.shadow || !changed {
            return None;
        }
        // The tightest rule now: the least left, the first of equals.
        let tightest = (0..self.rules.len())
            .min_by_key(|&i| self.rules[i].decision.remaining())
            .unwrap_or(0);
        let rules = self.rules.iter().map(|r| (&*r.rule, &r.decision));
        Some(joined_fields(rules, tightest))
    }
}

/// Settles a Redis reservation by `settle` on a task of its own, on the runtime the response
/// runs on. Without one (a response polled outside tokio) the reservation is dropped: its
/// permits stay spent, which never admits more than the policy.
#[cfg(feature = "redis")]
fn settle_in_background<F>(settle: F)
where
    F: std::future::Future<Output = Result<(), crate::redis::BackendError>> + Send + 'static,
{
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            // A settle that cannot reach Redis leaves the permits spent (the backend's rule).
            let _ = settle.await;
        });
    }
}

/// Settles the reservation of every rule of a route on Redis at `costs`, one per rule, on a
/// task of its own (see [`settle_in_background`]).
#[cfg(feature = "redis")]
fn settle_all_in_background(
    limiters: Vec<crate::redis::RedisLimiter>,
    keys: Vec<String>,
    reservation: crate::redis::RedisAllOfReservation,
    costs: Vec<u64>,
) {
    settle_in_background(async move {
        let all = limiters
            .iter()
            .zip(&keys)
            .fold(crate::redis::RedisAllOf::new(), |all, (limiter, key)| {
                all.key(limiter, key)
            });
        all.settle(reservation, &costs).await
    });
}

/// The budget a key has left now, from `peek`: what a request of 1 would get. Allowed, it
/// counts that permit as taken: one more is left. Its reset is the one such a request would
/// leave, an upper bound (by one permit's time at most) for the key's.
fn budget(peek: Decision) -> Decision {
    if !peek.is_allowed() || peek.would_refuse() {
        // Nothing is left; `remaining` counts what is.
        return peek;
    }
    let reset = u64::try_from(peek.reset_after().as_nanos()).unwrap_or(u64::MAX);
    let remaining = peek.remaining().saturating_add(1).min(peek.limit());
    Decision::allow(remaining, peek.limit(), reset).in_band(peek.band())
}

impl Drop for Settlement {
    fn drop(&mut self) {
        // No response to settle from: what a rule with `settle_with` reserved comes back; a
        // rule without keeps its cost spent, as it would alone (it counts requests, answered
        // or not).
        let settles = |ruled: &Ruled| ruled.rule.settle.is_some();
        match self.held.take() {
            None => {}
            Some(Held::Local(reservations)) => {
                // The last taken first, as a refusal gives them back.
                for (index, limiter, reservation) in reservations.into_iter().rev() {
                    let ruled = &self.rules[index];
                    if settles(ruled) {
                        let _ = limiter.settle(&ruled.key, reservation, 0);
                    }
                }
            }
            #[cfg(feature = "redis")]
            Some(Held::Redis(limiter, reservation)) => {
                let key = self.rules[0].key.to_string();
                settle_in_background(async move { limiter.cancel(&key, reservation).await });
            }
            #[cfg(feature = "redis")]
            Some(Held::RedisAll(limiters, reservation)) => {
                let costs: Vec<u64> = self
                    .rules
                    .iter()
                    .map(|ruled| if settles(ruled) { 0 } else { ruled.cost })
                    .collect();
                let keys: Vec<String> = self.rules.iter().map(|r| r.key.to_string()).collect();
                settle_all_in_background(limiters, keys, reservation, costs);
            }
        }
    }
}

impl fmt::Debug for Settlement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settlement")
            .field(
                "keys",
                &self.rules.iter().map(|r| &r.key).collect::<Vec<_>>(),
            )
            .field("settled", &self.held.is_none())
            .finish_non_exhaustive()
    }
}
