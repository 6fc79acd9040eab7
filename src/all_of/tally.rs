//! What the parts of an [`AllOf`](super::AllOf) decided, combined into one decision.

use crate::decision::Decision;
use crate::error::CostError;

/// The parts' decisions so far, as much of them as the combined decision needs. Public in
/// name only, as the sealed trait whose methods take it.
#[derive(Debug, Default)]
#[allow(unreachable_pub)]
pub struct Tally {
    /// The allowing part with the least remaining (the first of equals), or the first part
    /// whose refusal shadow mode let through (the whole is then such a refusal).
    least_left: Option<(usize, Decision)>,
    /// The refusing part with the longest wait (the first of equals).
    longest: Option<(usize, Decision)>,
    /// The least any part had available before it decided.
    least_available: Option<u64>,
    /// The first part whose cost no state of its policy could admit.
    error: Option<(usize, CostError)>,
}

impl Tally {
    /// Part `index` decided `decision` on a request of `cost`.
    #[inline]
    pub(crate) fn decided(&mut self, index: usize, decision: &Decision, cost: u64) {
        let available = decision.available_before(cost);
        self.least_available = Some(
            self.least_available
                .map_or(available, |least| least.min(available)),
        );
        if decision.is_allowed() {
            let reported = self.least_left.is_none_or(|(_, least)| {
                !least.would_refuse()
                    && (decision.would_refuse() || decision.remaining() < least.remaining())
            });
            if reported {
                self.least_left = Some((index, *decision));
            }
        } else if self
            .longest
            .is_none_or(|(_, longest)| decision.retry_after_nanos() > longest.retry_after_nanos())
        {
            self.longest = Some((index, *decision));
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
        let least_available = self.least_available.unwrap_or(u64::MAX);
        match (self.longest, self.least_left) {
            // The refusal as its part made it (its limit, band and flags), with the least any
            // part has as `remaining` (the refusing part's own remaining is among them).
            (Some((index, refusal)), _) => refusal.with_remaining(least_available).in_part(index),
            (None, Some((index, admission))) => admission.in_part(index),
            // No part: nothing limits the request.
            (None, None) => Decision::allow(u64::MAX, u64::MAX, 0),
        }
    }
}
