//! `flotilla report`: the results of run and sweep directories as a table, CSV, JSON or
//! Markdown, an HTML page with plots, or the figures as SVG and PNG files.

use anyhow::Context;
use clap::{Args, ValueEnum};
use flotilla_launch::rundir::write_atomic;
use flotilla_results::report::{self, figures, html, png, render, Mode, ReportOptions};
use std::path::PathBuf;

use super::{write_stdout, Failure};

pub const REPORT_EXAMPLES: &str = "PATH is a run dir, a sweep dir, or any directory holding them \
(searched recursively). Metrics are read from metrics.csv, metrics.jsonl or TensorBoard event \
files; a job that is still running shows its latest values.

Examples:
  flotilla report outputs/multirun/2026-11-25/10-00-00
  flotilla report outputs --metric eval_acc --top 5 --format markdown
  flotilla report outputs/multirun/2026-11-25/10-00-00 --html report.html
  flotilla report outputs/multirun/2026-11-25/10-00-00 --plot plots   # SVG and PNG figures
  flotilla report outputs/multirun/2026-11-25/10-00-00 --group-by seed   # mean ± std over seeds";

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
    /// Show only the K best jobs (by --sort, or by the best metric value); with --group-by,
    /// the K best configurations.
    #[arg(long)]
    top: Option<usize>,
    /// Group over swept keys (repeat it, or give a comma-separated list; a key may be named by
    /// its last part, `seed` for `trainer.seed`): one row per configuration of the other swept
    /// keys, with the mean, the sample standard deviation (n - 1) and the count of its jobs'
    /// best values, ranked by the mean (--sort: mean, std, n, final or a key); the figures
    /// plot mean ± std.
    #[arg(long, value_name = "KEY", value_delimiter = ',')]
    group_by: Vec<String>,
    #[arg(long, value_enum, default_value_t = ReportFormat::Table)]
    format: ReportFormat,
    /// Also write a self-contained HTML page (table and plots) to this file.
    #[arg(long)]
    html: Option<PathBuf>,
    /// Also write the figures into this directory, each as an SVG file and a PNG file of the
    /// same name at twice the size (curves_loss.svg and curves_loss.png, ...).
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
        metric_only: false,
        figures: args.html.is_some() || args.plot.is_some(),
        final_models: false,
        group_by: args.group_by.clone(),
    };
    let report = report::build(&args.paths, &options).map_err(|e| match e {
        e @ (report::ReportError::UnknownMetric { .. }
        | report::ReportError::SortKey { .. }
        | report::ReportError::GroupKey { .. }) => Failure::Usage(e.into()),
        e => Failure::Other(e.into()),
    })?;
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
        eprintln!("wrote the HTML report to {}", path.display());
    }
    if let Some(dir) = &args.plot {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the plot directory {}", dir.display()))?;
        let figures = figures::figures(&report);
        if !figures.is_empty() && png::font_family().is_none() {
            eprintln!(
                "warning: no font was found, so the PNG figures have no text; install one \
                 (Debian: apt-get install fonts-dejavu-core)"
            );
        }
        for (name, svg) in &figures {
            let path = dir.join(name);
            write_atomic(&path, svg.as_bytes())
                .with_context(|| format!("cannot write {}", path.display()))?;
            let path = path.with_extension("png");
            let bytes =
                png::svg_to_png(svg).with_context(|| format!("cannot draw {}", path.display()))?;
            write_atomic(&path, &bytes)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        eprintln!(
            "wrote {} figure{} (SVG and PNG) to {}",
            figures.len(),
            if figures.len() == 1 { "" } else { "s" },
            dir.display()
        );
    }
    let text = match args.format {
        ReportFormat::Table => render::table(&report),
        ReportFormat::Csv => render::csv(&report).context("cannot write CSV")?,
        ReportFormat::Json => render::json(&report),
        ReportFormat::Markdown => render::markdown(&report),
    };
    write_stdout(&text)
}
