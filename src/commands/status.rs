//! `flotilla status`: the jobs of a run, sweep or job directory, once or until they end, with
//! the best value of the report's metric logged so far.

use clap::Args;
use std::io::IsTerminal;
use std::path::PathBuf;

use super::run::OutputFormat;
use super::{write_stdout, Failure};

#[derive(Args)]
pub struct StatusArgs {
    /// A run directory, a sweep directory, or one job directory of a sweep.
    dir: PathBuf,
    /// Refresh until every job has ended.
    #[arg(long)]
    watch: bool,
    /// Seconds between refreshes with --watch.
    #[arg(long, default_value_t = 5.0)]
    interval_s: f64,
    /// The metric whose best value so far is shown under the table (default: eval_loss where
    /// any job logged it, else loss; lower is better for losses, higher for accuracies).
    #[arg(long)]
    metric: Option<String>,
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    format: OutputFormat,
}

pub fn status(args: StatusArgs) -> Result<(), Failure> {
    loop {
        // The best line is an addition to the status: a directory the report cannot read
        // shows the table without it.
        let (st, best) =
            flotilla_results::status::status_and_best(&args.dir, args.metric.as_deref())?;
        let mut text = match args.format {
            OutputFormat::Json => {
                flotilla_results::status::status_json_with_best(&st, best.as_ref())
            }
            OutputFormat::Text => {
                flotilla_results::status::status_text_with_best(&st, best.as_ref())
            }
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
