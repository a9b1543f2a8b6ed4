//! `flotilla plan`: the jobs a command would run, as a table or JSON; with `--memory`, each
//! job's memory estimate (`flotilla_launch::memory`); under a SLURM sweep's table, the `sbatch`
//! submissions `run` would make (`flotilla_launch::slurm::batches`).

use anyhow::Context;
use clap::{Args, ValueEnum};
use flotilla_config::node::to_json_text;
use flotilla_config::schema::Launcher;
use flotilla_config::sweep::sweep_overrides;
use flotilla_config::sweep::{plan_map, PlannedJob, SweepFile};
use flotilla_launch::memory::{self, Advice, Estimate};
use flotilla_launch::slurm::{
    self,
    batches::{describe_batches, plan_batches, JobShape, Submit},
};
use flotilla_launch::study::{first_trials, search_space};
use flotilla_study::config::{study_config, StudyConfig};
use flotilla_study::SearchSpace;
use std::path::PathBuf;

use super::{write_stdout, ConfigArgs, Failure};

pub const PLAN_EXAMPLES: &str =
    "Overrides use Hydra's grammar; with -m a comma list, range(), choice(), glob() or interval \
sweep expands into one job per combination, in Hydra's BasicSweeper order.

Examples:
  flotilla plan -m trainer.lr=1e-4,3e-4 model=tiny,small
  flotilla plan -m 'seed=range(0,5)' --format json
  flotilla plan -m --sweep sweeps/lr.yaml
  flotilla plan --memory model=llama-8b trainer/dist=fsdp compute=slurm trainer.micro_batch_size=4";

#[derive(Args)]
pub struct PlanArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// Expand sweeps (a,b / range() / choice() / glob()) into one job per combination.
    #[arg(short = 'm', long)]
    multirun: bool,
    /// A named sweep file with `params:` and optional fixed `overrides:`.
    #[arg(long)]
    sweep: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = PlanFormat::Table)]
    format: PlanFormat,
    /// Estimate each job's memory per GPU (every term, the peak and when it happens, host RAM
    /// per node) against its GPU (compute.gpu_type or compute.gpu_mem_gb), with ranked advice
    /// for a job that does not fit.
    #[arg(long)]
    memory: bool,
    /// Overrides: key=value, +key=value, ++key=value, ~key, group=option, sweeps a,b ...
    overrides: Vec<String>,
}

#[derive(Clone, Copy, ValueEnum)]
enum PlanFormat {
    Table,
    Json,
}

/// How many trials `plan` shows of an adaptive sweep.
const FIRST_TRIALS: usize = 5;

/// An adaptive sweep as `plan` prints it: the sampler, the space, the first trials.
pub fn describe_study(config: &StudyConfig, space: &SearchSpace) -> String {
    let mut out = format!(
        "adaptive sweep: sampler {}{}, {} trials, {} at once, seed {}{}\n",
        config.sampler.as_str(),
        if config.multivariate {
            " (multivariate)"
        } else {
            ""
        },
        config.n_trials,
        config.max_parallel,
        config.seed,
        if config.pruner.is_some() {
            ", pruner asha"
        } else {
            ""
        }
    );
    out.push_str("search space:\n");
    for line in space.describe().lines() {
        out.push_str(&format!("  {line}\n"));
    }
    let first = first_trials(config, space, FIRST_TRIALS);
    out.push_str(&format!(
        "first {} trial{} (later ones depend on the results):\n",
        first.len(),
        if first.len() == 1 { "" } else { "s" }
    ));
    for (i, overrides) in first.iter().enumerate() {
        out.push_str(&format!("{i:>5}  {}\n", overrides.join(" ")));
    }
    out
}

