//! [`Lanes`]: per key, the queue its callers wait in (first come, first served) and what the
//! upstream last said about its quota.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// Lanes are dropped, once idle, when the map grows past this many.
const TIDY_ABOVE: usize = 1_024;

/// Every key's lane.
#[derive(Default)]
pub(super) struct Lanes(Mutex<HashMap<String, Arc<Lane>>>);

impl Lanes {
    /// `key`'s lane, made on first use.
    pub(super) fn get(&self, key: &str) -> Arc<Lane> {
        let mut lanes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(lane) = lanes.get(key) {
            return Arc::clone(lane);
        }
        if lanes.len() >= TIDY_ABOVE {
            let now = Instant::now();
            // A lane no caller holds, with nothing in flight and nothing told that still
            // holds, is the same as a new one.
            lanes.retain(|_, lane| Arc::strong_count(lane) > 1 || !lane.told().is_idle(now));
        }
        Arc::clone(lanes.entry(key.to_owned()).or_default())
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
#[derive(Debug, Default)]
pub(super) struct Told {
    /// At most this much more may be spent until `until`.
    left: u64,
    /// When what was said stops holding; `None` when nothing holds.
    until: Option<Instant>,
    /// The serial number of the call whose answer said it: an older answer may only
    /// tighten it.
    source: u64,
    /// The serial number the next admitted call gets.
    next: u64,
    /// The cost of calls admitted and not answered yet.
    in_flight: u64,
    /// What holds is a refusal's pause: no answer lifts it before its end.
    paused: bool,
}

impl Told {
    /// Until when a call of `cost` must wait for what the upstream said, if it must.
    pub(super) fn holds_back(&self, now: Instant, cost: u64) -> Option<Instant> {
        self.until.filter(|&until| until > now && self.left < cost)
    }

    /// A call of `cost` was admitted: it is in flight, and spends from what was said.
    /// Returns its serial number.
    pub(super) fn admit(&mut self, now: Instant, cost: u64) -> u64 {
        if self.until.is_some_and(|until| until > now) {
            self.left = self.left.saturating_sub(cost);
        }
        self.in_flight = self.in_flight.saturating_add(cost);
        self.next += 1;
        self.next
    }

    /// A call of `cost` was answered, or will never be.
    pub(super) fn answered(&mut self, cost: u64) {
        self.in_flight = self.in_flight.saturating_sub(cost);
    }

    /// The answer to call `serial` (already [`answered`](Told::answered)) said that at most
    /// `remaining` more may be spent in the next `reset`. The calls still in flight were
    /// admitted before it came and the upstream may not have counted them yet, so they are
    /// taken off. An answer older than the one that set the present state, or any answer
    /// while a pause holds, only tightens it.
    pub(super) fn left(&mut self, now: Instant, serial: u64, remaining: u64, reset: Duration) {
        let left = remaining.saturating_sub(self.in_flight);
        let until = now + reset;
        let holding = self.until.is_some_and(|u| u > now);
        if !holding || (serial >= self.source && !self.paused) {
            self.left = left;
            self.until = Some(until);
            self.source = serial;
            self.paused = false;
        } else if left < self.left {
            self.left = left;
            self.until = self.until.max(Some(until));
        }
    }

    /// The answer to call `serial` refused it: nothing more until `pause` from now. A pause
    /// is never shortened by another answer, whatever its age.
    pub(super) fn pause(&mut self, now: Instant, serial: u64, pause: Duration) {
        let until = now + pause;
        let holding = self.until.is_some_and(|u| u > now);
        self.left = 0;
        self.paused = true;
        self.until = if holding {
            self.until.max(Some(until))
        } else {
            Some(until)
        };
        self.source = self.source.max(serial);
    }

    /// Nothing in flight and nothing said that still holds.
    fn is_idle(&self, now: Instant) -> bool {
        self.in_flight == 0 && self.until.is_none_or(|until| until <= now)
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
        // ... and says less: taken, for the longer of the two resets.
        told.left(now, old, 4, Duration::from_secs(5));
        assert_eq!(told.holds_back(now, 5), Some(now + Duration::from_secs(5)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_pause_holds_everything_and_is_never_shortened() {
        let now = Instant::now();
        let mut told = Told::default();
        let serial = told.admit(now, 1);
        told.answered(1);
        told.pause(now, serial, Duration::from_secs(3));
        assert_eq!(told.holds_back(now, 1), Some(now + Duration::from_secs(3)));
        told.pause(now, serial, Duration::from_secs(1));
        assert_eq!(told.holds_back(now, 1), Some(now + Duration::from_secs(3)));
        // A newer answer that says there is room does not lift it either.
        told.left(now, serial + 1, 10, Duration::from_secs(1));
        assert_eq!(told.holds_back(now, 1), Some(now + Duration::from_secs(3)));
        assert!(!told.is_idle(now));
        assert!(told.is_idle(now + Duration::from_secs(3)));
    }
}
