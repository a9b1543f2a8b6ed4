//! `flotilla-train`, the training task every rank of a built-in job runs (`flotilla run` starts
//! it; `flotilla train|consolidate|generate|bench` forward to it). It links libtorch; the
//! login-node CLI `flotilla` does not. Exit status 0 on success, 2 on a config or override
//! error, 75 when training was stopped by SIGUSR2/SIGTERM after writing a checkpoint (rerun the
//! same command to resume), 1 on any other failure (a libtorch error, out of memory included,
//! names the step); [`TaskError::exit_status`] decides.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use flotilla_config::{ComposeOptions, Composer};
use flotilla_train::commands::task_error::TaskError;
use flotilla_train::commands::{attention_bench, comm_bench, experts_bench};

/// Data preparation (tokenizing with offsets, rendering chat templates) allocates and frees
/// many small strings and vectors on every core; mimalloc does this much faster than glibc's
/// allocator. Tensors are libtorch's own allocations and do not go through it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "flotilla-train",
    version,
    about = "The training task of flotilla: trains a Llama-style model in a run directory (one rank of a DDP/FSDP job when the environment says so)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train a model in a run directory, resuming from its checkpoints. The rank comes from the
    /// environment (torchrun's or SLURM's variables; none means one process).
    #[command(after_help = TRAIN_EXAMPLES)]
    Train(TrainArgs),
    /// Write a checkpoint (full or FSDP-sharded, from any world size) as a Hugging Face
    /// directory (config.json + model.safetensors).
    Consolidate {
        /// A checkpoint directory, e.g. outputs/run/checkpoints/step_200; with --base, a PEFT
        /// LoRA adapter directory (a LoRA job's final/).
        checkpoint: PathBuf,
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
        /// Merge the adapter into this Hugging Face base model (W + scale·B·A).
        #[arg(long)]
        base: Option<PathBuf>,
    },
    /// Look at the training data of a job.
    Data {
        #[command(subcommand)]
        what: DataCommand,
    },
    /// Generate text from a trained model (a run's final/ or a checkpoint), with a key/value
    /// cache; greedy by default, or seeded sampling.
    #[command(after_help = GENERATE_EXAMPLES)]
    Generate(flotilla_train::commands::generate::GenerateArgs),
    /// Benchmarks that other tools rely on.
    Bench {
        #[command(subcommand)]
        what: BenchCommand,
    },
}

const TRAIN_EXAMPLES: &str =
    "Overrides use Hydra's grammar (key=value, +key=value, ~key, group=option).

Examples:
  flotilla train --run-dir outputs/try trainer.max_steps=50
  flotilla train --run-dir outputs/try model=small trainer/dist=fsdp
  flotilla-train train --run-dir outputs/2026-01-01/12-00-00 --prepared";

#[derive(clap::Args)]
struct TrainArgs {
    /// Directory holding the primary config and the config groups.
    #[arg(long, default_value = "conf")]
    config_dir: PathBuf,
    /// Name of the primary config (without .yaml).
    #[arg(long, default_value = "config")]
    config_name: String,
    /// Run directory: config.yaml, overrides.yaml, metrics.csv, checkpoints/, final/.
    #[arg(long)]
    run_dir: PathBuf,
    /// The run directory was prepared by `flotilla run`: train on its config.yaml as is
    /// (no overrides) and write no config files.
    #[arg(long)]
    prepared: bool,
    /// Overrides: key=value, +key=value, ++key=value, ~key, group=option, ...
    overrides: Vec<String>,
}

#[derive(Subcommand)]
enum DataCommand {
    /// The first examples of a job's training data as the model sees them: the text with
    /// trained tokens highlighted (masked ones dimmed), token counts, and a summary line.
    #[command(after_help = DATA_SHOW_EXAMPLES)]
    Show(DataShowArgs),
}

const DATA_SHOW_EXAMPLES: &str = "Examples:
  flotilla data show
  flotilla data show --num 2 data=chat data.path=chats.jsonl data.tokenizer=/models/qwen
  flotilla data show --format json data=chat data.path=chats.jsonl model.init_from=/models/llama";

#[derive(clap::Args)]
struct DataShowArgs {
    /// Directory holding the primary config and the config groups.
    #[arg(long, default_value = "conf")]
    config_dir: PathBuf,
    /// Name of the primary config (without .yaml).
    #[arg(long, default_value = "config")]
    config_name: String,
    /// How many examples to show (0: only the summary).
    #[arg(long, default_value_t = 3)]
    num: usize,
    /// `text` for a person, `json` for programs.
    #[arg(long, value_enum, default_value_t = flotilla_train::commands::data_show::Format::Text)]
    format: flotilla_train::commands::data_show::Format,
    /// Colours on a terminal: auto (when stdout is one), always, never (trained spans then
    /// stand between ⟦ and ⟧).
    #[arg(long, value_enum, default_value_t = flotilla_train::commands::data_show::ColorChoice::Auto)]
    color: flotilla_train::commands::data_show::ColorChoice,
    /// Overrides: key=value, group=option, ... (as for `flotilla run`).
    overrides: Vec<String>,
}

