//! Direct preference optimisation as TRL's `DPOTrainer` computes it: each sequence's summed
//! log-probability of its completion tokens, under the policy and the reference; the pair's
//! log-ratio margin `d = (log pi(c) - log ref(c)) - (log pi(r) - log ref(r))`; the loss of
//! `objective.loss_type` on `beta * d`; and the metrics TRL logs (`rewards/*`, `logps/*`,
//! `logits/*`) as sums that add over micro-batches and ranks ([`DpoSums`]).

use tch::{Kind, Tensor};

use crate::data::{Batch, IGNORE_INDEX};
use flotilla_config::schema::{DpoConfig, DpoLossType};

/// The settings of the loss (`objective` with `kind: dpo`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dpo {
    pub beta: f64,
    pub loss_type: DpoLossType,
    pub label_smoothing: f64,
}

impl From<&DpoConfig> for Dpo {
    fn from(c: &DpoConfig) -> Self {
        Self {
            beta: c.beta,
            loss_type: c.loss_type,
            label_smoothing: c.label_smoothing,
        }
    }
}

/// Each row's summed log-probability of its labelled tokens (`[R]`, fp32), from logits
/// `[R, T, V]` and labels already shifted (`[R, T]`, [`IGNORE_INDEX`] where nothing counts).
pub fn sequence_logps(logits: &Tensor, labels: &Tensor) -> Tensor {
    let logp = logits.log_softmax(-1, Kind::Float);
    let counted = labels.ne(IGNORE_INDEX);
    let targets = labels.clamp_min(0).unsqueeze(-1);
    let token = logp.gather(-1, &targets, false).squeeze_dim(-1);
    (token * counted.to_kind(Kind::Float)).sum_dim_intlist(-1, false, Kind::Float)
}

/// The figures TRL logs for a batch of pairs, as sums over pairs (and tokens for the mean
/// logits), so that micro-batches and ranks add up before [`DpoSums::metrics`] divides.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DpoSums {
    pub pairs: f64,
    pub chosen_rewards: f64,
    pub rejected_rewards: f64,
    /// Pairs whose chosen reward is above the rejected one's.
    pub accurate: f64,
    pub chosen_logps: f64,
    pub rejected_logps: f64,
    /// The vocabulary-mean logit summed over the chosen completions' tokens, and their count.
    pub chosen_logits: f64,
    pub chosen_tokens: f64,
    pub rejected_logits: f64,
    pub rejected_tokens: f64,
}

/// The metric names, in `metrics.csv`'s column order (TRL's names).
pub const DPO_METRICS: [&str; 8] = [
    "rewards/chosen",
    "rewards/rejected",
    "rewards/accuracies",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
    "logits/chosen",
    "logits/rejected",
];

impl DpoSums {
    /// The sums as a flat list, for one all-reduce.
    pub fn to_vec(self) -> Vec<f64> {
        vec![
            self.pairs,
            self.chosen_rewards,
            self.rejected_rewards,
            self.accurate,
            self.chosen_logps,
            self.rejected_logps,
            self.chosen_logits,
            self.chosen_tokens,
            self.rejected_logits,
            self.rejected_tokens,
        ]
    }

    /// The inverse of [`DpoSums::to_vec`].
    pub fn from_slice(v: &[f64]) -> Self {
        Self {
            pairs: v[0],
            chosen_rewards: v[1],
            rejected_rewards: v[2],
            accurate: v[3],
            chosen_logps: v[4],
            rejected_logps: v[5],
            chosen_logits: v[6],
            chosen_tokens: v[7],
            rejected_logits: v[8],
            rejected_tokens: v[9],
        }
    }

    /// The means, named as [`DPO_METRICS`] names them.
    pub fn metrics(&self) -> Vec<(&'static str, f64)> {
        let per_pair = |x: f64| {
            if self.pairs > 0.0 {
                x / self.pairs
            } else {
                0.0
            }
        };
        let per_token = |x: f64, n: f64| if n > 0.0 { x / n } else { 0.0 };
        let values = [
            per_pair(self.chosen_rewards),
            per_pair(self.rejected_rewards),
            per_pair(self.accurate),
            per_pair(self.chosen_rewards - self.rejected_rewards),
            per_pair(self.chosen_logps),
            per_pair(self.rejected_logps),
            per_token(self.chosen_logits, self.chosen_tokens),
            per_token(self.rejected_logits, self.rejected_tokens),
        ];
        DPO_METRICS.iter().copied().zip(values).collect()
    }
}

/// The margin of log-ratios each averaged over its completion's labelled tokens (IPO's and
/// `sigmoid_norm`'s), from the pairs' `[M]` chosen and rejected log-ratios.
fn length_averaged(
    batch: &Batch,
    chosen_ratio: &Tensor,
    rejected_ratio: &Tensor,
    m: i64,
) -> Tensor {
    let counted = batch
        .labels
        .ne(IGNORE_INDEX)
        .sum_dim_intlist(-1, false, Kind::Float)
        .clamp_min(1.0);
    chosen_ratio / counted.narrow(0, 0, m) - rejected_ratio / counted.narrow(0, m, m)
}

