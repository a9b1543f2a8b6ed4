//! The override parser (Hydra's `OverrideParser.g4`): recursive descent over the tokens into a
//! parse tree of elements, not yet evaluated.

use super::lexer::{Tk, Token};
use super::types::OverrideKind;

/// Deepest nesting of lists, dicts and function calls accepted.
pub(super) const MAX_DEPTH: usize = 400;

/// A parsed (not yet evaluated) element.
#[derive(Debug)]
pub(super) enum Ast {
    /// `primitive` without a quoted value: one or more tokens.
    Prim(Vec<Token>),
    Quoted(Token),
    List(Vec<Ast>, usize),
    Dict(Vec<(Vec<Token>, Ast)>, usize),
    Func(Func),
}

#[derive(Debug)]
pub(super) struct Func {
    pub(super) name: String,
    pub(super) args: Vec<(Option<String>, Ast)>,
    pub(super) start: usize,
    pub(super) end: usize,
}

pub(super) fn ast_start(ast: &Ast) -> usize {
    match ast {
        Ast::Prim(t) => t[0].start,
        Ast::Quoted(t) => t.start,
        Ast::List(_, s) | Ast::Dict(_, s) => *s,
        Ast::Func(f) => f.start,
    }
}

pub(super) enum ValueAst {
    /// `key=` with nothing after.
    Empty,
    Element(Ast),
    /// `a,b,c`
    Choice(Vec<Ast>),
}

pub(super) struct ParsedOverride {
    pub(super) kind: OverrideKind,
    pub(super) key: String,
    pub(super) package: Option<String>,
    pub(super) value: Option<ValueAst>,
}

type SyntaxResult<T> = Result<T, (String, usize)>;

pub(super) struct Parser<'a> {
    pub(super) s: &'a [char],
    pub(super) toks: Vec<Token>,
    pub(super) pos: usize,
}

const PRIMITIVE_TOKENS: [Tk; 10] = [
    Tk::Id,
    Tk::Null,
    Tk::Int,
    Tk::Float,
    Tk::Bool,
    Tk::Interpolation,
    Tk::UnquotedChar,
    Tk::Colon,
    Tk::Esc,
    Tk::Ws,
];

const DICT_KEY_TOKENS: [Tk; 8] = [
    Tk::Id,
    Tk::Null,
    Tk::Int,
    Tk::Float,
    Tk::Bool,
    Tk::UnquotedChar,
    Tk::Esc,
    Tk::Ws,
];

