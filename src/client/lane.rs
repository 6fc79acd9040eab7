//! [`Lanes`]: per key, the queue its callers wait in (first come, first served among the
//! callers being polled) and what the upstream last said about its quota.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Poll, Waker};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

use super::heard::{Left, MOST_POLICIES};

/// How long past the instant it is due (its permit's, or the one its turn came at) the head
/// of a lane's queue may go unpolled before its turn lapses and the next caller goes.
const GRACE: Duration = Duration::from_millis(10);

/// The map is first tidied when it holds this many lanes.
const TIDY_FIRST: usize = 1_024;

/// Every key's lane.
pub(super) struct Lanes(Mutex<Map>);

struct Map {
    lanes: HashMap<String, Arc<Lane>>,
    /// The size at which new lanes next trigger a tidy: twice what the last one kept, so
    /// that tidying costs a constant per lane made, however many keys stay busy.
    tidy_at: usize,
}

impl Default for Lanes {
    fn default() -> Self {
        Lanes(Mutex::new(Map {
            lanes: HashMap::new(),
            tidy_at: TIDY_FIRST,
        }))
    }
}

impl Lanes {
    /// `key`'s lane, made on first use.
    pub(super) fn get(&self, key: &str) -> Arc<Lane> {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(lane) = map.lanes.get(key) {
            return Arc::clone(lane);
        }
        if map.lanes.len() >= map.tidy_at {
            let now = Instant::now();
            // A lane no caller holds, with nothing in flight and nothing said that still
            // holds, is the same as a new one.
            map.lanes
                .retain(|_, lane| Arc::strong_count(lane) > 1 || !lane.told().is_idle(now));
            map.tidy_at = (map.lanes.len() * 2).max(TIDY_FIRST);
        }
        Arc::clone(map.lanes.entry(key.to_owned()).or_default())
    }
}

/// One key's lane.
#[derive(Default)]
pub(super) struct Lane {
    queue: Mutex<Queue>,
    told: Mutex<Told>,
    /// Wakes the lane's watch ([`Lane::start_watch`]) when the head's turn comes to end
    /// sooner than the watch sleeps for.
    watch: tokio::sync::Notify,
}

impl Lane {
    pub(super) fn told(&self) -> MutexGuard<'_, Told> {
        self.told.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn queue(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a call of `units` in flight at `now` if what the upstream said lets it go,
    /// before its permit is taken, so that a caller deciding meanwhile (a head whose turn
    /// lapsed during a Redis round trip, and the caller that went on) reads the cap with it
    /// in. `Err` with the instant until which it is held back.
    pub(super) fn claim(&self, now: Instant, units: u64) -> Result<Claim<'_>, Instant> {
        let mut told = self.told();
        if let Some(until) = told.holds_back(now, units) {
            return Err(until);
        }
        told.admit(now, units);
        Ok(Claim {
            lane: self,
            units,
            kept: false,
        })
    }

    /// Does what a change to the queue calls for, out of its lock.
    fn follow(self: &Arc<Self>, effects: Effects) {
        if let Some(waker) = effects.wake {
            waker.wake();
        }
        if effects.sooner {
            // A permit stored if the watch is not waiting: it looks again either way.
            self.watch.notify_one();
        }
        if effects.watch {
            self.start_watch();
        }
    }

    /// Starts the lane's watch (the queue has just marked it as running): a task that ends the
    /// turn of a head that goes unpolled past the instant it is due by [`GRACE`], and wakes
    /// the caller behind it. No caller behind the head can do so if none is polled either (a
    /// `select!` that dropped several `next()`s of `pace` streams on one key), so the lane
    /// keeps its own time. It ends when nobody waits behind the head.
    fn start_watch(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime, so no timer to wait on: no caller can be waiting either.
            self.queue().watched = false;
            return;
        };
        // Made here, not in the task: a task dropped before its first poll drops it too.
        let on_duty = OnDuty {
            lane: Arc::clone(self),
            armed: true,
        };
        runtime.spawn(async move {
            // The whole guard moved in (a field alone would be captured otherwise).
            let mut on_duty = on_duty;
            let lane = Arc::clone(&on_duty.lane);
            loop {
                let now = Instant::now();
                let (lapse_at, effects) = {
                    let mut queue = lane.queue();
                    if queue.waiting.len() < 2 {
                        queue.watched = false;
                        on_duty.armed = false;
                        return;
                    }
                    match queue.lapses_at(now) {
                        Some(at) if at > now => (Some(at), Effects::default()),
                        _ => (None, queue.lapse(now)),
                    }
                };
                lane.follow(effects);
                let Some(lapse_at) = lapse_at else {
                    continue;
                };
                // Until then, or until a new head's turn is due sooner.
                let mut sleep = pin!(tokio::time::sleep_until(lapse_at));
                let mut sooner = pin!(lane.watch.notified());
                poll_fn(|cx| {
                    if sooner.as_mut().poll(cx).is_ready() || sleep.as_mut().poll(cx).is_ready() {
                        Poll::Ready(())
                    } else {
                        Poll::Pending
                    }
                })
                .await;
            }
        });
    }
}

