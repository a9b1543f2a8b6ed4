//! Differential tests: `flotilla` against the real Hydra 1.3.8 / OmegaConf 2.3.1.
//!
//! The fixtures in `tests/oracle/fixtures/` were recorded from Hydra itself by
//! `tests/oracle/record_hydra.py` over the config trees in `tests/oracle/conf/`. Every case is run
//! through the `flotilla` binary:
//!
//! * compose cases: `flotilla compose --config-dir tests/oracle/conf/<tree> --config-name <name>
//!   --format json <overrides...>`
//! * multirun cases: `flotilla plan -m --config-dir ... --config-name ... --format json <overrides...>`
//!
//! with the case's environment variables set (and every other `FLOTILLA_ORACLE_*` variable
//! removed). A case passes when Hydra failed and flotilla exited with code 2, or when both
//! succeeded and the JSON is identical: the same values with the same types (`1` is not `1.0`) and
//! the same key order. A panic (exit code 101 or "panicked" on stderr) always fails the case. Every
//! case runs; the report lists each mismatch and the test fails with `N of M cases differ`.
//!
//! `FLOTILLA_ORACLE_FILTER=substr` restricts the run to cases whose name contains `substr`.
//! `FLOTILLA_ORACLE_LIVE=1` also re-runs the recorder (needs the `.venv`) and checks that the
//! committed fixtures are up to date.
//!
//! Mandatory values (`???`): `tests/oracle/record_mandatory.py` runs a `@hydra.main` app (which
//! reads none of its config) on `tests/oracle/conf/mandatory` with a `???` at one key per case,
//! as a run and as a multirun, and records whether hydra-core raised `MissingMandatoryValue`
//! (`fixtures/mandatory.json`). Where it did, `flotilla compose`, `plan` and `run --dry-run` (a
//! run) or `plan -m` and `run -m --dry-run` (a multirun) must exit 2 naming the key, having
//! created nothing; where it ran the app, they must succeed. The recorded cases always run; the
//! same comparison against hydra-core live runs when the `.venv` has it (else it is skipped, or
//! fails with `FLOTILLA_REQUIRE_ORACLES=1`), and checks that the fixture is what it records.

mod common;

use serde_json::{Map, Value};
use std::fmt::Write as _;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_flotilla");
const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");
/// Variables with this prefix belong to the oracle cases; the child never inherits ours.
const ENV_PREFIX: &str = "FLOTILLA_ORACLE_";
const RUN_TIMEOUT: Duration = Duration::from_secs(60);
/// How many value differences one case reports at most.
const MAX_DIFFS_PER_CASE: usize = 3;
/// Width at which expected/got values are cut in the report.
const SHOW_WIDTH: usize = 160;

// ------------------------------------------------------------------------------------------------
// Fixtures
// ------------------------------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Compose,
    Multirun,
}

#[derive(Debug)]
enum Expected {
    Ok(Value),
    Err { ty: String, message: String },
}

#[derive(Debug)]
struct Case {
    name: String,
    tree: String,
    config_name: String,
    overrides: Vec<String>,
    /// `None`: the variable must be unset.
    env: Vec<(String, Option<String>)>,
    expected: Expected,
}

fn oracle_dir() -> PathBuf {
    Path::new(MANIFEST_DIR).join("tests").join("oracle")
}

fn fixture_path(kind: Kind) -> PathBuf {
    let file = match kind {
        Kind::Compose => "compose.json",
        Kind::Multirun => "multirun.json",
    };
    oracle_dir().join("fixtures").join(file)
}

fn str_field<'a>(obj: &'a Map<String, Value>, key: &str, ctx: &str) -> &'a str {
    obj.get(key)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("{ctx}: field {key:?} missing or not a string"))
}

