//! [`Lanes`]: per key, the queue its callers wait in (first come, first served) and what the
//! upstream last said about its quota.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::heard::{Left, MOST_POLICIES};

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
    /// Held by the caller at the head of the queue while it waits for its permit: tokio's
    /// mutex wakes waiters in the order they asked, and a dropped waiter leaves its place.
    pub(super) turn: tokio::sync::Mutex<()>,
    told: Mutex<Told>,
}

impl Lane {
    pub(super) fn told(&self) -> MutexGuard<'_, Told> {
        self.told.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The caller at the head of the queue sleeps until `ready`, until the returned guard
    /// is dropped.
    pub(super) fn head_sleeps(&self, ready: Instant) -> HeadAsleep<'_> {
        self.told().head_ready = Some(ready);
        HeadAsleep(self)
    }
}

/// The head of a lane's queue asleep ([`Lane::head_sleeps`]): awake again when dropped.
pub(super) struct HeadAsleep<'a>(&'a Lane);

impl Drop for HeadAsleep<'_> {
    fn drop(&mut self) {
        self.0.told().head_ready = None;
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
    /// When the caller at the head of the queue expects its permit, while it sleeps.
    head_ready: Option<Instant>,
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

    /// A call counting `units` was admitted at `now`: it is in flight.
    pub(super) fn admit(&mut self, now: Instant, units: u64) {
        self.head_ready = None;
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

    /// How long after `now` the head of the queue expects its permit, if it sleeps.
    pub(super) fn head_ready_in(&self, now: Instant) -> Option<Duration> {
        self.head_ready
            .map(|ready| ready.saturating_duration_since(now))
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

    /// The head's wake-up time is told only while it sleeps: a head that left (woken, or
    /// dropped while asleep) leaves nothing behind for a caller that gives up in the queue.
    #[tokio::test(start_paused = true)]
    async fn the_heads_wait_is_told_only_while_it_sleeps() {
        let lane = Lane::default();
        let now = Instant::now();
        let asleep = lane.head_sleeps(now + secs(5));
        assert_eq!(lane.told().head_ready_in(now), Some(secs(5)));
        drop(asleep);
        assert_eq!(lane.told().head_ready_in(now), None);
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
