//! Where chat samples go as they are prepared: the cache entry (a temporary file renamed into
//! place when complete), or, when the cache folder cannot be written or no cache is asked
//! for, an unnamed temporary file; memory only when neither can be made. The samples are then
//! read back from there one at a time, so preparing a large dataset holds only its index.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use super::chat::ChatStats;
use super::chat_cache::{CacheEntry, PendingEntry};
use super::error::{DataError, Result};
use super::masked::{MaskedSequences, SequenceIndex, SequenceWriter};

/// Bytes buffered between the samples being made and a temporary file.
const WRITE_BUFFER: usize = 1 << 20;

/// The destination of samples being prepared.
pub(crate) enum SampleSink {
    /// The cache entry being written.
    Cache(PendingEntry),
    /// An unnamed temporary file (deleted when closed).
    Scratch(SequenceWriter<BufWriter<File>>),
    /// Memory.
    Held(SequenceWriter<Vec<u8>>),
}

impl SampleSink {
    /// The cache entry when there is one and its folder can be written, else a temporary
    /// file, else memory.
    pub(crate) fn open(cache: Option<&CacheEntry>) -> Self {
        if let Some(entry) = cache {
            match entry.create() {
                Ok(pending) => return SampleSink::Cache(pending),
                Err(e) => tracing::warn!(
                    "the prepared conversations are not cached in {} ({e}); they are kept in a \
                     temporary file instead",
                    entry.path().display()
                ),
            }
        }
        match tempfile::tempfile() {
            Ok(file) => SampleSink::Scratch(SequenceWriter::new(BufWriter::with_capacity(
                WRITE_BUFFER,
                file,
            ))),
            Err(e) => {
                tracing::warn!(
                    "no temporary file can be made in {} ({e}); the prepared conversations are \
                     held in memory",
                    std::env::temp_dir().display()
                );
                SampleSink::Held(SequenceWriter::new(vec![]))
            }
        }
    }

    /// The file the samples are written to, for messages.
    fn describe(&self) -> PathBuf {
        match self {
            SampleSink::Cache(pending) => pending.path().to_path_buf(),
            SampleSink::Scratch(_) | SampleSink::Held(_) => {
                std::env::temp_dir().join("(an unnamed temporary file)")
            }
        }
    }

    fn written(&self, e: std::io::Error) -> DataError {
        DataError::SamplesNotWritten {
            path: self.describe(),
            source: e,
        }
    }

    /// Appends one sequence holding conversations that start at the offsets `starts`.
    pub(crate) fn push_packed(
        &mut self,
        ids: &[u32],
        trained: &[bool],
        starts: &[usize],
        line: usize,
    ) -> Result<()> {
        let result = match self {
            SampleSink::Cache(pending) => pending.writer().push_packed(ids, trained, starts, line),
            SampleSink::Scratch(w) => w.push_packed(ids, trained, starts, line),
            SampleSink::Held(w) => w.push_packed(ids, trained, starts, line),
        };
        result.map_err(|e| self.written(e))
    }

    /// The sequences written so far.
    pub(crate) fn index(&mut self) -> &SequenceIndex {
        match self {
            SampleSink::Cache(pending) => pending.writer().index(),
            SampleSink::Scratch(w) => w.index(),
            SampleSink::Held(w) => w.index(),
        }
    }

    /// Trained tokens in the sequences written so far.
    pub(crate) fn trained_tokens(&mut self) -> usize {
        match self {
            SampleSink::Cache(pending) => pending.writer().trained_tokens(),
            SampleSink::Scratch(w) => w.trained_tokens(),
            SampleSink::Held(w) => w.trained_tokens(),
        }
    }

    /// The samples written, opened for reading (the cache entry completed and renamed into
    /// place, with `stats` in its header).
    pub(crate) fn finish(
        self,
        name: &str,
        seq_len: usize,
        pad_id: u32,
        stats: &ChatStats,
    ) -> Result<MaskedSequences> {
        let path = self.describe();
        let failed = |e: std::io::Error| DataError::SamplesNotWritten {
            path: path.clone(),
            source: e,
        };
        match self {
            SampleSink::Cache(pending) => {
                pending.commit(name, seq_len, pad_id, stats).map_err(failed)
            }
            SampleSink::Scratch(w) => {
                let (out, index) = w.into_parts();
                let file = out.into_inner().map_err(|e| failed(e.into_error()))?;
                Ok(MaskedSequences::in_file(
                    name,
                    seq_len,
                    pad_id,
                    index,
                    file,
                    Path::new(&path),
                    0,
                ))
            }
            SampleSink::Held(w) => {
                let (bytes, index) = w.into_parts();
                Ok(MaskedSequences::held(name, seq_len, pad_id, index, bytes))
            }
        }
    }
}
