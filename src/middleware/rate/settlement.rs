//! [`Settlement`]: a route's reservation on its way through the inner service, settled at
//! what the response says it cost, or given back when no response comes.

use std::fmt;
use std::sync::Arc;

use http::response;

use super::rule::Rule;
use crate::decision::Decision;
use crate::middleware::backend::Local;
use crate::middleware::headers::Fields;
use crate::middleware::key::LimitKey;
use crate::reservation::Reservation;

/// The limiter a reservation was made on.
pub(super) enum Holder {
    /// An in-process limiter: settled at once, and the response's fields say the budget left.
    Local(Arc<dyn Local>),
    /// A Redis limiter: settled by a task of its own (a response is never held back for a
    /// round trip); the response's fields stay those decided at the request.
    #[cfg(feature = "redis")]
    Redis(crate::redis::RedisLimiter),
}

/// An allowed reservation on its way through the inner service: settled at what the response
/// says ([`Settlement::settle`]), or cancelled when dropped unsettled (the inner service
/// failed, or the response future was dropped before the response).
pub(crate) struct Settlement {
    /// The rule whose `settle_with` reads the response, and whose fields it gets.
    rule: Arc<Rule>,
    /// The layer is in shadow mode: settle, but add no fields.
    shadow: bool,
    holder: Holder,
    key: LimitKey,
    /// `None` once settled (or kept spent).
    reservation: Option<Reservation>,
}

impl Settlement {
    pub(super) fn new(
        rule: Arc<Rule>,
        shadow: bool,
        holder: Holder,
        key: LimitKey,
        reservation: Reservation,
    ) -> Self {
        Settlement {
            rule,
            shadow,
            holder,
            key,
            reservation: Some(reservation),
        }
    }

    /// Settles the reservation at what `response` says it cost; the fields the response
    /// should carry instead of those decided at the request, when the settle changed them.
    /// A response that says nothing keeps the estimate spent.
    #[cfg_attr(
        not(feature = "redis"),
        allow(
            clippy::infallible_destructuring_match,
            reason = "with feature redis the holder has a second kind"
        )
    )]
    pub(crate) fn settle(mut self, response: &response::Parts) -> Option<Fields> {
        let reservation = self.reservation.take()?;
        let actual = self.rule.settle.as_ref()?;
        // `None`: dropping the reservation keeps its permits spent.
        let actual = actual(response)?;
        let limiter = match &self.holder {
            Holder::Local(limiter) => limiter,
            #[cfg(feature = "redis")]
            Holder::Redis(limiter) => {
                settle_in_background(limiter.clone(), self.key.to_string(), reservation, actual);
                return None;
            }
        };
        // A settle fails only for a reservation made elsewhere, which this one is not.
        limiter.settle(&self.key, reservation, actual).ok()?;
        if self.shadow {
            return None;
        }
        Some(self.rule.fields(&budget(limiter.peek(&self.key))))
    }
}

/// Settles a Redis reservation on a task of its own, on the runtime the response runs on.
/// Without one (a response polled outside tokio) the reservation is dropped: its permits
/// stay spent, which never admits more than the policy.
#[cfg(feature = "redis")]
fn settle_in_background(
    limiter: crate::redis::RedisLimiter,
    key: String,
    reservation: Reservation,
    actual: u64,
) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            // A settle that cannot reach Redis leaves the permits spent (the backend's rule).
            let _ = limiter.settle(&key, reservation, actual).await;
        });
    }
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
        if let Some(reservation) = self.reservation.take() {
            // No response to settle from: everything comes back.
            match &self.holder {
                Holder::Local(limiter) => {
                    let _ = limiter.settle(&self.key, reservation, 0);
                }
                #[cfg(feature = "redis")]
                Holder::Redis(limiter) => {
                    settle_in_background(limiter.clone(), self.key.to_string(), reservation, 0);
                }
            }
        }
    }
}

impl fmt::Debug for Settlement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settlement")
            .field("key", &self.key)
            .field("reservation", &self.reservation)
            .finish_non_exhaustive()
    }
}
