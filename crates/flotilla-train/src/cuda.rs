//! The one way the task asks about CUDA. The binaries do not link libtorch's CUDA library (a
//! login node composing configs should not load a dozen CUDA libraries), and libtorch caches
//! "no CUDA" at the first query made without it: every question (is there a GPU, how many,
//! which device `auto` means) goes through here, which loads the library first. Training,
//! `generate` and `bench comm` all choose their device with [`device_count`] and
//! [`auto_device`], so `auto` means the same thing everywhere. [`bind`] makes a rank's device
//! the current one explicitly, before anything allocates on it; [`set_allow_tf32`] sets
//! libtorch's TF32 switches (`trainer.allow_tf32`); [`pinned`] puts a host tensor in
//! page-locked memory, from which a copy to a GPU need not wait; [`set_sync_debug`] makes
//! libtorch warn about (or refuse) every CUDA operation that makes the host wait for the
//! device, as `torch.cuda.set_sync_debug_mode` does.

use std::path::Path;
use std::sync::{Arc, OnceLock};

use tch::{Device, Tensor};

/// Loads `libtorch_cuda.so` (global symbols) from the directory where `libtorch_cpu.so` is
/// mapped, once per process, so that tch can see CUDA. Returns whether it is loaded.
pub fn load_torch_cuda() -> bool {
    static LOADED: OnceLock<bool> = OnceLock::new();
    *LOADED.get_or_init(|| {
        let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
            return false;
        };
        let Some(dir) = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| p.ends_with("/libtorch_cpu.so"))
            .and_then(|p| Path::new(p).parent().map(|d| d.to_path_buf()))
        else {
            return false;
        };
        let path = dir.join("libtorch_cuda.so");
        if !path.is_file() {
            return false;
        }
        use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
        // SAFETY: loading libtorch's own CUDA library, whose initialisers only register
        // kernels.
        match unsafe { Library::open(Some(&path), RTLD_NOW | RTLD_GLOBAL) } {
            Ok(lib) => {
                // Keep it loaded for the life of the process.
                std::mem::forget(lib);
                true
            }
            Err(e) => {
                tracing::warn!("cannot load {}: {e}", path.display());
                false
            }
        }
    })
}

/// The CUDA devices libtorch can use (0 without a GPU or without CUDA libtorch).
pub fn device_count() -> usize {
    if load_torch_cuda() && tch::Cuda::is_available() {
        tch::Cuda::device_count().max(0) as usize
    } else {
        0
    }
}

/// What `auto` means: the first CUDA device when there is one, else the CPU.
pub fn auto_device() -> Device {
    if device_count() > 0 {
        Device::Cuda(0)
    } else {
        Device::Cpu
    }
}

/// Makes `device` the calling thread's current CUDA device (its primary context, kept for the
/// life of the process), as `torch.cuda.set_device` does: libtorch's allocator, the FSDP
/// storage shim and NCCL then all work on it rather than on device 0. Nothing for the CPU.
pub fn bind(device: Device) -> Result<(), String> {
    let Device::Cuda(ordinal) = device else {
        return Ok(());
    };
    static BOUND: OnceLock<Arc<cudarc::driver::CudaContext>> = OnceLock::new();
    if let Some(ctx) = BOUND.get() {
        if ctx.ordinal() != ordinal {
            return Err(format!(
                "this process already works on cuda:{}; it cannot also bind cuda:{ordinal}",
                ctx.ordinal()
            ));
        }
        return ctx
            .bind_to_thread()
            .map_err(|e| format!("binding cuda:{ordinal}: {e}"));
    }
    let ctx = cudarc::driver::CudaContext::new(ordinal)
        .map_err(|e| format!("making cuda:{ordinal} the current device: {e}"))?;
    let _ = BOUND.set(ctx);
    Ok(())
}

extern "C" {
    fn flotilla_set_allow_tf32(allow: bool);
    fn flotilla_pin_memory(tensor: *const std::ffi::c_void) -> *mut std::ffi::c_void;
    fn flotilla_pinned_error() -> *const std::ffi::c_char;
    fn flotilla_allow_tf32_cublas() -> bool;
}

/// Lets fp32 matrix products (cuBLAS) and convolutions (cuDNN) run in TF32 on GPUs that have
/// it, or not, as `torch.backends.cuda.matmul.allow_tf32` and `torch.backends.cudnn.allow_tf32`
/// do (`trainer.allow_tf32`; PyTorch's default for matrix products is off). Process-wide.
pub fn set_allow_tf32(allow: bool) {
    // SAFETY: sets two flags of libtorch's global context.
    unsafe { flotilla_set_allow_tf32(allow) }
}

/// Whether fp32 matrix products may run in TF32 ([`set_allow_tf32`]).
pub fn allow_tf32() -> bool {
    // SAFETY: reads a flag of libtorch's global context.
    unsafe { flotilla_allow_tf32_cublas() }
}

/// Waits for `device`'s queued work (nothing to wait for on a CPU), as timing a GPU needs.
pub fn synchronize(device: Device) {
    if let Device::Cuda(i) = device {
        tch::Cuda::synchronize(i as i64);
    }
}

