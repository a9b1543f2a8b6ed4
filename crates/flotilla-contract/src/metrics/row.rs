//! `metrics.csv`: its one row type, [`MetricsRow`] (the figures of one optimizer step, global
//! over the ranks, then those of the evaluation that followed it, if any), the evaluation
//! figures themselves ([`EvalMetrics`]), and its one writer, [`MetricsWriter`]. The columns are
//! [`STEP_COLUMNS`] then [`EVAL_COLUMNS`], in that order (tests and the Python benches read
//! them by name). A run directory's file has both; a bare training loop writes the step
//! columns alone.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::MetricsError;

/// The columns of a step's figures, in file order.
pub const STEP_COLUMNS: [&str; 6] = [
    "step",
    "loss",
    "grad_norm",
    "lr",
    "tokens_per_s",
    "elapsed_s",
];

/// The columns of an evaluation's figures, after [`STEP_COLUMNS`] (empty on rows without an
/// evaluation).
pub const EVAL_COLUMNS: [&str; 3] = ["eval_loss", "eval_ppl", "eval_acc"];

/// Evaluation results.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EvalMetrics {
    /// Summed loss over the evaluation tokens / their count.
    pub loss: f64,
    /// `exp(loss)`.
    pub ppl: f64,
    /// Greedy exact-match accuracy (arithmetic data only).
    pub acc: Option<f64>,
}

/// One row of `metrics.csv`: one optimizer step, global over the ranks (loss summed over ranks
/// of the globally normalised per-rank losses, tokens/s summed), and the evaluation run after
/// it, if any. The field order is the column order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MetricsRow {
    /// 0-based optimizer step.
    pub step: u64,
    /// Mean loss over the labelled tokens of the global batch.
    pub loss: f64,
    /// Global gradient L2 norm before clipping.
    pub grad_norm: f64,
    /// Learning rate used by this step.
    pub lr: f64,
    /// Input tokens (rows × seq_len, over all ranks) per second of this step.
    pub tokens_per_s: f64,
    /// Seconds since the trainer was created, at the end of this step.
    pub elapsed_s: f64,
    pub eval_loss: Option<f64>,
    pub eval_ppl: Option<f64>,
    pub eval_acc: Option<f64>,
}

impl MetricsRow {
    /// The row's figures by column name, without the step and the empty evaluation columns
    /// (what TensorBoard gets of it).
    pub fn scalars(&self) -> Vec<(&'static str, f64)> {
        let step = [
            self.loss,
            self.grad_norm,
            self.lr,
            self.tokens_per_s,
            self.elapsed_s,
        ];
        let eval = [self.eval_loss, self.eval_ppl, self.eval_acc];
        STEP_COLUMNS[1..]
            .iter()
            .copied()
            .zip(step)
            .chain(
                EVAL_COLUMNS
                    .iter()
                    .copied()
                    .zip(eval)
                    .filter_map(|(name, value)| Some((name, value?))),
            )
            .collect()
    }

    /// This row with the figures of `eval` (none: the evaluation columns stay empty).
    pub fn with_eval(self, eval: Option<EvalMetrics>) -> Self {
        Self {
            eval_loss: eval.map(|e| e.loss),
            eval_ppl: eval.map(|e| e.ppl),
            eval_acc: eval.and_then(|e| e.acc),
            ..self
        }
    }
}

/// Which columns a [`MetricsWriter`] writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Columns {
    /// [`STEP_COLUMNS`] only: a bare training loop, which never evaluates.
    Step,
    /// [`STEP_COLUMNS`] then [`EVAL_COLUMNS`]: a run directory's `metrics.csv`.
    StepAndEval,
}

/// Writes [`MetricsRow`]s to a CSV file, header first, flushing after each row.
pub struct MetricsWriter {
    writer: csv::Writer<std::fs::File>,
    columns: Columns,
    header_written: bool,
}

impl MetricsWriter {
    /// Creates (truncates) `path` for the step columns alone; the header is written with the
    /// first row.
    pub fn create(path: &Path) -> Result<Self, MetricsError> {
        Ok(Self {
            writer: Self::truncate(path)?,
            columns: Columns::Step,
            header_written: false,
        })
    }

