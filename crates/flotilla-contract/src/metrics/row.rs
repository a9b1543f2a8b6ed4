//! `metrics.csv`: its one row type, [`MetricsRow`] (the figures of one optimizer step, global
//! over the ranks, then those of the evaluation that followed it, if any), the evaluation
//! figures themselves ([`EvalMetrics`]), and its one writer, [`MetricsWriter`]. The columns are
//! [`STEP_COLUMNS`] then [`EVAL_COLUMNS`], in that order (tests and the Python benches read
//! them by name), then the objective's own columns, if it has any (DPO's `rewards/chosen`,
//! ..., and their `eval_` twins). A run directory's file has them all; a bare training loop
//! writes the step columns alone.

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
#[derive(Clone, Debug, PartialEq)]
pub struct EvalMetrics {
    /// Summed loss over the evaluation tokens (or pairs) / their count.
    pub loss: f64,
    /// `exp(loss)` of a next-token loss; `None` for a preference loss.
    pub ppl: Option<f64>,
    /// Greedy exact-match accuracy (arithmetic data only).
    pub acc: Option<f64>,
    /// The objective's own figures (DPO's `rewards/chosen`, ...), named without `eval_`.
    pub extra: Vec<(String, f64)>,
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
    /// The objective's own figures by column name (DPO's `rewards/chosen`, ..., and after an
    /// evaluation `eval_rewards/chosen`, ...); not part of the fixed columns.
    #[serde(skip)]
    pub extra: Vec<(String, f64)>,
}

impl MetricsRow {
    /// The row's figures by column name, without the step and the empty evaluation columns
    /// (what TensorBoard gets of it).
    pub fn scalars(&self) -> Vec<(&str, f64)> {
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
            .chain(
                self.extra
                    .iter()
                    .map(|(name, value)| (name.as_str(), *value)),
            )
            .collect()
    }

    /// This row with the figures of `eval` (none: the evaluation columns stay empty).
    pub fn with_eval(mut self, eval: Option<EvalMetrics>) -> Self {
        if let Some(e) = eval {
            self.eval_loss = Some(e.loss);
            self.eval_ppl = e.ppl;
            self.eval_acc = e.acc;
            self.extra.extend(
                e.extra
                    .into_iter()
                    .map(|(name, v)| (format!("eval_{name}"), v)),
            );
        }
        self
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
    /// The objective's columns after the fixed ones (a run directory's file only).
    extra: Vec<String>,
    header_written: bool,
}

/// A number as the CSV serializer writes it (the shortest text that reads back the same).
fn cell(v: f64) -> String {
    ryu::Buffer::new().format(v).to_string()
}

fn optional(v: Option<f64>) -> String {
    v.map(cell).unwrap_or_default()
}

impl MetricsWriter {
    /// Creates (truncates) `path` for the step columns alone; the header is written with the
    /// first row.
    pub fn create(path: &Path) -> Result<Self, MetricsError> {
        Ok(Self {
            writer: Self::truncate(path)?,
            columns: Columns::Step,
            extra: vec![],
            header_written: false,
        })
    }

    /// Opens a run directory's `metrics.csv` (step and evaluation columns), keeping its rows
    /// with `step < first_step` and dropping the rest (they belong to steps after the
    /// checkpoint that is resumed); the header and the kept rows are written at once.
    pub fn open(path: &Path, first_step: u64) -> Result<Self, MetricsError> {
        Self::open_with(path, first_step, &[])
    }

    /// [`MetricsWriter::open`] with the objective's `extra` columns after the fixed ones.
    pub fn open_with(path: &Path, first_step: u64, extra: &[String]) -> Result<Self, MetricsError> {
        let mut kept: Vec<csv::StringRecord> = vec![];
        if first_step > 0 && path.is_file() {
            let mut reader = csv::Reader::from_path(path)?;
            for record in reader.records() {
                let record = record?;
                let step: Option<u64> = record.get(0).and_then(|s| s.parse().ok());
                if step.is_some_and(|s| s < first_step) {
                    kept.push(record);
                }
            }
        }
        let mut metrics = Self {
            writer: Self::truncate(path)?,
            columns: Columns::StepAndEval,
            extra: extra.to_vec(),
            header_written: false,
        };
        metrics.write_header()?;
        for record in &kept {
            metrics.writer.write_record(record)?;
        }
        metrics.flush()?;
        Ok(metrics)
    }

    /// Appends `row` (its evaluation figures only where this writer has those columns, and
    /// of its objective's figures those this writer has columns for).
    pub fn write(&mut self, row: &MetricsRow) -> Result<(), MetricsError> {
        if !self.header_written {
            self.write_header()?;
        }
        let mut cells = vec![
            row.step.to_string(),
            cell(row.loss),
            cell(row.grad_norm),
            cell(row.lr),
            cell(row.tokens_per_s),
            cell(row.elapsed_s),
        ];
        if self.columns == Columns::StepAndEval {
            cells.extend([
                optional(row.eval_loss),
                optional(row.eval_ppl),
                optional(row.eval_acc),
            ]);
            for name in &self.extra {
                let value = row.extra.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
                cells.push(optional(value));
            }
        }
        self.writer.write_record(&cells)?;
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
        let mut header: Vec<&str> = STEP_COLUMNS.to_vec();
        if self.columns == Columns::StepAndEval {
            header.extend(EVAL_COLUMNS);
            header.extend(self.extra.iter().map(String::as_str));
        }
        self.writer.write_record(&header)?;
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
            extra: vec![],
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
            ppl: Some(1f64.exp()),
            acc: Some(0.5),
            extra: vec![],
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

#[cfg(test)]
mod extra_tests {
    use super::*;

    #[test]
    fn the_objectives_columns_follow_the_fixed_ones_and_survive_a_resume() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.csv");
        let extra: Vec<String> = ["rewards/chosen", "eval_rewards/chosen"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let mut w = MetricsWriter::open_with(&path, 0, &extra).unwrap();
        let row = |step: u64| MetricsRow {
            step,
            loss: 0.5,
            grad_norm: 1.0,
            lr: 0.1,
            tokens_per_s: 2.0,
            elapsed_s: 3.0,
            eval_loss: None,
            eval_ppl: None,
            eval_acc: None,
            extra: vec![("rewards/chosen".into(), -0.25)],
        };
        w.write(&row(0)).unwrap();
        let eval = EvalMetrics {
            loss: 0.75,
            ppl: None,
            acc: None,
            extra: vec![("rewards/chosen".into(), 0.125)],
        };
        w.write(&row(1).with_eval(Some(eval))).unwrap();
        drop(w);
        let want = "step,loss,grad_norm,lr,tokens_per_s,elapsed_s,eval_loss,eval_ppl,eval_acc,\
                    rewards/chosen,eval_rewards/chosen\n\
                    0,0.5,1.0,0.1,2.0,3.0,,,,-0.25,\n\
                    1,0.5,1.0,0.1,2.0,3.0,0.75,,,-0.25,0.125\n";
        assert_eq!(std::fs::read_to_string(&path).unwrap(), want);
        drop(MetricsWriter::open_with(&path, 1, &extra).unwrap());
        let kept: String = want.lines().take(2).map(|l| format!("{l}\n")).collect();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), kept);
    }
}
