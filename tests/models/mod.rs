//! Plain reference models of the three algorithms, written straight from the semantics in docs/ALGORITHMS.md
//! for clarity rather than speed. One copy, shared by the property tests (`mod models;` in
//! `tests/core/proptest_*.rs`) and by the differential fuzz target (`fuzz/src/lib.rs` includes
//! this file with `#[path]`). `composite.rs` combines them for policies of several bands.
//!
//! Each model decides one key's requests given the clock reading, and says whether it is at
//! rest. Faulty clocks follow docs/ALGORITHMS.md ("Faulty clocks"): a stored time ahead of now is decided as
//! the furthest valid one, and never moved backwards.

#![allow(dead_code)]

pub mod composite;

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
    /// What a request of `cost` at `now` would be told, changing nothing.
    fn peek(&self, now: u64, cost: u64) -> Outcome
    where
        Self: Clone,
    {
        self.clone().acquire(now, cost)
    }
}

/// The token bucket in its textbook "allowance" form, independent of the crate's GCRA (TAT)
/// arithmetic: a bucket of `burst = permits * interval` nanoseconds of allowance that refills
/// one nanosecond per nanosecond, where a permit costs `interval` = window / permits rounded
/// up (the crate's documented rounding). Only an admission writes; a refusal changes nothing.
///
/// A clock reading before the last admission drains the allowance by the difference
/// (never below zero) instead of refilling it: the state keeps the same instant at which the
/// bucket is full again, as the crate's faulty-clock rule asks, with "further ahead than any valid
/// state" meaning an empty bucket.
#[derive(Clone, Debug)]
pub struct GcraModel {
    permits: u64,
    interval: u128,
    burst: u128,
    /// Allowance in nanoseconds at `last`.
    allowance: u128,
    /// Clock reading of the last admission (0 for a key never seen).
    last: u64,
}

impl GcraModel {
    /// The allowance at `now`: refilled up to the burst, or drained (not below zero) when
    /// the clock reads before the last admission.
    fn allowance(&self, now: u64) -> u128 {
        if now >= self.last {
            (self.allowance + u128::from(now - self.last)).min(self.burst)
        } else {
            self.allowance.saturating_sub(u128::from(self.last - now))
        }
    }
}

impl Model for GcraModel {
    fn new(permits: u64, window: u64) -> Self {
        let interval = u128::from(window).div_ceil(u128::from(permits));
        let burst = interval * u128::from(permits);
        GcraModel {
            permits,
            interval,
            burst,
            allowance: burst,
            last: 0,
        }
    }

    fn acquire(&mut self, now: u64, cost: u64) -> Outcome {
        let allowance = self.allowance(now);
        let price = u128::from(cost) * self.interval;
        let nanos = |n: u128| u64::try_from(n).unwrap();
        if allowance >= price {
            let left = allowance - price;
            self.allowance = left;
            self.last = now;
            Outcome {
                allowed: true,
                remaining: nanos(left / self.interval),
                retry_after: 0,
                reset_after: nanos(self.burst - left),
                limit: self.permits,
            }
        } else {
            Outcome {
                allowed: false,
                remaining: nanos(allowance / self.interval),
                retry_after: nanos(price - allowance),
                reset_after: nanos(self.burst - allowance),
                limit: self.permits,
            }
        }
    }

    fn is_at_rest(&self, now: u64) -> bool {
        self.allowance(now) == self.burst
    }
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
