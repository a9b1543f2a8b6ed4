//! Multirun sweep expansion in the order Hydra's BasicSweeper produces jobs.
//!
//! The sweep's overrides are, in order: the primary config's `flotilla.sweeper.params` (alias
//! `hydra.sweeper.params`), a named sweep file's `params:` then its fixed `overrides:`, then
//! the command line. Each key keeps the position of its first appearance and the value of its
//! last; the jobs are the cartesian product of the per-key value lists, the last key varying
//! fastest. Runtime overrides (`hydra.*`, `flotilla.*`) apply to every job without being part
//! of its task overrides.

use crate::compose::is_runtime_override;
use crate::node::{python_str, Node, Value};
use crate::overrides::{parse_override, Override};
use crate::schema::{check_runtime_mandatory, RuntimeMode};
use crate::{yaml, Composed, Composer, ConfigError};
use indexmap::IndexMap;
use std::path::Path;

/// One job of a plan.
#[derive(Clone, Debug)]
pub struct PlannedJob {
    pub num: usize,
    /// The job's task overrides, as Hydra's BasicSweeper writes them (`key=value`).
    pub overrides: Vec<String>,
    pub composed: Composed,
}

/// A named sweep file: `params:` (like `hydra.sweeper.params`) and fixed `overrides:`.
#[derive(Clone, Debug, Default)]
pub struct SweepFile {
    pub params: Vec<String>,
    pub overrides: Vec<String>,
}

impl SweepFile {
    pub fn load(path: &Path) -> Result<SweepFile, ConfigError> {
        let display = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Io {
            path: display.clone(),
            message: format!("cannot read sweep file: {e}"),
        })?;
        let node = yaml::load_str(&text, &display)?;
        let Value::Dict(root) = &node.value else {
            return Err(ConfigError::Composition(format!(
                "{display}: a sweep file must be a mapping with 'params:' and/or 'overrides:'"
            )));
        };
        let mut out = SweepFile::default();
        for (key, value) in root {
            match key.as_str() {
                "params" => out.params = params_as_overrides(value)?,
                "overrides" => match &value.value {
                    Value::List(items) => {
                        for item in items {
                            match &item.value {
                                Value::Str(s) => out.overrides.push(s.clone()),
                                other => {
                                    return Err(ConfigError::Composition(format!(
                                        "{}: sweep file overrides must be strings like 'key=value', got {}",
                                        item.origin,
                                        other.type_name()
                                    )))
                                }
                            }
                        }
                    }
                    Value::Null => {}
                    _ => {
                        return Err(ConfigError::Composition(format!(
                            "{}: 'overrides' must be a list of 'key=value' strings",
                            value.origin
                        )))
                    }
                },
                other => {
                    let hint = crate::near_miss(other, ["params", "overrides"])
                        .map(|n| format!(" (did you mean '{n}'?)"))
                        .unwrap_or_default();
                    return Err(ConfigError::Composition(format!(
                        "{display}: unknown key '{other}' in sweep file{hint}; expected 'params' and 'overrides'"
                    )));
                }
            }
        }
        Ok(out)
    }
}

/// `params:` mapping → `key=value` override strings (Hydra renders each value with `str()`).
fn params_as_overrides(node: &Node) -> Result<Vec<String>, ConfigError> {
    match &node.value {
        Value::Null => Ok(Vec::new()),
        Value::Dict(d) => Ok(d
            .iter()
            .map(|(k, v)| format!("{k}={}", python_str(&v.value)))
            .collect()),
        other => Err(ConfigError::Composition(format!(
            "{}: sweeper params must be a mapping of key: values, got {}",
            node.origin,
            other.type_name()
        ))),
    }
}

