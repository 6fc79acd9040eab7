//! Settling a reservation: giving back what it did not use, or charging what it used on top,
//! on the state that holds its permits.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

use scc::Guard;

use crate::clock::Clock;
use crate::engine::dispatch::{with_state, PerAlgorithm};
use crate::policy::Policy;
use crate::reservation::{Origin, Reservation, SettleError};

use super::generations::{first_in_older, Generations};
use super::key_state::{with_keys, AnyKeys, KeyState, Keys, Settle};
use super::request::Job;
use super::rules::Resolved;

impl<K: Hash + Eq + Clone + 'static, C: Clock, S: BuildHasher + Clone + 'static>
    Generations<K, C, S>
{
    /// Settles `reservation` of `key` at `actual` (see `RateLimiter::settle`).
    pub(super) fn settle<Q>(
        &self,
        key: &Q,
        reservation: Reservation,
        actual: u64,
    ) -> Result<(), SettleError>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        let overflowed = reservation.decision().is_overflow();
        let overflow_policy = reservation.decided_policy();
        let taken = reservation.take(self.origin(key))?;
        if !taken.changes(actual) {
            return Ok(());
        }
        let settle = Settle {
            held: taken.held,
            marks: taken.marks,
            actual,
            made: taken.made,
            rebuilds: &self.rebuilds,
        };
        if overflowed && actual < taken.held {
            // A refund of a shared state's reservation goes back to the shared state that
            // holds the permits.
            self.refund_overflow(key, overflow_policy.as_deref(), &settle);
        } else if !self.settle_tracked(key, &settle) && actual > taken.held {
            // A charge for a key not tracked: on the state its next request would create (or
            // the shared one of the policy the resolver gives it now, when the limiter is
            // full). Whether the reservation was decided by the key's own state or by the
            // shared one, the charge goes where the key's next request would: a key tracked
            // by now (it started with what the shared state counted) takes it above. A refund
            // of the key's own state has nothing to give back when it is gone: what the
            // reservation held went with it.
            let _ = self.miss(key, Job::Settle(&settle));
        }
        Ok(())
    }

    /// What a reservation of `key` made here is marked with.
    pub(super) fn origin<Q: Hash + ?Sized>(&self, key: &Q) -> Origin {
        Origin {
            limiter: self.id,
            // `K: Borrow<Q>` hashes `key` as the owned key would be hashed.
            key: self.hasher.hash_one(key),
            // Read before the reservation is decided: the count must not be newer than the
            // state it is decided on.
            rebuilds: self.rebuilds.read(),
        }
    }

    /// Settles on `key`'s state in the current generation, or in an older one that still
    /// holds it (its move into the current one then carries the settle along). `false` when
    /// no generation holds the key.
    fn settle_tracked<Q>(&self, key: &Q, settle: &Settle<'_>) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let guard = Guard::new();
        let generation = self.generation(&guard);
        let on = |keys: &AnyKeys<K, S>, locked: bool| match keys {
            // A refund on a token bucket stops at what the key's stripes hold (with striping
            // off no key has any, and the word alone is settled, taking no lock).
            AnyKeys::Uniform(PerAlgorithm::TokenBucket(keyed)) if self.may_stripe => {
                let settle = |cell: &_| {
                    settle.apply(|held, marks, actual| {
                        let settled = (held, marks[0], actual);
                        keyed
                            .hot
                            .settle(cell, &keyed.params, settled, self.clock.now())
                    })
                };
                Self::read_either(keyed, key, locked, &guard, settle)
            }
            keys => with_keys!(keys, keyed => {
                let settle = |state: &_| settle.on(KeyState::<K>::bind(state, &keyed.params), self.clock.now());
                Self::read_either(keyed, key, locked, &guard, settle)
            }),
        };
        // The older generations first: a key only moves from one of them to the current
        // one, so looking there last meets it wherever it is when it moves. Without locks
        // first; a pass that found nothing (the key not tracked, or met retired while it
        // moves) looks again under the bucket locks, which a move holds throughout.
        [false, true].into_iter().any(|locked| {
            first_in_older(generation, &guard, |old| on(&old.keys, locked))
                .or_else(|| on(&generation.keys, locked))
                .is_some()
        })
    }

    /// Runs `settle` on `key`'s state in `keyed`: without a lock, or under the bucket lock,
    /// where no state is met retired.
    fn read_either<Q, St: KeyState<K>>(
        keyed: &Keys<K, St, S>,
        key: &Q,
        locked: bool,
        guard: &Guard,
        settle: impl FnOnce(&St) -> Option<()>,
    ) -> Option<()>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        if locked {
            keyed.table.read_locked(key, settle).flatten()
        } else {
            keyed.table.read(key, guard, settle)
        }
    }

    /// Gives back, on the shared overflow state that decided `key`'s reservation, what it did
    /// not use: on the state of the policy it `recorded` (a per-key policy's), never the one
    /// the resolver gives the key now. A shared state retired since by a policy change holds
    /// the reservation's permits no more: nothing comes back (the reservation is stale).
    fn refund_overflow<Q>(&self, key: &Q, recorded: Option<&Policy>, settle: &Settle<'_>)
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        // The resolver runs only for a reservation that recorded no policy (one made before a
        // change to per-key policies), outside the guard, as for a new key.
        let resolved = match recorded {
            Some(_) => None,
            None => self.resolve(key, None),
        };
        let guard = Guard::new();
        let generation = self.generation(&guard);
        with_keys!(&generation.keys, keyed => {
            refund_on_overflow(keyed, recorded, resolved.as_ref(), settle, &self.clock)
        });
    }
}

