//! `flotilla plan`: the jobs a command would run, as a table or JSON.

use anyhow::Context;
use clap::{Args, ValueEnum};
use flotilla_config::node::to_json_text;
use flotilla_config::sweep::{plan_map, PlannedJob, SweepFile};
use std::path::PathBuf;

use super::{write_stdout, ConfigArgs, Failure};

pub const PLAN_EXAMPLES: &str =
    "Overrides use Hydra's grammar; with -m a comma list, range(), choice(), glob() or interval \
sweep expands into one job per combination, in Hydra's BasicSweeper order.

Examples:
  flotilla plan -m trainer.lr=1e-4,3e-4 model=tiny,small
  flotilla plan -m '+seed=range(0,5)' --format json
  flotilla plan -m --sweep sweeps/lr.yaml";

#[derive(Args)]
pub struct PlanArgs {
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
    /// Overrides: key=value, +key=value, ++key=value, ~key, group=option, sweeps a,b ...
    overrides: Vec<String>,
}

#[derive(Clone, Copy, ValueEnum)]
enum PlanFormat {
    Table,
    Json,
}

pub fn plan(args: PlanArgs) -> Result<(), Failure> {
    let composer = args.config.composer(&super::settings()?)?;
    let sweep_file = args.sweep.as_deref().map(SweepFile::load).transpose()?;
    // Every job is composed and validated before anything is printed: a sweep with a broken job
    // prints nothing but the error.
    let start_dir = std::env::current_dir().context("the current directory")?;
    let mut text = String::new();
    let mut count = 0usize;
    if let PlanFormat::Json = args.format {
        text.push_str("{\"jobs\":[");
    }
    // Each job is rendered on the thread that composed it; the pieces arrive in job order.
    plan_map(
        &composer,
        &args.overrides,
        sweep_file.as_ref(),
        args.multirun,
        |job| {
            if job.composed.runs_user_task() {
                // The user's program is checked as `run` checks it.
                flotilla_launch::rundir::job_runs(&job.composed, composer.context(), &start_dir)?;
            }
            Ok(match args.format {
                PlanFormat::Json => json_job(&job),
                PlanFormat::Table => table_row(&job),
            })
        },
        |piece| {
            if count > 0 && matches!(args.format, PlanFormat::Json) {
                text.push(',');
            }
            text.push_str(&piece);
            count += 1;
            Ok(())
        },
    )?;
    match args.format {
        PlanFormat::Json => text.push_str("]}\n"),
        PlanFormat::Table => text.push_str(&format!(
            "{count} job{}\n",
            if count == 1 { "" } else { "s" }
        )),
    }
    write_stdout(&text)
}

/// `{"num":N,"overrides":[...],"config":{...}}`: the config is written by the node's own JSON
/// writer (key order and number spelling kept), so the line is assembled here.
fn json_job(job: &PlannedJob) -> String {
    let overrides = serde_json::Value::from(job.overrides.clone()).to_string();
    let config = to_json_text(&job.composed.job, None);
    format!(
        "{{\"num\":{},\"overrides\":{overrides},\"config\":{config}}}",
        job.num
    )
}

fn table_row(job: &PlannedJob) -> String {
    let line = if job.overrides.is_empty() {
        "(defaults)".to_string()
    } else {
        job.overrides.join(" ")
    };
    format!("{:>5}  {}\n", job.num, line)
}
