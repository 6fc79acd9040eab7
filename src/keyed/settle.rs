//! Reserving now and settling later: [`RateLimiter::reserve_n`], [`RateLimiter::settle`] and
//! [`RateLimiter::cancel`].

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

use scc::Guard;

use crate::clock::Clock;
use crate::engine::dispatch::with_state;
use crate::engine::rebuilds::Rebuilds;
use crate::error::CostError;
use crate::policy::Policy;
use crate::reservation::{Origin, Reservation, SettleError};

use super::generations::first_in_older;
use super::request::Ask;
use super::slot::{with_keyed, Keyed, Registry, Resolved, Settle, Slot};
use super::RateLimiter;

impl<K: Hash + Eq + Clone + 'static, C: Clock, S: BuildHasher + Clone + 'static>
    RateLimiter<K, C, S>
{
    /// Takes `n` permits for `key` now, for a request whose real cost is known only after it
    /// ran: the tokens an LLM call really used, an order that may fail. Decided exactly as
    /// [`try_acquire_n`](RateLimiter::try_acquire_n); the [`Reservation`] remembers where its
    /// admission stands in each band, so that [`settle`](RateLimiter::settle) can give back
    /// what the request did not use, or charge what it used on top.
    ///
    /// An allowed reservation's permits are spent at once, so every other request sees
    /// them. A refused one holds nothing (its decision says when to retry). A reservation
    /// dropped unsettled keeps its permits spent.
    ///
    /// # Errors
    ///
    /// As [`try_acquire_n`](RateLimiter::try_acquire_n): [`CostError::Zero`] and
    /// [`CostError::ExceedsLimit`]; nothing changes.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, RateLimiter};
    ///
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("10000/min".parse()?, FakeClock::new());
    /// let r = limiter.reserve_n("tenant-1", 4000)?; // the most the completion may use
    /// assert_eq!(r.decision().remaining(), 6000);
    /// limiter.settle("tenant-1", r, 1200)?; // it used 1,200: 2,800 come back
    /// assert_eq!(limiter.peek("tenant-1").remaining(), 8799);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn reserve_n<Q>(&self, key: &Q, n: u64) -> Result<Reservation, CostError>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        if n == 0 {
            return Err(CostError::Zero);
        }
        // The origin first: its count of rebuilds must not be newer than the state the
        // reservation is decided on (see `rebuilds`).
        let origin = self.origin(key);
        let decided = self.reserve_cost(key, n)?;
        Ok(Reservation::new(decided.decision, n, decided.marks, origin)
            .decided_by_overflow_of(decided.overflow))
    }

    /// Settles a reservation of `key` at what the request really cost.
    ///
    /// * `actual` below the reservation: the difference comes back, as if those permits had
    ///   never been admitted, but never more than the reservation still holds (a token
    ///   bucket's refill or a window's passing may already have given some back) and never
    ///   more than a fresh state has.
    /// * `actual` above it: the difference is charged at once, even past the limit. A token
    ///   bucket and a sliding counter carry the debt, so later requests wait it out (a token
    ///   bucket up to one more full burst, a counter up to twice its permits in a window); a
    ///   sliding log saturates at its limit within the window, as it holds one entry per
    ///   permit.
    /// * `actual` equal: nothing to do.
    ///
    /// If the key's state is gone by then (evicted at rest), nothing is given back and a
    /// charge is made on its new state. After a [`reset`](RateLimiter::reset) or a
    /// [`set_policy`](RateLimiter::set_policy) (of any key), reservations made before get
    /// no refund, since the state that held their permits is gone, but are still charged.
    /// A reservation decided by the shared overflow state of a full limiter
    /// ([`max_keys`](RateLimiter::max_keys)) is refunded there, on the shared state of the
    /// policy it was decided under, whatever a resolver answers for the key by then; a charge
    /// on it goes where the key's next request would (its own state if it has one by now).
    /// A refund is checked against resets and policy changes once the state it would write
    /// to is found, so a settle racing a `reset` of its key never gives back to the fresh
    /// state. See `docs/ALGORITHMS.md`.
    ///
    /// # Errors
    ///
    /// [`SettleError::Refused`] for a reservation that holds nothing,
    /// [`SettleError::OtherKey`] and [`SettleError::OtherLimiter`] for one made for another
    /// key or by another limiter. A failed settle changes nothing: the permits stay spent.
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, RateLimiter};
    ///
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("10/s".parse()?, FakeClock::new());
    /// let r = limiter.reserve_n("alice", 10)?;
    /// limiter.settle("alice", r, 3)?; // 7 come back
    /// assert_eq!(limiter.peek("alice").remaining(), 6);
    /// let r = limiter.reserve_n("alice", 2)?;
    /// limiter.settle("alice", r, 10)?; // 8 more than reserved: a debt
    /// assert!(!limiter.peek("alice").is_allowed());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn settle<Q>(
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
        let overflow_policy = reservation.overflow_policy();
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
            let _ = self.miss(key, Ask::Settle(&settle));
        }
        Ok(())
    }

    /// Gives back everything a reservation holds: [`settle`](RateLimiter::settle) at 0.
    ///
    /// # Errors
    ///
    /// As [`settle`](RateLimiter::settle).
    ///
    /// # Examples
    ///
    /// ```
    /// use tollgate::{FakeClock, RateLimiter};
    ///
    /// let limiter: RateLimiter<String, FakeClock> =
    ///     RateLimiter::with_clock("3/s".parse()?, FakeClock::new());
    /// let global = limiter.reserve_n("global", 1)?;
    /// // ... an inner limit refused the request: the global permit comes back.
    /// limiter.cancel("global", global)?;
    /// assert_eq!(limiter.peek("global").remaining(), 2);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn cancel<Q>(&self, key: &Q, reservation: Reservation) -> Result<(), SettleError>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        self.settle(key, reservation, 0)
    }

    /// What a reservation of `key` made here is marked with.
    fn origin<Q: Hash + ?Sized>(&self, key: &Q) -> Origin {
        Origin {
            limiter: self.id,
            // `K: Borrow<Q>` hashes `key` as the owned key would be hashed.
            key: self.hasher.hash_one(key),
            // Read before the reservation is decided: the count must not be newer than the
            // state it is decided on.
            epoch: self.rebuilds.read(),
        }
    }

    /// The count of resets and policy changes (see `Rebuilds`): each counts itself before it
    /// retires the state(s) it replaces and again once the new ones are published, and a
    /// reservation made before one, or during one, gets no refund (`Settle::on` checks the
    /// count once it has found the state it would write to). A refund would land on a state
    /// that never held its permits (a reset's fresh one, or one built under another policy,
    /// which reads the marks differently); a charge still lands, as it reads no mark.
    /// Limiter-wide, so a reset of one key also withholds the refunds of reservations
    /// outstanding on others: those give back less, never more.
    pub(super) fn rebuilds(&self) -> &Rebuilds {
        &self.rebuilds
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
        let on = |registry: &Registry<K, S>, locked: bool| {
            with_keyed!(registry, keyed => {
                let settle = |state: &_| settle.on::<K, _>(state, &keyed.params, self.clock.now());
                if locked {
                    // Under the bucket lock no state is met retired.
                    keyed.table.read_locked(key, settle).flatten()
                } else {
                    keyed.table.read(key, &guard, settle)
                }
            })
        };
        // The older generations first: a key only moves from one of them to the current
        // one, so looking there last meets it wherever it is when it moves. Without locks
        // first; a pass that found nothing (the key not tracked, or met retired while it
        // moves) looks again under the bucket locks, which a move holds throughout.
        [false, true].into_iter().any(|locked| {
            first_in_older(generation, &guard, |old| on(&old.registry, locked))
                .or_else(|| on(&generation.registry, locked))
                .is_some()
        })
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
        with_keyed!(&generation.registry, keyed => {
            refund_on_overflow(keyed, recorded, resolved.as_ref(), settle, &self.clock)
        });
    }
}

/// Gives back on `keyed`'s overflow state that decided the reservation (see
/// [`Slot::overflow_spec`]); nothing when there is none.
fn refund_on_overflow<K, St: Slot<K>, S: BuildHasher, C: Clock>(
    keyed: &Keyed<K, St, S>,
    recorded: Option<&Policy>,
    resolved: Option<&Resolved<K>>,
    settle: &Settle<'_>,
    clock: &C,
) {
    if let Some(spec) = St::overflow_spec(&keyed.params, recorded, resolved) {
        // `false`: retired by a policy change, so it gives nothing back (see the caller).
        let _ = St::overflow_settle(&keyed.overflow, &keyed.params, &spec, settle, clock);
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
