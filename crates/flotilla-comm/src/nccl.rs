//! NCCL backend: collectives on CUDA buffers through NCCL, with cudarc for the CUDA driver
//! (context, streams, events) and cudarc's `nccl::sys` types for the NCCL ABI. Everything is
//! loaded at run time, so building needs no CUDA and a login node never touches a GPU.
//!
//! - One communicator per process (plus sub-groups); the unique id goes from rank 0 to the
//!   others through the store (`nccl/g<generation>/unique_id`); the device is `LOCAL_RANK`
//!   (or 0 when the launcher left one visible device per task).
//! - Operations run on the communicator's own non-blocking stream. Each one first waits on an
//!   event recorded on the compute stream (by default the legacy default stream tch uses), so
//!   it sees the inputs; `Work::wait` makes the compute stream wait on the operation's done
//!   event (it does not block the host) and then releases the tensors the `Work` kept alive,
//!   which is safe because later compute-stream work is ordered after the collective.
//! - A watchdog thread per communicator polls the outstanding operations and NCCL's
//!   asynchronous error state; an operation that outlives the timeout or an NCCL error aborts
//!   the communicator (`ncclCommAbort`) and every later call returns an error.
//! - Sub-groups are `ncclCommSplit`s; bf16 is native (`ncclBfloat16`).
//!
//! ## Finding libnccl
//!
//! cudarc 0.19's own loader tries `libnccl.so`, `libnccl.so.13`, `.12`, … but never
//! `libnccl.so.2`, the only name the `nvidia-nccl-cu13` wheel (which torch's CUDA build uses)
//! ships; and glibc reads `LD_LIBRARY_PATH` once at process start, so a symlink folder added to
//! it later would not be searched. This module therefore opens NCCL itself (`libloading`) and
//! resolves the NCCL functions from that handle, trying in order:
//! 1. `FLOTILLA_NCCL_LIBRARY` (a path);
//! 2. the wheel next to the libtorch this process has loaded (`…/site-packages/torch/lib` →
//!    `…/site-packages/nvidia/nccl/lib/libnccl.so.2`, found through `/proc/self/maps`), i.e. the
//!    very NCCL libtorch_cuda uses;
//! 3. the same under `$FLOTILLA_VENV`;
//! 4. `libnccl.so.2` and then cudarc's names through the normal search path.

use super::comm::{
    Backend, CommError, Communicator, DType, Device, OpKind, RawOp, ReduceOp, Work, WorkHandle,
};
use super::store::KvStore;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};
use cudarc::nccl::sys::{ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t, ncclUniqueId};
use std::collections::VecDeque;
use std::ffi::{c_char, c_int, c_void, CStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------------
// The library

type NcclRes = c_int;
const NCCL_SUCCESS: NcclRes = ncclResult_t::ncclSuccess as NcclRes;
const NCCL_IN_PROGRESS: NcclRes = ncclResult_t::ncclInProgress as NcclRes;

/// The NCCL entry points flotilla uses, resolved from one opened library. Results and enums
/// cross the boundary as `c_int` (values from cudarc's `nccl::sys`), so an unknown result code
/// from a newer NCCL cannot be an invalid Rust enum.
pub struct NcclLib {
    path: String,
    get_version: unsafe extern "C" fn(*mut c_int) -> NcclRes,
    get_unique_id: unsafe extern "C" fn(*mut ncclUniqueId) -> NcclRes,
    comm_init_rank: unsafe extern "C" fn(*mut ncclComm_t, c_int, ncclUniqueId, c_int) -> NcclRes,
    comm_split:
        unsafe extern "C" fn(ncclComm_t, c_int, c_int, *mut ncclComm_t, *mut c_void) -> NcclRes,
    comm_destroy: unsafe extern "C" fn(ncclComm_t) -> NcclRes,
    comm_abort: unsafe extern "C" fn(ncclComm_t) -> NcclRes,
    comm_get_async_error: unsafe extern "C" fn(ncclComm_t, *mut c_int) -> NcclRes,
    comm_count: unsafe extern "C" fn(ncclComm_t, *mut c_int) -> NcclRes,
    comm_user_rank: unsafe extern "C" fn(ncclComm_t, *mut c_int) -> NcclRes,
    get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    get_last_error: unsafe extern "C" fn(ncclComm_t) -> *const c_char,
    #[allow(clippy::type_complexity)]
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        ncclComm_t,
        *mut c_void,
    ) -> NcclRes,
    #[allow(clippy::type_complexity)]
    reduce_scatter: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        ncclComm_t,
        *mut c_void,
    ) -> NcclRes,
    all_gather: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        ncclComm_t,
        *mut c_void,
    ) -> NcclRes,
    #[allow(clippy::type_complexity)]
    broadcast: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        ncclComm_t,
        *mut c_void,
    ) -> NcclRes,
    _lib: libloading::Library,
}

