//! Every example a user copies runs on the shipped config: each `Examples:` line of the
//! subcommands' `--help`, and each `flotilla` command of the README's code blocks, is run as
//! written (a `run` with `--dry-run` added, so nothing is submitted or trained) in a scratch
//! directory holding the shipped `conf/`, `sweeps/` and `launchers/`. The run and sweep
//! directories an example names (`outputs/multirun/2026-11-25/10-00-00`, `.../0`) are prepared
//! first by `flotilla run --dry-run`. README examples that need the output of a real training
//! run (a trained `final/`, the chat example's data) or show a placeholder are listed with the
//! reason, and the test checks the list still matches the README.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;
use common::{copy_dir, flotilla_bin, repo_root, venv_python};

/// The subcommands whose `--help` shows examples.
const SUBCOMMANDS: [&str; 6] = ["compose", "plan", "run", "report", "diff", "init"];

/// README commands not run, by a text they contain, and why.
const README_NOT_RUN: [(&str, &str); 10] = [
    (
        "generate outputs/",
        "needs a model trained by the README's default run",
    ),
    (
        "model.init_from=base/final",
        "needs base/final, trained by the step before",
    ),
    (
        "report lora-sweep",
        "reports the LoRA sweep trained by the step before",
    ),
    (
        "data.path=chat/",
        "needs the chat example's data (examples/chat/make_example.py)",
    ),
    ("generate chat/", "needs the chat example's trained model"),
    ("<date>", "a placeholder for the date of a real run"),
    (
        "plan --memory ... ",
        "elides the arguments of the example above it",
    ),
    (
        "flotilla.run.dir=base",
        "trains the base model of the LoRA example (minutes)",
    ),
    (
        " 'x=",
        "runs on a config of its own with a key x (an objective of x and y)",
    ),
    (
        " x=1",
        "runs on a config of its own with a key x, after a sweep that failed",
    ),
];

fn run_in(cwd: &Path, args: &[String]) -> Output {
    let path = format!(
        "{}:{}",
        venv_python().parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    Command::new(flotilla_bin())
        .args(args)
        .current_dir(cwd)
        .env("PATH", path)
        .env_remove("FLOTILLA_LOG")
        .output()
        .expect("run flotilla")
}

/// A command line split as a POSIX shell splits it (quotes and backslashes; no expansion).
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for q in chars.by_ref() {
                    if q == '\'' {
                        break;
                    }
                    word.push(q);
                }
            }
            '"' => {
                in_word = true;
                while let Some(q) = chars.next() {
                    match q {
                        '"' => break,
                        '\\' => word.extend(chars.next()),
                        _ => word.push(q),
                    }
                }
            }
            '\\' => {
                in_word = true;
                word.extend(chars.next());
            }
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            '#' if !in_word => break,
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// The `flotilla ...` lines under `Examples:` in a subcommand's `--help`.
fn help_examples(sub: &str) -> Vec<String> {
    let out = run_in(&repo_root(), &[sub.to_string(), "--help".to_string()]);
    assert!(out.status.success(), "flotilla {sub} --help failed");
    let text = String::from_utf8(out.stdout).unwrap();
    let examples = text
        .split_once("Examples:")
        .unwrap_or_else(|| panic!("flotilla {sub} --help shows no examples"))
        .1;
    let lines: Vec<&str> = examples.lines().map(str::trim).collect();
    // A line the help wrapped is not one a user can copy.
    for pair in lines.windows(2) {
        assert!(
            pair[1].is_empty() || pair[1].starts_with("flotilla "),
            "flotilla {sub} --help wraps an example: {:?} / {:?} (keep each under 100 columns)",
            pair[0],
            pair[1]
        );
    }
    lines
        .into_iter()
        .filter(|l| l.starts_with("flotilla "))
        .map(String::from)
        .collect()
}

/// One README command: its text (continuation lines joined) and the directory of the
/// repository it is run from (`examples/ddp_gloo` after a `cd`).
struct ReadmeCommand {
    line: usize,
    text: String,
    dir: Option<String>,
    /// The code block it is in (its opening line).
    block: usize,
}

/// The `$ flotilla ...` commands of the README's code blocks, and the `flotilla ...` lines of
/// its shell blocks (where a `cd` sets the directory of those after it).
fn readme_commands() -> Vec<ReadmeCommand> {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let lines: Vec<&str> = readme.lines().collect();
    let mut out = Vec::new();
    let mut fence: Option<&str> = None;
    let mut dir = None;
    let mut block = 0;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if let Some(lang) = line.strip_prefix("```") {
            fence = match fence {
                None => Some(lang.trim()),
                Some(_) => None,
            };
            block = i + 1;
            dir = None;
            i += 1;
            continue;
        }
        let Some(lang) = fence else {
            i += 1;
            continue;
        };
        let shell = lang == "sh" || lang == "bash";
        if shell {
            if let Some(d) = line.strip_prefix("cd ") {
                dir = Some(shell_words(d)[0].clone());
            }
        }
        let command = line
            .strip_prefix("$ ")
            .or_else(|| shell.then_some(line))
            .filter(|c| c.starts_with("flotilla "));
        let start = i;
        i += 1;
        if let Some(command) = command {
            let mut text = command.to_string();
            while text.ends_with('\\') && i < lines.len() {
                text.pop();
                text.push(' ');
                text.push_str(lines[i].trim());
                i += 1;
            }
            out.push(ReadmeCommand {
                line: start + 1,
                text,
                dir: dir.clone(),
                block,
            });
        }
    }
    out
}

