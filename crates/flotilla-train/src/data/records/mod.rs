//! Records of data files as JSON objects, whatever holds them: a `.jsonl` file (one object per
//! line, blank lines skipped), a `.json` array, a Parquet file, an Arrow IPC file (the stream
//! files `datasets.save_to_disk` writes, or the file format), a glob of such files, a directory
//! of shards (the Hub's `data/train-00000-of-00002.parquet` layout, one split chosen by file
//! name), or a `save_to_disk` directory (`state.json` naming its Arrow files; a `DatasetDict`'s
//! `dataset_dict.json` naming a subdirectory per split). [`locate`] turns a config path into
//! [`RecordFiles`].
//!
//! Records arrive as a stream of [`Chunk`]s (a few thousand records each: lines of text, items
//! of a `.json` array, or one Arrow record batch), so a large file is never held whole (a
//! `.json` array excepted: it is one JSON value). A chunk turns its record `k` into a
//! `serde_json::Value` on demand ([`Chunk::record`]; callers do that on every core), with its
//! [`Origin`]: the file and the line, item or row, for error messages. Nested Parquet and Arrow
//! columns (lists of message structs) read as the JSON they were written from
//! (`arrow_json`).
//!
//! Every data kind that reads records (chat, jsonl, text, and the formats they recognise) goes
//! through this module, which knows nothing of what the records mean.

mod arrow_json;
mod locate;
mod readers;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::RecordBatch;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::error::{DataError, Result};

pub use locate::locate;

/// Records read at once by [`RecordFiles::chunks`] (Arrow IPC files keep their writer's batch
/// size).
pub const CHUNK_RECORDS: usize = 4096;

/// How a data file holds its records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileFormat {
    /// One JSON object per line.
    JsonLines,
    /// One JSON array of objects.
    JsonArray,
    Parquet,
    /// Arrow IPC, stream or file format.
    Arrow,
}

impl FileFormat {
    /// The format a file's name says, if it says one.
    pub fn of(path: &Path) -> Option<Self> {
        match path.extension()?.to_str()? {
            "jsonl" | "ndjson" => Some(FileFormat::JsonLines),
            "json" => Some(FileFormat::JsonArray),
            "parquet" => Some(FileFormat::Parquet),
            "arrow" => Some(FileFormat::Arrow),
            _ => None,
        }
    }
}

/// One data file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordFile {
    pub path: PathBuf,
    pub format: FileFormat,
}

/// The files a config path names, in reading order.
#[derive(Clone, Debug)]
pub struct RecordFiles {
    /// The config key that named them (`data.path`, `data.sources[1].path`, ...).
    pub key: String,
    /// The path as the config wrote it.
    pub spec: String,
    pub files: Vec<RecordFile>,
    /// The folder a cache of what is made from these records goes in (as `.flotilla-cache/`):
    /// the one holding the file, the directory or the glob's first match.
    pub cache_parent: PathBuf,
}

/// Where a record is in its file (1-based).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// A line of a `.jsonl` file.
    Line(usize),
    /// An item of a `.json` array.
    Item(usize),
    /// A row of a Parquet or Arrow file.
    Row(usize),
}

impl Place {
    /// The line, item or row number.
    pub fn number(self) -> usize {
        match self {
            Place::Line(n) | Place::Item(n) | Place::Row(n) => n,
        }
    }
}

/// `:LINE`, ` record N` or ` row N`, to follow a file's name.
impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Line(n) => write!(f, ":{n}"),
            Place::Item(n) => write!(f, " record {n}"),
            Place::Row(n) => write!(f, " row {n}"),
        }
    }
}

/// A record's file and place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    pub file: Arc<Path>,
    pub place: Place,
}

impl Origin {
    /// A [`DataError::Record`] at this origin.
    pub fn error(&self, message: impl Into<String>) -> DataError {
        DataError::Record {
            path: self.file.to_path_buf(),
            place: self.place.to_string(),
            message: message.into(),
        }
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.file.display(), self.place)
    }
}

/// Consecutive records of one file.
pub struct Chunk {
    file: Arc<Path>,
    /// The index of the first record among all records of the [`RecordFiles`] (0-based).
    first: usize,
    body: Body,
}

