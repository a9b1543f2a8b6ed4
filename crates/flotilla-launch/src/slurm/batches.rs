//! How a run's jobs become `sbatch` submissions, decided before anything is written or
//! submitted: [`plan_batches`] groups the jobs by `compute` config and task kind (the built-in
//! trainer, or the user's program with its ranks per task or per node), keeping the jobs' order
//! inside each group, and makes each group of a sweep job arrays split so that no array reaches
//! the cluster's `MaxArraySize`, or, with `compute.pack`, one array of packed allocations
//! (at most `MaxArraySize` of them); a single run's job, and each trial of an adaptive study,
//! is one batch job. Submission ([`super::write_scripts`]) renders these batches and
//! `flotilla plan` prints them ([`describe_batches`]), so that the two never disagree.

use super::pack::{pack_shape, PackShape, ADAPTIVE_REFUSAL};
use super::SlurmError;
use flotilla_config::schema::{ComputeConfig, TaskRanks};

/// What grouping needs to know of one job.
pub trait BatchJob {
    /// The job's number in its run or sweep.
    fn num(&self) -> usize;
    /// Its `compute` config.
    fn compute(&self) -> &ComputeConfig;
    /// `None`: the built-in trainer; otherwise the user's program, started per task or per node.
    fn ranks(&self) -> Option<TaskRanks>;
}

/// One job as `flotilla plan` knows it (no directory yet): what grouping needs.
#[derive(Clone, Debug, PartialEq)]
pub struct JobShape {
    pub num: usize,
    pub compute: ComputeConfig,
    pub ranks: Option<TaskRanks>,
}

impl BatchJob for JobShape {
    fn num(&self) -> usize {
        self.num
    }
    fn compute(&self) -> &ComputeConfig {
        &self.compute
    }
    fn ranks(&self) -> Option<TaskRanks> {
        self.ranks
    }
}

/// How a run's jobs are submitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Submit {
    /// A sweep's jobs: job arrays (or arrays of packed allocations) of fewer than
    /// `max_array_size` tasks each.
    Arrays { max_array_size: usize },
    /// One batch job per job: a single run; with `adaptive`, the trials of an adaptive study,
    /// which refuse `compute.pack`.
    Singles { adaptive: bool },
}

/// What one `sbatch` submission is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchKind {
    /// One batch job running one job.
    Single,
    /// A job array: task `i` runs the `i`-th job of the batch.
    Array,
    /// A job array of packed allocations sharing the batch's jobs as one queue.
    Packed(PackShape),
}

/// One `sbatch` submission: its jobs, all with the same `compute` and task kind.
#[derive(Clone, Debug)]
pub struct Batch<'a, J> {
    pub compute: &'a ComputeConfig,
    pub ranks: Option<TaskRanks>,
    /// The jobs it runs, in order.
    pub jobs: Vec<&'a J>,
    pub kind: BatchKind,
}

impl<J> Batch<'_, J> {
    /// The `--array` value of the submission (`0-3%2`), `None` for a single batch job.
    pub fn array_spec(&self) -> Option<String> {
        match &self.kind {
            BatchKind::Single => None,
            BatchKind::Array => Some(array_range(self.jobs.len(), self.compute.array_parallelism)),
            BatchKind::Packed(shape) => Some(array_range(shape.allocations, 0)),
        }
    }
}

/// `sbatch --array`'s value for `tasks` tasks at most `parallelism` at once (`0`: no limit):
/// `0-N` or `0-N%P`.
pub fn array_range(tasks: usize, parallelism: usize) -> String {
    let mut a = format!("0-{}", tasks.max(1) - 1);
    if parallelism > 0 {
        a.push_str(&format!("%{parallelism}"));
    }
    a
}