impl NcclLib {
    /// Opens `path` (a path or a bare library name) and resolves the NCCL functions.
    pub fn open(path: &Path) -> Result<NcclLib, String> {
        // SAFETY: loading a library runs its initialisers; `path` names NCCL (the user's
        // choice or one of the candidates), whose initialisers only set up its own state.
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| e.to_string())?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol is NCCL's function of that name, whose C signature (NCCL
                // ≥ 2.18) is the type of the field it is stored in; the field's `Library`
                // (`_lib`) lives as long as the pointer.
                *unsafe { lib.get($name) }.map_err(|e| format!("{}: {e}", path.display()))?
            };
        }
        Ok(NcclLib {
            path: path.display().to_string(),
            get_version: sym!(b"ncclGetVersion"),
            get_unique_id: sym!(b"ncclGetUniqueId"),
            comm_init_rank: sym!(b"ncclCommInitRank"),
            comm_split: sym!(b"ncclCommSplit"),
            comm_destroy: sym!(b"ncclCommDestroy"),
            comm_abort: sym!(b"ncclCommAbort"),
            comm_get_async_error: sym!(b"ncclCommGetAsyncError"),
            comm_count: sym!(b"ncclCommCount"),
            comm_user_rank: sym!(b"ncclCommUserRank"),
            get_error_string: sym!(b"ncclGetErrorString"),
            get_last_error: sym!(b"ncclGetLastError"),
            all_reduce: sym!(b"ncclAllReduce"),
            reduce_scatter: sym!(b"ncclReduceScatter"),
            all_gather: sym!(b"ncclAllGather"),
            broadcast: sym!(b"ncclBroadcast"),
            _lib: lib,
        })
    }

    /// Where the library was loaded from.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// NCCL's version code (e.g. 22809 for 2.28.9).
    pub fn version(&self) -> Result<i32, CommError> {
        let mut v = 0;
        // SAFETY: `ncclGetVersion` writes one `int` through its argument, a live local.
        let r = unsafe { (self.get_version)(&mut v) };
        self.check(r, None, "ncclGetVersion")?;
        Ok(v)
    }

    /// A fresh unique id (rank 0 makes it, the others receive it through the store).
    pub fn unique_id(&self) -> Result<ncclUniqueId, CommError> {
        let mut id = ncclUniqueId { internal: [0; 128] };
        // SAFETY: `ncclGetUniqueId` writes one `ncclUniqueId` through its argument, a live
        // local.
        let r = unsafe { (self.get_unique_id)(&mut id) };
        self.check(r, None, "ncclGetUniqueId")?;
        Ok(id)
    }

    fn check(&self, r: NcclRes, comm: Option<ncclComm_t>, what: &str) -> Result<(), CommError> {
        if r == NCCL_SUCCESS || r == NCCL_IN_PROGRESS {
            return Ok(());
        }
        Err(CommError::Nccl(format!(
            "{what} failed: {}",
            self.describe(r, comm)
        )))
    }

    fn describe(&self, r: NcclRes, comm: Option<ncclComm_t>) -> String {
        // SAFETY: `ncclGetErrorString` takes any result code and returns a static
        // NUL-terminated string, which `cstr` copies.
        let s = unsafe { cstr((self.get_error_string)(r)) };
        let last = comm
            .map(|c| {
                // SAFETY: `c` is the handle the failing call was made on, still live (see
                // `RawComm`); `ncclGetLastError` returns null or a NUL-terminated string in
                // NCCL's last-error buffer, which `cstr` copies at once.
                unsafe { cstr((self.get_last_error)(c)) }
            })
            .unwrap_or_default();
        if last.is_empty() {
            format!("{s} (code {r})")
        } else {
            format!("{s} (code {r}): {last}")
        }
    }
}

/// # Safety
/// `p` is null or a NUL-terminated string.
unsafe fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: not null, so a NUL-terminated string live for this call (our caller's
        // contract); it is copied before returning.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// Directories holding the libtorch this process has mapped, from `/proc/self/maps` text.
pub fn torch_lib_dirs(maps: &str) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    for line in maps.lines() {
        let Some(path) = line.split_whitespace().nth(5) else {
            continue;
        };
        let p = Path::new(path);
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let is_torch = [
            "libtorch_cpu.so",
            "libtorch.so",
            "libc10.so",
            "libtorch_cuda.so",
        ]
        .contains(&name);
        if let (true, Some(dir)) = (is_torch, p.parent()) {
            if !dirs.iter().any(|d| d == dir) {
                dirs.push(dir.to_path_buf());
            }
        }
    }
    dirs
}

/// `libnccl.so.2` of the nvidia-nccl wheel in a venv (`<venv>/lib/python3.*/site-packages/…`).
fn venv_nccl(venv: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for lib in ["lib", "lib64"] {
        let Ok(rd) = std::fs::read_dir(venv.join(lib)) else {
            continue;
        };
        let mut pys: Vec<PathBuf> = rd.flatten().map(|e| e.path()).collect();
        pys.sort();
        for py in pys {
            let f = py.join("site-packages/nvidia/nccl/lib/libnccl.so.2");
            if f.is_file() && !out.contains(&f) {
                out.push(f);
            }
        }
    }
    out
}

/// Where to look for NCCL, in order (see the module docs). Paths that do not exist are left
/// out; bare names are left to the dynamic loader's search.
pub fn nccl_candidates(
    explicit: Option<OsString>,
    torch_dirs: &[PathBuf],
    venvs: &[PathBuf],
) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let push = |p: PathBuf, out: &mut Vec<PathBuf>| {
        if !out.contains(&p) {
            out.push(p)
        }
    };
    if let Some(e) = explicit.filter(|e| !e.is_empty()) {
        push(PathBuf::from(e), &mut out);
    }
    for d in torch_dirs {
        // site-packages/torch/lib -> site-packages/nvidia/nccl/lib
        if let Some(site) = d.parent().and_then(Path::parent) {
            let f = site.join("nvidia/nccl/lib/libnccl.so.2");
            if f.is_file() {
                push(f, &mut out);
            }
        }
    }
    for v in venvs {
        for f in venv_nccl(v) {
            push(f, &mut out);
        }
    }
    push(PathBuf::from("libnccl.so.2"), &mut out);
    for name in cudarc::get_lib_name_candidates("nccl") {
        push(PathBuf::from(name), &mut out);
    }
    out
}

