//! The connection (one node or a cluster) and the script on it: loaded when a limiter
//! connects, as a function library where Redis has functions (7 and later) and as a script
//! otherwise; then called as `FCALL` (loaded again when the function is missing) or
//! `EVALSHA` (sent again as `EVAL` on `NOSCRIPT`), and retried only on replies that prove
//! the script did not run.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::ConnectionManager;
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::SingleNodeRoutingInfo;
use ::redis::{Cmd, ErrorKind, RedisError, ServerErrorKind, Value};

use crate::reservation::next_limiter_id;

use super::error::BackendError;
use super::failure::bump;
use super::source::{library, SOURCE};

/// A connection that reconnects by itself: the connection manager for one node (a
/// multiplexed connection, replaced in the background when it drops), or the cluster client
/// (one multiplexed connection per node, slots refreshed on `MOVED`).
#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    pub(super) async fn query(&self, cmd: &Cmd) -> Result<Value, RedisError> {
        match self {
            Conn::Single(conn) => cmd.query_async(&mut conn.clone()).await,
            Conn::Cluster(conn) => cmd.query_async(&mut conn.clone()).await,
        }
    }

    /// `cmd` sent to the cluster node at `node` right after `ASKING`, in one pipeline on one
    /// connection: how a client follows an `ASK` redirect while a slot migrates (the node
    /// importing the slot serves the one command that follows `ASKING`). The cluster client
    /// routes by address only to nodes it is connected to, those of its slot map; another
    /// node yields `ClusterConnectionNotFound` (see docs/REDIS.md, "Not covered").
    async fn query_asking(&self, cmd: &Cmd, node: &Node) -> Result<Value, RedisError> {
        let conn = match self {
            Conn::Cluster(conn) => conn,
            // A single node never answers ASK; nothing to follow.
            Conn::Single(_) => return self.query(cmd).await,
        };
        let mut pipeline = ::redis::pipe();
        pipeline.cmd("ASKING").add_command(cmd.clone());
        let route = SingleNodeRoutingInfo::ByAddress {
            host: node.host.clone(),
            port: node.port,
        };
        // Offset 1, count 1: the script's reply alone, not ASKING's `OK`.
        let mut replies = conn.clone().route_pipeline(pipeline, 1, 1, route).await?;
        // A pipeline leaves most error replies (NOSCRIPT, BUSY, a script error) in place as
        // values; turn them into errors as `query` does, so `eval` treats them the same.
        replies
            .pop()
            .ok_or_else(|| RedisError::from((ErrorKind::Parse, "empty reply to ASKING + script")))?
            .extract_error()
    }
}

/// A cluster node named by an `ASK` redirect (`-ASK <slot> <host>:<port>`).
struct Node {
    host: String,
    port: u16,
}

impl Node {
    /// The node an `ASK` reply names; `None` for any other error or an unreadable address.
    fn asked_by(err: &RedisError) -> Option<Node> {
        if err.kind() != ErrorKind::Server(ServerErrorKind::Ask) {
            return None;
        }
        let (address, _slot) = err.redirect_node()?;
        Node::parse(address)
    }

    /// `host:port`, the host possibly an IPv6 address, bracketed (`[::1]:7000`) or not
    /// (`::1:7000`, as Redis writes it); `None` without a host or a port.
    fn parse(address: &str) -> Option<Node> {
        let (host, port) = address.rsplit_once(':')?;
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if host.is_empty() {
            return None;
        }
        Some(Node {
            host: host.to_owned(),
            port: port.parse().ok()?,
        })
    }
}

/// How often a call is sent again after a reply that proves it did not run (a cluster
/// redirect, a node still loading); the limiter's timeout bounds the whole call anyway.
const RETRIES: u32 = 6;

/// The limiter's script ([`SOURCE`]) on a connection: what every decision, settle and lease
/// call runs.
#[derive(Clone)]
pub(super) struct Script {
    conn: Conn,
    /// The SHA-1 of [`SOURCE`], for `EVALSHA`.
    sha: String,
    /// The function library it was loaded as, where Redis has functions: `FCALL` then.
    function: Option<Function>,
    /// Set once Redis refused `FCALL` itself (no such command, or an ACL that denies it
    /// while it allowed `FUNCTION LOAD`): every clone calls the script from then on.
    scripts_only: Arc<AtomicBool>,
    /// Names the connection: the same for every clone of this script, different for every
    /// other load.
    id: u64,
}

/// The script as a Redis function: its name, which is also its library's, the library, and
/// this connection's attempts to load it again.
#[derive(Clone)]
struct Function {
    name: Arc<str>,
    library: Arc<str>,
    /// The last reload attempt, behind the lock that makes them one at a time: a call that
    /// found the function missing tries to load it only if no attempt ended since it was
    /// sent, and otherwise goes by how that one ended.
    last_reload: Arc<tokio::sync::Mutex<Attempts>>,
    /// How many attempts ended, readable without the lock: what a call sees before it is
    /// sent.
    attempts: Arc<AtomicU64>,
}

