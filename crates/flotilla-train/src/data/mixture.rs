//! Which records of each source the training set takes, and which are held out for
//! evaluation, decided by the record counts and a seed alone (so every rank and every resumed
//! run picks the same):
//!
//! 1. Held out first (`data.eval_fraction`, `data.eval_records`): from each source, the
//!    first `e_i` records of a seeded permutation of its records, `e_i` being the fraction of
//!    its records, or the number asked for shared among the sources in proportion to their
//!    records (largest remainders).
//! 2. The rest, `m_i` records in the permutation's order, is the source's pool. Its share:
//!    all of it (no setting); `round(fraction * m_i)`; `records`; or, with weights `w_i`
//!    (`p_i = w_i / sum w`), `round(p_i * T)` with `T = min_i m_i / p_i`, so the sources stand
//!    in the weights' proportion until the first runs out (`interleave_datasets`'s
//!    `first_exhausted`).
//! 3. A share of `c_i = q * m_i + r` records takes every pool record `q` times and the first
//!    `r` of the pool once more.

use super::rng::{mix64, Permutation};

/// How much of a source the training set takes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Share {
    All,
    Weight(f64),
    Fraction(f64),
    Records(usize),
}

/// The held-out records carved from the training data.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum HeldOut {
    None,
    Fraction(f64),
    Records(usize),
}

/// One source's records: how many times the training set takes each, and which are held out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Picks {
    pub train: Vec<u32>,
    pub eval: Vec<bool>,
}

impl Picks {
    /// Records the training set takes, repeats counted.
    pub fn train_total(&self) -> usize {
        self.train.iter().map(|&t| t as usize).sum()
    }

    /// Records held out.
    pub fn eval_total(&self) -> usize {
        self.eval.iter().filter(|&&e| e).count()
    }
}

/// The permutation of source `i`'s `n` records.
fn order(n: usize, seed: u64, i: usize) -> Permutation {
    Permutation::new(n as u64, mix64(seed ^ mix64(i as u64 + 0x5eed)))
}

/// `total` shared among parts of sizes `sizes` in proportion to them (largest remainders,
/// ties to the first).
fn proportional(total: usize, sizes: &[usize]) -> Vec<usize> {
    let sum: usize = sizes.iter().sum();
    if sum == 0 {
        return vec![0; sizes.len()];
    }
    let exact: Vec<f64> = sizes
        .iter()
        .map(|&s| total as f64 * s as f64 / sum as f64)
        .collect();
    let mut out: Vec<usize> = exact.iter().map(|e| e.floor() as usize).collect();
    let mut left = total - out.iter().sum::<usize>();
    let mut by_remainder: Vec<usize> = (0..sizes.len()).collect();
    by_remainder.sort_by(|&a, &b| {
        let (ra, rb) = (exact[a] - exact[a].floor(), exact[b] - exact[b].floor());
        rb.total_cmp(&ra).then(a.cmp(&b))
    });
    for i in by_remainder {
        if left == 0 {
            break;
        }
        if out[i] < sizes[i] {
            out[i] += 1;
            left -= 1;
        }
    }
    out
}

