//! [`RateLimitBody`]: the response body of a [`RateLimit`](super::RateLimit) service.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

pin_project! {
    /// The body of a rate-limited service's response: the inner service's body, or the bytes
    /// of a refusal (a problem+json document; empty for gRPC).
    ///
    /// It implements [`http_body::Body`] with the inner body's data and error types (the
    /// data type must be buildable from [`Bytes`], as it is for axum, hyper and tonic), so
    /// servers accept it wherever they accept the inner body.
    ///
    /// # Examples
    ///
    /// ```
    /// use http_body::Body;
    /// use tollgate::middleware::RateLimitBody;
    ///
    /// fn assert_body<B: Body>() {}
    /// assert_body::<RateLimitBody<axum::body::Body>>();
    /// ```
    pub struct RateLimitBody<B> {
        #[pin]
        kind: Kind<B>,
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

impl<B> RateLimitBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        RateLimitBody {
            kind: Kind::Inner { body },
        }
    }

    pub(crate) fn full(data: Bytes) -> Self {
        RateLimitBody {
            kind: Kind::Full {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }
}

impl<B> Body for RateLimitBody<B>
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
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
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

impl<B> fmt::Debug for RateLimitBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Inner { .. } => f.write_str("RateLimitBody::Inner"),
            Kind::Full { data } => f
                .debug_struct("RateLimitBody::Full")
                .field("len", &data.as_ref().map_or(0, Bytes::len))
                .finish(),
        }
    }
}
