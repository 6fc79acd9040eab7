//! Removing states at rest, exactly, while requests run: the incremental sweep each new key
//! pays a few steps of, eviction of every state at rest, and the reset of one key.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::Ordering;

use scc::Guard;

use crate::bounded::Swept;
use crate::clock::Clock;
use crate::engine::dispatch::with_state;
use crate::engine::retry::Retry;
use crate::engine::state::Decides;

use super::generations::{Generation, Generations};
use super::key_state::{with_keys, AnyKeys, KeyState, Keys};
use super::request::Job;

impl<K: Hash + Eq + Clone + 'static, St: KeyState<K>, S: BuildHasher> Keys<K, St, S> {
    /// Removes every state at rest at `now`; returns how many.
    pub(super) fn evict_idle(&self, now: u64) -> usize {
        self.table.retain(|state| self.retire_at_rest(state, now))
    }

    /// Retires `state` if it is at rest at `now`. The plain check first: most states a sweep
    /// meets are either at rest or not, and only those at rest pay for the retiring CAS,
    /// which fails, keeping the state, if a request admitted in between.
    fn retire_at_rest(&self, state: &St, now: u64) -> bool {
        let bound = state.bind(&self.params);
        let retired = bound.is_at_rest(now) && bound.try_retire(now);
        if retired {
            self.hot.forget(state);
        }
        retired
    }
}

impl<K: Hash + Eq + Clone + 'static, S: BuildHasher> Generation<K, S> {
    /// Up to `slice` entries of `keyed` (this generation's map) from the cursor on, removing
    /// the states at rest at `now`.
    pub(super) fn sweep_step<St: KeyState<K>>(
        &self,
        keyed: &Keys<K, St, S>,
        slice: usize,
        now: u64,
    ) -> Swept {
        keyed.table.sweep_step(&self.sweep_cursor, slice, |state| {
            keyed.retire_at_rest(state, now)
        })
    }
}

