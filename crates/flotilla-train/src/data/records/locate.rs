//! From a config path to the data files it names: a file, a glob, a directory of shards (one
//! split chosen by file name), or a `datasets.save_to_disk` directory.
//!
//! - A file is read as its extension says: `.parquet`, `.arrow`, `.json` (an array), and
//!   anything else as `.jsonl`.
//! - A glob (`*`, `?`, `[`) takes its matching files in alphabetical order.
//! - A directory with `state.json` is a saved `Dataset`: its `_data_files`, in order. One with
//!   `dataset_dict.json` is a saved `DatasetDict`: the subdirectory of the split.
//! - Any other directory is searched (hidden folders skipped) for `.parquet` files, else
//!   `.arrow`, else `.jsonl`/`.json`. A file belongs to a split when a folder on its way or its
//!   name (all before the shard numbers of `{split}-00000-of-00002.parquet`, else before the
//!   first `-`, `_` or `.`) is the split's name, as the Hub lays out
//!   `data/train-00000-of-00002.parquet` or `train/0000.parquet`. When files name splits, the
//!   split asked for (`train` unless set) must be one of them; when none does, every file is
//!   read.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{FileFormat, RecordFile, RecordFiles};
use crate::data::error::{DataError, Result};

/// The split a directory is read for when the config names none.
pub const DEFAULT_SPLIT: &str = "train";

/// Names the Hub treats as splits (besides the one asked for).
const SPLIT_NAMES: &[&str] = &["train", "test", "validation", "valid", "dev", "eval"];

fn is_glob(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// The data files `spec` names (`key`: its config key; `split`: the split of a directory).
pub fn locate(key: &str, spec: &str, split: Option<&str>) -> Result<RecordFiles> {
    let path = Path::new(spec);
    let files = if is_glob(spec) {
        glob_files(key, spec)?
    } else if path.is_dir() {
        directory_files(key, path, split)?
    } else if path.is_file() {
        vec![file_of(path.to_path_buf())]
    } else {
        return Err(DataError::NotFound {
            key: key.into(),
            path: path.to_path_buf(),
        });
    };
    let first = &files[0].path;
    let cache_parent = if path.is_dir() {
        path.to_path_buf()
    } else {
        first
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf()
    };
    Ok(RecordFiles {
        key: key.into(),
        spec: spec.into(),
        files,
        cache_parent,
    })
}

fn file_of(path: PathBuf) -> RecordFile {
    let format = FileFormat::of(&path).unwrap_or(FileFormat::JsonLines);
    RecordFile { path, format }
}

fn glob_files(key: &str, pattern: &str) -> Result<Vec<RecordFile>> {
    let bad = |message: String| DataError::BadGlob {
        key: key.into(),
        pattern: pattern.into(),
        message,
    };
    let mut files = vec![];
    for p in glob::glob(pattern).map_err(|e| bad(e.to_string()))? {
        let p = p.map_err(|e| bad(e.to_string()))?;
        if p.is_file() {
            files.push(file_of(p));
        }
    }
    if files.is_empty() {
        return Err(DataError::GlobNoMatch {
            key: key.into(),
            pattern: pattern.into(),
        });
    }
    Ok(files)
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| DataError::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| DataError::File {
        path: path.to_path_buf(),
        message: format!("invalid JSON ({e}); the dataset directory is damaged: save it again"),
    })
}

fn directory_files(key: &str, dir: &Path, split: Option<&str>) -> Result<Vec<RecordFile>> {
    let state = dir.join("state.json");
    if state.is_file() {
        return saved_dataset(&state, dir);
    }
    let dict = dir.join("dataset_dict.json");
    if dict.is_file() {
        let splits: Vec<String> = read_json(&dict)?
            .get("splits")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        let want = split.unwrap_or(DEFAULT_SPLIT);
        if !splits.iter().any(|s| s == want) {
            return Err(no_split(key, dir, want, &splits));
        }
        return directory_files(key, &dir.join(want), None);
    }
    let mut found = vec![];
    walk(dir, &mut found).map_err(|e| DataError::io(dir, e))?;
    found.sort();
    let by_format = |formats: &[FileFormat]| -> Vec<RecordFile> {
        found
            .iter()
            .filter(|p| FileFormat::of(p).is_some_and(|f| formats.contains(&f)))
            .map(|p| file_of(p.clone()))
            .collect()
    };
    let mut files = by_format(&[FileFormat::Parquet]);
    if files.is_empty() {
        files = by_format(&[FileFormat::Arrow]);
    }
    if files.is_empty() {
        files = by_format(&[FileFormat::JsonLines, FileFormat::JsonArray]);
    }
    if files.is_empty() {
        return Err(DataError::config(
            key,
            format!(
                "{} holds no .parquet, .arrow, .jsonl or .json file (nor a datasets \
                 save_to_disk directory); name a data file or a directory of them",
                dir.display()
            ),
        ));
    }
    let want = split.unwrap_or(DEFAULT_SPLIT);
    let named: Vec<String> = {
        let mut names: Vec<String> = vec![];
        for f in &files {
            for name in split_names(dir, &f.path) {
                if (SPLIT_NAMES.contains(&name.as_str()) || name == want) && !names.contains(&name)
                {
                    names.push(name);
                }
            }
        }
        names
    };
    if named.is_empty() {
        if split.is_some_and(|s| s != DEFAULT_SPLIT) {
            return Err(no_split(key, dir, want, &[]));
        }
        return Ok(files);
    }
    let chosen: Vec<RecordFile> = files
        .into_iter()
        .filter(|f| split_names(dir, &f.path).iter().any(|n| n == want))
        .collect();
    if chosen.is_empty() {
        return Err(no_split(key, dir, want, &named));
    }
    Ok(chosen)
}