fn process_candidates() -> Vec<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    // No path of the build machine is compiled in: an installed binary finds NCCL beside the
    // libtorch it loaded, or through these variables.
    let venvs: Vec<PathBuf> = std::env::var_os("FLOTILLA_VENV")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    nccl_candidates(
        std::env::var_os("FLOTILLA_NCCL_LIBRARY"),
        &torch_lib_dirs(&maps),
        &venvs,
    )
}

/// The process-wide NCCL library, opened on first use.
pub fn library() -> Result<&'static NcclLib, CommError> {
    static LIB: OnceLock<Result<NcclLib, String>> = OnceLock::new();
    LIB.get_or_init(|| {
        let mut tried = Vec::new();
        for c in process_candidates() {
            match NcclLib::open(&c) {
                Ok(lib) => {
                    tracing::debug!("loaded NCCL from {}", c.display());
                    return Ok(lib);
                }
                Err(e) => tried.push(format!("{}: {e}", c.display())),
            }
        }
        Err(format!(
            "could not load NCCL (set FLOTILLA_NCCL_LIBRARY to libnccl.so.2); tried:\n  {}",
            tried.join("\n  ")
        ))
    })
    .as_ref()
    .map_err(|e| CommError::Nccl(e.clone()))
}

/// True when libcuda (the NVIDIA driver) can be loaded; cudarc panics without it, so check
/// first and turn its absence into an error.
fn driver_available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        cudarc::get_lib_name_candidates("cuda")
            .iter()
            // SAFETY: loading the NVIDIA driver library runs only its own initialisers; the
            // handle is dropped again at once.
            .any(|n| unsafe { libloading::Library::new(n.as_str()) }.is_ok())
    })
}

// ---------------------------------------------------------------------------------------------
// CPU-side mapping helpers

/// The store encoding of a unique id: its 128 raw bytes.
pub fn encode_unique_id(id: &ncclUniqueId) -> Vec<u8> {
    id.internal.iter().map(|&c| c as u8).collect()
}

pub fn decode_unique_id(bytes: &[u8]) -> Result<ncclUniqueId, CommError> {
    if bytes.len() != 128 {
        return Err(CommError::Store(format!(
            "NCCL unique id has {} bytes, expected 128",
            bytes.len()
        )));
    }
    let mut id = ncclUniqueId { internal: [0; 128] };
    for (d, &s) in id.internal.iter_mut().zip(bytes) {
        *d = s as c_char;
    }
    Ok(id)
}

pub fn nccl_dtype(d: DType) -> ncclDataType_t {
    match d {
        DType::F32 => ncclDataType_t::ncclFloat32,
        DType::BF16 => ncclDataType_t::ncclBfloat16,
        DType::F16 => ncclDataType_t::ncclFloat16,
        DType::I64 => ncclDataType_t::ncclInt64,
    }
}

pub fn nccl_op(op: ReduceOp) -> ncclRedOp_t {
    match op {
        ReduceOp::Sum => ncclRedOp_t::ncclSum,
        ReduceOp::Avg => ncclRedOp_t::ncclAvg,
        ReduceOp::Max => ncclRedOp_t::ncclMax,
        ReduceOp::Min => ncclRedOp_t::ncclMin,
    }
}

/// The CUDA ordinal of a local rank: 0 when the launcher left one visible device per task
/// (`CUDA_VISIBLE_DEVICES` bound per rank), else the local rank itself.
pub fn device_ordinal(local_rank: usize, visible: usize) -> Result<usize, CommError> {
    match visible {
        0 => Err(CommError::Cuda(
            "no CUDA device is visible to this process".into(),
        )),
        1 => Ok(0),
        v if local_rank < v => Ok(local_rank),
        v => Err(CommError::Cuda(format!(
            "local rank {local_rank} but only {v} CUDA devices are visible"
        ))),
    }
}

/// `split` arguments as NCCL's `int`s (NCCL reserves negative colors).
pub fn split_args(color: usize, key: usize) -> Result<(c_int, c_int), CommError> {
    let c = c_int::try_from(color)
        .map_err(|_| CommError::invalid("split", format!("color {color} too large")))?;
    let k = c_int::try_from(key)
        .map_err(|_| CommError::invalid("split", format!("key {key} too large")))?;
    Ok((c, k))
}

fn cuda_err(what: &str) -> impl Fn(cudarc::driver::DriverError) -> CommError + '_ {
    move |e| CommError::Cuda(format!("{what}: {e}"))
}

// ---------------------------------------------------------------------------------------------
// Watchdog

/// Something the watchdog can poll (a CUDA event in production, a fake in tests).
pub trait Completion: Send + Sync {
    fn poll(&self) -> Result<bool, String>;
}

impl Completion for CudaEvent {
    fn poll(&self) -> Result<bool, String> {
        self.try_is_complete().map_err(|e| e.to_string())
    }
}

