//! Defaults lists: parsing them from config files and expanding them, with the command-line
//! group overrides, into the ordered list of configs to merge (Hydra 1.3's defaults tree).
//!
//! The expansion mirrors Hydra's: a tree is built from the primary config, each config's
//! defaults visited in reverse so that `override` entries deeper in the list take effect on
//! entries above them; `_self_` marks where a config's own body is merged (appended last when
//! absent); packages come from `@pkg`, then the `# @package` header, then the group path.

use super::default_element::python_type;
pub use super::default_element::{parse_defaults_list, DefaultKind, GroupValue, InputDefault};
use super::node::Value;
use super::overrides::Override;
use super::repo::ConfigRepo;
use super::ConfigError;
use indexmap::IndexMap;
use std::collections::{BTreeSet, HashMap};

/// One config to merge, in order (Hydra's ResultDefault).
#[derive(Clone, Debug, PartialEq)]
pub struct ResultDefault {
    pub config_path: String,
    pub package: String,
    pub is_self: bool,
    pub primary: bool,
    pub override_key: Option<String>,
    pub parent: Option<String>,
}

#[derive(Debug)]
struct OverrideMetadata {
    external: bool,
    containing_config_path: Option<String>,
    used: bool,
}

#[derive(Debug)]
struct Deletion {
    name: Option<String>,
    used: bool,
}

/// The command-line overrides, split as Hydra splits them: group choices, appended groups,
/// deletions, and plain config overrides (applied after merging).
#[derive(Debug, Default)]
pub struct GroupOverrides {
    choices: IndexMap<String, GroupValue>,
    metadata: IndexMap<String, OverrideMetadata>,
    append: Vec<InputDefault>,
    deletions: IndexMap<String, Deletion>,
    /// `override_key` → chosen option name, for every group entry met (hydra.runtime.choices).
    pub known_choices: IndexMap<String, Option<String>>,
    known_choices_per_group: HashMap<String, BTreeSet<String>>,
    /// Overrides that change config values rather than defaults.
    pub config_overrides: Vec<Override>,
    /// The overrides that shape the defaults list (group choices, additions, deletions),
    /// verbatim and in order: two compositions with equal keys merge the same configs.
    pub defaults_key: Vec<String>,
}

impl GroupOverrides {
    pub fn new(repo: &ConfigRepo, overrides: &[Override]) -> Result<GroupOverrides, ConfigError> {
        let mut out = GroupOverrides::default();
        for o in overrides {
            if o.is_sweep() {
                continue;
            }
            let value = o.value();
            let is_dict = matches!(value, Some(Value::Dict(_)));
            let is_group = repo.group_exists(&o.key_or_group);
            if is_dict || !is_group {
                out.config_overrides.push(o.clone());
                continue;
            }
            out.defaults_key.push(o.input.clone());
            if o.is_force_add() {
                return Err(ConfigError::Composition(format!(
                    "force-add of config groups is not supported: '{}'",
                    o.input
                )));
            }
            if o.is_delete() {
                let key = o.key_element()[1..].to_string();
                let name = match value {
                    None => None,
                    Some(Value::Str(s)) => Some(s),
                    Some(other) => {
                        return Err(ConfigError::Override(format!(
                            "'{}': a config group deletion value must be a string, got {}",
                            o.input,
                            other.type_name()
                        )))
                    }
                };
                out.deletions.insert(key, Deletion { name, used: false });
                continue;
            }
            let group_value = match value {
                Some(Value::Str(s)) => GroupValue::Name(s),
                Some(Value::List(items)) => {
                    let mut names = Vec::new();
                    for item in items {
                        match item.value {
                            Value::Str(s) => names.push(s),
                            other => {
                                return Err(ConfigError::Override(format!(
                                    "'{}': config group options must be strings, got {}",
                                    o.input,
                                    other.type_name()
                                )))
                            }
                        }
                    }
                    GroupValue::Options(names)
                }
                other => {
                    let got = other.map(|v| python_type(&v)).unwrap_or("NoneType");
                    return Err(ConfigError::Override(format!(
                        "'{}': config group override must be a string or a list, got {got}{}",
                        o.input,
                        if got == "NoneType" {
                            format!(
                                " (to remove the group from the defaults list use ~{})",
                                o.key_or_group
                            )
                        } else {
                            String::new()
                        }
                    )));
                }
            };
            if o.is_add() {
                let mut d = InputDefault::group(&o.key_or_group, group_value, o.package.clone());
                d.external_append = true;
                out.append.push(d);
            } else {
                let key = o.key_element();
                out.choices.insert(key.clone(), group_value);
                out.metadata.insert(
                    key,
                    OverrideMetadata {
                        external: true,
                        containing_config_path: None,
                        used: false,
                    },
                );
            }
        }
        Ok(out)
    }

