//! `flotilla diff`: the config values that differ between two jobs, with where each came from.

use clap::Args;
use std::path::PathBuf;

use super::run::OutputFormat;
use super::{write_stdout, Failure};

pub const DIFF_EXAMPLES: &str =
    "Each side's value is the one in its job's config.yaml; where it came from (file:line or \
override) is found by composing the job again from the copy of the config directory kept with it.

Examples:
  flotilla diff outputs/multirun/2026-11-25/10-00-00/0 outputs/multirun/2026-11-25/10-00-00/1
  flotilla diff outputs/2026-11-24/09-12-44 outputs/2026-11-25/10-00-00 --format json";

#[derive(Args)]
pub struct DiffArgs {
    /// A job directory (a single run's directory, or one job of a sweep).
    a: PathBuf,
    /// The job directory to compare it with.
    b: PathBuf,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    format: OutputFormat,
    /// Exit with status 1 when the configs differ (as `git diff --exit-code`).
    #[arg(long)]
    exit_code: bool,
}

pub fn diff(args: DiffArgs) -> Result<(), Failure> {
    let settings = super::settings()?;
    let diff = flotilla_results::diff::diff_jobs(&args.a, &args.b, &settings.fallbacks())
        .map_err(|e| Failure::Usage(e.into()))?;
    write_stdout(&match args.format {
        OutputFormat::Text => flotilla_results::diff::to_text(&diff),
        OutputFormat::Json => flotilla_results::diff::to_json(&diff),
    })?;
    if args.exit_code && !diff.differences.is_empty() {
        return Err(Failure::Silent(1));
    }
    Ok(())
}