enum Body {
    /// `(line number, line)` of non-blank lines, parsed on demand.
    Lines(Vec<(usize, String)>),
    /// Items of a `.json` array; `first` is the 1-based number of the first.
    Items { first: usize, items: Vec<Value> },
    /// Rows of a Parquet or Arrow file; `first` is the 0-based row of the first.
    Batch { first: usize, batch: RecordBatch },
}

impl Chunk {
    pub fn len(&self) -> usize {
        match &self.body {
            Body::Lines(lines) => lines.len(),
            Body::Items { items, .. } => items.len(),
            Body::Batch { batch, .. } => batch.num_rows(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The file these records are from.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// Record `k`'s index among all records of its [`RecordFiles`].
    pub fn index(&self, k: usize) -> usize {
        self.first + k
    }

    /// Where record `k` is.
    pub fn origin(&self, k: usize) -> Origin {
        let place = match &self.body {
            Body::Lines(lines) => Place::Line(lines[k].0),
            Body::Items { first, .. } => Place::Item(first + k),
            Body::Batch { first, .. } => Place::Row(first + k + 1),
        };
        Origin {
            file: self.file.clone(),
            place,
        }
    }

    /// Record `k` as JSON (a line that is not JSON is an error naming its place).
    pub fn record(&self, k: usize) -> Result<Value> {
        match &self.body {
            Body::Lines(lines) => serde_json::from_str(&lines[k].1)
                .map_err(|e| self.origin(k).error(format!("invalid JSON: {e}"))),
            Body::Items { items, .. } => Ok(items[k].clone()),
            Body::Batch { batch, .. } => Ok(arrow_json::row(batch, k)),
        }
    }

    /// Columns of a Parquet or Arrow chunk that its records leave out (their types hold no
    /// JSON value), as `name (type)`.
    pub fn unreadable_columns(&self) -> Vec<String> {
        match &self.body {
            Body::Batch { batch, .. } => arrow_json::unreadable_columns(batch)
                .into_iter()
                .map(|(name, t)| format!("{name} ({t})"))
                .collect(),
            _ => vec![],
        }
    }
}

impl RecordFiles {
    /// The records in chunks of about [`CHUNK_RECORDS`], file after file.
    pub fn chunks(&self) -> readers::Chunks<'_> {
        readers::Chunks::new(self)
    }

    /// Every record with its origin, one after another (for readers that need no
    /// parallelism).
    pub fn records(&self) -> impl Iterator<Item = Result<(Origin, Value)>> + '_ {
        self.chunks().flat_map(|chunk| {
            let items: Vec<Result<(Origin, Value)>> = match chunk {
                Err(e) => vec![Err(e)],
                Ok(chunk) => (0..chunk.len())
                    .map(|k| Ok((chunk.origin(k), chunk.record(k)?)))
                    .collect(),
            };
            items
        })
    }

    /// How many records the files hold (Parquet from its footer; the others are read
    /// through, without parsing records).
    pub fn count(&self) -> Result<usize> {
        self.files.iter().map(readers::count).sum()
    }

    /// The SHA-256 of the files' contents, read a block at a time: part of a cache key.
    pub fn digest(&self) -> Result<[u8; 32]> {
        use std::io::Read;
        let mut h = Sha256::new();
        let mut block = vec![0u8; 1 << 20];
        for file in &self.files {
            let mut f = std::fs::File::open(&file.path)
                .map_err(|e| DataError::open(&self.key, &file.path, e))?;
            let mut len = 0u64;
            loop {
                let n = f
                    .read(&mut block)
                    .map_err(|e| DataError::io(&file.path, e))?;
                if n == 0 {
                    break;
                }
                len += n as u64;
                h.update(&block[..n]);
            }
            h.update(len.to_le_bytes());
        }
        Ok(h.finalize().into())
    }

    /// How a person names these records: the path, and the number of files when several.
    pub fn describe(&self) -> String {
        match self.files.len() {
            1 => self.files[0].path.display().to_string(),
            n => format!("{} ({n} files)", self.spec),
        }
    }
}
