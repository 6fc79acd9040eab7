//! The limiters a rule of a [`RateLimitLayer`](super::RateLimitLayer) can be decided by:
//! [`Backend`], an in-process `RateLimiter` (any clock, any hasher) or a Redis limiter.

use std::fmt;
use std::hash::BuildHasher;
use std::sync::Arc;

use super::key::LimitKey;
use crate::clock::{Clock, Reading};
use crate::decision::Decision;
use crate::error::CostError;
use crate::keyed::RateLimiter;
use crate::policy::Policy;
use crate::reservation::{Reservation, SettleError};

/// An in-process limiter as the layer sees it: any clock, any hasher.
pub(super) trait Local: Send + Sync {
    fn try_acquire_n(&self, key: &LimitKey, cost: u64) -> Result<Decision, CostError>;
    fn reserve_n(&self, key: &LimitKey, cost: u64) -> Result<Reservation, CostError>;
    /// A rule's part of a route of several: its reservation, and whether deciding it
    /// created the key's state (see [`give_back`](Local::give_back)).
    fn reserve_part(&self, key: &LimitKey, cost: u64) -> Result<(Reservation, bool), CostError>;
    /// Gives back everything `reserve_part` took, and a state it `created` goes again if
    /// nothing has spent from it since, as `AllOf` leaves a refused request's keys.
    fn give_back(&self, key: &LimitKey, reservation: Reservation, created: bool);
    fn settle(
        &self,
        key: &LimitKey,
        reservation: Reservation,
        actual: u64,
    ) -> Result<(), SettleError>;
    fn peek(&self, key: &LimitKey) -> Decision;
    /// What a request of `cost` would get now, taking nothing: a peek, in shadow mode let
    /// through as the request would be (a rule looked at after another refused).
    fn look_n(&self, key: &LimitKey, cost: u64) -> Result<Decision, CostError>;
    fn policy(&self) -> Option<Policy>;
}

impl<C, S> Local for RateLimiter<LimitKey, C, S>
where
    C: Clock + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    fn try_acquire_n(&self, key: &LimitKey, cost: u64) -> Result<Decision, CostError> {
        RateLimiter::try_acquire_n(self, key, cost)
    }

    fn reserve_n(&self, key: &LimitKey, cost: u64) -> Result<Reservation, CostError> {
        RateLimiter::reserve_n(self, key, cost)
    }

    fn reserve_part(&self, key: &LimitKey, cost: u64) -> Result<(Reservation, bool), CostError> {
        self.take_part(key, cost, &mut Reading::default(), |decision, held| {
            let created = held.created;
            (self.part_reservation(key, decision, cost, held), created)
        })
    }

    fn give_back(&self, key: &LimitKey, reservation: Reservation, created: bool) {
        self.give_back_part(key, reservation, created);
    }

    fn settle(
        &self,
        key: &LimitKey,
        reservation: Reservation,
        actual: u64,
    ) -> Result<(), SettleError> {
        RateLimiter::settle(self, key, reservation, actual)
    }

    fn peek(&self, key: &LimitKey) -> Decision {
        RateLimiter::peek(self, key)
    }

    fn look_n(&self, key: &LimitKey, cost: u64) -> Result<Decision, CostError> {
        RateLimiter::peek_n(self, key, cost).map(|decision| self.as_decided(decision))
    }

    fn policy(&self) -> Option<Policy> {
        RateLimiter::policy(self)
    }
}

/// What decides a rule's requests: a limiter given to
/// [`RateLimitLayer::new`](super::RateLimitLayer::new) or
/// [`RateLimitLayer::route`](super::RateLimitLayer::route), converted from
///
/// * a `RateLimiter<LimitKey, C, S>` or an `Arc` of one (in process: decided at once, in
///   `call`; keep an `Arc` to call `evict_idle`, read `stats` or `set_policy`), or
/// * with feature `redis`, a [`RedisLimiter`](crate::redis::RedisLimiter): every server
///   sharing the Redis and the prefix shares one limit per key. The decision is awaited in
///   the response future (`poll_ready` stays the inner service's); each [`LimitKey`] becomes
///   the Redis key of its [`Display`](LimitKey#impl-Display-for-LimitKey) form
///   (`ip:192.0.2.1`, `digest:<32 hex digits>`...). The limiter's
///   [`FailurePolicy`](crate::redis::FailurePolicy) decides while Redis is down; an error
///   it lets through (`FailurePolicy::Error`, or an error reply about the call) is answered
///   `503 Service Unavailable` with a problem document (gRPC `UNAVAILABLE`), never let
///   through. Deny-cache refusals are answered like any other refusal.
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use tollgate::middleware::{Backend, LimitKey};
/// use tollgate::RateLimiter;
///
/// let shared: Arc<RateLimiter<LimitKey>> = Arc::new(RateLimiter::new("5/1s".parse()?));
/// let backend = Backend::from(Arc::clone(&shared));
/// # Ok::<(), tollgate::PolicyError>(())
/// ```
#[derive(Clone)]
pub struct Backend(pub(super) Limiter);

#[derive(Clone)]
pub(super) enum Limiter {
    Local(Arc<dyn Local>),
    #[cfg(feature = "redis")]
    Redis(crate::redis::RedisLimiter),
}

impl Limiter {
    /// Why this limiter and `other` cannot decide one route's requests together, if they
    /// cannot: one in process and one on Redis, or two on Redis on different connections.
    pub(super) fn apart_from(&self, other: &Limiter) -> Option<&'static str> {
        match (self, other) {
            (Limiter::Local(_), Limiter::Local(_)) => None,
            #[cfg(feature = "redis")]
            (Limiter::Redis(one), Limiter::Redis(other)) => (!one.same_connection(other)).then_some(
                "one route's Redis limiters share one connection (RedisLimiterBuilder::connect_shared)",
            ),
            #[cfg(feature = "redis")]
            _ => Some("one route's rules are all in process or all on Redis"),
        }
    }

    /// The in-process limiter, if this is one.
    pub(super) fn local(&self) -> Option<&Arc<dyn Local>> {
        match self {
            Limiter::Local(limiter) => Some(limiter),
            #[cfg(feature = "redis")]
            Limiter::Redis(_) => None,
        }
    }

    pub(super) fn policy(&self) -> Option<Policy> {
        match self {
            Limiter::Local(limiter) => limiter.policy(),
            #[cfg(feature = "redis")]
            Limiter::Redis(limiter) => limiter.uniform_policy(),
        }
    }
}

impl<C, S> From<RateLimiter<LimitKey, C, S>> for Backend
where
    C: Clock + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    fn from(limiter: RateLimiter<LimitKey, C, S>) -> Self {
        Backend::from(Arc::new(limiter))
    }
}

impl<C, S> From<Arc<RateLimiter<LimitKey, C, S>>> for Backend
where
    C: Clock + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    fn from(limiter: Arc<RateLimiter<LimitKey, C, S>>) -> Self {
        Backend(Limiter::Local(limiter))
    }
}

#[cfg(feature = "redis")]
impl From<crate::redis::RedisLimiter> for Backend {
    fn from(limiter: crate::redis::RedisLimiter) -> Self {
        Backend(Limiter::Redis(limiter))
    }
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Limiter::Local(limiter) => f
                .debug_struct("Backend::Local")
                .field("policy", &limiter.policy())
                .finish(),
            #[cfg(feature = "redis")]
            Limiter::Redis(limiter) => f.debug_tuple("Backend::Redis").field(limiter).finish(),
        }
    }
}
