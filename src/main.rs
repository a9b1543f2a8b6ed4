//! The `flotilla` command line: compose configs, plan sweeps, train. Exit status 0 on success, 2 on a
//! config or override error (message on stderr), 1 on any other failure.

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
        #[arg(allow_hyphen_values = true)]
        overrides: Vec<String>,
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
        Command::Bench {
            what: BenchCommand::Comm(args),
        } => Ok(flotilla::dist::bench::run(&args)?),
        Command::Train {
            config,
            run_dir,
            overrides,
        } => {
            let composer = composer(&config)?;
            let composed = composer.compose(&overrides)?;
            let job = composed.typed.clone().context(
                "the composed config is not a flotilla job (or --no-validate was given)",
            )?;
            Ok(train_command(&composed, &job, &run_dir)?)
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

/// Loads `libtorch_cuda.so` (global symbols) from the directory where `libtorch_cpu.so` is
/// mapped, so that tch can see CUDA; the binary does not link it. Returns whether it loaded.
fn load_torch_cuda() -> bool {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return false;
    };
    let Some(dir) = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.ends_with("/libtorch_cpu.so"))
        .and_then(|p| std::path::Path::new(p).parent().map(|d| d.to_path_buf()))
    else {
        return false;
    };
    let path = dir.join("libtorch_cuda.so");
    if !path.is_file() {
        return false;
    }
    use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
    // SAFETY: loading libtorch's own CUDA library, whose initialisers only register kernels.
    match unsafe { Library::open(Some(&path), RTLD_NOW | RTLD_GLOBAL) } {
        Ok(lib) => {
            // Keep it loaded for the life of the process.
            std::mem::forget(lib);
            true
        }
        Err(e) => {
            tracing::warn!("cannot load {}: {e}", path.display());
            false
        }
    }
}

/// The training device of `trainer.device`.
fn train_device(device: flotilla::config::schema::Device) -> anyhow::Result<tch::Device> {
    use flotilla::config::schema::Device as D;
    match device {
        D::Cpu => Ok(tch::Device::Cpu),
        D::Cuda => {
            anyhow::ensure!(
                load_torch_cuda() && tch::Cuda::is_available(),
                "trainer.device=cuda but CUDA is not available"
            );
            Ok(tch::Device::Cuda(0))
        }
        D::Auto => Ok(if load_torch_cuda() && tch::Cuda::is_available() {
            tch::Device::Cuda(0)
        } else {
            tch::Device::Cpu
        }),
    }
}

/// `flotilla train`: one single-process run in `run_dir`.
fn train_command(
    composed: &flotilla::config::Composed,
    job: &flotilla::config::schema::JobConfig,
    run_dir: &std::path::Path,
) -> anyhow::Result<()> {
    use flotilla::data::{self, BatchLayout, DataLoader, DataOptions};
    use flotilla::model::{load_hf, save_hf, Llama};
    use flotilla::train::{fit, resume, EvalSet, FitOptions, RunMetricsWriter, Trainer};
    use tch::Kind;

    let wall = std::time::Instant::now();
    let t = &job.trainer;
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

    let device = train_device(t.device)?;
    let (model, params) = match &job.model.init_from {
        Some(dir) => load_hf(dir, device, Some(Kind::Float))
            .with_context(|| format!("model.init_from={dir}"))?,
        None => {
            let model = Llama::new(&job.model)?;
            let params = model.init_params(t.seed as u64, device, Kind::Float);
            (model, params)
        }
    };
    let data = data::build(
        &job.data,
        &DataOptions {
            model_vocab_size: model.config().vocab_size,
            run_dir: Some(run_dir),
        },
    )?;
    let layout = BatchLayout {
        global_batch_size: t.global_batch_size,
        micro_batch_size: t.micro_batch_size,
        rank: 0,
        world_size: 1,
    };
    let loader = DataLoader::new(
        data.train.clone(),
        job.data.shuffle(),
        t.seed as u64,
        layout,
        device,
    )?;
    let mut trainer = Trainer::new(model, &params, t, loader, device)?;
    if let Some((dir, state)) = resume(&mut trainer, run_dir, &t.resume)? {
        eprintln!("resuming from {} (step {})", dir.display(), state.step);
    }
    let mut metrics = RunMetricsWriter::open(&run_dir.join("metrics.csv"), trainer.step_index())?;
    let eval = data.eval.as_ref().map(|d| EvalSet {
        dataset: d.clone(),
        num_batches: t.eval_batches,
        micro_batch_size: t.micro_batch_size,
        task: data.arithmetic.as_ref().map(|a| (a, 256)),
    });
    let log_every = t.log_every.max(1);
    let max_steps = t.max_steps;
    let mut last_eval_acc = None;
    let mut log = |r: &flotilla::train::RunRow| {
        if let Some(acc) = r.eval_acc {
            last_eval_acc = Some(acc);
        }
        let done = r.step + 1;
        if done % log_every == 0 || done == max_steps || r.eval_loss.is_some() {
            let mut line = format!(
                "step {done}/{max_steps} loss {:.4} lr {:.3e} tokens/s {:.0}",
                r.loss, r.lr, r.tokens_per_s
            );
            if let Some(l) = r.eval_loss {
                line.push_str(&format!(" eval_loss {l:.4}"));
            }
            if let Some(a) = r.eval_acc {
                line.push_str(&format!(" eval_acc {:.1}%", 100.0 * a));
            }
            eprintln!("{line}");
        }
    };
    eprintln!(
        "training {} on {device:?}: {} steps from step {}",
        job.model.name,
        max_steps,
        trainer.step_index()
    );
    let rows = fit(
        &mut trainer,
        &mut metrics,
        FitOptions {
            run_dir,
            until: max_steps,
            eval_every: t.eval_every,
            eval,
            checkpoint_every: t.checkpoint_every,
            keep_last_checkpoints: t.keep_last_checkpoints,
            on_row: Some(&mut log),
        },
    )?;

    let final_dir = run_dir.join("final");
    save_hf(&final_dir, trainer.model(), trainer.params(), Kind::Float)?;
    if let Some(tok) = &data.tokenizer {
        tok.save(final_dir.join("tokenizer.json"))?;
    }
    let mut summary = format!("done: {} steps", trainer.step_index());
    if let Some(r) = rows.last() {
        summary.push_str(&format!(", final loss {:.4}", r.loss));
    }
    if let Some(a) = last_eval_acc {
        summary.push_str(&format!(", eval accuracy {:.1}%", 100.0 * a));
    }
    summary.push_str(&format!(", wall {:.1}s", wall.elapsed().as_secs_f64()));
    eprintln!("{summary}");
    Ok(())
}
