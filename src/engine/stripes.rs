//! One key's token bucket spread over stripes, each on its own cache line, so that threads
//! deciding on one very hot key write different lines: the key's central TAT word hands out
//! *leases*, runs of consecutive GCRA slots taken in one compare-and-swap, and a decision
//! takes the next slot of its stripe's lease with one compare-and-swap on that stripe alone.
//!
//! **A slot** is the TAT an admission leaves behind: GCRA admits a request at `now` with the
//! slot ending at `max(tat, now) + T`, and only while that end is within `B` of `now`. A lease
//! of `c` slots moves the central TAT on by `c * T` at once, taking slots that are all
//! admissible at the instant it is taken. A slot of a lease is used at a later `now` only
//! while its end is at least `now + T` (it does not lie in the past: GCRA would not grant a
//! permit accounted before the request came) and at most `now + B` (true for every slot of a
//! lease taken at or before `now`). A slot time has passed is dropped, never spent.
//!
//! **Why that is exact.** The slots handed out are distinct and at least `T` apart (the
//! central word hands them out in order), and every admission at `t` holds one slot whose end
//! lies in `[t + T, t + B]`. So the admissions of any interval `[a, a + L]` hold slots ending
//! in `[a + T, a + L + B]`, at most `L / T + B / T` of them: GCRA's own bound, `L / T` plus
//! a burst of `permits`. With a frozen clock no slot is ever dropped, and a request is refused
//! only when the central word has no slot left and every stripe is empty with no lease being
//! stored: then every slot was used, and the key admitted exactly its `permits`.
//!
//! **Orderings.** A lease is claimed on its stripe (the stripe set to `REFILLING`) before the
//! central word is asked, and stored once it is taken. A request that finds the central word
//! empty and then every stripe empty must not miss a lease taken before its own look at the
//! central word: the central word is read-modify-written with `AcqRel` and the stripes'
//! claims and stores are `Release`, their reads `Acquire`, so a request whose central CAS
//! comes after a lease's sees that lease's claim (or its store, or the slots already used)
//! when it scans the stripes.

use crossbeam_utils::CachePadded;

use crate::engine::retry::Retry;
use crate::engine::sync::{AtomicU128, Ordering};
use crate::engine::token_bucket::{Gcra, GcraCell};

/// A stripe with no slot left.
const EMPTY: u128 = 0;
/// A stripe whose lease is being taken from the central word: a scan that meets it waits
/// for the lease rather than refuse.
const REFILLING: u128 = u128::MAX;

/// A stripe's word: the end of its lease's next slot in the high half, the slots left in
/// the low half.
fn pack(end: u64, left: u64) -> u128 {
    (u128::from(end) << 64) | u128::from(left)
}

fn unpack(word: u128) -> (u64, u64) {
    ((word >> 64) as u64, word as u64)
}

/// What a look at one stripe found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Took {
    /// A slot, ending here, now the caller's.
    Slot(u64),
    /// No slot usable now.
    Empty,
    /// A lease is being stored: look again.
    Refilling,
}

/// The stripes of one key.
#[derive(Debug)]
pub(crate) struct Stripes {
    words: Box<[CachePadded<AtomicU128>]>,
    /// Slots per lease (at most; fewer when the central word has fewer left).
    lease: u64,
}

impl Stripes {
    /// `count` empty stripes whose leases take up to `lease` slots each.
    pub(crate) fn new(count: usize, lease: u64) -> Self {
        Stripes {
            words: (0..count.max(1))
                .map(|_| CachePadded::new(AtomicU128::new(EMPTY)))
                .collect(),
            lease: lease.max(1),
        }
    }

    /// Decides a request of cost 1 at `now`, from the stripe `home` first: its lease's next
    /// usable slot, else a new lease from `central`, else a slot of another stripe. `Some`
    /// with the end of the slot admitted; `None` refused: the central word has no slot
    /// admissible now and every stripe is empty.
    pub(crate) fn acquire(
        &self,
        central: &GcraCell,
        gcra: &Gcra,
        now: u64,
        home: usize,
    ) -> Option<u64> {
        let home = home % self.words.len();
        let mut retry = Retry::new();
        loop {
            if let Took::Slot(end) = self.take(home, gcra, now) {
                return Some(end);
            }
            if let Some(end) = self.refill(home, central, gcra, now) {
                return Some(end);
            }
            let mut refilling = false;
            for offset in 1..self.words.len() {
                match self.take((home + offset) % self.words.len(), gcra, now) {
                    Took::Slot(end) => return Some(end),
                    Took::Refilling => refilling = true,
                    Took::Empty => {}
                }
            }
            if !refilling && self.is_settled(home) {
                return None;
            }
            // A lease is being stored, or the home stripe changed under us: look again.
            retry.snooze();
        }
    }