/// Expands a sweep into per-job override lists, in BasicSweeper's order.
pub fn expand(
    composer: &Composer,
    overrides: &[Override],
) -> Result<Vec<Vec<String>>, ConfigError> {
    let mut per_key: IndexMap<String, Vec<String>> = IndexMap::new();
    for o in overrides {
        let key = o.key_element();
        let values = if o.is_sweep() {
            if !o.is_discrete_sweep() {
                return Err(ConfigError::Override(format!(
                    "'{}': the basic sweeper does not support continuous sweeps (interval); use choice() or range()",
                    o.input
                )));
            }
            let options = composer.repo().group_options(&o.key_or_group);
            o.sweep_value_strings(&options)?
                .into_iter()
                .map(|v| format!("{key}={v}"))
                .collect()
        } else {
            vec![format!("{key}={}", o.value_element_as_str())]
        };
        // A repeated key keeps its first position and takes the last values.
        per_key.insert(key, values);
    }
    let mut jobs: Vec<Vec<String>> = vec![Vec::new()];
    for values in per_key.values() {
        let mut next = Vec::with_capacity(jobs.len() * values.len());
        for prefix in &jobs {
            for v in values {
                let mut job = prefix.clone();
                job.push(v.clone());
                next.push(job);
            }
        }
        jobs = next;
    }
    Ok(jobs)
}

/// Plans the jobs of a command: one job, or with `multirun` the expanded sweep.
pub fn plan(
    composer: &Composer,
    overrides: &[String],
    sweep_file: Option<&SweepFile>,
    multirun: bool,
) -> Result<Vec<PlannedJob>, ConfigError> {
    let mut jobs = Vec::new();
    plan_each(composer, overrides, sweep_file, multirun, |job| {
        jobs.push(job);
        Ok(())
    })?;
    Ok(jobs)
}

/// Like [`plan`], handing each job to `on_job` in job order as soon as it is composed, so
/// that a large sweep needs memory for a few jobs at a time. Composition stops at the first
/// error (the failing job with the lowest number is the one reported).
pub fn plan_each(
    composer: &Composer,
    overrides: &[String],
    sweep_file: Option<&SweepFile>,
    multirun: bool,
    on_job: impl FnMut(PlannedJob) -> Result<(), ConfigError>,
) -> Result<(), ConfigError> {
    plan_map(composer, overrides, sweep_file, multirun, Ok, on_job)
}

/// The overrides of a multirun, before expansion.
#[derive(Clone, Debug)]
pub struct SweepOverrides {
    /// The runtime node of the primary config with the command line's overrides (unresolved):
    /// `sweeper.*` says how to sweep.
    pub master: Node,
    /// Runtime overrides (`flotilla.*`, `hydra.*`): every job gets them.
    pub runtime: Vec<Override>,
    /// The task overrides, sweeps unexpanded, in order: `sweeper.params`, the sweep file's
    /// `params:` and `overrides:`, the command line.
    pub task: Vec<Override>,
}

/// Collects the overrides of a multirun (see [`SweepOverrides`]); a sweep of the runtime node
/// and a sweep file that sets it are refused.
pub fn sweep_overrides(
    composer: &Composer,
    parsed: Vec<Override>,
    sweep_file: Option<&SweepFile>,
) -> Result<SweepOverrides, ConfigError> {
    let (runtime, task): (Vec<Override>, Vec<Override>) =
        parsed.into_iter().partition(is_runtime_override);
    if let Some(o) = runtime.iter().find(|o| o.is_sweep()) {
        return Err(ConfigError::Override(format!(
            "sweeping over the runtime configuration is not supported: '{}'",
            o.input
        )));
    }
    // Sweep params declared in the primary config come first.
    let mut all: Vec<Override> = Vec::new();
    let master = composer.compose_master_runtime(
        &runtime
            .iter()
            .chain(task.iter())
            .cloned()
            .collect::<Vec<_>>(),
    )?;
    // The sweep's own keys (`sweep.dir`, `sweeper.*`, `launcher`) are read once, by the sweep.
    check_runtime_mandatory(&master, RuntimeMode::Multirun)?;
    if let Some(params) = master.select("sweeper.params") {
        for text in params_as_overrides(params)? {
            all.push(parse_override(&text)?);
        }
    }
    if let Some(file) = sweep_file {
        for text in file.params.iter().chain(file.overrides.iter()) {
            let o = parse_override(text)?;
            if is_runtime_override(&o) {
                return Err(ConfigError::Override(format!(
                    "sweep file entry '{text}' sets the runtime node; put it on the command line"
                )));
            }
            all.push(o);
        }
    }
    all.extend(task);
    Ok(SweepOverrides {
        master,
        runtime,
        task: all,
    })
}

