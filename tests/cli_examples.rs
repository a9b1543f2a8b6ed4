//! Every example a user copies runs on the shipped config: each `Examples:` line of the
//! subcommands' `--help`, and each `flotilla` command of the README's code blocks, is run as
//! written (a `run` with `--dry-run` added, so nothing is submitted or trained) in a scratch
//! directory holding the shipped `conf/`, `sweeps/` and `launchers/`. The run and sweep
//! directories an example names (`outputs/multirun/2026-11-25/10-00-00`, `.../0`) are prepared
//! first by `flotilla run --dry-run`. README examples that need the output of a real training
//! run (a trained `final/`, the chat example's data) or show a placeholder are listed with the
//! reason, and the test checks the list still matches the README.
//!
//! Options go anywhere: each `--help` example of both binaries' subcommands (`flotilla-train`'s
//! through `flotilla`, which forwards them) that has options and other arguments runs three
//! times, in three copies of the project, with its options first, last, and one after each
//! other argument; all three must exit alike and print the same (run directories' dates and
//! the project's path masked), and fail with the same error.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;
use common::{copy_dir, flotilla_bin, repo_root, venv_python};

/// The subcommands whose `--help` shows examples.
const SUBCOMMANDS: [&str; 6] = ["compose", "plan", "run", "report", "diff", "init"];