    /// Takes the first slot of stripe `i` usable at `now`, dropping the slots time has
    /// passed.
    fn take(&self, i: usize, gcra: &Gcra, now: u64) -> Took {
        let word = &self.words[i];
        // Acquire: pairs with the Release store of a lease, so its slots are the ones the
        // central word handed out.
        let mut current = word.load(Ordering::Acquire);
        let mut retry = Retry::new();
        loop {
            if current == REFILLING {
                return Took::Refilling;
            }
            let (end, left) = unpack(current);
            if left == 0 {
                return Took::Empty;
            }
            let interval = gcra.interval();
            // The first slot not in the past: its end at least `now + T`.
            let skip = now
                .saturating_add(interval)
                .saturating_sub(end)
                .div_ceil(interval);
            let (next, taken) = if skip < left {
                let slot = end + skip * interval;
                // A slot ahead of now by more than the burst (a clock read before the lease
                // was taken) is not admissible yet.
                if slot.saturating_sub(now) > gcra.burst() {
                    return Took::Empty;
                }
                let rest = left - skip - 1;
                let next = if rest == 0 {
                    EMPTY
                } else {
                    pack(slot + interval, rest)
                };
                (next, Some(slot))
            } else {
                (EMPTY, None)
            };
            // AcqRel: a success publishes the stripe's new word as a store of a lease does;
            // Acquire on failure: the value read is decided on next.
            match word.compare_exchange(current, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    return match taken {
                        Some(slot) => Took::Slot(slot),
                        None => Took::Empty,
                    }
                }
                Err(seen) => {
                    current = seen;
                    retry.spin();
                }
            }
        }
    }

    /// Claims the empty stripe `home`, takes a lease from `central` and keeps its first
    /// slot for the caller. `None` when the stripe was not empty (someone else refills it) or
    /// the central word had no slot admissible at `now`.
    fn refill(&self, home: usize, central: &GcraCell, gcra: &Gcra, now: u64) -> Option<u64> {
        let word = &self.words[home];
        // AcqRel: the claim must be visible to anyone whose central CAS follows ours (see the
        // module's orderings).
        word.compare_exchange(EMPTY, REFILLING, Ordering::AcqRel, Ordering::Acquire)
            .ok()?;
        let leased = central.lease(gcra, now, self.lease);
        let (stored, first) = match leased {
            Some((first, count)) if count > 1 => {
                (pack(first + gcra.interval(), count - 1), Some(first))
            }
            Some((first, _)) => (EMPTY, Some(first)),
            None => (EMPTY, None),
        };
        // Release: publishes the lease to the requests that take from it.
        word.store(stored, Ordering::Release);
        first
    }

    /// Whether the home stripe still holds nothing a request could take now: checked last
    /// before a refusal, so a lease stored there since the first look is not missed.
    fn is_settled(&self, home: usize) -> bool {
        // Acquire: as every read of a stripe.
        let (_, left) = unpack(self.words[home].load(Ordering::Acquire));
        left == 0
    }

    /// Slots the stripes hold now (a snapshot; slots time has passed included).
    pub(crate) fn held(&self) -> u64 {
        self.words
            .iter()
            // Acquire: as every read of a stripe.
            .map(|word| match word.load(Ordering::Acquire) {
                REFILLING => 0,
                current => unpack(current).1,
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Barrier};

    use super::*;
    use crate::engine::state::RateState;
    use crate::policy::Policy;

    fn parts(policy: &str) -> (GcraCell, Gcra) {
        let policy: Policy = policy.parse().unwrap();
        let gcra = GcraCell::params(&policy);
        (GcraCell::fresh(&gcra), gcra)
    }

    #[test]
    fn a_frozen_clock_admits_exactly_the_burst_over_every_stripe() {
        let (central, gcra) = parts("10/1s");
        let stripes = Stripes::new(4, 3);
        let admitted = (0..40)
            .filter(|i| stripes.acquire(&central, &gcra, 0, i % 4).is_some())
            .count();
        assert_eq!(admitted, 10);
        assert_eq!(stripes.held(), 0);
    }

    #[test]
    fn a_stripe_steals_before_it_refuses() {
        let (central, gcra) = parts("4/1s");
        let stripes = Stripes::new(2, 4);
        // Stripe 0 leases all four slots and uses one.
        assert!(stripes.acquire(&central, &gcra, 0, 0).is_some());
        assert_eq!(stripes.held(), 3);
        // Stripe 1 finds the central word empty and takes stripe 0's slots.
        for _ in 0..3 {
            assert!(stripes.acquire(&central, &gcra, 0, 1).is_some());
        }
        assert!(stripes.acquire(&central, &gcra, 0, 1).is_none());
        assert!(stripes.acquire(&central, &gcra, 0, 0).is_none());
    }

    #[test]
    fn a_slot_time_has_passed_is_dropped_not_spent() {
        let (central, gcra) = parts("4/4s"); // T = 1 s, B = 4 s
        let stripes = Stripes::new(1, 4);
        let end = stripes.acquire(&central, &gcra, 0, 0).unwrap();
        assert_eq!(end, 1_000_000_000);
        // Three slots left, ending at 2, 3 and 4 s. At 2.5 s the one ending at 2 s lies in
        // the past (and so does the one ending at 3 s: its end is not 1 s ahead); the slot
        // ending at 4 s is the first usable.
        let slot = stripes.acquire(&central, &gcra, 2_500_000_000, 0).unwrap();
        assert_eq!(slot, 4_000_000_000);
        assert_eq!(stripes.held(), 0);
    }

    #[test]
    fn sixteen_threads_on_a_frozen_clock_admit_exactly_the_burst() {
        for round in 0..200 {
            let (central, gcra) = parts("10/1s");
            let shared = Arc::new((central, gcra, Stripes::new(4, 3)));
            let start = Arc::new(Barrier::new(16));
            let admitted: usize = (0..16)
                .map(|thread| {
                    let (shared, start) = (Arc::clone(&shared), Arc::clone(&start));
                    std::thread::spawn(move || {
                        let (central, gcra, stripes) = &*shared;
                        start.wait();
                        (0..2)
                            .filter(|_| stripes.acquire(central, gcra, 0, thread).is_some())
                            .count()
                    })
                })
                .collect::<Vec<_>>()
                .into_iter()
                .map(|handle| handle.join().unwrap())
                .sum();
            assert_eq!(admitted, 10, "round {round}");
        }
    }

    proptest::proptest! {
        /// With a moving clock every admission holds a slot of its own that GCRA could have
        /// granted at that instant: ends distinct and at least `T` apart, each within
        /// `[t + T, t + B]` of its request, so no interval admits more than GCRA's bound.
        #[test]
        fn every_admission_holds_a_slot_gcra_could_grant(
            steps in proptest::collection::vec((0u64..4, 0u64..700_000_000), 1..300),
            stripes in 1usize..5,
            lease in 1u64..6,
        ) {
            let (central, gcra) = parts("5/1s"); // T = 200 ms, B = 1 s
            let striped = Stripes::new(stripes, lease);
            let (t, b) = (gcra.interval(), gcra.burst());
            let mut now = 0;
            let mut admitted: Vec<(u64, u64)> = Vec::new();
            for (home, advance) in steps {
                now += advance;
                if let Some(end) = striped.acquire(&central, &gcra, now, home as usize) {
                    proptest::prop_assert!(end >= now + t && end - now <= b, "slot {end} at {now}");
                    admitted.push((now, end));
                }
            }
            let mut ends: Vec<u64> = admitted.iter().map(|&(_, end)| end).collect();
            ends.sort_unstable();
            for pair in ends.windows(2) {
                proptest::prop_assert!(pair[1] - pair[0] >= t, "slots {pair:?} closer than T");
            }
            // GCRA's bound over every interval between two admissions: at most
            // L / T + B / T admissions in an interval of length L.
            for (i, &(from, _)) in admitted.iter().enumerate() {
                for (j, &(to, _)) in admitted.iter().enumerate().skip(i) {
                    let count = (j - i + 1) as u64;
                    proptest::prop_assert!(count <= (to - from) / t + b / t, "{count} in [{from}, {to}]");
                }
            }
        }
    }
}
