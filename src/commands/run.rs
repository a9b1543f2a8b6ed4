//! `flotilla run`: prepare the run or sweep directories, then start the jobs locally or submit
//! them to SLURM; `--resume-sweep` starts again what did not complete.

use clap::{Args, ValueEnum};
use flotilla_config::sweep::sweep_overrides;
use flotilla_config::sweep::SweepFile;
use flotilla_launch::after::{After, AfterMode};
use flotilla_launch::rundir::snapshot::{layer_overrides, SavedJob};
use flotilla_launch::study::{
    detach, resume_study, run_study, search_space, summary, StudyFile, StudyRun,
};
use flotilla_launch::{LocalOptions, RunOptions, TaskCommand, JOB_DIR_PLACEHOLDER};
use flotilla_study::config::study_config;
use std::path::PathBuf;

use super::{write_stdout, ConfigArgs, Failure};

pub const RUN_EXAMPLES: &str = "Overrides use Hydra's grammar: key=value, +key=value, ++key=value, ~key, group=option; with -m \
a,b / range() / choice() / glob() sweep into one job per combination.

Examples:
  flotilla run trainer.max_steps=200
  flotilla run -m trainer.lr=1e-4,3e-4 compute=slurm trainer.micro_batch_size=4
  flotilla run compute=slurm compute.partition=gpu trainer.micro_batch_size=4  # 4 x 8 ranks = 32
  flotilla run -m peft=lora 'peft.r=8,16' trainer.lr=1e-3,3e-3
  flotilla run --resume-sweep outputs/multirun/2026-01-01/12-00-00
  flotilla run --after outputs/multirun/2026-01-01/12-00-00 -m seed=1,2,3
  flotilla run --from outputs/2026-01-01/12-00-00 trainer.max_steps=2000";

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Expand sweeps into one job per combination, under a sweep directory.
    #[arg(short = 'm', long)]
    multirun: bool,
    /// A named sweep file with `params:` and optional fixed `overrides:`.
    #[arg(long)]
    sweep: Option<PathBuf>,
    /// Start (or re-submit) again the jobs of this sweep or run directory that did not
    /// complete; they resume from their checkpoints.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["multirun", "sweep", "overrides"])]
    resume_sweep: Option<PathBuf>,
    /// Run a job again from its own saved files: the copy of the config directory kept with
    /// the run, its primary config name and its overrides, with OVERRIDES laid over them;
    /// into a new run directory (--config-dir and --config-name are not used).
    #[arg(long, value_name = "RUN_DIR", conflicts_with_all = ["resume_sweep", "sweep"])]
    from: Option<PathBuf>,
    /// Start the new job(s) only once every job of this run or sweep directory has completed
    /// successfully (SLURM: `sbatch --dependency=afterok` on its recorded ids; locally: wait).
    /// A job of DIR that already failed refuses the run.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["after_any", "resume_sweep"])]
    after: Option<PathBuf>,
    /// Like --after, but start once DIR's jobs have ended, however (`afterany`).
    #[arg(long, value_name = "DIR", conflicts_with = "resume_sweep")]
    after_any: Option<PathBuf>,
    /// Prepare the directories (and sbatch scripts) and start nothing.
    #[arg(long)]
    dry_run: bool,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    format: OutputFormat,
    /// Seconds between SIGTERM and SIGKILL when stopping the ranks of a local job.
    #[arg(long, default_value_t = 10.0)]
    stop_grace_s: f64,
    /// Run this program (with the job directory as its argument) in every rank instead of
    /// the training task (testing launchers).
    #[arg(long, hide = true)]
    task_exec: Option<PathBuf>,
    /// Overrides: key=value, +key=value, ++key=value, ~key, group=option, sweeps a,b ...
    overrides: Vec<String>,
}

#[derive(Clone, Copy, ValueEnum)]
pub enum OutputFormat {
    Text,
    Json,
}

