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
//! own retry_after carries the same caveat: "if nothing else is admitted meanwhile"). `tests/redis/standalone.rs` checks each cached refusal against Redis's own answer at
//! the same instant.
//!
//! A settled reservation that gives permits back is the one write that makes a key's
//! availability grow: through this limiter it is handled as a reset is (the key forgotten,
//! and every refusal already on its way kept out, see [`DenyCache::forget`]); through other
//! servers it is not seen, and their cached refusals of the key may refuse until their
//! deadline what Redis would now admit, as after another server's reset.

//!
//! # Bounded, with constant work per refusal
//!
//! The cache holds at most `capacity` refusals. Besides the map it keeps a queue of the
//! refusals in the order they were cached, at most `capacity` long, each naming its key and
//! the sequence number the refusal was stored with. An entry leaves the map by one of two
//! rules only:
//!
//! * **Expired**: a lookup at or after its deadline removes it (it no longer refuses anything).
//! * **Making room**: an insert into a full queue first takes the oldest item off it and
//!   removes that key's entry if it is still the refusal the item was queued for (same
//!   sequence number). A key since re-cached has a newer item further back; a key since
//!   removed has none: either way the stale item frees its slot and nothing else.
//!
//! Every entry in the map has its item in the queue, so the map never holds more entries than
//! the queue has items, nor more than `capacity`; and an insert visits at most one queued
//! item, whatever the cache holds. Dropping a refusal before its deadline is always sound:
//! the cache never admits, so the key's next request simply goes to Redis, which refuses it.

use std::collections::VecDeque;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex, PoisonError};

use scc::HashMap;

use crate::decision::Decision;
use crate::keys::KeyHasher;

/// One cached refusal.
#[derive(Clone, Copy, Debug)]
struct Refusal {
    /// The clock reading (ns) at which the refused request was sent.
    sent: u64,
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
    /// Which insert stored it: its item in the queue carries the same number.
    seq: u64,
}

/// The refusals in the order they were cached (see the module's docs).
#[derive(Debug)]
struct Order {
    /// Each cached refusal's key and sequence number, oldest first; some items are stale
    /// (their key was since removed or cached again).
    queue: VecDeque<(Arc<str>, u64)>,
    /// The next insert's sequence number.
    next: u64,
    /// How many times [`DenyCache::forget`] has run, per stripe of keys (by their hash): a
    /// refusal read from Redis under an older count of its key's stripe may predate a reset
    /// or a refund of that key and is not cached (see [`DenyCache::ticket`]). Striped, so
    /// that a stream of refunds on some keys does not keep every other key's refusals out.
    resets: [u64; STRIPES],
}

/// How many stripes of keys [`Order::resets`] counts apart.
const STRIPES: usize = 64;

/// Refusals by key, bounded in size.
#[derive(Debug)]
pub(super) struct DenyCache {
    map: HashMap<Arc<str>, Refusal, KeyHasher>,
    /// Picks a key's stripe of [`Order::resets`].
    stripes: KeyHasher,
    /// Taken by inserts, tickets and resets, once per round trip to Redis; lookups read the
    /// map alone.
    order: Mutex<Order>,
    capacity: usize,
    /// `true` when the clock is the script's own (an injected test clock): exact deadlines.
    exact: bool,
    /// Queued items taken off to make room, for tests to bound eviction's work.
    #[cfg(test)]
    evicted: std::sync::atomic::AtomicUsize,
}

