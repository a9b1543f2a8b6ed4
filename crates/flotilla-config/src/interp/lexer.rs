//! The lexer of OmegaConf's interpolation grammar: its lexer modes (top-level text,
//! interpolation, resolver arguments, quoted strings), longest match with rule order breaking
//! ties.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Tk {
    AnyStr,
    EscInter,
    TopEsc,
    InterOpen,
    BraceOpen,
    BraceClose,
    QuoteOpen,
    Comma,
    BracketOpen,
    BracketClose,
    Colon,
    Float,
    Int,
    Bool,
    Null,
    UnquotedChar,
    Id,
    Esc,
    Ws,
    InterClose,
    Dot,
    InterKey,
    QuoteClose,
    QuotedEsc,
    Eof,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode {
    /// DEFAULT_MODE: a whole config string.
    Top,
    /// VALUE_MODE: resolver arguments, and `oc.decode` input.
    Value,
    /// INTERPOLATION_MODE: inside `${`.
    Inter,
    /// QUOTED_SINGLE_MODE.
    Single,
    /// QUOTED_DOUBLE_MODE.
    Double,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Tok {
    pub(super) kind: Tk,
    pub(super) start: usize,
    pub(super) end: usize,
}

#[derive(Clone, Copy)]
enum Act {
    Stay,
    Push(Mode),
    Pop,
    Set(Mode),
}

type Lexed = Option<(Tk, usize, Act)>;

pub(super) fn lex(src: &str, start: Mode) -> Result<Vec<Tok>, String> {
    let b = src.as_bytes();
    let mut toks = Vec::with_capacity(8);
    let mut mode = start;
    let mut stack: Vec<Mode> = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let lexed = match mode {
            Mode::Top => lex_top(b, i),
            Mode::Value => lex_value(b, i),
            Mode::Inter => lex_inter(b, i),
            Mode::Single => lex_quoted(b, i, b'\''),
            Mode::Double => lex_quoted(b, i, b'"'),
        };
        let Some((kind, len, act)) = lexed else {
            let c = src.get(i..).and_then(|s| s.chars().next()).unwrap_or('?');
            return Err(format!("token recognition error at: '{c}'"));
        };
        match act {
            Act::Stay => {}
            Act::Push(m) => {
                stack.push(mode);
                mode = m;
            }
            Act::Pop => mode = stack.pop().ok_or_else(|| "Empty Stack".to_string())?,
            Act::Set(m) => mode = m,
        }
        toks.push(Tok {
            kind,
            start: i,
            end: i + len,
        });
        i += len;
    }
    Ok(toks)
}

/// The longest candidate; the earliest rule wins a tie. `None` when nothing matches.
fn longest(cands: &[(usize, Tk)]) -> Option<(Tk, usize)> {
    let mut best: Option<(Tk, usize)> = None;
    for &(len, kind) in cands {
        if len > 0 && best.is_none_or(|(_, l)| len > l) {
            best = Some((kind, len));
        }
    }
    best
}

fn ws_len(b: &[u8], i: usize) -> usize {
    b.get(i..).map_or(0, |s| {
        s.iter().take_while(|&&c| c == b' ' || c == b'\t').count()
    })
}

fn backslashes(b: &[u8], i: usize) -> usize {
    b[i..].iter().take_while(|&&c| c == b'\\').count()
}

fn is_digit(c: Option<&u8>) -> bool {
    c.is_some_and(u8::is_ascii_digit)
}

/// `~[stop]* ~[\\ stop]`: the longest run of non-stop bytes that does not end in a backslash.
fn any_str_len(b: &[u8], i: usize, stop: impl Fn(u8) -> bool) -> usize {
    let mut last = None;
    let mut j = i;
    while j < b.len() && !stop(b[j]) {
        if b[j] != b'\\' {
            last = Some(j);
        }
        j += 1;
    }
    last.map_or(0, |l| l + 1 - i)
}

fn opens_interp(b: &[u8], i: usize) -> bool {
    b.get(i) == Some(&b'$') && b.get(i + 1) == Some(&b'{')
}

