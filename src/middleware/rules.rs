//! The per-request rules of a [`RateLimitLayer`](super::RateLimitLayer) and the decision
//! itself ([`Config`]), shared through an `Arc` by every service the layer builds. The
//! limiters a rule is decided by are in `backend`, which requests a rule takes in `route`.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};

use super::backend::{Limiter, Local};
use super::headers::{self, Fields, HeaderStyle, Rendered};
use super::key::{KeyExtractor, LimitKey, RequestHead};
use super::route::{CostFn, MissingKey, Route, SettleFn};
use super::settlement::{Holder, Settlement};
#[cfg(doc)]
use super::RateLimitLayer;
use crate::decision::Decision;
use crate::error::CostError;

/// One limiter and how its requests are keyed and named.
#[derive(Clone)]
pub(super) struct Rule {
    pub(super) limiter: Limiter,
    pub(super) extractor: Option<Arc<dyn KeyExtractor>>,
    /// The rule's own name (quoted); `None`: the layer's.
    pub(super) name: Option<String>,
    /// The `RateLimit-Policy` rendering for the limiter's policy when configured.
    pub(super) rendered: Rendered,
    /// Permits each request spends, unless `cost_with` computes them.
    pub(super) cost: u64,
    pub(super) cost_with: Option<Arc<CostFn>>,
    /// Set: the cost is reserved, and settled from the response.
    pub(super) settle: Option<Arc<SettleFn>>,
}

impl Rule {
    pub(super) fn new(limiter: Limiter, name: Option<String>, base: &str) -> Self {
        let rendered = Rendered::new(name.as_deref().unwrap_or(base), limiter.policy());
        Rule {
            limiter,
            extractor: None,
            name,
            rendered,
            cost: 1,
            cost_with: None,
            settle: None,
        }
    }

    /// What `head`'s request spends: the computed cost (at least 1), else the fixed one.
    fn cost_of(&self, head: &RequestHead<'_>) -> u64 {
        match &self.cost_with {
            Some(cost) => cost(head).max(1),
            None => self.cost,
        }
    }

    /// A cost the policy can never admit: the configuration's fault for a fixed cost, the
    /// request's for one computed from it.
    fn cost_failure(&self, error: CostError) -> Failure {
        if self.cost_with.is_some() {
            Failure::Demand(error)
        } else {
            Failure::Cost(error)
        }
    }

    pub(super) fn rename(&mut self, base: &str) {
        if self.name.is_none() {
            self.rendered = Rendered::new(base, self.limiter.policy());
        }
    }
}

#[derive(Clone)]
pub(super) enum Target {
    Exempt,
    Limit(Box<Rule>),
}

/// Everything a [`RateLimit`] service needs, shared by all its clones.
#[derive(Clone)]
pub(crate) struct Config {
    pub(super) default: Rule,
    pub(super) routes: Vec<(Route, Target)>,
    pub(super) extractor: Arc<dyn KeyExtractor>,
    /// The layer's policy name, quoted.
    pub(super) name: String,
    pub(super) style: HeaderStyle,
    pub(super) missing: MissingKey,
    pub(super) exempt_options: bool,
    pub(super) shadow: bool,
    pub(super) grpc: bool,
}

/// Which rule of a [`Config`] decides a request.
#[derive(Clone, Copy, Debug)]
pub(super) enum RuleId {
    Default,
    Route(usize),
}

/// What the service does with one request, once decided.
pub(crate) enum Verdict {
    /// Call the inner service; put the decision (if any) in the request's extensions and the
    /// fields on its response; settle the reservation (if any) from the response.
    Pass(Option<Decision>, Fields, Option<Box<Settlement>>),
    /// Answer at once.
    Respond(Response<Bytes>),
}

/// How a request is decided: at once (in-process limiters, exemptions, missing keys), or by
/// Redis, awaited in the response future.
#[allow(
    clippy::large_enum_variant,
    reason = "returned by value once per request; boxing the common variant would allocate on the hot path"
)]
pub(crate) enum Outcome {
    Now(Verdict),
    #[cfg(feature = "redis")]
    Remote(Remote),
}

impl From<Verdict> for Outcome {
    fn from(verdict: Verdict) -> Self {
        Outcome::Now(verdict)
    }
}

