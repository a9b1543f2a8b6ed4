//! The Parzen estimator of Optuna's TPE (`optuna/samplers/_tpe/parzen_estimator.py` and
//! `probability_distributions.py`): a mixture with one kernel per observation plus the prior's,
//! truncated normals on the (log-)domain for numbers (widened by half a step for discrete
//! domains), smoothed categorical kernels, the default weights (a ramp over the oldest
//! observations once there are 25 or more), sampling and the log density. The TPE sampler
//! (`tpe.rs`) builds one over the good trials and one over the rest.

use super::space::Distribution;
use super::truncnorm;
use rand::Rng;

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
pub(crate) mod tests {
    use super::*;
    use crate::trial_rng;

    pub(crate) fn assert_close(got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            assert!(
                (g - w).abs() <= 1e-12 * w.abs().max(1.0),
                "{got:?}\n  vs {want:?}"
            );
        }
    }

    pub(crate) fn estimator(obs: &[&[f64]], dists: &[Distribution]) -> ParzenEstimator {
        let obs: Vec<Vec<f64>> = obs.iter().map(|o| o.to_vec()).collect();
        let dists: Vec<&Distribution> = dists.iter().collect();
        ParzenEstimator::new(&obs, &dists, &ParzenOptions::default())
    }

    pub(crate) fn numerical(pe: &ParzenEstimator, i: usize) -> (&[f64], &[f64]) {
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
}
