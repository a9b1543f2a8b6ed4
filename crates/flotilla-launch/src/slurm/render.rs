//! Rendering the sbatch script: the built-in template (`launchers/slurm.sbatch.j2`) or the
//! user's `compute.template`, filled by minijinja from a [`ScriptSpec`] (the compute config, the
//! job directories, the quoted task command, the stop signal and requeue exit status), with
//! `compute.additional_parameters` turned into `#SBATCH` options ([`sbatch_options`]).

use super::quote::{quote_task, sbatch_quote, shell_quote};
use super::{SlurmError, EXIT_MARKER, REQUEUE_EXIT_CODE};
use crate::TaskCommand;
use flotilla_config::schema::{ComputeConfig, TaskRanks};
use flotilla_contract::rank::{SLURM_PORT_BASE, SLURM_PORT_SPAN};
use minijinja::Environment;
use std::path::{Path, PathBuf};

/// The built-in sbatch template (`launchers/slurm.sbatch.j2`), compiled into the binary so that
/// `flotilla run` works from any directory.
pub const BUILTIN_TEMPLATE: &str = include_str!("../../../../launchers/slurm.sbatch.j2");
/// The name the built-in template is known by (and its path in the repository).
pub const BUILTIN_TEMPLATE_NAME: &str = "launchers/slurm.sbatch.j2";
/// The signal that asks a job to checkpoint and stop.
pub const STOP_SIGNAL: &str = "USR2";

/// `%` doubled, so that sbatch/srun filename patterns keep a literal path.
fn escape_pattern(path: &Path) -> String {
    path.display().to_string().replace('%', "%%")
}

/// `timeout_min` as sbatch's `D-HH:MM:SS`.
pub fn format_time(minutes: u64) -> String {
    let (days, rest) = (minutes / (24 * 60), minutes % (24 * 60));
    format!("{days}-{:02}:{:02}:00", rest / 60, rest % 60)
}

/// `compute.additional_parameters` as sbatch options: `key: value` → `--key=value` (`_` in a
/// key becomes `-`, as submitit does), `key: true` → `--key`, `false`/`null` → nothing.
pub fn sbatch_options(
    params: &indexmap::IndexMap<String, serde_json::Value>,
) -> Result<Vec<String>, SlurmError> {
    let mut out = Vec::new();
    for (key, value) in params {
        let bad = |message: String| SlurmError::Parameter {
            key: key.clone(),
            message,
        };
        let name_ok = key.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !name_ok {
            return Err(bad(format!(
                "'{key}' is not an sbatch option name (letters, digits, '-' and '_')"
            )));
        }
        let flag = key.replace('_', "-");
        let text = match value {
            serde_json::Value::Null | serde_json::Value::Bool(false) => continue,
            serde_json::Value::Bool(true) => {
                out.push(format!("--{flag}"));
                continue;
            }
            serde_json::Value::Number(n) => n.to_string(),
            serde_json::Value::String(s) => s.clone(),
            other => {
                return Err(bad(format!(
                    "a list or dict ({other}) is not an sbatch option value; write it as a string"
                )))
            }
        };
        out.push(format!("--{flag}={}", sbatch_quote(&text).map_err(bad)?));
    }
    Ok(out)
}

/// Everything one rendered script needs.
#[derive(Clone, Debug)]
pub struct ScriptSpec<'a> {
    pub compute: &'a ComputeConfig,
    pub job_name: &'a str,
    /// What every task runs (normally `<flotilla> train --run-dir {job_dir} --prepared`, or
    /// `<flotilla> exec-task {job_dir}` for the user's own program).
    pub task: &'a TaskCommand,
    /// `None`: the built-in trainer; otherwise the user's program, started once per task or
    /// once per node. The user's program is requeued when it ends after the stop signal,
    /// whatever its exit status.
    pub ranks: Option<TaskRanks>,
    /// The job directories; a job array runs `job_dirs[SLURM_ARRAY_TASK_ID]`.
    pub job_dirs: &'a [PathBuf],
    /// The jobs' numbers, in the order of `job_dirs`.
    pub job_nums: &'a [usize],
    /// `true`: a job array over `job_dirs`; `false`: one job (`job_dirs` has one entry).
    pub array: bool,
    /// Where the scripts live; an array's batch shell logs here until it knows its job dir.
    pub script_dir: &'a Path,
}

