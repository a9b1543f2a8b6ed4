//! The CPU communicator, [`CpuComm`]: building a group (its mesh of connections, its peers'
//! writer threads and its communication thread), queueing submitted operations to that
//! thread as jobs whose [`Work`] handles wait on a completion slot, and `split` into
//! sub-groups.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use super::engine::Engine;
use super::mesh::connect_mesh;
use super::scratch::Scratch;
use super::transport::Peer;
use super::CpuOptions;
use crate::comm::{
    split_membership, Backend, CommError, Communicator, Device, OpKind, RawOp, Work, WorkHandle,
};
use crate::store::KvStore;

/// The CPU (TCP) communicator. See the [module docs](super).
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

/// A submitted operation on its way to the communication thread.
pub(super) struct Job {
    pub(super) op: RawOp,
    pub(super) slot: Arc<Slot>,
}

/// Where the communication thread leaves a job's result for its `Work`.
#[derive(Default)]
pub(super) struct Slot {
    result: Mutex<Option<Result<(), CommError>>>,
    cv: Condvar,
    done: AtomicBool,
}

impl Slot {
    /// Stores the job's result and wakes its `Work`.
    pub(super) fn complete(&self, r: Result<(), CommError>) {
        *self.result.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
        self.done.store(true, Ordering::Release);
        self.cv.notify_all();
    }
}

/// The [`WorkHandle`] of a queued job.
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
            scratch: Scratch::default(),
            poisoned: None,
            op: "setup",
            inline_ok: false,
            store: store.clone(),
            group: group.clone(),
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
            // SAFETY: our caller's contract covers `op`'s buffers, `op` was validated just
            // above, and the copy is over when `local_only` returns.
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
/// As `Communicator::submit`, with `op` validated for a group of one.
unsafe fn local_only(op: &RawOp) {
    let bytes = op.count * op.dtype.size();
    if op.kind != OpKind::Barrier && !std::ptr::eq(op.send, op.recv) {
        // SAFETY: in a group of one, `send` and `recv` both hold `count` elements (`bytes`
        // bytes), valid for reads and writes respectively (our caller's contract); they do
        // not overlap (`validate`), and `ptr::copy` would allow it anyway.
        unsafe { std::ptr::copy(op.send, op.recv, bytes) };
    }
}
