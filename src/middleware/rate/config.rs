//! [`Config`]: the rules of a [`RateLimitLayer`](super::RateLimitLayer), shared through an
//! `Arc` by every service the layer builds, and the decision of each request: which rule,
//! which key, what the rule's limiter says, and the answer.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};

use super::route::Route;
use super::rule::Rule;
use super::settlement::{Holder, Settlement};
use crate::decision::Decision;
use crate::error::CostError;
use crate::middleware::backend::Limiter;
use crate::middleware::headers::{self, Fields, HeaderStyle};
use crate::middleware::key::{KeyExtractor, LimitKey, RequestHead};
use crate::middleware::missing_key::KeyTaker;
use crate::middleware::refusal::{Refusal, RefusalHandler, Refused};
use crate::reservation::Reservation;

/// What a route leads to.
#[derive(Clone)]
pub(super) enum Target {
    Exempt,
    Limit(Arc<Rule>),
}

/// Everything a [`RateLimit`](super::RateLimit) service needs, shared by all its clones.
#[derive(Clone)]
pub(super) struct Config {
    pub(super) default: Arc<Rule>,
    pub(super) routes: Vec<(Route, Target)>,
    pub(super) extractor: Arc<dyn KeyExtractor>,
    /// The layer's policy name, quoted.
    pub(super) name: String,
    pub(super) style: HeaderStyle,
    pub(super) keys: KeyTaker,
    pub(super) exempt_options: bool,
    pub(super) shadow: bool,
    pub(super) grpc: bool,
    pub(super) on_refusal: RefusalHandler,
}

/// What the service does with one request, once decided.
pub(super) enum Handling {
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
pub(super) enum Outcome {
    Now(Handling),
    #[cfg(feature = "redis")]
    Remote(Remote),
}

impl From<Handling> for Outcome {
    fn from(handling: Handling) -> Self {
        Outcome::Now(handling)
    }
}

/// A request whose rule is decided by Redis: everything [`Config::decide_remote`] needs.
#[cfg(feature = "redis")]
pub(super) struct Remote {
    rule: Arc<Rule>,
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
    /// A cost `rule`'s policy can never admit: the configuration's fault for a fixed cost,
    /// the request's for one computed from it.
    fn of_cost(rule: &Rule, error: CostError) -> Self {
        if rule.costs_per_request() {
            Failure::Demand(error)
        } else {
            Failure::Cost(error)
        }
    }

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

    /// Every rule, the default's first.
    pub(super) fn rules_mut(&mut self) -> impl Iterator<Item = &mut Arc<Rule>> {
        let routes = self
            .routes
            .iter_mut()
            .filter_map(|(_, target)| match target {
                Target::Limit(rule) => Some(rule),
                Target::Exempt => None,
            });
        std::iter::once(&mut self.default).chain(routes)
    }

    /// Decides `request`: matches its rule, extracts its key, asks an in-process limiter at
    /// once (reserving the cost when the rule settles it from the response), or hands the
    /// key to the response future for Redis.
    pub(super) fn decide<B>(&self, request: &Request<B>) -> Outcome {
        let method = request.method();
        if self.exempt_options && method == Method::OPTIONS {
            return Handling::Pass(None, Fields::default(), None).into();
        }
        let rule = match self.route_for(method, request.uri().path()) {
            Some(i) => match &self.routes[i].1 {
                Target::Exempt => return Handling::Pass(None, Fields::default(), None).into(),
                Target::Limit(rule) => rule,
            },
            None => &self.default,
        };
        let extractor = rule.extractor.as_deref().unwrap_or(&*self.extractor);
        let grpc = self.grpc && headers::is_grpc(request.headers());
        let head = RequestHead::new(request);
        let key = match self.keys.key(extractor, &head, grpc) {
            Ok(Some(key)) => key,
            Ok(None) => return Handling::Pass(None, Fields::default(), None).into(),
            Err(response) => return Handling::Respond(response).into(),
        };
        let cost = rule.cost_of(&head);
        match &rule.limiter {
            Limiter::Local(limiter) if rule.settle.is_some() => {
                let reserved = limiter
                    .reserve_n(&key, cost)
                    .map_err(|error| Failure::of_cost(rule, error));
                let holder = Holder::Local(Arc::clone(limiter));
                self.hold(rule, reserved, holder, key, grpc).into()
            }
            Limiter::Local(limiter) => {
                let decided = if cost == 1 {
                    Ok(limiter.try_acquire(&key))
                } else {
                    limiter
                        .try_acquire_n(&key, cost)
                        .map_err(|error| Failure::of_cost(rule, error))
                };
                self.conclude(rule, decided, grpc).into()
            }
            #[cfg(feature = "redis")]
            Limiter::Redis(limiter) => Outcome::Remote(Remote {
                rule: Arc::clone(rule),
                limiter: limiter.clone(),
                key,
                cost,
                grpc,
            }),
        }
    }

