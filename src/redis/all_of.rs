//! Several keys of Redis-backed limiters in one decision, all or nothing: [`RedisAllOf`].

use std::collections::HashSet;
use std::convert::Infallible;
use std::fmt;
use std::sync::atomic::Ordering;

use ::redis::cluster_routing::Slot;

use crate::all_of::{take_in_order, PartError, Tally};
use crate::decision::Decision;
use crate::error::CostError;
use crate::reservation::{Origin, Reservation, SettleError};

use super::conn::{self, Conn};
use super::error::BackendError;
use super::failure::{bump, FailurePolicy};
use super::script::{self, Bands, PartsAsk};
use super::shared::{kept_changing, Moved, Shared, MAX_MOVES, NOT_IN_REDIS};
use super::tiers::Choice;

/// One decision over keys of several [`RedisLimiter`](super::RedisLimiter)s (per user, per client address, one
/// global key, a budget of tokens), in **one script call**: allowed only if every part
/// allows, and then every part has spent its permits; refused, and nothing was spent
/// anywhere. The Redis counterpart of [`AllOf`](crate::AllOf), with the same answer.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tollgate::redis::{RedisAllOf, RedisLimiter};
///
/// let per_user = RedisLimiter::builder("100/min".parse()?)
///     .prefix("user")
///     .connect("redis://127.0.0.1:6379")
///     .await?;
/// // On the same connection, so that one script call decides both.
/// let per_ip = RedisLimiter::builder("20/min".parse()?)
///     .prefix("ip")
///     .connect_shared(&per_user)
///     .await?;
/// let tokens = RedisLimiter::builder("10000/min".parse()?)
///     .prefix("tokens")
///     .connect_shared(&per_user)
///     .await?;
///
/// let decision = RedisAllOf::new()
///     .key(&per_user, "alice")
///     .key(&per_ip, "203.0.113.9")
///     .named("per-ip")
///     .key_n(&tokens, "alice", 700)
///     .try_acquire()
///     .await?;
/// if !decision.is_allowed() {
///     println!("429, Retry-After: {}", decision.retry_after_secs());
/// }
/// # Ok(())
/// # }
/// ```
///
/// **One round trip, atomic.** The script reads and decides every band of every part's key
/// before it writes any, and writes only when every part admits; Redis runs it alone, so
/// no other decision interleaves, and there is no give-back and no window in which a racing
/// request sees permits taken that a refusal will return. What it takes:
/// - every part's limiter on one connection: the first part's limiter and those built from
///   it with [`connect_shared`](super::RedisLimiterBuilder::connect_shared)
///   ([`BackendError::OtherConnection`] otherwise);
/// - on a Redis Cluster, every key in one slot: give the limiters one
///   [`hash_tag`](super::RedisLimiterBuilder::hash_tag) ([`BackendError::CrossSlot`]
///   otherwise, checked before anything is sent);
/// - no Redis key named by two parts ([`BackendError::SharedKey`]): the same limiter and key
///   twice, or two limiters with one prefix and a band in common, for one key.
///
/// The call runs with the first part's limiter's settings: its timeout, its clock (a test
/// clock), its counters of script reloads. Each part's limiter counts one decision by Redis
/// (`BackendStats::redis_decisions`).
///
/// **The answer** is that of [`AllOf`](crate::AllOf): allowed, the decision of the part with
/// the least left; refused, the `retry_after` of the refusing part with the longest wait and,
/// as `remaining`, the least any part has available. [`Decision::part`] says which part
/// decided, [`RedisAllOf::name`] its name. A cost no state of its part's policy could admit is
/// refused without a round trip, as `AllOf` refuses it (`retry_after` `u64::MAX`
/// nanoseconds); [`check`](RedisAllOf::check) names it. (With a resolver or live policies, a
/// part's policy may be known only from its key's record, once a call was made: the
/// refusal then comes after it, with nothing spent, and other parts' keys possibly moved to
/// their policies.)
///
/// **Leases and deny caches.** The decision is Redis's, on the state in Redis: a lease a
/// part's limiter holds counts there as spent (so it may refuse what the lease would admit,
/// never the other way), and no part's deny cache is read or filled. An admission drops each
/// part's key from its limiter's deny cache, as its own admissions do.
///
/// **Shadow mode.** A part whose limiter is in
/// [shadow mode](super::RedisLimiterBuilder::shadow) and would refuse spends nothing and does
/// not refuse the whole; the whole is then that refusal let through
/// ([`would_refuse`](Decision::would_refuse)), as in [`AllOf`](crate::AllOf). Each part's
/// limiter counts its part's own decision in `BackendStats::allowed` or `refused`, whether or
/// not the whole admitted (a peek is not counted).
///
/// **While Redis is slow or down**, each part is decided by its limiter's
/// [`FailurePolicy`]: if any part's is [`Error`](FailurePolicy::Error), the call fails with
/// the error; otherwise an [`Open`](FailurePolicy::Open) part allows, a
/// [`Closed`](FailurePolicy::Closed) part refuses, and the [`Local`](FailurePolicy::Local)
/// limiters decide their parts all or nothing in process, as an [`AllOf`](crate::AllOf)
/// does (taken in order, given back at the first refusal). The switch to the failure policy
/// and back, and the probes, follow the first part's limiter, and every part's limiter is
/// switched with it.
///
/// [`reserve`](RedisAllOf::reserve) takes every part's cost in one call, as reservations
/// that [`settle`](RedisAllOf::settle) settles part by part from the real costs.
///
/// [`Decision::part`] counts parts in 16 bits: build no `RedisAllOf` of more than 65,535
/// parts.
#[derive(Clone, Default)]
pub struct RedisAllOf<'a> {
    parts: Vec<RedisPart<'a>>,
}

