//! The [`AllOf`](super::AllOf) protocol over a list of parts known only at run time (the
//! HTTP layer's rules, the failure policies of a `RedisAllOf`'s parts): [`take_in_order`].
//! The chain in `parts` is the same protocol over a list known at compile time.

use crate::decision::Decision;

use super::tally::Tally;

/// What the parts of a [`take_in_order`] decided.
pub(crate) struct InOrder<T> {
    /// The parts' decisions, combined.
    pub(crate) tally: Tally,
    /// Each part's own decision, in order.
    pub(crate) decisions: Vec<Decision>,
    /// What each part that spent holds, with its position: only when every part let the
    /// request through (a refusal gave everything back).
    #[cfg_attr(
        not(feature = "tower"),
        allow(dead_code, reason = "the HTTP layer settles what its rules hold")
    )]
    pub(crate) taken: Vec<(usize, T)>,
}

/// Decides `count` parts all or nothing: each part taken in order (`take(i)`: its decision,
/// its cost, and what holds its permits when it spent any), and at the first refusal the
/// parts taken given back at once, the last taken first (`give_back`), the parts after it
/// only looked at (`look(i)`). An error from `take` or `look` gives back what was taken, and
/// is returned with nothing held.
pub(crate) fn take_in_order<T, E>(
    count: usize,
    mut take: impl FnMut(usize) -> Result<(Decision, u64, Option<T>), E>,
    mut look: impl FnMut(usize) -> Result<(Decision, u64), E>,
    mut give_back: impl FnMut(usize, T),
) -> Result<InOrder<T>, E> {
    let mut tally = Tally::default();
    let mut decisions = Vec::with_capacity(count);
    let mut taken = Vec::new();
    let mut refused = false;
    for index in 0..count {
        let decided = if refused {
            look(index)
        } else {
            take(index).map(|(decision, cost, held)| {
                if let Some(held) = held {
                    taken.push((index, held));
                }
                (decision, cost)
            })
        };
        let (decision, cost) = match decided {
            Ok(decided) => decided,
            Err(error) => {
                give_back_all(&mut taken, &mut give_back);
                return Err(error);
            }
        };
        refused |= !decision.is_allowed();
        tally.decided(index, &decision, cost);
        decisions.push(decision);
    }
    if refused {
        give_back_all(&mut taken, &mut give_back);
    }
    Ok(InOrder {
        tally,
        decisions,
        taken,
    })
}

/// Gives back everything in `taken`, the last taken first.
fn give_back_all<T>(taken: &mut Vec<(usize, T)>, give_back: &mut impl FnMut(usize, T)) {
    while let Some((index, held)) = taken.pop() {
        give_back(index, held);
    }
}
