//! What the clones of a limiter share ([`Shared`]), and the path every decision takes: the
//! deny cache, then one script call in Redis, then, while Redis is slow or down, the failure
//! policy. Also a key's reset, and the origin of its reservations, which a reset makes stale.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use crate::decision::Decision;
use crate::keys::KeyHasher;
use crate::policy::Policy;
use crate::reservation::{Marks, Origin};

use super::cache::DenyCache;
use super::conn::{self, Script};
use super::error::BackendError;
use super::failure::{bump, Breaker, Counters, FailurePolicy};
use super::lease::Leases;
use super::live::Live;
use super::script::{self, Ask, Bands, Conflict};
use super::tiers::{Choice, Chosen, Tier, Tiers};

/// The marks of a reservation that Redis did not make (the failure policy admitted it):
/// settling it changes nothing. No script mark comes near: they are below 2^53.
pub(super) const NOT_IN_REDIS: Marks = [u64::MAX; Policy::MAX_BANDS + 1];

/// A request's decision, for a reservation or a lease that Redis admitted each band's mark
/// ([`NOT_IN_REDIS`] when the failure policy decided), for a lease the permits it took, and
/// the policy it was decided under.
pub(super) type KeyDecided = (Decision, Marks, u64, Policy);

/// How many times one request moves its key to its policy before it gives up (another
/// server moving it back each time: servers whose resolvers disagree).
pub(super) const MAX_MOVES: usize = 3;

/// Why a script call, or the move of a key before it, did not decide.
pub(super) enum Moved {
    /// Redis answered with an error, or could not be reached.
    Redis(::redis::RedisError),
    /// Redis did not answer within the timeout.
    Timeout,
    /// Anything else (an unexpected reply, a record that is no policy, too many moves).
    Other(BackendError),
}

impl Moved {
    /// A script call's outcome (`conn::Script::call`): its reply, or why there is none.
    pub(super) fn reply(
        call: Result<Result<::redis::Value, ::redis::RedisError>, tokio::time::error::Elapsed>,
    ) -> Result<::redis::Value, Moved> {
        match call {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(err)) => Err(Moved::Redis(err)),
            Err(_) => Err(Moved::Timeout),
        }
    }
}

/// The error of a request whose key was moved to another policy [`MAX_MOVES`] times.
pub(super) fn kept_changing(key: &str) -> BackendError {
    BackendError::Reply(format!(
        "the policy of key `{key}` kept changing under this request ({MAX_MOVES} moves): do the servers' resolvers agree?"
    ))
}

/// What a limiter's clones share: the script on its connection, the policy's bands and the
/// settings, the switch to the failure policy, the deny cache, the counters and the leases.
pub(super) struct Shared {
    pub(super) script: Script,
    /// The builder's policy: every key's, unless `tiers` chooses.
    pub(super) tier: Arc<Tier>,
    /// Per-key policies: the resolver and its cache (`RedisLimiterBuilder::resolver`).
    pub(super) tiers: Option<Tiers>,
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
    /// The policy set on any server (`RedisLimiterBuilder::live_policy`), as known here.
    pub(super) live: Option<Live>,
    /// The clock's reading when the limiter was built: when its builder's policy was chosen.
    pub(super) started: u64,
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

    /// The policy `key` is decided under: the builder's, or the resolver's answer (cached),
    /// with when it was chosen. A key whose answer may have changed here has its cached
    /// refusal forgotten (it may have been another policy's).
    ///
    /// # Errors
    ///
    /// [`BackendError::UnsupportedPolicy`] for an answer the scripts cannot decide.
    pub(super) fn tier_of(&self, key: &str) -> Result<Choice, BackendError> {
        // A policy set live replaces the builder's and the resolver's, as in process.
        if let Some(choice) = self.live.as_ref().and_then(Live::current) {
            return Ok(choice);
        }
        let Some(tiers) = &self.tiers else {
            // The builder's policy, chosen when this limiter was built: a server started
            // later with another configured policy is the later choice.
            return Ok(Choice {
                tier: Arc::clone(&self.tier),
                chosen: Chosen::Since(self.started),
            });
        };
        let (choice, changed) = tiers.tier(key, &*self.clock)?;
        if changed {
            if let Some(cache) = &self.cache {
                cache.forget(key);
            }
        }
        Ok(choice)
    }