    /// Decides a request by Redis: its key's [`Display`](fmt::Display) form is the Redis key.
    #[cfg(feature = "redis")]
    pub(super) async fn decide_remote(&self, remote: Remote) -> Handling {
        use crate::redis::BackendError;

        let Remote {
            rule,
            limiter,
            key,
            cost,
            grpc,
        } = remote;
        let failure = |error| match error {
            BackendError::Cost(error) => Failure::of_cost(&rule, error),
            error => Failure::Backend(error),
        };
        let redis_key = key.to_string();
        if rule.settle.is_none() {
            let decided = limiter.try_acquire_n(&redis_key, cost).await;
            return self.conclude(&rule, decided.map_err(failure), grpc);
        }
        let reserved = limiter.reserve_n(&redis_key, cost).await.map_err(failure);
        self.hold(&rule, reserved, Holder::Redis(limiter), key, grpc)
    }

    /// Concludes a reservation as a decision is concluded; an allowed one goes with the
    /// request, to be settled from its response (or cancelled when it ends without one).
    fn hold(
        &self,
        rule: &Arc<Rule>,
        reserved: Result<Reservation, Failure>,
        holder: Holder,
        key: LimitKey,
        grpc: bool,
    ) -> Handling {
        let reservation = match reserved {
            Ok(reservation) => reservation,
            Err(failure) => return self.conclude(rule, Err(failure), grpc),
        };
        match self.conclude(rule, Ok(reservation.decision()), grpc) {
            // A refusal holds nothing (nor does a limiter's shadow pass): nothing to settle.
            Handling::Pass(decision, fields, None) if reservation.held() > 0 => {
                let settlement =
                    Settlement::new(Arc::clone(rule), self.shadow, holder, key, reservation);
                Handling::Pass(decision, fields, Some(Box::new(settlement)))
            }
            verdict => verdict,
        }
    }

    /// What a rule's limiter said becomes the answer: pass with the fields, or refuse.
    fn conclude(&self, rule: &Rule, decided: Result<Decision, Failure>, grpc: bool) -> Handling {
        let decision = match decided {
            Ok(decision) => decision,
            // Shadow mode refuses nothing: a misconfigured cost or a failed backend included.
            Err(_) if self.shadow => return Handling::Pass(None, Fields::default(), None),
            Err(failure) => return Handling::Respond(failure.response(grpc)),
        };
        if self.shadow {
            return Handling::Pass(Some(decision), Fields::default(), None);
        }
        let fields = rule.fields(&decision);
        if decision.is_allowed() {
            return Handling::Pass(Some(decision), fields, None);
        }
        let refused = Refused::Rate {
            decision,
            rule: rule.policy_name(),
        };
        let mut response = self.on_refusal.answer(&Refusal::new(refused, grpc));
        fields.apply(response.headers_mut());
        Handling::Respond(response)
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
            .field("missing", &self.keys.missing())
            .field("exempt_options", &self.exempt_options)
            .field("shadow", &self.shadow)
            .field("grpc", &self.grpc)
            .field("on_refusal", &self.on_refusal)
            .finish_non_exhaustive()
    }
}
