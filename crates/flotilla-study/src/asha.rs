//! Asynchronous successive halving: Optuna's `SuccessiveHalvingPruner`
//! (`optuna/pruners/_successive_halving.py`), decision for decision.
//!
//! Rung `k` is reached at step `min_resource · reduction_factor^(min_early_stopping_rate + k)`.
//! When a trial reports a step at or past its next rung, the value it reports is recorded as
//! its `completed_rung_k` ([`Trial::rungs`]) and compared with the values every other trial
//! recorded at that rung: the trial continues only if it is in the top `1/reduction_factor` of
//! them (itself included), and then tries the next rung with the same value; among the first
//! `reduction_factor − 1` trials to reach a rung, only one as good as the best so far continues
//! (`_is_trial_promotable_to_next_rung`). A NaN value is pruned at its rung; with
//! `bootstrap_count`, a trial is pruned while no more than that many values are recorded at
//! its rung. `min_resource: auto` is estimated once, when first needed, as the largest last step
//! of the COMPLETE trials divided by 100 (at least 1); until a trial has completed nothing is
//! pruned.

use super::{Direction, Trial, TrialState};
use serde::{Deserialize, Serialize};

/// The step of the first rung: a number of steps, or `auto`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "MinResourceRepr", into = "MinResourceRepr")]
pub enum MinResource {
    #[default]
    Auto,
    Steps(u64),
}

#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum MinResourceRepr {
    Steps(u64),
    Text(String),
}

impl TryFrom<MinResourceRepr> for MinResource {
    type Error = String;

    fn try_from(r: MinResourceRepr) -> Result<Self, Self::Error> {
        match r {
            MinResourceRepr::Steps(n) => Ok(MinResource::Steps(n)),
            MinResourceRepr::Text(t) if t == "auto" => Ok(MinResource::Auto),
            MinResourceRepr::Text(t) => Err(format!(
                "min_resource must be 'auto' or a number of steps >= 1, got '{t}'"
            )),
        }
    }
}

impl From<MinResource> for MinResourceRepr {
    fn from(m: MinResource) -> Self {
        match m {
            MinResource::Auto => MinResourceRepr::Text("auto".into()),
            MinResource::Steps(n) => MinResourceRepr::Steps(n),
        }
    }
}

/// The pruner's settings and, under `min_resource: auto`, the estimate once made.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SuccessiveHalving {
    pub min_resource: MinResource,
    pub reduction_factor: u64,
    pub min_early_stopping_rate: u32,
    pub bootstrap_count: usize,
    /// The `auto` estimate, made the first time a decision needs it and kept from then on (a
    /// driver persists the pruner with the study to decide the same after a restart).
    pub estimated_min_resource: Option<u64>,
}

impl Default for SuccessiveHalving {
    fn default() -> Self {
        SuccessiveHalving {
            min_resource: MinResource::Auto,
            reduction_factor: 4,
            min_early_stopping_rate: 0,
            bootstrap_count: 0,
            estimated_min_resource: None,
        }
    }
}

impl SuccessiveHalving {
    /// A pruner with Optuna's checks on its settings.
    pub fn new(
        min_resource: MinResource,
        reduction_factor: u64,
        min_early_stopping_rate: u32,
        bootstrap_count: usize,
    ) -> Result<SuccessiveHalving, String> {
        let p = SuccessiveHalving {
            min_resource,
            reduction_factor,
            min_early_stopping_rate,
            bootstrap_count,
            estimated_min_resource: None,
        };
        p.validate()?;
        Ok(p)
    }

    /// Optuna's constructor checks (also for settings read from a file).
    pub fn validate(&self) -> Result<(), String> {
        if self.min_resource == MinResource::Steps(0) {
            return Err(
                "min_resource is 0, but must be either `min_resource >= 1` or 'auto'".into(),
            );
        }
        if self.reduction_factor < 2 {
            return Err(format!(
                "reduction_factor is {}, but must be `reduction_factor >= 2`",
                self.reduction_factor
            ));
        }
        if self.bootstrap_count > 0 && self.min_resource == MinResource::Auto {
            return Err(format!(
                "bootstrap_count > 0 and min_resource == 'auto' are mutually incompatible, \
                 bootstrap_count is {}",
                self.bootstrap_count
            ));
        }
        Ok(())
    }

    /// The first rung's step, when known: the fixed `min_resource`, or the `auto` estimate.
    pub fn min_resource_steps(&self) -> Option<u64> {
        match self.min_resource {
            MinResource::Steps(n) => Some(n),
            MinResource::Auto => self.estimated_min_resource,
        }
    }