/// Outstanding operations of one communicator, oldest first.
pub struct Outstanding<E: Completion + ?Sized> {
    queue: VecDeque<(Arc<E>, Instant, &'static str)>,
}

impl<E: Completion + ?Sized> Default for Outstanding<E> {
    fn default() -> Self {
        Outstanding {
            queue: VecDeque::new(),
        }
    }
}

impl<E: Completion + ?Sized> Outstanding<E> {
    pub fn push(&mut self, e: Arc<E>, at: Instant, op: &'static str) {
        self.queue.push_back((e, at, op));
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Drops completed operations (they complete in order); returns a failure message when
    /// the oldest pending one has waited longer than `timeout` or polling failed.
    pub fn scan(&mut self, now: Instant, timeout: Duration) -> Option<String> {
        while let Some((e, at, op)) = self.queue.front() {
            match e.poll() {
                Ok(true) => {
                    self.queue.pop_front();
                }
                Ok(false) if now.duration_since(*at) > timeout => {
                    return Some(format!("{op} did not complete within {timeout:?}"));
                }
                Ok(false) => return None,
                Err(err) => return Some(format!("{op} failed: {err}")),
            }
        }
        None
    }
}

/// An NCCL communicator handle. It is live from `ncclCommInitRank` (or `ncclCommSplit`) until
/// the one `ncclCommAbort` or `ncclCommDestroy` that the `aborted` flag of [`Shared`] lets
/// through; calls on it assume that window (see the `unsafe` blocks that use it).
struct RawComm(ncclComm_t);
// SAFETY: an NCCL communicator is not tied to the thread that made it; NCCL lets any thread
// make calls on it, one enqueue at a time, which `NcclComm::enqueue` serialises.
unsafe impl Send for RawComm {}
// SAFETY: the calls made through a shared handle are either serialised by
// `NcclComm::enqueue` (enqueues and splits) or ones NCCL allows from any thread at any time
// (`ncclCommGetAsyncError`, `ncclGetLastError`, and `ncclCommAbort`, which exists to stop a
// communicator another thread is using).
unsafe impl Sync for RawComm {}

/// State shared by a communicator, its watchdog and its `Work`s.
struct Shared {
    lib: &'static NcclLib,
    comm: RawComm,
    failed: Mutex<Option<String>>,
    aborted: AtomicBool,
    outstanding: Mutex<Outstanding<CudaEvent>>,
    stop: AtomicBool,
    timeout: Duration,
}

impl Shared {
    fn failure(&self) -> Option<String> {
        self.failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Records the first failure and aborts the communicator (pending NCCL kernels return).
    fn fail(&self, msg: String) {
        tracing::error!("NCCL communicator failed: {msg}; aborting it");
        self.failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(msg);
        if !self.aborted.swap(true, Ordering::AcqRel) {
            // SAFETY: winning the `aborted` swap makes this the handle's only abort or destroy,
            // so it is still live; NCCL allows the abort from any thread.
            unsafe { (self.lib.comm_abort)(self.comm.0) };
        }
    }

    fn check_async(&self) -> Result<(), CommError> {
        if let Some(f) = self.failure() {
            return Err(CommError::Aborted(f));
        }
        let mut r = NCCL_SUCCESS;
        // SAFETY: `r` is a live local for the result. The handle is live: no failure was
        // recorded (checked above), and only a failure or the communicator's drop end it. (A
        // watchdog abort racing between that check and this call is not excluded.)
        let q = unsafe { (self.lib.comm_get_async_error)(self.comm.0, &mut r) };
        if q != NCCL_SUCCESS {
            r = q;
        }
        if r != NCCL_SUCCESS && r != NCCL_IN_PROGRESS {
            let msg = format!(
                "asynchronous NCCL error: {}",
                self.lib.describe(r, Some(self.comm.0))
            );
            self.fail(msg.clone());
            return Err(CommError::Nccl(msg));
        }
        Ok(())
    }

    /// Blocks the host until `event` completes, failing (and aborting) after the timeout.
    fn block_on(&self, event: &CudaEvent, op: &'static str) -> Result<(), CommError> {
        let start = Instant::now();
        loop {
            match event.try_is_complete() {
                Ok(true) => return self.check_async(),
                Ok(false) => {}
                Err(e) => return Err(CommError::Cuda(format!("{op}: {e}"))),
            }
            self.check_async()?;
            let waited = start.elapsed();
            if waited > self.timeout {
                let msg = format!("{op} did not complete within {:?}", self.timeout);
                self.fail(msg.clone());
                return Err(CommError::Aborted(msg));
            }
            // Spin briefly (small collectives finish in microseconds), then back off.
            if waited < Duration::from_micros(200) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }
}

fn watchdog(shared: Arc<Shared>) {
    while !shared.stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(100));
        if shared.aborted.load(Ordering::Acquire) {
            continue;
        }
        let verdict = shared
            .outstanding
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .scan(Instant::now(), shared.timeout);
        if let Some(msg) = verdict {
            shared.fail(msg);
            continue;
        }
        let _ = shared.check_async();
    }
}

// ---------------------------------------------------------------------------------------------
// The communicator

/// Options of the NCCL backend.
#[derive(Debug, Clone)]
pub struct NcclOptions {
    /// Limit for a collective to complete before the communicator is aborted.
    pub timeout: Duration,
    /// Picks the GPU (see [`device_ordinal`]).
    pub local_rank: usize,
}

/// The NCCL communicator. See the module docs.
pub struct NcclComm {
    shared: Arc<Shared>,
    rank: usize,
    n: usize,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    compute: Mutex<Arc<CudaStream>>,
    enqueue: Mutex<()>,
    barrier_buf: DeviceBuffer,
    watchdog: Option<std::thread::JoinHandle<()>>,
}

impl NcclComm {
    /// The world communicator over `store`. Collective over all ranks.
    pub fn new(store: Arc<dyn KvStore>, opts: &NcclOptions) -> Result<NcclComm, CommError> {
        let lib = library()?;
        if !driver_available() {
            return Err(CommError::Cuda(
                "the NVIDIA driver (libcuda) is not available on this machine".into(),
            ));
        }
        let visible = CudaContext::device_count().map_err(cuda_err("counting devices"))?;
        let ordinal = device_ordinal(opts.local_rank, visible.max(0) as usize)?;
        let ctx = CudaContext::new(ordinal).map_err(cuda_err("creating the context"))?;
        let (rank, n) = (store.rank(), store.world_size());
        if rank >= n {
            let msg = format!("rank {rank} out of range for world size {n}");
            return Err(CommError::setup(Backend::Nccl, msg));
        }
        let generation = store.add(&format!("nccl/generation/{rank}"), 1)?;
        let key = format!("nccl/g{generation}/unique_id");
        let id = if rank == 0 {
            let id = lib.unique_id()?;
            store.set(&key, &encode_unique_id(&id))?;
            id
        } else {
            decode_unique_id(&store.get(&key)?)?
        };
        let nranks =
            c_int::try_from(n).map_err(|_| CommError::setup(Backend::Nccl, "world too large"))?;
        ctx.bind_to_thread()
            .map_err(cuda_err("binding the context"))?;
        // ncclCommInitRank blocks until every rank has called it: a rank that died after the id
        // exchange would hang the others for ever. It runs on a thread of its own, waited for
        // at most the collective timeout; past it the rank fails, naming the wait, and the
        // stuck thread goes with the process.
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let init_ctx = ctx.clone();
        std::thread::Builder::new()
            .name("nccl-init".into())
            .spawn(move || {
                let result = init_ctx
                    .bind_to_thread()
                    .map_err(|e| e.to_string())
                    .map(|()| {
                        let mut comm: ncclComm_t = std::ptr::null_mut();
                        // SAFETY: `comm` is a live local for the new handle, `id` a unique id made
                        // by `ncclGetUniqueId` on rank 0, and the device's context is current on
                        // this thread.
                        let r =
                            unsafe { (lib.comm_init_rank)(&mut comm, nranks, id, rank as c_int) };
                        (r, RawComm(comm))
                    });
                let _ = done_tx.send(result);
            })
            .map_err(|e| CommError::setup(Backend::Nccl, format!("spawning the init: {e}")))?;
        let (r, RawComm(comm)) = match done_rx.recv_timeout(opts.timeout) {
            Ok(Ok(done)) => done,
            Ok(Err(e)) => return Err(CommError::Cuda(format!("binding the context: {e}"))),
            Err(_) => {
                return Err(CommError::setup(
                    Backend::Nccl,
                    format!(
                        "ncclCommInitRank on rank {rank} did not complete within {:?}: a rank \
                         of the {n} died or hangs after the id exchange (see the other ranks' \
                         logs)",
                        opts.timeout
                    ),
                ))
            }
        };
        lib.check(r, None, "ncclCommInitRank")?;
        tracing::info!(
            "NCCL {} from {}: rank {rank}/{n} on cuda:{ordinal}",
            lib.version().unwrap_or(0),
            lib.path()
        );
        NcclComm::wrap(lib, ctx, comm, opts.timeout)
    }

