//! The client side: `tollgate::client`'s throttle, layer and stream pacing against scripted
//! upstreams, on tokio's paused time.

mod layer;
mod quota;
mod throttle;
mod upstream;