impl DenyCache {
    /// A cache of at most `capacity` refusals (at least 1).
    pub(super) fn new(capacity: usize, exact: bool) -> Self {
        DenyCache {
            map: HashMap::with_hasher(KeyHasher::default()),
            stripes: KeyHasher::default(),
            order: Mutex::new(Order {
                queue: VecDeque::with_capacity(capacity.min(1_024)),
                next: 0,
                resets: [0; STRIPES],
            }),
            capacity: capacity.max(1),
            exact,
            #[cfg(test)]
            evicted: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// The cached refusal of a request of `cost` for `key` at `now`, if one covers it.
    pub(super) fn check(&self, key: &str, cost: u64, now: u64) -> Option<Decision> {
        let refusal = self.map.read_sync(key, |_, refusal| *refusal)?;
        if now < refusal.sent {
            // The clock went back past the refusal: Redis decides (its answer's waits are
            // capped by the policy; this one's would not be).
            return None;
        }
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

    fn order(&self) -> std::sync::MutexGuard<'_, Order> {
        // Nothing panics while the lock is held, so the order is whole even if poisoned.
        self.order.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Taken before a request is sent to Redis and handed to [`insert`](DenyCache::insert)
    /// with its refusal: a refusal whose ticket predates a [`forget`](DenyCache::forget) is
    /// not cached, since Redis may have decided it before a reset deleted the state.
    pub(super) fn ticket(&self, key: &str) -> u64 {
        self.order().resets[self.stripe(key)]
    }

    /// `key`'s stripe of [`Order::resets`].
    fn stripe(&self, key: &str) -> usize {
        (self.stripes.hash_one(key) % STRIPES as u64) as usize
    }

    /// Remembers Redis's `refusal` of a request of `cost` for `key`, sent at `sent` with
    /// `ticket`; nothing if a reset ran since the ticket was taken.
    pub(super) fn insert(&self, key: &str, cost: u64, sent: u64, ticket: u64, refusal: &Decision) {
        let retry = refusal.retry_after_nanos();
        let margin = if self.exact { 0 } else { retry / 1_000 + 1_000 };
        let until = sent.saturating_add(retry.saturating_sub(margin));
        if until <= sent {
            return;
        }
        let reset = u64::try_from(refusal.reset_after().as_nanos()).unwrap_or(u64::MAX);
        let stripe = self.stripe(key);
        let key: Arc<str> = key.into();
        let mut order = self.order();
        if order.resets[stripe] != ticket {
            return;
        }
        if order.queue.len() >= self.capacity {
            // Full: the oldest item makes room (see the module's docs).
            if let Some((old, seq)) = order.queue.pop_front() {
                self.map.remove_if_sync(&*old, |r| r.seq == seq);
                // Relaxed: a tally tests read after the inserts; nothing is ordered by it.
                #[cfg(test)]
                self.evicted
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let seq = order.next;
        order.next += 1;
        order.queue.push_back((Arc::clone(&key), seq));
        // Under the lock, so that every entry's item is queued before the entry is visible.
        self.map.upsert_sync(
            key,
            Refusal {
                sent,
                until,
                reset_at: sent.saturating_add(reset),
                cost,
                remaining: refusal.remaining(),
                limit: refusal.limit(),
                seq,
            },
        );
    }

    /// Forgets `key`'s refusal.
    pub(super) fn remove(&self, key: &str) {
        self.map.remove_sync(key);
    }

    /// Forgets `key`'s refusal for a reset or a refund, and keeps every refusal of a key of
    /// its stripe already on its way from Redis out of the cache (their tickets are now old).
    /// Under the insert lock, so that an insert either ran before (and its entry is removed
    /// here) or sees the new count.
    pub(super) fn forget(&self, key: &str) {
        let stripe = self.stripe(key);
        let mut order = self.order();
        order.resets[stripe] += 1;
        self.map.remove_sync(key);
    }

    /// Forgets every refusal, as [`forget`](DenyCache::forget) forgets one: for a change of
    /// policy, under which they may no longer hold.
    pub(super) fn forget_all(&self) {
        let mut order = self.order();
        for resets in &mut order.resets {
            *resets += 1;
        }
        self.map.clear_sync();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

    const HOUR: u64 = 3_600_000_000_000;

    fn refusal() -> Decision {
        Decision::deny(0, 5, HOUR, HOUR)
    }

    #[test]
    fn a_full_cache_takes_a_refusal_with_bounded_work() {
        let capacity = 100_000;
        let cache = DenyCache::new(capacity, true);
        for i in 0..capacity {
            cache.insert(&format!("old-{i}"), 1, 0, 0, &refusal());
        }
        assert_eq!(cache.map.len(), capacity);
        assert_eq!(cache.evicted.load(Ordering::Relaxed), 0);
        for i in 0..1_000 {
            cache.insert(&format!("new-{i}"), 1, 1, 0, &refusal());
        }
        // Each insert into the full cache took one queued item off, not a pass over all.
        assert_eq!(cache.evicted.load(Ordering::Relaxed), 1_000);
        assert_eq!(cache.map.len(), capacity);
        // The newest refusals are cached, displacing the oldest; the rest still refuse.
        assert!(cache.check("new-999", 1, 2).is_some());
        assert!(cache.check("old-999", 1, 2).is_none());
        assert!(cache.check("old-1000", 1, 2).is_some());
    }

    #[test]
    fn stale_items_free_their_slot_and_nothing_else() {
        let cache = DenyCache::new(2, true);
        cache.insert("a", 1, 0, 0, &refusal());
        // "a" cached again: its first item is stale.
        cache.insert("a", 1, 0, 0, &refusal());
        // Full: the stale item makes room, and "a" stays.
        cache.insert("b", 1, 0, 0, &refusal());
        assert!(cache.check("a", 1, 1).is_some());
        assert!(cache.check("b", 1, 1).is_some());
        // Full again: "a"'s live item is the oldest.
        cache.insert("c", 1, 0, 0, &refusal());
        assert!(cache.check("a", 1, 1).is_none());
        assert!(cache.check("b", 1, 1).is_some());
        assert!(cache.check("c", 1, 1).is_some());
        assert!(cache.map.len() <= 2);
        // A removed key's item is stale too: it makes room without touching "c".
        cache.remove("b");
        cache.insert("d", 1, 0, 0, &refusal());
        assert!(cache.check("c", 1, 1).is_some());
        assert!(cache.check("d", 1, 1).is_some());
        // An expired refusal refuses nothing and leaves the map.
        assert!(cache.check("d", 1, HOUR).is_none());
        assert!(cache.check("c", 1, 1).is_some());
        assert_eq!(cache.map.len(), 1);
    }

    /// `RedisLimiter::reset` forgets the key before its `DEL` and again after it returns; a
    /// decision refused by Redis before the `DEL` takes its ticket before or between the two
    /// and inserts at any point after taking it. Every such interleaving leaves no refusal.
    #[test]
    fn a_refusal_from_before_a_reset_is_not_cached_after_it() {
        // (when the ticket is taken, when the insert runs): 0 before the first forget, 1
        // between the forgets, 2 after the second.
        for (ticket_at, insert_at) in [(0, 0), (0, 1), (0, 2), (1, 1), (1, 2)] {
            let cache = DenyCache::new(8, true);
            let mut ticket = None;
            for step in 0..3 {
                if step == ticket_at {
                    ticket = Some(cache.ticket("k"));
                }
                if step == insert_at {
                    cache.insert("k", 1, 0, ticket.unwrap(), &refusal());
                }
                if step < 2 {
                    cache.forget("k");
                }
            }
            assert!(
                cache.check("k", 1, 1).is_none(),
                "ticket at {ticket_at}, insert at {insert_at}"
            );
        }
        // Without a reset in between, the refusal is cached.
        let cache = DenyCache::new(8, true);
        let ticket = cache.ticket("k");
        cache.insert("k", 1, 0, ticket, &refusal());
        assert!(cache.check("k", 1, 1).is_some());
    }
}
