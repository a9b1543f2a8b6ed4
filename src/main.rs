//! The `flotilla` command line: compose configs, plan sweeps. Exit status 0 on success, 2 on a
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
