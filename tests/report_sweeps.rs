//! `flotilla report` on sweeps as people run them at scale: seeds grouped into configurations
//! (`--group-by`) in every format, and the HTML page of a sweep of a thousand jobs in headless
//! Chromium. The sweeps are prepared by `flotilla run -m --dry-run` on the shipped config and
//! then given the files the trainer leaves: a `metrics.csv`, `final/`, a COMPLETED record.

use std::path::{Path, PathBuf};
use std::process::Output;

#[path = "common/chromium.rs"]
mod chromium;
mod common;
use chromium::{chromium, headless};
use common::{flotilla_in, ok};

fn flotilla(args: &[&str]) -> Output {
    flotilla_in(Path::new(env!("CARGO_MANIFEST_DIR")), args)
}

/// A sweep of `trainer.lr` × `seed` prepared under `root/sweep`.
fn prepared_sweep(root: &Path, lrs: &str, seeds: &str) -> PathBuf {
    // `flotilla run`, even a dry one, finds the task binary first.
    common::train_binary();
    let sweep = root.join("sweep");
    ok(flotilla(&[
        "run",
        "-m",
        "--dry-run",
        &format!("trainer.lr={lrs}"),
        &format!("seed={seeds}"),
        &format!("flotilla.sweep.dir={}", sweep.display()),
    ]));
    sweep
}

/// Job `num` finished: its metrics.csv in the trainer's columns (`eval_loss` at the given
/// steps, `loss` at every step), `final/`, and its COMPLETED record in `plan`.
fn finish_job(sweep: &Path, plan: &mut serde_json::Value, num: usize, eval: &[(u64, f64)]) {
    let mut csv =
        String::from("step,loss,grad_norm,lr,tokens_per_s,elapsed_s,eval_loss,eval_ppl,eval_acc\n");
    let last = eval.iter().map(|(s, _)| *s).max().unwrap_or(0);
    for step in 0..=last {
        let loss = 3.0 - step as f64 * 0.01 - num as f64 * 1e-4;
        match eval.iter().find(|(s, _)| *s == step) {
            Some((_, e)) => csv.push_str(&format!(
                "{step},{loss},1,0.001,1000,{},{e},{},\n",
                step + 1,
                e.exp()
            )),
            None => csv.push_str(&format!("{step},{loss},1,0.001,1000,{},,,\n", step + 1)),
        }
    }
    let dir = sweep.join(num.to_string());
    std::fs::write(dir.join("metrics.csv"), csv).unwrap();
    std::fs::create_dir_all(dir.join("final")).unwrap();
    plan["jobs"][num]["state"] = "COMPLETED".into();
}

fn read_plan(sweep: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(sweep.join("sweep.json")).unwrap()).unwrap()
}

fn write_plan(sweep: &Path, plan: &serde_json::Value) {
    std::fs::write(
        sweep.join("sweep.json"),
        serde_json::to_string_pretty(plan).unwrap(),
    )
    .unwrap();
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * b.abs().max(1.0)
}

