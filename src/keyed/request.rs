//! Deciding a request: a small inline hit for a key already tracked, the rest of a tracked
//! key's cases out of line (other algorithms, a striped key's refills, steals and refusals,
//! a state retired under us), and `peek`. A key not tracked goes to the cold miss
//! (`keyed::create`), which creates its state.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

use scc::Guard;

use crate::clock::{Clock, Fixed, Reading};
use crate::decision::Decision;
use crate::engine::dispatch::{with_state, PerAlgorithm};
use crate::engine::retry::Retry;
use crate::engine::state::{one_mark, Decides};
use crate::engine::token_bucket::GcraCell;
use crate::error::CostError;
use crate::policy::Policy;
use crate::reservation::Marks;

use super::generations::{Generation, Generations};
use super::key_state::{with_keys, AnyKeys, KeyState, Keys, Settle};
use super::last_hit::{self, ToPin, Tried};
use super::rules::Resolved;

/// A decision, where its admission stands, and (for a decision of a per-key policy's shared
/// overflow state) the policy whose overflow state decided it: what a reservation keeps to be
/// settled on the same state later.
pub(super) struct Decided {
    pub(super) decision: Decision,
    pub(super) marks: Marks,
    /// Boxed: a policy is 200 bytes, and every decision moves a `Decided` about.
    pub(super) overflow: Option<Box<Policy>>,
    /// Whether the key's state was created for this decision.
    pub(super) created: bool,
}

impl Decided {
    /// Decided on the key's own state.
    #[inline(always)]
    pub(super) fn own((decision, marks): (Decision, Marks)) -> Self {
        Decided {
            decision,
            marks,
            overflow: None,
            created: false,
        }
    }
}

/// What a request read of this thread's notes before the table (see
/// [`Generations::last_hit_first`]).
#[derive(Clone, Copy)]
struct First {
    /// The limiter's count of changes, read before the generation.
    changes: u64,
    start: last_hit::Start,
}

/// What the cold path is asked to do once it has found or created the key's state.
#[derive(Clone, Copy)]
pub(super) enum Job<'a> {
    /// Decide a request of this cost.
    Decide(u64),
    /// Settle this reservation (a charge for a key whose state was gone).
    Settle(&'a Settle<'a>),
    /// Move the key from an older generation, if one still holds it, deciding nothing.
    Move,
}

