//! `flotilla report` and `flotilla diff` as a user runs them: on a sweep prepared by `flotilla run
//! --dry-run` whose jobs are then given every kind of broken or partial output, on a real
//! training sweep, the HTML page in a real headless Chromium, the `--plot` figures as SVG and
//! PNG files, and the best-so-far line of `flotilla status`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

#[path = "common/chromium.rs"]
mod chromium;
mod common;
use chromium::{chromium, headless};
use common::{flotilla_in, ok};

fn flotilla(args: &[&str]) -> Output {
    flotilla_in(Path::new(env!("CARGO_MANIFEST_DIR")), args)
}

/// Every file under `dir` with its size and modification time.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, (u64, std::time::SystemTime)> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let m = e.metadata().unwrap();
            if m.is_dir() {
                stack.push(e.path());
            }
            out.insert(e.path(), (m.len(), m.modified().unwrap()));
        }
    }
    out
}

/// A sweep of five jobs prepared (not started) under `root/sweep`.
fn prepared_sweep(root: &Path) -> PathBuf {
    // `flotilla run`, even a dry one, finds the task binary first.
    common::train_binary();
    let sweep = root.join("sweep");
    ok(flotilla(&[
        "run",
        "-m",
        "--dry-run",
        "trainer.lr=0.1,0.2,0.3,0.4,0.5",
        &format!("flotilla.sweep.dir={}", sweep.display()),
    ]));
    assert!(sweep.join("sweep.json").is_file());
    sweep
}

fn set_record(sweep: &Path, num: usize, state: &str, message: Option<&str>) {
    let path = sweep.join("sweep.json");
    let mut plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    plan["jobs"][num]["state"] = state.into();
    if let Some(m) = message {
        plan["jobs"][num]["message"] = m.into();
    }
    std::fs::write(&path, serde_json::to_string_pretty(&plan).unwrap()).unwrap();
}

const HEADER: &str = "step,loss,grad_norm,lr,tokens_per_s,elapsed_s,eval_loss,eval_ppl,eval_acc\n";

/// Writes job `num`'s metrics.csv: the trainer's header, then `rows` verbatim.
fn write_metrics(sweep: &Path, num: usize, rows: &str) {
    std::fs::write(
        sweep.join(format!("{num}/metrics.csv")),
        format!("{HEADER}{rows}"),
    )
    .unwrap();
}

