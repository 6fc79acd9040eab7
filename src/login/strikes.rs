//! The lockout escalation: [`Escalation`], pure arithmetic on one account's [`Streak`], and
//! [`StrikeCell`], the atomic word that holds a streak and its compare-and-swap loop.

use crate::engine::retry::Retry;
use crate::engine::sync::{AtomicU128, Ordering};

/// The lockout escalation as pure arithmetic on a [`Streak`] and `now`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Escalation {
    /// W: the strike window, ns.
    window: u64,
    /// Strikes in a streak that start the first lockout (>= 1 once validated).
    threshold: u32,
    /// The first lockout, ns.
    first: u64,
    /// The longest lockout, ns.
    cap: u64,
}

/// One account's strike record, unpacked. `Streak::default()` is "no record".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Streak {
    /// Strikes in the current streak (saturating); 0 for none.
    strikes: u32,
    /// ns on the guard's clock: the end of the window the latest strike was counted in,
    /// or, for a strike that locked the account out, the end of the lockout.
    until: u64,
}

impl Streak {
    /// Strikes in the current streak (0 for none).
    pub(crate) const fn strikes(self) -> u32 {
        self.strikes
    }

    const fn pack(self) -> u128 {
        (self.until as u128) | ((self.strikes as u128) << 64)
    }

    const fn unpack(word: u128) -> Self {
        Streak {
            // Truncations intended: the fields' bits (see `StrikeCell`).
            until: word as u64,
            strikes: (word >> 64) as u32,
        }
    }
}

impl Escalation {
    /// The escalation of a strike window `window`, locking at `threshold` strikes for
    /// `first`, doubling up to `cap` (all ns).
    pub(crate) const fn new(window: u64, threshold: u32, first: u64, cap: u64) -> Self {
        Escalation {
            window,
            threshold,
            first,
            cap,
        }
    }

    /// The lockout the `strikes`-th strike of a streak starts, ns: `None` below the
    /// threshold, then `first * 2^(strikes - threshold)`, capped.
    pub(crate) fn lockout(&self, strikes: u32) -> Option<u64> {
        let doublings = strikes.checked_sub(self.threshold)?;
        let grown = match 1u64.checked_shl(doublings) {
            Some(factor) => self.first.saturating_mul(factor),
            None => u64::MAX,
        };
        Some(grown.min(self.cap))
    }

    /// A stored `until` further ahead of `now` than any valid record could be (the clock
    /// went backwards) is treated as the furthest valid one: `now + max(W, cap)`. So a
    /// faulty clock never stretches a lockout beyond the cap.
    fn clamp(&self, streak: Streak, now: u64) -> Streak {
        Streak {
            until: streak
                .until
                .min(now.saturating_add(self.window.max(self.cap))),
            ..streak
        }
    }

    /// The record after the account struck at `now`.
    pub(crate) fn strike(&self, streak: Streak, now: u64) -> Streak {
        let streak = self.clamp(streak, now);
        if streak.strikes > 0 && now < streak.until {
            // Already counted in this window, or locked out: nothing more.
            return streak;
        }
        let continues = streak.strikes > 0 && now < streak.until.saturating_add(self.window);
        let strikes = if continues {
            streak.strikes.saturating_add(1)
        } else {
            1
        };
        let until = match self.lockout(strikes) {
            Some(lockout) => now.saturating_add(lockout),
            // The next window starts where the counted one ended (anchored, so a streak's
            // windows do not drift later with each strike).
            None if continues => streak.until.saturating_add(self.window),
            None => now.saturating_add(self.window),
        };
        Streak { strikes, until }
    }

    /// ns until the lockout ends, if the record locks the account out at `now`.
    pub(crate) fn locked_for(&self, streak: Streak, now: u64) -> Option<u64> {
        let streak = self.clamp(streak, now);
        (streak.strikes >= self.threshold && now < streak.until).then(|| streak.until - now)
    }

    /// The streak at `now`: 0 once it can no longer continue.
    pub(crate) fn streak(&self, streak: Streak, now: u64) -> u32 {
        if self.is_at_rest(streak, now) {
            0
        } else {
            streak.strikes
        }
    }

