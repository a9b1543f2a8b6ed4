//! The exit statuses of flotilla's processes, one list for the CLI, the training task and the
//! launchers that read them. A launcher requeues a job whose task exits with
//! [`REQUEUE`]; a task reports a config error with [`USAGE`].

/// Success.
pub const SUCCESS: u8 = 0;
/// A failure that is not the user's input: a failed job, a rank that died, an I/O error, a
/// libtorch error (out of memory included).
pub const FAILURE: u8 = 1;
/// The user's input is wrong: a config or override error, an unknown option, a job refused
/// before anything was created (a missing program, a job that will not fit).
pub const USAGE: u8 = 2;
/// The task stopped on request (SIGUSR2/SIGTERM) after writing a checkpoint: the launchers
/// requeue such a job, and the same command resumes it (`EX_TEMPFAIL`).
pub const REQUEUE: u8 = 75;
