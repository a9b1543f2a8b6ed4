//! Jobs grouped into configurations (`flotilla report --group-by seed`): the jobs whose swept
//! keys are equal once the grouped keys are left out form one configuration, shown as one
//! row with the mean, the sample standard deviation (n − 1 in the denominator) and the count
//! of its jobs' best values (and of their final values), ranked by the mean.

use super::{compare_json, nones_last, Mode, Report, ReportError};
use indexmap::IndexMap;
use serde::Serialize;
use serde_json::Value;

/// What the `std` of a group is, as the JSON document says it.
pub const STD_KIND: &str = "sample standard deviation (n - 1 in the denominator)";

/// The configurations of a report grouped over some swept keys.
#[derive(Clone, Debug, Serialize)]
pub struct Groups {
    /// The keys grouped over, as the jobs' overrides name them.
    pub by: Vec<String>,
    /// What `std` means: [`STD_KIND`].
    pub std_kind: &'static str,
    /// The configurations, best mean first (or in the order asked for).
    pub groups: Vec<Group>,
}

/// One configuration and the statistics over its jobs.
#[derive(Clone, Debug, Serialize)]
pub struct Group {
    /// The configuration: its swept keys (other than those grouped over) that differ across
    /// the configurations.
    pub params: IndexMap<String, Value>,
    /// Each grouped key's values among the group's jobs, in job order.
    pub grouped: IndexMap<String, Vec<Value>>,
    /// The numbers of the group's jobs.
    pub jobs: Vec<usize>,
    /// The jobs with a finite best value: what the statistics are over.
    pub n: usize,
    /// The mean of the jobs' best values.
    pub mean: Option<f64>,
    /// Their sample standard deviation (n − 1 in the denominator); `None` below two values.
    pub std: Option<f64>,
    /// The mean and sample standard deviation of the jobs' final values.
    pub final_mean: Option<f64>,
    pub final_std: Option<f64>,
    /// The jobs left out of the statistics, and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The group's rows in the report's `jobs`.
    #[serde(skip)]
    pub rows: Vec<usize>,
}

impl Groups {
    /// Whether `g` is the best configuration: the first by mean among those with one.
    pub fn is_best(&self, g: &Group, mode: Mode) -> bool {
        self.best(mode).is_some_and(|b| std::ptr::eq(b, g))
    }

    /// The configuration with the best mean (the first among equals).
    pub fn best(&self, mode: Mode) -> Option<&Group> {
        let mut best: Option<&Group> = None;
        for g in &self.groups {
            let Some(m) = g.mean else { continue };
            if best.is_none_or(|b| b.mean.is_some_and(|bm| mode.better(m, bm))) {
                best = Some(g);
            }
        }
        best
    }

    /// The configuration columns, in the first group's order.
    pub fn param_keys(&self) -> Vec<String> {
        self.groups
            .first()
            .map(|g| g.params.keys().cloned().collect())
            .unwrap_or_default()
    }
}

