//! The metrics a job leaves behind: the built-in trainer's `metrics.csv` rows and their writer
//! ([`row`]), and the readers of whatever a job logged — `metrics.csv`, a user program's
//! `metrics.jsonl` or TensorBoard event files ([`read`]) — that `status`, `report` and the
//! study driver share, with the one way a metric value is printed ([`format_value`]).

pub mod read;
pub mod row;

pub use read::{
    read_job_metrics, read_job_metrics_named, read_job_metrics_wanted, JobMetrics, Series, Wanted,
};
pub use row::{EvalMetrics, MetricsRow, MetricsWriter, EVAL_COLUMNS, STEP_COLUMNS};

use serde::Serialize;
use std::path::PathBuf;

/// A `metrics.csv` that cannot be written or read back.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("metrics.csv: {0}")]
    Csv(#[from] csv::Error),
}

/// A number as a person reads it: four significant decimals, scientific when very large or small.
pub fn format_value(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let a = x.abs();
    if a != 0.0 && !(1e-3..1e5).contains(&a) {
        // `9.000e-4` reads as `9e-4`: the mantissa without trailing zeros.
        let text = format!("{x:.3e}");
        return match text.split_once('e') {
            Some((mantissa, exponent)) if mantissa.contains('.') => format!(
                "{}e{exponent}",
                mantissa.trim_end_matches('0').trim_end_matches('.')
            ),
            _ => text,
        };
    }
    let text = format!("{x:.4}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text.is_empty() || text == "-" {
        "0".into()
    } else {
        text.to_string()
    }
}

/// Whether smaller or larger values of the metric are better.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Min,
    Max,
}

impl Mode {
    /// The mode a metric's name implies: accuracies and scores are maximised, anything else
    /// (loss, perplexity, error, ...) minimised.
    pub fn for_metric(name: &str) -> Mode {
        let lower = name.to_ascii_lowercase();
        const MAXIMISED: [&str; 10] = [
            "acc",
            "f1",
            "auc",
            "bleu",
            "rouge",
            "precision",
            "recall",
            "reward",
            "score",
            "mfu",
        ];
        if lower.contains("loss") || lower.contains("ppl") || lower.contains("perplexity") {
            Mode::Min
        } else if MAXIMISED.iter().any(|m| lower.contains(m)) {
            Mode::Max
        } else {
            Mode::Min
        }
    }

    /// Is `a` better than `b`?
    pub fn better(self, a: f64, b: f64) -> bool {
        match self {
            Mode::Min => a < b,
            Mode::Max => a > b,
        }
    }
}