/// A call counted in flight before its permit is taken ([`Lane::claim`]): counted no more
/// when dropped unkept (the permit was refused, the budget failed, the caller left).
pub(super) struct Claim<'a> {
    lane: &'a Lane,
    units: u64,
    kept: bool,
}

impl Claim<'_> {
    /// The call was admitted: it stays in flight until it is answered or dropped.
    pub(super) fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if !self.kept {
            self.lane.told().withdraw(self.units);
        }
    }
}

/// Turns the watch off when its task is dropped before it ended on its own (its runtime shut
/// down, maybe before the task first ran), so that a later caller starts another; disarmed
/// where the task turned it off itself, under the queue's lock.
struct OnDuty {
    lane: Arc<Lane>,
    armed: bool,
}

impl Drop for OnDuty {
    fn drop(&mut self) {
        if self.armed {
            self.lane.queue().watched = false;
        }
    }
}

/// A lane's queue: the callers of the key in the order they asked, each with a ticket.
///
/// The first caller whose turn has not lapsed is the *head*: it alone takes a permit, and
/// sleeps until its permit is due when there is none yet; the others wait to be woken. A
/// head due at an instant (its permit's, or the one its turn came at) and not polled within
/// [`GRACE`] of it (a future its owner keeps but does not poll) lapses, and the next caller
/// becomes the head; a lapsed caller polled again takes its place back, ahead of every
/// caller that asked after it. So callers being polled are served in the order they asked,
/// and a caller that is not polled holds the others up by the grace at most, once. A head
/// that lapses while it takes its permit (a Redis round trip longer than the grace) goes on
/// taking it: two callers may then take at once, in either order, each counted against what
/// the upstream said before its permit is taken ([`Lane::claim`]), and the budget deciding.
#[derive(Debug, Default)]
struct Queue {
    /// The next caller's ticket: tickets grow in the order callers ask.
    next: u64,
    /// The callers in line whose turn has not lapsed, by ticket, each with the waker of its
    /// latest poll while it waited: the first is the head.
    waiting: BTreeMap<u64, Option<Waker>>,
    /// The callers whose turn lapsed: not polled in time, in line again once polled.
    lapsed: BTreeSet<u64>,
    /// When the head is due to be polled (while there is one): the instant its permit comes,
    /// while it sleeps for it; else the instant its turn came or it last acted.
    head_due: Option<Instant>,
    /// Whether the lane's watch runs ([`Lane::start_watch`]).
    watched: bool,
}

/// What a change to a queue calls for once its lock is released ([`Lane::follow`]).
#[derive(Debug, Default)]
struct Effects {
    /// A caller to wake: its turn came.
    wake: Option<Waker>,
    /// The head's turn now ends sooner than before: the watch must look again.
    sooner: bool,
    /// Start the watch: callers wait behind the head, and none watches.
    watch: bool,
}

impl Queue {
    fn head(&self) -> Option<u64> {
        self.waiting.first_key_value().map(|(&ticket, _)| ticket)
    }

    /// A new caller, at the end of the line: its ticket.
    fn join(&mut self, now: Instant) -> u64 {
        let ticket = self.next;
        self.next += 1;
        if self.waiting.is_empty() {
            self.head_due = Some(now);
        }
        self.waiting.insert(ticket, None);
        ticket
    }

    /// The head is due at `due`; whether that ends its turn sooner than before.
    fn due(&mut self, due: Instant) -> bool {
        let sooner = self.head_due.is_some_and(|before| due < before);
        self.head_due = Some(due);
        sooner
    }