/// A request whose rule is decided by Redis: everything [`Config::decide_remote`] needs.
#[cfg(feature = "redis")]
pub(crate) struct Remote {
    rule: RuleId,
    limiter: crate::redis::RedisLimiter,
    key: LimitKey,
    cost: u64,
    grpc: bool,
}

/// Why a limiter gave no decision.
enum Failure {
    /// The rule's cost can never be admitted: a configuration error (500).
    Cost(CostError),
    /// The cost computed from the request can never be admitted: the request's fault (400).
    Demand(CostError),
    /// Redis could not decide and its failure policy let the error through (503).
    #[cfg(feature = "redis")]
    Backend(crate::redis::BackendError),
}

impl Failure {
    fn response(&self, grpc: bool) -> Response<Bytes> {
        let (status, detail) = match self {
            Failure::Cost(error) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("this route's cost cannot be admitted: {error}"),
            ),
            Failure::Demand(error) => (
                StatusCode::BAD_REQUEST,
                format!("this request's cost cannot be admitted: {error}"),
            ),
            #[cfg(feature = "redis")]
            Failure::Backend(error) => {
                // The cause (an OS error, a cluster node's address) is for the operator's log,
                // not for the client.
                log::warn!("rate limit store unavailable, answering 503: {error}");
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the rate limiter cannot decide now".to_owned(),
                )
            }
        };
        headers::error_response(status, &detail, None, grpc)
    }
}

impl Config {
    /// The index of the route deciding `method path`: the first that matches, except that a
    /// `HEAD` request takes the first matching route built for `HEAD` when there is one, so
    /// that an explicit `HEAD` rule is not shadowed by an earlier `GET` rule serving `HEAD`
    /// too (`Route::new`).
    fn route_for(&self, method: &Method, path: &str) -> Option<usize> {
        let first = |explicit_head: bool| {
            self.routes.iter().position(|(route, _)| {
                (!explicit_head || route.method.as_ref() == Some(&Method::HEAD))
                    && route.matches(method, path)
            })
        };
        (method == Method::HEAD)
            .then(|| first(true))
            .flatten()
            .or_else(|| first(false))
    }

    pub(super) fn rule(&self, id: RuleId) -> &Rule {
        match id {
            RuleId::Route(i) => match &self.routes[i].1 {
                Target::Limit(rule) => rule,
                Target::Exempt => &self.default,
            },
            RuleId::Default => &self.default,
        }
    }

    /// Decides `request`: matches its rule, extracts its key, asks an in-process limiter at
    /// once (reserving the cost when the rule settles it from the response), or hands the
    /// key to the response future for Redis.
    pub(crate) fn decide<B>(self: &Arc<Self>, request: &Request<B>) -> Outcome {
        let method = request.method();
        if self.exempt_options && method == Method::OPTIONS {
            return Verdict::Pass(None, Fields::default(), None).into();
        }
        let id = match self.route_for(method, request.uri().path()) {
            Some(i) if matches!(self.routes[i].1, Target::Exempt) => {
                return Verdict::Pass(None, Fields::default(), None).into()
            }
            Some(i) => RuleId::Route(i),
            None => RuleId::Default,
        };
        let rule = self.rule(id);
        let extractor = rule.extractor.as_deref().unwrap_or(&*self.extractor);
        let grpc = self.is_grpc(request);
        let head = RequestHead::new(request);
        let key = match self.missing.key(extractor, &head, grpc) {
            Ok(Some(key)) => key,
            Ok(None) => return Verdict::Pass(None, Fields::default(), None).into(),
            Err(response) => return Verdict::Respond(response).into(),
        };
        let cost = rule.cost_of(&head);
        let result = match &rule.limiter {
            Limiter::Local(limiter) if rule.settle.is_some() => {
                return self.reserve(id, limiter, key, cost, grpc).into();
            }
            Limiter::Local(limiter) if cost == 1 => Ok(limiter.try_acquire(&key)),
            Limiter::Local(limiter) => limiter
                .try_acquire_n(&key, cost)
                .map_err(|error| rule.cost_failure(error)),
            #[cfg(feature = "redis")]
            Limiter::Redis(limiter) => {
                return Outcome::Remote(Remote {
                    rule: id,
                    limiter: limiter.clone(),
                    key,
                    cost,
                    grpc,
                })
            }
        };
        self.conclude(rule, result, grpc).into()
    }

