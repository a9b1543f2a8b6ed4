//! What a checkpoint holds, recorded when it is committed, and the check that proves it whole
//! before a resume reads it. `manifest.json` lists every file of the checkpoint with its size;
//! [`verify`] finds each file, compares its size, proves each safetensors file whole from its
//! header (every tensor's bytes inside the file) and parses each JSON file. A file that is
//! missing, short, long or unreadable (a node that crashed while a network file system had not
//! flushed it, a disk error) makes the checkpoint damaged, and `resume: auto` takes the newest
//! intact one instead ([`super::newest_intact`]).
//!
//! A checkpoint written before manifests existed is checked the same way on the files it has.
//! Bytes changed in place without changing the length (bit rot) are not detected: that would
//! need every byte of every shard read back at each checkpoint.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::STATE_FILE;
use crate::error::TrainError;
use crate::safetensors_io::{SafetensorsError, SafetensorsFile};

/// The manifest's file name in a checkpoint directory.
pub const MANIFEST_FILE: &str = "manifest.json";
const MANIFEST_FORMAT: &str = "flotilla-checkpoint-manifest-v1";

/// The contents of `manifest.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    /// Every file of the checkpoint but the manifest and `trainer_state.json` (written after
    /// it, and parsed by the check), by name.
    pub files: Vec<ManifestEntry>,
}

/// One file of a checkpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ManifestEntry {
    pub name: String,
    pub bytes: u64,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
    move |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes the manifest of the files in `dir` (a checkpoint being committed, every file
/// written and closed by every rank).
pub fn record(dir: &Path) -> Result<(), TrainError> {
    let mut files = vec![];
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == MANIFEST_FILE || name == STATE_FILE {
            continue;
        }
        let bytes = entry.metadata().map_err(io(&entry.path()))?.len();
        files.push(ManifestEntry { name, bytes });
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    let manifest = Manifest {
        format: MANIFEST_FORMAT.to_string(),
        files,
    };
    let path = dir.join(MANIFEST_FILE);
    let json = serde_json::to_string_pretty(&manifest).expect("a manifest serialises");
    std::fs::write(&path, json).map_err(io(&path))
}

/// Why a checkpoint cannot be resumed from: its first damaged file and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    pub file: String,
    pub reason: String,
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.file, self.reason)
    }
}

/// Checks that checkpoint `dir` is whole: its manifest's files all there with their sizes (or,
/// without a manifest, the files it has), each safetensors file's tensors inside the file, each
/// JSON file parseable, `trainer_state.json` among them.
pub fn verify(dir: &Path) -> Result<(), Damage> {
    let damage = |file: &str, reason: String| Damage {
        file: file.to_string(),
        reason,
    };
    let manifest_path = dir.join(MANIFEST_FILE);
    let names: Vec<(String, Option<u64>)> = if manifest_path.exists() {
        let text = std::fs::read_to_string(&manifest_path)
            .map_err(|e| damage(MANIFEST_FILE, format!("unreadable ({e})")))?;
        let manifest: Manifest = serde_json::from_str(&text)
            .map_err(|e| damage(MANIFEST_FILE, format!("not a manifest ({e})")))?;
        manifest
            .files
            .into_iter()
            .map(|e| (e.name, Some(e.bytes)))
            .collect()
    } else {
        let entries =
            std::fs::read_dir(dir).map_err(|e| damage(".", format!("unreadable ({e})")))?;
        let mut names = vec![];
        for entry in entries {
            let entry = entry.map_err(|e| damage(".", format!("unreadable ({e})")))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name != STATE_FILE {
                names.push((name, None));
            }
        }
        names.sort();
        names
    };
    for (name, bytes) in names.iter().chain([&(STATE_FILE.to_string(), None)]) {
        let path = dir.join(name);
        let len = match std::fs::metadata(&path) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(damage(name, "missing".into()))
            }
            Err(e) => return Err(damage(name, format!("unreadable ({e})"))),
        };
        if let Some(want) = bytes {
            if len != *want {
                return Err(damage(
                    name,
                    format!("{len} bytes where {want} were written"),
                ));
            }
        }
        if name.ends_with(".safetensors") {
            SafetensorsFile::open(&path).map_err(|e| {
                let reason = match e {
                    SafetensorsError::Format { reason, .. } => format!("not whole: {reason}"),
                    SafetensorsError::Io { source, .. } => format!("unreadable ({source})"),
                    other => other.to_string(),
                };
                damage(name, reason)
            })?;
        } else if name.ends_with(".json") {
            let text =
                std::fs::read(&path).map_err(|e| damage(name, format!("unreadable ({e})")))?;
            serde_json::from_slice::<serde_json::Value>(&text)
                .map_err(|e| damage(name, format!("not JSON ({e})")))?;
        }
    }
    Ok(())
}