fn no_split(key: &str, dir: &Path, want: &str, splits: &[String]) -> DataError {
    let message = if splits.is_empty() {
        format!(
            "{} names no splits, so it has no split '{want}'; leave the split unset to read \
             every file",
            dir.display()
        )
    } else {
        format!(
            "{} has no split '{want}'; its splits are [{}]: choose one with the split key \
             (e.g. data.split={})",
            dir.display(),
            splits.join(", "),
            splits[0]
        )
    };
    DataError::config(key, message)
}

/// The names a file's path could give its split: each folder between `dir` and it, and its
/// file name up to the first `-`, `_` or `.`.
fn split_names(dir: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(dir).unwrap_or(file);
    let mut names: Vec<String> = rel
        .parent()
        .into_iter()
        .flat_map(|p| p.components())
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if let Some(name) = rel.file_name().and_then(|n| n.to_str()) {
        names.push(match hub_shard_split(name) {
            Some(split) => split.to_string(),
            None => name
                .split(['-', '_', '.'])
                .next()
                .unwrap_or(name)
                .to_string(),
        });
    }
    names
}

/// The split of a file named as the Hub names shards, `{split}-00000-of-00002.parquet`: all
/// that comes before the shard numbers, underscores included (`train_prefs`, `test_sft`).
fn hub_shard_split(name: &str) -> Option<&str> {
    let stem = name.split('.').next()?;
    let (head, total) = stem.rsplit_once("-of-")?;
    let (split, shard) = head.rsplit_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits(shard) && digits(total) && !split.is_empty()).then_some(split)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let hidden = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with('.'));
        if hidden {
            continue;
        }
        if path.is_dir() {
            walk(&path, out)?;
        } else {
            out.push(path);
        }
    }
    Ok(())
}

/// The Arrow files of a `save_to_disk` directory, as its `state.json` lists them.
fn saved_dataset(state: &Path, dir: &Path) -> Result<Vec<RecordFile>> {
    let files: Vec<RecordFile> = read_json(state)?
        .get("_data_files")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.get("filename").and_then(Value::as_str))
                .map(|name| RecordFile {
                    path: dir.join(name),
                    format: FileFormat::Arrow,
                })
                .collect()
        })
        .unwrap_or_default();
    if files.is_empty() {
        return Err(DataError::File {
            path: state.to_path_buf(),
            message: "lists no _data_files; the dataset directory is damaged: save it again".into(),
        });
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hub_shard_names_its_whole_split() {
        assert_eq!(
            hub_shard_split("train_prefs-00000-of-00001.parquet"),
            Some("train_prefs")
        );
        assert_eq!(
            hub_shard_split("train-00003-of-00010.parquet"),
            Some("train")
        );
        assert_eq!(hub_shard_split("train.parquet"), None);
        assert_eq!(hub_shard_split("train_0.jsonl"), None);
    }

    #[test]
    fn hub_shards_are_chosen_by_split() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        for name in [
            "train-00001-of-00002.parquet",
            "train-00000-of-00002.parquet",
            "test-00000-of-00001.parquet",
        ] {
            std::fs::write(data.join(name), b"").unwrap();
        }
        std::fs::write(dir.path().join("README.md"), b"").unwrap();
        let spec = dir.path().to_str().unwrap();
        let train = locate("data.path", spec, None).unwrap();
        let names: Vec<_> = train
            .files
            .iter()
            .map(|f| f.path.file_name().unwrap().to_str().unwrap().to_string())
            .collect();
        assert_eq!(
            names,
            [
                "train-00000-of-00002.parquet",
                "train-00001-of-00002.parquet"
            ]
        );
        assert!(train.files.iter().all(|f| f.format == FileFormat::Parquet));
        let test = locate("data.path", spec, Some("test")).unwrap();
        assert_eq!(test.files.len(), 1);
        let err = locate("data.path", spec, Some("validation"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no split 'validation'") && err.contains("[test, train]"),
            "{err}"
        );
    }

    #[test]
    fn a_directory_without_split_names_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["0000.parquet", "0001.parquet"] {
            std::fs::write(dir.path().join(name), b"").unwrap();
        }
        let spec = dir.path().to_str().unwrap();
        assert_eq!(locate("data.path", spec, None).unwrap().files.len(), 2);
        assert!(locate("data.path", spec, Some("test")).is_err());
    }
}