    fn add_override(&mut self, parent_config_path: &str, d: &InputDefault) {
        let key = d.override_key();
        if self.choices.contains_key(&key) {
            return;
        }
        if let DefaultKind::Group { value, .. } = &d.kind {
            self.choices.insert(key.clone(), value.clone());
            self.metadata.insert(
                key,
                OverrideMetadata {
                    external: false,
                    containing_config_path: Some(parent_config_path.to_string()),
                    used: false,
                },
            );
        }
    }

    fn is_overridden(&self, d: &InputDefault) -> bool {
        d.is_group() && self.choices.contains_key(&d.override_key())
    }

    fn override_default_option(&mut self, d: &mut InputDefault) {
        let key = d.override_key();
        if let Some(v) = self.choices.get(&key) {
            if let DefaultKind::Group { value, .. } = &mut d.kind {
                *value = v.clone();
            }
            if let Some(m) = self.metadata.get_mut(&key) {
                m.used = true;
            }
        }
    }

    fn set_known_choice(&mut self, d: &InputDefault) -> Result<(), ConfigError> {
        if !d.is_group() {
            return Ok(());
        }
        let key = d.override_key();
        let name = d.name();
        match self.known_choices.get(&key) {
            None => {
                self.known_choices.insert(key.clone(), name);
            }
            Some(prev) if *prev != name => {
                return Err(ConfigError::Composition(format!(
                    "multiple values for {key}. To override a value use 'override {key}: {}'",
                    prev.clone().unwrap_or_else(|| "null".into())
                )));
            }
            Some(_) => {}
        }
        self.known_choices_per_group
            .entry(d.group_path())
            .or_default()
            .insert(key);
        Ok(())
    }

    fn is_deleted(&self, d: &InputDefault) -> bool {
        if !d.is_group() {
            return false;
        }
        match self.deletions.get(&d.override_key()) {
            None => false,
            Some(del) => match &del.name {
                None => true,
                Some(n) => Some(n) == d.name().as_ref(),
            },
        }
    }

    fn delete(&mut self, d: &mut InputDefault) {
        d.deleted = true;
        if let Some(del) = self.deletions.get_mut(&d.override_key()) {
            del.used = true;
        }
    }

    fn ensure_used(&self) -> Result<(), ConfigError> {
        for (key, meta) in &self.metadata {
            if meta.used {
                continue;
            }
            let group = key.split('@').next().unwrap_or(key);
            let choices = self.known_choices_per_group.get(group);
            let mut msg = match choices.map(|c| c.len()).unwrap_or(0) {
                0 => format!("could not override '{key}': no match in the defaults list"),
                1 => format!(
                    "could not override '{key}': did you mean to override {}?",
                    choices.unwrap().iter().next().unwrap()
                ),
                _ => format!(
                    "could not override '{key}': did you mean to override one of {}?",
                    choices
                        .unwrap()
                        .iter()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            if let Some(p) = &meta.containing_config_path {
                msg = format!("in '{p}': {msg}");
            }
            if meta.external {
                let value = match &self.choices[key] {
                    GroupValue::Name(n) => n.clone(),
                    GroupValue::Options(o) => format!("[{}]", o.join(",")),
                    GroupValue::Null => "null".into(),
                };
                msg.push_str(&format!(
                    "\nTo append to your defaults list use +{key}={value}"
                ));
            }
            return Err(ConfigError::Composition(msg));
        }
        for (key, del) in &self.deletions {
            if !del.used {
                let desc = match &del.name {
                    Some(n) => format!("{key}={n}"),
                    None => key.clone(),
                };
                return Err(ConfigError::Composition(format!(
                    "could not delete '{desc}': no match in the defaults list"
                )));
            }
        }
        Ok(())
    }
}

enum Child {
    Leaf(InputDefault),
    Tree(TreeNode),
}

struct TreeNode {
    node: InputDefault,
    children: Option<Vec<Child>>,
}

/// Builds the ordered list of configs to merge for `config_name`.
pub struct DefaultsBuilder<'r> {
    repo: &'r ConfigRepo,
    skip_missing: bool,
    /// Guards against a config that (indirectly) includes itself.
    stack: Vec<String>,
}

impl<'r> DefaultsBuilder<'r> {
    pub fn new(repo: &'r ConfigRepo, skip_missing: bool) -> Self {
        DefaultsBuilder {
            repo,
            skip_missing,
            stack: Vec::new(),
        }
    }