    /// Opens a run directory's `metrics.csv` (step and evaluation columns), keeping its rows
    /// with `step < first_step` and dropping the rest (they belong to steps after the
    /// checkpoint that is resumed); the header and the kept rows are written at once.
    pub fn open(path: &Path, first_step: u64) -> Result<Self, MetricsError> {
        let mut kept: Vec<MetricsRow> = vec![];
        if first_step > 0 && path.is_file() {
            let mut reader = csv::Reader::from_path(path)?;
            for row in reader.deserialize::<MetricsRow>() {
                let row = row?;
                if row.step < first_step {
                    kept.push(row);
                }
            }
        }
        let mut metrics = Self {
            writer: Self::truncate(path)?,
            columns: Columns::StepAndEval,
            header_written: false,
        };
        metrics.write_header()?;
        for row in &kept {
            metrics.writer.serialize(row)?;
        }
        metrics.flush()?;
        Ok(metrics)
    }

    /// Appends `row` (its evaluation figures only where this writer has those columns).
    pub fn write(&mut self, row: &MetricsRow) -> Result<(), MetricsError> {
        if !self.header_written {
            self.write_header()?;
        }
        match self.columns {
            Columns::Step => self.writer.serialize((
                row.step,
                row.loss,
                row.grad_norm,
                row.lr,
                row.tokens_per_s,
                row.elapsed_s,
            ))?,
            Columns::StepAndEval => self.writer.serialize(row)?,
        }
        self.flush()
    }

    fn truncate(path: &Path) -> Result<csv::Writer<std::fs::File>, MetricsError> {
        let file = std::fs::File::create(path).map_err(|source| MetricsError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(csv::WriterBuilder::new()
            .has_headers(false)
            .from_writer(file))
    }

    fn write_header(&mut self) -> Result<(), MetricsError> {
        let eval: &[&str] = match self.columns {
            Columns::Step => &[],
            Columns::StepAndEval => &EVAL_COLUMNS,
        };
        self.writer
            .write_record(STEP_COLUMNS.iter().chain(eval.iter()))?;
        self.header_written = true;
        Ok(())
    }

    fn flush(&mut self) -> Result<(), MetricsError> {
        self.writer.flush().map_err(|e| MetricsError::Csv(e.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(step: u64) -> MetricsRow {
        MetricsRow {
            step,
            loss: 2.5,
            grad_norm: 0.75,
            lr: 0.001,
            tokens_per_s: 1024.0,
            elapsed_s: 0.5,
            eval_loss: None,
            eval_ppl: None,
            eval_acc: None,
        }
    }

    #[test]
    fn step_columns_alone_with_the_header_on_the_first_row() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.csv");
        let mut w = MetricsWriter::create(&path).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
        w.write(&row(0)).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "step,loss,grad_norm,lr,tokens_per_s,elapsed_s\n0,2.5,0.75,0.001,1024.0,0.5\n"
        );
    }

    #[test]
    fn a_run_file_has_the_eval_columns_and_keeps_the_rows_before_the_resumed_step() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.csv");
        let mut w = MetricsWriter::open(&path, 0).unwrap();
        w.write(&row(0)).unwrap();
        let eval = EvalMetrics {
            loss: 1.0,
            ppl: 1f64.exp(),
            acc: Some(0.5),
        };
        w.write(&row(1).with_eval(Some(eval))).unwrap();
        w.write(&row(2)).unwrap();
        drop(w);
        let header = "step,loss,grad_norm,lr,tokens_per_s,elapsed_s,eval_loss,eval_ppl,eval_acc\n";
        let rows = [
            "0,2.5,0.75,0.001,1024.0,0.5,,,\n",
            "1,2.5,0.75,0.001,1024.0,0.5,1.0,2.718281828459045,0.5\n",
            "2,2.5,0.75,0.001,1024.0,0.5,,,\n",
        ];
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            [header, rows[0], rows[1], rows[2]].concat()
        );

        let w = MetricsWriter::open(&path, 2).unwrap();
        drop(w);
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            [header, rows[0], rows[1]].concat()
        );
    }
}