    /// When the head's turn lapses if it is not polled: `None` without a head.
    fn lapses_at(&self, now: Instant) -> Option<Instant> {
        self.head()?;
        Some(self.head_due.unwrap_or(now) + GRACE)
    }

    /// Caller `ticket` is polled at `now`: back in line in its place if its turn had lapsed
    /// (the head then, if none that asked before it waits).
    fn polled(&mut self, ticket: u64, now: Instant) -> Effects {
        let mut effects = Effects::default();
        if self.lapsed.remove(&ticket) {
            self.waiting.insert(ticket, None);
            if self.head() == Some(ticket) {
                effects.sooner = self.due(now);
            }
        }
        effects
    }

    /// The caller first in line after the head left (or lapsed) at `now`: the head, due at
    /// once, and woken.
    fn next_head(&mut self, now: Instant) -> Effects {
        let mut effects = Effects::default();
        match self.waiting.first_key_value() {
            Some((_, waker)) => {
                effects.wake = waker.clone();
                effects.sooner = self.due(now);
            }
            None => self.head_due = None,
        }
        effects
    }

    /// The head was not polled in time: its turn lapses at `now`, and the next caller's
    /// comes.
    fn lapse(&mut self, now: Instant) -> Effects {
        match self.waiting.pop_first() {
            Some((head, _)) => {
                self.lapsed.insert(head);
                self.next_head(now)
            }
            None => Effects::default(),
        }
    }

    /// Caller `ticket` leaves the queue at `now` (admitted, failed, or dropped).
    fn leave(&mut self, ticket: u64, now: Instant) -> Effects {
        if self.lapsed.remove(&ticket) {
            return Effects::default();
        }
        let was_head = self.head() == Some(ticket);
        self.waiting.remove(&ticket);
        if was_head {
            self.next_head(now)
        } else {
            Effects::default()
        }
    }

    /// Caller `ticket`, polled at `now` with `waker`: `Ok` when it is the head (it acts now),
    /// else `Err` with the instant the head is due. A head past that by the grace lapses
    /// first, as the watch would have it.
    fn turn(&mut self, ticket: u64, now: Instant, waker: &Waker) -> (Result<(), Instant>, Effects) {
        let mut effects = self.polled(ticket, now);
        loop {
            if self.head() == Some(ticket) {
                effects.sooner |= self.due(now);
                return (Ok(()), effects);
            }
            match self.lapses_at(now) {
                Some(at) if at <= now => {
                    // At most once: the next head is due now. A caller it wakes is polled
                    // once more at worst.
                    let lapsed = self.lapse(now);
                    effects.wake = lapsed.wake;
                    effects.sooner |= lapsed.sooner;
                }
                _ => break,
            }
        }
        let kept = self.waiting.entry(ticket).or_default();
        if !kept.as_ref().is_some_and(|kept| kept.will_wake(waker)) {
            *kept = Some(waker.clone());
        }
        (Err(self.head_due.unwrap_or(now)), self.watched_if(effects))
    }

    /// The head, caller `ticket` if it still is (polled at `now`), sleeps until `ready`:
    /// due then.
    fn sleeps(&mut self, ticket: u64, ready: Instant, now: Instant) -> Effects {
        let mut effects = self.polled(ticket, now);
        if self.head() == Some(ticket) {
            effects.sooner |= self.due(ready);
        }
        self.watched_if(effects)
    }

    /// `effects`, and a watch to start if callers wait behind the head and none runs.
    fn watched_if(&mut self, mut effects: Effects) -> Effects {
        if !self.watched && self.waiting.len() >= 2 {
            self.watched = true;
            effects.watch = true;
        }
        effects
    }
}

/// A caller's place in its key's queue, from the moment it asks until it is dropped
/// (admitted, failed, or gone): dropped, it leaves the queue, and the next caller's turn
/// comes if it was the head.
pub(super) struct Place {
    lane: Arc<Lane>,
    ticket: u64,
}

impl Place {
    /// A place at the end of `lane`'s queue, asked for at `now`.
    pub(super) fn join(lane: Arc<Lane>, now: Instant) -> Place {
        let ticket = lane.queue().join(now);
        Place { lane, ticket }
    }