impl Parser<'_> {
    fn peek(&self) -> Tk {
        self.toks[self.pos].kind
    }

    fn peek2(&self) -> Tk {
        self.toks.get(self.pos + 1).map_or(Tk::Eof, |t| t.kind)
    }

    fn bump(&mut self) -> Token {
        let t = self.toks[self.pos];
        if t.kind != Tk::Eof {
            self.pos += 1;
        }
        t
    }

    fn text(&self, t: &Token) -> String {
        self.s[t.start..t.end].iter().collect()
    }

    fn describe_current(&self) -> String {
        let t = self.toks[self.pos];
        if t.kind == Tk::Eof {
            "end of input".to_string()
        } else {
            let text = self.text(&t);
            if text.contains('\'') {
                format!("\"{text}\"")
            } else {
                format!("'{text}'")
            }
        }
    }

    fn fail<T>(&self, message: String) -> SyntaxResult<T> {
        Err((message, self.toks[self.pos].start))
    }

    fn unexpected<T>(&self, expected: &str) -> SyntaxResult<T> {
        self.fail(format!(
            "expected {expected} but found {}",
            self.describe_current()
        ))
    }

    /// `override: key EQUAL value? | TILDE key (EQUAL value?)? | PLUS PLUS? key EQUAL value?`
    pub(super) fn parse_override(&mut self) -> SyntaxResult<ParsedOverride> {
        let kind = match self.peek() {
            Tk::Tilde => {
                self.bump();
                OverrideKind::Delete
            }
            Tk::Plus => {
                self.bump();
                if self.peek() == Tk::Plus {
                    self.bump();
                    OverrideKind::ForceAdd
                } else {
                    OverrideKind::Add
                }
            }
            _ => OverrideKind::Change,
        };
        let (key, package) = self.parse_key()?;
        if kind == OverrideKind::Delete && self.peek() == Tk::Eof {
            return Ok(ParsedOverride {
                kind,
                key,
                package,
                value: None,
            });
        }
        if self.peek() != Tk::Equal {
            return match self.peek() {
                Tk::Tilde | Tk::Plus => self.fail(format!(
                    "unexpected {}: '~' cannot be combined with '+' and at most two '+' are allowed",
                    self.describe_current()
                )),
                _ => self.unexpected("'='"),
            };
        }
        self.bump();
        let value = if self.peek() == Tk::Eof {
            ValueAst::Empty
        } else {
            self.parse_value()?
        };
        if self.peek() != Tk::Eof {
            return self.fail(format!("unexpected {}", self.describe_current()));
        }
        Ok(ParsedOverride {
            kind,
            key,
            package,
            value: Some(value),
        })
    }

    /// `key: packageOrGroup (AT package)?`, `packageOrGroup: package | ID (SLASH ID)+`,
    /// `package: ( | ID | KEY_SPECIAL | DOT_PATH)`
    fn parse_key(&mut self) -> SyntaxResult<(String, Option<String>)> {
        let is_package = |k: Tk| matches!(k, Tk::Id | Tk::KeySpecial | Tk::DotPath);
        let mut key = String::new();
        if self.peek() == Tk::Id && self.peek2() == Tk::Slash {
            let t = self.bump();
            key.push_str(&self.text(&t));
            while self.peek() == Tk::Slash {
                self.bump();
                key.push('/');
                if self.peek() != Tk::Id {
                    return self.unexpected("a config group name after '/'");
                }
                let t = self.bump();
                key.push_str(&self.text(&t));
            }
        } else if is_package(self.peek()) {
            let t = self.bump();
            key = self.text(&t);
        }
        let mut package = None;
        if self.peek() == Tk::At {
            self.bump();
            let mut p = String::new();
            if is_package(self.peek()) {
                let t = self.bump();
                p = self.text(&t);
            }
            package = Some(p);
        }
        Ok((key, package))
    }

    /// `value: element | simpleChoiceSweep`, `simpleChoiceSweep: element (COMMA element)+`
    fn parse_value(&mut self) -> SyntaxResult<ValueAst> {
        let first = self.parse_element(0)?;
        if self.peek() != Tk::Comma {
            return Ok(ValueAst::Element(first));
        }
        let mut items = vec![first];
        while self.peek() == Tk::Comma {
            self.bump();
            items.push(self.parse_element(0)?);
        }
        Ok(ValueAst::Choice(items))
    }

    /// `element: primitive | listContainer | dictContainer | function`
    fn parse_element(&mut self, depth: usize) -> SyntaxResult<Ast> {
        if depth >= MAX_DEPTH {
            return self.fail(format!("values nested more than {MAX_DEPTH} levels deep"));
        }
        match self.peek() {
            Tk::Id if self.peek2() == Tk::POpen => self.parse_function(depth),
            Tk::BracketOpen => self.parse_list(depth),
            Tk::BraceOpen => self.parse_dict(depth),
            Tk::Quoted => Ok(Ast::Quoted(self.bump())),
            k if PRIMITIVE_TOKENS.contains(&k) => {
                let mut toks = Vec::new();
                while PRIMITIVE_TOKENS.contains(&self.peek()) {
                    toks.push(self.bump());
                }
                Ok(Ast::Prim(toks))
            }
            _ => self.unexpected("a value"),
        }
    }

    /// `listContainer: BRACKET_OPEN (element (COMMA element)*)? BRACKET_CLOSE`
    fn parse_list(&mut self, depth: usize) -> SyntaxResult<Ast> {
        let start = self.bump().start;
        let mut items = Vec::new();
        if self.peek() == Tk::BracketClose {
            self.bump();
            return Ok(Ast::List(items, start));
        }
        loop {
            items.push(self.parse_element(depth + 1)?);
            match self.peek() {
                Tk::Comma => {
                    self.bump();
                }
                Tk::BracketClose => {
                    self.bump();
                    return Ok(Ast::List(items, start));
                }
                Tk::Eof => return self.fail("missing ']'".to_string()),
                _ => return self.unexpected("',' or ']'"),
            }
        }
    }

    /// `dictContainer: BRACE_OPEN (dictKeyValuePair (COMMA dictKeyValuePair)*)? BRACE_CLOSE`,
    /// `dictKeyValuePair: dictKey COLON element`
    fn parse_dict(&mut self, depth: usize) -> SyntaxResult<Ast> {
        let start = self.bump().start;
        let mut pairs = Vec::new();
        if self.peek() == Tk::BraceClose {
            self.bump();
            return Ok(Ast::Dict(pairs, start));
        }
        loop {
            let mut key = Vec::new();
            while DICT_KEY_TOKENS.contains(&self.peek()) {
                key.push(self.bump());
            }
            if key.is_empty() {
                return match self.peek() {
                    Tk::Eof => self.fail("missing '}'".to_string()),
                    _ => self.unexpected("a dictionary key"),
                };
            }
            if self.peek() != Tk::Colon {
                return match self.peek() {
                    Tk::Eof => self.fail("missing ':' and '}'".to_string()),
                    _ => self.unexpected("':' after the dictionary key"),
                };
            }
            self.bump();
            let value = self.parse_element(depth + 1)?;
            pairs.push((key, value));
            match self.peek() {
                Tk::Comma => {
                    self.bump();
                }
                Tk::BraceClose => {
                    self.bump();
                    return Ok(Ast::Dict(pairs, start));
                }
                Tk::Eof => return self.fail("missing '}'".to_string()),
                _ => return self.unexpected("',' or '}'"),
            }
        }
    }

    /// `function: ID POPEN (argName? element (COMMA argName? element)*)? PCLOSE`,
    /// `argName: ID EQUAL`
    fn parse_function(&mut self, depth: usize) -> SyntaxResult<Ast> {
        let name_tok = self.bump();
        let name = self.text(&name_tok);
        self.bump(); // POPEN
        let mut args = Vec::new();
        if self.peek() != Tk::PClose {
            loop {
                let mut arg_name = None;
                if self.peek() == Tk::Id && self.peek2() == Tk::Equal {
                    let t = self.bump();
                    arg_name = Some(self.text(&t));
                    self.bump();
                }
                let value = self.parse_element(depth + 1)?;
                args.push((arg_name, value));
                match self.peek() {
                    Tk::Comma => {
                        self.bump();
                    }
                    Tk::PClose => break,
                    Tk::Eof => return self.fail("missing ')'".to_string()),
                    _ => return self.unexpected("',' or ')'"),
                }
            }
        }
        let close = self.bump();
        Ok(Ast::Func(Func {
            name,
            args,
            start: name_tok.start,
            end: close.end,
        }))
    }
}
