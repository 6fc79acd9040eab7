//! [`Lanes`]: per key, the queue its callers wait in (first come, first served) and what the
//! upstream last said about its quota.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

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
}

/// What the upstream said about the key's quota, and the calls it has not answered yet.
/// What it said is counted in `units` per call: 1 (the fields count calls), or the call's
/// cost.
#[derive(Debug, Default)]
pub(super) struct Told {
    /// Nothing may be sent before this (a refusal's pause).
    paused_until: Option<Instant>,
    /// At most this much more may be spent until `until` (the rate-limit fields).
    left: u64,
    /// When `left` stops holding; `None` when nothing holds.
    until: Option<Instant>,
    /// The serial number of the call whose answer set `left`: an older answer may only
    /// tighten it.
    source: u64,
    /// The serial number the next admitted call gets.
    next: u64,
    /// What calls admitted and not answered yet count, in the fields' units.
    in_flight: u64,
    /// When the caller at the head of the queue expects its permit, while it sleeps.
    head_ready: Option<Instant>,
}

impl Told {
    /// Until when a call counting `units` must wait for what the upstream said, if it must.
    pub(super) fn holds_back(&self, now: Instant, units: u64) -> Option<Instant> {
        if let Some(paused) = self.paused_until.filter(|&paused| paused > now) {
            return Some(paused);
        }
        self.until.filter(|_| self.capped(now) && self.left < units)
    }

    /// Whether the cap of the rate-limit fields still holds at `now`.
    fn capped(&self, now: Instant) -> bool {
        self.until.is_some_and(|until| until > now)
    }

    /// A call counting `units` was admitted: it is in flight, and spends from what was
    /// said. Returns its serial number.
    pub(super) fn admit(&mut self, now: Instant, units: u64) -> u64 {
        if self.capped(now) {
            self.left = self.left.saturating_sub(units);
        }
        self.in_flight = self.in_flight.saturating_add(units);
        self.head_ready = None;
        self.next += 1;
        self.next
    }

    /// A call counting `units` was answered, or will never be.
    pub(super) fn answered(&mut self, units: u64) {
        self.in_flight = self.in_flight.saturating_sub(units);
    }

    /// The answer to call `serial` (already [`answered`](Told::answered)) said that at most
    /// `remaining` more may be spent in the next `reset`. The calls still in flight were
    /// admitted before it came and the upstream may not have counted them yet, so they are
    /// taken off. An answer older than the one that set the present cap only tightens it.
    pub(super) fn left(&mut self, now: Instant, serial: u64, remaining: u64, reset: Duration) {
        let left = remaining.saturating_sub(self.in_flight);
        let until = now + reset;
        if !self.capped(now) || serial >= self.source {
            self.left = left;
            self.until = Some(until);
            self.source = serial;
        } else if left <= self.left {
            self.left = left;
            self.until = self.until.max(Some(until));
        }
    }

    /// A refusal said: nothing more until `pause` from now. A pause is never shortened, and
    /// leaves the cap of the rate-limit fields as it was for after it.
    pub(super) fn pause(&mut self, now: Instant, pause: Duration) {
        self.paused_until = self.paused_until.max(Some(now + pause));
    }