    pub(super) fn lane(&self) -> &Arc<Lane> {
        &self.lane
    }

    /// Waits until this caller is the head of the queue, and may take a permit now: `Ok`
    /// with whether it had to wait. `Err` when `deadline` has passed while it is still
    /// queued behind a head that sleeps for its permit beyond it: the head's wait (which
    /// this caller's own permit comes after). A head due at the deadline is waited for, at
    /// most the grace, until it sleeps, leaves, or lapses: then its wait, or this caller's
    /// own, is known.
    pub(super) async fn turn(&self, deadline: Option<Instant>) -> Result<bool, Duration> {
        let mut waited = false;
        let mut timer: Option<Pin<Box<Sleep>>> = None;
        poll_fn(|cx| loop {
            let now = Instant::now();
            let (stand, effects) = self.lane.queue().turn(self.ticket, now, cx.waker());
            self.lane.follow(effects);
            let head_due = match stand {
                Ok(()) => return Poll::Ready(Ok(waited)),
                Err(head_due) => head_due,
            };
            waited = true;
            let wake_at = match deadline {
                // Woken when its turn comes.
                None => return Poll::Pending,
                Some(deadline) if now < deadline => deadline,
                Some(_) if head_due > now => return Poll::Ready(Err(head_due - now)),
                // The head is due now: it sleeps, leaves or lapses within the grace.
                Some(_) => head_due + GRACE,
            };
            let timer = timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(wake_at)));
            if timer.deadline() != wake_at {
                timer.as_mut().reset(wake_at);
            }
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            // Its time came: where does it stand now?
        })
        .await
    }

    /// The head sleeps until `ready`, when it is due: past that by the grace, unpolled, its
    /// turn lapses.
    pub(super) async fn sleep_until(&self, ready: Instant) {
        let effects = self.lane.queue().sleeps(self.ticket, ready, Instant::now());
        self.lane.follow(effects);
        tokio::time::sleep_until(ready).await;
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let effects = self.lane.queue().leave(self.ticket, Instant::now());
        self.lane.follow(effects);
    }
}

/// One policy's cap: the least `remaining` reported in its present period, when that period
/// ends (`None` before the first), and the calls lost since its period may count them.
#[derive(Clone, Copy, Debug, Default)]
struct Cap {
    policy: u64,
    reported: u64,
    until: Option<Instant>,
    lost: u64,
}

impl Cap {
    /// Whether its period holds at `now`.
    fn holds(&self, now: Instant) -> bool {
        self.until.is_some_and(|until| until > now)
    }
}

/// What the upstream said about the key's quota, and the calls it has not answered yet,
/// counted in the fields' units: 1 per call (the fields count calls), or the call's cost.
///
/// The cap: within a period that the first answer with fields opens and each answer extends
/// to its reset, the least `remaining` any answer reported, less every call still in flight
/// and every call answered without a report (or never answered). Safe: the answer that
/// reported the least counted every call processed before it; a call processed after it is
/// still in flight (had it been answered with a report, that report would be lower) or was
/// answered without one, so no more than that can reach the upstream's count, whatever
/// order the answers come back in. Calls without a report stay counted until a call is
/// admitted with nothing in flight and no period holding: every report from then on comes
/// from a call that arrived after them, unless one of them was dropped unanswered and
/// arrives later still (a limit docs/CLIENT.md states; `Throttle::quota`'s margin covers
/// it). Once every call is answered with a report, the cap is exactly what the upstream
/// said.
///
/// An upstream with several policies (a `RateLimit` field of several members: per second and
/// per day) has a cap per policy, each kept by this rule, and a call goes when every cap
/// lets it.
#[derive(Debug, Default)]
pub(super) struct Told {
    /// Nothing may be sent before this (a refusal's pause).
    paused_until: Option<Instant>,
    /// One cap per policy the answers named, at most [`MOST_POLICIES`].
    caps: [Cap; MOST_POLICIES],
    /// The calls admitted and not answered yet.
    in_flight: u64,
    /// The calls answered without a report, or never answered, since the last call admitted
    /// with nothing in flight: they may have been counted upstream, and no report may say
    /// so. What a cap opened from now on starts with; each cap keeps its own count, reset
    /// only when a call is admitted with nothing in flight and that cap's period over.
    lost: u64,
}

