//! Adaptive sweeps' study: what the samplers and the pruner share. A study is a sequence of
//! [`Trial`]s (number, sampled params in their internal representation, state, final value,
//! intermediate values by step, the values recorded at each successive-halving rung) optimised
//! in one [`Direction`]; a [`Sampler`] proposes the params of the next trial from the space and
//! every trial so far. Everything here serialises (a driver persists the trials as JSON in the
//! sweep directory; non-finite values are written as the strings `"NaN"`, `"Infinity"`,
//! `"-Infinity"`).
//!
//! The pieces, each Optuna's semantics (Optuna 5.0):
//! * [`space`] — the search space built from hydra-optuna-sweeper style overrides;
//! * [`truncnorm`] — the truncated normal of TPE's kernels;
//! * [`parzen`] — TPE's Parzen estimator (kernels, weights, sampling, log density);
//! * [`random`] — `RandomSampler`;
//! * [`tpe`] — `TPESampler` (the below/above split, the acquisition, trials in flight);
//! * [`asha`] — `SuccessiveHalvingPruner`.
//!
//! Sampling is reproducible: the generator for trial `n` of a study seeded `s` is ChaCha20
//! seeded with `s` on stream `n` ([`trial_rng`]), so a resumed study proposes what an
//! uninterrupted one would have, given the same finished trials.

pub mod asha;
pub mod config;
pub mod parzen;
pub mod random;
pub mod space;
pub mod tpe;
pub mod truncnorm;

pub use asha::{MinResource, SuccessiveHalving};
pub use random::RandomSampler;
pub use space::{Distribution, Param, SearchSpace, SpaceError};
pub use tpe::{TpeOptions, TpeSampler};

use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Whether smaller or larger objective values are better.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    #[default]
    Minimize,
    Maximize,
}

impl Direction {
    /// `minimize` or `maximize`.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Minimize => "minimize",
            Direction::Maximize => "maximize",
        }
    }

    /// Is `a` strictly better than `b`?
    pub fn better(self, a: f64, b: f64) -> bool {
        match self {
            Direction::Minimize => a < b,
            Direction::Maximize => a > b,
        }
    }
}

impl std::str::FromStr for Direction {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "minimize" => Ok(Direction::Minimize),
            "maximize" => Ok(Direction::Maximize),
            other => Err(format!(
                "direction must be 'minimize' or 'maximize', got '{other}'"
            )),
        }
    }
}

/// Where a trial is (Optuna's `TrialState` without WAITING).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum TrialState {
    Running,
    Complete,
    Pruned,
    Failed,
}

impl TrialState {
    /// `RUNNING`, `COMPLETE`, `PRUNED`, `FAILED`.
    pub fn as_str(self) -> &'static str {
        match self {
            TrialState::Running => "RUNNING",
            TrialState::Complete => "COMPLETE",
            TrialState::Pruned => "PRUNED",
            TrialState::Failed => "FAILED",
        }
    }

    /// Complete, pruned or failed.
    pub fn is_finished(self) -> bool {
        self != TrialState::Running
    }
}

/// Sampled params by name, each in its distribution's internal representation (the index of
/// a categorical choice; the number itself for ints and floats). See [`space::Distribution`].
pub type Params = BTreeMap<String, f64>;

/// One trial of a study.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Trial {
    /// 0, 1, 2, ... in the order the trials were created.
    pub number: u64,
    /// The sampled params (internal representation).
    pub params: Params,
    pub state: TrialState,
    /// The objective's final value (COMPLETE trials).
    #[serde(with = "json_f64::option", default)]
    pub value: Option<f64>,
    /// The metric reported at each step (what the pruner reads).
    #[serde(with = "json_f64::map", default)]
    pub intermediate: BTreeMap<u64, f64>,
    /// The value recorded when the trial reached successive-halving rung `k` (Optuna's
    /// `completed_rung_k` system attributes), written by [`SuccessiveHalving::prune`].
    #[serde(with = "json_f64::map", default)]
    pub rungs: BTreeMap<u32, f64>,
}

impl Trial {
    /// A RUNNING trial with these params and nothing reported yet.
    pub fn new(number: u64, params: Params) -> Trial {
        Trial {
            number,
            params,
            state: TrialState::Running,
            value: None,
            intermediate: BTreeMap::new(),
            rungs: BTreeMap::new(),
        }
    }

    /// The largest step with an intermediate value.
    pub fn last_step(&self) -> Option<u64> {
        self.intermediate.keys().next_back().copied()
    }

    /// Records the metric at `step` (a later report for the same step replaces it, as in
    /// Optuna).
    pub fn report(&mut self, step: u64, value: f64) {
        self.intermediate.insert(step, value);
    }
}

/// Proposes the params of the next trial.
pub trait Sampler {
    /// The params (internal representation) of a new trial in `space`, given every other trial
    /// of the study so far (RUNNING ones included; the new trial's number is one more than the
    /// largest number among them, or 0).
    fn sample(&mut self, space: &SearchSpace, trials: &[Trial]) -> Params;
}

/// The number the next trial gets after `trials`.
pub fn next_number(trials: &[Trial]) -> u64 {
    trials.iter().map(|t| t.number + 1).max().unwrap_or(0)
}

