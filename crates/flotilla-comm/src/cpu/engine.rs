//! The engine of a CPU group, which runs on its communication thread: it takes jobs in
//! submission order, picks the algorithm for each (direct exchange for small buffers, rings
//! and chains for large ones), and after a failure poisons the group so every later job fails
//! at once. The first rank to lose a peer records its error in the store before it shuts its
//! connections; the ranks that then fail because of that shutdown report the recorded error
//! (the rank and host really lost) rather than only the survivor that hung up on them. The algorithms are in `direct.rs` and `ring.rs`, the point-to-point primitives in
//! `transport.rs`.
//!
//! # The algorithms' contract
//!
//! The algorithms are `unsafe fn`s over raw pointers. Each says which memory it reads and
//! writes, for how many elements, and requires that memory to be *lent to the engine*:
//! nothing outside the engine reads or writes it (nor frees it) until the method has returned
//! and, if it failed, until the engine has drained its writer threads (`poison`). `run_t`
//! gets that from [`Communicator::submit`](crate::comm::Communicator::submit)'s contract: the
//! buffers stay untouched until the operation's `Work` completes, which is after both.
//! In return, an algorithm that succeeds has waited for every send it queued, so no writer
//! thread reads the buffers after it returns.

use std::sync::{mpsc, Arc};
use std::time::Duration;

use half::{bf16, f16};

use super::communicator::Job;
use super::kernels::Kernel;
use super::scratch::Scratch;
use super::transport::Peer;
use crate::comm::{CommError, DType, OpKind, RawOp};
use crate::store::KvStore;

/// The state of a group's communication thread.
pub(super) struct Engine {
    /// This rank in the group.
    pub(super) rank: usize,
    /// Group size.
    pub(super) n: usize,
    /// One per group rank; `None` at this rank's own index.
    pub(super) peers: Vec<Option<Peer>>,
    /// Limit of a single read or write (for error messages; the sockets enforce it).
    pub(super) timeout: Duration,
    /// Pipelining granularity of the rings.
    pub(super) chunk_bytes: usize,
    /// Buffers up to this size use the direct algorithms.
    pub(super) small_bytes: usize,
    pub(super) scratch: Scratch,
    /// Why the group is unusable, after a failure.
    pub(super) poisoned: Option<String>,
    /// The running collective's name, for error messages.
    pub(super) op: &'static str,
    /// Whether the running algorithm may write small messages inline (see INLINE_WRITE_MAX).
    pub(super) inline_ok: bool,
    /// The rendezvous store, where the first failure of the group is recorded.
    pub(super) store: Arc<dyn KvStore>,
    /// The group's store-level name (`g1`, `g1.0.3`, ...).
    pub(super) group: String,
}

impl Engine {
    /// Runs jobs until the communicator drops its sender.
    pub(super) fn serve(mut self, rx: mpsc::Receiver<Job>) {
        while let Ok(job) = rx.recv() {
            let res = match &self.poisoned {
                Some(msg) => Err(CommError::Aborted(msg.clone())),
                None => {
                    self.op = job.op.kind.name();
                    // SAFETY: the job comes from `CpuComm::submit`, whose caller keeps its
                    // buffers valid and untouched until the job's `Work` completes, that is
                    // until `complete` below, after `run` (and, on failure, `poison`).
                    let r = unsafe { self.run(&job.op) };
                    r.map_err(|e| self.poison(e))
                }
            };
            job.slot.complete(res);
        }
    }

    /// After a failure: record it (or learn the group's first failure, [`Engine::first_failure`]),
    /// shut every connection (peers fail at once rather than at their timeout), let the writers
    /// drain so no thread touches the caller's buffers any more. Returns the error to report.
    fn poison(&mut self, e: CommError) -> CommError {
        let e = self.first_failure(e);
        tracing::error!("collective failed: {e}");
        self.poisoned = Some(e.to_string());
        for p in self.peers.iter().flatten() {
            p.shut();
        }
        for p in self.peers.iter().flatten() {
            p.wait_drained();
        }
        e
    }

