//! Reading each file format a chunk at a time: lines of `.jsonl`, items of a `.json` array,
//! record batches of Parquet (`parquet`'s Arrow reader) and Arrow IPC (`arrow-ipc`'s stream
//! and file readers). A file that is not what its name says is a [`DataError::File`] naming it
//! and what to do.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek};
use std::path::Path;
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::ArrowError;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::Value;

use super::{Body, Chunk, FileFormat, RecordFile, RecordFiles, CHUNK_RECORDS};
use crate::data::error::{DataError, Result};

/// The chunks of [`RecordFiles`], file after file.
pub struct Chunks<'a> {
    files: &'a RecordFiles,
    /// The next file to open.
    next_file: usize,
    open: Option<(Arc<Path>, Reader)>,
    /// Records given out so far.
    given: usize,
    failed: bool,
}

type Batches = Box<dyn Iterator<Item = std::result::Result<RecordBatch, ArrowError>>>;

enum Reader {
    Lines {
        lines: BufReader<File>,
        line: usize,
    },
    Items {
        items: std::vec::IntoIter<Value>,
        next: usize,
    },
    Batches {
        batches: Batches,
        next_row: usize,
        format: FileFormat,
    },
}

impl<'a> Chunks<'a> {
    pub(super) fn new(files: &'a RecordFiles) -> Self {
        Chunks {
            files,
            next_file: 0,
            open: None,
            given: 0,
            failed: false,
        }
    }

    fn next_chunk(&mut self) -> Result<Option<Chunk>> {
        loop {
            if self.open.is_none() {
                let Some(file) = self.files.files.get(self.next_file) else {
                    return Ok(None);
                };
                self.next_file += 1;
                let reader = open(&self.files.key, file)?;
                self.open = Some((Arc::from(file.path.as_path()), reader));
            }
            let (path, reader) = self.open.as_mut().expect("a file is open");
            let body = read_chunk(path, reader)?;
            match body {
                Some(body) => {
                    let chunk = Chunk {
                        file: path.clone(),
                        first: self.given,
                        body,
                    };
                    self.given += chunk.len();
                    if !chunk.is_empty() {
                        return Ok(Some(chunk));
                    }
                }
                None => self.open = None,
            }
        }
    }
}

impl Iterator for Chunks<'_> {
    type Item = Result<Chunk>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let next = self.next_chunk();
        self.failed = next.is_err();
        next.transpose()
    }
}

fn damaged(path: &Path, what: &str, e: impl std::fmt::Display) -> DataError {
    DataError::File {
        path: path.to_path_buf(),
        message: format!(
            "cannot be read as {what} ({e}); the file is damaged, truncated, or not {what}: \
             download or write it again, or name the right file"
        ),
    }
}

fn open(key: &str, file: &RecordFile) -> Result<Reader> {
    let path = &file.path;
    let handle = File::open(path).map_err(|e| DataError::open(key, path, e))?;
    Ok(match file.format {
        FileFormat::JsonLines => Reader::Lines {
            lines: BufReader::with_capacity(1 << 20, handle),
            line: 0,
        },
        FileFormat::JsonArray => {
            let value: Value =
                serde_json::from_reader(BufReader::new(handle)).map_err(|e| DataError::Record {
                    path: path.clone(),
                    place: format!(":{}", e.line()),
                    message: format!("invalid JSON: {e}"),
                })?;
            let Value::Array(items) = value else {
                return Err(DataError::File {
                    path: path.clone(),
                    message: "a .json data file must hold an array of records (use .jsonl for \
                              one record per line)"
                        .into(),
                });
            };
            Reader::Items {
                items: items.into_iter(),
                next: 1,
            }
        }
        FileFormat::Parquet => {
            let batches = ParquetRecordBatchReaderBuilder::try_new(handle)
                .and_then(|b| b.with_batch_size(CHUNK_RECORDS).build())
                .map_err(|e| damaged(path, "Parquet", e))?;
            Reader::Batches {
                batches: Box::new(batches),
                next_row: 0,
                format: FileFormat::Parquet,
            }
        }
        FileFormat::Arrow => Reader::Batches {
            batches: arrow_batches(path, handle)?,
            next_row: 0,
            format: FileFormat::Arrow,
        },
    })
}

