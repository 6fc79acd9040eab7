//! Per-key policies on Redis: a [`Tier`] (one policy as the scripts take it, with the text a
//! key's record names it by), a [`Choice`] (a tier and when it was chosen), and [`Tiers`],
//! the resolver that picks each key's tier and this instance's cache of its answers, bounded
//! and expiring.
//!
//! A key's state in Redis remembers the policy it was made under: a record next to it,
//! `<prefix>:{<key>}:policy`, holds that policy's text and when it was chosen, on the
//! script's clock. A request names its tier and when it was chosen; when the record names
//! another, the script decides nothing and returns the record: a choice made later moves the
//! key to its tier first, carrying the permits in use, an earlier one is decided under the
//! record's tier, which this instance then keeps following for the key until it asks its
//! resolver again (`lua/record.lua`). A resolver's answer dates from when it last changed here, not
//! from when it was last asked again: servers whose answers differ for a while agree on the
//! one that changed last, and a key moves once per change, not once per renewal.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::clock::Clock;
use crate::error::CostError;
use crate::policy::Policy;

use super::error::BackendError;
use super::script::Bands;

/// One policy as the scripts take it.
#[derive(Debug)]
pub(super) struct Tier {
    pub(super) policy: Policy,
    pub(super) bands: Bands,
    /// What a key's record holds for it: each band in its plain form (`"10/s burst 100"` is
    /// `"token-bucket 100/10s"`), so that equal policies have one text, and it parses back.
    pub(super) text: String,
}

impl Tier {
    /// `policy` as the scripts take it.
    ///
    /// # Errors
    ///
    /// [`BackendError::UnsupportedPolicy`] for a band the scripts cannot decide.
    pub(super) fn new(policy: Policy) -> Result<Self, BackendError> {
        let text = policy
            .bands()
            .map(|band| band.plain().to_string())
            .collect::<Vec<_>>()
            .join(" & ");
        Ok(Tier {
            bands: Bands::new(&policy)?,
            text,
            policy,
        })
    }

    /// The tier a key's record names (`text`, as [`Tier::new`] wrote it).
    ///
    /// # Errors
    ///
    /// [`BackendError::Reply`] for a record that is no policy.
    pub(super) fn recorded(text: &str) -> Result<Self, BackendError> {
        let policy: Policy = text
            .parse()
            .map_err(|err| BackendError::Reply(format!("a key's policy record `{text}`: {err}")))?;
        Tier::new(policy)
    }

    /// `n` as a request's cost: at least 1, at most the smallest band's permits.
    pub(super) fn check_cost(&self, n: u64) -> Result<(), CostError> {
        CostError::nonzero(n)?;
        CostError::within(n, self.policy.max_cost())
    }
}

/// A key's policy chosen by the caller.
pub(super) type Resolver = Arc<dyn Fn(&str) -> Policy + Send + Sync>;

/// When a choice of policy was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Chosen {
    /// At this instant of the script's clock (Redis `TIME`, or the test clock), in
    /// microseconds: the builder's policy (0, before any other), a policy set live, a
    /// record's.
    At(u64),
    /// At this reading of this instance's clock, in nanoseconds: a resolver's answer, sent as
    /// its age, which the script dates on its own clock (servers' clocks need not agree).
    Since(u64),
}

impl Chosen {
    /// The script's argument for it at `now` (this instance's clock): the instant, or `-` and
    /// the age in microseconds (`lua/record.lua`, `chosen_at`).
    pub(super) fn arg(self, now: u64) -> String {
        match self {
            Chosen::At(micros) => micros.to_string(),
            Chosen::Since(since) => format!("-{}", now.saturating_sub(since) / 1_000),
        }
    }
}

/// The tier a request is decided under, and when it was chosen.
#[derive(Clone, Debug)]
pub(super) struct Choice {
    pub(super) tier: Arc<Tier>,
    pub(super) chosen: Chosen,
}

/// The resolver and this instance's cache of its answers.
pub(super) struct Tiers {
    resolver: Resolver,
    /// How long an answer is used before the resolver is asked again.
    ttl: Duration,
    /// At most this many keys' answers are cached.
    max_keys: usize,
    cache: Mutex<HashMap<String, Cached>>,
}

/// A cached answer.
struct Cached {
    /// The resolver's answer, dated from when it last changed here.
    own: Choice,
    /// A policy chosen later elsewhere, which the key's record named: followed until the
    /// resolver is asked again.
    follow: Option<Choice>,
    /// The clock reading (ns) until which the answer is used without asking again.
    until: u64,
}

impl Cached {
    fn choice(&self) -> Choice {
        self.follow.clone().unwrap_or_else(|| self.own.clone())
    }
}

