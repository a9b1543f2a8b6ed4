//! YAML 1.1 scalar resolution as PyYAML's SafeLoader and OmegaConf resolve it: booleans
//! (`yes`/`no`/`on`/`off`), nulls, integers (binary, octal, hex, sexagesimal, `_`), floats
//! (OmegaConf's `1e-4` included), `!!` tags, and `???` as the missing value.

use crate::node::Value;
use yaml_rust2::parser::Tag;
use yaml_rust2::scanner::TScalarStyle;

pub(super) fn scalar_value(
    text: &str,
    style: TScalarStyle,
    tag: Option<&Tag>,
) -> Result<Value, String> {
    if let Some(tag) = tag {
        if tag.handle == "tag:yaml.org,2002:" || tag.handle == "!!" {
            return match tag.suffix.as_str() {
                "str" => Ok(string_value(text)),
                "int" => parse_yaml11_int(text).ok_or_else(|| format!("'{text}' is not an int")),
                "float" => parse_yaml11_float(text)
                    .or_else(|| {
                        parse_yaml11_int(text).map(|v| match v {
                            Value::Int(i) => Value::Float(i as f64),
                            other => other,
                        })
                    })
                    .ok_or_else(|| format!("'{text}' is not a float")),
                "bool" => match yaml11_bool(text) {
                    Some(b) => Ok(Value::Bool(b)),
                    None => Err(format!("'{text}' is not a bool")),
                },
                "null" => Ok(Value::Null),
                other => Err(format!("unsupported YAML tag !!{other}")),
            };
        }
        return Err(format!("unsupported YAML tag {}{}", tag.handle, tag.suffix));
    }
    if style != TScalarStyle::Plain {
        return Ok(string_value(text));
    }
    Ok(plain_scalar(text))
}

fn string_value(text: &str) -> Value {
    if text == "???" {
        Value::Missing
    } else {
        Value::Str(text.to_string())
    }
}

/// Resolves a plain (unquoted) scalar with YAML 1.1's implicit types, as OmegaConf's loader does.
pub fn plain_scalar(text: &str) -> Value {
    if let Some(b) = yaml11_bool(text) {
        return Value::Bool(b);
    }
    if matches!(text, "" | "~" | "null" | "Null" | "NULL") {
        return Value::Null;
    }
    if let Some(first) = text.chars().next() {
        if "-+0123456789.".contains(first) {
            if let Some(v) = parse_yaml11_float_strict(text) {
                return v;
            }
            if let Some(v) = parse_yaml11_int(text) {
                return v;
            }
            if let Some(v) = parse_yaml11_float(text) {
                return v;
            }
        }
    }
    string_value(text)
}

/// YAML 1.1 booleans.
pub fn yaml11_bool(text: &str) -> Option<bool> {
    match text {
        "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => Some(true),
        "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => Some(false),
        _ => None,
    }
}

fn split_sign(text: &str) -> (bool, &str) {
    match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    }
}

fn all_chars(s: &str, allowed: impl Fn(char) -> bool) -> bool {
    !s.is_empty() && s.chars().all(allowed)
}