/// The submissions of `jobs` (see the module doc): groups in the order of their first job,
/// each split at `MaxArraySize` (`Submit::Arrays`) or one batch job per job
/// (`Submit::Singles`). An adaptive study's job with `compute.pack` is refused.
pub fn plan_batches<J: BatchJob>(jobs: &[J], how: Submit) -> Result<Vec<Batch<'_, J>>, SlurmError> {
    // Group by compute config and task kind, keeping the jobs' order inside each group.
    let mut groups: Vec<(&ComputeConfig, Option<TaskRanks>, Vec<&J>)> = Vec::new();
    for job in jobs {
        match groups
            .iter_mut()
            .find(|(c, r, _)| *c == job.compute() && *r == job.ranks())
        {
            Some((_, _, g)) => g.push(job),
            None => groups.push((job.compute(), job.ranks(), vec![job])),
        }
    }
    let mut out = Vec::new();
    for (compute, ranks, group) in groups {
        match how {
            Submit::Singles { adaptive } => {
                if adaptive && pack_shape(compute, group.len()).is_some() {
                    return Err(SlurmError::Parameter {
                        key: "compute.pack".into(),
                        message: ADAPTIVE_REFUSAL.into(),
                    });
                }
                out.extend(group.into_iter().map(|job| Batch {
                    compute,
                    ranks,
                    jobs: vec![job],
                    kind: BatchKind::Single,
                }));
            }
            Submit::Arrays { max_array_size } => {
                let max_array = max_array_size.max(1);
                if let Some(mut shape) = pack_shape(compute, group.len()) {
                    shape.allocations = shape.allocations.min(max_array);
                    out.push(Batch {
                        compute,
                        ranks,
                        jobs: group,
                        kind: BatchKind::Packed(shape),
                    });
                    continue;
                }
                out.extend(group.chunks(max_array).map(|chunk| Batch {
                    compute,
                    ranks,
                    jobs: chunk.to_vec(),
                    kind: BatchKind::Array,
                }));
            }
        }
    }
    Ok(out)
}

