//! `flotilla study-drive SWEEP_DIR` (hidden): the detached driver of an adaptive study whose
//! trials are SLURM jobs. `flotilla run -m ... compute=slurm` (and `--resume-sweep` of such a
//! study) starts it in its own session with its output in `SWEEP_DIR/driver.log`; it holds
//! `SWEEP_DIR/driver.pid` while it runs and ends when the study has its `n_trials` trials.

use std::path::PathBuf;

use clap::Args;
use flotilla_launch::slurm::SlurmOptions;
use flotilla_launch::study::{drive_slurm_study, summary};
use flotilla_launch::{TaskCommand, JOB_DIR_PLACEHOLDER};

use super::Failure;

#[derive(Args)]
pub struct StudyDriveArgs {
    /// The study's sweep directory (it holds `study.json`).
    sweep_dir: PathBuf,
    /// Seconds between `scancel --signal=TERM` and `scancel` when stopping a pruned trial.
    #[arg(long, default_value_t = 10.0)]
    stop_grace_s: f64,
    /// Run this program (with the job directory as its argument) in every task instead of the
    /// training task (testing launchers).
    #[arg(long)]
    task_exec: Option<PathBuf>,
}

/// What the driver logs by default: its trials' submissions, ends and stops (info), and any
/// warning. Its stderr is `driver.log`.
const DRIVER_LOG_FILTER: &str = "warn,flotilla_launch::study=info";

pub fn study_drive(args: StudyDriveArgs) -> Result<(), Failure> {
    super::default_log_filter(DRIVER_LOG_FILTER);
    let settings = super::settings()?;
    let task = match &args.task_exec {
        Some(p) => TaskCommand::new([p.as_os_str(), JOB_DIR_PLACEHOLDER.as_ref()]),
        // A study of the user's own program never needs the training binary.
        None => TaskCommand::train(&settings).unwrap_or_else(|_| {
            TaskCommand::train_with(std::path::Path::new(flotilla_launch::TRAIN_BINARY_NAME))
        }),
    };
    let argv: Vec<String> = std::env::args().collect();
    let study = drive_slurm_study(
        &args.sweep_dir,
        settings.fallbacks(),
        &argv,
        SlurmOptions::with_task(task),
        std::time::Duration::from_secs_f64(args.stop_grace_s.max(0.0)),
    )?;
    eprint!("{}", summary(&study));
    Ok(())
}