/// YAML 1.1 integers: binary `0b`, octal `0…`, decimal, hex `0x`, sexagesimal `1:30`; `_` ignored.
pub fn parse_yaml11_int(text: &str) -> Option<Value> {
    let (negative, body) = split_sign(text);
    let digits_of = |s: &str| s.replace('_', "");
    let magnitude: i128 = if let Some(bin) = body.strip_prefix("0b") {
        if !all_chars(bin, |c| c == '0' || c == '1' || c == '_') {
            return None;
        }
        i128::from_str_radix(&digits_of(bin), 2).ok()?
    } else if let Some(hex) = body.strip_prefix("0x") {
        if !all_chars(hex, |c| c.is_ascii_hexdigit() || c == '_') {
            return None;
        }
        i128::from_str_radix(&digits_of(hex), 16).ok()?
    } else if body.len() > 1
        && body.starts_with('0')
        && all_chars(&body[1..], |c| ('0'..='7').contains(&c) || c == '_')
    {
        let d = digits_of(&body[1..]);
        if d.is_empty() {
            0
        } else {
            i128::from_str_radix(&d, 8).ok()?
        }
    } else if body == "0" {
        0
    } else if body.starts_with(|c: char| ('1'..='9').contains(&c))
        && all_chars(body, |c| c.is_ascii_digit() || c == '_')
    {
        digits_of(body).parse().ok()?
    } else if body.contains(':') {
        let parts: Vec<&str> = body.split(':').collect();
        let head = parts[0];
        if !(head.starts_with(|c: char| ('1'..='9').contains(&c))
            && all_chars(head, |c| c.is_ascii_digit() || c == '_'))
        {
            return None;
        }
        let mut total: i128 = digits_of(head).parse().ok()?;
        for part in &parts[1..] {
            if part.is_empty() || part.len() > 2 || !all_chars(part, |c| c.is_ascii_digit()) {
                return None;
            }
            let v: i128 = part.parse().ok()?;
            if v > 59 {
                return None;
            }
            total = total * 60 + v;
        }
        total
    } else {
        return None;
    };
    let signed = if negative { -magnitude } else { magnitude };
    Some(match i64::try_from(signed) {
        Ok(i) => Value::Int(i),
        Err(_) => Value::Float(signed as f64),
    })
}

/// YAML 1.1's own float pattern (a dot is required, or `.inf`/`.nan`, or sexagesimal).
fn parse_yaml11_float_strict(text: &str) -> Option<Value> {
    let (negative, body) = split_sign(text);
    let sign = if negative { -1.0 } else { 1.0 };
    if matches!(body, ".inf" | ".Inf" | ".INF") {
        return Some(Value::Float(sign * f64::INFINITY));
    }
    if matches!(text, ".nan" | ".NaN" | ".NAN") {
        return Some(Value::Float(f64::NAN));
    }
    // [0-9][0-9_]*\.[0-9_]*([eE][-+][0-9]+)?   |   \.[0-9_]+([eE][-+][0-9]+)?
    let (mantissa, exponent) = match body.find(['e', 'E']) {
        Some(i) => (&body[..i], Some(&body[i + 1..])),
        None => (body, None),
    };
    if let Some(exp) = exponent {
        let ok = exp.len() > 1
            && (exp.starts_with('+') || exp.starts_with('-'))
            && all_chars(&exp[1..], |c| c.is_ascii_digit());
        if !ok {
            return sexagesimal_float(negative, body);
        }
    }
    let (int_part, frac) = mantissa.split_once('.')?;
    let int_ok = if int_part.is_empty() {
        !negative && !text.starts_with('+') && all_chars(frac, |c| c.is_ascii_digit() || c == '_')
    } else {
        int_part.starts_with(|c: char| c.is_ascii_digit())
            && int_part.chars().all(|c| c.is_ascii_digit() || c == '_')
            && frac.chars().all(|c| c.is_ascii_digit() || c == '_')
    };
    if !int_ok {
        return sexagesimal_float(negative, body);
    }
    float_from_parts(negative, int_part, frac, exponent)
}

fn sexagesimal_float(negative: bool, body: &str) -> Option<Value> {
    // [0-9][0-9_]*(:[0-5]?[0-9])+\.[0-9_]*
    if !body.contains(':') {
        return None;
    }
    let (whole, frac) = body.rsplit_once('.')?;
    if !frac.chars().all(|c| c.is_ascii_digit() || c == '_') {
        return None;
    }
    let parts: Vec<&str> = whole.split(':').collect();
    let head = parts[0];
    if !(head.starts_with(|c: char| c.is_ascii_digit())
        && all_chars(head, |c| c.is_ascii_digit() || c == '_'))
    {
        return None;
    }
    let mut total: f64 = head.replace('_', "").parse().ok()?;
    for (i, part) in parts[1..].iter().enumerate() {
        let last = i == parts.len() - 2;
        let p = *part;
        if p.is_empty() || p.len() > 2 || !all_chars(p, |c| c.is_ascii_digit()) {
            return None;
        }
        let mut v: f64 = p.parse().ok()?;
        if p.len() == 2 && p.as_bytes()[0] > b'5' {
            return None;
        }
        if last {
            let f = frac.replace('_', "");
            if !f.is_empty() {
                v += format!("0.{f}").parse::<f64>().ok()?;
            }
        }
        total = total * 60.0 + v;
    }
    Some(Value::Float(if negative { -total } else { total }))
}

