//! One function per subcommand of the `flotilla` CLI, the arguments they share, and the edge
//! where errors become exit statuses (2 for the user's config, 1 for the rest).

mod compose;
mod diff;
mod exec_task;
mod forward;
mod init;
mod pack_run;
mod plan;
mod report;
mod run;
mod status;
mod study_drive;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::OnceLock;

use anyhow::Context;
use clap::Args;
use flotilla_config::{ComposeOptions, Composer, ConfigError};
use flotilla_contract::exit::error_message;
use flotilla_launch::settings::{Settings, SettingsError, SettingsSources};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Registry};

pub use compose::{compose, ComposeArgs, COMPOSE_EXAMPLES};
pub use diff::{diff, DiffArgs, DIFF_EXAMPLES};
pub use exec_task::{exec_task, ExecTaskArgs};
pub use forward::{forward_to_task, ForwardArgs};
pub use init::{init, InitArgs, INIT_EXAMPLES};
pub use pack_run::{pack_run, PackRunArgs};
pub use plan::{plan, PlanArgs, PLAN_EXAMPLES};
pub use report::{report, ReportArgs, REPORT_EXAMPLES};
pub use run::{run, RunArgs, RUN_EXAMPLES};
pub use status::{status, StatusArgs};
pub use study_drive::{study_drive, StudyDriveArgs};

/// Where the config comes from, shared by every subcommand that composes.
#[derive(Args, Clone)]
pub struct ConfigArgs {
    /// Directory holding the primary config and the config groups.
    #[arg(long, default_value = "conf")]
    pub config_dir: PathBuf,
    /// Name of the primary config (without .yaml).
    #[arg(long, default_value = "config")]
    pub config_name: String,
    /// Skip the typed validation of the model/trainer/data/compute sections.
    #[arg(long)]
    pub no_validate: bool,
}

impl ConfigArgs {
    /// A composer for these arguments whose jobs take `settings` where they leave a key unset.
    pub fn composer(&self, settings: &Settings) -> Result<Composer, ConfigError> {
        let mut composer = Composer::new(ComposeOptions {
            config_dir: self.config_dir.clone(),
            config_name: self.config_name.clone(),
        })?;
        composer.set_validate(!self.no_validate);
        composer.set_fallbacks(settings.fallbacks());
        Ok(composer)
    }
}

/// The site, user and project settings files and the `FLOTILLA_*` variables, merged.
pub fn settings() -> Result<Settings, Failure> {
    Settings::load(&SettingsSources::standard()).map_err(Failure::Settings)
}

/// A failure, and whether it was the user's config (exit 2) or something else (exit 1).
pub enum Failure {
    Config(ConfigError),
    Settings(SettingsError),
    /// An exit status with nothing more to say (the output said it).
    Silent(u8),
    /// A command line that cannot be carried out as given (exit 2).
    Usage(anyhow::Error),
    Other(anyhow::Error),
}

impl From<ConfigError> for Failure {
    fn from(e: ConfigError) -> Self {
        Failure::Config(e)
    }
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        Failure::Other(e)
    }
}

impl From<flotilla_launch::rundir::RunDirError> for Failure {
    fn from(e: flotilla_launch::rundir::RunDirError) -> Self {
        use flotilla_launch::rundir::RunDirError;
        match e {
            RunDirError::Config(c) => Failure::Config(c),
            e @ RunDirError::NotReplayable { .. } => Failure::Usage(e.into()),
            other => Failure::Other(other.into()),
        }
    }
}

impl From<flotilla_launch::LaunchError> for Failure {
    fn from(e: flotilla_launch::LaunchError) -> Self {
        use flotilla_launch::rundir::RunDirError;
        use flotilla_launch::LaunchError;
        match e {
            LaunchError::RunDir(
                e @ (RunDirError::Config(_) | RunDirError::NotReplayable { .. }),
            ) => e.into(),
            other => Failure::Other(other.into()),
        }
    }
}

/// The log filter when `FLOTILLA_LOG` sets none.
const DEFAULT_LOG_FILTER: &str = "warn";

/// The handle that replaces the default log filter; unset when `FLOTILLA_LOG` chose the filter.
static DEFAULT_LOG: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();

/// Logs to stderr (colour only on a terminal), filtered by `FLOTILLA_LOG` (default `warn`, or
/// what a subcommand sets with [`default_log_filter`]).
pub fn init_logging() {
    let from_env = EnvFilter::try_from_env("FLOTILLA_LOG").ok();
    let chosen = from_env.is_some();
    let (filter, handle) =
        reload::Layer::new(from_env.unwrap_or_else(|| EnvFilter::new(DEFAULT_LOG_FILTER)));
    tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
        )
        .init();
    if !chosen {
        let _ = DEFAULT_LOG.set(handle);
    }
}

/// Replaces the default log filter with `directives` (an `EnvFilter` string) for this
/// subcommand; a filter chosen with `FLOTILLA_LOG` stays.
fn default_log_filter(directives: &str) {
    if let Some(handle) = DEFAULT_LOG.get() {
        let _ = handle.reload(EnvFilter::new(directives));
    }
}

/// The process's exit status for a subcommand's result; the error goes to stderr.
pub fn exit_code(result: Result<(), Failure>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Config(e)) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
        Err(Failure::Settings(e)) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
        Err(Failure::Silent(code)) => ExitCode::from(code),
        Err(Failure::Usage(e)) => {
            eprintln!("error: {}", error_message(e.as_ref()));
            ExitCode::from(2)
        }
        Err(Failure::Other(e)) => {
            eprintln!("error: {}", error_message(e.as_ref()));
            ExitCode::from(1)
        }
    }
}

pub fn write_stdout(text: &str) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|_| out.flush())
        .context("cannot write to standard output")?;
    Ok(())
}
