//! The TCP rendezvous key-value store: rank 0 serves, every rank (rank 0 included) is a client.
//!
//! This module owns the store's wire protocol, its server (threads in rank 0's process), its
//! client ([`Store`]), the [`KvStore`] trait the communicators program against, and an
//! in-process [`MemoryStore`] for tests. It is what ranks use to exchange the little they must
//! agree on before they can talk directly (an NCCL unique id, the CPU backend's addresses) and
//! to wait for one another ([`Store::barrier`]).
//!
//! # Protocol
//!
//! Every message is a frame: a little-endian `u32` length, then that many bytes: one opcode
//! byte and the payload. Strings and byte strings inside payloads are `u32`-length-prefixed;
//! integers are little-endian. A client's first frame is a hello: [`PROTOCOL_MAGIC`],
//! [`PROTOCOL_VERSION`], world size, rank, flags and run id. The server checks each against
//! its own and answers OK or an error that says what differs; a connection whose first bytes
//! are not a hello (an HTTP request, a port scanner, garbage) is logged and closed, and the
//! server goes on serving. Keys are at most [`MAX_KEY_LEN`] bytes, values at most
//! [`MAX_VALUE_LEN`].
//!
//! Blocking operations (`get`, `wait`, `barrier`) carry their timeout; the server parks the
//! request until it can answer or the timeout passes, and then answers with who is missing
//! (ranks that never joined, ranks that disconnected, ranks that have not reached the barrier,
//! hellos it rejected), so timeouts name the culprits. Nothing polls over the network.
//!
//! # Life cycle
//!
//! Rank 0's [`Store::connect`] binds, starts the server (an accept thread and one thread per
//! connection), and connects to itself. Other ranks connect with exponential backoff until the
//! configured timeout. When a rank's connection closes, the server notes it; ranks waiting in
//! a barrier for it fail at once. When rank 0's process dies, the other ranks' connections
//! close and their next (or current) operation fails with "the master closed the connection".
//! Dropping rank 0's [`Store`] waits up to a short grace period (the store timeout, at most
//! 5 s) for the other ranks to disconnect, then closes every connection and joins every
//! server thread; dropping never hangs.
//!
//! A [`Store`] is `Send + Sync`. It keeps a small pool of connections: a thread that calls
//! while another thread's call is in flight (say, parked in `get`) opens another connection
//! instead of waiting behind it.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use flotilla_contract::rank::RankInfo;

/// First bytes of every hello payload.
pub const PROTOCOL_MAGIC: [u8; 8] = *b"FLOTSTOR";
/// Version of the wire protocol; client and server must agree.
pub const PROTOCOL_VERSION: u32 = 1;
/// Longest key (and barrier name), in bytes.
pub const MAX_KEY_LEN: usize = 4096;
/// Largest value, in bytes.
pub const MAX_VALUE_LEN: usize = 64 << 20;
/// Longest run id, in bytes.
pub const MAX_RUN_ID_LEN: usize = 1024;

/// Largest frame accepted before a hello succeeded (so garbage cannot make us allocate).
const MAX_HELLO_FRAME: usize = 64 + MAX_RUN_ID_LEN;
/// Largest frame accepted after the hello.
const MAX_FRAME: usize = MAX_VALUE_LEN + MAX_KEY_LEN + 64;
/// Most keys one `wait` may name.
const MAX_WAIT_KEYS: usize = 65536;
/// How much longer than an operation's timeout a client waits for the server's answer.
const RESPONSE_SLACK: Duration = Duration::from_secs(5);
/// Longest grace period rank 0's drop gives the other ranks to disconnect.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Timeouts are capped here so deadlines never overflow.
const MAX_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);
/// Longest single connection attempt.
const MAX_CONNECT_ATTEMPT: Duration = Duration::from_secs(5);
/// Rejected hellos remembered for timeout messages.
const MAX_REJECTIONS: usize = 16;

mod op {
    pub const HELLO: u8 = 0x01;
    pub const SET: u8 = 0x02;
    pub const GET: u8 = 0x03;
    pub const ADD: u8 = 0x04;
    pub const WAIT: u8 = 0x05;
    pub const DELETE: u8 = 0x06;
    pub const BARRIER: u8 = 0x07;

    pub const OK: u8 = 0x80;
    pub const VALUE: u8 = 0x81;
    pub const INT: u8 = 0x82;
    pub const BOOL: u8 = 0x83;
    pub const TIMEOUT: u8 = 0x84;
    pub const ERR: u8 = 0x85;
}

/// Kinds of `ERR` answers.
mod err_kind {
    pub const REJECTED: u8 = 1;
    pub const BAD_REQUEST: u8 = 2;
    pub const REFUSED: u8 = 3;
    pub const SHUTTING_DOWN: u8 = 4;
    pub const PEER_LEFT: u8 = 5;
}

/// Hello flag: this is the rank's first connection (the one the server tracks for joins).
const FLAG_PRIMARY: u8 = 1;

// ---------------------------------------------------------------------------------------------
// Configuration and errors
// ---------------------------------------------------------------------------------------------

/// Where the store is and who this process is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// The master's host (MASTER_ADDR); clients connect here.
    pub host: String,
    /// The master's port (MASTER_PORT); 0 lets rank 0 pick a free one (see [`Store::port`]).
    pub port: u16,
    /// This process's rank.
    pub rank: usize,
    /// Number of ranks.
    pub world_size: usize,
    /// Identifies the job; a process with another run id is turned away.
    pub run_id: String,
    /// How long to wait to connect, and for blocking operations (`get`, `wait`, `barrier`).
    pub timeout: Duration,
    /// Where rank 0 listens; `None` means `host`. Use `0.0.0.0` to listen everywhere.
    pub bind_addr: Option<String>,
}

impl StoreConfig {
    /// The configuration for a discovered rank.
    pub fn from_rank_info(info: &RankInfo, run_id: impl Into<String>, timeout: Duration) -> Self {
        StoreConfig {
            host: info.master_addr.clone(),
            port: info.master_port,
            rank: info.rank,
            world_size: info.world_size,
            run_id: run_id.into(),
            timeout,
            bind_addr: None,
        }
    }
}

/// What went wrong with the store, precisely.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The configuration cannot work.
    #[error("invalid store configuration: {0}")]
    Config(String),
    /// Rank 0 could not listen.
    #[error("cannot bind {addr}: {reason}{hint}")]
    Bind {
        addr: String,
        reason: String,
        hint: String,
    },
    /// A rank could not connect to the master.
    #[error("cannot reach master {addr} after {} ({reason})", secs(*.waited))]
    Unreachable {
        addr: String,
        waited: Duration,
        reason: String,
    },
    /// The master turned this process away.
    #[error("the master {addr} rejected this process: {reason}")]
    Rejected { addr: String, reason: String },
    /// Something at the master's address is not a flotilla store.
    #[error("protocol error with {addr}: {detail}")]
    Protocol { addr: String, detail: String },
    /// The connection closed under an operation.
    #[error("the master closed the connection (rank 0 exited?) during {op} on {addr}")]
    MasterClosed { addr: String, op: String },
    /// The master is stopping and serves nothing new.
    #[error("the master {addr} is shutting down (rank 0 is exiting) during {op}")]
    ShuttingDown { addr: String, op: String },
    /// The master did not answer at all (it is stuck, or the network is).
    #[error("the master {addr} did not answer {op} within {}", secs(*.waited))]
    NoAnswer {
        addr: String,
        op: String,
        waited: Duration,
    },
    /// A blocking operation timed out; `detail` says who is missing, `missing` lists them.
    #[error("{op} timed out after {}: {detail}", secs(*.waited))]
    Timeout {
        op: String,
        waited: Duration,
        detail: String,
        missing: Vec<usize>,
    },
    /// A rank this operation needs has left.
    #[error("{op} failed: {detail}")]
    PeerLeft { op: String, detail: String },
    /// The master refused the operation (for instance, `add` on a key that is not a counter).
    #[error("{op} refused: {reason}")]
    Refused { op: String, reason: String },
    /// A key or value is over the limit.
    #[error("{what} is {len} bytes, over the limit of {limit} bytes")]
    TooLarge {
        what: String,
        len: usize,
        limit: usize,
    },
    /// Any other I/O error.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
}

/// `12 s`, `2.5 s`, `300 s`.
fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if d < Duration::from_millis(100) {
        format!("{} ms", d.as_millis())
    } else if s >= 10.0 {
        format!("{s:.0} s")
    } else {
        let t = format!("{s:.1}");
        format!("{} s", t.strip_suffix(".0").unwrap_or(&t))
    }
}

/// `2`, `2,3`, `2-5,9` (runs of three or more become ranges).
fn format_ranks(ranks: &[usize]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        if !out.is_empty() {
            out.push(',');
        }
        if j >= i + 2 {
            let _ = write!(out, "{}-{}", ranks[i], ranks[j]);
        } else {
            let _ = write!(out, "{}", ranks[i]);
            if j == i + 1 {
                let _ = write!(out, ",{}", ranks[j]);
            }
        }
        i = j + 1;
    }
    out
}

/// `rank 2 of 4`, `ranks 2,3 of 4`.
fn ranks_of(ranks: &[usize], world: usize) -> String {
    let noun = if ranks.len() == 1 { "rank" } else { "ranks" };
    format!("{noun} {} of {world}", format_ranks(ranks))
}

/// A key for messages: quoted, shortened if long.
fn show_key(key: &str) -> String {
    if key.chars().count() > 80 {
        let head: String = key.chars().take(77).collect();
        format!("'{head}...'")
    } else {
        format!("'{key}'")
    }
}

