//! Mandatory values (`???`) of the runtime node that hydra-core itself reads: where Hydra 1.3.8
//! raises `MissingMandatoryValue` before the job's own code runs, [`check_runtime_mandatory`]
//! refuses the job at composition (exit 2 from `compose`, `plan` and `run`), before anything is
//! created.
//!
//! Hydra never raises for a `???` of the job config itself (the primary config's values,
//! overrides of user keys): only the job's code reads them, and so they are left to the job (the
//! typed validation of flotilla's own sections refuses a `???` the trainer would read). For the
//! runtime node (`flotilla:`, alias `hydra:`) `tests/oracle/record_mandatory.py` records what
//! hydra-core does, key by key, and `tests/hydra_oracle.rs` checks flotilla against it:
//!
//! * every job: Hydra reads `job.chdir`, `verbose`, `output_subdir`, `job.env_set` (and each of
//!   its values), `job.env_copy` (and each item), `job.config.override_dirname.{kv_sep,
//!   item_sep,exclude_keys}`, `job_logging`, `hydra_logging`, and writes into
//!   `overrides.{task,hydra}` and `runtime.choices`: a `???` at any of them, or at a node above
//!   one (`job`, `runtime`), fails;
//! * a multirun also reads `sweep.dir`, `sweeper.max_batch_size`, `sweeper.params` and
//!   `launcher`;
//! * Hydra does not raise for `run.dir` or `sweep.subdir` (it selects them leniently: a `???`
//!   becomes a directory named `None`), nor for the keys it overwrites (`job.name`, `job.num`,
//!   `job.id`, `mode`, `runtime.output_dir`, ...); neither does flotilla.

use super::messages::join;
use super::{Problem, ProblemKind, SchemaError};
use crate::node::{Node, Origin, Value};

/// Whether the runtime node is that of one job or of a multirun's sweep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuntimeMode {
    /// One job (a single run, or one job of a sweep).
    Run,
    /// A multirun: what every job reads, and the sweep's own keys.
    Multirun,
}

/// Runtime keys hydra-core reads (or writes into) for every job, with a value that fixes them.
const READ_BY_EVERY_JOB: [(&str, &str); 13] = [
    ("job.chdir", "false"),
    ("verbose", "false"),
    ("output_subdir", "null"),
    ("job.env_set", "{}"),
    ("job.env_copy", "[]"),
    ("job.config.override_dirname.kv_sep", "'='"),
    ("job.config.override_dirname.item_sep", "','"),
    ("job.config.override_dirname.exclude_keys", "[]"),
    ("job_logging", "{}"),
    ("hydra_logging", "{}"),
    ("overrides.task", "[]"),
    ("overrides.hydra", "[]"),
    ("runtime.choices", "{}"),
];

/// Runtime keys hydra-core reads for a multirun's sweep, with a value that fixes them.
const READ_BY_A_SWEEP: [(&str, &str); 4] = [
    ("sweep.dir", "outputs/multirun/my_sweep"),
    ("sweeper.max_batch_size", "null"),
    ("sweeper.params", "null"),
    ("launcher", "{}"),
];

/// Refuses the `???` values of the unresolved `runtime` node that hydra-core would fail on for
/// a command of `mode` (see the module's documentation): one [`ProblemKind::Mandatory`]
/// problem per value, naming the key, where it was set and a value to give it.
pub fn check_runtime_mandatory(runtime: &Node, mode: RuntimeMode) -> Result<(), SchemaError> {
    let sweep: &[(&str, &str)] = match mode {
        RuntimeMode::Run => &[],
        RuntimeMode::Multirun => &READ_BY_A_SWEEP,
    };
    let mut problems: Vec<Problem> = Vec::new();
    let mut push = |key: String, node: &Node, example: &str| {
        if !problems.iter().any(|p| p.key == format!("flotilla.{key}")) {
            problems.push(problem(key, &node.origin, example));
        }
    };
    for &(path, example) in READ_BY_EVERY_JOB.iter().chain(sweep) {
        let Some((key, node)) = first_missing(runtime, path) else {
            continue;
        };
        if key != path {
            // A node above the key Hydra reads: the fix replaces that node.
            push(key, node, "{...}");
            continue;
        }
        match &node.value {
            Value::Missing => push(key, node, example),
            // Hydra sets every variable of `job.env_set` and copies every one of `job.env_copy`.
            Value::Dict(d) if path == "job.env_set" => {
                for (name, value) in d {
                    if value.value == Value::Missing {
                        push(join(path, name), value, "VALUE");
                    }
                }
            }
            Value::List(items) if path == "job.env_copy" => {
                for (i, item) in items.iter().enumerate() {
                    if item.value == Value::Missing {
                        push(format!("{path}[{i}]"), item, "NAME");
                    }
                }
            }
            _ => {}
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(SchemaError { problems })
    }
}

/// The first node on the dotted `path` from `root` (the node at the path included) that is
/// `???`, with its dotted key; `None` when every node there is set or the path ends early.
fn first_missing<'a>(root: &'a Node, path: &str) -> Option<(String, &'a Node)> {
    let mut node = root;
    let mut key = String::new();
    for segment in path.split('.') {
        node = node.value.as_dict()?.get(segment)?;
        key = join(&key, segment);
        if node.value == Value::Missing {
            return Some((key, node));
        }
    }
    Some((key, node))
}

