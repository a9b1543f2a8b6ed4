//! Optuna's `TPESampler` (Optuna 5.0, `optuna/samplers/_tpe/`), single objective: random
//! sampling for the first `n_startup_trials` finished trials, then for each parameter (or, with
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
//! What differs: the random numbers (ChaCha20 per trial instead of numpy's Mersenne Twister,
//! so the same seed proposes other points than Optuna does); sorting ties among equal
//! observations is stable here (numpy's `argsort` is not, which can swap the σ of two equal
//! observations); Optuna's default for a single objective is `multivariate=True` since 5.0 —
//! here the default is univariate (`multivariate: false`), as the issue asks, and the joint
//! sampler is one option away.

use super::random::sample_independent as random_independent;
use super::space::{Distribution, Param, SearchSpace};
use super::truncnorm;
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
    /// RUNNING trials count as "above" (bad) observations, so parallel workers spread out.
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

    /// Optuna's `_sample` for the parameters `group` of a trial numbered `number`.
    fn sample_group<R: Rng + ?Sized>(
        &self,
        group: &[&Param],
        trials: &[Trial],
        number: u64,
        rng: &mut R,
    ) -> Vec<f64> {
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
        let samples = below.sample(rng, self.options.n_ei_candidates);
        let ll_below = below.log_pdf(&samples);
        let ll_above = above.log_pdf(&samples);
        let acq: Vec<f64> = ll_below.iter().zip(&ll_above).map(|(l, g)| l - g).collect();
        let best = argmax(&acq);
        group
            .iter()
            .zip(&samples)
            .map(|(p, s)| to_internal_value(&p.distribution, s[best]))
            .collect()
    }
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
        if finished.len() < self.options.n_startup_trials {
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

/// Optuna's `default_weights(n)`: ones below 25; else a ramp from `1/n` to 1 over the oldest
/// `n − 25` observations (numpy's `linspace`), then 25 ones.
pub fn default_weights(n: usize) -> Vec<f64> {
    if n < 25 {
        return vec![1.0; n];
    }
    let num = n - 25;
    let start = 1.0 / n as f64;
    let mut w: Vec<f64> = if num > 1 {
        let step = (1.0 - start) / (num - 1) as f64;
        let mut v: Vec<f64> = (0..num).map(|i| i as f64 * step + start).collect();
        v[num - 1] = 1.0;
        v
    } else {
        vec![start; num]
    };
    w.extend(std::iter::repeat_n(1.0, 25));
    w
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

/// The Parzen estimator's settings (`_ParzenEstimatorParameters`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ParzenOptions {
    pub prior_weight: f64,
    pub consider_magic_clip: bool,
    pub consider_endpoints: bool,
}

impl Default for ParzenOptions {
    fn default() -> Self {
        ParzenOptions {
            prior_weight: 1.0,
            consider_magic_clip: true,
            consider_endpoints: false,
        }
    }
}

/// One parameter's kernels: one per observation, then the prior's.
#[derive(Clone, Debug, PartialEq)]
pub enum Kernels {
    /// `weights[k][c]`: kernel `k`'s probability of choice `c`.
    Categorical { weights: Vec<Vec<f64>> },
    /// Truncated normals with means `mus` and deviations `sigmas` in the transformed domain
    /// (log when `log`); `step` is 0 for a continuous domain.
    Numerical {
        mus: Vec<f64>,
        sigmas: Vec<f64>,
        low: f64,
        high: f64,
        step: f64,
        log: bool,
    },
}

impl Kernels {
    /// The truncation bounds in the transformed domain (`adapted_low`, `adapted_high`).
    fn adapted(&self) -> (f64, f64) {
        match *self {
            Kernels::Numerical {
                low,
                high,
                step,
                log,
                ..
            } => {
                let (lo, hi) = (low - step / 2.0, high + step / 2.0);
                if log {
                    (lo.ln(), hi.ln())
                } else {
                    (lo, hi)
                }
            }
            Kernels::Categorical { .. } => (0.0, 0.0),
        }
    }
}

/// A mixture of product kernels (Optuna's `_ParzenEstimator` over
/// `_MixtureOfProductDistribution`): kernel `k` has weight `weights[k]` and, for each
/// parameter, its component in `kernels[param]`.
#[derive(Clone, Debug, PartialEq)]
pub struct ParzenEstimator {
    pub weights: Vec<f64>,
    pub kernels: Vec<Kernels>,
}

impl ParzenEstimator {
    /// The estimator over `observations[param][i]` (internal representations) of the
    /// distributions `dists`, with Optuna's default weights.
    pub fn new(
        observations: &[Vec<f64>],
        dists: &[&Distribution],
        opts: &ParzenOptions,
    ) -> ParzenEstimator {
        assert_eq!(observations.len(), dists.len());
        let n = observations.first().map_or(0, Vec::len);
        let mut weights = if n == 0 {
            vec![1.0]
        } else {
            let mut w = default_weights(n);
            w.truncate(n);
            w.push(opts.prior_weight);
            w
        };
        let total = pairwise_sum(&weights);
        for w in &mut weights {
            *w /= total;
        }
        let kernels = observations
            .iter()
            .zip(dists)
            .map(|(obs, d)| match d {
                Distribution::Categorical { choices } => {
                    categorical_kernels(obs, choices.len(), opts)
                }
                _ => numerical_kernels(obs, d, opts),
            })
            .collect();
        ParzenEstimator { weights, kernels }
    }

    /// `size` draws from the mixture: per parameter, the values of each draw.
    pub fn sample<R: Rng + ?Sized>(&self, rng: &mut R, size: usize) -> Vec<Vec<f64>> {
        // rng.choice(len(weights), p=weights): the normalised CDF searched on the right.
        let mut cdf = Vec::with_capacity(self.weights.len());
        let mut acc = 0.0;
        for w in &self.weights {
            acc += w;
            cdf.push(acc);
        }
        let last = *cdf.last().unwrap_or(&1.0);
        for c in &mut cdf {
            *c /= last;
        }
        let active: Vec<usize> = (0..size)
            .map(|_| {
                let u: f64 = rng.random();
                cdf.partition_point(|c| *c <= u).min(cdf.len() - 1)
            })
            .collect();
        let mut out = vec![vec![0.0; size]; self.kernels.len()];
        for (i, kernels) in self.kernels.iter().enumerate() {
            if let Kernels::Categorical { weights } = kernels {
                for (j, &k) in active.iter().enumerate() {
                    let u: f64 = rng.random();
                    let row = &weights[k];
                    let mut cum = 0.0;
                    let mut idx = 0;
                    for (c, w) in row.iter().enumerate() {
                        cum += w;
                        let cum = if c == row.len() - 1 { 1.0 } else { cum };
                        if cum < u {
                            idx += 1;
                        }
                    }
                    out[i][j] = idx as f64;
                }
            }
        }
        for (i, kernels) in self.kernels.iter().enumerate() {
            if let Kernels::Numerical {
                mus,
                sigmas,
                low,
                high,
                step,
                log,
            } = kernels
            {
                let (alow, ahigh) = kernels.adapted();
                for (j, &k) in active.iter().enumerate() {
                    let (mu, sigma) = (mus[k], sigmas[k]);
                    let mut x =
                        truncnorm::rvs((alow - mu) / sigma, (ahigh - mu) / sigma, mu, sigma, rng);
                    if *log {
                        x = x.exp();
                    }
                    if *step != 0.0 {
                        x = (low + ((x - low) / step).round_ties_even() * step).clamp(*low, *high);
                    }
                    out[i][j] = x;
                }
            }
        }
        out
    }

    /// The log density of the mixture at each sample (`samples[param][j]`).
    pub fn log_pdf(&self, samples: &[Vec<f64>]) -> Vec<f64> {
        let size = samples.first().map_or(0, Vec::len);
        let nk = self.weights.len();
        (0..size)
            .map(|j| {
                let per_kernel: Vec<f64> = (0..nk)
                    .map(|k| {
                        let mut lp = 0.0;
                        let mut cont = 0.0;
                        for (kernels, xs) in self.kernels.iter().zip(samples) {
                            let x = xs[j];
                            match kernels {
                                Kernels::Categorical { weights } => {
                                    lp += weights[k][x as usize].ln();
                                }
                                Kernels::Numerical {
                                    mus,
                                    sigmas,
                                    step,
                                    log,
                                    ..
                                } => {
                                    let (alow, ahigh) = kernels.adapted();
                                    let (mu, sigma) = (mus[k], sigmas[k]);
                                    if *step == 0.0 {
                                        let xt = if *log { x.ln() } else { x };
                                        cont += truncnorm::logpdf(
                                            xt,
                                            (alow - mu) / sigma,
                                            (ahigh - mu) / sigma,
                                            mu,
                                            sigma,
                                        );
                                    } else {
                                        let t = |v: f64| if *log { v.ln() } else { v };
                                        let left = t(x - step / 2.0);
                                        let right = t(x + step / 2.0);
                                        lp += truncnorm::log_gauss_mass(
                                            (left - mu) / sigma,
                                            (right - mu) / sigma,
                                        );
                                        lp -= truncnorm::log_gauss_mass(
                                            (alow - mu) / sigma,
                                            (ahigh - mu) / sigma,
                                        );
                                    }
                                }
                            }
                        }
                        lp + cont + self.weights[k].ln()
                    })
                    .collect();
                let mut max = per_kernel.iter().copied().fold(f64::NAN, f64::max);
                if max == f64::NEG_INFINITY || max.is_nan() {
                    max = if max.is_nan() { f64::NAN } else { 0.0 };
                }
                let exps: Vec<f64> = per_kernel.iter().map(|v| (v - max).exp()).collect();
                pairwise_sum(&exps).ln() + max
            })
            .collect()
    }
}

fn categorical_kernels(obs: &[f64], n_choices: usize, opts: &ParzenOptions) -> Kernels {
    if obs.is_empty() {
        return Kernels::Categorical {
            weights: vec![vec![1.0 / n_choices as f64; n_choices]],
        };
    }
    let n_kernels = obs.len() + 1;
    let mut weights = vec![vec![opts.prior_weight / n_kernels as f64; n_choices]; n_kernels];
    for (row, &o) in weights.iter_mut().zip(obs) {
        row[o as usize] += 1.0;
    }
    for row in &mut weights {
        let s = pairwise_sum(row);
        let s = if s == 0.0 { 1.0 } else { s };
        for w in row.iter_mut() {
            *w /= s;
        }
    }
    Kernels::Categorical { weights }
}

fn numerical_kernels(obs: &[f64], d: &Distribution, opts: &ParzenOptions) -> Kernels {
    let (dlow, dhigh, step, log) = match *d {
        Distribution::Float {
            low,
            high,
            log,
            step,
        } => (low, high, step.unwrap_or(0.0), log),
        Distribution::Int {
            low,
            high,
            log,
            step,
        } => (low as f64, high as f64, step as f64, log),
        Distribution::Categorical { .. } => unreachable!("categoricals have their own kernels"),
    };
    let (mut low, mut high) = (dlow, dhigh);
    if step != 0.0 {
        low -= step / 2.0;
        high += step / 2.0;
    }
    let mut mus: Vec<f64> = obs.to_vec();
    if log {
        for m in &mut mus {
            *m = m.ln();
        }
        low = low.ln();
        high = high.ln();
    }
    let n = mus.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| mus[a].total_cmp(&mus[b]));
    let mut ends = Vec::with_capacity(n + 2);
    ends.push(low);
    ends.extend(order.iter().map(|&i| mus[i]));
    ends.push(high);
    let mut sorted_sigmas: Vec<f64> = (0..n)
        .map(|i| (ends[i + 1] - ends[i]).max(ends[i + 2] - ends[i + 1]))
        .collect();
    if !opts.consider_endpoints && ends.len() >= 4 {
        sorted_sigmas[0] = ends[2] - ends[1];
        sorted_sigmas[n - 1] = ends[n] - ends[n - 1];
    }
    let mut sigmas = vec![0.0; n];
    for (rank, &i) in order.iter().enumerate() {
        sigmas[i] = sorted_sigmas[rank];
    }
    let maxsigma = high - low;
    let minsigma = if opts.consider_magic_clip {
        (high - low) / 100f64.min(1.0 + (n + 1) as f64)
    } else {
        1e-12
    };
    for s in &mut sigmas {
        *s = s.max(minsigma).min(maxsigma);
    }
    mus.push(0.5 * (low + high));
    sigmas.push(high - low);
    Kernels::Numerical {
        mus,
        sigmas,
        low: dlow,
        high: dhigh,
        step,
        log,
    }
}