/// README commands not run, by a text they contain, and why.
const README_NOT_RUN: [(&str, &str); 13] = [
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
    (
        "{path: chat/",
        "mixes sources of the chat example's data (examples/chat/make_example.py)",
    ),
    ("generate chat/", "needs the chat example's trained model"),
    (
        "=pref/",
        "needs the preference example's data (examples/preference/make_example.py)",
    ),
    (
        "pref/dpo",
        "reports on and generates from the preference example's sweep",
    ),
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

/// Prepares (with `run --dry-run` and the `extra` overrides) every run or sweep directory under
/// `outputs/` an example names: `outputs/multirun/D/T` a sweep, `outputs/multirun/D/T/N` a job of
/// one, `outputs/D/T` a single run.
fn prepare_named_outputs(project: &Path, words: &[String], extra: &[&str]) {
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
        let mut args: Vec<String> = if kind == "sweep" {
            vec![
                "run".into(),
                "-m".into(),
                "--dry-run".into(),
                "trainer.lr=1e-3,3e-3".into(),
                // Two seeds of each: `report --group-by seed` has something to group.
                "seed=1,2".into(),
                format!("flotilla.sweep.dir={dir}"),
            ]
        } else {
            vec![
                "run".into(),
                "--dry-run".into(),
                format!("flotilla.run.dir={dir}"),
            ]
        };
        args.extend(extra.iter().map(|e| e.to_string()));
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
            prepare_named_outputs(&cwd, &words, &[]);
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
        prepare_named_outputs(&cwd, &words, &[]);
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

// ---- options anywhere -----------------------------------------------------------------------

/// The subcommands (as `flotilla` names them) whose `--help` examples run again with their
/// options moved: `flotilla`'s own (`init`'s examples have no option) and those of
/// `flotilla-train` that `flotilla` forwards (`train`, `data show`, `generate`).
const OPTION_ORDER_HELP: [&str; 8] = [
    "compose",
    "plan",
    "run",
    "report",
    "diff",
    "train",
    "data show",
    "generate",
];

/// Commands with options and other arguments that no `--help` example shows: `status` and
/// `consolidate` (whose help has no examples) and a `data show` that succeeds on the shipped
/// config (its examples need a chat data set). They run after the examples, in the same project.
const OPTION_ORDER_EXTRA: [&str; 3] = [
    "flotilla status outputs/multirun/2026-11-25/10-00-00 --format json --metric loss",
    "flotilla consolidate outputs/2026-01-01/12-00-00/checkpoints/step_1 --out consolidated",
    "flotilla data show --num 2 --format json --color never data.num_train=50",
];

/// What a job trains in this test: one step, no evaluation (added to every `train` example's
/// overrides and to the runs prepared for the examples; a `run` gets `--dry-run`, a `generate`
/// `--max-new-tokens 8`).
const ONE_STEP: [&str; 2] = ["trainer.max_steps=1", "trainer.eval_every=0"];

/// Where an example's options go among its other arguments.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Order {
    /// Every option before the first other argument (as most examples are written).
    First,
    /// Every option after the last other argument.
    Last,
    /// One option after each other argument, the options left over at the end.
    Interleaved,
}

/// A command split as its binary parses it.
struct SplitCommand {
    /// The binary and the subcommand (`flotilla data show`).
    head: Vec<String>,
    /// Each option with its value, in order.
    options: Vec<Vec<String>>,
    /// The other arguments (overrides, directories), in order.
    others: Vec<String>,
}

impl SplitCommand {
    fn arrange(&self, order: Order) -> Vec<String> {
        let mut out = self.head.clone();
        match order {
            Order::First => {
                out.extend(self.options.iter().flatten().cloned());
                out.extend(self.others.iter().cloned());
            }
            Order::Last => {
                out.extend(self.others.iter().cloned());
                out.extend(self.options.iter().flatten().cloned());
            }
            Order::Interleaved => {
                let mut options = self.options.iter();
                for other in &self.others {
                    out.push(other.clone());
                    out.extend(options.next().into_iter().flatten().cloned());
                }
                out.extend(options.flatten().cloned());
            }
        }
        out
    }

    /// Whether moving the options changes the command line.
    fn movable(&self) -> bool {
        !self.options.is_empty() && !self.others.is_empty()
    }
}

/// How many words name the binary and its subcommand (`flotilla data show`: 3).
fn head_len(words: &[String]) -> usize {
    match words.get(1).map(String::as_str) {
        Some("data" | "bench") => 3,
        _ => 2,
    }
}

/// The lines under `Examples:` in `flotilla <path> --help` that run `flotilla` or
/// `flotilla-train`, up to the first blank line.
fn examples_in_help(path: &str) -> Vec<String> {
    let mut args: Vec<String> = path.split_whitespace().map(String::from).collect();
    args.push("--help".into());
    let out = run_in(&repo_root(), &args);
    assert!(out.status.success(), "flotilla {path} --help failed");
    let text = String::from_utf8(out.stdout).unwrap();
    let (_, examples) = text
        .split_once("Examples:")
        .unwrap_or_else(|| panic!("flotilla {path} --help shows no examples"));
    examples
        .lines()
        .map(str::trim)
        .skip_while(|l| l.is_empty())
        .take_while(|l| !l.is_empty())
        .filter(|l| l.starts_with("flotilla ") || l.starts_with("flotilla-train "))
        .map(String::from)
        .collect()
}

/// The options of `flotilla <path>` that take a value (`--format <FORMAT>`), from its `--help`.
fn value_options(path: &[String]) -> Vec<String> {
    let mut args = path.to_vec();
    args.push("--help".into());
    let out = run_in(&repo_root(), &args);
    assert!(
        out.status.success(),
        "flotilla {} --help failed",
        path.join(" ")
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut names = Vec::new();
    for line in text.lines() {
        // An option's own line is indented by at most 6 columns; its description wraps deeper.
        let indent = line.len() - line.trim_start().len();
        let line = line.trim_start();
        if indent > 6 || !line.starts_with('-') {
            continue;
        }
        let head = line.split("  ").next().unwrap_or_default();
        if !head.contains('<') {
            continue;
        }
        names.extend(
            head.split([' ', ','])
                .filter(|w| {
                    w.starts_with('-')
                        && w.trim_start_matches('-')
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '-')
                })
                .map(String::from),
        );
    }
    names
}

/// Splits `words` into options (with their values) and other arguments.
fn split_command(words: &[String], takes_value: &[String]) -> SplitCommand {
    let n = head_len(words);
    let mut options = Vec::new();
    let mut others = Vec::new();
    let mut rest = words[n..].iter();
    while let Some(w) = rest.next() {
        assert_ne!(w, "--", "{words:?}: examples with `--` are not moved");
        if w.starts_with('-') && w.len() > 1 {
            let mut option = vec![w.clone()];
            if !w.contains('=') && takes_value.contains(w) {
                option.extend(rest.next().cloned());
            }
            options.push(option);
        } else {
            others.push(w.clone());
        }
    }
    SplitCommand {
        head: words[..n].to_vec(),
        options,
        others,
    }
}

/// What one command did, as compared between orders: its exit status, its standard output,
/// and, when it failed, its error (the project's path and dates masked in both).
#[derive(Debug, PartialEq)]
struct Outcome {
    code: Option<i32>,
    stdout: String,
    error: Option<String>,
}

/// `text` with the project's path and the dates and times of run directories masked.
fn masked(text: &str, project: &Path) -> String {
    let text = text.replace(&project.display().to_string(), "<project>");
    // YYYY-MM-DD, and HH-MM-SS with an optional _N (a second run in the same second).
    let shapes: [(&[u8], &str); 2] = [(b"dddd-dd-dd", "<date>"), (b"dd-dd-dd", "<time>")];
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    'scan: while i < bytes.len() {
        for (shape, name) in shapes {
            let fits = bytes.len() - i >= shape.len()
                && shape.iter().zip(&bytes[i..]).all(|(s, b)| match s {
                    b'd' => b.is_ascii_digit(),
                    s => s == b,
                });
            if fits {
                out.push_str(name);
                i += shape.len();
                if bytes.get(i) == Some(&b'_') && bytes.get(i + 1).is_some_and(u8::is_ascii_digit) {
                    i += 1;
                    while bytes.get(i).is_some_and(u8::is_ascii_digit) {
                        i += 1;
                    }
                }
                continue 'scan;
            }
        }
        let c = text[i..].chars().next().unwrap();
        out.push(c);
        i += c.len_utf8();
    }
    out
}