    pub fn build(
        &mut self,
        config_name: &str,
        overrides: &mut GroupOverrides,
    ) -> Result<Vec<ResultDefault>, ConfigError> {
        let mut primary = InputDefault::config(config_name, None);
        primary.primary = true;
        let root = TreeNode {
            node: primary,
            children: None,
        };
        let tree = self.expand(root, true, false, overrides, None)?;
        let mut out = Vec::new();
        collect(&tree, None, &mut out);
        let mut seen = BTreeSet::new();
        for r in &out {
            if r.is_self {
                continue;
            }
            if let Some(k) = &r.override_key {
                if !seen.insert(k.clone()) {
                    return Err(ConfigError::Composition(format!(
                        "{k} appears more than once in the final defaults list"
                    )));
                }
            }
        }
        overrides.ensure_used()?;
        Ok(out)
    }

    fn expand(
        &mut self,
        mut root: TreeNode,
        is_root_config: bool,
        interpolated_subtree: bool,
        overrides: &mut GroupOverrides,
        parent_config_path: Option<&str>,
    ) -> Result<TreeNode, ConfigError> {
        if is_root_config {
            root.node.update_parent("", "");
            if !self.repo.config_exists(&root.node.config_path()) {
                return Err(self.not_found(&root.node, parent_config_path));
            }
        }
        // Package header (loads the config; the repository caches it).
        if !root.node.is_missing() && root.node.name().is_some() {
            if let Some(loaded) = self.repo.load(&root.node.config_path())? {
                if root.node.package_header.is_none() {
                    root.node.package_header = loaded.package_header.clone();
                }
            }
        }
        if overrides.is_deleted(&root.node) {
            overrides.delete(&mut root.node);
            return Ok(root);
        }
        overrides.set_known_choice(&root.node)?;
        if root.node.name().is_none() {
            return Ok(root);
        }
        if root.node.is_missing() {
            if self.skip_missing {
                return Ok(root);
            }
            return Err(self.missing_choice(&root.node));
        }
        let path = root.node.config_path();
        let loaded = match self.repo.load(&path)? {
            Some(l) => l,
            None => {
                if root.node.optional {
                    root.node.deleted = true;
                    return Ok(root);
                }
                return Err(self.not_found(&root.node, parent_config_path));
            }
        };
        if self.stack.contains(&path) {
            return Err(ConfigError::Composition(format!(
                "cycle in the defaults lists: {} -> {path}",
                self.stack.join(" -> ")
            )));
        }
        let mut defaults = loaded.defaults.clone();
        if !defaults.is_empty() || (is_root_config && !overrides.append.is_empty()) {
            validate_self(&root.node, &mut defaults, &loaded.display_path)?;
        }
        if is_root_config {
            defaults.extend(overrides.append.iter().cloned());
        }
        self.update_overrides(&mut defaults, overrides, &root.node, interpolated_subtree)?;

        let parent_group = root.node.group_path();
        let parent_package = root.node.final_package(true);
        self.stack.push(path.clone());
        let mut children: Vec<Child> = Vec::new();
        for mut d in defaults.iter().rev().cloned() {
            if d.is_self() {
                children.push(Child::Leaf(d));
                continue;
            }
            if d.is_override {
                continue;
            }
            d.update_parent(&parent_group, &parent_package);
            if overrides.is_overridden(&d) {
                overrides.override_default_option(&mut d);
            }
            if d.is_options() {
                let (group, options) = match &d.kind {
                    DefaultKind::Group {
                        group,
                        value: GroupValue::Options(o),
                    } => (group.clone(), o.clone()),
                    _ => unreachable!("checked by is_options"),
                };
                for item in options.iter().rev() {
                    if item.contains("${") {
                        return Err(ConfigError::Composition(format!(
                            "in '{path}': defaults list interpolation is not supported in options list items"
                        )));
                    }
                    let mut node =
                        InputDefault::config(&format!("{group}/{item}"), d.package.clone());
                    node.optional = d.optional;
                    node.update_parent(&parent_group, &parent_package);
                    self.add_child(&mut children, node, interpolated_subtree, overrides, &path)?;
                }
            } else if d.is_interpolation() {
                children.push(Child::Leaf(d));
            } else {
                self.add_child(&mut children, d, interpolated_subtree, overrides, &path)?;
            }
        }

        // Deferred interpolations (`db_schema: ${db}`) resolve against the known choices.
        for child in children.iter_mut() {
            let needs = matches!(child, Child::Leaf(d) if !d.is_self() && d.is_interpolation());
            if !needs {
                continue;
            }
            let placeholder = Child::Leaf(InputDefault::config("_self_", None));
            let Child::Leaf(mut d) = std::mem::replace(child, placeholder) else {
                unreachable!("checked above")
            };
            resolve_default_interpolation(&mut d, overrides)?;
            d.update_parent(&parent_group, &parent_package);
            let subtree = self.expand(
                TreeNode {
                    node: d,
                    children: None,
                },
                false,
                true,
                overrides,
                Some(&path),
            )?;
            *child = if subtree.children.is_some() {
                Child::Tree(subtree)
            } else {
                Child::Leaf(subtree.node)
            };
        }
        self.stack.pop();
        if !children.is_empty() {
            children.reverse();
            root.children = Some(children);
        }
        Ok(root)
    }

