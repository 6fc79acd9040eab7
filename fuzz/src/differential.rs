//! The `differential` target: an arbitrary policy and an arbitrary sequence of operations
//! (move the clock forward or back, acquire for one of a few keys at some cost, evict) run
//! through the crate's keyed `RateLimiter` and `DirectLimiter` and through one reference
//! model per key (`tests/models/mod.rs`, the property tests' models). Every decision must
//! match the model exactly: allowed, remaining, retry_after and reset_after to the
//! nanosecond, and the limit.
//!
//! Also checked on every step:
//!
//! * a cost of 0 or above the permits is refused with the typed error and creates nothing;
//! * `evict_idle` removes exactly the keys whose model is at rest (the count, then `len`),
//!   and a removed key's next decision equals a fresh model's (its model is replaced by a
//!   fresh one, and the next decision is compared against that);
//! * the direct limiter, which sees key 0's requests but is never evicted, decides exactly
//!   as the keyed limiter does for key 0, and its `is_at_rest` agrees with its model.
//!
//! Inputs are decoded with `arbitrary`; [`Input::to_bytes`] is the inverse, used to write
//! the seed corpus ([`seeds`]).

use std::fmt::Debug;
use std::time::Duration;

use arbitrary::Arbitrary;
use tollgate::{Algorithm, Clock, CostError, DirectLimiter, FakeClock, Policy, RateLimiter};

use crate::models::{CounterModel, GcraModel, LogModel, Model, Outcome};

/// How many distinct keys the keyed limiter sees.
pub const KEYS: u8 = 4;

/// One fuzz input: a policy, then the operations.
#[derive(Arbitrary, Clone, Debug, PartialEq, Eq)]
pub struct Input {
    /// The policy, decoded by [`Setup::policy`].
    pub setup: Setup,
    /// The operations, in order.
    pub ops: Vec<Op>,
}

/// The policy's parameters, as fuzz bytes.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setup {
    /// The algorithm.
    pub algorithm: Algo,
    /// Permits: `1 + permits % 8`.
    pub permits: u8,
    /// Which range the window is drawn from.
    pub scale: Scale,
    /// The window within its range (see [`Scale`]).
    pub window: u32,
}

/// [`Algorithm`], decodable.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algo {
    /// [`Algorithm::TokenBucket`].
    TokenBucket,
    /// [`Algorithm::SlidingLog`].
    SlidingLog,
    /// [`Algorithm::SlidingCounter`].
    SlidingCounter,
}

/// The window's range, in nanoseconds.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// `1 + window % 16`: a few nanoseconds, so that every step crosses windows, refills
    /// and expiries; below the permits, the policy is invalid and the input is skipped.
    Tiny,
    /// `17 + window % 1_984`.
    Short,
    /// `1 ms + window % 3 s`.
    Long,
}

/// One operation.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Move the clock forward by `n % (2W + 1)` ns.
    Advance(u32),
    /// Move the clock forward by a boundary amount.
    Tick(Tick),
    /// Set the clock back by `n % (2W + 1)` ns (not below zero): a faulty clock.
    Back(u32),
    /// Ask for `cost % (permits + 2)` permits (0 and permits + 1 are invalid costs) for key
    /// `key % KEYS`.
    Acquire {
        /// The key, modulo [`KEYS`].
        key: u8,
        /// The cost, modulo permits + 2.
        cost: u8,
    },
    /// Run `evict_idle`.
    Evict,
}

/// Boundary amounts of time.
#[derive(Arbitrary, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tick {
    /// 1 ns.
    One,
    /// W - 1 ns.
    WindowLessOne,
    /// W.
    Window,
}

impl Setup {
    /// (algorithm, permits, window in ns) as the input selects them.
    pub fn resolve(self) -> (Algorithm, u64, u64) {
        let algorithm = match self.algorithm {
            Algo::TokenBucket => Algorithm::TokenBucket,
            Algo::SlidingLog => Algorithm::SlidingLog,
            Algo::SlidingCounter => Algorithm::SlidingCounter,
        };
        let permits = 1 + u64::from(self.permits % 8);
        let w = u64::from(self.window);
        let window = match self.scale {
            Scale::Tiny => 1 + w % 16,
            Scale::Short => 17 + w % 1_984,
            Scale::Long => 1_000_000 + w % 3_000_000_000,
        };
        (algorithm, permits, window)
    }
}

