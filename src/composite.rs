//! TEMPORARY STUB, replaced by the real implementation.
#![allow(missing_docs, unreachable_pub, dead_code)]
use crate::state::RateState;
use crate::{Clock, Decision, Policy};

#[derive(Clone, Copy, Debug)]
pub(crate) struct Composite;

#[derive(Debug)]
pub(crate) struct CompositeCell;

impl RateState for CompositeCell {
    type Params = Composite;
    fn params(_: &Policy) -> Composite { Composite }
    fn fresh(_: &Composite) -> Self { CompositeCell }
    fn try_acquire<C: Clock + ?Sized>(&self, _: &Composite, _: &C, _: u64) -> Option<Decision> { None }
    fn peek<C: Clock + ?Sized>(&self, _: &Composite, _: &C, _: u64) -> Option<Decision> { None }
    fn is_at_rest(&self, _: &Composite, _: u64) -> bool { true }
    fn try_retire(&self, _: &Composite, _: u64) -> bool { true }
}
