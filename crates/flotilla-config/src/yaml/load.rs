//! The YAML loader: one document into a [`Node`] tree that records the file and line of every
//! value, with duplicate keys rejected, anchors, aliases and `<<` merge keys honoured, and the
//! document's size bounded against alias bombs; plus Hydra's `# @package` header.

use super::scalars::scalar_value;
use crate::node::{python_float_repr, Dict, Node, Origin, Value};
use std::collections::HashMap;
use std::sync::Arc;
use yaml_rust2::parser::{Event, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// A YAML document that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum YamlError {
    #[error("{path}:{line}:{col}: malformed YAML: {message}")]
    Syntax {
        path: String,
        line: usize,
        col: usize,
        message: String,
    },
    #[error("{path}:{line}: duplicate key '{key}' in the same mapping")]
    DuplicateKey {
        path: String,
        line: usize,
        key: String,
    },
    #[error("{path}: {message}")]
    Other { path: String, message: String },
}

/// The header of a config file (`# @package foo.bar`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Header {
    pub package: Option<String>,
}

/// Reads Hydra's header: comment lines of the form `# @key value` at the top of the file,
/// up to the first line that is neither blank nor such a comment.
pub fn parse_header(text: &str, path: &str) -> Result<Header, YamlError> {
    let mut header = Header::default();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let Some(rest) = line.strip_prefix('#') else {
            break;
        };
        let rest = rest.trim_start();
        if !rest.starts_with('@') {
            break;
        }
        let rest = line.trim_start_matches('#').trim();
        let parts: Vec<&str> = rest.split(' ').filter(|s| !s.is_empty()).collect();
        if parts.len() < 2 {
            return Err(YamlError::Other {
                path: path.into(),
                message: format!("expected header format '# @KEY VALUE', got '{rest}'"),
            });
        }
        if parts.len() > 2 {
            return Err(YamlError::Other {
                path: path.into(),
                message: format!("too many components in header '{rest}'"),
            });
        }
        if parts[0] == "@package" {
            header.package = Some(parts[1].to_string());
        }
    }
    Ok(header)
}

/// Parses one YAML document into a node tree. An empty document is an empty dictionary.
pub fn load_str(text: &str, path: &str) -> Result<Node, YamlError> {
    let file: Arc<str> = Arc::from(path);
    let mut parser = Parser::new_from_str(text);
    let mut builder = Builder {
        file,
        path,
        text,
        anchors: HashMap::new(),
        cost: 0,
    };
    let syntax = |e: yaml_rust2::ScanError| scan_error(text, path, &e);
    let mut next = || parser.next_token().map_err(syntax);
    // StreamStart
    let (ev, _) = next()?;
    debug_assert_eq!(ev, Event::StreamStart);
    let (ev, mark) = next()?;
    let root = match ev {
        Event::StreamEnd => Node::new(Value::dict(), builder.origin(mark)),
        Event::DocumentStart => {
            let (ev, mark) = next()?;
            let root = builder.node(ev, mark, &mut next)?;
            let (ev, mark) = next()?;
            if ev != Event::DocumentEnd {
                return Err(YamlError::Syntax {
                    path: path.into(),
                    line: mark.line(),
                    col: mark.col() + 1,
                    message: "expected a single document".into(),
                });
            }
            let (ev, mark) = next()?;
            if ev != Event::StreamEnd {
                return Err(YamlError::Syntax {
                    path: path.into(),
                    line: mark.line(),
                    col: mark.col() + 1,
                    message: "expected a single YAML document, found several".into(),
                });
            }
            root
        }
        other => {
            return Err(YamlError::Other {
                path: path.into(),
                message: format!("unexpected YAML event {other:?}"),
            })
        }
    };
    Ok(match root.value {
        Value::Null => Node::new(Value::dict(), root.origin),
        _ => root,
    })
}

/// The most a document may cost to build, in estimated bytes (every node counts
/// `NODE_COST`, every scalar its text too), aliases counted as the copies they create. Real
/// configs cost kilobytes; a YAML alias bomb ("billion laughs") is stopped here long before it
/// exhausts memory.
pub const MAX_DOCUMENT_COST: u64 = 64 << 20;

/// The estimated cost of one node, apart from its text.
const NODE_COST: u64 = 64;

struct Builder<'p> {
    file: Arc<str>,
    path: &'p str,
    text: &'p str,
    /// Every anchored node and what building it cost, by the parser's anchor id.
    anchors: HashMap<usize, (Node, u64)>,
    /// The cost of everything built so far, aliases included.
    cost: u64,
}

