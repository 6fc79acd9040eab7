//! `all_of`: one decision over three hot parts (a user's key, a key's budget of tokens at a
//! cost of 100, and a global direct limiter), beside the three decisions made one after
//! another, which spend without the all-or-nothing rule. The target: the `AllOf` costs at
//! most the three calls plus 10%.
//!
//! Contestants: `three_calls` (`try_acquire`, `try_acquire_n`, `try_acquire`) and `all_of`.

use std::hint::black_box;

use criterion::Criterion;
use tollgate::{AllOf, DirectLimiter, RateLimiter};

use crate::common::{self, FAST};

/// The budget of tokens: one token a nanosecond, 10^12 at once.
const TOKENS: &str = "token-bucket 1000000000000/1000s";

pub fn bench(c: &mut Criterion) {
    let mut g = common::group(c, "all_of");
    let users: RateLimiter<u64> = RateLimiter::new(common::policy(FAST));
    // A budget no run can exhaust at a cost of 100 (a burst of 10^12 tokens): every decision
    // in both contestants is an admission. A `FAST` budget, 10^9 a second, runs out within a
    // second at this cost, and the rest of the run would time refusals.
    let tokens: RateLimiter<u64> = RateLimiter::new(common::policy(TOKENS));
    let global = DirectLimiter::new(common::policy(FAST));
    let user = 7_u64;

    g.bench_function("three_calls", |b| {
        b.iter(|| {
            let user = black_box(&user);
            black_box(users.try_acquire(user).is_allowed())
                & black_box(
                    tokens
                        .try_acquire_n(user, 100)
                        .is_ok_and(|d| d.is_allowed()),
                )
                & black_box(global.try_acquire().is_allowed())
        })
    });

    g.bench_function("all_of", |b| {
        b.iter(|| {
            let user = black_box(&user);
            AllOf::new()
                .key(&users, user)
                .key_n(&tokens, user, 100)
                .direct(&global)
                .try_acquire()
                .is_allowed()
        })
    });
    g.finish();
}