fn parse_case(v: &Value, file: &Path) -> Case {
    let ctx = file.display().to_string();
    let obj = v
        .as_object()
        .unwrap_or_else(|| panic!("{ctx}: a case is not an object"));
    let name = str_field(obj, "name", &ctx).to_string();
    let ctx = format!("{ctx}: case {name}");
    let overrides = obj
        .get("overrides")
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("{ctx}: overrides missing"))
        .iter()
        .map(|o| {
            o.as_str()
                .unwrap_or_else(|| panic!("{ctx}: override not a string"))
                .to_string()
        })
        .collect();
    let env = obj
        .get("env")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().map(str::to_string)))
                .collect()
        })
        .unwrap_or_default();
    let expected = match (obj.get("result"), obj.get("error")) {
        (Some(r), None) => Expected::Ok(r.clone()),
        (None, Some(e)) => Expected::Err {
            ty: e
                .get("type")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_string(),
            message: e
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
        },
        _ => panic!("{ctx}: needs exactly one of result / error"),
    };
    Case {
        tree: str_field(obj, "tree", &ctx).to_string(),
        config_name: str_field(obj, "config_name", &ctx).to_string(),
        name,
        overrides,
        env,
        expected,
    }
}

fn load_cases(kind: Kind) -> Vec<Case> {
    let path = fixture_path(kind);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let root: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not valid JSON: {e}", path.display()));
    let cases = root
        .get("cases")
        .and_then(Value::as_array)
        .unwrap_or_else(|| panic!("{}: no \"cases\" array", path.display()));
    let filter = std::env::var("FLOTILLA_ORACLE_FILTER")
        .ok()
        .filter(|f| !f.is_empty());
    cases
        .iter()
        .map(|c| parse_case(c, &path))
        .filter(|c| filter.as_deref().is_none_or(|f| c.name.contains(f)))
        .collect()
}

// ------------------------------------------------------------------------------------------------
// Running flotilla
// ------------------------------------------------------------------------------------------------

struct RunOutput {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    timed_out: bool,
}

fn command_line(kind: Kind, case: &Case) -> Vec<String> {
    let mut args: Vec<String> = match kind {
        Kind::Compose => vec!["compose".into()],
        Kind::Multirun => vec!["plan".into(), "-m".into()],
    };
    args.push("--config-dir".into());
    args.push(format!("tests/oracle/conf/{}", case.tree));
    args.push("--config-name".into());
    args.push(case.config_name.clone());
    args.push("--format".into());
    args.push("json".into());
    if case.overrides.iter().any(|o| o.starts_with('-')) {
        args.push("--".into());
    }
    args.extend(case.overrides.iter().cloned());
    args
}

fn run_flotilla(args: &[String], env: &[(String, Option<String>)]) -> RunOutput {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .current_dir(MANIFEST_DIR)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for k in std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()) {
        if k.starts_with(ENV_PREFIX) || k.starts_with("HYDRA_") {
            cmd.env_remove(&k);
        }
    }
    for (k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return RunOutput {
                code: None,
                stdout: String::new(),
                stderr: format!("failed to spawn {BIN}: {e}"),
                timed_out: false,
            }
        }
    };
    let mut out_pipe = child.stdout.take().expect("stdout piped");
    let mut err_pipe = child.stderr.take().expect("stderr piped");
    let out_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = out_pipe.read_to_end(&mut buf);
        buf
    });
    let err_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = err_pipe.read_to_end(&mut buf);
        buf
    });
    let start = Instant::now();
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if start.elapsed() > RUN_TIMEOUT => {
                timed_out = true;
                let _ = child.kill();
                break child.wait().ok();
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(_) => break None,
        }
    };
    let stdout = String::from_utf8_lossy(&out_reader.join().unwrap_or_default()).into_owned();
    let stderr = String::from_utf8_lossy(&err_reader.join().unwrap_or_default()).into_owned();
    RunOutput {
        code: status.and_then(|s| s.code()),
        stdout,
        stderr,
        timed_out,
    }
}

// ------------------------------------------------------------------------------------------------
// Comparing JSON: values (types matter) first, key order second
// ------------------------------------------------------------------------------------------------

fn child_path(path: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && !key.starts_with(|c: char| c.is_ascii_digit());
    if plain {
        format!("{path}.{key}")
    } else {
        format!("{path}[{}]", Value::String(key.to_string()))
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "int",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "dict",
    }
}