#[test]
fn every_job_gets_its_row_whatever_state_its_files_are_in() {
    let tmp = tempfile::tempdir().unwrap();
    let sweep = prepared_sweep(tmp.path());
    // 0: completed, evaluated twice (best at step 1).
    write_metrics(
        &sweep,
        0,
        "0,3.0,1,0.1,1000,1.0,,,\n1,2.5,1,0.1,1200,2.0,2.4,11.0,\n2,2.0,1,0.1,1100,3.0,2.6,13.4,\n",
    );
    std::fs::create_dir(sweep.join("0/final")).unwrap();
    set_record(&sweep, 0, "COMPLETED", None);
    // 1: failed, its loss went NaN at step 1.
    write_metrics(
        &sweep,
        1,
        "0,3.1,1,0.2,900,1.0,,,\n1,NaN,1,0.2,900,2.0,,,\n",
    );
    set_record(&sweep, 1, "FAILED", Some("rank 0 exited with status 1"));
    // 2: running; its writer is in the middle of a row.
    write_metrics(
        &sweep,
        2,
        "0,3.2,1,0.3,800,1.0,,,\n1,2.9,1,0.3,800,2.0,2.8,16.4,\n2,2.7,1,0.",
    );
    set_record(&sweep, 2, "RUNNING", None);
    // 3: a program that logs JSON lines, and whose config is gone.
    std::fs::remove_file(sweep.join("3/config.yaml")).unwrap();
    std::fs::write(
        sweep.join("3/metrics.jsonl"),
        "{\"step\": 0, \"loss\": 3.3}\n{\"step\": 4, \"loss\": 2.2, \"eval_loss\": 2.3}\n",
    )
    .unwrap();
    // 4: never started: nothing but what `run` prepared.
    let before = snapshot(&sweep);

    let out = ok(flotilla(&[
        "report",
        sweep.to_str().unwrap(),
        "--format",
        "json",
    ]));
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["metric"], "eval_loss");
    assert_eq!(report["mode"], "min");
    let jobs = report["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 5);
    let states: Vec<&str> = jobs.iter().map(|j| j["state"].as_str().unwrap()).collect();
    assert_eq!(
        states,
        ["COMPLETED", "FAILED", "RUNNING", "PENDING", "PENDING"]
    );
    for (i, job) in jobs.iter().enumerate() {
        assert_eq!(job["num"], i);
        // The only parameter that differs is the swept one; job 3 takes it from its overrides.
        let params = job["params"].as_object().unwrap();
        assert_eq!(params.keys().collect::<Vec<_>>(), ["trainer.lr"], "job {i}");
        assert_eq!(
            params["trainer.lr"],
            [0.1, 0.2, 0.3, 0.4, 0.5][i],
            "job {i}"
        );
    }
    assert_eq!(jobs[0]["final"], 2.6);
    assert_eq!(jobs[0]["best"], 2.4);
    assert_eq!(jobs[0]["best_step"], 1);
    assert_eq!(jobs[0]["steps"], 3);
    assert_eq!(jobs[0]["wall_s"], 3.0);
    assert_eq!(jobs[0]["tokens_per_s"], 1100.0);
    assert!(jobs[1]["final"].is_null() && jobs[1]["best"].is_null());
    assert!(jobs[1]["reason"]
        .as_str()
        .unwrap()
        .contains("rank 0 exited with status 1"));
    assert_eq!(jobs[2]["best"], 2.8);
    assert_eq!(jobs[2]["steps"], 2);
    assert!(jobs[2]["reason"].as_str().unwrap().contains("cut short"));
    assert_eq!(jobs[3]["best"], 2.3);
    assert_eq!(jobs[3]["best_step"], 4);
    assert!(jobs[3]["reason"].as_str().unwrap().contains("config.yaml"));
    assert!(jobs[4]["reason"].as_str().unwrap().contains("no metrics"));
    assert_eq!(report["best"]["num"], 3);

    // With loss, job 1's NaN is reported and the best is the lowest finite loss.
    let out = ok(flotilla(&[
        "report",
        sweep.to_str().unwrap(),
        "--format",
        "json",
        "--metric",
        "loss",
        "--sort",
        "best",
        "--top",
        "2",
    ]));
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let jobs = report["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 2);
    assert_eq!(
        (jobs[0]["num"].as_u64(), jobs[0]["best"].as_f64()),
        (Some(0), Some(2.0))
    );
    assert_eq!(
        (jobs[1]["num"].as_u64(), jobs[1]["best"].as_f64()),
        (Some(3), Some(2.2))
    );

    // The table a person reads: the best job starred, the failure's reason on its row.
    let table = ok(flotilla(&["report", sweep.to_str().unwrap()]));
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("num  state") && lines[0].contains("trainer.lr"),
        "{table}"
    );
    assert!(
        lines[4].trim_start().starts_with("3*") && lines[4].contains("2.3"),
        "{table}"
    );
    assert!(
        lines[2].contains("FAILED") && lines[2].contains("rank 0 exited"),
        "{table}"
    );
    assert!(
        lines[0].contains("best eval_loss (min over steps)"),
        "{table}"
    );
    assert!(
        table.contains("best eval_loss (the lowest value logged at any step): job 3"),
        "{table}"
    );

    // A metric no job logged: a typo names the near miss, any other name the metrics that
    // exist; both exit 2 and print no table.
    for (metric, needle) in [
        ("eval_los", "(did you mean 'eval_loss'?)"),
        ("bleu", "the metrics logged are: loss, grad_norm, lr, tokens_per_s, elapsed_s, eval_loss, eval_ppl"),
    ] {
        let out = flotilla(&["report", sweep.to_str().unwrap(), "--metric", metric]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(out.stdout.is_empty(), "{}", String::from_utf8_lossy(&out.stdout));
        assert!(err.contains(&format!("no job logged a metric named '{metric}'")), "{err}");
        assert!(err.contains(needle), "{err}");
    }

    let csv = ok(flotilla(&[
        "report",
        sweep.to_str().unwrap(),
        "--format",
        "csv",
    ]));
    assert!(
        csv.starts_with("num,dir,state,trainer.lr,final,best,"),
        "{csv}"
    );
    let md = ok(flotilla(&[
        "report",
        sweep.to_str().unwrap(),
        "--format",
        "markdown",
    ]));
    assert!(md.lines().nth(1).unwrap().starts_with("|---|"), "{md}");

    assert_eq!(
        snapshot(&sweep),
        before,
        "the report wrote into the run dirs"
    );
}

/// Three sweeps of two jobs each, with a config key named `steps`; every job's eval_loss dips
/// then rises, so its best (lowest at any step) is not its final value. The best job is
/// sweep `b`'s job 1.
fn three_sweeps(root: &Path) -> Vec<PathBuf> {
    common::train_binary();
    let mut sweeps = Vec::new();
    for (s, name) in ["a", "b", "c"].into_iter().enumerate() {
        let sweep = root.join(name);
        ok(flotilla(&[
            "run",
            "-m",
            "--dry-run",
            "+steps=3,5",
            &format!("flotilla.sweep.dir={}", sweep.display()),
        ]));
        for num in 0..2 {
            let low = 2.0 - 0.5 * s as f64 * (num as f64) - 0.1 * num as f64;
            let low = if name == "b" && num == 1 {
                0.5
            } else {
                low.max(0.9)
            };
            write_metrics(
                &sweep,
                num,
                &format!(
                    "0,3.0,1,0.1,1000,1.0,3.0,,\n1,2.5,1,0.1,1000,2.0,{low},,\n2,2.0,1,0.1,1000,3.0,{},,\n",
                    low + 1.0
                ),
            );
            set_record(&sweep, num, "COMPLETED", None);
        }
        sweeps.push(sweep);
    }
    sweeps
}

#[test]
fn several_sweeps_mark_only_the_best_job_and_name_their_sweep() {
    let tmp = tempfile::tempdir().unwrap();
    let sweeps = three_sweeps(tmp.path());
    let paths: Vec<&str> = sweeps.iter().map(|s| s.to_str().unwrap()).collect();
    let html_path = tmp.path().join("report.html");
    let plots = tmp.path().join("plots");
    let mut args = vec!["report"];
    args.extend(&paths);
    args.extend(["--html", html_path.to_str().unwrap()]);
    args.extend(["--plot", plots.to_str().unwrap()]);
    let out = flotilla(&args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let table = ok(out);
    // Where the files went is said on stderr, the table alone on stdout.
    assert!(
        err.contains(&format!("wrote the HTML report to {}", html_path.display())),
        "{err}"
    );
    let figures = std::fs::read_dir(&plots)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension().unwrap() == "svg")
        .count();
    assert!(
        err.contains(&format!(
            "wrote {figures} figures (SVG and PNG) to {}",
            plots.display()
        )),
        "{err}"
    );
    let lines: Vec<&str> = table.lines().collect();
    // One column tells the sweeps apart; the config's `steps` does not clash with steps done.
    let header: Vec<&str> = lines[0]
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(
        header[..6],
        [
            "num",
            "sweep",
            "state",
            "steps (config)",
            "final eval_loss",
            "best eval_loss (min over steps)"
        ],
        "{table}"
    );
    assert_eq!(
        header.iter().filter(|h| **h == "steps").count(),
        1,
        "{table}"
    );
    let starred: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|n| n.ends_with('*'))
        })
        .collect();
    assert_eq!(starred.len(), 1, "{table}");
    assert!(
        starred[0].trim_start().starts_with("1*  b ") && starred[0].contains(" 0.5 "),
        "{table}"
    );
    assert!(
        table.contains(&format!("job 1 in {}", sweeps[1].join("1").display())),
        "{table}"
    );
    // The HTML page highlights the same single row and says what "best" means.
    let html = std::fs::read_to_string(&html_path).unwrap();
    assert_eq!(html.matches("<tr class=\"best\">").count(), 1, "{html}");
    let best_row = html.split("<tr class=\"best\">").nth(1).unwrap();
    assert!(
        best_row.starts_with("<td>1</td><td class=\"text\">b</td>"),
        "{best_row}"
    );
    assert!(html.contains("best eval_loss (min over steps)"));
    // The optimization history plots the same best values as the table (0.5 among them), not
    // the final ones (1.5 for that job).
    let json: serde_json::Value = serde_json::from_str(&ok(flotilla(&[
        "report", paths[0], paths[1], paths[2], "--format", "json",
    ])))
    .unwrap();
    let jobs = json["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 6);
    assert_eq!(jobs[3]["sweep"], "b");
    assert_eq!(jobs[3]["best"], 0.5);
    assert_eq!(jobs[3]["final"], 1.5);
    let history = html.split("optimization history").nth(1).unwrap();
    assert!(history.contains("<title>job 3: 0.5</title>"), "{history}");
    assert!(!history.contains(": 1.5</title>"), "{history}");
}

