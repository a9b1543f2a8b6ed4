//! Just enough of Python's `decimal` (default context: 28 digits, ROUND_HALF_EVEN) to
//! reproduce Hydra's `FloatRange`: exact conversion from floats, addition, comparison.

use super::types::Number;
use std::cmp::Ordering;
use std::fmt;

/// Python's default `decimal` context precision, used by Hydra's float ranges.
const DECIMAL_PRECISION: usize = 28;

/// Magnitudes are little-endian base-10 digit vectors without leading zeros.
#[derive(Clone, Debug)]
pub(super) enum Dec {
    NaN,
    Inf { neg: bool },
    Fin { neg: bool, mag: Vec<u8>, exp: i64 },
}

fn mag_from_u64(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    while v > 0 {
        out.push((v % 10) as u8);
        v /= 10;
    }
    out
}

fn mag_mul_small(mag: &mut Vec<u8>, m: u64) {
    let mut carry = 0u64;
    for d in mag.iter_mut() {
        let x = u64::from(*d) * m + carry;
        *d = (x % 10) as u8;
        carry = x / 10;
    }
    while carry > 0 {
        mag.push((carry % 10) as u8);
        carry /= 10;
    }
}

fn mag_trim(mag: &mut Vec<u8>) {
    while mag.last() == Some(&0) {
        mag.pop();
    }
}

fn mag_shift(mag: &[u8], k: usize) -> Vec<u8> {
    if mag.is_empty() {
        return Vec::new();
    }
    let mut out = vec![0; k];
    out.extend_from_slice(mag);
    out
}

fn mag_cmp(a: &[u8], b: &[u8]) -> Ordering {
    a.len()
        .cmp(&b.len())
        .then_with(|| a.iter().rev().cmp(b.iter().rev()))
}

fn mag_add(a: &[u8], b: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(a.len().max(b.len()) + 1);
    let mut carry = 0;
    for i in 0..a.len().max(b.len()) {
        let s = a.get(i).copied().unwrap_or(0) + b.get(i).copied().unwrap_or(0) + carry;
        out.push(s % 10);
        carry = s / 10;
    }
    if carry > 0 {
        out.push(carry);
    }
    out
}

/// `a - b` for `a >= b`.
fn mag_sub(a: &[u8], b: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(a.len());
    let mut borrow = 0i8;
    for (i, &da) in a.iter().enumerate() {
        let mut d = da as i8 - b.get(i).copied().unwrap_or(0) as i8 - borrow;
        borrow = 0;
        if d < 0 {
            d += 10;
            borrow = 1;
        }
        out.push(d as u8);
    }
    mag_trim(&mut out);
    out
}

/// Both magnitudes scaled to the smaller exponent.
fn align(ma: &[u8], ea: i64, mb: &[u8], eb: i64) -> (Vec<u8>, Vec<u8>, i64) {
    let e = ea.min(eb);
    (
        mag_shift(ma, (ea - e) as usize),
        mag_shift(mb, (eb - e) as usize),
        e,
    )
}

impl Dec {
    /// `Decimal(x)` for an int or float: exact.
    pub(super) fn from_number(n: Number) -> Dec {
        match n {
            Number::Int(i) => Dec::Fin {
                neg: i < 0,
                mag: mag_from_u64(i.unsigned_abs()),
                exp: 0,
            },
            Number::Float(x) => Dec::from_f64(x),
        }
    }

    fn from_f64(x: f64) -> Dec {
        if x.is_nan() {
            return Dec::NaN;
        }
        if x.is_infinite() {
            return Dec::Inf { neg: x < 0.0 };
        }
        let bits = x.to_bits();
        let neg = bits >> 63 == 1;
        let biased = ((bits >> 52) & 0x7ff) as i64;
        let frac = bits & ((1u64 << 52) - 1);
        let (m, e2) = if biased == 0 {
            (frac, -1074)
        } else {
            (frac | (1u64 << 52), biased - 1075)
        };
        let mut mag = mag_from_u64(m);
        let mut exp = 0;
        if e2 >= 0 {
            let mut k = e2;
            while k > 0 {
                let s = k.min(30);
                mag_mul_small(&mut mag, 1u64 << s);
                k -= s;
            }
        } else {
            let mut k = -e2;
            while k > 0 {
                let s = k.min(13);
                mag_mul_small(&mut mag, 5u64.pow(s as u32));
                k -= s;
            }
            exp = e2;
        }
        mag_trim(&mut mag);
        Dec::Fin { neg, mag, exp }
    }

