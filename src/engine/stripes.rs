//! One key's token bucket spread over stripes, each on its own cache line, so that threads
//! deciding on one very hot key write different lines.
//!
//! **The timeline.** GCRA gives each admission at `now` a stretch `(s, s + T]` of the key's
//! timeline, from `s = max(tat, now)`, and admits only while `s + T <= now + B`. The
//! stretches of all admissions are disjoint, each starts no earlier than its request and ends
//! no later than `B` after it. That is the whole of GCRA's promise: the admissions of any
//! interval `[a, a + L]` hold disjoint stretches of length `T` inside `(a, a + L + B]`, so
//! there are at most `L / T + B / T` of them.
//!
//! **Leases.** The key's central word is still its TAT. A stripe takes a *lease* from it, a
//! run `(start, end]` of whole intervals starting at `max(tat, now)`, in one compare-and-swap
//! that moves the TAT to `end`. A request on a stripe then takes `(s, s + T]` from its lease
//! with `s = max(start, now)`, by one compare-and-swap on the stripe's own line, while
//! `s + T <= end` and `s + T <= now + B`. That is the central rule applied to a piece of the
//! timeline no one else holds: the stretches stay disjoint and each lies within `[now, now +
//! B]` of its own request, so a striped key keeps GCRA's bound exactly, with a moving clock as
//! with a frozen one. The part of a lease that time has passed (`start` up to `now`) is
//! dropped, as the central word drops it (`max(tat, now)`): a permit is never used later than
//! the instant it stood for.
//!
//! **Refusals.** A request whose stripe is empty takes a new lease; when the central word has
//! nothing either, it looks at every other stripe and takes from the first that has a permit
//! (a steal). It is refused only when the central word and every stripe had nothing at one
//! instant, so on a frozen clock a key of `N` permits admits exactly `N`, however many
//! threads race. Under-admission is possible only with a moving clock, for a permit that sat
//! in a stripe until time passed it: at most one lease per stripe.
//!
//! **Giving back.** When a key goes quiet (one stripe alone took leases for a while), the
//! stripe that noticed gives the unused end of its lease back to the central word, if that
//! lease is still the newest (the TAT is still its end); otherwise the run stays where it is
//! and is used or stolen like any other. A give-back only lowers the TAT by what the stripe
//! held, so it never lets more through than the lease would have.
//!
//! **Orderings.** A lease is claimed on its stripe (the stripe set to `BUSY`) before the
//! central word is asked, and stored once it is taken. A request that finds the central word
//! empty and then every stripe empty must not miss a lease taken before its look at the
//! central word: the lease's compare-and-swap on the central word is `AcqRel` and the
//! request's read of it `Acquire` (every later write of the word is a read-modify-write, so
//! the lease's release reaches any later value read), so the request then sees the claim,
//! the lease, or what is left of it. A give-back is the other way round (the central word
//! gains what a stripe loses), so a refusal also reads a count of give-backs before and after
//! its look: a give-back bumps it before it empties its stripe, so a request that saw the
//! stripe empty sees the count changed and looks again.

use std::cell::Cell;
use std::sync::atomic::AtomicUsize;

use crossbeam_utils::CachePadded;

use crate::decision::Decision;
use crate::engine::retry::Retry;
use crate::engine::sync::{AtomicU64, Mutex, MutexGuard, Ordering};
use crate::engine::token_bucket::{Gcra, GcraCell, LAST_LEASED};

/// A stripe with nothing in it (no run starts at 0: a stretch ends at `T` or later).
const EMPTY: u64 = 0;
/// A stripe whose lease is being taken from, or given back to, the central word: a request
/// that meets it waits rather than refuse.
const BUSY: u64 = u64::MAX;
/// A stripe of a state retired by a policy change: never used again.
const RETIRED: u64 = u64::MAX - 1;
const _: () = assert!(
    LAST_LEASED < RETIRED && RETIRED < BUSY,
    "no run reaches a marker"
);

/// How long a lease lasts at the policy's rate, at most: the time its run of the timeline
/// covers. Long enough that taking leases costs little beside the decisions they serve (one
/// per several hundred at a full bucket and tens of millions of decisions a second), short
/// enough that a stripe holds few permits of a slow policy.
const LEASE_SPAN: u64 = 10_000;
/// The most permits one lease takes.
const MAX_LEASE: u64 = 1 << 16;
/// How long one stripe alone must take leases before the key counts as quiet, in ns.
pub(crate) const QUIET_SPAN: u64 = 1_000_000;

/// One stripe, alone on its cache line: the run `(next, end]` of its lease not yet used.
///
/// `next` is the word requests compare-and-swap; `end` is written only while `next` is
/// [`BUSY`], before the `Release` store that publishes the lease, so a request that read
/// `next` with `Acquire` reads that lease's `end` or a later one's. A stripe's `next` only
/// grows from one lease to the next (a lease starts at or after the central TAT, which is at
/// or after every run a stripe holds: a give-back or a refund never moves it below one), so a
/// compare-and-swap from a `next` read before a new lease was stored fails: `next` and `end`
/// are always of one lease when it succeeds.
#[derive(Debug)]
struct Stripe {
    next: AtomicU64,
    end: AtomicU64,
}