#[test]
fn an_unreadable_plan_still_reports_its_jobs_and_a_missing_path_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let sweep = prepared_sweep(tmp.path());
    write_metrics(&sweep, 1, "0,3.0,1,0.2,1000,1.0,,,\n");
    std::fs::write(sweep.join("sweep.json"), "{ not json").unwrap();
    // The directory above the sweep is searched recursively.
    let out = ok(flotilla(&[
        "report",
        tmp.path().to_str().unwrap(),
        "--format",
        "json",
    ]));
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    let jobs = report["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 5);
    assert_eq!(jobs[1]["num"], 1);
    assert_eq!(jobs[1]["final"], 3.0);
    assert!(jobs[1]["reason"].as_str().unwrap().contains("sweep.json"));
    assert_eq!(report["metric"], "loss");

    let missing = flotilla(&["report", "no/such/dir"]);
    assert!(!missing.status.success());
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(
        err.contains("no/such/dir") && err.contains("no such directory"),
        "{err}"
    );
    let empty = tempfile::tempdir().unwrap();
    let none = flotilla(&["report", empty.path().to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&none.stderr).contains("no job under"));
    let bad_sort = flotilla(&["report", sweep.to_str().unwrap(), "--sort", "nope"]);
    assert!(String::from_utf8_lossy(&bad_sort.stderr).contains("unknown sort key 'nope'"));
}