/// The attempts to load the function again that ended, and whether the last one loaded it.
#[derive(Clone, Copy, Default)]
struct Attempts {
    ended: u64,
    loaded: bool,
}

/// How a call that found the function missing goes on ([`Function::reload`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Reload {
    /// This call loaded it: sent again, counted as a reload.
    Loaded,
    /// Another call loaded it since this one was sent: sent again.
    LoadedBefore,
    /// This call's attempt, or the last one since it was sent, failed: sent as `EVAL`.
    Failed,
}

impl Function {
    /// The library of the script whose SHA-1 is `sha`: named after it, so that limiters of
    /// different versions of the script, sharing one Redis, each call their own.
    fn of(sha: &str) -> Self {
        let name = format!("tollgate_{sha}");
        Function {
            library: library(&name).into(),
            name: name.into(),
            last_reload: Arc::new(tokio::sync::Mutex::new(Attempts::default())),
            attempts: Arc::new(AtomicU64::new(0)),
        }
    }

    /// How many reload attempts had ended, read before a call is sent.
    fn attempts_seen(&self) -> u64 {
        // Acquire: pairs with the Release store in `reload`; a call that sees an attempt's
        // count is sent after that attempt's `FUNCTION LOAD` was answered.
        self.attempts.load(Ordering::Acquire)
    }

    /// Loads the library again after a call, sent when `seen` attempts had ended, found the
    /// function missing; unless an attempt ended since, whose outcome then serves this call
    /// too. Every call in flight when Redis lost the function meets the same error, and one
    /// `FUNCTION LOAD` (which compiles the whole library, blocking Redis meanwhile) serves
    /// them all, whether it loads the library or is refused (an ACL, `OOM`).
    async fn reload(&self, conn: &Conn, seen: u64) -> Reload {
        let mut last = self.last_reload.lock().await;
        if last.ended != seen {
            return if last.loaded {
                Reload::LoadedBefore
            } else {
                Reload::Failed
            };
        }
        let loaded = self.load(conn).await.is_ok();
        *last = Attempts {
            ended: last.ended + 1,
            loaded,
        };
        // Release: see `attempts_seen`.
        self.attempts.store(last.ended, Ordering::Release);
        if loaded {
            Reload::Loaded
        } else {
            Reload::Failed
        }
    }

    /// Loads the library on `conn` (on every primary of a cluster), replacing the one of the
    /// same name, which holds the same code.
    async fn load(&self, conn: &Conn) -> Result<(), RedisError> {
        let mut load = ::redis::cmd("FUNCTION");
        load.arg("LOAD").arg("REPLACE").arg(&*self.library);
        match conn.query(&load).await? {
            Value::BulkString(bytes) if bytes.as_slice() == self.name.as_bytes() => Ok(()),
            Value::SimpleString(name) if *name == *self.name => Ok(()),
            other => Err(RedisError::from((
                ErrorKind::Parse,
                "unexpected reply to FUNCTION LOAD",
                format!("{other:?}"),
            ))),
        }
    }
}

impl Script {
    /// Loads the script on `conn` (on every primary of a cluster), within `timeout`: the first
    /// calls then find it, and a server that cannot run it fails here rather than on a request.
    ///
    /// As a function library first, which Redis compiles once: a script's own functions are
    /// made again on every call, which costs about a quarter of a one-key decision's time in
    /// Redis. A server without functions (before Redis 7), or a user whose ACL does not allow
    /// `FUNCTION LOAD`, gets the script, called with `EVALSHA`.
    pub(super) async fn load(conn: Conn, timeout: Duration) -> Result<Script, BackendError> {
        let sha = ::redis::Script::new(SOURCE).get_hash().to_owned();
        let function = Function::of(&sha);
        let loaded = tokio::time::timeout(timeout, function.load(&conn))
            .await
            .map_err(|_| BackendError::Timeout(timeout))?;
        // A refusal (no such command, an ACL, `OOM` under `maxmemory`, which `SCRIPT LOAD` is
        // not refused for) leaves the script; a server down or not ready fails the connect,
        // as the script's load would.
        let function = match loaded {
            Ok(()) => Some(function),
            Err(err) if is_unavailable(&err) && err.code() != Some("OOM") => {
                return Err(err.into());
            }
            Err(err) => {
                log::info!("tollgate: Redis functions unavailable ({err}); using EVALSHA");
                None
            }
        };
        if function.is_none() {
            let mut load = ::redis::cmd("SCRIPT");
            load.arg("LOAD").arg(SOURCE);
            let loaded = tokio::time::timeout(timeout, conn.query(&load))
                .await
                .map_err(|_| BackendError::Timeout(timeout))??;
            match &loaded {
                Value::BulkString(bytes) if bytes.as_slice() == sha.as_bytes() => {}
                other => return Err(BackendError::Reply(format!("SCRIPT LOAD: {other:?}"))),
            }
        }
        Ok(Script {
            conn,
            sha,
            function,
            scripts_only: Arc::new(AtomicBool::new(false)),
            id: next_limiter_id(),
        })
    }

