//! [`Paced`]: a `Stream` whose items come no faster than a [`Throttle`] admits them.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use futures_core::Stream;
use pin_project_lite::pin_project;

use super::error::ThrottleError;
use super::throttle::{Admission, Throttle};

type Waiting = Pin<Box<dyn Future<Output = Result<Admission, ThrottleError>> + Send>>;

/// Paces `stream` through `throttle`: each item is yielded once a permit for `key` is
/// admitted, in the stream's order and in turn with every other caller of the key. An item
/// whose permit fails (a [`max_wait`](Throttle::max_wait) passed, a Redis budget down) is
/// not lost: the error is yielded and the item kept, and the next poll waits for its permit
/// again.
///
/// A `next()` dropped while it waits (a `select!` that chose another branch) keeps the
/// stream's call for its permit under way, for the next poll: in the key's queue, it holds
/// the callers behind it until the stream is polled again or dropped (see
/// [`Throttle::acquire_n`]). Poll it again, or drop it.
///
/// # Examples
///
/// ```
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::future::poll_fn;
/// use std::pin::pin;
/// use futures_core::Stream;
/// use tollgate::client::{pace, Throttle};
///
/// struct Count(u32);
/// impl Stream for Count {
///     type Item = u32;
///     fn poll_next(mut self: std::pin::Pin<&mut Self>, _: &mut std::task::Context<'_>)
///         -> std::task::Poll<Option<u32>> {
///         self.0 += 1;
///         std::task::Poll::Ready((self.0 <= 5).then_some(self.0))
///     }
/// }
///
/// let throttle = Throttle::quota("2/1s".parse()?)?;
/// let mut paced = pin!(pace(Count(0), throttle, "jobs"));
/// let start = tokio::time::Instant::now();
/// let mut seen = Vec::new();
/// while let Some(item) = poll_fn(|cx| paced.as_mut().poll_next(cx)).await {
///     seen.push(item?);
/// }
/// assert_eq!(seen, [1, 2, 3, 4, 5]);
/// assert!(start.elapsed() >= std::time::Duration::from_secs(2)); // 2, 2, then 1 more
/// # Ok(())
/// # }
/// ```
pub fn pace<S: Stream>(stream: S, throttle: Throttle, key: impl Into<String>) -> Paced<S> {
    Paced {
        stream,
        throttle,
        key: key.into(),
        item: None,
        waiting: None,
    }
}

pin_project! {
    /// A stream paced by [`pace`].
    pub struct Paced<S: Stream> {
        #[pin]
        stream: S,
        throttle: Throttle,
        key: String,
        item: Option<S::Item>,
        waiting: Option<Waiting>,
    }
}

impl<S: Stream> Stream for Paced<S> {
    type Item = Result<S::Item, ThrottleError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut this = self.project();
        if this.item.is_none() {
            match ready!(this.stream.as_mut().poll_next(cx)) {
                Some(item) => *this.item = Some(item),
                None => return Poll::Ready(None),
            }
        }
        let waiting = this.waiting.get_or_insert_with(|| {
            let throttle = this.throttle.clone();
            let key = this.key.clone();
            Box::pin(async move { throttle.acquire(&key).await })
        });
        let admitted = ready!(waiting.as_mut().poll(cx));
        *this.waiting = None;
        if let Err(err) = admitted {
            return Poll::Ready(Some(Err(err)));
        }
        // The item pulled above, now admitted.
        Poll::Ready(this.item.take().map(Ok))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let buffered = usize::from(self.item.is_some());
        let (low, high) = self.stream.size_hint();
        (
            low.saturating_add(buffered),
            high.and_then(|high| high.checked_add(buffered)),
        )
    }
}

impl<S: Stream + fmt::Debug> fmt::Debug for Paced<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Paced")
            .field("stream", &self.stream)
            .field("key", &self.key)
            .field("waiting", &self.waiting.is_some())
            .finish_non_exhaustive()
    }
}
