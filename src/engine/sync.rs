//! The atomics the per-key state machines use, from `std` / `portable-atomic` or from `loom`.
//!
//! Every state cell imports its atomics from here and nowhere else, so the loom models in
//! the loom models (`tests/loom_models/`) check the very code the limiters run. The
//! switch is the namespaced cfg `tollgate_loom` (`RUSTFLAGS="--cfg tollgate_loom"`): a bare
//! `loom` cfg would also change other crates in the build.
//!
//! | item | normal build | `cfg(tollgate_loom)` |
//! |---|---|---|
//! | `AtomicU64`, `Ordering`, `fence` | `std::sync::atomic` | `loom::sync::atomic` |
//! | `AtomicU128` | `portable_atomic::AtomicU128` (lock-free `cmpxchg16b` where the CPU has it) | a shim over `loom::sync::Mutex<u128>` |
//! | `Backoff` | `crossbeam_utils::Backoff` | a shim that yields to loom's scheduler |
//! | `Mutex` | `std::sync::Mutex` | `loom::sync::Mutex` |
//! | `Guard` (deferring the reuse of a slab's cell) | `scc::Guard` | a shim that runs a deferred closure once every guard present at the time is gone |

#[cfg(not(tollgate_loom))]
pub(crate) use std::sync::atomic::{fence, AtomicU64, Ordering};

#[cfg(not(tollgate_loom))]
pub(crate) use crossbeam_utils::Backoff;
#[cfg(not(tollgate_loom))]
pub(crate) use portable_atomic::AtomicU128;
#[cfg(not(tollgate_loom))]
pub(crate) use scc::Guard;
#[cfg(not(tollgate_loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

#[cfg(tollgate_loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicU64, Ordering};

#[cfg(tollgate_loom)]
pub(crate) use self::loom_shim::{AtomicU128, Backoff, Guard};
#[cfg(tollgate_loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};

#[cfg(tollgate_loom)]
mod loom_shim {
    //! Stand-ins for types loom does not provide.

    use super::Ordering;

    /// A 128-bit atomic for loom models, built on `loom::sync::Mutex<u128>`.
    ///
    /// loom has no 128-bit atomic. Behind a loom mutex every operation is one indivisible
    /// step that loom can interleave with the other threads' steps, so the models check the
    /// interleavings of the protocol built on the word (load, decide, compare-and-swap),
    /// with the atomicity of the 128-bit word itself taken as given (`portable-atomic`
    /// provides it). A mutex also orders more than a `Relaxed` atomic would; the counter
    /// publishes no other memory through its word, so no ordering is being checked there.
    #[derive(Debug)]
    pub(crate) struct AtomicU128 {
        value: loom::sync::Mutex<u128>,
    }

    impl AtomicU128 {
        /// A word holding `value`.
        pub(crate) fn new(value: u128) -> Self {
            AtomicU128 {
                value: loom::sync::Mutex::new(value),
            }
        }

        /// The current value.
        pub(crate) fn load(&self, _: Ordering) -> u128 {
            *self.value.lock().unwrap()
        }

        /// Stores `value`.
        pub(crate) fn store(&self, value: u128, _: Ordering) {
            *self.value.lock().unwrap() = value;
        }

        /// Stores `new` if the word holds `current`; returns the value it held.
        pub(crate) fn compare_exchange(
            &self,
            current: u128,
            new: u128,
            _: Ordering,
            _: Ordering,
        ) -> Result<u128, u128> {
            let mut value = self.value.lock().unwrap();
            if *value == current {
                *value = new;
                Ok(current)
            } else {
                Err(*value)
            }
        }
    }

    /// Backs off by yielding to loom's scheduler, so a spinning thread lets the thread it
    /// waits for run (loom would otherwise report the spin as a livelock).
    #[derive(Debug, Default)]
    pub(crate) struct Backoff;

    impl Backoff {
        /// A new backoff.
        pub(crate) fn new() -> Self {
            Backoff
        }

        /// Waits a little for another thread.
        pub(crate) fn snooze(&self) {
            loom::thread::yield_now();
        }

        /// Waits a little for another thread (a spin in the normal build).
        pub(crate) fn spin(&self) {
            loom::thread::yield_now();
        }
    }

    /// An epoch guard for loom models, standing in for `scc::Guard`, which loom cannot run.
    ///
    /// Only the slab takes its guards from here: the keyed table's readers keep scc's guard
    /// in every build, so a loom model may drive the slab (`model::ModelSlab`) but not the
    /// table or a limiter.
    ///
    /// It keeps the one promise the slab relies on, and no more: a closure deferred while
    /// some guards exist runs once each of those guards is gone (guards created later do not
    /// hold it back), on the thread that drops the last of them. The bookkeeping sits behind
    /// a loom mutex, so loom interleaves creating, dropping and deferring with every other
    /// step of the model.
    pub(crate) struct Guard {
        ticket: u64,
    }

    /// Deferred work waiting for the guards of its time.
    type Deferred = (Vec<u64>, Box<dyn FnOnce() + Send>);

    #[derive(Default)]
    struct Epochs {
        next: u64,
        active: Vec<u64>,
        deferred: Vec<Deferred>,
    }

    loom::lazy_static! {
        // One per model execution: loom resets its lazy statics between executions.
        static ref EPOCHS: loom::sync::Mutex<Epochs> = loom::sync::Mutex::new(Epochs::default());
    }

    impl Guard {
        /// A guard: what a reader holds while it may hold a cell it found.
        pub(crate) fn new() -> Self {
            let mut epochs = EPOCHS.lock().unwrap();
            let ticket = epochs.next;
            epochs.next += 1;
            epochs.active.push(ticket);
            Guard { ticket }
        }

        /// Asks for deferred work to run soon: nothing to ask here, it runs as soon as it may.
        pub(crate) fn accelerate(&self) {}

        /// Runs `work` once every guard present now is gone.
        pub(crate) fn defer_execute(&self, work: impl FnOnce() + Send + 'static) {
            let mut epochs = EPOCHS.lock().unwrap();
            let waits_for = epochs.active.clone();
            epochs.deferred.push((waits_for, Box::new(work)));
        }
    }

    impl Drop for Guard {
        fn drop(&mut self) {
            let ready: Vec<Deferred> = {
                let mut epochs = EPOCHS.lock().unwrap();
                let ticket = self.ticket;
                epochs.active.retain(|&t| t != ticket);
                let Epochs {
                    active, deferred, ..
                } = &mut *epochs;
                let (ready, waiting) = std::mem::take(deferred)
                    .into_iter()
                    .partition(|(waits_for, _)| waits_for.iter().all(|t| !active.contains(t)));
                *deferred = waiting;
                ready
            };
            for (_, work) in ready {
                work();
            }
        }
    }
}
