//! What the clones of a limiter share ([`Shared`]), and the path every decision takes: the
//! deny cache, then one script call in Redis, then, while Redis is slow or down, the failure
//! policy. Also a key's reset, and the origin of its reservations, which a reset makes stale.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use crate::decision::Decision;
use crate::error::CostError;
use crate::keys::KeyHasher;
use crate::policy::Policy;
use crate::reservation::{Marks, Origin};

use super::cache::DenyCache;
use super::conn::{self, Script};
use super::error::BackendError;
use super::failure::{bump, Breaker, Counters, FailurePolicy};
use super::lease::Leases;
use super::script::{self, Ask, Bands};

/// The marks of a reservation that Redis did not make (the failure policy admitted it):
/// settling it changes nothing. No script mark comes near: they are below 2^53.
pub(super) const NOT_IN_REDIS: Marks = [u64::MAX; Policy::MAX_BANDS];

/// What a limiter's clones share: the script on its connection, the policy's bands and the
/// settings, the switch to the failure policy, the deny cache, the counters and the leases.
pub(super) struct Shared {
    pub(super) script: Script,
    pub(super) policy: Policy,
    pub(super) bands: Bands,
    pub(super) prefix: String,
    pub(super) timeout: Duration,
    pub(super) failure: FailurePolicy,
    pub(super) breaker: Breaker,
    pub(super) cache: Option<DenyCache>,
    /// The injected clock whose readings replace Redis `TIME` (tests only: see
    /// `RedisLimiterBuilder::test_clock`); always `None` without the `test-util` feature.
    pub(super) test_clock: Option<Arc<dyn Clock>>,
    /// The deny cache's clock: the test clock, or a monotonic one.
    pub(super) clock: Arc<dyn Clock>,
    pub(super) counters: Counters,
    /// This limiter's serial number, in the origin of its reservations.
    pub(super) id: u64,
    /// This limiter instance's name in the tokens it writes next to a key's state (its lease
    /// token's field, the prefix of its reservations' fields): random, so that servers never
    /// share one.
    pub(super) instance: String,
    /// The serial number of this limiter's latest reservation, which its token names.
    pub(super) reservations: AtomicU64,
    /// Hashes a key for the origin of its reservations.
    pub(super) hasher: KeyHasher,
    /// `reset`s this limiter has made: a reservation made before one gets no refund (its
    /// state is gone; a refund would land on the fresh one). Resets by other limiters are not
    /// seen here (see docs/REDIS.md).
    pub(super) resets: AtomicU64,
    /// The leases of hot keys (`None` without `RedisLimiterBuilder::lease`).
    pub(super) leases: Option<Leases>,
    /// Shadow mode (`RedisLimiterBuilder::shadow`): refusals are counted and let through.
    pub(super) shadow: bool,
}

impl Drop for Shared {
    /// Gives back the leases still held, from a task on the running tokio runtime (there is
    /// no awaiting here); without a runtime they are not given back, and stay spent in
    /// Redis as if admitted.
    fn drop(&mut self) {
        let Some(leases) = &self.leases else {
            return;
        };
        let held = leases.drain();
        if held.is_empty() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let returner = Arc::clone(&leases.returner);
            let clock = self.test_clock.clone();
            runtime.spawn(returner.give_back_all(held, clock));
        }
    }
}

impl Shared {
    /// A request's decision as the caller gets it: counted in `allowed` or `refused` as the
    /// policy made it, then, in shadow mode, a refusal let through (it spent nothing, and
    /// says so with `would_refuse`). Every request goes through here once; peeks do not.
    pub(super) fn finish(&self, decision: Decision) -> Decision {
        if decision.is_allowed() {
            bump(&self.counters.allowed);
            decision
        } else {
            bump(&self.counters.refused);
            if self.shadow {
                decision.shadowed()
            } else {
                decision
            }
        }
    }

    /// `n` as a request's cost: at least 1, at most the smallest band's permits.
    pub(super) fn check_cost(&self, n: u64) -> Result<(), CostError> {
        CostError::nonzero(n)?;
        CostError::within(n, self.policy.max_cost())
    }

