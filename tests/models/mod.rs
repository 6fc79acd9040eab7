//! Plain reference models of the three algorithms, written straight from the semantics in docs/ALGORITHMS.md
//! for clarity rather than speed. One copy, shared by the property tests (`mod models;` in
//! `tests/core/proptest_*.rs`) and by the differential fuzz target (`fuzz/src/lib.rs` includes
//! this file with `#[path]`). `composite.rs` combines them for policies of several bands.
//!
//! Each model decides one key's requests given the clock reading, and says whether it is at
//! rest. Faulty clocks follow docs/ALGORITHMS.md ("Faulty clocks"): a stored time ahead of now is decided as
//! the furthest valid one, and never moved backwards.
//!
//! Each also reserves and settles (`reserve_n`, then `settle` or `cancel`): a reservation is
//! decided as an acquisition, and the model hands back a mark of its own (the instant the
//! bucket is full again, the stamp of the log's entries, the counter's window), from which it
//! settles later by the rules each algorithm's `settle` documents in `src/engine/`.

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
    /// Reserves `cost` at `now`: decided exactly as `acquire`. For an admission, also the
    /// mark `settle` needs later (what it means is the model's own; 0 for a refusal).
    fn reserve(&mut self, now: u64, cost: u64) -> (Outcome, u64);
    /// Settles at `now` an admission of `held` permits that `reserve` marked `mark` and
    /// that really cost `actual`: gives back `held - actual`, or charges `actual - held`.
    fn settle(&mut self, held: u64, mark: u64, actual: u64, now: u64);
}

/// The token bucket in its textbook "allowance" form, independent of the crate's GCRA (TAT)
/// arithmetic: a bucket of `burst = permits * interval` nanoseconds of allowance that refills
/// one nanosecond per nanosecond, where a permit costs `interval` = window / permits rounded
/// up (the crate's documented rounding). Only an admission or a settle writes; a refusal
/// changes nothing.
///
/// Settling a reservation may charge more than the bucket holds: the allowance then goes
/// negative, a debt later requests wait out, down to `-burst` (one more full burst) at most.
///
/// A clock reading before the last change drains the allowance by the difference (never
/// below `-burst`) instead of refilling it: the state keeps the same instant at which the
/// bucket is full again, as the crate's faulty-clock rule asks, with "further ahead than any
/// valid state" meaning a bucket a full burst in debt (`Gcra::decide`: a TAT at most `2B`
/// ahead of now).
#[derive(Clone, Debug)]
pub struct GcraModel {
    permits: u64,
    interval: i128,
    burst: i128,
    /// Allowance in nanoseconds at `last`: `-burst ..= burst`.
    allowance: i128,
    /// Clock reading of the last change (0 for a key never seen).
    last: u64,
}

impl GcraModel {
    /// The allowance at `now`: refilled up to the burst, or drained (not below `-burst`)
    /// when the clock reads before the last change.
    fn allowance(&self, now: u64) -> i128 {
        let (now, last) = (i128::from(now), i128::from(self.last));
        if now >= last {
            (self.allowance + (now - last)).min(self.burst)
        } else {
            (self.allowance - (last - now)).max(-self.burst)
        }
    }

    /// The instant the bucket is full again if nothing more is admitted.
    fn full_at(&self) -> i128 {
        i128::from(self.last) + self.burst - self.allowance
    }

    /// Makes the bucket full again at `instant` (not before now, so not negative).
    fn set_full_at(&mut self, instant: i128) {
        self.last = u64::try_from(instant).unwrap();
        self.allowance = self.burst;
    }
}

impl Model for GcraModel {
    fn new(permits: u64, window: u64) -> Self {
        let interval = i128::from(window.div_ceil(permits));
        let burst = interval * i128::from(permits);
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
        let price = i128::from(cost) * self.interval;
        let nanos = |n: i128| u64::try_from(n).unwrap();
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
                // A bucket in debt has nothing available.
                remaining: nanos(allowance.max(0) / self.interval),
                retry_after: nanos(price - allowance),
                reset_after: nanos(self.burst - allowance),
                limit: self.permits,
            }
        }
    }

    fn is_at_rest(&self, now: u64) -> bool {
        self.allowance(now) == self.burst
    }

    /// The mark is the instant the bucket is full again right after the admission.
    fn reserve(&mut self, now: u64, cost: u64) -> (Outcome, u64) {
        let outcome = self.acquire(now, cost);
        let mark = if outcome.allowed {
            u64::try_from(self.full_at()).unwrap()
        } else {
            0
        };
        (outcome, mark)
    }

    /// A refund of `k` brings back `k` permits' worth of allowance, but no more than the
    /// reservation's own debt still outstanding (`mark - latest`, with the clock read as at
    /// least `full_at - burst`: time has refilled the rest) and never beyond a full bucket. A charge of `k` more takes `k` permits' worth from
    /// the allowance as it stands now, whatever it is, down to `-burst`; it never makes the
    /// bucket full earlier than it already was. Both move the instant the bucket is full
    /// again, not the allowance as read now, so a clock that went backwards keeps its
    /// excess.
    fn settle(&mut self, held: u64, mark: u64, actual: u64, now: u64) {
        if actual == held {
            return;
        }
        let full_at = self.full_at();
        let now = i128::from(now);
        if actual < held {
            if full_at <= now {
                // Full already: nothing to give back.
                return;
            }
            // The clock read as at least `full_at - burst`, the earliest instant the last
            // admission can have been decided at (a clock set back gives back no more).
            let latest = now.max(full_at - self.burst);
            let outstanding = (i128::from(mark) - latest).max(0);
            let give = (i128::from(held - actual) * self.interval).min(outstanding);
            self.set_full_at((full_at - give).max(now));
        } else {
            let debt = (full_at - now).clamp(0, 2 * self.burst);
            let charged = (debt + i128::from(actual - held) * self.interval).min(2 * self.burst);
            self.set_full_at(full_at.max(now + charged));
        }
    }
}