pub fn run(args: RunArgs) -> Result<(), Failure> {
    let settings = super::settings()?;
    // The task binary is found before anything is created: a missing one fails here.
    let task = match &args.task_exec {
        Some(p) => TaskCommand::new([p.as_os_str(), JOB_DIR_PLACEHOLDER.as_ref()]),
        None => TaskCommand::train(&settings)?,
    };
    let mut local = LocalOptions::with_task(task);
    local.grace = std::time::Duration::from_secs_f64(args.stop_grace_s.max(0.0));
    local.catch_interrupts = true;
    let options = RunOptions {
        dry_run: args.dry_run,
        local,
    };
    let argv: Vec<String> = std::env::args().collect();
    let driving = Driving {
        stop_grace_s: args.stop_grace_s,
        task_exec: args.task_exec.clone(),
        format: args.format,
    };
    let mut study_dir = None;
    let report = match &args.resume_sweep {
        Some(dir) => match StudyFile::read(dir)? {
            Some(study) if !args.dry_run => {
                study_dir = Some(dir.clone());
                match resume_study(dir, study, settings.fallbacks(), &argv, options.local)? {
                    StudyRun::Ran(report) => report,
                    StudyRun::Slurm(dir) => return start_driver(&dir, &driving),
                }
            }
            _ => flotilla_launch::resume(dir, options)?,
        },
        None => {
            let (composer, overrides, rerun_of) = match &args.from {
                Some(dir) => {
                    let saved = SavedJob::load(dir)?;
                    if !saved.from_snapshot {
                        tracing::warn!(
                            "{} kept no copy of its config directory; composing from {} as it is now",
                            dir.display(),
                            saved.config_dir.display()
                        );
                    }
                    let overrides = layer_overrides(&saved.overrides, &args.overrides);
                    (
                        saved.composer(settings.fallbacks())?,
                        overrides,
                        Some(saved),
                    )
                }
                None => (args.config.composer(&settings)?, args.overrides, None),
            };
            let sweep_file = args.sweep.as_deref().map(SweepFile::load).transpose()?;
            let study = match args.multirun {
                true => {
                    let parsed = composer.parse_overrides(&overrides)?;
                    let sweep = sweep_overrides(&composer, parsed, sweep_file.as_ref())?;
                    study_config(&sweep.master)?.map(|config| (config, sweep))
                }
                false => None,
            };
            match study {
                Some((config, sweep)) if args.dry_run => {
                    let space = search_space(&sweep.task)?;
                    return write_stdout(&super::plan::describe_study(&config, &space));
                }
                Some(_) if args.after.is_some() || args.after_any.is_some() => {
                    return Err(Failure::Usage(anyhow::anyhow!(
                        "--after and --after-any start a grid sweep or a run after another; an \
                         adaptive sweep (flotilla.sweeper.sampler) is not supported with them: \
                         start it once the other run has ended"
                    )));
                }
                Some((config, sweep)) => {
                    let report = match run_study(
                        &composer,
                        config,
                        sweep.runtime,
                        sweep.task,
                        &argv,
                        options.local,
                    )? {
                        StudyRun::Ran(report) => report,
                        StudyRun::Slurm(dir) => return start_driver(&dir, &driving),
                    };
                    study_dir = report.run.sweep_dir.clone();
                    report
                }
                None => {
                    let request = flotilla_launch::rundir::RunRequest {
                        overrides,
                        sweep_file,
                        multirun: args.multirun,
                        argv,
                        rerun_of,
                    };
                    let after = match (&args.after, &args.after_any) {
                        (Some(dir), _) => Some((dir, AfterMode::Ok)),
                        (None, Some(dir)) => Some((dir, AfterMode::Any)),
                        (None, None) => None,
                    }
                    .map(|(dir, mode)| After {
                        dir: dir.clone(),
                        mode,
                        poll: std::time::Duration::from_secs(2),
                    });
                    flotilla_launch::run_after(&composer, &request, options, after.as_ref())?
                }
            }
        }
    };
    if let (Some(dir), OutputFormat::Text) = (&study_dir, args.format) {
        if let Some(study) = StudyFile::read(dir)? {
            eprint!("{}", summary(&study));
        }
    }
    write_stdout(&match args.format {
        OutputFormat::Json => report.to_json(),
        OutputFormat::Text => report.to_text(),
    })?;
    let problems = report.problems();
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Failure::Other(anyhow::anyhow!(problems.join("\n"))))
    }
}

/// What a detached study driver is started with.
struct Driving {
    stop_grace_s: f64,
    task_exec: Option<PathBuf>,
    format: OutputFormat,
}

/// A study whose trials are SLURM jobs: starts its detached driver (`flotilla study-drive DIR`)
/// unless one is alive, prints where it is and how to watch it, and returns.
fn start_driver(dir: &std::path::Path, args: &Driving) -> Result<(), Failure> {
    let dir = std::path::absolute(dir).map_err(|e| Failure::Other(e.into()))?;
    let (pid, started) = match detach::live_driver(&dir) {
        Some(pid) => (pid, false),
        None => {
            let exe = std::env::current_exe().map_err(|e| Failure::Other(e.into()))?;
            let mut extra = vec!["--stop-grace-s".to_string(), args.stop_grace_s.to_string()];
            if let Some(p) = &args.task_exec {
                extra.push("--task-exec".into());
                extra.push(p.display().to_string());
            }
            (detach::spawn_driver(&exe, &dir, &extra)?.pid, true)
        }
    };
    let log = dir.join(detach::LOG_FILE);
    let shown = dir.display();
    write_stdout(&match args.format {
        OutputFormat::Json => format!(
            "{}\n",
            serde_json::json!({
                "sweep_dir": dir,
                "driver_pid": pid,
                "driver_started": started,
                "driver_log": log,
            })
        ),
        OutputFormat::Text => format!(
            "study: {shown} (trials are SLURM jobs)\n\
             driver: pid {pid}{}, log {}\n\
             watch:  flotilla status {shown} --watch\n\
             report: flotilla report {shown}\n",
            if started { "" } else { " (already running)" },
            log.display()
        ),
    })
}