impl Stripe {
    fn new() -> Self {
        Stripe {
            next: AtomicU64::new(EMPTY),
            end: AtomicU64::new(0),
        }
    }

    /// The end of the run whose `next` the caller read (see the type's docs).
    #[inline(always)]
    fn end(&self) -> u64 {
        // Relaxed: ordered by the Acquire read of `next` (see the type's docs).
        self.end.load(Ordering::Relaxed)
    }

    /// Publishes a run, from [`BUSY`] only: a policy change that retired the stripe in
    /// between counted what the claim was for as spent, and keeps it retired.
    fn publish(&self, next: u64, end: Option<u64>) {
        if let Some(end) = end {
            // Relaxed: published by the Release below.
            self.end.store(end, Ordering::Relaxed);
        }
        // Release: publishes the run to the requests that take from it.
        let _ = self
            .next
            .compare_exchange(BUSY, next, Ordering::Release, Ordering::Relaxed);
    }
}

/// The stretch a request at `now` would take from the run `(start, end]`: its end, if the run
/// has a whole interval left that may be used at `now`.
#[inline(always)]
fn next_slot(gcra: &Gcra, start: u64, end: u64, now: u64) -> Option<u64> {
    let slot = start.max(now).checked_add(gcra.interval())?;
    (slot <= end && slot - now <= gcra.burst()).then_some(slot)
}

/// The permits the run `(start, end]` holds that may be used at `now`.
fn usable(gcra: &Gcra, start: u64, end: u64, now: u64) -> u64 {
    let from = start.max(now);
    let to = end.min(now.saturating_add(gcra.burst()));
    gcra.intervals(to.saturating_sub(from))
}

thread_local! {
    /// The calling thread's index, for its home stripe (`usize::MAX` until it has one).
    static INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// The index of the calling thread, for its home stripe: threads are numbered as they first
/// decide on a striped key, so the first threads of a process each have a stripe of their
/// own; a thread that meets another on its stripe moves on ([`rehome`]).
#[inline(always)]
fn thread_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    INDEX.with(|index| {
        let mut i = index.get();
        if i == usize::MAX {
            // Relaxed: a number, no memory published through it.
            i = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            index.set(i);
        }
        i
    })
}

/// Moves the calling thread to the next stripe, after it lost a compare-and-swap on its home
/// stripe to another thread with the same home: threads that come and go (a pool that
/// replaces its workers) are numbered on, and two of them may land on one stripe; the one
/// that notices moves, as `LongAdder`'s cells are re-probed on contention.
#[cold]
fn rehome() {
    INDEX.with(|index| index.set(index.get().wrapping_add(1)));
}

/// What a look at one stripe found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Took {
    /// A stretch ending at `.0`, now the caller's; the stripe's run ends at `.1`.
    Slot(u64, u64),
    /// Nothing usable at `now`; the stripe's `next` as read.
    Empty(u64),
    /// A lease is being stored or given back: look again.
    Busy,
    /// The state was retired.
    Retired,
}

/// What a refill of the home stripe did.
enum Refill {
    /// A lease taken: the caller's stretch ends at `.0`, the run at `.1`.
    Leased(u64, u64),
    /// The central word had nothing at `now`.
    Dry,
    /// The stripe changed under the caller: take from it again.
    Raced,
    /// The state was retired.
    Retired,
}

/// What a look at the central word and every stripe concluded.
enum Scan {
    /// A stretch taken from some stripe: ends at `.0`, its run at `.1`.
    Slot(u64, u64),
    /// Nothing anywhere at one instant: refused.
    Refused(Decision),
    /// The central word had room, or a lease was moving: decide again.
    Again,
}

/// A decision made on the stripes, and whether the key has gone quiet (one stripe alone
/// took leases for [`QUIET_SPAN`]): time to decide on the central word alone again.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Striped {
    pub(crate) decision: Decision,
    /// Whether the key has gone quiet: its requests go back to the central word, and
    /// stripe [`Striped::home`] gives its lease back.
    pub(crate) quiet: bool,
    /// The stripe that decided.
    pub(crate) home: usize,
}

impl Striped {
    fn new(decision: Decision, quiet: bool, home: usize) -> Self {
        Striped {
            decision,
            quiet,
            home,
        }
    }
}

/// The lock of whatever moves a key's TAT back (see [`Stripes::settle`]); a poisoned lock
/// guards nothing that a panic could have left half-written.
fn lock(lowering: &Mutex<()>) -> MutexGuard<'_, ()> {
    lowering
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The words written when a lease is taken or given back, on a line of their own.
#[derive(Debug, Default)]
struct Leasing {
    /// Give-backs so far (see the module's orderings).
    returns: AtomicU64,
    /// When the current span of watching which stripes take leases began.
    since: AtomicU64,
    /// The stripes that took a lease since then, one bit each.
    takers: AtomicU64,
}

