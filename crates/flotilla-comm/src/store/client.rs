//! The store's client, [`Store`]: connecting (with backoff, and rank 0 starting the server
//! first), the hello, a small pool of connections so concurrent calls do not queue behind a
//! parked one, the operations (`set`, `get`, `add`, `wait`, `delete`, `barrier`), and turning
//! the server's answers into [`StoreError`]s.

use std::collections::HashMap;
use std::io::{self, Write};
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::config::{host_port, StoreConfig};
use super::error::{check_key, show_bytes, show_key, show_keys, StoreError};
use super::kv::KvStore;
use super::lock;
use super::server::{bind, connectable, Server};
use super::wire::{
    err_kind, op, read_frame, Dec, Enc, FrameError, FLAG_PRIMARY, MAX_FRAME, MAX_HELLO_FRAME,
    MAX_RUN_ID_LEN, MAX_TIMEOUT, MAX_VALUE_LEN, MAX_WAIT_KEYS, PROTOCOL_MAGIC, PROTOCOL_VERSION,
};

/// How much longer than an operation's timeout a client waits for the server's answer.
const RESPONSE_SLACK: Duration = Duration::from_secs(5);
/// Longest single connection attempt.
const MAX_CONNECT_ATTEMPT: Duration = Duration::from_secs(5);

/// `d` in whole milliseconds, saturating: timeouts travel as `u64` milliseconds.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing::{cfg, group, T};
    use crate::store::MAX_KEY_LEN;
    use std::net::TcpListener;
    use std::thread;

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
}
