//! The parameters a report shows for each job: the keys whose values differ across its jobs.
//! A job's parameters are its task overrides (its plan record, else its `overrides.yaml`), so
//! a sweep of thousands of jobs is reported without parsing a single config. When the jobs
//! come from several sweeps or runs, their resolved configs are read too, and a config value
//! that is the same within each sweep (or run) but differs between them is shown as well
//! (runs made from edited config files, sweeps over different bases); a value that differs
//! within a sweep only follows its swept keys (`trainer.seed: ${seed}`) and is left out.

use super::discover::FoundJob;
use flotilla_config::node::Node;
use flotilla_launch::rundir::{load_job_config_tree, override_assignments, read_overrides};
use indexmap::IndexMap;
use rayon::prelude::*;
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;

/// A job's task overrides as `key → value`: from its plan record, else its `overrides.yaml`;
/// a value typed as JSON reads it, else kept as text.
pub fn override_params(job: &FoundJob) -> IndexMap<String, Value> {
    let overrides = job
        .record
        .as_ref()
        .map(|r| r.overrides.clone())
        .or_else(|| read_overrides(&job.dir))
        .unwrap_or_default();
    override_assignments(&overrides)
        .into_iter()
        .map(|(key, text)| {
            let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
            (key, value)
        })
        .collect()
}

/// A resolved config's leaves by dotted key, as JSON.
fn config_leaves(config: &Node) -> IndexMap<String, Value> {
    let mut leaves = IndexMap::new();
    crate::diff::leaves(config, "", &mut leaves);
    leaves
        .into_iter()
        .map(|(k, v)| (k, flotilla_config::node::to_json(&v)))
        .collect()
}

/// Per job: the parameters whose values are not the same in every job (see the module's
/// documentation), from `overrides[i]`, job `i`'s [`override_params`]; `groups[i]` is the
/// sweep (or run) directory job `i` belongs to, and
/// `has_config[i]` whether its directory holds its config. A single job shows its task
/// overrides, typed as its config has them.
pub fn differing_params(
    jobs: &[FoundJob],
    overrides: &[IndexMap<String, Value>],
    groups: &[&Path],
    has_config: &[bool],
) -> Vec<IndexMap<String, Value>> {
    let several_groups = groups
        .iter()
        .any(|g| g.as_os_str() != groups[0].as_os_str());
    if jobs.len() == 1 || several_groups {
        let mut overrides = overrides.to_vec();
        // Configs are read only here: one job, or jobs of several sweeps or runs.
        let configs: Vec<Option<IndexMap<String, Value>>> = jobs
            .par_iter()
            .map(|job| load_job_config_tree(&job.dir).map(|c| config_leaves(&c)))
            .collect();
        // An override's value as the config typed it.
        for (o, c) in overrides.iter_mut().zip(&configs) {
            for (key, value) in o.iter_mut() {
                if let Some(v) = c.as_ref().and_then(|c| c.get(key)) {
                    *value = v.clone();
                }
            }
        }
        if jobs.len() == 1 {
            return overrides;
        }
        // A key another sweep overrides: this job's value is its config's.
        let overridden: IndexMap<String, ()> = overrides
            .iter()
            .flat_map(|o| o.keys().map(|k| (k.clone(), ())))
            .collect();
        for (o, c) in overrides.iter_mut().zip(&configs) {
            for key in overridden.keys() {
                if let (false, Some(v)) = (o.contains_key(key), c.as_ref().and_then(|c| c.get(key)))
                {
                    o.insert(key.clone(), v.clone());
                }
            }
        }
        add_config_differences(&mut overrides, &configs, groups);
        return keep_differing(&overrides, has_config);
    }
    keep_differing(overrides, has_config)
}