/// The name the user gave the runtime node where the value was set: `hydra` for an override
/// that wrote `hydra.…`, else `flotilla`.
fn runtime_name(origin: &Origin) -> &'static str {
    match origin {
        Origin::Override(text) if text.trim_start_matches(['+', '~']).starts_with("hydra") => {
            "hydra"
        }
        _ => "flotilla",
    }
}

fn problem(key: String, origin: &Origin, example: &str) -> Problem {
    let name = format!("{}.{key}", runtime_name(origin));
    let note = match origin {
        Origin::Unknown => String::new(),
        o @ Origin::File { .. } => format!(" (left as ??? in {o})"),
        o @ Origin::Override(_) => format!(" (set to ??? by {o})"),
    };
    let message = format!(
        "{name} is mandatory (???){note} and Hydra reads it before the job starts \
         (hydra-core raises MissingMandatoryValue there) — set it, e.g. {name}={example}"
    );
    Problem {
        kind: ProblemKind::Mandatory,
        key: format!("flotilla.{key}"),
        origin: origin.clone(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::yaml::load_str;

    fn runtime(yaml: &str) -> Node {
        load_str(yaml, "runtime.yaml").unwrap()
    }

    fn keys(r: Result<(), SchemaError>) -> Vec<String> {
        match r {
            Ok(()) => vec![],
            Err(e) => e.problems.into_iter().map(|p| p.key).collect(),
        }
    }

    #[test]
    fn every_job_reads_chdir_verbose_and_env() {
        let r = runtime(
            "job: {chdir: ???, name: ???, num: ???, env_set: {A: x, B: ???}, env_copy: [C, ???]}\n\
             verbose: ???\nrun: {dir: ???}\nsweep: {dir: ???, subdir: ???}\n",
        );
        assert_eq!(
            keys(check_runtime_mandatory(&r, RuntimeMode::Run)),
            [
                "flotilla.job.chdir",
                "flotilla.verbose",
                "flotilla.job.env_set.B",
                "flotilla.job.env_copy[1]"
            ]
        );
        assert_eq!(
            keys(check_runtime_mandatory(&r, RuntimeMode::Multirun)),
            [
                "flotilla.job.chdir",
                "flotilla.verbose",
                "flotilla.job.env_set.B",
                "flotilla.job.env_copy[1]",
                "flotilla.sweep.dir"
            ]
        );
    }

    #[test]
    fn a_missing_node_above_a_read_key_is_named_once() {
        let r = runtime("job: ???\nsweeper: ???\n");
        assert_eq!(
            keys(check_runtime_mandatory(&r, RuntimeMode::Run)),
            ["flotilla.job"]
        );
        assert_eq!(
            keys(check_runtime_mandatory(&r, RuntimeMode::Multirun)),
            ["flotilla.job", "flotilla.sweeper"]
        );
    }

    #[test]
    fn the_message_names_the_key_as_written_and_the_fix() {
        let mut r = runtime("job: {chdir: false}\n");
        let node = r.get_path_mut(&["job", "chdir"]).unwrap();
        node.value = Value::Missing;
        node.origin = Origin::Override("hydra.job.chdir=???".into());
        let e = check_runtime_mandatory(&r, RuntimeMode::Run).unwrap_err();
        assert_eq!(
            e.to_string(),
            "hydra.job.chdir is mandatory (???) (set to ??? by override 'hydra.job.chdir=???') \
             and Hydra reads it before the job starts (hydra-core raises MissingMandatoryValue \
             there) — set it, e.g. hydra.job.chdir=false"
        );
    }
}