    fn wrap(
        lib: &'static NcclLib,
        ctx: Arc<CudaContext>,
        comm: ncclComm_t,
        timeout: Duration,
    ) -> Result<NcclComm, CommError> {
        let (mut n, mut rank) = (0, 0);
        // SAFETY: `comm` was just created by NCCL and is not shared yet; `n` is a live local.
        let r = unsafe { (lib.comm_count)(comm, &mut n) };
        lib.check(r, Some(comm), "ncclCommCount")?;
        // SAFETY: as above, with `rank`.
        let r = unsafe { (lib.comm_user_rank)(comm, &mut rank) };
        lib.check(r, Some(comm), "ncclCommUserRank")?;
        let stream = ctx
            .new_stream()
            .map_err(cuda_err("creating the NCCL stream"))?;
        // SAFETY: the null `CUstream` is the legacy default stream, which exists as long as
        // the context does, and a borrowed stream is never destroyed by cudarc.
        let compute = unsafe { ctx.wrap_borrowed_stream(std::ptr::null_mut()) };
        let barrier_buf = DeviceBuffer::new(&ctx, 4)?;
        let shared = Arc::new(Shared {
            lib,
            comm: RawComm(comm),
            failed: Mutex::new(None),
            aborted: AtomicBool::new(false),
            outstanding: Mutex::new(Outstanding::default()),
            stop: AtomicBool::new(false),
            timeout,
        });
        let sh = shared.clone();
        let watchdog = std::thread::Builder::new()
            .name("nccl-watchdog".into())
            .spawn(move || watchdog(sh))
            .map_err(|e| CommError::setup(Backend::Nccl, format!("spawning the watchdog: {e}")))?;
        Ok(NcclComm {
            shared,
            rank: rank as usize,
            n: n as usize,
            ctx,
            stream,
            compute: Mutex::new(compute),
            enqueue: Mutex::new(()),
            barrier_buf,
            watchdog: Some(watchdog),
        })
    }

    /// Orders collectives after, and makes `Work::wait` order later work on, `stream` instead
    /// of the legacy default stream.
    ///
    /// # Safety
    /// `stream` is a live `CUstream` of this communicator's device that outlives the
    /// communicator (or the next call to this method).
    pub unsafe fn set_compute_stream(&self, stream: *mut c_void) {
        // SAFETY: the caller promises a live stream of this device that outlives its use.
        let s = unsafe {
            self.ctx
                .wrap_borrowed_stream(stream as cudarc::driver::sys::CUstream)
        };
        *self.compute.lock().unwrap_or_else(|e| e.into_inner()) = s;
    }