pub fn plan(args: PlanArgs) -> Result<(), Failure> {
    let composer = args.config.composer(&super::settings()?)?;
    let sweep_file = args.sweep.as_deref().map(SweepFile::load).transpose()?;
    if args.multirun {
        let parsed = composer.parse_overrides(&args.overrides)?;
        let sweep = sweep_overrides(&composer, parsed, sweep_file.as_ref())?;
        if let Some(config) = study_config(&sweep.master)? {
            let space = search_space(&sweep.task)?;
            return write_stdout(&describe_study(&config, &space));
        }
    }
    // Every job is composed and validated before anything is printed: a sweep with a broken job
    // prints nothing but the error.
    let start_dir = std::env::current_dir().context("the current directory")?;
    let mut text = String::new();
    let mut count = 0usize;
    // Each job's compute and task kind, to say what `sbatch` submissions a SLURM sweep makes.
    let planned = std::sync::Mutex::new(Vec::new());
    if let PlanFormat::Json = args.format {
        text.push_str("{\"jobs\":[");
    }
    // Each job is rendered on the thread that composed it; the pieces arrive in job order.
    plan_map(
        &composer,
        &args.overrides,
        sweep_file.as_ref(),
        args.multirun,
        |job| {
            if job.composed.runs_user_task() {
                // The user's program is checked as `run` checks it.
                let runs = flotilla_launch::rundir::job_runs(
                    &job.composed,
                    composer.context(),
                    &start_dir,
                )?;
                planned.lock().unwrap().push(JobShape {
                    num: job.num,
                    compute: runs.compute,
                    ranks: runs.task.map(|t| t.ranks),
                });
            } else if let Some(c) = &job.composed.typed {
                planned.lock().unwrap().push(JobShape {
                    num: job.num,
                    compute: c.compute.clone(),
                    ranks: None,
                });
            }
            Ok(match (args.format, args.memory) {
                (PlanFormat::Json, false) => json_job(&job),
                (PlanFormat::Table, false) => table_row(&job),
                (PlanFormat::Json, true) => json_job_memory(&job),
                (PlanFormat::Table, true) => table_row_memory(&job),
            })
        },
        |piece| {
            if count > 0 && matches!(args.format, PlanFormat::Json) {
                text.push(',');
            }
            text.push_str(&piece);
            count += 1;
            Ok(())
        },
    )?;
    match args.format {
        PlanFormat::Json => text.push_str("]}\n"),
        PlanFormat::Table => {
            text.push_str(&format!(
                "{count} job{}\n",
                if count == 1 { "" } else { "s" }
            ));
            if args.multirun {
                text.push_str(&submissions(planned.into_inner().unwrap())?);
            }
        }
    }
    write_stdout(&text)
}

/// `{"num":N,"overrides":[...],"config":{...}}`: the config is written by the node's own JSON
/// writer (key order and number spelling kept), so the line is assembled here.
fn json_job(job: &PlannedJob) -> String {
    let overrides = serde_json::Value::from(job.overrides.clone()).to_string();
    let config = to_json_text(&job.composed.job, None);
    format!(
        "{{\"num\":{},\"overrides\":{overrides},\"config\":{config}}}",
        job.num
    )
}

/// The job's memory estimate with its advice (when it does not fit), or why it has none.
fn memory_of(job: &PlannedJob) -> Result<(Estimate, Vec<Advice>), &'static str> {
    if job.composed.runs_user_task() {
        return Err("runs the user's own program: no model to estimate");
    }
    let Some(config) = &job.composed.typed else {
        return Err("not a validated flotilla job: no estimate");
    };
    // A job from a base directory is priced as that base (the job's own `model` when its
    // config.json cannot be read here: `run` refuses such a job, naming the file).
    let trained = flotilla_launch::base_model::trained_job(config)
        .unwrap_or(std::borrow::Cow::Borrowed(config));
    let est = memory::estimate(&trained);
    let advice = match (&est.gpu, est.fits) {
        (Some(g), Some(false)) => memory::advise(&trained, g.bytes),
        _ => vec![],
    };
    Ok((est, advice))
}

/// [`json_job`] with a `"memory"` member: the estimate and its advice, or `null` and a
/// `"memory_note"` saying why there is none.
fn json_job_memory(job: &PlannedJob) -> String {
    let mut line = json_job(job);
    line.pop();
    match memory_of(job) {
        Ok((est, advice)) => {
            line.push_str(",\"memory\":");
            line.push_str(&memory::render::json(&est, &advice).to_string());
        }
        Err(why) => {
            line.push_str(",\"memory\":null,\"memory_note\":");
            line.push_str(&serde_json::Value::from(why).to_string());
        }
    }
    line.push('}');
    line
}

/// [`table_row`] followed by the job's memory table.
fn table_row_memory(job: &PlannedJob) -> String {
    let mut text = table_row(job);
    match memory_of(job) {
        Ok((est, advice)) => text.push_str(&memory::render::table(&est, &advice)),
        Err(why) => text.push_str(&format!("  {why}\n")),
    }
    text
}

fn table_row(job: &PlannedJob) -> String {
    let line = if job.overrides.is_empty() {
        "(defaults)".to_string()
    } else {
        job.overrides.join(" ")
    };
    format!("{:>5}  {}\n", job.num, line)
}

/// The `sbatch` submissions a SLURM sweep makes, as `flotilla run` would make them (the same
/// [`plan_batches`], split at the cluster's `MaxArraySize`): one line per job array, with its
/// jobs, their size and, packed, the allocations; nothing for a sweep on the local launcher.
fn submissions(mut jobs: Vec<JobShape>) -> Result<String, Failure> {
    // Composed on several threads: back in job order, as submission lists them.
    jobs.sort_by_key(|j| j.num);
    jobs.retain(|j| j.compute.launcher == Launcher::Slurm);
    if jobs.is_empty() {
        return Ok(String::new());
    }
    let (max_array_size, from_cluster) = match slurm::max_array_size() {
        Ok(n) => (n, true),
        Err(_) => (slurm::DEFAULT_MAX_ARRAY_SIZE, false),
    };
    let batches = plan_batches(&jobs, Submit::Arrays { max_array_size })
        .map_err(|e| Failure::Other(e.into()))?;
    Ok(describe_batches(&batches, max_array_size, from_cluster))
}