fn lex_top(b: &[u8], i: usize) -> Lexed {
    if b[i] == b'$' {
        if opens_interp(b, i) {
            return Some((Tk::InterOpen, 2 + ws_len(b, i + 2), Act::Push(Mode::Inter)));
        }
        return Some((Tk::AnyStr, 1, Act::Stay));
    }
    let any = any_str_len(b, i, |c| c == b'$');
    if b[i] != b'\\' {
        return Some((Tk::AnyStr, any, Act::Stay));
    }
    let n = backslashes(b, i);
    let esc_inter = if n % 2 == 1 && opens_interp(b, i + n) {
        n + 2
    } else {
        0
    };
    longest(&[
        (any, Tk::AnyStr),
        (esc_inter, Tk::EscInter),
        (n / 2 * 2, Tk::TopEsc),
        (n, Tk::AnyStr),
    ])
    .map(|(k, l)| (k, l, Act::Stay))
}

fn lex_quoted(b: &[u8], i: usize, quote: u8) -> Lexed {
    let c = b[i];
    if c == b'$' {
        if opens_interp(b, i) {
            return Some((Tk::InterOpen, 2 + ws_len(b, i + 2), Act::Push(Mode::Inter)));
        }
        return Some((Tk::AnyStr, 1, Act::Stay));
    }
    if c == quote {
        return Some((Tk::QuoteClose, 1, Act::Pop));
    }
    let any = any_str_len(b, i, |x| x == quote || x == b'$');
    if c != b'\\' {
        return Some((Tk::AnyStr, any, Act::Stay));
    }
    let n = backslashes(b, i);
    let odd = n % 2 == 1;
    let esc_inter = if odd && opens_interp(b, i + n) {
        n + 2
    } else {
        0
    };
    let esc_quote = if odd && b.get(i + n) == Some(&quote) {
        n + 1
    } else {
        0
    };
    longest(&[
        (any, Tk::AnyStr),
        (esc_inter, Tk::EscInter),
        (esc_quote, Tk::Esc),
        (n / 2 * 2, Tk::QuotedEsc),
        (n, Tk::AnyStr),
    ])
    .map(|(k, l)| (k, l, Act::Stay))
}

fn lex_value(b: &[u8], i: usize) -> Lexed {
    let w = ws_len(b, i);
    if w > 0 {
        let after = i + w;
        return Some(match b.get(after) {
            Some(b'}') => (Tk::BraceClose, w + 1, Act::Pop),
            Some(b',') => (Tk::Comma, w + 1 + ws_len(b, after + 1), Act::Stay),
            Some(b']') => (Tk::BracketClose, w + 1, Act::Stay),
            Some(b':') => (Tk::Colon, w + 1 + ws_len(b, after + 1), Act::Stay),
            _ => (Tk::Ws, w, Act::Stay),
        });
    }
    let simple = match b[i] {
        b'$' if opens_interp(b, i) => {
            Some((Tk::InterOpen, 2 + ws_len(b, i + 2), Act::Push(Mode::Inter)))
        }
        b'{' => Some((Tk::BraceOpen, 1 + ws_len(b, i + 1), Act::Push(Mode::Value))),
        b'}' => Some((Tk::BraceClose, 1, Act::Pop)),
        b'\'' => Some((Tk::QuoteOpen, 1, Act::Push(Mode::Single))),
        b'"' => Some((Tk::QuoteOpen, 1, Act::Push(Mode::Double))),
        b',' => Some((Tk::Comma, 1 + ws_len(b, i + 1), Act::Stay)),
        b'[' => Some((Tk::BracketOpen, 1 + ws_len(b, i + 1), Act::Stay)),
        b']' => Some((Tk::BracketClose, 1, Act::Stay)),
        b':' => Some((Tk::Colon, 1 + ws_len(b, i + 1), Act::Stay)),
        _ => None,
    };
    if simple.is_some() {
        return simple;
    }
    let unquoted = usize::from(b"/-\\+.$%*@?|".contains(&b[i]));
    longest(&[
        (float_len(b, i), Tk::Float),
        (int_len(b, i), Tk::Int),
        (keyword_len(b, i, &[b"true", b"false"]), Tk::Bool),
        (keyword_len(b, i, &[b"null"]), Tk::Null),
        (unquoted, Tk::UnquotedChar),
        (id_len(b, i), Tk::Id),
        (esc_len(b, i), Tk::Esc),
    ])
    .map(|(k, l)| (k, l, Act::Stay))
}