/// `t` (a host tensor) copied into page-locked memory (`Tensor::pin_memory()`, through
/// `csrc/pinned.cpp`): a copy from there to a GPU with `non_blocking` runs without the host
/// waiting for the device. Needs a CUDA runtime.
pub fn pinned(t: &Tensor) -> Result<Tensor, tch::TchError> {
    // SAFETY: `t` is a live tch handle (an at::Tensor*); the shim returns a new at::Tensor* we
    // take ownership of, or null with a thread-local message.
    unsafe {
        let p = flotilla_pin_memory(t.as_ptr() as *const std::ffi::c_void);
        if p.is_null() {
            let msg = std::ffi::CStr::from_ptr(flotilla_pinned_error());
            return Err(tch::TchError::Torch(format!(
                "pinning a host tensor: {}",
                msg.to_string_lossy()
            )));
        }
        Ok(Tensor::from_ptr(p as *mut torch_sys::C_tensor))
    }
}

/// What libtorch does when a CUDA operation makes the host wait for the device (a copy to the
/// host, a synchronize): `torch.cuda.set_sync_debug_mode`'s modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncDebug {
    Off = 0,
    /// A warning on stderr for each.
    Warn = 1,
    /// An error.
    Error = 2,
}

/// The environment variable that sets a training rank's [`SyncDebug`] on a GPU.
pub const SYNC_DEBUG_ENV: &str = "FLOTILLA_CUDA_SYNC_DEBUG";

impl SyncDebug {
    /// `off`, `warn` or `error` ([`SYNC_DEBUG_ENV`]'s values).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "off" => Some(Self::Off),
            "warn" => Some(Self::Warn),
            "error" => Some(Self::Error),
            _ => None,
        }
    }
}

/// libtorch keeps the mode in the static of an inline function (`c10::cuda::warning_state()`),
/// which a caller without CUDA headers cannot reach; that static is one exported object of
/// `libc10_cuda.so`, shared by every library of the process, whose only member is the mode
/// (an `int` enum).
const SYNC_DEBUG_STATE: &[u8] = b"_ZZN3c104cuda13warning_stateEvE14warning_state_\0";

fn sync_debug_state() -> Result<*mut i32, String> {
    if !load_torch_cuda() {
        return Err("libtorch's CUDA library is not loaded (a CPU-only libtorch?)".into());
    }
    // SAFETY: looking up a data symbol of the loaded libraries; the pointer is only used as the
    // address of that object, which lives as long as the process.
    unsafe {
        let this = libloading::os::unix::Library::this();
        let symbol = this
            .get::<*mut i32>(SYNC_DEBUG_STATE)
            .map_err(|e| format!("libtorch's CUDA sync debug state: {e}"))?;
        Ok(*symbol)
    }
}

/// Sets libtorch's CUDA sync debug mode for the process (`torch.cuda.set_sync_debug_mode`).
pub fn set_sync_debug(mode: SyncDebug) -> Result<(), String> {
    let state = sync_debug_state()?;
    // SAFETY: the address of libtorch's `WarningState`, whose one member is this mode.
    unsafe { state.write_volatile(mode as i32) };
    Ok(())
}

/// libtorch's CUDA sync debug mode now.
pub fn sync_debug() -> Result<SyncDebug, String> {
    let state = sync_debug_state()?;
    // SAFETY: as in `set_sync_debug`.
    match unsafe { state.read_volatile() } {
        0 => Ok(SyncDebug::Off),
        1 => Ok(SyncDebug::Warn),
        2 => Ok(SyncDebug::Error),
        other => Err(format!("libtorch's CUDA sync debug mode reads {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The switch reaches libtorch's context and back (the only test in this binary that
    /// touches it).
    #[test]
    fn tf32_is_off_by_default_and_switches() {
        assert!(
            !allow_tf32(),
            "PyTorch's default: no TF32 for fp32 matrix products"
        );
        set_allow_tf32(true);
        assert!(allow_tf32());
        set_allow_tf32(false);
        assert!(!allow_tf32());
    }

    /// Without a GPU, `auto` is the CPU and binding the CPU does nothing; the count agrees
    /// with libtorch's own answer once the library is loaded.
    #[test]
    fn auto_follows_the_count() {
        let n = device_count();
        assert_eq!(auto_device() == Device::Cpu, n == 0);
        assert_eq!(n, tch::Cuda::device_count().max(0) as usize);
        bind(Device::Cpu).unwrap();
    }

    #[test]
    fn pinned_copies_the_values_or_says_why_not() {
        let t = Tensor::from_slice(&[1i64, 2, 3]);
        match pinned(&t) {
            Ok(p) => {
                assert!(device_count() > 0, "pinned memory without a GPU");
                assert_eq!(Vec::<i64>::try_from(&p).unwrap(), [1, 2, 3]);
            }
            Err(e) => {
                assert_eq!(device_count(), 0, "{e}");
                let e = e.to_string();
                assert!(e.contains("pinning a host tensor: "), "{e}");
                assert!(!e.contains("frame #"), "a message, not a backtrace: {e}");
            }
        }
    }

    #[test]
    fn sync_debug_mode_is_libtorchs_own() {
        match sync_debug() {
            // A CUDA libtorch (with or without a GPU): the mode is its static, off at start.
            Ok(mode) => {
                assert_eq!(mode, SyncDebug::Off);
                set_sync_debug(SyncDebug::Warn).unwrap();
                assert_eq!(sync_debug().unwrap(), SyncDebug::Warn);
                set_sync_debug(SyncDebug::Off).unwrap();
                assert_eq!(sync_debug().unwrap(), SyncDebug::Off);
            }
            Err(e) => assert!(!load_torch_cuda(), "{e}"),
        }
        assert_eq!(SyncDebug::parse("warn"), Some(SyncDebug::Warn));
        assert_eq!(SyncDebug::parse("loud"), None);
    }
}
