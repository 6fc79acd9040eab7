//! [`ResponseBody`]: the response body of every layer's service: the inner service's body,
//! or the bytes of an answer the layer wrote itself.

use std::fmt;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::Response;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::concurrency::Permit;

pin_project! {
    /// The body of a response from any of the layers' services ([`RateLimit`](super::rate::RateLimit),
    /// [`ConcurrencyLimit`](super::concurrency::ConcurrencyLimit),
    /// [`Login`](super::login::Login)): the inner service's body, or the bytes of an answer
    /// the layer wrote itself (a refusal's problem+json document, empty for gRPC, or what
    /// an `on_refusal` handler returned).
    ///
    /// It implements [`http_body::Body`] with the inner body's data and error types (the
    /// data type must be buildable from [`Bytes`], as it is for axum, hyper and tonic), so
    /// servers accept it wherever they accept the inner body. Behind a
    /// [`ConcurrencyLimitLayer`](super::ConcurrencyLimitLayer) it also holds the request's
    /// place until it has ended or is dropped.
    ///
    /// # Examples
    ///
    /// ```
    /// use http_body::Body;
    /// use tollgate::middleware::ResponseBody;
    ///
    /// fn assert_body<B: Body>() {}
    /// assert_body::<ResponseBody<axum::body::Body>>();
    /// ```
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
        // The concurrency layer's place for this request, released when the body ends.
        permit: Option<Permit>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner {
            #[pin]
            body: B,
        },
        Full {
            data: Option<Bytes>,
        },
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        ResponseBody {
            kind: Kind::Inner { body },
            permit: None,
        }
    }

    /// The layer's own answer, which a response future holds in `slot` until it is polled,
    /// once: a future polled again after it completed has nothing left to give.
    pub(crate) fn answered(slot: &mut Option<Response<Bytes>>) -> Response<Self> {
        slot.take()
            .expect("ResponseFuture polled after completion")
            .map(ResponseBody::full)
    }

    pub(crate) fn full(data: Bytes) -> Self {
        ResponseBody {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
            permit: None,
        }
    }

    /// The inner body, holding `permit` until it has ended or is dropped.
    pub(crate) fn holding(body: B, permit: Option<Permit>) -> Self {
        ResponseBody {
            kind: Kind::Inner { body },
            permit,
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body,
    B::Data: From<Bytes>,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        match this.kind.project() {
            KindProj::Inner { mut body } => {
                let frame = ready!(body.as_mut().poll_frame(cx));
                // Ended (no more frames, an error, or nothing left after this one): the
                // request is no longer in flight, even if the server keeps the body a while
                // before dropping it.
                if !matches!(frame, Some(Ok(_))) || body.is_end_stream() {
                    *this.permit = None;
                }
                Poll::Ready(frame)
            }
            KindProj::Full { data } => {
                Poll::Ready(data.take().map(|data| Ok(Frame::data(data.into()))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |data| data.len() as u64))
            }
        }
    }
}

impl<B> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Inner { .. } => f
                .debug_struct("ResponseBody::Inner")
                .field("permit", &self.permit)
                .finish(),
            Kind::Full { data } => f
                .debug_struct("ResponseBody::Full")
                .field("len", &data.as_ref().map_or(0, Bytes::len))
                .finish(),
        }
    }
}
