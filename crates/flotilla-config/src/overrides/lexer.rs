//! The override lexer (Hydra's `OverrideLexer.g4`): key mode before the first `=`, value
//! mode after it, and at each position the longest match, ties going to the rule defined first.

use super::types::is_escapable;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tk {
    // Both modes.
    Equal,
    Colon,
    Id,
    // Key mode.
    Tilde,
    Plus,
    At,
    Slash,
    KeySpecial,
    DotPath,
    // Value mode.
    POpen,
    Comma,
    PClose,
    BracketOpen,
    BracketClose,
    BraceOpen,
    BraceClose,
    Float,
    Int,
    Bool,
    Null,
    UnquotedChar,
    Esc,
    Ws,
    Quoted,
    Interpolation,
    Eof,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Token {
    pub(super) kind: Tk,
    pub(super) start: usize,
    pub(super) end: usize,
}

fn at(s: &[char], i: usize) -> Option<char> {
    s.get(i).copied()
}

fn is_ws(c: char) -> bool {
    c == ' ' || c == '\t'
}

fn digit_at(s: &[char], i: usize) -> bool {
    at(s, i).is_some_and(|c| c.is_ascii_digit())
}

/// `[ \t]*`
fn ws_len(s: &[char], p: usize) -> usize {
    let mut q = p;
    while at(s, q).is_some_and(is_ws) {
        q += 1;
    }
    q - p
}

/// `ID: (CHAR|'_') (CHAR|DIGIT|'_'|'-')*`
fn id_len(s: &[char], p: usize) -> usize {
    match at(s, p) {
        Some(c) if c.is_ascii_alphabetic() || c == '_' => {
            let mut q = p + 1;
            while at(s, q).is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
                q += 1;
            }
            q - p
        }
        _ => 0,
    }
}

/// `KEY_SPECIAL: (CHAR|'_'|'$') (CHAR|DIGIT|'_'|'-'|'$')*`
fn key_special_len(s: &[char], p: usize) -> usize {
    match at(s, p) {
        Some(c) if c.is_ascii_alphabetic() || c == '_' || c == '$' => {
            let mut q = p + 1;
            while at(s, q)
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '$')
            {
                q += 1;
            }
            q - p
        }
        _ => 0,
    }
}

/// `(('_')? DIGIT)*`
fn digit_run(s: &[char], p: usize) -> usize {
    let mut q = p;
    loop {
        if digit_at(s, q) {
            q += 1;
        } else if at(s, q) == Some('_') && digit_at(s, q + 1) {
            q += 2;
        } else {
            return q - p;
        }
    }
}

/// `DIGIT (('_')? DIGIT)*`
fn digits_len(s: &[char], p: usize) -> usize {
    if digit_at(s, p) {
        1 + digit_run(s, p + 1)
    } else {
        0
    }
}

/// `INT_UNSIGNED: '0' | [1-9] (('_')? DIGIT)*`
fn int_unsigned_len(s: &[char], p: usize) -> usize {
    match at(s, p) {
        Some('0') => 1,
        Some('1'..='9') => 1 + digit_run(s, p + 1),
        _ => 0,
    }
}

/// `DOT_PATH: (KEY_SPECIAL | INT_UNSIGNED) ('.' (KEY_SPECIAL | INT_UNSIGNED))+`
fn dot_path_len(s: &[char], p: usize) -> usize {
    let segment = |q: usize| key_special_len(s, q).max(int_unsigned_len(s, q));
    let first = segment(p);
    if first == 0 {
        return 0;
    }
    let mut q = p + first;
    let mut dots = 0;
    while at(s, q) == Some('.') {
        let l = segment(q + 1);
        if l == 0 {
            break;
        }
        q += 1 + l;
        dots += 1;
    }
    if dots > 0 {
        q - p
    } else {
        0
    }
}

fn word_ci(s: &[char], p: usize, word: &str) -> bool {
    word.chars()
        .enumerate()
        .all(|(i, w)| at(s, p + i).is_some_and(|c| c.eq_ignore_ascii_case(&w)))
}

/// `FLOAT: [+-]? (POINT_FLOAT | EXPONENT_FLOAT | [Ii][Nn][Ff] | [Nn][Aa][Nn])`
fn float_len(s: &[char], p: usize) -> usize {
    let sign = usize::from(matches!(at(s, p), Some('+' | '-')));
    let b = p + sign;
    let mut best = 0;
    if word_ci(s, b, "inf") || word_ci(s, b, "nan") {
        best = 3;
    }
    // POINT_FLOAT: INT_UNSIGNED '.' | INT_UNSIGNED? '.' DIGIT (('_')? DIGIT)*
    let il = int_unsigned_len(s, b);
    let mut point = Vec::with_capacity(3);
    if il > 0 && at(s, b + il) == Some('.') {
        point.push(il + 1);
        let d = digits_len(s, b + il + 1);
        if d > 0 {
            point.push(il + 1 + d);
        }
    }
    if at(s, b) == Some('.') {
        let d = digits_len(s, b + 1);
        if d > 0 {
            point.push(1 + d);
        }
    }
    for &m in &point {
        best = best.max(m);
    }
    // EXPONENT_FLOAT: (INT_UNSIGNED | POINT_FLOAT) [eE] [+-]? DIGIT (('_')? DIGIT)*
    let mantissas = point.iter().copied().chain((il > 0).then_some(il));
    for m in mantissas {
        if matches!(at(s, b + m), Some('e' | 'E')) {
            let mut q = b + m + 1;
            if matches!(at(s, q), Some('+' | '-')) {
                q += 1;
            }
            let d = digits_len(s, q);
            if d > 0 {
                best = best.max(q + d - b);
            }
        }
    }
    if best == 0 {
        0
    } else {
        sign + best
    }
}

