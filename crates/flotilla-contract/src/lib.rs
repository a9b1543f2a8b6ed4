//! The contract between a flotilla launcher and the task it starts, and between a job and
//! whoever reads its directory later (`status`, `report`, the study driver). Both sides depend
//! on this crate and on nothing of each other:
//! * [`rank`]: the rank environment a launcher sets ([`rank::RankEnv`]) and a task reads
//!   ([`rank::discover`]), torchrun's and SLURM's variables;
//! * [`layout`]: every name in a run or job directory, and readers of the job files both sides
//!   use (`config.yaml`, `overrides.yaml`);
//! * [`exit`]: the exit statuses of a task and of the CLI;
//! * [`metrics`]: the `metrics.csv` row and its writer, and the readers of whatever metrics a
//!   job left (`metrics.csv`, `metrics.jsonl`, event files);
//! * [`events`]: TensorBoard event files, written by the trainer's rank 0 and read back by the
//!   report.

pub mod events;
pub mod exit;
pub mod layout;
pub mod metrics;
pub mod rank;

/// The libtorch version that this release's training task (`flotilla-train`) is built against
/// (tch 0.24.0 binds libtorch 2.11.0); recorded in every job's `meta.json`.
pub const LIBTORCH_VERSION: &str = "2.11.0";

/// This host's name (`gethostname`), or `unknown`.
pub fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; the result is NUL-terminated or truncated.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}