    /// The step at which rung `rung` is reached, once the first rung's step is known.
    pub fn rung_step(&self, rung: u32) -> Option<u64> {
        let exp = self.min_early_stopping_rate.checked_add(rung)?;
        self.min_resource_steps()?
            .checked_mul(self.reduction_factor.checked_pow(exp)?)
    }

    /// Optuna's `prune(study, trial)` after `trial` reported its latest intermediate value:
    /// `true` to stop it. Records the values of the rungs it completes in `trial.rungs`.
    /// `trials` is the rest of the study (every state; an entry with `trial`'s number is
    /// skipped).
    pub fn prune(&mut self, trial: &mut Trial, trials: &[Trial], direction: Direction) -> bool {
        let Some(step) = trial.last_step() else {
            return false;
        };
        let value = trial.intermediate[&step];
        let mut rung = 0u32;
        while trial.rungs.contains_key(&rung) {
            rung += 1;
        }
        loop {
            if self.min_resource_steps().is_none() {
                match estimate_min_resource(trials) {
                    Some(m) => self.estimated_min_resource = Some(m),
                    None => return false,
                }
            }
            let Some(promotion_step) = self.rung_step(rung) else {
                return false;
            };
            if step < promotion_step {
                return false;
            }
            if value.is_nan() {
                return true;
            }
            trial.rungs.insert(rung, value);
            let mut competing: Vec<f64> = trials
                .iter()
                .filter(|t| t.number != trial.number)
                .filter_map(|t| t.rungs.get(&rung).copied())
                .collect();
            competing.push(value);
            if competing.len() <= self.bootstrap_count {
                return true;
            }
            if !is_promotable(value, &mut competing, self.reduction_factor, direction) {
                return true;
            }
            rung += 1;
        }
    }
}

/// Optuna's `_estimate_min_resource`: the largest last step of the COMPLETE trials, `// 100`,
/// at least 1; `None` while no trial has completed with a step.
pub fn estimate_min_resource(trials: &[Trial]) -> Option<u64> {
    trials
        .iter()
        .filter(|t| t.state == TrialState::Complete)
        .filter_map(Trial::last_step)
        .max()
        .map(|last| (last / 100).max(1))
}