    /// Whether keys' records name their policies: with a resolver, or live policies.
    pub(super) fn recorded(&self) -> bool {
        self.tiers.is_some() || self.live.is_some()
    }

    /// `n` as a request's cost for `key`: at least 1, at most the smallest band's permits of
    /// its policy. The policy set live is read first (when due): a cost the old one refuses
    /// may be the new one's.
    pub(super) async fn check_cost(&self, key: &str, n: u64) -> Result<(), BackendError> {
        self.read_live().await;
        Ok(self.tier_of(key)?.tier.check_cost(n)?)
    }

    /// The keys and arguments of the script call asking `ask` for `key` under `choice`.
    pub(super) fn call_for(
        &self,
        choice: &Choice,
        key: &str,
        ask: Ask,
        (now_micros, clock_now): (Option<u64>, u64),
    ) -> (Vec<String>, Vec<String>) {
        let bands = &choice.tier.bands;
        let mut args = bands.args(now_micros, ask);
        let mut keys = bands.call_keys(&self.prefix, key, ask, &self.instance, &mut args);
        if self.recorded() {
            let recorded = (choice.tier.text.as_str(), choice.chosen.arg(clock_now));
            Bands::recorded(&self.prefix, key, recorded, &mut keys, &mut args);
        }
        (keys, args)
    }

    /// Settles `conflict`, `key`'s record naming another policy than `choice`'s: follows the
    /// record's when it was chosen no earlier (the request is then decided under it), else
    /// moves the key's state to `choice`'s, carrying the permits in use (one script call,
    /// counted in `policy_moves`; it may find a third policy and follow or move from it, up
    /// to [`MAX_MOVES`] calls in all). A cost the policy followed cannot admit is the
    /// request's error. A peek moves the key as a request would (the one write a peek makes,
    /// so that it answers what the request would get, as in process). `now` is the script's
    /// instant and this instance's clock reading, read once for the request.
    pub(super) async fn resolve_conflict(
        &self,
        key: &str,
        conflict: Conflict,
        choice: &mut Choice,
        cost: u64,
        now: (Option<u64>, u64),
    ) -> Result<(), Moved> {
        let (now_micros, clock_now) = now;
        let mut conflict = conflict;
        for _ in 0..MAX_MOVES {
            let old = Tier::recorded(&conflict.recorded).map_err(Moved::Other)?;
            if conflict.follow {
                old.check_cost(cost)
                    .map_err(|err| Moved::Other(err.into()))?;
                let used = std::mem::replace(
                    choice,
                    Choice {
                        tier: Arc::new(old),
                        chosen: Chosen::At(conflict.at),
                    },
                );
                // Kept for the key's next requests, until the resolver is asked again; a
                // policy set live is taken for every key.
                if let Some(tiers) = &self.tiers {
                    tiers.follow(key, choice.clone(), &used);
                }
                self.learn_live(choice);
                return Ok(());
            }
            let (keys, args) = old.bands.convert_call(
                &choice.tier.bands,
                &self.prefix,
                key,
                now_micros,
                // The record's own text, as the script compares it (a record written by
                // another version may spell the policy otherwise).
                (
                    [&conflict.recorded, &choice.tier.text],
                    choice.chosen.arg(clock_now),
                ),
            );
            let reply = self
                .script
                .call(
                    &keys,
                    &args,
                    &self.counters.script_reloads,
                    true,
                    self.timeout,
                )
                .await;
            let reply = Moved::reply(reply)?;
            match script::converted(&reply).map_err(Moved::Other)? {
                Ok(moved) => {
                    if moved {
                        bump(&self.counters.policy_moves);
                    }
                    if let Some(cache) = &self.cache {
                        cache.forget(key);
                    }
                    return Ok(());
                }
                Err(next) => conflict = next,
            }
        }
        Err(Moved::Other(kept_changing(key)))
    }

