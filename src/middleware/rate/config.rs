//! [`Config`]: the rules of a [`RateLimitLayer`](super::RateLimitLayer), shared through an
//! `Arc` by every service the layer builds, and the decision of each request: which rule,
//! which key, what the rule's limiter says, and the answer.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};

use super::route::Route;
use super::rule::{joined_fields, Rule};
use super::settlement::{Held, Ruled, Settlement};
use crate::all_of::take_in_order;
use crate::decision::Decision;
use crate::error::CostError;
use crate::middleware::backend::{Limiter, Local};
use crate::middleware::headers::{self, Fields, HeaderStyle};
use crate::middleware::key::{KeyExtractor, LimitKey, RequestHead};
use crate::middleware::missing_key::KeyTaker;
use crate::middleware::refusal::{Refusal, RefusalHandler, Refused};

/// What a route leads to.
#[derive(Clone)]
pub(super) enum Target {
    Exempt,
    /// Its rules, decided together (all or nothing) when there are several.
    Limit(Vec<Arc<Rule>>),
}

/// Everything a [`RateLimit`](super::RateLimit) service needs, shared by all its clones.
#[derive(Clone)]
pub(super) struct Config {
    /// The rules of requests no route takes.
    pub(super) default: Vec<Arc<Rule>>,
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

/// A request whose rules are decided by Redis: everything [`Config::decide_remote`] needs.
#[cfg(feature = "redis")]
pub(super) struct Remote {
    /// Each rule with its limiter, the request's key and cost.
    parts: Vec<(Arc<Rule>, crate::redis::RedisLimiter, LimitKey, u64)>,
    grpc: bool,
}

/// Why a limiter gave no decision.
enum Failure {
    /// The rule's cost can never be admitted: a configuration error (500).
    Cost(CostError),
    /// The route's rules cannot be decided together (why, for the log): a configuration
    /// error (500).
    Config(String),
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
            Failure::Config(why) => {
                // The cause names the store's keys: for the operator's log, not the client.
                log::error!("rate limit rules misconfigured, answering 500: {why}");
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "this route's rate limits cannot be decided together".to_owned(),
                )
            }
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

    /// A name two rules of one route share (the default's rules or a route's), if any: their
    /// `RateLimit-Policy` items could not be told apart.
    pub(super) fn shared_name(&self) -> Option<String> {
        let routes = self.routes.iter().filter_map(|(_, target)| match target {
            Target::Limit(rules) => Some(rules),
            Target::Exempt => None,
        });
        std::iter::once(&self.default)
            .chain(routes)
            .find_map(|rules| {
                rules.iter().enumerate().find_map(|(i, rule)| {
                    rules[..i]
                        .iter()
                        .any(|earlier| earlier.clashes_with(rule))
                        .then(|| format!("\"{}\"", rule.policy_name()))
                })
            })
    }

    /// Every rule, the default's first.
    pub(super) fn rules_mut(&mut self) -> impl Iterator<Item = &mut Arc<Rule>> {
        let routes = self
            .routes
            .iter_mut()
            .filter_map(|(_, target)| match target {
                Target::Limit(rules) => Some(rules),
                Target::Exempt => None,
            });
        std::iter::once(&mut self.default).chain(routes).flatten()
    }

    /// Decides `request`: matches its rules, extracts their keys, asks in-process limiters at
    /// once (reserving the cost when a rule settles it from the response, or when several
    /// rules decide together), or hands the keys to the response future for Redis.
    pub(super) fn decide<B>(&self, request: &Request<B>) -> Outcome {
        let method = request.method();
        if self.exempt_options && method == Method::OPTIONS {
            return Handling::Pass(None, Fields::default(), None).into();
        }
        let rules = match self.route_for(method, request.uri().path()) {
            Some(i) => match &self.routes[i].1 {
                Target::Exempt => return Handling::Pass(None, Fields::default(), None).into(),
                Target::Limit(rules) => rules,
            },
            None => &self.default,
        };
        let grpc = self.grpc && headers::is_grpc(request.headers());
        let head = RequestHead::new(request);
        if let [rule] = rules.as_slice() {
            let extractor = rule.extractor.as_deref().unwrap_or(&*self.extractor);
            let key = match self.keys.key(extractor, &head, grpc) {
                Ok(Some(key)) => key,
                Ok(None) => return Handling::Pass(None, Fields::default(), None).into(),
                Err(response) => return Handling::Respond(response).into(),
            };
            let cost = rule.cost_of(&head);
            return self.decide_one(rule, key, cost, grpc);
        }
        let mut parts = Vec::with_capacity(rules.len());
        for rule in rules {
            let extractor = rule.extractor.as_deref().unwrap_or(&*self.extractor);
            match self.keys.key(extractor, &head, grpc) {
                Ok(Some(key)) => parts.push((Arc::clone(rule), key, rule.cost_of(&head))),
                // Passed without a key: this rule does not limit the request.
                Ok(None) => {}
                Err(response) => return Handling::Respond(response).into(),
            }
        }
        match parts.as_slice() {
            [] => Handling::Pass(None, Fields::default(), None).into(),
            [(rule, key, cost)] => self.decide_one(rule, *key, *cost, grpc),
            _ => self.decide_several(parts, grpc),
        }
    }

