//! The truncated normal distribution the TPE sampler's kernels are made of, computed as Optuna
//! computes it (`optuna/samplers/_tpe/_truncnorm.py`, itself scipy's algorithm): the log of the
//! standard normal CDF ([`log_ndtr`]), the log Gaussian mass of an interval
//! ([`log_gauss_mass`]), the percent point function ([`ppf`], Newton's method on `log_ndtr`),
//! random variates ([`rvs`]) and the log density ([`logpdf`]); and `erf`/`erfc` themselves
//! (the fdlibm algorithm that C's libm, hence Python's `math.erf`, uses).
//!
//! Optuna's functions take numpy arrays; these take one value at a time. The one place where
//! that shows is [`ppf`]'s Newton loop, which numpy runs until every element of a batch has
//! converged and this runs until its own element has (the results agree to ~1e-15).

use rand::Rng;
use std::f64::consts::{PI, SQRT_2};

/// `log(sqrt(2π))`.
const NORM_PDF_LOG_C: f64 = 0.918_938_533_204_672_7;
/// `sqrt(3)/π`, the logistic approximation's scale in `ndtri_exp`'s first guess.
const NDTRI_EXP_APPROX_C: f64 = 0.551_328_895_421_792_1;

/// The standard normal CDF the way Optuna's `_ndtr_single` computes it (erfc in the tails).
pub fn ndtr_single(a: f64) -> f64 {
    let x = a / SQRT_2;
    if x < -1.0 / SQRT_2 {
        0.5 * erfc(-x)
    } else if x < 1.0 / SQRT_2 {
        0.5 + 0.5 * erf(x)
    } else {
        1.0 - 0.5 * erfc(x)
    }
}

/// The standard normal CDF the way Optuna's vectorised `_ndtr` computes it (`0.5 + 0.5
/// erf(a/√2)`, used for the central case of [`log_gauss_mass`]).
pub fn ndtr(a: f64) -> f64 {
    0.5 + 0.5 * erf(a / SQRT_2)
}

/// `log Φ(a)`: Optuna's `_log_ndtr_single` (an asymptotic series below −20).
pub fn log_ndtr(a: f64) -> f64 {
    if a > 6.0 {
        return -ndtr_single(-a);
    }
    if a > -20.0 {
        return ndtr_single(a).ln();
    }
    let log_lhs = -0.5 * a * a - (-a).ln() - 0.5 * (2.0 * PI).ln();
    let mut last_total: f64 = 0.0;
    let mut right_hand_side = 1.0;
    let mut numerator = 1.0;
    let mut denom_factor = 1.0;
    let denom_cons = 1.0 / (a * a);
    let mut sign = 1.0;
    let mut i = 0.0;
    while (last_total - right_hand_side).abs() > f64::EPSILON {
        i += 1.0;
        last_total = right_hand_side;
        sign = -sign;
        denom_factor *= denom_cons;
        numerator *= 2.0 * i - 1.0;
        right_hand_side += sign * numerator * denom_factor;
    }
    log_lhs + right_hand_side.ln()
}

/// `log(exp(p) + exp(q))`, numpy's `logaddexp`.
pub fn log_sum(p: f64, q: f64) -> f64 {
    if p == q {
        return p + std::f64::consts::LN_2;
    }
    let d = p - q;
    if d > 0.0 {
        p + (-d).exp().ln_1p()
    } else if d <= 0.0 {
        q + d.exp().ln_1p()
    } else {
        d
    }
}

/// `log(exp(p) − exp(q))`, Optuna's `_log_diff`.
pub fn log_diff(p: f64, q: f64) -> f64 {
    p + (-(q - p).exp()).ln_1p()
}

