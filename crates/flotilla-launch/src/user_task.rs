//! The user's own program as a job runs it (`flotilla.task`): what every process of the job
//! does before the program starts (`flotilla exec-task JOB_DIR`): read `task.json` and its place
//! in the job from the launcher's variables (torchrun's, or SLURM's), set torchrun's variables
//! (or, for `ranks: per_node`, the per-node variables a `torchrun` reads), `FLOTILLA_CONFIG` and
//! `FLOTILLA_SWEEP_DIR`, fill the argv placeholders, change directory and `exec` the program, so
//! that the program is the launcher's child itself (signals, exit status, process group).
//! Local runs and SLURM jobs go through this one path.
//!
//! The resolved task a job directory keeps in `task.json` ([`TaskSpec`], with the check that
//! its program exists) belongs to the job directory's layout and lives in
//! [`crate::rundir::task`]; it is re-exported here.

use crate::hydra_job;
use crate::rundir::{CONFIG_FILE, SWEEP_FILE};
use flotilla_config::schema::{ConfigArg, TaskRanks};
use flotilla_contract::rank::{discover, RankEnv, RankInfo};
use std::path::{Path, PathBuf};

pub use crate::rundir::task::{TaskError, TaskSpec, TASK_FILE};

/// Argv placeholders filled for each process.
pub const PLACEHOLDERS: [&str; 10] = [
    "{job_dir}",
    "{job_num}",
    "{rank}",
    "{local_rank}",
    "{world_size}",
    "{node_rank}",
    "{nnodes}",
    "{nproc_per_node}",
    "{master_addr}",
    "{master_port}",
];

/// Variables a per-node process must not inherit from a per-task placement: they would describe
/// the node, not a worker (torchrun sets them for its workers).
const PER_TASK_ONLY: [&str; 10] = [
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "ROLE_NAME",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
];

/// `s` as one value of Hydra's override grammar: as it is when it is a plain path, else in
/// single quotes with `\` and `'` escaped.
fn hydra_quote(s: &str) -> String {
    let plain = s
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/_.-+".contains(c));
    if plain && !s.is_empty() {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
    }
}

/// The sweep directory holding `job_dir`, when it belongs to one.
fn sweep_dir_of(job_dir: &Path) -> Option<PathBuf> {
    job_dir
        .ancestors()
        .skip(1)
        .take(8)
        .find(|a| a.join(SWEEP_FILE).is_file())
        .map(Path::to_path_buf)
}

/// What one process of a task runs: the program, its arguments, its directory, and the
/// variables set and removed on top of the inherited environment.
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessPlan {
    pub argv: Vec<String>,
    pub cwd: PathBuf,
    pub set: Vec<(String, String)>,
    pub remove: Vec<String>,
}