    /// Decides a request by one rule.
    fn decide_one(&self, rule: &Arc<Rule>, key: LimitKey, cost: u64, grpc: bool) -> Outcome {
        match &rule.limiter {
            Limiter::Local(limiter) if rule.settle.is_some() => {
                let reserved = limiter
                    .reserve_n(&key, cost)
                    .map_err(|error| Failure::of_cost(rule, error));
                let reservation = match reserved {
                    Ok(reservation) => reservation,
                    Err(failure) => return self.conclude(rule, Err(failure), grpc).into(),
                };
                let decision = reservation.decision();
                let held = Held::Local(vec![(0, Arc::clone(limiter), reservation)]);
                let rules = vec![Ruled {
                    rule: Arc::clone(rule),
                    key,
                    decision,
                    cost,
                }];
                self.hold(rules, decision, held, grpc).into()
            }
            Limiter::Local(limiter) => {
                let decided = limiter
                    .try_acquire_n(&key, cost)
                    .map_err(|error| Failure::of_cost(rule, error));
                self.conclude(rule, decided, grpc).into()
            }
            #[cfg(feature = "redis")]
            Limiter::Redis(limiter) => Outcome::Remote(Remote {
                parts: vec![(Arc::clone(rule), limiter.clone(), key, cost)],
                grpc,
            }),
        }
    }

    /// Decides a request by several rules at once, all or nothing: in process, each rule's
    /// cost reserved in order, and at the first refusal (or a cost no policy admits) those
    /// taken given back, the last first, and the rest only looked at; on Redis, one call for
    /// them all. The layer refuses to combine in-process and Redis limiters in one route.
    fn decide_several(&self, parts: Vec<(Arc<Rule>, LimitKey, u64)>, grpc: bool) -> Outcome {
        #[cfg(feature = "redis")]
        if let Limiter::Redis(_) = &parts[0].0.limiter {
            let parts = parts
                .into_iter()
                .filter_map(|(rule, key, cost)| match &rule.limiter {
                    Limiter::Redis(limiter) => {
                        let limiter = limiter.clone();
                        Some((rule, limiter, key, cost))
                    }
                    // Refused when the layer was built (`RateLimitLayer::and`).
                    Limiter::Local(_) => None,
                })
                .collect();
            return Outcome::Remote(Remote { parts, grpc });
        }
        let limiters: Vec<&Arc<dyn Local>> = parts
            .iter()
            .filter_map(|(rule, ..)| rule.limiter.local())
            .collect();
        // Never: the layer refused in-process and Redis rules on one route (`and`).
        if limiters.len() != parts.len() {
            let failure = Failure::Config("in-process and Redis rules on one route".to_owned());
            return self.conclude(&parts[0].0, Err(failure), grpc).into();
        }
        let decided = take_in_order(
            parts.len(),
            |index| {
                let (_, key, cost) = &parts[index];
                let (reservation, created) = limiters[index]
                    .reserve_part(key, *cost)
                    .map_err(|error| (index, error))?;
                let decision = reservation.decision();
                let held = (reservation.held() > 0).then_some((reservation, created));
                Ok((decision, *cost, held))
            },
            |index| {
                let (_, key, cost) = &parts[index];
                let peeked = limiters[index].look_n(key, *cost);
                Ok((peeked.map_err(|error| (index, error))?, *cost))
            },
            |index, (reservation, created)| {
                limiters[index].give_back(&parts[index].1, reservation, created);
            },
        );
        let in_order = match decided {
            Ok(in_order) => in_order,
            Err((index, error)) => {
                let rule = &parts[index].0;
                return self
                    .conclude(rule, Err(Failure::of_cost(rule, error)), grpc)
                    .into();
            }
        };
        let decision = in_order.tally.decision();
        let decisions = in_order.decisions;
        let taken: Vec<_> = in_order
            .taken
            .into_iter()
            .map(|(index, (reservation, _))| (index, Arc::clone(limiters[index]), reservation))
            .collect();
        let rules: Vec<Ruled> = parts
            .into_iter()
            .zip(decisions)
            .map(|((rule, key, cost), decision)| Ruled {
                rule,
                key,
                decision,
                cost,
            })
            .collect();
        let settles = rules.iter().any(|ruled| ruled.rule.settle.is_some());
        if settles && !taken.is_empty() {
            return self.hold(rules, decision, Held::Local(taken), grpc).into();
        }
        // What was taken stays spent: the reservations are dropped unsettled.
        self.conclude_several(&rules, Ok(decision), grpc).into()
    }