    /// Whether `other` is this script on the same connection (a clone of it).
    pub(super) fn same_connection(&self, other: &Script) -> bool {
        self.id == other.id
    }

    /// The connection, for the commands that are not the script (a reset's `DEL`).
    pub(super) fn conn(&self) -> &Conn {
        &self.conn
    }

    /// Runs the script with `keys` and `args` ([`eval`]), given up after `timeout`: the
    /// caller then reports a timeout (a call cut off may still have run).
    pub(super) async fn call(
        &self,
        keys: &[String],
        args: &[String],
        reloads: &AtomicU64,
        resend_dropped: bool,
        timeout: Duration,
    ) -> Result<Result<Value, RedisError>, tokio::time::error::Elapsed> {
        // Relaxed: a hint; a call that misses it meets the same refusal and sets it again.
        let function = if self.scripts_only.load(Ordering::Relaxed) {
            None
        } else {
            self.function.as_ref()
        };
        let call = eval(
            &self.conn,
            function,
            &self.scripts_only,
            &self.sha,
            keys,
            args,
            reloads,
            resend_dropped,
        );
        tokio::time::timeout(timeout, call).await
    }
}

/// How a call is sent.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Send {
    /// `FCALL`, the function loaded when the limiter connected.
    Function,
    /// `FCALL`, once more after loading the function again.
    Reloaded,
    /// `EVALSHA`, the script loaded when the limiter connected.
    Sha,
    /// `EVAL` with the whole [`SOURCE`], which also caches the script.
    Source,
}

/// Whether `err` is Redis saying that the function called is not loaded.
fn function_missing(err: &RedisError) -> bool {
    err.code() == Some("ERR")
        && err
            .detail()
            .is_some_and(|d| d.starts_with("Function not found"))
}

/// Whether `err` is Redis refusing `FCALL` itself: no such command (before Redis 7), or an
/// ACL that does not let the user run it (not one that denies a key: the call's own error).
fn fcall_refused(err: &RedisError) -> bool {
    let detail = err.detail().unwrap_or("");
    match err.code() {
        Some("NOPERM") => detail.contains("'fcall'"),
        Some("ERR") => detail.starts_with("unknown command"),
        _ => false,
    }
}

