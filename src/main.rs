//! The `flotilla` command line: compose configs, plan sweeps, train. Exit status 0 on success, 2 on a
//! config or override error (message on stderr), 75 when `train` was stopped by SIGUSR2/SIGTERM
//! after writing a checkpoint (rerun the same command to resume), 1 on any other failure.

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use flotilla::config::node::{to_json_text, Node, Value};
use flotilla::config::yaml::{to_yaml, EmitOptions};
use flotilla::config::{ComposeOptions, Composer, ConfigError};
use flotilla::sweep::{plan_each, SweepFile};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "flotilla",
    version,
    about = "Compose experiment configs, plan and launch sweeps, train Llama-style models with DDP/FSDP"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Clone)]
struct ConfigArgs {
    /// Directory holding the primary config and the config groups.
    #[arg(long, default_value = "conf")]
    config_dir: PathBuf,
    /// Name of the primary config (without .yaml).
    #[arg(long, default_value = "config")]
    config_name: String,
    /// Skip the typed validation of the model/trainer/data/compute sections.
    #[arg(long)]
    no_validate: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Print the composed, resolved config of one job.
    Compose {
        #[command(flatten)]
        config: ConfigArgs,
        #[arg(long, value_enum, default_value_t = ComposeFormat::Yaml)]
        format: ComposeFormat,
        /// Show where every value came from (file:line or override).
        #[arg(long)]
        provenance: bool,
        /// Overrides: key=value, +key=value, ++key=value, ~key, group=option, ...
        #[arg(allow_hyphen_values = true)]
        overrides: Vec<String>,
    },
    /// Print the jobs a command would run (with -m, the expanded sweep).
    Plan {
        #[command(flatten)]
        config: ConfigArgs,
        /// Expand sweeps (a,b / range() / choice() / glob()) into one job per combination.
        #[arg(short = 'm', long)]
        multirun: bool,
        /// A named sweep file with `params:` and optional fixed `overrides:`.
        #[arg(long)]
        sweep: Option<PathBuf>,
        #[arg(long, value_enum, default_value_t = PlanFormat::Table)]
        format: PlanFormat,
        #[arg(allow_hyphen_values = true)]
        overrides: Vec<String>,
    },
    /// Train a model in a run directory (single process), resuming from its checkpoints.
    Train {
        #[command(flatten)]
        config: ConfigArgs,
        /// Run directory: config.yaml, overrides.yaml, metrics.csv, checkpoints/, final/.
        #[arg(long)]
        run_dir: PathBuf,
        /// The run directory was prepared by `flotilla run`: train on its config.yaml as is
        /// (no overrides) and write no config files.
        #[arg(long)]
        prepared: bool,
        #[arg(allow_hyphen_values = true)]
        overrides: Vec<String>,
    },
    /// Prepare run directories (validating every job first) and start the jobs locally or
    /// submit them to SLURM (compute.launcher).
    Run(RunArgs),
    /// Show the state of the jobs of a run, job or sweep directory.
    Status(StatusArgs),
    /// Write a checkpoint (full or FSDP-sharded, from any world size) as a Hugging Face
    /// directory (config.json + model.safetensors).
    Consolidate {
        /// A checkpoint directory, e.g. outputs/run/checkpoints/step_200.
        checkpoint: PathBuf,
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
    },
    /// Benchmarks that other tools rely on.
    Bench {
        #[command(subcommand)]
        what: BenchCommand,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Collective bandwidth between local ranks (nccl-tests' algbw/busbw definitions).
    Comm(flotilla::dist::bench::CommBenchArgs),
}

#[derive(Args)]
struct RunArgs {
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
    /// Prepare the directories (and sbatch scripts) and start nothing.
    #[arg(long)]
    dry_run: bool,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    format: OutputFormat,
    /// Seconds between SIGTERM and SIGKILL when stopping the ranks of a local job.
    #[arg(long, default_value_t = 10.0)]
    stop_grace_s: f64,
    /// Run this program (with the job directory as its argument) in every rank instead of
    /// `flotilla train` (testing launchers).
    #[arg(long, hide = true)]
    task_exec: Option<PathBuf>,
    #[arg(allow_hyphen_values = true)]
    overrides: Vec<String>,
}

#[derive(Args)]
struct StatusArgs {
    /// A run directory, a sweep directory, or one job directory of a sweep.
    dir: PathBuf,
    /// Refresh until every job has ended.
    #[arg(long)]
    watch: bool,
    /// Seconds between refreshes with --watch.
    #[arg(long, default_value_t = 5.0)]
    interval_s: f64,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    format: OutputFormat,
}

#[derive(Clone, Copy, ValueEnum)]
enum OutputFormat {
    Text,
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
enum ComposeFormat {
    Yaml,
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
enum PlanFormat {
    Table,
    Json,
}

/// A failure, and whether it was the user's config (exit 2) or something else (exit 1).
enum Failure {
    Config(ConfigError),
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

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FLOTILLA_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    // A rank started by `flotilla bench comm` runs the benchmark body and nothing else.
    if std::env::var_os(flotilla::dist::bench::WORKER_ENV).is_some() {
        return match flotilla::dist::bench::worker_main() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(1)
            }
        };
    }
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Config(e)) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
        Err(Failure::Other(e)) => {
            // A run stopped by SIGUSR2/SIGTERM after its checkpoint: a requeue resumes it.
            if let Some(stop) = e.chain().find_map(flotilla::train::preempt::find_stopped) {
                eprintln!("{stop}");
                return ExitCode::from(flotilla::train::preempt::EXIT_CODE);
            }
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn composer(args: &ConfigArgs) -> Result<Composer, ConfigError> {
    let mut composer = Composer::new(ComposeOptions {
        config_dir: args.config_dir.clone(),
        config_name: args.config_name.clone(),
    })?;
    composer.set_validate(!args.no_validate);
    Ok(composer)
}

/// Every leaf's dotted path and origin.
fn provenance_map(node: &Node, prefix: &str, out: &mut serde_json::Map<String, serde_json::Value>) {
    match &node.value {
        Value::Dict(d) if !d.is_empty() => {
            for (k, v) in d {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                provenance_map(v, &p, out);
            }
        }
        Value::List(items) if !items.is_empty() => {
            for (i, v) in items.iter().enumerate() {
                provenance_map(v, &format!("{prefix}[{i}]"), out);
            }
        }
        _ => {
            out.insert(
                prefix.to_string(),
                serde_json::Value::String(node.origin.to_string()),
            );
        }
    }
}

fn write_stdout(text: &str) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|_| out.flush())
        .context("cannot write to standard output")?;
    Ok(())
}

fn run(cli: Cli) -> Result<(), Failure> {
    match cli.command {
        Command::Compose {
            config,
            format,
            provenance,
            overrides,
        } => {
            let composer = composer(&config)?;
            let composed = composer.compose(&overrides)?;
            let text = match format {
                ComposeFormat::Yaml => to_yaml(&composed.job, EmitOptions { provenance }),
                ComposeFormat::Json => {
                    let config = to_json_text(&composed.job, Some(2));
                    if provenance {
                        let mut map = serde_json::Map::new();
                        provenance_map(&composed.job, "", &mut map);
                        let map = serde_json::to_string_pretty(&map).context("JSON output")?;
                        format!("{{\"config\": {config},\n\"provenance\": {map}}}\n")
                    } else {
                        format!("{config}\n")
                    }
                }
            };
            write_stdout(&text)
        }
        Command::Run(args) => run_command(args),
        Command::Status(args) => status_command(args),
        Command::Consolidate { checkpoint, out } => {
            flotilla::train::checkpoint::consolidate(&checkpoint, &out).with_context(|| {
                format!(
                    "consolidating {} into {}",
                    checkpoint.display(),
                    out.display()
                )
            })?;
            eprintln!("wrote {}", out.display());
            Ok(())
        }
        Command::Bench {
            what: BenchCommand::Comm(args),
        } => Ok(flotilla::dist::bench::run(&args)?),
        Command::Train {
            config,
            run_dir,
            prepared,
            overrides,
        } => {
            let composer = if prepared {
                if !overrides.is_empty() {
                    return Err(anyhow::anyhow!(
                        "--prepared trains on {}/config.yaml as written; overrides belong to `flotilla run`",
                        run_dir.display()
                    )
                    .into());
                }
                let config_file = run_dir.join("config.yaml");
                if !config_file.is_file() {
                    return Err(anyhow::anyhow!(
                        "--prepared: {} does not exist (prepare the directory with `flotilla run`)",
                        config_file.display()
                    )
                    .into());
                }
                composer(&ConfigArgs {
                    config_dir: run_dir.clone(),
                    config_name: "config".into(),
                    no_validate: false,
                })?
            } else {
                composer(&config)?
            };
            let composed = composer.compose(&overrides)?;
            let job = composed.typed.clone().context(
                "the composed config is not a flotilla job (or --no-validate was given)",
            )?;
            Ok(train_command(&composed, &job, &run_dir, prepared)?)
        }
        Command::Plan {
            config,
            multirun,
            sweep,
            format,
            overrides,
        } => {
            let composer = composer(&config)?;
            let sweep_file = sweep.as_deref().map(SweepFile::load).transpose()?;
            // Every job is composed and validated before anything is printed: a sweep with a
            // broken job prints nothing but the error.
            let mut text = String::new();
            let mut count = 0usize;
            if let PlanFormat::Json = format {
                text.push_str("{\"jobs\":[");
            }
            plan_each(&composer, &overrides, sweep_file.as_ref(), multirun, |j| {
                match format {
                    PlanFormat::Json => {
                        if count > 0 {
                            text.push(',');
                        }
                        let overrides = serde_json::Value::from(j.overrides.clone()).to_string();
                        let config = to_json_text(&j.composed.job, None);
                        text.push_str(&format!(
                            "{{\"num\":{},\"overrides\":{overrides},\"config\":{config}}}",
                            j.num
                        ));
                    }
                    PlanFormat::Table => {
                        let line = if j.overrides.is_empty() {
                            "(defaults)".to_string()
                        } else {
                            j.overrides.join(" ")
                        };
                        text.push_str(&format!("{:>5}  {}\n", j.num, line));
                    }
                }
                count += 1;
                Ok(())
            })?;
            match format {
                PlanFormat::Json => text.push_str("]}\n"),
                PlanFormat::Table => text.push_str(&format!(
                    "{count} job{}\n",
                    if count == 1 { "" } else { "s" }
                )),
            }
            write_stdout(&text)
        }
    }
}

impl From<flotilla::launch::LaunchError> for Failure {
    fn from(e: flotilla::launch::LaunchError) -> Self {
        use flotilla::launch::LaunchError;
        use flotilla::rundir::RunDirError;
        match e {
            LaunchError::RunDir(RunDirError::Config(c)) => Failure::Config(c),
            other => Failure::Other(other.into()),
        }
    }
}

/// `flotilla run`: prepare the directories, then start or submit the jobs.
fn run_command(args: RunArgs) -> Result<(), Failure> {
    use flotilla::launch::{LocalOptions, RunOptions, TaskCommand, JOB_DIR_PLACEHOLDER};
    let task = match &args.task_exec {
        Some(p) => TaskCommand::new([p.as_os_str(), JOB_DIR_PLACEHOLDER.as_ref()]),
        None => TaskCommand::train()?,
    };
    let mut local_opts = LocalOptions::with_task(task);
    local_opts.grace = std::time::Duration::from_secs_f64(args.stop_grace_s.max(0.0));
    local_opts.catch_interrupts = true;
    let options = RunOptions {
        dry_run: args.dry_run,
        local: local_opts,
    };
    let report = match &args.resume_sweep {
        Some(dir) => flotilla::launch::resume(dir, options)?,
        None => {
            let composer = composer(&args.config)?;
            let sweep_file = args.sweep.as_deref().map(SweepFile::load).transpose()?;
            let request = flotilla::rundir::RunRequest {
                overrides: args.overrides,
                sweep_file,
                multirun: args.multirun,
                argv: std::env::args().collect(),
            };
            flotilla::launch::run(&composer, &request, options)?
        }
    };
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

/// `flotilla status`: the jobs of a directory, once or until they have all ended.
fn status_command(args: StatusArgs) -> Result<(), Failure> {
    use std::io::IsTerminal;
    loop {
        let st = flotilla::launch::status(&args.dir)?;
        let mut text = match args.format {
            OutputFormat::Json => flotilla::launch::status_json(&st),
            OutputFormat::Text => flotilla::launch::status_text(&st),
        };
        if args.watch && std::io::stdout().is_terminal() {
            text.insert_str(0, "\x1b[2J\x1b[H");
        }
        write_stdout(&text)?;
        if !args.watch || st.all_terminal() {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_secs_f64(args.interval_s.max(0.1)));
    }
}

/// `flotilla train`: this process's part of a run in `run_dir` (one process, or one rank of a
/// DDP/FSDP job whose rank comes from the environment). Unless the directory was prepared by
/// `flotilla run`, rank 0 first writes `config.yaml` and `overrides.yaml`.
fn train_command(
    composed: &flotilla::config::Composed,
    job: &flotilla::config::schema::JobConfig,
    run_dir: &std::path::Path,
    prepared: bool,
) -> anyhow::Result<()> {
    let rank = flotilla::dist::env::discover_from_process()
        .context("reading this task's rank from the environment")?;
    if rank.is_master() && !prepared {
        std::fs::create_dir_all(run_dir)
            .with_context(|| format!("cannot create {}", run_dir.display()))?;
        let write = |name: &str, text: String| -> anyhow::Result<()> {
            let p = run_dir.join(name);
            std::fs::write(&p, text).with_context(|| format!("cannot write {}", p.display()))
        };
        write(
            "config.yaml",
            to_yaml(&composed.job, EmitOptions { provenance: false }),
        )?;
        let mut ov = String::new();
        if composed.task_overrides.is_empty() {
            ov.push_str("[]\n");
        }
        for o in &composed.task_overrides {
            ov.push_str(&format!("- {}\n", serde_json::Value::from(o.as_str())));
        }
        write("overrides.yaml", ov)?;
    } else if !run_dir.is_dir() {
        std::fs::create_dir_all(run_dir)
            .with_context(|| format!("cannot create {}", run_dir.display()))?;
    }
    let t = &job.trainer;
    let mut progress = rank
        .is_master()
        .then(|| flotilla::train::Progress::new(t.max_steps, t.log_every));
    let mut log = |r: &flotilla::train::RunRow| {
        if let Some(p) = progress.as_mut() {
            p.on_row(r);
        }
    };
    let on_row: Option<&mut dyn FnMut(&flotilla::train::RunRow)> = if rank.is_master() {
        Some(&mut log)
    } else {
        None
    };
    let summary =
        flotilla::train::job::run_job(job, run_dir, &rank, on_row).with_context(|| {
            format!(
                "training in {} (rank {} of {})",
                run_dir.display(),
                rank.rank,
                rank.world_size
            )
        })?;
    if let Some(p) = progress.as_mut() {
        p.finish(&summary.to_string());
    }
    Ok(())
}
