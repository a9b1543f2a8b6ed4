//! What a study samples from and with: its search space (the multirun's task overrides,
//! [`search_space`]), its sampler (random or TPE, from the study config), and the first trials
//! a new study would sample ([`first_trials`], for `flotilla plan`).

use flotilla_config::overrides::Override;
use flotilla_config::ConfigError;
use flotilla_study::config::{SamplerKind, StudyConfig};
use flotilla_study::{
    next_number, Direction, RandomSampler, Sampler, SearchSpace, TpeOptions, TpeSampler, Trial,
};

/// The study's sampler: its configured kind and seed, optimising in `direction`.
pub(super) fn sampler_for(config: &StudyConfig, direction: Direction) -> Box<dyn Sampler> {
    match config.sampler {
        SamplerKind::Random => Box::new(RandomSampler::new(config.seed)),
        SamplerKind::Tpe => Box::new(TpeSampler::new(
            TpeOptions {
                seed: config.seed,
                multivariate: config.multivariate,
                ..TpeOptions::default()
            },
            direction,
        )),
    }
}

/// The study's search space: every task override (sweeps become parameters).
pub fn search_space(task: &[Override]) -> Result<SearchSpace, ConfigError> {
    let texts: Vec<&str> = task.iter().map(|o| o.input.as_str()).collect();
    SearchSpace::from_overrides(&texts).map_err(|e| ConfigError::Override(e.to_string()))
}

/// The first trials a new study would sample (for `plan`): their override lists.
pub fn first_trials(config: &StudyConfig, space: &SearchSpace, count: usize) -> Vec<Vec<String>> {
    let mut sampler = sampler_for(config, config.direction.unwrap_or_default());
    let mut trials: Vec<Trial> = Vec::new();
    let mut out = Vec::new();
    for _ in 0..count.min(config.n_trials) {
        let params = sampler.sample(space, &trials);
        out.push(space.overrides(&params));
        trials.push(Trial::new(next_number(&trials), params));
    }
    out
}
