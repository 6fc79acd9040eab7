//! Giving a lease back to Redis: the keys and arguments of a lease call, the call (once,
//! never resent), and the leases of a dropped limiter, given back from a task of their own.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use crate::reservation::Marks;

use super::conn::Script;
use super::error::BackendError;
use super::script::{self, Ask, Bands};

/// A lease as Redis granted it, to be given back: its marks and serial number.
#[derive(Clone, Copy, Debug)]
pub(super) struct Held {
    pub(super) marks: Marks,
    pub(super) serial: u64,
}

/// Sends what gives a lease back: what the limiter's `Drop` hands to a task, so it owns it.
pub(super) struct Returner {
    script: Script,
    bands: Bands,
    prefix: String,
    /// This limiter's field in each key's hash of lease tokens.
    instance: String,
    timeout: Duration,
}

impl Returner {
    /// Gives leases back through `script`, for the keys of `bands` under `prefix`, as the
    /// limiter instance `instance`, each call within `timeout`.
    pub(super) fn new(
        script: Script,
        bands: Bands,
        prefix: String,
        instance: String,
        timeout: Duration,
    ) -> Self {
        Returner {
            script,
            bands,
            prefix,
            instance,
            timeout,
        }
    }

    /// How long each of its calls may take.
    pub(super) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The keys of a lease call for `key`: the bands', then the lease token's.
    pub(super) fn keys(&self, key: &str) -> Vec<String> {
        let mut keys = self.bands.keys(&self.prefix, key);
        keys.push(Bands::lease_key(&self.prefix, key));
        keys
    }

    /// The keys of a lease call (`lease` or `return`) for `key`, with this limiter's field in
    /// the key's hash of lease tokens appended to the call's `args`.
    pub(super) fn token_call(&self, key: &str, args: &mut Vec<String>) -> Vec<String> {
        args.push(self.instance.clone());
        self.keys(key)
    }

    /// Gives `permits` of the lease `held` back, once, never resent: `true` when applied,
    /// `false` when the token no longer named the lease.
    pub(super) async fn send(
        &self,
        key: &str,
        held: Held,
        permits: u64,
        now_micros: Option<u64>,
        reloads: &AtomicU64,
    ) -> Result<bool, BackendError> {
        let ask = Ask::Return {
            permits,
            marks: held.marks,
            serial: held.serial,
        };
        let mut args = self.bands.args(now_micros, ask);
        let keys = self.token_call(key, &mut args);
        let call = self.script.call(&keys, &args, reloads, false, self.timeout);
        match call.await {
            Ok(Ok(reply)) => script::returned(&reply),
            Ok(Err(err)) => Err(BackendError::Redis(err)),
            Err(_) => Err(BackendError::Timeout(self.timeout)),
        }
    }

    /// Gives back each of `leases` in turn (a dropped limiter's, from a task of its own).
    pub(super) async fn give_back_all(
        self: Arc<Self>,
        leases: Vec<(String, Held, u64)>,
        clock: Option<Arc<dyn Clock>>,
    ) {
        let reloads = AtomicU64::new(0);
        for (key, held, unused) in leases {
            let now_micros = match &clock {
                Some(clock) => match script::micros(clock.now()) {
                    Ok(micros) => Some(micros),
                    Err(_) => return,
                },
                None => None,
            };
            if let Err(err) = self.send(&key, held, unused, now_micros, &reloads).await {
                log::warn!(
                    "tollgate: a dropped limiter could not give back {unused} leased permits of a key: {err}"
                );
            }
        }
    }
}
