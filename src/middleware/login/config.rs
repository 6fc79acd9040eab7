//! [`Config`]: what every [`Login`](super::Login) service of one layer shares, the admission
//! of one attempt, and the [`Attempt`] whose outcome is recorded from the response.

use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response, StatusCode};

use super::outcome::LoginOutcome;
use crate::clock::Clock;
use crate::login::{LoginClient, LoginDecision, LoginGuard};
use crate::middleware::headers;
use crate::middleware::key::{KeyExtractor, LimitKey, RequestHead};
use crate::middleware::missing_key::KeyTaker;
use crate::middleware::refusal::{Refusal, RefusalHandler, Refused};

/// A login guard as the layer sees it: any clock.
pub(super) trait Guard: Send + Sync {
    fn check(&self, account: &str, client: LoginClient<'_>) -> LoginDecision;
    fn record(&self, account: &str, client: LoginClient<'_>, outcome: LoginOutcome);
}

impl<C: Clock + Send + Sync + 'static> Guard for LoginGuard<C> {
    fn check(&self, account: &str, client: LoginClient<'_>) -> LoginDecision {
        LoginGuard::check(self, account, client)
    }

    fn record(&self, account: &str, client: LoginClient<'_>, outcome: LoginOutcome) {
        match outcome {
            LoginOutcome::Failure => {
                let _next = self.record_failure(account, client);
            }
            LoginOutcome::Success => self.record_success(account, client),
            LoginOutcome::Ignore => {}
        }
    }
}

/// Reads the account an attempt is for from the request's head.
pub(super) type AccountOf = dyn Fn(&RequestHead<'_>) -> Option<String> + Send + Sync;

/// Classifies a response status.
pub(super) type Classify = dyn Fn(StatusCode) -> LoginOutcome + Send + Sync;

#[derive(Clone)]
pub(super) struct Config {
    pub(super) guard: Arc<dyn Guard>,
    pub(super) account: Arc<AccountOf>,
    pub(super) client: Arc<dyn KeyExtractor>,
    pub(super) keys: KeyTaker,
    pub(super) classify: Arc<Classify>,
    pub(super) grpc: bool,
    pub(super) max_account_len: usize,
    pub(super) on_refusal: RefusalHandler,
}

/// An attempt let through: whom to record its outcome for.
pub(super) struct Attempt {
    config: Arc<Config>,
    account: String,
    client: LimitKey,
}

impl Attempt {
    /// `client` as the guard takes it: an address (the guard masks it) or, for any other
    /// key, its stable text form as a token.
    fn with_client<R>(&self, f: impl FnOnce(LoginClient<'_>) -> R) -> R {
        match self.client {
            LimitKey::Ip(ip) => f(LoginClient::from(ip)),
            key => f(LoginClient::Token(&key.to_string())),
        }
    }

    /// Records `outcome` for the attempt.
    pub(super) fn record(&self, outcome: LoginOutcome) {
        self.with_client(|client| self.config.guard.record(&self.account, client, outcome));
    }

    /// The attempt's outcome as `response` tells it: from `grpc-status` for a gRPC response
    /// (a gRPC media type, or a `grpc-status` header), else from the status. The response
    /// says whether it is gRPC, not the request: the client writes the request's content
    /// type, and would pick whichever reading records nothing (a REST `401` read as gRPC has
    /// no `grpc-status`; a failed RPC read by its status is an HTTP `200`, a success).
    pub(super) fn outcome_of<B>(&self, response: &Response<B>) -> LoginOutcome {
        let headers = response.headers();
        let code = headers.get(headers::GRPC_STATUS);
        if self.config.grpc && (code.is_some() || headers::is_grpc(headers)) {
            LoginOutcome::from_grpc_status(code.and_then(|code| code.to_str().ok()))
        } else {
            (self.config.classify)(response.status())
        }
    }
}

impl Config {
    /// The attempt `request` makes (`None`: not guarded, for a missing client under
    /// `MissingKey::Allow`), or the answer refusing it.
    #[allow(
        clippy::result_large_err,
        reason = "the answer is returned once per request and sent as is; boxing it would allocate"
    )]
    pub(super) fn admit<B>(
        config: &Arc<Config>,
        request: &Request<B>,
    ) -> Result<Option<Attempt>, Response<Bytes>> {
        let grpc = config.grpc && headers::is_grpc(request.headers());
        let head = RequestHead::new(request);
        let Some(account) = (config.account)(&head).filter(|a| !a.is_empty()) else {
            // Letting it through would let a client that leaves the account out guess
            // without limit if the handler reads it from elsewhere.
            return Err(headers::error_response(
                StatusCode::BAD_REQUEST,
                "no account in the login request",
                None,
                grpc,
            ));
        };
        if account.len() > config.max_account_len {
            // The guard keeps the account as a key: a bound keeps each key's memory bounded.
            return Err(headers::error_response(
                StatusCode::BAD_REQUEST,
                "the account in the login request is too long",
                None,
                grpc,
            ));
        }
        let Some(client) = config.keys.key(&*config.client, &head, grpc)? else {
            return Ok(None);
        };
        let attempt = Attempt {
            config: Arc::clone(config),
            account,
            client,
        };
        let decision = attempt.with_client(|client| config.guard.check(&attempt.account, client));
        if decision.is_allowed() {
            return Ok(Some(attempt));
        }
        Err(config
            .on_refusal
            .answer(&Refusal::new(Refused::Login(decision), grpc)))
    }
}