/// The process of `spec` placed at `place` in the job of `job_dir` (number `job_num`).
pub fn process_plan(
    spec: &TaskSpec,
    job_dir: &Path,
    job_num: Option<&str>,
    place: &RankInfo,
) -> ProcessPlan {
    let mut set: Vec<(String, String)> = Vec::new();
    let mut remove: Vec<String> = Vec::new();
    let master_port = place.master_port.to_string();
    // The run's id: the launcher's (torchrun's, or the SLURM job), else one named by the job.
    let run_id = place.job_id.clone().unwrap_or_else(|| match job_num {
        Some(n) => format!("flotilla-job-{n}"),
        None => "flotilla".to_string(),
    });
    let (nnodes, node_rank) = match spec.ranks {
        TaskRanks::PerTask => (place.num_nodes, place.node_rank),
        // One process per node: the node is the process's rank in the launcher's placement.
        TaskRanks::PerNode => (spec.compute.nodes, place.rank),
    };
    match spec.ranks {
        TaskRanks::PerTask => {
            let mut place = place.clone();
            place.job_id = Some(run_id);
            set.extend(
                RankEnv {
                    place,
                    threads: None,
                    visible_devices: None,
                }
                .vars(),
            );
        }
        TaskRanks::PerNode => {
            remove.extend(PER_TASK_ONLY.iter().map(|s| s.to_string()));
            let n = node_rank.to_string();
            set.extend([
                ("MASTER_ADDR".to_string(), place.master_addr.clone()),
                ("MASTER_PORT".to_string(), master_port.clone()),
                ("NODE_RANK".to_string(), n.clone()),
                ("GROUP_RANK".to_string(), n.clone()),
                ("GROUP_WORLD_SIZE".to_string(), nnodes.to_string()),
                ("PET_NNODES".to_string(), nnodes.to_string()),
                (
                    "PET_NPROC_PER_NODE".to_string(),
                    spec.compute.tasks_per_node.to_string(),
                ),
                ("PET_NODE_RANK".to_string(), n),
                ("PET_MASTER_ADDR".to_string(), place.master_addr.clone()),
                ("PET_MASTER_PORT".to_string(), master_port.clone()),
                ("PET_RDZV_ID".to_string(), run_id),
            ]);
        }
    }
    let job_dir_text = job_dir.display().to_string();
    set.push(("FLOTILLA_JOB_DIR".into(), job_dir_text.clone()));
    set.push((
        "FLOTILLA_CONFIG".into(),
        job_dir.join(CONFIG_FILE).display().to_string(),
    ));
    if let Some(n) = job_num {
        set.push(("FLOTILLA_JOB_NUM".into(), n.to_string()));
    }
    match sweep_dir_of(job_dir) {
        Some(sweep) => set.push(("FLOTILLA_SWEEP_DIR".into(), sweep.display().to_string())),
        None => remove.push("FLOTILLA_SWEEP_DIR".into()),
    }
    for (k, v) in &spec.env {
        set.retain(|(key, _)| key != k);
        remove.retain(|key| key != k);
        set.push((k.clone(), v.clone()));
    }

    let values: [String; 10] = [
        job_dir_text.clone(),
        job_num.unwrap_or("0").to_string(),
        place.rank.to_string(),
        place.local_rank.to_string(),
        place.world_size.to_string(),
        node_rank.to_string(),
        nnodes.to_string(),
        spec.compute.tasks_per_node.to_string(),
        place.master_addr.clone(),
        master_port,
    ];
    let fill = |arg: &str| {
        let mut out = arg.to_string();
        for (p, v) in PLACEHOLDERS.iter().zip(&values) {
            if out.contains(p) {
                out = out.replace(p, v);
            }
        }
        out
    };
    let mut argv: Vec<String> = spec.argv.iter().map(|a| fill(a)).collect();
    if spec.config_arg == Some(ConfigArg::Hydra) {
        argv.extend([
            format!("--config-path={job_dir_text}"),
            format!("--config-name={}", CONFIG_FILE.trim_end_matches(".yaml")),
            format!("hydra.run.dir={}", hydra_quote(&job_dir_text)),
        ]);
        if spec.hydra_job.is_some() {
            argv.extend(hydra_job::callback_overrides(job_dir, hydra_quote));
            let module_dir = job_dir.join(hydra_job::MODULE_DIR).display().to_string();
            let inherited = spec
                .env
                .get("PYTHONPATH")
                .cloned()
                .or_else(|| std::env::var("PYTHONPATH").ok())
                .filter(|p| !p.is_empty());
            let path = match inherited {
                Some(p) => format!("{module_dir}:{p}"),
                None => module_dir,
            };
            set.retain(|(k, _)| k != "PYTHONPATH");
            set.push(("PYTHONPATH".into(), path));
        }
    }
    ProcessPlan {
        argv,
        cwd: spec.cwd.clone(),
        set,
        remove,
    }
}