/// The float pattern OmegaConf adds on top of YAML 1.1 (exponents without a dot, `1e-4`).
pub fn parse_yaml11_float(text: &str) -> Option<Value> {
    if let Some(v) = parse_yaml11_float_strict(text) {
        return Some(v);
    }
    let (negative, body) = split_sign(text);
    // [-+]?[0-9][0-9_]*\.[0-9_]*([eE][-+]?[0-9]+)?  |  [-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
    // |  \.[0-9_]+([eE][-+][0-9]+)?
    let (mantissa, exponent) = match body.find(['e', 'E']) {
        Some(i) => (&body[..i], Some(&body[i + 1..])),
        None => (body, None),
    };
    if let Some(exp) = exponent {
        let digits = exp.strip_prefix(['+', '-']).unwrap_or(exp);
        if !all_chars(digits, |c| c.is_ascii_digit()) {
            return None;
        }
    }
    match mantissa.split_once('.') {
        Some((int_part, frac)) => {
            if int_part.is_empty() {
                return None; // the `.5` forms are covered by the strict pattern
            }
            if !(int_part.starts_with(|c: char| c.is_ascii_digit())
                && int_part.chars().all(|c| c.is_ascii_digit() || c == '_')
                && frac.chars().all(|c| c.is_ascii_digit() || c == '_'))
            {
                return None;
            }
            float_from_parts(negative, int_part, frac, exponent)
        }
        None => {
            exponent?;
            if !(mantissa.starts_with(|c: char| c.is_ascii_digit())
                && mantissa.chars().all(|c| c.is_ascii_digit() || c == '_'))
            {
                return None;
            }
            float_from_parts(negative, mantissa, "", exponent)
        }
    }
}

fn float_from_parts(
    negative: bool,
    int_part: &str,
    frac: &str,
    exp: Option<&str>,
) -> Option<Value> {
    let int_digits = int_part.replace('_', "");
    let frac_digits = frac.replace('_', "");
    let mut s = String::new();
    if negative {
        s.push('-');
    }
    s.push_str(if int_digits.is_empty() {
        "0"
    } else {
        &int_digits
    });
    s.push('.');
    s.push_str(if frac_digits.is_empty() {
        "0"
    } else {
        &frac_digits
    });
    if let Some(e) = exp {
        s.push('e');
        s.push_str(e);
    }
    s.parse::<f64>().ok().map(Value::Float)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::Node;
    use crate::yaml::load_str;

    fn load(text: &str) -> Node {
        load_str(text, "test.yaml").unwrap()
    }

    #[test]
    fn yaml11_scalars() {
        let n = load(
            "a: yes\nb: off\nc: 1e-4\nd: .5\ne: 5.\nf: 1_000\ng: 0x1F\nh: 017\ni: ~\nj: '1'\nk: ???\nl: 1:30\nm: 2024-01-01\nn: .inf\no: -1.5e+3\np: 1.2.3\nq: '???'\nr: 08\n",
        );
        let get = |k: &str| n.child(k).unwrap().value.clone();
        assert_eq!(get("a"), Value::Bool(true));
        assert_eq!(get("b"), Value::Bool(false));
        assert_eq!(get("c"), Value::Float(1e-4));
        assert_eq!(get("d"), Value::Float(0.5));
        assert_eq!(get("e"), Value::Float(5.0));
        assert_eq!(get("f"), Value::Int(1000));
        assert_eq!(get("g"), Value::Int(31));
        assert_eq!(get("h"), Value::Int(15));
        assert_eq!(get("i"), Value::Null);
        assert_eq!(get("j"), Value::Str("1".into()));
        assert_eq!(get("k"), Value::Missing);
        assert_eq!(get("l"), Value::Int(90));
        assert_eq!(get("m"), Value::Str("2024-01-01".into()));
        assert_eq!(get("n"), Value::Float(f64::INFINITY));
        assert_eq!(get("o"), Value::Float(-1500.0));
        assert_eq!(get("p"), Value::Str("1.2.3".into()));
        assert_eq!(get("q"), Value::Missing);
        assert_eq!(get("r"), Value::Str("08".into()));
    }
}
