//! `flotilla diff`: the config values that differ between two jobs, each side with where its
//! value came from. Values are read from each job's resolved `config.yaml` (what the job really
//! ran with); where each came from (`conf/model/tiny.yaml:3`, an override) is found by composing
//! the job again from the copy of the config directory kept with it and its saved overrides.
//! When that is not possible (an older run without a copy, an environment variable that is gone)
//! the side falls back to the line of its `config.yaml` and says why.

use flotilla_config::node::to_json as node_json;
use flotilla_config::{Fallback, Node, Value};
use flotilla_launch::rundir::snapshot::SavedJob;
use flotilla_launch::rundir::{load_job_config_tree, Meta, CONFIG_FILE};
use indexmap::IndexMap;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    #[error("{}: a sweep directory; give one of its job directories (e.g. {})", path.display(), path.join("0").display())]
    SweepDir { path: PathBuf },
    #[error("{}: no readable {CONFIG_FILE}; give a job directory written by `flotilla run` (a sweep's job is one of its sub-directories)", path.display())]
    NoConfig { path: PathBuf },
}

/// One side's value of a key.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Side {
    /// The value (`0.001`, `"tiny"`, `[1, 2]`).
    pub value: serde_json::Value,
    /// Where it came from: `file:line` or `override '...'`.
    pub origin: String,
}

/// A key whose value differs; `None` on the side that lacks it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Difference {
    pub key: String,
    pub a: Option<Side>,
    pub b: Option<Side>,
}

/// One job of the comparison.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Job {
    pub dir: PathBuf,
    pub git_commit: Option<String>,
    pub git_dirty: Option<bool>,
    pub overrides: Vec<String>,
    /// Why provenance is only the line in `config.yaml`, when it is.
    pub provenance_note: Option<String>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct ConfigDiff {
    pub a: Job,
    pub b: Job,
    pub differences: Vec<Difference>,
}

/// The leaves of a config tree by dotted key, in file order (lists and empty dicts are
/// leaves). `report` reads a sweep's differing parameters from them too.
pub(crate) fn leaves(node: &Node, prefix: &str, out: &mut IndexMap<String, Node>) {
    match &node.value {
        Value::Dict(d) if !d.is_empty() => {
            for (k, v) in d {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(v, &key, out);
            }
        }
        _ => {
            out.insert(prefix.to_string(), node.clone());
        }
    }
}

struct Loaded {
    job: Job,
    values: IndexMap<String, Node>,
    /// Origins by key from composing the job again, shown as the original command saw them.
    origins: Option<IndexMap<String, String>>,
}

fn load(dir: &Path, fallbacks: &[Fallback]) -> Result<Loaded, DiffError> {
    if dir.join(flotilla_launch::rundir::SWEEP_FILE).is_file() {
        return Err(DiffError::SweepDir {
            path: dir.to_path_buf(),
        });
    }
    let tree = load_job_config_tree(dir).ok_or_else(|| DiffError::NoConfig {
        path: dir.to_path_buf(),
    })?;
    let mut values = IndexMap::new();
    leaves(&tree, "", &mut values);
    let meta: Option<Meta> = std::fs::read_to_string(dir.join(flotilla_launch::rundir::META_FILE))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let recomposed = SavedJob::load(dir)
        .map_err(|e| e.to_string())
        .and_then(|saved| {
            let composer = saved
                .composer(fallbacks.to_vec())
                .map_err(|e| e.to_string())?;
            let composed = composer
                .compose(&saved.overrides)
                .map_err(|e| e.to_string())?;
            let mut nodes = IndexMap::new();
            leaves(&composed.job, "", &mut nodes);
            let origins = nodes
                .into_iter()
                .map(|(k, n)| (k, saved.original_origin(&n.origin.to_string())))
                .collect::<IndexMap<_, _>>();
            Ok((origins, saved.from_snapshot))
        });
    let (origins, note) = match recomposed {
        Ok((origins, true)) => (Some(origins), None),
        Ok((origins, false)) => (
            Some(origins),
            Some("no copy of its config directory was kept; provenance is from the directory as it is now".to_string()),
        ),
        Err(why) => (
            None,
            Some(format!(
                "provenance is the line in {CONFIG_FILE} ({why})"
            )),
        ),
    };
    let overrides = flotilla_launch::rundir::read_overrides(dir).unwrap_or_default();
    Ok(Loaded {
        job: Job {
            dir: dir.to_path_buf(),
            git_commit: meta.as_ref().and_then(|m| m.git_commit.clone()),
            git_dirty: meta.as_ref().and_then(|m| m.git_dirty),
            overrides,
            provenance_note: note,
        },
        values,
        origins,
    })
}

