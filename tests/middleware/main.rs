//! The HTTP middleware (feature `tower`), end to end through axum routers on loopback: one
//! test binary, a module per layer (`rate_limit`: `RateLimitLayer`; `settle`: its routes that
//! reserve at the request and settle from the response; `all_rules`: its routes decided by
//! several rules at once; `layers`: the concurrency and login
//! layers; `peer`: the peer address as a key; `refusals`: every layer's `on_refusal`
//! handler), the server and client of tests/support/http.rs and the in-place call of
//! `in_place` compiled once.
//!
//! ```text
//! cargo test --features tower --test middleware
//! cargo test --features tower --test middleware layers::
//! ```

#[path = "../support/http.rs"]
mod http_support;

mod all_rules;
mod in_place;
mod layers;
mod peer;
mod rate_limit;
mod refusals;
mod settle;
