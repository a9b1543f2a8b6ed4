//! The config a job was composed from, kept with the job: a copy of the config directory's YAML
//! files taken when the run directory is prepared (`.flotilla/conf/` at the root of the run or
//! sweep directory), and what `flotilla run --from` and `flotilla diff` need to compose a job
//! again from its own files: the copy, the primary config's name, whether it was validated, and
//! the job's overrides, with new overrides laid over them.

use super::{io_err, Meta, RunDirError, META_FILE, OVERRIDES_FILE, SWEEP_FILE};
use flotilla_config::{ComposeOptions, Composer, Fallback};
use std::path::{Path, PathBuf};

/// Where the copy of the config directory lives, relative to the run or sweep directory.
pub use flotilla_contract::layout::SNAPSHOT_DIR;

/// A config directory larger than this is not copied (the job records no snapshot and a
/// warning says why): config directories are small, and a huge one is a mistake.
const MAX_SNAPSHOT_BYTES: u64 = 64 << 20;
/// How deep sub-directories (config groups) are followed.
const MAX_DEPTH: usize = 16;

/// Copies the YAML files of `config_dir` (every `*.yaml`/`*.yml`, sub-directories included,
/// hidden entries skipped, symbolic links followed) to `dest`. Returns `Ok(false)` without
/// copying anything when the files exceed 64 MiB (`MAX_SNAPSHOT_BYTES`).
pub fn copy_config_dir(config_dir: &Path, dest: &Path) -> Result<bool, RunDirError> {
    let mut files = Vec::new();
    collect_yaml(config_dir, Path::new(""), 0, &mut files)?;
    let mut total = 0u64;
    for (source, _) in &files {
        total += std::fs::metadata(source)
            .map_err(|e| io_err(source, e))?
            .len();
    }
    if total > MAX_SNAPSHOT_BYTES {
        tracing::warn!(
            "{}: the config directory's YAML files hold {total} bytes (more than {MAX_SNAPSHOT_BYTES}); no copy is kept with the run, so `run --from` and `diff` will need it unchanged",
            config_dir.display()
        );
        return Ok(false);
    }
    std::fs::create_dir_all(dest).map_err(|e| io_err(dest, e))?;
    for (source, rel) in files {
        let target = dest.join(&rel);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io_err(parent, e))?;
        }
        std::fs::copy(&source, &target).map_err(|e| io_err(&source, e))?;
    }
    Ok(true)
}

fn collect_yaml(
    root: &Path,
    rel: &Path,
    depth: usize,
    out: &mut Vec<(PathBuf, PathBuf)>,
) -> Result<(), RunDirError> {
    let dir = root.join(rel);
    let entries = std::fs::read_dir(&dir).map_err(|e| io_err(&dir, e))?;
    let mut entries: Vec<_> = entries.flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry.file_name();
        let Some(text) = name.to_str() else { continue };
        if text.starts_with('.') {
            continue;
        }
        let path = entry.path();
        let child = rel.join(&name);
        // `metadata` follows symbolic links: a linked group directory is copied as a directory.
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            if depth < MAX_DEPTH {
                collect_yaml(root, &child, depth + 1, out)?;
            }
        } else if meta.is_file() && (text.ends_with(".yaml") || text.ends_with(".yml")) {
            out.push((path, child));
        }
    }
    Ok(())
}

/// The path from a job directory `subdir` levels below the run root to the root's snapshot.
pub fn snapshot_path_from_job(subdir: &Path) -> String {
    let ups = subdir.components().count();
    let mut rel = "../".repeat(ups);
    rel.push_str(SNAPSHOT_DIR);
    rel
}

/// What it takes to compose a job again from its own directory.
#[derive(Clone, Debug)]
pub struct SavedJob {
    pub job_dir: PathBuf,
    pub meta: Meta,
    /// The copy of the config directory (or, for a run prepared without one, the original
    /// directory recorded in `meta.json`).
    pub config_dir: PathBuf,
    /// True when `config_dir` is the copy kept with the run.
    pub from_snapshot: bool,
    pub config_name: String,
    pub validate: bool,
    /// The job's task overrides (`overrides.yaml`), then the runtime overrides it recorded
    /// (`meta.json`).
    pub overrides: Vec<String>,
}