impl Builder<'_> {
    fn origin(&self, mark: Marker) -> Origin {
        Origin::File {
            path: self.file.clone(),
            line: mark.line() as u32,
        }
    }

    /// The name of the alias at `mark` (`*name` in the source text).
    fn alias_name(&self, mark: Marker) -> String {
        let rest = self
            .text
            .chars()
            .skip(mark.index())
            .skip_while(|c| *c == '*');
        rest.take_while(|c| !c.is_whitespace() && !matches!(c, ',' | ']' | '}'))
            .collect()
    }

    /// Adds `cost` to the document's total; an error names the culprit when the total passes
    /// [`MAX_DOCUMENT_COST`].
    fn spend(
        &mut self,
        cost: u64,
        mark: Marker,
        culprit: impl FnOnce() -> String,
    ) -> Result<(), YamlError> {
        self.cost = self.cost.saturating_add(cost);
        if self.cost > MAX_DOCUMENT_COST {
            return Err(YamlError::Other {
                path: format!("{}:{}", self.path, mark.line()),
                message: format!(
                    "{} takes the document past {} MiB; a config this large is an alias bomb \
                     (anchors expanded many times over) or data that belongs in a data file",
                    culprit(),
                    MAX_DOCUMENT_COST >> 20
                ),
            });
        }
        Ok(())
    }

    /// Records an anchored node with the cost of building it.
    fn remember(&mut self, anchor: usize, node: &Node, cost_before: u64) {
        if anchor > 0 {
            self.anchors
                .insert(anchor, (node.clone(), self.cost - cost_before));
        }
    }

    fn node(
        &mut self,
        ev: Event,
        mark: Marker,
        next: &mut impl FnMut() -> Result<(Event, Marker), YamlError>,
    ) -> Result<Node, YamlError> {
        let cost_before = self.cost;
        self.node_inner(ev, mark, next, cost_before)
    }

    fn node_inner(
        &mut self,
        ev: Event,
        mark: Marker,
        next: &mut impl FnMut() -> Result<(Event, Marker), YamlError>,
        cost_before: u64,
    ) -> Result<Node, YamlError> {
        match ev {
            Event::Scalar(text, style, anchor, tag) => {
                let value = scalar_value(&text, style, tag.as_ref()).map_err(|message| {
                    YamlError::Other {
                        path: format!("{}:{}", self.path, mark.line()),
                        message,
                    }
                })?;
                self.spend(NODE_COST + text.len() as u64, mark, || "a scalar".into())?;
                let node = Node::new(value, self.origin(mark));
                self.remember(anchor, &node, cost_before);
                Ok(node)
            }
            Event::Alias(id) => {
                let Some((node, cost)) = self.anchors.get(&id).cloned() else {
                    return Err(YamlError::Syntax {
                        path: self.path.into(),
                        line: mark.line(),
                        col: mark.col() + 1,
                        message: "alias to an unknown anchor".into(),
                    });
                };
                let name = self.alias_name(mark);
                self.spend(cost, mark, || format!("alias *{name} (of anchor &{name})"))?;
                Ok(node)
            }
            Event::SequenceStart(anchor, _) => {
                self.spend(NODE_COST, mark, || "a sequence".into())?;
                let mut items = Vec::new();
                loop {
                    let (ev, m) = next().map_err(|e| self.while_parsing(e, mark))?;
                    if ev == Event::SequenceEnd {
                        break;
                    }
                    let item = self
                        .node(ev, m, next)
                        .map_err(|e| self.while_parsing(e, mark))?;
                    items.push(item);
                }
                let node = Node::new(Value::List(items), self.origin(mark));
                self.remember(anchor, &node, cost_before);
                Ok(node)
            }
            Event::MappingStart(anchor, _) => {
                self.spend(NODE_COST, mark, || "a mapping".into())?;
                let mut dict = Dict::new();
                // PyYAML 6.0.2+'s flatten_mapping, which OmegaConf and so Hydra use: the pairs
                // of every merge source come first, in source order, then the mapping's own
                // pairs; a later pair replaces an earlier value and keeps its place, so explicit
                // keys win. Among merge sources PyYAML drops a pair whose key object it has seen
                // (identity, not equality): CPython shares one object per 1-character Latin-1
                // string, so for such keys the first source wins, for longer keys the last.
                let mut merged: Vec<(String, Node)> = Vec::new();
                // A block mapping's event is marked after its first key; it begins at that key.
                let mut start = mark;
                let flow = self.char_at(mark) == Some('{');
                loop {
                    let (ev, key_mark) = next().map_err(|e| self.while_parsing(e, start))?;
                    if ev == Event::MappingEnd {
                        break;
                    }
                    if !flow && dict.is_empty() && merged.is_empty() {
                        start = key_mark;
                    }
                    let is_merge_key =
                        matches!(&ev, Event::Scalar(k, TScalarStyle::Plain, _, None) if k == "<<");
                    let key_node = self
                        .node(ev, key_mark, next)
                        .map_err(|e| self.while_parsing(e, start))?;
                    let (ev, m) = next().map_err(|e| self.while_parsing(e, start))?;
                    let value = self
                        .node(ev, m, next)
                        .map_err(|e| self.while_parsing(e, start))?;
                    if is_merge_key {
                        match value.value {
                            Value::Dict(d) => merged.extend(d),
                            Value::List(items) => {
                                let mut sources = Vec::with_capacity(items.len());
                                for item in items {
                                    match item.value {
                                        Value::Dict(d) => sources.push(d),
                                        _ => return Err(self.merge_error(key_mark)),
                                    }
                                }
                                merged.extend(sources.into_iter().flatten());
                            }
                            _ => return Err(self.merge_error(key_mark)),
                        }
                        continue;
                    }
                    let key = key_text(&key_node.value).ok_or_else(|| YamlError::Other {
                        path: format!("{}:{}", self.path, key_mark.line()),
                        message: format!(
                            "a mapping key must be a scalar, found a {}",
                            key_node.value.type_name()
                        ),
                    })?;
                    if dict.contains_key(&key) {
                        return Err(YamlError::DuplicateKey {
                            path: self.path.into(),
                            line: key_mark.line(),
                            key,
                        });
                    }
                    dict.insert(key, value);
                }
                if !merged.is_empty() {
                    let own = std::mem::take(&mut dict);
                    for (key, value) in merged {
                        let shared_key_object = {
                            let mut chars = key.chars();
                            matches!((chars.next(), chars.next()), (Some(c), None) if (c as u32) < 256)
                        };
                        if !(shared_key_object && dict.contains_key(&key)) {
                            dict.insert(key, value);
                        }
                    }
                    dict.extend(own);
                }
                let node = Node::new(Value::Dict(dict), self.origin(mark));
                self.remember(anchor, &node, cost_before);
                Ok(node)
            }
            other => Err(YamlError::Other {
                path: self.path.into(),
                message: format!("unexpected YAML event {other:?}"),
            }),
        }
    }

    /// Adds to a syntax error met inside the collection that starts at `start` where that
    /// collection began, as PyYAML's "while parsing a flow sequence ... started at" does: an
    /// unclosed `[` is reported where the parser gave up, usually lines later. Only the
    /// innermost collection is named; tab errors name their tab alone.
    fn while_parsing(&self, e: YamlError, start: Marker) -> YamlError {
        let YamlError::Syntax {
            path,
            line,
            col,
            message,
        } = e
        else {
            return e;
        };
        if message.contains(WHILE_PARSING) || message.starts_with(TAB_MESSAGE) {
            return YamlError::Syntax {
                path,
                line,
                col,
                message,
            };
        }
        let (kind, closer) = match self.char_at(start) {
            Some('[') => ("flow sequence", Some(']')),
            Some('{') => ("flow mapping", Some('}')),
            Some('-') => ("block sequence", None),
            _ => ("block mapping", None),
        };
        // yaml-rust2 names the construct itself in some messages; it is named below.
        let message = message
            .strip_prefix(&format!("while parsing a {kind}, "))
            .unwrap_or(&message)
            .to_string();
        let unclosed = match closer {
            Some(c) if line > start.line() => format!(" (is its closing '{c}' missing?)"),
            _ => String::new(),
        };
        YamlError::Syntax {
            path,
            line,
            col,
            message: format!(
                "{message}{WHILE_PARSING}{kind} started at line {}, column {}{unclosed}",
                start.line(),
                start.col() + 1
            ),
        }
    }

    /// The character of the text at a marker.
    fn char_at(&self, mark: Marker) -> Option<char> {
        self.text
            .lines()
            .nth(mark.line().saturating_sub(1))
            .and_then(|l| l.chars().nth(mark.col()))
    }

    fn merge_error(&self, mark: Marker) -> YamlError {
        YamlError::Other {
            path: format!("{}:{}", self.path, mark.line()),
            message: "'<<' merge expects a mapping or a list of mappings".into(),
        }
    }
}

