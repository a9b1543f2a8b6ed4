//! The collective-communication API every backend implements: the [`Communicator`] trait
//! (all_reduce, reduce_scatter, all_gather, broadcast, barrier and sub-groups by `split`), the
//! element types it moves ([`Element`]: f32, bf16, f16, i64; the half types are reduced in f32),
//! the reduce operations, the asynchronous [`Work`] handle, the typed front end over host slices in
//! [`CommunicatorExt`] (the trainer adds one over tensors). The backends live in
//! [`cpu`](crate::cpu) and [`nccl`](crate::nccl); [`connect`](crate::connect) builds the one a
//! run asks for.
//!
//! Semantics shared by all backends:
//! - operations of one communicator run in submission order, whatever order their `Work`s are
//!   waited in; every rank of the group must submit the same sequence of collectives;
//! - after `Work::wait` returns, the result is visible to the caller (CPU: in memory; NCCL: to
//!   all later work on the caller's compute stream);
//! - a failed collective (peer gone, timeout) poisons the communicator: that operation and every
//!   later one return an error naming the peer, and peers of this rank fail promptly too.
//!
//! The typed API borrows buffers for the lifetime of the returned [`Work`]; dropping a `Work`
//! waits for it. Leaking a pending `Work` (`std::mem::forget`) would let the buffer be reused
//! while the backend still writes it, so don't. A front end over tensors holds its tensors in the
//! `Work` ([`Work::keep_alive`]) instead of a borrow: as with `torch.distributed(async_op=True)`,
//! the tensors must not be read or written until the `Work` is waited.

use super::store::StoreError;
use half::{bf16, f16};
use std::any::Any;
use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

/// Element type of a buffer taking part in a collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    BF16,
    F16,
    I64,
}

impl DType {
    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::BF16 | DType::F16 => 2,
            DType::I64 => 8,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::I64 => "i64",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
    impl Sealed for i64 {}
}

/// A Rust element type collectives accept: `f32`, `half::bf16`, `half::f16`, `i64`.
pub trait Element: Copy + Send + Sync + 'static + sealed::Sealed {
    const DTYPE: DType;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
}
impl Element for bf16 {
    const DTYPE: DType = DType::BF16;
}
impl Element for f16 {
    const DTYPE: DType = DType::F16;
}
impl Element for i64 {
    const DTYPE: DType = DType::I64;
}

/// How all_reduce and reduce_scatter combine the ranks' values. `Avg` divides the sum by the
/// group size (integer division for i64). bf16/f16 values are combined in f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Avg,
    Max,
    Min,
}

impl ReduceOp {
    pub const fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Avg => "avg",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        }
    }
}

/// Where a communicator's buffers live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    Cpu,
    Cuda(usize),
}

/// A communication backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// TCP between ranks, buffers in host memory ([`cpu`](crate::cpu)).
    Cpu,
    /// NCCL through cudarc, buffers in GPU memory ([`nccl`](crate::nccl)).
    Nccl,
}

impl Backend {
    pub const fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Nccl => "nccl",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "cpu" | "gloo" | "tcp" => Ok(Backend::Cpu),
            "nccl" | "cuda" | "gpu" => Ok(Backend::Nccl),
            other => Err(format!(
                "unknown communication backend `{other}` (expected cpu or nccl)"
            )),
        }
    }
}

/// Which collective, with its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    AllReduce(ReduceOp),
    ReduceScatter(ReduceOp),
    AllGather,
    Broadcast { root: usize },
    Barrier,
}

impl OpKind {
    /// The name used in error messages and benchmarks (`all_reduce`, …).
    pub const fn name(&self) -> &'static str {
        match self {
            OpKind::AllReduce(_) => "all_reduce",
            OpKind::ReduceScatter(_) => "reduce_scatter",
            OpKind::AllGather => "all_gather",
            OpKind::Broadcast { .. } => "broadcast",
            OpKind::Barrier => "barrier",
        }
    }
}

