//! flotilla's own settings, apart from experiment configs: what every user of a cluster would
//! otherwise repeat in each command (account, partition, qos, the sbatch setup lines, where the
//! training task binary is). Layered with figment, later layers winning:
//!
//! built-in defaults < site file (`/etc/flotilla/settings.yaml`, or `$FLOTILLA_SITE_SETTINGS`)
//! < user file (`$XDG_CONFIG_HOME/flotilla/settings.yaml`, else `~/.config/flotilla/...`)
//! < project file (`.flotilla/settings.yaml` in the current directory)
//! < `FLOTILLA_ACCOUNT`, `FLOTILLA_PARTITION`, `FLOTILLA_QOS`, `FLOTILLA_SETUP`,
//!   `FLOTILLA_TRAIN_BINARY`.
//!
//! A job takes a setting only where its config leaves the key unset (null or an empty list,
//! see [`flotilla_config::Fallback`]); the value's origin (file and line, or the variable)
//! shows in `flotilla compose --provenance`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use figment::providers::{Env, Format, Yaml};
use figment::Figment;
use flotilla_config::node::{Node, Origin, Value};
use flotilla_config::{near_miss, Fallback};
use serde::{Deserialize, Serialize};

/// The keys a settings file may hold, and the job config key each one fills.
const KEYS: [(&str, Option<&str>); 5] = [
    ("account", Some("compute.account")),
    ("partition", Some("compute.partition")),
    ("qos", Some("compute.qos")),
    ("setup", Some("compute.setup")),
    ("train_binary", None),
];

/// The variable prefix of the environment layer.
pub const ENV_PREFIX: &str = "FLOTILLA_";

/// The variable that moves the site file (default `/etc/flotilla/settings.yaml`).
pub const SITE_SETTINGS_ENV: &str = "FLOTILLA_SITE_SETTINGS";

/// A settings file that cannot be used; the message names the file (and line).
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("{path}: {message}")]
    Io { path: String, message: String },
    #[error("settings file {0}")]
    Yaml(#[from] flotilla_config::yaml::YamlError),
    #[error("{path}:{line}: unknown setting '{key}'{hint}; known: account, partition, qos, setup, train_binary")]
    UnknownKey {
        path: String,
        line: u32,
        key: String,
        hint: String,
    },
    #[error("settings: {0}")]
    Invalid(String),
}

/// The merged settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub account: Option<String>,
    pub partition: Option<String>,
    pub qos: Option<String>,
    /// Shell lines for the sbatch script; one string is one line.
    #[serde(default, deserialize_with = "one_or_many_lines")]
    pub setup: Vec<String>,
    pub train_binary: Option<PathBuf>,
    /// Where each set value came from, by key.
    #[serde(skip)]
    pub origins: Vec<(String, Origin)>,
}

/// A list of lines, or one line given as a string (`FLOTILLA_SETUP='module load cuda'`).
fn one_or_many_lines<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    struct Lines;
    impl<'de> serde::de::Visitor<'de> for Lines {
        type Value = Vec<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a list of shell lines, or one line as a string")
        }
        fn visit_str<E: serde::de::Error>(self, line: &str) -> Result<Vec<String>, E> {
            Ok(vec![line.to_string()])
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Vec<String>, A::Error> {
            let mut lines = Vec::new();
            while let Some(line) = seq.next_element::<String>()? {
                lines.push(line);
            }
            Ok(lines)
        }
    }
    d.deserialize_any(Lines)
}

/// Where the layers are read from.
#[derive(Clone, Debug)]
pub struct SettingsSources {
    /// Files in increasing priority; a missing file is skipped.
    pub files: Vec<PathBuf>,
    /// Whether the `FLOTILLA_*` variables form the last layer.
    pub environment: bool,
}

