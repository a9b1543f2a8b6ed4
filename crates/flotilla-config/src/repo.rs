//! The config repository: a config directory on disk, its groups and options, and a cache of
//! loaded config files (parsed once per process, shared by every job of a sweep and by the
//! threads that compose them).

use super::default_element::{parse_defaults_list, InputDefault};
use super::node::{Node, Value};
use super::yaml::{load_str, parse_header};
use super::ConfigError;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// One config file as loaded: its body (without `defaults`), its defaults list and header.
#[derive(Debug)]
pub struct LoadedConfig {
    /// Path of the file as shown to users (relative to the working directory when possible).
    pub display_path: String,
    pub body: Node,
    pub defaults: Vec<InputDefault>,
    /// `# @package` header, normalised as Hydra does (`foo` → `_global_.foo`).
    pub package_header: Option<String>,
}

/// A directory of configs, laid out as Hydra's file config source.
pub struct ConfigRepo {
    root: PathBuf,
    cache: Mutex<HashMap<String, Option<Arc<LoadedConfig>>>>,
    options_cache: Mutex<HashMap<String, Arc<Vec<String>>>>,
    group_cache: Mutex<HashMap<String, bool>>,
}

impl ConfigRepo {
    pub fn new(root: impl Into<PathBuf>) -> ConfigRepo {
        ConfigRepo {
            root: root.into(),
            cache: Mutex::new(HashMap::new()),
            options_cache: Mutex::new(HashMap::new()),
            group_cache: Mutex::new(HashMap::new()),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn file_for(&self, config_path: &str) -> Option<PathBuf> {
        let name = normalize_config_name(config_path);
        let path = self.root.join(&name);
        path.is_file().then_some(path)
    }

    /// True when `config_path` (e.g. `model/tiny`) names a config file.
    pub fn config_exists(&self, config_path: &str) -> bool {
        if let Some(cached) = lock(&self.cache).get(config_path) {
            return cached.is_some();
        }
        self.file_for(config_path).is_some()
    }

    /// True when `group` (e.g. `trainer/dist`) is a directory of the repository.
    pub fn group_exists(&self, group: &str) -> bool {
        let group = group.trim_start_matches('/');
        if group.is_empty() {
            return false;
        }
        if let Some(found) = lock(&self.group_cache).get(group) {
            return *found;
        }
        let exists = self.root.join(group).is_dir();
        lock(&self.group_cache).insert(group.to_string(), exists);
        exists
    }

    /// Every config group of the repository (`compute`, `trainer/dist`, ...): its directories
    /// at any depth, hidden ones excluded, sorted. Read from disk on each call (only error
    /// messages ask for it).
    pub fn group_names(&self) -> Vec<String> {
        fn walk(dir: &Path, prefix: &str, out: &mut Vec<String>) {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return;
            };
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') || !entry.path().is_dir() {
                    continue;
                }
                let group = if prefix.is_empty() {
                    name
                } else {
                    format!("{prefix}/{name}")
                };
                walk(&entry.path(), &group, out);
                out.push(group);
            }
        }
        let mut groups = Vec::new();
        walk(&self.root, "", &mut groups);
        groups.sort();
        groups
    }

    /// The options of a group: its config files without extension, sorted.
    pub fn group_options(&self, group: &str) -> Arc<Vec<String>> {
        let group = group.trim_start_matches('/');
        if let Some(found) = lock(&self.options_cache).get(group) {
            return found.clone();
        }
        let mut options = Vec::new();
        if let Ok(entries) = std::fs::read_dir(self.root.join(group)) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if !entry.path().is_file() {
                    continue;
                }
                if let Some(stem) = name
                    .strip_suffix(".yaml")
                    .or_else(|| name.strip_suffix(".yml"))
                {
                    options.push(stem.to_string());
                }
            }
        }
        options.sort();
        options.dedup();
        let options = Arc::new(options);
        lock(&self.options_cache).insert(group.to_string(), options.clone());
        options
    }

    /// Loads (once) the config at `config_path`; `None` when no such file exists.
    pub fn load(&self, config_path: &str) -> Result<Option<Arc<LoadedConfig>>, ConfigError> {
        if let Some(cached) = lock(&self.cache).get(config_path) {
            return Ok(cached.clone());
        }
        let loaded = match self.file_for(config_path) {
            None => None,
            Some(file) => Some(Arc::new(self.read(config_path, &file)?)),
        };
        lock(&self.cache).insert(config_path.to_string(), loaded.clone());
        Ok(loaded)
    }

    fn read(&self, config_path: &str, file: &Path) -> Result<LoadedConfig, ConfigError> {
        let display_path = display_path(file);
        let text = std::fs::read_to_string(file).map_err(|e| ConfigError::Io {
            path: display_path.clone(),
            message: e.to_string(),
        })?;
        let header = parse_header(&text, &display_path)?;
        let mut body = load_str(&text, &display_path)?;
        // OmegaConf reads a file holding a lone string as a mapping with that key set to null.
        if let Value::Str(key) = &body.value {
            let mut d = super::node::Dict::new();
            d.insert(key.clone(), Node::new(Value::Null, body.origin.clone()));
            body.value = Value::Dict(d);
        }
        let defaults_node = match &mut body.value {
            Value::Dict(d) => d.shift_remove("defaults"),
            _ => {
                return Err(ConfigError::Composition(format!(
                    "{display_path}: a config must be a mapping at the top level, found a {}",
                    body.value.type_name()
                )))
            }
        };
        let defaults = match defaults_node {
            None => Vec::new(),
            Some(node) => parse_defaults_list(&node, config_path, &display_path)?,
        };
        let package_header = header.package.map(|p| {
            if p == "_global_" || p.starts_with("_global_.") {
                p
            } else if p.is_empty() {
                "_global_".to_string()
            } else {
                format!("_global_.{p}")
            }
        });
        Ok(LoadedConfig {
            display_path,
            body,
            defaults,
            package_header,
        })
    }
}

/// Locks a cache. A thread that panicked while holding it left it consistent (every update is
/// one insert), so a poisoned lock is taken as it is.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Adds `.yaml` unless the name already ends in `.yaml` or `.yml` (Hydra's rule).
fn normalize_config_name(name: &str) -> String {
    if name.ends_with(".yaml") || name.ends_with(".yml") {
        name.to_string()
    } else {
        format!("{name}.yaml")
    }
}

/// A path as users should see it: relative to the working directory when it lies below it.
pub fn display_path(path: &Path) -> String {
    if let Ok(cwd) = std::env::current_dir() {
        if let Ok(rel) = path.strip_prefix(&cwd) {
            return rel.display().to_string();
        }
    }
    path.display().to_string()
}