/// Adds to each job the config values that are the same within each group but differ between
/// groups (`configs[i]`: job `i`'s leaves, `None` without a readable config), for keys no job
/// sets by an override.
fn add_config_differences(
    params: &mut [IndexMap<String, Value>],
    configs: &[Option<IndexMap<String, Value>>],
    groups: &[&Path],
) {
    // Per group, each key's value when every job of the group with a config agrees on it
    // (`None`: absent in some config of the group, or not agreed).
    let mut per_group: HashMap<&Path, IndexMap<&str, Option<&Value>>> = HashMap::new();
    let mut keys: IndexMap<&str, ()> = IndexMap::new();
    for (config, group) in configs.iter().zip(groups) {
        let Some(config) = config else { continue };
        for k in config.keys() {
            keys.insert(k, ());
        }
        let seen = per_group.contains_key(group);
        let values = per_group.entry(group).or_default();
        if !seen {
            for (k, v) in config {
                values.insert(k, Some(v));
            }
            continue;
        }
        for (k, v) in values.iter_mut() {
            if v.is_some_and(|v| config.get(*k) != Some(v)) {
                *v = None;
            }
        }
        for k in config.keys() {
            values.entry(k).or_insert(None);
        }
    }
    let overridden: Vec<&str> = params
        .iter()
        .flat_map(|p| p.keys())
        .map(String::as_str)
        .collect();
    let added: Vec<&str> = keys
        .keys()
        .copied()
        .filter(|k| !overridden.contains(k))
        .filter(|k| {
            // Agreed within every group (or absent from every config of it) ...
            let within: Vec<Option<&Value>> = per_group
                .values()
                .map(|values| match values.get(k) {
                    Some(Some(v)) => Ok(Some(*v)),
                    Some(None) => Err(()),
                    None => Ok(None),
                })
                .collect::<Result<_, _>>()
                .unwrap_or_default();
            // ... and not the same in all of them.
            within.len() == per_group.len() && within.iter().any(|v| *v != within[0])
        })
        .collect();
    for ((p, config), group) in params.iter_mut().zip(configs).zip(groups) {
        let agreed = per_group.get(group);
        for k in &added {
            let value = config
                .as_ref()
                .and_then(|_| agreed.and_then(|a| a.get(*k)).copied().flatten())
                .cloned()
                .unwrap_or(Value::Null);
            p.insert((*k).to_string(), value);
        }
    }
}

/// Keeps the keys whose values are not the same in every job: two jobs that have a key
/// disagree, or a job composed from a config lacks it (a job known only by its overrides says
/// nothing about the keys it does not set).
fn keep_differing(
    params: &[IndexMap<String, Value>],
    has_config: &[bool],
) -> Vec<IndexMap<String, Value>> {
    let mut keys: IndexMap<&str, ()> = IndexMap::new();
    for p in params {
        for k in p.keys() {
            keys.insert(k, ());
        }
    }
    let differing: Vec<String> = keys
        .keys()
        .filter(|k| {
            let mut present = params.iter().filter_map(|p| p.get(**k));
            let first = present.next();
            present.any(|v| Some(v) != first)
                || params
                    .iter()
                    .zip(has_config)
                    .any(|(p, has)| *has && !p.contains_key(**k))
        })
        .map(|k| k.to_string())
        .collect();
    params
        .iter()
        .map(|p| {
            differing
                .iter()
                .map(|k| (k.clone(), p.get(k).cloned().unwrap_or(Value::Null)))
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(pairs: &[(&str, Value)]) -> IndexMap<String, Value> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    #[test]
    fn only_keys_that_differ_are_kept() {
        let params = vec![
            map(&[("lr", json!(0.1)), ("steps", json!(10)), ("seed", json!(1))]),
            map(&[("lr", json!(0.2)), ("steps", json!(10)), ("seed", json!(1))]),
            map(&[("lr", json!(0.1)), ("steps", json!(10))]),
        ];
        // Job 2 has a config without `seed`: the key differs; constant `steps` does not.
        let kept = keep_differing(&params, &[true, true, true]);
        assert_eq!(kept[0], map(&[("lr", json!(0.1)), ("seed", json!(1))]));
        assert_eq!(kept[2], map(&[("lr", json!(0.1)), ("seed", Value::Null)]));
        // Known only by its overrides, job 2 says nothing about `seed`.
        let kept = keep_differing(&params, &[true, true, false]);
        assert_eq!(kept[2], map(&[("lr", json!(0.1))]));
    }

    #[test]
    fn config_values_count_when_they_differ_between_sweeps_not_within() {
        let (a, b) = (Path::new("a"), Path::new("b"));
        let groups = vec![a, a, b];
        let configs = vec![
            Some(map(&[
                ("seed", json!(1)),
                ("t.seed", json!(1)),
                ("warmup", json!(10)),
            ])),
            Some(map(&[
                ("seed", json!(2)),
                ("t.seed", json!(2)),
                ("warmup", json!(10)),
            ])),
            Some(map(&[
                ("seed", json!(1)),
                ("t.seed", json!(1)),
                ("warmup", json!(50)),
            ])),
        ];
        let mut params = vec![
            map(&[("seed", json!(1))]),
            map(&[("seed", json!(2))]),
            map(&[]),
        ];
        add_config_differences(&mut params, &configs, &groups);
        // `warmup` is one value per sweep, two values in all; `t.seed` follows the swept seed.
        assert_eq!(params[0], map(&[("seed", json!(1)), ("warmup", json!(10))]));
        assert_eq!(params[2], map(&[("warmup", json!(50))]));
    }
}
