//! What `flotilla status` and `flotilla report` print, byte for byte, for a sweep whose jobs
//! cover every case their readers tell apart: a finished trainer's metrics, a job still
//! running before its first evaluation, a last row cut short with a failure message, a
//! completed record without metrics, `final/` on a pending job, a NaN loss and a clock whose
//! last cell is not a number, a program's `metrics.jsonl`, a quoted `metrics.csv`, and a
//! header with no rows and no config. The expected outputs are files in
//! `tests/oracle/fixtures/report_outputs/`, recorded from the binary of an earlier commit:
//! the readers are made faster without changing a byte of what they print.
//!
//! `FLOTILLA_REFERENCE_BINARY=PATH` compares with what that binary prints instead of the
//! files, and `FLOTILLA_BLESS=1` writes the files (from the reference binary when given).

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::{flotilla_in, ok};

const HEADER: &str = "step,loss,grad_norm,lr,tokens_per_s,elapsed_s,eval_loss,eval_ppl,eval_acc\n";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle/fixtures/report_outputs")
}

fn set_record(plan: &mut serde_json::Value, num: usize, state: &str, message: Option<&str>) {
    plan["jobs"][num]["state"] = state.into();
    if let Some(m) = message {
        plan["jobs"][num]["message"] = m.into();
    }
}

/// A trainer's rows for `steps` steps, an evaluation every `eval_every`.
fn trainer_rows(steps: u64, eval_every: u64, lr: f64) -> String {
    let mut rows = String::new();
    for step in 0..steps {
        let loss = 2.0 + 3.0 / (1.0 + step as f64 * lr * 10.0);
        let elapsed = 0.1 * (step + 1) as f64;
        let tokens = 1000 + 7 * step;
        rows.push_str(&format!("{step},{loss},1.0,{lr},{tokens},{elapsed},"));
        if (step + 1) % eval_every == 0 {
            let eval = loss + 0.1;
            rows.push_str(&format!("{eval},{},{}\n", eval.exp(), 1.0 - eval / 4.0));
        } else {
            rows.push_str(",,\n");
        }
    }
    rows
}

/// The sweep (`trainer.lr` × `seed`, 8 jobs) under `root/sweep`, its jobs given their files.
fn mixed_sweep(root: &Path) -> PathBuf {
    common::train_binary();
    let sweep = root.join("sweep");
    // Composed from the shipped config, as `flotilla run` in the repository would.
    ok(flotilla_in(
        Path::new(env!("CARGO_MANIFEST_DIR")),
        &[
            "run",
            "-m",
            "--dry-run",
            "trainer.lr=0.1,0.2,0.3,0.4",
            "seed=0,1",
            &format!("flotilla.sweep.dir={}", sweep.display()),
        ],
    ));
    let plan_path = sweep.join("sweep.json");
    let mut plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&plan_path).unwrap()).unwrap();
    let write = |num: usize, name: &str, text: &str| {
        std::fs::write(sweep.join(num.to_string()).join(name), text).unwrap();
    };
    let final_dir =
        |num: usize| std::fs::create_dir_all(sweep.join(format!("{num}/final"))).unwrap();
    // 0: finished.
    write(
        0,
        "metrics.csv",
        &format!("{HEADER}{}", trainer_rows(30, 10, 0.1)),
    );
    final_dir(0);
    set_record(&mut plan, 0, "COMPLETED", None);
    plan["jobs"][0]["wall_s"] = 3.25.into();
    // 1: running, no evaluation yet.
    write(
        1,
        "metrics.csv",
        &format!("{HEADER}{}", trainer_rows(7, 10, 0.1)),
    );
    set_record(&mut plan, 1, "RUNNING", None);
    // 2: failed, its last row cut short.
    let mut cut = format!("{HEADER}{}", trainer_rows(20, 5, 0.2));
    cut.push_str("20,2.31,1.0,0.2,1140,2.1,2.4");
    write(2, "metrics.csv", &cut);
    set_record(&mut plan, 2, "FAILED", Some("rank 0 exited with status 1"));
    // 3: completed by its record, no metrics at all.
    set_record(&mut plan, 3, "COMPLETED", None);
    // 4: pending but saved its model; a NaN loss from step 3, a clock ending in a word.
    write(
        4,
        "metrics.csv",
        &format!(
            "{HEADER}0,3.0,1.0,0.2,1000,0.1,,,\n1,2.9,1.0,0.2,1007,0.2,,,\n\
             2,2.8,1.0,0.2,1014,0.3,,,\n3,nan,1.0,0.2,1021,0.4,,,\n\
             4,nan,1.0,0.2,1028,0.5,2.95,19.1,0.26\n5,2.7,1.0,0.2,1035,x,,,\n"
        ),
    );
    final_dir(4);
    // 5: a user program's metrics.jsonl.
    write(
        5,
        "metrics.jsonl",
        "{\"step\": 0, \"loss\": 3.5}\n{\"step\": 4, \"loss\": 2.9, \"eval_loss\": 3.1}\n\
         {\"step\": 9, \"loss\": 2.5, \"eval_loss\": 2.75, \"elapsed_s\": 12.5}\n",
    );
    set_record(&mut plan, 5, "COMPLETED", None);
    // 6: quoted cells.
    write(
        6,
        "metrics.csv",
        "\"step\",\"loss\",tokens_per_s,elapsed_s,\"eval_loss\"\n0,\"3.0\",900,0.5,\n\
         1,2.8,950,1.0,\"2.95\"\n2,2.6,\"1000\",1.5,\n3,2.5,1000,2.0,2.7\n",
    );
    set_record(&mut plan, 6, "COMPLETED", None);
    // 7: a header alone, and no config.
    write(7, "metrics.csv", HEADER);
    std::fs::remove_file(sweep.join("7/config.yaml")).unwrap();
    set_record(&mut plan, 7, "CANCELLED", Some("cancelled by the user"));
    std::fs::write(&plan_path, serde_json::to_string_pretty(&plan).unwrap()).unwrap();
    sweep
}