    /// Reserves `cost` for `key` under a rule that settles from the response: an allowed
    /// reservation goes with the request, to be settled (or cancelled) when it ends.
    fn reserve(
        self: &Arc<Self>,
        id: RuleId,
        limiter: &Arc<dyn Local>,
        key: LimitKey,
        cost: u64,
        grpc: bool,
    ) -> Verdict {
        let rule = self.rule(id);
        let reservation = match limiter.reserve_n(&key, cost) {
            Ok(reservation) => reservation,
            Err(error) => return self.conclude(rule, Err(rule.cost_failure(error)), grpc),
        };
        let verdict = self.conclude(rule, Ok(reservation.decision()), grpc);
        match verdict {
            // A refusal holds nothing (nor does a limiter's shadow pass): nothing to settle.
            Verdict::Pass(decision, fields, None) if reservation.held() > 0 => {
                let settlement = Settlement::new(
                    Arc::clone(self),
                    id,
                    Holder::Local(Arc::clone(limiter)),
                    key,
                    reservation,
                );
                Verdict::Pass(decision, fields, Some(Box::new(settlement)))
            }
            verdict => verdict,
        }
    }

    /// Decides a request by Redis: its key's [`Display`](fmt::Display) form is the Redis key.
    #[cfg(feature = "redis")]
    pub(crate) async fn decide_remote(self: &Arc<Self>, remote: Remote) -> Verdict {
        use crate::redis::BackendError;

        let rule = self.rule(remote.rule);
        let key = remote.key.to_string();
        let failure = |error| match error {
            BackendError::Cost(error) => rule.cost_failure(error),
            error => Failure::Backend(error),
        };
        if rule.settle.is_none() {
            let result = remote.limiter.try_acquire_n(&key, remote.cost).await;
            return self.conclude(rule, result.map_err(failure), remote.grpc);
        }
        let reservation = match remote.limiter.reserve_n(&key, remote.cost).await {
            Ok(reservation) => reservation,
            Err(error) => return self.conclude(rule, Err(failure(error)), remote.grpc),
        };
        match self.conclude(rule, Ok(reservation.decision()), remote.grpc) {
            // A refusal holds nothing (nor does a shadow pass): nothing to settle.
            Verdict::Pass(decision, fields, None) if reservation.held() > 0 => {
                let settlement = Settlement::new(
                    Arc::clone(self),
                    remote.rule,
                    Holder::Redis(remote.limiter),
                    remote.key,
                    reservation,
                );
                Verdict::Pass(decision, fields, Some(Box::new(settlement)))
            }
            verdict => verdict,
        }
    }

    /// What a rule's limiter said becomes the answer: pass with the fields, or refuse.
    fn conclude(&self, rule: &Rule, result: Result<Decision, Failure>, grpc: bool) -> Verdict {
        let decision = match result {
            Ok(decision) => decision,
            // Shadow mode refuses nothing: a misconfigured cost or a failed backend included.
            Err(_) if self.shadow => return Verdict::Pass(None, Fields::default(), None),
            Err(failure) => return Verdict::Respond(failure.response(grpc)),
        };
        if self.shadow {
            return Verdict::Pass(Some(decision), Fields::default(), None);
        }
        let fields = self.fields(rule, &decision);
        if decision.is_allowed() {
            Verdict::Pass(Some(decision), fields, None)
        } else {
            Verdict::Respond(headers::refusal(&decision, fields, grpc))
        }
    }

    pub(super) fn fields(&self, rule: &Rule, decision: &Decision) -> Fields {
        if self.style != HeaderStyle::Draft {
            return headers::fields(self.style, &rule.rendered, decision);
        }
        let policy = rule.limiter.policy();
        if policy == rule.rendered.policy() {
            headers::fields(self.style, &rule.rendered, decision)
        } else {
            // The policy was changed live (`set_policy`): render the new one.
            let name = rule.name.as_deref().unwrap_or(&self.name);
            headers::fields(self.style, &Rendered::new(name, policy), decision)
        }
    }

    fn is_grpc<B>(&self, request: &Request<B>) -> bool {
        self.grpc && headers::is_grpc(request.headers())
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field(
                "routes",
                &self.routes.iter().map(|(r, _)| r).collect::<Vec<_>>(),
            )
            .field("name", &self.name)
            .field("style", &self.style)
            .field("missing", &self.missing)
            .field("exempt_options", &self.exempt_options)
            .field("shadow", &self.shadow)
            .field("grpc", &self.grpc)
            .finish_non_exhaustive()
    }
}