/// The stripes of one key.
#[derive(Debug)]
pub(crate) struct Stripes {
    stripes: Box<[CachePadded<Stripe>]>,
    /// `stripes.len() - 1`; the length is a power of two.
    mask: usize,
    /// Permits per lease (at most; fewer when the central word has fewer).
    lease: u64,
    leasing: CachePadded<Leasing>,
}

impl Stripes {
    /// As many stripes as the machine runs threads at once (a power of two, 2 to 64), with
    /// leases sized for `gcra`.
    pub(crate) fn for_machine(gcra: &Gcra) -> Self {
        let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
        let count = cores.next_power_of_two().clamp(2, 64);
        Self::new(count, Self::lease_for(gcra, count))
    }

    /// How many permits a lease takes under `gcra` with `count` stripes: what [`LEASE_SPAN`]
    /// of the timeline holds, and never more than a share of the burst that leaves half of it
    /// in the central word when every stripe holds a lease.
    fn lease_for(gcra: &Gcra, count: usize) -> u64 {
        let share = gcra.limit() / (2 * count as u64);
        (LEASE_SPAN / gcra.interval())
            .min(share)
            .clamp(1, MAX_LEASE)
    }

    /// `count` empty stripes (rounded up to a power of two, at most 64) whose leases take up
    /// to `lease` permits each.
    pub(crate) fn new(count: usize, lease: u64) -> Self {
        let count = count.next_power_of_two().clamp(1, 64);
        Stripes {
            stripes: (0..count)
                .map(|_| CachePadded::new(Stripe::new()))
                .collect(),
            mask: count - 1,
            lease: lease.max(1),
            leasing: CachePadded::new(Leasing::default()),
        }
    }

    /// A request of cost 1 at `now` admitted from the calling thread's home stripe, if its
    /// lease has a permit: the hot path of a striped key, one compare-and-swap on the
    /// thread's own line. `None` otherwise: [`Stripes::acquire`] decides.
    #[inline(always)]
    pub(crate) fn try_home(&self, central: &GcraCell, gcra: &Gcra, now: u64) -> Option<Decision> {
        match self.take(thread_index() & self.mask, true, gcra, now) {
            Took::Slot(slot, end) => Some(allowed(central, gcra, now, slot, end)),
            _ => None,
        }
    }

    /// Decides a request of cost 1 at `now` from the calling thread's home stripe.
    #[inline(never)]
    pub(crate) fn acquire(&self, central: &GcraCell, gcra: &Gcra, now: u64) -> Option<Striped> {
        self.acquire_from(thread_index() & self.mask, central, gcra, now)
    }

    /// Decides a request of cost 1 at `now` from stripe `home`: its lease, else a new lease
    /// from `central`, else a permit of another stripe. `None` when the state was retired.
    pub(crate) fn acquire_from(
        &self,
        home: usize,
        central: &GcraCell,
        gcra: &Gcra,
        now: u64,
    ) -> Option<Striped> {
        let home = home & self.mask;
        // The admission of a stretch ending at `slot` from a run ending at `end`.
        let admit = |slot, end, quiet| {
            let decision = allowed(central, gcra, now, slot, end);
            Some(Striped::new(decision, quiet, home))
        };
        let mut retry = Retry::new();
        loop {
            let seen = match self.take(home, true, gcra, now) {
                Took::Slot(slot, end) => return admit(slot, end, false),
                Took::Retired => return None,
                Took::Busy => {
                    retry.snooze();
                    continue;
                }
                Took::Empty(seen) => seen,
            };
            match self.refill(home, seen, central, gcra, now) {
                Refill::Leased(slot, end) => return admit(slot, end, self.note_lease(home, now)),
                Refill::Retired => return None,
                Refill::Raced => {
                    retry.again();
                    continue;
                }
                Refill::Dry => {}
            }
            match self.scan(central, gcra, now)? {
                Scan::Slot(slot, end) => return admit(slot, end, false),
                Scan::Refused(decision) => return Some(Striped::new(decision, false, home)),
                Scan::Again => retry.snooze(),
            }
        }
    }

    /// Takes the next stretch of stripe `i` usable at `now`; `home` when `i` is the calling
    /// thread's home stripe (a lost compare-and-swap there moves the thread on).
    #[inline(always)]
    fn take(&self, i: usize, home: bool, gcra: &Gcra, now: u64) -> Took {
        let stripe = &self.stripes[i];
        // Acquire: pairs with the Release store of a lease, so its run is the one the central
        // word handed out.
        let mut next = stripe.next.load(Ordering::Acquire);
        let mut retry = Retry::new();
        loop {
            match next {
                EMPTY => return Took::Empty(EMPTY),
                BUSY => return Took::Busy,
                RETIRED => return Took::Retired,
                _ => {}
            }
            let end = stripe.end();
            let Some(slot) = next_slot(gcra, next, end, now) else {
                return Took::Empty(next);
            };
            // AcqRel: a success passes the run on as a lease's store does; Acquire on
            // failure: the value read is decided on next.
            match stripe
                .next
                .compare_exchange(next, slot, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Took::Slot(slot, end),
                Err(seen) => {
                    if home {
                        rehome();
                    }
                    next = seen;
                    retry.spin();
                }
            }
        }
    }