fn show_keys(keys: &[&str]) -> String {
    let mut shown: Vec<String> = keys.iter().take(5).map(|k| show_key(k)).collect();
    if keys.len() > 5 {
        shown.push(format!("and {} more", keys.len() - 5));
    }
    shown.join(", ")
}

/// A short, printable view of bytes received where a protocol message was expected.
fn show_bytes(b: &[u8]) -> String {
    let mut s = String::from("\"");
    for &c in b.iter().take(16) {
        match c {
            b' '..=b'~' if c != b'"' && c != b'\\' => s.push(c as char),
            b'\r' => s.push_str("\\r"),
            b'\n' => s.push_str("\\n"),
            _ => {
                let _ = write!(s, "\\x{c:02x}");
            }
        }
    }
    s.push('"');
    s
}

fn looks_like_http(head: &[u8]) -> bool {
    [
        &b"GET "[..],
        b"POST",
        b"HEAD",
        b"PUT ",
        b"OPTI",
        b"DELE",
        b"CONN",
        b"PRI ",
        b"HTTP",
    ]
    .iter()
    .any(|m| head.starts_with(m))
}

fn check_key(what: &str, key: &str) -> Result<(), StoreError> {
    if key.len() > MAX_KEY_LEN {
        return Err(StoreError::TooLarge {
            what: format!("{what} {}", show_key(key)),
            len: key.len(),
            limit: MAX_KEY_LEN,
        });
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves consistent data; keep serving.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

// ---------------------------------------------------------------------------------------------
// Wire encoding
// ---------------------------------------------------------------------------------------------

/// Builds one frame.
struct Enc(Vec<u8>);

impl Enc {
    fn new(opcode: u8) -> Enc {
        Enc(vec![0, 0, 0, 0, opcode])
    }
    fn u8(mut self, v: u8) -> Enc {
        self.0.push(v);
        self
    }
    fn u32(mut self, v: u32) -> Enc {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Enc {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn i64(mut self, v: i64) -> Enc {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(self, v: &[u8]) -> Enc {
        let mut e = self.u32(v.len() as u32);
        e.0.extend_from_slice(v);
        e
    }
    fn str(self, v: &str) -> Enc {
        self.bytes(v.as_bytes())
    }
    fn raw(mut self, v: &[u8]) -> Enc {
        self.0.extend_from_slice(v);
        self
    }
    fn finish(mut self) -> Vec<u8> {
        let len = (self.0.len() - 4) as u32;
        self.0[..4].copy_from_slice(&len.to_le_bytes());
        self.0
    }
}

/// Reads a payload.
struct Dec<'a> {
    buf: &'a [u8],
}

impl<'a> Dec<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.buf.len() < n {
            return Err(format!(
                "message truncated (wanted {n} more bytes, have {})",
                self.buf.len()
            ));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn i64(&mut self) -> Result<i64, String> {
        Ok(i64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn str(&mut self) -> Result<String, String> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec()).map_err(|_| "a string is not UTF-8".to_string())
    }
    fn key(&mut self) -> Result<String, String> {
        let k = self.str()?;
        if k.len() > MAX_KEY_LEN {
            return Err(format!(
                "key of {} bytes is over the limit of {MAX_KEY_LEN}",
                k.len()
            ));
        }
        Ok(k)
    }
    fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }
    fn end(&self) -> Result<(), String> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(format!("{} unexpected trailing bytes", self.buf.len()))
        }
    }
}

#[derive(Debug)]
enum FrameError {
    /// The peer closed the connection cleanly before a new frame.
    Closed,
    /// The announced length is zero or over the limit; `head` are the first four bytes.
    BadLength {
        len: u32,
        head: [u8; 4],
    },
    Io(io::Error),
}

fn read_frame(r: &mut impl Read, limit: usize) -> Result<(u8, Vec<u8>), FrameError> {
    let mut head = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut head[got..]) {
            Ok(0) if got == 0 => return Err(FrameError::Closed),
            Ok(0) => return Err(FrameError::Io(io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    let len = u32::from_le_bytes(head);
    if len == 0 || len as usize > limit {
        return Err(FrameError::BadLength { len, head });
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body).map_err(FrameError::Io)?;
    let opcode = body[0];
    body.remove(0);
    Ok((opcode, body))
}

fn err_frame(kind: u8, message: &str) -> Vec<u8> {
    Enc::new(op::ERR).u8(kind).str(message).finish()
}

fn timeout_frame(missing: &[usize], detail: &str) -> Vec<u8> {
    let mut e = Enc::new(op::TIMEOUT).u32(missing.len() as u32);
    for &r in missing {
        e = e.u32(r as u32);
    }
    e.str(detail).finish()
}

// ---------------------------------------------------------------------------------------------
// The table (shared by the server and MemoryStore)
// ---------------------------------------------------------------------------------------------

#[derive(Default)]
struct Table {
    kv: HashMap<String, Arc<[u8]>>,
    barriers: HashMap<String, BarrierState>,
}

/// Generation counting: each rank numbers its calls of a barrier name 1, 2, 3, …; generation
/// `g` completes when all ranks arrived with `g`.
#[derive(Default)]
struct BarrierState {
    completed: u64,
    arrived: HashMap<u64, BTreeSet<usize>>,
}

impl Table {
    fn add(&mut self, key: &str, delta: i64) -> Result<i64, String> {
        let current = match self.kv.get(key) {
            None => 0,
            Some(v) => std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.parse::<i64>().ok())
                .ok_or_else(|| {
                    let shown = match std::str::from_utf8(v) {
                        Ok(s) if s.len() <= 40 => format!("'{s}'"),
                        _ => format!("{} bytes of data", v.len()),
                    };
                    format!(
                        "key {} holds {shown}, which is not a counter (add keeps a decimal integer)",
                        show_key(key)
                    )
                })?,
        };
        let new = current.checked_add(delta).ok_or_else(|| {
            format!(
                "adding {delta} to key {} (now {current}) overflows a 64-bit counter",
                show_key(key)
            )
        })?;
        self.kv
            .insert(key.to_string(), Arc::from(new.to_string().into_bytes()));
        Ok(new)
    }

    fn missing_keys<'k>(&self, keys: &'k [String]) -> Vec<&'k str> {
        keys.iter()
            .filter(|k| !self.kv.contains_key(k.as_str()))
            .map(|k| k.as_str())
            .collect()
    }

    /// Record `rank`'s arrival at generation `generation`; true when it is complete.
    fn arrive(&mut self, name: &str, generation: u64, rank: usize, world: usize) -> bool {
        let b = self.barriers.entry(name.to_string()).or_default();
        if generation <= b.completed {
            return true;
        }
        let set = b.arrived.entry(generation).or_default();
        set.insert(rank);
        if set.len() >= world {
            b.completed = b.completed.max(generation);
            let done = b.completed;
            b.arrived.retain(|g, _| *g > done);
            true
        } else {
            false
        }
    }

    fn barrier_done(&self, name: &str, generation: u64) -> bool {
        self.barriers
            .get(name)
            .is_some_and(|b| b.completed >= generation)
    }

    fn arrived(&self, name: &str, generation: u64) -> BTreeSet<usize> {
        self.barriers
            .get(name)
            .and_then(|b| b.arrived.get(&generation))
            .cloned()
            .unwrap_or_default()
    }
}

// ---------------------------------------------------------------------------------------------
// Server
// ---------------------------------------------------------------------------------------------

struct ServerShared {
    world_size: usize,
    run_id: String,
    started: Instant,
    hello_timeout: Duration,
    state: Mutex<ServerState>,
    changed: Condvar,
    stop: AtomicBool,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

#[derive(Default)]
struct ServerState {
    table: Table,
    /// Ranks that ever completed a hello.
    joined: BTreeSet<usize>,
    /// Ranks whose primary connection is open: rank → (connection id, peer).
    connected: HashMap<usize, (u64, SocketAddr)>,
    /// Every open connection, so shutdown can close them.
    conns: HashMap<u64, TcpStream>,
    next_conn: u64,
    /// Why recent hellos were turned away (for timeout messages).
    rejections: Vec<String>,
    /// Shutting down: no new joins.
    closing: bool,
    /// Stopped: every request fails.
    stopped: bool,
}

/// What a client said in its hello.
struct Hello {
    rank: usize,
    primary: bool,
}

impl ServerShared {
    fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    /// Ranks missing for an operation, and a sentence saying so. With `arrived`, the operation
    /// is a barrier and ranks that have not arrived are missing too.
    fn who_is_missing(
        &self,
        st: &ServerState,
        arrived: Option<&BTreeSet<usize>>,
    ) -> (Vec<usize>, String) {
        let world = self.world_size;
        let never: Vec<usize> = (0..world).filter(|r| !st.joined.contains(r)).collect();
        // For a barrier, a rank that arrived and then left is not the one holding it up.
        let left: Vec<usize> = (0..world)
            .filter(|r| st.joined.contains(r) && !st.connected.contains_key(r))
            .filter(|r| arrived.is_none_or(|a| !a.contains(r)))
            .collect();
        let mut parts = Vec::new();
        if !never.is_empty() {
            parts.push(format!(
                "{} did not join within {}",
                ranks_of(&never, world),
                secs(self.uptime())
            ));
        }
        if !left.is_empty() {
            parts.push(format!("{} disconnected", ranks_of(&left, world)));
        }
        let missing: Vec<usize> = match arrived {
            Some(arrived) => {
                let waiting: Vec<usize> = (0..world)
                    .filter(|r| st.connected.contains_key(r) && !arrived.contains(r))
                    .collect();
                if !waiting.is_empty() {
                    parts.push(format!(
                        "{} joined but did not reach the barrier",
                        ranks_of(&waiting, world)
                    ));
                }
                (0..world).filter(|r| !arrived.contains(r)).collect()
            }
            None => never.iter().chain(left.iter()).copied().collect(),
        };
        if !st.rejections.is_empty() {
            parts.push(format!(
                "the master turned away: {}",
                st.rejections.join("; ")
            ));
        }
        (missing, parts.join("; "))
    }