/// One part: a limiter's key at a cost.
#[derive(Clone)]
struct RedisPart<'a> {
    /// What the limiter's clones share.
    shared: &'a Shared,
    key: &'a str,
    cost: u64,
    name: Option<&'static str>,
}

impl<'a> RedisAllOf<'a> {
    /// No part yet (it allows everything).
    #[must_use]
    pub fn new() -> Self {
        RedisAllOf { parts: Vec::new() }
    }

    /// Adds the key `key` of the limiter whose shared state is `shared`, at a cost of `n`
    /// (for `RedisAllOf::key_n`, with the limiter's methods in the parent module).
    pub(super) fn push(mut self, shared: &'a Shared, key: &'a str, n: u64) -> Self {
        self.parts.push(RedisPart {
            shared,
            key,
            cost: n,
            name: None,
        });
        self
    }

    /// Names the part added last, for [`RedisAllOf::name`] and [`PartError`] (the limiter's
    /// role: "per-ip", "tokens"). With no part yet, names nothing.
    #[must_use]
    pub fn named(mut self, name: &'static str) -> Self {
        if let Some(part) = self.parts.last_mut() {
            part.name = Some(name);
        }
        self
    }

    /// How many parts.
    #[must_use]
    pub fn len(&self) -> usize {
        self.parts.len()
    }