/// The sbatch template named by `compute.template` (read from that path, relative to the
/// current directory), or the built-in one. Returns (name, text).
pub fn load_template(compute: &ComputeConfig) -> Result<(String, String), SlurmError> {
    match &compute.template {
        None => Ok((BUILTIN_TEMPLATE_NAME.into(), BUILTIN_TEMPLATE.into())),
        Some(path) => {
            let p = PathBuf::from(path);
            let text = std::fs::read_to_string(&p)
                .map_err(|source| SlurmError::TemplateRead { path: p, source })?;
            Ok((path.clone(), text))
        }
    }
}

/// Renders the sbatch script of `spec` with its template (see [`load_template`]).
pub fn render_script(spec: &ScriptSpec) -> Result<String, SlurmError> {
    let (name, text) = load_template(spec.compute)?;
    render_with(spec, &name, &text)
}

/// Renders `spec` with the template `text` (called `name` in error messages).
pub fn render_with(spec: &ScriptSpec, name: &str, text: &str) -> Result<String, SlurmError> {
    let tmpl_err = |e: minijinja::Error| SlurmError::Template {
        name: name.to_string(),
        message: format!("{e:#}"),
    };
    let c = spec.compute;
    let n = spec.job_dirs.len();
    if n == 0 || (!spec.array && n != 1) {
        return Err(SlurmError::Template {
            name: name.into(),
            message: format!("a script runs one job or an array of jobs, got {n} directories"),
        });
    }
    let array = spec
        .array
        .then(|| super::batches::array_range(n, c.array_parallelism));
    let first = &spec.job_dirs[0];
    let (output, error) = if spec.array {
        let base = escape_pattern(spec.script_dir);
        (format!("{base}/%A_%a.out"), format!("{base}/%A_%a.err"))
    } else {
        let base = escape_pattern(&first.join(crate::rundir::LOGS_DIR));
        (
            format!("{base}/slurm-%j.out"),
            format!("{base}/slurm-%j.err"),
        )
    };
    let job_dirs: Vec<String> = spec
        .job_dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    let task_argv: Vec<String> = spec
        .task
        .argv
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let task_command = quote_task(&task_argv).map_err(|message| SlurmError::Template {
        name: name.into(),
        message,
    })?;
    let ctx = minijinja::context! {
        job_name => spec.job_name,
        compute => minijinja::Value::from_serialize(c),
        time => format_time(c.timeout_min),
        array => array,
        sbatch_extra => sbatch_options(&c.additional_parameters)?,
        output => output,
        error => error,
        job_dirs => job_dirs,
        job_nums => spec.job_nums,
        task_argv => task_argv,
        task_command => task_command,
        user_task => spec.ranks.is_some(),
        per_node => spec.ranks == Some(TaskRanks::PerNode),
        signal => STOP_SIGNAL,
        requeue_exit_code => REQUEUE_EXIT_CODE,
        port_base => SLURM_PORT_BASE,
        port_span => SLURM_PORT_SPAN,
        flotilla_version => env!("CARGO_PKG_VERSION"),
        exit_marker => EXIT_MARKER,
    };
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(true);
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    env.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    let filter = |f: fn(&str) -> Result<String, String>| {
        move |v: minijinja::Value| -> Result<String, minijinja::Error> {
            let s = match v.as_str() {
                Some(s) => s.to_string(),
                None => v.to_string(),
            };
            f(&s).map_err(|m| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, m))
        }
    };
    env.add_filter("shell_quote", filter(shell_quote));
    env.add_filter("sbatch_quote", filter(sbatch_quote));
    env.add_template(name, text).map_err(tmpl_err)?;
    env.get_template(name)
        .map_err(tmpl_err)?
        .render(ctx)
        .map_err(tmpl_err)
}