/// Writes smooth loss curves (and an eval_loss every 10 steps) for all five jobs of `sweep`.
fn write_curves(sweep: &Path) {
    for (i, scale) in [1.0, 0.8, 0.9, 1.2, 1.1].iter().enumerate() {
        let mut text = String::new();
        for step in 0..30 {
            let loss = scale * (3.0 - (step as f64).ln_1p() * 0.4);
            let eval = if step % 10 == 9 {
                format!("{:.4}", loss + 0.1)
            } else {
                String::new()
            };
            text.push_str(&format!("{step},{loss:.4},1,0.1,1000,{step},{eval},,\n"));
        }
        write_metrics(sweep, i, &text);
    }
}

/// A PNG's width, height and RGBA8 pixels, decoded by the `png` crate.
fn decode_png(bytes: &[u8]) -> (u32, u32, Vec<[u8; 4]>) {
    let mut reader = png::Decoder::new(std::io::Cursor::new(bytes))
        .read_info()
        .expect("a PNG header");
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).expect("PNG pixels");
    assert_eq!(
        (info.color_type, info.bit_depth),
        (png::ColorType::Rgba, png::BitDepth::Eight)
    );
    let pixels = buf[..info.buffer_size()]
        .chunks_exact(4)
        .map(|p| [p[0], p[1], p[2], p[3]])
        .collect();
    (info.width, info.height, pixels)
}

/// The number in `name="..."` of an SVG's root element.
fn svg_attr(svg: &str, name: &str) -> u32 {
    let root = &svg[..svg.find('>').unwrap()];
    let start = root.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
    root[start..].split('"').next().unwrap().parse().unwrap()
}