    fn add_child(
        &mut self,
        children: &mut Vec<Child>,
        node: InputDefault,
        interpolated_subtree: bool,
        overrides: &mut GroupOverrides,
        parent_path: &str,
    ) -> Result<(), ConfigError> {
        let subtree = self.expand(
            TreeNode {
                node,
                children: None,
            },
            false,
            interpolated_subtree,
            overrides,
            Some(parent_path),
        )?;
        children.push(if subtree.children.is_some() {
            Child::Tree(subtree)
        } else {
            Child::Leaf(subtree.node)
        });
        Ok(())
    }

    fn update_overrides(
        &self,
        defaults: &mut [InputDefault],
        overrides: &mut GroupOverrides,
        parent: &InputDefault,
        interpolated_subtree: bool,
    ) -> Result<(), ConfigError> {
        let parent_group = parent.group_path();
        let parent_package = parent.final_package(true);
        let parent_path = parent.config_path();
        let mut last_override: Option<InputDefault> = None;
        for d in defaults.iter_mut() {
            if d.is_self() {
                continue;
            }
            d.update_parent(&parent_group, &parent_package);
            if let Some(prev) = &last_override {
                if !(d.is_override || d.external_append) {
                    return Err(ConfigError::Composition(format!(
                        "in {parent_path}: override '{} : {}' is defined before '{}: {}'. Overrides must be at the end of the defaults list",
                        prev.override_key(),
                        prev.name().unwrap_or_default(),
                        d.override_key(),
                        d.name().unwrap_or_default()
                    )));
                }
            }
            if d.is_group() && d.is_override {
                last_override = Some(d.clone());
                if interpolated_subtree {
                    return Err(ConfigError::Composition(format!(
                        "{parent_path}: defaults list overrides are not allowed in the subtree of an interpolated config group (override {}={})",
                        d.override_key(),
                        d.name().unwrap_or_default()
                    )));
                }
                overrides.add_override(&parent_path, d);
            }
        }
        Ok(())
    }

    fn not_found(&self, d: &InputDefault, parent: Option<&str>) -> ConfigError {
        let root = self.repo.root().display();
        if d.primary {
            return ConfigError::Composition(format!(
                "cannot find primary config '{}' in {root}; check --config-dir and --config-name",
                d.config_path()
            ));
        }
        let mut msg = if d.is_group() {
            let group = d.group_path();
            let options = self.repo.group_options(&group);
            let name = d.name().unwrap_or_default();
            let mut m = format!("could not find '{}'", d.config_path());
            if let Some(near) = super::near_miss(&name, options.iter().map(|s| s.as_str())) {
                m.push_str(&format!(" (did you mean '{group}={near}'?)"));
            }
            if !options.is_empty() {
                m.push_str(&format!(
                    "\nAvailable options in '{group}': {}",
                    options.join(", ")
                ));
            } else if !self.repo.group_exists(&group) {
                m.push_str(&format!("\nThere is no config group '{group}' in {root}"));
            }
            m
        } else {
            format!("could not load '{}'", d.config_path())
        };
        if let Some(p) = parent {
            msg = format!("in '{p}': {msg}");
        }
        ConfigError::Composition(msg)
    }

