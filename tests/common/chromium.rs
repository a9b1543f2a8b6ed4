//! Headless Chromium, the oracle of the HTML report: Debian's binary, if installed, run with a
//! profile of the test's own and without network or first-run chatter.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Debian's Chromium, or `None` (the test then skips, or fails with `FLOTILLA_REQUIRE_ORACLES`).
pub fn chromium() -> Option<PathBuf> {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// Runs headless Chromium with the profile directory `profile` and `args` (a page's URL,
/// `--dump-dom`, `--screenshot=FILE`, ...), its log on stderr.
pub fn headless(chromium: &Path, profile: &Path, args: &[&str]) -> Output {
    Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .output()
        .expect("run chromium")
}
