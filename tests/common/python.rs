//! The project venv's Python for the tests' oracles, run by warm interpreters.
//!
//! A fresh `python` that imports torch and transformers 5 spends 6 to 14 s of CPU before the
//! oracle's first line, more than most oracles compute; a test binary used to pay it once per
//! call. [`Python`] builds a call as `Command` does (`arg`, `env`, `current_dir`, `stdin`) and
//! [`Python::output`] hands it to a server of `tests/oracle/serve.py` taken from this
//! process's pool: one per concurrent call, each importing torch and transformers once, kept
//! for the next call. The server runs the script as `__main__` and puts back between calls
//! what a script may change (environment, working directory, `sys.path`, torch's defaults and
//! seed), so a call sees what a fresh interpreter would.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Output, Stdio};
use std::sync::Mutex;

/// A call of the venv's python: `python ARGS...` with extra environment, a working directory
/// and text on stdin.
#[derive(Debug, Clone, Default)]
pub struct Python {
    args: Vec<String>,
    env: BTreeMap<String, String>,
    cwd: Option<PathBuf>,
    stdin: String,
}

/// `python SCRIPT`, to which arguments are added.
pub fn python(script: impl AsRef<OsStr>) -> Python {
    Python::default().arg(script)
}

impl Python {
    /// One more argument.
    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(text(arg.as_ref()));
        self
    }

    /// More arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args.extend(args.into_iter().map(|a| text(a.as_ref())));
        self
    }

    /// An environment variable for this call.
    pub fn env(mut self, name: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env.insert(text(name.as_ref()), text(value.as_ref()));
        self
    }

    /// The working directory of this call.
    pub fn current_dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.cwd = Some(dir.as_ref().to_path_buf());
        self
    }

    /// The text the call reads on stdin.
    pub fn stdin(mut self, text: impl Into<String>) -> Self {
        self.stdin = text.into();
        self
    }

    /// Runs the call, asserts that it succeeded (naming the call and its stderr otherwise) and
    /// returns its stdout.
    pub fn run(&self) -> String {
        let out = self.output();
        assert!(
            out.status.success(),
            "{self:?} failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs the call on a warm server and returns what `Command::output` would: the exit
    /// status, stdout and stderr. A server that dies during a call answers with its
    /// interpreter's fate in stderr and is not reused.
    pub fn output(&self) -> Output {
        let mut server = POOL
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .unwrap_or_else(Server::start);
        match server.call(self) {
            Ok(out) => {
                POOL.lock().unwrap_or_else(|e| e.into_inner()).push(server);
                out
            }
            Err(e) => Output {
                status: ExitStatus::from_raw(1 << 8),
                stdout: Vec::new(),
                stderr: format!("the oracle server died during {self:?}: {e}").into_bytes(),
            },
        }
    }
}

/// Idle servers of this process.
static POOL: Mutex<Vec<Server>> = Mutex::new(Vec::new());

/// One `serve.py` interpreter: requests on its stdin, answers on its stdout. It exits when
/// this process does (its stdin closes).
struct Server {
    _child: Child,
    requests: ChildStdin,
    answers: BufReader<ChildStdout>,
}

impl Server {
    fn start() -> Server {
        let script = super::oracle_file("serve.py");
        let mut child = Command::new(super::venv_python())
            .arg(&script)
            .env("TRANSFORMERS_VERBOSITY", "error")
            .env("HF_HUB_OFFLINE", "1")
            .env("TOKENIZERS_PARALLELISM", "false")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {} {}: {e}",
                    super::venv_python().display(),
                    script.display()
                )
            });
        Server {
            requests: child.stdin.take().expect("piped stdin"),
            answers: BufReader::new(child.stdout.take().expect("piped stdout")),
            _child: child,
        }
    }

    fn call(&mut self, call: &Python) -> Result<Output, String> {
        let request = serde_json::json!({
            "argv": call.args,
            "env": call.env,
            "cwd": call.cwd,
            "stdin": call.stdin,
        });
        writeln!(self.requests, "{request}").map_err(|e| format!("writing the request: {e}"))?;
        self.requests.flush().map_err(|e| e.to_string())?;
        let mut line = String::new();
        match self.answers.read_line(&mut line) {
            Ok(0) => return Err("it exited (see the test's stderr)".into()),
            Err(e) => return Err(format!("reading the answer: {e}")),
            Ok(_) => {}
        }
        let answer: serde_json::Value =
            serde_json::from_str(&line).map_err(|e| format!("answer {line:?}: {e}"))?;
        let field = |name: &str| {
            answer[name]
                .as_str()
                .unwrap_or_default()
                .as_bytes()
                .to_vec()
        };
        let code = answer["code"].as_i64().unwrap_or(1) as i32;
        Ok(Output {
            status: ExitStatus::from_raw((code & 0xff) << 8),
            stdout: field("stdout"),
            stderr: field("stderr"),
        })
    }
}

fn text(s: &OsStr) -> String {
    s.to_str()
        .unwrap_or_else(|| panic!("an oracle argument that is not UTF-8: {s:?}"))
        .to_string()
}
