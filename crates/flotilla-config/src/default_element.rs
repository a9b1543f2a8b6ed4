//! Default elements: one entry of a config's `defaults` list (Hydra's `InputDefault`, from
//! `hydra/core/default_element.py`) and the parsing of a `defaults` node into them.
//!
//! This module knows nothing of the config repository or of how defaults lists are expanded;
//! [`crate::repo`] parses each file's list with it and [`crate::defaults`] expands them.

use super::node::{Node, Value};
use super::ConfigError;

/// The choice of a group entry: one option, several, or none (`null`).
#[derive(Clone, Debug, PartialEq)]
pub enum GroupValue {
    Null,
    Name(String),
    Options(Vec<String>),
}

#[derive(Clone, Debug, PartialEq)]
pub enum DefaultKind {
    /// `- path/to/config` or `- _self_`.
    Config { path: String },
    /// `- group: option`.
    Group { group: String, value: GroupValue },
}

/// One entry of a defaults list (Hydra's InputDefault).
#[derive(Clone, Debug, PartialEq)]
pub struct InputDefault {
    pub kind: DefaultKind,
    /// Explicit `@package` of the entry (`_here_` already mapped to "").
    pub package: Option<String>,
    pub package_header: Option<String>,
    pub parent_base_dir: Option<String>,
    pub parent_package: Option<String>,
    pub primary: bool,
    pub optional: bool,
    pub is_override: bool,
    pub deleted: bool,
    pub external_append: bool,
}

impl InputDefault {
    fn new(kind: DefaultKind, package: Option<String>) -> InputDefault {
        let package = package.map(|p| if p == "_here_" { String::new() } else { p });
        InputDefault {
            kind,
            package,
            package_header: None,
            parent_base_dir: None,
            parent_package: None,
            primary: false,
            optional: false,
            is_override: false,
            deleted: false,
            external_append: false,
        }
    }

    pub fn config(path: &str, package: Option<String>) -> InputDefault {
        InputDefault::new(
            DefaultKind::Config {
                path: path.to_string(),
            },
            package,
        )
    }

    pub fn group(group: &str, value: GroupValue, package: Option<String>) -> InputDefault {
        InputDefault::new(
            DefaultKind::Group {
                group: group.to_string(),
                value,
            },
            package,
        )
    }

    pub fn is_self(&self) -> bool {
        match &self.kind {
            DefaultKind::Config { path } => path == "_self_",
            DefaultKind::Group { value, .. } => {
                matches!(value, GroupValue::Name(n) if n == "_self_")
            }
        }
    }

    pub(crate) fn is_group(&self) -> bool {
        matches!(self.kind, DefaultKind::Group { .. })
    }

    pub(crate) fn update_parent(&mut self, parent_base_dir: &str, parent_package: &str) {
        self.parent_base_dir = Some(parent_base_dir.to_string());
        self.parent_package = Some(parent_package.to_string());
        if let Some(pkg) = &self.package {
            if pkg.contains("_group_") {
                let resolved = pkg.replace("_group_", &self.default_package());
                self.package = Some(format!("_global_.{resolved}"));
            }
        }
    }

    fn base_dir(&self) -> &str {
        self.parent_base_dir.as_deref().unwrap_or("")
    }

    pub fn group_path(&self) -> String {
        match &self.kind {
            DefaultKind::Group { group, .. } => {
                if let Some(abs) = group.strip_prefix('/') {
                    abs.to_string()
                } else if self.base_dir().is_empty() {
                    group.clone()
                } else {
                    format!("{}/{}", self.base_dir(), group)
                }
            }
            DefaultKind::Config { path } => {
                let (rel, absolute) = match path.strip_prefix('/') {
                    Some(p) => (p, true),
                    None => (path.as_str(), false),
                };
                let group = rel.rfind('/').map(|i| &rel[..i]).unwrap_or("");
                if absolute || self.base_dir().is_empty() {
                    group.to_string()
                } else if group.is_empty() {
                    self.base_dir().to_string()
                } else {
                    format!("{}/{}", self.base_dir(), group)
                }
            }
        }
    }

    /// The config's name (`None` for a `null` group choice or an options list).
    pub fn name(&self) -> Option<String> {
        match &self.kind {
            DefaultKind::Config { path } => {
                Some(path.rsplit('/').next().unwrap_or(path).to_string())
            }
            DefaultKind::Group { value, .. } => match value {
                GroupValue::Name(n) => Some(n.clone()),
                _ => None,
            },
        }
    }

    pub fn config_path(&self) -> String {
        match &self.kind {
            DefaultKind::Group { .. } => {
                format!("{}/{}", self.group_path(), self.name().unwrap_or_default())
            }
            DefaultKind::Config { path } => match path.strip_prefix('/') {
                Some(abs) => abs.to_string(),
                None if self.base_dir().is_empty() => path.clone(),
                None => format!("{}/{}", self.base_dir(), path),
            },
        }
    }

    fn default_package(&self) -> String {
        self.group_path().replace('/', ".")
    }

    fn relative_group_path(&self) -> String {
        match &self.kind {
            DefaultKind::Group { group, .. } => group.trim_start_matches('/').to_string(),
            DefaultKind::Config { path } => {
                let rel = path.trim_start_matches('/');
                rel.rfind('/')
                    .map(|i| rel[..i].to_string())
                    .unwrap_or_default()
            }
        }
    }

    fn package(&self, default_to_header: bool) -> Option<String> {
        if self.package.is_none() && default_to_header {
            self.package_header.clone()
        } else {
            self.package.clone()
        }
    }