/// Job numbers as ranges: `0-3,7,9-10`.
pub fn num_ranges(nums: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < nums.len() {
        let mut j = i;
        while j + 1 < nums.len() && nums[j + 1] == nums[j] + 1 {
            j += 1;
        }
        parts.push(if j == i {
            nums[i].to_string()
        } else {
            format!("{}-{}", nums[i], nums[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

fn plural(n: usize, word: &str) -> String {
    format!("{n} {word}{}", if n == 1 { "" } else { "s" })
}

/// What the jobs run, in words.
fn task_kind(ranks: Option<TaskRanks>) -> &'static str {
    match ranks {
        None => "built-in trainer",
        Some(TaskRanks::PerTask) => "your program, one process per rank",
        Some(TaskRanks::PerNode) => "your program, one process per node",
    }
}

/// The submissions `batches` make, as `flotilla plan` prints them: a heading naming the
/// `MaxArraySize` they were split at (`from_cluster`: as `scontrol show config` gave it, else
/// Slurm's default), then one line per `sbatch` call with its `--array`, its jobs and their
/// size; a packed array also says how its jobs share the allocations.
pub fn describe_batches<J: BatchJob>(
    batches: &[Batch<'_, J>],
    max_array_size: usize,
    from_cluster: bool,
) -> String {
    let mut out = format!(
        "sbatch: {} (MaxArraySize {max_array_size}{})\n",
        plural(batches.len(), "submission"),
        if from_cluster {
            ""
        } else {
            ", Slurm's default: `scontrol show config` did not answer"
        }
    );
    for (k, b) in batches.iter().enumerate() {
        let nums: Vec<usize> = b.jobs.iter().map(|j| j.num()).collect();
        let c = b.compute;
        let what = task_kind(b.ranks);
        let line = match &b.kind {
            BatchKind::Single => format!(
                "batch job: job {} ({} x {} each{}; {what})",
                num_ranges(&nums),
                plural(c.nodes, "node"),
                plural(c.tasks_per_node, "task"),
                gpus(c.gpus_per_node, " per node"),
            ),
            BatchKind::Array => format!(
                "job array --array={}: {} ({}), {} x {} each{}; {what}",
                b.array_spec().unwrap_or_default(),
                plural(nums.len(), "job"),
                num_ranges(&nums),
                plural(c.nodes, "node"),
                plural(c.tasks_per_node, "task"),
                gpus(c.gpus_per_node, " per node"),
            ),
            BatchKind::Packed(s) => format!(
                "job array --array={}, packed: {} ({}) into {} of 1 node ({} slots: {} CPUs{}{}), \
                 {} at a time in each ({} per job; {what})",
                b.array_spec().unwrap_or_default(),
                plural(nums.len(), "job"),
                num_ranges(&nums),
                plural(s.allocations, "allocation"),
                s.slots,
                s.cpus,
                gpus(s.gpus, ""),
                s.mem_gb.map(|m| format!(", {m}G")).unwrap_or_default(),
                plural(s.jobs_at_once, "job"),
                plural(s.ranks_per_job, "rank"),
            ),
        };
        out.push_str(&format!("  {}. {line}\n", k + 1));
    }
    out
}

/// `, N GPUs<suffix>`, or nothing without GPUs.
fn gpus(n: usize, suffix: &str) -> String {
    if n == 0 {
        String::new()
    } else {
        format!(", {}{suffix}", plural(n, "GPU"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compute(pack: Option<usize>, tasks_per_node: usize) -> ComputeConfig {
        serde_json::from_value(serde_json::json!({
            "launcher": "slurm", "nodes": 1, "tasks_per_node": tasks_per_node,
            "gpus_per_node": 1, "cpus_per_task": 1, "mem_gb": 4, "timeout_min": 5,
            "partition": null, "account": null, "qos": null, "constraint": null,
            "array_parallelism": 256, "pack": pack, "signal_delay_s": 90,
            "max_num_timeout": 3, "setup": [], "additional_parameters": {}, "template": null,
            "max_parallel": 1, "gpu_type": null, "gpu_mem_gb": null, "check_memory": true
        }))
        .unwrap()
    }

    fn jobs(list: &[(ComputeConfig, Option<TaskRanks>)]) -> Vec<JobShape> {
        list.iter()
            .enumerate()
            .map(|(num, (compute, ranks))| JobShape {
                num,
                compute: compute.clone(),
                ranks: *ranks,
            })
            .collect()
    }

    fn nums<J: BatchJob>(b: &Batch<'_, J>) -> Vec<usize> {
        b.jobs.iter().map(|j| j.num()).collect()
    }

    #[test]
    fn arrays_split_at_max_array_size_and_group_by_compute_and_task_kind() {
        let (a, b) = (compute(None, 1), compute(None, 2));
        let user = Some(TaskRanks::PerTask);
        let list = jobs(&[
            (a.clone(), None),
            (b.clone(), None),
            (a.clone(), None),
            (a.clone(), user),
            (a.clone(), None),
            (a.clone(), None),
        ]);
        let batches = plan_batches(&list, Submit::Arrays { max_array_size: 2 }).unwrap();
        let got: Vec<Vec<usize>> = batches.iter().map(nums).collect();
        assert_eq!(got, [vec![0, 2], vec![4, 5], vec![1], vec![3]]);
        assert!(batches.iter().all(|b| b.kind == BatchKind::Array));
        assert_eq!(batches[0].array_spec().as_deref(), Some("0-1%256"));
        assert_eq!(batches[3].ranks, user);
        let text = describe_batches(&batches, 2, true);
        assert_eq!(
            text,
            "sbatch: 4 submissions (MaxArraySize 2)\n\
             \x20 1. job array --array=0-1%256: 2 jobs (0,2), 1 node x 1 task each, 1 GPU per node; built-in trainer\n\
             \x20 2. job array --array=0-1%256: 2 jobs (4-5), 1 node x 1 task each, 1 GPU per node; built-in trainer\n\
             \x20 3. job array --array=0-0%256: 1 job (1), 1 node x 2 tasks each, 1 GPU per node; built-in trainer\n\
             \x20 4. job array --array=0-0%256: 1 job (3), 1 node x 1 task each, 1 GPU per node; your program, one process per rank\n"
        );
    }

    #[test]
    fn packed_groups_are_capped_at_max_array_size_and_split_by_task_kind() {
        let p = compute(Some(2), 1);
        let list = jobs(&[
            (p.clone(), Some(TaskRanks::PerTask)),
            (p.clone(), Some(TaskRanks::PerNode)),
            (p.clone(), Some(TaskRanks::PerTask)),
            (p.clone(), Some(TaskRanks::PerTask)),
            (p.clone(), Some(TaskRanks::PerTask)),
            (p.clone(), Some(TaskRanks::PerTask)),
            (p.clone(), Some(TaskRanks::PerTask)),
            (p.clone(), Some(TaskRanks::PerTask)),
            (p.clone(), Some(TaskRanks::PerTask)),
            (p.clone(), Some(TaskRanks::PerTask)),
            (p.clone(), Some(TaskRanks::PerTask)),
            (p.clone(), Some(TaskRanks::PerTask)),
            (p.clone(), Some(TaskRanks::PerTask)),
        ]);
        let batches = plan_batches(&list, Submit::Arrays { max_array_size: 4 }).unwrap();
        assert_eq!(batches.len(), 2);
        assert_eq!(nums(&batches[1]), [1]);
        let BatchKind::Packed(shape) = &batches[0].kind else {
            panic!("{:?}", batches[0].kind)
        };
        // 12 jobs, 2 at a time: 6 allocations, but an array holds at most 4 tasks.
        assert_eq!((shape.allocations, shape.jobs_at_once), (4, 2));
        assert_eq!(batches[0].array_spec().as_deref(), Some("0-3"));
        let text = describe_batches(&batches, 4, false);
        assert!(
            text.starts_with("sbatch: 2 submissions (MaxArraySize 4, Slurm's default"),
            "{text}"
        );
        assert!(
            text.contains(
                "  1. job array --array=0-3, packed: 12 jobs (0,2-12) into 4 allocations of 1 \
                 node (2 slots: 2 CPUs, 2 GPUs, 8G), 2 jobs at a time in each (1 rank per job; \
                 your program, one process per rank)\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("  2. job array --array=0-0, packed: 1 job (1) into 1 allocation"),
            "{text}"
        );
    }

    #[test]
    fn singles_are_one_batch_job_each_and_an_adaptive_study_refuses_pack() {
        let a = compute(None, 1);
        let list = jobs(&[(a.clone(), None), (a.clone(), None)]);
        let batches = plan_batches(&list, Submit::Singles { adaptive: true }).unwrap();
        assert_eq!(batches.len(), 2);
        assert!(batches.iter().all(|b| b.kind == BatchKind::Single));
        assert_eq!(batches[1].array_spec(), None);
        let packed = jobs(&[(compute(Some(4), 1), None)]);
        let err = plan_batches(&packed, Submit::Singles { adaptive: true }).unwrap_err();
        assert!(err.to_string().contains("compute.pack"), "{err}");
        // A single run is never packed.
        let one = plan_batches(&packed, Submit::Singles { adaptive: false }).unwrap();
        assert_eq!(one[0].kind, BatchKind::Single);
    }

    #[test]
    fn ranges() {
        assert_eq!(num_ranges(&[0, 1, 2, 3, 7, 9, 10]), "0-3,7,9-10");
        assert_eq!(num_ranges(&[4]), "4");
        assert_eq!(num_ranges(&[]), "");
        assert_eq!(array_range(4, 0), "0-3");
        assert_eq!(array_range(1, 2), "0-0%2");
    }
}