impl Told {
    /// Until when a call counting `units` must wait for what the upstream said, if it must.
    pub(super) fn holds_back(&self, now: Instant, units: u64) -> Option<Instant> {
        if let Some(paused) = self.paused_until.filter(|&paused| paused > now) {
            return Some(paused);
        }
        // Until every cap that holds it back has ended.
        self.caps
            .iter()
            .filter(|cap| cap.holds(now) && self.allows(cap) < units)
            .filter_map(|cap| cap.until)
            .max()
    }

    /// What `cap`'s present period lets through now.
    fn allows(&self, cap: &Cap) -> u64 {
        cap.reported
            .saturating_sub(self.in_flight)
            .saturating_sub(cap.lost)
    }

    /// A call counting `units` is admitted at `now` (counted before its permit is taken, see
    /// [`Lane::claim`]): it is in flight.
    pub(super) fn admit(&mut self, now: Instant, units: u64) {
        if self.in_flight == 0 {
            // Every call before this one was answered, and arrived before it, or was dropped
            // unanswered (and is taken to have arrived by now): any report from now on
            // counts them. A cap whose period holds may still go by a report
            // from before them, and keeps them until its period is over.
            self.lost = 0;
            for cap in self.caps.iter_mut().filter(|cap| !cap.holds(now)) {
                cap.lost = 0;
            }
        }
        self.in_flight = self.in_flight.saturating_add(units);
    }

    /// A call counting `units` was answered.
    pub(super) fn answered(&mut self, units: u64) {
        self.in_flight = self.in_flight.saturating_sub(units);
    }

    /// A call counting `units` was counted in flight and then not sent (its permit refused,
    /// its budget failed, its caller gone): no longer in flight, and never counted upstream.
    /// What [`admit`](Told::admit) forgot when nothing was in flight stays forgotten: every
    /// report from then on still comes from a call admitted after it.
    fn withdraw(&mut self, units: u64) {
        self.in_flight = self.in_flight.saturating_sub(units);
    }

    /// A call counting `units` was answered with no report (no fields, or none that parse),
    /// or will never be answered (it failed, or was dropped): it was counted upstream, or
    /// may have been, and no report may say so.
    pub(super) fn unreported(&mut self, units: u64) {
        self.answered(units);
        self.lost = self.lost.saturating_add(units);
        for cap in &mut self.caps {
            cap.lost = cap.lost.saturating_add(units);
        }
    }

    /// An answer (already [`answered`](Told::answered)) said that at most `left.remaining`
    /// more may be spent in the next `left.reset` under its policy: it opens a period of
    /// that policy's cap, or tightens and extends the present one. A policy not seen before
    /// takes a cap whose period has ended; with none free, it is folded into the one whose
    /// period ends nearest its own (which then counts the least of both, for the longer of
    /// the two times).
    pub(super) fn reported(&mut self, now: Instant, left: Left) {
        let until = Some(now + left.reset);
        let slot = self
            .caps
            .iter()
            .position(|cap| cap.policy == left.policy && cap.until.is_some())
            .or_else(|| self.caps.iter().position(|cap| !cap.holds(now)));
        match slot {
            Some(i) if self.caps[i].holds(now) && self.caps[i].policy == left.policy => {
                let cap = &mut self.caps[i];
                cap.reported = cap.reported.min(left.remaining);
                cap.until = cap.until.max(until);
            }
            Some(i) => {
                self.caps[i] = Cap {
                    policy: left.policy,
                    reported: left.remaining,
                    until,
                    lost: self.lost,
                };
            }
            None => {
                let end = now + left.reset;
                let apart = |cap: &&mut Cap| cap.until.map(|at| at.max(end) - at.min(end));
                if let Some(cap) = self.caps.iter_mut().min_by_key(apart) {
                    cap.reported = cap.reported.min(left.remaining);
                    cap.until = cap.until.max(until);
                    cap.lost = cap.lost.max(self.lost);
                }
            }
        }
    }

    /// A refusal said: nothing more until `pause` from now. A pause is never shortened, and
    /// leaves the cap of the rate-limit fields as it was for after it.
    pub(super) fn pause(&mut self, now: Instant, pause: Duration) {
        self.paused_until = self.paused_until.max(Some(now + pause));
    }