/// Runs one input; panics on the first disagreement, naming the step.
pub fn run(input: &Input) {
    let (algorithm, permits, window) = input.setup.resolve();
    let policy = match Policy::new(algorithm, permits, Duration::from_nanos(window)) {
        Ok(policy) => policy,
        Err(e) => {
            // The only invalid choice in range: less than one nanosecond per permit.
            assert!(window < permits, "{permits}/{window}ns refused: {e}");
            return;
        }
    };
    match algorithm {
        Algorithm::TokenBucket => drive::<GcraModel>(policy, permits, window, &input.ops),
        Algorithm::SlidingLog => drive::<LogModel>(policy, permits, window, &input.ops),
        Algorithm::SlidingCounter => drive::<CounterModel>(policy, permits, window, &input.ops),
    }
}

fn drive<M: Model + Debug>(policy: Policy, permits: u64, window: u64, ops: &[Op]) {
    let clock = FakeClock::new();
    let keyed: RateLimiter<u8, FakeClock> = RateLimiter::with_clock(policy, clock.clone());
    let direct = DirectLimiter::with_clock(policy, clock.clone());
    // `None`: the key is not tracked (never seen, or evicted).
    let mut models: [Option<M>; KEYS as usize] = std::array::from_fn(|_| None);
    let mut direct_model = M::new(permits, window);
    let span = 2 * window + 1;

    for (step, &op) in ops.iter().enumerate() {
        match op {
            Op::Advance(n) => clock.advance(Duration::from_nanos(u64::from(n) % span)),
            Op::Tick(tick) => clock.advance(Duration::from_nanos(match tick {
                Tick::One => 1,
                Tick::WindowLessOne => window - 1,
                Tick::Window => window,
            })),
            Op::Back(n) => {
                let to = clock.now().saturating_sub(u64::from(n) % span);
                clock.set(Duration::from_nanos(to));
            }
            Op::Acquire { key, cost } => {
                let key = key % KEYS;
                let cost = u64::from(cost) % (permits + 2);
                let now = clock.now();
                let got = keyed.try_acquire_n(&key, cost);
                let got_direct = (key == 0).then(|| direct.try_acquire_n(cost));
                if cost == 0 || cost > permits {
                    let expected = if cost == 0 {
                        CostError::Zero
                    } else {
                        CostError::ExceedsLimit {
                            cost,
                            limit: permits,
                        }
                    };
                    assert_eq!(got, Err(expected.clone()), "step {step}: {op:?}");
                    if let Some(got_direct) = got_direct {
                        assert_eq!(got_direct, Err(expected), "step {step}: {op:?}");
                    }
                } else {
                    let got = Outcome::from(got.unwrap());
                    let model =
                        models[usize::from(key)].get_or_insert_with(|| M::new(permits, window));
                    let before = format!("{model:?}");
                    let expected = model.acquire(now, cost);
                    assert_eq!(
                        got, expected,
                        "keyed, step {step} at {now} ns: {op:?} (key {key}, cost {cost}); model before: {before}"
                    );
                    if let Some(got_direct) = got_direct {
                        let got_direct = Outcome::from(got_direct.unwrap());
                        assert_eq!(
                            got_direct, got,
                            "direct and keyed disagree for key 0, step {step} at {now} ns: {op:?}"
                        );
                        assert_eq!(
                            got_direct,
                            direct_model.acquire(now, cost),
                            "direct, step {step} at {now} ns: {op:?}"
                        );
                    }
                }
            }
            Op::Evict => {
                let now = clock.now();
                let mut expected = 0;
                for model in &mut models {
                    if model.as_ref().is_some_and(|m| m.is_at_rest(now)) {
                        *model = None;
                        expected += 1;
                    }
                }
                assert_eq!(
                    keyed.evict_idle(),
                    expected,
                    "step {step} at {now} ns: evicted"
                );
            }
        }
        let tracked = models.iter().filter(|m| m.is_some()).count();
        assert_eq!(keyed.len(), tracked, "step {step}: keys tracked");
        let now = clock.now();
        assert_eq!(
            direct.is_at_rest(),
            direct_model.is_at_rest(now),
            "step {step} at {now} ns: direct at rest; model: {direct_model:?}"
        );
    }
}