/// The sliding window log: every admitted permit's timestamp, the last `permits` of them.
///
/// A refund removes entries; when more than `permits` entries were ever written (less those
/// removed), the log had already dropped older ones, and as many of those come back into
/// view as were removed: the crate's ring keeps no stamps for them, and gives them the one
/// `Fix::Remove` documents, no later than the oldest entry and at least a window before the
/// settle (gone, unless the clock later goes back).
#[derive(Clone, Debug)]
pub struct LogModel {
    permits: u64,
    window: u64,
    entries: VecDeque<u64>,
    /// Entries ever written, less those refunds removed.
    written: u64,
}

impl LogModel {
    /// Whether an entry stamped `entry` counts at `now`: an entry in the future counts as
    /// stamped now; an entry exactly W old has left.
    fn is_live(&self, entry: u64, now: u64) -> bool {
        now - entry.min(now) < self.window
    }

    /// Appends `cost` entries at `now`, stamped no earlier than the newest, keeping the last
    /// `permits`; returns their stamp.
    fn append(&mut self, now: u64, cost: u64) -> u64 {
        let stamp = self.entries.back().map_or(now, |&newest| newest.max(now));
        for _ in 0..cost {
            self.entries.push_back(stamp);
        }
        while self.entries.len() as u64 > self.permits {
            self.entries.pop_front();
        }
        self.written += cost;
        stamp
    }
}

impl Model for LogModel {
    fn new(permits: u64, window: u64) -> Self {
        LogModel {
            permits,
            window,
            entries: VecDeque::new(),
            written: 0,
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
            self.append(now, cost);
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

    /// The mark is the stamp of the admission's entries.
    fn reserve(&mut self, now: u64, cost: u64) -> (Outcome, u64) {
        let outcome = self.acquire(now, cost);
        let mark = if outcome.allowed {
            *self.entries.back().unwrap()
        } else {
            0
        };
        (outcome, mark)
    }

    /// A refund of `k` removes up to `k` of the entries stamped `mark`, if they still count
    /// (gone ones no longer do) and are still in the log. A charge of `k` more appends
    /// entries as an admission would, but only as many as the log has room for: at most
    /// `permits` live.
    fn settle(&mut self, held: u64, mark: u64, actual: u64, now: u64) {
        if actual == held {
            return;
        }
        if actual > held {
            let live = self
                .entries
                .iter()
                .filter(|&&e| self.is_live(e, now))
                .count() as u64;
            let cost = (actual - held).min(self.permits - live);
            if cost > 0 {
                self.append(now, cost);
            }
            return;
        }
        if !self.is_live(mark, now) {
            return;
        }
        let stamped = self.entries.iter().filter(|&&e| e == mark).count() as u64;
        let take = (held - actual).min(stamped);
        if take == 0 {
            return;
        }
        let Some(&oldest) = self.entries.front() else {
            return;
        };
        let mut left = take;
        self.entries.retain(|&e| {
            let remove = e == mark && left > 0;
            left -= u64::from(remove);
            !remove
        });
        let dropped = self.written.saturating_sub(self.permits);
        let gone = oldest.min(now.saturating_sub(self.window));
        for _ in 0..take.min(dropped) {
            self.entries.push_front(gone);
        }
        self.written -= take;
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

    /// The mark is the window the admission was counted in.
    fn reserve(&mut self, now: u64, cost: u64) -> (Outcome, u64) {
        let outcome = self.acquire(now, cost);
        let mark = if outcome.allowed { self.index } else { 0 };
        (outcome, mark)
    }

    /// A settle first moves the counts on to now's window, as an admission does. A refund of
    /// `k` then takes up to `k` from the count of the reservation's window, if that is still
    /// the current or the previous one (an older window counts for nothing any more). A
    /// charge of `k` more adds `k` to the current count, whatever the estimate, up to twice
    /// the permits.
    fn settle(&mut self, held: u64, mark: u64, actual: u64, now: u64) {
        if actual == held {
            return;
        }
        let now = self.effective(now);
        let (previous, current, _) = self.view(now);
        self.index = now / self.window;
        self.previous = previous;
        self.current = current;
        if actual < held {
            let k = held - actual;
            if mark == self.index {
                self.current -= k.min(self.current);
            } else if mark + 1 == self.index {
                self.previous -= k.min(self.previous);
            }
        } else {
            self.current = (self.current + (actual - held))
                .min(2 * self.permits)
                .max(self.current);
        }
    }
}
