//! Enumerating discrete sweeps as Hydra's BasicSweeper does
//! ([`Override::sweep_value_strings`]): Python's `range`, Hydra's decimal `FloatRange`, globs
//! filtered with Python's `fnmatch`, and the seeded shuffle.

use std::cmp::Ordering;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

use super::decimal;
use super::types::{Element, Number, Override, OverrideError, Sweep};

/// Most values one sweep may expand to.
const MAX_SWEEP_VALUES: usize = 1_000_000;

impl Override {
    /// Hydra's `sweep_string_iterator()`: the value strings of a discrete sweep, in Hydra's
    /// order (sorting applied; shuffled sweeps shuffled with a random seed, which cannot
    /// reproduce Python's `random`). A glob is filtered over `group_options`, which the caller
    /// supplies sorted, as Hydra's config loader does.
    pub fn sweep_value_strings(
        &self,
        group_options: &[String],
    ) -> Result<Vec<String>, OverrideError> {
        self.sweep_value_strings_seeded(group_options, random_seed())
    }

    /// [`Override::sweep_value_strings`] with a reproducible shuffle order.
    pub fn sweep_value_strings_seeded(
        &self,
        group_options: &[String],
        seed: u64,
    ) -> Result<Vec<String>, OverrideError> {
        let fail = |message: String| OverrideError::Sweep {
            input: self.input.clone(),
            message,
        };
        let mut rng = Rng::new(seed);
        match self.sweep() {
            Some(Sweep::Choice { items, shuffle, .. }) => {
                let mut items = items.clone();
                if *shuffle {
                    rng.shuffle(&mut items);
                }
                Ok(items.iter().map(Element::as_override_str).collect())
            }
            Some(Sweep::Range {
                start,
                stop,
                step,
                shuffle,
                ..
            }) => {
                let mut values = range_values(*start, *stop, *step).map_err(fail)?;
                if *shuffle {
                    rng.shuffle(&mut values);
                }
                Ok(values.iter().map(|n| n.python_str()).collect())
            }
            Some(Sweep::Glob { include, exclude }) => {
                glob_filter(include, exclude, group_options).map_err(fail)
            }
            Some(Sweep::Interval { .. }) => Err(fail(
                "Can only enumerate CHOICE and RANGE sweeps, type is INTERVAL_SWEEP".to_string(),
            )),
            None => Err(fail(
                "Can only enumerate CHOICE and RANGE sweeps, the value is not a sweep".to_string(),
            )),
        }
    }
}

// =============================================================================================
// Range sweeps: Python's range and Hydra's decimal FloatRange
// =============================================================================================

fn range_values(start: Number, stop: Number, step: Number) -> Result<Vec<Number>, String> {
    if let (Number::Int(a), Number::Int(b), Number::Int(c)) = (start, stop, step) {
        if c == 0 {
            return Err("range() arg 3 must not be zero".to_string());
        }
        let (a, b, c) = (i128::from(a), i128::from(b), i128::from(c));
        let count = if c > 0 && a < b {
            (b - a + c - 1) / c
        } else if c < 0 && a > b {
            (a - b - c - 1) / -c
        } else {
            0
        };
        if count > MAX_SWEEP_VALUES as i128 {
            return Err(too_many_values());
        }
        return Ok((0..count)
            .map(|i| Number::Int((a + i * c) as i64))
            .collect());
    }
    let estimate = (stop.as_f64() - start.as_f64()) / step.as_f64();
    // An infinite positive estimate (an infinite bound moving towards the other) never ends.
    if estimate > MAX_SWEEP_VALUES as f64 + 2.0 {
        return Err(too_many_values());
    }
    let mut cur = decimal::Dec::from_number(start);
    let stop = decimal::Dec::from_number(stop);
    let step = decimal::Dec::from_number(step);
    let zero = decimal::Dec::from_number(Number::Int(0));
    let mut out = Vec::new();
    loop {
        let direction = step.cmp(&zero)?;
        let go = match direction {
            Ordering::Greater => cur.cmp(&stop)? == Ordering::Less,
            Ordering::Less => cur.cmp(&stop)? == Ordering::Greater,
            Ordering::Equal => {
                return Err(format!(
                    "Invalid range values (start:{}, stop:{}, step:{})",
                    cur, stop, step
                ))
            }
        };
        if !go {
            return Ok(out);
        }
        if out.len() >= MAX_SWEEP_VALUES {
            return Err(too_many_values());
        }
        out.push(Number::Float(cur.to_f64()));
        cur = cur.add(&step)?;
    }
}

