//! Memory, measured by a counting global allocator: bounded maps under floods of new keys,
//! automatic eviction, and policy reloads. One binary with one allocator; its tests run one
//! at a time, since each reads the process's heap figures.

use std::sync::{Mutex, MutexGuard};

#[global_allocator]
static ALLOC: count_alloc::CountingAlloc = count_alloc::CountingAlloc::new();

/// Held by every test of this binary for its whole run (see [`Serial`]).
fn one_at_a_time() -> Serial {
    static LOCK: Mutex<()> = Mutex::new(());
    // A test that failed while holding it leaves nothing to repair: the guarded data is `()`.
    Serial(
        LOCK.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    )
}

/// A test's turn. Taken first in each test, it is dropped last, after everything the test
/// made: it lets the epoch collector free what the test's own thread retired before the next
/// test starts. Retired memory belongs to the thread that retired it until that thread
/// frees it or exits, and a test's thread may still be exiting while the next test measures:
/// a limiter of a million keys freed then made another test's reading fall by megabytes.
struct Serial(#[allow(dead_code, reason = "held for its drop")] MutexGuard<'static, ()>);

impl Drop for Serial {
    fn drop(&mut self) {
        collect_retired();
    }
}

/// Lets the map's epoch collector free what this thread has retired so far: the epoch
/// advanced until live bytes stop falling. A test calls it before its first reading too.
fn collect_retired() {
    let mut live = ALLOC.live();
    let mut steady = 0;
    while steady < 5 {
        let seen = scc::Guard::new().epoch();
        for _ in 0..100_000 {
            if scc::Guard::new().epoch() != seen {
                break;
            }
        }
        let now = ALLOC.live();
        steady = if now < live { 0 } else { steady + 1 };
        live = now;
    }
}

/// A deterministic stream of distinct-looking keys (xorshift64), for floods of new keys.
struct Keys(u64);

impl Iterator for Keys {
    type Item = u64;
    fn next(&mut self) -> Option<u64> {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        Some(self.0)
    }
}

mod bounded;
mod bounded_guards;
mod pins;
mod reload_memory;