/// Sweeps with at least this many jobs are composed on several threads.
const PARALLEL_PLAN_MIN_JOBS: usize = 64;

/// Like [`plan_each`], with `map` applied to each composed job on the composing thread (a
/// sweep of many jobs is composed on all cores) and `on_result` called with its results in job
/// order, on the calling thread.
pub fn plan_map<T: Send>(
    composer: &Composer,
    overrides: &[String],
    sweep_file: Option<&SweepFile>,
    multirun: bool,
    map: impl Fn(PlannedJob) -> Result<T, ConfigError> + Sync,
    mut on_result: impl FnMut(T) -> Result<(), ConfigError>,
) -> Result<(), ConfigError> {
    let parsed = composer.parse_overrides(overrides)?;
    if !multirun {
        if sweep_file.is_some() {
            return Err(ConfigError::Override(
                "a sweep file needs --multirun (-m)".into(),
            ));
        }
        let composed = composer.compose(overrides)?;
        return on_result(map(PlannedJob {
            num: 0,
            overrides: composed.task_overrides.clone(),
            composed,
        })?);
    }
    let SweepOverrides {
        runtime, task: all, ..
    } = sweep_overrides(composer, parsed, sweep_file)?;
    let jobs = expand(composer, &all)?;
    let compose_job = |num: usize| -> Result<T, ConfigError> {
        let job = &jobs[num];
        let mut parsed = runtime.clone();
        for text in job {
            parsed.push(parse_override(text)?);
        }
        let composed = composer
            .compose_parsed(&parsed, Some(num))
            .map_err(|e| ConfigError::Composition(format!("job {num} ({}): {e}", job.join(" "))))?;
        map(PlannedJob {
            num,
            overrides: job.clone(),
            composed,
        })
    };
    let threads = if jobs.len() < PARALLEL_PLAN_MIN_JOBS {
        1
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get().min(16))
    };
    if threads <= 1 {
        for num in 0..jobs.len() {
            on_result(compose_job(num)?)?;
        }
        return Ok(());
    }
    in_order_parallel(jobs.len(), threads, compose_job, on_result)
}

/// Runs `work(0..count)` on `threads` scoped threads and hands the results to `consume` in
/// index order on the calling thread. The first error in index order (from `work` or
/// `consume`) is returned; threads stop taking new indices past a failed one.
fn in_order_parallel<T: Send>(
    count: usize,
    threads: usize,
    work: impl Fn(usize) -> Result<T, ConfigError> + Sync,
    mut consume: impl FnMut(T) -> Result<(), ConfigError>,
) -> Result<(), ConfigError> {
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;

    // Indices are handed out in small blocks so that results arrive nearly in order.
    const BLOCK: usize = 16;
    let next = AtomicUsize::new(0);
    let stop_at = AtomicUsize::new(usize::MAX);
    std::thread::scope(|scope| {
        let (sender, receiver) = mpsc::channel::<(usize, Result<T, ConfigError>)>();
        for _ in 0..threads {
            let sender = sender.clone();
            let (next, stop_at, work) = (&next, &stop_at, &work);
            scope.spawn(move || loop {
                let start = next.fetch_add(BLOCK, Ordering::Relaxed);
                if start >= count.min(stop_at.load(Ordering::Relaxed)) {
                    break;
                }
                for index in start..(start + BLOCK).min(count) {
                    let result = work(index);
                    if result.is_err() {
                        stop_at.fetch_min(index, Ordering::Relaxed);
                    }
                    if sender.send((index, result)).is_err() {
                        return;
                    }
                }
            });
        }
        drop(sender);
        let mut pending = BTreeMap::new();
        let mut expected = 0;
        for (index, result) in receiver.iter() {
            pending.insert(index, result);
            while let Some(result) = pending.remove(&expected) {
                expected += 1;
                let outcome = result.and_then(&mut consume);
                if outcome.is_err() {
                    // Dropping the receiver makes the workers' next send fail: they stop.
                    stop_at.store(0, Ordering::Relaxed);
                    return outcome;
                }
            }
        }
        Ok(())
    })
}
