//! CPU backend: collectives over TCP between ranks, for CPU training and for every multi-rank
//! test on machines without GPUs.
//!
//! Set-up: each rank listens on the interface that routes to the master (or `listen_ip`),
//! publishes `ip:port` in the store under `cpu/<group>/addr/<rank>`, connects to every higher
//! rank and accepts every lower one (one full-duplex TCP connection per peer pair, TCP_NODELAY,
//! read and write timeouts from the configured timeout).
//!
//! Execution: a communicator owns one communication thread that runs submitted operations in
//! FIFO order (so `Work`s are truly asynchronous and complete in submission order), and one
//! writer thread per peer, so a rank can stream its outgoing chunks while it reads and reduces
//! incoming ones: both ends of a link sending large buffers at once never deadlock. Large
//! reads sleep in `poll()` until up to 1 MiB has arrived (SO_RCVLOWAT) rather than waking for
//! every TCP segment.
//!
//! Algorithms:
//! - small buffers (≤ `small_bytes`): direct exchange — every rank sends its data to every
//!   peer and reduces all contributions in rank order (one round trip; the same result bits on
//!   every rank); tiny messages are written by the communication thread itself;
//! - large buffers: ring reduce-scatter then ring all-gather (all_reduce), ring reduce-scatter,
//!   ring all-gather, and a pipelined chain for broadcast, each in chunks of `chunk_bytes` so a
//!   rank forwards chunk i while chunk i+1 is still arriving.
//!
//! Copies: data is sent straight from the caller's buffer and, where the algorithm allows,
//! received straight into it (all-gather phases, broadcast); reductions read an incoming chunk
//! from a small scratch buffer and combine it in place. bf16/f16 are combined in f32, rounded
//! once per hop as NCCL does; the small path accumulates all ranks in f32 and rounds once.
//!
//! Tuning (environment): `FLOTILLA_CPU_CHUNK_BYTES` (default 1 MiB), `FLOTILLA_CPU_SMALL_BYTES`
//! (default 64 KiB), `FLOTILLA_CPU_LISTEN_IP` (the address to listen on and advertise).
//!
//! Failures: a read or write error, EOF or timeout names the peer (`rank 2 (10.0.0.3:41234)
//! closed the connection during all_reduce`); the communicator then shuts all its connections
//! so its other peers fail at once instead of waiting for their timeout, and every later
//! operation returns `CommError::Aborted`.

use super::comm::{
    split_membership, Backend, CommError, Communicator, DType, Device, Element, OpKind, RawOp,
    ReduceOp, Work, WorkHandle,
};
use super::store::KvStore;
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use std::io::{self, Read, Write};
use std::net::{
    IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket,
};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Options of the CPU backend.
#[derive(Debug, Clone)]
pub struct CpuOptions {
    /// How long any single read or write may wait on a peer, and the connection set-up limit.
    pub timeout: Duration,
    /// Host to route to when picking the interface to listen on (usually `MASTER_ADDR`).
    pub route_to: Option<String>,
    /// Listen on this address instead (`FLOTILLA_CPU_LISTEN_IP` overrides both).
    pub listen_ip: Option<IpAddr>,
    /// Pipelining granularity of the ring algorithms.
    pub chunk_bytes: usize,
    /// Buffers up to this size use the direct-exchange algorithms.
    pub small_bytes: usize,
}

impl Default for CpuOptions {
    fn default() -> Self {
        CpuOptions {
            timeout: Duration::from_secs(1800),
            route_to: None,
            listen_ip: None,
            chunk_bytes: env_bytes("FLOTILLA_CPU_CHUNK_BYTES").unwrap_or(1 << 20),
            small_bytes: env_bytes("FLOTILLA_CPU_SMALL_BYTES").unwrap_or(64 << 10),
        }
    }
}

fn env_bytes(name: &str) -> Option<usize> {
    std::env::var(name)
        .ok()?
        .trim()
        .parse()
        .ok()
        .filter(|&v: &usize| v > 0)
}

/// In the direct (small-buffer) algorithms and barriers, messages of at most this size are
/// written by the communication thread itself when the peer's writer is idle (saves two thread
/// switches per small collective). There every link carries one such message per operation,
/// and socket buffers always absorb a few of them, so two ranks can never both sit in a write
/// waiting for the other to read. The pipelined rings always go through the writer threads.
const INLINE_WRITE_MAX: usize = 8 << 10;

const HELLO_MAGIC: u32 = 0xF107_C0DE;

/// Reads of at least `LOWAT_MIN` bytes ask the kernel (SO_RCVLOWAT) to wake the reader only
/// once up to `LOWAT_MAX` bytes have arrived: fewer wake-ups and larger copies per syscall.
const LOWAT_MIN: usize = 64 << 10;
const LOWAT_MAX: usize = 1 << 20;