/// Runs `args` (a `flotilla` or `flotilla-train` command line) in `project`.
fn run_command(project: &Path, args: &[String]) -> Outcome {
    let bin = match args[0].as_str() {
        "flotilla-train" => common::train_binary(),
        _ => flotilla_bin(),
    };
    let path = format!(
        "{}:{}",
        venv_python().parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new(bin)
        .args(&args[1..])
        .current_dir(project)
        .env("PATH", path)
        .env_remove("FLOTILLA_LOG")
        .output()
        .expect("run the example");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("panicked"),
        "`{}` panicked: {stderr}",
        args.join(" ")
    );
    Outcome {
        code: out.status.code(),
        stdout: masked(&String::from_utf8_lossy(&out.stdout), project),
        error: (!out.status.success()).then(|| masked(stderr.trim(), project)),
    }
}

/// Runs every command, in order, with its options placed by `order`, in a fresh copy of the
/// shipped project under `root` (the run directories a command names prepared first, training
/// one step): what each did.
fn run_in_order(root: &Path, commands: &[SplitCommand], order: Order) -> Vec<Outcome> {
    let project = scratch_project(root);
    commands
        .iter()
        .map(|c| {
            let args = c.arrange(order);
            prepare_named_outputs(&project, &args, &ONE_STEP);
            run_command(&project, &args)
        })
        .collect()
}

