//! `flotilla report`: the results of run and sweep directories as a table, CSV, JSON or
//! Markdown, an HTML page with plots, or SVG figures.

use anyhow::Context;
use clap::{Args, ValueEnum};
use flotilla_launch::report::{self, html, render, Mode, ReportOptions};
use flotilla_launch::rundir::write_atomic;
use std::path::PathBuf;

use super::{write_stdout, Failure};

pub const REPORT_EXAMPLES: &str = "PATH is a run dir, a sweep dir, or any directory holding them \
(searched recursively). Metrics are read from metrics.csv, metrics.jsonl or TensorBoard event \
files; a job that is still running shows its latest values.

Examples:
  flotilla report outputs/multirun/2026-11-25/10-00-00
  flotilla report outputs --metric eval_acc --top 5 --format markdown
  flotilla report outputs/multirun/2026-11-25/10-00-00 --html report.html";

#[derive(Args)]
pub struct ReportArgs {
    /// Run directories, sweep directories, or directories holding them.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    /// The metric to rank by (default: eval_loss where any job logged it, else loss).
    #[arg(long)]
    metric: Option<String>,
    /// Whether lower or higher is better (default from the metric's name: loss/ppl → min,
    /// acc/accuracy/f1/... → max).
    #[arg(long, value_enum)]
    mode: Option<ModeArg>,
    /// Sort by a column: num, state, final, best, best_step, steps, wall_s, tokens_per_s, or a
    /// parameter key (metric columns sort best first).
    #[arg(long)]
    sort: Option<String>,
    /// Show only the K best jobs (by --sort, or by the best metric value).
    #[arg(long)]
    top: Option<usize>,
    #[arg(long, value_enum, default_value_t = ReportFormat::Table)]
    format: ReportFormat,
    /// Also write a self-contained HTML page (table and plots) to this file.
    #[arg(long)]
    html: Option<PathBuf>,
    /// Also write the figures as SVG files into this directory.
    #[arg(long)]
    plot: Option<PathBuf>,
}

#[derive(Clone, Copy, ValueEnum)]
enum ModeArg {
    Min,
    Max,
}

#[derive(Clone, Copy, ValueEnum)]
enum ReportFormat {
    Table,
    Csv,
    Json,
    Markdown,
}

pub fn report(args: ReportArgs) -> Result<(), Failure> {
    let options = ReportOptions {
        metric: args.metric.clone(),
        mode: args.mode.map(|m| match m {
            ModeArg::Min => Mode::Min,
            ModeArg::Max => Mode::Max,
        }),
        sort: args.sort.clone(),
        top: args.top,
    };
    let report = report::build(&args.paths, &options).map_err(anyhow::Error::from)?;
    if let Some(path) = &args.html {
        let title = format!(
            "flotilla report: {}",
            args.paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        write_atomic(path, html::page(&report, &title).as_bytes())
            .with_context(|| format!("cannot write the HTML report {}", path.display()))?;
    }
    if let Some(dir) = &args.plot {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the plot directory {}", dir.display()))?;
        for (name, svg) in html::figures(&report) {
            let path = dir.join(name);
            write_atomic(&path, svg.as_bytes())
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
    }
    let text = match args.format {
        ReportFormat::Table => render::table(&report),
        ReportFormat::Csv => render::csv(&report).context("cannot write CSV")?,
        ReportFormat::Json => render::json(&report),
        ReportFormat::Markdown => render::markdown(&report),
    };
    write_stdout(&text)
}
