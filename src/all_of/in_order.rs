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
/// is returned with nothing held; so does a panic in either.
pub(crate) fn take_in_order<T, E>(
    count: usize,
    mut take: impl FnMut(usize) -> Result<(Decision, u64, Option<T>), E>,
    mut look: impl FnMut(usize) -> Result<(Decision, u64), E>,
    give_back: impl FnMut(usize, T),
) -> Result<InOrder<T>, E> {
    let mut tally = Tally::default();
    let mut decisions = Vec::with_capacity(count);
    // Given back when dropped: on a refusal, an error or a panic.
    let mut taken = Taken {
        taken: Vec::new(),
        give_back,
    };
    let mut refused = false;
    for index in 0..count {
        let (decision, cost) = if refused {
            look(index)?
        } else {
            let (decision, cost, held) = take(index)?;
            if let Some(held) = held {
                taken.taken.push((index, held));
            }
            (decision, cost)
        };
        refused |= !decision.is_allowed();
        tally.decided(index, &decision, cost);
        decisions.push(decision);
    }
    let taken = if refused {
        Vec::new()
    } else {
        std::mem::take(&mut taken.taken)
    };
    Ok(InOrder {
        tally,
        decisions,
        taken,
    })
}

/// What the parts took, with how to give it back: given back when dropped, the last taken
/// first, unless the request was admitted and took it.
struct Taken<T, G: FnMut(usize, T)> {
    taken: Vec<(usize, T)>,
    give_back: G,
}

impl<T, G: FnMut(usize, T)> Drop for Taken<T, G> {
    fn drop(&mut self) {
        while let Some((index, held)) = self.taken.pop() {
            (self.give_back)(index, held);
        }
    }
}
