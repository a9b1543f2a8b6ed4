//! Optuna's `TPESampler` (Optuna 5.0, `optuna/samplers/_tpe/`), single objective: random
//! sampling for the first `n_startup_trials` trials, then for each parameter (or, with
//! `multivariate`, for all of them jointly) two Parzen estimators — `l` over the best
//! `γ(n) = min(⌈0.1·n⌉, 25)` trials, `g` over the rest — and the candidate among
//! `n_ei_candidates` samples of `l` that maximises `log l(x) − log g(x)`.
//!
//! What is Optuna's here, to the line: the defaults (`n_startup_trials` 10, `n_ei_candidates`
//! 24, prior weight 1, magic clip on, endpoints off, `constant_liar` on); `default_gamma`;
//! `default_weights` (a
//! `linspace` ramp for the oldest trials once there are 25 or more); `_split_trials` (COMPLETE
//! trials by value, then PRUNED ones by (last step descending, last intermediate value),
//! RUNNING ones always "above"; `n` counts the finished trials only); the Parzen estimator of
//! `parzen_estimator.py` (a kernel per observation plus the prior kernel at the middle of the
//! domain with σ = high − low; σ of an observation the larger gap to its sorted neighbours,
//! clipped to `[(high−low)/min(100, n+2), high−low]`; truncated normal kernels on the
//! (log-)domain, widened by half a step for discrete domains whose kernels integrate over
//! `[x − step/2, x + step/2]`; categorical kernels with `prior/n_kernels` smoothing) and the
//! mixture's sampling and log density of `probability_distributions.py`.
//!
//! What differs: trials in flight count towards `n_startup_trials` under the constant liar
//! (`TpeSampler::startup_count`: the random phase is `n_startup_trials` trials however many
//! run at once; Optuna counts finished trials only, which is the same one trial at a time);
//! the random numbers (ChaCha20 per trial instead of numpy's Mersenne Twister,
//! so the same seed proposes other points than Optuna does); sorting ties among equal
//! observations is stable here (numpy's `argsort` is not, which can swap the σ of two equal
//! observations); Optuna's default for a single objective is `multivariate=True` since 5.0 —
//! here the default is univariate (`multivariate: false`), as the issue asks, and the joint
//! sampler is one option away.

use super::parzen::{ParzenEstimator, ParzenOptions};
use super::random::sample_independent as random_independent;
use super::space::{Distribution, Param, SearchSpace};
use super::{next_number, trial_rng, Direction, Params, Sampler, Trial, TrialState};
use rand::Rng;
use serde::{Deserialize, Serialize};

/// The sampler's settings; [`Default`] gives Optuna's defaults (univariate).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TpeOptions {
    pub seed: u64,
    pub n_startup_trials: usize,
    pub n_ei_candidates: usize,
    pub prior_weight: f64,
    pub consider_magic_clip: bool,
    pub consider_endpoints: bool,
    /// RUNNING trials count as "above" (bad) observations, so parallel workers spread out,
    /// and towards `n_startup_trials`.
    pub constant_liar: bool,
    /// One joint Parzen estimator over every parameter instead of one per parameter.
    pub multivariate: bool,
}

impl Default for TpeOptions {
    fn default() -> Self {
        TpeOptions {
            seed: 0,
            n_startup_trials: 10,
            n_ei_candidates: 24,
            prior_weight: 1.0,
            consider_magic_clip: true,
            consider_endpoints: false,
            constant_liar: true,
            multivariate: false,
        }
    }
}

/// The TPE sampler of a study optimised in `direction`.
#[derive(Clone, Debug)]
pub struct TpeSampler {
    pub options: TpeOptions,
    pub direction: Direction,
}

impl TpeSampler {
    pub fn new(options: TpeOptions, direction: Direction) -> TpeSampler {
        TpeSampler { options, direction }
    }

    fn parzen_options(&self) -> ParzenOptions {
        ParzenOptions {
            prior_weight: self.options.prior_weight,
            consider_magic_clip: self.options.consider_magic_clip,
            consider_endpoints: self.options.consider_endpoints,
        }
    }

