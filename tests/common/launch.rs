//! Preparing runs with flotilla_launch, for the root package's tests. Included beside `common`
//! and `compose` with `#[path = "common/launch.rs"] mod launch;`.

#![allow(dead_code)]

use flotilla_config::Composer;
use flotilla_launch::rundir::{self, PreparedRun, RunDirError, RunRequest};

/// The command line prepared runs record (`meta.json`, `sweep.json`).
pub const ARGV: [&str; 3] = ["flotilla", "run", "--test"];

/// Prepares a run (or with `multirun`, a sweep) of `overrides` with `composer`.
pub fn prepare(
    composer: &Composer,
    overrides: &[String],
    multirun: bool,
) -> Result<PreparedRun, RunDirError> {
    rundir::prepare(
        composer,
        &RunRequest {
            overrides: overrides.to_vec(),
            sweep_file: None,
            multirun,
            argv: ARGV.iter().map(|s| s.to_string()).collect(),
            rerun_of: None,
        },
    )
}