    /// The CUDA ordinal this communicator uses.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// Device memory on this communicator's GPU (for benchmarks and tests).
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer, CommError> {
        DeviceBuffer::new(&self.ctx, bytes)
    }

    /// Enqueues `op` on the NCCL stream after the compute stream's current work; returns the
    /// operation's done event and the compute stream.
    ///
    /// # Safety
    /// As [`Communicator::submit`], with `op` validated for this communicator.
    unsafe fn enqueue_op(
        &self,
        op: &RawOp,
    ) -> Result<(Arc<CudaEvent>, Arc<CudaStream>), CommError> {
        let sh = &self.shared;
        if let Some(f) = sh.failure() {
            return Err(CommError::Aborted(f));
        }
        let _g = self.enqueue.lock().unwrap_or_else(|e| e.into_inner());
        self.ctx
            .bind_to_thread()
            .map_err(cuda_err("binding the context"))?;
        let compute = self
            .compute
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let ready = compute
            .record_event(None)
            .map_err(cuda_err("recording the input event"))?;
        self.stream
            .wait(&ready)
            .map_err(cuda_err("ordering the NCCL stream"))?;
        let s = self.stream.cu_stream() as *mut c_void;
        let (lib, comm) = (sh.lib, sh.comm.0);
        let dt = nccl_dtype(op.dtype) as c_int;
        let (send, recv) = (op.send as *const c_void, op.recv as *mut c_void);
        // SAFETY: `send` and `recv` are device buffers of the lengths `RawOp` documents, on
        // this device, untouched by others until the `Work` completes (our caller's
        // contract); the barrier uses our own 4-byte device buffer. `s` is our live stream
        // and the context is current. The handle is live: no failure was recorded (checked
        // above), drop cannot run while `&self` is borrowed, and enqueues are serialised by
        // `_g`. (A watchdog abort racing between that check and this call is not excluded.)
        let r = unsafe {
            match op.kind {
                OpKind::AllReduce(o) => {
                    (lib.all_reduce)(send, recv, op.count, dt, nccl_op(o) as c_int, comm, s)
                }
                OpKind::ReduceScatter(o) => {
                    (lib.reduce_scatter)(send, recv, op.count, dt, nccl_op(o) as c_int, comm, s)
                }
                OpKind::AllGather => (lib.all_gather)(send, recv, op.count, dt, comm, s),
                OpKind::Broadcast { root } => {
                    (lib.broadcast)(send, recv, op.count, dt, root as c_int, comm, s)
                }
                OpKind::Barrier => {
                    let p = self.barrier_buf.ptr as *mut c_void;
                    (lib.all_reduce)(
                        p,
                        p,
                        1,
                        ncclDataType_t::ncclFloat32 as c_int,
                        ncclRedOp_t::ncclSum as c_int,
                        comm,
                        s,
                    )
                }
            }
        };
        if let Err(e) = lib.check(r, Some(comm), op.kind.name()) {
            sh.fail(e.to_string());
            return Err(e);
        }
        let done = Arc::new(
            self.stream
                .record_event(None)
                .map_err(cuda_err("recording the done event"))?,
        );
        sh.outstanding
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(done.clone(), Instant::now(), op.kind.name());
        Ok((done, compute))
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        // Let pending work finish (bounded by the timeout, which aborts), then destroy.
        let drained = !self.shared.aborted.load(Ordering::Acquire)
            && self
                .stream
                .record_event(None)
                .map_err(cuda_err("recording an event"))
                .and_then(|ev| self.shared.block_on(&ev, "destroying the communicator"))
                .is_ok();
        self.shared.stop.store(true, Ordering::Release);
        if let Some(w) = self.watchdog.take() {
            let _ = w.join();
        }
        if !self.shared.aborted.swap(true, Ordering::AcqRel) {
            let _ = self.ctx.bind_to_thread();
            // SAFETY: winning the `aborted` swap makes this the handle's only abort or destroy,
            // so it is still live; the watchdog has exited, and with `&mut self` no enqueue
            // runs. Destroy waits for pending work, so it is used only once the stream drained.
            unsafe {
                if drained {
                    (self.shared.lib.comm_destroy)(self.shared.comm.0);
                } else {
                    (self.shared.lib.comm_abort)(self.shared.comm.0);
                }
            }
        }
    }
}

struct NcclWork {
    done: Arc<CudaEvent>,
    compute: Arc<CudaStream>,
    shared: Arc<Shared>,
    /// Barriers block the host; other operations only order the compute stream.
    block: bool,
    op: &'static str,
}

impl WorkHandle for NcclWork {
    fn wait(&mut self) -> Result<(), CommError> {
        if self.block {
            return self.shared.block_on(&self.done, self.op);
        }
        self.compute
            .wait(&self.done)
            .map_err(|e| CommError::Cuda(format!("{}: {e}", self.op)))?;
        match self.shared.failure() {
            Some(f) => Err(CommError::Aborted(f)),
            None => Ok(()),
        }
    }

    fn is_completed(&self) -> bool {
        self.done.is_complete()
    }
}

impl Communicator for NcclComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.n
    }

    fn backend(&self) -> Backend {
        Backend::Nccl
    }

    fn device(&self) -> Device {
        Device::Cuda(self.ctx.ordinal())
    }

