//! Property tests of `AllOf` against its sequential model: random traces of decisions over
//! three parts (a keyed token bucket, a keyed sliding log, a direct two-band composite of a
//! sliding counter and a token bucket), in every order, with random costs and clock steps.
//!
//! The model is the same three limiters decided one step at a time, all or nothing by
//! looking first: every part is peeked at its cost, and only if all would allow are they all
//! taken. `AllOf` takes the parts one by one and gives back what it took at the first
//! refusal; on one thread it must end every step exactly as the model does: the same
//! decision (allowed or not, `remaining`, `limit`, `retry_after`, `reset_after` and the part
//! that decided, by the rules `AllOf` documents) and every part left with the same permits,
//! checked with `available` after each step. A give-back that was not exact, or a refusal
//! that spent something, would show up as a part left differently.

use std::time::Duration;

use proptest::prelude::*;
use tollgate::all_of::Parts;
use tollgate::{AllOf, Decision, DirectLimiter, FakeClock, RateLimiter};

use crate::proptest_settle::config;

/// The three parts' limiters, on one clock.
struct Limiters {
    bucket: RateLimiter<u64, FakeClock>,
    log: RateLimiter<String, FakeClock>,
    composite: DirectLimiter<FakeClock>,
}

impl Limiters {
    fn new(clock: &FakeClock) -> Self {
        Limiters {
            bucket: RateLimiter::with_clock("5/1s".parse().unwrap(), clock.clone()),
            log: RateLimiter::with_clock("sliding-log 4/1s".parse().unwrap(), clock.clone()),
            composite: DirectLimiter::with_clock(
                "sliding-counter 6/2s & token-bucket 3/500ms"
                    .parse()
                    .unwrap(),
                clock.clone(),
            ),
        }
    }

    /// What part `part` has now.
    fn available(&self, part: usize) -> u64 {
        match part {
            0 => self.bucket.available(&1),
            1 => self.log.available("a"),
            _ => self.composite.available(),
        }
    }

    fn peek(&self, part: usize, cost: u64) -> Decision {
        match part {
            0 => self.bucket.peek_n(&1, cost),
            1 => self.log.peek_n("a", cost),
            _ => self.composite.peek_n(cost),
        }
        .unwrap()
    }

    fn take(&self, part: usize, cost: u64) -> Decision {
        match part {
            0 => self.bucket.try_acquire_n(&1, cost),
            1 => self.log.try_acquire_n("a", cost),
            _ => self.composite.try_acquire_n(cost),
        }
        .unwrap()
    }

    /// The `AllOf` of the parts in `order` with `costs` (by part), decided.
    fn all_of(&self, order: [usize; 3], costs: [u64; 3]) -> Decision {
        fn run<P: Parts>(all: AllOf<P>) -> Decision {
            all.try_acquire()
        }
        // One arm per order: each builds an AllOf of its own type.
        match order {
            [0, 1, 2] => run(AllOf::new()
                .key_n(&self.bucket, &1, costs[0])
                .key_n(&self.log, "a", costs[1])
                .direct_n(&self.composite, costs[2])),
            [0, 2, 1] => run(AllOf::new()
                .key_n(&self.bucket, &1, costs[0])
                .direct_n(&self.composite, costs[2])
                .key_n(&self.log, "a", costs[1])),
            [1, 0, 2] => run(AllOf::new()
                .key_n(&self.log, "a", costs[1])
                .key_n(&self.bucket, &1, costs[0])
                .direct_n(&self.composite, costs[2])),
            [1, 2, 0] => run(AllOf::new()
                .key_n(&self.log, "a", costs[1])
                .direct_n(&self.composite, costs[2])
                .key_n(&self.bucket, &1, costs[0])),
            [2, 0, 1] => run(AllOf::new()
                .direct_n(&self.composite, costs[2])
                .key_n(&self.bucket, &1, costs[0])
                .key_n(&self.log, "a", costs[1])),
            _ => run(AllOf::new()
                .direct_n(&self.composite, costs[2])
                .key_n(&self.log, "a", costs[1])
                .key_n(&self.bucket, &1, costs[0])),
        }
    }

