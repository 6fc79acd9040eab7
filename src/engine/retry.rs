//! A debug-build bound on the retries of the loops that wait for another thread.
//!
//! Every retry loop of the engine and of the direct limiter repeats only while another
//! thread is in the middle of something short: a writer between its compare-and-swap and its
//! publishing store, a writer that won the compare-and-swap this one lost, a policy change
//! between retiring the old state and publishing the new one. Each of those takes a few
//! stores, so a loop that retries [`Retries::LIMIT`] times in a row can only be waiting for a
//! state that never becomes readable or writable: a bug, such as a retired or "writing"
//! answer for a state that is neither. In a debug build [`Retries::again`] then panics at the
//! loop that went round, so the bug fails its test within about a second instead of hanging
//! it. In a release build [`Retries`] is empty and [`Retries::again`] compiles to nothing:
//! the hot path pays nothing for the check.

/// Counts one loop's consecutive retries (debug builds only; see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Retries {
    /// Retries so far.
    #[cfg(debug_assertions)]
    count: u32,
}

impl Retries {
    /// Consecutive retries after which a debug build panics (2^20): far above any legitimate
    /// wait. A loop waiting for a writer or a policy change to finish yields to the scheduler
    /// before each retry once its first few spins are over, so 2^20 retries gave the thread
    /// it waits for a million chances to run its few stores (about a second of yielding on a
    /// loaded two-core machine). A loop whose compare-and-swap failed retries because another
    /// writer succeeded; losing 2^20 times in a row, backing off a little longer after each loss
    /// up to 64 spin hints, is starvation far beyond anything contention on one key produces. A
    /// smaller bound would risk a spurious panic on an overloaded machine; a larger one makes
    /// every test that meets the bug take longer to fail.
    // Read only by the check, which a release build leaves out.
    #[cfg_attr(not(debug_assertions), allow(dead_code))]
    pub(crate) const LIMIT: u32 = 1 << 20;

    /// Notes one more retry of the caller's loop. Panics in a debug build, at the caller,
    /// once the loop has retried [`LIMIT`](Retries::LIMIT) times; does nothing in a release
    /// build.
    #[inline(always)]
    #[track_caller]
    pub(crate) fn again(&mut self) {
        #[cfg(debug_assertions)]
        {
            self.count += 1;
            assert!(
                self.count < Self::LIMIT,
                "retried {} times in a row: waiting for a state that never becomes ready",
                self.count
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_below_the_limit_are_allowed() {
        let mut retries = Retries::default();
        for _ in 1..Retries::LIMIT {
            retries.again();
        }
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "retried 1048576 times in a row")]
    fn the_retry_at_the_limit_panics_in_a_debug_build() {
        let mut retries = Retries::default();
        for _ in 0..Retries::LIMIT {
            retries.again();
        }
    }
}