    fn missing_choice(&self, d: &InputDefault) -> ConfigError {
        if !d.is_group() {
            return ConfigError::Composition(format!(
                "missing config in defaults list is not supported: {}",
                d.config_path()
            ));
        }
        let key = d.override_key();
        let options = self.repo.group_options(&d.group_path());
        ConfigError::Composition(format!(
            "you must specify '{key}', e.g. {key}=<OPTION>\nAvailable options: {}",
            options.join(", ")
        ))
    }
}

/// Checks `_self_` appears at most once; appends it when absent.
fn validate_self(
    containing: &InputDefault,
    defaults: &mut Vec<InputDefault>,
    display_path: &str,
) -> Result<(), ConfigError> {
    let mut has_self = false;
    let mut has_non_override = false;
    for d in defaults.iter() {
        if !d.is_override {
            has_non_override = true;
        }
        if d.is_self() {
            if has_self {
                return Err(ConfigError::Composition(format!(
                    "duplicate _self_ defined in {} ({display_path})",
                    containing.config_path()
                )));
            }
            has_self = true;
        }
    }
    if (!has_self && has_non_override) || defaults.is_empty() {
        defaults.push(InputDefault::config("_self_", None));
    }
    Ok(())
}

fn resolve_default_interpolation(
    d: &mut InputDefault,
    overrides: &GroupOverrides,
) -> Result<(), ConfigError> {
    let lookup = |key: &str| -> Option<String> {
        overrides
            .known_choices
            .get(key)
            .map(|v| v.clone().unwrap_or_else(|| "None".into()))
    };
    let text = match &d.kind {
        DefaultKind::Config { .. } => d.config_path(),
        DefaultKind::Group { value, .. } => match value {
            GroupValue::Name(n) => n.clone(),
            _ => return Ok(()),
        },
    };
    let mut out = String::new();
    let mut rest = text.as_str();
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            return Err(interp_error(&text, overrides));
        };
        let key = after[..end].trim();
        match lookup(key) {
            Some(v) => out.push_str(&v),
            None => return Err(interp_error(&text, overrides)),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    match &mut d.kind {
        DefaultKind::Config { path } => {
            // The resolved text is a config path relative to the root.
            *path = format!("/{out}");
        }
        DefaultKind::Group { value, .. } => *value = GroupValue::Name(out),
    }
    Ok(())
}

fn interp_error(text: &str, overrides: &GroupOverrides) -> ConfigError {
    let keys: Vec<&str> = overrides.known_choices.keys().map(|s| s.as_str()).collect();
    if keys.is_empty() {
        ConfigError::Composition(format!("error resolving interpolation '{text}'"))
    } else {
        ConfigError::Composition(format!(
            "error resolving interpolation '{text}', possible interpolation keys: {}",
            keys.join(", ")
        ))
    }
}

fn collect(tree: &TreeNode, parent: Option<&TreeNode>, out: &mut Vec<ResultDefault>) {
    match &tree.children {
        None => visit(parent, &tree.node, out),
        Some(children) if children.is_empty() => visit(parent, &tree.node, out),
        Some(children) => {
            for child in children {
                match child {
                    Child::Leaf(d) => visit(Some(tree), d, out),
                    Child::Tree(t) => collect(t, Some(tree), out),
                }
            }
        }
    }
}

fn visit(tree: Option<&TreeNode>, node: &InputDefault, out: &mut Vec<ResultDefault>) {
    if node.deleted || node.is_missing() || node.name().is_none() {
        return;
    }
    let result = if node.is_self() {
        let Some(tree) = tree else { return };
        ResultDefault {
            config_path: tree.node.config_path(),
            package: tree.node.final_package(true),
            is_self: true,
            primary: tree.node.primary,
            override_key: None,
            parent: None,
        }
    } else {
        ResultDefault {
            config_path: node.config_path(),
            package: node.final_package(true),
            is_self: false,
            primary: node.primary,
            override_key: node.is_group().then(|| node.override_key()),
            parent: tree.map(|t| t.node.config_path()),
        }
    };
    out.push(result);
}