impl<K: Hash + Eq + Clone + 'static, C: Clock, S: BuildHasher + Clone + 'static>
    Generations<K, C, S>
{
    /// The most common request, a request of cost 1 (within every policy, so no cost check)
    /// decided at `clock`'s instant (the limiter's own clock, or the one reading of an
    /// `AllOf`), each decision handed to `finish` (stats and shadow mode).
    ///
    /// First this thread's last hit (`keyed::last_hit`): the key it pinned, decided with no
    /// guard and no lookup. Then the hit, inline and its decision made in registers: a token
    /// bucket's key already tracked in the current generation, found without a lock, decided
    /// on its word (noted for the last hit) or from a slot of its home stripe. Everything
    /// else (another algorithm, a striped key's stripes beyond that slot, a key not tracked,
    /// a state retired under us) goes to
    /// [`Generations::acquire_slow`], out of line, which returns its decision whole. The two
    /// never meet: a decision that comes back through memory, merged with the hit's, made
    /// the hit's go through memory too, written in 8-byte pieces and copied in 16-byte ones,
    /// past store forwarding (in `perf annotate`, a sixth of a keyed hit's time).
    #[inline(always)]
    pub(super) fn acquire_one<Q>(
        &self,
        key: &Q,
        clock: &Fixed,
        reading: &mut Reading,
        finish: impl Fn(Decision) -> Decision,
    ) -> Decision
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        let (first, tried) = self.last_hit_first(key, clock.now(), (1, true));
        let lost = match tried {
            Tried::Decided(decision, _) => return finish(decision),
            Tried::Lost => true,
            Tried::Missed => false,
        };
        let guard = Guard::new();
        let generation = self.generation(&guard);
        let hit = match &generation.keys {
            // The token bucket's table knows its striped keys (see `keyed::striped`).
            AnyKeys::Uniform(PerAlgorithm::TokenBucket(keyed)) => keyed.table.read_at(
                key,
                &guard,
                #[inline(always)]
                |held, cell| {
                    self.count_lost(lost, keyed, cell, clock.now());
                    keyed.hot.acquire(
                        cell,
                        &keyed.params,
                        clock.now(),
                        self.may_stripe,
                        &guard,
                        #[inline(always)]
                        |striped| {
                            self.note_hit(
                                first,
                                keyed,
                                held,
                                key,
                                striped.then_some((cell, &guard)),
                            );
                        },
                    )
                },
            ),
            _ => None,
        };
        match hit {
            Some(decision) => {
                drop(guard);
                finish(decision)
            }
            None => self.acquire_slow(key, clock, reading, guard, finish),
        }
    }

    /// [`Generations::acquire_one`] past its inline hit, under the same guard: the key looked
    /// up again in the current generation (read again: a policy change since the hit makes
    /// it a newer one) and decided on the state found there, at the same `clock` (a token
    /// bucket's through its stripes, `Hot::acquire_rest`); a state retired and already
    /// replaced is decided on its successor. Else [`Generations::miss_at`], at the limiter's
    /// own time, which clears `reading`. A striped key's refills, steals and refusals pay the
    /// second lookup (about 10 ns), once every few hundred decisions for the refills.
    #[inline(never)]
    fn acquire_slow<Q>(
        &self,
        key: &Q,
        clock: &Fixed,
        reading: &mut Reading,
        guard: Guard,
        finish: impl Fn(Decision) -> Decision,
    ) -> Decision
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        let generation = self.generation(&guard);
        let found = match &generation.keys {
            AnyKeys::Uniform(PerAlgorithm::TokenBucket(keyed)) => {
                keyed.table.read(key, &guard, |cell| {
                    keyed.hot.acquire_rest(
                        cell,
                        &keyed.params,
                        clock.now(),
                        self.may_stripe,
                        &guard,
                    )
                })
            }
            keys => with_keys!(keys, keyed => self.one_in(keyed, key, &guard, clock)),
        };
        drop(guard);
        let decision = match found {
            Some(decision) => decision,
            None => match self.miss_at(key, 1, reading) {
                Ok(decided) => decided.decision,
                // Every policy has at least one permit, so a cost of 1 is always acceptable.
                Err(_) => unreachable!("a cost of 1 is within every policy"),
            },
        };
        finish(decision)
    }

    /// A request of `cost` for `key` at `now` on this thread's last hit (`keyed::last_hit`),
    /// before the table, taking from a striped key's stripes if `may_take_stripes` (see
    /// `LastHits::decide`): what the thread's notes said (the count of changes read before
    /// the generation is, and the limiter's way), and how it went.
    #[inline(always)]
    fn last_hit_first<Q>(&self, key: &Q, now: u64, ask: (u64, bool)) -> (First, Tried)
    where
        K: Borrow<Q>,
        Q: Eq + ?Sized,
    {
        let changes = last_hit::changes(&self.changes);
        let start = self.last_hits.start(self.id, changes);
        let tried = self.last_hits.decide(start, &self.changes, key, now, ask);
        (First { changes, start }, tried)
    }

    /// Counts, when `lost`, the compare-and-swap this thread's last hit lost on `cell` at `now`
    /// before the request came to the table, as the table counts its own (`Hot::acquire`).
    #[inline(always)]
    fn count_lost(&self, lost: bool, keyed: &Keys<K, GcraCell, S>, cell: &GcraCell, now: u64) {
        if lost {
            keyed
                .hot
                .lost_elsewhere(cell, &keyed.params, now, self.may_stripe);
        }
    }

    /// Notes a decision on `key`'s token bucket at `held`, made through the table under the
    /// guard still held, for this thread's last hit: a run of them pins the key. `striped`
    /// for a decision on the key's stripes: its state and that guard, to pin the stripes too.
    #[inline(always)]
    fn note_hit<Q>(
        &self,
        first: First,
        keyed: &Keys<K, GcraCell, S>,
        held: u32,
        key: &Q,
        striped: Option<(&GcraCell, &Guard)>,
    ) where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        self.last_hits
            .seen(first.start, self.id, first.changes, held, || ToPin {
                key: K::from(key.to_owned()),
                cell: keyed.table.pin(held),
                gcra: keyed.params,
                // Not found, the key went back to its word since: pinned on it, as a key
                // striped after this is (the count of changes moves).
                stripes: striped.and_then(|(cell, guard)| keyed.hot.pin_stripes(cell, guard)),
            });
    }

    /// A request of cost 1 on `keyed`'s table, for [`Generations::acquire_slow`].
    #[inline(always)]
    fn one_in<Q, St: KeyState<K>>(
        &self,
        keyed: &Keys<K, St, S>,
        key: &Q,
        guard: &Guard,
        clock: &impl Clock,
    ) -> Option<Decision>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        keyed.table.read(key, guard, |state| {
            state.bind(&keyed.params).try_acquire(clock, 1)
        })
    }

    /// Decides a request of `cost` (at least 1) for `key` at `reading`'s instant (see
    /// `RateLimiter::acquire_at`): the decision, and where its admission stands.
    #[inline(always)]
    pub(super) fn decide<Q>(
        &self,
        key: &Q,
        cost: u64,
        reading: &mut Reading,
    ) -> Result<Decided, CostError>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        self.decide_with(key, cost, reading, |decided| decided)
    }

    /// [`Generations::decide`], handing the result to `on` where it is made: the caller
    /// keeps only what `on` returns, and the decision and its marks are not moved through the
    /// path's results (an `AllOf`'s part keeps both; moved, they cost it store-forwarding
    /// stalls). The token bucket's table inline; the others out of line, so the default's
    /// hit is compiled alone, with no other algorithm's code (and registers) around it.
    #[inline(always)]
    pub(super) fn decide_with<Q, R>(
        &self,
        key: &Q,
        cost: u64,
        reading: &mut Reading,
        mut on: impl FnMut(Decided) -> R,
    ) -> Result<R, CostError>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        // `on` is called once, on whichever path decides.
        let at = Fixed(self.clock.now_in(reading));
        let clock = &at;
        let (first, tried) = self.last_hit_first(key, clock.now(), (cost, false));
        let lost = match tried {
            Tried::Decided(decision, mark) => {
                return Ok(on(Decided::own((decision, one_mark(mark)))));
            }
            Tried::Lost => true,
            Tried::Missed => false,
        };
        let guard = Guard::new();
        let generation = self.generation(&guard);
        let hit = match &generation.keys {
            AnyKeys::Uniform(PerAlgorithm::TokenBucket(keyed)) => {
                keyed.table.read_at(key, &guard, |held, cell| {
                    self.count_lost(lost, keyed, cell, clock.now());
                    let result = self.decide_on(cell, &keyed.params, clock, cost, &mut on)?;
                    if result.is_ok() && keyed.hot.may_pin(cell) {
                        self.note_hit(first, keyed, held, key, None);
                    }
                    Some(result)
                })
            }
            keys => self
                .hit_elsewhere(keys, key, &guard, clock, cost)
                .map(|result| result.map(&mut on)),
        };
        drop(guard);
        match hit {
            Some(result) => result,
            None => self.miss_at(key, cost, reading).map(on),
        }
    }

    /// A request of `cost` for a key the hit path did not find, decided by
    /// [`Generations::miss`] at the limiter's own time. It clears `reading`: a miss may take
    /// long (the resolver, the key's bucket lock, a sweep), and what is decided after it at
    /// that reading (the next parts of an `AllOf`) reads the time afresh.
    #[inline]
    pub(super) fn miss_at<Q>(
        &self,
        key: &Q,
        cost: u64,
        reading: &mut Reading,
    ) -> Result<Decided, CostError>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        *reading = Reading::default();
        self.miss(key, Job::Decide(cost))
    }

    /// The request of `decide_with` on `keyed`'s table, found without a lock, its result
    /// handed to `on`; `None` for a key not in the table or a state retired under us. The
    /// cost is checked against the key's policy first: a cost above a state's limit counts
    /// only from a live state (one retired under us, by a reset moving the key to another
    /// tier, sends the request to the state that replaces it).
    #[inline(always)]
    fn hit_in<Q, St: KeyState<K>, R>(
        &self,
        keyed: &Keys<K, St, S>,
        key: &Q,
        guard: &Guard,
        clock: &impl Clock,
        cost: u64,
        on: &mut impl FnMut(Decided) -> R,
    ) -> Option<Result<R, CostError>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        keyed.table.read(key, guard, |state| {
            self.decide_on(state, &keyed.params, clock, cost, on)
        })
    }

    /// The request of [`Generations::hit_in`] on `state`, found in its table.
    #[inline(always)]
    fn decide_on<St: KeyState<K>, R>(
        &self,
        state: &St,
        params: &St::Params,
        clock: &impl Clock,
        cost: u64,
        on: &mut impl FnMut(Decided) -> R,
    ) -> Option<Result<R, CostError>> {
        match state.bind(params).reserve_checked(clock, cost)? {
            Ok(decided) => Some(Ok(on(Decided::own(decided)))),
            Err(refused) => state.bind(params).peek(clock, 1).map(|_| Err(refused)),
        }
    }

    /// [`Generations::hit_in`] for every table but the token bucket's, out of line.
    #[inline(never)]
    fn hit_elsewhere<Q>(
        &self,
        keys: &AnyKeys<K, S>,
        key: &Q,
        guard: &Guard,
        clock: &impl Clock,
        cost: u64,
    ) -> Option<Result<Decided, CostError>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        with_keys!(keys, keyed => self.hit_in(keyed, key, guard, clock, cost, &mut |decided| decided))
    }

    /// Whether `key` is striped in the current generation.
    pub(super) fn is_striped<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let guard = Guard::new();
        match &self.generation(&guard).keys {
            AnyKeys::Uniform(PerAlgorithm::TokenBucket(keyed)) => keyed
                .table
                .read(key, &guard, |cell| Some(keyed.hot.is_striped(cell)))
                .unwrap_or(false),
            _ => false,
        }
    }

    /// What a request of `cost` for `key` would get now, changing nothing and creating no
    /// state; `with_stripes`, a request of cost 1 counts what a striped key's stripes hold
    /// (as `try_acquire` takes from them), else only the key's word (as a reservation).
    pub(super) fn peek<Q>(
        &self,
        key: &Q,
        cost: u64,
        with_stripes: bool,
    ) -> Result<Decision, CostError>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        let mut resolved = None;
        let mut retry = Retry::new();
        loop {
            {
                let guard = Guard::new();
                let generation = self.generation(&guard);
                let resolved = resolved.as_ref();
                let peeked = match &generation.keys {
                    // A striped key's stripes hold permits its word counts as spent, for
                    // requests of cost 1 (a larger one takes from the word alone).
                    AnyKeys::Uniform(PerAlgorithm::TokenBucket(keyed))
                        if cost == 1 && with_stripes =>
                    {
                        let peek = |cell: &_, now| keyed.hot.peek(cell, &keyed.params, now).map(Ok);
                        self.peek_in(generation, keyed, key, resolved, (peek, cost), &guard)
                    }
                    keys => with_keys!(keys, keyed => {
                        let peek = peek_on(keyed, cost);
                        self.peek_in(generation, keyed, key, resolved, (peek, cost), &guard)
                    }),
                };
                if let Some(peeked) = peeked {
                    return peeked;
                }
            }
            // An untracked key under a per-key resolver: ask it, outside the guard, and look
            // again (a tracked key never gets here).
            resolved = self.resolve(key, resolved);
            // A policy change may be under way (a retired shared overflow state): yield.
            retry.snooze();
        }
    }

    /// What a request of `cost` for `key` would get now, as `peek` reads a tracked state at
    /// an instant; `None` when it is not tracked and `resolved` is not the answer of this
    /// map's resolver.
    fn peek_in<Q, St: KeyState<K>>(
        &self,
        generation: &Generation<K, S>,
        keyed: &Keys<K, St, S>,
        key: &Q,
        resolved: Option<&Resolved<K>>,
        (peek, cost): (
            impl Fn(&St, u64) -> Option<Result<Decision, CostError>>,
            u64,
        ),
        guard: &Guard,
    ) -> Option<Result<Decision, CostError>>
    where
        K: Borrow<Q> + From<Q::Owned>,
        Q: Hash + Eq + ToOwned + ?Sized,
    {
        let now = self.clock.now();
        let at_now = Fixed(now);
        let peek = |state: &St| peek(state, now);
        // Without a lock first; then, if that found nothing, under the bucket's lock, where
        // no state is met retired (one being moved to a new generation, or removed).
        if let Some(decision) = keyed
            .table
            .read(key, guard, peek)
            .or_else(|| keyed.table.read_locked(key, peek).flatten())
        {
            return Some(decision);
        }
        // Not tracked here: decide on the state the key's next request would create, built
        // aside and dropped.
        let blueprint = St::blueprint(&keyed.params, resolved)?;
        if let Err(refused) = CostError::within(cost, St::max_cost_for(&keyed.params, &blueprint)) {
            return Some(Err(refused));
        }
        let moved = self.peek_older(generation, key, now, guard);
        if moved.is_none() && (self.len() >= self.max_keys || keyed.table.is_full()) {
            // `None` (retired by a policy change): the caller looks again. A key with
            // permits kept is refused by them first, as its request would be.
            if let Some(refused) = self.kept_refusal(keyed, &blueprint, key, cost, now)? {
                return Some(Ok(refused));
            }
            return St::overflow_peek(&keyed.overflow, &keyed.params, &blueprint, &at_now, cost)
                .map(|decision| Ok(decision.overflowed()));
        }
        let new = moved.is_none();
        let carry = self.starting_carry(keyed, &blueprint, moved, now)?;
        let (state, _, own_refuses) =
            self.starting_state(keyed, &blueprint, key, carry, (new, cost), now);
        if own_refuses && !keyed.shared_admits(&blueprint, cost, now) {
            // A refusal: the shared state's, as the request's (see `create_in`).
            return St::overflow_peek(&keyed.overflow, &keyed.params, &blueprint, &at_now, cost)
                .map(|decision| Ok(decision.overflowed()));
        }
        Some(Ok(keyed.peek_new(&state, cost, now)))
    }
}

/// What a request of `cost` would get from a state of `keyed` at an instant (`None` when the
/// state was retired).
fn peek_on<K, St: KeyState<K>, S: BuildHasher>(
    keyed: &Keys<K, St, S>,
    cost: u64,
) -> impl Fn(&St, u64) -> Option<Result<Decision, CostError>> + '_ {
    move |state, now| state.bind(&keyed.params).peek_checked(&Fixed(now), cost)
}