    fn reject(&self, stream: &mut TcpStream, peer: SocketAddr, kind: u8, reason: String) {
        tracing::error!("store: turned away {peer}: {reason}");
        if kind == err_kind::REJECTED {
            let mut st = lock(&self.state);
            if !st.rejections.contains(&reason) {
                if st.rejections.len() >= MAX_REJECTIONS {
                    st.rejections.remove(0);
                }
                st.rejections.push(reason.clone());
            }
            drop(st);
            self.changed.notify_all();
        }
        let _ = stream.write_all(&err_frame(kind, &reason));
    }

    /// Read and check the hello. On success the rank is registered (if primary) and OK is sent.
    fn handshake(&self, stream: &mut TcpStream, id: u64, peer: SocketAddr) -> Option<Hello> {
        let _ = stream.set_read_timeout(Some(self.hello_timeout));
        let (opcode, payload) = match read_frame(stream, MAX_HELLO_FRAME) {
            Ok(frame) => frame,
            Err(FrameError::Closed) => {
                tracing::debug!("store: {peer} connected and closed without a hello");
                return None;
            }
            Err(FrameError::BadLength { len, head }) => {
                let what = if looks_like_http(&head) {
                    " (an HTTP request?)"
                } else {
                    ""
                };
                tracing::warn!(
                    "store: ignored a connection from {peer} that does not speak the store \
                     protocol: its first bytes {}{what} announce a {len}-byte frame",
                    show_bytes(&head)
                );
                return None;
            }
            Err(FrameError::Io(e)) => {
                if !self.stop.load(Ordering::SeqCst) {
                    tracing::warn!(
                        "store: ignored a connection from {peer} that sent no complete hello: {e}"
                    );
                }
                return None;
            }
        };
        if opcode != op::HELLO || !payload.starts_with(&PROTOCOL_MAGIC) {
            let mut head = vec![opcode];
            head.extend_from_slice(&payload[..payload.len().min(12)]);
            tracing::warn!(
                "store: ignored a connection from {peer} that does not speak the store protocol \
                 (its first message starts {})",
                show_bytes(&head)
            );
            return None;
        }
        let mut d = Dec {
            buf: &payload[PROTOCOL_MAGIC.len()..],
        };
        let parsed = (|| -> Result<(u32, u32, u32, u8, String), String> {
            let version = d.u32()?;
            if version != PROTOCOL_VERSION {
                return Ok((version, 0, 0, 0, String::new()));
            }
            let world = d.u32()?;
            let rank = d.u32()?;
            let flags = d.u8()?;
            let run_id = d.str()?;
            d.end()?;
            Ok((version, world, rank, flags, run_id))
        })();
        let (version, world, rank, flags, run_id) = match parsed {
            Ok(h) => h,
            Err(e) => {
                self.reject(
                    stream,
                    peer,
                    err_kind::BAD_REQUEST,
                    format!("malformed hello: {e}"),
                );
                return None;
            }
        };
        if version != PROTOCOL_VERSION {
            self.reject(
                stream,
                peer,
                err_kind::REJECTED,
                format!(
                    "a process at {peer} speaks store protocol version {version}, the master \
                     {PROTOCOL_VERSION} (different flotilla builds?)"
                ),
            );
            return None;
        }
        let (world, rank) = (world as usize, rank as usize);
        let mut problems = Vec::new();
        if run_id != self.run_id {
            problems.push(format!(
                "rank {rank} has run id '{run_id}', the master '{}'",
                self.run_id
            ));
        }
        if world != self.world_size {
            problems.push(format!(
                "rank {rank} joined with world size {world}, but the master expects {}",
                self.world_size
            ));
        } else if rank >= world {
            problems.push(format!("rank {rank} is not below the world size {world}"));
        }
        if !problems.is_empty() {
            self.reject(stream, peer, err_kind::REJECTED, problems.join("; "));
            return None;
        }
        let primary = flags & FLAG_PRIMARY != 0;
        {
            let mut st = lock(&self.state);
            if st.closing || st.stopped {
                drop(st);
                self.reject(
                    stream,
                    peer,
                    err_kind::SHUTTING_DOWN,
                    format!("rank {rank} joined while the master is shutting down"),
                );
                return None;
            }
            if primary {
                if let Some((_, other)) = st.connected.get(&rank) {
                    let reason = format!(
                        "rank {rank} is already connected from {other}, and {peer} claims it too \
                         (two processes with the same rank?)"
                    );
                    drop(st);
                    self.reject(stream, peer, err_kind::REJECTED, reason);
                    return None;
                }
                st.connected.insert(rank, (id, peer));
                let first = st.joined.insert(rank);
                let n = st.joined.len();
                if first {
                    tracing::debug!(
                        "store: rank {rank} joined from {peer} ({n}/{})",
                        self.world_size
                    );
                    if n == self.world_size {
                        tracing::info!(
                            "store: all {} ranks joined after {}",
                            self.world_size,
                            secs(self.uptime())
                        );
                    }
                } else {
                    tracing::info!("store: rank {rank} reconnected from {peer}");
                }
            }
        }
        self.changed.notify_all();
        if stream.write_all(&Enc::new(op::OK).finish()).is_err() {
            return Some(Hello { rank, primary }); // the caller's read fails and cleans up
        }
        let _ = stream.set_read_timeout(None);
        Some(Hello { rank, primary })
    }

    /// Serve one connection until it closes.
    fn serve(&self, mut stream: TcpStream, id: u64, peer: SocketAddr) {
        let _ = stream.set_nodelay(true);
        let hello = self.handshake(&mut stream, id, peer);
        if let Some(hello) = &hello {
            loop {
                let (opcode, payload) = match read_frame(&mut stream, MAX_FRAME) {
                    Ok(frame) => frame,
                    Err(FrameError::Closed) => break,
                    Err(e) => {
                        if !self.stop.load(Ordering::SeqCst) {
                            tracing::warn!(
                                "store: dropping rank {}'s connection: {e:?}",
                                hello.rank
                            );
                        }
                        break;
                    }
                };
                let (reply, close) = match self.handle(hello.rank, opcode, &payload) {
                    Ok(reply) => (reply, false),
                    Err(bad) => {
                        tracing::warn!(
                            "store: bad request from rank {} ({peer}): {bad}",
                            hello.rank
                        );
                        (err_frame(err_kind::BAD_REQUEST, &bad), true)
                    }
                };
                if stream.write_all(&reply).is_err() || close {
                    break;
                }
            }
        }
        let _ = stream.shutdown(Shutdown::Both);
        let mut st = lock(&self.state);
        st.conns.remove(&id);
        if let Some(hello) = hello.filter(|h| h.primary) {
            if st
                .connected
                .get(&hello.rank)
                .is_some_and(|(cid, _)| *cid == id)
            {
                st.connected.remove(&hello.rank);
                if !st.stopped && hello.rank != 0 {
                    tracing::info!("store: rank {} disconnected", hello.rank);
                }
            }
        }
        drop(st);
        self.changed.notify_all();
    }