const GENERATE_EXAMPLES: &str = "Examples:
  flotilla generate outputs/2026-01-01/12-00-00/final --prompt '012+340='
  flotilla generate outputs/RUN/checkpoints/step_800 --prompt '012+340=' --format json
  flotilla generate /models/llama --messages chat.json --temperature 0.7 --top-p 0.9 --seed 1
  flotilla generate /models/llama --adapter outputs/LORA_RUN/final --prompt 'Hi' --device cuda:0

--messages FILE: [{\"role\": \"user\", \"content\": \"Hi\"}] (or {\"messages\": [...]}).";

#[derive(Subcommand)]
enum BenchCommand {
    /// Collective bandwidth between local ranks (nccl-tests' algbw/busbw definitions).
    Comm(comm_bench::CommBenchArgs),
    /// Packed attention by sequence bounds (flash, variable lengths) against the masked path
    /// on a GPU: differences of outputs and gradients, and times.
    Attention(attention_bench::AttentionBenchArgs),
    /// A sparse layer's experts as grouped products against one product per expert: differences
    /// of outputs and gradients, and times (CPU or GPU).
    Experts(experts_bench::ExpertsBenchArgs),
}

fn main() -> ExitCode {
    flotilla_train::commands::train::init_logging();
    flotilla_train::error::torch_guard::install_panic_hook();
    // A rank started by `flotilla bench comm` runs the benchmark body and nothing else.
    if std::env::var_os(comm_bench::WORKER_ENV).is_some() {
        return exit_with(comm_bench::worker_main().map_err(TaskError::from));
    }
    let result = match Cli::parse().command {
        Command::Train(args) => train(args),
        Command::Consolidate {
            checkpoint,
            out,
            base,
        } => consolidate(&checkpoint, &out, base.as_deref()),
        Command::Data {
            what: DataCommand::Show(args),
        } => data_show(args),
        Command::Generate(args) => {
            flotilla_train::commands::generate::run(&args).map_err(|e| match e {
                e if e.is_usage() => TaskError::Usage(e.into()),
                e => TaskError::Other(e.into()),
            })
        }
        Command::Bench {
            what: BenchCommand::Comm(args),
        } => comm_bench::run(&args).map_err(TaskError::from),
        Command::Bench {
            what: BenchCommand::Attention(args),
        } => attention_bench::run(&args).map_err(TaskError::from),
        Command::Bench {
            what: BenchCommand::Experts(args),
        } => experts_bench::run(&args).map_err(TaskError::from),
    };
    exit_with(result)
}

/// Prints the error (a stop on request as its own report) and exits with its status.
fn exit_with(result: Result<(), TaskError>) -> ExitCode {
    let Err(e) = result else {
        return ExitCode::SUCCESS;
    };
    match e.stopped() {
        Some(stop) => eprintln!("{stop}"),
        None => eprintln!("error: {}", e.report()),
    }
    ExitCode::from(e.exit_status())
}

fn train(args: TrainArgs) -> Result<(), TaskError> {
    let (config_dir, config_name) = if args.prepared {
        if !args.overrides.is_empty() {
            return Err(TaskError::Other(anyhow::anyhow!(
                "--prepared trains on {}/{} as written; overrides belong to `flotilla run`",
                args.run_dir.display(),
                flotilla_contract::layout::CONFIG_FILE
            )));
        }
        let config_file = args.run_dir.join(flotilla_contract::layout::CONFIG_FILE);
        if !config_file.is_file() {
            return Err(TaskError::Other(anyhow::anyhow!(
                "--prepared: {} does not exist (prepare the directory with `flotilla run`)",
                config_file.display()
            )));
        }
        (args.run_dir.clone(), "config".to_string())
    } else {
        (args.config_dir, args.config_name)
    };
    let composer = Composer::new(ComposeOptions {
        config_dir,
        config_name,
    })?;
    let composed = composer.compose(&args.overrides)?;
    flotilla_train::commands::train::train_in_run_dir(&composed, &args.run_dir, args.prepared)
}

fn data_show(args: DataShowArgs) -> Result<(), TaskError> {
    let composer = Composer::new(ComposeOptions {
        config_dir: args.config_dir,
        config_name: args.config_name,
    })?;
    let composed = composer.compose(&args.overrides)?;
    let out =
        flotilla_train::commands::data_show::run(&composed, args.num, args.format, args.color)?;
    print!("{out}");
    Ok(())
}

/// Writes a checkpoint as a Hugging Face directory, or merges an adapter into its base; a
/// checkpoint, adapter or base that is missing, malformed or unsupported is bad input (exit 2).
fn consolidate(
    checkpoint: &std::path::Path,
    out: &std::path::Path,
    base: Option<&std::path::Path>,
) -> Result<(), TaskError> {
    let (result, what) = match base {
        Some(base) => (
            flotilla_train::state::peft::merge_into_base(checkpoint, base, out),
            format!(
                "merging the adapter {} into {} as {}",
                checkpoint.display(),
                base.display(),
                out.display()
            ),
        ),
        None => (
            flotilla_train::checkpoint::consolidate(checkpoint, out),
            format!(
                "consolidating {} into {}",
                checkpoint.display(),
                out.display()
            ),
        ),
    };
    if let Err(e) = result {
        let bad_input = e.is_bad_input();
        let e = anyhow::Error::new(e).context(what);
        return Err(match bad_input {
            true => TaskError::Usage(e),
            false => TaskError::Other(e),
        });
    }
    eprintln!("wrote {}", out.display());
    Ok(())
}