/// The generator used to sample trial `number` of a study seeded `seed`: ChaCha20 seeded with
/// `seed`, on stream `number`.
pub fn trial_rng(seed: u64, number: u64) -> ChaCha20Rng {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    rng.set_stream(number);
    rng
}

/// The best COMPLETE trial (the first among equals).
pub fn best_trial(trials: &[Trial], direction: Direction) -> Option<&Trial> {
    let mut best: Option<(&Trial, f64)> = None;
    for t in trials {
        let (TrialState::Complete, Some(v)) = (t.state, t.value) else {
            continue;
        };
        if v.is_nan() {
            continue;
        }
        match best {
            Some((_, b)) if !direction.better(v, b) => {}
            _ => best = Some((t, v)),
        }
    }
    best.map(|(t, _)| t)
}

/// Serde for floats that may be NaN or infinite: JSON has no such numbers, so they are written
/// as the strings `"NaN"`, `"Infinity"` and `"-Infinity"` (and read back from those).
pub(crate) mod json_f64 {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Num(f64),
        Text(String),
    }

    fn to_repr(x: f64) -> Repr {
        if x.is_nan() {
            Repr::Text("NaN".into())
        } else if x == f64::INFINITY {
            Repr::Text("Infinity".into())
        } else if x == f64::NEG_INFINITY {
            Repr::Text("-Infinity".into())
        } else {
            Repr::Num(x)
        }
    }

    fn from_repr<E: serde::de::Error>(r: Repr) -> Result<f64, E> {
        match r {
            Repr::Num(x) => Ok(x),
            Repr::Text(t) => match t.as_str() {
                "NaN" => Ok(f64::NAN),
                "Infinity" => Ok(f64::INFINITY),
                "-Infinity" => Ok(f64::NEG_INFINITY),
                other => Err(E::custom(format!("expected a number, got \"{other}\""))),
            },
        }
    }

    pub mod option {
        use super::*;

        pub fn serialize<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
            v.map(to_repr).serialize(s)
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
            Option::<Repr>::deserialize(d)?.map(from_repr).transpose()
        }
    }

    pub mod map {
        use super::*;
        use std::collections::BTreeMap;

        pub fn serialize<K, S>(m: &BTreeMap<K, f64>, s: S) -> Result<S::Ok, S::Error>
        where
            K: Serialize + Ord,
            S: Serializer,
        {
            s.collect_map(m.iter().map(|(k, v)| (k, to_repr(*v))))
        }

        pub fn deserialize<'de, K, D>(d: D) -> Result<BTreeMap<K, f64>, D::Error>
        where
            K: Deserialize<'de> + Ord,
            D: Deserializer<'de>,
        {
            BTreeMap::<K, Repr>::deserialize(d)?
                .into_iter()
                .map(|(k, v)| Ok((k, from_repr(v)?)))
                .collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trials_round_trip_through_json_with_non_finite_values() {
        let mut t = Trial::new(3, Params::from([("lr".to_string(), 0.01)]));
        t.report(10, 1.5);
        t.report(20, f64::NAN);
        t.report(30, f64::INFINITY);
        t.rungs.insert(0, 1.5);
        t.state = TrialState::Pruned;
        let text = serde_json::to_string(&t).unwrap();
        assert!(text.contains(r#""state":"PRUNED""#), "{text}");
        assert!(text.contains(r#""20":"NaN""#), "{text}");
        assert!(text.contains(r#""30":"Infinity""#), "{text}");
        let back: Trial = serde_json::from_str(&text).unwrap();
        assert_eq!(back.number, 3);
        assert_eq!(back.state, TrialState::Pruned);
        assert!(back.intermediate[&20].is_nan());
        assert_eq!(back.intermediate[&30], f64::INFINITY);
        assert_eq!(back.rungs[&0], 1.5);
        assert_eq!(back.last_step(), Some(30));
        let d: Direction = serde_json::from_str("\"maximize\"").unwrap();
        assert_eq!(d, Direction::Maximize);
        assert!(serde_json::from_str::<Trial>(
            r#"{"number":0,"params":{},"state":"RUNNING","value":"big"}"#
        )
        .is_err());
    }

    #[test]
    fn best_trial_skips_unfinished_and_keeps_the_first_of_equals() {
        let mk = |n: u64, state, value| Trial {
            value,
            state,
            ..Trial::new(n, Params::new())
        };
        let trials = vec![
            mk(0, TrialState::Complete, Some(2.0)),
            mk(1, TrialState::Pruned, Some(0.1)),
            mk(2, TrialState::Complete, Some(1.0)),
            mk(3, TrialState::Complete, Some(1.0)),
            mk(4, TrialState::Running, None),
        ];
        assert_eq!(best_trial(&trials, Direction::Minimize).unwrap().number, 2);
        assert_eq!(best_trial(&trials, Direction::Maximize).unwrap().number, 0);
        assert_eq!(next_number(&trials), 5);
        assert_eq!(next_number(&[]), 0);
    }

    #[test]
    fn trial_rngs_are_reproducible_and_differ_by_trial() {
        use rand::Rng;
        let a: u64 = trial_rng(1, 5).random();
        let b: u64 = trial_rng(1, 5).random();
        let c: u64 = trial_rng(1, 6).random();
        let d: u64 = trial_rng(2, 5).random();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
    }
}
