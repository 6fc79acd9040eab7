//! Plain reference models of the windowed algorithms, written straight from DESIGN.md
//! section 3 for clarity rather than speed, shared by the property tests (`mod models;`).
//!
//! Each model decides one key's requests given the clock reading, and says whether it is at
//! rest. Faulty clocks follow DESIGN.md section 5: a stored time ahead of now is decided as
//! the furthest valid one, and never moved backwards.

#![allow(dead_code)]

use std::collections::VecDeque;

use tollgate::Decision;

/// Everything a decision reports, in nanoseconds, comparable with `==`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub allowed: bool,
    pub remaining: u64,
    pub retry_after: u64,
    pub reset_after: u64,
    pub limit: u64,
}

impl From<Decision> for Outcome {
    fn from(d: Decision) -> Self {
        Outcome {
            allowed: d.is_allowed(),
            remaining: d.remaining(),
            retry_after: u64::try_from(d.retry_after().as_nanos()).unwrap(),
            reset_after: u64::try_from(d.reset_after().as_nanos()).unwrap(),
            limit: d.limit(),
        }
    }
}

/// A model of one key's state under one algorithm.
pub trait Model {
    /// A key never seen, for `permits` per `window` nanoseconds.
    fn new(permits: u64, window: u64) -> Self;
    /// Decides a request of `cost` at `now`, updating the state when it is allowed.
    fn acquire(&mut self, now: u64, cost: u64) -> Outcome;
    /// Whether the state decides as a fresh one from `now` on.
    fn is_at_rest(&self, now: u64) -> bool;
}

/// The sliding window log: every admitted permit's timestamp, the last `permits` of them.
#[derive(Clone, Debug)]
pub struct LogModel {
    permits: u64,
    window: u64,
    entries: VecDeque<u64>,
}

impl Model for LogModel {
    fn new(permits: u64, window: u64) -> Self {
        LogModel {
            permits,
            window,
            entries: VecDeque::new(),
        }
    }

    fn acquire(&mut self, now: u64, cost: u64) -> Outcome {
        // An entry in the future counts as stamped now; an entry exactly W old has left.
        let mut live: Vec<u64> = self
            .entries
            .iter()
            .map(|&e| e.min(now))
            .filter(|&e| now - e < self.window)
            .collect();
        live.sort_unstable();
        let live_count = live.len() as u64;
        if live_count + cost <= self.permits {
            let stamp = self.entries.back().map_or(now, |&newest| newest.max(now));
            for _ in 0..cost {
                self.entries.push_back(stamp);
            }
            while self.entries.len() as u64 > self.permits {
                self.entries.pop_front();
            }
            Outcome {
                allowed: true,
                remaining: self.permits - live_count - cost,
                retry_after: 0,
                reset_after: self.window,
                limit: self.permits,
            }
        } else {
            // These many live entries must leave, oldest first, for the request to fit.
            let leave = (live_count + cost - self.permits) as usize;
            let newest = *live.last().unwrap();
            Outcome {
                allowed: false,
                remaining: self.permits - live_count,
                retry_after: live[leave - 1] + self.window - now,
                reset_after: newest + self.window - now,
                limit: self.permits,
            }
        }
    }

    fn is_at_rest(&self, now: u64) -> bool {
        self.entries
            .iter()
            .all(|&e| e <= now && now - e >= self.window)
    }
}

/// The sliding window counter: the window index of the last admission and two counts. The
/// estimate is kept as an exact fraction over `W`.
#[derive(Clone, Debug)]
pub struct CounterModel {
    permits: u64,
    window: u64,
    index: u64,
    current: u64,
    previous: u64,
}

impl CounterModel {
    /// The clock reading decided at: time that runs backwards counts as zero elapsed, so a
    /// reading before the start of the last admission's window is taken as that start.
    fn effective(&self, now: u64) -> u64 {
        now.max(self.index * self.window)
    }

    /// (previous, current, elapsed) as seen at `now`, which is not before the stored window.
    fn view(&self, now: u64) -> (u64, u64, u64) {
        let now_index = now / self.window;
        let elapsed = now - now_index * self.window;
        if self.index == now_index {
            (self.previous, self.current, elapsed)
        } else if self.index + 1 == now_index {
            (self.current, 0, elapsed)
        } else {
            (0, 0, elapsed)
        }
    }

    /// `estimate * W` at `now`, plus `extra` requests.
    fn scaled_estimate(&self, now: u64, extra: u64) -> u128 {
        let (previous, current, elapsed) = self.view(now);
        let w = u128::from(self.window);
        u128::from(previous) * (w - u128::from(elapsed)) + u128::from(current + extra) * w
    }

    /// Whether a request of `cost` fits at `now`: `estimate + cost - 1 < N`.
    fn fits(&self, now: u64, cost: u64) -> bool {
        self.scaled_estimate(now, cost - 1) < u128::from(self.permits * self.window)
    }

    /// `max(0, ceil(N - estimate))` at `now` with `extra` requests counted in.
    fn remaining(&self, now: u64, extra: u64) -> u64 {
        let w = i128::from(self.window);
        let spare = i128::from(self.permits) * w - self.scaled_estimate(now, extra) as i128;
        if spare <= 0 {
            0
        } else {
            ((spare + w - 1) / w) as u64
        }
    }
}

impl Model for CounterModel {
    fn new(permits: u64, window: u64) -> Self {
        CounterModel {
            permits,
            window,
            index: 0,
            current: 0,
            previous: 0,
        }
    }

    fn acquire(&mut self, now: u64, cost: u64) -> Outcome {
        let now = self.effective(now);
        let elapsed = now % self.window;
        let (previous, current, _) = self.view(now);
        if self.fits(now, cost) {
            let remaining = self.remaining(now, cost);
            self.index = now / self.window;
            self.previous = previous;
            self.current = current + cost;
            return Outcome {
                allowed: true,
                remaining,
                retry_after: 0,
                reset_after: 2 * self.window - elapsed,
                limit: self.permits,
            };
        }
        // The first nanosecond at which the same request fits: found by bisection over
        // (now, now + 2W], relying on the estimate never growing while nothing is admitted.
        let (mut lo, mut hi) = (now, now + 2 * self.window);
        assert!(self.fits(hi, cost), "fits at the latest after 2W");
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.fits(mid, cost) {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        let reset_after = if current > 0 {
            2 * self.window - elapsed
        } else if previous > 0 {
            self.window - elapsed
        } else {
            0
        };
        Outcome {
            allowed: false,
            remaining: self.remaining(now, 0),
            retry_after: hi - now,
            reset_after,
            limit: self.permits,
        }
    }

    fn is_at_rest(&self, now: u64) -> bool {
        let (previous, current, _) = self.view(self.effective(now));
        previous == 0 && current == 0
    }
}