    unsafe fn submit(&self, op: RawOp) -> Result<Work<'static>, CommError> {
        op.validate(self.rank, self.n)?;
        if op.count == 0 && op.kind != OpKind::Barrier {
            return Ok(Work::completed());
        }
        // SAFETY: our caller's contract, and `op` was validated just above.
        let (done, compute) = unsafe { self.enqueue_op(&op)? };
        Ok(Work::from_handle(Box::new(NcclWork {
            done,
            compute,
            shared: self.shared.clone(),
            block: op.kind == OpKind::Barrier,
            op: op.kind.name(),
        })))
    }

    fn split(&self, color: usize, key: usize) -> Result<Box<dyn Communicator>, CommError> {
        let (c, k) = split_args(color, key)?;
        let sh = &self.shared;
        if let Some(f) = sh.failure() {
            return Err(CommError::Aborted(f));
        }
        let mut new: ncclComm_t = std::ptr::null_mut();
        {
            let _g = self.enqueue.lock().unwrap_or_else(|e| e.into_inner());
            self.ctx
                .bind_to_thread()
                .map_err(cuda_err("binding the context"))?;
            // SAFETY: `new` is a live local for the child handle; a null config means the
            // parent's. The parent handle is live (no failure recorded, checked above, and
            // `&self` is borrowed) and `_g` serialises this with enqueues.
            let r = unsafe { (sh.lib.comm_split)(sh.comm.0, c, k, &mut new, std::ptr::null_mut()) };
            sh.lib.check(r, Some(sh.comm.0), "ncclCommSplit")?;
        }
        let child = NcclComm::wrap(sh.lib, self.ctx.clone(), new, sh.timeout)?;
        *child.compute.lock().unwrap_or_else(|e| e.into_inner()) = self
            .compute
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        Ok(Box::new(child))
    }

    fn synchronize(&self) -> Result<(), CommError> {
        let ev = {
            let _g = self.enqueue.lock().unwrap_or_else(|e| e.into_inner());
            self.stream
                .record_event(None)
                .map_err(cuda_err("recording an event"))?
        };
        self.shared.block_on(&ev, "synchronize")
    }
}

/// A raw device allocation on one GPU (freed on drop).
pub struct DeviceBuffer {
    ptr: u64,
    bytes: usize,
    ctx: Arc<CudaContext>,
}

impl DeviceBuffer {
    fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<DeviceBuffer, CommError> {
        ctx.bind_to_thread()
            .map_err(cuda_err("binding the context"))?;
        // SAFETY: a plain allocation in the context made current just above.
        let ptr = unsafe { cudarc::driver::result::malloc_sync(bytes.max(1)) }
            .map_err(cuda_err("cuMemAlloc"))?;
        // SAFETY: `ptr` is the allocation of `bytes.max(1)` bytes just made, used by no one
        // else yet.
        unsafe { cudarc::driver::result::memset_d8_sync(ptr, 0, bytes.max(1)) }
            .map_err(cuda_err("cuMemset"))?;
        Ok(DeviceBuffer {
            ptr,
            bytes,
            ctx: ctx.clone(),
        })
    }

