//! [`TokioClock`] (feature `tokio`): tokio's time, paused and advanced in tests.

use super::source::{duration_to_nanos, Clock};

/// A clock that follows tokio's time (feature `tokio`): real time normally, and paused or
/// advanced time in tests (`#[tokio::test(start_paused = true)]`,
/// `tokio::time::advance`), so async waiting can be tested without real sleeping.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// use std::time::Duration;
/// use tollgate::Clock;
/// use tollgate::clock::TokioClock;
///
/// let clock = TokioClock::new();
/// tokio::time::advance(Duration::from_millis(5)).await;
/// assert_eq!(clock.now(), 5_000_000);
/// # }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct TokioClock {
    origin: tokio::time::Instant,
}

impl TokioClock {
    /// A clock whose zero is tokio's now.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let clock = tollgate::clock::TokioClock::new();
    /// # let _ = clock;
    /// # }
    /// ```
    #[must_use]
    pub fn new() -> Self {
        TokioClock {
            origin: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> u64 {
        duration_to_nanos(self.origin.elapsed())
    }
}
