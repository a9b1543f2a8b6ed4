//! The study settings of a multirun, read from the runtime node's `flotilla.sweeper` (alias
//! `hydra.sweeper`): `sampler` (`grid`, today's exact Hydra order, or the adaptive `random` and
//! `tpe`, with `multivariate`), `n_trials`, `seed`, `metric` and `direction`, `max_parallel`, and
//! `pruner` (`asha`, with `min_resource`, `reduction_factor`, `min_early_stopping_rate`).

use super::{Direction, MinResource, SuccessiveHalving};
use flotilla_config::node::{python_str, Node, Value};
use flotilla_config::ConfigError;
use serde::{Deserialize, Serialize};

/// How trials are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SamplerKind {
    Random,
    Tpe,
}

impl SamplerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SamplerKind::Random => "random",
            SamplerKind::Tpe => "tpe",
        }
    }
}

/// An adaptive study's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StudyConfig {
    pub sampler: SamplerKind,
    pub n_trials: usize,
    pub seed: u64,
    /// The metric optimised, read as `flotilla report` reads it; `None`: `eval_loss` for the
    /// built-in trainer with evaluation on, else `loss`.
    pub metric: Option<String>,
    /// `None`: from the metric's name, as `flotilla report` decides its mode.
    pub direction: Option<Direction>,
    /// Trials running at once.
    pub max_parallel: usize,
    pub pruner: Option<SuccessiveHalving>,
    /// TPE: one joint Parzen estimator over every parameter (Optuna's `multivariate=True`)
    /// instead of one per parameter.
    #[serde(default)]
    pub multivariate: bool,
}

fn key(name: &str) -> String {
    format!("flotilla.sweeper.{name}")
}

fn bad(name: &str, node: &Node, expected: &str) -> ConfigError {
    ConfigError::Composition(format!(
        "{} must be {expected}, got '{}' ({})",
        key(name),
        python_str(&node.value),
        node.origin
    ))
}

fn get<'a>(sweeper: &'a Node, name: &str) -> Option<&'a Node> {
    sweeper
        .select(name)
        .filter(|n| !matches!(n.value, Value::Null))
}

fn uint(sweeper: &Node, name: &str) -> Result<Option<u64>, ConfigError> {
    match get(sweeper, name) {
        None => Ok(None),
        Some(n) => match n.value {
            Value::Int(i) if i >= 0 => Ok(Some(i as u64)),
            _ => Err(bad(name, n, "a non-negative integer")),
        },
    }
}

fn text<'a>(sweeper: &'a Node, name: &str) -> Result<Option<&'a str>, ConfigError> {
    match get(sweeper, name) {
        None => Ok(None),
        Some(n) => n
            .value
            .as_str()
            .map(Some)
            .ok_or_else(|| bad(name, n, "a string")),
    }
}

