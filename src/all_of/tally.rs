//! What the parts of an [`AllOf`](super::AllOf) decided, combined into one decision.

use crate::decision::Decision;
use crate::error::CostError;

/// The parts' decisions so far, as much of them as the combined decision needs. Public in
/// name only, as the sealed trait whose methods take it.
///
/// Laid out for the path where every part allows: one decision reported so far, with what
/// kind it is beside it, rather than an optional decision per kind to test and rewrite; an
/// admission after admissions tests the kind once and compares what is left.
#[derive(Debug)]
#[allow(unreachable_pub)]
pub struct Tally {
    /// The decision reported so far: see [`Reported`].
    reported: Decision,
    /// Its part's position (set in the combined decision once, at the end).
    part: usize,
    /// What `reported` is.
    kind: Reported,
    /// The least any part had available before it decided (`u64::MAX` before any did).
    least_available: u64,
    /// The first part whose cost no state of its policy could admit.
    error: Option<(usize, CostError)>,
}

/// What the decision a [`Tally`] reports so far is, in the order a later part's decision
/// may take its place: only by one of a kind as far down the list or further.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Reported {
    /// No part has decided: nothing limits the request.
    Nothing,
    /// Every part so far allowed: the one with the least left (the first of equals).
    LeastLeft,
    /// A part's refusal that shadow mode let through, the first one: the whole is such a
    /// refusal, unless a part refuses for real.
    Shadowed,
    /// A part refused: the refusal with the longest wait (the first of equals).
    Refused,
}

/// The decision of an `AllOf` with no part: nothing limits the request.
const NOTHING_LIMITS: Decision = Decision::allow(u64::MAX, u64::MAX, 0);

impl Default for Tally {
    fn default() -> Self {
        Tally {
            reported: NOTHING_LIMITS,
            part: 0,
            kind: Reported::Nothing,
            least_available: u64::MAX,
            error: None,
        }
    }
}

impl Tally {
    /// Part `index` decided `decision` on a request of `cost`.
    ///
    /// An admission while every part before it admitted, the path of every decision an
    /// `AllOf` allows, takes the short branch: the least available, and the least left.
    #[inline(always)]
    pub(crate) fn decided(&mut self, index: usize, decision: &Decision, cost: u64) {
        if decision.spent() && self.kind <= Reported::LeastLeft {
            let remaining = decision.remaining();
            self.least_available = self.least_available.min(remaining.saturating_add(cost));
            if remaining < self.reported.remaining() || self.kind == Reported::Nothing {
                self.report(index, decision, Reported::LeastLeft);
            }
        } else {
            self.decided_otherwise(index, decision, cost);
        }
    }

    /// As [`decided`](Tally::decided), for a refusal, a refusal shadow mode let through, or
    /// an admission after either.
    #[inline(always)]
    fn decided_otherwise(&mut self, index: usize, decision: &Decision, cost: u64) {
        self.least_available = self.least_available.min(decision.available_before(cost));
        if decision.spent() {
            // A refusal (let through or not) is reported already: it stays.
        } else if decision.is_allowed() {
            if self.kind <= Reported::LeastLeft {
                self.report(index, decision, Reported::Shadowed);
            }
        } else if self.kind != Reported::Refused
            || decision.retry_after_nanos() > self.reported.retry_after_nanos()
        {
            self.report(index, decision, Reported::Refused);
        }
    }

    /// Reports part `index`'s `decision`, of kind `kind`.
    #[inline(always)]
    fn report(&mut self, index: usize, decision: &Decision, kind: Reported) {
        self.reported = *decision;
        self.part = index;
        self.kind = kind;
    }

    /// Part `index`'s cost was refused as bad input.
    pub(crate) fn failed(&mut self, index: usize, error: CostError) {
        self.error.get_or_insert((index, error));
    }

    /// The first part whose cost was refused, and why.
    pub(crate) fn error(&self) -> Option<(usize, CostError)> {
        self.error
    }

    /// The combined decision: a refusal when a part refused or had a cost no state could
    /// admit, else the admission of the part with the least left (see `AllOf`).
    #[inline]
    pub(crate) fn decision(&self) -> Decision {
        if let Some((index, error)) = self.error {
            let limit = match error {
                CostError::ExceedsLimit { limit, .. } => limit,
                CostError::Zero => 0,
            };
            // Never: no wait lets this request through.
            return Decision::deny(0, limit, u64::MAX, 0).in_part(index);
        }
        let reported = match self.kind {
            // The refusal as its part made it (its limit, band and flags), with the least any
            // part has as `remaining` (the refusing part's own remaining is among them).
            Reported::Refused => self.reported.with_remaining(self.least_available),
            Reported::Nothing | Reported::LeastLeft | Reported::Shadowed => self.reported,
        };
        reported.in_part(self.part)
    }
}

#[cfg(test)]
mod tests;
