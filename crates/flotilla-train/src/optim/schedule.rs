//! The learning-rate schedule: linear warmup from `lr/W` to `lr`, then constant, cosine or
//! linear decay to `min_lr` at the last step (`max_steps - 1`). This file owns only the formula.

use flotilla_config::schema::LrSchedule;

/// The parameters of a schedule, as in `trainer:` of a job config.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Schedule {
    pub kind: LrSchedule,
    /// Peak learning rate.
    pub lr: f64,
    pub min_lr: f64,
    pub warmup_steps: u64,
    pub max_steps: u64,
}

impl Schedule {
    /// The learning rate of 0-based step `step`.
    ///
    /// `step < W`: `lr·(step+1)/W`; afterwards, with `p = (step−W)/max(1, S−1−W)` clamped to 1,
    /// constant `lr`, cosine `min_lr + ½(lr−min_lr)(1+cos πp)` or linear `lr + (min_lr−lr)·p`.
    pub fn lr_at(&self, step: u64) -> f64 {
        let w = self.warmup_steps;
        if step < w {
            return self.lr * (step + 1) as f64 / w as f64;
        }
        let denom = self.max_steps.saturating_sub(1).saturating_sub(w).max(1) as f64;
        let p = ((step - w) as f64 / denom).min(1.0);
        match self.kind {
            LrSchedule::Constant => self.lr,
            LrSchedule::Cosine => {
                self.min_lr
                    + 0.5 * (self.lr - self.min_lr) * (1.0 + (std::f64::consts::PI * p).cos())
            }
            LrSchedule::Linear => self.lr + (self.min_lr - self.lr) * p,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(kind: LrSchedule) -> Schedule {
        Schedule {
            kind,
            lr: 1e-3,
            min_lr: 1e-4,
            warmup_steps: 4,
            max_steps: 14,
        }
    }

    #[test]
    fn warmup_is_linear_from_lr_over_w() {
        for kind in [LrSchedule::Constant, LrSchedule::Cosine, LrSchedule::Linear] {
            let sc = s(kind);
            assert_eq!(sc.lr_at(0), 1e-3 * 1.0 / 4.0);
            assert_eq!(sc.lr_at(1), 1e-3 * 2.0 / 4.0);
            assert_eq!(sc.lr_at(3), 1e-3);
            assert_eq!(sc.lr_at(4), 1e-3, "{kind:?} starts decay at the peak");
        }
    }

    #[test]
    fn constant_stays_at_peak() {
        let sc = s(LrSchedule::Constant);
        for step in 4..40 {
            assert_eq!(sc.lr_at(step), 1e-3);
        }
    }

    #[test]
    fn cosine_exact_values() {
        let sc = s(LrSchedule::Cosine);
        // S-1-W = 9 decay steps.
        assert_eq!(sc.lr_at(13), 1e-4);
        assert_eq!(sc.lr_at(100), 1e-4);
        let mid = 1e-4 + 0.5 * 9e-4 * (1.0 + (std::f64::consts::PI * 0.5).cos());
        assert!((sc.lr_at(4) - 1e-3).abs() < 1e-18);
        // p = 4.5/9 is not a step; step 7 is p = 3/9.
        let p = 3.0 / 9.0;
        let want = 1e-4 + 0.5 * 9e-4 * (1.0 + (std::f64::consts::PI * p).cos());
        assert_eq!(sc.lr_at(7), want);
        assert!((want - 7.75e-4).abs() < 1e-15, "{want}");
        assert!((mid - 5.5e-4).abs() < 1e-15);
    }

    #[test]
    fn linear_exact_values() {
        let sc = s(LrSchedule::Linear);
        assert_eq!(sc.lr_at(7), 1e-3 + (1e-4 - 1e-3) * (3.0 / 9.0));
        assert!((sc.lr_at(7) - 7e-4).abs() < 1e-15);
        // The formula as written, not min_lr exactly (1.0000000000000005e-4).
        assert_eq!(sc.lr_at(13), 1e-3 + (1e-4 - 1e-3));
        assert_eq!(sc.lr_at(50), sc.lr_at(13));
        assert!((sc.lr_at(13) - 1e-4).abs() < 1e-18);
    }

    #[test]
    fn degenerate_lengths() {
        // No warmup, one step: p = 0/max(1, 0) = 0, so the peak.
        let sc = Schedule {
            kind: LrSchedule::Cosine,
            lr: 2.0,
            min_lr: 0.0,
            warmup_steps: 0,
            max_steps: 1,
        };
        assert_eq!(sc.lr_at(0), 2.0);
        // Warmup longer than training.
        let sc = Schedule {
            warmup_steps: 10,
            max_steps: 5,
            ..sc
        };
        assert_eq!(sc.lr_at(4), 1.0);
        assert_eq!(sc.lr_at(10), 2.0);
    }
}