    /// `true` when the record decides exactly as no record from `now` on: not locked out,
    /// and a strike now would start a new streak.
    pub(crate) fn is_at_rest(&self, streak: Streak, now: u64) -> bool {
        let streak = self.clamp(streak, now);
        streak.strikes == 0 || now >= streak.until.saturating_add(self.window)
    }
}

/// One account's strike record in a single atomic word, updated by compare-and-swap.
///
/// | bits | field |
/// |---|---|
/// | 0..64 | `until`: ns on the guard's clock; the end of the window the latest strike was counted in, or of the lockout it started |
/// | 64..96 | `strikes`: strikes in the current streak (`u32`, saturating) |
/// | 96..128 | zero |
///
/// All zeros is a record with no strike, what a new account starts from. 128 bits because
/// `until` is a full clock reading: no room is left in 64 bits for the count without
/// losing precision or range. (`portable_atomic::AtomicU128`: a lock-free `cmpxchg16b` on
/// x86-64; this is not a hot path.)
///
/// Orderings: the word is the whole record and publishes no other memory, so every access
/// is `Relaxed`; a strike is a CAS from the exact snapshot it was computed from, so two
/// racing strikes are both applied, in one order (and the second, in the same window,
/// then adds nothing). The map's bucket lock keeps eviction out while a strike runs.
#[derive(Debug)]
pub(crate) struct StrikeCell {
    word: AtomicU128,
}

impl StrikeCell {
    pub(crate) fn fresh() -> Self {
        StrikeCell {
            word: AtomicU128::new(0),
        }
    }

    /// Forgets the streak (an administrator's unlock).
    pub(crate) fn clear(&self) {
        // Relaxed: see the type's docs; a strike racing the clear lands either before it
        // (and is forgotten) or after it (and counts).
        self.word.store(0, Ordering::Relaxed);
    }

    /// The record now.
    pub(crate) fn load(&self) -> Streak {
        // Relaxed: see the type's docs.
        Streak::unpack(self.word.load(Ordering::Relaxed))
    }

