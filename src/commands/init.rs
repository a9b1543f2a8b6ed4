//! `flotilla init [DIR]`: writes the config tree shipped in the binary (the repository's
//! `conf/`, embedded at build time) into DIR, and beside DIR the named sweeps (`sweeps/`) and
//! the sbatch template (`launchers/slurm.sbatch.j2`), so that a pip-installed flotilla runs the
//! default job from there. It refuses to overwrite: when any target exists it names them all
//! and writes nothing.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};
use clap::Args;

use super::{write_stdout, Failure};

include!(concat!(env!("OUT_DIR"), "/shipped_files.rs"));

pub const INIT_EXAMPLES: &str = "Examples:
  flotilla init                 # conf/, sweeps/ and launchers/ in the current directory
  flotilla init myproject/conf  # myproject/conf/, myproject/sweeps/, myproject/launchers/
  flotilla run                  # then, beside conf/: the default job";

#[derive(Args)]
pub struct InitArgs {
    /// The config directory to create (the shipped `conf/`); `sweeps/` and `launchers/` go
    /// beside it.
    #[arg(default_value = "conf")]
    dir: PathBuf,
}

/// Where each shipped file goes: `conf/...` under `dir`, everything else under `dir`'s parent.
fn destinations(dir: &Path) -> Vec<(PathBuf, &'static str)> {
    let beside = dir.parent().unwrap_or(Path::new(""));
    SHIPPED_FILES
        .iter()
        .map(|(relative, text)| {
            let target = match relative.strip_prefix("conf/") {
                Some(in_conf) => dir.join(in_conf),
                None => beside.join(relative),
            };
            (target, *text)
        })
        .collect()
}

pub fn init(args: InitArgs) -> Result<(), Failure> {
    let files = destinations(&args.dir);
    let taken: Vec<String> = files
        .iter()
        .filter(|(target, _)| target.symlink_metadata().is_ok())
        .map(|(target, _)| target.display().to_string())
        .collect();
    if !taken.is_empty() {
        return Err(Failure::Usage(anyhow!(
            "flotilla init writes nothing over existing files, and {} of its {} files exist: \
             {}; move them away or choose another directory (`flotilla init DIR`)",
            taken.len(),
            files.len(),
            taken.join(", ")
        )));
    }
    let mut written = String::new();
    for (target, text) in &files {
        if let Some(parent) = target.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create the directory {}", parent.display()))?;
        }
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(target)
            .with_context(|| format!("cannot create {}", target.display()))?;
        file.write_all(text.as_bytes())
            .with_context(|| format!("cannot write {}", target.display()))?;
        written.push_str(&format!("wrote {}\n", target.display()));
    }
    if args.dir == Path::new("conf") {
        written.push_str(
            "\nnext: `flotilla compose` shows the default job's config, `flotilla run` runs it\n",
        );
    } else {
        let dir = args.dir.display();
        written.push_str(&format!(
            "\nnext: `flotilla compose --config-dir {dir}` shows the default job's config, \
             `flotilla run --config-dir {dir}` runs it\n"
        ));
    }
    write_stdout(&written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_tree_holds_the_primary_config_and_the_template() {
        let names: Vec<&str> = SHIPPED_FILES.iter().map(|(n, _)| *n).collect();
        for needed in [
            "conf/config.yaml",
            "conf/model/tiny.yaml",
            "conf/compute/slurm.yaml",
            "launchers/slurm.sbatch.j2",
        ] {
            assert!(names.contains(&needed), "{needed} not shipped in {names:?}");
        }
        let (_, config) = SHIPPED_FILES
            .iter()
            .find(|(n, _)| *n == "conf/config.yaml")
            .unwrap();
        assert_eq!(
            *config,
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/conf/config.yaml"))
                .unwrap()
        );
    }

    #[test]
    fn conf_goes_into_dir_and_the_rest_beside_it() {
        let files = destinations(Path::new("proj/conf"));
        let find = |suffix: &str| {
            files
                .iter()
                .find(|(t, _)| t.ends_with(suffix))
                .map(|(t, _)| t.clone())
                .unwrap()
        };
        assert_eq!(find("config.yaml"), Path::new("proj/conf/config.yaml"));
        assert_eq!(
            find("slurm.sbatch.j2"),
            Path::new("proj/launchers/slurm.sbatch.j2")
        );
        let files = destinations(Path::new("conf"));
        assert!(files
            .iter()
            .any(|(t, _)| t == Path::new("launchers/slurm.sbatch.j2")));
    }
}
