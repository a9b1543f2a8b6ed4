//! Build script of the `flotilla` CLI: lists the shipped config tree (`conf/`, the named sweeps
//! in `sweeps/` and the sbatch template `launchers/slurm.sbatch.j2`) into `shipped_files.rs`,
//! which embeds each file's text, so that `flotilla init` writes them from a pip-installed
//! binary with no repository at hand.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The directories whose files `flotilla init` writes, relative to the package root.
const SHIPPED_DIRS: &[&str] = &["conf", "sweeps", "launchers"];

fn main() {
    let root = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    println!("cargo:rerun-if-changed=build.rs");
    let mut files = Vec::new();
    for dir in SHIPPED_DIRS {
        collect(&root, &root.join(dir), &mut files);
    }
    files.sort();
    let mut out = String::from(
        "/// Every shipped file: its path relative to the repository root and its text.\n\
         pub const SHIPPED_FILES: &[(&str, &str)] = &[\n",
    );
    for relative in &files {
        let absolute = root.join(relative);
        writeln!(
            out,
            "    ({:?}, include_str!({:?})),",
            relative,
            absolute.display().to_string()
        )
        .expect("writing to a String");
    }
    out.push_str("];\n");
    let dest =
        PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR")).join("shipped_files.rs");
    std::fs::write(&dest, out).expect("writing shipped_files.rs");
}

/// Adds the files under `dir` (recursively, as `/`-separated paths relative to `root`) to
/// `files`, and asks Cargo to rerun when any of them, or a directory's listing, changes.
fn collect(root: &Path, dir: &Path, files: &mut Vec<String>) {
    println!("cargo:rerun-if-changed={}", dir.display());
    let entries =
        std::fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        let hidden = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_none_or(|n| n.starts_with('.'));
        if hidden {
            continue;
        }
        if path.is_dir() {
            collect(root, &path, files);
        } else if path.is_file() {
            println!("cargo:rerun-if-changed={}", path.display());
            let relative = path.strip_prefix(root).expect("under the package root");
            let parts: Vec<_> = relative
                .components()
                .map(|c| c.as_os_str().to_str().expect("a UTF-8 file name"))
                .collect();
            files.push(parts.join("/"));
        }
    }
}
