//! Real `redis-server` processes for the Redis backend's tests: one server, or a 3-node
//! Redis Cluster, on free loopback ports, persistence off, killed (and their directories
//! removed) on drop.
//!
//! Without `redis-server` on PATH every test that needs one fails with a message saying how
//! to install it: no test is skipped silently.

use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What the tests say when the server is missing.
pub const MISSING: &str =
    "redis-server not found: run scripts/install-redis.sh (apt-get install redis-server)";

/// The path of `name` on PATH.
fn find(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

fn redis_server() -> PathBuf {
    find("redis-server").unwrap_or_else(|| panic!("{MISSING}"))
}

fn redis_cli() -> PathBuf {
    find("redis-cli").unwrap_or_else(|| panic!("redis-cli not found: {MISSING}"))
}

/// A fresh scratch directory for one server.
fn scratch_dir() -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "tollgate-redis-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    dir
}

/// `true` when `port` can be bound on loopback right now.
fn bindable(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// A port the OS considers free now.
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral loopback port")
}

/// A free port whose cluster bus port (+10000) is free too.
fn free_cluster_port() -> u16 {
    static SEED: AtomicU64 = AtomicU64::new(0);
    let mut x = u64::from(std::process::id()) * 7919
        + SEED.fetch_add(1, Ordering::Relaxed) * 104_729
        + u64::from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos(),
        );
    for _ in 0..1000 {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let port = 20_000 + ((x >> 33) % 30_000) as u16;
        if bindable(port) && bindable(port + 10_000) {
            return port;
        }
    }
    panic!("no free loopback port pair for a cluster node");
}

/// A reply to a raw command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Option<String>),
    Array(Vec<Reply>),
}

impl Reply {
    /// The integer of an integer reply.
    #[track_caller]
    pub fn int(&self) -> i64 {
        match self {
            Reply::Int(n) => *n,
            other => panic!("expected an integer reply, got {other:?}"),
        }
    }

    /// The text of a bulk or status reply.
    #[track_caller]
    pub fn text(&self) -> String {
        match self {
            Reply::Bulk(Some(s)) | Reply::Status(s) => s.clone(),
            other => panic!("expected a string reply, got {other:?}"),
        }
    }
}

fn read_reply(reader: &mut impl BufRead) -> std::io::Result<Reply> {
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let line = line.trim_end_matches(['\r', '\n']);
    let (kind, rest) = line.split_at(1.min(line.len()));
    let number = || rest.parse::<i64>().unwrap_or(-1);
    Ok(match kind {
        "+" => Reply::Status(rest.to_owned()),
        "-" => Reply::Error(rest.to_owned()),
        ":" => Reply::Int(number()),
        "$" if number() < 0 => Reply::Bulk(None),
        "$" => {
            let mut buf = vec![0; number() as usize + 2];
            reader.read_exact(&mut buf)?;
            buf.truncate(buf.len() - 2);
            Reply::Bulk(Some(String::from_utf8_lossy(&buf).into_owned()))
        }
        "*" => {
            let mut items = Vec::new();
            for _ in 0..number().max(0) {
                items.push(read_reply(reader)?);
            }
            Reply::Array(items)
        }
        _ => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("bad reply line {line:?}"),
            ))
        }
    })
}