#[test]
fn seeds_group_into_configurations_with_mean_std_and_count_in_every_format() {
    let tmp = tempfile::tempdir().unwrap();
    // Jobs 0-2: lr 0.001, seeds 1-3; jobs 3-5: lr 0.01, seeds 1-3.
    let sweep = prepared_sweep(tmp.path(), "0.001,0.01", "1,2,3");
    let mut plan = read_plan(&sweep);
    // Best eval_loss per job (the lowest at any step): 2.0, 2.5, 3.5 | 1.0, 1.5, (none).
    let evals: [&[(u64, f64)]; 5] = [
        &[(1, 2.2), (3, 2.0)],
        &[(1, 2.5), (3, 2.6)],
        &[(1, 3.5)],
        &[(1, 1.0), (3, 1.1)],
        &[(1, 1.6), (3, 1.5)],
    ];
    for (num, eval) in evals.iter().enumerate() {
        finish_job(&sweep, &mut plan, num, eval);
    }
    plan["jobs"][5]["state"] = "FAILED".into();
    write_plan(&sweep, &plan);
    let dir = sweep.to_str().unwrap();

    // By hand: lr 0.01 — 1.0 and 1.5, mean 1.25, sample variance 0.125 (n - 1 = 1);
    // lr 0.001 — 2.0, 2.5, 3.5, mean 8/3, squares 4/9 + 1/36 + 25/36 = 7/6, variance 7/12.
    let json: serde_json::Value = serde_json::from_str(&ok(flotilla(&[
        "report",
        dir,
        "--group-by",
        "seed",
        "--format",
        "json",
    ])))
    .unwrap();
    let groups = &json["groups"];
    assert_eq!(groups["by"], serde_json::json!(["seed"]));
    assert!(
        groups["std_kind"].as_str().unwrap().contains("n - 1"),
        "{groups}"
    );
    let list = groups["groups"].as_array().unwrap();
    assert_eq!(list.len(), 2);
    let (a, b) = (&list[0], &list[1]);
    assert_eq!(a["params"], serde_json::json!({"trainer.lr": 0.01}));
    assert_eq!(a["jobs"], serde_json::json!([3, 4, 5]));
    assert_eq!(a["n"], 2);
    assert!(close(a["mean"].as_f64().unwrap(), 1.25), "{a}");
    assert!(close(a["std"].as_f64().unwrap(), 0.125f64.sqrt()), "{a}");
    assert!(a["reason"].as_str().unwrap().contains("5 FAILED"), "{a}");
    assert_eq!(b["params"], serde_json::json!({"trainer.lr": 0.001}));
    assert_eq!(b["n"], 3);
    assert!(close(b["mean"].as_f64().unwrap(), 8.0 / 3.0), "{b}");
    assert!(
        close(b["std"].as_f64().unwrap(), (7.0f64 / 12.0).sqrt()),
        "{b}"
    );
    assert_eq!(b["grouped"]["seed"], serde_json::json!([1, 2, 3]));
    // The final values too: 2.0, 2.6, 3.5 (mean 8.1/3).
    assert!(close(b["final_mean"].as_f64().unwrap(), 8.1 / 3.0), "{b}");
    // The jobs are still there, each once.
    assert_eq!(json["jobs"].as_array().unwrap().len(), 6);

    // The table a person reads: one row per learning rate, the best starred, the seeds listed.
    let table = ok(flotilla(&["report", dir, "--group-by", "seed"]));
    let lines: Vec<&str> = table.lines().collect();
    let header: Vec<&str> = lines[0]
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(
        header,
        [
            "trainer.lr",
            "seed",
            "n",
            "mean best eval_loss",
            "std",
            "final eval_loss mean",
            "final std",
            "jobs",
            "note"
        ],
        "{table}"
    );
    assert!(
        lines[1].trim_start().starts_with("0.01 ")
            && lines[1].contains(" 1.25* ")
            && lines[1].contains("0.3536"),
        "{table}"
    );
    assert!(
        lines[2].contains(" 2.6667 ") && lines[2].contains("0.7638"),
        "{table}"
    );
    assert!(lines[2].contains("1,2,3"), "{table}");
    assert!(
        table.contains("best configuration (marked *): trainer.lr=0.01 (mean 1.25 ± 0.3536, n 2)"),
        "{table}"
    );
    assert!(
        table.contains("sample standard deviation, n - 1"),
        "{table}"
    );

    // CSV, unrounded; Markdown with the same rows.
    let csv = ok(flotilla(&[
        "report",
        dir,
        "--group-by",
        "seed",
        "--format",
        "csv",
    ]));
    let mut rows = csv.lines();
    assert_eq!(
        rows.next().unwrap(),
        "trainer.lr,seed,n,mean,std,final_mean,final_std,jobs,reason"
    );
    let first: Vec<&str> = rows.next().unwrap().split(',').collect();
    assert_eq!(first[..3], ["0.01", "1;2;3", "2"]);
    assert!(close(first[3].parse().unwrap(), 1.25));
    assert!(close(first[4].parse().unwrap(), 0.125f64.sqrt()));
    assert_eq!(first[7], "3;4;5");
    let md = ok(flotilla(&[
        "report",
        dir,
        "--group-by",
        "seed",
        "--format",
        "markdown",
    ]));
    assert!(md.starts_with("| trainer.lr | seed | n |"), "{md}");
    assert_eq!(
        md.lines().filter(|l| l.starts_with("| 0.0")).count(),
        2,
        "{md}"
    );

    // Ranked by the mean unless asked otherwise; --top keeps the best configurations.
    let top = ok(flotilla(&[
        "report",
        dir,
        "--group-by",
        "seed",
        "--top",
        "1",
        "--format",
        "csv",
    ]));
    assert_eq!(top.lines().count(), 2, "{top}");
    assert!(top.lines().nth(1).unwrap().starts_with("0.01,"), "{top}");
    let by_std = ok(flotilla(&[
        "report",
        dir,
        "--group-by",
        "seed",
        "--sort",
        "std",
        "--format",
        "csv",
    ]));
    assert!(
        by_std.lines().nth(1).unwrap().starts_with("0.01,"),
        "{by_std}"
    );

    // A key no job sweeps is a usage error naming the swept ones.
    let out = flotilla(&["report", dir, "--group-by", "warmup"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("cannot group by 'warmup'") && err.contains("trainer.lr, seed"),
        "{err}"
    );

    // The figures plot each configuration's mean with its spread.
    let page = tmp.path().join("grouped.html");
    ok(flotilla(&[
        "report",
        dir,
        "--group-by",
        "seed",
        "--html",
        page.to_str().unwrap(),
    ]));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains("mean best eval_loss by trainer.lr (± std over seed)"),
        "{html}"
    );
    // One error bar (lr 0.001 and 0.01 each have two or more values) per configuration.
    assert_eq!(html.matches("class=\"spread\"").count(), 2);
    assert!(
        html.contains("class=\"band\""),
        "the mean curves have no ± std band"
    );
    assert!(html.contains("<h2>Configurations</h2>"));
    assert!(html.find("<svg").unwrap() < html.find("<table").unwrap());
}