impl Dpo {
    /// The summed loss of the pairs of `batch` (chosen rows first, [`Batch::pairs`]) given the
    /// policy's logits `[2M, T, V]` and the reference's log-probabilities in
    /// [`Batch::reference_logps`], and the pairs' [`DpoSums`] as a float64 tensor in
    /// [`DpoSums::to_vec`]'s order, on the device (not read: the trainer reads it with the
    /// step's other figures, [`crate::parallel::readings`]).
    pub fn loss_sum(
        &self,
        logits: &Tensor,
        batch: &Batch,
    ) -> Result<(Tensor, Tensor), tch::TchError> {
        let m = batch.samples();
        let reference = batch
            .reference_logps
            .as_ref()
            .expect("the trainer attaches the reference log-probabilities to a batch of pairs");
        let logps = sequence_logps(logits, &batch.labels);
        let (chosen, rejected) = (logps.narrow(0, 0, m), logps.narrow(0, m, m));
        let reference = reference.to_device(logps.device()).to_kind(Kind::Float);
        let chosen_ratio = &chosen - reference.narrow(0, 0, m);
        let rejected_ratio = &rejected - reference.narrow(0, m, m);
        let beta = self.beta;
        let eps = self.label_smoothing;
        let margin = &chosen_ratio - &rejected_ratio;
        let per_pair = match self.loss_type {
            DpoLossType::Sigmoid => {
                let z = &margin * beta;
                -(z.log_sigmoid() * (1.0 - eps)) - (-&z).log_sigmoid() * eps
            }
            DpoLossType::Robust => {
                let z = &margin * beta;
                (-(z.log_sigmoid() * (1.0 - eps)) + (-&z).log_sigmoid() * eps) / (1.0 - 2.0 * eps)
            }
            DpoLossType::Hinge => (-(&margin * beta) + 1.0).relu(),
            DpoLossType::Ipo => (length_averaged(batch, &chosen_ratio, &rejected_ratio, m)
                - 1.0 / (2.0 * beta))
                .square(),
            DpoLossType::SigmoidNorm => {
                -(length_averaged(batch, &chosen_ratio, &rejected_ratio, m) * beta).log_sigmoid()
            }
            DpoLossType::ApoZero => {
                (-(&chosen_ratio * beta).sigmoid() + 1.0) + (&rejected_ratio * beta).sigmoid()
            }
        };
        let loss = per_pair.sum(Kind::Float);
        let sums = tch::no_grad(|| -> Result<Tensor, tch::TchError> {
            let chosen_rewards = chosen_ratio.detach() * beta;
            let rejected_rewards = rejected_ratio.detach() * beta;
            let counted = batch.labels.ne(IGNORE_INDEX).to_kind(Kind::Float);
            let mean_logits = logits.detach().mean_dim(-1, false, Kind::Float) * &counted;
            let per_row_logits = mean_logits.sum_dim_intlist(-1, false, Kind::Float);
            let per_row_tokens = counted.sum_dim_intlist(-1, false, Kind::Float);
            // Every sum on the device; the pairs first.
            let sum = |t: &Tensor| t.sum(Kind::Double);
            Tensor::f_stack(
                &[
                    Tensor::f_full([], m as f64, (Kind::Double, logits.device()))?,
                    sum(&chosen_rewards),
                    sum(&rejected_rewards),
                    sum(&chosen_rewards.gt_tensor(&rejected_rewards)),
                    sum(&chosen.detach()),
                    sum(&rejected.detach()),
                    sum(&per_row_logits.narrow(0, 0, m)),
                    sum(&per_row_tokens.narrow(0, 0, m)),
                    sum(&per_row_logits.narrow(0, m, m)),
                    sum(&per_row_tokens.narrow(0, m, m)),
                ],
                0,
            )
        })?;
        Ok((loss, sums))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    fn pair_batch(labels: &[[i64; 3]; 4], reference: [f32; 4]) -> Batch {
        let flat: Vec<i64> = labels.iter().flatten().copied().collect();
        Batch {
            input_ids: Tensor::zeros([4, 3], (Kind::Int64, Device::Cpu)),
            labels: Tensor::from_slice(&flat).reshape([4, 3]),
            positions: None,
            layout: None,
            num_loss_tokens: flat.iter().filter(|&&l| l != IGNORE_INDEX).count() as u64,
            pairs: true,
            reference_logps: Some(Tensor::from_slice(&reference)),
        }
    }

    #[test]
    fn sequence_logps_sum_the_labelled_tokens_only() {
        let logits = Tensor::from_slice(&[0.0f32, 1.0, 2.0, 3.0, 1.0, 0.0]).reshape([1, 2, 3]);
        let labels = Tensor::from_slice(&[2i64, IGNORE_INDEX]).reshape([1, 2]);
        let got = sequence_logps(&logits, &labels).double_value(&[0]);
        let want = 2.0 - (0f64.exp() + 1f64.exp() + 2f64.exp()).ln();
        assert!((got - want).abs() < 1e-6, "{got} vs {want}");
    }

    #[test]
    fn each_loss_type_matches_its_formula_and_the_policy_equal_to_the_reference_gives_ln_2() {
        // Two pairs; vocabulary 2, uniform logits: every labelled token has log-probability
        // ln(1/2).
        let logits = Tensor::zeros([4, 3, 2], (Kind::Float, Device::Cpu));
        let labels = [
            [1, 0, IGNORE_INDEX],
            [1, IGNORE_INDEX, IGNORE_INDEX],
            [0, 1, 1],
            [0, IGNORE_INDEX, IGNORE_INDEX],
        ];
        let half = 0.5f64.ln();
        // Reference equal to the policy: margins 0.
        let same = [2.0 * half, half, 3.0 * half, half].map(|x| x as f32);
        let dpo = |loss_type, label_smoothing| Dpo {
            beta: 0.1,
            loss_type,
            label_smoothing,
        };
        let (loss, sums) = dpo(DpoLossType::Sigmoid, 0.0)
            .loss_sum(&logits, &pair_batch(&labels, same))
            .unwrap();
        assert!((loss.double_value(&[]) / 2.0 - 2f64.ln()).abs() < 1e-6);
        let sums = DpoSums::from_slice(&Vec::<f64>::try_from(&sums).unwrap());
        assert_eq!(sums.pairs, 2.0);
        assert_eq!(sums.chosen_rewards, 0.0);
        assert_eq!(sums.accurate, 0.0);
        assert!((sums.chosen_logps - 3.0 * half).abs() < 1e-5);
        // A reference that likes the rejected completions less: margin d per pair.
        let reference = [2.0 * half, half, 3.0 * half - 1.0, half - 2.0].map(|x| x as f32);
        let d: [f64; 2] = [-1.0, -2.0];
        let ls = |x: f64| -(1.0 + (-x).exp()).ln();
        for (loss_type, eps, f) in [
            (
                DpoLossType::Sigmoid,
                0.0,
                Box::new(|z: f64| -ls(z)) as Box<dyn Fn(f64) -> f64>,
            ),
            (
                DpoLossType::Sigmoid,
                0.2,
                Box::new(move |z: f64| -0.8 * ls(z) - 0.2 * ls(-z)),
            ),
            (
                DpoLossType::Robust,
                0.2,
                Box::new(move |z: f64| (-0.8 * ls(z) + 0.2 * ls(-z)) / 0.6),
            ),
            (
                DpoLossType::Hinge,
                0.0,
                Box::new(|z: f64| (1.0 - z).max(0.0)),
            ),
        ] {
            let (loss, sums) = dpo(loss_type, eps)
                .loss_sum(&logits, &pair_batch(&labels, reference))
                .unwrap();
            let want: f64 = d.iter().map(|&d| f(0.1 * d)).sum();
            assert!(
                (loss.double_value(&[]) - want).abs() < 1e-5,
                "{loss_type:?} {eps}"
            );
            let sums = DpoSums::from_slice(&Vec::<f64>::try_from(&sums).unwrap());
            assert!((sums.rejected_rewards - 0.1 * 3.0).abs() < 1e-5);
            assert_eq!(sums.accurate, 0.0);
        }
        // IPO: log-ratios averaged over each completion's labelled tokens (2, 1; 3, 1).
        let (loss, _) = dpo(DpoLossType::Ipo, 0.0)
            .loss_sum(&logits, &pair_batch(&labels, reference))
            .unwrap();
        let want = (0.0f64 - 1.0 / 3.0 - 5.0).powi(2) + (0.0f64 - 2.0 - 5.0).powi(2);
        assert!(
            (loss.double_value(&[]) - want).abs() < 1e-4,
            "{}",
            loss.double_value(&[])
        );
        // sigmoid_norm: DPO on the same length-averaged margins; apo_zero: each completion
        // against the reference on its own (chosen log-ratios 0, rejected 1 and 2).
        let (loss, _) = dpo(DpoLossType::SigmoidNorm, 0.0)
            .loss_sum(&logits, &pair_batch(&labels, reference))
            .unwrap();
        let want = -ls(0.1 * (-1.0 / 3.0)) - ls(0.1 * -2.0);
        assert!((loss.double_value(&[]) - want).abs() < 1e-5);
        let (loss, _) = dpo(DpoLossType::ApoZero, 0.0)
            .loss_sum(&logits, &pair_batch(&labels, reference))
            .unwrap();
        let sig = |x: f64| 1.0 / (1.0 + (-x).exp());
        let want = 2.0 * (1.0 - sig(0.0)) + sig(0.1) + sig(0.2);
        assert!((loss.double_value(&[]) - want).abs() < 1e-5);
    }
}
