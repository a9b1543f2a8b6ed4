//! Preemption: SIGUSR2 (what SLURM sends ahead of a time limit with `--signal=USR2@N`) and
//! SIGTERM (what it sends at the limit or on `scancel`) ask a run to stop. [`install`] sets
//! handlers that only store to static atomics (async-signal-safe); the training loop polls
//! [`requested`] after each step, writes a checkpoint and returns [`PreemptError::Stopped`],
//! which `flotilla train` reports ([`crate::commands::task_error::TaskError::exit_status`]) with exit status
//! [`EXIT_CODE`] so that a launcher can requeue the same command, which resumes from that
//! checkpoint. A multi-rank run must agree on the step it stops at: reduce [`requested`] over
//! the ranks (a rank that learns of a stop from its peers records it with [`request`]). This
//! file owns the signal handling and the stop state; it depends on nothing else of the crate.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

/// Exit status of a run stopped by a signal after writing its checkpoint (`EX_TEMPFAIL`).
pub const EXIT_CODE: u8 = flotilla_contract::exit::REQUEUE;

/// The signals [`install`] handles.
pub const SIGNALS: [libc::c_int; 2] = [libc::SIGUSR2, libc::SIGTERM];

static REQUESTED: AtomicBool = AtomicBool::new(false);
/// The first signal received (0: none, or a stop requested by [`request`] without one).
static SIGNAL: AtomicI32 = AtomicI32::new(0);

/// Preemption errors and the stop outcome.
#[derive(Debug, thiserror::Error)]
pub enum PreemptError {
    /// The run stopped at a step boundary on request, with a checkpoint at that step.
    #[error(
        "stopped by {reason} at step {step}; checkpoint written to {}; resume with the same command",
        checkpoint.display()
    )]
    Stopped {
        /// `SIGUSR2`, `SIGTERM`, or `a stop request` when no signal was recorded.
        reason: String,
        /// Steps completed (the checkpoint's step).
        step: u64,
        checkpoint: PathBuf,
    },
    #[error("cannot install the {signal} handler: {source}")]
    Install {
        signal: &'static str,
        #[source]
        source: std::io::Error,
    },
}

extern "C" fn on_signal(sig: libc::c_int) {
    // Only lock-free atomic stores: async-signal-safe.
    let _ = SIGNAL.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
    REQUESTED.store(true, Ordering::SeqCst);
}

fn name(sig: libc::c_int) -> &'static str {
    match sig {
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGTERM => "SIGTERM",
        _ => "a stop request",
    }
}

/// Installs the SIGUSR2 and SIGTERM handlers (idempotent). `SA_RESTART` keeps interrupted
/// system calls (file and socket I/O) going.
pub fn install() -> Result<(), PreemptError> {
    for sig in SIGNALS {
        // SAFETY: a zeroed sigaction is a valid starting value; the handler is an
        // `extern "C" fn(c_int)` that only stores to atomics.
        let rc = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(PreemptError::Install {
                signal: name(sig),
                source: std::io::Error::last_os_error(),
            });
        }
    }
    Ok(())
}

/// Whether a stop was requested (by a handled signal or [`request`]).
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// Requests a stop, e.g. on a rank whose peers received the signal; `signal` (0 for none)
/// names the reason unless one was recorded already.
pub fn request(signal: libc::c_int) {
    on_signal(signal);
}

/// Forgets a request (tests, or a run that handled it and goes on).
pub fn clear() {
    REQUESTED.store(false, Ordering::SeqCst);
    SIGNAL.store(0, Ordering::SeqCst);
}

/// The reason of the current request: `SIGUSR2`, `SIGTERM` or `a stop request`.
pub fn reason() -> &'static str {
    name(SIGNAL.load(Ordering::SeqCst))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raised_signal_sets_the_flag() {
        install().unwrap();
        clear();
        assert!(!requested());
        // SAFETY: raising a signal whose handler is installed.
        assert_eq!(unsafe { libc::raise(libc::SIGUSR2) }, 0);
        assert!(requested());
        assert_eq!(reason(), "SIGUSR2");
        // The first signal names the reason.
        request(libc::SIGTERM);
        assert_eq!(reason(), "SIGUSR2");
        clear();
        assert!(!requested());
        assert_eq!(reason(), "a stop request");
    }
}