impl Tiers {
    pub(super) fn new(resolver: Resolver, max_keys: usize, ttl: Duration) -> Self {
        Tiers {
            resolver,
            ttl,
            max_keys,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// `key`'s tier at `clock`'s now: the cached answer (or the policy it follows) while it
    /// is fresh, else the resolver's (then cached), with whether the answer may have changed
    /// here: a different answer, or one with none to compare with (a key new here, or whose
    /// answer was dropped to make room, or forgotten by a reset). An
    /// answer equal to the one it renews keeps its date, and follows nothing until a record
    /// says to again.
    ///
    /// # Errors
    ///
    /// [`BackendError::UnsupportedPolicy`] when the resolver answers a policy the scripts
    /// cannot decide (nothing is cached).
    pub(super) fn tier(
        &self,
        key: &str,
        clock: &dyn Clock,
    ) -> Result<(Choice, bool), BackendError> {
        let now = clock.now();
        let before = match self.cache().get(key) {
            Some(cached) if now < cached.until => return Ok((cached.choice(), false)),
            Some(cached) => Some(cached.own.clone()),
            None => None,
        };
        // Asked with no lock held: a slow resolver holds up its own request only.
        let policy = (self.resolver)(key);
        let (own, changed) = match before {
            // The same answer keeps its date. What it followed is dropped and looked at again
            // (the record may have moved on, or gone with a reset): one call per key more.
            Some(own) if own.tier.policy == policy => (own, false),
            _ => {
                let own = Choice {
                    tier: Arc::new(Tier::new(policy)?),
                    chosen: Chosen::Since(now),
                };
                (own, true)
            }
        };
        let ttl = u64::try_from(self.ttl.as_nanos()).unwrap_or(u64::MAX);
        let cached = Cached {
            own,
            follow: None,
            until: now.saturating_add(ttl),
        };
        let choice = cached.choice();
        let mut cache = self.cache();
        if cache.len() >= self.max_keys && !cache.contains_key(key) {
            make_room(&mut cache, self.max_keys, now);
        }
        cache.insert(key.to_owned(), cached);
        Ok((choice, changed))
    }

    /// Follows `choice`, a policy chosen later elsewhere that `key`'s record names, until the
    /// resolver is asked again for `key`, if `key` is still decided under `used` (the choice
    /// the request that met the record was decided under): an answer renewed meanwhile,
    /// dated later, is not overruled by what an older request met.
    pub(super) fn follow(&self, key: &str, choice: Choice, used: &Choice) {
        if let Some(cached) = self.cache().get_mut(key) {
            let current = cached.choice();
            if Arc::ptr_eq(&current.tier, &used.tier) && current.chosen == used.chosen {
                cached.follow = Some(choice);
            }
        }
    }

    /// Forgets `key`'s answer: its next request asks the resolver.
    pub(super) fn forget(&self, key: &str) {
        self.cache().remove(key);
    }

    fn cache(&self) -> std::sync::MutexGuard<'_, HashMap<String, Cached>> {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Makes room in a full cache: drops the expired answers, and if that leaves it more than
/// three quarters full, arbitrary ones down to three quarters (at least one fewer than the
/// bound), so that the next inserts find room at once (constant work per insert, amortized).
fn make_room(cache: &mut HashMap<String, Cached>, max_keys: usize, now: u64) {
    cache.retain(|_, cached| now < cached.until);
    let keep = max_keys - (max_keys / 4).max(1);
    if cache.len() > keep {
        let excess: Vec<String> = cache.keys().take(cache.len() - keep).cloned().collect();
        for key in excess {
            cache.remove(&key);
        }
    }
}

impl fmt::Debug for Tiers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tiers")
            .field("ttl", &self.ttl)
            .field("max_keys", &self.max_keys)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::clock::FakeClock;

    fn tiers(max_keys: usize, asked: &Arc<AtomicU64>) -> Tiers {
        let asked = Arc::clone(asked);
        let resolver: Resolver = Arc::new(move |key: &str| {
            let n = asked.fetch_add(1, Ordering::Relaxed);
            let permits = if key.starts_with("vip") {
                100
            } else {
                10 + (n / 2) % 2
            };
            format!("{permits}/1s").parse().unwrap()
        });
        Tiers::new(resolver, max_keys, Duration::from_secs(60))
    }

    /// An answer is used until its time to live ends; then the resolver is asked again: the
    /// same answer keeps its date and follows nothing until a record says to again, a
    /// different one is dated anew and says the key changed tier. A follow is set only while
    /// the key is decided under the choice the request used.
    #[test]
    fn answers_are_cached_for_their_time_to_live() {
        let asked = Arc::new(AtomicU64::new(0));
        let tiers = tiers(10, &asked);
        let clock = FakeClock::new();
        clock.set(Duration::from_secs(1));
        let (first, changed) = tiers.tier("a", &clock).unwrap();
        assert!(
            changed,
            "a key new here: nothing to compare its answer with"
        );
        assert_eq!(first.tier.policy.first_band().permits(), 10);
        assert_eq!(first.chosen, Chosen::Since(1_000_000_000));
        let other = Choice {
            tier: Arc::new(Tier::new("3/1s".parse().unwrap()).unwrap()),
            chosen: Chosen::At(7),
        };
        let stale = Choice {
            tier: Arc::clone(&other.tier),
            chosen: Chosen::At(1),
        };
        tiers.follow("a", other.clone(), &stale);
        // The same tier, dated otherwise: not what the key is decided under either.
        let redated = Choice {
            tier: Arc::clone(&first.tier),
            chosen: Chosen::At(99),
        };
        tiers.follow("a", other.clone(), &redated);
        let now = tiers.tier("a", &clock).unwrap().0;
        assert_eq!(now.chosen, first.chosen, "not decided under what was used");
        tiers.follow("a", other, &first);
        clock.advance(Duration::from_secs(59));
        let (again, changed) = tiers.tier("a", &clock).unwrap();
        assert!(!changed);
        assert_eq!(
            (again.tier.text.as_str(), again.chosen),
            ("token-bucket 3/1s", Chosen::At(7))
        );
        assert_eq!(asked.load(Ordering::Relaxed), 1);
        clock.advance(Duration::from_secs(1));
        let (renewed, changed) = tiers.tier("a", &clock).unwrap();
        assert!(!changed, "the same answer: 10/s");
        assert_eq!(
            renewed.chosen, first.chosen,
            "its own again, dated as before"
        );
        clock.advance(Duration::from_secs(60));
        let (next, changed) = tiers.tier("a", &clock).unwrap();
        assert!(changed, "10/s then 11/s");
        assert_eq!(next.tier.policy.first_band().permits(), 11);
        assert_eq!(next.tier.text, "token-bucket 11/1s");
        assert_eq!(next.chosen, Chosen::Since(121_000_000_000));
        assert_eq!(asked.load(Ordering::Relaxed), 3);
        tiers.forget("a");
        let (_, changed) = tiers.tier("a", &clock).unwrap();
        assert!(
            changed,
            "a forgotten key has no answer to compare with: what was cached for it goes"
        );
        assert_eq!(Chosen::Since(1_000).arg(5_000_000), "-4999");
        assert_eq!(Chosen::At(42).arg(5_000_000), "42");
    }

    /// A full cache drops expired answers first, and arbitrary ones only down to three
    /// quarters of its bound (at least one below it); one that is not full drops nothing.
    #[test]
    fn room_is_made_from_expired_answers_first() {
        let asked = Arc::new(AtomicU64::new(0));
        let tiers = tiers(8, &asked);
        let clock = FakeClock::new();
        for i in 0..4 {
            tiers.tier(&format!("vip-old-{i}"), &clock).unwrap();
        }
        // Exactly the time to live: expired.
        clock.advance(Duration::from_secs(60));
        // Renewing one answer in a cache that is not full keeps the expired others.
        tiers.tier("vip-old-0", &clock).unwrap();
        assert_eq!(tiers.cache().len(), 4);
        for i in 0..4 {
            tiers.tier(&format!("vip-new-{i}"), &clock).unwrap();
        }
        assert_eq!(tiers.cache().len(), 8);
        // Full: the three expired answers go, and nothing else.
        tiers.tier("vip-new-4", &clock).unwrap();
        assert_eq!(tiers.cache().len(), 6);
        let before = asked.load(Ordering::Relaxed);
        tiers.tier("vip-old-0", &clock).unwrap();
        for i in 0..5 {
            tiers.tier(&format!("vip-new-{i}"), &clock).unwrap();
        }
        assert_eq!(
            asked.load(Ordering::Relaxed),
            before,
            "the fresh answers stayed"
        );
        // Full of fresh answers: arbitrary ones go, down to 6, and the new one comes in.
        tiers.tier("vip-new-5", &clock).unwrap();
        tiers.tier("vip-new-6", &clock).unwrap();
        assert_eq!(tiers.cache().len(), 8);
        tiers.tier("vip-new-7", &clock).unwrap();
        assert_eq!(tiers.cache().len(), 7);
        assert!(format!("{tiers:?}").contains("max_keys: 8"));
    }

    /// The cache never holds more than its bound, whatever the bound, and a full one keeps
    /// answering.
    #[test]
    fn the_cache_is_bounded() {
        for bound in [1, 2, 3, 8] {
            let asked = Arc::new(AtomicU64::new(0));
            let tiers = tiers(bound, &asked);
            let clock = FakeClock::new();
            for i in 0..100 {
                tiers.tier(&format!("vip-{i}"), &clock).unwrap();
                let len = tiers.cache().len();
                assert!(len <= bound, "{len} cached, bound {bound}");
            }
            assert_eq!(asked.load(Ordering::Relaxed), 100);
        }
    }

    /// A record parses back to the tier that wrote it, equal policies written differently
    /// have one text, and a record that is no policy is a reply error.
    #[test]
    fn records_parse_back() {
        let policy: Policy = "10/s burst 100 & sliding-log 5/1min".parse().unwrap();
        let tier = Tier::new(policy).unwrap();
        assert_eq!(tier.text, "token-bucket 100/10s & sliding-log 5/1m");
        assert_eq!(Tier::recorded(&tier.text).unwrap().policy, policy);
        let same = Tier::new("100/10s & sliding-log 5/1min".parse().unwrap()).unwrap();
        assert_eq!(same.text, tier.text);
        assert!(matches!(
            Tier::recorded("ten a second"),
            Err(BackendError::Reply(_))
        ));
    }
}