/// A scratch project: the shipped config tree, and an `outputs/` to hold prepared runs.
fn scratch_project(root: &Path) -> PathBuf {
    let project = root.join("project");
    for d in ["conf", "sweeps", "launchers"] {
        copy_dir(&repo_root().join(d), &project.join(d));
    }
    project
}

/// Prepares (with `run --dry-run`) every run or sweep directory under `outputs/` an example
/// names: `outputs/multirun/D/T` a sweep, `outputs/multirun/D/T/N` a job of one, `outputs/D/T`
/// a single run.
fn prepare_named_outputs(project: &Path, words: &[String]) {
    for w in words {
        let parts: Vec<&str> = w.split('/').collect();
        let (kind, dir) = match parts.as_slice() {
            ["outputs", "multirun", d, t] | ["outputs", "multirun", d, t, _] => {
                ("sweep", format!("outputs/multirun/{d}/{t}"))
            }
            ["outputs", d, t] | ["outputs", d, t, ..] => ("run", format!("outputs/{d}/{t}")),
            _ => continue,
        };
        if project.join(&dir).exists() {
            continue;
        }
        let args: Vec<String> = if kind == "sweep" {
            vec![
                "run".into(),
                "-m".into(),
                "--dry-run".into(),
                "trainer.lr=1e-3,3e-3".into(),
                format!("flotilla.sweep.dir={dir}"),
            ]
        } else {
            vec![
                "run".into(),
                "--dry-run".into(),
                format!("flotilla.run.dir={dir}"),
            ]
        };
        let out = run_in(project, &args);
        assert!(
            out.status.success(),
            "preparing {dir}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Runs one example in `cwd`; a `run` gets `--dry-run`. Returns the failure, if any.
fn run_example(cwd: &Path, words: &[String]) -> Result<(), String> {
    let mut args: Vec<String> = words[1..].to_vec();
    if args.first().map(String::as_str) == Some("run") && !args.iter().any(|a| a == "--dry-run") {
        args.insert(1, "--dry-run".into());
    }
    let out = run_in(cwd, &args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() && !stderr.contains("panicked") {
        Ok(())
    } else {
        Err(format!(
            "`flotilla {}` exited {:?}: {}",
            args.join(" "),
            out.status.code(),
            stderr.trim()
        ))
    }
}

#[test]
fn every_help_example_runs_on_the_shipped_config() {
    common::train_binary();
    let tmp = tempfile::tempdir().unwrap();
    let project = scratch_project(tmp.path());
    let mut failures = Vec::new();
    let mut count = 0;
    for sub in SUBCOMMANDS {
        let examples = help_examples(sub);
        assert!(
            !examples.is_empty(),
            "flotilla {sub} --help shows no example"
        );
        // `init` writes a project: its examples run in an empty directory of their own.
        let cwd = if sub == "init" {
            let d = tmp.path().join("init");
            std::fs::create_dir_all(&d).unwrap();
            d
        } else {
            project.clone()
        };
        for example in examples {
            let words = shell_words(&example);
            prepare_named_outputs(&cwd, &words);
            count += 1;
            if let Err(e) = run_example(&cwd, &words) {
                failures.push(format!("flotilla {sub} --help: {e}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {count} examples failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn every_readme_example_runs_on_the_shipped_config() {
    common::train_binary();
    let tmp = tempfile::tempdir().unwrap();
    let project = scratch_project(tmp.path());
    let mut failures = Vec::new();
    let mut skipped_by = vec![0usize; README_NOT_RUN.len()];
    let mut ran = 0;
    // A block that runs `flotilla init` runs in an empty directory of its own.
    let mut init_dirs: std::collections::HashMap<usize, PathBuf> = Default::default();
    for command in readme_commands() {
        if command.text.starts_with("flotilla init") {
            let d = tmp.path().join(format!("init-{}", command.block));
            std::fs::create_dir_all(&d).unwrap();
            init_dirs.insert(command.block, d);
        }
        if let Some(k) = README_NOT_RUN
            .iter()
            .position(|(needle, _)| command.text.contains(needle))
        {
            skipped_by[k] += 1;
            continue;
        }
        let cwd = match &command.dir {
            _ if init_dirs.contains_key(&command.block) => init_dirs[&command.block].clone(),
            Some(d) => {
                let copy = tmp.path().join(d);
                if !copy.exists() {
                    copy_dir(&repo_root().join(d), &copy);
                }
                copy
            }
            None => project.clone(),
        };
        let words = shell_words(&command.text);
        // A synopsis (`flotilla run [-m] [OVERRIDES...]`) is not an example.
        if words
            .iter()
            .any(|w| w.starts_with('[') || w.starts_with('(') || w.contains('|'))
        {
            continue;
        }
        prepare_named_outputs(&cwd, &words);
        ran += 1;
        if let Err(e) = run_example(&cwd, &words) {
            failures.push(format!("README.md:{}: {e}", command.line));
        }
    }
    for (k, (needle, why)) in README_NOT_RUN.iter().enumerate() {
        assert!(
            skipped_by[k] > 0,
            "no README command contains {needle:?} ({why}): remove it from README_NOT_RUN"
        );
    }
    assert!(ran >= 5, "only {ran} README commands ran");
    assert!(
        failures.is_empty(),
        "{} of {ran} README examples failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn shell_words_splits_as_a_shell_does() {
    assert_eq!(
        shell_words(r#"flotilla run 'peft.r=8,16' "a b" c\ d  # note"#),
        ["flotilla", "run", "peft.r=8,16", "a b", "c d"]
    );
}
