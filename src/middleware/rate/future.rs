//! [`ResponseFuture`]: the inner service's response with the rate-limit fields added, or the
//! layer's own answer.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::Response;
use pin_project_lite::pin_project;

use super::settlement::Settlement;
use crate::middleware::body::ResponseBody;
use crate::middleware::headers::Fields;

pin_project! {
    /// The future of a [`RateLimit`](super::RateLimit) service's response: the inner
    /// service's response with the rate-limit fields added (and its reservation settled, for
    /// a route that settles), or the layer's own answer.
    ///
    /// # Panics
    ///
    /// Like most futures, when polled again after it completed.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use http::{Request, Response};
    /// use tollgate::middleware::rate::ResponseFuture;
    /// use tollgate::middleware::{GlobalKey, RateLimitLayer};
    /// use tollgate::RateLimiter;
    /// use tower_layer::Layer;
    /// use tower_service::Service;
    ///
    /// #[derive(Clone)]
    /// struct Ok200;
    /// impl Service<Request<()>> for Ok200 {
    ///     type Response = Response<String>;
    ///     type Error = Infallible;
    ///     type Future = std::future::Ready<Result<Response<String>, Infallible>>;
    ///     fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Infallible>> {
    ///         std::task::Poll::Ready(Ok(()))
    ///     }
    ///     fn call(&mut self, _: Request<()>) -> Self::Future {
    ///         std::future::ready(Ok(Response::new("ok".into())))
    ///     }
    /// }
    ///
    /// let mut service = RateLimitLayer::new(RateLimiter::new("1/min".parse()?)).key(GlobalKey).layer(Ok200);
    /// let future: ResponseFuture<_> = service.call(Request::new(()));
    /// # Ok::<(), tollgate::PolicyError>(())
    /// ```
    pub struct ResponseFuture<F> {
        #[pin]
        state: State<F>,
    }
}

/// The decision awaited from Redis, ending in the inner service's future or an answer.
#[cfg(feature = "redis")]
pub(super) type Deciding<F> = Pin<Box<dyn Future<Output = Step<F>> + Send>>;

/// Where a request goes once Redis has decided it.
#[cfg(feature = "redis")]
pub(super) enum Step<F> {
    /// The inner service was called: its future, the fields for its response, and the
    /// reservation its response settles (if any).
    Call(F, Fields, Option<Box<Settlement>>),
    /// Answered without the inner service.
    Respond(Response<Bytes>),
}

#[cfg(feature = "redis")]
pin_project! {
    #[project = StateProj]
    enum State<F> {
        Deciding {
            pending: Deciding<F>,
        },
        Inner {
            #[pin]
            future: F,
            fields: Option<Fields>,
            // Dropped unsettled (an error, or the future dropped early): cancelled.
            settlement: Option<Box<Settlement>>,
        },
        Ready {
            response: Option<Response<Bytes>>,
        },
    }
}

#[cfg(not(feature = "redis"))]
pin_project! {
    #[project = StateProj]
    enum State<F> {
        Inner {
            #[pin]
            future: F,
            fields: Option<Fields>,
            // Dropped unsettled (an error, or the future dropped early): cancelled.
            settlement: Option<Box<Settlement>>,
        },
        Ready {
            response: Option<Response<Bytes>>,
        },
    }
}

impl<F> ResponseFuture<F> {
    /// The inner service's future, whose response gets `fields` and settles `settlement`
    /// (if any).
    pub(super) fn inner(future: F, fields: Fields, settlement: Option<Box<Settlement>>) -> Self {
        ResponseFuture {
            state: State::Inner {
                future,
                fields: Some(fields),
                settlement,
            },
        }
    }

    pub(super) fn ready(response: Response<Bytes>) -> Self {
        ResponseFuture {
            state: State::Ready {
                response: Some(response),
            },
        }
    }

    #[cfg(feature = "redis")]
    pub(super) fn deciding(pending: Deciding<F>) -> Self {
        ResponseFuture {
            state: State::Deciding { pending },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<ResponseBody<B>>, E>;

    #[cfg_attr(
        not(feature = "redis"),
        allow(
            clippy::never_loop,
            reason = "only a Redis decision moves to another state"
        )
    )]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            return match state.as_mut().project() {
                #[cfg(feature = "redis")]
                StateProj::Deciding { pending } => {
                    let next = match ready!(pending.as_mut().poll(cx)) {
                        Step::Call(future, fields, settlement) => State::Inner {
                            future,
                            fields: Some(fields),
                            settlement,
                        },
                        Step::Respond(response) => State::Ready {
                            response: Some(response),
                        },
                    };
                    state.set(next);
                    continue;
                }
                StateProj::Inner {
                    future,
                    fields,
                    settlement,
                } => {
                    let result = ready!(future.poll(cx));
                    // Settled from the response, or cancelled (dropped) on an error.
                    let settlement = settlement.take();
                    let (mut parts, body) = result?.into_parts();
                    let settled = settlement.and_then(|settlement| settlement.settle(&parts));
                    if let Some(fields) = settled.or_else(|| fields.take()) {
                        fields.apply(&mut parts.headers);
                    }
                    Poll::Ready(Ok(Response::from_parts(parts, ResponseBody::inner(body))))
                }
                StateProj::Ready { response } => Poll::Ready(Ok(ResponseBody::answered(response))),
            };
        }
    }
}

impl<F> fmt::Debug for ResponseFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            #[cfg(feature = "redis")]
            State::Deciding { .. } => "deciding",
            State::Inner { .. } => "inner",
            State::Ready { .. } => "ready",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