    /// Decides what `ask` asks for `key`: the decision, for a reservation or a lease that
    /// Redis admitted each band's mark ([`NOT_IN_REDIS`] when the failure policy decided),
    /// and for a lease the permits it took (0 when refused or not decided by Redis).
    pub(super) async fn decide(
        &self,
        key: &str,
        ask: Ask,
    ) -> Result<(Decision, Marks, u64), BackendError> {
        // A peek is a request of cost 1 that writes nothing: the deny cache treats it so.
        let cover = ask.cost();
        // Read before anything is sent: the deny cache measures Redis's retry_after from here.
        let (now_micros, now) = match &self.test_clock {
            Some(clock) => {
                let micros = script::micros(clock.now())?;
                (Some(micros), micros * 1_000)
            }
            None => (None, self.clock.now()),
        };
        let mut ticket = 0;
        if let Some(cache) = &self.cache {
            if let Some(refusal) = cache.check(key, cover, now) {
                bump(&self.counters.cached_refusals);
                return Ok((refusal, NOT_IN_REDIS, 0));
            }
            ticket = cache.ticket(key);
        }
        if !self.breaker.should_try() {
            return self.fallback(key, ask, BackendError::Unavailable);
        }
        let mut args = self.bands.args(now_micros, ask);
        let keys = self
            .bands
            .call_keys(&self.prefix, key, ask, &self.instance, &mut args);
        let call = self.script.call(
            &keys,
            &args,
            &self.counters.script_reloads,
            true,
            self.timeout,
        );
        let marks = match ask {
            Ask::Reserve { .. } | Ask::Lease { .. } => self.bands.count(),
            _ => 0,
        };
        let counted = matches!(ask, Ask::Lease { .. });
        match call.await {
            Ok(Ok(reply)) => {
                let (decision, marks, count) = script::decision(&reply, marks, counted)?;
                self.recovered();
                bump(&self.counters.redis_decisions);
                if let Some(cache) = &self.cache {
                    if decision.is_allowed() {
                        if let Ask::Acquire(_) | Ask::Reserve { .. } | Ask::Lease { .. } = ask {
                            // An admission may lengthen a cached refusal of another cost.
                            cache.remove(key);
                        }
                    } else {
                        cache.insert(key, cover, now, ticket, &decision);
                    }
                }
                Ok((decision, marks, count))
            }
            Ok(Err(err)) if conn::is_unavailable(&err) => {
                bump(&self.counters.unavailable);
                self.failed(key, ask, BackendError::Redis(err))
            }
            Ok(Err(err)) => {
                // Redis answered: it is up, and the error is about this call.
                self.recovered();
                Err(BackendError::Redis(err))
            }
            Err(_) => {
                bump(&self.counters.timeouts);
                self.failed(key, ask, BackendError::Timeout(self.timeout))
            }
        }
    }

    /// Redis answered: switch back from the failure policy if it was deciding.
    pub(super) fn recovered(&self) {
        if self.breaker.succeeded() {
            bump(&self.counters.switches_to_redis);
            log::info!(
                "tollgate: redis answers again; deciding by redis (prefix `{}`)",
                self.prefix
            );
        }
    }

    /// A call to Redis failed with `err`: switch to the failure policy and let it decide.
    fn failed(
        &self,
        key: &str,
        ask: Ask,
        err: BackendError,
    ) -> Result<(Decision, Marks, u64), BackendError> {
        self.switch_to_failure(&err);
        self.fallback(key, ask, err)
    }

    /// A call to Redis failed with `err`: the failure policy decides from now on, until a
    /// probe succeeds.
    pub(super) fn switch_to_failure(&self, err: &BackendError) {
        if self.breaker.failed() {
            bump(&self.counters.switches_to_failure);
            log::warn!(
                "tollgate: {err}; deciding by the failure policy {:?} (prefix `{}`), probing redis every {:?}",
                self.failure,
                self.prefix,
                self.breaker.probe_interval()
            );
        }
    }

