//! The tally against a model of the rules `AllOf` documents, written out longhand: every
//! sequence of up to four part decisions from a set that holds ties, a part with nothing
//! spent of `u64::MAX` permits, a cost that saturates what was available, refusals that
//! shadow mode let through, and refusals of equal and unequal waits.

use crate::decision::Decision;

use super::Tally;

/// What an `AllOf` whose parts decided `parts` (each decision with its cost) answers: a
/// refusal, the one with the longest wait (the first of equals) with the least any part had
/// available as `remaining`; else the first refusal that shadow mode let through; else the
/// admission with the least left (the first of equals); with no part, nothing limits.
fn model(parts: &[(Decision, u64)]) -> Decision {
    let Some(first) = parts.first() else {
        return Decision::allow(u64::MAX, u64::MAX, 0).in_part(0);
    };
    let available = |(decision, cost): &(Decision, u64)| {
        if decision.is_allowed() && !decision.would_refuse() {
            decision.remaining().saturating_add(*cost)
        } else {
            decision.remaining()
        }
    };
    let least_available = parts.iter().map(available).min().unwrap_or(u64::MAX);
    let mut refusal: Option<(usize, Decision)> = None;
    for (index, (decision, _)) in parts.iter().enumerate() {
        if !decision.is_allowed()
            && refusal.is_none_or(|(_, longest)| {
                decision.retry_after_nanos() > longest.retry_after_nanos()
            })
        {
            refusal = Some((index, *decision));
        }
    }
    if let Some((index, decision)) = refusal {
        return decision.with_remaining(least_available).in_part(index);
    }
    if let Some(index) = parts
        .iter()
        .position(|(decision, _)| decision.would_refuse())
    {
        return parts[index].0.in_part(index);
    }
    let mut least = (0, first.0);
    for (index, (decision, _)) in parts.iter().enumerate().skip(1) {
        if decision.remaining() < least.1.remaining() {
            least = (index, *decision);
        }
    }
    least.1.in_part(least.0)
}

#[test]
fn every_sequence_of_up_to_four_parts_is_combined_as_documented() {
    let choices = [
        (Decision::allow(5, 10, 100), 1),
        (Decision::allow(3, 20, 200), 2),
        // As much left as the one before: the first of the two is reported.
        (Decision::allow(3, 30, 300), 1),
        // Nothing spent of `u64::MAX` permits: still reported when it is the first part.
        (Decision::allow(u64::MAX, u64::MAX, 7), 1),
        // What was available saturates.
        (Decision::allow(7, 10, 0), u64::MAX),
        (Decision::deny(2, 10, 50, 100).shadowed(), 1),
        (Decision::deny(1, 10, 70, 100).shadowed(), 3),
        (Decision::deny(4, 10, 500, 100), 1),
        (Decision::deny(0, 10, 900, 100), 5),
        // As long a wait as the one before: the first of the two is reported.
        (Decision::deny(9, 10, 900, 400), 1),
    ];
    let mut checked = 0;
    for len in 0..=4_u32 {
        for mut n in 0..choices.len().pow(len) {
            let mut parts = Vec::new();
            for _ in 0..len {
                parts.push(choices[n % choices.len()]);
                n /= choices.len();
            }
            let mut tally = Tally::default();
            for (index, (decision, cost)) in parts.iter().enumerate() {
                tally.decided(index, decision, *cost);
            }
            assert_eq!(tally.decision(), model(&parts), "parts {parts:?}");
            checked += 1;
        }
    }
    assert_eq!(checked, 11_111);
}
