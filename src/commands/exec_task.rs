//! `flotilla exec-task JOB_DIR` (hidden): what each process of a job that runs the user's own
//! program runs; it sets the process's environment from its place in the job and becomes the
//! program (see `flotilla_launch::user_task`). It returns only when the program cannot be started.

use std::path::PathBuf;

use clap::Args;

use super::Failure;

/// The exit status when the program cannot be started (as a shell's "command not found").
const CANNOT_START: u8 = 127;

#[derive(Args)]
pub struct ExecTaskArgs {
    /// The prepared job directory (it holds `task.json`).
    job_dir: PathBuf,
}

pub fn exec_task(args: ExecTaskArgs) -> Result<(), Failure> {
    let error = flotilla_launch::user_task::exec(&args.job_dir);
    eprintln!("flotilla exec-task: {error}");
    Err(Failure::Silent(CANNOT_START))
}