/// Sends one command to `port` on a fresh connection and reads its reply.
pub fn command_at(port: u16, args: &[&str]) -> std::io::Result<Reply> {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut packet = format!("*{}\r\n", args.len());
    for arg in args {
        packet.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    stream.write_all(packet.as_bytes())?;
    read_reply(&mut BufReader::new(stream))
}

/// Polls until `port` answers PING, or panics after `limit`, showing the server's log.
fn wait_ready(port: u16, limit: Duration, log: &Path) {
    let start = Instant::now();
    loop {
        if let Ok(Reply::Status(pong)) = command_at(port, &["PING"]) {
            if pong == "PONG" {
                return;
            }
        }
        if start.elapsed() > limit {
            let log = std::fs::read_to_string(log).unwrap_or_default();
            panic!(
                "redis-server on port {port} did not answer PING within {limit:?}; its log:\n{log}"
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// One `redis-server` process.
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    cluster: bool,
    child: Option<Child>,
}

impl RedisServer {
    /// A standalone server on a free loopback port.
    pub fn start() -> RedisServer {
        for _ in 0..20 {
            let mut server = RedisServer {
                port: free_port(),
                dir: scratch_dir(),
                cluster: false,
                child: None,
            };
            if server.spawn().is_ok() {
                return server;
            }
        }
        panic!("could not start redis-server on a free port in 20 attempts");
    }

    /// A cluster-enabled node on a free port (and free bus port).
    fn start_cluster_node() -> RedisServer {
        for _ in 0..20 {
            let mut server = RedisServer {
                port: free_cluster_port(),
                dir: scratch_dir(),
                cluster: true,
                child: None,
            };
            if server.spawn().is_ok() {
                return server;
            }
        }
        panic!("could not start a cluster node on a free port in 20 attempts");
    }

    /// Starts the process on `self.port`; `Err` when it exits at once (port taken).
    fn spawn(&mut self) -> Result<(), ()> {
        let log = self.dir.join("redis.log");
        let mut cmd = Command::new(redis_server());
        cmd.arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--daemonize", "no"])
            .args(["--loglevel", "warning"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(&log);
        if self.cluster {
            cmd.args(["--cluster-enabled", "yes"])
                .args(["--cluster-config-file", "nodes.conf"])
                .args(["--cluster-node-timeout", "2000"]);
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{MISSING} ({e})"));
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = child.try_wait() {
                return Err(());
            }
            if matches!(command_at(self.port, &["PING"]), Ok(Reply::Status(ref s)) if s == "PONG") {
                self.child = Some(child);
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = child.kill();
        let _ = child.wait();
        wait_ready(self.port, Duration::ZERO, &log);
        Err(())
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The process id (while running).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the server is running").id()
    }

    /// Sends one command and returns its reply.
    #[track_caller]
    pub fn command(&self, args: &[&str]) -> Reply {
        command_at(self.port, args)
            .unwrap_or_else(|e| panic!("command {args:?} on port {}: {e}", self.port))
    }

    /// `field` (`calls`, `usec_per_call`, ...) of `command`'s line in `INFO commandstats`
    /// (`fcall`, `evalsha`, `eval`): since the start or the last `CONFIG RESETSTAT`; 0 when
    /// the server ran no such command.
    pub fn command_stat(&self, command: &str, field: &str) -> f64 {
        let stats = self.command(&["INFO", "commandstats"]).text();
        let line = format!("cmdstat_{command}:");
        let field = format!("{field}=");
        stats
            .lines()
            .find_map(|l| l.strip_prefix(line.as_str()))
            .and_then(|rest| rest.split(',').find_map(|f| f.strip_prefix(field.as_str())))
            .map_or(0.0, |value| value.parse().unwrap())
    }

    /// Kills the process (SIGKILL, as a crash) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, empty (persistence is off).
    pub fn restart(&mut self) {
        self.kill();
        let start = Instant::now();
        while self.spawn().is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "could not restart redis-server on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Pauses the process (SIGSTOP): it keeps its connections but answers nothing.
    pub fn pause(&self) {
        signal(self.pid(), "-STOP");
    }

    /// Resumes a paused process (SIGCONT).
    pub fn resume(&self) {
        signal(self.pid(), "-CONT");
    }
}

fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .arg(sig)
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {sig} {pid} failed");
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A 3-node Redis Cluster (3 primaries, no replicas), slots spread by `redis-cli --cluster
/// create`.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three nodes, joins them, and waits until every node reports the cluster ok.
    pub fn start() -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..3).map(|_| RedisServer::start_cluster_node()).collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let output = Command::new(redis_cli())
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed:\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let start = Instant::now();
        for node in &nodes {
            loop {
                let info = node.command(&["CLUSTER", "INFO"]).text();
                if info.contains("cluster_state:ok") && info.contains("cluster_slots_ok:16384") {
                    break;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(30),
                    "the cluster did not become ok:\n{info}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        RedisCluster { nodes }
    }

    /// The nodes' URLs.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The nodes.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }
}