/// Scalar equality where an int never equals a float (1 != 1.0) and ints compare by value.
fn scalar_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            if x.is_f64() != y.is_f64() {
                return false;
            }
            if x.is_f64() {
                let (fx, fy) = (
                    x.as_f64().unwrap_or(f64::NAN),
                    y.as_f64().unwrap_or(f64::NAN),
                );
                fx == fy || (fx.is_nan() && fy.is_nan())
            } else {
                let ix = x
                    .as_i64()
                    .map(i128::from)
                    .or_else(|| x.as_u64().map(i128::from));
                let iy = y
                    .as_i64()
                    .map(i128::from)
                    .or_else(|| y.as_u64().map(i128::from));
                ix == iy
            }
        }
        _ => a == b,
    }
}

fn show(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > SHOW_WIDTH {
        let cut: String = s.chars().take(SHOW_WIDTH).collect();
        format!("{cut}…")
    } else {
        s
    }
}

/// Differences in value (not order), at most `limit`, as "at PATH: ..." lines.
fn value_diffs(expected: &Value, got: &Value, path: &str, out: &mut Vec<String>, limit: usize) {
    if out.len() >= limit {
        return;
    }
    match (expected, got) {
        (Value::Object(e), Value::Object(g)) => {
            let missing: Vec<&String> = e.keys().filter(|k| !g.contains_key(*k)).collect();
            let extra: Vec<&String> = g.keys().filter(|k| !e.contains_key(*k)).collect();
            if !missing.is_empty() || !extra.is_empty() {
                out.push(format!(
                    "at {path}: keys differ; missing {missing:?}, unexpected {extra:?}"
                ));
            }
            for (k, ev) in e {
                if let Some(gv) = g.get(k) {
                    value_diffs(ev, gv, &child_path(path, k), out, limit);
                }
            }
        }
        (Value::Array(e), Value::Array(g)) => {
            if e.len() != g.len() {
                out.push(format!(
                    "at {path}: list length {} expected, got {}: expected {}, got {}",
                    e.len(),
                    g.len(),
                    show(expected),
                    show(got)
                ));
                return;
            }
            for (i, (ev, gv)) in e.iter().zip(g).enumerate() {
                value_diffs(ev, gv, &format!("{path}[{i}]"), out, limit);
            }
        }
        _ => {
            if !scalar_eq(expected, got) {
                let (te, tg) = (type_name(expected), type_name(got));
                let types = if te == tg {
                    String::new()
                } else {
                    format!(" ({te} vs {tg})")
                };
                out.push(format!(
                    "at {path}: expected {}, got {}{types}",
                    show(expected),
                    show(got)
                ));
            }
        }
    }
}

/// The first place where two value-equal trees order their keys differently.
fn order_diff(expected: &Value, got: &Value, path: &str) -> Option<String> {
    match (expected, got) {
        (Value::Object(e), Value::Object(g)) => {
            let ek: Vec<&String> = e.keys().collect();
            let gk: Vec<&String> = g.keys().collect();
            if ek != gk {
                return Some(format!("at {path}: key order expected {ek:?}, got {gk:?}"));
            }
            e.iter()
                .find_map(|(k, ev)| order_diff(ev, &g[k], &child_path(path, k)))
        }
        (Value::Array(e), Value::Array(g)) => e
            .iter()
            .zip(g)
            .enumerate()
            .find_map(|(i, (ev, gv))| order_diff(ev, gv, &format!("{path}[{i}]"))),
        _ => None,
    }
}

/// One mismatch found in a case: a short kind label and detail lines.
struct Mismatch {
    kind: &'static str,
    details: Vec<String>,
}

fn compare_json(expected: &Value, got: &Value, path: &str) -> Option<Mismatch> {
    let mut diffs = Vec::new();
    value_diffs(expected, got, path, &mut diffs, MAX_DIFFS_PER_CASE);
    if !diffs.is_empty() {
        return Some(Mismatch {
            kind: "value",
            details: diffs,
        });
    }
    order_diff(expected, got, path).map(|d| Mismatch {
        kind: "key order",
        details: vec![d],
    })
}