    /// The caller at the head of the queue sleeps until `ready`.
    pub(super) fn head_waits(&mut self, ready: Instant) {
        self.head_ready = Some(ready);
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

    #[tokio::test(start_paused = true)]
    async fn an_answer_takes_off_what_is_still_in_flight() {
        let now = Instant::now();
        let mut told = Told::default();
        let first = told.admit(now, 1);
        let _second = told.admit(now, 1);
        let _third = told.admit(now, 1);
        told.answered(1);
        told.left(now, first, 5, Duration::from_secs(1));
        // Two calls in flight may not be counted upstream yet: 5 - 2.
        assert_eq!(told.holds_back(now, 3), None);
        assert_eq!(told.holds_back(now, 4), Some(now + Duration::from_secs(1)));
        told.admit(now, 3);
        assert_eq!(told.holds_back(now, 1), Some(now + Duration::from_secs(1)));
        // Once the reset has passed, nothing holds.
        assert_eq!(told.holds_back(now + Duration::from_secs(1), 1), None);
    }

    #[tokio::test(start_paused = true)]
    async fn an_older_answer_only_tightens() {
        let now = Instant::now();
        let mut told = Told::default();
        let old = told.admit(now, 1);
        let new = told.admit(now, 1);
        told.answered(1);
        told.left(now, new, 10, Duration::from_secs(1));
        told.answered(1);
        // The older call was still in flight: 10 - 1. Its own answer says more is left:
        // ignored.
        told.left(now, old, 12, Duration::from_secs(5));
        assert_eq!(told.holds_back(now, 9), None);
        assert_eq!(told.holds_back(now, 10), Some(now + Duration::from_secs(1)));
        // ... and says as much, for longer: the longer reset holds.
        told.left(now, old, 9, Duration::from_secs(2));
        assert_eq!(told.holds_back(now, 10), Some(now + Duration::from_secs(2)));
        // ... and says less: taken, for the longer of the two resets.
        told.left(now, old, 4, Duration::from_secs(5));
        assert_eq!(told.holds_back(now, 5), Some(now + Duration::from_secs(5)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_holds_everything_is_never_shortened_and_leaves_the_cap_for_after() {
        let now = Instant::now();
        let secs = Duration::from_secs;
        let mut told = Told::default();
        let serial = told.admit(now, 1);
        told.answered(1);
        told.left(now, serial, 1_000, secs(300));
        told.pause(now, secs(3));
        assert_eq!(told.holds_back(now, 1), Some(now + secs(3)));
        told.pause(now, secs(1));
        assert_eq!(told.holds_back(now, 1), Some(now + secs(3)));
        // A newer answer that says there is room does not lift it either.
        told.left(now, serial + 1, 10, secs(1));
        assert_eq!(told.holds_back(now, 1), Some(now + secs(3)));
        assert!(!told.is_idle(now));
        // After it, the cap holds as the last answer set it, not as a stop.
        assert_eq!(told.holds_back(now + secs(3), 1), None);
        assert!(told.is_idle(now + secs(3)));
        // A pause after one has ended holds for its own time.
        told.pause(now + secs(10), secs(2));
        assert_eq!(told.holds_back(now + secs(10), 1), Some(now + secs(12)));
    }

    #[tokio::test(start_paused = true)]
    async fn the_cap_ends_at_its_reset_and_admissions_spend_only_while_it_holds() {
        let now = Instant::now();
        let secs = Duration::from_secs;
        let mut told = Told::default();
        let serial = told.admit(now, 1);
        told.answered(1);
        told.left(now, serial, 2, secs(1));
        // At the reset the cap has ended: an admission then spends nothing of it.
        told.admit(now + secs(1), 1);
        told.answered(1);
        assert!(told.is_idle(now + secs(1)));
        // An older answer once the cap has ended sets a new one.
        told.left(now + secs(1), 0, 1, secs(1));
        assert_eq!(told.holds_back(now + secs(1), 2), Some(now + secs(2)));
        assert!(!told.is_idle(now + secs(1)));
    }

    #[tokio::test(start_paused = true)]
    async fn idle_lanes_are_tidied_at_a_constant_cost_per_lane() {
        let lanes = Lanes::default();
        let len = |lanes: &Lanes| lanes.0.lock().unwrap().lanes.len();
        // Held lanes, a paused one and one with a call in flight survive every tidy.
        let held: Vec<_> = (0..600).map(|i| lanes.get(&format!("held{i}"))).collect();
        let now = Instant::now();
        lanes
            .get("paused")
            .told()
            .pause(now, Duration::from_secs(60));
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
