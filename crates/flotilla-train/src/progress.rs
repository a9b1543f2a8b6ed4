//! Training progress on rank 0: [`Progress`] takes each metrics row and the final summary.
//! On a terminal (stderr) it draws a live bar (step/max_steps, loss, lr, tokens/s, ETA) with
//! evaluation results printed above it; otherwise it prints plain lines every `log_every`
//! steps, at the last step and at each evaluation. The bar appears with the first row and
//! starts at its step, so a resumed run's ETA counts only this run's pace.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use flotilla_contract::metrics::MetricsRow;

/// Progress reporting of one run.
pub struct Progress {
    max_steps: u64,
    log_every: u64,
    bar: Option<ProgressBar>,
    /// Whether a row was seen (the bar's start is set from the first).
    started: bool,
}

impl Progress {
    /// Reports a run of `max_steps` steps: a live bar when stderr is a terminal, plain lines
    /// otherwise.
    pub fn new(max_steps: u64, log_every: u64) -> Self {
        let live = std::io::stderr().is_terminal();
        let target = if live {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        Self::with_target(max_steps, log_every, live.then_some(target))
    }

    /// Plain lines on stderr (`None`) or a bar drawn to `target`.
    pub fn with_target(max_steps: u64, log_every: u64, target: Option<ProgressDrawTarget>) -> Self {
        let bar = target.map(|target| {
            let bar = ProgressBar::with_draw_target(Some(max_steps), target);
            bar.set_style(
                ProgressStyle::with_template(
                    "{bar:30.cyan/blue} {pos}/{len} {msg} [{elapsed_precise} < {eta_precise}]",
                )
                .expect("valid template")
                .progress_chars("=> "),
            );
            bar
        });
        Progress {
            max_steps,
            log_every: log_every.max(1),
            bar,
            started: false,
        }
    }

    /// Whether a live bar is drawn.
    pub fn is_live(&self) -> bool {
        self.bar.is_some()
    }

    /// Reports a metrics row (the step it ends is `row.step + 1`).
    pub fn on_row(&mut self, row: &MetricsRow) {
        match &self.bar {
            Some(bar) => {
                if !self.started {
                    // A resumed run starts at its first row's step: no jump in the rate.
                    bar.set_position(row.step);
                    bar.reset_eta();
                    bar.reset_elapsed();
                    // Nothing is drawn before the first row, so the lines a run prints before
                    // training are not overwritten.
                    bar.enable_steady_tick(Duration::from_millis(500));
                }
                bar.set_position(row.step + 1);
                bar.set_message(format!(
                    "loss {:.4} lr {:.3e} tokens/s {:.0}",
                    row.loss, row.lr, row.tokens_per_s
                ));
                if row.eval_loss.is_some() {
                    bar.println(self.line(row));
                }
            }
            None => {
                if let Some(line) = self.plain_line(row) {
                    eprintln!("{line}");
                }
            }
        }
        self.started = true;
    }

    /// Ends the report with a summary line (the bar is cleared first).
    pub fn finish(&mut self, summary: &str) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        eprintln!("{summary}");
    }

    /// The plain line of a row, when one is due: every `log_every` steps, at `max_steps`, and
    /// on evaluation rows.
    pub fn plain_line(&self, row: &MetricsRow) -> Option<String> {
        let done = row.step + 1;
        (done.is_multiple_of(self.log_every) || done == self.max_steps || row.eval_loss.is_some())
            .then(|| self.line(row))
    }

    fn line(&self, r: &MetricsRow) -> String {
        let mut line = format!(
            "step {}/{} loss {:.4} lr {:.3e} tokens/s {:.0}",
            r.step + 1,
            self.max_steps,
            r.loss,
            r.lr,
            r.tokens_per_s
        );
        if let Some(l) = r.eval_loss {
            line.push_str(&format!(" eval_loss {l:.4}"));
        }
        if let Some(a) = r.eval_acc {
            line.push_str(&format!(" eval_acc {:.1}%", 100.0 * a));
        }
        line
    }
}

impl Drop for Progress {
    /// A run that ends without [`Progress::finish`] (an error, a stop on a signal) leaves its
    /// last bar on screen.
    fn drop(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.abandon();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(step: u64, eval: bool) -> MetricsRow {
        MetricsRow {
            step,
            loss: 1.234567,
            grad_norm: 0.5,
            lr: 0.003,
            tokens_per_s: 12345.6,
            elapsed_s: 1.0,
            eval_loss: eval.then_some(0.5),
            eval_ppl: eval.then_some(0.5f64.exp()),
            eval_acc: eval.then_some(0.875),
            extra: vec![],
        }
    }

    #[test]
    fn plain_lines_every_log_every_at_the_end_and_on_eval() {
        let p = Progress::with_target(25, 10, None);
        assert!(!p.is_live());
        let due: Vec<u64> = (0..25)
            .filter(|&s| p.plain_line(&row(s, s == 14)).is_some())
            .collect();
        assert_eq!(due, [9, 14, 19, 24]);
        assert_eq!(
            p.plain_line(&row(9, false)).unwrap(),
            "step 10/25 loss 1.2346 lr 3.000e-3 tokens/s 12346"
        );
        assert_eq!(
            p.plain_line(&row(14, true)).unwrap(),
            "step 15/25 loss 1.2346 lr 3.000e-3 tokens/s 12346 eval_loss 0.5000 eval_acc 87.5%"
        );
    }

    #[test]
    fn live_bar_tracks_the_step() {
        let mut p = Progress::with_target(25, 10, Some(ProgressDrawTarget::hidden()));
        assert!(p.is_live());
        // A resumed run: the first row is step 5.
        p.on_row(&row(5, false));
        assert_eq!(p.bar.as_ref().unwrap().position(), 6);
        p.on_row(&row(6, true));
        let bar = p.bar.clone().unwrap();
        assert_eq!(bar.position(), 7);
        assert_eq!(bar.length(), Some(25));
        assert_eq!(bar.message(), "loss 1.2346 lr 3.000e-3 tokens/s 12346");
        p.finish("done");
        assert!(bar.is_finished());
        assert!(!p.is_live());
    }
}