#[test]
fn plot_writes_every_figure_as_svg_and_as_a_png_of_the_same_picture() {
    let tmp = tempfile::tempdir().unwrap();
    let sweep = prepared_sweep(tmp.path());
    write_curves(&sweep);
    let plots = tmp.path().join("plots");
    let out = flotilla(&[
        "report",
        sweep.to_str().unwrap(),
        "--plot",
        plots.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    ok(out);
    let fonts = flotilla_results::report::png::font_family().is_some();
    assert_eq!(
        stderr.contains("fonts-dejavu-core"),
        !fonts,
        "the missing-font warning: {stderr}"
    );
    let mut svgs: Vec<PathBuf> = std::fs::read_dir(&plots)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "svg"))
        .collect();
    svgs.sort();
    assert_eq!(svgs.len(), 5, "{svgs:?}");
    let pngs = std::fs::read_dir(&plots)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension().unwrap() == "png")
        .count();
    assert_eq!(pngs, svgs.len());
    // The curves' colours: the palette's first five, one per job.
    let stroke_colours: [[u8; 3]; 5] = [
        [0x4e, 0x79, 0xa7],
        [0xf2, 0x8e, 0x2b],
        [0xe1, 0x57, 0x59],
        [0x76, 0xb7, 0xb2],
        [0x59, 0xa1, 0x4f],
    ];
    for svg_path in &svgs {
        let svg = std::fs::read_to_string(svg_path).unwrap();
        let png_path = svg_path.with_extension("png");
        let bytes =
            std::fs::read(&png_path).unwrap_or_else(|e| panic!("{}: {e}", png_path.display()));
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{}", png_path.display());
        let (width, height, pixels) = decode_png(&bytes);
        assert_eq!(
            (width, height),
            (2 * svg_attr(&svg, "width"), 2 * svg_attr(&svg, "height")),
            "{}",
            png_path.display()
        );
        // Opaque, white background, and a picture on it (axes, text, lines or points).
        assert!(pixels.iter().all(|p| p[3] == 255), "{}", png_path.display());
        let drawn = pixels.iter().filter(|p| p[..3] != [255, 255, 255]).count();
        assert!(
            drawn > pixels.len() / 100 && drawn < pixels.len() / 2,
            "{}: {drawn} of {} pixels drawn",
            png_path.display(),
            pixels.len()
        );
        let name = svg_path.file_name().unwrap().to_string_lossy();
        if name.starts_with("curves_") {
            // Each job's curve, in its colour, left of the legend (x < 2 × (640 − 150)).
            for colour in stroke_colours {
                let on_plot = pixels
                    .iter()
                    .enumerate()
                    .filter(|(i, p)| (*i as u32 % width) < 2 * 490 && p[..3] == colour)
                    .count();
                assert!(
                    on_plot > 20,
                    "{name}: {on_plot} pixels of the curve coloured {colour:02x?}"
                );
            }
        }
    }
    if let Ok(keep) = std::env::var("FLOTILLA_KEEP_PNG") {
        std::fs::copy(plots.join("curves_loss.png"), keep).unwrap();
    }
}

/// Legends whose labels are longer than the legend's column stay inside the figure: wrapped,
/// or cut with an ellipsis and the whole label as the entry's `<title>`, so that nothing is
/// drawn at the figure's right edge (the labels ran past it); a legend with more entries than
/// fit ends with `+N more`.
#[test]
fn long_legend_labels_stay_inside_the_figures() {
    let tmp = tempfile::tempdir().unwrap();
    let proj = tmp.path().join("proj");
    std::fs::create_dir_all(proj.join("conf")).unwrap();
    std::fs::write(
        proj.join("conf/config.yaml"),
        "x: 0\nname: a\nflotilla:\n  task:\n    command: [bash, job.sh, '${x}']\n",
    )
    .unwrap();
    std::fs::write(proj.join("job.sh"), "").unwrap();
    let long = "warmup_cosine_schedule_with_restarts_and_a_rather_long_name";
    for (jobs, xs) in [(4, "x=1,2"), (30, "x=range(0,15)")] {
        let sweep = tmp.path().join(format!("sweep{jobs}"));
        ok(flotilla_in(
            &proj,
            &[
                "run",
                "-m",
                "--dry-run",
                xs,
                &format!("name={long},linear_decay_to_zero_over_the_whole_run"),
                &format!("flotilla.sweep.dir={}", sweep.display()),
            ],
        ));
        for num in 0..jobs {
            let rows: String = (0..20)
                .map(|s| format!("{s},{}\n", 3.0 + num as f64 * 0.1 - s as f64 * 0.05))
                .collect();
            std::fs::write(
                sweep.join(format!("{num}/metrics.csv")),
                format!("step,loss\n{rows}"),
            )
            .unwrap();
        }
        let plots = tmp.path().join(format!("plots{jobs}"));
        ok(flotilla(&[
            "report",
            sweep.to_str().unwrap(),
            "--plot",
            plots.to_str().unwrap(),
        ]));
        let svg = std::fs::read_to_string(plots.join("curves_loss.svg")).unwrap();
        let png = std::fs::read(plots.join("curves_loss.png")).unwrap();
        let (width, height, pixels) = decode_png(&png);
        assert_eq!(width, 2 * svg_attr(&svg, "width"));
        // Nothing drawn in the 3 units at the figure's right edge (6 PNG pixels).
        let at_edge = pixels
            .iter()
            .enumerate()
            .filter(|(i, p)| (*i as u32 % width) >= width - 6 && p[..3] != [255, 255, 255])
            .count();
        assert_eq!(
            at_edge, 0,
            "{jobs} jobs: {at_edge} pixels drawn at the right edge of a {width}x{height} figure"
        );
        if jobs == 4 {
            // Room enough: every label whole, wrapped.
            assert!(
                svg.matches(">rather_long_name</text>").count() == 2 && !svg.contains("<title>"),
                "{svg}"
            );
        } else {
            // One line each, cut, the whole label as the entry's title; the rest counted.
            assert!(
                svg.contains(&format!("<title>0 x=0 name={long}</title>")),
                "{svg}"
            );
            assert!(svg.contains(">+10 more</text>"), "{svg}");
        }
        if let Ok(keep) = std::env::var("FLOTILLA_KEEP_PNG") {
            std::fs::copy(plots.join("curves_loss.png"), format!("{keep}.{jobs}.png")).unwrap();
        }
    }
}

