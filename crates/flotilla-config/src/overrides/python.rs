//! Python semantics the override grammar inherits from Hydra: the exceptions a grammar
//! function raises, `int()` and `float()` of strings (Unicode digits included), `int(float)`,
//! exact comparison of ints and floats, `==` and `<` between parsed elements, CPython's
//! `sorted`, and `type(x).__name__`.

use std::cmp::Ordering;

use super::types::{Element, Number};
use crate::node::{python_float_repr, python_str_repr};

/// A Python exception raised by a grammar function: its type name and message.
pub(super) struct PyErr {
    pub(super) ty: &'static str,
    pub(super) msg: String,
}

pub(super) type PyResult<T> = Result<T, PyErr>;

pub(super) fn py_err<T>(ty: &'static str, msg: impl Into<String>) -> PyResult<T> {
    Err(PyErr {
        ty,
        msg: msg.into(),
    })
}

/// Python's `==` between dict keys (1 == 1.0 == True; NaN equals nothing).
pub(super) fn py_key_eq(a: &Element, b: &Element) -> bool {
    match (a, b) {
        (Element::Null, Element::Null) => true,
        (Element::Str(x), Element::Str(y)) => x == y,
        _ => match (as_number(a), as_number(b)) {
            (Some(x), Some(y)) => num_cmp(x, y) == Some(Ordering::Equal),
            _ => false,
        },
    }
}

fn as_number(e: &Element) -> Option<Number> {
    match e {
        Element::Bool(b) => Some(Number::Int(i64::from(*b))),
        Element::Int(i) => Some(Number::Int(*i)),
        Element::Float(f) => Some(Number::Float(*f)),
        _ => None,
    }
}

/// Python's exact comparison of two numbers (`None` when a NaN is involved).
pub(super) fn num_cmp(a: Number, b: Number) -> Option<Ordering> {
    match (a, b) {
        (Number::Int(x), Number::Int(y)) => Some(x.cmp(&y)),
        (Number::Float(x), Number::Float(y)) => x.partial_cmp(&y),
        (Number::Int(x), Number::Float(y)) => int_float_cmp(x, y),
        (Number::Float(x), Number::Int(y)) => int_float_cmp(y, x).map(Ordering::reverse),
    }
}

fn int_float_cmp(i: i64, f: f64) -> Option<Ordering> {
    if f.is_nan() {
        return None;
    }
    if f.is_infinite() {
        return Some(if f > 0.0 {
            Ordering::Less
        } else {
            Ordering::Greater
        });
    }
    let fi = i as f64;
    if fi < f {
        Some(Ordering::Less)
    } else if fi > f {
        Some(Ordering::Greater)
    } else {
        // f is integral and within about 2^63: compare exactly.
        Some(i128::from(i).cmp(&(f as i128)))
    }
}

pub(super) fn element_type_name(e: &Element) -> &'static str {
    match e {
        Element::Null => "NoneType",
        Element::Bool(_) => "bool",
        Element::Int(_) => "int",
        Element::Float(_) => "float",
        Element::Str(_) => "str",
        Element::Quoted { .. } => "QuotedString",
        Element::List(_) => "list",
        Element::Dict(_) => "dict",
    }
}

/// Python's `int(float)`.
pub(super) fn float_to_int(f: f64) -> PyResult<i64> {
    if f.is_nan() {
        return py_err("ValueError", "cannot convert float NaN to integer");
    }
    if f.is_infinite() {
        return py_err("OverflowError", "cannot convert float infinity to integer");
    }
    let t = f.trunc();
    if (-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&t) {
        Ok(t as i64)
    } else {
        py_err(
            "OverflowError",
            format!("int({}) does not fit in 64 bits", python_float_repr(f)),
        )
    }
}

fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

fn python_strip(s: &str) -> &str {
    s.trim_matches(is_python_space)
}