impl SettingsSources {
    /// The standard layers for this process: site, user and project files, then the
    /// environment.
    pub fn standard() -> SettingsSources {
        let site = std::env::var_os(SITE_SETTINGS_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/etc/flotilla/settings.yaml"));
        let user_config = std::env::var_os("XDG_CONFIG_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")));
        let mut files = vec![site];
        files.extend(user_config.map(|c| c.join("flotilla/settings.yaml")));
        files.push(PathBuf::from(".flotilla/settings.yaml"));
        SettingsSources {
            files,
            environment: true,
        }
    }
}

impl Settings {
    /// Reads and merges the layers. A malformed file or an unknown key is an error naming the
    /// file and line.
    pub fn load(sources: &SettingsSources) -> Result<Settings, SettingsError> {
        let mut figment = Figment::new();
        let mut origins: Vec<(String, Origin)> = Vec::new();
        for path in &sources.files {
            let Some(node) = read_layer(path)? else {
                continue;
            };
            figment = figment.merge(Yaml::file_exact(path));
            if let Value::Dict(d) = &node.value {
                for (key, value) in d {
                    set_origin(&mut origins, key, value.origin.clone());
                }
            }
        }
        if sources.environment {
            let env = Env::prefixed(ENV_PREFIX).only(&KEYS.map(|(k, _)| k));
            for (key, _) in env.iter() {
                let var = format!("{ENV_PREFIX}{}", key.as_str().to_ascii_uppercase());
                set_origin(&mut origins, key.as_str(), environment_origin(&var));
            }
            figment = figment.merge(env);
        }
        let mut settings: Settings = figment
            .extract()
            .map_err(|e| SettingsError::Invalid(e.to_string()))?;
        settings.origins = origins;
        Ok(settings)
    }

    /// The job config values these settings provide, each with its origin.
    pub fn fallbacks(&self) -> Vec<Fallback> {
        let mut out = Vec::new();
        for (key, target) in KEYS {
            let Some(target) = target else { continue };
            let origin = self.origin(key);
            let value = match key {
                "account" => self.account.clone().map(Value::Str),
                "partition" => self.partition.clone().map(Value::Str),
                "qos" => self.qos.clone().map(Value::Str),
                "setup" => (!self.setup.is_empty()).then(|| {
                    Value::List(
                        self.setup
                            .iter()
                            .map(|line| Node::new(Value::Str(line.clone()), origin.clone()))
                            .collect(),
                    )
                }),
                _ => None,
            };
            if let Some(value) = value {
                out.push(Fallback {
                    key: target.to_string(),
                    value: Node::new(value, origin),
                });
            }
        }
        out
    }

    /// Where `key` was set.
    pub fn origin(&self, key: &str) -> Origin {
        self.origins
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, o)| o.clone())
            .unwrap_or_default()
    }
}

/// One settings file as a mapping, checked for syntax and unknown keys; `None` when it does
/// not exist.
fn read_layer(path: &Path) -> Result<Option<Node>, SettingsError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(SettingsError::Io {
                path: path.display().to_string(),
                message: format!("cannot read the settings file: {e}"),
            })
        }
    };
    let shown = path.display().to_string();
    let node = flotilla_config::yaml::load_str(&text, &shown)?;
    let Value::Dict(d) = &node.value else {
        return Err(SettingsError::Io {
            path: shown,
            message: format!(
                "a settings file is a mapping of settings, found a {}",
                node.value.type_name()
            ),
        });
    };
    for (key, value) in d {
        if !KEYS.iter().any(|(k, _)| k == key) {
            let line = match &value.origin {
                Origin::File { line, .. } => *line,
                _ => 0,
            };
            return Err(SettingsError::UnknownKey {
                path: shown,
                line,
                key: key.clone(),
                hint: near_miss(key, KEYS.map(|(k, _)| k))
                    .map(|k| format!(" (did you mean '{k}'?)"))
                    .unwrap_or_default(),
            });
        }
    }
    Ok(Some(node))
}

fn set_origin(origins: &mut Vec<(String, Origin)>, key: &str, origin: Origin) {
    origins.push((key.to_string(), origin));
}

/// The origin shown for a value from the environment.
fn environment_origin(var: &str) -> Origin {
    Origin::File {
        path: Arc::from(format!("environment variable {var}")),
        line: 0,
    }
}