    /// The trials that count towards `n_startup_trials`: the finished ones (COMPLETE and
    /// PRUNED, as Optuna counts) and, under the constant liar, those in flight. Optuna counts
    /// finished trials only, so with `p` trials in flight it samples `n_startup_trials + p − 1`
    /// at random and its first informed trial sees `p − 1` fewer results; counting the trials in
    /// flight keeps the random phase at `n_startup_trials` whatever `max_parallel` is (one at a
    /// time, nothing is in flight and both agree).
    fn startup_count(&self, trials: &[Trial]) -> usize {
        trials
            .iter()
            .filter(|t| match t.state {
                TrialState::Complete | TrialState::Pruned => true,
                TrialState::Running => self.options.constant_liar,
                TrialState::Failed => false,
            })
            .count()
    }

    /// Optuna's `_sample` for the parameters `group` of a trial numbered `number`.
    fn sample_group<R: Rng + ?Sized>(
        &self,
        group: &[&Param],
        trials: &[Trial],
        number: u64,
        rng: &mut R,
    ) -> Vec<f64> {
        let (below, above) = self.estimators(group, trials, number);
        let samples = below.sample(rng, self.options.n_ei_candidates);
        let acq = acquisition(&below, &above, &samples);
        let best = argmax(&acq);
        group
            .iter()
            .zip(&samples)
            .map(|(p, s)| to_internal_value(&p.distribution, s[best]))
            .collect()
    }

    /// The Parzen estimators `l` (over the good trials) and `g` (over the rest, with the
    /// trials in flight under the constant liar) of the parameters `group` for a trial numbered
    /// `number`: Optuna's `_split_trials` and `_build_parzen_estimator`.
    fn estimators(
        &self,
        group: &[&Param],
        trials: &[Trial],
        number: u64,
    ) -> (ParzenEstimator, ParzenEstimator) {
        let used: Vec<&Trial> = trials
            .iter()
            .filter(|t| t.number != number)
            .filter(|t| match t.state {
                TrialState::Complete => t.value.is_some_and(|v| !v.is_nan()),
                TrialState::Pruned => true,
                TrialState::Running => self.options.constant_liar,
                TrialState::Failed => false,
            })
            .collect();
        let n = used
            .iter()
            .filter(|t| t.state != TrialState::Running)
            .count();
        let (below, above) = split_trials(&used, default_gamma(n), self.direction);
        let dists: Vec<&Distribution> = group.iter().map(|p| &p.distribution).collect();
        let opts = self.parzen_options();
        let below = ParzenEstimator::new(&observations(&below, group), &dists, &opts);
        let above = ParzenEstimator::new(&observations(&above, group), &dists, &opts);
        (below, above)
    }
}

/// Optuna's `_compute_acquisition_func`: `log l(x) − log g(x)` at each of `samples`
/// (`samples[param][j]`).
fn acquisition(below: &ParzenEstimator, above: &ParzenEstimator, samples: &[Vec<f64>]) -> Vec<f64> {
    let ll_below = below.log_pdf(samples);
    let ll_above = above.log_pdf(samples);
    ll_below.iter().zip(&ll_above).map(|(l, g)| l - g).collect()
}

impl Sampler for TpeSampler {
    fn sample(&mut self, space: &SearchSpace, trials: &[Trial]) -> Params {
        let number = next_number(trials);
        let mut rng = trial_rng(self.options.seed, number);
        let finished: Vec<&Trial> = trials
            .iter()
            .filter(|t| matches!(t.state, TrialState::Complete | TrialState::Pruned))
            .collect();
        let mut out = Params::new();
        if self.startup_count(trials) < self.options.n_startup_trials {
            for p in &space.params {
                let v = if p.distribution.single() {
                    p.distribution.single_value()
                } else {
                    random_independent(&p.distribution, &mut rng)
                };
                out.insert(p.name.clone(), v);
            }
            return out;
        }
        let mut joint: Vec<&Param> = Vec::new();
        if self.options.multivariate {
            // Optuna's IntersectionSearchSpace(include_pruned=True) over the finished trials,
            // its single-valued distributions left out.
            joint = space
                .params
                .iter()
                .filter(|p| !p.distribution.single())
                .filter(|p| finished.iter().all(|t| t.params.contains_key(&p.name)))
                .collect();
            if !joint.is_empty() {
                let values = self.sample_group(&joint, trials, number, &mut rng);
                for (p, v) in joint.iter().zip(values) {
                    out.insert(p.name.clone(), v);
                }
            }
        }
        for p in &space.params {
            if joint.iter().any(|j| j.name == p.name) {
                continue;
            }
            let v = if p.distribution.single() {
                p.distribution.single_value()
            } else {
                self.sample_group(&[p], trials, number, &mut rng)[0]
            };
            out.insert(p.name.clone(), v);
        }
        out
    }
}