/// A type-erased collective as backends receive it.
///
/// Buffer shapes (`count` elements of `dtype`, `n` = group size):
/// - `AllReduce`, `Broadcast`: `send` and `recv` hold `count` elements (equal pointers: in place);
/// - `ReduceScatter`: `send` holds `n * count`, `recv` holds `count`; in place when
///   `recv == send + rank * count` (NCCL's convention), and then all of `send` must be
///   writable: the CPU backend uses the other ranks' segments as scratch and leaves them
///   clobbered;
/// - `AllGather`: `send` holds `count`, `recv` holds `n * count`; in place when
///   `send == recv + rank * count`;
/// - `Barrier`: no buffers (`count == 0`).
///
/// For a CUDA communicator the pointers are device addresses.
#[derive(Debug, Clone, Copy)]
pub struct RawOp {
    pub kind: OpKind,
    pub dtype: DType,
    pub send: *const u8,
    pub recv: *mut u8,
    pub count: usize,
}

// SAFETY: a RawOp is a description; whoever submits one promises (see `Communicator::submit`)
// that the memory it points to stays valid and unaliased until the operation completes, from
// whichever thread the backend touches it, so handing it to a communication thread is sound.
unsafe impl Send for RawOp {}

impl RawOp {
    /// A barrier (no buffers).
    pub fn barrier() -> RawOp {
        RawOp {
            kind: OpKind::Barrier,
            dtype: DType::F32,
            send: std::ptr::null(),
            recv: std::ptr::null_mut(),
            count: 0,
        }
    }

    /// Elements in the send buffer for a group of `n`.
    pub fn send_len(&self, n: usize) -> usize {
        match self.kind {
            OpKind::ReduceScatter(_) => self.count * n,
            OpKind::Barrier => 0,
            _ => self.count,
        }
    }

    /// Elements in the receive buffer for a group of `n`.
    pub fn recv_len(&self, n: usize) -> usize {
        match self.kind {
            OpKind::AllGather => self.count * n,
            OpKind::Barrier => 0,
            _ => self.count,
        }
    }

    /// Basic checks every backend makes before accepting the operation.
    pub fn validate(&self, rank: usize, n: usize) -> Result<(), CommError> {
        let op = self.kind.name();
        if let OpKind::Broadcast { root } = self.kind {
            if root >= n {
                return Err(CommError::invalid(
                    op,
                    format!("root {root} is not a rank of this group of {n}"),
                ));
            }
        }
        if self.count > 0 && (self.send.is_null() || self.recv.is_null()) {
            return Err(CommError::invalid(op, "null buffer pointer"));
        }
        let size = self.dtype.size();
        let overflow = || CommError::invalid(op, "buffer size overflows");
        let send_bytes = self.send_len(n).checked_mul(size).ok_or_else(overflow)?;
        let recv_bytes = self.recv_len(n).checked_mul(size).ok_or_else(overflow)?;
        if self.count == 0 {
            return Ok(());
        }
        let (s, r) = (self.send as usize, self.recv as usize);
        if s % size != 0 || r % size != 0 {
            return Err(CommError::invalid(
                op,
                format!("buffers are not aligned for {}", self.dtype),
            ));
        }
        let shard = self.count * size;
        let allowed_alias = match self.kind {
            OpKind::AllReduce(_) | OpKind::Broadcast { .. } => s == r,
            OpKind::ReduceScatter(_) => r == s + rank * shard,
            OpKind::AllGather => s == r + rank * shard,
            OpKind::Barrier => true,
        };
        let overlap = s < r + recv_bytes && r < s + send_bytes;
        if overlap && !allowed_alias {
            return Err(CommError::invalid(
                op,
                "send and receive buffers overlap (only the in-place layout is allowed)",
            ));
        }
        // Out-of-place all_reduce/broadcast (disjoint buffers) is accepted: backends copy first.
        Ok(())
    }
}

