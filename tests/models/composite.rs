//! The combined model of a composite policy (several bands, all-or-nothing), built from the
//! per-band reference models of `mod.rs`; shared by `tests/core/proptest_composite.rs` and the
//! differential fuzz target.
//!
//! The combined model peeks every band's model (a clone decides, the model itself is left
//! alone); only when every band allows does it commit the request to all of them. Its
//! decision follows the table in `src/engine/composite.rs`: allowed, the smallest remaining and its
//! band's limit, the largest reset_after; refused, the smallest of the permits available now,
//! the largest retry_after among the refusing bands, and the largest reset_after as the bands
//! stand (for a band that would allow, found from the model's own `is_at_rest`).
//!
//! A reservation is decided as a request; once admitted, each band's model marks it, and
//! settling it settles every band by its own model's rule, with its own mark.
//!
//! Time must only move forwards: a band's reset_after is found by bisection over its
//! `is_at_rest`, which assumes no stored time lies ahead of now.

use tollgate::policy::Band;
use tollgate::{Algorithm, Policy};

use super::{CounterModel, GcraModel, LogModel, Model, Outcome};

/// One band's reference model.
#[derive(Clone, Debug)]
pub enum BandModel {
    Bucket(GcraModel),
    Log(LogModel),
    Counter(CounterModel),
}

impl BandModel {
    pub fn new(band: Band) -> Self {
        let (permits, window) = (band.permits(), band.window().as_nanos() as u64);
        match band.algorithm() {
            Algorithm::TokenBucket => BandModel::Bucket(GcraModel::new(permits, window)),
            Algorithm::SlidingLog => BandModel::Log(LogModel::new(permits, window)),
            Algorithm::SlidingCounter => BandModel::Counter(CounterModel::new(permits, window)),
        }
    }

    pub fn acquire(&mut self, now: u64, cost: u64) -> Outcome {
        match self {
            BandModel::Bucket(m) => m.acquire(now, cost),
            BandModel::Log(m) => m.acquire(now, cost),
            BandModel::Counter(m) => m.acquire(now, cost),
        }
    }

    pub fn peek(&self, now: u64, cost: u64) -> Outcome {
        self.clone().acquire(now, cost)
    }

    pub fn reserve(&mut self, now: u64, cost: u64) -> (Outcome, u64) {
        match self {
            BandModel::Bucket(m) => m.reserve(now, cost),
            BandModel::Log(m) => m.reserve(now, cost),
            BandModel::Counter(m) => m.reserve(now, cost),
        }
    }

    pub fn settle(&mut self, held: u64, mark: u64, actual: u64, now: u64) {
        match self {
            BandModel::Bucket(m) => m.settle(held, mark, actual, now),
            BandModel::Log(m) => m.settle(held, mark, actual, now),
            BandModel::Counter(m) => m.settle(held, mark, actual, now),
        }
    }

    pub fn is_at_rest(&self, now: u64) -> bool {
        match self {
            BandModel::Bucket(m) => m.is_at_rest(now),
            BandModel::Log(m) => m.is_at_rest(now),
            BandModel::Counter(m) => m.is_at_rest(now),
        }
    }

    /// Nanoseconds until the band is at rest with nothing more admitted: the first instant
    /// from which `is_at_rest` holds (it holds for good once it does, time running forwards),
    /// found by bisection. Every algorithm is at rest `4 * window` after its last change at
    /// the latest: a sliding log one window after, a sliding counter two (whatever a charge
    /// added to its counts), a token bucket in debt two bursts, each below two windows.
    pub fn reset_after(&self, now: u64, window: u64) -> u64 {
        if self.is_at_rest(now) {
            return 0;
        }
        let (mut lo, mut hi) = (now, now + 4 * window);
        assert!(self.is_at_rest(hi), "at rest after 4W: {self:?}");
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.is_at_rest(mid) {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        hi - now
    }
}

/// The combined model: the bands in the policy's order, all-or-nothing.
#[derive(Clone, Debug)]
pub struct CompositeModel {
    bands: Vec<(BandModel, u64)>,
}

impl CompositeModel {
    pub fn new(policy: &Policy) -> Self {
        CompositeModel {
            bands: policy
                .bands()
                .map(|b| (BandModel::new(b), b.window().as_nanos() as u64))
                .collect(),
        }
    }

    pub fn acquire(&mut self, now: u64, cost: u64) -> Outcome {
        self.reserve(now, cost).0
    }

    /// Reserves `cost` at `now`: decided as `acquire`; for an admission, also every band's
    /// mark, in band order (empty for a refusal).
    pub fn reserve(&mut self, now: u64, cost: u64) -> (Outcome, Vec<u64>) {
        let peeked: Vec<Outcome> = self.bands.iter().map(|(m, _)| m.peek(now, cost)).collect();
        // The first band with the smallest value wins a tie.
        let smallest = |values: &[(u64, u64)]| {
            values
                .iter()
                .copied()
                .reduce(|best, v| if v.0 < best.0 { v } else { best })
                .unwrap()
        };
        if peeked.iter().all(|o| o.allowed) {
            let mut marks = Vec::new();
            for (model, _) in &mut self.bands {
                let (committed, mark) = model.reserve(now, cost);
                assert!(committed.allowed);
                marks.push(mark);
            }
            let (remaining, limit) = smallest(
                &peeked
                    .iter()
                    .map(|o| (o.remaining, o.limit))
                    .collect::<Vec<_>>(),
            );
            let outcome = Outcome {
                allowed: true,
                remaining,
                retry_after: 0,
                reset_after: peeked.iter().map(|o| o.reset_after).max().unwrap(),
                limit,
            };
            return (outcome, marks);
        }
        let available: Vec<(u64, u64)> = peeked
            .iter()
            .map(|o| {
                let now_available = if o.allowed {
                    o.remaining + cost
                } else {
                    o.remaining
                };
                (now_available, o.limit)
            })
            .collect();
        let (remaining, limit) = smallest(&available);
        let reset_after = self
            .bands
            .iter()
            .zip(&peeked)
            .map(|((model, window), o)| {
                if o.allowed {
                    model.reset_after(now, *window)
                } else {
                    o.reset_after
                }
            })
            .max()
            .unwrap();
        let outcome = Outcome {
            allowed: false,
            remaining,
            retry_after: peeked
                .iter()
                .filter(|o| !o.allowed)
                .map(|o| o.retry_after)
                .max()
                .unwrap(),
            reset_after,
            limit,
        };
        (outcome, Vec::new())
    }

    /// Settles at `now` an admission of `held` permits that `reserve` marked `marks` and that
    /// really cost `actual`: every band by its own rule, all at once.
    pub fn settle(&mut self, held: u64, marks: &[u64], actual: u64, now: u64) {
        for ((model, _), &mark) in self.bands.iter_mut().zip(marks) {
            model.settle(held, mark, actual, now);
        }
    }

    pub fn is_at_rest(&self, now: u64) -> bool {
        self.bands.iter().all(|(m, _)| m.is_at_rest(now))
    }

    /// What a request of `cost` at `now` would be told, changing nothing.
    pub fn peek(&self, now: u64, cost: u64) -> Outcome {
        self.clone().acquire(now, cost)
    }
}