/// Options may come before, between or after the other arguments, in every subcommand of both
/// binaries: each example of the subcommands' `--help` (and a few commands their help does not
/// show) does the same with its options first, last, and one after each other argument.
#[test]
fn examples_do_the_same_wherever_their_options_are() {
    common::train_binary();
    let mut takes_value: std::collections::HashMap<Vec<String>, Vec<String>> = Default::default();
    let mut commands = Vec::new();
    let lines = OPTION_ORDER_HELP
        .iter()
        .flat_map(|path| examples_in_help(path))
        .chain(OPTION_ORDER_EXTRA.iter().map(|l| l.to_string()));
    for line in lines {
        let mut words = shell_words(&line);
        let n = head_len(&words);
        let subcommand = &words[1..n];
        match subcommand[0].as_str() {
            "run" if !words.iter().any(|w| w == "--dry-run") => words.insert(n, "--dry-run".into()),
            "train" if !words.iter().any(|w| w == "--prepared") => {
                words.extend(ONE_STEP.iter().map(|s| s.to_string()))
            }
            "generate" if !words.iter().any(|w| w == "--max-new-tokens") => {
                words.splice(n..n, ["--max-new-tokens".to_string(), "8".to_string()]);
            }
            _ => {}
        }
        let subcommand = words[1..n].to_vec();
        let values = takes_value
            .entry(subcommand.clone())
            .or_insert_with(|| value_options(&subcommand));
        commands.push(split_command(&words, values));
    }
    let movable = commands.iter().filter(|c| c.movable()).count();
    assert!(
        movable >= 20,
        "only {movable} commands have options to move"
    );
    assert!(
        commands
            .iter()
            .any(|c| c.movable() && c.head[1..] == ["data", "show"]),
        "no `data show` command to move options in"
    );

    let tmp = tempfile::tempdir().unwrap();
    let orders = [Order::First, Order::Last, Order::Interleaved];
    let outcomes: Vec<Vec<Outcome>> = std::thread::scope(|scope| {
        let runs: Vec<_> = orders
            .iter()
            .map(|&order| {
                let root = tmp.path().join(format!("{order:?}"));
                let commands = &commands;
                scope.spawn(move || run_in_order(&root, commands, order))
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    let mut failures = Vec::new();
    for (i, command) in commands.iter().enumerate().filter(|(_, c)| c.movable()) {
        let first = &outcomes[0][i];
        for (k, order) in orders.iter().enumerate().skip(1) {
            if outcomes[k][i] != *first {
                failures.push(format!(
                    "`{}` ({order:?}) did not do what `{}` did:\n  {:?}\n  {first:?}",
                    command.arrange(*order).join(" "),
                    command.arrange(Order::First).join(" "),
                    outcomes[k][i]
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {movable} commands depend on where their options are:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// `--` ends the options of both binaries, also through `flotilla`'s forwarding (where it may
/// come first): what follows is an override even when it starts with `-`.
#[test]
fn a_double_dash_ends_the_options_in_both_binaries() {
    common::train_binary();
    let tmp = tempfile::tempdir().unwrap();
    let project = scratch_project(tmp.path());
    let cases: [(&str, &str); 4] = [
        (
            "flotilla compose -- --format json",
            "Error parsing override '--format'",
        ),
        (
            "flotilla data show --num 0 -- --num 1",
            "Error parsing override '--num'",
        ),
        (
            "flotilla-train data show --num 0 trainer.max_steps=5 -- trainer.lr=-1",
            "trainer.lr: must be a positive number, got -1.0",
        ),
        // Not `train --run-dir try`: nothing trains.
        (
            "flotilla train -- --run-dir try trainer.max_steps=1",
            "--run-dir",
        ),
    ];
    for (line, error) in cases {
        let outcome = run_command(&project, &shell_words(line));
        assert_eq!(outcome.code, Some(2), "{line}: {outcome:?}");
        let stderr = outcome.error.unwrap_or_default();
        assert!(stderr.contains(error), "{line}: {error:?} not in {stderr}");
    }
    assert!(
        !project.join("try").exists(),
        "`flotilla train -- --run-dir try` trained"
    );
}

#[test]
fn options_are_split_from_overrides_as_the_binaries_parse_them() {
    let words = shell_words("flotilla data show --num 2 data=chat --format json a=-1 -m");
    let c = split_command(&words, &["--num".into(), "--format".into()]);
    assert_eq!(c.head, ["flotilla", "data", "show"]);
    assert_eq!(c.others, ["data=chat", "a=-1"]);
    assert_eq!(
        c.arrange(Order::Last).join(" "),
        "flotilla data show data=chat a=-1 --num 2 --format json -m"
    );
    assert_eq!(
        c.arrange(Order::Interleaved).join(" "),
        "flotilla data show data=chat --num 2 a=-1 --format json -m"
    );
    assert_eq!(
        masked(
            "/p/outputs/2026-01-02/10-11-12_3/x 2026-01-02",
            Path::new("/p")
        ),
        "<project>/outputs/<date>/<time>/x <date>"
    );
}

#[test]
fn shell_words_splits_as_a_shell_does() {
    assert_eq!(
        shell_words(r#"flotilla run 'peft.r=8,16' "a b" c\ d  # note"#),
        ["flotilla", "run", "peft.r=8,16", "a b", "c d"]
    );
}