fn too_many_values() -> String {
    format!("the range has more than {MAX_SWEEP_VALUES} values")
}

// =============================================================================================
// Globs: Python's fnmatch
// =============================================================================================

#[derive(Debug, Clone, PartialEq)]
enum GlobItem {
    Star,
    Any,
    Lit(char),
    Class {
        negate: bool,
        members: Vec<(char, char)>,
    },
    Never,
}

fn glob_filter(
    include: &[String],
    exclude: &[String],
    names: &[String],
) -> Result<Vec<String>, String> {
    let inc = include
        .iter()
        .map(|p| fnmatch_translate(p))
        .collect::<Result<Vec<_>, _>>()?;
    let exc = exclude
        .iter()
        .map(|p| fnmatch_translate(p))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(names
        .iter()
        .filter(|name| {
            let chars: Vec<char> = name.chars().collect();
            inc.iter().any(|p| glob_match(p, &chars)) && !exc.iter().any(|p| glob_match(p, &chars))
        })
        .cloned()
        .collect())
}

/// `fnmatch.translate` (Python 3.11), producing matchers instead of a regular expression.
fn fnmatch_translate(pattern: &str) -> Result<Vec<GlobItem>, String> {
    let pat: Vec<char> = pattern.chars().collect();
    let n = pat.len();
    let mut out = Vec::new();
    let mut i = 0;
    while i < n {
        let c = pat[i];
        i += 1;
        match c {
            '*' => {
                if out.last() != Some(&GlobItem::Star) {
                    out.push(GlobItem::Star);
                }
            }
            '?' => out.push(GlobItem::Any),
            '[' => {
                let mut j = i;
                if j < n && pat[j] == '!' {
                    j += 1;
                }
                if j < n && pat[j] == ']' {
                    j += 1;
                }
                while j < n && pat[j] != ']' {
                    j += 1;
                }
                if j >= n {
                    out.push(GlobItem::Lit('['));
                    continue;
                }
                let stuff = fnmatch_class_text(&pat, i, j)?;
                i = j + 1;
                if stuff.is_empty() {
                    out.push(GlobItem::Never);
                } else if stuff == ['!'] {
                    out.push(GlobItem::Any);
                } else {
                    let mut class = Vec::with_capacity(stuff.len() + 1);
                    if stuff[0] == '!' {
                        class.push('^');
                        class.extend_from_slice(&stuff[1..]);
                    } else {
                        if stuff[0] == '^' || stuff[0] == '[' {
                            class.push('\\');
                        }
                        class.extend_from_slice(&stuff);
                    }
                    out.push(regex_class(&class, pattern)?);
                }
            }
            c => out.push(GlobItem::Lit(c)),
        }
    }
    Ok(out)
}