fn lex_inter(b: &[u8], i: usize) -> Lexed {
    let w = ws_len(b, i);
    match b.get(i + w) {
        Some(b':') => {
            let len = w + 1 + ws_len(b, i + w + 1);
            return Some((Tk::Colon, len, Act::Set(Mode::Value)));
        }
        Some(b'}') => return Some((Tk::InterClose, w + 1, Act::Pop)),
        _ if w > 0 => return None,
        _ => {}
    }
    match b[i] {
        b'$' if opens_interp(b, i) => {
            Some((Tk::InterOpen, 2 + ws_len(b, i + 2), Act::Push(Mode::Inter)))
        }
        b'.' => Some((Tk::Dot, 1, Act::Stay)),
        b'[' => Some((Tk::BracketOpen, 1, Act::Stay)),
        b']' => Some((Tk::BracketClose, 1, Act::Stay)),
        _ => {
            let id = id_len(b, i);
            let key = b[i..]
                .iter()
                .take_while(|&&c| !b"\\{}()[]:. \t'\"".contains(&c))
                .count();
            if id == 0 && key == 0 {
                None
            } else if id >= key {
                Some((Tk::Id, id, Act::Stay))
            } else {
                Some((Tk::InterKey, key, Act::Stay))
            }
        }
    }
}

/// `DIGIT (('_')? DIGIT)*` starting at a digit; returns the end.
fn digits_end(b: &[u8], mut j: usize) -> usize {
    j += 1;
    loop {
        if is_digit(b.get(j)) {
            j += 1;
        } else if b.get(j) == Some(&b'_') && is_digit(b.get(j + 1)) {
            j += 2;
        } else {
            return j;
        }
    }
}

/// `INT_UNSIGNED: '0' | [1-9] (('_')? DIGIT)*`; returns the end.
fn int_unsigned_end(b: &[u8], s: usize) -> Option<usize> {
    match b.get(s) {
        Some(b'0') => Some(s + 1),
        Some(c) if c.is_ascii_digit() => Some(digits_end(b, s)),
        _ => None,
    }
}

fn sign_end(b: &[u8], i: usize) -> usize {
    if matches!(b.get(i), Some(b'+' | b'-')) {
        i + 1
    } else {
        i
    }
}

fn int_len(b: &[u8], i: usize) -> usize {
    int_unsigned_end(b, sign_end(b, i)).map_or(0, |e| e - i)
}

fn float_len(b: &[u8], i: usize) -> usize {
    let s = sign_end(b, i);
    let mut best = 0;
    if let Some(word) = b.get(s..s + 3) {
        if word.eq_ignore_ascii_case(b"inf") || word.eq_ignore_ascii_case(b"nan") {
            best = s + 3 - i;
        }
    }
    let int_end = int_unsigned_end(b, s);
    // POINT_FLOAT: INT_UNSIGNED '.' | INT_UNSIGNED? '.' DIGIT (('_')? DIGIT)*
    let p1 = int_end.filter(|&u| b.get(u) == Some(&b'.')).map(|u| u + 1);
    let q = int_end.unwrap_or(s);
    let p2 = (b.get(q) == Some(&b'.') && is_digit(b.get(q + 1))).then(|| digits_end(b, q + 1));
    for end in [p1, p2].into_iter().flatten() {
        best = best.max(end - i);
    }
    // EXPONENT_FLOAT: (INT_UNSIGNED | POINT_FLOAT) [eE] [+-]? DIGIT (('_')? DIGIT)*
    for base in [int_end, p1, p2].into_iter().flatten() {
        if matches!(b.get(base), Some(b'e' | b'E')) {
            let k = sign_end(b, base + 1);
            if is_digit(b.get(k)) {
                best = best.max(digits_end(b, k) - i);
            }
        }
    }
    best
}

fn keyword_len(b: &[u8], i: usize, words: &[&[u8]]) -> usize {
    words
        .iter()
        .find(|w| {
            b.get(i..i + w.len())
                .is_some_and(|s| s.eq_ignore_ascii_case(w))
        })
        .map_or(0, |w| w.len())
}

fn id_len(b: &[u8], i: usize) -> usize {
    if !(b[i].is_ascii_alphabetic() || b[i] == b'_') {
        return 0;
    }
    1 + b[i + 1..]
        .iter()
        .take_while(|&&c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
        .count()
}

fn esc_len(b: &[u8], i: usize) -> usize {
    let mut j = i;
    while b.get(j) == Some(&b'\\') && b.get(j + 1).is_some_and(|c| b"\\()[]{}:=, \t".contains(c)) {
        j += 2;
    }
    j - i
}
