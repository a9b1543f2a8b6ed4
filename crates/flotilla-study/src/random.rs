//! Optuna's `RandomSampler`: each parameter drawn independently and uniformly over its
//! transformed bounds (Optuna's `_SearchSpaceTransform`): a log domain in log space, an int or
//! stepped float over `[low − step/2, high + step/2]` then rounded onto the grid, a
//! categorical as the argmax of one uniform per choice (a uniform choice). It is also the
//! TPE sampler's startup sampler.

use super::space::{Distribution, SearchSpace};
use super::{next_number, trial_rng, Params, Sampler, Trial};
use rand::Rng;

/// Uniform random search, seeded (see [`super::trial_rng`]).
#[derive(Clone, Debug)]
pub struct RandomSampler {
    pub seed: u64,
}

impl RandomSampler {
    pub fn new(seed: u64) -> RandomSampler {
        RandomSampler { seed }
    }
}

impl Sampler for RandomSampler {
    fn sample(&mut self, space: &SearchSpace, trials: &[Trial]) -> Params {
        let mut rng = trial_rng(self.seed, next_number(trials));
        space
            .params
            .iter()
            .map(|p| {
                (
                    p.name.clone(),
                    sample_independent(&p.distribution, &mut rng),
                )
            })
            .collect()
    }
}

/// `nextafter(x, −∞)`.
fn next_down(x: f64) -> f64 {
    if x.is_nan() || x == f64::NEG_INFINITY {
        return x;
    }
    if x == 0.0 {
        return -f64::from_bits(1);
    }
    let bits = x.to_bits();
    f64::from_bits(if x > 0.0 { bits - 1 } else { bits + 1 })
}

/// A uniform draw in `[low, high)`, numpy's `uniform`.
fn uniform<R: Rng + ?Sized>(rng: &mut R, low: f64, high: f64) -> f64 {
    let u: f64 = rng.random();
    low + (high - low) * u
}

/// The transformed bounds of a numerical distribution (`_transform_search_space` with
/// `transform_log` and `transform_step`).
pub fn transformed_bounds(d: &Distribution) -> (f64, f64) {
    match *d {
        Distribution::Float {
            low,
            high,
            log,
            step,
        } => {
            let t = |x: f64| if log { x.ln() } else { x };
            let half = step.map_or(0.0, |s| 0.5 * s);
            (t(low) - half, t(high) + half)
        }
        Distribution::Int {
            low,
            high,
            log,
            step,
        } => {
            let half = 0.5 * step as f64;
            if log {
                ((low as f64 - half).ln(), (high as f64 + half).ln())
            } else {
                (low as f64 - half, high as f64 + half)
            }
        }
        Distribution::Categorical { .. } => (0.0, 1.0),
    }
}

/// `_untransform_numerical_param`: a transformed value back onto the distribution.
pub fn untransform(d: &Distribution, x: f64) -> f64 {
    match *d {
        Distribution::Float {
            low,
            high,
            log,
            step,
        } => {
            let single = d.single();
            if log {
                let v = x.exp();
                if single {
                    v
                } else {
                    v.clamp(low, next_down(high))
                }
            } else if let Some(step) = step {
                (((x - low) / step).round_ties_even() * step + low).clamp(low, high)
            } else if single {
                x
            } else {
                x.min(next_down(high))
            }
        }
        Distribution::Int {
            low,
            high,
            log,
            step,
        } => {
            let v = if log {
                x.exp().round_ties_even()
            } else {
                ((x - low as f64) / step as f64 + 0.5).floor() * step as f64 + low as f64
            };
            v.clamp(low as f64, high as f64)
        }
        Distribution::Categorical { .. } => x,
    }
}

