//! `flotilla train`, `consolidate`, `generate` and `bench`: they need libtorch, which this CLI
//! does not link, so they run the task binary `flotilla-train` with the same arguments (the
//! process is replaced, so signals and the exit status are the task's own).

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
        .args(&args.args)
        .exec();
    Err(Failure::Other(anyhow::anyhow!(
        "cannot run {}: {error}",
        binary.display()
    )))
}