/// The escaped text fnmatch puts between `[` and `]` for `pat[i..j]`.
fn fnmatch_class_text(pat: &[char], i: usize, j: usize) -> Result<Vec<char>, String> {
    let escape = |s: &[char], hyphen: bool| -> Vec<char> {
        let mut o = Vec::with_capacity(s.len());
        for &c in s {
            if c == '\\' || (hyphen && c == '-') {
                o.push('\\');
            }
            o.push(c);
        }
        o
    };
    let raw = &pat[i..j];
    let mut stuff = if !raw.contains(&'-') {
        escape(raw, false)
    } else {
        let mut chunks: Vec<Vec<char>> = Vec::new();
        let mut lo = i;
        let mut k = if pat[i] == '!' { i + 2 } else { i + 1 };
        loop {
            let found = (k..j).find(|&x| pat[x] == '-');
            match found {
                None => break,
                Some(h) => {
                    chunks.push(pat[lo..h].to_vec());
                    lo = h + 1;
                    k = h + 3;
                }
            }
        }
        let chunk = pat[lo..j].to_vec();
        if !chunk.is_empty() {
            chunks.push(chunk);
        } else if let Some(last) = chunks.last_mut() {
            last.push('-');
        }
        // Remove empty ranges (invalid in a regular expression).
        let mut k = chunks.len();
        while k > 1 {
            k -= 1;
            let (Some(&prev_last), Some(&next_first)) = (chunks[k - 1].last(), chunks[k].first())
            else {
                return Err(format!(
                    "IndexError while translating the glob pattern '{}'",
                    pat.iter().collect::<String>()
                ));
            };
            if prev_last > next_first {
                let tail: Vec<char> = chunks[k][1..].to_vec();
                chunks[k - 1].pop();
                chunks[k - 1].extend(tail);
                chunks.remove(k);
            }
        }
        let mut joined = Vec::new();
        for (idx, ch) in chunks.iter().enumerate() {
            if idx > 0 {
                joined.push('-');
            }
            joined.extend(escape(ch, true));
        }
        joined
    };
    // Escape set operations (&&, ~~ and ||).
    let mut escaped = Vec::with_capacity(stuff.len());
    for c in stuff.drain(..) {
        if matches!(c, '&' | '~' | '|') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    Ok(escaped)
}

/// Parses the body of a regular-expression character class the way Python's `re` does.
fn regex_class(body: &[char], pattern: &str) -> Result<GlobItem, String> {
    let bad = |what: &str| Err(format!("{what} in the glob pattern '{pattern}'"));
    let mut i = 0;
    let negate = body.first() == Some(&'^');
    if negate {
        i = 1;
    }
    let mut members: Vec<(char, char)> = Vec::new();
    let next = |i: &mut usize| -> Option<char> {
        let c = body.get(*i).copied();
        if c.is_some() {
            *i += 1;
        }
        c
    };
    loop {
        let this = match next(&mut i) {
            // The closing ']' that fnmatch appends.
            None if !members.is_empty() => break,
            None => return bad("unterminated character set"),
            Some(c) => c,
        };
        if this == ']' && !members.is_empty() {
            return bad("unsupported character set");
        }
        let lo = if this == '\\' {
            match next(&mut i) {
                Some(c) => c,
                None => return bad("bad escape"),
            }
        } else {
            this
        };
        if body.get(i) == Some(&'-') {
            i += 1;
            let that = match next(&mut i) {
                // `x-]`: a literal x and a literal '-'.
                None => {
                    members.push((lo, lo));
                    members.push(('-', '-'));
                    break;
                }
                Some(c) => c,
            };
            let hi = if that == '\\' {
                match next(&mut i) {
                    Some(c) => c,
                    None => return bad("bad escape"),
                }
            } else {
                that
            };
            if hi < lo {
                return bad("bad character range");
            }
            members.push((lo, hi));
        } else {
            members.push((lo, lo));
        }
    }
    Ok(GlobItem::Class { negate, members })
}

fn glob_item_matches(item: &GlobItem, c: char) -> bool {
    match item {
        GlobItem::Any => true,
        GlobItem::Lit(l) => *l == c,
        GlobItem::Class { negate, members } => {
            members.iter().any(|&(lo, hi)| lo <= c && c <= hi) != *negate
        }
        GlobItem::Never | GlobItem::Star => false,
    }
}

/// Whole-string match; every item but `*` matches exactly one character.
fn glob_match(items: &[GlobItem], s: &[char]) -> bool {
    let (mut p, mut i) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while i < s.len() {
        if p < items.len() && items[p] == GlobItem::Star {
            star = Some((p, i));
            p += 1;
        } else if p < items.len() && glob_item_matches(&items[p], s[i]) {
            p += 1;
            i += 1;
        } else if let Some((sp, si)) = star {
            p = sp + 1;
            i = si + 1;
            star = Some((sp, si + 1));
        } else {
            return false;
        }
    }
    while p < items.len() && items[p] == GlobItem::Star {
        p += 1;
    }
    p == items.len()
}

// =============================================================================================
// Shuffling
// =============================================================================================

/// xorshift64*: a small generator for `shuffle` (Python's Mersenne Twister is not reproduced).
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Rng {
        Rng((seed ^ 0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (`n > 0`), by rejection.
    fn below(&mut self, n: usize) -> usize {
        let n = n as u64;
        let zone = u64::MAX - (u64::MAX % n);
        loop {
            let x = self.next_u64();
            if x < zone {
                return (x % n) as usize;
            }
        }
    }

    /// Fisher-Yates from the end, like Python's `random.shuffle`.
    pub(super) fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

pub(super) fn random_seed() -> u64 {
    RandomState::new().hash_one(std::time::SystemTime::now())
}