fn compare_multirun(expected: &Value, got: &Value) -> Option<Mismatch> {
    let empty = Vec::new();
    let ejobs = expected
        .get("jobs")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    let Some(gjobs) = got.get("jobs").and_then(Value::as_array) else {
        return Some(Mismatch {
            kind: "shape",
            details: vec![format!("output has no \"jobs\" list: {}", show(got))],
        });
    };
    let mut details = Vec::new();
    if ejobs.len() != gjobs.len() {
        details.push(format!(
            "expected {} jobs, got {}",
            ejobs.len(),
            gjobs.len()
        ));
    }
    let mut kind = if details.is_empty() { "" } else { "job count" };
    for (i, (ej, gj)) in ejobs.iter().zip(gjobs).enumerate() {
        if details.len() >= MAX_DIFFS_PER_CASE {
            break;
        }
        let (en, gn) = (ej.get("num"), gj.get("num"));
        if !matches!((en, gn), (Some(a), Some(b)) if scalar_eq(a, b)) {
            details.push(format!(
                "job {i}: num expected {}, got {}",
                en.map_or("-".into(), show),
                gn.map_or("-".into(), show)
            ));
            kind = if kind.is_empty() { "job num" } else { kind };
        }
        let (eo, go) = (ej.get("overrides"), gj.get("overrides"));
        if eo != go {
            details.push(format!(
                "job {i}: overrides expected {}, got {}",
                eo.map_or("-".into(), show),
                go.map_or("-".into(), show)
            ));
            kind = if kind.is_empty() { "overrides" } else { kind };
        }
        let ec = ej.get("config").unwrap_or(&Value::Null);
        match gj.get("config") {
            None => {
                details.push(format!("job {i}: no \"config\""));
                kind = if kind.is_empty() { "shape" } else { kind };
            }
            Some(gc) => {
                if let Some(m) = compare_json(ec, gc, &format!("$.jobs[{i}].config")) {
                    details.extend(m.details);
                    kind = if kind.is_empty() { m.kind } else { kind };
                }
            }
        }
    }
    if details.is_empty() {
        None
    } else {
        details.truncate(MAX_DIFFS_PER_CASE + 1);
        Some(Mismatch { kind, details })
    }
}

// ------------------------------------------------------------------------------------------------
// Checking one case
// ------------------------------------------------------------------------------------------------

fn tail(s: &str, lines: usize) -> String {
    let v: Vec<&str> = s.trim_end().lines().collect();
    let start = v.len().saturating_sub(lines);
    v[start..].join(" | ")
}

fn check_case(kind: Kind, case: &Case) -> Option<Mismatch> {
    let args = command_line(kind, case);
    let out = run_flotilla(&args, &case.env);
    if out.timed_out {
        return Some(Mismatch {
            kind: "timeout",
            details: vec![format!("no exit after {}s", RUN_TIMEOUT.as_secs())],
        });
    }
    if out.code == Some(101) || out.stderr.contains("panicked") {
        return Some(Mismatch {
            kind: "panic",
            details: vec![format!(
                "exit {:?}; stderr: {}",
                out.code,
                tail(&out.stderr, 4)
            )],
        });
    }
    match &case.expected {
        Expected::Err { ty, message } => {
            if out.code == Some(2) {
                return None;
            }
            let first_line = message.lines().next().unwrap_or("");
            let got = match out.code {
                Some(0) => format!("exit 0, stdout: {}", tail(&out.stdout, 3)),
                c => format!("exit {c:?}, stderr: {}", tail(&out.stderr, 3)),
            };
            Some(Mismatch {
                kind: "expected error",
                details: vec![
                    format!("Hydra: {ty}: {first_line}"),
                    format!("flotilla: {got}"),
                ],
            })
        }
        Expected::Ok(expected) => {
            if out.code != Some(0) {
                return Some(Mismatch {
                    kind: "unexpected error",
                    details: vec![format!(
                        "exit {:?}, stderr: {}",
                        out.code,
                        tail(&out.stderr, 4)
                    )],
                });
            }
            let got: Value = match serde_json::from_str(out.stdout.trim()) {
                Ok(v) => v,
                Err(e) => {
                    return Some(Mismatch {
                        kind: "bad output",
                        details: vec![format!(
                            "stdout is not JSON ({e}): {}",
                            tail(&out.stdout, 3)
                        )],
                    })
                }
            };
            match kind {
                Kind::Compose => compare_json(expected, &got, "$"),
                Kind::Multirun => compare_multirun(expected, &got),
            }
        }
    }
}

