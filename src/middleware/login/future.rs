//! [`ResponseFuture`]: the inner service's response, from which the attempt's outcome is
//! recorded, or the layer's own answer.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::Response;
use pin_project_lite::pin_project;

use super::config::Attempt;
use super::outcome::LoginOutcome;
use crate::middleware::body::ResponseBody;

pin_project! {
    /// The future of a [`Login`](super::Login) service's response: records the attempt's
    /// outcome when the inner service answers (a failure if it fails, or if the future is
    /// dropped first). A refusal is ready at once.
    ///
    /// # Panics
    ///
    /// Like most futures, when polled again after it completed.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::future::{Future, Ready};
    /// use tollgate::middleware::login::ResponseFuture;
    ///
    /// fn assert_future<F: Future>() {}
    /// assert_future::<ResponseFuture<Ready<Result<http::Response<()>, ()>>>>();
    /// ```
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
        // The attempt let through, until its outcome is recorded.
        attempt: Option<Attempt>,
    }

    impl<F> PinnedDrop for ResponseFuture<F> {
        fn drop(this: Pin<&mut Self>) {
            // Dropped before its response: the client went away, a timeout fired, the
            // handler panicked. Counted as a failure, so that cancelling an attempt whose
            // answer is slow to come (a wrong password, often) cannot make a guess free.
            if let Some(attempt) = this.project().attempt.take() {
                attempt.record(LoginOutcome::Failure);
            }
        }
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Inner {
            #[pin]
            future: F,
        },
        Answered {
            response: Option<Response<Bytes>>,
        },
    }
}

impl<F> ResponseFuture<F> {
    /// The inner service's future for `attempt` (`None`: not guarded).
    pub(super) fn inner(future: F, attempt: Option<Attempt>) -> Self {
        ResponseFuture {
            state: State::Inner { future },
            attempt,
        }
    }

    pub(super) fn answered(response: Response<Bytes>) -> Self {
        ResponseFuture {
            state: State::Answered {
                response: Some(response),
            },
            attempt: None,
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        match this.state.project() {
            StateProj::Inner { future } => {
                let response = ready!(future.poll(cx));
                if let Some(attempt) = this.attempt.take() {
                    // An error instead of a response counts as a failure, as a dropped
                    // attempt does: otherwise a guess that makes the service fail would cost
                    // nothing.
                    let outcome = match &response {
                        Ok(response) => attempt.outcome_of(response),
                        Err(_) => LoginOutcome::Failure,
                    };
                    attempt.record(outcome);
                }
                Poll::Ready(response.map(|response| response.map(ResponseBody::inner)))
            }
            StateProj::Answered { response } => Poll::Ready(Ok(ResponseBody::answered(response))),
        }
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Inner { .. } => "inner",
            State::Answered { .. } => "answered",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("guarded", &self.attempt.is_some())
            .finish()
    }
}