    /// The failure policy's decision of what `ask` asks for `key`, with the marks of a
    /// reservation it makes: [`NOT_IN_REDIS`].
    fn fallback(
        &self,
        key: &str,
        ask: Ask,
        err: BackendError,
    ) -> Result<(Decision, Marks, u64), BackendError> {
        bump(&self.counters.failure_decisions);
        // Open and Closed read no band's state: they report the shortest window's permits.
        let limit = self.policy.first_band().permits();
        let decision = match &self.failure {
            FailurePolicy::Error => return Err(err),
            FailurePolicy::Open => Decision::allow(0, limit, 0),
            FailurePolicy::Closed => self.fallback_refusal(),
            FailurePolicy::Local(local) => match ask {
                Ask::Peek => local.peek(key),
                Ask::Acquire(cost) | Ask::Reserve { cost, .. } => local
                    .try_acquire_n(key, cost)
                    .unwrap_or_else(|_| self.fallback_refusal()),
                // A lease's request alone: no lease while the failure policy decides.
                Ask::Lease { .. } => local
                    .try_acquire_n(key, 1)
                    .unwrap_or_else(|_| self.fallback_refusal()),
                // Settles never reach the failure policy.
                Ask::Refund { .. } | Ask::Charge { .. } | Ask::Return { .. } => return Err(err),
            },
        };
        Ok((decision, NOT_IN_REDIS, 0))
    }

    /// The failure policy's refusal without a state to read (`Closed`, or a cost the `Local`
    /// limiter's policy cannot admit): the shortest window's permits as the limit, and the
    /// probe interval as the wait.
    pub(super) fn fallback_refusal(&self) -> Decision {
        let limit = self.policy.first_band().permits();
        let wait = u64::try_from(self.breaker.probe_interval().as_nanos()).unwrap_or(u64::MAX);
        Decision::deny(0, limit, wait, 0)
    }

    /// A settle (or a lease given back) failed with `err`: counted, but the limiter does not
    /// switch to its failure policy for it. A settle is often the first call after a long
    /// request, on a connection Redis dropped meanwhile, and says nothing the next decision
    /// will not find out for itself. Returns `err`.
    pub(super) fn settle_failed(&self, err: BackendError) -> BackendError {
        match &err {
            BackendError::Redis(redis) if conn::is_unavailable(redis) => {
                bump(&self.counters.unavailable);
            }
            // Redis answered: it is up, and the error is about this call.
            BackendError::Redis(_) => self.recovered(),
            BackendError::Timeout(_) => bump(&self.counters.timeouts),
            _ => {}
        }
        err
    }

    /// The test clock's reading in microseconds (`None`: Redis `TIME` decides).
    pub(super) fn test_micros(&self) -> Result<Option<u64>, BackendError> {
        match &self.test_clock {
            Some(clock) => Ok(Some(script::micros(clock.now())?)),
            None => Ok(None),
        }
    }

    /// Deletes `key`'s state in Redis (all bands, its lease token and its reservation
    /// tokens), and forgets its refusal in the deny cache and its lease: `true` when there
    /// was state to delete.
    pub(super) async fn reset(&self, key: &str) -> Result<bool, BackendError> {
        // Forgotten before the DEL and again after it returns: a decision Redis refused
        // before the DEL may still be on its way, and must not cache its refusal after the
        // reset (see `DenyCache::forget`).
        let forget = || {
            if let Some(cache) = &self.cache {
                cache.forget(key);
            }
            if let Some(leases) = &self.leases {
                leases.forget(key);
            }
        };
        forget();
        let mut del = ::redis::cmd("DEL");
        match &self.leases {
            Some(leases) => del.arg(leases.returner.keys(key)),
            None => del.arg(self.bands.keys(&self.prefix, key)),
        };
        // The reservation tokens go with the state: a reservation made before gets no refund.
        del.arg(Bands::reserve_key(&self.prefix, key));
        let reply = tokio::time::timeout(self.timeout, self.script.conn().query(&del)).await;
        forget();
        // Release, once the DEL was sent (it may have run even if no answer came): a
        // reservation made before is stale from now on and gets no refund, which would land
        // on the fresh state.
        self.resets.fetch_add(1, Ordering::Release);
        let reply = reply.map_err(|_| BackendError::Timeout(self.timeout))??;
        match reply {
            ::redis::Value::Int(deleted) => Ok(deleted > 0),
            other => Err(BackendError::Reply(format!("DEL: {other:?}"))),
        }
    }

    /// Where a reservation for `key` on this limiter comes from.
    pub(super) fn origin(&self, key: &str) -> Origin {
        Origin {
            limiter: self.id,
            key: self.hasher.hash_one(key),
            // Acquire: pairs with the Release increment in `reset`, read before the
            // reservation is decided.
            rebuilds: self.resets.load(Ordering::Acquire),
        }
    }
}
