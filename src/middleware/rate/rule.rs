//! [`Rule`]: one limiter of a [`RateLimitLayer`](super::RateLimitLayer) with how its requests
//! are keyed, costed and named, and the fields its decisions put on responses.

use std::sync::Arc;

use super::route::{CostFn, SettleFn, Terms};
use crate::decision::Decision;
use crate::middleware::backend::Limiter;
use crate::middleware::headers::{self, Fields, HeaderStyle, Rendered};
use crate::middleware::key::{KeyExtractor, RequestHead};

/// One limiter and how its requests are keyed, costed and named.
#[derive(Clone)]
pub(super) struct Rule {
    pub(super) limiter: Limiter,
    /// The rule's own extractor; `None`: the layer's.
    pub(super) extractor: Option<Arc<dyn KeyExtractor>>,
    /// Permits each request spends, unless `cost_with` computes them.
    cost: u64,
    cost_with: Option<Arc<CostFn>>,
    /// Set: the cost is reserved, and settled from the response.
    pub(super) settle: Option<Arc<SettleFn>>,
    /// The name in the fields, quoted: the route's own, else the layer's.
    name: String,
    /// Whether `name` is the route's own (a layer rename leaves it alone).
    own_name: bool,
    style: HeaderStyle,
    /// The `RateLimit-Policy` rendering for the limiter's policy when configured.
    rendered: Rendered,
}

impl Rule {
    /// The layer's default rule: `limiter`, named as the layer (`layer_name`, quoted).
    pub(super) fn new(limiter: Limiter, layer_name: &str, style: HeaderStyle) -> Self {
        let rendered = Rendered::new(layer_name, limiter.policy());
        Rule {
            limiter,
            extractor: None,
            cost: 1,
            cost_with: None,
            settle: None,
            name: layer_name.to_owned(),
            own_name: false,
            style,
            rendered,
        }
    }

    /// The rule `terms` (a route's, or a limit's) make with `limiter`.
    pub(super) fn with_terms(
        terms: &Terms,
        limiter: Limiter,
        layer_name: &str,
        style: HeaderStyle,
    ) -> Self {
        let mut rule = Rule::new(limiter, terms.name.as_deref().unwrap_or(layer_name), style);
        rule.own_name = terms.name.is_some();
        rule.extractor.clone_from(&terms.extractor);
        rule.cost = terms.cost;
        rule.cost_with.clone_from(&terms.cost_with);
        rule.settle.clone_from(&terms.settle);
        rule
    }

    /// Takes the layer's new name, unless the rule has its own.
    pub(super) fn rename(&mut self, layer_name: &str) {
        if !self.own_name {
            self.name = layer_name.to_owned();
            self.rendered = Rendered::new(layer_name, self.limiter.policy());
        }
    }

    pub(super) fn set_style(&mut self, style: HeaderStyle) {
        self.style = style;
    }

    /// What `head`'s request spends: the computed cost (at least 1), else the fixed one.
    pub(super) fn cost_of(&self, head: &RequestHead<'_>) -> u64 {
        match &self.cost_with {
            Some(cost) => cost(head).max(1),
            None => self.cost,
        }
    }

    /// Whether the cost is computed from each request (so a cost the policy cannot admit is
    /// the request's fault, not the configuration's).
    pub(super) fn costs_per_request(&self) -> bool {
        self.cost_with.is_some()
    }

    /// The rule's name, unquoted, as a refusal handler sees it.
    pub(super) fn policy_name(&self) -> String {
        let bare = &self.name[1..self.name.len() - 1];
        bare.replace("\\\"", "\"").replace("\\\\", "\\")
    }

    /// Whether this rule's `RateLimit-Policy` items and `other`'s may share a name: the same
    /// name, or one rule's composite band items (`<name>-<window>`) named as the other is. A
    /// rule whose policy is not known here (a resolver's) is taken as possibly composite.
    pub(super) fn clashes_with(&self, other: &Rule) -> bool {
        let (mine, theirs) = (self.policy_name(), other.policy_name());
        let banded = |rule: &Rule| rule.limiter.policy().is_none_or(|p| p.bands().count() > 1);
        mine == theirs
            || (banded(self) && theirs.starts_with(&format!("{mine}-")))
            || (banded(other) && mine.starts_with(&format!("{theirs}-")))
    }

    /// The fields `decision` puts on its response.
    pub(super) fn fields(&self, decision: &Decision) -> Fields {
        if self.style != HeaderStyle::Draft {
            return headers::fields(self.style, &self.rendered, decision);
        }
        let policy = self.limiter.policy();
        if policy == self.rendered.policy() {
            headers::fields(self.style, &self.rendered, decision)
        } else {
            // The policy was changed live (`set_policy`): render the new one.
            headers::fields(self.style, &Rendered::new(&self.name, policy), decision)
        }
    }
}

/// The fields of several rules decided together, each with its own decision: those of the
/// rule at `deciding` (the tightest), with every rule's policy in `RateLimit-Policy` (draft
/// style; the other styles hold one rule's values).
pub(super) fn joined_fields<'a>(
    rules: impl Iterator<Item = (&'a Rule, &'a Decision)> + Clone,
    deciding: usize,
) -> Fields {
    let Some((rule, decision)) = rules.clone().nth(deciding) else {
        return Fields::default();
    };
    let fields = rule.fields(decision);
    if fields.policy().is_none() {
        return fields;
    }
    let each: Vec<Fields> = rules
        .map(|(rule, decision)| rule.fields(decision))
        .collect();
    fields.with_policies(each.iter().filter_map(Fields::policy))
}