/// `log(Φ(b) − Φ(a))`, the log of the standard Gaussian mass of `[a, b]` (Optuna's
/// `_log_gauss_mass`: the left tail directly, the right tail by symmetry, the centre as
/// `log1p(−Φ(a) − Φ(−b))`).
pub fn log_gauss_mass(a: f64, b: f64) -> f64 {
    let left = |a: f64, b: f64| log_diff(log_ndtr(b), log_ndtr(a));
    if b <= 0.0 {
        left(a, b)
    } else if a > 0.0 {
        left(-b, -a)
    } else if a <= 0.0 && b > 0.0 {
        (-ndtr(a) - ndtr(-b)).ln_1p()
    } else {
        f64::NAN
    }
}

/// `x` with `log Φ(x) = y` (Optuna's `_ndtri_exp`): a first guess from the tail asymptote or
/// the logistic approximation, then Newton steps to a relative tolerance of 1e-8.
pub fn ndtri_exp(y: f64) -> f64 {
    let flipped = y > -1e-2;
    let z = if flipped { (-y.exp_m1()).ln() } else { y };
    let mut x = if z < -5.0 {
        -(-2.0 * (z + NORM_PDF_LOG_C)).sqrt()
    } else {
        -NDTRI_EXP_APPROX_C * (-z).exp_m1().ln()
    };
    for _ in 0..100 {
        let log_ndtr_x = log_ndtr(x);
        let log_norm_pdf_x = -0.5 * x * x - NORM_PDF_LOG_C;
        let dx = (log_ndtr_x - z) * (log_ndtr_x - log_norm_pdf_x).exp();
        x -= dx;
        if dx.abs() < 1e-8 * x.abs() {
            break;
        }
    }
    if flipped {
        -x
    } else {
        x
    }
}

/// The percent point function of the standard normal truncated to `[a, b]`: the `c` with
/// `q = ∫_a^c f`. NaN when `a == b`.
pub fn ppf(q: f64, a: f64, b: f64) -> f64 {
    if a == b {
        return f64::NAN;
    }
    if q == 0.0 {
        return a;
    }
    if q == 1.0 {
        return b;
    }
    let log_mass = log_gauss_mass(a, b);
    if a < 0.0 {
        let log_phi_x = log_sum(log_ndtr(a), q.ln() + log_mass);
        ndtri_exp(log_phi_x)
    } else {
        let log_phi_x = log_sum(log_ndtr(-b), (-q).ln_1p() + log_mass);
        -ndtri_exp(log_phi_x)
    }
}

/// One draw from the normal with mean `loc` and deviation `scale` truncated to the standardised
/// interval `[a, b]`: `ppf(u)·scale + loc` for a uniform `u` in `[0, 1)`.
pub fn rvs<R: Rng + ?Sized>(a: f64, b: f64, loc: f64, scale: f64, rng: &mut R) -> f64 {
    let q: f64 = rng.random();
    ppf(q, a, b) * scale + loc
}

/// The log density at `x` of the normal with mean `loc` and deviation `scale` truncated to the
/// standardised interval `[a, b]`: −∞ outside it, NaN when `a == b`.
pub fn logpdf(x: f64, a: f64, b: f64, loc: f64, scale: f64) -> f64 {
    let x = (x - loc) / scale;
    if a == b {
        return f64::NAN;
    }
    if x < a || x > b {
        return f64::NEG_INFINITY;
    }
    norm_logpdf(x) - log_gauss_mass(a, b) - scale.ln()
}

/// The standard normal log density.
pub fn norm_logpdf(x: f64) -> f64 {
    -(x * x) / 2.0 - NORM_PDF_LOG_C
}

pub use fdlibm::{erf, erfc};