/// The first code point of each run of ten Unicode decimal digits (category Nd, Unicode 14 as
/// in Python 3.11), which Python's `int()` and `float()` accept like ASCII digits.
const UNICODE_DIGIT_ZEROS: [u32; 66] = [
    0x30, 0x660, 0x6F0, 0x7C0, 0x966, 0x9E6, 0xA66, 0xAE6, 0xB66, 0xBE6, 0xC66, 0xCE6, 0xD66,
    0xDE6, 0xE50, 0xED0, 0xF20, 0x1040, 0x1090, 0x17E0, 0x1810, 0x1946, 0x19D0, 0x1A80, 0x1A90,
    0x1B50, 0x1BB0, 0x1C40, 0x1C50, 0xA620, 0xA8D0, 0xA900, 0xA9D0, 0xA9F0, 0xAA50, 0xABF0, 0xFF10,
    0x104A0, 0x10D30, 0x11066, 0x110F0, 0x11136, 0x111D0, 0x112F0, 0x11450, 0x114D0, 0x11650,
    0x116C0, 0x11730, 0x118E0, 0x11950, 0x11C50, 0x11D50, 0x11DA0, 0x16A60, 0x16AC0, 0x16B50,
    0x1D7CE, 0x1D7D8, 0x1D7E2, 0x1D7EC, 0x1D7F6, 0x1E140, 0x1E2F0, 0x1E950, 0x1FBF0,
];

/// Python's `_PyUnicode_TransformDecimalAndSpaceToASCII`: decimal digits become ASCII digits
/// and whitespace becomes a space, before `int()`/`float()` parse a string.
fn python_number_text(s: &str) -> String {
    s.chars()
        .map(|c| {
            let cp = c as u32;
            match UNICODE_DIGIT_ZEROS
                .iter()
                .find(|&&z| cp >= z && cp < z + 10)
            {
                Some(&z) => char::from(b'0' + (cp - z) as u8),
                None if is_python_space(c) => ' ',
                None => c,
            }
        })
        .collect()
}

/// Whether `body` is digits with single underscores between digits.
fn underscored_digits(body: &str) -> bool {
    let b = body.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_digit()
        && b[b.len() - 1].is_ascii_digit()
        && b.iter().all(|c| c.is_ascii_digit() || *c == b'_')
        && !body.contains("__")
}

/// Python's `int(str)` in base 10 (ASCII digits).
pub(super) fn python_int(s: &str) -> PyResult<i64> {
    let invalid = || {
        py_err(
            "ValueError",
            format!(
                "invalid literal for int() with base 10: {}",
                python_str_repr(s)
            ),
        )
    };
    let ascii = python_number_text(s);
    let t = python_strip(&ascii);
    let body = t.strip_prefix(['+', '-']).unwrap_or(t);
    if !underscored_digits(body) {
        return invalid();
    }
    let cleaned: String = t.chars().filter(|&c| c != '_').collect();
    match cleaned.parse::<i64>() {
        Ok(i) => Ok(i),
        Err(_) => py_err(
            "OverflowError",
            format!("int({}) does not fit in 64 bits", python_str_repr(s)),
        ),
    }
}

/// Python's `float(str)` (ASCII digits).
pub(super) fn python_float(s: &str) -> PyResult<f64> {
    let invalid = || {
        py_err(
            "ValueError",
            format!("could not convert string to float: {}", python_str_repr(s)),
        )
    };
    let ascii = python_number_text(s);
    let t = python_strip(&ascii);
    let (neg, body) = match t.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let lower = body.to_ascii_lowercase();
    let special = match lower.as_str() {
        "inf" | "infinity" => Some(f64::INFINITY),
        "nan" => Some(f64::NAN),
        _ => None,
    };
    if let Some(v) = special {
        return Ok(if neg { -v } else { v });
    }
    let (mantissa, exponent) = match lower.find('e') {
        Some(i) => (&lower[..i], Some(&lower[i + 1..])),
        None => (lower.as_str(), None),
    };
    let mantissa_ok = match mantissa.split_once('.') {
        Some((a, b)) => {
            (a.is_empty() || underscored_digits(a))
                && (b.is_empty() || underscored_digits(b))
                && !(a.is_empty() && b.is_empty())
        }
        None => underscored_digits(mantissa),
    };
    let exponent_ok = match exponent {
        Some(e) => underscored_digits(e.strip_prefix(['+', '-']).unwrap_or(e)),
        None => true,
    };
    if !mantissa_ok || !exponent_ok {
        return invalid();
    }
    let cleaned: String = lower.chars().filter(|&c| c != '_').collect();
    match cleaned.parse::<f64>() {
        Ok(v) => Ok(if neg { -v } else { v }),
        Err(_) => invalid(),
    }
}