#[test]
fn without_any_font_the_pngs_are_still_written_and_one_warning_names_the_fix() {
    let tmp = tempfile::tempdir().unwrap();
    let sweep = prepared_sweep(tmp.path());
    write_curves(&sweep);
    let plots = tmp.path().join("plots");
    let empty = tmp.path().join("no-fonts");
    std::fs::create_dir(&empty).unwrap();
    // A mount namespace in which the system's font directories are empty (root only).
    let probe = Command::new("unshare")
        .args(["-m", "mount", "--bind"])
        .args([&empty, &empty])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        return common::skip_or_fail(
            "hiding the fonts needs `unshare -m` and mount: run the tests as root",
        );
    }
    let mut script = String::from("set -e\n");
    for dir in ["/usr/share/fonts", "/usr/local/share/fonts"] {
        if Path::new(dir).is_dir() {
            script.push_str(&format!("mount --bind '{}' {dir}\n", empty.display()));
        }
    }
    script.push_str("exec \"$@\"\n");
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c", &script, "sh"])
        .arg(env!("CARGO_BIN_EXE_flotilla"))
        .args(["report", sweep.to_str().unwrap(), "--plot"])
        .arg(&plots)
        .env("HOME", &empty)
        .env("XDG_DATA_HOME", &empty)
        .env("XDG_CONFIG_HOME", &empty)
        .env_remove("FLOTILLA_LOG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    ok(out);
    let figures = std::fs::read_dir(&plots)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension().unwrap() == "png")
        .count();
    assert_eq!(
        stderr.lines().collect::<Vec<_>>(),
        [
            "warning: no font was found, so the PNG figures have no text; install one (Debian: \
          apt-get install fonts-dejavu-core)"
                .to_string(),
            format!(
                "wrote {figures} figures (SVG and PNG) to {}",
                plots.display()
            )
        ]
    );
    let png = std::fs::read(plots.join("curves_loss.png")).unwrap();
    let (width, height, pixels) = decode_png(&png);
    assert_eq!((width, height), (1280, 720));
    let blue = pixels
        .iter()
        .filter(|p| p[..3] == [0x4e, 0x79, 0xa7])
        .count();
    assert!(
        blue > 100,
        "the curves are drawn without text ({blue} pixels)"
    );
}

