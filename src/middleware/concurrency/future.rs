//! [`ResponseFuture`]: the inner service's response, whose body takes over the request's
//! permit, or the layer's own answer.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::Response;
use pin_project_lite::pin_project;

use crate::concurrency::Permit;
use crate::middleware::body::ResponseBody;

pin_project! {
    /// The future of a [`ConcurrencyLimit`](super::ConcurrencyLimit) service's response: it
    /// holds the request's permit and hands it to the response body, which holds it until
    /// it has ended or is dropped. A refusal is ready at once.
    ///
    /// # Panics
    ///
    /// Like most futures, when polled again after it completed.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::future::{Future, Ready};
    /// use tollgate::middleware::concurrency::ResponseFuture;
    ///
    /// fn assert_future<F: Future>() {}
    /// assert_future::<ResponseFuture<Ready<Result<http::Response<()>, ()>>>>();
    /// ```
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        // The inner service was called; the permit (if any) goes to its body.
        Inner {
            #[pin]
            future: F,
            permit: Option<Permit>,
        },
        Answered {
            response: Option<Response<Bytes>>,
        },
    }
}

impl<F> ResponseFuture<F> {
    pub(super) fn inner(future: F, permit: Option<Permit>) -> Self {
        ResponseFuture {
            state: State::Inner { future, permit },
        }
    }

    pub(super) fn answered(response: Response<Bytes>) -> Self {
        ResponseFuture {
            state: State::Answered {
                response: Some(response),
            },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Inner { future, permit } => {
                // On an error the permit is dropped here: nothing is in flight any more.
                let response = ready!(future.poll(cx))?;
                let permit = permit.take();
                Poll::Ready(Ok(response.map(|body| ResponseBody::holding(body, permit))))
            }
            StateProj::Answered { response } => Poll::Ready(Ok(ResponseBody::answered(response))),
        }
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.state {
            State::Inner { permit, .. } => f
                .debug_struct("ResponseFuture::Inner")
                .field("permit", permit)
                .finish_non_exhaustive(),
            State::Answered { .. } => f.write_str("ResponseFuture::Answered"),
        }
    }
}