const WHILE_PARSING: &str = ", while parsing a ";
const TAB_MESSAGE: &str = "found a tab character that cannot start any token";

/// A scanner error as a [`YamlError::Syntax`]. yaml-rust2 reports a tab in the indentation
/// at the token before it (often the end of the previous line); PyYAML, and this, at the tab.
fn scan_error(text: &str, path: &str, e: &yaml_rust2::ScanError) -> YamlError {
    let (line, col) = (e.marker().line(), e.marker().col() + 1);
    if e.info().contains("tab") {
        if let Some((tab_line, tab_col)) = indentation_tab(text, line) {
            return YamlError::Syntax {
                path: path.into(),
                line: tab_line,
                col: tab_col,
                message: format!("{TAB_MESSAGE} (YAML indents with spaces only)"),
            };
        }
    }
    YamlError::Syntax {
        path: path.into(),
        line,
        col,
        message: e.info().to_string(),
    }
}

/// The first tab in the leading whitespace of a line at or after `from_line` (1-based), as
/// (line, column), both 1-based.
fn indentation_tab(text: &str, from_line: usize) -> Option<(usize, usize)> {
    text.lines()
        .enumerate()
        .skip(from_line.saturating_sub(1))
        .find_map(|(i, l)| {
            l.chars()
                .take_while(|c| *c == ' ' || *c == '\t')
                .position(|c| c == '\t')
                .map(|col| (i + 1, col + 1))
        })
}