    /// Decides what `ask` asks for `key`: the decision, for a reservation or a lease that
    /// Redis admitted each band's mark ([`NOT_IN_REDIS`] when the failure policy decided),
    /// and for a lease the permits it took (0 when refused or not decided by Redis).
    pub(super) async fn decide(&self, key: &str, ask: Ask) -> Result<KeyDecided, BackendError> {
        self.read_live().await;
        // Taken before the policy is chosen: a forget (a live change, a changed answer)
        // after the choice keeps this request's refusal, made under the old policy, out.
        let early_ticket = self.cache.as_ref().map(|cache| cache.ticket(key));
        let mut choice = self.tier_of(key)?;
        // A peek is a request of cost 1 that writes nothing: the deny cache treats it so.
        let cover = ask.cost();
        // Checked by the caller under the answer it had; the resolver may have answered
        // another since.
        choice.tier.check_cost(cover)?;
        // Read before anything is sent: the deny cache measures Redis's retry_after from here,
        // and an answer's age is counted to here.
        let clock_now = self.clock.now();
        let (now_micros, now) = match &self.test_clock {
            Some(_) => {
                let micros = script::micros(clock_now)?;
                (Some(micros), micros * 1_000)
            }
            None => (None, clock_now),
        };
        let mut ticket = 0;
        if let Some(cache) = &self.cache {
            if let Some(refusal) = cache.check(key, cover, now) {
                bump(&self.counters.cached_refusals);
                return Ok((refusal, NOT_IN_REDIS, 0, choice.tier.policy));
            }
            ticket = early_ticket.unwrap_or_default();
        }
        if !self.breaker.should_try() {
            return self.fallback(&choice.tier, key, ask, BackendError::Unavailable);
        }
        let mut moves = 0;
        let reply = loop {
            let (keys, args) = self.call_for(&choice, key, ask, (now_micros, clock_now));
            let call = self.script.call(
                &keys,
                &args,
                &self.counters.script_reloads,
                true,
                self.timeout,
            );
            let failed = match Moved::reply(call.await) {
                Ok(reply) => match script::conflict(&reply) {
                    None => break reply,
                    // The key's state is under another policy: follow it, or move the state.
                    Some(conflict) if moves < MAX_MOVES => {
                        moves += 1;
                        let resolved = self
                            .resolve_conflict(
                                key,
                                conflict,
                                &mut choice,
                                cover,
                                (now_micros, clock_now),
                            )
                            .await;
                        match resolved {
                            Ok(()) => continue,
                            Err(failed) => failed,
                        }
                    }
                    Some(_) => Moved::Other(kept_changing(key)),
                },
                Err(failed) => failed,
            };
            return match failed {
                Moved::Redis(err) if conn::is_unavailable(&err) => {
                    bump(&self.counters.unavailable);
                    self.failed(&choice.tier, key, ask, BackendError::Redis(err))
                }
                Moved::Redis(err) => {
                    // Redis answered: it is up, and the error is about this call.
                    self.recovered();
                    Err(BackendError::Redis(err))
                }
                Moved::Timeout => {
                    bump(&self.counters.timeouts);
                    self.failed(&choice.tier, key, ask, BackendError::Timeout(self.timeout))
                }
                Moved::Other(err) => {
                    self.recovered();
                    Err(err)
                }
            };
        };
        let marks = match ask {
            Ask::Reserve { .. } | Ask::Lease { .. } => choice.tier.bands.count(),
            _ => 0,
        };
        let counted = matches!(ask, Ask::Lease { .. });
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
        Ok((decision, marks, count, choice.tier.policy))
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
        tier: &Tier,
        key: &str,
        ask: Ask,
        err: BackendError,
    ) -> Result<KeyDecided, BackendError> {
        self.switch_to_failure(&err);
        self.fallback(tier, key, ask, err)
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

    /// The failure policy's decision of what `ask` asks for `key` (under `tier`), with the
    /// marks of a reservation it makes: [`NOT_IN_REDIS`].
    fn fallback(
        &self,
        tier: &Tier,
        key: &str,
        ask: Ask,
        err: BackendError,
    ) -> Result<KeyDecided, BackendError> {
        bump(&self.counters.failure_decisions);
        // Open and Closed read no band's state: they report the shortest window's permits.
        let limit = tier.policy.first_band().permits();
        let decision = match &self.failure {
            FailurePolicy::Error => return Err(err),
            FailurePolicy::Open => Decision::allow(0, limit, 0),
            FailurePolicy::Closed => self.fallback_refusal(tier),
            FailurePolicy::Local(local) => match ask {
                Ask::Peek => local.peek(key),
                Ask::Acquire(cost) | Ask::Reserve { cost, .. } => local
                    .try_acquire_n(key, cost)
                    .unwrap_or_else(|_| self.fallback_refusal(tier)),
                // A lease's request alone: no lease while the failure policy decides.
                Ask::Lease { .. } => local
                    .try_acquire_n(key, 1)
                    .unwrap_or_else(|_| self.fallback_refusal(tier)),
                // Settles never reach the failure policy.
                Ask::Refund { .. } | Ask::Charge { .. } | Ask::Return { .. } => return Err(err),
            },
        };
        Ok((decision, NOT_IN_REDIS, 0, tier.policy))
    }

    /// The failure policy's refusal without a state to read (`Closed`, or a cost the `Local`
    /// limiter's policy cannot admit): the shortest window's permits as the limit, and the
    /// probe interval as the wait.
    pub(super) fn fallback_refusal(&self, tier: &Tier) -> Decision {
        let limit = tier.policy.first_band().permits();
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

    /// Deletes `key`'s state in Redis (all bands, its record and kept permits, its lease
    /// token and its reservation tokens), and forgets its refusal in the deny cache and its lease: `true` when there
    /// was state to delete.
    pub(super) async fn reset(&self, key: &str) -> Result<bool, BackendError> {
        // The key's policy here, before its answer is forgotten below (none when the
        // resolver answers one the scripts cannot decide: the record's state goes all the
        // same).
        let own = self.tier_of(key).ok().map(|choice| choice.tier);
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
            // Its next request asks the resolver again, as in process.
            if let Some(tiers) = &self.tiers {
                tiers.forget(key);
            }
        };
        forget();
        let mut del = ::redis::cmd("DEL");
        match &self.leases {
            Some(leases) => del.arg(leases.returner.keys(key)),
            None => del.arg(own.map_or_else(Vec::new, |own| own.bands.keys(&self.prefix, key))),
        };
        // Every server's lease tokens for the key go with its state, whether or not this
        // limiter leases: a lease taken before the reset gives nothing back to the fresh one.
        del.arg(Bands::lease_key(&self.prefix, key));
        if self.recorded() {
            // The state may be under another policy than this server's answer for the key:
            // the one its record names goes too, with the record.
            let record = Bands::record_key(&self.prefix, key);
            let get = ::redis::cmd("GET").arg(&record).clone();
            let recorded = tokio::time::timeout(self.timeout, self.script.conn().query(&get))
                .await
                .map_err(|_| BackendError::Timeout(self.timeout))??;
            if let ::redis::Value::BulkString(record) = recorded {
                // '<chosen>|<policy>' (lua/record.lua).
                let record = String::from_utf8_lossy(&record);
                let text = record.split_once('|').map_or(&*record, |(_, text)| text);
                // A record that names no policy goes with the rest; it names no keys.
                if let Ok(tier) = Tier::recorded(text) {
                    del.arg(tier.bands.keys(&self.prefix, key));
                }
            }
            // What its moves could not carry goes too: the fresh state owes nothing.
            del.arg(Bands::kept_key(&self.prefix, key));
            del.arg(record);
        }
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