impl Input {
    /// The bytes that `arbitrary` decodes (as `fuzz_target!` does, with
    /// `arbitrary_take_rest`) into exactly this input: integers little-endian, an enum
    /// variant as a `u32` scaled onto the variant count, each element of the trailing
    /// `ops` preceded by a "one more" byte.
    pub fn to_bytes(&self) -> Vec<u8> {
        fn variant(out: &mut Vec<u8>, index: u64, count: u64) {
            // derive(Arbitrary) picks variant (u32 * count) >> 32: the least u32 mapping to
            // `index` is ceil(index * 2^32 / count).
            let x = (index << 32).div_ceil(count);
            out.extend_from_slice(&u32::try_from(x).unwrap().to_le_bytes());
        }
        let mut out = Vec::new();
        let s = self.setup;
        variant(&mut out, s.algorithm as u64, 3);
        out.push(s.permits);
        variant(&mut out, s.scale as u64, 3);
        out.extend_from_slice(&s.window.to_le_bytes());
        for op in &self.ops {
            out.push(1);
            match *op {
                Op::Advance(n) => {
                    variant(&mut out, 0, 5);
                    out.extend_from_slice(&n.to_le_bytes());
                }
                Op::Tick(tick) => {
                    variant(&mut out, 1, 5);
                    variant(&mut out, tick as u64, 3);
                }
                Op::Back(n) => {
                    variant(&mut out, 2, 5);
                    out.extend_from_slice(&n.to_le_bytes());
                }
                Op::Acquire { key, cost } => {
                    variant(&mut out, 3, 5);
                    out.extend([key, cost]);
                }
                Op::Evict => variant(&mut out, 4, 5),
            }
        }
        out
    }

    /// Decodes `data` as the fuzz target does.
    pub fn from_bytes(data: &[u8]) -> arbitrary::Result<Input> {
        Input::arbitrary_take_rest(arbitrary::Unstructured::new(data))
    }
}