impl<K: Hash + Eq + Clone + 'static, C: Clock, S: BuildHasher + Clone + 'static>
    Generations<K, C, S>
{
    /// One step of the incremental sweep: up to `slice` entries of each generation, starting
    /// where the last step stopped, removing states at rest. Never blocks on
    /// another sweeper (it skips a generation someone else is sweeping).
    /// With `grace`, only states at rest for at least their generation's grace period are
    /// removed; without, any state at rest.
    pub(super) fn sweep(
        &self,
        generation: &Generation<K, S>,
        slice: usize,
        grace: bool,
        guard: &Guard,
    ) {
        let now = self.clock.now();
        let mut removed = 0;
        let mut older_empty = false;
        let mut current = Some(generation);
        while let Some(g) = current {
            // A state at rest at an earlier instant is at rest now (time only brings states
            // closer to rest), so removing it as of that instant is exact.
            let as_of = if grace {
                now.saturating_sub(g.sweep_grace)
            } else {
                now
            };
            let swept = with_keys!(&g.keys, keyed => g.sweep_step(keyed, slice, as_of));
            removed += swept.removed;
            older_empty |= swept.empty && !std::ptr::eq(g, generation);
            // Acquire: as every walk of the chain.
            current = g.older.load(Ordering::Acquire, guard).as_ref();
        }
        // Relaxed: a statistic, decremented after the removals.
        self.tracked.fetch_sub(removed, Ordering::Relaxed);
        if older_empty {
            // A replaced generation looked empty: unlink it, unless a reload holds the lock
            // (a request never waits for one; a later sweep sees the empty map again).
            if let Some(_config) = self.try_lock_config() {
                self.generation(guard).unlink_drained(guard);
            }
        }
    }

    /// Removes every state at rest now, in every generation; returns how many.
    pub(super) fn evict_idle(&self) -> usize {
        let guard = Guard::new();
        let now = self.clock.now();
        let generation = self.generation(&guard);
        let mut removed = with_keys!(&generation.keys, keyed => keyed.evict_idle(now));
        // Acquire: as every walk of the chain.
        let mut older = generation.older.load(Ordering::Acquire, &guard);
        let replaced = !older.is_null();
        while let Some(old) = older.as_ref() {
            removed += with_keys!(&old.keys, keyed => keyed.evict_idle(now));
            older = old.older.load(Ordering::Acquire, &guard);
        }
        // Relaxed: a statistic.
        self.tracked.fetch_sub(removed, Ordering::Relaxed);
        self.kept.clear_passed(now);
        if replaced {
            let _config = self.lock_config();
            self.generation(&guard).unlink_drained(&guard);
        }
        removed
    }

    /// Removes `key`'s state from the current generation if it is at rest now (retired as
    /// eviction retires it, so a request that spent from it meanwhile keeps it).
    pub(super) fn forget_at_rest<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let guard = Guard::new();
        let now = self.clock.now();
        let generation = self.generation(&guard);
        let removed = with_keys!(&generation.keys, keyed => {
            keyed.table.remove_if(key, |state| keyed.retire_at_rest(state, now))
        });
        if removed {
            // Relaxed: a statistic, decremented after the removal.
            self.tracked.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Moves every key that an older generation still holds to the current one now, with
    /// the permits it has in use, as its next request would (see `RateLimiter::set_policy`).
    pub(super) fn move_every_key(&self) {
        let keys: Vec<K> = {
            let guard = Guard::new();
            let mut keys = Vec::new();
            // Acquire: as every walk of the chain.
            let mut older = self
                .generation(&guard)
                .older
                .load(Ordering::Acquire, &guard);
            while let Some(old) = older.as_ref() {
                with_keys!(&old.keys, keyed => keyed.table.keys_into(&mut keys, &guard));
                older = old.older.load(Ordering::Acquire, &guard);
            }
            keys
        };
        for key in keys {
            // A move decides nothing, so no cost is refused.
            let _ = self.miss(&key, Job::Move);
        }
    }

    /// Forgets `key`'s state, in whatever generation it is, and what was kept for it
    /// (`keyed::kept`); whether a state was removed.
    pub(super) fn reset<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let guard = Guard::new();
        let mut removed = 0;
        let mut retry = Retry::new();
        loop {
            let current = self.generation(&guard);
            let mut chain = vec![current];
            while let Some(older) = chain[chain.len() - 1]
                .older
                .load(Ordering::Acquire, &guard)
                .as_ref()
            {
                chain.push(older);
            }
            // Oldest first: a key only ever moves from an older generation to the current one
            // (under the current bucket's lock, see `Generations::create_in`), so walking
            // towards the current generation meets it wherever it is when it moves. Walking newest first
            // could look in the current map just before the key arrives there and in the old
            // one just after it left.
            for generation in chain.iter().rev() {
                // Retired, then removed, under the bucket lock: a request still holding the
                // state's slot meets it retired and looks the key up again.
                let mut open = None;
                removed += with_keys!(&generation.keys, keyed => {
                    let now = self.clock.now();
                    usize::from(
                        keyed
                            .table
                            .remove(key, |state| {
                                // Counted before the state is retired, and again below once
                                // it is unlinked: a refund never lands on the key's next state
                                // for a reservation made before (see `Rebuilds`). A reset that
                                // finds nothing counts nothing.
                                open = Some(self.rebuilds.begin());
                                let carry = KeyState::<K>::bind(state, &keyed.params)
                                    .retire_with_carry(now);
                                keyed.hot.forget(state);
                                // Under the bucket lock that a move of the key writes what it
                                // keeps under (`keyed::kept`): none is left behind.
                                self.kept.forget(key);
                                carry
                            })
                            .is_some(),
                    )
                });
                // The state is unlinked: the rebuild ends (when one began).
                drop(open);
            }
            // A policy change meanwhile made a newer generation the key could have moved to:
            // walk again.
            if std::ptr::eq(self.generation(&guard), current) {
                break;
            }
            retry.again();
        }
        // Relaxed: a statistic.
        self.tracked.fetch_sub(removed, Ordering::Relaxed);
        // A key with nothing but permits kept (evicted since) forgets them too.
        self.kept.forget(key);
        removed > 0
    }
}

#[cfg(test)]
mod tests {
    //! Every path that removes a state retires it first, so a request that found the state
    //! before it was unlinked cannot decide on it: unlinking a state merely checked at rest
    //! would let that request admit on a state nobody sees any more.

    use std::time::Duration;

    use scc::Guard;

    use crate::clock::{Clock, FakeClock};
    use crate::engine::dispatch::with_state;
    use crate::engine::state::Decides;
    use crate::keyed::key_state::{with_keys, AnyKeys, KeyState};
    use crate::keyed::RateLimiter;

    /// Holds key 1's state as a request would, runs `act`, then says whether the state it
    /// holds still decides (`false` once retired).
    fn still_decides(limiter: &RateLimiter<u64, FakeClock>, act: &dyn Fn()) -> bool {
        let guard = Guard::new();
        let generation = limiter.generations.generation(&guard);
        with_keys!(&generation.keys, keyed => {
            let held = keyed.table.held(&1, &guard).expect("key 1 is tracked");
            act();
            KeyState::<u64>::bind(held, &keyed.params).peek(limiter.clock(), 1).is_some()
        })
    }

    fn limiter(policy: &str, clock: &FakeClock) -> RateLimiter<u64, FakeClock> {
        RateLimiter::with_clock(policy.parse().unwrap(), clock.clone())
    }

    /// A limiter whose keys each carry their own policy (odd keys twice the permits).
    fn per_key(clock: &FakeClock) -> RateLimiter<u64, FakeClock> {
        RateLimiter::with_resolver(
            |key: &u64| format!("{}/1s", 2 + 2 * (key % 2)).parse().unwrap(),
            clock.clone(),
        )
    }

