//! Per-key policies on Redis: a [`Tier`] (one policy as the scripts take it, with the text a
//! key's record names it by) and [`Tiers`], the resolver that picks each key's tier and this
//! instance's cache of its answers, bounded and expiring.
//!
//! A key's state in Redis remembers the policy it was made under: a record next to it,
//! `<prefix>:{<key>}:policy`, holds that policy's text and when a resolver chose it. A
//! request names its tier and when it was chosen ([`Choice`]); when the record names
//! another (the resolver's answer changed, here or on another server), the script decides
//! nothing and returns the record: a newer choice moves the key to its tier first, carrying
//! the permits in use, an older one is decided under the record's tier (`lua/record.lua`).
//! So servers whose answers differ for a while (each caches its own) agree on the newest.

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
    /// What a key's record holds for it: the policy as it parses back.
    pub(super) text: String,
}

impl Tier {
    /// `policy` as the scripts take it.
    ///
    /// # Errors
    ///
    /// [`BackendError::UnsupportedPolicy`] for a band the scripts cannot decide.
    pub(super) fn new(policy: Policy) -> Result<Self, BackendError> {
        Ok(Tier {
            bands: Bands::new(&policy)?,
            text: policy.to_string(),
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

/// The tier a request is decided under, and when a resolver chose it (microseconds since the
/// Unix epoch, or on the test clock; 0 without a resolver, or for a settle, which is never
/// checked against the record).
#[derive(Clone, Debug)]
pub(super) struct Choice {
    pub(super) tier: Arc<Tier>,
    pub(super) chosen: u64,
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

/// A cached answer: the tier, when it was chosen, and until when (clock nanoseconds) it is
/// used.
struct Cached {
    choice: Choice,
    until: u64,
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

    /// `key`'s tier at `clock`'s now: the cached answer while it is fresh, else the
    /// resolver's, chosen at `chosen` (then cached), with whether it differs from the answer
    /// it replaced (the key changed tier here).
    ///
    /// # Errors
    ///
    /// [`BackendError::UnsupportedPolicy`] when the resolver answers a policy the scripts
    /// cannot decide (nothing is cached).
    pub(super) fn tier(
        &self,
        key: &str,
        clock: &dyn Clock,
        chosen: u64,
    ) -> Result<(Choice, bool), BackendError> {
        let now = clock.now();
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        let before = match cache.get(key) {
            Some(cached) if now < cached.until => return Ok((cached.choice.clone(), false)),
            Some(cached) => Some(Arc::clone(&cached.choice.tier)),
            None => None,
        };
        // The resolver runs under the lock: it is the caller's quick choice of a policy (a
        // lookup), and a key is then resolved once however many requests ask at once.
        let policy = (self.resolver)(key);
        let tier = match &before {
            Some(before) if before.policy == policy => Arc::clone(before),
            _ => Arc::new(Tier::new(policy)?),
        };
        let changed = before.is_some_and(|before| before.policy != policy);
        if cache.len() >= self.max_keys && !cache.contains_key(key) {
            make_room(&mut cache, self.max_keys, now);
        }
        let ttl = u64::try_from(self.ttl.as_nanos()).unwrap_or(u64::MAX);
        let choice = Choice { tier, chosen };
        cache.insert(
            key.to_owned(),
            Cached {
                choice: choice.clone(),
                until: now.saturating_add(ttl),
            },
        );
        Ok((choice, changed))
    }

    /// Forgets `key`'s answer: its next request asks the resolver.
    pub(super) fn forget(&self, key: &str) {
        self.cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
    }
}

/// Makes room in a full cache: drops the expired answers, and if that leaves it more than
/// three quarters full, arbitrary ones down to three quarters, so that the next quarter of
/// inserts find room at once (constant work per insert, amortized).
fn make_room(cache: &mut HashMap<String, Cached>, max_keys: usize, now: u64) {
    cache.retain(|_, cached| now < cached.until);
    let keep = max_keys - max_keys / 4;
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
                10 + n % 2
            };
            format!("{permits}/1s").parse().unwrap()
        });
        Tiers::new(resolver, max_keys, Duration::from_secs(60))
    }

    /// An answer is used until its time to live ends; then the resolver is asked again, and
    /// a different answer says the key changed tier.
    #[test]
    fn answers_are_cached_for_their_time_to_live() {
        let asked = Arc::new(AtomicU64::new(0));
        let tiers = tiers(10, &asked);
        let clock = FakeClock::new();
        let (first, changed) = tiers.tier("a", &clock, 1).unwrap();
        assert!(!changed);
        assert_eq!(first.tier.policy.first_band().permits(), 10);
        clock.advance(Duration::from_secs(59));
        let (again, changed) = tiers.tier("a", &clock, 2).unwrap();
        assert!(!changed && Arc::ptr_eq(&first.tier, &again.tier));
        assert_eq!(again.chosen, 1, "chosen when the resolver answered");
        assert_eq!(asked.load(Ordering::Relaxed), 1);
        clock.advance(Duration::from_secs(1));
        let (next, changed) = tiers.tier("a", &clock, 3).unwrap();
        assert!(changed, "10/s then 11/s");
        assert_eq!(next.tier.policy.first_band().permits(), 11);
        assert_eq!(next.tier.text, "token-bucket 11/1s");
        assert_eq!(next.chosen, 3);
        assert_eq!(asked.load(Ordering::Relaxed), 2);
        tiers.forget("a");
        let (_, changed) = tiers.tier("a", &clock, 4).unwrap();
        assert!(!changed, "a forgotten key has no answer to differ from");
    }

    /// The cache never holds more than its bound, and a full one keeps answering.
    #[test]
    fn the_cache_is_bounded() {
        let asked = Arc::new(AtomicU64::new(0));
        let tiers = tiers(8, &asked);
        let clock = FakeClock::new();
        for i in 0..100 {
            tiers.tier(&format!("vip-{i}"), &clock, i).unwrap();
            let len = tiers.cache.lock().unwrap().len();
            assert!(len <= 8, "{len} cached");
        }
        assert_eq!(asked.load(Ordering::Relaxed), 100);
    }

    /// A record parses back to the tier that wrote it, and a record that is no policy is a
    /// reply error.
    #[test]
    fn records_parse_back() {
        let policy: Policy = "10/s burst 100 & sliding-log 5/1min".parse().unwrap();
        let tier = Tier::new(policy).unwrap();
        assert_eq!(Tier::recorded(&tier.text).unwrap().policy, policy);
        assert!(matches!(
            Tier::recorded("ten a second"),
            Err(BackendError::Reply(_))
        ));
    }
}