// ---------------------------------------------------------------------------------------------
// Python's `sorted` over parsed elements
// ---------------------------------------------------------------------------------------------

/// Python's `a == b` for parsed elements.
fn py_eq(a: &Element, b: &Element) -> bool {
    match (a, b) {
        (Element::Null, Element::Null) => true,
        (Element::Str(x), Element::Str(y)) => x == y,
        (Element::Quoted { text: x, quote: qx }, Element::Quoted { text: y, quote: qy }) => {
            x == y && qx == qy
        }
        (Element::List(x), Element::List(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| py_eq(p, q))
        }
        (Element::Dict(x), Element::Dict(y)) => {
            x.len() == y.len()
                && x.iter().all(|(k, v)| {
                    y.iter()
                        .find(|(k2, _)| k2 == k)
                        .is_some_and(|(_, v2)| py_eq(v, v2))
                })
        }
        _ => match (as_number(a), as_number(b)) {
            (Some(x), Some(y)) => num_cmp(x, y) == Some(Ordering::Equal),
            _ => false,
        },
    }
}

/// Python's `a < b` for parsed elements; a `TypeError` where Python has no ordering.
fn py_lt(a: &Element, b: &Element) -> PyResult<bool> {
    if let (Some(x), Some(y)) = (as_number(a), as_number(b)) {
        return Ok(num_cmp(x, y) == Some(Ordering::Less));
    }
    match (a, b) {
        (Element::Str(x), Element::Str(y)) => Ok(x < y),
        (Element::List(x), Element::List(y)) => {
            for (p, q) in x.iter().zip(y) {
                if !py_eq(p, q) {
                    return py_lt(p, q);
                }
            }
            Ok(x.len() < y.len())
        }
        _ => py_err(
            "TypeError",
            format!(
                "'<' not supported between instances of '{}' and '{}'",
                element_type_name(a),
                element_type_name(b)
            ),
        ),
    }
}

/// Python's `sorted(items, reverse=reverse)`: CPython's run detection and binary insertion
/// sort (what `list.sort` does below 64 items, so results agree even for NaN), a stable merge
/// sort above that.
pub(super) fn py_sorted(mut items: Vec<Element>, reverse: bool) -> PyResult<Vec<Element>> {
    if reverse {
        items.reverse();
    }
    if items.len() < 64 {
        cpython_small_sort(&mut items)?;
    } else {
        items = merge_sort(items)?;
    }
    if reverse {
        items.reverse();
    }
    Ok(items)
}

fn cpython_small_sort(a: &mut [Element]) -> PyResult<()> {
    let n = a.len();
    if n < 2 {
        return Ok(());
    }
    // count_run
    let mut run = 2;
    if py_lt(&a[1], &a[0])? {
        while run < n && py_lt(&a[run], &a[run - 1])? {
            run += 1;
        }
        a[..run].reverse();
    } else {
        while run < n && !py_lt(&a[run], &a[run - 1])? {
            run += 1;
        }
    }
    // binarysort
    for start in run..n {
        let (mut l, mut r) = (0, start);
        while l < r {
            let p = l + ((r - l) >> 1);
            if py_lt(&a[start], &a[p])? {
                r = p;
            } else {
                l = p + 1;
            }
        }
        a[l..=start].rotate_right(1);
    }
    Ok(())
}

fn merge_sort(items: Vec<Element>) -> PyResult<Vec<Element>> {
    if items.len() <= 1 {
        return Ok(items);
    }
    let mut left = items;
    let right = left.split_off(left.len() / 2);
    let left = merge_sort(left)?;
    let right = merge_sort(right)?;
    let mut out = Vec::with_capacity(left.len() + right.len());
    let mut li = left.into_iter().peekable();
    let mut ri = right.into_iter().peekable();
    while let (Some(l), Some(r)) = (li.peek(), ri.peek()) {
        if py_lt(r, l)? {
            out.push(ri.next().expect("peeked"));
        } else {
            out.push(li.next().expect("peeked"));
        }
    }
    out.extend(li);
    out.extend(ri);
    Ok(out)
}