/// Errors of the communication layer. Messages name the peer (global rank, host and address)
/// and the collective, e.g. `rank 1 (gpu-node-2, 10.0.0.3:40123) closed the connection during
/// all_reduce`.
#[derive(Debug, thiserror::Error)]
pub enum CommError {
    #[error("rank {rank} ({addr}) closed the connection during {op}")]
    PeerClosed {
        rank: usize,
        addr: String,
        op: &'static str,
    },
    #[error("timed out after {timeout:?} waiting for rank {rank} ({addr}) during {op}")]
    Timeout {
        rank: usize,
        addr: String,
        op: &'static str,
        timeout: Duration,
    },
    #[error("I/O error with rank {rank} ({addr}) during {op}: {source}")]
    Io {
        rank: usize,
        addr: String,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// This rank lost a peer (`own`) after another rank, `first`, had already failed with
    /// `cause` and shut its connections: the first failure is what went wrong.
    #[error("{cause} (seen first by rank {first}; here: {own})")]
    AfterPeerFailure {
        first: usize,
        cause: String,
        own: Box<CommError>,
    },
    #[error("invalid {op}: {msg}")]
    InvalidArgument { op: &'static str, msg: String },
    #[error("communicator unusable after an earlier failure: {0}")]
    Aborted(String),
    #[error("rendezvous store: {0}")]
    Store(String),
    #[error("setting up the {backend} communicator: {msg}")]
    Setup { backend: &'static str, msg: String },
    #[error("NCCL: {0}")]
    Nccl(String),
    #[error("CUDA: {0}")]
    Cuda(String),
}

impl CommError {
    pub fn invalid(op: &'static str, msg: impl Into<String>) -> CommError {
        CommError::InvalidArgument {
            op,
            msg: msg.into(),
        }
    }

    pub(crate) fn setup(backend: Backend, msg: impl Into<String>) -> CommError {
        CommError::Setup {
            backend: backend.name(),
            msg: msg.into(),
        }
    }
}

impl From<StoreError> for CommError {
    fn from(e: StoreError) -> Self {
        CommError::Store(e.to_string())
    }
}

/// Backend side of a [`Work`]: waits for, or polls, one submitted operation.
pub trait WorkHandle: Send {
    /// Blocks until the operation's result is visible to the caller (see the module docs).
    fn wait(&mut self) -> Result<(), CommError>;
    /// True once `wait` would return without blocking.
    fn is_completed(&self) -> bool;
}

/// Handle of a submitted collective. Borrows the collective's buffers for `'a`; `wait()` (or
/// dropping the handle, which waits and logs any error) ends the operation.
#[must_use = "a Work must be waited; dropping it blocks until the collective is done"]
pub struct Work<'a> {
    handle: Option<Box<dyn WorkHandle>>,
    keepalive: Option<Box<dyn Any + Send>>,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl Work<'static> {
    /// A handle for an operation that is already complete.
    pub fn completed() -> Work<'static> {
        Work {
            handle: None,
            keepalive: None,
            _borrow: PhantomData,
        }
    }

    /// Wraps a backend handle.
    pub fn from_handle(handle: Box<dyn WorkHandle>) -> Work<'static> {
        Work {
            handle: Some(handle),
            keepalive: None,
            _borrow: PhantomData,
        }
    }
}

impl<'a> Work<'a> {
    /// Waits for the operation; after `Ok`, the results can be used.
    pub fn wait(mut self) -> Result<(), CommError> {
        let res = match self.handle.as_mut() {
            Some(h) => h.wait(),
            None => Ok(()),
        };
        self.handle = None;
        self.keepalive = None;
        res
    }

    /// True when `wait()` would not block.
    pub fn is_completed(&self) -> bool {
        self.handle.as_ref().is_none_or(|h| h.is_completed())
    }

    /// Keeps `value` (e.g. tensor clones) alive until the operation is done.
    pub fn keep_alive(mut self, value: Box<dyn Any + Send>) -> Self {
        self.keepalive = Some(value);
        self
    }

    /// Narrows the handle to the lifetime of the buffers it was made for.
    fn bind<'b>(mut self) -> Work<'b> {
        Work {
            handle: self.handle.take(),
            keepalive: self.keepalive.take(),
            _borrow: PhantomData,
        }
    }
}

impl Drop for Work<'_> {
    fn drop(&mut self) {
        if let Some(mut h) = self.handle.take() {
            if let Err(e) = h.wait() {
                tracing::warn!("collective dropped without wait() failed: {e}");
            }
        }
    }
}

impl fmt::Debug for Work<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Work")
            .field("completed", &self.is_completed())
            .finish()
    }
}

/// A group of ranks that run collectives together. Object-safe; the typed API is in
/// [`CommunicatorExt`], implemented for every communicator.
pub trait Communicator: Send + Sync {
    /// This process's rank in the group.
    fn rank(&self) -> usize;
    /// Number of ranks in the group.
    fn world_size(&self) -> usize;
    fn backend(&self) -> Backend;
    /// Where buffers must live.
    fn device(&self) -> Device;