/// The sampled value as the trial records it: Optuna's `to_external_repr` (an int truncated,
/// a categorical's index), kept inside the distribution.
fn to_internal_value(d: &Distribution, x: f64) -> f64 {
    match *d {
        Distribution::Float { low, high, .. } => x.clamp(low, high),
        Distribution::Int { low, high, .. } => x.trunc().clamp(low as f64, high as f64),
        Distribution::Categorical { ref choices } => {
            x.trunc().clamp(0.0, (choices.len() - 1) as f64)
        }
    }
}

/// The observations of `group` in `trials` (which are sorted by number): per parameter, the
/// values of the trials that have every parameter of the group.
fn observations(trials: &[&Trial], group: &[&Param]) -> Vec<Vec<f64>> {
    let mut out = vec![Vec::new(); group.len()];
    for t in trials {
        if group.iter().all(|p| t.params.contains_key(&p.name)) {
            for (o, p) in out.iter_mut().zip(group) {
                o.push(t.params[&p.name]);
            }
        }
    }
    out
}

/// numpy's `argmax`: the first maximum, or the first NaN when there is one.
fn argmax(xs: &[f64]) -> usize {
    if let Some(i) = xs.iter().position(|x| x.is_nan()) {
        return i;
    }
    let mut best = 0;
    for (i, x) in xs.iter().enumerate() {
        if *x > xs[best] {
            best = i;
        }
    }
    best
}

/// `min(⌈0.1·n⌉, 25)` (in floating point, as Python computes it).
pub fn default_gamma(n: usize) -> usize {
    ((0.1 * n as f64).ceil() as usize).min(25)
}

/// Optuna's `_split_trials` for one objective: the `n_below` best trials ("below", the good
/// ones: COMPLETE by value, then PRUNED by [`pruned_score`]) and the rest, RUNNING ones always
/// above; both sorted by number.
pub fn split_trials<'a>(
    trials: &[&'a Trial],
    n_below: usize,
    direction: Direction,
) -> (Vec<&'a Trial>, Vec<&'a Trial>) {
    let mut complete = Vec::new();
    let mut pruned = Vec::new();
    let mut running = Vec::new();
    for t in trials {
        match t.state {
            TrialState::Running => running.push(*t),
            TrialState::Complete => complete.push(*t),
            TrialState::Pruned => pruned.push(*t),
            TrialState::Failed => {}
        }
    }
    let value = |t: &Trial| t.value.unwrap_or(f64::NAN);
    complete.sort_by(|a, b| {
        let o = value(a).total_cmp(&value(b));
        match direction {
            Direction::Minimize => o,
            Direction::Maximize => o.reverse(),
        }
    });
    let n_complete = n_below.min(complete.len());
    let above_complete = complete.split_off(n_complete);
    let n_below = n_below - n_complete;
    pruned.sort_by(|a, b| {
        let (sa, va) = pruned_score(a, direction);
        let (sb, vb) = pruned_score(b, direction);
        sa.cmp(&sb).then(va.total_cmp(&vb))
    });
    let n_pruned = n_below.min(pruned.len());
    let above_pruned = pruned.split_off(n_pruned);
    let mut below: Vec<&Trial> = complete.into_iter().chain(pruned).collect();
    let mut above: Vec<&Trial> = above_complete
        .into_iter()
        .chain(above_pruned)
        .chain(running)
        .collect();
    below.sort_by_key(|t| t.number);
    above.sort_by_key(|t| t.number);
    (below, above)
}

