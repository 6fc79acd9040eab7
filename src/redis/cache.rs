//! The local deny cache: refusals from Redis, replayed locally until their retry_after.
//!
//! # Why it never admits anything Redis would refuse, and refuses only what Redis would
//!
//! The cache only ever answers with a refusal; every admission still comes from the Redis
//! script, so the cache cannot let anything through that Redis would refuse. It also refuses
//! only what Redis would refuse at that moment, and says so with Redis's own retry_after:
//!
//! * Redis refused a request of cost `c` at its instant `t0` with `retry_after` `r`: `t0 + r`
//!   is the first instant at which that request fits *if nothing else is admitted
//!   meanwhile*. With nothing admitted, a key's availability never shrinks as time passes
//!   (debts drain, entries leave, counts roll out), so the request is refused at every
//!   instant before `t0 + r`, and at each of them Redis would report the same retry instant
//!   `t0 + r` and the same reset instant. Admissions by any server only shrink
//!   availability: they can make Redis refuse for longer, never shorter.
//! * The cache answers only requests of the same cost `c` (a peek counts as cost 1), and only
//!   before `sent + r`, where `sent` was read before the request was sent, so `sent <= t0`
//!   in real time.
//! * Redis counts in whole microseconds (TIME truncated), so the deadline is pulled in by
//!   one microsecond, and by one part in a thousand of `r` for any difference between the
//!   rates of the local monotonic clock and Redis's clock. With an injected test clock (one
//!   clock for both) the deadline is exact: `sent + r`.
//!
//! A cached refusal reports `retry_after` and `reset_after` counted down to the instants Redis
//! gave, and the refusal's `remaining` and `limit` (what was available at `t0`: a lower bound
//! of what is available now; for a composite policy, the band that had least then). An admission of the key through this limiter (of another cost) drops its
//! cached refusal, since it may have lengthened it; admissions through other servers are
//! not seen, so their refusals may then report a shorter wait than Redis would now (Redis's
//! own retry_after carries the same caveat: "if nothing else is admitted meanwhile"). `tests/redis.rs` checks each cached refusal against Redis's own answer at
//! the same instant.

use scc::HashMap;

use crate::{Decision, KeyHasher};

/// One cached refusal.
#[derive(Clone, Copy, Debug)]
struct Refusal {
    /// The clock reading (ns) from which Redis may admit again.
    until: u64,
    /// The clock reading (ns) at which the key's state is at rest.
    reset_at: u64,
    /// The refused cost: the refusal answers requests of this cost only.
    cost: u64,
    /// What the refusal reported as available.
    remaining: u64,
    /// The refusal's limit.
    limit: u64,
}

/// Refusals by key, bounded in size.
#[derive(Debug)]
pub(crate) struct DenyCache {
    map: HashMap<Box<str>, Refusal, KeyHasher>,
    capacity: usize,
    /// `true` when the clock is the script's own (an injected test clock): exact deadlines.
    exact: bool,
}

impl DenyCache {
    pub(crate) fn new(capacity: usize, exact: bool) -> Self {
        DenyCache {
            map: HashMap::with_hasher(KeyHasher::default()),
            capacity,
            exact,
        }
    }

    /// The cached refusal of a request of `cost` for `key` at `now`, if one covers it.
    pub(crate) fn check(&self, key: &str, cost: u64, now: u64) -> Option<Decision> {
        let refusal = self.map.read_sync(key, |_, refusal| *refusal)?;
        if now >= refusal.until {
            // Expired: forget it (unless a newer refusal replaced it meanwhile).
            self.map.remove_if_sync(key, |r| now >= r.until);
            return None;
        }
        (cost == refusal.cost).then(|| {
            Decision::deny(
                refusal.remaining,
                refusal.limit,
                refusal.until - now,
                refusal.reset_at.saturating_sub(now),
            )
        })
    }

    /// Remembers Redis's `refusal` of a request of `cost` for `key`, sent at `sent`.
    pub(crate) fn insert(&self, key: &str, cost: u64, sent: u64, refusal: &Decision) {
        let retry = refusal.retry_after_nanos();
        let margin = if self.exact { 0 } else { retry / 1_000 + 1_000 };
        let until = sent.saturating_add(retry.saturating_sub(margin));
        if until <= sent {
            return;
        }
        if self.map.len() >= self.capacity {
            // Full: drop what has expired; if that frees nothing, do not cache.
            self.map.retain_sync(|_, r| r.until > sent);
            if self.map.len() >= self.capacity {
                return;
            }
        }
        let reset = u64::try_from(refusal.reset_after().as_nanos()).unwrap_or(u64::MAX);
        self.map.upsert_sync(
            key.into(),
            Refusal {
                until,
                reset_at: sent.saturating_add(reset),
                cost,
                remaining: refusal.remaining(),
                limit: refusal.limit(),
            },
        );
    }

    /// Forgets `key`'s refusal.
    pub(crate) fn remove(&self, key: &str) {
        self.map.remove_sync(key);
    }
}