/// Runs the script with `keys` and `args`: as `FCALL` of `function` when it was loaded as
/// one, else as `EVALSHA sha`. A function found missing (Redis restarted without
/// persistence, or ran `FUNCTION FLUSH`) is loaded again, once for all the calls that were
/// in flight then ([`Function::reload`]), and called once more; after
/// `NOSCRIPT` (Redis restarted, failed over, or ran `SCRIPT FLUSH`), or where loading the
/// function fails, the same call goes as `EVAL` with the [`SOURCE`], which also caches the
/// script. Each reload bumps `reloads`. Where Redis refuses `FCALL` itself (no such command,
/// or an ACL), the call goes as `EVALSHA` and `scripts_only` is set, so that every later
/// call does too; refused with `OOM`, this one call goes as `EVALSHA`.
///
/// A call is sent again after a reply that Redis gives *instead of* running the script
/// (`NOSCRIPT`, `MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`, `LOADING`, `MASTERDOWN`,
/// `READONLY`: the script writes only after every read, and a node that refuses writes
/// refuses the first), and, when `resend_dropped`, once after a dropped connection: the
/// connection manager then
/// hands out a fresh connection, so a limiter that sat idle through a Redis restart is
/// decided by Redis on its first call instead of failing over. A connection that dropped
/// after Redis ran the script but before its reply arrived makes that one resend spend the
/// call's permits twice: it can only refuse sooner, never admit beyond the limit. (A settle
/// is not resent so: a refund applied twice would give back more than was held.) A timeout
/// is never followed by a resend: the caller reports the failure instead. The cluster client
/// is built with no retries of its own for the same reason, so redirects are followed here:
/// `MOVED` by sending again (the client refreshes its slot map from the reply), `ASK` (a
/// slot being migrated, the key already on the importing node) by sending `ASKING` and the
/// call to the node the reply names.
#[allow(
    clippy::too_many_arguments,
    reason = "one call's whole context, passed once"
)]
async fn eval(
    conn: &Conn,
    function: Option<&Function>,
    scripts_only: &AtomicBool,
    sha: &str,
    keys: &[String],
    args: &[String],
    reloads: &AtomicU64,
    resend_dropped: bool,
) -> Result<Value, RedisError> {
    let mut send = if function.is_some() {
        Send::Function
    } else {
        Send::Sha
    };
    // Whether this call left the function for the script, which may never have been loaded.
    let mut fell_back = false;
    let mut attempt = 0;
    let mut reconnected = false;
    // Set by an ASK reply: the next attempt goes to that node, after ASKING.
    let mut asked: Option<Node> = None;
    // The function's reload attempts ended when this call was last sent as `FCALL`.
    let mut seen = 0;
    loop {
        let mut cmd = match (send, function) {
            (Send::Function | Send::Reloaded, Some(function)) => {
                seen = function.attempts_seen();
                let mut cmd = ::redis::cmd("FCALL");
                cmd.arg(&*function.name);
                cmd
            }
            (Send::Sha, _) => {
                let mut cmd = ::redis::cmd("EVALSHA");
                cmd.arg(sha);
                cmd
            }
            _ => {
                let mut cmd = ::redis::cmd("EVAL");
                cmd.arg(SOURCE);
                cmd
            }
        };
        cmd.arg(keys.len()).arg(keys).arg(args);
        let reply = match &asked {
            Some(node) => conn.query_asking(&cmd, node).await,
            None => conn.query(&cmd).await,
        };
        match reply {
            Err(err) if send == Send::Function && function_missing(&err) => {
                send = match function {
                    Some(function) => match function.reload(conn, seen).await {
                        Reload::Loaded => {
                            bump(reloads);
                            Send::Reloaded
                        }
                        Reload::LoadedBefore => Send::Reloaded,
                        Reload::Failed => Send::Source,
                    },
                    None => Send::Source,
                };
            }
            Err(err) if send == Send::Reloaded && function_missing(&err) => {
                send = Send::Source;
            }
            // Under `maxmemory` with `noeviction`, Redis refuses a function that may write
            // before it runs; a script runs, and only its first write is refused (after every
            // read, so nothing is written): sent as one, a refusal is still answered.
            Err(err)
                if matches!(send, Send::Function | Send::Reloaded) && err.code() == Some("OOM") =>
            {
                (send, fell_back) = (Send::Sha, true);
            }
            Err(err) if matches!(send, Send::Function | Send::Reloaded) && fcall_refused(&err) => {
                log::info!("tollgate: FCALL refused ({err}); using EVALSHA");
                // Relaxed: see `Script::call`.
                scripts_only.store(true, Ordering::Relaxed);
                (send, fell_back) = (Send::Sha, true);
            }
            Err(err)
                if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
                    && send == Send::Sha =>
            {
                // A script never loaded (the limiter loaded the function) is not lost.
                if !fell_back {
                    bump(reloads);
                }
                send = Send::Source;
            }
            // The connection was found dead (typically Redis restarted while this limiter
            // sat idle): the manager is already replacing it; send once more through it.
            Err(err) if err.is_connection_dropped() && resend_dropped && !reconnected => {
                reconnected = true;
            }
            Err(err) if did_not_run(&err) && attempt < RETRIES => {
                attempt += 1;
                match Node::asked_by(&err) {
                    // Follow the redirect at once: the slot is on its way to that node.
                    Some(node) => asked = Some(node),
                    None => {
                        // MOVED (the slot map is refreshed), or a node not ready: the owner as
                        // the client now knows it, after a pause.
                        asked = None;
                        tokio::time::sleep(Duration::from_millis(1 << attempt)).await;
                    }
                }
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
pub(super) fn is_unavailable(err: &RedisError) -> bool {
    did_not_run(err)
        || err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_timeout()
        || matches!(err.code(), Some("BUSY" | "OOM" | "NOREPLICAS"))
}

#[cfg(test)]
mod tests {
    use super::Node;

    fn parsed(address: &str) -> Option<(String, u16)> {
        Node::parse(address).map(|n| (n.host, n.port))
    }

    #[test]
    fn redirect_addresses() {
        assert_eq!(parsed("127.0.0.1:7001"), Some(("127.0.0.1".into(), 7001)));
        assert_eq!(
            parsed("redis-3.internal:6379"),
            Some(("redis-3.internal".into(), 6379))
        );
        assert_eq!(parsed("::1:7000"), Some(("::1".into(), 7000)));
        assert_eq!(
            parsed("[2001:db8::7]:7000"),
            Some(("2001:db8::7".into(), 7000))
        );
        assert_eq!(parsed(":7000"), None);
        assert_eq!(parsed("[]:7000"), None);
        assert_eq!(parsed("host:"), None);
        assert_eq!(parsed("host"), None);
    }
}