    /// A lost peer (`e`) as the group saw it first. The first rank to fail counts itself in
    /// the store (`cpu/<group>/failures`) and records `<global rank>\n<error>` there
    /// (`cpu/<group>/failure`) before it shuts its connections, so a rank that fails because
    /// of that shutdown finds the record already written and reports it (with its own error
    /// after it). A store that cannot be reached (its host, rank 0's, is the one lost) leaves
    /// `e` as it is. Errors that are not about a peer are returned unchanged.
    fn first_failure(&self, e: CommError) -> CommError {
        if !matches!(
            e,
            CommError::PeerClosed { .. } | CommError::Timeout { .. } | CommError::Io { .. }
        ) {
            return e;
        }
        let me = self.store.rank();
        let record = format!("cpu/{}/failure", self.group);
        match self.store.add(&format!("cpu/{}/failures", self.group), 1) {
            Ok(1) => {
                let _ = self.store.set(&record, format!("{me}\n{e}").as_bytes());
                e
            }
            Ok(_) => {
                let Ok(value) = self.store.get(&record) else {
                    return e;
                };
                let value = String::from_utf8_lossy(&value);
                match value.split_once('\n') {
                    Some((first, cause)) => match first.parse::<usize>() {
                        // Another rank failed first, and not merely on the same peer.
                        Ok(first) if first != me && cause != e.to_string() => {
                            CommError::AfterPeerFailure {
                                first,
                                cause: cause.to_string(),
                                own: Box::new(e),
                            }
                        }
                        _ => e,
                    },
                    None => e,
                }
            }
            Err(_) => e,
        }
    }

    pub(super) fn peer(&self, q: usize) -> &Peer {
        self.peers[q].as_ref().expect("a peer of this group")
    }

    pub(super) fn chunk_elems<T>(&self) -> usize {
        (self.chunk_bytes / std::mem::size_of::<T>()).max(1)
    }

    /// Runs one collective.
    ///
    /// # Safety
    /// `op` passed [`RawOp::validate`] for this group, and its buffers are valid as
    /// `Communicator::submit` promises and lent to the engine.
    unsafe fn run(&mut self, op: &RawOp) -> Result<(), CommError> {
        // SAFETY: our caller's contract; the element type matches `op.dtype`, so the buffers
        // hold elements of `T` (aligned for it: `validate` checked).
        unsafe {
            match op.dtype {
                DType::F32 => self.run_t::<f32>(op),
                DType::BF16 => self.run_t::<bf16>(op),
                DType::F16 => self.run_t::<f16>(op),
                DType::I64 => self.run_t::<i64>(op),
            }
        }
    }

