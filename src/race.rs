//! Threads started together, for the unit tests of racing requests.

use std::sync::{Arc, Barrier};

/// `threads` threads started together, each running `work`; the sum of what they return.
pub(crate) fn race(threads: usize, work: impl Fn() -> u64 + Send + Sync + 'static) -> u64 {
    let (work, start) = (Arc::new(work), Arc::new(Barrier::new(threads)));
    (0..threads)
        .map(|_| {
            let (work, start) = (work.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                work()
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|handle| handle.join().unwrap())
        .sum()
}