    /// Claims stripe `home`, which held `seen` with nothing usable, takes a lease from
    /// `central` and keeps its first stretch for the caller.
    fn refill(&self, home: usize, seen: u64, central: &GcraCell, gcra: &Gcra, now: u64) -> Refill {
        // No claim when the central word has nothing: a refusal writes no line.
        let Some(tat) = central.tat_acquire() else {
            return Refill::Retired;
        };
        if gcra.room(tat, now) == 0 {
            return Refill::Dry;
        }
        let stripe = &self.stripes[home];
        // AcqRel: the claim comes before the lease's compare-and-swap on the central word,
        // whose Release makes it visible to every request that reads that word with Acquire
        // afterwards (module's orderings); Acquire on failure: the value is looked at again.
        if stripe
            .next
            .compare_exchange(seen, BUSY, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Refill::Raced;
        }
        match central.lease(gcra, now, self.lease) {
            None => {
                stripe.publish(RETIRED, None);
                Refill::Retired
            }
            Some(None) => {
                stripe.publish(seen, None);
                Refill::Dry
            }
            Some(Some((start, end))) => {
                // At most `end`: a lease clamped at the end of the clock's range.
                let slot = start.saturating_add(gcra.interval()).min(end);
                stripe.publish(slot, Some(end));
                Refill::Leased(slot, end)
            }
        }
    }

    /// Looks at the central word, then at every stripe, taking the first permit found.
    /// `None` when the state was retired, or no lease fits (the end of the clock's range).
    fn scan(&self, central: &GcraCell, gcra: &Gcra, now: u64) -> Option<Scan> {
        // Acquire: pairs with the Release increment of a give-back (module's orderings).
        let returns = self.leasing.returns.load(Ordering::Acquire);
        let tat = central.tat_acquire()?;
        let verdict = gcra.decide(tat, now, 1).decision();
        if verdict.is_allowed() {
            // Room in the central word: lease it. At the end of the clock's range no lease
            // fits below the markers: `None`, and the caller decides on the word alone.
            return (tat.max(now) < LAST_LEASED).then_some(Scan::Again);
        }
        let mut moving = false;
        for i in 0..self.stripes.len() {
            match self.take(i, false, gcra, now) {
                Took::Slot(slot, end) => return Some(Scan::Slot(slot, end)),
                Took::Busy => moving = true,
                Took::Retired => return None,
                Took::Empty(_) => {}
            }
        }
        // Acquire: as above. The central word again too: a refund or a give-back that added
        // room after the first look is seen either here or in the count.
        if moving
            || self.leasing.returns.load(Ordering::Acquire) != returns
            || gcra.room(central.tat_acquire()?, now) > 0
        {
            return Some(Scan::Again);
        }
        Some(Scan::Refused(verdict))
    }

    /// Notes that stripe `home` took a lease at `now`: `true` when it alone has taken leases
    /// for a whole [`QUIET_SPAN`] (the key is no longer contended).
    fn note_lease(&self, home: usize, now: u64) -> bool {
        let bit = 1u64 << home;
        let leasing = &self.leasing;
        // Relaxed, here and below: a heuristic of when to stripe, no memory published; a
        // stale value only moves the moment the key is judged quiet.
        let since = leasing.since.load(Ordering::Relaxed);
        if now.saturating_sub(since) < QUIET_SPAN
            || leasing
                .since
                .compare_exchange(since, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            leasing.takers.fetch_or(bit, Ordering::Relaxed);
            return false;
        }
        // This request ended the span: judge it. A key judged quiet starts its next span
        // with no stripe noted, so that striped again it is not judged on this one.
        let quiet = leasing.takers.swap(bit, Ordering::Relaxed) == bit;
        if quiet {
            leasing.takers.store(0, Ordering::Relaxed);
        }
        quiet
    }

    /// Gives the unused end of stripe `home`'s lease back to `central`, when that lease is
    /// still the newest (see the module docs), holding `lowering` as a refund does (see
    /// [`Stripes::settle`]).
    pub(crate) fn give_back(
        &self,
        home: usize,
        lowering: &Mutex<()>,
        central: &GcraCell,
        now: u64,
    ) {
        let _lowering = lock(lowering);
        let stripe = &self.stripes[home & self.mask];
        // Acquire: as every read of a stripe.
        let next = stripe.next.load(Ordering::Acquire);
        if matches!(next, EMPTY | BUSY | RETIRED) {
            return;
        }
        let end = stripe.end();
        let from = next.max(now);
        if from >= end {
            return;
        }
        // AcqRel: the claim, as a lease's.
        if stripe
            .next
            .compare_exchange(next, BUSY, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return;
        }
        // Only while `end` is still the TAT: nothing was handed out after this run.
        if central.replace(end, from) {
            // Release, before the stripe is emptied: a refusal that sees it empty sees the
            // count moved (module's orderings).
            self.leasing.returns.fetch_add(1, Ordering::Release);
            stripe.publish(EMPTY, None);
        } else {
            // The same run back: requests that read `next` before the claim may take from it.
            stripe.publish(next, None);
        }
    }