/// `INT: [+-]? INT_UNSIGNED`
fn int_len(s: &[char], p: usize) -> usize {
    let sign = usize::from(matches!(at(s, p), Some('+' | '-')));
    let l = int_unsigned_len(s, p + sign);
    if l == 0 {
        0
    } else {
        sign + l
    }
}

/// `ESC: ('\\\\' | '\\(' | '\\)' | ... | '\\ ' | '\\\t')+`
fn esc_len(s: &[char], p: usize) -> usize {
    let mut q = p;
    while at(s, q) == Some('\\') && at(s, q + 1).is_some_and(is_escapable) {
        q += 2;
    }
    q - p
}

/// `QUOTED_VALUE`: the closing quote is the first one after an even run of backslashes.
fn quoted_len(s: &[char], p: usize) -> usize {
    let quote = match at(s, p) {
        Some(q @ ('\'' | '"')) => q,
        _ => return 0,
    };
    let mut backslashes = 0;
    let mut q = p + 1;
    while let Some(c) = at(s, q) {
        if c == quote && backslashes % 2 == 0 {
            return q + 1 - p;
        }
        if c == '\\' {
            backslashes += 1;
        } else {
            backslashes = 0;
        }
        q += 1;
    }
    0
}

/// `INTERPOLATION: '${' ~('}')+ '}'`
fn interpolation_len(s: &[char], p: usize) -> usize {
    if at(s, p) != Some('$') || at(s, p + 1) != Some('{') || at(s, p + 2) == Some('}') {
        return 0;
    }
    let mut q = p + 2;
    while let Some(c) = at(s, q) {
        if c == '}' {
            return q + 1 - p;
        }
        q += 1;
    }
    0
}

/// `WS? c WS?` (trailing whitespace only when `trailing`).
fn punct_len(s: &[char], p: usize, c: char, leading: bool, trailing: bool) -> usize {
    let w = if leading { ws_len(s, p) } else { 0 };
    if at(s, p + w) != Some(c) {
        return 0;
    }
    let t = if trailing { ws_len(s, p + w + 1) } else { 0 };
    w + 1 + t
}

/// Splits the input into tokens, switching from key mode to value mode after the first `=`,
/// choosing at each position the longest match and, among equals, the rule defined first.
pub(super) fn tokenize(s: &[char]) -> Result<Vec<Token>, (String, usize)> {
    let mut toks = Vec::new();
    let mut p = 0;
    let mut value_mode = false;
    while p < s.len() {
        let candidates: Vec<(Tk, usize)> = if value_mode {
            vec![
                (Tk::POpen, punct_len(s, p, '(', true, true)),
                (Tk::Comma, punct_len(s, p, ',', true, true)),
                (Tk::PClose, punct_len(s, p, ')', true, false)),
                (Tk::BracketOpen, punct_len(s, p, '[', false, true)),
                (Tk::BracketClose, punct_len(s, p, ']', true, false)),
                (Tk::BraceOpen, punct_len(s, p, '{', false, true)),
                (Tk::BraceClose, punct_len(s, p, '}', true, false)),
                (Tk::Colon, punct_len(s, p, ':', true, true)),
                (Tk::Equal, punct_len(s, p, '=', true, true)),
                (Tk::Float, float_len(s, p)),
                (Tk::Int, int_len(s, p)),
                (
                    Tk::Bool,
                    if word_ci(s, p, "false") {
                        5
                    } else if word_ci(s, p, "true") {
                        4
                    } else {
                        0
                    },
                ),
                (Tk::Null, if word_ci(s, p, "null") { 4 } else { 0 }),
                (
                    Tk::UnquotedChar,
                    usize::from(matches!(
                        s[p],
                        '/' | '-' | '\\' | '+' | '.' | '$' | '%' | '*' | '@' | '?' | '|'
                    )),
                ),
                (Tk::Id, id_len(s, p)),
                (Tk::Esc, esc_len(s, p)),
                (Tk::Ws, ws_len(s, p)),
                (Tk::Quoted, quoted_len(s, p)),
                (Tk::Interpolation, interpolation_len(s, p)),
            ]
        } else {
            let single = |c: char| usize::from(s[p] == c);
            vec![
                (Tk::Equal, punct_len(s, p, '=', false, true)),
                (Tk::Tilde, single('~')),
                (Tk::Plus, single('+')),
                (Tk::At, single('@')),
                (Tk::Colon, single(':')),
                (Tk::Slash, single('/')),
                (Tk::Id, id_len(s, p)),
                (Tk::KeySpecial, key_special_len(s, p)),
                (Tk::DotPath, dot_path_len(s, p)),
            ]
        };
        let mut best = (Tk::Eof, 0);
        for (kind, len) in candidates {
            if len > best.1 {
                best = (kind, len);
            }
        }
        if best.1 == 0 {
            return Err((format!("unexpected character {}", describe_char(s[p])), p));
        }
        if !value_mode && best.0 == Tk::Equal {
            value_mode = true;
        }
        toks.push(Token {
            kind: best.0,
            start: p,
            end: p + best.1,
        });
        p += best.1;
    }
    toks.push(Token {
        kind: Tk::Eof,
        start: s.len(),
        end: s.len(),
    });
    Ok(toks)
}

fn describe_char(c: char) -> String {
    match c {
        '\'' => "\"'\"".to_string(),
        c if c.is_control() || c.is_whitespace() => format!("{:?}", c),
        c => format!("'{c}'"),
    }
}
