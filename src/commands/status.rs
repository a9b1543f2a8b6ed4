//! `flotilla status`: the jobs of a run, sweep or job directory, once or until they end.

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
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    format: OutputFormat,
}

pub fn status(args: StatusArgs) -> Result<(), Failure> {
    loop {
        let st = flotilla_launch::status(&args.dir)?;
        let mut text = match args.format {
            OutputFormat::Json => flotilla_launch::status_json(&st),
            OutputFormat::Text => flotilla_launch::status_text(&st),
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
