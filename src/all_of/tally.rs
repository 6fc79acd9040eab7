//! What the parts of an [`AllOf`](super::AllOf) decided, combined into one decision.

use crate::decision::Decision;
use crate::error::CostError;

/// The parts' decisions so far, as much of them as the combined decision needs. Public in
/// name only, as the sealed trait whose methods take it.
///
/// Laid out for the path where every part allows: one decision reported so far, with what
/// kind it is beside it, rather than an optional decision per kind to test and rewrite.
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

/// What the decision a [`Tally`] reports so far is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    #[inline(always)]
    pub(crate) fn decided(&mut self, index: usize, decision: &Decision, cost: u64) {
        self.least_available = self.least_available.min(decision.available_before(cost));
        let (reported, kind) = if decision.spent() {
            let reported = match self.kind {
                Reported::Nothing => true,
                Reported::LeastLeft => decision.remaining() < self.reported.remaining(),
                Reported::Shadowed | Reported::Refused => false,
            };
            (reported, Reported::LeastLeft)
        } else if decision.is_allowed() {
            let reported = matches!(self.kind, Reported::Nothing | Reported::LeastLeft);
            (reported, Reported::Shadowed)
        } else {
            let reported = self.kind != Reported::Refused
                || decision.retry_after_nanos() > self.reported.retry_after_nanos();
            (reported, Reported::Refused)
        };
        if reported {
            self.reported = *decision;
            self.part = index;
            self.kind = kind;
        }
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