    /// The model: peek every part in `order`, take them all if all would allow, and combine
    /// the decisions by `AllOf`'s rules.
    fn model(&self, order: [usize; 3], costs: [u64; 3]) -> Expected {
        let peeks: Vec<(usize, Decision)> = order
            .iter()
            .enumerate()
            .map(|(position, &part)| (position, self.peek(part, costs[part])))
            .collect();
        let least_available = order
            .iter()
            .zip(&peeks)
            .map(|(&part, (_, peek))| available_before(peek, costs[part]))
            .min()
            .unwrap();
        if let Some(&(position, refusal)) =
            peeks.iter().filter(|(_, peek)| !peek.is_allowed()).fold(
                None::<&(usize, Decision)>,
                |longest, candidate| match longest {
                    Some(longest) if longest.1.retry_after() >= candidate.1.retry_after() => {
                        Some(longest)
                    }
                    _ => Some(candidate),
                },
            )
        {
            return Expected {
                allowed: false,
                part: position,
                remaining: least_available.min(refusal.remaining()),
                limit: refusal.limit(),
                retry_after: refusal.retry_after(),
                reset_after: refusal.reset_after(),
            };
        }
        let taken: Vec<Decision> = order
            .iter()
            .map(|&part| self.take(part, costs[part]))
            .collect();
        assert!(
            taken.iter().all(Decision::is_allowed),
            "peeked allowed, then refused"
        );
        let (position, least) = taken
            .iter()
            .enumerate()
            .fold(
                None::<(usize, &Decision)>,
                |least, (position, decision)| match least {
                    Some(least) if least.1.remaining() <= decision.remaining() => Some(least),
                    _ => Some((position, decision)),
                },
            )
            .unwrap();
        Expected {
            allowed: true,
            part: position,
            remaining: least.remaining(),
            limit: least.limit(),
            retry_after: least.retry_after(),
            reset_after: least.reset_after(),
        }
    }
}

/// What a request of `cost` had available when `peek` was made of it.
fn available_before(peek: &Decision, cost: u64) -> u64 {
    if peek.is_allowed() {
        peek.remaining() + cost
    } else {
        peek.remaining()
    }
}

/// The fields of a decision the model predicts.
#[derive(Debug, PartialEq, Eq)]
struct Expected {
    allowed: bool,
    part: usize,
    remaining: u64,
    limit: u64,
    retry_after: Duration,
    reset_after: Duration,
}

impl From<Decision> for Expected {
    fn from(decision: Decision) -> Self {
        Expected {
            allowed: decision.is_allowed(),
            part: decision.part(),
            remaining: decision.remaining(),
            limit: decision.limit(),
            retry_after: decision.retry_after(),
            reset_after: decision.reset_after(),
        }
    }
}

/// One step: move the clock on, then decide the parts in `order` at `costs`.
#[derive(Clone, Copy, Debug)]
struct Step {
    advance_ms: u64,
    order: [usize; 3],
    costs: [u64; 3],
}

fn step() -> impl Strategy<Value = Step> {
    let orders = [
        [0, 1, 2],
        [0, 2, 1],
        [1, 0, 2],
        [1, 2, 0],
        [2, 0, 1],
        [2, 1, 0],
    ];
    (
        prop_oneof![3 => Just(0u64), 2 => 0u64..400],
        0..orders.len(),
        [1u64..=3, 1u64..=3, 1u64..=3],
    )
        .prop_map(move |(advance_ms, order, costs)| Step {
            advance_ms,
            order: orders[order],
            costs,
        })
}

proptest! {
    #![proptest_config(config(200))]

    #[test]
    fn all_of_decides_as_its_sequential_model(steps in prop::collection::vec(step(), 1..60)) {
        let clock = FakeClock::new();
        let (real, model) = (Limiters::new(&clock), Limiters::new(&clock));
        for (i, step) in steps.iter().enumerate() {
            clock.advance(Duration::from_millis(step.advance_ms));
            let expected = model.model(step.order, step.costs);
            let decided = Expected::from(real.all_of(step.order, step.costs));
            prop_assert_eq!(&decided, &expected, "step {}: {:?}", i, step);
            for part in 0..3 {
                prop_assert_eq!(
                    real.available(part),
                    model.available(part),
                    "step {}: part {} left differently", i, part
                );
            }
        }
    }
}
