//! `flotilla run --from` and `flotilla diff` as a user runs them: a real CPU training run is run
//! again from its own saved files (after its config directory changed and then vanished) and
//! gives the same metrics; new overrides are laid over the saved ones; `diff` names, for each
//! value that differs, the file and line or the override it came from on both sides.

use std::path::{Path, PathBuf};

mod common;
use common::{copy_dir, flotilla_in, ok};

/// A project directory with its own copy of the shipped `conf/`.
fn project() -> tempfile::TempDir {
    // Every test here runs `flotilla run`, which finds the task binary first.
    common::train_binary();
    let tmp = tempfile::tempdir().unwrap();
    copy_dir(&common::conf_dir(), &tmp.path().join("conf"));
    tmp
}

/// The run or sweep directory `flotilla run` printed (`prepared run DIR`, `finished run DIR`,
/// `prepared sweep DIR (2 jobs)`, ...).
fn prepared_dir(stdout: &str) -> PathBuf {
    let line = stdout
        .lines()
        .find_map(|l| {
            let (_, rest) = l.split_once(' ')?;
            rest.strip_prefix("run ")
                .or_else(|| rest.strip_prefix("sweep "))
        })
        .unwrap_or_else(|| panic!("no 'prepared' line in:\n{stdout}"));
    PathBuf::from(line.split(" (").next().unwrap())
}

