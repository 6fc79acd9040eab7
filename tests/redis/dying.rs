//! A limiter instance in a process that dies: its runtime is gone and the limiter is never
//! dropped, so nothing it holds is given back and nothing of it is closed.

use std::future::Future;

use tollgate::redis::RedisLimiter;

/// Runs `run` to completion on a runtime of its own, in a thread of its own, then abandons
/// the runtime and the limiter `run` returns, as a killed process would. A panic in `run`
/// fails the caller.
pub fn in_a_process_that_dies<F>(run: impl FnOnce() -> F + Send + 'static)
where
    F: Future<Output = RedisLimiter>,
{
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let limiter = runtime.block_on(run());
        runtime.shutdown_background();
        std::mem::forget(limiter);
    })
    .join()
    .unwrap();
}