fn describe(kind: Kind, case: &Case) -> String {
    let mut s = format!(
        "{} {}/{}",
        match kind {
            Kind::Compose => "compose",
            Kind::Multirun => "plan -m",
        },
        case.tree,
        case.config_name
    );
    for o in &case.overrides {
        let _ = write!(s, " {}", Value::String(o.clone()));
    }
    for (k, v) in &case.env {
        match v {
            Some(v) => {
                let _ = write!(s, " [{k}={v:?}]");
            }
            None => {
                let _ = write!(s, " [{k} unset]");
            }
        }
    }
    s
}

fn run_all(kind: Kind) {
    let cases = load_cases(kind);
    assert!(
        !cases.is_empty() || std::env::var("FLOTILLA_ORACLE_FILTER").is_ok(),
        "no cases"
    );
    let workers = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, 8);
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Mismatch>>> =
        Mutex::new((0..cases.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= cases.len() {
                    break;
                }
                let m = check_case(kind, &cases[i]);
                results.lock().unwrap()[i] = m;
            });
        }
    });
    let results = results.into_inner().unwrap();

    let mut report = String::new();
    let mut by_kind: Vec<(&'static str, usize)> = Vec::new();
    let mut failed = 0;
    for (case, m) in cases.iter().zip(&results) {
        let Some(m) = m else { continue };
        failed += 1;
        match by_kind.iter_mut().find(|(k, _)| *k == m.kind) {
            Some((_, n)) => *n += 1,
            None => by_kind.push((m.kind, 1)),
        }
        let _ = writeln!(
            report,
            "[{}] {}  ({})",
            m.kind,
            case.name,
            describe(kind, case)
        );
        for d in &m.details {
            let _ = writeln!(report, "    {d}");
        }
    }
    let label = match kind {
        Kind::Compose => "compose",
        Kind::Multirun => "multirun",
    };
    if failed > 0 {
        let kinds: Vec<String> = by_kind.iter().map(|(k, n)| format!("{k}: {n}")).collect();
        eprintln!("{report}");
        eprintln!(
            "hydra oracle ({label}): {failed} of {} cases differ ({})",
            cases.len(),
            kinds.join(", ")
        );
        panic!("{failed} of {} cases differ", cases.len());
    }
    eprintln!("hydra oracle ({label}): all {} cases match", cases.len());
}

// ------------------------------------------------------------------------------------------------
// Tests
// ------------------------------------------------------------------------------------------------

#[test]
fn compose_matches_hydra() {
    run_all(Kind::Compose);
}

#[test]
fn multirun_plan_matches_hydra() {
    run_all(Kind::Multirun);
}

/// The fixtures are what the recorder produces now. Slow (runs Hydra ~100 times), so only with
/// `FLOTILLA_ORACLE_LIVE=1`.
#[test]
fn fixtures_are_up_to_date() {
    if std::env::var("FLOTILLA_ORACLE_LIVE").as_deref() != Ok("1") {
        return common::skip_or_fail(
            "re-recording the fixtures with the live Hydra is slow and opt-in: set \
             FLOTILLA_ORACLE_LIVE=1 (with hydra-core in the venv: scripts/setup.sh)",
        );
    }
    let python = common::venv_python();
    assert!(
        python.exists(),
        "no Python at {}; run scripts/setup.sh",
        python.display()
    );
    let tmp = tempfile::tempdir().expect("temp dir");
    let status = Command::new(&python)
        .arg(oracle_dir().join("record_hydra.py"))
        .arg("--out")
        .arg(tmp.path())
        .current_dir(MANIFEST_DIR)
        .status()
        .expect("run record_hydra.py");
    assert!(status.success(), "record_hydra.py failed: {status}");

    let mut stale = Vec::new();
    for kind in [Kind::Compose, Kind::Multirun] {
        let committed_path = fixture_path(kind);
        let fresh_path = tmp.path().join(committed_path.file_name().unwrap());
        let committed = std::fs::read_to_string(&committed_path).unwrap_or_default();
        let fresh = std::fs::read_to_string(&fresh_path).expect("recorder output");
        if committed == fresh {
            continue;
        }
        // Name the cases that changed, to make the failure actionable.
        let parse = |s: &str| -> Vec<Value> {
            serde_json::from_str::<Value>(s)
                .ok()
                .and_then(|v| v.get("cases").and_then(Value::as_array).cloned())
                .unwrap_or_default()
        };
        let (old, new) = (parse(&committed), parse(&fresh));
        let name = |v: &Value| {
            v.get("name")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_string()
        };
        let mut changed: Vec<String> = new
            .iter()
            .filter(|n| !old.iter().any(|o| o == *n))
            .map(name)
            .collect();
        changed.extend(
            old.iter()
                .filter(|o| !new.iter().any(|n| name(n) == name(o)))
                .map(|o| format!("{} (removed)", name(o))),
        );
        if changed.is_empty() {
            changed.push("(formatting only)".into());
        }
        stale.push(format!(
            "{}: {}",
            committed_path.display(),
            changed.join(", ")
        ));
    }
    assert!(
        stale.is_empty(),
        "fixtures are stale; run `.venv/bin/python tests/oracle/record_hydra.py`:\n{}",
        stale.join("\n")
    );
}