    /// The device address.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr as *mut u8
    }

    pub fn len(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: `ptr` was allocated by `new` in this context and is freed only here, once;
        // collectives that used it were waited for by their owner.
        let _ = unsafe { cudarc::driver::result::free_sync(self.ptr) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_id_round_trips() {
        let mut id = ncclUniqueId { internal: [0; 128] };
        for (i, c) in id.internal.iter_mut().enumerate() {
            *c = (i as u8).wrapping_mul(37) as c_char;
        }
        let bytes = encode_unique_id(&id);
        assert_eq!(bytes.len(), 128);
        assert_eq!(decode_unique_id(&bytes).unwrap().internal, id.internal);
        assert!(decode_unique_id(&bytes[..100]).is_err());
    }

    #[test]
    fn dtype_and_op_mapping() {
        assert_eq!(nccl_dtype(DType::BF16) as i32, 9);
        assert_eq!(nccl_dtype(DType::F16) as i32, 6);
        assert_eq!(nccl_dtype(DType::F32) as i32, 7);
        assert_eq!(nccl_dtype(DType::I64) as i32, 4);
        assert_eq!(nccl_op(ReduceOp::Sum) as i32, 0);
        assert_eq!(nccl_op(ReduceOp::Max) as i32, 2);
        assert_eq!(nccl_op(ReduceOp::Min) as i32, 3);
        assert_eq!(nccl_op(ReduceOp::Avg) as i32, 4);
    }

    #[test]
    fn device_from_local_rank() {
        assert_eq!(device_ordinal(3, 1).unwrap(), 0);
        assert_eq!(device_ordinal(3, 8).unwrap(), 3);
        assert!(device_ordinal(0, 0).is_err());
        assert!(device_ordinal(4, 2).is_err());
        assert_eq!(split_args(1, 5).unwrap(), (1, 5));
        assert!(split_args(usize::MAX, 0).is_err());
    }

    #[test]
    fn torch_dirs_from_maps() {
        let maps = "\
7f00-7f01 r-xp 00000000 08:01 1 /venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so
7f01-7f02 r--p 00000000 08:01 1 /venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so
7f02-7f03 r-xp 00000000 08:01 2 /venv/lib/python3.11/site-packages/torch/lib/libc10.so
7f03-7f04 rw-p 00000000 00:00 0
7f04-7f05 r-xp 00000000 08:01 3 /usr/lib/x86_64-linux-gnu/libc.so.6
";
        assert_eq!(
            torch_lib_dirs(maps),
            vec![PathBuf::from(
                "/venv/lib/python3.11/site-packages/torch/lib"
            )]
        );
    }

    #[test]
    fn candidates_prefer_explicit_then_wheel_next_to_torch() {
        let dir = std::env::temp_dir().join(format!("flotilla-nccl-test-{}", std::process::id()));
        let site = dir.join("venv/lib/python3.11/site-packages");
        std::fs::create_dir_all(site.join("torch/lib")).unwrap();
        std::fs::create_dir_all(site.join("nvidia/nccl/lib")).unwrap();
        std::fs::write(site.join("nvidia/nccl/lib/libnccl.so.2"), b"").unwrap();
        let wheel = site.join("nvidia/nccl/lib/libnccl.so.2");
        let c = nccl_candidates(
            Some("/opt/nccl/libnccl.so".into()),
            &[site.join("torch/lib")],
            &[dir.join("venv")],
        );
        assert_eq!(c[0], PathBuf::from("/opt/nccl/libnccl.so"));
        assert_eq!(c[1], wheel);
        assert_eq!(c.iter().filter(|p| **p == wheel).count(), 1, "deduplicated");
        assert_eq!(c[2], PathBuf::from("libnccl.so.2"));
        assert!(c.contains(&PathBuf::from("libnccl.so")));
        // No torch dir: the venv finds the wheel.
        let c = nccl_candidates(None, &[], &[dir.join("venv")]);
        assert_eq!(c[0], wheel);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    struct Fake(Mutex<Result<bool, String>>);
    impl Completion for Fake {
        fn poll(&self) -> Result<bool, String> {
            self.0.lock().unwrap().clone()
        }
    }

    #[test]
    fn watchdog_bookkeeping() {
        let t0 = Instant::now();
        let timeout = Duration::from_secs(5);
        let a = Arc::new(Fake(Mutex::new(Ok(true))));
        let b = Arc::new(Fake(Mutex::new(Ok(false))));
        let mut o: Outstanding<Fake> = Outstanding::default();
        o.push(a, t0, "all_reduce");
        o.push(b.clone(), t0, "all_gather");
        assert_eq!(o.scan(t0 + Duration::from_secs(1), timeout), None);
        assert_eq!(o.len(), 1, "completed ops are dropped in order");
        let msg = o.scan(t0 + Duration::from_secs(6), timeout).unwrap();
        assert!(msg.contains("all_gather") && msg.contains("5s"), "{msg}");
        *b.0.lock().unwrap() = Err("illegal address".into());
        assert!(o.scan(t0, timeout).unwrap().contains("illegal address"));
        *b.0.lock().unwrap() = Ok(true);
        assert_eq!(o.scan(t0, timeout), None);
        assert!(o.is_empty());
    }

    /// Loads the real libnccl.so.2 of the venv's nvidia-nccl wheel (the name cudarc's own
    /// loader misses) and calls into it. No GPU needed; skipped where the wheel is absent.
    #[test]
    fn loads_the_wheel_nccl_without_a_gpu() {
        let found = process_candidates()
            .into_iter()
            .any(|p| p.is_absolute() && p.is_file());
        if !found {
            eprintln!("no libnccl.so.2 wheel found; skipping");
            return;
        }
        // cudarc's own loader would not find this file name.
        assert!(!cudarc::get_lib_name_candidates("nccl").contains(&"libnccl.so.2".to_string()));
        let lib = library().expect("NCCL loads");
        assert!(lib.path().ends_with("libnccl.so.2"), "{}", lib.path());
        let v = lib.version().unwrap();
        assert!(v >= 21800, "NCCL version code {v}");
        // A unique id needs no GPU either; it survives the store encoding.
        let id = lib.unique_id().unwrap();
        assert!(id.internal.iter().any(|&c| c != 0));
        assert_eq!(
            decode_unique_id(&encode_unique_id(&id)).unwrap().internal,
            id.internal
        );
    }

    /// Without the NVIDIA driver, building a communicator is an error, not a panic; with a GPU
    /// (world of one), collectives run on device memory.
    #[test]
    fn world_of_one_on_a_gpu_or_a_clean_error() {
        if library().is_err() {
            return;
        }
        let store = crate::store::MemoryStore::group(1).pop().unwrap();
        let opts = NcclOptions {
            timeout: Duration::from_secs(30),
            local_rank: 0,
        };
        let comm = match NcclComm::new(store, &opts) {
            Err(CommError::Cuda(msg)) if !driver_available() => {
                assert!(msg.contains("driver"), "{msg}");
                return;
            }
            Err(e) => panic!("{e}"),
            Ok(c) => c,
        };
        let host = [1.5f32, -2.0, 3.25, 7.0];
        let buf = comm.alloc(16).unwrap();
        // SAFETY: `buf` holds 16 bytes on this device, the size of `host`.
        unsafe { cudarc::driver::result::memcpy_htod_sync(buf.ptr as u64, &host[..]) }.unwrap();
        let raw = RawOp {
            kind: OpKind::AllReduce(ReduceOp::Sum),
            dtype: DType::F32,
            send: buf.ptr(),
            recv: buf.ptr(),
            count: 4,
        };
        // SAFETY: `buf` (4 f32 on this device) outlives the `Work`, which is waited at once.
        unsafe { comm.submit(raw) }.unwrap().wait().unwrap();
        comm.synchronize().unwrap();
        let mut back = [0f32; 4];
        // SAFETY: `buf` holds 16 bytes on this device, the size of `back`, and the stream was
        // synchronised above.
        unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut back[..], buf.ptr as u64) }.unwrap();
        assert_eq!(back, host);
        let sub = comm.split(0, 0).unwrap();
        assert_eq!((sub.rank(), sub.world_size()), (0, 1));
        use crate::comm::CommunicatorExt;
        sub.barrier().unwrap();
        comm.barrier().unwrap();
    }
}