    /// Whether there is no part (such a `RedisAllOf` allows everything).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// The name of part `part` (its position, in the order added), if it was
    /// [`named`](RedisAllOf::named).
    #[must_use]
    pub fn name(&self, part: usize) -> Option<&'static str> {
        self.parts.get(part).and_then(|part| part.name)
    }

    /// Whether every part's cost is one its policy could ever admit, changing nothing and
    /// sending nothing.
    ///
    /// # Errors
    ///
    /// The first part whose cost is 0 or above its policy's smallest band's permits.
    pub fn check(&self) -> Result<(), PartError> {
        for (index, part) in self.parts.iter().enumerate() {
            // A policy the scripts cannot decide is the call's error, not a cost's.
            let Ok(tier) = part.shared.tier_of(part.key) else {
                continue;
            };
            if let Err(error) = tier.tier.check_cost(part.cost) {
                return Err(PartError::new(index, part.name, error));
            }
        }
        Ok(())
    }

    /// Decides a request on every part at once, in one script call: allowed, with every
    /// part's permits spent, or refused, with nothing spent (see the type's docs).
    ///
    /// # Errors
    ///
    /// [`BackendError::OtherConnection`], [`BackendError::SharedKey`] and
    /// [`BackendError::CrossSlot`] for parts one call cannot decide (nothing is sent); while
    /// Redis is slow or down, as a part's [`FailurePolicy`] says; otherwise as
    /// [`RedisLimiter::try_acquire`](super::RedisLimiter::try_acquire).
    pub async fn try_acquire(&self) -> Result<Decision, BackendError> {
        Ok(self.decide(PartsAsk::Acquire, None).await?.decision)
    }

    /// What [`try_acquire`](RedisAllOf::try_acquire) would decide now, changing nothing: one
    /// script call that decides every part and writes nothing (a snapshot of all the parts at
    /// one instant). A part whose limiter has a resolver or live policies, and whose key's
    /// record names an older policy, is moved first, as its limiter's
    /// [`peek`](super::RedisLimiter::peek) moves it.
    ///
    /// # Errors
    ///
    /// As [`try_acquire`](RedisAllOf::try_acquire).
    pub async fn peek(&self) -> Result<Decision, BackendError> {
        Ok(self.decide(PartsAsk::Peek, None).await?.decision)
    }

    /// Takes every part's permits now, for a request whose real costs are known only after
    /// it ran, all or nothing as [`try_acquire`](RedisAllOf::try_acquire) and in one script
    /// call; [`settle`](RedisAllOf::settle) then gives back what a part did not use, or
    /// charges what it used on top. Each part is a reservation of its limiter, as its
    /// [`reserve_n`](super::RedisLimiter::reserve_n) makes one (its token written next to its
    /// key's state by the same call).
    ///
    /// # Errors
    ///
    /// [`BackendError::Part`] for a part whose cost no state of its policy could admit
    /// (nothing is sent, or with a resolver or live policies nothing spent); otherwise as
    /// [`try_acquire`](RedisAllOf::try_acquire).
    pub async fn reserve(&self) -> Result<RedisAllOfReservation, BackendError> {
        let decided = self.decide(PartsAsk::Reserve, None).await?;
        // A cost the policy a part is decided under cannot admit: checked by `decide` once
        // the policies set live are read (a cost the old policy refuses may be the new
        // one's), and again against the policy each key's record names. Nothing spent.
        if let Some((index, error)) = decided.error {
            let name = self.parts.get(index).and_then(|part| part.name);
            return Err(BackendError::Part(PartError::new(index, name, error)));
        }
        Ok(RedisAllOfReservation {
            decision: decided.decision,
            parts: decided.reservations,
            len: self.parts.len(),
        })
    }

    /// Settles `reservation` at what each part really cost: `actual[i]` for part `i` (a part
    /// with no entry cost what it reserved), each part as its limiter's
    /// [`settle`](super::RedisLimiter::settle) settles it: one script call per part whose
    /// cost changed. Every part is checked before any is settled.
    ///
    /// # Errors
    ///
    /// [`BackendError::Settle`] with [`SettleError::Refused`] for a refused reservation,
    /// [`SettleError::Parts`] for more costs than parts or a reservation of a `RedisAllOf`
    /// of another number of parts, [`SettleError::OtherLimiter`] or
    /// [`SettleError::OtherKey`] for one made by other parts: nothing is sent. When Redis
    /// cannot be reached, the error of the first part whose settle failed, once every other
    /// part was settled (a part whose settle failed keeps its permits spent, as its
    /// limiter's `settle` does).
    pub async fn settle(
        &self,
        reservation: RedisAllOfReservation,
        actual: &[u64],
    ) -> Result<(), BackendError> {
        let RedisAllOfReservation {
            decision,
            parts,
            len,
        } = reservation;
        if len != self.parts.len() || actual.len() > len {
            let given = if len == self.parts.len() {
                actual.len()
            } else {
                self.parts.len()
            };
            return Err(SettleError::Parts { parts: len, given }.into());
        }
        if !decision.is_allowed() {
            return Err(SettleError::Refused.into());
        }
        // Every part checked, holding permits or not: a reservation of other parts is
        // refused whole.
        for (part, reservation) in self.parts.iter().zip(&parts) {
            if let Some(reservation) = reservation {
                reservation.check_place(part.shared.origin(part.key))?;
            }
        }
        // Parts that hold nothing (a refusal shadow mode let through, a part a shadow-mode
        // `Local` failure policy let through, one the HTTP layer only spent) have nothing to
        // settle, as in `AllOf`.
        let held: Vec<Option<Reservation>> = parts
            .into_iter()
            .map(|r| r.filter(|r| r.held() > 0))
            .collect();
        let mut first = None;
        for (index, (part, reservation)) in self.parts.iter().zip(held).enumerate() {
            let Some(reservation) = reservation else {
                continue;
            };
            let actual = actual.get(index).copied().unwrap_or(reservation.held());
            if let Err(err) = part.shared.settle(part.key, reservation, actual).await {
                first.get_or_insert(err);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// As [`try_acquire`](RedisAllOf::try_acquire), or when some part is to be reserved
    /// (`reserve[i]` for part `i`) as [`reserve`](RedisAllOf::reserve) of those parts alone
    /// (the others spent, with no token left in Redis), with each part's own decision too:
    /// for the HTTP layer, whose fields report a rule's own budget and whose rules without a
    /// settle are never settled.
    #[cfg(feature = "tower")]
    pub(crate) async fn decide_each(
        &self,
        reserve: &[bool],
    ) -> Result<(Decided, Option<RedisAllOfReservation>), BackendError> {
        if !reserve.contains(&true) {
            return Ok((self.decide(PartsAsk::Acquire, None).await?, None));
        }
        let mut decided = self.decide(PartsAsk::Reserve, Some(reserve)).await?;
        let reservation = RedisAllOfReservation {
            decision: decided.decision,
            parts: std::mem::take(&mut decided.reservations),
            len: self.parts.len(),
        };
        Ok((decided, Some(reservation)))
    }

    /// Gives back every permit of `reservation`: [`settle`](RedisAllOf::settle) at 0 on every
    /// part.
    ///
    /// # Errors
    ///
    /// As [`settle`](RedisAllOf::settle).
    pub async fn cancel(&self, reservation: RedisAllOfReservation) -> Result<(), BackendError> {
        self.settle(reservation, &vec![0; self.parts.len()]).await
    }

    /// The decision of `ask` on every part, and when it is an admitted reservation each
    /// part's reservation (none otherwise); with `only`, only the parts it marks are
    /// reserved.
    async fn decide(&self, ask: PartsAsk, only: Option<&[bool]>) -> Result<Decided, BackendError> {
        let Some(first) = self.parts.first() else {
            return Ok(Decided::from(Tally::default(), Vec::new()));
        };
        // The policies set live first: a cost an old one refuses may be the new one's.
        for part in &self.parts {
            part.shared.read_live().await;
        }
        if let Err(error) = self.check() {
            // Refused as `AllOf` refuses a cost no state admits: never, with nothing sent.
            return Ok(Decided::refused(error.part(), error.error()));
        }
        let lead = first.shared;
        // Each part's policy: its limiter's, set live, or its resolver's answer for the key
        // (or the one its record names, when that was chosen later).
        let mut choices = self
            .parts
            .iter()
            .map(|part| part.shared.tier_of(part.key))
            .collect::<Result<Vec<_>, _>>()?;
        // Checked before anything is sent: the keys, and each cost against the policy it is
        // decided under now (the resolver may have answered another since `check`).
        self.keys(lead, &choices)?;
        for (index, (part, choice)) in self.parts.iter().zip(&choices).enumerate() {
            if let Err(error) = choice.tier.check_cost(part.cost) {
                return Ok(Decided::refused(index, error));
            }
        }
        // Where each part's reservation comes from and its serial number: the origin first,
        // as for one key (its count of resets must not be newer than the state decided on).
        let reserving: Vec<Option<(Origin, u64)>> = if ask == PartsAsk::Reserve {
            self.parts
                .iter()
                .enumerate()
                .map(|(index, part)| {
                    if only.is_some_and(|only| !only.get(index).copied().unwrap_or(false)) {
                        return None;
                    }
                    let origin = part.shared.origin(part.key);
                    // Relaxed: only uniqueness matters (see `Shared::reserve`).
                    let serial = part.shared.reservations.fetch_add(1, Ordering::Relaxed) + 1;
                    Some((origin, serial))
                })
                .collect()
        } else {
            Vec::new()
        };
        if !lead.breaker.should_try() {
            return self.fallback(&choices, ask, &reserving, BackendError::Unavailable);
        }
        let now_micros = lead.test_micros()?;
        // Each part's clock, read once: its answer's age is counted to here.
        let clocks: Vec<u64> = self.parts.iter().map(|p| p.shared.clock.now()).collect();
        // A peek reports each policy's own answer, as a limiter's `peek` does.
        let shadow: Vec<bool> = self
            .parts
            .iter()
            .map(|part| part.shared.shadow && ask != PartsAsk::Peek)
            .collect();
        // Moves and follows per part: each part's key may be moved or followed as one key's.
        let mut moves = vec![0; self.parts.len()];
        let reply = loop {
            let flags = (ask, shadow.as_slice(), (now_micros, clocks.as_slice()));
            let (keys, args) = self.call(lead, &choices, &reserving, flags)?;
            let call = lead.script.call(
                &keys,
                &args,
                &lead.counters.script_reloads,
                true,
                lead.timeout,
            );
            let failed = match Moved::reply(call.await) {
                Ok(reply) => match script::conflict(&reply) {
                    None => break reply,
                    // A part's state is under another policy: follow it, or move the state.
                    Some(conflict) => match conflict.part.filter(|&i| i < self.parts.len()) {
                        Some(index) if moves[index] < MAX_MOVES => {
                            moves[index] += 1;
                            let part = &self.parts[index];
                            let resolved = part
                                .shared
                                .resolve_conflict(
                                    part.key,
                                    conflict,
                                    &mut choices[index],
                                    part.cost,
                                    (now_micros, clocks[index]),
                                )
                                .await;
                            match resolved {
                                Ok(()) => continue,
                                Err(Moved::Other(BackendError::Cost(error))) => {
                                    // A cost the policy followed cannot admit: refused as
                                    // `AllOf` refuses it, with nothing spent.
                                    return Ok(Decided::refused(index, error));
                                }
                                Err(failed) => failed,
                            }
                        }
                        Some(index) => Moved::Other(kept_changing(self.parts[index].key)),
                        None => Moved::Other(BackendError::Reply(format!("{reply:?}"))),
                    },
                },
                Err(failed) => failed,
            };
            return match failed {
                Moved::Redis(err) if conn::is_unavailable(&err) => {
                    self.each_shared(|shared| bump(&shared.counters.unavailable));
                    self.failed(&choices, ask, &reserving, BackendError::Redis(err))
                }
                Moved::Redis(err) => {
                    // Redis answered: it is up, and the error is about this call.
                    self.each_shared(Shared::recovered);
                    Err(BackendError::Redis(err))
                }
                Moved::Timeout => {
                    self.each_shared(|shared| bump(&shared.counters.timeouts));
                    self.failed(
                        &choices,
                        ask,
                        &reserving,
                        BackendError::Timeout(lead.timeout),
                    )
                }
                Moved::Other(err) => {
                    self.each_shared(Shared::recovered);
                    Err(err)
                }
            };
        };
        let bands: Vec<usize> = choices.iter().map(|c| c.tier.bands.count()).collect();
        let reserve = ask == PartsAsk::Reserve;
        let (admitted, decided) = script::parts_decisions(&reply, &bands, &shadow, reserve)?;
        self.each_shared(Shared::recovered);
        let mut tally = Tally::default();
        let mut each = Vec::with_capacity(self.parts.len());
        let mut reservations = Vec::new();
        for (index, (part, (decision, marks))) in self.parts.iter().zip(decided).enumerate() {
            let shared = part.shared;
            bump(&shared.counters.redis_decisions);
            // Each limiter counts its part's own decision, and lets it through in shadow
            // mode (the script spent nothing for it).
            let decision = if ask == PartsAsk::Peek {
                decision
            } else {
                shared.finish(decision)
            };
            tally.decided(index, &decision, part.cost);
            each.push(decision);
            if !admitted || ask == PartsAsk::Peek {
                continue;
            }
            if let Some(cache) = &shared.cache {
                // An admission may lengthen a cached refusal of another cost.
                cache.remove(part.key);
            }
            if let Some(&reserved) = reserving.get(index) {
                let policy = &choices[index].tier.policy;
                reservations.push(reserved.map(|(origin, serial)| {
                    Reservation::new(decision, part.cost, marks, origin)
                        .with_token(serial)
                        .decided_under(Some(Box::new(*policy)))
                }));
            }
        }
        Ok(Decided {
            decision: tally.decision(),
            each,
            reservations,
            error: None,
        })
    }

    /// The keys and arguments of the call deciding `ask` on every part, each under its
    /// `choices` entry, in shadow mode where `shadow` says, reserved where `reserving` says,
    /// at the script's instant `now_micros` (each answer's age counted to its part's clock
    /// reading in `clocks`).
    fn call(
        &self,
        lead: &Shared,
        choices: &[Choice],
        reserving: &[Option<(Origin, u64)>],
        (ask, shadow, (now_micros, clocks)): (PartsAsk, &[bool], (Option<u64>, &[u64])),
    ) -> Result<(Vec<String>, Vec<String>), BackendError> {
        let band_keys = self.keys(lead, choices)?;
        let mut args = script::parts_args(now_micros, ask, self.parts.len());
        let mut keys = Vec::with_capacity(band_keys.len() + 2 * self.parts.len());
        let mut band_keys = band_keys.into_iter();
        for (index, part) in self.parts.iter().enumerate() {
            let (shared, choice) = (part.shared, &choices[index]);
            let recorded = shared
                .recorded()
                .then(|| (choice.tier.text.as_str(), choice.chosen.arg(clocks[index])));
            let bands = &choice.tier.bands;
            let tiered = recorded.is_some();
            bands.part_args(part.cost, shadow[index], recorded, &mut args);
            keys.extend(band_keys.by_ref().take(bands.count()));
            if tiered {
                keys.push(Bands::record_key(&shared.prefix, part.key));
            }
            match reserving.get(index) {
                Some(Some((_, serial))) => {
                    args.push(serial.to_string());
                    args.push(shared.instance.clone());
                    keys.push(Bands::reserve_key(&shared.prefix, part.key));
                }
                // Spent, not reserved: an empty serial, no token.
                Some(None) => args.extend([String::new(), String::new()]),
                None => {}
            }
        }
        Ok((keys, args))
    }

    /// Every part's Redis keys, part after part, once it is known one call on `lead`'s
    /// connection can decide them all.
    fn keys(&self, lead: &Shared, choices: &[Choice]) -> Result<Vec<String>, BackendError> {
        let mut keys: Vec<String> = Vec::new();
        let mut seen = HashSet::new();
        let cluster = matches!(lead.script.conn(), Conn::Cluster(_));
        for (part, each) in self.parts.iter().enumerate() {
            let shared = each.shared;
            if !shared.script.same_connection(&lead.script) {
                return Err(BackendError::OtherConnection { part });
            }
            // A record is named by prefix and key alone: two parts with records on one
            // prefix would take each other's.
            let record = shared
                .recorded()
                .then(|| Bands::record_key(&shared.prefix, each.key));
            if let Some(key) = record.filter(|key| !seen.insert(key.clone())) {
                return Err(BackendError::SharedKey { part, key });
            }
            for key in choices[part].tier.bands.keys(&shared.prefix, each.key) {
                if !seen.insert(key.clone()) {
                    return Err(BackendError::SharedKey { part, key });
                }
                if let Some(first) = keys.first().filter(|_| cluster) {
                    if Slot::for_key(&key) != Slot::for_key(first) {
                        let first = first.clone();
                        return Err(BackendError::CrossSlot { part, key, first });
                    }
                }
                keys.push(key);
            }
        }
        Ok(keys)
    }

    /// Runs `f` on each part's limiter's shared state, once per limiter.
    fn each_shared(&self, mut f: impl FnMut(&Shared)) {
        for (index, part) in self.parts.iter().enumerate() {
            let repeated = self.parts[..index]
                .iter()
                .any(|earlier| std::ptr::eq(earlier.shared, part.shared));
            if !repeated {
                f(part.shared);
            }
        }
    }

    /// The call failed with `err`: every part's limiter switches to its failure policy, and
    /// the failure policies decide.
    fn failed(
        &self,
        tiers: &[Choice],
        ask: PartsAsk,
        reserving: &[Option<(Origin, u64)>],
        err: BackendError,
    ) -> Result<Decided, BackendError> {
        self.each_shared(|shared| shared.switch_to_failure(&err));
        self.fallback(tiers, ask, reserving, err)
    }

    /// Each part decided by its limiter's failure policy, all or nothing (see the type's
    /// docs); `err` for a part whose policy is `Error`. An admitted reservation's parts hold
    /// nothing in Redis: settling them changes nothing there (a `Local` limiter keeps its
    /// permits spent), as for one key.
    fn fallback(
        &self,
        tiers: &[Choice],
        ask: PartsAsk,
        reserving: &[Option<(Origin, u64)>],
        err: BackendError,
    ) -> Result<Decided, BackendError> {
        let error = self
            .parts
            .iter()
            .any(|part| matches!(part.shared.failure, FailurePolicy::Error));
        if error {
            // Counted as the failure policy's decision, as for one key.
            self.each_shared(|shared| bump(&shared.counters.failure_decisions));
            return Err(err);
        }
        // What part `index`'s failure policy decides: by its `Local` limiter, taking (a
        // reservation, when `take`) or only looking.
        let decide = |index: usize, take: bool| {
            let part = &self.parts[index];
            let shared = part.shared;
            bump(&shared.counters.failure_decisions);
            let decided = match &shared.failure {
                FailurePolicy::Local(local) if take => match local.reserve_n(part.key, part.cost) {
                    Ok(reservation) => {
                        let decision = reservation.decision();
                        (decision, decision.is_allowed().then_some(reservation))
                    }
                    // A cost the local policy cannot admit.
                    Err(_) => (shared.fallback_refusal(&tiers[index].tier), None),
                },
                FailurePolicy::Local(local) => {
                    let peeked = local.peek_n(part.key, part.cost);
                    (
                        peeked.unwrap_or_else(|_| shared.fallback_refusal(&tiers[index].tier)),
                        None,
                    )
                }
                FailurePolicy::Closed => (shared.fallback_refusal(&tiers[index].tier), None),
                // Reading no state, an `Open` part reports its whole limit left, so that a
                // part that does read one (a `Local` limiter) gives the answer. `Error`
                // returned above.
                FailurePolicy::Open | FailurePolicy::Error => {
                    let limit = tiers[index].tier.policy.first_band().permits();
                    (Decision::allow(limit, limit, 0), None)
                }
            };
            // A part taken is a request of its limiter: counted, and shadowed. A part looked
            // at stands in for one (after a refusal, or in a peek): shadowed, not counted.
            let (decision, held) = decided;
            let decision = if take {
                shared.finish(decision)
            } else if shared.shadow {
                decision.shadowed()
            } else {
                decision
            };
            Ok::<_, Infallible>((decision, held))
        };
        let peek = ask == PartsAsk::Peek;
        let Ok(in_order) = take_in_order(
            self.parts.len(),
            |index| decide(index, !peek).map(|(d, held)| (d, self.parts[index].cost, held)),
            |index| decide(index, false).map(|(d, _)| (d, self.parts[index].cost)),
            |index, reservation| {
                let part = &self.parts[index];
                if let FailurePolicy::Local(local) = &part.shared.failure {
                    // A refund of what was just taken, on the limiter that took it: only a
                    // reset or policy change in between can void it, as for any reservation.
                    let _ = local.cancel(part.key, reservation);
                }
            },
        );
        let (tally, decisions) = (in_order.tally, in_order.decisions);
        if !tally.decision().is_allowed() {
            return Ok(Decided::from(tally, decisions));
        }
        let reservations = self
            .parts
            .iter()
            .zip(&decisions)
            .zip(reserving)
            .map(|((part, &decision), reserved)| {
                reserved.map(|(origin, serial)| {
                    Reservation::new(decision, part.cost, NOT_IN_REDIS, origin).with_token(serial)
                })
            })
            .collect();
        Ok(Decided {
            decision: tally.decision(),
            each: decisions,
            reservations,
            error: None,
        })
    }
}

/// What the parts decided: the whole's decision, each part's own (none when a cost was
/// refused before anything was sent), and for an admitted reservation each part's.
pub(crate) struct Decided {
    pub(crate) decision: Decision,
    #[cfg_attr(
        not(feature = "tower"),
        allow(dead_code, reason = "read by the HTTP layer's fields")
    )]
    pub(crate) each: Vec<Decision>,
    /// Each part's reservation (`None` for a part only spent); none at all unless admitted.
    reservations: Vec<Option<Reservation>>,
    /// The part whose cost its policy cannot admit, and why (then `each` is empty).
    #[cfg_attr(
        not(feature = "tower"),
        allow(
            dead_code,
            reason = "read by the HTTP layer, which answers it as a bad cost"
        )
    )]
    pub(crate) error: Option<(usize, CostError)>,
}