    /// Runs one collective on elements of `T` with the algorithm its size calls for.
    ///
    /// # Safety
    /// As [`Engine::run`], with `T` the element type of `op.dtype`.
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
        match op.kind {
            OpKind::Barrier => self.barrier(),
            OpKind::AllReduce(rop) => {
                if !std::ptr::eq(send, recv) {
                    // SAFETY: out of place, `send` and `recv` hold `k` elements each and do
                    // not overlap (`validate` allows overlap only when they are equal).
                    unsafe { std::ptr::copy_nonoverlapping(send, recv, k) };
                }
                if direct {
                    // SAFETY: `recv` holds `k` elements, lent to the engine.
                    unsafe { self.direct_all_reduce(recv, k, rop) }
                } else {
                    // SAFETY: as above.
                    unsafe { self.ring_all_reduce(recv, k, rop) }
                }
            }
            OpKind::ReduceScatter(rop) => {
                // SAFETY: `r < n`, so segment `r` lies within `send`'s `n * k` elements.
                let own = unsafe { send.add(r * k) };
                if direct {
                    // SAFETY: `send` holds `n * k` elements and `recv` `k`, either disjoint
                    // from `send` or equal to `own` (the only overlap `validate` allows).
                    unsafe { self.direct_reduce_scatter(send, recv, k, rop) }
                } else if std::ptr::eq(recv, own) {
                    // SAFETY: in place, the whole of `send` (`n * k` elements) is writable and
                    // the other ranks' segments of it are scratch (see `RawOp`).
                    unsafe { self.ring_reduce_scatter_in_place(send as *mut T, k, rop) }
                } else {
                    // SAFETY: out of place, `recv` (`k` elements) and `send` (`n * k`) do not
                    // overlap (`validate`).
                    unsafe { self.ring_reduce_scatter(send, recv, k, rop) }
                }
            }
            OpKind::AllGather => {
                // SAFETY: `r < n`, so segment `r` lies within `recv`'s `n * k` elements.
                let own = unsafe { recv.add(r * k) };
                if !std::ptr::eq(own, send) {
                    // SAFETY: out of place, `send` (`k` elements) and `recv` do not overlap
                    // (`validate`); segment `own` holds `k` elements.
                    unsafe { std::ptr::copy_nonoverlapping(send, own, k) };
                }
                if direct {
                    // SAFETY: `recv` holds `n * k` elements, this rank's at `own`.
                    unsafe { self.direct_all_gather(recv, k) }
                } else {
                    // SAFETY: as above.
                    unsafe { self.ring_all_gather(recv, k) }
                }
            }
            OpKind::Broadcast { root } => {
                if !std::ptr::eq(send, recv) {
                    // SAFETY: out of place, `send` and `recv` hold `k` elements each and do
                    // not overlap (`validate` allows overlap only when they are equal).
                    unsafe { std::ptr::copy_nonoverlapping(send, recv, k) };
                }
                if direct {
                    // SAFETY: `recv` holds `k` elements, lent to the engine.
                    unsafe { self.direct_broadcast(recv, k, root) }
                } else {
                    // SAFETY: as above.
                    unsafe { self.chain_broadcast(recv, k, root) }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::comm::{CommunicatorExt, ReduceOp};
    use crate::cpu::{CpuComm, CpuOptions};
    use crate::store::MemoryStore;
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::Barrier;
    use std::time::Duration;

    /// Rank 3 of 4 leaves; the others' next all_reduce (a ring 0 → 1 → 2 → 3 → 0, where rank 1
    /// talks only to ranks 0 and 2) fails on every survivor with an error that starts with rank
    /// 3 and its host: rank 1 learns it from the store, not from the neighbour that hung up.
    #[test]
    fn every_survivor_names_the_rank_that_left() {
        let stores = MemoryStore::group_with_timeout(4, Duration::from_secs(20));
        let opts = CpuOptions {
            timeout: Duration::from_secs(20),
            listen_ip: Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            ..CpuOptions::default()
        };
        let host = flotilla_contract::host_name();
        let left = Barrier::new(4);
        let errors: Vec<Option<String>> = std::thread::scope(|s| {
            let handles: Vec<_> = stores
                .iter()
                .enumerate()
                .map(|(rank, store)| {
                    let (opts, left) = (opts.clone(), &left);
                    s.spawn(move || {
                        let comm = CpuComm::new(store.clone(), opts).unwrap();
                        let mut buf = vec![1.0f32; 1 << 20];
                        comm.all_reduce(&mut buf, ReduceOp::Sum)
                            .unwrap()
                            .wait()
                            .unwrap();
                        assert_eq!(buf[0], 4.0);
                        if rank == 3 {
                            drop(comm);
                            left.wait();
                            return None;
                        }
                        left.wait();
                        let r = comm
                            .all_reduce(&mut buf, ReduceOp::Sum)
                            .and_then(|w| w.wait());
                        Some(r.expect_err("an all_reduce without rank 3").to_string())
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (rank, e) in errors.iter().enumerate().take(3) {
            let e = e.as_ref().unwrap();
            assert!(
                e.starts_with(&format!("rank 3 ({host}, 127.0.0.1:")),
                "rank {rank}: {e}"
            );
        }
        assert!(errors[1].as_ref().unwrap().contains("seen first by rank"));
    }
}
