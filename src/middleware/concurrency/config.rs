//! [`Config`]: what every [`ConcurrencyLimit`](super::ConcurrencyLimit) service of one layer
//! shares, and the admission of one request.

use std::hash::BuildHasher;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};

use crate::concurrency::{AtCapacity, ConcurrencyLimiter, Permit};
use crate::middleware::headers;
use crate::middleware::key::{KeyExtractor, LimitKey, RequestHead};
use crate::middleware::missing_key::KeyTaker;
use crate::middleware::refusal::{Refusal, RefusalHandler, Refused};

/// A concurrency limiter as the layer sees it: any hasher.
pub(super) trait Gate: Send + Sync {
    fn try_acquire(&self, key: &LimitKey) -> Result<Permit, AtCapacity>;
}

impl<S> Gate for ConcurrencyLimiter<LimitKey, S>
where
    S: BuildHasher + Send + Sync + 'static,
{
    fn try_acquire(&self, key: &LimitKey) -> Result<Permit, AtCapacity> {
        ConcurrencyLimiter::try_acquire(self, key)
    }
}

#[derive(Clone)]
pub(super) struct Config {
    pub(super) limiter: Arc<dyn Gate>,
    pub(super) extractor: Arc<dyn KeyExtractor>,
    pub(super) keys: KeyTaker,
    pub(super) grpc: bool,
    pub(super) on_refusal: RefusalHandler,
}

impl Config {
    /// The permit `request` holds while in flight (`None`: unlimited, for a missing key
    /// under `MissingKey::Allow`), or the answer refusing it.
    #[allow(
        clippy::result_large_err,
        reason = "the answer is returned once per request and sent as is; boxing it would allocate"
    )]
    pub(super) fn admit<B>(&self, request: &Request<B>) -> Result<Option<Permit>, Response<Bytes>> {
        let grpc = self.grpc && headers::is_grpc(request.headers());
        let Some(key) = self
            .keys
            .key(&*self.extractor, &RequestHead::new(request), grpc)?
        else {
            return Ok(None);
        };
        self.limiter.try_acquire(&key).map(Some).map_err(|full| {
            let refused = Refused::Concurrency {
                limit: full.limit(),
            };
            self.on_refusal.answer(&Refusal::new(refused, grpc))
        })
    }
}