/// Rows of a `<tbody>`: the number of `<tr` in the table of id `id` of a page (or DOM dump).
fn table_rows(html: &str, id: &str) -> usize {
    let start = html
        .find(&format!("<table class=\"report\" id=\"{id}\">"))
        .unwrap_or_else(|| panic!("no table {id}"));
    let end = start + html[start..].find("</table>").unwrap();
    html[start..end].matches("<tr").count() - 1
}

#[test]
fn a_thousand_job_sweep_makes_a_small_page_with_its_figures_first() {
    let tmp = tempfile::tempdir().unwrap();
    let lrs: Vec<String> = (1..=100)
        .map(|k| format!("{:.4}", k as f64 * 1e-4))
        .collect();
    let sweep = prepared_sweep(tmp.path(), &lrs.join(","), "range(0,10)");
    let mut plan = read_plan(&sweep);
    let n = plan["jobs"].as_array().unwrap().len();
    assert_eq!(n, 1000);
    for num in 0..n {
        // 50 steps, evaluated every 10; the best job is number 637.
        let base = 2.0 + ((num * 7919) % 1000) as f64 / 1000.0;
        let base = if num == 637 { 1.5 } else { base };
        let eval: Vec<(u64, f64)> = (1..=5)
            .map(|k| (k * 10 - 1, base + 0.5 / k as f64))
            .collect();
        finish_job(&sweep, &mut plan, num, &eval);
    }
    write_plan(&sweep, &plan);
    let page = tmp.path().join("report.html");
    ok(flotilla(&[
        "report",
        sweep.to_str().unwrap(),
        "--html",
        page.to_str().unwrap(),
    ]));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.len() < 2_000_000,
        "a 1000-job page is {} bytes",
        html.len()
    );
    // Figures first, then the 50 best jobs, the rest as data behind "show all".
    let first_svg = html.find("<svg").unwrap();
    let table = html.find("<table").unwrap();
    assert!(first_svg < table, "the table comes before the figures");
    assert_eq!(
        html[..table].matches("<svg").count(),
        6,
        "curves (2), lr, seed, parallel, history"
    );
    assert_eq!(table_rows(&html, "jobs"), 50);
    assert!(html.contains("The 50 best of 1000 jobs by best eval_loss (min over steps)"));
    assert!(html.contains("<a href=\"#all\">show all 1000</a>"));
    let best_row = html.split("<tr class=\"best\">").nth(1).unwrap();
    assert!(best_row.starts_with("<td>637</td>"), "{}", &best_row[..200]);
    // The curves figure draws the 10 best jobs over the band of all, not 1000 lines.
    let curves = &html[first_svg..html[first_svg..].find("</svg>").unwrap() + first_svg];
    assert_eq!(
        curves.matches("class=\"curve\"").count(),
        11,
        "10 best and the median"
    );
    assert!(curves.contains("the 10 best of 1000 jobs"), "{curves}");

    let Some(chromium) = chromium() else {
        return common::skip_or_fail("chromium is not installed (apt-get install chromium)");
    };
    let profile = tmp.path().join("profile");
    let url = format!("file://{}", page.display());
    let dom = headless(&chromium, &profile, &["--dump-dom", &url]);
    let dom_text = String::from_utf8_lossy(&dom.stdout);
    let log = String::from_utf8_lossy(&dom.stderr);
    assert!(
        dom_text.contains("data-ready=\"yes\""),
        "the page script did not run to its end:\n{log}"
    );
    let console_errors: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("CONSOLE") || l.contains("Uncaught"))
        .collect();
    assert!(console_errors.is_empty(), "{console_errors:?}");
    assert_eq!(table_rows(&dom_text, "jobs"), 50);
    // The link's target: every job's row, rendered from the page's data.
    let all = headless(&chromium, &profile, &["--dump-dom", &format!("{url}#all")]);
    let all_text = String::from_utf8_lossy(&all.stdout);
    assert_eq!(table_rows(&all_text, "jobs"), 1000);
    assert_eq!(all_text.matches("<tr class=\"best\">").count(), 1);
    let shot = tmp.path().join("report.png");
    let out = headless(
        &chromium,
        &profile,
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1400,1900",
            &url,
        ],
    );
    assert!(shot.is_file(), "{}", String::from_utf8_lossy(&out.stderr));
    let png = std::fs::read(&shot).unwrap();
    assert_eq!(&png[1..4], b"PNG");
    if let Ok(keep) = std::env::var("FLOTILLA_KEEP_SCREENSHOT") {
        std::fs::copy(&shot, keep).unwrap();
    }
}