    /// The package the config's body lands in (dotted; "" is the root).
    pub fn final_package(&self, default_to_header: bool) -> String {
        let parent_package = self.parent_package.as_deref().unwrap_or("");
        let package = self
            .package(default_to_header)
            .unwrap_or_else(|| self.relative_group_path().replace('/', "."));
        let full = if parent_package.is_empty() {
            package
        } else if package.is_empty() {
            parent_package.to_string()
        } else {
            format!("{parent_package}.{package}")
        };
        match full.rfind("_global_") {
            None => full,
            Some(i) => full
                .get(i + "_global_".len() + 1..)
                .unwrap_or("")
                .to_string(),
        }
    }

    /// The key a command-line override uses for this entry (`group` or `group@pkg`).
    pub fn override_key(&self) -> String {
        let default_pkg = self.default_package();
        let mut final_pkg = self.final_package(false);
        let mut key = self.group_path();
        if default_pkg != final_pkg {
            if final_pkg.is_empty() {
                final_pkg = "_global_".into();
            }
            key = format!("{key}@{final_pkg}");
        }
        key
    }

    pub fn is_missing(&self) -> bool {
        match &self.kind {
            DefaultKind::Config { .. } => self.name().as_deref() == Some("???"),
            DefaultKind::Group { value, .. } => matches!(value, GroupValue::Name(n) if n == "???"),
        }
    }

    pub(crate) fn is_interpolation(&self) -> bool {
        match &self.kind {
            DefaultKind::Config { .. } => self.config_path().contains("${"),
            DefaultKind::Group { value, .. } => {
                matches!(value, GroupValue::Name(n) if n.contains("${"))
            }
        }
    }

    pub(crate) fn is_options(&self) -> bool {
        matches!(
            self.kind,
            DefaultKind::Group {
                value: GroupValue::Options(_),
                ..
            }
        )
    }
}

/// Parses the `defaults` node of a config file.
pub fn parse_defaults_list(
    node: &Node,
    config_path: &str,
    display_path: &str,
) -> Result<Vec<InputDefault>, ConfigError> {
    let bad = |line: u32, message: String| {
        ConfigError::Composition(format!("{display_path}:{line}: {message}"))
    };
    let line_of = |n: &Node| match &n.origin {
        super::node::Origin::File { line, .. } => *line,
        _ => 0,
    };
    let items = match &node.value {
        Value::List(items) => items,
        other => {
            let kind = match other {
                Value::Dict(_) => "mapping",
                other => other.type_name(),
            };
            return Err(bad(
                line_of(node),
                format!("invalid defaults list in '{config_path}', defaults must be a list (got {kind})"),
            ));
        }
    };
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let line = line_of(item);
        match &item.value {
            Value::Str(entry) => {
                let (path, package) = split_group_package(entry);
                out.push(InputDefault::config(path, package));
            }
            Value::Dict(d) => {
                if d.len() != 1 {
                    return Err(bad(
                        line,
                        if d.is_empty() {
                            "missing group name in a defaults entry".into()
                        } else {
                            format!(
                                "too many keys in defaults entry {{{}}}; write one 'group: option' per entry",
                                d.keys().cloned().collect::<Vec<_>>().join(", ")
                            )
                        },
                    ));
                }
                let (key, value) = d.first().expect("one entry");
                let (group_with_keywords, package) = split_group_package(key);
                let mut words: Vec<&str> = group_with_keywords.split(' ').collect();
                let group = words.pop().unwrap_or_default();
                let mut optional = false;
                let mut is_override = false;
                for w in words {
                    match w {
                        "optional" => optional = true,
                        "override" => is_override = true,
                        _ => break,
                    }
                }
                let value = match &value.value {
                    Value::Null => GroupValue::Null,
                    Value::Str(s) => GroupValue::Name(s.clone()),
                    Value::Missing => GroupValue::Name("???".into()),
                    Value::List(options) => {
                        let mut names = Vec::with_capacity(options.len());
                        for o in options {
                            match &o.value {
                                Value::Str(s) => names.push(s.clone()),
                                other => {
                                    return Err(bad(
                                        line,
                                        format!(
                                            "unsupported item value in defaults: {}, nested list items must be strings",
                                            python_type(other)
                                        ),
                                    ))
                                }
                            }
                        }
                        GroupValue::Options(names)
                    }
                    other => {
                        return Err(bad(
                            line,
                            format!(
                                "unsupported item value in defaults: {} (for '{key}'). Supported: string or list",
                                python_type(other)
                            ),
                        ))
                    }
                };
                if group.is_empty() {
                    return Err(bad(line, "missing group name in a defaults entry".into()));
                }
                let mut d = InputDefault::group(group, value, package);
                d.optional = optional;
                d.is_override = is_override;
                out.push(d);
            }
            other => {
                return Err(bad(
                    line,
                    format!("unsupported type in defaults: {}", python_type(other)),
                ))
            }
        }
    }
    Ok(out)
}

pub(crate) fn python_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "NoneType",
        Value::Bool(_) => "bool",
        Value::Int(_) => "int",
        Value::Float(_) => "float",
        Value::Str(_) | Value::Missing => "str",
        Value::List(_) => "ListConfig",
        Value::Dict(_) => "DictConfig",
    }
}

/// `group@package` → (`group`, Some(`package`)). A Hydra 1.0 rename (`pkg1:pkg2`) keeps `pkg1`.
fn split_group_package(text: &str) -> (&str, Option<String>) {
    match text.find('@') {
        None => (text, None),
        Some(i) => {
            let pkg = &text[i + 1..];
            let pkg = pkg.split(':').next().unwrap_or(pkg);
            (&text[..i], Some(pkg.to_string()))
        }
    }
}