impl Decided {
    /// The decision `tally` makes, with each part's own (`each`) and no reservation.
    fn from(tally: Tally, each: Vec<Decision>) -> Self {
        Decided {
            decision: tally.decision(),
            each,
            reservations: Vec::new(),
            error: tally.error(),
        }
    }

    /// Refused for part `index`'s cost, which its policy cannot admit (`error`), with
    /// nothing spent.
    fn refused(index: usize, error: CostError) -> Self {
        let mut tally = Tally::default();
        tally.failed(index, error);
        Decided::from(tally, Vec::new())
    }
}

/// The permits a [`RedisAllOf::reserve`] took on every part, until
/// [`RedisAllOf::settle`] or [`RedisAllOf::cancel`]; dropped unsettled, they stay spent.
#[must_use = "a RedisAllOfReservation holds permits until it is settled or cancelled"]
#[derive(Debug)]
pub struct RedisAllOfReservation {
    decision: Decision,
    /// Each part's reservation, in the order added (`None` for a part only spent); none when
    /// refused.
    parts: Vec<Option<Reservation>>,
    /// How many parts its `RedisAllOf` had.
    len: usize,
}

impl RedisAllOfReservation {
    /// The decision, as [`RedisAllOf::try_acquire`] would have made it.
    pub const fn decision(&self) -> Decision {
        self.decision
    }
}

impl fmt::Debug for RedisAllOf<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut list = f.debug_list();
        for part in &self.parts {
            list.entry(&format_args!(
                "{:?} {:?} x{}{}",
                part.shared.prefix,
                part.key,
                part.cost,
                part.name.map_or(String::new(), |name| format!(" ({name})"))
            ));
        }
        list.finish()
    }
}