fn set_rcvlowat(s: &TcpStream, bytes: usize) {
    let v = bytes.min(i32::MAX as usize) as libc::c_int;
    // SAFETY: plain setsockopt on an open socket with a c_int value.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVLOWAT,
            &v as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// The CPU (TCP) communicator. See the module docs.
pub struct CpuComm {
    rank: usize,
    n: usize,
    globals: Arc<Vec<usize>>,
    group: String,
    store: Arc<dyn KvStore>,
    opts: CpuOptions,
    splits: AtomicUsize,
    tx: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

struct Job {
    op: RawOp,
    slot: Arc<Slot>,
}

#[derive(Default)]
struct Slot {
    result: Mutex<Option<Result<(), CommError>>>,
    cv: Condvar,
    done: AtomicBool,
}

impl Slot {
    fn complete(&self, r: Result<(), CommError>) {
        *self.result.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
        self.done.store(true, Ordering::Release);
        self.cv.notify_all();
    }
}

struct CpuWork {
    slot: Arc<Slot>,
}

impl WorkHandle for CpuWork {
    fn wait(&mut self) -> Result<(), CommError> {
        let mut g = self.slot.result.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(r) = g.take() {
                return r;
            }
            if self.slot.done.load(Ordering::Acquire) {
                return Ok(()); // result already taken by an earlier wait
            }
            g = self.slot.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn is_completed(&self) -> bool {
        self.slot.done.load(Ordering::Acquire)
    }
}

impl CpuComm {
    /// The world group of `store` (its rank and world size). Collective over all ranks.
    pub fn new(store: Arc<dyn KvStore>, opts: CpuOptions) -> Result<CpuComm, CommError> {
        let (rank, n) = (store.rank(), store.world_size());
        if rank >= n {
            return Err(CommError::setup(
                Backend::Cpu,
                format!("rank {rank} out of range for world size {n}"),
            ));
        }
        // Every rank creates communicators in the same order, so a per-rank counter names the
        // group identically everywhere (and never collides with an earlier group on the store).
        let generation = store.add(&format!("cpu/generation/{rank}"), 1)?;
        CpuComm::with_group(
            store,
            opts,
            format!("g{generation}"),
            rank,
            (0..n).collect(),
        )
    }

    fn with_group(
        store: Arc<dyn KvStore>,
        opts: CpuOptions,
        group: String,
        rank: usize,
        globals: Vec<usize>,
    ) -> Result<CpuComm, CommError> {
        let n = globals.len();
        let conns = if n > 1 {
            connect_mesh(store.as_ref(), &group, rank, &globals, &opts)?
        } else {
            Vec::new()
        };
        let mut peers = Vec::with_capacity(n);
        for (q, conn) in conns.into_iter().enumerate() {
            peers.push(match conn {
                None => None,
                Some(c) => Some(Peer::start(c, globals[q], &group)?),
            });
        }
        let engine = Engine {
            rank,
            n,
            peers,
            timeout: opts.timeout,
            chunk_bytes: opts.chunk_bytes.max(4096),
            small_bytes: opts.small_bytes,
            scratch: Vec::new(),
            poisoned: None,
            op: "setup",
            inline_ok: false,
        };
        let (tx, rx) = mpsc::channel::<Job>();
        let thread = std::thread::Builder::new()
            .name(format!("comm-{group}"))
            .spawn(move || engine.serve(rx))
            .map_err(|e| {
                CommError::setup(
                    Backend::Cpu,
                    format!("spawning the communication thread: {e}"),
                )
            })?;
        Ok(CpuComm {
            rank,
            n,
            globals: Arc::new(globals),
            group,
            store,
            opts,
            splits: AtomicUsize::new(0),
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    /// The store-level name of this group (`g1`, `g1.0.3`, …).
    pub fn group_name(&self) -> &str {
        &self.group
    }

    /// Global rank (rank in the store's world) of each member, in group-rank order.
    pub fn global_ranks(&self) -> &[usize] {
        &self.globals
    }
}

impl Drop for CpuComm {
    fn drop(&mut self) {
        self.tx = None; // the thread finishes queued work, then exits
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Communicator for CpuComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.n
    }

    fn backend(&self) -> Backend {
        Backend::Cpu
    }

    fn device(&self) -> Device {
        Device::Cpu
    }

    unsafe fn submit(&self, op: RawOp) -> Result<Work<'static>, CommError> {
        op.validate(self.rank, self.n)?;
        if op.count == 0 && op.kind != OpKind::Barrier {
            return Ok(Work::completed());
        }
        if self.n == 1 {
            // SAFETY: the caller guarantees the buffers (see `Communicator::submit`).
            unsafe { local_only(&op) };
            return Ok(Work::completed());
        }
        let slot = Arc::new(Slot::default());
        let job = Job {
            op,
            slot: slot.clone(),
        };
        let tx = self
            .tx
            .as_ref()
            .expect("sender lives as long as the communicator");
        tx.send(job)
            .map_err(|_| CommError::Aborted("the communication thread has exited".into()))?;
        Ok(Work::from_handle(Box::new(CpuWork { slot })))
    }

    fn split(&self, color: usize, key: usize) -> Result<Box<dyn Communicator>, CommError> {
        let seq = self.splits.fetch_add(1, Ordering::Relaxed);
        let base = format!("cpu/{}/split{seq}", self.group);
        self.store.set(
            &format!("{base}/{}", self.rank),
            format!("{color} {key}").as_bytes(),
        )?;
        let mut all = Vec::with_capacity(self.n);
        for q in 0..self.n {
            let v = self.store.get(&format!("{base}/{q}"))?;
            let s = String::from_utf8_lossy(&v);
            let mut it = s.split(' ').map(|x| x.parse::<usize>());
            match (it.next(), it.next()) {
                (Some(Ok(c)), Some(Ok(k))) => all.push((c, k)),
                _ => {
                    return Err(CommError::Store(format!(
                        "malformed split entry {s:?} of rank {q}"
                    )))
                }
            }
        }
        let (members, new_rank) = split_membership(&all, self.rank);
        let globals = members.iter().map(|&q| self.globals[q]).collect();
        let group = format!("{}.{seq}.{color}", self.group);
        let comm = CpuComm::with_group(
            self.store.clone(),
            self.opts.clone(),
            group,
            new_rank,
            globals,
        )?;
        Ok(Box::new(comm))
    }
}

/// A collective in a group of one: only the out-of-place copies remain.
///
/// # Safety
/// As `Communicator::submit`.
unsafe fn local_only(op: &RawOp) {
    let bytes = op.count * op.dtype.size();
    if op.kind != OpKind::Barrier && !std::ptr::eq(op.send, op.recv) {
        // SAFETY: validated non-overlapping (or in-place) buffers of `bytes` each.
        unsafe { std::ptr::copy(op.send, op.recv, bytes) };
    }
}

// ---------------------------------------------------------------------------------------------
// Connection set-up

struct Conn {
    stream: TcpStream,
    addr: String,
}

fn addr_key(group: &str, rank: usize) -> String {
    format!("cpu/{group}/addr/{rank}")
}

fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The local address of the route towards `host` (no packet is sent), else loopback.
fn route_ip(host: Option<&str>) -> IpAddr {
    let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let Some(host) = host.filter(|h| !h.is_empty()) else {
        return loopback;
    };
    let Ok(addrs) = (host, 9).to_socket_addrs() else {
        return loopback;
    };
    for a in addrs {
        let bind: SocketAddr = if a.is_ipv4() {
            "0.0.0.0:0".parse().unwrap()
        } else {
            "[::]:0".parse().unwrap()
        };
        if let Ok(u) = UdpSocket::bind(bind) {
            if u.connect(a).is_ok() {
                if let Ok(l) = u.local_addr() {
                    return l.ip();
                }
            }
        }
    }
    loopback
}

fn listen_ip(opts: &CpuOptions) -> IpAddr {
    if let Some(ip) = std::env::var("FLOTILLA_CPU_LISTEN_IP")
        .ok()
        .and_then(|s| s.trim().parse().ok())
    {
        return ip;
    }
    opts.listen_ip
        .unwrap_or_else(|| route_ip(opts.route_to.as_deref()))
}

fn hello(group_hash: u64, rank: usize) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[..4].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
    h[4..12].copy_from_slice(&group_hash.to_le_bytes());
    h[12..].copy_from_slice(&(rank as u32).to_le_bytes());
    h
}

/// Connects every pair of ranks of the group (lower rank accepts, higher rank connects).
fn connect_mesh(
    store: &dyn KvStore,
    group: &str,
    rank: usize,
    globals: &[usize],
    opts: &CpuOptions,
) -> Result<Vec<Option<Conn>>, CommError> {
    let n = globals.len();
    let setup = |msg: String| CommError::setup(Backend::Cpu, msg);
    let ip = listen_ip(opts);
    let listener =
        TcpListener::bind((ip, 0)).map_err(|e| setup(format!("listening on {ip}: {e}")))?;
    let me = listener.local_addr().map_err(|e| setup(e.to_string()))?;
    store.set(&addr_key(group, rank), me.to_string().as_bytes())?;
    let deadline = Instant::now() + opts.timeout;
    let group_hash = fnv1a(group);
    let mut conns: Vec<Option<Conn>> = (0..n).map(|_| None).collect();

    for (q, conn) in conns.iter_mut().enumerate().skip(rank + 1) {
        let addr_s = String::from_utf8_lossy(&store.get(&addr_key(group, q))?).into_owned();
        let addr: SocketAddr = addr_s.parse().map_err(|_| {
            CommError::Store(format!("bad address {addr_s:?} for rank {}", globals[q]))
        })?;
        let mut stream = loop {
            match TcpStream::connect_timeout(&addr, Duration::from_secs(5).min(opts.timeout)) {
                Ok(s) => break s,
                Err(e) if Instant::now() >= deadline => {
                    return Err(setup(format!(
                        "connecting to rank {} ({addr_s}): {e}",
                        globals[q]
                    )))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        };
        stream
            .write_all(&hello(group_hash, rank))
            .map_err(|e| setup(format!("greeting rank {} ({addr_s}): {e}", globals[q])))?;
        *conn = Some(Conn {
            stream,
            addr: addr_s,
        });
    }

    listener
        .set_nonblocking(true)
        .map_err(|e| setup(e.to_string()))?;
    let mut missing = rank;
    while missing > 0 {
        match listener.accept() {
            Ok((mut s, from)) => {
                let _ = s.set_nonblocking(false);
                let _ = s.set_read_timeout(Some(
                    deadline
                        .saturating_duration_since(Instant::now())
                        .max(Duration::from_millis(100)),
                ));
                let mut h = [0u8; 16];
                if s.read_exact(&mut h).is_err() {
                    continue; // not one of ours, or gone
                }
                let magic = u32::from_le_bytes(h[..4].try_into().unwrap());
                let ghash = u64::from_le_bytes(h[4..12].try_into().unwrap());
                let q = u32::from_le_bytes(h[12..].try_into().unwrap()) as usize;
                if magic != HELLO_MAGIC || ghash != group_hash || q >= rank || conns[q].is_some() {
                    tracing::warn!(
                        "ignoring unexpected connection from {from} while setting up group {group}"
                    );
                    continue;
                }
                let addr = String::from_utf8_lossy(&store.get(&addr_key(group, q))?).into_owned();
                conns[q] = Some(Conn { stream: s, addr });
                missing -= 1;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let absent: Vec<usize> = (0..rank)
                        .filter(|&q| conns[q].is_none())
                        .map(|q| globals[q])
                        .collect();
                    return Err(setup(format!(
                        "timed out after {:?} waiting for ranks {absent:?} to connect to {me}",
                        opts.timeout
                    )));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(setup(format!("accepting connections on {me}: {e}"))),
        }
    }
    for c in conns.iter().flatten() {
        let s = &c.stream;
        let r = s
            .set_nodelay(true)
            .and_then(|_| s.set_read_timeout(Some(opts.timeout)))
            .and_then(|_| s.set_write_timeout(Some(opts.timeout)));
        r.map_err(|e| setup(format!("configuring the connection to {}: {e}", c.addr)))?;
    }
    Ok(conns)
}

// ---------------------------------------------------------------------------------------------
// Peers and their writer threads

#[derive(Debug, Clone)]
enum Failure {
    Closed,
    TimedOut,
    Io(io::ErrorKind, String),
}

fn classify(e: &io::Error) -> Failure {
    use io::ErrorKind::*;
    match e.kind() {
        UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe | NotConnected => {
            Failure::Closed
        }
        WouldBlock | TimedOut => Failure::TimedOut,
        k => Failure::Io(k, e.to_string()),
    }
}

struct SendItem {
    ptr: *const u8,
    len: usize,
}

// SAFETY: the engine only enqueues memory that stays valid and unmodified until the writer
// reports the item done (it waits for that before completing the operation).
unsafe impl Send for SendItem {}

#[derive(Default)]
struct WriterState {
    done: u64,
    failure: Option<Failure>,
}

#[derive(Default)]
struct WriterShared {
    state: Mutex<WriterState>,
    cv: Condvar,
}

impl WriterShared {
    fn lock(&self) -> std::sync::MutexGuard<'_, WriterState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

struct Peer {
    global: usize,
    addr: String,
    stream: TcpStream,
    /// Current SO_RCVLOWAT (large reads wait for big batches instead of waking per segment).
    lowat: usize,
    tx: Option<mpsc::Sender<SendItem>>,
    shared: Arc<WriterShared>,
    issued: u64,
    thread: Option<JoinHandle<()>>,
}

impl Peer {
    fn start(conn: Conn, global: usize, group: &str) -> Result<Peer, CommError> {
        let w = conn.stream.try_clone().map_err(|e| {
            CommError::setup(
                Backend::Cpu,
                format!("cloning the socket to {}: {e}", conn.addr),
            )
        })?;
        let shared = Arc::new(WriterShared::default());
        let (tx, rx) = mpsc::channel::<SendItem>();
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("comm-{group}-w{global}"))
            .spawn(move || writer_loop(w, rx, sh))
            .map_err(|e| {
                CommError::setup(Backend::Cpu, format!("spawning a writer thread: {e}"))
            })?;
        Ok(Peer {
            global,
            addr: conn.addr,
            stream: conn.stream,
            lowat: 1,
            tx: Some(tx),
            shared,
            issued: 0,
            thread: Some(thread),
        })
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn writer_loop(mut sock: TcpStream, rx: mpsc::Receiver<SendItem>, shared: Arc<WriterShared>) {
    let mut failed = false;
    for item in rx {
        if !failed {
            // SAFETY: see `SendItem`.
            let buf = unsafe { std::slice::from_raw_parts(item.ptr, item.len) };
            if let Err(e) = sock.write_all(buf) {
                failed = true;
                let _ = sock.shutdown(Shutdown::Both);
                let mut st = shared.lock();
                st.failure.get_or_insert(classify(&e));
            }
        }
        let mut st = shared.lock();
        st.done += 1;
        drop(st);
        shared.cv.notify_all();
    }
}

// ---------------------------------------------------------------------------------------------
// The engine: runs on the communication thread

struct Engine {
    rank: usize,
    n: usize,
    peers: Vec<Option<Peer>>,
    timeout: Duration,
    chunk_bytes: usize,
    small_bytes: usize,
    scratch: Vec<u64>,
    poisoned: Option<String>,
    op: &'static str,
    /// Whether the running algorithm may write small messages inline (see INLINE_WRITE_MAX).
    inline_ok: bool,
}

static BARRIER_TOKEN: [u8; 1] = [0xB7];

impl Engine {
    fn serve(mut self, rx: mpsc::Receiver<Job>) {
        while let Ok(job) = rx.recv() {
            let res = match &self.poisoned {
                Some(msg) => Err(CommError::Aborted(msg.clone())),
                None => {
                    self.op = job.op.kind.name();
                    // SAFETY: `submit`'s contract covers the buffers until the slot completes.
                    let r = unsafe { self.run(&job.op) };
                    if let Err(e) = &r {
                        self.poison(e);
                    }
                    r
                }
            };
            job.slot.complete(res);
        }
    }

    /// After a failure: shut every connection (peers fail at once rather than at their
    /// timeout), let the writers drain so no thread touches the caller's buffers any more.
    fn poison(&mut self, e: &CommError) {
        tracing::error!("collective failed: {e}");
        self.poisoned = Some(e.to_string());
        for p in self.peers.iter().flatten() {
            let _ = p.stream.shutdown(Shutdown::Both);
        }
        for p in self.peers.iter().flatten() {
            let mut st = p.shared.lock();
            while st.done < p.issued {
                st = p.shared.cv.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        }
    }

    fn peer(&self, q: usize) -> &Peer {
        self.peers[q].as_ref().expect("a peer of this group")
    }

    fn error(&self, q: usize, f: Failure) -> CommError {
        let p = self.peer(q);
        let (rank, addr, op) = (p.global, p.addr.clone(), self.op);
        match f {
            Failure::Closed => CommError::PeerClosed { rank, addr, op },
            Failure::TimedOut => CommError::Timeout {
                rank,
                addr,
                op,
                timeout: self.timeout,
            },
            Failure::Io(kind, msg) => CommError::Io {
                rank,
                addr,
                op,
                source: io::Error::new(kind, msg),
            },
        }
    }

    /// Queues `len` elements at `p` for peer `q`.
    fn send<T>(&mut self, q: usize, p: *const T, len: usize) -> Result<(), CommError> {
        let bytes = len * std::mem::size_of::<T>();
        if bytes == 0 {
            return Ok(());
        }
        let peer = self.peers[q].as_mut().expect("a peer of this group");
        let failed = peer.shared.lock().failure.clone();
        if let Some(f) = failed {
            return Err(self.error(q, f));
        }
        if self.inline_ok && bytes <= INLINE_WRITE_MAX {
            let st = peer.shared.lock();
            if st.done == peer.issued && st.failure.is_none() {
                drop(st);
                // SAFETY: the caller's buffer, valid for the operation; the writer is idle.
                let buf = unsafe { std::slice::from_raw_parts(p as *const u8, bytes) };
                if let Err(e) = (&peer.stream).write_all(buf) {
                    let f = classify(&e);
                    peer.shared.lock().failure.get_or_insert(f.clone());
                    return Err(self.error(q, f));
                }
                return Ok(());
            }
        }
        peer.issued += 1;
        let item = SendItem {
            ptr: p as *const u8,
            len: bytes,
        };
        if peer.tx.as_ref().is_none_or(|tx| tx.send(item).is_err()) {
            peer.issued -= 1;
            return Err(self.error(
                q,
                Failure::Io(io::ErrorKind::Other, "writer thread exited".into()),
            ));
        }
        Ok(())
    }

    /// Reads exactly `len` elements from peer `q` into `p`.
    fn recv<T>(&mut self, q: usize, p: *mut T, len: usize) -> Result<(), CommError> {
        let bytes = len * std::mem::size_of::<T>();
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: `p` points into the caller's buffer or our scratch, valid for `len`.
        let buf = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, bytes) };
        let wait_ms = self.timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        let peer = self.peers[q].as_mut().expect("a peer of this group");
        let fd = peer.stream.as_raw_fd();
        let mut done = 0;
        while done < bytes {
            let left = bytes - done;
            if left < LOWAT_MIN {
                // Small remainder: a plain blocking read (SO_RCVTIMEO bounds it).
                if peer.lowat != 1 {
                    set_rcvlowat(&peer.stream, 1);
                    peer.lowat = 1;
                }
                match (&peer.stream).read(&mut buf[done..]) {
                    Ok(0) => return Err(self.read_error(q, io::ErrorKind::UnexpectedEof.into())),
                    Ok(k) => done += k,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(self.read_error(q, e)),
                }
                continue;
            }
            // Large remainder: take what is queued without blocking; when nothing is, sleep
            // in poll() until SO_RCVLOWAT bytes (never more than this message still owes us)
            // are queued, so the reader wakes once per big batch instead of per segment. (A
            // blocking read with a raised SO_RCVLOWAT can sleep forever: the kernel compares
            // the low-water mark with what is still queued, not with what the call copied.)
            // SAFETY: `buf[done..]` is valid for `left` bytes.
            let k = unsafe {
                libc::recv(
                    fd,
                    buf[done..].as_mut_ptr() as *mut libc::c_void,
                    left,
                    libc::MSG_DONTWAIT,
                )
            };
            if k > 0 {
                done += k as usize;
                continue;
            }
            if k == 0 {
                return Err(self.read_error(q, io::ErrorKind::UnexpectedEof.into()));
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                io::ErrorKind::WouldBlock => {}
                _ => return Err(self.read_error(q, e)),
            }
            let want = left.min(LOWAT_MAX);
            if peer.lowat != want {
                set_rcvlowat(&peer.stream, want);
                peer.lowat = want;
            }
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut pfd, 1, wait_ms) };
            if r == 0 {
                return Err(self.read_error(q, io::ErrorKind::TimedOut.into()));
            }
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(self.read_error(q, e));
                }
            }
        }
        Ok(())
    }

    fn read_error(&self, q: usize, e: io::Error) -> CommError {
        // If our writer to `q` failed first (and shut the socket), its cause is the real one.
        let f = self
            .peer(q)
            .shared
            .lock()
            .failure
            .clone()
            .unwrap_or_else(|| classify(&e));
        self.error(q, f)
    }

    fn issued(&self, q: usize) -> u64 {
        self.peer(q).issued
    }

    /// Waits until the first `upto` queued sends to `q` are written.
    fn wait_sent(&self, q: usize, upto: u64) -> Result<(), CommError> {
        let p = self.peer(q);
        let mut st = p.shared.lock();
        loop {
            if let Some(f) = st.failure.clone() {
                drop(st);
                return Err(self.error(q, f));
            }
            if st.done >= upto {
                return Ok(());
            }
            st = p.shared.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn wait_all_sent(&self) -> Result<(), CommError> {
        for q in 0..self.n {
            if q != self.rank {
                self.wait_sent(q, self.issued(q))?;
            }
        }
        Ok(())
    }

    /// Scratch space for `elems` elements of `T` (8-byte aligned, reused across operations).
    fn scratch<T>(&mut self, elems: usize) -> *mut T {
        let words = (elems * std::mem::size_of::<T>()).div_ceil(8);
        if self.scratch.len() < words {
            self.scratch.resize(words, 0);
        }
        self.scratch.as_mut_ptr() as *mut T
    }

    fn chunk_elems<T>(&self) -> usize {
        (self.chunk_bytes / std::mem::size_of::<T>()).max(1)
    }

    /// # Safety
    /// `op`'s buffers are valid as `Communicator::submit` promises.
    unsafe fn run(&mut self, op: &RawOp) -> Result<(), CommError> {
        // SAFETY: forwarded contract.
        unsafe {
            match op.dtype {
                DType::F32 => self.run_t::<f32>(op),
                DType::BF16 => self.run_t::<bf16>(op),
                DType::F16 => self.run_t::<f16>(op),
                DType::I64 => self.run_t::<i64>(op),
            }
        }
    }

    unsafe fn run_t<T: Kernel>(&mut self, op: &RawOp) -> Result<(), CommError> {
        let (n, r) = (self.n, self.rank);
        let k = op.count;
        let send = op.send as *const T;
        let recv = op.recv as *mut T;
        let size = std::mem::size_of::<T>();
        let small = |total: usize| total * size <= self.small_bytes;
        // Direct exchange for small buffers (and fewer elements than ranks), rings otherwise.
        let direct = match op.kind {
            OpKind::Barrier => true,
            OpKind::AllReduce(_) => small(k) || k < n,
            OpKind::ReduceScatter(_) | OpKind::AllGather => small(n * k),
            OpKind::Broadcast { .. } => small(k),
        };
        self.inline_ok = direct;
        // SAFETY (whole body): pointer offsets stay within the lengths `RawOp` documents.
        unsafe {
            match op.kind {
                OpKind::Barrier => self.barrier(),
                OpKind::AllReduce(rop) => {
                    if !std::ptr::eq(send, recv) {
                        std::ptr::copy_nonoverlapping(send, recv, k);
                    }
                    if direct {
                        self.direct_all_reduce(recv, k, rop)
                    } else {
                        self.ring_all_reduce(recv, k, rop)
                    }
                }
                OpKind::ReduceScatter(rop) => {
                    if direct {
                        self.direct_reduce_scatter(send, recv, k, rop)
                    } else if std::ptr::eq(recv, send.add(r * k)) {
                        self.ring_reduce_scatter_in_place(send as *mut T, k, rop)
                    } else {
                        self.ring_reduce_scatter(send, recv, k, rop)
                    }
                }
                OpKind::AllGather => {
                    let own = recv.add(r * k);
                    if !std::ptr::eq(own, send) {
                        std::ptr::copy_nonoverlapping(send, own, k);
                    }
                    if direct {
                        self.direct_all_gather(recv, k)
                    } else {
                        self.ring_all_gather(recv, k)
                    }
                }
                OpKind::Broadcast { root } => {
                    if !std::ptr::eq(send, recv) {
                        std::ptr::copy_nonoverlapping(send, recv, k);
                    }
                    if direct {
                        self.direct_broadcast(recv, k, root)
                    } else {
                        self.chain_broadcast(recv, k, root)
                    }
                }
            }
        }
    }

    fn barrier(&mut self) -> Result<(), CommError> {
        let mut got = [0u8; 1];
        for q in 0..self.n {
            if q != self.rank {
                self.send(q, BARRIER_TOKEN.as_ptr(), 1)?;
            }
        }
        for q in 0..self.n {
            if q != self.rank {
                self.recv(q, got.as_mut_ptr(), 1)?;
            }
        }
        self.wait_all_sent()
    }

    /// Scratch slot of peer `q` when every peer's `len` elements are received at once.
    fn slot_index(&self, q: usize) -> usize {
        if q < self.rank {
            q
        } else {
            q - 1
        }
    }

    unsafe fn direct_all_reduce<T: Kernel>(
        &mut self,
        buf: *mut T,
        len: usize,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let (n, r) = (self.n, self.rank);
        for q in (0..n).filter(|&q| q != r) {
            self.send(q, buf, len)?;
        }
        let scratch = self.scratch::<T>((n - 1) * len);
        for q in (0..n).filter(|&q| q != r) {
            // SAFETY: slot within the (n-1)*len scratch.
            self.recv(q, unsafe { scratch.add(self.slot_index(q) * len) }, len)?;
        }
        self.wait_all_sent()?;
        let srcs: Vec<*const T> = (0..n)
            .map(|q| {
                if q == r {
                    buf as *const T
                } else {
                    unsafe { scratch.add(self.slot_index(q) * len) as *const T }
                }
            })
            .collect();
        // SAFETY: every source holds `len` elements; `buf` is one of them, handled blockwise.
        unsafe { reduce_ordered(&srcs, buf, len, op) };
        Ok(())
    }

    unsafe fn direct_reduce_scatter<T: Kernel>(
        &mut self,
        input: *const T,
        out: *mut T,
        k: usize,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let (n, r) = (self.n, self.rank);
        for q in (0..n).filter(|&q| q != r) {
            self.send(q, unsafe { input.add(q * k) }, k)?;
        }
        let scratch = self.scratch::<T>((n - 1) * k);
        for q in (0..n).filter(|&q| q != r) {
            self.recv(q, unsafe { scratch.add(self.slot_index(q) * k) }, k)?;
        }
        self.wait_all_sent()?;
        let srcs: Vec<*const T> = (0..n)
            .map(|q| unsafe {
                if q == r {
                    input.add(r * k)
                } else {
                    scratch.add(self.slot_index(q) * k) as *const T
                }
            })
            .collect();
        // SAFETY: `out` is either disjoint from the sources or is `input + r*k` (in place).
        unsafe { reduce_ordered(&srcs, out, k, op) };
        Ok(())
    }

    unsafe fn direct_all_gather<T: Kernel>(
        &mut self,
        out: *mut T,
        k: usize,
    ) -> Result<(), CommError> {
        let (n, r) = (self.n, self.rank);
        let own = unsafe { out.add(r * k) };
        for q in (0..n).filter(|&q| q != r) {
            self.send(q, own, k)?;
        }
        for q in (0..n).filter(|&q| q != r) {
            self.recv(q, unsafe { out.add(q * k) }, k)?;
        }
        self.wait_all_sent()
    }

    unsafe fn direct_broadcast<T: Kernel>(
        &mut self,
        buf: *mut T,
        len: usize,
        root: usize,
    ) -> Result<(), CommError> {
        if self.rank == root {
            for q in (0..self.n).filter(|&q| q != root) {
                self.send(q, buf, len)?;
            }
            self.wait_all_sent()
        } else {
            self.recv(root, buf, len)
        }
    }

    /// Ring reduce-scatter phase shared by all_reduce and in-place reduce_scatter: on return,
    /// segment `rank` of `buf` holds the reduction; with `forward_last`, its chunks are already
    /// queued to the right neighbour (the first all-gather step). Returns the send count to the
    /// right neighbour before that last step.
    unsafe fn ring_rs_in_place<T: Kernel>(
        &mut self,
        buf: *mut T,
        seg: &dyn Fn(usize) -> (usize, usize),
        op: ReduceOp,
        forward_last: bool,
    ) -> Result<u64, CommError> {
        let (n, r) = (self.n, self.rank);
        let (right, left) = ((r + 1) % n, (r + n - 1) % n);
        let ce = self.chunk_elems::<T>();
        let scratch = self.scratch::<T>(ce);
        let (a, b) = seg((r + n - 1) % n);
        self.send(right, unsafe { buf.add(a) }, b - a)?;
        let mut mark = self.issued(right);
        for s in 0..n - 1 {
            let last = s == n - 2;
            if last {
                mark = self.issued(right);
            }
            let (a, b) = seg((r + 2 * n - 2 - s) % n);
            let div = (last && op == ReduceOp::Avg).then_some(n);
            let mut i = a;
            while i < b {
                let m = ce.min(b - i);
                self.recv(left, scratch, m)?;
                // SAFETY: disjoint chunk of `buf` and the scratch chunk.
                unsafe {
                    T::combine(
                        std::slice::from_raw_parts_mut(buf.add(i), m),
                        std::slice::from_raw_parts(scratch, m),
                        op,
                        div,
                    )
                };
                if !last || forward_last {
                    self.send(right, unsafe { buf.add(i) }, m)?;
                }
                i += m;
            }
        }
        Ok(mark)
    }

    unsafe fn ring_all_reduce<T: Kernel>(
        &mut self,
        buf: *mut T,
        len: usize,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let (n, r) = (self.n, self.rank);
        let seg = move |i: usize| seg_bounds(len, n, i);
        let mark = unsafe { self.ring_rs_in_place(buf, &seg, op, true)? };
        // The segments the all-gather overwrites were sent during the reduce-scatter.
        self.wait_sent((r + 1) % n, mark)?;
        unsafe { self.ring_ag_phase(buf, &seg)? };
        self.wait_all_sent()
    }

    unsafe fn ring_reduce_scatter_in_place<T: Kernel>(
        &mut self,
        buf: *mut T,
        k: usize,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let seg = move |i: usize| (i * k, (i + 1) * k);
        unsafe { self.ring_rs_in_place(buf, &seg, op, false)? };
        self.wait_all_sent()
    }

    /// Out-of-place ring reduce-scatter: partial sums travel through two scratch segments,
    /// the last step lands in `out`; `input` is only read.
    unsafe fn ring_reduce_scatter<T: Kernel>(
        &mut self,
        input: *const T,
        out: *mut T,
        k: usize,
        op: ReduceOp,
    ) -> Result<(), CommError> {
        let (n, r) = (self.n, self.rank);
        let (right, left) = ((r + 1) % n, (r + n - 1) % n);
        let ce = self.chunk_elems::<T>();
        let slots = if n > 2 {
            self.scratch::<T>(2 * k)
        } else {
            std::ptr::null_mut()
        };
        self.send(right, unsafe { input.add(((r + n - 1) % n) * k) }, k)?;
        let mut marks = [0u64; 2];
        for s in 0..n - 1 {
            let last = s == n - 2;
            let x = (r + 2 * n - 2 - s) % n;
            let dst = if last {
                out
            } else {
                unsafe { slots.add((s % 2) * k) }
            };
            if !last && s >= 2 {
                self.wait_sent(right, marks[s % 2])?;
            }
            let div = (last && op == ReduceOp::Avg).then_some(n);
            let mut i = 0;
            while i < k {
                let m = ce.min(k - i);
                self.recv(left, unsafe { dst.add(i) }, m)?;
                // SAFETY: `dst` (scratch or out) and `input` are disjoint.
                unsafe {
                    T::combine(
                        std::slice::from_raw_parts_mut(dst.add(i), m),
                        std::slice::from_raw_parts(input.add(x * k + i), m),
                        op,
                        div,
                    )
                };
                if !last {
                    self.send(right, unsafe { dst.add(i) }, m)?;
                }
                i += m;
            }
            if !last {
                marks[s % 2] = self.issued(right);
            }
        }
        self.wait_all_sent()
    }

    /// Ring all-gather steps after this rank's own segment has been queued to the right:
    /// step s receives segment (rank - s - 1) from the left straight into place and forwards it.
    unsafe fn ring_ag_phase<T: Kernel>(
        &mut self,
        buf: *mut T,
        seg: &dyn Fn(usize) -> (usize, usize),
    ) -> Result<(), CommError> {
        let (n, r) = (self.n, self.rank);
        let (right, left) = ((r + 1) % n, (r + n - 1) % n);
        let ce = self.chunk_elems::<T>();
        for s in 0..n - 1 {
            let (a, b) = seg((r + 2 * n - 1 - s) % n);
            let mut i = a;
            while i < b {
                let m = ce.min(b - i);
                self.recv(left, unsafe { buf.add(i) }, m)?;
                if s < n - 2 {
                    self.send(right, unsafe { buf.add(i) }, m)?;
                }
                i += m;
            }
        }
        Ok(())
    }

    unsafe fn ring_all_gather<T: Kernel>(
        &mut self,
        out: *mut T,
        k: usize,
    ) -> Result<(), CommError> {
        let (n, r) = (self.n, self.rank);
        self.send((r + 1) % n, unsafe { out.add(r * k) }, k)?;
        let seg = move |i: usize| (i * k, (i + 1) * k);
        unsafe { self.ring_ag_phase(out, &seg)? };
        self.wait_all_sent()
    }

    /// Pipelined chain from `root` around the ring.
    unsafe fn chain_broadcast<T: Kernel>(
        &mut self,
        buf: *mut T,
        len: usize,
        root: usize,
    ) -> Result<(), CommError> {
        let (n, r) = (self.n, self.rank);
        let (right, left) = ((r + 1) % n, (r + n - 1) % n);
        let pos = (r + n - root) % n;
        if pos == 0 {
            self.send(right, buf, len)?;
        } else {
            let ce = self.chunk_elems::<T>();
            let mut i = 0;
            while i < len {
                let m = ce.min(len - i);
                self.recv(left, unsafe { buf.add(i) }, m)?;
                if pos < n - 1 {
                    self.send(right, unsafe { buf.add(i) }, m)?;
                }
                i += m;
            }
        }
        self.wait_all_sent()
    }
}

/// Bounds of segment `i` when `len` elements are split into `n` nearly equal segments.
fn seg_bounds(len: usize, n: usize, i: usize) -> (usize, usize) {
    let at = |j: usize| ((j as u128 * len as u128) / n as u128) as usize;
    (at(i), at(i + 1))
}

/// `out = srcs[0] ∘ srcs[1] ∘ … ∘ srcs[n-1]` in that order (accumulating in f32 for the half
/// types); `out` may be one of the sources.
///
/// # Safety
/// Every source and `out` hold `len` elements.
unsafe fn reduce_ordered<T: Kernel>(srcs: &[*const T], out: *mut T, len: usize, op: ReduceOp) {
    const B: usize = 512;
    let mut acc = [T::Acc::default(); B];
    let mut tmp = [T::Acc::default(); B];
    let mut i = 0;
    while i < len {
        let m = B.min(len - i);
        // SAFETY: in-bounds blocks; reads end before the write to `out`.
        unsafe {
            T::to_acc(std::slice::from_raw_parts(srcs[0].add(i), m), &mut acc[..m]);
            for s in &srcs[1..] {
                T::to_acc(std::slice::from_raw_parts(s.add(i), m), &mut tmp[..m]);
                T::acc_combine(&mut acc[..m], &tmp[..m], op);
            }
            if op == ReduceOp::Avg {
                T::acc_div(&mut acc[..m], srcs.len());
            }
            T::from_acc(&acc[..m], std::slice::from_raw_parts_mut(out.add(i), m));
        }
        i += m;
    }
}

// ---------------------------------------------------------------------------------------------
// Element kernels

/// Arithmetic the CPU backend needs per element type.
trait Kernel: Element {
    /// Accumulator type: f32 for the half types, the type itself otherwise.
    type Acc: Copy + Default;
    fn to_acc(src: &[Self], dst: &mut [Self::Acc]);
    fn from_acc(src: &[Self::Acc], dst: &mut [Self]);
    fn acc_combine(acc: &mut [Self::Acc], other: &[Self::Acc], op: ReduceOp);
    fn acc_div(acc: &mut [Self::Acc], n: usize);

    /// `acc = acc ∘ other`, then divided by `div` if given (the last step of an average).
    fn combine(acc: &mut [Self], other: &[Self], op: ReduceOp, div: Option<usize>) {
        const B: usize = 1024;
        let mut a = [Self::Acc::default(); B];
        let mut b = [Self::Acc::default(); B];
        for (ac, oc) in acc.chunks_mut(B).zip(other.chunks(B)) {
            let m = ac.len();
            Self::to_acc(ac, &mut a[..m]);
            Self::to_acc(oc, &mut b[..m]);
            Self::acc_combine(&mut a[..m], &b[..m], op);
            if let Some(n) = div {
                Self::acc_div(&mut a[..m], n);
            }
            Self::from_acc(&a[..m], ac);
        }
    }
}

fn combine_f32(acc: &mut [f32], other: &[f32], op: ReduceOp) {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => acc.iter_mut().zip(other).for_each(|(a, b)| *a += *b),
        // NaN propagates, as in torch.
        ReduceOp::Max => acc.iter_mut().zip(other).for_each(|(a, &b)| {
            if b > *a || b.is_nan() {
                *a = b
            }
        }),
        ReduceOp::Min => acc.iter_mut().zip(other).for_each(|(a, &b)| {
            if b < *a || b.is_nan() {
                *a = b
            }
        }),
    }
}

impl Kernel for f32 {
    type Acc = f32;
    fn to_acc(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src)
    }
    fn from_acc(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src)
    }
    fn acc_combine(acc: &mut [f32], other: &[f32], op: ReduceOp) {
        combine_f32(acc, other, op)
    }
    fn acc_div(acc: &mut [f32], n: usize) {
        let d = n as f32;
        acc.iter_mut().for_each(|a| *a /= d)
    }
    fn combine(acc: &mut [f32], other: &[f32], op: ReduceOp, div: Option<usize>) {
        match div {
            Some(n) if matches!(op, ReduceOp::Sum | ReduceOp::Avg) => {
                let d = n as f32;
                acc.iter_mut()
                    .zip(other)
                    .for_each(|(a, b)| *a = (*a + *b) / d)
            }
            _ => {
                combine_f32(acc, other, op);
                if let Some(n) = div {
                    Self::acc_div(acc, n)
                }
            }
        }
    }
}

impl Kernel for i64 {
    type Acc = i64;
    fn to_acc(src: &[i64], dst: &mut [i64]) {
        dst.copy_from_slice(src)
    }
    fn from_acc(src: &[i64], dst: &mut [i64]) {
        dst.copy_from_slice(src)
    }
    fn acc_combine(acc: &mut [i64], other: &[i64], op: ReduceOp) {
        match op {
            ReduceOp::Sum | ReduceOp::Avg => acc
                .iter_mut()
                .zip(other)
                .for_each(|(a, b)| *a = a.wrapping_add(*b)),
            ReduceOp::Max => acc
                .iter_mut()
                .zip(other)
                .for_each(|(a, b)| *a = (*a).max(*b)),
            ReduceOp::Min => acc
                .iter_mut()
                .zip(other)
                .for_each(|(a, b)| *a = (*a).min(*b)),
        }
    }
    fn acc_div(acc: &mut [i64], n: usize) {
        let d = n as i64;
        acc.iter_mut().for_each(|a| *a /= d)
    }
    fn combine(acc: &mut [i64], other: &[i64], op: ReduceOp, div: Option<usize>) {
        Self::acc_combine(acc, other, op);
        if let Some(n) = div {
            Self::acc_div(acc, n)
        }
    }
}

/// f32 → bf16, round to nearest even, NaN kept quiet (same bits as `half::bf16::from_f32`).
#[inline(always)]
fn f32_to_bf16_bits(x: f32) -> u16 {
    let b = x.to_bits();
    if (b & 0x7fff_ffff) > 0x7f80_0000 {
        return ((b >> 16) | 0x0040) as u16;
    }
    let round = 0x7fff + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

impl Kernel for bf16 {
    type Acc = f32;
    fn to_acc(src: &[bf16], dst: &mut [f32]) {
        dst.iter_mut()
            .zip(src)
            .for_each(|(d, s)| *d = f32::from_bits((s.to_bits() as u32) << 16))
    }
    fn from_acc(src: &[f32], dst: &mut [bf16]) {
        dst.iter_mut()
            .zip(src)
            .for_each(|(d, &s)| *d = bf16::from_bits(f32_to_bf16_bits(s)))
    }
    fn acc_combine(acc: &mut [f32], other: &[f32], op: ReduceOp) {
        combine_f32(acc, other, op)
    }
    fn acc_div(acc: &mut [f32], n: usize) {
        let d = n as f32;
        acc.iter_mut().for_each(|a| *a /= d)
    }
}

impl Kernel for f16 {
    type Acc = f32;
    fn to_acc(src: &[f16], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst)
    }
    fn from_acc(src: &[f32], dst: &mut [f16]) {
        dst.convert_from_f32_slice(src)
    }
    fn acc_combine(acc: &mut [f32], other: &[f32], op: ReduceOp) {
        combine_f32(acc, other, op)
    }
    fn acc_div(acc: &mut [f32], n: usize) {
        let d = n as f32;
        acc.iter_mut().for_each(|a| *a /= d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cover_the_buffer() {
        for len in [1usize, 2, 3, 7, 10, 1001] {
            for n in 1..=5 {
                let mut next = 0;
                for i in 0..n {
                    let (a, b) = seg_bounds(len, n, i);
                    assert_eq!(a, next);
                    assert!(b >= a && b - a <= len / n + 1);
                    next = b;
                }
                assert_eq!(next, len);
            }
        }
    }

    #[test]
    fn bf16_rounding_matches_half() {
        let samples = [
            0.0f32,
            -0.0,
            1.0,
            1.003_906_3,
            1.0039063,
            1.234_567_8e-3,
            -2.5e-39,
            65504.0,
            f32::MAX,
            f32::MIN_POSITIVE,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ];
        for &x in &samples {
            assert_eq!(f32_to_bf16_bits(x), bf16::from_f32(x).to_bits(), "{x}");
        }
        let mut s = 0x1234_5678u32;
        for _ in 0..100_000 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            let x = f32::from_bits(s);
            if x.is_nan() {
                assert!(bf16::from_bits(f32_to_bf16_bits(x)).is_nan());
            } else {
                assert_eq!(f32_to_bf16_bits(x), bf16::from_f32(x).to_bits(), "{x}");
            }
        }
    }

    #[test]
    fn kernels_combine_in_f32() {
        let mut a: Vec<bf16> = [1.0f32, 2.0, -3.0, 0.5]
            .iter()
            .map(|&x| bf16::from_f32(x))
            .collect();
        let b: Vec<bf16> = [1.0f32, 5.0, 4.0, 0.25]
            .iter()
            .map(|&x| bf16::from_f32(x))
            .collect();
        bf16::combine(&mut a, &b, ReduceOp::Avg, Some(2));
        let got: Vec<f32> = a.iter().map(|x| x.to_f32()).collect();
        assert_eq!(got, vec![1.0, 3.5, 0.5, 0.375]);
        let mut h: Vec<f16> = [1.0f32, -7.0].iter().map(|&x| f16::from_f32(x)).collect();
        f16::combine(
            &mut h,
            &[f16::from_f32(2.0), f16::from_f32(-9.0)],
            ReduceOp::Min,
            None,
        );
        assert_eq!(h[0].to_f32(), 1.0);
        assert_eq!(h[1].to_f32(), -9.0);
        let mut x = vec![1.0f32, f32::NAN];
        f32::combine(&mut x, &[f32::NAN, 0.0], ReduceOp::Max, None);
        assert!(x[0].is_nan() && x[1].is_nan());
        let mut i = vec![7i64, -7];
        i64::combine(&mut i, &[2, 0], ReduceOp::Avg, Some(2));
        assert_eq!(i, vec![4, -3]);
    }

    #[test]
    fn reduce_ordered_accumulates_halves_in_f32() {
        // bf16 has 8 significant bits: 256 + 1 rounds back to 256, so pairwise bf16 sums give
        // 256 + 1 + 1 = 256; accumulated in f32 the result is 258 (exact in bf16).
        let a = [bf16::from_f32(256.0)];
        let b = [bf16::from_f32(1.0)];
        let c = [bf16::from_f32(1.0)];
        let mut out = [bf16::ZERO];
        let srcs = [a.as_ptr(), b.as_ptr(), c.as_ptr()];
        unsafe { reduce_ordered(&srcs, out.as_mut_ptr(), 1, ReduceOp::Sum) };
        assert_eq!(out[0].to_f32(), 258.0);
        let mut pairwise = a;
        bf16::combine(&mut pairwise, &b, ReduceOp::Sum, None);
        bf16::combine(&mut pairwise, &c, ReduceOp::Sum, None);
        assert_eq!(pairwise[0].to_f32(), 256.0);
    }

    #[test]
    fn route_ip_of_loopback_is_loopback() {
        assert_eq!(route_ip(Some("127.0.0.1")), IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert_eq!(route_ip(None), IpAddr::V4(Ipv4Addr::LOCALHOST));
        assert!(route_ip(Some("no-such-host.invalid")).is_loopback());
    }
}