/// numpy's pairwise summation (`np.sum` of a float64 array).
fn pairwise_sum(a: &[f64]) -> f64 {
    let n = a.len();
    if n < 8 {
        let mut res = 0.0;
        for x in a {
            res += x;
        }
        res
    } else if n <= 128 {
        let mut r = [0.0f64; 8];
        r.copy_from_slice(&a[..8]);
        let mut i = 8;
        while i < n - (n % 8) {
            for (j, rj) in r.iter_mut().enumerate() {
                *rj += a[i + j];
            }
            i += 8;
        }
        let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        while i < n {
            res += a[i];
            i += 1;
        }
        res
    } else {
        let mut n2 = n / 2;
        n2 -= n2 % 8;
        pairwise_sum(&a[..n2]) + pairwise_sum(&a[n2..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::space::SearchSpace;
    use std::collections::BTreeMap;

    fn assert_close(got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            assert!(
                (g - w).abs() <= 1e-12 * w.abs().max(1.0),
                "{got:?}\n  vs {want:?}"
            );
        }
    }

    fn estimator(obs: &[&[f64]], dists: &[Distribution]) -> ParzenEstimator {
        let obs: Vec<Vec<f64>> = obs.iter().map(|o| o.to_vec()).collect();
        let dists: Vec<&Distribution> = dists.iter().collect();
        ParzenEstimator::new(&obs, &dists, &ParzenOptions::default())
    }

    fn numerical(pe: &ParzenEstimator, i: usize) -> (&[f64], &[f64]) {
        match &pe.kernels[i] {
            Kernels::Numerical { mus, sigmas, .. } => (mus, sigmas),
            k => panic!("{k:?}"),
        }
    }

    // The expected numbers in the tests below were printed (repr) by optuna 5.0.0 (pip install optuna==5.0.0):
    // `_ParzenEstimator(observations, search_space,
    // _ParzenEstimatorParameters(1.0, True, False, default_weights, True))`, its
    // `_mixture_distribution` (weights, mu, sigma, categorical weights) and `log_pdf(points)`.

    #[test]
    fn parzen_float_matches_optuna() {
        let pe = estimator(
            &[&[2.0, -1.0, 7.5, 3.0]],
            &[Distribution::float(-5.0, 10.0, false, None).unwrap()],
        );
        assert_close(&pe.weights, &[0.2; 5]);
        let (mus, sigmas) = numerical(&pe, 0);
        assert_close(mus, &[2.0, -1.0, 7.5, 3.0, 2.5]);
        assert_close(sigmas, &[3.0, 3.0, 4.5, 4.5, 15.0]);
        assert_close(
            &pe.log_pdf(&[vec![-4.0, 0.0, 2.5, 9.9]]),
            &[
                -3.1974964584231693,
                -2.465614212022257,
                -2.4265617494595273,
                -3.194951995292576,
            ],
        );
    }

    #[test]
    fn parzen_log_float_matches_optuna() {
        let pe = estimator(
            &[&[1e-3, 0.02, 3e-4]],
            &[Distribution::float(1e-5, 1.0, true, None).unwrap()],
        );
        assert_close(&pe.weights, &[0.25; 4]);
        let (mus, sigmas) = numerical(&pe, 0);
        assert_close(
            mus,
            &[
                -6.907755278982137,
                -3.912023005428146,
                -8.111728083308073,
                -5.756462732485114,
            ],
        );
        // 2.3025... is ln 10 (a gap in log space), as Optuna computed it.
        #[allow(clippy::approx_constant)]
        let want = [
            2.995732273553991,
            2.995732273553991,
            2.302585092994046,
            11.512925464970229,
        ];
        assert_close(sigmas, &want);
        assert_close(
            &pe.log_pdf(&[vec![1e-4, 0.01, 0.5]]),
            &[-2.3261919083851295, -2.3035133305394186, -3.084077765529845],
        );
    }

    #[test]
    fn parzen_int_matches_optuna() {
        let pe = estimator(
            &[&[2.0, 2.0, 5.0, 8.0]],
            &[Distribution::int(1, 8, false, 1).unwrap()],
        );
        let (mus, sigmas) = numerical(&pe, 0);
        assert_close(mus, &[2.0, 2.0, 5.0, 8.0, 4.5]);
        assert_close(sigmas, &[1.3333333333333333, 3.0, 3.0, 3.0, 8.0]);
        assert_close(
            &pe.log_pdf(&[vec![1.0, 2.0, 5.0, 8.0]]),
            &[
                -2.0493761391548824,
                -1.8479831611867414,
                -2.1434306898779463,
                -2.3412213200003316,
            ],
        );
    }

    #[test]
    fn parzen_stepped_float_and_log_int_match_optuna() {
        let pe = estimator(
            &[&[0.25, 0.75]],
            &[Distribution::float(0.0, 1.0, false, Some(0.25)).unwrap()],
        );
        let (mus, sigmas) = numerical(&pe, 0);
        assert_close(mus, &[0.25, 0.75, 0.5]);
        assert_close(sigmas, &[0.5, 0.5, 1.25]);
        assert_close(
            &pe.log_pdf(&[vec![0.0, 0.25, 1.0]]),
            &[
                -1.7530987556780993,
                -1.5478822644394965,
                -1.7530987556780993,
            ],
        );
        let pe = estimator(
            &[&[4.0, 64.0, 512.0]],
            &[Distribution::int(1, 1024, true, 1).unwrap()],
        );
        let (mus, sigmas) = numerical(&pe, 0);
        assert_close(
            mus,
            &[
                1.3862943611198906,
                4.1588830833596715,
                6.238324625039508,
                3.1194063935595047,
            ],
        );
        assert_close(
            sigmas,
            &[
                2.7725887222397807,
                2.7725887222397807,
                2.079441541679836,
                7.6251071482389,
            ],
        );
        assert_close(
            &pe.log_pdf(&[vec![1.0, 5.0, 64.0, 1000.0]]),
            &[
                -2.354092255835988,
                -3.7518315689367143,
                -6.029936455323922,
                -8.899104167412748,
            ],
        );
    }

    #[test]
    fn parzen_categorical_matches_optuna() {
        let pe = estimator(
            &[&[0.0, 2.0, 2.0]],
            &[Distribution::categorical(vec!["a".into(), "b".into(), "c".into()]).unwrap()],
        );
        let Kernels::Categorical { weights } = &pe.kernels[0] else {
            panic!()
        };
        let (hi, lo) = (0.7142857142857143, 0.14285714285714285);
        assert_close(&weights[0], &[hi, lo, lo]);
        assert_close(&weights[1], &[lo, lo, hi]);
        assert_close(&weights[2], &[lo, lo, hi]);
        assert_close(&weights[3], &[1.0 / 3.0; 3]);
        assert_close(
            &pe.log_pdf(&[vec![0.0, 1.0, 2.0]]),
            &[
                -1.0986122886681098,
                -1.6582280766035324,
                -0.7419373447293772,
            ],
        );
    }

    #[test]
    fn parzen_ramp_weights_and_prior_only_match_optuna() {
        let obs: Vec<f64> = (0..30).map(|i| ((i * 7) % 30) as f64 / 30.0).collect();
        let pe = estimator(
            &[&obs],
            &[Distribution::float(0.0, 1.0, false, None).unwrap()],
        );
        let mut want = vec![
            0.0011661807580174927,
            0.009620991253644314,
            0.018075801749271137,
            0.026530612244897955,
        ];
        want.extend([0.034985422740524776; 27]);
        assert_close(&pe.weights, &want);
        let (_, sigmas) = numerical(&pe, 0);
        assert!((sigmas[0] - 0.03333333333333333).abs() < 1e-15);
        assert_eq!(sigmas[30], 1.0);
        assert_close(
            &pe.log_pdf(&[vec![0.05, 0.5, 0.95]]),
            &[
                0.014656644574797317,
                -0.037429301837969775,
                0.0056860101075869585,
            ],
        );
        let pe = estimator(
            &[&[]],
            &[Distribution::float(-5.0, 10.0, false, None).unwrap()],
        );
        assert_eq!(pe.weights, vec![1.0]);
        assert_close(numerical(&pe, 0).0, &[2.5]);
        assert_close(numerical(&pe, 0).1, &[15.0]);
        assert_close(
            &pe.log_pdf(&[vec![0.0, 9.0]]),
            &[-2.680961289500149, -2.760961289500149],
        );
    }

    #[test]
    fn parzen_joint_matches_optuna() {
        let pe = estimator(
            &[&[1.0, 4.0, -2.0], &[0.0, 1.0, 1.0]],
            &[
                Distribution::float(-5.0, 10.0, false, None).unwrap(),
                Distribution::categorical(vec!["a".into(), "b".into()]).unwrap(),
            ],
        );
        assert_close(numerical(&pe, 0).1, &[3.0, 3.0, 3.0, 15.0]);
        assert_close(
            &pe.log_pdf(&[vec![1.0, 4.0, 0.0], vec![0.0, 0.0, 1.0]]),
            &[-3.1130442006894863, -3.4287913857569263, -2.957048980251334],
        );
    }

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

    #[test]
    fn samples_of_the_estimator_stay_in_the_domain_and_on_the_grid() {
        let dists = [
            Distribution::int(1, 8, false, 1).unwrap(),
            Distribution::float(0.0, 1.0, false, Some(0.25)).unwrap(),
            Distribution::float(1e-5, 1.0, true, None).unwrap(),
            Distribution::categorical(vec!["a".into(), "b".into()]).unwrap(),
        ];
        let pe = estimator(
            &[&[2.0, 7.0], &[0.0, 1.0], &[1e-3, 0.5], &[1.0, 1.0]],
            &dists,
        );
        let mut rng = trial_rng(0, 0);
        let s = pe.sample(&mut rng, 500);
        for (d, xs) in dists.iter().zip(&s) {
            for x in xs {
                assert!(d.contains(*x), "{d:?} {x}");
            }
        }
        // Both observations chose "b": every kernel but the prior favours it.
        let b = s[3].iter().filter(|x| **x == 1.0).count();
        assert!(b > 300, "{b}");
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
        // Few finished trials: still random startup (RUNNING ones do not count).
        let few: Vec<Trial> = trials[..9].to_vec();
        let mut running = few.clone();
        running.push(Trial::new(9, Params::from([("x".to_string(), 1.0)])));
        let a = TpeSampler::new(opts(true), Direction::Minimize).sample(&space, &running);
        let b = crate::RandomSampler::new(0).sample(&space, &running);
        assert_eq!(a, b);
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