    /// Enqueues a collective and returns at once.
    ///
    /// # Safety
    /// The buffers described by `op` must be valid for reads (`send`) and writes (`recv`, and
    /// all of `send` for an in-place reduce_scatter) of the lengths in [`RawOp`]'s docs, on
    /// [`Communicator::device`], and must not be accessed by anything else until the returned
    /// `Work` has been waited (or dropped). The caller must not let the returned `Work`
    /// outlive the buffers.
    unsafe fn submit(&self, op: RawOp) -> Result<Work<'static>, CommError>;

    /// Creates sub-groups: ranks that pass the same `color` form a new group, ranked by
    /// `key` (ties by rank in this group). Collective over this group.
    fn split(&self, color: usize, key: usize) -> Result<Box<dyn Communicator>, CommError>;

    /// Blocks the host until every operation submitted so far is complete (the CPU backend's
    /// `wait` already does; NCCL synchronises its stream).
    fn synchronize(&self) -> Result<(), CommError> {
        Ok(())
    }
}

/// Membership of a split: given every rank's `(color, key)` (indexed by rank in the parent
/// group), returns the parent ranks of `me`'s new group in new-rank order, and `me`'s new rank.
pub fn split_membership(colors_keys: &[(usize, usize)], me: usize) -> (Vec<usize>, usize) {
    let color = colors_keys[me].0;
    let mut members: Vec<usize> = (0..colors_keys.len())
        .filter(|&r| colors_keys[r].0 == color)
        .collect();
    members.sort_by_key(|&r| (colors_keys[r].1, r));
    let new_rank = members
        .iter()
        .position(|&r| r == me)
        .expect("me is a member of its own color");
    (members, new_rank)
}

/// The shard length of an in-place collective over `len` elements split across `n` ranks;
/// `len` must be divisible by `n`.
fn shard_len(op: &'static str, len: usize, n: usize) -> Result<usize, CommError> {
    if !len.is_multiple_of(n) {
        return Err(CommError::invalid(
            op,
            format!("buffer of {len} elements is not divisible by the group size {n}"),
        ));
    }
    Ok(len / n)
}

fn check_host(comm: &(impl Communicator + ?Sized), op: &'static str) -> Result<(), CommError> {
    match comm.device() {
        Device::Cpu => Ok(()),
        Device::Cuda(_) => Err(CommError::invalid(
            op,
            "host slices cannot be used with a CUDA communicator; use the trainer's tensor collectives with CUDA tensors",
        )),
    }
}

/// A communicator behind a box, as `split` returns it.
pub type BoxedComm = Box<dyn Communicator>;