/// The text of a mapping key (keys are stored as strings, as OmegaConf prints them).
fn key_text(value: &Value) -> Option<String> {
    Some(match value {
        Value::Str(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        Value::Float(f) => python_float_repr(*f),
        // Python's json module writes True/None keys as "true"/"null".
        Value::Bool(b) => if *b { "true" } else { "false" }.to_string(),
        Value::Null => "null".to_string(),
        Value::Missing => "???".to_string(),
        Value::List(_) | Value::Dict(_) => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Node {
        load_str(text, "test.yaml").unwrap()
    }

    #[test]
    fn lines_are_recorded() {
        let n = load("a: 1\nb:\n  c: 2\n");
        let c = n.select("b.c").unwrap();
        assert_eq!(
            c.origin,
            Origin::File {
                path: "test.yaml".into(),
                line: 3
            }
        );
    }

    #[test]
    fn duplicate_keys_are_rejected() {
        let err = load_str("a: 1\na: 2\n", "dup.yaml").unwrap_err();
        assert!(err.to_string().contains("duplicate key 'a'"), "{err}");
        assert!(err.to_string().contains("dup.yaml:2"), "{err}");
    }

    #[test]
    fn malformed_yaml_names_file_and_line() {
        let err = load_str("a: [1, 2\nb: 3\n", "bad.yaml").unwrap_err();
        assert!(err.to_string().starts_with("bad.yaml:"), "{err}");
    }

    #[test]
    fn unclosed_flow_collection_names_where_it_began() {
        let text = "a: 1\nb: 2\nc: 3\nd: 4\ne: 5\nlist: [1, 2, 3\nother: 4\nmore: 5\n";
        let err = load_str(text, "bad.yaml").unwrap_err().to_string();
        assert!(
            err.contains("while parsing a flow sequence started at line 6, column 7"),
            "{err}"
        );
        assert!(err.contains("closing ']' missing"), "{err}");
        let err = load_str("a: 1\nb: {x: 1, y: 2\nc: 3\n", "bad.yaml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("while parsing a flow mapping started at line 2, column 4"),
            "{err}"
        );
        assert!(!err.contains("while parsing a flow mapping,"), "{err}");
    }

    #[test]
    fn block_error_names_the_enclosing_mapping() {
        let err = load_str("a: 1\nb:\n  - 1\n  - 2\n c: 3\n", "bad.yaml")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("bad.yaml:5:"), "{err}");
        assert!(
            err.contains("while parsing a block mapping started at line 1, column 1"),
            "{err}"
        );
    }

    #[test]
    fn tab_is_reported_where_it_is() {
        for (text, at) in [
            ("model:\n  name: tiny\n\tlayers: 2\n", "bad.yaml:3:1:"),
            ("model:\n  name: tiny\n  \tlayers: 2\n", "bad.yaml:3:3:"),
            ("a: 1\nb:\n\tc: 3\n", "bad.yaml:3:1:"),
        ] {
            let err = load_str(text, "bad.yaml").unwrap_err().to_string();
            assert!(err.starts_with(at), "{text:?}: {err}");
            assert!(err.contains("tab character"), "{err}");
            assert!(!err.contains("while parsing"), "{err}");
        }
    }

    #[test]
    fn merge_keys_and_aliases() {
        let n = load("base: &b\n  x: 1\n  y: 2\nderived:\n  <<: *b\n  y: 3\n");
        assert_eq!(n.select("derived.x").unwrap().value, Value::Int(1));
        assert_eq!(n.select("derived.y").unwrap().value, Value::Int(3));
    }

    #[test]
    fn header_package() {
        let h = parse_header("# @package _global_\na: 1\n", "x").unwrap();
        assert_eq!(h.package.as_deref(), Some("_global_"));
        let h = parse_header("# comment\n# @package foo\n", "x").unwrap();
        assert_eq!(h.package, None);
    }
}
