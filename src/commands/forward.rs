//! `flotilla train`, `consolidate`, `data`, `generate` and `bench`: they need libtorch, which
//! this CLI does not link, so they run the task binary `flotilla-train` with the same arguments,
//! verbatim (the process is replaced, so signals and the exit status are the task's own). The
//! task binary parses them: options may come before, between or after the overrides, and `--`
//! ends its options.

use clap::Args;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;

use super::Failure;

#[derive(Args)]
pub struct ForwardArgs {
    /// Arguments for `flotilla-train <command>` (`--help` shows them).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    args: Vec<OsString>,
}

pub fn forward_to_task(subcommand: &str, args: ForwardArgs) -> Result<(), Failure> {
    let binary = flotilla_launch::locate_train_binary(&super::settings()?)?;
    let error = std::process::Command::new(&binary)
        .arg(subcommand)
        .args(verbatim_args(subcommand, args.args))
        .exec();
    Err(Failure::Other(anyhow::anyhow!(
        "cannot run {}: {error}",
        binary.display()
    )))
}

/// The arguments after the subcommand's name exactly as they were given. clap drops a `--`
/// that comes first (`flotilla train -- -x`), which must still reach the task binary, where it
/// ends the options; `flotilla` has no option of its own before the subcommand, so its
/// arguments are the process's from the second on. `parsed` (what clap collected) is the
/// fallback should the name not be there.
fn verbatim_args(subcommand: &str, parsed: Vec<OsString>) -> Vec<OsString> {
    let mut argv = std::env::args_os().skip(1);
    match argv.next() {
        Some(name) if name == subcommand => argv.collect(),
        _ => parsed,
    }
}