    /// Rounds to the context precision, half to even.
    fn rounded(neg: bool, mut mag: Vec<u8>, mut exp: i64) -> Dec {
        mag_trim(&mut mag);
        if mag.len() > DECIMAL_PRECISION {
            let drop = mag.len() - DECIMAL_PRECISION;
            let first = mag[drop - 1];
            let rest_nonzero = mag[..drop - 1].iter().any(|&d| d != 0);
            let mut kept = mag[drop..].to_vec();
            exp += drop as i64;
            let up = first > 5 || (first == 5 && (rest_nonzero || kept[0] % 2 == 1));
            if up {
                let mut i = 0;
                loop {
                    if i == kept.len() {
                        kept.push(1);
                        break;
                    }
                    if kept[i] == 9 {
                        kept[i] = 0;
                        i += 1;
                    } else {
                        kept[i] += 1;
                        break;
                    }
                }
                if kept.len() > DECIMAL_PRECISION {
                    kept.remove(0);
                    exp += 1;
                }
            }
            mag = kept;
        }
        Dec::Fin { neg, mag, exp }
    }

    /// `self + other`, rounded; an error where Python signals InvalidOperation.
    pub(super) fn add(&self, other: &Dec) -> Result<Dec, String> {
        match (self, other) {
            (Dec::NaN, _) | (_, Dec::NaN) => Ok(Dec::NaN),
            (Dec::Inf { neg: a }, Dec::Inf { neg: b }) if a != b => {
                Err("decimal.InvalidOperation: Infinity + -Infinity".to_string())
            }
            (Dec::Inf { neg }, _) | (_, Dec::Inf { neg }) => Ok(Dec::Inf { neg: *neg }),
            (
                Dec::Fin {
                    neg: na,
                    mag: ma,
                    exp: ea,
                },
                Dec::Fin {
                    neg: nb,
                    mag: mb,
                    exp: eb,
                },
            ) => {
                let (a, b, e) = align(ma, *ea, mb, *eb);
                if na == nb {
                    Ok(Dec::rounded(*na, mag_add(&a, &b), e))
                } else {
                    match mag_cmp(&a, &b) {
                        Ordering::Equal => Ok(Dec::Fin {
                            neg: false,
                            mag: Vec::new(),
                            exp: e,
                        }),
                        Ordering::Greater => Ok(Dec::rounded(*na, mag_sub(&a, &b), e)),
                        Ordering::Less => Ok(Dec::rounded(*nb, mag_sub(&b, &a), e)),
                    }
                }
            }
        }
    }

    /// Ordering comparison; an error for NaN (Python signals InvalidOperation).
    pub(super) fn cmp(&self, other: &Dec) -> Result<Ordering, String> {
        let rank = |d: &Dec| -> i8 {
            match d {
                Dec::Inf { neg: true } => -2,
                Dec::Inf { neg: false } => 2,
                Dec::Fin { mag, .. } if mag.is_empty() => 0,
                Dec::Fin { neg: true, .. } => -1,
                _ => 1,
            }
        };
        if matches!(self, Dec::NaN) || matches!(other, Dec::NaN) {
            return Err(
                "decimal.InvalidOperation: comparison involving NaN in a float range".to_string(),
            );
        }
        let (ra, rb) = (rank(self), rank(other));
        if ra != rb || ra.abs() != 1 {
            return Ok(ra.cmp(&rb));
        }
        match (self, other) {
            (
                Dec::Fin {
                    neg,
                    mag: ma,
                    exp: ea,
                    ..
                },
                Dec::Fin {
                    mag: mb, exp: eb, ..
                },
            ) => {
                let (a, b, _) = align(ma, *ea, mb, *eb);
                let ord = mag_cmp(&a, &b);
                Ok(if *neg { ord.reverse() } else { ord })
            }
            _ => Ok(Ordering::Equal),
        }
    }

    /// `float(self)`: correctly rounded.
    pub(super) fn to_f64(&self) -> f64 {
        match self {
            Dec::NaN => f64::NAN,
            Dec::Inf { neg } => {
                if *neg {
                    f64::NEG_INFINITY
                } else {
                    f64::INFINITY
                }
            }
            Dec::Fin { neg, mag, exp } => {
                let v = if mag.is_empty() {
                    0.0
                } else {
                    let digits: String = mag.iter().rev().map(|d| char::from(b'0' + d)).collect();
                    format!("{digits}e{exp}").parse::<f64>().unwrap_or(f64::NAN)
                };
                if *neg {
                    -v
                } else {
                    v
                }
            }
        }
    }
}

impl fmt::Display for Dec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dec::NaN => write!(f, "NaN"),
            Dec::Inf { neg } => write!(f, "{}Infinity", if *neg { "-" } else { "" }),
            Dec::Fin { neg, mag, exp } => {
                let digits: String = if mag.is_empty() {
                    "0".to_string()
                } else {
                    mag.iter().rev().map(|d| char::from(b'0' + d)).collect()
                };
                write!(f, "{}{}E{}", if *neg { "-" } else { "" }, digits, exp)
            }
        }
    }
}