/// The picks of sources with `counts` records (the error names what cannot be done; the
/// caller says which config key).
pub fn pick(
    counts: &[usize],
    shares: &[Share],
    held_out: HeldOut,
    seed: u64,
) -> Result<Vec<Picks>, String> {
    let total: usize = counts.iter().sum();
    let eval: Vec<usize> = match held_out {
        HeldOut::None => vec![0; counts.len()],
        HeldOut::Fraction(f) => counts
            .iter()
            .map(|&n| ((f * n as f64).round() as usize).min(n))
            .collect(),
        HeldOut::Records(r) => {
            if r >= total {
                return Err(format!(
                    "{r} held-out records leave none of the {total} to train on"
                ));
            }
            proportional(r, counts)
        }
    };
    let pools: Vec<usize> = counts.iter().zip(&eval).map(|(n, e)| n - e).collect();
    let weights: Vec<f64> = shares
        .iter()
        .filter_map(|s| match s {
            Share::Weight(w) => Some(*w),
            _ => None,
        })
        .collect();
    let weight_sum: f64 = weights.iter().sum();
    // The mixture's size with weights: as many as the scarcest source allows.
    let horizon = shares
        .iter()
        .zip(&pools)
        .filter_map(|(s, &m)| match s {
            Share::Weight(w) => Some(m as f64 / (w / weight_sum)),
            _ => None,
        })
        .fold(f64::INFINITY, f64::min);
    let mut out = Vec::with_capacity(counts.len());
    for (i, ((&n, &e), &m)) in counts.iter().zip(&eval).zip(&pools).enumerate() {
        let take = match shares[i] {
            Share::All => m,
            Share::Fraction(f) => (f * m as f64).round() as usize,
            Share::Records(r) => r,
            Share::Weight(w) => ((w / weight_sum * horizon).round() as usize).min(m),
        };
        if take > 0 && m == 0 {
            return Err(format!(
                "source {i} has no records left to train on ({n} records, {e} held out)"
            ));
        }
        let perm = order(n, seed, i);
        let mut picks = Picks {
            train: vec![0; n],
            eval: vec![false; n],
        };
        for j in 0..e {
            picks.eval[perm.apply(j as u64) as usize] = true;
        }
        let (every, extra) = (
            take.checked_div(m).unwrap_or(0),
            take.checked_rem(m).unwrap_or(0),
        );
        for j in e..n {
            let record = perm.apply(j as u64) as usize;
            picks.train[record] = every as u32 + ((j - e) < extra) as u32;
        }
        out.push(picks);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_keep_their_proportion_until_the_first_source_runs_out() {
        let picks = pick(
            &[1000, 300],
            &[Share::Weight(1.0), Share::Weight(1.0)],
            HeldOut::None,
            7,
        )
        .unwrap();
        assert_eq!(picks[0].train_total(), 300);
        assert_eq!(picks[1].train_total(), 300);
        assert!(picks.iter().all(|p| p.train.iter().all(|&t| t <= 1)));
        let again = pick(
            &[1000, 300],
            &[Share::Weight(1.0), Share::Weight(1.0)],
            HeldOut::None,
            7,
        )
        .unwrap();
        assert_eq!(picks, again);
        let other = pick(
            &[1000, 300],
            &[Share::Weight(1.0), Share::Weight(1.0)],
            HeldOut::None,
            8,
        )
        .unwrap();
        assert_ne!(picks[0], other[0]);
    }

    #[test]
    fn fractions_and_records_repeat_past_a_whole_source() {
        let picks = pick(
            &[10, 10],
            &[Share::Fraction(2.5), Share::Records(3)],
            HeldOut::None,
            0,
        )
        .unwrap();
        assert_eq!(picks[0].train_total(), 25);
        assert!(picks[0].train.iter().all(|&t| t == 2 || t == 3));
        assert_eq!(picks[1].train_total(), 3);
    }

    #[test]
    fn held_out_records_are_never_trained_on() {
        let picks = pick(
            &[100, 50],
            &[Share::All, Share::All],
            HeldOut::Records(30),
            1,
        )
        .unwrap();
        assert_eq!(picks[0].eval_total(), 20);
        assert_eq!(picks[1].eval_total(), 10);
        for p in &picks {
            assert!(p.train.iter().zip(&p.eval).all(|(&t, &e)| !(e && t > 0)));
            assert_eq!(p.train_total() + p.eval_total(), p.train.len());
        }
        let fraction = pick(&[200], &[Share::All], HeldOut::Fraction(0.1), 1).unwrap();
        assert_eq!(fraction[0].eval_total(), 20);
        assert!(pick(&[5], &[Share::All], HeldOut::Records(5), 1).is_err());
    }
}