    #[test]
    fn eviction_under_per_key_policies_retires_what_it_removes_and_nothing_else() {
        let clock = FakeClock::new();
        let limiter = per_key(&clock);
        let _ = limiter.try_acquire(&1);
        assert!(still_decides(&limiter, &|| assert_eq!(
            limiter.evict_idle(),
            0
        )));
        clock.advance(Duration::from_secs(2));
        assert!(!still_decides(&limiter, &|| assert_eq!(
            limiter.evict_idle(),
            1
        )));
        assert_eq!(limiter.len(), 0);
    }

    #[test]
    fn the_routine_sweep_waits_for_a_grace_period_of_one_window() {
        let clock = FakeClock::new();
        let limiter = limiter("2/1s", &clock);
        let _ = limiter.try_acquire(&1);
        // Key 1 is at rest from 0.5 s on, but not yet for a whole window at 1.4 s.
        clock.advance(Duration::from_millis(1_400));
        let _ = limiter.try_acquire(&2);
        assert_eq!(limiter.len(), 2);
        clock.advance(Duration::from_millis(200));
        let _ = limiter.try_acquire(&3);
        assert_eq!(limiter.len(), 2, "key 1 at rest for 1.1 s: swept");
        // Under per-key policies the grace is a minute.
        let limiter = per_key(&clock);
        let _ = limiter.try_acquire(&1);
        clock.advance(Duration::from_secs(59));
        let _ = limiter.try_acquire(&2);
        assert_eq!(limiter.len(), 2);
        clock.advance(Duration::from_secs(2));
        let _ = limiter.try_acquire(&3);
        assert_eq!(limiter.len(), 2);
    }

    #[test]
    fn a_full_limiter_sweeps_for_a_place_before_it_overflows() {
        let clock = FakeClock::new();
        let limiter = limiter("2/1s", &clock).max_keys(1).sweep_per_insert(0);
        let _ = limiter.try_acquire(&1);
        // Key 1 is still spending: the new key overflows.
        assert!(limiter.try_acquire(&2).is_overflow());
        clock.advance(Duration::from_secs(1));
        // Key 1 is at rest (not yet for the routine sweep's grace): the full limiter's own
        // sweep frees its place, and key 2 gets a state of its own.
        let decision = limiter.try_acquire(&2);
        assert!(!decision.is_overflow() && decision.is_allowed());
        assert_eq!(limiter.len(), 1);
    }

    #[test]
    fn eviction_retires_what_it_removes_and_nothing_else() {
        for policy in [
            "token-bucket 2/1s",
            "sliding-log 2/1s",
            "sliding-counter 2/1s",
            "2/1s & 5/1h",
        ] {
            let clock = FakeClock::new();
            let limiter = limiter(policy, &clock);
            let _ = limiter.try_acquire(&1);
            // Not at rest: kept, and still live.
            assert!(
                still_decides(&limiter, &|| assert_eq!(limiter.evict_idle(), 0)),
                "{policy}"
            );
            clock.advance(Duration::from_secs(2));
            if policy.contains("5/1h") {
                // The hour-long band is not at rest: kept.
                assert!(still_decides(&limiter, &|| assert_eq!(
                    limiter.evict_idle(),
                    0
                )));
                continue;
            }
            assert!(
                !still_decides(&limiter, &|| assert_eq!(limiter.evict_idle(), 1)),
                "{policy}"
            );
            assert_eq!(limiter.len(), 0);
        }
    }

    #[test]
    fn the_sweep_retires_what_it_removes() {
        let clock = FakeClock::new();
        let limiter = limiter("2/1s", &clock).sweep_per_insert(64);
        let _ = limiter.try_acquire(&1);
        clock.advance(Duration::from_secs(3));
        // A new key's insertion sweeps key 1, at rest for longer than the grace period.
        assert!(!still_decides(&limiter, &|| {
            let _ = limiter.try_acquire(&2);
        }));
        assert_eq!(limiter.len(), 1);
    }

    #[test]
    fn reset_retires_the_state_even_when_it_is_not_at_rest() {
        let clock = FakeClock::new();
        let limiter = limiter("2/1h", &clock);
        let _ = limiter.try_acquire(&1);
        assert!(!still_decides(&limiter, &|| assert!(limiter.reset(&1))));
        assert_eq!(limiter.try_acquire(&1).remaining(), 1);
    }

    #[test]
    fn a_move_to_a_new_policy_retires_the_old_state() {
        let clock = FakeClock::new();
        let limiter = limiter("2/1h", &clock);
        let _ = limiter.try_acquire(&1);
        let guard = Guard::new();
        let old = limiter.generations.generation(&guard);
        limiter.set_policy("3/1h".parse().unwrap());
        let decides = with_keys!(&old.keys, keyed => {
            let held = keyed.table.held(&1, &guard).expect("key 1 is in the old generation");
            // Its next request moves it, carrying the permit it spent.
            assert_eq!(limiter.try_acquire(&1).remaining(), 1);
            KeyState::<u64>::bind(held, &keyed.params).peek(&FakeClock::new(), 1).is_some()
        });
        assert!(
            !decides,
            "the old state must refuse once its permits are carried"
        );
        assert_eq!(clock.now(), 0);
    }
}