    /// Settles, at `now`, a reservation of `held` permits that left the TAT at `mark` and
    /// really cost `actual`, on a token bucket that has (or may come to have) `stripes`: as
    /// `Gcra::settle`, except that a refund never moves the TAT below the end of a run a
    /// stripe still holds (those permits are not the reservation's to give back, and the
    /// central word would hand them out a second time). `None` when retired.
    ///
    /// A refund holds `lowering`, the key's lock for whatever moves its TAT back (refunds and
    /// give-backs): every other write moves the TAT on, so a TAT that still holds the value
    /// read when the compare-and-swap comes has not changed at all, and the runs read in
    /// between are still the ones above it. Without the lock, two refunds and a lease could
    /// bring the TAT back to the value read, over a run read as absent.
    pub(crate) fn settle(
        stripes: &std::sync::OnceLock<Stripes>,
        lowering: &Mutex<()>,
        central: &GcraCell,
        gcra: &Gcra,
        (held, mark, actual): (u64, u64, u64),
        now: u64,
    ) -> Option<()> {
        let _lowering = (actual < held).then(|| lock(lowering));
        let mut retry = Retry::new();
        loop {
            // The TAT before the stripes: a lease taken before this read is seen claimed or
            // stored below (the lease's compare-and-swap releases what its thread wrote
            // before, its claim included, to this Acquire read); one taken after it makes the
            // compare-and-swap below fail.
            let tat = central.tat_acquire()?;
            let leased = stripes.get();
            let floor = match leased.map(Stripes::held_until) {
                None => 0,
                Some(Some(furthest)) => furthest,
                // A lease is being stored: its end is not known yet.
                Some(None) => {
                    retry.snooze();
                    continue;
                }
            };
            let settled = gcra
                .settle(tat, held, mark, actual, now)
                .max(floor.min(tat));
            if let (true, Some(stripes)) = (settled < tat, leased) {
                // Release, before the central word gains permits (module's orderings): a
                // refusal racing the refund sees the count moved and looks again.
                stripes.leasing.returns.fetch_add(1, Ordering::Release);
            }
            if central.replace(tat, settled) {
                return Some(());
            }
            retry.spin();
        }
    }

    /// The end of the furthest run any stripe holds; `None` while a lease is being stored
    /// (its end is not known yet).
    fn held_until(&self) -> Option<u64> {
        let mut furthest = 0;
        for stripe in &*self.stripes {
            // Acquire: as every read of a stripe.
            match stripe.next.load(Ordering::Acquire) {
                BUSY => return None,
                EMPTY | RETIRED => {}
                _ => furthest = furthest.max(stripe.end()),
            }
        }
        Some(furthest)
    }

    /// The permits every stripe holds that may be used at `now` (a snapshot).
    pub(crate) fn usable(&self, gcra: &Gcra, now: u64) -> u64 {
        self.stripes
            .iter()
            // Acquire: as every read of a stripe.
            .map(|stripe| {
                // A `next` and an `end` of one lease: `next` read again after `end`.
                let mut retry = Retry::new();
                loop {
                    match stripe.next.load(Ordering::Acquire) {
                        EMPTY | BUSY | RETIRED => return 0,
                        next => {
                            let end = stripe.end();
                            // Acquire: as every read of a stripe.
                            if stripe.next.load(Ordering::Acquire) == next {
                                return usable(gcra, next, end, now);
                            }
                        }
                    }
                    retry.again();
                }
            })
            .sum()
    }

    /// Retires every stripe, after the central word was retired by a policy change: a request
    /// that still finds them looks the state up again. What they held was counted as spent
    /// when the central word was retired.
    pub(crate) fn retire(&self) {
        for stripe in &*self.stripes {
            // Release: as a lease's store; a request on this stripe now finds it retired.
            stripe.next.store(RETIRED, Ordering::Release);
        }
    }

    /// The decision a look that changes nothing gives at `now`: the central word's, with
    /// what the stripes hold added.
    pub(crate) fn peek(&self, central: &GcraCell, gcra: &Gcra, now: u64) -> Option<Decision> {
        let tat = central.tat_acquire()?;
        let held = self.usable(gcra, now);
        let reset = gcra.reset_after(tat, now);
        let decision = gcra.decide(tat, now, 1).decision();
        Some(if decision.is_allowed() {
            Decision::allow(
                (decision.remaining() + held).min(gcra.limit() - 1),
                gcra.limit(),
                decision.reset_after_nanos(),
            )
        } else if held > 0 {
            Decision::allow(held - 1, gcra.limit(), reset)
        } else {
            decision
        })
    }
}