#[test]
fn status_shows_the_best_metric_so_far_of_a_running_sweep() {
    let tmp = tempfile::tempdir().unwrap();
    let sweep = prepared_sweep(tmp.path());
    let dir = sweep.to_str().unwrap();
    let status = |extra: &[&str]| ok(flotilla(&[&["status", dir], extra].concat()));
    let json = |extra: &[&str]| -> serde_json::Value {
        serde_json::from_str(&status(&[&["--format", "json"], extra].concat())).unwrap()
    };

    // Nothing logged yet: no best line, and a null best beside the jobs.
    let text = status(&[]);
    assert!(!text.contains("so far"), "{text}");
    let before = json(&[]);
    assert!(before["best"].is_null(), "{before}");
    assert_eq!(before["jobs"].as_array().unwrap().len(), 5);

    // Two jobs running: job 1 evaluates 2.6 then 2.5, job 3 2.4 then 2.45.
    write_metrics(
        &sweep,
        1,
        "0,3.0,1,0.2,1000,1.0,,,\n1,2.7,1,0.2,1000,2.0,2.6,13.5,0.30\n2,2.6,1,0.2,1000,3.0,,,\n3,2.5,1,0.2,1000,4.0,2.5,12.2,0.35\n",
    );
    write_metrics(
        &sweep,
        3,
        "0,3.1,1,0.4,1000,1.0,,,\n1,2.5,1,0.4,1000,2.0,2.4,11.0,0.32\n2,2.45,1,0.4,1000,3.0,,,\n3,2.4,1,0.4,1000,4.0,2.45,11.6,0.31\n",
    );
    set_record(&sweep, 1, "RUNNING", None);
    set_record(&sweep, 3, "RUNNING", None);
    let text = status(&[]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.last().copied(),
        Some("best eval_loss so far: 2.4 (job 3, step 1; trainer.lr=0.4)"),
        "{text}"
    );
    assert_eq!(text.matches("so far").count(), 1, "{text}");
    let st = json(&[]);
    assert_eq!(st["jobs"].as_array().unwrap().len(), 5, "{st}");
    assert_eq!(st["jobs"][3]["steps"], 4, "{st}");
    assert_eq!(
        st["best"],
        serde_json::json!({"metric": "eval_loss", "mode": "min", "value": 2.4, "num": 3,
            "step": 1, "params": {"trainer.lr": 0.4}})
    );

    // An accuracy is maximised: job 1's 0.35 at step 3.
    let text = status(&["--metric", "eval_acc"]);
    assert!(
        text.ends_with("best eval_acc so far: 0.35 (job 1, step 3; trainer.lr=0.2)\n"),
        "{text}"
    );
    let st = json(&["--metric", "eval_acc"]);
    assert_eq!(
        st["best"],
        serde_json::json!({"metric": "eval_acc", "mode": "max", "value": 0.35, "num": 1,
            "step": 3, "params": {"trainer.lr": 0.2}})
    );
    // A metric no job logged shows no line.
    assert!(!status(&["--metric", "nope"]).contains("so far"));

    // --watch shows it on every refresh, and returns once every job has ended.
    for num in 0..5 {
        set_record(
            &sweep,
            num,
            if num == 1 { "FAILED" } else { "COMPLETED" },
            None,
        );
    }
    let text = status(&["--watch", "--interval-s", "0.1"]);
    assert!(
        text.ends_with("best eval_loss so far: 2.4 (job 3, step 1; trainer.lr=0.4)\n"),
        "{text}"
    );

    // One job directory of the sweep: its own best.
    let job = ok(flotilla(&["status", sweep.join("1").to_str().unwrap()]));
    assert!(
        job.contains("best eval_loss so far: 2.5 (job 1, step 3"),
        "{job}"
    );
}

#[test]
fn the_html_report_renders_in_headless_chromium_without_console_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let sweep = prepared_sweep(tmp.path());
    write_curves(&sweep);
    let page = tmp.path().join("report.html");
    let plots = tmp.path().join("plots");
    ok(flotilla(&[
        "report",
        sweep.to_str().unwrap(),
        "--html",
        page.to_str().unwrap(),
        "--plot",
        plots.to_str().unwrap(),
    ]));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        !html.contains("http://") || !html.contains("<script src"),
        "the page must be self-contained"
    );
    // Curves for loss and eval_loss, one per parameter, parallel coordinates, history.
    let figures: Vec<String> = std::fs::read_dir(&plots)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    for name in [
        "curves_loss.svg",
        "curves_eval_loss.svg",
        "param_trainer.lr.svg",
        "parallel.svg",
        "history.svg",
    ] {
        assert!(figures.contains(&name.to_string()), "{figures:?}");
    }
    assert_eq!(html.matches("<svg").count(), 5);
    assert_eq!(html.matches("class=\"curve\"").count(), 10);

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
    let shot = tmp.path().join("report.png");
    let out = headless(
        &chromium,
        &profile,
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1300,1900",
            &url,
        ],
    );
    assert!(shot.is_file(), "{}", String::from_utf8_lossy(&out.stderr));
    let png = std::fs::read(&shot).unwrap();
    assert_eq!(&png[1..4], b"PNG");
    assert!(
        png.len() > 30_000,
        "a screenshot of tables and plots is not {} bytes",
        png.len()
    );
    if let Ok(keep) = std::env::var("FLOTILLA_KEEP_SCREENSHOT") {
        std::fs::copy(&shot, keep).unwrap();
    }
}