/// One value of `d` (internal representation) drawn as Optuna's `RandomSampler` draws it.
pub fn sample_independent<R: Rng + ?Sized>(d: &Distribution, rng: &mut R) -> f64 {
    match d {
        Distribution::Categorical { choices } => {
            // One uniform per one-hot column, then the argmax (the first of equals).
            let mut best = 0;
            let mut best_u = f64::NEG_INFINITY;
            for i in 0..choices.len() {
                let u = uniform(rng, 0.0, 1.0);
                if u > best_u {
                    best_u = u;
                    best = i;
                }
            }
            best as f64
        }
        _ => {
            let (lo, hi) = transformed_bounds(d);
            untransform(d, uniform(rng, lo, hi))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::space::SearchSpace;

    fn draws(d: &Distribution, n: usize) -> Vec<f64> {
        let mut rng = trial_rng(0, 0);
        (0..n).map(|_| sample_independent(d, &mut rng)).collect()
    }

    #[test]
    fn bounds_and_untransform_follow_optunas_transform() {
        // Values from optuna 5.0.0's _SearchSpaceTransform(...).bounds and .untransform.
        let i = Distribution::int(1, 8, false, 1).unwrap();
        assert_eq!(transformed_bounds(&i), (0.5, 8.5));
        assert_eq!(untransform(&i, 0.5), 1.0);
        assert_eq!(untransform(&i, 1.4999), 1.0);
        assert_eq!(untransform(&i, 1.5), 2.0);
        assert_eq!(untransform(&i, 8.5), 8.0);
        let il = Distribution::int(1, 100, true, 1).unwrap();
        let (lo, hi) = transformed_bounds(&il);
        assert_eq!((lo, hi), (0.5f64.ln(), 100.5f64.ln()));
        assert_eq!(untransform(&il, 2.5f64.ln()), 2.0); // round half to even
        let f = Distribution::float(0.0, 1.0, false, Some(0.25)).unwrap();
        assert_eq!(transformed_bounds(&f), (-0.125, 1.125));
        assert_eq!(untransform(&f, 0.375), 0.5); // half to even: 1.5 → 2
        assert_eq!(untransform(&f, 1.1), 1.0);
        let c = Distribution::float(2.0, 3.0, false, None).unwrap();
        assert_eq!(untransform(&c, 3.0), next_down(3.0));
        let l = Distribution::float(1e-5, 1.0, true, None).unwrap();
        assert_eq!(transformed_bounds(&l), (1e-5f64.ln(), 0.0));
        assert!(untransform(&l, 0.0) < 1.0);
    }

    #[test]
    fn draws_are_uniform_over_the_transformed_space() {
        let i = Distribution::int(1, 4, false, 1).unwrap();
        let v = draws(&i, 8000);
        for k in 1..=4 {
            let n = v.iter().filter(|x| **x == k as f64).count();
            assert!((1800..=2200).contains(&n), "{k}: {n}");
        }
        let l = Distribution::float(1e-4, 1.0, true, None).unwrap();
        let v = draws(&l, 8000);
        let below = v.iter().filter(|x| **x < 1e-2).count();
        assert!((3700..=4300).contains(&below), "{below}");
        assert!(v.iter().all(|x| (1e-4..1.0).contains(x)));
        let c = Distribution::categorical(vec!["a".into(), "b".into(), "c".into()]).unwrap();
        let v = draws(&c, 9000);
        for k in 0..3 {
            let n = v.iter().filter(|x| **x == k as f64).count();
            assert!((2700..=3300).contains(&n), "{k}: {n}");
        }
    }

    #[test]
    fn the_sampler_is_seeded_per_trial() {
        let space =
            SearchSpace::from_overrides(&["x=interval(-5, 10)", "m=choice(a,b)", "n=range(1,8)"])
                .unwrap();
        let mut s = RandomSampler::new(3);
        let a = s.sample(&space, &[]);
        let b = RandomSampler::new(3).sample(&space, &[]);
        assert_eq!(a, b);
        assert_eq!(a.len(), 3);
        let t0 = Trial::new(0, a.clone());
        let c = s.sample(&space, &[t0]);
        assert_ne!(a, c);
        for (name, v) in &c {
            assert!(space.get(name).unwrap().distribution.contains(*v));
        }
    }
}