/// The admission of a stretch ending at `slot` from a run ending at `end`: what remains is
/// what the central word has at `now` and what the deciding stripe still holds (another
/// stripe's lease is not counted: reading every stripe on every decision would pull their
/// lines; see the module docs); the key is at rest when the central TAT is reached.
#[inline(always)]
fn allowed(central: &GcraCell, gcra: &Gcra, now: u64, slot: u64, end: u64) -> Decision {
    // The central TAT is at or after the end of every lease (a give-back or a refund lowers
    // it no further than the runs the stripes hold), so it is when the key comes to rest.
    let tat = central.tat_relaxed().unwrap_or(end);
    // Never more than the limit less this admission, whatever a snapshot of two words says.
    let remaining = (gcra.room(tat, now) + gcra.intervals(end - slot)).min(gcra.limit() - 1);
    Decision::allow(
        remaining,
        gcra.limit(),
        gcra.reset_after(tat.max(slot), now),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Barrier};

    use super::*;
    use crate::engine::state::RateState;
    use crate::policy::Policy;

    const S: u64 = 1_000_000_000;

    fn parts(policy: &str) -> (GcraCell, Gcra) {
        let policy: Policy = policy.parse().unwrap();
        let gcra = GcraCell::params(&policy);
        (GcraCell::fresh(&gcra), gcra)
    }

    fn admits(stripes: &Stripes, central: &GcraCell, gcra: &Gcra, now: u64, home: usize) -> bool {
        stripes
            .acquire_from(home, central, gcra, now)
            .unwrap()
            .decision
            .is_allowed()
    }

    #[test]
    fn each_thread_has_an_index_of_its_own_and_moves_on_when_it_meets_another() {
        let mine = std::thread::spawn(|| {
            let first = thread_index();
            assert_eq!(thread_index(), first, "an index stays with its thread");
            rehome();
            (first, thread_index())
        })
        .join()
        .unwrap();
        assert_eq!(mine.1, mine.0.wrapping_add(1), "moved to the next stripe");
        let theirs = std::thread::spawn(thread_index).join().unwrap();
        assert_ne!(theirs, mine.0, "another thread, another index");
    }

    #[test]
    fn a_lease_covers_ten_microseconds_of_the_timeline_and_never_half_the_burst() {
        let (_, fast) = parts("1000000000/1s"); // T = 1 ns
        assert_eq!(Stripes::lease_for(&fast, 2), 10_000);
        let (_, tight) = parts("100000/1ms"); // T = 10 ns, a burst of 100,000
        assert_eq!(Stripes::lease_for(&tight, 64), 781, "100,000 / 128");
        let (_, slow) = parts("10/1s"); // T = 100 ms
        assert_eq!(Stripes::lease_for(&slow, 2), 1);
    }

    #[test]
    fn the_fast_path_takes_from_the_stripe_its_thread_leased_on() {
        let (central, gcra) = parts("10/1s");
        let stripes = Stripes::new(2, 3);
        INDEX.with(|index| index.set(0)); // this thread's home: stripe 0
        assert!(
            stripes.try_home(&central, &gcra, 0).is_none(),
            "no lease yet"
        );
        let striped = stripes.acquire(&central, &gcra, 0).unwrap();
        assert!(striped.decision.is_allowed());
        assert_eq!(striped.home, 0);
        assert!(stripes.try_home(&central, &gcra, 0).unwrap().is_allowed());
        assert!(stripes.try_home(&central, &gcra, 0).unwrap().is_allowed());
        assert!(
            stripes.try_home(&central, &gcra, 0).is_none(),
            "the lease is used up"
        );
    }

    #[test]
    fn a_clock_past_the_last_leased_instant_sends_requests_to_the_word() {
        let (central, gcra) = parts("10/1s");
        let stripes = Stripes::new(2, 4);
        assert!(stripes
            .acquire_from(0, &central, &gcra, u64::MAX - 1)
            .is_none());
    }

    #[test]
    fn a_look_that_changes_nothing_counts_what_only_the_stripes_hold() {
        let (central, gcra) = parts("4/1s");
        let stripes = Stripes::new(2, 4);
        assert!(admits(&stripes, &central, &gcra, 0, 0)); // the whole burst leased, one used
        let peeked = stripes.peek(&central, &gcra, 0).unwrap();
        assert!(peeked.is_allowed());
        assert_eq!(
            peeked.remaining(),
            2,
            "three in stripe 0, one taken by the look"
        );
        assert_eq!(peeked.available_before(1), 3);
    }

    #[test]
    fn a_frozen_clock_admits_exactly_the_burst_over_every_stripe() {
        let (central, gcra) = parts("10/1s");
        let stripes = Stripes::new(4, 3);
        let admitted = (0..40)
            .filter(|i| admits(&stripes, &central, &gcra, 0, i % 4))
            .count();
        assert_eq!(admitted, 10);
        assert_eq!(stripes.usable(&gcra, 0), 0);
    }

    #[test]
    fn a_stripe_steals_before_it_refuses() {
        let (central, gcra) = parts("4/1s");
        let stripes = Stripes::new(2, 4);
        // Stripe 0 leases all four permits and uses one.
        assert!(admits(&stripes, &central, &gcra, 0, 0));
        assert_eq!(stripes.usable(&gcra, 0), 3);
        // Stripe 1 finds the central word empty and takes stripe 0's permits.
        for _ in 0..3 {
            assert!(admits(&stripes, &central, &gcra, 0, 1));
        }
        assert!(!admits(&stripes, &central, &gcra, 0, 1));
        assert!(!admits(&stripes, &central, &gcra, 0, 0));
    }

    #[test]
    fn the_part_of_a_lease_time_has_passed_is_dropped_not_spent() {
        let (central, gcra) = parts("4/4s"); // T = 1 s, B = 4 s
        let stripes = Stripes::new(1, 4);
        assert!(admits(&stripes, &central, &gcra, 0, 0)); // lease (0, 4 s], first stretch (0, 1 s]
                                                          // At 2.5 s the run from 1 s to 2.5 s lies in the past: the next stretch is (2.5, 3.5].
        let striped = stripes.acquire_from(0, &central, &gcra, 5 * S / 2).unwrap();
        assert!(striped.decision.is_allowed());
        assert_eq!(
            stripes.usable(&gcra, 5 * S / 2),
            0,
            "half an interval is not a permit"
        );
        // The central word, at 4 s, has two permits at 2.5 s (B = 4 s): the next lease.
        assert_eq!(striped.decision.remaining(), 2);
        assert!(admits(&stripes, &central, &gcra, 5 * S / 2, 0));
        assert!(admits(&stripes, &central, &gcra, 5 * S / 2, 0));
        assert!(!admits(&stripes, &central, &gcra, 5 * S / 2, 0));
    }

    #[test]
    fn a_refusal_says_when_the_central_word_has_a_permit_again() {
        let (central, gcra) = parts("2/1s");
        let stripes = Stripes::new(2, 1);
        assert!(admits(&stripes, &central, &gcra, 0, 0));
        assert!(admits(&stripes, &central, &gcra, 0, 1));
        let refused = stripes
            .acquire_from(0, &central, &gcra, 0)
            .unwrap()
            .decision;
        assert!(!refused.is_allowed());
        assert_eq!(refused.retry_after_nanos(), S / 2);
        assert_eq!(refused.reset_after_nanos(), S);
    }

    #[test]
    fn the_newest_lease_is_given_back_and_an_older_one_stays() {
        let (central, gcra) = parts("10/1s");
        let stripes = Stripes::new(2, 4);
        assert!(admits(&stripes, &central, &gcra, 0, 0)); // stripe 0: (0, 0.4 s]
        assert!(admits(&stripes, &central, &gcra, 0, 1)); // stripe 1: (0.4, 0.8 s], the newest
        stripes.give_back(0, &Mutex::new(()), &central, 0);
        assert_eq!(
            stripes.usable(&gcra, 0),
            6,
            "not the newest: stays with its stripe"
        );
        stripes.give_back(1, &Mutex::new(()), &central, 0);
        assert_eq!(stripes.usable(&gcra, 0), 3);
        assert_eq!(
            central.tat_relaxed(),
            Some(S / 2),
            "stripe 1's three unused permits back"
        );
        let peeked = stripes.peek(&central, &gcra, 0).unwrap();
        assert_eq!(
            peeked.remaining(),
            7,
            "5 central + 3 in stripe 0, one taken by the peek"
        );
        let admitted = (0..20)
            .filter(|i| admits(&stripes, &central, &gcra, 0, i % 2))
            .count();
        assert_eq!(admitted, 8, "two used, eight left");
    }

    #[test]
    fn a_key_is_quiet_once_one_stripe_alone_took_leases_for_the_whole_span() {
        let stripes = Stripes::new(2, 1);
        assert!(!stripes.note_lease(0, QUIET_SPAN), "the first span starts");
        assert!(!stripes.note_lease(1, QUIET_SPAN + 1));
        assert!(
            !stripes.note_lease(0, 2 * QUIET_SPAN + 1),
            "two stripes took leases"
        );
        assert!(!stripes.note_lease(0, 2 * QUIET_SPAN + 2));
        assert!(stripes.note_lease(0, 3 * QUIET_SPAN + 2), "stripe 0 alone");
        // Striped again later: judged on a span of its own, not on the one before.
        assert!(!stripes.note_lease(0, 100 * QUIET_SPAN));
        assert!(
            stripes.note_lease(0, 102 * QUIET_SPAN),
            "stripe 0 alone again"
        );
    }

    #[test]
    fn a_refund_stops_at_the_runs_the_stripes_hold() {
        let (central, gcra) = parts("10000/1ms");
        let lock = std::sync::OnceLock::new();
        let stripes = lock.get_or_init(|| Stripes::new(64, Stripes::lease_for(&gcra, 64)));
        // A reservation, then a lease on every stripe above it; the reservation is cancelled.
        let (_, mark) = central.reserve_at(&gcra, 0, 5008, || {}).unwrap();
        for home in 0..64 {
            assert!(admits(stripes, &central, &gcra, 0, home));
        }
        let before = central.tat_relaxed().unwrap();
        Stripes::settle(&lock, &Mutex::new(()), &central, &gcra, (5008, mark, 0), 0).unwrap();
        assert_eq!(
            central.tat_relaxed(),
            Some(before),
            "the runs above the reservation are the stripes': nothing to give back under them"
        );
        // When the key is full again, it admits its burst and no more.
        let admitted = (0..30_000)
            .filter(|i| admits(stripes, &central, &gcra, before, i % 64))
            .count();
        assert_eq!(admitted, 10_000);
    }

    #[test]
    fn a_refund_above_every_run_gives_back_and_a_racing_refusal_looks_again() {
        let (central, gcra) = parts("10/1s");
        let lock = std::sync::OnceLock::new();
        let stripes = lock.get_or_init(|| Stripes::new(2, 2));
        assert!(admits(stripes, &central, &gcra, 0, 0)); // stripe 0: (0.1, 0.2 s]
        let (_, mark) = central.reserve_at(&gcra, 0, 5, || {}).unwrap(); // (0.2, 0.7 s]
        let returns = stripes.leasing.returns.load(Ordering::Relaxed);
        Stripes::settle(&lock, &Mutex::new(()), &central, &gcra, (5, mark, 2), 0).unwrap();
        assert_eq!(
            central.tat_relaxed(),
            Some(S * 4 / 10),
            "three of five back"
        );
        assert_eq!(stripes.leasing.returns.load(Ordering::Relaxed), returns + 1);
        assert_eq!(stripes.peek(&central, &gcra, 0).unwrap().remaining(), 6);
    }

    #[test]
    fn a_lease_at_the_end_of_the_clocks_range_stays_live() {
        let (central, gcra) = parts("10/1s");
        let stripes = Stripes::new(2, 4);
        let now = u64::MAX - gcra.interval();
        assert!(admits(&stripes, &central, &gcra, now, 0));
        assert!(central.tat_relaxed().is_some(), "not retired");
        // Every request there is answered, none sent round for ever (a debug build panics
        // after `Retry::LIMIT` rounds): by the stripes, or handed back to decide on the word
        // once no lease fits.
        for i in 0..20 {
            let _ = stripes.acquire_from(i % 2, &central, &gcra, now);
        }
    }

    #[test]
    fn retired_stripes_send_requests_back() {
        let (central, gcra) = parts("4/1s");
        let stripes = Stripes::new(2, 2);
        assert!(admits(&stripes, &central, &gcra, 0, 0));
        stripes.retire();
        assert!(stripes.acquire_from(0, &central, &gcra, 0).is_none());
    }

    #[test]
    fn sixteen_threads_on_a_frozen_clock_admit_exactly_the_burst() {
        for round in 0..200 {
            let (central, gcra) = parts("10/1s");
            let shared = Arc::new((central, gcra, Stripes::new(4, 3)));
            let start = Arc::new(Barrier::new(16));
            let admitted: usize = (0..16)
                .map(|thread| {
                    let (shared, start) = (Arc::clone(&shared), Arc::clone(&start));
                    std::thread::spawn(move || {
                        let (central, gcra, stripes) = &*shared;
                        start.wait();
                        (0..2)
                            .filter(|_| admits(stripes, central, gcra, 0, thread))
                            .count()
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|handle| handle.join().unwrap())
                .sum();
            assert_eq!(admitted, 10, "round {round}");
        }
    }

    proptest::proptest! {
        /// With a moving clock every admission holds a stretch of the timeline of its own,
        /// `(s, s + T]` with `now <= s` and `s + T <= now + B`, so no interval admits more than
        /// GCRA's bound; and a request is refused only when a look that changes nothing (the
        /// central word plus every stripe) finds nothing either.
        #[test]
        fn every_admission_holds_a_stretch_gcra_could_grant(
            steps in proptest::collection::vec((0usize..4, 0u64..700_000_000, proptest::bool::ANY), 1..300),
            stripes in 1usize..5,
            lease in 1u64..6,
        ) {
            let (central, gcra) = parts("5/1s"); // T = 200 ms, B = 1 s
            let striped = Stripes::new(stripes, lease);
            let (t, b) = (gcra.interval(), gcra.burst());
            let mut now = 0;
            let mut admitted: Vec<(u64, u64)> = Vec::new();
            for (home, advance, give_back) in steps {
                now += advance;
                if give_back {
                    striped.give_back(home, &Mutex::new(()), &central, now);
                }
                let before = striped.peek(&central, &gcra, now).unwrap();
                let decision = striped.acquire_from(home, &central, &gcra, now).unwrap().decision;
                proptest::prop_assert_eq!(decision.is_allowed(), before.is_allowed(), "at {}", now);
                if decision.is_allowed() {
                    // The stretch's end: the TAT it would leave on a lone stripe.
                    let end = now + decision.reset_after_nanos().min(b);
                    proptest::prop_assert!(end >= now + t, "stretch ending {end} at {now}");
                    admitted.push((now, end));
                }
            }
            // GCRA's bound over every interval between two admissions: at most
            // L / T + B / T admissions in an interval of length L.
            for (i, &(from, _)) in admitted.iter().enumerate() {
                for (j, &(to, _)) in admitted.iter().enumerate().skip(i) {
                    let count = (j - i + 1) as u64;
                    proptest::prop_assert!(count <= (to - from) / t + b / t, "{count} in [{from}, {to}]");
                }
            }
        }
    }
}