/// The seed corpus: named inputs written to `corpus/differential/` (see the test
/// `seed_corpus_is_written` for how to regenerate it).
pub fn seeds() -> Vec<(&'static str, Input)> {
    const MS: u32 = 1_000_000;
    // Long scale: window = 1 ms + w, so w = W - 1 ms.
    let long = |algorithm, permits: u8, window_ms: u32| Setup {
        algorithm,
        permits: permits - 1,
        scale: Scale::Long,
        window: window_ms * MS - MS,
    };
    let tiny = |algorithm, permits: u8, window: u32| Setup {
        algorithm,
        permits: permits - 1,
        scale: Scale::Tiny,
        window: window - 1,
    };
    let acquire = |key, cost| Op::Acquire { key, cost };
    let at = |ms: u32| Op::Advance(ms * MS);

    let mut seeds = Vec::new();

    // DESIGN.md section 6, token bucket 5 per second; alice is key 0, bob key 1.
    let mut ops = vec![acquire(0, 1); 6];
    ops.extend([
        at(100),
        acquire(0, 1),
        at(200),
        acquire(0, 1),
        acquire(0, 1),
    ]);
    ops.extend([
        acquire(1, 1),
        at(1000),
        acquire(0, 1),
        Op::Evict,
        at(200),
        Op::Evict,
    ]);
    seeds.push((
        "trace-token-bucket",
        Input {
            setup: long(Algo::TokenBucket, 5, 1000),
            ops,
        },
    ));

    // Sliding log, 3 per second.
    let ops = vec![
        acquire(0, 1),
        at(400),
        acquire(0, 1),
        at(400),
        acquire(0, 1),
        at(100),
        acquire(0, 1),
        at(100),
        acquire(0, 1),
        at(50),
        acquire(0, 1),
        Op::Evict,
        at(1400),
        Op::Evict,
    ];
    seeds.push((
        "trace-sliding-log",
        Input {
            setup: long(Algo::SlidingLog, 3, 1000),
            ops,
        },
    ));

    // The sliding counter trace (10 per minute) scaled to 8 per 3 s: 6 at 2.5 s, then at
    // 3.45 s requests until refused, then after the retry.
    let mut ops = vec![at(2500)];
    ops.extend(vec![acquire(0, 1); 6]);
    ops.push(at(950));
    ops.extend(vec![acquire(0, 1); 6]);
    ops.extend([at(300), acquire(0, 1), acquire(0, 2), Op::Evict]);
    seeds.push((
        "trace-sliding-counter",
        Input {
            setup: long(Algo::SlidingCounter, 8, 3000),
            ops,
        },
    ));

    // Every algorithm on a few-nanosecond window: all keys, all costs (including the two
    // invalid ones), ticks across boundaries, a clock set back, and evictions.
    for (name, algorithm) in [
        ("tiny-token-bucket", Algo::TokenBucket),
        ("tiny-sliding-log", Algo::SlidingLog),
        ("tiny-sliding-counter", Algo::SlidingCounter),
    ] {
        let mut ops = Vec::new();
        for key in 0..KEYS {
            for cost in 0..=5 {
                ops.push(acquire(key, cost));
            }
            ops.push(Op::Tick(Tick::One));
        }
        ops.extend([Op::Evict, Op::Tick(Tick::WindowLessOne), Op::Evict]);
        ops.extend([
            acquire(0, 4),
            acquire(1, 2),
            Op::Back(3),
            acquire(0, 1),
            acquire(1, 4),
        ]);
        ops.extend([
            Op::Tick(Tick::Window),
            Op::Evict,
            acquire(2, 1),
            Op::Tick(Tick::Window),
        ]);
        ops.extend([
            Op::Tick(Tick::Window),
            Op::Evict,
            acquire(0, 4),
            Op::Advance(5),
        ]);
        ops.extend([acquire(0, 4), Op::Evict]);
        seeds.push((
            name,
            Input {
                setup: tiny(algorithm, 4, 12),
                ops,
            },
        ));
    }

    // A clock that jumps back by most of a window after a burst, then forward again.
    for (name, algorithm) in [
        ("backwards-token-bucket", Algo::TokenBucket),
        ("backwards-sliding-log", Algo::SlidingLog),
        ("backwards-sliding-counter", Algo::SlidingCounter),
    ] {
        let ops = vec![
            at(700),
            acquire(0, 2),
            acquire(1, 1),
            at(500),
            acquire(0, 1),
            Op::Back(900 * MS),
            acquire(0, 1),
            acquire(1, 1),
            Op::Evict,
            acquire(0, 1),
            at(1200),
            acquire(0, 1),
            Op::Evict,
            at(2000),
            Op::Evict,
            acquire(1, 3),
        ];
        seeds.push((
            name,
            Input {
                setup: long(algorithm, 3, 1000),
                ops,
            },
        ));
    }

    // A policy with less than a nanosecond per permit: refused, skipped.
    seeds.push((
        "invalid-policy",
        Input {
            setup: tiny(Algo::SlidingLog, 8, 3),
            ops: vec![acquire(0, 1)],
        },
    ));
    seeds
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::Path;

    use super::*;

    /// The seeds decode back to themselves and run clean; the files in
    /// `corpus/differential/` are exactly their bytes. `TOLLGATE_WRITE_SEEDS=1` rewrites
    /// the files first.
    #[test]
    fn seed_corpus_is_written() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/differential");
        let write = std::env::var_os("TOLLGATE_WRITE_SEEDS").is_some();
        for (name, input) in seeds() {
            let bytes = input.to_bytes();
            assert_eq!(Input::from_bytes(&bytes).unwrap(), input, "{name}");
            run(&input);
            let path = dir.join(format!("seed-{name}"));
            if write {
                fs::create_dir_all(&dir).unwrap();
                fs::write(&path, &bytes).unwrap();
            }
            let on_disk = fs::read(&path).unwrap_or_else(|e| {
                panic!("{}: {e} (TOLLGATE_WRITE_SEEDS=1 writes it)", path.display())
            });
            assert_eq!(on_disk, bytes, "{} is stale", path.display());
        }
    }

    /// Every committed corpus file, seeds and reproducers alike, runs clean.
    #[test]
    fn differential_corpus_replays_clean() {
        let files = crate::tests::corpus("differential");
        assert!(!files.is_empty());
        for (path, data) in files {
            eprintln!("{}", path.display());
            if let Ok(input) = Input::from_bytes(&data) {
                run(&input);
            }
        }
    }
}
