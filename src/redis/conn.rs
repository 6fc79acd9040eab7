//! The connection (one node or a cluster) and the script call: `EVALSHA`, sent again as
//! `EVAL` on `NOSCRIPT`, retried only on replies that prove the script did not run.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use ::redis::aio::ConnectionManager;
use ::redis::cluster_async::ClusterConnection;
use ::redis::{Cmd, ErrorKind, RedisError, ServerErrorKind, Value};

use super::failure::bump;

/// A connection that reconnects by itself: the connection manager for one node (a
/// multiplexed connection, replaced in the background when it drops), or the cluster client
/// (one multiplexed connection per node, slots refreshed on `MOVED`).
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    pub(crate) async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        match self {
            Conn::Single(conn) => cmd.query_async(&mut conn.clone()).await,
            Conn::Cluster(conn) => cmd.query_async(&mut conn.clone()).await,
        }
    }
}

/// How often a call is sent again after a reply that proves it did not run (a cluster
/// redirect, a node still loading); the limiter's timeout bounds the whole call anyway.
const RETRIES: u32 = 6;

/// Runs the script with `keys` and `args`: `EVALSHA sha`; after `NOSCRIPT` (Redis restarted,
/// failed over, or ran `SCRIPT FLUSH`) the same call as `EVAL source`, which also caches the
/// script again (each such reload bumps `reloads`).
///
/// Never double-counts: a call is sent again only after a reply that Redis gives *instead of*
/// running the script (`NOSCRIPT`, `MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`, `LOADING`,
/// `MASTERDOWN`, `READONLY`: the script writes only after every read, and a node that
/// refuses writes refuses the first). A call whose fate is unknown (a dropped connection, a
/// timeout) is never sent again: the caller reports the failure instead. The cluster client
/// is built with no retries of its own for the same reason.
pub(crate) async fn eval(
    conn: &Conn,
    sha: &str,
    source: &str,
    keys: &[String],
    args: &[String],
    reloads: &AtomicU64,
) -> Result<Value, RedisError> {
    let mut full = false;
    let mut attempt = 0;
    loop {
        let mut cmd = if full {
            let mut cmd = ::redis::cmd("EVAL");
            cmd.arg(source);
            cmd
        } else {
            let mut cmd = ::redis::cmd("EVALSHA");
            cmd.arg(sha);
            cmd
        };
        cmd.arg(keys.len()).arg(keys).arg(args);
        match conn.query(&cmd).await {
            Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) && !full => {
                bump(reloads);
                full = true;
            }
            Err(err) if did_not_run(&err) && attempt < RETRIES => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(1 << attempt)).await;
            }
            reply => return reply,
        }
    }
}

/// `true` for replies Redis gives instead of running a command.
fn did_not_run(err: &RedisError) -> bool {
    matches!(
        err.kind(),
        ErrorKind::Server(
            ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::BusyLoading
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly
        ) | ErrorKind::ClusterConnectionNotFound
    )
}

/// `true` when `err` means Redis is unreachable or not ready (the failure policy decides),
/// rather than an answer about this call (returned to the caller).
pub(crate) fn is_unavailable(err: &RedisError) -> bool {
    did_not_run(err)
        || err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_timeout()
        || matches!(err.code(), Some("BUSY" | "OOM" | "NOREPLICAS"))
}