/// metrics.csv as rows of `column → value`, without the time columns.
fn metrics_without_time(dir: &Path) -> Vec<Vec<(String, String)>> {
    let mut reader = csv::Reader::from_path(dir.join("metrics.csv")).unwrap();
    let headers = reader.headers().unwrap().clone();
    reader
        .records()
        .map(|r| {
            let r = r.unwrap();
            headers
                .iter()
                .zip(r.iter())
                .filter(|(h, _)| !matches!(*h, "tokens_per_s" | "elapsed_s"))
                .map(|(h, v)| (h.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

#[test]
fn run_from_reproduces_a_runs_metrics_from_its_own_files() {
    let project = project();
    let cwd = project.path();
    let first = prepared_dir(&ok(flotilla_in(
        cwd,
        &[
            "run",
            "trainer.max_steps=12",
            "trainer.eval_every=6",
            "trainer.lr=2e-3",
            "flotilla.run.dir=runs/first",
        ],
    )));
    let original = metrics_without_time(&first);
    assert_eq!(original.len(), 12, "one row per step: {original:?}");

    // The config directory changes (a new default learning rate, another model) and then goes
    // away: the saved copy is what the run is composed from.
    let conf = cwd.join("conf");
    let trainer = conf.join("trainer/default.yaml");
    let text = std::fs::read_to_string(&trainer).unwrap();
    std::fs::write(&trainer, text.replace("max_steps:", "max_steps: 99 #")).unwrap();
    std::fs::rename(&conf, cwd.join("conf.old")).unwrap();

    let again = prepared_dir(&ok(flotilla_in(
        cwd,
        &[
            "run",
            "--from",
            first.to_str().unwrap(),
            "flotilla.run.dir=runs/again",
        ],
    )));
    assert_ne!(again, first);
    let replayed = metrics_without_time(&again);
    assert_eq!(
        replayed, original,
        "the same seed and config give the same metrics"
    );
    let config = |d: &Path| std::fs::read_to_string(d.join("config.yaml")).unwrap();
    assert_eq!(config(&again), config(&first));

    // The runs' configs are the same, so diff says so.
    let same = ok(flotilla_in(
        cwd,
        &[
            "diff",
            first.to_str().unwrap(),
            again.to_str().unwrap(),
            "--exit-code",
        ],
    ));
    assert!(same.contains("the configs are identical"), "{same}");
}

#[test]
fn run_from_lays_new_overrides_over_the_saved_ones_and_diff_names_both_origins() {
    let project = project();
    let cwd = project.path();
    let sweep = prepared_dir(&ok(flotilla_in(
        cwd,
        &[
            "run",
            "--dry-run",
            "-m",
            "model=tiny,small",
            "trainer.max_steps=7",
            "+extra.tag=a",
            "flotilla.sweep.dir=sweep",
        ],
    )));
    let job1 = sweep.join("1");
    let rerun = prepared_dir(&ok(flotilla_in(
        cwd,
        &[
            "run",
            "--dry-run",
            "--from",
            job1.to_str().unwrap(),
            "trainer.lr=0.01",
            "extra.tag=b",
            "trainer/dist=fsdp",
            "flotilla.run.dir=rerun",
        ],
    )));
    let overrides = std::fs::read_to_string(rerun.join("overrides.yaml")).unwrap();
    // The saved `+extra.tag=a` is replaced, and the new plain assignment keeps its `+`.
    assert_eq!(
        overrides,
        "- \"model=small\"\n- \"trainer.max_steps=7\"\n- \"trainer.lr=0.01\"\n- \"+extra.tag=b\"\n- \"trainer/dist=fsdp\"\n"
    );
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(rerun.join("meta.json")).unwrap()).unwrap();
    assert_eq!(meta["conf_snapshot"], ".flotilla/conf");
    // The config directory it records is the original's, not the copy it was read from.
    let conf = cwd.join("conf").canonicalize().unwrap();
    assert_eq!(
        Path::new(meta["config_dir"].as_str().unwrap())
            .canonicalize()
            .unwrap(),
        conf
    );
    assert_eq!(
        Path::new(meta["rerun_of"].as_str().unwrap())
            .canonicalize()
            .unwrap(),
        job1.canonicalize().unwrap()
    );
    assert_eq!(meta["config_name"], "config");
    assert!(rerun.join(".flotilla/conf/model/small.yaml").is_file());
    let sweep_meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(job1.join("meta.json")).unwrap()).unwrap();
    assert_eq!(sweep_meta["conf_snapshot"], "../.flotilla/conf");

    let text = ok(flotilla_in(
        cwd,
        &["diff", job1.to_str().unwrap(), rerun.to_str().unwrap()],
    ));
    // The values that differ, each with its origin on both sides: a group option's file is
    // named as the original command saw it, not by the copy it was read from.
    assert!(
        text.contains("trainer.dist.mode\n  a: \"ddp\"    conf/trainer/dist/ddp.yaml:2\n  b: \"fsdp\"   conf/trainer/dist/fsdp.yaml:2\n"),
        "{text}"
    );
    assert!(text.contains("trainer.dist.bucket_cap_mb\n  a: 25         conf/trainer/dist/ddp.yaml:5\n  b: (absent)\n"), "{text}");
    let lr_a = text
        .lines()
        .skip_while(|l| *l != "trainer.lr")
        .nth(1)
        .unwrap();
    assert!(lr_a.starts_with("  a: 0.003"), "{text}");
    assert!(lr_a.ends_with("conf/trainer/default.yaml:12"), "{text}");
    assert!(
        text.contains("  b: 0.01    override 'trainer.lr=0.01'"),
        "{text}"
    );
    assert!(
        text.contains("  a: \"a\"   override '+extra.tag=a'"),
        "{text}"
    );
    assert!(
        text.contains("  b: \"b\"   override '+extra.tag=b'"),
        "{text}"
    );

    let json = ok(flotilla_in(
        cwd,
        &[
            "diff",
            sweep.join("0").to_str().unwrap(),
            job1.to_str().unwrap(),
            "--format",
            "json",
        ],
    ));
    let diff: serde_json::Value = serde_json::from_str(&json).unwrap();
    let differences = diff["differences"].as_array().unwrap();
    let name = differences
        .iter()
        .find(|d| d["key"] == "model.name")
        .unwrap();
    assert_eq!(name["a"]["value"], "tiny");
    assert_eq!(name["a"]["origin"], "conf/model/tiny.yaml:3");
    assert_eq!(name["b"]["value"], "small");
    assert_eq!(name["b"]["origin"], "conf/model/small.yaml:3");
    assert!(differences
        .iter()
        .all(|d| d["key"].as_str().unwrap().starts_with("model.")));
    // --exit-code: 1 when the configs differ.
    let o = flotilla_in(
        cwd,
        &[
            "diff",
            sweep.join("0").to_str().unwrap(),
            job1.to_str().unwrap(),
            "--exit-code",
        ],
    );
    assert_eq!(o.status.code(), Some(1));
}

#[test]
fn run_from_and_diff_refuse_what_is_not_a_job_directory() {
    let project = project();
    let cwd = project.path();
    let sweep = prepared_dir(&ok(flotilla_in(
        cwd,
        &[
            "run",
            "--dry-run",
            "-m",
            "trainer.lr=1e-3,2e-3",
            "flotilla.sweep.dir=sweep",
        ],
    )));
    let before: Vec<_> = std::fs::read_dir(cwd).unwrap().collect();
    let (sweep_s, job0) = (sweep.to_str().unwrap(), sweep.join("0"));
    let job0 = job0.to_str().unwrap();
    let conf = cwd.join("conf");
    for (args, says) in [
        (vec!["run", "--from", sweep_s], "a sweep directory"),
        (vec!["diff", sweep_s, job0], "a sweep directory"),
        (
            vec!["run", "--from", conf.to_str().unwrap()],
            "not a job directory",
        ),
        (vec!["diff", job0, "nowhere"], "no readable config.yaml"),
    ] {
        let o = flotilla_in(cwd, &args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.starts_with("error: ") && err.contains(says),
            "{args:?}: {err}"
        );
    }
    // Nothing was created by the refused commands.
    assert_eq!(std::fs::read_dir(cwd).unwrap().count(), before.len());

    // A job whose saved copy and original config directory are both gone cannot be composed
    // again, and says what to do.
    std::fs::remove_dir_all(sweep.join(".flotilla")).unwrap();
    std::fs::remove_dir_all(cwd.join("conf")).unwrap();
    let o = flotilla_in(cwd, &["run", "--from", sweep.join("0").to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("--config-dir"), "{err}");
    // diff still compares the values, with config.yaml lines as provenance.
    let text = ok(flotilla_in(
        cwd,
        &[
            "diff",
            sweep.join("0").to_str().unwrap(),
            sweep.join("1").to_str().unwrap(),
        ],
    ));
    assert!(
        text.contains("note (a): provenance is the line in config.yaml"),
        "{text}"
    );
    assert!(text.contains("trainer.lr\n  a: 0.001"), "{text}");
    assert!(text.contains("/0/config.yaml:"), "{text}");
}

#[test]
fn run_from_keeps_a_task_set_on_the_command_line_but_not_the_run_dir() {
    let project = project();
    let cwd = project.path();
    let first = prepared_dir(&ok(flotilla_in(
        cwd,
        &[
            "run",
            "--dry-run",
            "flotilla.task.command=[echo,'lr=${trainer.lr}']",
            "trainer.lr=0.5",
            "flotilla.run.dir=runs/first",
        ],
    )));
    let again = prepared_dir(&ok(flotilla_in(
        cwd,
        &[
            "run",
            "--from",
            first.to_str().unwrap(),
            "flotilla.run.dir=runs/again",
        ],
    )));
    let task: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(again.join("task.json")).unwrap()).unwrap();
    assert_eq!(task["argv"], serde_json::json!(["echo", "lr=0.5"]));
    let log = std::fs::read_to_string(again.join("logs/rank_0.log")).unwrap();
    assert!(log.lines().any(|l| l == "lr=0.5"), "{log}");
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(again.join("meta.json")).unwrap()).unwrap();
    assert_eq!(
        meta["runtime_overrides"],
        serde_json::json!(["flotilla.task.command=[echo,'lr=${trainer.lr}']"])
    );
}
