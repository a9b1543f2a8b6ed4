//! `flotilla`, the login-node CLI: compose configs, plan sweeps, prepare run directories and
//! start or submit jobs, watch them. It links no libtorch: training runs in the task binary
//! `flotilla-train`, which `flotilla run` starts and `flotilla train|consolidate|generate|bench`
//! forward to. Exit status 0 on success, 2 on a config or override error (message on stderr), 1
//! on any other failure; forwarded commands exit with the task's status.

mod commands;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use commands::{
    ComposeArgs, DiffArgs, ExecTaskArgs, ForwardArgs, PackRunArgs, PlanArgs, ReportArgs, RunArgs,
    StatusArgs, StudyDriveArgs,
};

/// Composition allocates and frees many small trees; mimalloc does this faster than glibc's
/// allocator, most visibly in large sweeps.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "flotilla",
    version,
    about = "Compose experiment configs, plan and launch sweeps locally or on SLURM, train Llama-style models with DDP/FSDP"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the composed, resolved config of one job.
    #[command(after_help = commands::COMPOSE_EXAMPLES)]
    Compose(ComposeArgs),
    /// Print the jobs a command would run (with -m, the expanded sweep).
    #[command(after_help = commands::PLAN_EXAMPLES)]
    Plan(PlanArgs),
    /// Prepare run directories (validating every job first) and start the jobs locally or
    /// submit them to SLURM (compute.launcher).
    #[command(after_help = commands::RUN_EXAMPLES)]
    Run(RunArgs),
    /// Show the state of the jobs of a run, job or sweep directory, and the best metric so
    /// far.
    Status(StatusArgs),
    /// Compare the jobs of run and sweep directories: one row per job with its parameters and
    /// metric; a table, CSV, JSON, Markdown, an HTML page with plots.
    #[command(after_help = commands::REPORT_EXAMPLES)]
    Report(ReportArgs),
    /// Show the config values that differ between two jobs, with where each came from.
    #[command(after_help = commands::DIFF_EXAMPLES)]
    Diff(DiffArgs),
    /// Write the shipped config tree (conf/, sweeps/, the sbatch template) to start a project
    /// from: `flotilla init`, then `flotilla run`.
    #[command(after_help = commands::INIT_EXAMPLES)]
    Init(commands::InitArgs),
    /// Train in a run directory (runs `flotilla-train train`; see `flotilla train --help`).
    #[command(disable_help_flag = true)]
    Train(ForwardArgs),
    /// Write a checkpoint as a Hugging Face directory, or merge a LoRA adapter into its base
    /// (runs `flotilla-train consolidate`).
    #[command(disable_help_flag = true)]
    Consolidate(ForwardArgs),
    /// Look at a job's training data as the model will see it (runs `flotilla-train data`;
    /// see `flotilla data show --help`).
    #[command(disable_help_flag = true)]
    Data(ForwardArgs),
    /// Generate text from a trained model: a run's final/ or a checkpoint (runs
    /// `flotilla-train generate`; see `flotilla generate --help`).
    #[command(disable_help_flag = true)]
    Generate(ForwardArgs),
    /// Benchmarks (runs `flotilla-train bench`; see `flotilla bench --help`).
    #[command(disable_help_flag = true)]
    Bench(ForwardArgs),
    /// Run the user's program of a prepared job as one of its processes (started by the
    /// launchers).
    #[command(hide = true)]
    ExecTask(ExecTaskArgs),
    /// Drive an adaptive study whose trials are SLURM jobs (started detached by `flotilla run`).
    #[command(hide = true)]
    StudyDrive(StudyDriveArgs),
    /// Run the jobs of a packed sweep as job steps of this allocation (the allocation's batch
    /// script runs it).
    #[command(hide = true)]
    PackRun(PackRunArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions { shell: clap_complete::Shell },
}

fn main() -> ExitCode {
    commands::init_logging();
    let result = match Cli::parse().command {
        Command::Compose(args) => commands::compose(args),
        Command::Plan(args) => commands::plan(args),
        Command::Run(args) => commands::run(args),
        Command::Status(args) => commands::status(args),
        Command::Report(args) => commands::report(args),
        Command::Diff(args) => commands::diff(args),
        Command::Init(args) => commands::init(args),
        Command::ExecTask(args) => commands::exec_task(args),
        Command::StudyDrive(args) => commands::study_drive(args),
        Command::PackRun(args) => commands::pack_run(args),
        Command::Train(args) => commands::forward_to_task("train", args),
        Command::Consolidate(args) => commands::forward_to_task("consolidate", args),
        Command::Data(args) => commands::forward_to_task("data", args),
        Command::Generate(args) => commands::forward_to_task("generate", args),
        Command::Bench(args) => commands::forward_to_task("bench", args),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "flotilla",
                &mut std::io::stdout(),
            );
            Ok(())
        }
    };
    commands::exit_code(result)
}