/// `flotilla exec-task JOB_DIR`: becomes the job's program (see the module documentation).
/// Returns only on failure.
pub fn exec(job_dir: &Path) -> TaskError {
    use std::os::unix::process::CommandExt;
    let job_dir = std::path::absolute(job_dir).unwrap_or_else(|_| job_dir.to_path_buf());
    let spec = match TaskSpec::read(&job_dir) {
        Ok(Some(spec)) => spec,
        Ok(None) => {
            return TaskError::Place(format!(
                "{}: no {TASK_FILE}; this job runs the built-in trainer",
                job_dir.display()
            ))
        }
        Err(e) => return e,
    };
    let mut place = match discover(&|name| std::env::var(name).ok()) {
        Ok(p) => p,
        Err(e) => return TaskError::Place(e.to_string()),
    };
    // Under SLURM the scheduler's job names the run, and its restarts count.
    if place.job_id.is_none() {
        place.job_id = std::env::var("SLURM_JOB_ID").ok().filter(|v| !v.is_empty());
        if let Some(n) = std::env::var("SLURM_RESTART_COUNT")
            .ok()
            .and_then(|v| v.parse().ok())
        {
            place.restart_count = n;
        }
    }
    let job_num = std::env::var("FLOTILLA_JOB_NUM").ok();
    if spec.hydra_job.is_some() {
        if let Err(e) = hydra_job::install(&job_dir) {
            return e.into();
        }
    }
    let plan = process_plan(&spec, &job_dir, job_num.as_deref(), &place);
    let Some((program, args)) = plan.argv.split_first() else {
        return TaskError::Place("flotilla.task.command is empty".into());
    };
    let mut cmd = std::process::Command::new(program);
    cmd.args(args).current_dir(&plan.cwd);
    for k in &plan.remove {
        cmd.env_remove(k);
    }
    cmd.envs(plan.set.iter().map(|(k, v)| (k, v)));
    let error = cmd.exec();
    TaskError::Place(format!(
        "cannot start `{program}` in {}: {error}",
        plan.cwd.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_config::schema::ComputeConfig;
    use indexmap::IndexMap;

    fn compute() -> ComputeConfig {
        let defaults = flotilla_config::yaml::load_str(
            flotilla_config::schema::USER_TASK_COMPUTE_DEFAULTS,
            "t",
        )
        .unwrap();
        let task = flotilla_config::yaml::load_str(
            "{command: [x], ranks: per_task, cwd: null, env: {}, config_arg: null, starts_workers: false}",
            "t",
        )
        .unwrap();
        let (_, mut c) = flotilla_config::schema::validate_user_task(&task, &defaults).unwrap();
        c.nodes = 2;
        c.tasks_per_node = 4;
        c
    }

    fn spec(ranks: TaskRanks) -> TaskSpec {
        TaskSpec {
            argv: vec![
                "torchrun".into(),
                "--node-rank={node_rank}".into(),
                "{job_dir}/x".into(),
            ],
            ranks,
            cwd: PathBuf::from("/srv/project"),
            env: IndexMap::from([("EXTRA".to_string(), "1".to_string())]),
            config_arg: None,
            compute: compute(),
            hydra_job: None,
        }
    }

    fn get<'a>(plan: &'a ProcessPlan, key: &str) -> Option<&'a str> {
        plan.set
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    #[test]
    fn per_task_processes_get_torchruns_variables() {
        let place = RankEnv::on_this_host(5, 2, 4, 29500).place;
        let plan = process_plan(
            &spec(TaskRanks::PerTask),
            Path::new("/runs/a"),
            Some("3"),
            &place,
        );
        assert_eq!(get(&plan, "RANK"), Some("5"));
        assert_eq!(get(&plan, "LOCAL_RANK"), Some("1"));
        assert_eq!(get(&plan, "GROUP_RANK"), Some("1"));
        assert_eq!(get(&plan, "ROLE_RANK"), Some("5"));
        assert_eq!(get(&plan, "TORCHELASTIC_RUN_ID"), Some("flotilla-job-3"));
        assert_eq!(get(&plan, "FLOTILLA_CONFIG"), Some("/runs/a/config.yaml"));
        assert_eq!(get(&plan, "EXTRA"), Some("1"));
        assert_eq!(plan.argv[1], "--node-rank=1");
        assert_eq!(plan.argv[2], "/runs/a/x");
        assert!(plan.remove.contains(&"FLOTILLA_SWEEP_DIR".to_string()));
    }

    #[test]
    fn per_node_processes_get_torchruns_launcher_variables() {
        // The launcher placed one process per node: process 1 of 2.
        let place = RankEnv::on_this_host(1, 2, 1, 29500).place;
        let plan = process_plan(&spec(TaskRanks::PerNode), Path::new("/r"), None, &place);
        assert_eq!(get(&plan, "PET_NNODES"), Some("2"));
        assert_eq!(get(&plan, "PET_NPROC_PER_NODE"), Some("4"));
        assert_eq!(get(&plan, "PET_NODE_RANK"), Some("1"));
        assert_eq!(get(&plan, "PET_MASTER_PORT"), Some("29500"));
        assert_eq!(get(&plan, "RANK"), None);
        assert!(plan.remove.contains(&"RANK".to_string()));
        assert_eq!(plan.argv[1], "--node-rank=1");
    }

    #[test]
    fn hydra_gets_the_job_config_and_a_quoted_run_dir() {
        let mut s = spec(TaskRanks::PerTask);
        s.argv = vec!["python".into(), "app.py".into()];
        s.config_arg = Some(ConfigArg::Hydra);
        let place = RankInfo::single();
        let plan = process_plan(&s, Path::new("/m/lr=1,seed=2"), None, &place);
        assert_eq!(
            plan.argv[2..],
            [
                "--config-path=/m/lr=1,seed=2",
                "--config-name=config",
                "hydra.run.dir='/m/lr=1,seed=2'"
            ]
        );
        assert_eq!(hydra_quote("/a/b_c-1.2"), "/a/b_c-1.2");
        assert_eq!(hydra_quote("it's"), "'it\\'s'");
    }
}