/// fdlibm's `s_erf.c` (as in musl and glibc): the error function and its complement, with its
/// constants as printed there.
#[allow(clippy::excessive_precision)]
mod fdlibm {
    const ERX: f64 = 8.45062911510467529297e-01;
    const EFX: f64 = 1.28379167095512586316e-01;
    const EFX8: f64 = 1.02703333676410069053e+00;
    const PP: [f64; 5] = [
        1.28379167095512558561e-01,
        -3.25042107247001499370e-01,
        -2.84817495755985104766e-02,
        -5.77027029648944159157e-03,
        -2.37630166566501626084e-05,
    ];
    const QQ: [f64; 5] = [
        3.97917223959155352819e-01,
        6.50222499887672944485e-02,
        5.08130628187576562776e-03,
        1.32494738004321644526e-04,
        -3.96022827877536812320e-06,
    ];
    const PA: [f64; 7] = [
        -2.36211856075265944077e-03,
        4.14856118683748331666e-01,
        -3.72207876035701323847e-01,
        3.18346619901161753674e-01,
        -1.10894694282396677476e-01,
        3.54783043256182359371e-02,
        -2.16637559486879084300e-03,
    ];
    const QA: [f64; 6] = [
        1.06420880400844228286e-01,
        5.40397917702171048937e-01,
        7.18286544141962662868e-02,
        1.26171219808761642112e-01,
        1.36370839120290507362e-02,
        1.19844998467991074170e-02,
    ];
    const RA: [f64; 8] = [
        -9.86494403484714822705e-03,
        -6.93858572707181764372e-01,
        -1.05586262253232909814e+01,
        -6.23753324503260060396e+01,
        -1.62396669462573470355e+02,
        -1.84605092906711035994e+02,
        -8.12874355063065934246e+01,
        -9.81432934416914548592e+00,
    ];
    const SA: [f64; 8] = [
        1.96512716674392571292e+01,
        1.37657754143519042600e+02,
        4.34565877475229228821e+02,
        6.45387271733267880336e+02,
        4.29008140027567833386e+02,
        1.08635005541779435134e+02,
        6.57024977031928170135e+00,
        -6.04244152148580987438e-02,
    ];
    const RB: [f64; 7] = [
        -9.86494292470009928597e-03,
        -7.99283237680523006574e-01,
        -1.77579549177547519889e+01,
        -1.60636384855821916062e+02,
        -6.37566443368389627722e+02,
        -1.02509513161107724954e+03,
        -4.83519191608651397019e+02,
    ];
    const SB: [f64; 7] = [
        3.03380607434824582924e+01,
        3.25792512996573918826e+02,
        1.53672958608443695994e+03,
        3.19985821950859553908e+03,
        2.55305040643316442583e+03,
        4.74528541206955367215e+02,
        -2.24409524465858183362e+01,
    ];
    const TINY: f64 = 1e-300;

    /// `c0 + s·(c1 + s·(c2 + …))`.
    fn horner(coeffs: &[f64], s: f64) -> f64 {
        coeffs.iter().rev().fold(0.0, |acc, &c| c + s * acc)
    }

    /// `1 + s·(c0 + s·(c1 + …))`.
    fn horner1(coeffs: &[f64], s: f64) -> f64 {
        1.0 + s * horner(coeffs, s)
    }

    fn high_word(x: f64) -> u32 {
        (x.to_bits() >> 32) as u32
    }

    /// `x` with its low 32 bits cleared.
    fn clear_low_word(x: f64) -> f64 {
        f64::from_bits(x.to_bits() & 0xffff_ffff_0000_0000)
    }

    /// `exp(−x² − 0.5625 + R/S) / x` for `|x| ≥ 1.25`, with `x²` split for accuracy.
    fn erfc_tail(x: f64, rs: f64) -> f64 {
        let z = clear_low_word(x);
        (-z * z - 0.5625).exp() * ((z - x) * (z + x) + rs).exp() / x
    }

    fn tail_ratio(ax: f64, ix: u32) -> f64 {
        let s = 1.0 / (ax * ax);
        if ix < 0x4006_db6e {
            horner(&RA, s) / horner1(&SA, s)
        } else {
            horner(&RB, s) / horner1(&SB, s)
        }
    }

