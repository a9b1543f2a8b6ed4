//! The store's server, run by rank 0: binding the listener (with errors that say what to fix),
//! an accept thread, one thread per connection, the hello check, the request handlers (which
//! park blocking requests until they can answer or time out, then name who is missing), and a
//! shutdown that gives the other ranks a grace period and never hangs.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;
use std::io::{self, Write};
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::config::host_port;
use super::error::{ranks_of, secs, show_bytes, show_key, show_keys, StoreError};
use super::lock;
use super::table::Table;
use super::wire::{
    err_frame, err_kind, op, read_frame, timeout_frame, Dec, Enc, FrameError, FLAG_PRIMARY,
    MAX_FRAME, MAX_HELLO_FRAME, MAX_TIMEOUT, MAX_VALUE_LEN, MAX_WAIT_KEYS, PROTOCOL_MAGIC,
    PROTOCOL_VERSION,
};

/// Longest grace period rank 0's drop gives the other ranks to disconnect.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Rejected hellos remembered for timeout messages.
const MAX_REJECTIONS: usize = 16;

/// Whether a connection's first bytes look like an HTTP request (said in the log).
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
pub(super) struct Server {
    shared: Arc<ServerShared>,
    accept: Option<JoinHandle<()>>,
    /// Where to connect to wake the accept thread.
    wake: SocketAddr,
    grace: Duration,
}

impl Server {
    pub(super) fn start(
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
    pub(super) fn shutdown(&mut self) {
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
pub(super) fn connectable(mut addr: SocketAddr) -> SocketAddr {
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr.ip() {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
        });
    }
    addr
}

pub(super) fn bind(host: &str, port: u16, world_size: usize) -> Result<TcpListener, StoreError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing::{cfg, group, T};
    use crate::store::{Store, StoreError};
    use std::io::Read;
    use std::thread;

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
}