/// Gives back on `keyed`'s overflow state that decided the reservation (see
/// [`KeyState::overflow_blueprint`]); nothing when there is none.
fn refund_on_overflow<K, St: KeyState<K>, S: BuildHasher, C: Clock>(
    keyed: &Keys<K, St, S>,
    recorded: Option<&Policy>,
    resolved: Option<&Resolved<K>>,
    settle: &Settle<'_>,
    clock: &C,
) {
    if let Some(blueprint) = St::overflow_blueprint(&keyed.params, recorded, resolved) {
        // `false`: retired by a policy change, so it gives nothing back (see the caller).
        let _ = St::overflow_settle(&keyed.overflow, &keyed.params, &blueprint, settle, clock);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::clock::FakeClock;
    use crate::error::CostError;
    use crate::keyed::RateLimiter;

    #[test]
    fn settling_at_the_reserved_cost_for_an_evicted_key_creates_nothing() {
        let clock = FakeClock::new();
        let limiter: RateLimiter<u64, FakeClock> =
            RateLimiter::with_clock("2/1s".parse().unwrap(), clock.clone());
        let at_cost = limiter.reserve_n(&1, 1).unwrap();
        let above = limiter.reserve_n(&1, 1).unwrap();
        clock.advance(Duration::from_secs(1));
        assert_eq!(limiter.evict_idle(), 1);
        // Nothing to give back or to charge: no state comes back for it.
        limiter.settle(&1, at_cost, 1).unwrap();
        assert_eq!(limiter.len(), 0);
        // A charge does land, on a new state.
        limiter.settle(&1, above, 2).unwrap();
        assert_eq!(limiter.len(), 1);
        assert_eq!(limiter.peek(&1).remaining(), 0);
    }

    #[test]
    fn a_reset_that_removes_nothing_keeps_every_refund() {
        let limiter: RateLimiter<u64, FakeClock> =
            RateLimiter::with_clock("2/1h".parse().unwrap(), FakeClock::new());
        let kept = limiter.reserve_n(&1, 2).unwrap();
        assert!(!limiter.reset(&2), "key 2 is not tracked");
        limiter.cancel(&1, kept).unwrap();
        assert_eq!(limiter.peek(&1).remaining(), 1, "both permits given back");
        // A reset that removes a state does void the refunds of reservations made before.
        let voided = limiter.reserve_n(&1, 2).unwrap();
        let _ = limiter.try_acquire(&3);
        assert!(limiter.reset(&3));
        limiter.cancel(&1, voided).unwrap();
        assert!(!limiter.peek(&1).is_allowed());
    }

    #[test]
    fn overflowing_keys_under_per_key_policies_are_held_to_their_policys_cost_and_settle() {
        let limiter: RateLimiter<u64, FakeClock> =
            RateLimiter::with_resolver(|_: &u64| "3/1h".parse().unwrap(), FakeClock::new())
                .max_keys(1);
        let _ = limiter.try_acquire(&1);
        // Key 2 overflows into the shared state of its policy, which takes costs up to 3.
        assert_eq!(
            limiter.try_acquire_n(&2, 4),
            Err(CostError::ExceedsLimit { cost: 4, limit: 3 })
        );
        let reservation = limiter.reserve_n(&2, 3).unwrap();
        assert!(reservation.decision().is_overflow() && reservation.decision().is_allowed());
        assert!(!limiter.try_acquire(&3).is_allowed());
        // Giving two back reaches the shared state: two more overflowing requests pass.
        limiter.settle(&2, reservation, 1).unwrap();
        assert!(limiter.try_acquire(&3).is_allowed());
        assert!(limiter.try_acquire(&4).is_allowed());
        assert!(!limiter.try_acquire(&5).is_allowed());
        assert_eq!(limiter.len(), 1);
    }
}