    /// Nothing in flight and nothing said that still holds.
    fn is_idle(&self, now: Instant) -> bool {
        self.in_flight == 0 && self.holds_back(now, u64::MAX).is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// What an answer says of `policy`.
    const fn of(policy: u64, remaining: u64, reset: Duration) -> Left {
        Left {
            policy,
            remaining,
            reset,
        }
    }

    /// What an answer of one unnamed policy says.
    const fn left(remaining: u64, reset: Duration) -> Left {
        of(0, remaining, reset)
    }

    #[tokio::test(start_paused = true)]
    async fn the_calls_in_flight_are_taken_off_the_least_reported() {
        let now = Instant::now();
        let mut told = Told::default();
        for _ in 0..3 {
            told.admit(now, 1);
        }
        told.answered(1);
        told.reported(now, left(5, secs(1)));
        // Two calls in flight may not be counted upstream yet: 5 - 2.
        assert_eq!(told.holds_back(now, 3), None);
        assert_eq!(told.holds_back(now, 4), Some(now + secs(1)));
        told.admit(now, 3);
        assert_eq!(told.holds_back(now, 1), Some(now + secs(1)));
        // Once the period has passed, nothing holds.
        assert_eq!(told.holds_back(now + secs(1), 1), None);
    }

    /// An upstream of several policies: each keeps its own cap, and a call goes when every
    /// cap lets it (a burst's short reset does not end a day's cap).
    #[tokio::test(start_paused = true)]
    async fn every_policy_keeps_its_own_cap() {
        let now = Instant::now();
        let mut told = Told::default();
        told.admit(now, 1);
        told.answered(1);
        told.reported(now, of(1, 0, secs(1)));
        told.reported(now, of(2, 2, secs(900)));
        assert_eq!(told.holds_back(now, 1), Some(now + secs(1)));
        let later = now + secs(1);
        assert_eq!(told.holds_back(later, 2), None);
        assert_eq!(told.holds_back(later, 3), Some(now + secs(900)));
        // The burst's next period opens in the same place; the day's cap tightens.
        told.reported(later, of(1, 5, secs(1)));
        told.reported(later, of(2, 1, secs(899)));
        assert_eq!(told.holds_back(later, 1), None);
        assert_eq!(told.holds_back(later, 2), Some(now + secs(900)));
        // With four policies holding, a fifth is folded into the one whose period ends
        // nearest its own (the 1 s burst's): held back for 5 s, not for the day.
        told.reported(later, of(3, 7, secs(10)));
        told.reported(later, of(4, 8, secs(20)));
        told.reported(later, of(5, 0, secs(5)));
        assert_eq!(told.holds_back(later, 1), Some(later + secs(5)));
        assert_eq!(told.holds_back(later + secs(5), 1), None);
        assert_eq!(told.holds_back(later + secs(5), 2), Some(now + secs(900)));
    }

    /// Calls lost long ago stay off a long policy's cap while its period holds, not off a
    /// short one whose period began after them.
    #[tokio::test(start_paused = true)]
    async fn lost_calls_count_against_the_caps_that_may_not_count_them() {
        let now = Instant::now();
        let mut told = Told::default();
        told.admit(now, 1);
        told.answered(1);
        told.reported(now, of(1, 5, secs(1)));
        told.reported(now, of(2, 1_000, secs(900)));
        for _ in 0..5 {
            told.admit(now, 1);
            told.unreported(1);
        }
        let later = now + secs(10);
        told.admit(later, 1);
        told.answered(1);
        told.reported(later, of(1, 4, secs(1)));
        told.reported(later, of(2, 994, secs(890)));
        assert_eq!(told.holds_back(later, 4), None, "4 of the burst left");
        assert_eq!(told.holds_back(later, 5), Some(later + secs(1)));
        // The day's cap, from a report before them, still takes them off: 994 - 5.
        assert_eq!(told.allows(&told.caps[1]), 989);
    }

    #[tokio::test(start_paused = true)]
    async fn answers_in_any_order_end_exact_once_all_are_in() {
        let now = Instant::now();
        let mut told = Told::default();
        for _ in 0..4 {
            told.admit(now, 1);
        }
        // The upstream processed the four calls in order (reporting 9, 8, 7, 6 left); the
        // answers come back 4th, 1st, 3rd, 2nd.
        for (remaining, left_after) in [(6, 3), (9, 4), (7, 5), (8, 6)] {
            told.answered(1);
            told.reported(now, left(remaining, secs(2)));
            assert_eq!(told.allows(&told.caps[0]), left_after);
        }
        // All answered: exactly what the last processed call reported.
        assert_eq!(told.holds_back(now, 6), None);
        assert_eq!(told.holds_back(now, 7), Some(now + secs(2)));
        // A later answer with a longer reset extends the period; a higher report within it
        // changes nothing.
        told.admit(now, 1);
        told.answered(1);
        told.reported(now + secs(1), left(20, secs(5)));
        assert_eq!(told.holds_back(now + secs(1), 7), Some(now + secs(6)));
    }

    #[tokio::test(start_paused = true)]
    async fn calls_without_a_report_stay_counted_until_a_call_starts_afresh() {
        let now = Instant::now();
        let mut told = Told::default();
        // B and A go out; the upstream handles B (2 left), then A (1 left). A's answer
        // comes first, without fields; then B's, which opens the period.
        told.admit(now, 1);
        told.admit(now, 1);
        told.unreported(1);
        told.answered(1);
        told.reported(now, left(2, secs(60)));
        assert_eq!(told.allows(&told.caps[0]), 1);
        // A call dropped unanswered within the period stays counted too.
        told.admit(now, 1);
        told.unreported(1);
        assert_eq!(told.allows(&told.caps[0]), 0);
        // Past the period, a call admitted with nothing in flight starts afresh: the next
        // report counts every call before it.
        told.admit(now + secs(60), 1);
        told.answered(1);
        told.reported(now + secs(60), left(3, secs(10)));
        assert_eq!(told.allows(&told.caps[0]), 3);
        assert!(!told.is_idle(now + secs(60)));
        assert!(told.is_idle(now + secs(70)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_holds_everything_is_never_shortened_and_leaves_the_cap_for_after() {
        let now = Instant::now();
        let mut told = Told::default();
        told.admit(now, 1);
        told.answered(1);
        told.reported(now, left(1_000, secs(300)));
        told.pause(now, secs(3));
        assert_eq!(told.holds_back(now, 1), Some(now + secs(3)));
        told.pause(now, secs(1));
        assert_eq!(told.holds_back(now, 1), Some(now + secs(3)));
        // An answer that says there is room does not lift it either.
        told.reported(now, left(10, secs(1)));
        assert_eq!(told.holds_back(now, 1), Some(now + secs(3)));
        assert!(!told.is_idle(now));
        // After it, the cap holds as the answers set it, not as a stop.
        assert_eq!(told.holds_back(now + secs(3), 10), None);
        assert_eq!(told.holds_back(now + secs(3), 11), Some(now + secs(300)));
        // A pause after one has ended holds for its own time.
        told.pause(now + secs(10), secs(2));
        assert_eq!(told.holds_back(now + secs(10), 1), Some(now + secs(12)));
        assert!(told.is_idle(now + secs(300)));
    }

    /// The queue's order: one head at a time, in the order callers asked; a head that leaves
    /// wakes the next, due at once.
    #[tokio::test(start_paused = true)]
    async fn callers_take_their_turns_in_the_order_they_asked() {
        let waker = Waker::noop();
        let now = Instant::now();
        let mut queue = Queue::default();
        let (first, second, third) = (queue.join(now), queue.join(now), queue.join(now));
        assert_eq!(queue.turn(first, now, waker).0, Ok(()));
        let effects = queue.sleeps(first, now + secs(1), now);
        assert!(!effects.sooner);
        assert!(effects.watch, "callers wait behind the head: watched");
        let (stand, effects) = queue.turn(third, now, waker);
        assert_eq!(stand, Err(now + secs(1)));
        assert!(!effects.watch, "one watch");
        assert_eq!(queue.turn(second, now, waker).0, Err(now + secs(1)));
        // The head leaves (dropped while asleep): the next is woken, due now, sooner.
        let effects = queue.leave(first, now + secs(1) / 2);
        assert!(effects.wake.is_some() && effects.sooner);
        assert_eq!(queue.head(), Some(second));
        assert_eq!(queue.head_due, Some(now + secs(1) / 2));
        assert_eq!(queue.turn(third, now, waker).0, Err(now + secs(1) / 2));
        // A caller behind that leaves changes nothing for the head.
        assert!(queue.leave(third, now).wake.is_none());
        assert!(queue.leave(second, now).wake.is_none());
        assert_eq!((queue.head(), queue.head_due), (None, None));
    }

    /// A head not polled within the grace of its due instant lapses: the caller behind goes,
    /// and the lapsed one, polled again, is the head again, ahead of those who asked later.
    #[tokio::test(start_paused = true)]
    async fn a_head_not_polled_in_time_lapses_and_takes_its_place_back_when_polled() {
        let waker = Waker::noop();
        let now = Instant::now();
        let mut queue = Queue::default();
        let (first, second) = (queue.join(now), queue.join(now));
        assert_eq!(queue.turn(first, now, waker).0, Ok(()));
        let _ = queue.sleeps(first, now + secs(1), now);
        let due = now + secs(1);
        assert_eq!(queue.lapses_at(now), Some(due + GRACE));
        // Within the grace the head keeps its turn...
        let almost = due + GRACE - Duration::from_nanos(1);
        assert_eq!(queue.turn(second, almost, waker).0, Err(due));
        // ... past it, the caller behind takes it, polled or woken by the watch.
        assert_eq!(queue.turn(second, due + GRACE, waker).0, Ok(()));
        assert!(queue.lapsed.contains(&first));
        let _ = queue.sleeps(second, due + secs(5), due + GRACE);
        let third = queue.join(due + GRACE);
        // Polled again, the first is back at the head, due now (sooner than the second was).
        let later = due + secs(1);
        let (stand, effects) = queue.turn(first, later, waker);
        assert_eq!(stand, Ok(()));
        assert!(effects.sooner);
        assert_eq!(queue.turn(second, later, waker).0, Err(later));
        assert_eq!(queue.turn(third, later, waker).0, Err(later));
        // A lapsed caller that leaves changes nothing.
        let _ = queue.lapse(later + GRACE);
        assert!(queue.leave(first, later + GRACE).wake.is_none());
        assert_eq!(queue.head(), Some(second));
    }

    /// A call is counted in flight before its permit is taken, and no more if it is not sent.
    #[tokio::test(start_paused = true)]
    async fn a_claim_counts_a_call_in_flight_until_it_is_kept_or_dropped() {
        let lane = Lane::default();
        let now = Instant::now();
        lane.told().admit(now, 1);
        lane.told().answered(1);
        lane.told().reported(now, left(2, secs(10)));
        let kept = lane.claim(now, 1).unwrap();
        let refused = lane.claim(now, 1).unwrap();
        // Two counted in flight: the report of 2 lets no third go.
        assert_eq!(lane.claim(now, 1).err(), Some(now + secs(10)));
        drop(refused);
        kept.keep();
        assert_eq!(lane.told().in_flight, 1);
        assert!(lane.claim(now, 1).is_ok());
        assert_eq!(lane.told().in_flight, 1, "dropped unkept: withdrawn");
    }

    #[tokio::test(start_paused = true)]
    async fn idle_lanes_are_tidied_at_a_constant_cost_per_lane() {
        let lanes = Lanes::default();
        let len = |lanes: &Lanes| lanes.0.lock().unwrap().lanes.len();
        // Held lanes, a paused one and one with a call in flight survive every tidy.
        let held: Vec<_> = (0..600).map(|i| lanes.get(&format!("held{i}"))).collect();
        let now = Instant::now();
        lanes.get("paused").told().pause(now, secs(60));
        lanes.get("flying").told().admit(now, 1);
        // Below the first threshold nothing is tidied.
        for i in 0..(TIDY_FIRST - 603) {
            drop(lanes.get(&i.to_string()));
        }
        assert_eq!(len(&lanes), TIDY_FIRST - 1);
        drop(lanes.get("one more"));
        drop(lanes.get("and another"));
        // The tidy at 1,024 kept the 602 lanes in use: the next comes at twice that.
        assert_eq!(len(&lanes), 603);
        assert_eq!(lanes.0.lock().unwrap().tidy_at, 1_204);
        for key in ["held0", "paused", "flying", "and another"] {
            assert!(lanes.0.lock().unwrap().lanes.contains_key(key), "{key}");
        }
        drop(held);
    }
}
