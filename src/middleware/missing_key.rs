//! What a layer makes of a request without a key: [`MissingKey`], the answer the user
//! chooses, and [`KeyTaker`], which applies it (and answers a server without peer addresses)
//! for every layer alike.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http::{Response, StatusCode};

use super::error::KeyError;
use super::headers;
use super::key::{KeyExtractor, LimitKey, RequestHead};

/// What to do with a request whose key cannot be extracted ([`KeyError`]).
///
/// The default is `Reject(400 Bad Request)`: the request lacks what the service requires of
/// it (a token, a forwarding entry from the trusted proxy), so it is the client's request
/// that cannot be served, and answering 500 would page someone for every malformed request
/// an attacker cares to send. Letting such requests through unlimited
/// ([`Allow`](MissingKey::Allow)) would make "strip the header" a way around the limit.
///
/// One case is not the client's: a request without a peer address
/// ([`KeyError::NoPeerAddress`]) means the server never recorded the connection's address.
/// Every layer answers it `500 Internal Server Error` whatever this answer says, and logs
/// the cause once per layer.
///
/// # Examples
///
/// ```
/// use http::StatusCode;
/// use tollgate::middleware::{MissingKey, RateLimitLayer};
/// use tollgate::RateLimiter;
///
/// assert_eq!(MissingKey::default(), MissingKey::Reject(StatusCode::BAD_REQUEST));
/// let layer = RateLimitLayer::new(RateLimiter::new("100/min".parse()?))
///     .on_missing_key(MissingKey::Reject(StatusCode::UNAUTHORIZED));
/// # Ok::<(), tollgate::PolicyError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MissingKey {
    /// Answer with this status and an `application/problem+json` body naming what was
    /// missing (for gRPC requests, the nearest `grpc-status`).
    Reject(StatusCode),
    /// Count every such request against one shared key: together they get one key's budget.
    Shared,
    /// Let the request through unlimited, with no rate-limit fields and no `Decision`.
    Allow,
}

impl Default for MissingKey {
    fn default() -> Self {
        MissingKey::Reject(StatusCode::BAD_REQUEST)
    }
}

/// How a layer takes a request's key: the user's [`MissingKey`] for a request that carries
/// none, and `500` for a request the server gave no peer address, logged once per layer.
#[derive(Clone, Debug)]
pub(crate) struct KeyTaker {
    missing: MissingKey,
    /// Set once the missing peer address has been logged: shared by every service (and
    /// clone) of one layer.
    peer_logged: Arc<AtomicBool>,
}

impl KeyTaker {
    pub(crate) fn new(missing: MissingKey) -> Self {
        KeyTaker {
            missing,
            peer_logged: Arc::new(AtomicBool::new(false)),
        }
    }

    pub(crate) fn missing(&self) -> MissingKey {
        self.missing
    }

    pub(crate) fn set_missing(&mut self, missing: MissingKey) {
        self.missing = missing;
    }

    /// The key `extractor` takes from `head`, or, when it finds none, what the layer makes
    /// of that: the shared key, `None` (let through unlimited), or the answer to send.
    #[allow(
        clippy::result_large_err,
        reason = "the answer is returned once per request and sent as is; boxing it would allocate"
    )]
    pub(crate) fn key(
        &self,
        extractor: &dyn KeyExtractor,
        head: &RequestHead<'_>,
        grpc: bool,
    ) -> Result<Option<LimitKey>, Response<Bytes>> {
        let error = match extractor.extract(head) {
            Ok(key) => return Ok(Some(key)),
            Err(error) => error,
        };
        if error == KeyError::NoPeerAddress {
            return Err(self.no_peer_address(grpc));
        }
        match self.missing {
            MissingKey::Reject(status) => Err(headers::error_response(
                status,
                &error.to_string(),
                None,
                grpc,
            )),
            MissingKey::Shared => Ok(Some(LimitKey::Global)),
            MissingKey::Allow => Ok(None),
        }
    }

    /// The answer to a request without a peer address: the server did not record the
    /// connection's address, so every request would fail alike. It is the operator who must
    /// act, so the cause goes to the log (once: a log line per request would flood it) and
    /// the client gets a plain 500.
    #[cold]
    fn no_peer_address(&self, grpc: bool) -> Response<Bytes> {
        // Relaxed: the flag orders nothing; the swap is one read-modify-write, so exactly one
        // request (the first) logs.
        if !self.peer_logged.swap(true, Ordering::Relaxed) {
            log::error!(
                "tollgate middleware: a request carries no peer address; with axum, serve with \
                 `into_make_service_with_connect_info::<SocketAddr>()` (and enable tollgate's \
                 `axum` feature), with hyper put the connection's `SocketAddr` in the request's \
                 extensions; answering 500 to every such request"
            );
        }
        headers::error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the server cannot identify this request's client",
            None,
            grpc,
        )
    }
}