impl Loaded {
    fn side(&self, key: &str) -> Option<Side> {
        let node = self.values.get(key)?;
        let origin = self
            .origins
            .as_ref()
            .and_then(|o| o.get(key).cloned())
            .unwrap_or_else(|| node.origin.to_string());
        Some(Side {
            value: node_json(node),
            origin,
        })
    }
}

/// The config values that differ between the jobs in `a` and `b` (in `a`'s key order, then the
/// keys only `b` has). `fallbacks` are the settings the jobs were composed with.
pub fn diff_jobs(a: &Path, b: &Path, fallbacks: &[Fallback]) -> Result<ConfigDiff, DiffError> {
    let la = load(a, fallbacks)?;
    let lb = load(b, fallbacks)?;
    let mut keys: Vec<&String> = la.values.keys().collect();
    keys.extend(lb.values.keys().filter(|k| !la.values.contains_key(*k)));
    let differences = keys
        .into_iter()
        .filter(|k| la.values.get(*k) != lb.values.get(*k))
        .map(|k| Difference {
            key: k.clone(),
            a: la.side(k),
            b: lb.side(k),
        })
        .collect();
    Ok(ConfigDiff {
        a: la.job,
        b: lb.job,
        differences,
    })
}

fn describe(job: &Job) -> String {
    let mut s = job.dir.display().to_string();
    if let Some(commit) = &job.git_commit {
        let short: String = commit.chars().take(10).collect();
        let dirty = if job.git_dirty == Some(true) {
            ", uncommitted changes"
        } else {
            ""
        };
        s.push_str(&format!("  (git {short}{dirty})"));
    }
    s
}

/// The comparison as a person reads it: each differing key, then both values with where they
/// came from.
pub fn to_text(diff: &ConfigDiff) -> String {
    let mut out = format!("a: {}\nb: {}\n", describe(&diff.a), describe(&diff.b));
    for (name, job) in [("a", &diff.a), ("b", &diff.b)] {
        if let Some(note) = &job.provenance_note {
            out.push_str(&format!("note ({name}): {note}\n"));
        }
    }
    if diff.differences.is_empty() {
        out.push_str("\nthe configs are identical\n");
        return out;
    }
    let n = diff.differences.len();
    out.push_str(&format!(
        "\n{n} value{} differ{}:\n",
        if n == 1 { "" } else { "s" },
        if n == 1 { "s" } else { "" }
    ));
    for d in &diff.differences {
        let shown = |s: &Option<Side>| {
            s.as_ref()
                .map_or(("(absent)".to_string(), String::new()), |s| {
                    (s.value.to_string(), s.origin.clone())
                })
        };
        let (va, oa) = shown(&d.a);
        let (vb, ob) = shown(&d.b);
        let width = va.chars().count().max(vb.chars().count());
        out.push_str(&format!("\n{}\n", d.key));
        for (name, v, o) in [("a", va, oa), ("b", vb, ob)] {
            let line = format!("  {name}: {v:<width$}   {o}");
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
    out
}

pub fn to_json(diff: &ConfigDiff) -> String {
    let mut s = serde_json::to_string_pretty(diff).expect("a diff serialises");
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_config::node::to_json_text;

    #[test]
    fn leaves_are_dotted_keys_with_lists_whole() {
        let tree = flotilla_config::yaml::load_str("a: {b: 1, c: [1, 2]}\nd: {}\ne: x\n", "t.yaml")
            .unwrap();
        let mut out = IndexMap::new();
        leaves(&tree, "", &mut out);
        let keys: Vec<&str> = out.keys().map(String::as_str).collect();
        assert_eq!(keys, ["a.b", "a.c", "d", "e"]);
        assert_eq!(to_json_text(&out["a.c"], None), "[1,2]");
        assert_eq!(out["e"].origin.to_string(), "t.yaml:3");
    }
}