    /// Applies a strike at `now`; returns the record after it.
    pub(crate) fn strike(&self, escalation: &Escalation, now: u64) -> Streak {
        // Relaxed: see the type's docs; a stale read only makes the CAS fail and retry.
        let mut current = self.word.load(Ordering::Relaxed);
        let mut retry = Retry::new();
        loop {
            let next = escalation.strike(Streak::unpack(current), now).pack();
            if next == current {
                return Streak::unpack(current);
            }
            match self
                .word
                .compare_exchange(current, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Streak::unpack(next),
                Err(_) => {
                    // Another strike came first: back off, then read the record afresh and
                    // strike on top of it. Relaxed: as the first read.
                    retry.spin();
                    current = self.word.load(Ordering::Relaxed);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::login::LoginConfig;

    const MIN: u64 = 60_000_000_000;

    fn defaults() -> Escalation {
        LoginConfig::default().escalation()
    }

    /// Strikes at each time (minutes); returns the records after each.
    fn run(e: &Escalation, minutes: &[u64]) -> Vec<Streak> {
        let mut streak = Streak::default();
        minutes
            .iter()
            .map(|&m| {
                streak = e.strike(streak, m * MIN);
                streak
            })
            .collect()
    }

    #[test]
    fn schedule_doubles_from_the_threshold_and_caps() {
        let e = defaults();
        let got: Vec<Option<u64>> = (1..=11).map(|s| e.lockout(s).map(|n| n / MIN)).collect();
        let want = [
            None,
            None,
            Some(15),
            Some(30),
            Some(60),
            Some(120),
            Some(240),
            Some(480),
            Some(960),
            Some(1440),
            Some(1440),
        ];
        assert_eq!(got, want);
        assert_eq!(e.lockout(u32::MAX), Some(1440 * MIN));
    }

    #[test]
    fn one_strike_per_window_and_windows_are_anchored() {
        let e = defaults();
        // 0: window [0, 15). 5, 14: same window. 20: window 2 [15, 30) -> 2 strikes, until 30.
        let r = run(&e, &[0, 5, 14, 20]);
        assert_eq!(
            r[0],
            Streak {
                strikes: 1,
                until: 15 * MIN
            }
        );
        assert_eq!(r[1], r[0]);
        assert_eq!(r[2], r[0]);
        assert_eq!(
            r[3],
            Streak {
                strikes: 2,
                until: 30 * MIN
            }
        );
        // 44: window 3 [30, 45) -> third strike: 15 min lockout from 44.
        let s = e.strike(r[3], 44 * MIN);
        assert_eq!(
            s,
            Streak {
                strikes: 3,
                until: 59 * MIN
            }
        );
        assert_eq!(e.locked_for(s, 44 * MIN), Some(15 * MIN));
        assert_eq!(e.locked_for(s, 59 * MIN), None);
    }

    #[test]
    fn a_window_without_a_strike_ends_the_streak() {
        let e = defaults();
        // Strike at 0 (window [0, 15)); window 2 is [15, 30); a strike at 30 starts over.
        let r = run(&e, &[0, 30]);
        assert_eq!(
            r[1],
            Streak {
                strikes: 1,
                until: 45 * MIN
            }
        );
        // Just inside window 2 continues it.
        let r = run(&e, &[0, 29]);
        assert_eq!(r[1].strikes, 2);
    }

    #[test]
    fn after_a_lockout_the_next_window_starts_when_it_ends() {
        let e = defaults();
        let r = run(&e, &[0, 15, 30]); // locked 30..45
        assert_eq!(
            r[2],
            Streak {
                strikes: 3,
                until: 45 * MIN
            }
        );
        assert_eq!(e.strike(r[2], 40 * MIN), r[2], "no strike while locked out");
        // Window after the lockout: [45, 60). A strike at 59 -> 30 min lockout.
        let s = e.strike(r[2], 59 * MIN);
        assert_eq!(
            s,
            Streak {
                strikes: 4,
                until: 89 * MIN
            }
        );
        // A strike only after [89, 104) has passed starts over.
        assert!(e.is_at_rest(s, 104 * MIN));
        assert!(!e.is_at_rest(s, 104 * MIN - 1));
        assert_eq!(
            e.strike(s, 104 * MIN),
            Streak {
                strikes: 1,
                until: 119 * MIN
            }
        );
    }

    #[test]
    fn threshold_of_one_locks_at_the_first_strike() {
        let config = LoginConfig::default().with_strikes_to_lock(1);
        let e = config.escalation();
        let s = e.strike(Streak::default(), 0);
        assert_eq!(
            s,
            Streak {
                strikes: 1,
                until: 15 * MIN
            }
        );
        assert_eq!(e.locked_for(s, 0), Some(15 * MIN));
    }

    #[test]
    fn backwards_clock_never_locks_beyond_the_cap() {
        let e = defaults();
        let far = Streak {
            strikes: 3,
            until: u64::MAX - 1,
        };
        assert_eq!(e.locked_for(far, 0), Some(1440 * MIN));
        let s = e.strike(far, 0);
        assert!(s.until <= 1440 * MIN);
    }

    #[test]
    fn packing_round_trips() {
        let s = Streak {
            strikes: u32::MAX,
            until: u64::MAX,
        };
        assert_eq!(Streak::unpack(s.pack()), s);
        assert_eq!(Streak::unpack(0), Streak::default());
        assert_eq!(Streak::unpack(0).pack(), 0);
    }

    #[test]
    fn cell_applies_strikes_once_per_window() {
        let e = defaults();
        let cell = StrikeCell::fresh();
        assert_eq!(cell.strike(&e, 0).strikes, 1);
        assert_eq!(cell.strike(&e, MIN).strikes, 1);
        assert_eq!(cell.strike(&e, 16 * MIN).strikes, 2);
        assert_eq!(
            cell.load(),
            Streak {
                strikes: 2,
                until: 30 * MIN
            }
        );
    }
}