/// The commands whose output is compared, by the name of their fixture.
const COMMANDS: &[(&str, &[&str])] = &[
    ("status.txt", &["status", "sweep"]),
    ("status.json", &["status", "sweep", "--format", "json"]),
    ("status_loss.txt", &["status", "sweep", "--metric", "loss"]),
    ("status_job.txt", &["status", "sweep/2"]),
    ("report.txt", &["report", "sweep"]),
    ("report.json", &["report", "sweep", "--format", "json"]),
    ("report.csv", &["report", "sweep", "--format", "csv"]),
    ("report.md", &["report", "sweep", "--format", "markdown"]),
    (
        "report_group.txt",
        &["report", "sweep", "--group-by", "seed"],
    ),
    (
        "report_group.json",
        &["report", "sweep", "--group-by", "seed", "--format", "json"],
    ),
    ("report_loss.txt", &["report", "sweep", "--metric", "loss"]),
    (
        "report_elapsed.json",
        &[
            "report",
            "sweep",
            "--metric",
            "elapsed_s",
            "--format",
            "json",
        ],
    ),
    (
        "report_top.txt",
        &["report", "sweep", "--sort", "wall_s", "--top", "3"],
    ),
    ("report_job.txt", &["report", "sweep/4"]),
    (
        "report_html.html",
        &["report", "sweep", "--html", "page.html"],
    ),
];

/// What `binary` prints for `args` in `root`, its exit status and standard error too (the
/// HTML page in place of standard output for `--html`).
fn output_of(binary: &Path, root: &Path, args: &[&str]) -> String {
    let out = Command::new(binary)
        .args(args)
        .current_dir(root)
        .env_remove("FLOTILLA_LOG")
        .output()
        .expect("run flotilla");
    let mut text = format!(
        "exit {:?}\n--- stdout\n{}--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if args.contains(&"--html") {
        text.push_str("--- page\n");
        text.push_str(&std::fs::read_to_string(root.join("page.html")).unwrap());
        std::fs::remove_file(root.join("page.html")).unwrap();
    }
    text.replace(root.to_str().unwrap(), "ROOT")
}

#[test]
fn status_and_report_print_what_they_printed_before() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    mixed_sweep(root);
    let ours = common::flotilla_bin();
    let reference = std::env::var_os("FLOTILLA_REFERENCE_BINARY").map(PathBuf::from);
    let bless = std::env::var_os("FLOTILLA_BLESS").is_some();
    let mut differ = Vec::new();
    for (name, args) in COMMANDS {
        let got = output_of(&ours, root, args);
        let want = match &reference {
            Some(binary) => output_of(binary, root, args),
            None if bless => got.clone(),
            None => std::fs::read_to_string(fixtures().join(name))
                .unwrap_or_else(|e| panic!("{name}: {e} (FLOTILLA_BLESS=1 writes it)")),
        };
        if bless {
            std::fs::create_dir_all(fixtures()).unwrap();
            std::fs::write(fixtures().join(name), &want).unwrap();
        }
        if got != want {
            let line = got
                .lines()
                .zip(want.lines())
                .position(|(g, w)| g != w)
                .unwrap_or(got.lines().count().min(want.lines().count()));
            differ.push(format!(
                "{name} (flotilla {}), first at line {}:\n  got:  {:?}\n  want: {:?}",
                args.join(" "),
                line + 1,
                got.lines().nth(line),
                want.lines().nth(line)
            ));
        }
    }
    assert!(differ.is_empty(), "{}", differ.join("\n"));
}