/// The typed front end of every [`Communicator`] over host slices (CPU backend).
pub trait CommunicatorExt: Communicator {
    /// Reduces `buf` across the group, in place.
    fn all_reduce<'a, T: Element>(
        &self,
        buf: &'a mut [T],
        op: ReduceOp,
    ) -> Result<Work<'a>, CommError> {
        check_host(self, "all_reduce")?;
        let p = buf.as_mut_ptr() as *mut u8;
        let raw = RawOp {
            kind: OpKind::AllReduce(op),
            dtype: T::DTYPE,
            send: p,
            recv: p,
            count: buf.len(),
        };
        // SAFETY: `buf` is host memory (`check_host`) holding every element `raw` describes,
        // borrowed mutably (so by no one else) for 'a, the lifetime of the returned `Work`,
        // which waits for the operation when it is waited or dropped.
        unsafe { self.submit(raw) }.map(Work::bind)
    }

    /// Reduces `input` (`n * k` elements) across the group and leaves shard `rank` of the
    /// result (`k` elements) in `output`.
    fn reduce_scatter<'a, T: Element>(
        &self,
        input: &'a [T],
        output: &'a mut [T],
        op: ReduceOp,
    ) -> Result<Work<'a>, CommError> {
        check_host(self, "reduce_scatter")?;
        let n = self.world_size();
        if input.len() != output.len() * n {
            return Err(CommError::invalid(
                "reduce_scatter",
                format!(
                    "input has {} elements, expected {} x output ({})",
                    input.len(),
                    n,
                    output.len()
                ),
            ));
        }
        let raw = RawOp {
            kind: OpKind::ReduceScatter(op),
            dtype: T::DTYPE,
            send: input.as_ptr() as *const u8,
            recv: output.as_mut_ptr() as *mut u8,
            count: output.len(),
        };
        // SAFETY: both slices are host memory (`check_host`) of the lengths `RawOp` asks for
        // (checked above), `input` borrowed shared (so written by no one) and `output`
        // mutably for 'a, the lifetime of the returned `Work`, which waits for the operation
        // when it is waited or dropped.
        unsafe { self.submit(raw) }.map(Work::bind)
    }

    /// In-place reduce_scatter: `buf` holds `n * k` elements; afterwards
    /// `buf[rank*k..(rank+1)*k]` holds this rank's reduced shard and the rest is scratch.
    fn reduce_scatter_in_place<'a, T: Element>(
        &self,
        buf: &'a mut [T],
        op: ReduceOp,
    ) -> Result<Work<'a>, CommError> {
        check_host(self, "reduce_scatter")?;
        let n = self.world_size();
        let k = shard_len("reduce_scatter", buf.len(), n)?;
        let p = buf.as_mut_ptr();
        let raw = RawOp {
            kind: OpKind::ReduceScatter(op),
            dtype: T::DTYPE,
            send: p as *const u8,
            // SAFETY: `rank < n` and `buf` holds `n * k` elements, so the offset stays inside.
            recv: unsafe { p.add(self.rank() * k) } as *mut u8,
            count: k,
        };
        // SAFETY: `buf` is host memory (`check_host`) holding every element `raw` describes,
        // borrowed mutably (so by no one else) for 'a, the lifetime of the returned `Work`,
        // which waits for the operation when it is waited or dropped.
        unsafe { self.submit(raw) }.map(Work::bind)
    }

    /// Gathers every rank's `input` (`k` elements) into `output` (`n * k`, rank order).
    fn all_gather<'a, T: Element>(
        &self,
        input: &'a [T],
        output: &'a mut [T],
    ) -> Result<Work<'a>, CommError> {
        check_host(self, "all_gather")?;
        let n = self.world_size();
        if output.len() != input.len() * n {
            return Err(CommError::invalid(
                "all_gather",
                format!(
                    "output has {} elements, expected {} x input ({})",
                    output.len(),
                    n,
                    input.len()
                ),
            ));
        }
        let raw = RawOp {
            kind: OpKind::AllGather,
            dtype: T::DTYPE,
            send: input.as_ptr() as *const u8,
            recv: output.as_mut_ptr() as *mut u8,
            count: input.len(),
        };
        // SAFETY: both slices are host memory (`check_host`) of the lengths `RawOp` asks for
        // (checked above), `input` borrowed shared (so written by no one) and `output`
        // mutably for 'a, the lifetime of the returned `Work`, which waits for the operation
        // when it is waited or dropped.
        unsafe { self.submit(raw) }.map(Work::bind)
    }

    /// In-place all_gather: `buf` holds `n * k` elements and this rank's shard is already at
    /// `buf[rank*k..(rank+1)*k]`; afterwards `buf` holds every rank's shard.
    fn all_gather_in_place<'a, T: Element>(&self, buf: &'a mut [T]) -> Result<Work<'a>, CommError> {
        check_host(self, "all_gather")?;
        let n = self.world_size();
        let k = shard_len("all_gather", buf.len(), n)?;
        let p = buf.as_mut_ptr();
        let raw = RawOp {
            kind: OpKind::AllGather,
            dtype: T::DTYPE,
            // SAFETY: `rank < n` and `buf` holds `n * k` elements, so the offset stays inside.
            send: unsafe { p.add(self.rank() * k) } as *const u8,
            recv: p as *mut u8,
            count: k,
        };
        // SAFETY: `buf` is host memory (`check_host`) holding every element `raw` describes,
        // borrowed mutably (so by no one else) for 'a, the lifetime of the returned `Work`,
        // which waits for the operation when it is waited or dropped.
        unsafe { self.submit(raw) }.map(Work::bind)
    }

    /// Copies `buf` of rank `root` into `buf` of every rank.
    fn broadcast<'a, T: Element>(
        &self,
        buf: &'a mut [T],
        root: usize,
    ) -> Result<Work<'a>, CommError> {
        check_host(self, "broadcast")?;
        let p = buf.as_mut_ptr() as *mut u8;
        let raw = RawOp {
            kind: OpKind::Broadcast { root },
            dtype: T::DTYPE,
            send: p,
            recv: p,
            count: buf.len(),
        };
        // SAFETY: `buf` is host memory (`check_host`) holding every element `raw` describes,
        // borrowed mutably (so by no one else) for 'a, the lifetime of the returned `Work`,
        // which waits for the operation when it is waited or dropped.
        unsafe { self.submit(raw) }.map(Work::bind)
    }

    /// Asynchronous barrier: completes once every rank of the group has submitted it.
    fn barrier_async(&self) -> Result<Work<'static>, CommError> {
        // SAFETY: a barrier has no buffers, so there is nothing to keep valid.
        unsafe { self.submit(RawOp::barrier()) }
    }

    /// Blocks until every rank of the group has reached the barrier.
    fn barrier(&self) -> Result<(), CommError> {
        self.barrier_async()?.wait()?;
        self.synchronize()
    }

    /// Within-node and across-node groups for hybrid sharding, ranks being numbered node by
    /// node (`local_world_size` per node): returns `(intra_node, inter_node)`.
    fn split_hybrid(&self, local_world_size: usize) -> Result<(BoxedComm, BoxedComm), CommError> {
        let (rank, n) = (self.rank(), self.world_size());
        if local_world_size == 0 || n % local_world_size != 0 {
            return Err(CommError::invalid(
                "split",
                format!(
                    "group size {n} is not a multiple of the local world size {local_world_size}"
                ),
            ));
        }
        let intra = self.split(rank / local_world_size, rank)?;
        let inter = self.split(rank % local_world_size, rank)?;
        Ok((intra, inter))
    }
}