// ------------------------------------------------------------------------------------------------
// Mandatory values: refused where hydra-core raises MissingMandatoryValue
// ------------------------------------------------------------------------------------------------

/// A case of `fixtures/mandatory.json`: a `???` at one key, and what hydra-core did with it.
struct MandatoryCase {
    name: String,
    multirun: bool,
    overrides: Vec<String>,
    /// `None`: Hydra ran the app; `Some(key)`: it raised MissingMandatoryValue for `key`
    /// (directly or as the cause of what it raised).
    missing: Option<String>,
}

fn mandatory_cases(path: &Path) -> Vec<MandatoryCase> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let root: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not valid JSON: {e}", path.display()));
    let cases = root["cases"]
        .as_array()
        .unwrap_or_else(|| panic!("{}: no \"cases\" array", path.display()));
    cases
        .iter()
        .map(|c| {
            let name = c["name"].as_str().expect("a case name").to_string();
            let missing = match &c["raises"] {
                Value::Null => None,
                raised => Some(
                    raised["missing_key"]
                        .as_str()
                        .unwrap_or_else(|| {
                            panic!(
                                "{name}: hydra-core raised {} without MissingMandatoryValue: \
                                 keep such a case out of record_mandatory.py (it has no \
                                 counterpart here)",
                                raised["type"]
                            )
                        })
                        .to_string(),
                ),
            };
            MandatoryCase {
                multirun: c["mode"] == "multirun",
                overrides: c["overrides"]
                    .as_array()
                    .expect("overrides")
                    .iter()
                    .map(|o| o.as_str().expect("an override").to_string())
                    .collect(),
                missing,
                name,
            }
        })
        .collect()
}

/// The commands that must agree with hydra-core on a case: those composing a run, or a
/// multirun (sweeping `b` as the recorder does).
fn mandatory_commands(case: &MandatoryCase) -> Vec<Vec<String>> {
    let conf = oracle_dir().join("conf/mandatory").display().to_string();
    let config = ["--config-dir".to_string(), conf];
    // No task binary is needed: nothing is started.
    let run = ["run", "--dry-run", "--task-exec", "/bin/true"];
    let commands: Vec<Vec<&str>> = if case.multirun {
        vec![
            vec!["plan", "-m", "b=1,2"],
            [&run[..], &["-m", "b=1,2"]].concat(),
        ]
    } else {
        vec![vec!["compose"], vec!["plan"], run.to_vec()]
    };
    commands
        .into_iter()
        .map(|c| {
            let mut args: Vec<String> = c.iter().map(|s| s.to_string()).collect();
            args.extend(config.iter().cloned());
            args.extend(case.overrides.iter().cloned());
            args
        })
        .collect()
}