/// The study settings of the runtime node `runtime` (its `sweeper` key); `None` for the grid
/// sampler (the basic sweeper's cartesian product).
pub fn study_config(runtime: &Node) -> Result<Option<StudyConfig>, ConfigError> {
    let Some(sweeper) = runtime.select("sweeper") else {
        return Ok(None);
    };
    let sampler = match text(sweeper, "sampler")?.unwrap_or("grid") {
        "grid" => return Ok(None),
        "random" => SamplerKind::Random,
        "tpe" => SamplerKind::Tpe,
        other => {
            return Err(ConfigError::Composition(format!(
                "{} is '{other}'; choose grid (every combination, Hydra's order), random or tpe",
                key("sampler")
            )))
        }
    };
    let n_trials = uint(sweeper, "n_trials")?.ok_or_else(|| {
        ConfigError::Composition(format!(
            "{} is not set; an adaptive sweep ({}) needs its budget, e.g. flotilla.sweeper.n_trials=40",
            key("n_trials"),
            sampler.as_str()
        ))
    })?;
    if n_trials == 0 {
        return Err(ConfigError::Composition(format!(
            "{} must be at least 1",
            key("n_trials")
        )));
    }
    let direction = match text(sweeper, "direction")? {
        None => None,
        Some("minimize" | "min") => Some(Direction::Minimize),
        Some("maximize" | "max") => Some(Direction::Maximize),
        Some(other) => {
            return Err(ConfigError::Composition(format!(
                "{} is '{other}'; choose minimize or maximize",
                key("direction")
            )))
        }
    };
    let pruner = match text(sweeper, "pruner")? {
        None | Some("none") => None,
        Some("asha") => {
            let min_resource = match get(sweeper, "min_resource") {
                None => MinResource::Auto,
                Some(n) => match &n.value {
                    Value::Str(s) if s == "auto" => MinResource::Auto,
                    Value::Int(i) if *i >= 1 => MinResource::Steps(*i as u64),
                    _ => {
                        return Err(bad(
                            "min_resource",
                            n,
                            "'auto' or a step count of at least 1",
                        ))
                    }
                },
            };
            let rf = uint(sweeper, "reduction_factor")?.unwrap_or(4);
            let rate = uint(sweeper, "min_early_stopping_rate")?.unwrap_or(0);
            let p = SuccessiveHalving::new(min_resource, rf, rate as u32, 0)
                .map_err(|e| ConfigError::Composition(format!("flotilla.sweeper: {e}")))?;
            Some(p)
        }
        Some(other) => {
            return Err(ConfigError::Composition(format!(
                "{} is '{other}'; choose asha (asynchronous successive halving) or null",
                key("pruner")
            )))
        }
    };
    Ok(Some(StudyConfig {
        sampler,
        n_trials: n_trials as usize,
        seed: uint(sweeper, "seed")?.unwrap_or(0),
        metric: text(sweeper, "metric")?.map(str::to_string),
        direction,
        max_parallel: uint(sweeper, "max_parallel")?.unwrap_or(1).max(1) as usize,
        pruner,
        multivariate: match get(sweeper, "multivariate") {
            None => false,
            Some(n) => match n.value {
                Value::Bool(b) => b,
                _ => return Err(bad("multivariate", n, "true or false")),
            },
        },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runtime(text: &str) -> Node {
        flotilla_config::yaml::load_str(text, "t.yaml").unwrap()
    }

    #[test]
    fn grid_is_no_study_and_adaptive_settings_are_read() {
        assert_eq!(
            study_config(&runtime("sweeper: {sampler: grid}")).unwrap(),
            None
        );
        let c = study_config(&runtime(
            "sweeper: {sampler: tpe, n_trials: 40, seed: 3, metric: eval_acc, direction: maximize, max_parallel: 4, pruner: asha, min_resource: 100, reduction_factor: 3}",
        ))
        .unwrap()
        .unwrap();
        assert_eq!(c.sampler, SamplerKind::Tpe);
        assert_eq!((c.n_trials, c.seed, c.max_parallel), (40, 3, 4));
        assert_eq!(c.direction, Some(Direction::Maximize));
        let p = c.pruner.unwrap();
        assert_eq!(p.min_resource, MinResource::Steps(100));
        assert_eq!(p.reduction_factor, 3);
        assert!(!c.multivariate);
        let c = study_config(&runtime(
            "sweeper: {sampler: tpe, n_trials: 5, multivariate: true}",
        ))
        .unwrap()
        .unwrap();
        assert!(c.multivariate);
        let e = study_config(&runtime(
            "sweeper: {sampler: tpe, n_trials: 5, multivariate: 1}",
        ))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("flotilla.sweeper.multivariate must be true or false"),
            "{e}"
        );
    }

    #[test]
    fn mistakes_name_the_key_and_the_fix() {
        let e = study_config(&runtime("sweeper: {sampler: tpe}"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("flotilla.sweeper.n_trials") && e.contains("n_trials=40"),
            "{e}"
        );
        let e = study_config(&runtime("sweeper: {sampler: bayes, n_trials: 3}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("'bayes'") && e.contains("tpe"), "{e}");
        let e = study_config(&runtime(
            "sweeper: {sampler: random, n_trials: 3, pruner: asha, reduction_factor: 1}",
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("reduction_factor"), "{e}");
    }
}