impl SavedJob {
    /// Reads what `job_dir` recorded about its composition. A sweep directory, a directory
    /// that is not a job, or a job without the files are refused, naming the fix.
    pub fn load(job_dir: &Path) -> Result<SavedJob, RunDirError> {
        let invalid = |why: String| RunDirError::NotReplayable {
            path: job_dir.to_path_buf(),
            why,
        };
        if job_dir.join(SWEEP_FILE).is_file() {
            return Err(invalid(
                "a sweep directory; give one of its job directories (e.g. its 0/)".into(),
            ));
        }
        let meta_path = job_dir.join(META_FILE);
        let text = std::fs::read_to_string(&meta_path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => invalid(format!(
                "no {META_FILE}: not a job directory written by `flotilla run`"
            )),
            _ => io_err(&meta_path, e),
        })?;
        let meta: Meta = serde_json::from_str(&text).map_err(|error| RunDirError::Json {
            path: meta_path.clone(),
            error,
        })?;
        let mut overrides = super::read_overrides(job_dir)
            .ok_or_else(|| invalid(format!("{OVERRIDES_FILE} is missing or not a list")))?;
        let snapshot = meta
            .conf_snapshot
            .as_ref()
            .map(|rel| job_dir.join(rel))
            .map(|dir| dir.canonicalize().unwrap_or(dir));
        let (config_dir, from_snapshot) = match (snapshot, &meta.config_dir) {
            (Some(dir), _) if dir.is_dir() => (dir, true),
            (_, Some(original)) if Path::new(original).is_dir() => (PathBuf::from(original), false),
            (snapshot, original) => {
                return Err(invalid(format!(
                    "the config it was composed from is gone ({}); compose it again with `flotilla run --config-dir DIR` and the overrides in {OVERRIDES_FILE}",
                    snapshot
                        .map(|s| s.display().to_string())
                        .or(original.clone())
                        .unwrap_or_else(|| "not recorded".into())
                )))
            }
        };
        overrides.extend(meta.runtime_overrides.iter().cloned());
        Ok(SavedJob {
            job_dir: job_dir.to_path_buf(),
            config_name: meta.config_name.clone().unwrap_or_else(|| "config".into()),
            validate: meta.validate,
            meta,
            config_dir,
            from_snapshot,
            overrides,
        })
    }

    /// A composer over the saved config directory, set up as the original was.
    pub fn composer(&self, fallbacks: Vec<Fallback>) -> Result<Composer, RunDirError> {
        let mut composer = Composer::new(ComposeOptions {
            config_dir: self.config_dir.clone(),
            config_name: self.config_name.clone(),
        })?;
        composer.set_validate(self.validate);
        composer.set_fallbacks(fallbacks);
        Ok(composer)
    }

    /// A file:line origin inside the saved config directory, written as the original command
    /// saw it (`conf/model/tiny.yaml:3` for a run started with `--config-dir conf`); any other
    /// origin (an override) as it is.
    pub fn original_origin(&self, origin: &str) -> String {
        let (file, line) = match origin.rsplit_once(':') {
            Some((file, line)) if line.parse::<u32>().is_ok() => (file, Some(line)),
            _ => (origin, None),
        };
        let root = self.config_dir.canonicalize();
        let inside = Path::new(file).canonicalize().ok().and_then(|f| {
            let root = root.as_ref().ok()?;
            f.strip_prefix(root).ok().map(Path::to_path_buf)
        });
        let Some(rest) = inside else {
            return origin.to_string();
        };
        let shown = match &self.meta.config_dir {
            Some(original) => {
                let original = Path::new(original);
                original
                    .strip_prefix(&self.meta.cwd)
                    .unwrap_or(original)
                    .join(rest)
            }
            None => rest,
        };
        match line {
            Some(line) => format!("{}:{line}", shown.display()),
            None => shown.display().to_string(),
        }
    }
}

/// The key an override sets, without its `+`, `++` or `~` prefix (`model`, `trainer.lr`).
fn override_key(o: &str) -> &str {
    let o = o.trim_start_matches('~').trim_start_matches('+');
    o.split_once('=').map_or(o, |(k, _)| k).trim()
}

/// `saved` with `new` laid over it: a saved override of a key that `new` sets again is dropped,
/// and a new plain assignment to a key the saved overrides had added (`+key=...`) keeps the `+`
/// (the key is not in the primary config, so it must be added again).
pub fn layer_overrides(saved: &[String], new: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(saved.len() + new.len());
    let mut kept: Vec<&String> = Vec::new();
    for s in saved {
        if !new.iter().any(|n| override_key(n) == override_key(s)) {
            kept.push(s);
        }
    }
    out.extend(kept.into_iter().cloned());
    for n in new {
        let plain = !n.starts_with('+') && !n.starts_with('~');
        let was_added = saved
            .iter()
            .any(|s| s.starts_with('+') && override_key(s) == override_key(n));
        if plain && was_added {
            out.push(format!("+{n}"));
        } else {
            out.push(n.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn new_overrides_replace_saved_ones_of_the_same_key() {
        let saved = v(&["trainer.lr=0.001", "model=small", "+extra.tag=a"]);
        let out = layer_overrides(&saved, &v(&["trainer.lr=0.003", "extra.tag=b", "seed=2"]));
        assert_eq!(
            out,
            v(&["model=small", "trainer.lr=0.003", "+extra.tag=b", "seed=2"])
        );
        assert_eq!(layer_overrides(&saved, &[]), saved);
        assert_eq!(
            layer_overrides(&saved, &v(&["~extra.tag"])),
            v(&["trainer.lr=0.001", "model=small", "~extra.tag"])
        );
    }

    #[test]
    fn snapshot_path_climbs_out_of_the_job_dir() {
        assert_eq!(snapshot_path_from_job(Path::new("")), ".flotilla/conf");
        assert_eq!(snapshot_path_from_job(Path::new("3")), "../.flotilla/conf");
        assert_eq!(
            snapshot_path_from_job(Path::new("lr=1/seed=2")),
            "../../.flotilla/conf"
        );
    }

    #[test]
    fn copies_yaml_files_of_groups_and_skips_the_rest() {
        let src = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(src.path().join("model")).unwrap();
        std::fs::create_dir_all(src.path().join(".git")).unwrap();
        std::fs::write(src.path().join("config.yaml"), "a: 1\n").unwrap();
        std::fs::write(src.path().join("model/tiny.yml"), "b: 2\n").unwrap();
        std::fs::write(src.path().join("model/notes.txt"), "x").unwrap();
        std::fs::write(src.path().join(".git/config.yaml"), "x").unwrap();
        let dest = tempfile::tempdir().unwrap();
        let dest = dest.path().join("snap");
        assert!(copy_config_dir(src.path(), &dest).unwrap());
        assert_eq!(
            std::fs::read_to_string(dest.join("config.yaml")).unwrap(),
            "a: 1\n"
        );
        assert_eq!(
            std::fs::read_to_string(dest.join("model/tiny.yml")).unwrap(),
            "b: 2\n"
        );
        assert!(!dest.join("model/notes.txt").exists());
        assert!(!dest.join(".git").exists());
    }
}
