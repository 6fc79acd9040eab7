//! The client side: `tollgate::client`'s throttle, layer and stream pacing against scripted
//! upstreams, on tokio's paused time.

mod layer;
mod properties;
mod quota;
mod throttle;
mod upstream;