/// The issue's own acceptance run, shortened: a real two-job sweep of the built-in trainer,
/// reported, and its TensorBoard events read back by the real `tensorboard` package.
#[test]
fn a_real_sweep_is_reported_and_tensorboard_reads_its_events() {
    common::train_binary();
    let tmp = tempfile::tempdir().unwrap();
    let sweep = tmp.path().join("sweep");
    ok(flotilla(&[
        "run",
        "-m",
        "trainer.lr=1e-3,3e-3",
        "trainer.max_steps=20",
        "trainer.eval_every=10",
        &format!("flotilla.sweep.dir={}", sweep.display()),
    ]));
    let out = ok(flotilla(&[
        "report",
        sweep.to_str().unwrap(),
        "--format",
        "json",
    ]));
    let report: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["metric"], "eval_loss");
    let jobs = report["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 2);
    let mut bests = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        assert_eq!(job["state"], "COMPLETED", "{job}");
        assert_eq!(job["steps"], 20);
        assert_eq!(job["params"]["trainer.lr"], [1e-3, 3e-3][i]);
        // The report's figures are metrics.csv's.
        let mut reader = csv::Reader::from_path(sweep.join(format!("{i}/metrics.csv"))).unwrap();
        let headers = reader.headers().unwrap().clone();
        let col = |name: &str| headers.iter().position(|h| h == name).unwrap();
        let rows: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
        let evals: Vec<(u64, f64)> = rows
            .iter()
            .filter(|r| !r[col("eval_loss")].is_empty())
            .map(|r| {
                (
                    r[col("step")].parse().unwrap(),
                    r[col("eval_loss")].parse().unwrap(),
                )
            })
            .collect();
        assert_eq!(evals.iter().map(|e| e.0).collect::<Vec<_>>(), [9, 19]);
        let best = evals
            .iter()
            .cloned()
            .fold((0, f64::INFINITY), |a, e| if e.1 < a.1 { e } else { a });
        assert_eq!(job["final"].as_f64(), Some(evals[1].1));
        assert_eq!(job["best"].as_f64(), Some(best.1));
        assert_eq!(job["best_step"].as_u64(), Some(best.0));
        bests.push(best.1);

        // TensorBoard sees every value of metrics.csv at its step (as float32), and the hparams.
        let read = common::python(common::oracle_file("tensorboard_events.py"))
            .arg(sweep.join(format!("{i}/tb")))
            .output();
        let events: serde_json::Value = serde_json::from_str(&ok(read)).unwrap();
        for name in [
            "loss",
            "grad_norm",
            "lr",
            "tokens_per_s",
            "elapsed_s",
            "eval_loss",
            "eval_ppl",
            "eval_acc",
        ] {
            let expected: Vec<(u64, f32)> = rows
                .iter()
                .filter(|r| !r[col(name)].is_empty())
                .map(|r| {
                    (
                        r[col("step")].parse().unwrap(),
                        r[col(name)].parse::<f64>().unwrap() as f32,
                    )
                })
                .collect();
            let got: Vec<(u64, f32)> = events["scalars"][name]
                .as_array()
                .unwrap_or_else(|| panic!("no {name} in {events}"))
                .iter()
                .map(|p| (p[0].as_u64().unwrap(), p[1].as_f64().unwrap() as f32))
                .collect();
            assert_eq!(got, expected, "{name} of job {i}");
        }
        assert_eq!(
            events["hparams"]["trainer.lr"].as_f64(),
            Some([1e-3, 3e-3][i])
        );
        assert_eq!(events["hparam_names"][0], "trainer.lr");
        assert!(events["metric_tags"]
            .as_array()
            .unwrap()
            .contains(&"eval_loss".into()));
        assert_eq!(events["status"], 1, "SessionEndInfo SUCCESS");
    }
    let best_num = if bests[0] <= bests[1] { 0 } else { 1 };
    assert_eq!(report["best"]["num"], best_num);
}