/// Optuna's `_is_trial_promotable_to_next_rung`: is `value` within the best
/// `len(competing) // reduction_factor` of `competing` (the best one while fewer than
/// `reduction_factor` are recorded)?
pub fn is_promotable(
    value: f64,
    competing: &mut [f64],
    reduction_factor: u64,
    direction: Direction,
) -> bool {
    let n = competing.len();
    let idx = (n as u64 / reduction_factor).saturating_sub(1) as usize;
    competing.sort_by(f64::total_cmp);
    match direction {
        Direction::Maximize => value >= competing[n - (idx + 1)],
        Direction::Minimize => value <= competing[idx],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Params;

    /// Trials `0..curves.len()` all started at once; in each round every trial still running
    /// reports `curve(step)` for the next of `steps`, and the pruner decides. Those left run
    /// to completion with their last value. Returns (trial, step) for each prune, in order,
    /// and the trials.
    fn run(
        pruner: &mut SuccessiveHalving,
        direction: Direction,
        curves: &[f64],
        steps: &[u64],
        first_complete: Option<u64>,
    ) -> (Vec<(u64, u64)>, Vec<Trial>) {
        let mut trials: Vec<Trial> = Vec::new();
        if let Some(last) = first_complete {
            // A finished trial for `auto` to estimate from.
            let mut t = Trial::new(0, Params::new());
            for s in (100..=last).step_by(100) {
                t.report(s, 10.0);
                let others = trials.clone();
                assert!(!pruner.prune(&mut t, &others, direction));
            }
            t.state = TrialState::Complete;
            t.value = Some(10.0);
            trials.push(t);
        }
        let base = trials.len() as u64;
        for i in 0..curves.len() as u64 {
            trials.push(Trial::new(base + i, Params::new()));
        }
        let mut pruned = Vec::new();
        for &s in steps {
            for (i, curve) in curves.iter().enumerate() {
                let idx = base as usize + i;
                if trials[idx].state != TrialState::Running {
                    continue;
                }
                let v = curve + 1.0 / s as f64;
                trials[idx].report(s, v);
                let others = trials.clone();
                if pruner.prune(&mut trials[idx], &others, direction) {
                    trials[idx].state = TrialState::Pruned;
                    pruned.push((base + i as u64, s));
                }
            }
        }
        for t in trials.iter_mut() {
            if t.state == TrialState::Running {
                t.state = TrialState::Complete;
                t.value = t.intermediate.values().next_back().copied();
            }
        }
        (pruned, trials)
    }

    // Expected decisions from optuna 5.0.0: the same trials asked at once from a study with
    // `SuccessiveHalvingPruner(...)`, `trial.report(v, s)` then `trial.should_prune()` in the
    // same order, `study.tell(trial, state=PRUNED)` when it says so; the rungs are the
    // trials' `completed_rung_k` system attributes.
    const CURVES: [f64; 8] = [0.5, 0.3, 0.7, 0.2, 0.6, 0.25, 0.9, 0.1];

    #[test]
    fn default_rates_match_optuna() {
        let mut p = SuccessiveHalving::new(MinResource::Steps(1), 4, 0, 0).unwrap();
        let steps: Vec<u64> = (1..=20).collect();
        let (pruned, trials) = run(&mut p, Direction::Minimize, &CURVES, &steps, None);
        assert_eq!(pruned, OPTUNA_MIN_RF4);
        assert_eq!(rungs(&trials), optuna_min_rf4_rungs());
    }

    #[test]
    fn halving_with_factor_2_and_maximize_matches_optuna() {
        let mut p = SuccessiveHalving::new(MinResource::Steps(2), 2, 1, 0).unwrap();
        let steps: Vec<u64> = (1..=40).step_by(3).collect();
        let (pruned, trials) = run(&mut p, Direction::Maximize, &CURVES, &steps, None);
        assert_eq!(pruned, OPTUNA_MAX_RF2);
        assert_eq!(rungs(&trials), optuna_max_rf2_rungs());
    }

    #[test]
    fn auto_min_resource_matches_optuna() {
        let mut p = SuccessiveHalving::default();
        let steps: Vec<u64> = (1..=12).map(|k| k * 2).collect();
        let (pruned, trials) = run(&mut p, Direction::Minimize, &CURVES, &steps, Some(500));
        assert_eq!(p.estimated_min_resource, Some(5));
        assert_eq!(pruned, OPTUNA_AUTO);
        assert_eq!(rungs(&trials), optuna_auto_rungs());
    }

    #[test]
    fn bootstrap_prunes_until_enough_values_and_nan_is_pruned() {
        let mut p = SuccessiveHalving::new(MinResource::Steps(1), 4, 0, 2).unwrap();
        let steps: Vec<u64> = (1..=20).collect();
        let (pruned, trials) = run(&mut p, Direction::Minimize, &CURVES, &steps, None);
        assert_eq!(pruned, OPTUNA_BOOTSTRAP);
        assert_eq!(rungs(&trials), optuna_bootstrap_rungs());

        let mut p = SuccessiveHalving::new(MinResource::Steps(1), 4, 0, 0).unwrap();
        let mut t = Trial::new(0, Params::new());
        t.report(1, f64::NAN);
        assert!(p.prune(&mut t, &[], Direction::Minimize));
        assert!(t.rungs.is_empty());
    }

    #[test]
    fn no_decision_without_steps_or_an_estimate() {
        let mut p = SuccessiveHalving::default();
        let mut t = Trial::new(0, Params::new());
        assert!(!p.prune(&mut t, &[], Direction::Minimize));
        t.report(1000, 5.0);
        assert!(!p.prune(&mut t, &[], Direction::Minimize));
        assert_eq!(p.estimated_min_resource, None);
        assert_eq!(p.rung_step(0), None);
        let p = SuccessiveHalving::new(MinResource::Steps(3), 4, 1, 0).unwrap();
        assert_eq!(p.rung_step(0), Some(12));
        assert_eq!(p.rung_step(2), Some(192));
    }

    #[test]
    fn promotion_rule_is_optunas() {
        // Fewer than rf values: only a value as good as the best continues.
        assert!(is_promotable(1.0, &mut [2.0, 1.0], 4, Direction::Minimize));
        assert!(!is_promotable(2.0, &mut [2.0, 1.0], 4, Direction::Minimize));
        // 8 values, rf 4: the best 2.
        let vals = [5.0, 3.0, 8.0, 1.0, 7.0, 2.0, 6.0, 4.0];
        assert!(is_promotable(
            2.0,
            &mut vals.clone(),
            4,
            Direction::Minimize
        ));
        assert!(!is_promotable(
            3.0,
            &mut vals.clone(),
            4,
            Direction::Minimize
        ));
        assert!(is_promotable(
            7.0,
            &mut vals.clone(),
            4,
            Direction::Maximize
        ));
        assert!(!is_promotable(
            6.0,
            &mut vals.clone(),
            4,
            Direction::Maximize
        ));
    }

    #[test]
    fn settings_are_checked_and_serialised() {
        assert!(SuccessiveHalving::new(MinResource::Steps(0), 4, 0, 0).is_err());
        assert!(SuccessiveHalving::new(MinResource::Steps(1), 1, 0, 0).is_err());
        assert!(SuccessiveHalving::new(MinResource::Auto, 4, 0, 1).is_err());
        let p: SuccessiveHalving = serde_json::from_str(r#"{"min_resource": "auto"}"#).unwrap();
        assert_eq!(p, SuccessiveHalving::default());
        let p: SuccessiveHalving =
            serde_json::from_str(r#"{"min_resource": 10, "reduction_factor": 3}"#).unwrap();
        assert_eq!(p.min_resource, MinResource::Steps(10));
        assert_eq!(p.reduction_factor, 3);
        assert!(serde_json::from_str::<SuccessiveHalving>(r#"{"min_resource": "x"}"#).is_err());
        let text = serde_json::to_string(&p).unwrap();
        assert!(text.contains(r#""min_resource":10"#), "{text}");
    }

    // Printed by the optuna script described above.
    const OPTUNA_MIN_RF4: &[(u64, u64)] = &[(2, 1), (4, 1), (5, 1), (6, 1)];
    fn optuna_min_rf4_rungs() -> Vec<(u64, Vec<(u32, f64)>)> {
        vec![
            (0, vec![(0, 1.5), (1, 0.75), (2, 0.5625)]),
            (1, vec![(0, 1.3), (1, 0.55), (2, 0.3625)]),
            (2, vec![(0, 1.7)]),
            (3, vec![(0, 1.2), (1, 0.45), (2, 0.2625)]),
            (4, vec![(0, 1.6)]),
            (5, vec![(0, 1.25)]),
            (6, vec![(0, 1.9)]),
            (7, vec![(0, 1.1), (1, 0.35), (2, 0.1625)]),
        ]
    }
    const OPTUNA_MAX_RF2: &[(u64, u64)] = &[(1, 4), (3, 4), (5, 4), (7, 4), (4, 10)];
    fn optuna_max_rf2_rungs() -> Vec<(u64, Vec<(u32, f64)>)> {
        vec![
            (
                0,
                vec![(0, 0.75), (1, 0.6), (2, 0.5625), (3, 0.5294117647058824)],
            ),
            (1, vec![(0, 0.55)]),
            (
                2,
                vec![
                    (0, 0.95),
                    (1, 0.7999999999999999),
                    (2, 0.7625),
                    (3, 0.7294117647058823),
                ],
            ),
            (3, vec![(0, 0.45)]),
            (4, vec![(0, 0.85), (1, 0.7)]),
            (5, vec![(0, 0.5)]),
            (
                6,
                vec![(0, 1.15), (1, 1.0), (2, 0.9625), (3, 0.9294117647058824)],
            ),
            (7, vec![(0, 0.35)]),
        ]
    }
    const OPTUNA_AUTO: &[(u64, u64)] = &[(3, 6), (5, 6), (6, 6), (7, 6)];
    fn optuna_auto_rungs() -> Vec<(u64, Vec<(u32, f64)>)> {
        vec![
            (1, vec![(0, 0.6666666666666666), (1, 0.55)]),
            (2, vec![(0, 0.4666666666666667), (1, 0.35)]),
            (3, vec![(0, 0.8666666666666666)]),
            (4, vec![(0, 0.3666666666666667), (1, 0.25)]),
            (5, vec![(0, 0.7666666666666666)]),
            (6, vec![(0, 0.41666666666666663)]),
            (7, vec![(0, 1.0666666666666667)]),
            (8, vec![(0, 0.26666666666666666), (1, 0.15000000000000002)]),
        ]
    }
    const OPTUNA_BOOTSTRAP: &[(u64, u64)] = &[
        (0, 1),
        (1, 1),
        (2, 1),
        (4, 1),
        (5, 1),
        (6, 1),
        (3, 4),
        (7, 4),
    ];
    fn optuna_bootstrap_rungs() -> Vec<(u64, Vec<(u32, f64)>)> {
        vec![
            (0, vec![(0, 1.5)]),
            (1, vec![(0, 1.3)]),
            (2, vec![(0, 1.7)]),
            (3, vec![(0, 1.2), (1, 0.45)]),
            (4, vec![(0, 1.6)]),
            (5, vec![(0, 1.25)]),
            (6, vec![(0, 1.9)]),
            (7, vec![(0, 1.1), (1, 0.35)]),
        ]
    }

    fn rungs(trials: &[Trial]) -> Vec<(u64, Vec<(u32, f64)>)> {
        trials
            .iter()
            .filter(|t| !t.rungs.is_empty())
            .map(|t| (t.number, t.rungs.iter().map(|(k, v)| (*k, *v)).collect()))
            .collect()
    }
}