/// What `flotilla` did differently from hydra-core on one case, if anything.
fn check_mandatory_case(case: &MandatoryCase) -> Option<String> {
    for args in mandatory_commands(case) {
        let cwd = tempfile::tempdir().expect("temp dir");
        let out = Command::new(BIN)
            .args(&args)
            .current_dir(cwd.path())
            .env_remove("FLOTILLA_LOG")
            .output()
            .expect("run flotilla");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let shown = format!("`flotilla {}`", args.join(" "));
        if stderr.contains("panicked") {
            return Some(format!("{shown} panicked: {stderr}"));
        }
        match &case.missing {
            None if !out.status.success() => {
                return Some(format!(
                    "hydra-core runs the app, but {shown} exited {:?}: {}",
                    out.status.code(),
                    tail(&stderr, 3)
                ))
            }
            None => {}
            Some(key) => {
                // Hydra names a list item `None`; flotilla `job.env_copy[0]`.
                let named = key.strip_prefix("hydra.").unwrap_or(key);
                let names = key == "None" || stderr.contains(named);
                if out.status.code() != Some(2) || !names || !stderr.contains("???") {
                    return Some(format!(
                        "hydra-core raises MissingMandatoryValue for {key}, but {shown} exited \
                         {:?}: {}",
                        out.status.code(),
                        tail(&stderr, 3)
                    ));
                }
                let created: Vec<_> = std::fs::read_dir(cwd.path()).unwrap().collect();
                if !created.is_empty() {
                    return Some(format!("{shown} refused the job but created {created:?}"));
                }
            }
        }
    }
    None
}

/// Cases where flotilla differs from hydra-core on purpose, and why.
const MANDATORY_DIFFERENCES: [(&str, &str); 1] = [(
    "run_dir.run",
    "`run` refuses a `???` run directory (`flotilla.run.dir must be a path`, exit 2, as it \
     always did for one left `???` in a file), where hydra-core selects it leniently and writes \
     into a directory named `None`",
)];

/// Checks every case, reporting each mismatch.
fn check_mandatory_cases(cases: &[MandatoryCase], against: &str) {
    assert!(cases.len() >= 40, "only {} cases in {against}", cases.len());
    for (name, why) in MANDATORY_DIFFERENCES {
        assert!(
            cases.iter().any(|c| c.name == name),
            "no case {name} in {against} ({why}): remove it from MANDATORY_DIFFERENCES"
        );
    }
    let failures: Vec<String> = cases
        .iter()
        .filter(|c| {
            !MANDATORY_DIFFERENCES
                .iter()
                .any(|(name, _)| *name == c.name)
        })
        .filter_map(|c| check_mandatory_case(c).map(|m| format!("[{}] {m}", c.name)))
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} mandatory-value cases differ from {against}:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

fn mandatory_fixture() -> PathBuf {
    oracle_dir().join("fixtures").join("mandatory.json")
}

#[test]
fn mandatory_values_are_refused_where_hydra_raises() {
    check_mandatory_cases(
        &mandatory_cases(&mandatory_fixture()),
        "tests/oracle/fixtures/mandatory.json",
    );
}

/// The same cases recorded from hydra-core now: flotilla agrees with it, and the committed
/// fixture is what it records.
#[test]
fn mandatory_values_match_hydra_core_live() {
    if !common::venv_imports("hydra, omegaconf") {
        return common::skip_or_fail(&format!(
            "hydra-core is not importable by {} (the oracle of the mandatory-value cases): run \
             scripts/setup.sh",
            common::venv_python().display()
        ));
    }
    let tmp = tempfile::tempdir().expect("temp dir");
    let out = Command::new(common::venv_python())
        .arg(oracle_dir().join("record_mandatory.py"))
        .arg("--out")
        .arg(tmp.path())
        .current_dir(MANIFEST_DIR)
        .output()
        .expect("run record_mandatory.py");
    assert!(
        out.status.success(),
        "record_mandatory.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let live = tmp.path().join("mandatory.json");
    check_mandatory_cases(&mandatory_cases(&live), "hydra-core (live)");
    assert_eq!(
        std::fs::read_to_string(&live).unwrap(),
        std::fs::read_to_string(mandatory_fixture()).unwrap(),
        "tests/oracle/fixtures/mandatory.json is stale: run \
         `.venv/bin/python tests/oracle/record_mandatory.py`"
    );
}