/// Optuna's `_get_pruned_trial_score`: `(−last step, last value)` (the value negated when
/// maximizing, +∞ when NaN); `(1, 0)` with no intermediate value. Smaller is better.
pub fn pruned_score(t: &Trial, direction: Direction) -> (i128, f64) {
    match t.intermediate.iter().next_back() {
        None => (1, 0.0),
        Some((&step, &v)) => {
            let v = if v.is_nan() {
                f64::INFINITY
            } else if direction == Direction::Maximize {
                -v
            } else {
                v
            };
            (-(step as i128), v)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parzen::default_weights;
    use crate::parzen::tests::{assert_close, estimator};
    use crate::space::SearchSpace;
    use std::collections::BTreeMap;

    #[test]
    fn gamma_and_weights_match_optuna() {
        let ns = [0, 1, 10, 11, 29, 30, 31, 100, 240, 251, 260];
        let want = [0, 1, 1, 2, 3, 3, 4, 10, 24, 25, 25];
        for (n, w) in ns.iter().zip(want) {
            assert_eq!(default_gamma(*n), w, "gamma({n})");
        }
        let mut w30 = vec![
            0.03333333333333333,
            0.275,
            0.5166666666666667,
            0.7583333333333333,
        ];
        w30.extend([1.0; 26]);
        assert_close(&default_weights(30), &w30);
        let mut w26 = vec![0.038461538461538464];
        w26.extend([1.0; 25]);
        assert_close(&default_weights(26), &w26);
        assert_eq!(default_weights(25), vec![1.0; 25]);
        assert_eq!(default_weights(3), vec![1.0; 3]);
    }

    fn trial(number: u64, state: TrialState, value: Option<f64>, iv: &[(u64, f64)]) -> Trial {
        Trial {
            value,
            state,
            intermediate: iv.iter().copied().collect::<BTreeMap<_, _>>(),
            ..Trial::new(number, Params::from([("x".to_string(), 0.5)]))
        }
    }

    /// Trials 0..12 as built in optuna with `create_trial` for `_split_trials`.
    fn split_fixture() -> Vec<Trial> {
        use TrialState::*;
        vec![
            trial(0, Complete, Some(3.0), &[]),
            trial(1, Complete, Some(1.0), &[]),
            trial(2, Pruned, None, &[(10, 0.5)]),
            trial(3, Complete, Some(2.0), &[]),
            trial(4, Running, None, &[]),
            trial(5, Pruned, None, &[(20, 0.9)]),
            trial(6, Complete, Some(5.0), &[]),
            trial(7, Pruned, None, &[(20, 0.3)]),
            trial(8, Pruned, None, &[]),
            trial(9, Complete, Some(1.0), &[]),
            trial(10, Pruned, None, &[(20, f64::NAN)]),
            trial(11, Complete, Some(4.0), &[]),
        ]
    }

    #[test]
    fn split_trials_matches_optuna() {
        // optuna 5.0.0's `_split_trials(study, trials, n_below)` on the same trials.
        let trials = split_fixture();
        let refs: Vec<&Trial> = trials.iter().collect();
        let nums = |v: Vec<&Trial>| v.iter().map(|t| t.number).collect::<Vec<_>>();
        let cases: [(Direction, usize, &[u64]); 12] = [
            (Direction::Minimize, 0, &[]),
            (Direction::Minimize, 2, &[1, 9]),
            (Direction::Minimize, 5, &[0, 1, 3, 9, 11]),
            (Direction::Minimize, 7, &[0, 1, 3, 6, 7, 9, 11]),
            (Direction::Minimize, 9, &[0, 1, 3, 5, 6, 7, 9, 10, 11]),
            (
                Direction::Minimize,
                12,
                &[0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11],
            ),
            (Direction::Maximize, 0, &[]),
            (Direction::Maximize, 2, &[6, 11]),
            (Direction::Maximize, 5, &[0, 1, 3, 6, 11]),
            (Direction::Maximize, 7, &[0, 1, 3, 5, 6, 9, 11]),
            (Direction::Maximize, 9, &[0, 1, 3, 5, 6, 7, 9, 10, 11]),
            (
                Direction::Maximize,
                12,
                &[0, 1, 2, 3, 5, 6, 7, 8, 9, 10, 11],
            ),
        ];
        for (dir, nb, want_below) in cases {
            let (below, above) = split_trials(&refs, nb, dir);
            let below = nums(below);
            assert_eq!(below, want_below, "{dir:?} {nb}");
            let above = nums(above);
            let mut all: Vec<u64> = below.iter().chain(&above).copied().collect();
            all.sort();
            assert_eq!(all, (0..12).collect::<Vec<_>>());
            assert!(above.contains(&4), "running trials are always above");
        }
    }

    #[test]
    fn acquisition_picks_the_argmax_of_l_over_g() {
        // l over good trials near 0, g over bad ones near 8: of the candidates, the one
        // maximising log l − log g wins; numpy's argmax rules (first max, NaN first).
        let d = Distribution::float(-10.0, 10.0, false, None).unwrap();
        let l = estimator(&[&[0.0, 0.5]], std::slice::from_ref(&d));
        let g = estimator(&[&[8.0, 7.0, 9.0, 6.0]], std::slice::from_ref(&d));
        let cands = vec![vec![5.0, 0.2, -9.0, 9.0]];
        let acq: Vec<f64> = l
            .log_pdf(&cands)
            .iter()
            .zip(g.log_pdf(&cands))
            .map(|(a, b)| a - b)
            .collect();
        assert_eq!(argmax(&acq), 1);
        assert_eq!(argmax(&[1.0, 3.0, 3.0]), 1);
        assert_eq!(argmax(&[1.0, f64::NAN, 3.0]), 1);
    }

    fn objective(p: &Params) -> f64 {
        let x = p["x"];
        let y = p["y"];
        let m = if p["m"] == 1.0 { 0.0 } else { 1.0 };
        (x - 2.0).powi(2) + (y - 3.0).abs() + m
    }

    fn run_study(sampler: &mut dyn Sampler, space: &SearchSpace, n: usize) -> Vec<Trial> {
        let mut trials: Vec<Trial> = Vec::new();
        for _ in 0..n {
            let params = sampler.sample(space, &trials);
            let mut t = Trial::new(next_number(&trials), params);
            t.value = Some(objective(&t.params));
            t.state = TrialState::Complete;
            trials.push(t);
        }
        trials
    }

    #[test]
    fn tpe_is_reproducible_and_beats_random_on_a_simple_objective() {
        let space = SearchSpace::from_overrides(&[
            "x=interval(-10, 10)",
            "y=range(0, 10)",
            "m=choice(a, b, c)",
        ])
        .unwrap();
        let mut wins = 0;
        for seed in 0..8 {
            let mut tpe = TpeSampler::new(
                TpeOptions {
                    seed,
                    ..TpeOptions::default()
                },
                Direction::Minimize,
            );
            let a = run_study(&mut tpe, &space, 40);
            let b = run_study(&mut tpe, &space, 40);
            assert_eq!(a, b, "same seed, same study");
            let mut rs = crate::RandomSampler::new(seed);
            let r = run_study(&mut rs, &space, 40);
            // The first 10 trials are the random sampler's.
            assert_eq!(a[..10], r[..10]);
            let best = |ts: &[Trial]| {
                ts.iter()
                    .filter_map(|t| t.value)
                    .fold(f64::INFINITY, f64::min)
            };
            if best(&a) < best(&r) {
                wins += 1;
            }
            for t in &a {
                for p in &space.params {
                    assert!(p.distribution.contains(t.params[&p.name]));
                }
            }
        }
        assert!(wins >= 6, "TPE beat random on {wins} of 8 seeds");
    }

    #[test]
    fn running_trials_push_the_next_proposal_away_under_constant_liar() {
        // 12 finished trials, the best near x = 0; a RUNNING trial sits at 0. With constant
        // liar its neighbourhood counts as "above", without it the sampler ignores it.
        let space = SearchSpace::from_overrides(&["x=interval(-10, 10)"]).unwrap();
        let mut trials: Vec<Trial> = (0..12)
            .map(|i| {
                let x = -9.0 + 1.5 * i as f64;
                let mut t = Trial::new(i, Params::from([("x".to_string(), x)]));
                t.value = Some(x * x);
                t.state = TrialState::Complete;
                t
            })
            .collect();
        trials.push(Trial::new(12, Params::from([("x".to_string(), 0.0)])));
        let opts = |liar| TpeOptions {
            constant_liar: liar,
            ..TpeOptions::default()
        };
        let with = TpeSampler::new(opts(true), Direction::Minimize).sample(&space, &trials);
        let without = TpeSampler::new(opts(false), Direction::Minimize).sample(&space, &trials);
        assert_ne!(with, without);
        // The random phase: 8 finished trials and one in flight are 9 started, fewer than
        // n_startup_trials (10), so the proposal is the random sampler's, liar or not.
        let mut running: Vec<Trial> = trials[..8].to_vec();
        running.push(Trial::new(8, Params::from([("x".to_string(), 1.0)])));
        let random = crate::RandomSampler::new(0).sample(&space, &running);
        for liar in [true, false] {
            let tpe = TpeSampler::new(opts(liar), Direction::Minimize).sample(&space, &running);
            assert_eq!(tpe, random, "constant_liar {liar}");
        }
        // 9 finished and one in flight: under the liar the trials in flight count towards the
        // random phase, so this is TPE's proposal; without it, still the random one.
        let mut running: Vec<Trial> = trials[..9].to_vec();
        running.push(Trial::new(9, Params::from([("x".to_string(), 1.0)])));
        let random = crate::RandomSampler::new(0).sample(&space, &running);
        let liar = TpeSampler::new(opts(true), Direction::Minimize).sample(&space, &running);
        let no_liar = TpeSampler::new(opts(false), Direction::Minimize).sample(&space, &running);
        assert_ne!(liar, random);
        assert_eq!(no_liar, random);
    }

    #[test]
    fn multivariate_estimators_with_trials_in_flight_match_optuna() {
        // 32 trials of Branin + (log10 lr + 3)² (2 PRUNED with one intermediate value, 3 in
        // flight): optuna 5.0.0's `_split_trials` with `default_gamma` (29 finished: the 3
        // best below; the other 26 finished and the 3 RUNNING above, 29, so the oldest get the
        // ramp of `default_weights`), `TPESampler(multivariate=True)._build_parzen_estimator`
        // of both, and their `log_pdf` and `_compute_acquisition_func` at four points.
        use TrialState::*;
        let history: [(u64, f64, f64, f64, TrialState, f64); 32] = [
            (
                0,
                3.262,
                10.622,
                0.0002818382931264455,
                Complete,
                71.98710009453957,
            ),
            (
                1,
                2.662,
                13.394,
                0.3019951720402016,
                Complete,
                122.44861550216243,
            ),
            (
                2,
                -3.116,
                3.109,
                1.8197008586099827e-05,
                Complete,
                86.3219966527595,
            ),
            (
                3,
                1.612,
                0.448,
                0.0019054607179632462,
                Complete,
                20.719310715649723,
            ),
            (
                4,
                4.737,
                4.177,
                0.023988329190194897,
                Complete,
                20.078304953746684,
            ),
            (
                5,
                3.863,
                0.36,
                0.006165950018614822,
                Complete,
                5.42945836501033,
            ),
            (
                6,
                -1.111,
                6.227,
                0.00026302679918953814,
                Complete,
                17.489754021558742,
            ),
            (
                7,
                5.397,
                6.607,
                6.0255958607435806e-05,
                Complete,
                47.08621327741288,
            ),
            (
                8,
                3.17,
                11.705,
                0.0003388441561392024,
                Complete,
                89.96390085242172,
            ),
            (
                9,
                -1.671,
                5.82,
                0.4786300923226383,
                Complete,
                26.46308006764766,
            ),
            (
                10,
                9.64,
                10.086,
                0.32359365692962827,
                Pruned,
                62.02745058095543,
            ),
            (
                11,
                7.686,
                5.67,
                2.8840315031266056e-05,
                Complete,
                32.2195228231071,
            ),
            (
                12,
                4.801,
                8.368,
                0.0006456542290346556,
                Complete,
                60.326108474770145,
            ),
            (
                13,
                -1.624,
                6.098,
                0.002187761623949552,
                Complete,
                17.599075859989235,
            ),
            (
                14,
                -0.961,
                4.377,
                0.0019498445997580456,
                Complete,
                26.287802778813393,
            ),
            (
                15,
                7.908,
                8.794,
                0.00026302679918953814,
                Complete,
                63.125928513336554,
            ),
            (
                16,
                -0.83,
                6.819,
                0.00010715193052376059,
                Complete,
                17.77039188906036,
            ),
            (
                17,
                -1.979,
                7.711,
                2.754228703338169e-05,
                Complete,
                12.403479778120467,
            ),
            (
                18,
                2.254,
                5.433,
                0.034673685045253165,
                Complete,
                11.898600383901552,
            ),
            (
                19,
                6.201,
                10.366,
                0.028183829312644536,
                Complete,
                107.56327159033123,
            ),
            (
                20,
                0.604,
                10.022,
                0.0005011872336272725,
                Pruned,
                42.35896257766874,
            ),
            (
                21,
                3.592,
                4.887,
                0.0016982436524617442,
                Complete,
                10.034653064361548,
            ),
            (
                22,
                -4.077,
                3.64,
                0.72443596007499,
                Complete,
                133.39379272366614,
            ),
            (
                23,
                -1.541,
                10.372,
                0.01778279410038923,
                Complete,
                14.449206431776847,
            ),
            (
                24,
                5.859,
                7.126,
                0.009549925860214359,
                Complete,
                55.906875340668684,
            ),
            (
                25,
                -3.995,
                1.088,
                9.772372209558111e-05,
                Complete,
                182.4504542643599,
            ),
            (
                26,
                -2.722,
                1.502,
                4.466835921509635e-05,
                Complete,
                98.8457831190179,
            ),
            (
                27,
                3.299,
                2.817,
                0.5754399373371569,
                Running,
                8.571852762625458,
            ),
            (
                28,
                5.224,
                8.115,
                0.034673685045253165,
                Complete,
                64.73489187121551,
            ),
            (
                29,
                -1.042,
                13.901,
                0.15848931924611134,
                Running,
                56.92278546314002,
            ),
            (
                30,
                5.895,
                7.204,
                0.16218100973589297,
                Complete,
                60.94385618094827,
            ),
            (
                31,
                6.171,
                9.905,
                0.37153522909717257,
                Running,
                103.70893429268355,
            ),
        ];
        let trials: Vec<Trial> = history
            .iter()
            .map(|&(number, x1, x2, lr, state, value)| {
                let params = Params::from([
                    ("x1".to_string(), x1),
                    ("x2".to_string(), x2),
                    ("lr".to_string(), lr),
                ]);
                let mut t = Trial::new(number, params);
                t.state = state;
                match state {
                    Complete => t.value = Some(value),
                    // The value the trial would have had, as its one intermediate value.
                    Pruned => t.intermediate = BTreeMap::from([(5, value)]),
                    _ => {}
                }
                t
            })
            .collect();
        let space = SearchSpace::from_overrides(&[
            "x1=interval(-5, 10)",
            "x2=interval(0, 15)",
            "lr=tag(log, interval(1e-5, 1))",
        ])
        .unwrap();
        let group: Vec<&Param> = space.params.iter().collect();
        let tpe = TpeSampler::new(
            TpeOptions {
                multivariate: true,
                ..TpeOptions::default()
            },
            Direction::Minimize,
        );
        let (below, above) = tpe.estimators(&group, &trials, 32);
        let points = vec![
            vec![-3.0, 0.5, 3.1, 9.4],
            vec![12.0, 4.0, 2.3, 2.5],
            vec![1e-4, 1e-3, 0.02, 0.5],
        ];
        let tolerance = |got: &[f64], want: &[f64]| {
            for (g, w) in got.iter().zip(want) {
                assert!(
                    (g - w).abs() <= 1e-10 * w.abs().max(1.0),
                    "{got:?}\n  vs {want:?}"
                );
            }
        };
        tolerance(
            &below.log_pdf(&points),
            &[
                -9.190078615466753,
                -6.976968517745979,
                -6.416851642771737,
                -8.944138954435035,
            ],
        );
        tolerance(
            &above.log_pdf(&points),
            &[
                -11.22852281193477,
                -10.27884978869612,
                -10.606967899029486,
                -11.297258042488894,
            ],
        );
        tolerance(
            &acquisition(&below, &above, &points),
            &[
                2.038444196468017,
                3.3018812709501404,
                4.19011625625775,
                2.353119088053859,
            ],
        );
        // The below estimator's kernels are trials 5, 18 and 21 and the prior's; the above one
        // has 30 (the oldest weighted down).
        assert_eq!(below.weights.len(), 4);
        assert_eq!(above.weights.len(), 30);
        assert!(above.weights[0] < above.weights[29]);
    }

    /// 15 finished trials of `(x − 1)²` over `[−10, 10]`, the best at 1.
    fn quadratic_history() -> Vec<Trial> {
        (0..15)
            .map(|i| {
                let x = -9.5 + 1.5 * i as f64;
                let mut t = Trial::new(i, Params::from([("x".to_string(), x)]));
                t.value = Some((x - 1.0).powi(2));
                t.state = TrialState::Complete;
                t
            })
            .collect()
    }

    #[test]
    fn a_trial_in_flight_moves_the_next_proposal_and_the_seed_fixes_it() {
        let space = SearchSpace::from_overrides(&["x=interval(-10, 10)"]).unwrap();
        // Trial 15 sits at the best point, in flight or (the control) failed: a failed trial is
        // ignored by the sampler but keeps the number, so both studies draw trial 16 from the
        // same random stream and differ only in what they know of trial 15.
        let with_state = |state| {
            let mut trials = quadratic_history();
            let mut t = Trial::new(15, Params::from([("x".to_string(), 1.0)]));
            t.state = state;
            trials.push(t);
            trials
        };
        let in_flight = with_state(TrialState::Running);
        let control = with_state(TrialState::Failed);
        let (mut moved, mut near_in_flight, mut near_control) = (0, 0, 0);
        for seed in 0..200 {
            let mut tpe = TpeSampler::new(
                TpeOptions {
                    seed,
                    ..TpeOptions::default()
                },
                Direction::Minimize,
            );
            let a = tpe.sample(&space, &in_flight)["x"];
            assert_eq!(a, tpe.sample(&space, &in_flight)["x"], "seed {seed}");
            let b = tpe.sample(&space, &control)["x"];
            moved += usize::from(a != b);
            near_in_flight += usize::from((a - 1.0).abs() < 0.25);
            near_control += usize::from((b - 1.0).abs() < 0.25);
        }
        assert!(
            moved > 150,
            "the trial in flight changed {moved} of 200 proposals"
        );
        assert!(
            near_in_flight * 2 < near_control,
            "proposals within 0.25 of the trial in flight: {near_in_flight} with it, \
             {near_control} without"
        );
    }

    /// A study of `n` trials of `(x − 1)² + (y + 2)²` with `parallel` in flight, the oldest
    /// finishing first; returns the trials and, per trial, its distance to the nearest trial
    /// in flight when it was sampled.
    fn study_in_flight(options: TpeOptions, n: usize, parallel: usize) -> (Vec<Trial>, Vec<f64>) {
        let space =
            SearchSpace::from_overrides(&["x=interval(-10, 10)", "y=interval(-10, 10)"]).unwrap();
        let mut tpe = TpeSampler::new(options, Direction::Minimize);
        let mut trials: Vec<Trial> = Vec::new();
        let mut in_flight: std::collections::VecDeque<usize> = Default::default();
        let mut gaps = Vec::new();
        while trials.len() < n {
            if in_flight.len() == parallel {
                let t = &mut trials[in_flight.pop_front().unwrap()];
                t.value = Some((t.params["x"] - 1.0).powi(2) + (t.params["y"] + 2.0).powi(2));
                t.state = TrialState::Complete;
            }
            let p = tpe.sample(&space, &trials);
            let gap = in_flight
                .iter()
                .map(|&i| {
                    let q = &trials[i].params;
                    (p["x"] - q["x"]).hypot(p["y"] - q["y"])
                })
                .fold(f64::INFINITY, f64::min);
            gaps.push(gap);
            in_flight.push_back(trials.len());
            trials.push(Trial::new(next_number(&trials), p));
        }
        (trials, gaps)
    }

    #[test]
    fn trials_sampled_in_flight_spread_out_under_the_constant_liar() {
        let options = |seed, liar| TpeOptions {
            seed,
            constant_liar: liar,
            ..TpeOptions::default()
        };
        let (mut close_liar, mut close_plain) = (0, 0);
        for seed in 0..20 {
            let (a, gaps) = study_in_flight(options(seed, true), 30, 4);
            assert_eq!(
                a,
                study_in_flight(options(seed, true), 30, 4).0,
                "seed {seed}"
            );
            let (_, plain) = study_in_flight(options(seed, false), 30, 4);
            // The informed trials (after the random phase): how many land within 0.5 of a
            // trial still in flight.
            close_liar += gaps[10..].iter().filter(|g| **g < 0.5).count();
            close_plain += plain[13..].iter().filter(|g| **g < 0.5).count();
        }
        assert!(
            close_liar * 2 < close_plain,
            "proposals within 0.5 of a trial in flight: {close_liar} with the liar, \
             {close_plain} without"
        );
    }

    #[test]
    fn multivariate_samples_every_parameter() {
        let space = SearchSpace::from_overrides(&[
            "x=interval(-10, 10)",
            "y=range(0, 10)",
            "m=choice(a, b, c)",
            "k=choice(only)",
        ])
        .unwrap();
        let mut tpe = TpeSampler::new(
            TpeOptions {
                multivariate: true,
                ..TpeOptions::default()
            },
            Direction::Minimize,
        );
        let mut trials: Vec<Trial> = Vec::new();
        for _ in 0..15 {
            let params = tpe.sample(&space, &trials);
            assert_eq!(params.len(), 4);
            assert_eq!(params["k"], 0.0);
            let mut t = Trial::new(next_number(&trials), params);
            let p = t.params.clone();
            t.value = Some(objective(&p));
            t.state = TrialState::Complete;
            trials.push(t);
        }
    }
}