    /// Answer one request. `Err` is a malformed request (the connection is then closed).
    fn handle(&self, rank: usize, opcode: u8, payload: &[u8]) -> Result<Vec<u8>, String> {
        let mut d = Dec { buf: payload };
        match opcode {
            op::SET => {
                let key = d.key()?;
                let value = d.rest();
                if value.len() > MAX_VALUE_LEN {
                    return Err(format!("value of {} bytes is over the limit", value.len()));
                }
                let value: Arc<[u8]> = Arc::from(value);
                let mut st = lock(&self.state);
                if st.stopped {
                    return Ok(err_frame(
                        err_kind::SHUTTING_DOWN,
                        "the master is shutting down",
                    ));
                }
                st.table.kv.insert(key, value);
                drop(st);
                self.changed.notify_all();
                Ok(Enc::new(op::OK).finish())
            }
            op::ADD => {
                let delta = d.i64()?;
                let key = d.key()?;
                d.end()?;
                let mut st = lock(&self.state);
                if st.stopped {
                    return Ok(err_frame(
                        err_kind::SHUTTING_DOWN,
                        "the master is shutting down",
                    ));
                }
                let result = st.table.add(&key, delta);
                drop(st);
                match result {
                    Ok(n) => {
                        self.changed.notify_all();
                        Ok(Enc::new(op::INT).i64(n).finish())
                    }
                    Err(reason) => Ok(err_frame(err_kind::REFUSED, &reason)),
                }
            }
            op::DELETE => {
                let key = d.key()?;
                d.end()?;
                let existed = lock(&self.state).table.kv.remove(&key).is_some();
                Ok(Enc::new(op::BOOL).u8(existed as u8).finish())
            }
            op::GET => {
                let timeout = Duration::from_millis(d.u64()?).min(MAX_TIMEOUT);
                let key = d.key()?;
                d.end()?;
                let deadline = Instant::now() + timeout;
                let mut st = lock(&self.state);
                loop {
                    if st.stopped {
                        return Ok(err_frame(
                            err_kind::SHUTTING_DOWN,
                            "the master is shutting down",
                        ));
                    }
                    if let Some(v) = st.table.kv.get(&key).cloned() {
                        drop(st);
                        return Ok(Enc::new(op::VALUE).raw(&v).finish());
                    }
                    let now = Instant::now();
                    if now >= deadline {
                        let (missing, who) = self.who_is_missing(&st, None);
                        let detail = if who.is_empty() && self.world_size == 1 {
                            "no rank set it".to_string()
                        } else if who.is_empty() {
                            format!("no rank set it (all {} ranks joined)", self.world_size)
                        } else {
                            format!("no rank set it; {who}")
                        };
                        return Ok(timeout_frame(&missing, &detail));
                    }
                    st = self
                        .changed
                        .wait_timeout(st, deadline - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
            op::WAIT => {
                let timeout = Duration::from_millis(d.u64()?).min(MAX_TIMEOUT);
                let n = d.u32()? as usize;
                if n > MAX_WAIT_KEYS {
                    return Err(format!(
                        "wait for {n} keys is over the limit of {MAX_WAIT_KEYS}"
                    ));
                }
                let keys = (0..n).map(|_| d.key()).collect::<Result<Vec<_>, _>>()?;
                d.end()?;
                let deadline = Instant::now() + timeout;
                let mut st = lock(&self.state);
                loop {
                    if st.stopped {
                        return Ok(err_frame(
                            err_kind::SHUTTING_DOWN,
                            "the master is shutting down",
                        ));
                    }
                    let absent = st.table.missing_keys(&keys);
                    if absent.is_empty() {
                        return Ok(Enc::new(op::OK).finish());
                    }
                    let now = Instant::now();
                    if now >= deadline {
                        let (missing, who) = self.who_is_missing(&st, None);
                        let mut detail = format!("never set: {}", show_keys(&absent));
                        if !who.is_empty() {
                            let _ = write!(detail, "; {who}");
                        }
                        return Ok(timeout_frame(&missing, &detail));
                    }
                    st = self
                        .changed
                        .wait_timeout(st, deadline - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
            op::BARRIER => {
                let timeout = Duration::from_millis(d.u64()?).min(MAX_TIMEOUT);
                let generation = d.u64()?;
                let name = d.key()?;
                d.end()?;
                let deadline = Instant::now() + timeout;
                let mut st = lock(&self.state);
                if st.table.arrive(&name, generation, rank, self.world_size) {
                    drop(st);
                    self.changed.notify_all();
                    return Ok(Enc::new(op::OK).finish());
                }
                loop {
                    if st.table.barrier_done(&name, generation) {
                        return Ok(Enc::new(op::OK).finish());
                    }
                    if st.stopped {
                        return Ok(err_frame(
                            err_kind::SHUTTING_DOWN,
                            "the master is shutting down",
                        ));
                    }
                    let arrived = st.table.arrived(&name, generation);
                    let gone: Vec<usize> = (0..self.world_size)
                        .filter(|r| {
                            st.joined.contains(r)
                                && !st.connected.contains_key(r)
                                && !arrived.contains(r)
                        })
                        .collect();
                    if !gone.is_empty() {
                        let detail = format!(
                            "{} disconnected (exited or crashed?) before reaching barrier {}",
                            ranks_of(&gone, self.world_size),
                            show_key(&name)
                        );
                        return Ok(err_frame(err_kind::PEER_LEFT, &detail));
                    }
                    let now = Instant::now();
                    if now >= deadline {
                        let (missing, detail) = self.who_is_missing(&st, Some(&arrived));
                        return Ok(timeout_frame(&missing, &detail));
                    }
                    st = self
                        .changed
                        .wait_timeout(st, deadline - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
            other => Err(format!("unknown opcode 0x{other:02x}")),
        }
    }
}

/// Rank 0's server: the accept thread and the connection threads.
struct Server {
    shared: Arc<ServerShared>,
    accept: Option<JoinHandle<()>>,
    /// Where to connect to wake the accept thread.
    wake: SocketAddr,
    grace: Duration,
}

impl Server {
    fn start(
        listener: TcpListener,
        world_size: usize,
        run_id: String,
        timeout: Duration,
    ) -> io::Result<Server> {
        let local = listener.local_addr()?;
        let shared = Arc::new(ServerShared {
            world_size,
            run_id,
            started: Instant::now(),
            hello_timeout: timeout.clamp(Duration::from_secs(1), Duration::from_secs(60)),
            state: Mutex::new(ServerState::default()),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            threads: Mutex::new(Vec::new()),
        });
        let accept_shared = Arc::clone(&shared);
        let accept = std::thread::Builder::new()
            .name("store-accept".into())
            .spawn(move || accept_loop(accept_shared, listener))?;
        Ok(Server {
            shared,
            accept: Some(accept),
            wake: connectable(local),
            grace: timeout.min(SHUTDOWN_GRACE),
        })
    }

    /// Wait (up to the grace period) for the ranks to disconnect, then close everything and
    /// join every thread.
    fn shutdown(&mut self) {
        let Some(accept) = self.accept.take() else {
            return;
        };
        let shared = &self.shared;
        let deadline = Instant::now() + self.grace;
        let mut st = lock(&shared.state);
        st.closing = true;
        while !st.connected.is_empty() {
            let now = Instant::now();
            if now >= deadline {
                let mut still: Vec<usize> = st.connected.keys().copied().collect();
                still.sort_unstable();
                tracing::warn!(
                    "store: closing while {} still connected (waited {})",
                    ranks_of(&still, shared.world_size),
                    secs(self.grace)
                );
                break;
            }
            st = shared
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        st.stopped = true;
        for conn in st.conns.values() {
            let _ = conn.shutdown(Shutdown::Both);
        }
        drop(st);
        shared.stop.store(true, Ordering::SeqCst);
        shared.changed.notify_all();
        // Wake the accept thread; it sees the stop flag and exits, closing the listener. (If
        // the wake-up cannot connect, the thread may already be gone: give it a moment.)
        let woke = TcpStream::connect_timeout(&self.wake, Duration::from_secs(1));
        let give_up = Instant::now() + Duration::from_secs(1);
        while woke.is_err() && !accept.is_finished() && Instant::now() < give_up {
            std::thread::sleep(Duration::from_millis(5));
        }
        if woke.is_ok() || accept.is_finished() {
            let _ = accept.join();
        } else if let Err(e) = woke {
            tracing::warn!(
                "store: cannot wake the accept thread at {} ({e}); leaving it to exit later",
                self.wake
            );
        }
        let threads = std::mem::take(&mut *lock(&shared.threads));
        for t in threads {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn accept_loop(shared: Arc<ServerShared>, listener: TcpListener) {
    loop {
        let accepted = listener.accept();
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        let (stream, peer) = match accepted {
            Ok(s) => s,
            Err(e) => {
                // Out of file descriptors and the like: log, breathe, go on.
                tracing::warn!("store: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let id = {
            let mut st = lock(&shared.state);
            if st.stopped {
                break;
            }
            let Ok(clone) = stream.try_clone() else {
                continue;
            };
            let id = st.next_conn;
            st.next_conn += 1;
            st.conns.insert(id, clone);
            id
        };
        let conn_shared = Arc::clone(&shared);
        let spawned = std::thread::Builder::new()
            .name(format!("store-conn-{id}"))
            .spawn(move || conn_shared.serve(stream, id, peer));
        let mut threads = lock(&shared.threads);
        // Reap finished connection threads so the list stays short.
        let (done, running): (Vec<_>, Vec<_>) = std::mem::take(&mut *threads)
            .into_iter()
            .partition(|t| t.is_finished());
        *threads = running;
        for t in done {
            let _ = t.join();
        }
        match spawned {
            Ok(t) => threads.push(t),
            Err(e) => {
                tracing::error!("store: cannot start a thread for {peer}: {e}");
                if let Some(s) = lock(&shared.state).conns.remove(&id) {
                    let _ = s.shutdown(Shutdown::Both);
                }
            }
        }
    }
}

/// An address one can connect to for a listener's address (`0.0.0.0` → `127.0.0.1`).
fn connectable(mut addr: SocketAddr) -> SocketAddr {
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr.ip() {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        });
    }
    addr
}

fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

fn bind(host: &str, port: u16, world_size: usize) -> Result<TcpListener, StoreError> {
    let addr = host_port(host, port);
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| StoreError::Bind {
            addr: addr.clone(),
            reason: format!("cannot resolve '{host}': {e}"),
            hint: " (check MASTER_ADDR)".into(),
        })?
        .collect();
    let mut first_err = None;
    for a in &addrs {
        match TcpListener::bind(a) {
            Ok(l) => {
                let named =
                    !(host.eq_ignore_ascii_case("localhost") || host.parse::<IpAddr>().is_ok());
                if world_size > 1 && named && a.ip().is_loopback() {
                    // The Debian-style "127.0.1.1 myhost" line in /etc/hosts: other nodes cannot
                    // reach this address.
                    tracing::warn!(
                        "store: '{host}' resolves to the loopback address {} on this machine, so \
                         ranks on other machines cannot reach the store; set MASTER_ADDR to an \
                         address they can reach, or bind to 0.0.0.0",
                        a.ip()
                    );
                }
                return Ok(l);
            }
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    let e = first_err.unwrap_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no addresses"));
    let (reason, hint) = match e.kind() {
        io::ErrorKind::AddrInUse => (
            "address already in use".to_string(),
            " (another job on this port? set MASTER_PORT)".to_string(),
        ),
        io::ErrorKind::AddrNotAvailable => (
            "address not available".to_string(),
            format!(
                " ('{host}' is not an address of this machine: does rank 0 run on the master \
                 host? check MASTER_ADDR, or bind to 0.0.0.0)"
            ),
        ),
        io::ErrorKind::PermissionDenied => (
            "permission denied".to_string(),
            " (ports below 1024 need privileges; set MASTER_PORT)".to_string(),
        ),
        _ => (e.to_string(), String::new()),
    };
    Err(StoreError::Bind { addr, reason, hint })
}

// ---------------------------------------------------------------------------------------------
// Client
// ---------------------------------------------------------------------------------------------

/// A client of the rendezvous store (and, in rank 0, the owner of its server).
pub struct Store {
    rank: usize,
    world_size: usize,
    run_id: String,
    timeout: Duration,
    /// Display form `host:port`.
    addr: String,
    /// Where connections go.
    host: String,
    port: u16,
    /// Idle connections.
    pool: Mutex<Vec<TcpStream>>,
    /// This rank's count of calls per barrier name.
    generations: Mutex<HashMap<String, u64>>,
    server: Option<Server>,
}

/// Why a hello failed.
enum HelloError {
    /// Try again (the connection broke, or nobody answered).
    Retry(String),
    /// Give up with this error.
    Fatal(StoreError),
}

fn describe_io(e: &io::Error) -> String {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => "connection refused".into(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => "connection timed out".into(),
        io::ErrorKind::HostUnreachable => "host unreachable".into(),
        io::ErrorKind::NetworkUnreachable => "network unreachable".into(),
        io::ErrorKind::ConnectionReset => "connection reset".into(),
        io::ErrorKind::AddrNotAvailable => "address not available".into(),
        _ => e.to_string(),
    }
}

impl Store {
    /// Rank 0 binds and serves in background threads, then connects to itself; other ranks
    /// connect with retry and exponential backoff until `cfg.timeout`. Every connection starts
    /// with a hello (magic, version, run id, world size, rank) that the server checks.
    pub fn connect(cfg: &StoreConfig) -> Result<Store, StoreError> {
        let invalid = |m: String| Err(StoreError::Config(m));
        if cfg.world_size == 0 {
            return invalid("the world size must be at least 1".into());
        }
        if cfg.world_size > u32::MAX as usize {
            return invalid(format!("the world size {} is too large", cfg.world_size));
        }
        if cfg.rank >= cfg.world_size {
            return invalid(format!(
                "rank {} is not below the world size {}",
                cfg.rank, cfg.world_size
            ));
        }
        if cfg.run_id.len() > MAX_RUN_ID_LEN {
            return invalid(format!(
                "the run id is {} bytes, over the limit of {MAX_RUN_ID_LEN}",
                cfg.run_id.len()
            ));
        }
        if cfg.timeout.is_zero() {
            return invalid("the timeout must be positive".into());
        }
        if cfg.host.is_empty() {
            return invalid("the master host is empty".into());
        }
        if cfg.rank != 0 && cfg.port == 0 {
            return invalid(format!(
                "rank {} needs the master's port; port 0 (pick a free port) only works for rank 0",
                cfg.rank
            ));
        }
        let timeout = cfg.timeout.min(MAX_TIMEOUT);
        let mut store = Store {
            rank: cfg.rank,
            world_size: cfg.world_size,
            run_id: cfg.run_id.clone(),
            timeout,
            addr: host_port(&cfg.host, cfg.port),
            host: cfg.host.clone(),
            port: cfg.port,
            pool: Mutex::new(Vec::new()),
            generations: Mutex::new(HashMap::new()),
            server: None,
        };
        if cfg.rank == 0 {
            let bind_host = cfg.bind_addr.as_deref().unwrap_or(&cfg.host);
            let listener = bind(bind_host, cfg.port, cfg.world_size)?;
            let local = listener.local_addr().map_err(|e| StoreError::Io {
                context: "cannot read the store's listening address".into(),
                source: e,
            })?;
            let server = Server::start(listener, cfg.world_size, cfg.run_id.clone(), timeout)
                .map_err(|e| StoreError::Io {
                    context: "cannot start the store's server thread".into(),
                    source: e,
                })?;
            tracing::info!(
                "store: serving {} rank(s) on {local} (run id '{}')",
                cfg.world_size,
                cfg.run_id
            );
            store.port = local.port();
            store.addr = host_port(&cfg.host, local.port());
            // Rank 0 talks to its own server over loopback when it listens everywhere.
            store.host = connectable(local).ip().to_string();
            store.server = Some(server);
        }
        let conn = store.dial(true, Instant::now() + timeout, true)?;
        lock(&store.pool).push(conn);
        Ok(store)
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The master's port (for rank 0 started with port 0: the port it picked).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The master as `host:port`.
    pub fn master_addr(&self) -> &str {
        &self.addr
    }

    /// The timeout of blocking operations.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Open a connection and say hello, retrying (if `retry`) until `deadline`.
    fn dial(&self, primary: bool, deadline: Instant, retry: bool) -> Result<TcpStream, StoreError> {
        let start = Instant::now();
        let mut backoff = Duration::from_millis(10 + (self.rank % 7) as u64);
        loop {
            let reason = match self.try_dial(primary, deadline) {
                Ok(stream) => return Ok(stream),
                Err(HelloError::Fatal(e)) => return Err(e),
                Err(HelloError::Retry(reason)) => reason,
            };
            let now = Instant::now();
            if !retry || now >= deadline {
                return Err(StoreError::Unreachable {
                    addr: self.addr.clone(),
                    waited: if retry { self.timeout } else { start.elapsed() },
                    reason,
                });
            }
            tracing::trace!(
                "store: master {} not reachable yet ({reason}); retrying",
                self.addr
            );
            // The last attempt is made at the deadline.
            std::thread::sleep(backoff.min(deadline - now));
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }

    fn try_dial(&self, primary: bool, deadline: Instant) -> Result<TcpStream, HelloError> {
        let addrs: Vec<SocketAddr> = (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| HelloError::Retry(format!("cannot resolve '{}': {e}", self.host)))?
            .collect();
        let attempt = deadline
            .saturating_duration_since(Instant::now())
            .clamp(Duration::from_millis(100), MAX_CONNECT_ATTEMPT);
        let mut last = format!("'{}' resolves to no address", self.host);
        let mut stream = None;
        for a in &addrs {
            match TcpStream::connect_timeout(a, attempt) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = describe_io(&e),
            }
        }
        let mut stream = stream.ok_or(HelloError::Retry(last))?;
        let _ = stream.set_nodelay(true);
        let _ = stream.set_write_timeout(Some(self.timeout));
        let _ = stream.set_read_timeout(Some(attempt));
        let hello = Enc::new(op::HELLO)
            .raw(&PROTOCOL_MAGIC)
            .u32(PROTOCOL_VERSION)
            .u32(self.world_size as u32)
            .u32(self.rank as u32)
            .u8(if primary { FLAG_PRIMARY } else { 0 })
            .str(&self.run_id)
            .finish();
        if let Err(e) = stream.write_all(&hello) {
            return Err(HelloError::Retry(format!(
                "the connection broke during the hello: {}",
                describe_io(&e)
            )));
        }
        let not_a_store = |what: String| {
            HelloError::Fatal(StoreError::Protocol {
                addr: self.addr.clone(),
                detail: format!("the service there is not a flotilla store (another program on this port?): {what}"),
            })
        };
        match read_frame(&mut stream, MAX_HELLO_FRAME) {
            Ok((op::OK, _)) => {
                let _ = stream.set_read_timeout(None);
                Ok(stream)
            }
            Ok((op::ERR, payload)) => {
                let mut d = Dec { buf: &payload };
                let kind = d.u8().unwrap_or(0);
                let reason = d.str().unwrap_or_else(|_| "(unreadable reason)".into());
                Err(HelloError::Fatal(match kind {
                    err_kind::REJECTED => StoreError::Rejected {
                        addr: self.addr.clone(),
                        reason,
                    },
                    err_kind::SHUTTING_DOWN => StoreError::ShuttingDown {
                        addr: self.addr.clone(),
                        op: "the hello".into(),
                    },
                    _ => StoreError::Protocol {
                        addr: self.addr.clone(),
                        detail: reason,
                    },
                }))
            }
            Ok((opcode, payload)) => {
                let mut head = vec![opcode];
                head.extend_from_slice(&payload[..payload.len().min(12)]);
                Err(not_a_store(format!("it answered {}", show_bytes(&head))))
            }
            Err(FrameError::BadLength { head, .. }) => {
                Err(not_a_store(format!("it answered {}", show_bytes(&head))))
            }
            Err(FrameError::Closed) => Err(HelloError::Retry(
                "the service there closed the connection without answering the hello".into(),
            )),
            Err(FrameError::Io(e)) => Err(HelloError::Retry(format!(
                "no answer to the hello ({})",
                describe_io(&e)
            ))),
        }
    }

    /// Send one request and read the answer, on an idle pooled connection or a new one.
    fn call(
        &self,
        op_name: &dyn Fn() -> String,
        frame: &[u8],
        read_timeout: Duration,
    ) -> Result<(u8, Vec<u8>), StoreError> {
        let pooled = lock(&self.pool).pop();
        let mut stream = match pooled {
            Some(s) => s,
            None => self.dial(
                false,
                Instant::now() + self.timeout.min(MAX_CONNECT_ATTEMPT),
                false,
            )?,
        };
        let result = stream
            .set_read_timeout(Some(read_timeout.max(Duration::from_millis(1))))
            .and_then(|()| stream.write_all(frame))
            .and_then(|()| match read_frame(&mut stream, MAX_FRAME) {
                Ok(f) => Ok(f),
                Err(FrameError::Closed) => Err(io::ErrorKind::UnexpectedEof.into()),
                Err(FrameError::Io(e)) => Err(e),
                Err(FrameError::BadLength { len, head }) => Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "the master sent a frame of {len} bytes starting {}",
                        show_bytes(&head)
                    ),
                )),
            });
        match result {
            Ok((code, payload)) => {
                let reusable = code != op::ERR
                    || !matches!(
                        payload.first(),
                        Some(&err_kind::BAD_REQUEST) | Some(&err_kind::SHUTTING_DOWN)
                    );
                if reusable {
                    lock(&self.pool).push(stream);
                }
                Ok((code, payload))
            }
            Err(e) => {
                let _ = stream.shutdown(Shutdown::Both);
                let op = op_name();
                Err(match e.kind() {
                    io::ErrorKind::UnexpectedEof
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::BrokenPipe
                    | io::ErrorKind::NotConnected => StoreError::MasterClosed {
                        addr: self.addr.clone(),
                        op,
                    },
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => StoreError::NoAnswer {
                        addr: self.addr.clone(),
                        op,
                        waited: read_timeout,
                    },
                    _ => StoreError::Io {
                        context: format!("{op} with the master {}", self.addr),
                        source: e,
                    },
                })
            }
        }
    }

    /// Turn an answer into a result, or the error it carries.
    fn answer(
        &self,
        op: String,
        waited: Duration,
        code: u8,
        payload: Vec<u8>,
    ) -> Result<Answer, StoreError> {
        let mut d = Dec { buf: &payload };
        let bad = |detail: String| StoreError::Protocol {
            addr: self.addr.clone(),
            detail,
        };
        match code {
            op::OK => Ok(Answer::Ok),
            op::VALUE => Ok(Answer::Value(payload)),
            op::INT => Ok(Answer::Int(d.i64().map_err(bad)?)),
            op::BOOL => Ok(Answer::Bool(d.u8().map_err(bad)? != 0)),
            op::TIMEOUT => {
                let n = d.u32().map_err(bad)? as usize;
                let missing = (0..n.min(self.world_size))
                    .map(|_| d.u32().map(|r| r as usize))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(bad)?;
                let detail = d.str().map_err(bad)?;
                Err(StoreError::Timeout {
                    op,
                    waited,
                    detail,
                    missing,
                })
            }
            op::ERR => {
                let kind = d.u8().map_err(bad)?;
                let reason = d.str().map_err(bad)?;
                Err(match kind {
                    err_kind::REFUSED => StoreError::Refused { op, reason },
                    err_kind::PEER_LEFT => StoreError::PeerLeft { op, detail: reason },
                    err_kind::SHUTTING_DOWN => StoreError::ShuttingDown {
                        addr: self.addr.clone(),
                        op,
                    },
                    err_kind::REJECTED => StoreError::Rejected {
                        addr: self.addr.clone(),
                        reason,
                    },
                    _ => bad(format!("the master could not read {op}: {reason}")),
                })
            }
            other => Err(bad(format!("unexpected answer 0x{other:02x} to {op}"))),
        }
    }

    fn request(
        &self,
        op: &dyn Fn() -> String,
        frame: &[u8],
        waited: Duration,
        read_timeout: Duration,
    ) -> Result<Answer, StoreError> {
        let (code, payload) = self.call(op, frame, read_timeout)?;
        self.answer(op(), waited, code, payload)
    }

    fn unexpected(&self, op: String, got: Answer) -> StoreError {
        StoreError::Protocol {
            addr: self.addr.clone(),
            detail: format!("unexpected answer {got:?} to {op}"),
        }
    }

    /// Store `value` under `key` (replacing any value) and wake whoever waits for it.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        check_key("key", key)?;
        if value.len() > MAX_VALUE_LEN {
            return Err(StoreError::TooLarge {
                what: format!("the value for key {}", show_key(key)),
                len: value.len(),
                limit: MAX_VALUE_LEN,
            });
        }
        let op = || format!("set {}", show_key(key));
        let frame = Enc::new(op::SET).str(key).raw(value).finish();
        match self.request(&op, &frame, self.timeout, self.timeout)? {
            Answer::Ok => Ok(()),
            other => Err(self.unexpected(op(), other)),
        }
    }

    /// The value of `key`, waiting up to the store timeout for some rank to set it.
    pub fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        self.get_timeout(key, self.timeout)
    }

    /// The value of `key`, waiting up to `t` for some rank to set it.
    pub fn get_timeout(&self, key: &str, t: Duration) -> Result<Vec<u8>, StoreError> {
        check_key("key", key)?;
        let t = t.min(MAX_TIMEOUT);
        let op = || format!("get {}", show_key(key));
        let frame = Enc::new(op::GET).u64(millis(t)).str(key).finish();
        match self.request(&op, &frame, t, t + RESPONSE_SLACK)? {
            Answer::Value(v) => Ok(v),
            other => Err(self.unexpected(op(), other)),
        }
    }

    /// Add `delta` to the counter under `key` (absent = 0) atomically; returns the new value.
    /// The counter is kept as decimal text, so `get` reads it as e.g. `b"3"`.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        check_key("key", key)?;
        let op = || format!("add {delta} to {}", show_key(key));
        let frame = Enc::new(op::ADD).i64(delta).str(key).finish();
        match self.request(&op, &frame, self.timeout, self.timeout)? {
            Answer::Int(n) => Ok(n),
            other => Err(self.unexpected(op(), other)),
        }
    }

    /// Wait until every key in `keys` is set (up to the store timeout).
    pub fn wait(&self, keys: &[&str]) -> Result<(), StoreError> {
        for k in keys {
            check_key("key", k)?;
        }
        if keys.len() > MAX_WAIT_KEYS {
            return Err(StoreError::TooLarge {
                what: "the key list of wait".into(),
                len: keys.len(),
                limit: MAX_WAIT_KEYS,
            });
        }
        let op = || format!("wait for {}", show_keys(keys));
        let mut e = Enc::new(op::WAIT)
            .u64(millis(self.timeout))
            .u32(keys.len() as u32);
        for k in keys {
            e = e.str(k);
        }
        let frame = e.finish();
        match self.request(&op, &frame, self.timeout, self.timeout + RESPONSE_SLACK)? {
            Answer::Ok => Ok(()),
            other => Err(self.unexpected(op(), other)),
        }
    }

    /// Remove `key`; true if it was there.
    pub fn delete(&self, key: &str) -> Result<bool, StoreError> {
        check_key("key", key)?;
        let op = || format!("delete {}", show_key(key));
        let frame = Enc::new(op::DELETE).str(key).finish();
        match self.request(&op, &frame, self.timeout, self.timeout)? {
            Answer::Bool(b) => Ok(b),
            other => Err(self.unexpected(op(), other)),
        }
    }

    /// Wait until all `world_size` ranks called `barrier(name)` as often as this one has
    /// (names are reusable: each call is the next generation). Fails at once if a rank that
    /// has not arrived disconnects; on timeout the error names the ranks that did not arrive.
    pub fn barrier(&self, name: &str) -> Result<(), StoreError> {
        check_key("barrier name", name)?;
        let generation = {
            let mut g = lock(&self.generations);
            let n = g.entry(name.to_string()).or_insert(0);
            *n += 1;
            *n
        };
        let op = || format!("barrier {}", show_key(name));
        let frame = Enc::new(op::BARRIER)
            .u64(millis(self.timeout))
            .u64(generation)
            .str(name)
            .finish();
        match self.request(&op, &frame, self.timeout, self.timeout + RESPONSE_SLACK)? {
            Answer::Ok => Ok(()),
            other => Err(self.unexpected(op(), other)),
        }
    }
}

#[derive(Debug)]
enum Answer {
    Ok,
    Value(Vec<u8>),
    Int(i64),
    Bool(bool),
}

impl Drop for Store {
    fn drop(&mut self) {
        for s in lock(&self.pool).drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
        if let Some(mut server) = self.server.take() {
            server.shutdown();
        }
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("master", &self.addr)
            .field("serving", &self.server.is_some())
            .finish()
    }
}

// ---------------------------------------------------------------------------------------------
// The trait and the in-memory store
// ---------------------------------------------------------------------------------------------

/// The store operations communicators need, so they can be tested with [`MemoryStore`].
pub trait KvStore: Send + Sync {
    /// Store `value` under `key`.
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError>;
    /// The value of `key`, waiting (up to the store's timeout) until some rank sets it.
    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError>;
    /// Atomically add `delta` to the counter `key`; returns the new value.
    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError>;
    /// Wait for all ranks (reusable names, by generation counting).
    fn barrier(&self, name: &str) -> Result<(), StoreError>;
    /// This handle's rank.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world_size(&self) -> usize;
}

impl KvStore for Store {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        Store::set(self, key, value)
    }
    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        Store::get(self, key)
    }
    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        Store::add(self, key, delta)
    }
    fn barrier(&self, name: &str) -> Result<(), StoreError> {
        Store::barrier(self, name)
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world_size
    }
}

struct MemShared {
    world_size: usize,
    timeout: Duration,
    table: Mutex<Table>,
    changed: Condvar,
}

/// An in-process store for tests: one handle per rank over a shared table, with the same
/// semantics as [`Store`] (blocking `get` with a timeout, counters, generation barriers).
pub struct MemoryStore {
    shared: Arc<MemShared>,
    rank: usize,
    generations: Mutex<HashMap<String, u64>>,
}

impl MemoryStore {
    /// Timeout of [`MemoryStore::group`]'s handles.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

    /// One handle per rank, sharing one table; blocking operations time out after 30 s.
    pub fn group(world_size: usize) -> Vec<Arc<dyn KvStore>> {
        Self::group_with_timeout(world_size, Self::DEFAULT_TIMEOUT)
    }

    /// As [`MemoryStore::group`], with the given timeout.
    pub fn group_with_timeout(world_size: usize, timeout: Duration) -> Vec<Arc<dyn KvStore>> {
        Self::handles(world_size, timeout)
            .into_iter()
            .map(|h| h as Arc<dyn KvStore>)
            .collect()
    }

    /// As [`MemoryStore::group_with_timeout`], typed (for the inherent methods).
    pub fn handles(world_size: usize, timeout: Duration) -> Vec<Arc<MemoryStore>> {
        let shared = Arc::new(MemShared {
            world_size,
            timeout,
            table: Mutex::new(Table::default()),
            changed: Condvar::new(),
        });
        (0..world_size)
            .map(|rank| {
                Arc::new(MemoryStore {
                    shared: Arc::clone(&shared),
                    rank,
                    generations: Mutex::new(HashMap::new()),
                })
            })
            .collect()
    }

    /// The value of `key`, waiting up to `t`.
    pub fn get_timeout(&self, key: &str, t: Duration) -> Result<Vec<u8>, StoreError> {
        check_key("key", key)?;
        let deadline = Instant::now() + t.min(MAX_TIMEOUT);
        let mut table = lock(&self.shared.table);
        loop {
            if let Some(v) = table.kv.get(key) {
                return Ok(v.to_vec());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(StoreError::Timeout {
                    op: format!("get {}", show_key(key)),
                    waited: t,
                    detail: "no rank set it".into(),
                    missing: Vec::new(),
                });
            }
            table = self
                .shared
                .changed
                .wait_timeout(table, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Remove `key`; true if it was there.
    pub fn delete(&self, key: &str) -> bool {
        lock(&self.shared.table).kv.remove(key).is_some()
    }
}

impl KvStore for MemoryStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        check_key("key", key)?;
        if value.len() > MAX_VALUE_LEN {
            return Err(StoreError::TooLarge {
                what: format!("the value for key {}", show_key(key)),
                len: value.len(),
                limit: MAX_VALUE_LEN,
            });
        }
        lock(&self.shared.table)
            .kv
            .insert(key.to_string(), Arc::from(value));
        self.shared.changed.notify_all();
        Ok(())
    }

    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        self.get_timeout(key, self.shared.timeout)
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        check_key("key", key)?;
        let result = lock(&self.shared.table).add(key, delta);
        self.shared.changed.notify_all();
        result.map_err(|reason| StoreError::Refused {
            op: format!("add {delta} to {}", show_key(key)),
            reason,
        })
    }

    fn barrier(&self, name: &str) -> Result<(), StoreError> {
        check_key("barrier name", name)?;
        let generation = {
            let mut g = lock(&self.generations);
            let n = g.entry(name.to_string()).or_insert(0);
            *n += 1;
            *n
        };
        let world = self.shared.world_size;
        let deadline = Instant::now() + self.shared.timeout;
        let mut table = lock(&self.shared.table);
        if table.arrive(name, generation, self.rank, world) {
            drop(table);
            self.shared.changed.notify_all();
            return Ok(());
        }
        loop {
            if table.barrier_done(name, generation) {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                let arrived = table.arrived(name, generation);
                let missing: Vec<usize> = (0..world).filter(|r| !arrived.contains(r)).collect();
                return Err(StoreError::Timeout {
                    op: format!("barrier {}", show_key(name)),
                    waited: self.shared.timeout,
                    detail: format!("{} did not reach the barrier", ranks_of(&missing, world)),
                    missing,
                });
            }
            table = self
                .shared
                .changed
                .wait_timeout(table, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.shared.world_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    const T: Duration = Duration::from_secs(10);

    fn cfg(port: u16, rank: usize, world: usize, timeout: Duration) -> StoreConfig {
        StoreConfig {
            host: "127.0.0.1".into(),
            port,
            rank,
            world_size: world,
            run_id: "test".into(),
            timeout,
            bind_addr: None,
        }
    }

    /// Rank 0 on a free port, then ranks 1.. connected from threads.
    fn group(world: usize, timeout: Duration) -> Vec<Store> {
        let master = Store::connect(&cfg(0, 0, world, timeout)).unwrap();
        let port = master.port();
        let others: Vec<Store> = (1..world)
            .map(|r| thread::spawn(move || Store::connect(&cfg(port, r, world, timeout)).unwrap()))
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect();
        std::iter::once(master).chain(others).collect()
    }

    #[test]
    fn formatting_helpers() {
        assert_eq!(format_ranks(&[2]), "2");
        assert_eq!(format_ranks(&[2, 3]), "2,3");
        assert_eq!(format_ranks(&[1, 2, 3, 4, 7, 9, 10]), "1-4,7,9,10");
        assert_eq!(ranks_of(&[2, 3], 4), "ranks 2,3 of 4");
        assert_eq!(ranks_of(&[1], 2), "rank 1 of 2");
        assert_eq!(secs(Duration::from_secs(300)), "300 s");
        assert_eq!(secs(Duration::from_millis(2500)), "2.5 s");
        assert_eq!(secs(Duration::from_secs(2)), "2 s");
        assert_eq!(secs(Duration::from_millis(2040)), "2 s");
        assert_eq!(secs(Duration::from_millis(9960)), "10 s");
        assert_eq!(secs(Duration::from_millis(42)), "42 ms");
        assert_eq!(show_bytes(b"GET /\r\n\x00"), "\"GET /\\r\\n\\x00\"");
    }

    #[test]
    fn frames_round_trip() {
        let f = Enc::new(op::GET).u64(7).str("key").finish();
        let (code, payload) = read_frame(&mut &f[..], MAX_FRAME).unwrap();
        assert_eq!(code, op::GET);
        let mut d = Dec { buf: &payload };
        assert_eq!(d.u64().unwrap(), 7);
        assert_eq!(d.key().unwrap(), "key");
        assert!(d.end().is_ok());
        assert!(matches!(
            read_frame(&mut &b""[..], 10),
            Err(FrameError::Closed)
        ));
        assert!(matches!(
            read_frame(&mut &b"GET / HTTP/1.1"[..], 1000),
            Err(FrameError::BadLength { .. })
        ));
        assert!(matches!(
            read_frame(&mut &[5u8, 0, 0, 0, 1][..], 1000),
            Err(FrameError::Io(_))
        ));
        assert!(Dec { buf: &[1, 0, 0] }.u32().is_err());
    }

    #[test]
    fn table_counters_and_barrier_generations() {
        let mut t = Table::default();
        assert_eq!(t.add("c", 2).unwrap(), 2);
        assert_eq!(t.add("c", -5).unwrap(), -3);
        assert_eq!(&*t.kv["c"], b"-3");
        t.kv.insert("s".into(), Arc::from(&b"hello"[..]));
        assert!(t
            .add("s", 1)
            .unwrap_err()
            .contains("holds 'hello', which is not a counter"));
        t.kv.insert("m".into(), Arc::from(i64::MAX.to_string().into_bytes()));
        assert!(t.add("m", 1).unwrap_err().contains("overflows"));
        assert!(!t.arrive("b", 1, 0, 2));
        assert!(!t.barrier_done("b", 1));
        assert!(t.arrive("b", 1, 1, 2));
        assert!(t.barrier_done("b", 1));
        assert!(
            t.arrive("b", 1, 0, 2),
            "a completed generation passes at once"
        );
        assert!(!t.arrive("b", 2, 1, 2));
    }

    #[test]
    fn single_rank_store_does_everything() {
        let s = Store::connect(&cfg(0, 0, 1, T)).unwrap();
        assert_ne!(s.port(), 0);
        s.set("a", b"1").unwrap();
        assert_eq!(s.get("a").unwrap(), b"1");
        s.set("a", b"2").unwrap();
        assert_eq!(s.get("a").unwrap(), b"2");
        assert_eq!(s.add("n", 5).unwrap(), 5);
        assert_eq!(s.add("n", -2).unwrap(), 3);
        assert_eq!(s.get("n").unwrap(), b"3");
        s.wait(&["a", "n"]).unwrap();
        assert!(s.delete("a").unwrap());
        assert!(!s.delete("a").unwrap());
        s.barrier("x").unwrap();
        s.barrier("x").unwrap();
        s.set("empty", b"").unwrap();
        assert_eq!(s.get("empty").unwrap(), b"");
        let e = s.add("empty", 1).unwrap_err().to_string();
        assert_eq!(e, "add 1 to 'empty' refused: key 'empty' holds '', which is not a counter (add keeps a decimal integer)");
        let e = s
            .get_timeout("nope", Duration::from_millis(50))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "get 'nope' timed out after 50 ms: no rank set it"
        );
    }

    #[test]
    fn limits_are_enforced_by_the_client() {
        let s = Store::connect(&cfg(0, 0, 1, T)).unwrap();
        let long = "k".repeat(MAX_KEY_LEN + 1);
        assert!(matches!(
            s.set(&long, b""),
            Err(StoreError::TooLarge { .. })
        ));
        let big = vec![0u8; MAX_VALUE_LEN + 1];
        let e = s.set("k", &big).unwrap_err().to_string();
        assert!(
            e.starts_with("the value for key 'k' is 67108865 bytes, over the limit"),
            "{e}"
        );
        // The store still works afterwards.
        s.set("k", b"v").unwrap();
    }

    /// Drop rank 0 last, as its drop waits (up to the grace period) for the others to leave.
    fn drop_all(mut stores: Vec<Store>) {
        while stores.pop().is_some() {}
    }

    #[test]
    fn ranks_exchange_block_and_count() {
        let stores = group(3, T);
        let big: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        thread::scope(|sc| {
            for s in &stores {
                let big = &big;
                sc.spawn(move || {
                    let r = s.rank();
                    if r == 2 {
                        thread::sleep(Duration::from_millis(200));
                        s.set("late", big).unwrap();
                    }
                    let t0 = Instant::now();
                    assert_eq!(&s.get("late").unwrap(), big);
                    if r != 2 {
                        assert!(t0.elapsed() >= Duration::from_millis(150));
                    }
                    s.add("count", 1).unwrap();
                    for round in 0..5 {
                        s.barrier("round").unwrap();
                        assert_eq!(s.get("count").unwrap(), b"3");
                        s.set(&format!("r{r}/{round}"), &[r as u8, round]).unwrap();
                    }
                    let keys: Vec<String> = (0..3).map(|p| format!("r{p}/4")).collect();
                    s.wait(&keys.iter().map(|k| k.as_str()).collect::<Vec<_>>())
                        .unwrap();
                });
            }
        });
        let t0 = Instant::now();
        drop_all(stores);
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    }

    #[test]
    fn concurrent_calls_on_one_store_do_not_block_each_other() {
        let stores = group(1, T);
        let s = &stores[0];
        thread::scope(|sc| {
            let waiter = sc.spawn(|| s.get("from-other-thread").unwrap());
            thread::sleep(Duration::from_millis(100));
            // This set runs while the get above is parked on its connection.
            s.set("from-other-thread", b"ok").unwrap();
            assert_eq!(waiter.join().unwrap(), b"ok");
        });
    }

    #[test]
    fn barrier_timeout_names_the_missing_rank() {
        let t = Duration::from_millis(700);
        let master = Store::connect(&cfg(0, 0, 3, t)).unwrap();
        let r1 = Store::connect(&cfg(master.port(), 1, 3, t)).unwrap();
        let start = Instant::now();
        let (e0, e1) = thread::scope(|sc| {
            let a = sc.spawn(|| master.barrier("b").unwrap_err());
            let b = sc.spawn(|| r1.barrier("b").unwrap_err());
            (a.join().unwrap(), b.join().unwrap())
        });
        assert!(start.elapsed() < t + Duration::from_secs(2));
        for e in [&e0, &e1] {
            let msg = e.to_string();
            assert!(
                msg.starts_with(
                    "barrier 'b' timed out after 0.7 s: rank 2 of 3 did not join within"
                ),
                "{msg}"
            );
            assert!(matches!(e, StoreError::Timeout { missing, .. } if missing == &vec![2]));
        }
        // A get names them too.
        let msg = r1.get("k").unwrap_err().to_string();
        assert!(
            msg.contains("no rank set it; rank 2 of 3 did not join within"),
            "{msg}"
        );
    }

    #[test]
    fn barrier_fails_promptly_when_a_rank_leaves() {
        let stores = group(3, T);
        let mut it = stores.into_iter();
        let (s0, s1, s2) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
        let start = Instant::now();
        thread::scope(|sc| {
            let h = sc.spawn(|| s1.barrier("b").unwrap_err().to_string());
            thread::sleep(Duration::from_millis(100));
            drop(s2);
            let msg = h.join().unwrap();
            assert_eq!(
                msg,
                "barrier 'b' failed: rank 2 of 3 disconnected (exited or crashed?) before reaching barrier 'b'"
            );
        });
        assert!(start.elapsed() < Duration::from_secs(3));
        drop(s1);
        drop(s0);
    }

    #[test]
    fn mismatched_hellos_are_rejected_on_both_sides() {
        let t = Duration::from_millis(800);
        let master = Store::connect(&cfg(0, 0, 2, t)).unwrap();
        let port = master.port();
        let e = Store::connect(&cfg(port, 1, 3, t)).unwrap_err().to_string();
        assert_eq!(
            e,
            format!("the master 127.0.0.1:{port} rejected this process: rank 1 joined with world size 3, but the master expects 2")
        );
        let mut other = cfg(port, 1, 2, t);
        other.run_id = "x".into();
        let e = Store::connect(&other).unwrap_err().to_string();
        assert!(
            e.ends_with("rank 1 has run id 'x', the master 'test'"),
            "{e}"
        );
        // The master's own wait names what it turned away.
        let e = master.barrier("b").unwrap_err().to_string();
        assert!(e.contains("rank 1 of 2 did not join within"), "{e}");
        assert!(e.contains("the master turned away: rank 1 joined with world size 3, but the master expects 2; rank 1 has run id 'x', the master 'test'"), "{e}");
    }

    #[test]
    fn duplicate_rank_is_rejected() {
        let master = Store::connect(&cfg(0, 0, 2, T)).unwrap();
        let _one = Store::connect(&cfg(master.port(), 1, 2, T)).unwrap();
        let e = Store::connect(&cfg(master.port(), 1, 2, T))
            .unwrap_err()
            .to_string();
        assert!(e.contains("rank 1 is already connected from"), "{e}");
        assert!(e.contains("two processes with the same rank?"), "{e}");
    }

    #[test]
    fn port_in_use_is_a_clear_error() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = taken.local_addr().unwrap().port();
        let e = Store::connect(&cfg(port, 0, 2, T)).unwrap_err().to_string();
        assert_eq!(
            e,
            format!("cannot bind 127.0.0.1:{port}: address already in use (another job on this port? set MASTER_PORT)")
        );
    }

    #[test]
    fn unreachable_master_is_a_clear_error() {
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let start = Instant::now();
        let e = Store::connect(&cfg(port, 1, 2, Duration::from_millis(400)))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            format!("cannot reach master 127.0.0.1:{port} after 0.4 s (connection refused)")
        );
        assert!(start.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn invalid_configurations() {
        let e = |c: StoreConfig| Store::connect(&c).unwrap_err().to_string();
        assert_eq!(
            e(cfg(0, 2, 2, T)),
            "invalid store configuration: rank 2 is not below the world size 2"
        );
        assert_eq!(
            e(cfg(0, 0, 0, T)),
            "invalid store configuration: the world size must be at least 1"
        );
        assert!(e(cfg(0, 1, 2, T)).contains("port 0 (pick a free port) only works for rank 0"));
        assert!(e(cfg(0, 0, 1, Duration::ZERO)).contains("timeout must be positive"));
    }

    #[test]
    fn garbage_and_http_do_not_hurt_the_server() {
        let master = Store::connect(&cfg(0, 0, 2, T)).unwrap();
        let port = master.port();
        let junk: [&[u8]; 5] = [
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
            b"\xff\xff\xff\xff\xff\xff",
            b"\x10\x00\x00\x00\x01NOTMAGIC........",
            b"\x03\x00",
            b"",
        ];
        for bytes in junk {
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            s.write_all(bytes).unwrap();
            let _ = s.shutdown(Shutdown::Write);
            // The server closes without answering.
            let mut buf = Vec::new();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let _ = s.read_to_end(&mut buf);
            assert!(buf.is_empty(), "{buf:?}");
        }
        // A valid magic but another protocol version gets a clear refusal.
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let hello = Enc::new(op::HELLO).raw(&PROTOCOL_MAGIC).u32(99).finish();
        s.write_all(&hello).unwrap();
        let (code, payload) = read_frame(&mut s, MAX_FRAME).unwrap();
        assert_eq!(code, op::ERR);
        let msg = Dec { buf: &payload[1..] }.str().unwrap();
        assert!(
            msg.contains("speaks store protocol version 99, the master 1"),
            "{msg}"
        );
        // And the next real client is served.
        let r1 = Store::connect(&cfg(port, 1, 2, T)).unwrap();
        r1.set("k", b"v").unwrap();
        assert_eq!(master.get("k").unwrap(), b"v");
    }

    #[test]
    fn dropping_the_master_closes_clients_promptly() {
        let stores = group(2, Duration::from_millis(500));
        let mut it = stores.into_iter();
        let (master, r1) = (it.next().unwrap(), it.next().unwrap());
        thread::scope(|sc| {
            let waiter = sc.spawn(|| {
                let t0 = Instant::now();
                let e = r1
                    .get_timeout("never", Duration::from_secs(30))
                    .unwrap_err();
                (e, t0.elapsed())
            });
            thread::sleep(Duration::from_millis(100));
            let t0 = Instant::now();
            drop(master);
            // r1 is still connected, so the master waits for the grace period (0.5 s) first.
            assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
            let (e, waited) = waiter.join().unwrap();
            assert!(waited < Duration::from_secs(4), "{waited:?}");
            assert!(
                matches!(
                    e,
                    StoreError::ShuttingDown { .. } | StoreError::MasterClosed { .. }
                ),
                "{e}"
            );
        });
        let e = r1.set("k", b"v").unwrap_err().to_string();
        assert!(
            e.starts_with("the master closed the connection (rank 0 exited?)")
                || e.starts_with("cannot reach master"),
            "{e}"
        );
    }

    #[test]
    fn memory_store_semantics() {
        let g = MemoryStore::group_with_timeout(3, Duration::from_millis(300));
        assert_eq!(g[2].rank(), 2);
        assert_eq!(g[0].world_size(), 3);
        thread::scope(|sc| {
            for s in &g {
                sc.spawn(move || {
                    if s.rank() == 1 {
                        thread::sleep(Duration::from_millis(50));
                        s.set("k", b"v").unwrap();
                    }
                    assert_eq!(s.get("k").unwrap(), b"v");
                    s.add("n", 1).unwrap();
                    s.barrier("b").unwrap();
                    assert_eq!(s.get("n").unwrap(), b"3");
                    s.barrier("b").unwrap();
                });
            }
        });
        let e = g[0].get("absent").unwrap_err().to_string();
        assert_eq!(e, "get 'absent' timed out after 0.3 s: no rank set it");
        let e = g[0].barrier("lonely").unwrap_err();
        assert_eq!(
            e.to_string(),
            "barrier 'lonely' timed out after 0.3 s: ranks 1,2 of 3 did not reach the barrier"
        );
        g[0].set("text", b"abc").unwrap();
        assert!(matches!(
            g[1].add("text", 1),
            Err(StoreError::Refused { .. })
        ));
        let typed = MemoryStore::handles(1, T);
        typed[0].set("x", b"1").unwrap();
        assert!(typed[0].delete("x"));
        assert!(!typed[0].delete("x"));
    }

    #[test]
    fn store_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Store>();
        check::<MemoryStore>();
        let _: Box<dyn KvStore> = Box::new(Store::connect(&cfg(0, 0, 1, T)).unwrap());
    }
}