/// The mean and the sample standard deviation (n − 1 in the denominator) of `values`: `None`
/// for no value, and a `None` deviation for one.
pub fn mean_std(values: &[f64]) -> (Option<f64>, Option<f64>) {
    if values.is_empty() {
        return (None, None);
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    if values.len() < 2 {
        return (Some(mean), None);
    }
    let squares: f64 = values.iter().map(|v| (v - mean).powi(2)).sum();
    (Some(mean), Some((squares / (n - 1.0)).sqrt()))
}

/// The override key that `asked` names: itself, or the one key ending in `.asked`.
fn resolve(asked: &str, swept: &[&str]) -> Option<String> {
    if swept.contains(&asked) {
        return Some(asked.to_string());
    }
    let suffix = format!(".{asked}");
    let matches: Vec<&&str> = swept.iter().filter(|k| k.ends_with(&suffix)).collect();
    (matches.len() == 1).then(|| matches[0].to_string())
}

/// Groups the jobs of `report` over the swept keys `by` (override keys, or their last
/// dotted components), in the order the configurations first appear.
pub fn group(report: &Report, by: &[String]) -> Result<Groups, ReportError> {
    let mut swept: Vec<&str> = Vec::new();
    for r in &report.jobs {
        for k in r.overrides.keys() {
            if !swept.contains(&k.as_str()) {
                swept.push(k);
            }
        }
    }
    let keys: Vec<String> = by
        .iter()
        .map(|asked| {
            resolve(asked, &swept).ok_or_else(|| ReportError::GroupKey {
                key: asked.clone(),
                swept: if swept.is_empty() {
                    "none".into()
                } else {
                    swept.join(", ")
                },
            })
        })
        .collect::<Result<_, _>>()?;
    // The configuration of each job: its overrides without the grouped keys, by key.
    let mut index: IndexMap<String, Vec<usize>> = IndexMap::new();
    for (i, r) in report.jobs.iter().enumerate() {
        let mut config: Vec<(&String, &Value)> = r
            .overrides
            .iter()
            .filter(|(k, _)| !keys.contains(k))
            .collect();
        config.sort_by(|a, b| a.0.cmp(b.0));
        let identity = serde_json::to_string(&config).unwrap_or_default();
        index.entry(identity).or_default().push(i);
    }
    // The configuration columns: the remaining swept keys whose values differ between groups.
    let value_of = |i: usize, key: &str| -> Value {
        let r = &report.jobs[i];
        r.params
            .get(key)
            .or_else(|| r.overrides.get(key))
            .cloned()
            .unwrap_or(Value::Null)
    };
    let columns: Vec<&str> = swept
        .iter()
        .copied()
        .filter(|k| !keys.iter().any(|g| g == k))
        .filter(|k| {
            let mut values = index.values().map(|rows| value_of(rows[0], k));
            let first = values.next();
            values.any(|v| Some(v) != first)
        })
        .collect();
    let groups = index
        .into_values()
        .map(|rows| {
            let finite = |f: fn(&super::JobRow) -> Option<f64>| -> Vec<f64> {
                rows.iter()
                    .filter_map(|&i| f(&report.jobs[i]).filter(|v| v.is_finite()))
                    .collect()
            };
            let best = finite(|r| r.best);
            let (mean, std) = mean_std(&best);
            let (final_mean, final_std) = mean_std(&finite(|r| r.final_value));
            let left_out: Vec<String> = rows
                .iter()
                .map(|&i| &report.jobs[i])
                .filter(|r| !r.best.is_some_and(f64::is_finite))
                .map(|r| format!("{} {}", r.num, r.state))
                .collect();
            Group {
                params: columns
                    .iter()
                    .map(|k| (k.to_string(), value_of(rows[0], k)))
                    .collect(),
                grouped: keys
                    .iter()
                    .map(|k| {
                        let values = rows
                            .iter()
                            .map(|&i| {
                                report.jobs[i]
                                    .overrides
                                    .get(k)
                                    .cloned()
                                    .unwrap_or(Value::Null)
                            })
                            .collect();
                        (k.clone(), values)
                    })
                    .collect(),
                jobs: rows.iter().map(|&i| report.jobs[i].num).collect(),
                n: best.len(),
                mean,
                std,
                final_mean,
                final_std,
                reason: (!left_out.is_empty()).then(|| {
                    format!(
                        "without a best {}: job{} {}",
                        report.metric,
                        if left_out.len() == 1 { "" } else { "s" },
                        left_out.join(", ")
                    )
                }),
                rows,
            }
        })
        .collect();
    Ok(Groups {
        by: keys,
        std_kind: STD_KIND,
        groups,
    })
}

/// The columns groups can be sorted by, for the error message.
const SORT_COLUMNS: [&str; 4] = ["mean", "std", "n", "final"];

/// Sorts the groups by `key` (`mean`, the default, or `best`; `std`; `n`; `final`, the mean
/// final value; or a configuration key); metric columns best first, a missing value last.
pub fn sort_groups(groups: &mut Groups, key: Option<&str>, mode: Mode) -> Result<(), ReportError> {
    let by_metric = |a: Option<f64>, b: Option<f64>| {
        nones_last(a, b, |x, y| match mode {
            Mode::Min => x.total_cmp(&y),
            Mode::Max => y.total_cmp(&x),
        })
    };
    let list = &mut groups.groups;
    match key.unwrap_or("mean") {
        "mean" | "best" => list.sort_by(|a, b| by_metric(a.mean, b.mean)),
        "final" => list.sort_by(|a, b| by_metric(a.final_mean, b.final_mean)),
        "std" => list.sort_by(|a, b| nones_last(a.std, b.std, |x, y| x.total_cmp(&y))),
        "n" => list.sort_by_key(|g| std::cmp::Reverse(g.n)),
        param if list.iter().any(|g| g.params.contains_key(param)) => {
            list.sort_by(|a, b| compare_json(a.params.get(param), b.params.get(param)))
        }
        other => {
            let mut choices: Vec<String> = SORT_COLUMNS.iter().map(|s| s.to_string()).collect();
            if let Some(g) = list.first() {
                choices.extend(g.params.keys().cloned());
            }
            return Err(ReportError::SortKey {
                key: other.into(),
                choices: choices.join(", "),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::JobRow;
    use flotilla_launch::rundir::JobState;
    use serde_json::json;
    use std::path::PathBuf;

    fn job(num: usize, lr: f64, seed: u64, best: Option<f64>) -> JobRow {
        let overrides: IndexMap<String, Value> = [
            ("trainer.lr".to_string(), json!(lr)),
            ("seed".to_string(), json!(seed)),
        ]
        .into_iter()
        .collect();
        JobRow {
            num,
            dir: PathBuf::from(format!("s/{num}")),
            sweep: None,
            state: if best.is_some() {
                JobState::Completed
            } else {
                JobState::Failed
            },
            params: overrides.clone(),
            overrides,
            final_value: best.map(|b| b + 1.0),
            best,
            best_step: best.map(|_| 9),
            steps: 10,
            wall_s: None,
            tokens_per_s: None,
            reason: None,
            metrics: Default::default(),
            final_model: None,
        }
    }

    fn report(jobs: Vec<JobRow>) -> Report {
        Report {
            metric: "eval_loss".into(),
            mode: Mode::Min,
            groups: None,
            jobs,
            best: None,
        }
    }

    #[test]
    fn mean_and_sample_std_by_hand() {
        // 2, 4, 4, 4, 5, 5, 7, 9: mean 5, squares 32, sample variance 32/7.
        let (mean, std) = mean_std(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!(mean, Some(5.0));
        assert!((std.unwrap() - (32.0f64 / 7.0).sqrt()).abs() < 1e-15);
        assert_eq!(mean_std(&[3.5]), (Some(3.5), None));
        assert_eq!(mean_std(&[]), (None, None));
    }

    #[test]
    fn seeds_group_into_configurations_ranked_by_their_mean() {
        let jobs = vec![
            job(0, 0.1, 1, Some(1.0)),
            job(1, 0.1, 2, Some(2.0)),
            job(2, 0.1, 3, Some(4.5)),
            job(3, 0.2, 1, Some(1.5)),
            job(4, 0.2, 2, Some(1.7)),
            job(5, 0.2, 3, None),
            job(6, 0.3, 1, Some(0.9)),
        ];
        let report = report(jobs);
        let mut g = group(&report, &["seed".to_string()]).unwrap();
        sort_groups(&mut g, None, Mode::Min).unwrap();
        let lrs: Vec<&Value> = g.groups.iter().map(|g| &g.params["trainer.lr"]).collect();
        assert_eq!(lrs, [&json!(0.3), &json!(0.2), &json!(0.1)]);
        let [a, b, c] = &g.groups[..] else { panic!() };
        // lr 0.3: one job, no deviation.
        assert_eq!((a.n, a.mean, a.std), (1, Some(0.9), None));
        // lr 0.2: 1.5 and 1.7 (job 5 failed): mean 1.6, sample std sqrt(0.02).
        assert_eq!(b.n, 2);
        assert!((b.mean.unwrap() - 1.6).abs() < 1e-12);
        assert!((b.std.unwrap() - 0.02f64.sqrt()).abs() < 1e-12);
        assert_eq!(b.jobs, [3, 4, 5]);
        assert_eq!(b.grouped["seed"], [json!(1), json!(2), json!(3)]);
        assert_eq!(
            b.reason.as_deref(),
            Some("without a best eval_loss: job 5 FAILED")
        );
        // lr 0.1: 1, 2, 4.5: mean 2.5, squares 2.25 + 0.25 + 4 = 6.5, sample std sqrt(3.25).
        assert!((c.mean.unwrap() - 2.5).abs() < 1e-12);
        assert!((c.std.unwrap() - 3.25f64.sqrt()).abs() < 1e-12);
        assert!((c.final_mean.unwrap() - 3.5).abs() < 1e-12);
        assert!(g.is_best(a, Mode::Min) && !g.is_best(b, Mode::Min));
        // Higher is better: the order turns round.
        sort_groups(&mut g, None, Mode::Max).unwrap();
        assert_eq!(g.groups[0].params["trainer.lr"], json!(0.1));
        sort_groups(&mut g, Some("std"), Mode::Min).unwrap();
        assert_eq!(g.groups[0].params["trainer.lr"], json!(0.2));
        assert!(matches!(
            sort_groups(&mut g, Some("warmup"), Mode::Min),
            Err(ReportError::SortKey { .. })
        ));
    }

    #[test]
    fn a_key_is_named_whole_or_by_its_last_part_and_must_be_swept() {
        let report = report(vec![job(0, 0.1, 1, Some(1.0)), job(1, 0.1, 2, Some(3.0))]);
        let g = group(&report, &["lr".to_string()]).unwrap();
        assert_eq!(g.by, ["trainer.lr"]);
        // Over the learning rate, the seeds are the configurations.
        assert_eq!(g.groups.len(), 2);
        assert_eq!(g.groups[0].params.keys().collect::<Vec<_>>(), ["seed"]);
        let g = group(&report, &["seed".to_string(), "trainer.lr".to_string()]).unwrap();
        assert_eq!(g.groups.len(), 1);
        assert!(g.groups[0].params.is_empty());
        assert_eq!((g.groups[0].mean, g.groups[0].n), (Some(2.0), 2));
        assert!((g.groups[0].std.unwrap() - 2f64.sqrt()).abs() < 1e-15);
        match group(&report, &["warmup".to_string()]) {
            Err(e @ ReportError::GroupKey { .. }) => {
                let text = e.to_string();
                assert!(
                    text.contains("'warmup'") && text.contains("trainer.lr, seed"),
                    "{text}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
}
