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
//! instant, so on a frozen clock a key of `N` permits admits exactly `N` requests of cost 1,
//! however many threads race. What a striped key may under-admit, never over-admit: a permit
//! that sat in a stripe until time passed it (at most one lease per stripe); a request of
//! cost above 1 or a reservation, which takes from the central word alone, refused while
//! stripes hold permits; a refund cut short at the end of the latest run a stripe leased
//! ([`Stripes::settle`]), up to the whole of it; and what the stripes held when the policy
//! changes, counted as spent.
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
/// A stripe retired: its state was retired by a policy change, or the keyed limiter unstriped
/// the key (`keyed::striped`). Never used again.
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
/// or after every run a stripe holds or gave back: a give-back leaves the TAT at the run's
/// `next`, and a refund never moves the TAT below a run's end or below `given_back`), so a
/// compare-and-swap from a `next` read before a new lease was stored fails: `next` and
/// `end` are always of one lease when it succeeds.
#[derive(Debug)]
struct Stripe {
    next: AtomicU64,
    end: AtomicU64,
    /// Where the stripe's latest give-back left the TAT (0: none). A refund never moves the
    /// TAT below it, so the TAT never goes back under a `next` a request may have read from
    /// the stripe before the give-back, and that request's compare-and-swap fails against
    /// any later lease of the stripe. A word of its own, not `end`: a request that read
    /// `next` before the give-back may read `end` after it, and must find there an end of
    /// a run, not a point inside it (loom found a refusal with a permit left that way).
    /// Written and read under the key's `lowering` lock.
    given_back: AtomicU64,
}

impl Stripe {
    fn new() -> Self {
        Stripe {
            next: AtomicU64::new(EMPTY),
            end: AtomicU64::new(0),
            given_back: AtomicU64::new(0),
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

/// What [`Stripes::home`] found on the calling thread's home stripe.
pub(crate) enum Home {
    /// Admitted from the stripe's lease.
    Decided(Decision),
    /// Nothing usable, or a lease moving: [`Stripes::acquire`] decides.
    Empty,
    /// The stripes are retired.
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
    /// leases sized for `gcra`, made at `now`.
    pub(crate) fn for_machine(gcra: &Gcra, now: u64) -> Self {
        // Asked once: the answer reads cgroup files, and stripes are made on a request's path.
        static COUNT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        let count = *COUNT.get_or_init(|| {
            let cores = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
            cores.next_power_of_two().clamp(2, 64)
        });
        let stripes = Self::new(count, Self::lease_for(gcra, count));
        // Relaxed: not yet shared.
        stripes.leasing.since.store(now, Ordering::Relaxed);
        stripes
    }

    /// When the current span of watching which stripes take leases began: the stripes were
    /// made then, or a lease was taken at most [`QUIET_SPAN`] after it. Long ago means no
    /// lease for as long.
    pub(crate) fn last_span(&self) -> u64 {
        // Relaxed: a heuristic, as in `note_lease`.
        self.leasing.since.load(Ordering::Relaxed)
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
        match self.home(central, gcra, now) {
            Home::Decided(decision) => Some(decision),
            Home::Empty | Home::Retired => None,
        }
    }

    /// [`Stripes::try_home`], telling stripes retired (their key left the table or went
    /// back to its word; no request takes from them again) from a home stripe with nothing.
    #[inline(always)]
    pub(crate) fn home(&self, central: &GcraCell, gcra: &Gcra, now: u64) -> Home {
        self.home_from(thread_index(), central, gcra, now)
    }

    /// [`Stripes::home`] on stripe `home`.
    #[inline(always)]
    pub(crate) fn home_from(&self, home: usize, central: &GcraCell, gcra: &Gcra, now: u64) -> Home {
        match self.take(home & self.mask, true, gcra, now) {
            Took::Slot(slot, end) => Home::Decided(allowed(central, gcra, now, slot, end)),
            Took::Retired => Home::Retired,
            Took::Empty(_) | Took::Busy => Home::Empty,
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
            // Relaxed: read only under `lowering`, which this give-back holds (see
            // `Stripe::given_back`).
            stripe.given_back.store(from, Ordering::Relaxed);
            stripe.publish(EMPTY, None);
        } else {
            // The same run back: requests that read `next` before the claim may take from it.
            stripe.publish(next, None);
        }
    }

    /// Settles, at `now`, a reservation of `held` permits that left the TAT at `mark` and
    /// really cost `actual`, on a token bucket that has (or may come to have) the stripes
    /// `stripes` finds (asked again after each read of the TAT): as
    /// `Gcra::settle`, except that a refund never moves the TAT below the end of a run a
    /// stripe holds, used up or not, nor below where a give-back left it (`held_until`):
    /// unused, those permits are the stripe's, and the central word would hand them out a
    /// second time; used up, the stripe's `next` must still only grow from one lease to the
    /// next (see [`Stripe`]). So a reservation settled after a stripe leased a run above it
    /// gets back less than it held, or nothing. `None` when retired.
    ///
    /// A refund holds `lowering`, the key's lock for whatever moves its TAT back (refunds and
    /// give-backs): every other write moves the TAT on, so a TAT that still holds the value
    /// read when the compare-and-swap comes has not changed at all, and the runs read in
    /// between are still the ones above it. Without the lock, two refunds and a lease could
    /// bring the TAT back to the value read, over a run read as absent.
    pub(crate) fn settle<'s>(
        stripes: impl Fn() -> Option<&'s Stripes>,
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
            let leased = stripes();
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

    /// The end of the furthest run any stripe holds, and the furthest point a stripe's
    /// give-back left the TAT at (see `Stripe::given_back`); `None` while a lease is being
    /// stored (its end is not known yet). Called under the key's `lowering` lock.
    fn held_until(&self) -> Option<u64> {
        let mut furthest = 0;
        for stripe in &*self.stripes {
            // Acquire: as every read of a stripe.
            match stripe.next.load(Ordering::Acquire) {
                BUSY => return None,
                RETIRED => continue,
                EMPTY => {}
                _ => furthest = furthest.max(stripe.end()),
            }
            // Relaxed: written under the `lowering` lock the caller holds.
            furthest = furthest.max(stripe.given_back.load(Ordering::Relaxed));
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

    /// Whether the stripes are retired (a snapshot: every stripe is retired at once).
    pub(crate) fn is_retired(&self) -> bool {
        // Relaxed: a look for whether to let go of a handle to them; nothing is decided on it.
        self.stripes[0].next.load(Ordering::Relaxed) == RETIRED
    }

    /// Retires every stripe: after the central word was retired by a policy change (what they
    /// held was counted as spent then), or when the keyed limiter unstripes the key (what they
    /// held stays spent until time passes it). A request that still finds them decides on the
    /// central word, or looks the state up again when that is retired too.
    pub(crate) fn retire(&self) {
        for stripe in &*self.stripes {
            // Release: as a lease's store; a request on this stripe now finds it retired. A
            // swap, where a store would do on the machine (a compare-and-swap reads the latest
            // value, so a take's fails against an earlier store): loom 0.7 lets a plain store
            // fall between a read-modify-write's read and its write, and its models of a pinned
            // take racing the retirement then report a take over a retired stripe that cannot
            // happen. Two read-modify-writes it orders.
            stripe.next.swap(RETIRED, Ordering::Release);
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
mod tests;