/// The record batches of an Arrow IPC file: the file format (`ARROW1` magic) or the stream
/// format `datasets` writes.
fn arrow_batches(path: &Path, mut handle: File) -> Result<Batches> {
    let mut magic = [0u8; 6];
    let is_file_format = handle.read_exact(&mut magic).is_ok() && &magic == b"ARROW1";
    handle.rewind().map_err(|e| DataError::io(path, e))?;
    let bad = |e: ArrowError| damaged(path, "Arrow IPC", e);
    Ok(if is_file_format {
        Box::new(arrow_ipc::reader::FileReader::try_new(handle, None).map_err(bad)?)
    } else {
        let reader = BufReader::with_capacity(1 << 20, handle);
        Box::new(arrow_ipc::reader::StreamReader::try_new(reader, None).map_err(bad)?)
    })
}

/// The next chunk of an open file, `None` at its end.
fn read_chunk(path: &Path, reader: &mut Reader) -> Result<Option<Body>> {
    match reader {
        Reader::Lines { lines, line } => {
            let mut out = Vec::with_capacity(CHUNK_RECORDS);
            let mut text = String::new();
            while out.len() < CHUNK_RECORDS {
                text.clear();
                let n = lines.read_line(&mut text).map_err(|e| match e.kind() {
                    std::io::ErrorKind::InvalidData => DataError::Record {
                        path: path.to_path_buf(),
                        place: format!(":{}", *line + 1),
                        message: "not valid UTF-8".into(),
                    },
                    _ => DataError::io(path, e),
                })?;
                if n == 0 {
                    break;
                }
                *line += 1;
                if !text.trim().is_empty() {
                    out.push((*line, text.trim_end_matches(['\n', '\r']).to_owned()));
                }
            }
            Ok((!out.is_empty()).then_some(Body::Lines(out)))
        }
        Reader::Items { items, next } => {
            let out: Vec<Value> = items.by_ref().take(CHUNK_RECORDS).collect();
            let first = *next;
            *next += out.len();
            Ok((!out.is_empty()).then_some(Body::Items { first, items: out }))
        }
        Reader::Batches {
            batches,
            next_row,
            format,
        } => match batches.next() {
            None => Ok(None),
            Some(Err(e)) => Err(damaged(
                path,
                if *format == FileFormat::Parquet {
                    "Parquet"
                } else {
                    "Arrow IPC"
                },
                e,
            )),
            Some(Ok(batch)) => {
                let first = *next_row;
                *next_row += batch.num_rows();
                Ok(Some(Body::Batch { first, batch }))
            }
        },
    }
}

/// How many records `file` holds.
pub(super) fn count(file: &RecordFile) -> Result<usize> {
    let path = &file.path;
    match file.format {
        FileFormat::Parquet => {
            let handle = File::open(path).map_err(|e| DataError::io(path, e))?;
            let builder = ParquetRecordBatchReaderBuilder::try_new(handle)
                .map_err(|e| damaged(path, "Parquet", e))?;
            Ok(builder.metadata().file_metadata().num_rows() as usize)
        }
        FileFormat::JsonLines => {
            let handle = File::open(path).map_err(|e| DataError::io(path, e))?;
            let mut reader = BufReader::with_capacity(1 << 20, handle);
            let (mut n, mut line) = (0, Vec::new());
            loop {
                line.clear();
                if reader
                    .read_until(b'\n', &mut line)
                    .map_err(|e| DataError::io(path, e))?
                    == 0
                {
                    return Ok(n);
                }
                n += !line.iter().all(u8::is_ascii_whitespace) as usize;
            }
        }
        FileFormat::JsonArray | FileFormat::Arrow => {
            let mut reader = open("data.path", file)?;
            let mut n = 0;
            while let Some(body) = read_chunk(path, &mut reader)? {
                n += match body {
                    Body::Lines(l) => l.len(),
                    Body::Items { items, .. } => items.len(),
                    Body::Batch { batch, .. } => batch.num_rows(),
                };
            }
            Ok(n)
        }
    }
}