    /// [`Config::decide_remote`] on a task of its own where a tokio runtime runs, so that a
    /// request dropped while Redis decides (an outer timeout, a client gone) leaves the
    /// decision to finish: its answer, finding no one to take it, is dropped, and a
    /// reservation in it is given back (`Settlement`'s drop). Without a runtime, inline.
    #[cfg(feature = "redis")]
    pub(super) async fn decide_remote_detached(self: Arc<Self>, remote: Remote) -> Handling {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return self.decide_remote(remote).await;
        };
        let grpc = remote.grpc;
        let (answer, answered) = tokio::sync::oneshot::channel();
        runtime.spawn(async move {
            // Sent, or dropped here when the request is gone.
            let _ = answer.send(self.decide_remote(remote).await);
        });
        answered.await.unwrap_or_else(|_| {
            // The task ended without an answer: the runtime is shutting down.
            let lost = crate::redis::BackendError::Reply("no decision: the runtime stopped".into());
            Handling::Respond(Failure::Backend(lost).response(grpc))
        })
    }

    /// Decides a request by Redis: each key's [`Display`](fmt::Display) form is its Redis
    /// key; several rules in one call ([`RedisAllOf`](crate::redis::RedisAllOf)).
    #[cfg(feature = "redis")]
    pub(super) async fn decide_remote(&self, remote: Remote) -> Handling {
        use crate::redis::{BackendError, RedisAllOf};

        let Remote { mut parts, grpc } = remote;
        if parts.len() == 1 {
            let Some((rule, limiter, key, cost)) = parts.pop() else {
                return Handling::Pass(None, Fields::default(), None);
            };
            let failure = |error| match error {
                BackendError::Cost(error) => Failure::of_cost(&rule, error),
                error => Failure::Backend(error),
            };
            let redis_key = key.to_string();
            if rule.settle.is_none() {
                let decided = limiter.try_acquire_n(&redis_key, cost).await;
                return self.conclude(&rule, decided.map_err(failure), grpc);
            }
            let reservation = match limiter.reserve_n(&redis_key, cost).await {
                Ok(reservation) => reservation,
                Err(error) => return self.conclude(&rule, Err(failure(error)), grpc),
            };
            let decision = reservation.decision();
            let rules = vec![Ruled {
                rule,
                key,
                decision,
                cost,
            }];
            return self.hold(rules, decision, Held::Redis(limiter, reservation), grpc);
        }
        let keys: Vec<String> = parts.iter().map(|(_, _, key, _)| key.to_string()).collect();
        let all = parts
            .iter()
            .zip(&keys)
            .fold(RedisAllOf::new(), |all, ((_, limiter, _, cost), key)| {
                all.key_n(limiter, key, *cost)
            });
        if let Err(error) = all.check() {
            let rule = &parts[error.part()].0;
            return self.conclude(rule, Err(Failure::of_cost(rule, error.error())), grpc);
        }
        // Only the rules that settle are reserved: the others are spent, with no token left
        // in Redis for a settle that never comes.
        let reserve: Vec<bool> = parts
            .iter()
            .map(|(rule, ..)| rule.settle.is_some())
            .collect();
        let limiters: Vec<_> = parts
            .iter()
            .map(|(_, limiter, ..)| limiter.clone())
            .collect();
        let (decided, reservation) = match all.decide_each(&reserve).await {
            Ok(decided) => decided,
            Err(
                error @ (BackendError::OtherConnection { .. }
                | BackendError::SharedKey { .. }
                | BackendError::CrossSlot { .. }),
            ) => {
                // The rules cannot be decided together: the configuration's fault.
                let failure = Failure::Config(error.to_string());
                return self.conclude(&parts[0].0, Err(failure), grpc);
            }
            Err(error) => return self.conclude(&parts[0].0, Err(Failure::Backend(error)), grpc),
        };
        if let Some((part, error)) = decided.error {
            // A cost the policy a rule was decided under cannot admit (a record named another
            // policy than the one checked): the configuration's or the client's, as a cost.
            let rule = &parts[part].0;
            return self.conclude(rule, Err(Failure::of_cost(rule, error)), grpc);
        }
        let decision = decided.decision;
        let rules: Vec<Ruled> = parts
            .into_iter()
            .zip(decided.each)
            .map(|((rule, _, key, cost), decision)| Ruled {
                rule,
                key,
                decision,
                cost,
            })
            .collect();
        match reservation {
            Some(reservation) if decision.is_allowed() => {
                self.hold(rules, decision, Held::RedisAll(limiters, reservation), grpc)
            }
            _ => self.conclude_several(&rules, Ok(decision), grpc),
        }
    }

    /// Concludes an admitted reservation (of one rule or several: `rules`, deciding
    /// `decision`) as a decision is concluded; allowed, it goes with the request, to be
    /// settled from its response (or cancelled when it ends without one).
    fn hold(&self, rules: Vec<Ruled>, decision: Decision, held: Held, grpc: bool) -> Handling {
        match self.conclude_several(&rules, Ok(decision), grpc) {
            // A refusal holds nothing (nor does a limiter's shadow pass): nothing to settle.
            Handling::Pass(decision, fields, None) if holds(&held) => {
                let settlement = Settlement::new(self.shadow, rules, held);
                Handling::Pass(decision, fields, Some(Box::new(settlement)))
            }
            verdict => verdict,
        }
    }

    /// What a rule's limiter said becomes the answer: pass with the fields, or refuse.
    fn conclude(&self, rule: &Rule, decided: Result<Decision, Failure>, grpc: bool) -> Handling {
        self.answer(rule, decided, grpc, |decision| rule.fields(decision))
    }

    /// What several rules decided together (`rules`, each with its own decision) becomes the
    /// answer: the deciding rule's ([`Decision::part`]), with every rule's policy in the
    /// fields.
    fn conclude_several(
        &self,
        rules: &[Ruled],
        decided: Result<Decision, Failure>,
        grpc: bool,
    ) -> Handling {
        let deciding = decided.as_ref().map_or(0, Decision::part);
        let Some(rule) = rules.get(deciding) else {
            // Never: a decision names one of its parts. Refused rather than let through.
            let failure = Failure::Config(format!("no rule {deciding} of {}", rules.len()));
            return Handling::Respond(failure.response(grpc));
        };
        let each = || rules.iter().map(|ruled| (&*ruled.rule, &ruled.decision));
        self.answer(&rule.rule, decided, grpc, |_| {
            joined_fields(each(), deciding)
        })
    }

    /// The answer to `decided`, `rule`'s decision, with the `fields` it puts on the response.
    fn answer(
        &self,
        rule: &Rule,
        decided: Result<Decision, Failure>,
        grpc: bool,
        fields: impl FnOnce(&Decision) -> Fields,
    ) -> Handling {
        let decision = match decided {
            Ok(decision) => decision,
            // Shadow mode refuses nothing: a misconfigured cost or a failed backend included.
            Err(_) if self.shadow => return Handling::Pass(None, Fields::default(), None),
            Err(failure) => return Handling::Respond(failure.response(grpc)),
        };
        if self.shadow {
            return Handling::Pass(Some(decision), Fields::default(), None);
        }
        let fields = fields(&decision);
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

/// Whether `held` holds permits to settle.
fn holds(held: &Held) -> bool {
    match held {
        Held::Local(reservations) => reservations.iter().any(|(_, _, r)| r.held() > 0),
        #[cfg(feature = "redis")]
        Held::Redis(_, reservation) => reservation.held() > 0,
        #[cfg(feature = "redis")]
        Held::RedisAll(..) => true,
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