    /// The error function (fdlibm).
    pub fn erf(x: f64) -> f64 {
        let hx = high_word(x);
        let negative = hx >> 31 != 0;
        let ix = hx & 0x7fff_ffff;
        if ix >= 0x7ff0_0000 {
            let sign = if negative { -1.0 } else { 1.0 };
            return sign + 1.0 / x;
        }
        if ix < 0x3feb_0000 {
            if ix < 0x3e30_0000 {
                if ix < 0x0080_0000 {
                    return 0.125 * (8.0 * x + EFX8 * x);
                }
                return x + EFX * x;
            }
            let z = x * x;
            let y = horner(&PP, z) / horner1(&QQ, z);
            return x + x * y;
        }
        if ix < 0x3ff4_0000 {
            let s = x.abs() - 1.0;
            let p = horner(&PA, s);
            let q = horner1(&QA, s);
            return if negative { -ERX - p / q } else { ERX + p / q };
        }
        if ix >= 0x4018_0000 {
            return if negative { TINY - 1.0 } else { 1.0 - TINY };
        }
        let ax = x.abs();
        let r = erfc_tail(ax, tail_ratio(ax, ix));
        if negative {
            r - 1.0
        } else {
            1.0 - r
        }
    }

    /// The complementary error function (fdlibm).
    pub fn erfc(x: f64) -> f64 {
        let hx = high_word(x);
        let negative = hx >> 31 != 0;
        let ix = hx & 0x7fff_ffff;
        if ix >= 0x7ff0_0000 {
            let base = if negative { 2.0 } else { 0.0 };
            return base + 1.0 / x;
        }
        if ix < 0x3feb_0000 {
            if ix < 0x3c70_0000 {
                return 1.0 - x;
            }
            let z = x * x;
            let y = horner(&PP, z) / horner1(&QQ, z);
            if (hx as i32) < 0x3fd0_0000 {
                return 1.0 - (x + x * y);
            }
            let r = x * y + (x - 0.5);
            return 0.5 - r;
        }
        if ix < 0x3ff4_0000 {
            let s = x.abs() - 1.0;
            let p = horner(&PA, s);
            let q = horner1(&QA, s);
            return if negative {
                1.0 + (ERX + p / q)
            } else {
                (1.0 - ERX) - p / q
            };
        }
        if ix < 0x403c_0000 {
            if negative && ix >= 0x4018_0000 {
                return 2.0 - TINY;
            }
            let ax = x.abs();
            // fdlibm's erfc switches series at 0x4006DB6D (erf at ...6E); keep that.
            let s = 1.0 / (ax * ax);
            let rs = if ix < 0x4006_db6d {
                horner(&RA, s) / horner1(&SA, s)
            } else {
                horner(&RB, s) / horner1(&SB, s)
            };
            let r = erfc_tail(ax, rs);
            return if negative { 2.0 - r } else { r };
        }
        if negative {
            2.0 - TINY
        } else {
            TINY * TINY
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(got: f64, want: f64, rel: f64) {
        let tol = rel * want.abs().max(1e-300);
        assert!(
            (got - want).abs() <= tol || (got.is_nan() && want.is_nan()) || got == want,
            "got {got:e}, want {want:e}"
        );
    }

    // Expected values printed (repr) by CPython 3.11's math.erf/math.erfc (glibc libm).
    #[test]
    fn erf_and_erfc_match_libm() {
        let cases = [
            (1e-30, 1.1283791670955127e-30, 1.0),
            (0.1, 0.1124629160182849, 0.8875370839817152),
            (0.5, 0.5204998778130465, 0.4795001221869535),
            (1.0, 0.8427007929497149, 0.15729920705028513),
            (2.0, 0.9953222650189527, 0.004677734981047265),
            (4.0, 0.9999999845827421, 1.541725790028002e-08),
            (-0.3, -0.3286267594591274, 1.3286267594591274),
            (-1.1, -0.8802050695740817, 1.8802050695740817),
            (-3.0, -0.9999779095030014, 1.9999779095030015),
            (10.0, 1.0, 2.088487583762545e-45),
        ];
        for (x, e, ec) in cases {
            close(erf(x), e, 4e-16);
            close(erfc(x), ec, 4e-16);
        }
    }

    // Expected values printed (repr) by optuna 5.0.0's `optuna.samplers._tpe._truncnorm`
    // (`_log_ndtr`, `_log_gauss_mass`, `ppf`, `logpdf` on one-element arrays).
    #[test]
    #[allow(clippy::approx_constant)]
    fn log_ndtr_matches_optuna() {
        let cases = [
            (-40.0, -804.6084420137538),
            (-20.5, -214.0667289632638),
            (-5.0, -15.064998393988724),
            (0.0, -0.6931471805599453),
            (3.0, -0.0013508099647482027),
            (7.0, -1.279812543885835e-12),
        ];
        for (a, want) in cases {
            close(log_ndtr(a), want, 1e-15);
        }
    }

    #[test]
    fn log_gauss_mass_matches_optuna() {
        let cases = [
            (-3.0, -1.0, -1.8495664205476083),
            (1.0, 3.0, -1.8495664205476083),
            (-0.5, 2.0, -0.4024013123385751),
            (5.0, 6.0, -15.06844609652945),
            (-1e-3, 1e-3, -7.133546798293504),
        ];
        for (a, b, want) in cases {
            close(log_gauss_mass(a, b), want, 1e-14);
        }
        assert_eq!(log_gauss_mass(-30.0, 30.0), 0.0);
    }

    #[test]
    fn ppf_matches_optuna() {
        let cases = [
            (0.1, -2.0, 0.5, -1.3430903195383765),
            (0.9, 0.3, 4.0, 1.7715172676764086),
            (0.25, -10.0, -8.0, -8.168964354229262),
            (0.75, 8.0, 12.0, 8.168964358662926),
            (1e-6, -1.0, 3.0, -0.9999965285329796),
            (0.999, -0.2, 0.2, 0.19959464017610362),
        ];
        for (q, a, b, want) in cases {
            close(ppf(q, a, b), want, 1e-13);
        }
        assert!(ppf(0.5, -1.0, 1.0).abs() < 1e-15);
        assert_eq!(ppf(0.0, -1.0, 2.0), -1.0);
        assert_eq!(ppf(1.0, -1.0, 2.0), 2.0);
        assert!(ppf(0.3, 1.0, 1.0).is_nan());
    }

    #[test]
    fn logpdf_matches_optuna() {
        let cases = [
            (0.3, -2.0, 1.5, 0.2, 0.5, -0.15196700191073742),
            (5.0, -1.0, 1.0, 4.0, 2.0, -1.3553705674624918),
            (-3.0, -10.0, 10.0, 0.0, 1.0, -5.418938533204672),
        ];
        for (x, a, b, loc, scale, want) in cases {
            close(logpdf(x, a, b, loc, scale), want, 1e-15);
        }
        assert_eq!(logpdf(10.0, -1.0, 1.0, 0.0, 1.0), f64::NEG_INFINITY);
        assert!(logpdf(0.0, 1.0, 1.0, 0.0, 1.0).is_nan());
    }

    #[test]
    fn rvs_stays_inside_and_follows_the_ppf() {
        use rand::SeedableRng;
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(7);
        let (a, b, loc, scale) = (-0.5, 2.0, 1.0, 3.0);
        let mut below_median = 0;
        let median = ppf(0.5, a, b) * scale + loc;
        for _ in 0..4000 {
            let x = rvs(a, b, loc, scale, &mut rng);
            assert!((loc + a * scale - 1e-9..=loc + b * scale + 1e-9).contains(&x));
            if x < median {
                below_median += 1;
            }
        }
        assert!((1850..=2150).contains(&below_median), "{below_median}");
    }
}