impl<C: Communicator + ?Sized> CommunicatorExt for C {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_membership_orders_by_key_then_rank() {
        // 4 ranks, 2 per node: intra-node colors 0,0,1,1; inter-node colors 0,1,0,1.
        let intra = [(0, 0), (0, 1), (1, 2), (1, 3)];
        assert_eq!(split_membership(&intra, 3), (vec![2, 3], 1));
        let inter = [(0, 0), (1, 1), (0, 2), (1, 3)];
        assert_eq!(split_membership(&inter, 1), (vec![1, 3], 0));
        // Keys reorder; ties by parent rank.
        let k = [(7, 5), (7, 1), (7, 1), (8, 0)];
        assert_eq!(split_membership(&k, 0), (vec![1, 2, 0], 2));
        assert_eq!(split_membership(&k, 3), (vec![3], 0));
    }

    #[test]
    fn raw_op_validation() {
        let mut a = [0f32; 8];
        let p = a.as_mut_ptr() as *mut u8;
        let mk = |kind, send: *const u8, recv: *mut u8, count| RawOp {
            kind,
            dtype: DType::F32,
            send,
            recv,
            count,
        };
        // In-place all_gather: send is the rank's shard of recv.
        // SAFETY: byte 8 of the 32-byte array.
        let ag = mk(OpKind::AllGather, unsafe { p.add(8) }, p, 2);
        assert!(ag.validate(1, 4).is_ok());
        assert!(ag.validate(2, 4).is_err());
        // In-place reduce_scatter: recv is the rank's shard of send.
        // SAFETY: byte 16 of the 32-byte array.
        let p16 = unsafe { p.add(16) };
        let rs = mk(OpKind::ReduceScatter(ReduceOp::Sum), p, p16, 2);
        assert!(rs.validate(2, 4).is_ok());
        assert!(rs.validate(1, 4).is_err());
        let bc = mk(OpKind::Broadcast { root: 4 }, p, p, 8);
        assert!(matches!(
            bc.validate(0, 4),
            Err(CommError::InvalidArgument { .. })
        ));
        // SAFETY: byte 1 of the 32-byte array.
        let p1 = unsafe { p.add(1) };
        let odd = mk(OpKind::AllReduce(ReduceOp::Sum), p1, p1, 2);
        assert!(odd.validate(0, 2).is_err());
        assert!(RawOp::barrier().validate(0, 3).is_ok());
    }

    #[test]
    fn backend_names_parse() {
        assert_eq!("cpu".parse::<Backend>().unwrap(), Backend::Cpu);
        assert_eq!("NCCL".parse::<Backend>().unwrap(), Backend::Nccl);
        assert!("mpi".parse::<Backend>().is_err());
    }
}
