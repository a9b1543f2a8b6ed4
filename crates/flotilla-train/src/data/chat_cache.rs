//! The cache of prepared chat data: `.flotilla-cache/chat-<key>.bin` beside the data file,
//! written as the samples are made and read back one sample at a time, so that prepared data
//! of any size costs only its index in memory.
//!
//! The key is the SHA-256 of everything the samples depend on: the data files' bytes (and which
//! records a mixture or a held-out set takes), the
//! tokenizer directory's `tokenizer.json` and its companions, the template's source, the
//! settings (and today's date when the template calls `strftime_now`), and a format version.
//!
//! A file is the magic line, the samples' token bytes as [`SequenceWriter`] writes them, then
//! the index (sequence bounds, lines, conversation starts: `u64` each), a JSON header (the
//! key, the counts, the sizes), the header's length (`u64`) and the magic line again. The
//! token bytes are streamed to a temporary name as conversations are encoded; the index and
//! header follow once all are, and the file is renamed into place, so readers never see half
//! a file, and a failure on the way (a full disk) removes the temporary file. Anything that
//! does not match on reading is ignored (and rebuilt).
//!
//! Ranks that share the data folder prepare an entry once: whoever first takes the entry's lock
//! (`chat-<key>.lock`, an exclusive `flock`) prepares and stores it while the others wait, then
//! read what it stored. The lock goes with its holder, so a rank that dies never blocks the rest.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::chat::{ChatStats, ChatTokenizer};
use super::masked::{MaskedSequences, SequenceIndex, SequenceWriter, BYTES_PER_TOKEN};
use super::positional_read::read_exact_at;

/// The format and the renderer's version: part of every key, so a cache written by an earlier
/// renderer (3: messages reach the template as transformers passes them, values print as
/// Python prints them; 4: templates that are not prefix-stable are masked by markers, not
/// refused; 5: records of every format, with each source's counts; 6: the samples first,
/// sequence by sequence, the index and header after them) is never served.
const MAGIC: &[u8] = b"FLOTILLA-CHAT-CACHE 6\n";
/// Bytes buffered between the samples being made and the file.
const WRITE_BUFFER: usize = 1 << 20;
/// Index entries read at once.
const INDEX_BLOCK: usize = 1 << 16;
/// The folder beside the data file that holds the cache.
pub const CACHE_DIR: &str = ".flotilla-cache";

#[derive(Serialize, Deserialize)]
struct Header {
    key: String,
    stats: ChatStats,
    name: String,
    seq_len: usize,
    pad_id: u32,
    sequences: usize,
    /// Conversations (entries of [`SequenceIndex`]'s starts).
    conversations: usize,
    tokens: usize,
}

impl Header {
    /// Where the index begins in the file.
    fn index_offset(&self) -> Option<u64> {
        (self.tokens as u64)
            .checked_mul(BYTES_PER_TOKEN)?
            .checked_add(MAGIC.len() as u64)
    }

    /// Bytes of the index in the file.
    fn index_len(&self) -> Option<u64> {
        let entries = self
            .sequences
            .checked_mul(2)?
            .checked_add(1)?
            .checked_add(self.conversations)?;
        (entries as u64).checked_mul(8)
    }
}

/// One data file's cache entry.
pub(crate) struct CacheEntry {
    key: String,
    file: PathBuf,
}

impl CacheEntry {
    /// The entry in `parent`'s cache folder for records whose contents (and picks) hash to
    /// `data_digest`.
    pub(crate) fn new(
        parent: &Path,
        data_digest: &[u8],
        chat: &ChatTokenizer,
        settings: &impl Serialize,
    ) -> Self {
        let mut h = Sha256::new();
        let mut part = |label: &str, b: &[u8]| {
            h.update(label.as_bytes());
            h.update((b.len() as u64).to_le_bytes());
            h.update(b);
        };
        part("version", MAGIC);
        part("data", data_digest);
        for name in [
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
        ] {
            part(
                name,
                &std::fs::read(chat.dir.join(name)).unwrap_or_default(),
            );
        }
        let source = chat.template.source();
        part("template", source.as_bytes());
        part(
            "settings",
            serde_json::to_string(settings)
                .unwrap_or_default()
                .as_bytes(),
        );
        if source.contains("strftime_now") {
            part(
                "date",
                chrono::Local::now().format("%F").to_string().as_bytes(),
            );
        }
        let key: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        let dir = parent.join(CACHE_DIR);
        let file = dir.join(format!("chat-{}.bin", &key[..32]));
        CacheEntry { key, file }
    }

    /// The entry's file.
    pub(crate) fn path(&self) -> &Path {
        &self.file
    }

    /// Waits for this entry's lock and holds it until the returned file is dropped; `None` when
    /// the lock cannot be taken (an unwritable folder, a file system without locks), which only
    /// costs the waiting: each process then prepares for itself.
    pub(crate) fn lock(&self) -> Option<File> {
        let dir = self.file.parent()?;
        std::fs::create_dir_all(dir).ok()?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.file.with_extension("lock"))
            .ok()?;
        match file.try_lock() {
            Ok(()) => return Some(file),
            Err(std::fs::TryLockError::WouldBlock) => {}
            Err(std::fs::TryLockError::Error(_)) => return None,
        }
        tracing::info!(
            "waiting for another process that prepares {}",
            self.file.display()
        );
        file.lock().ok()?;
        Some(file)
    }

    /// The cached samples (their index read, their tokens left in the file) and their counts,
    /// when a complete entry with this key is there.
    pub(crate) fn load(&self) -> Option<(MaskedSequences, ChatStats)> {
        let file = File::open(&self.file).ok()?;
        let size = file.metadata().ok()?.len();
        let footer = 8 + MAGIC.len() as u64;
        let read = |offset: u64, len: u64| -> Option<Vec<u8>> {
            let mut buf = vec![0u8; usize::try_from(len).ok()?];
            read_exact_at(&file, &mut buf, offset).ok()?;
            Some(buf)
        };
        if size < MAGIC.len() as u64 + footer || read(0, MAGIC.len() as u64)? != MAGIC {
            return None;
        }
        let tail = read(size - footer, footer)?;
        if &tail[8..] != MAGIC {
            return None;
        }
        let header_len = u64::from_le_bytes(tail[..8].try_into().ok()?);
        let header_start = (size - footer).checked_sub(header_len)?;
        let header: Header = serde_json::from_slice(&read(header_start, header_len)?).ok()?;
        let index_start = header.index_offset()?;
        if header.key != self.key || index_start.checked_add(header.index_len()?)? != header_start {
            return None;
        }
        let mut at = index_start;
        let mut entries = |n: usize| -> Option<Vec<usize>> {
            let mut out = Vec::with_capacity(n);
            while out.len() < n {
                let k = (n - out.len()).min(INDEX_BLOCK);
                let bytes = read(at, k as u64 * 8)?;
                at += k as u64 * 8;
                for c in bytes.chunks_exact(8) {
                    out.push(usize::try_from(u64::from_le_bytes(c.try_into().ok()?)).ok()?);
                }
            }
            Some(out)
        };
        let index = SequenceIndex {
            bounds: entries(header.sequences + 1)?,
            lines: entries(header.sequences)?,
            starts: entries(header.conversations)?,
        };
        if !index.is_consistent() || index.num_tokens() != header.tokens {
            return None;
        }
        let data = MaskedSequences::in_file(
            &header.name,
            header.seq_len,
            header.pad_id,
            index,
            file,
            &self.file,
            MAGIC.len() as u64,
        );
        Some((data, header.stats))
    }

    /// Starts writing the entry under a temporary name in the cache folder.
    pub(crate) fn create(&self) -> std::io::Result<PendingEntry> {
        let dir = self.file.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        let tmp = self
            .file
            .with_extension(format!("tmp-{}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        let mut pending = PendingEntry {
            key: self.key.clone(),
            file: self.file.clone(),
            tmp,
            writer: None,
            committed: false,
        };
        let mut out = BufWriter::with_capacity(WRITE_BUFFER, file);
        out.write_all(MAGIC)?;
        pending.writer = Some(SequenceWriter::new(out));
        Ok(pending)
    }
}

/// A cache entry being written: its samples go to the temporary file as they are made; it is
/// renamed into place by [`PendingEntry::commit`], and removed if it is dropped before.
pub(crate) struct PendingEntry {
    key: String,
    file: PathBuf,
    tmp: PathBuf,
    /// `None` once committed.
    writer: Option<SequenceWriter<BufWriter<File>>>,
    /// Renamed into place.
    committed: bool,
}

impl PendingEntry {
    /// Where the samples go.
    pub(crate) fn writer(&mut self) -> &mut SequenceWriter<BufWriter<File>> {
        self.writer
            .as_mut()
            .expect("a pending entry has its writer until it is committed")
    }

    /// The entry's file once complete (for messages).
    pub(crate) fn path(&self) -> &Path {
        &self.file
    }

    /// Completes the entry (the index and the header after the samples), renames it into
    /// place and opens its samples for reading.
    pub(crate) fn commit(
        mut self,
        name: &str,
        seq_len: usize,
        pad_id: u32,
        stats: &ChatStats,
    ) -> std::io::Result<MaskedSequences> {
        let writer = self
            .writer
            .take()
            .expect("a pending entry is committed once");
        let (mut out, index) = writer.into_parts();
        let header = serde_json::to_vec(&Header {
            key: self.key.clone(),
            stats: stats.clone(),
            name: name.to_string(),
            seq_len,
            pad_id,
            sequences: index.len(),
            conversations: index.starts.len(),
            tokens: index.num_tokens(),
        })?;
        for v in index.bounds.iter().chain(&index.lines).chain(&index.starts) {
            out.write_all(&(*v as u64).to_le_bytes())?;
        }
        out.write_all(&header)?;
        out.write_all(&(header.len() as u64).to_le_bytes())?;
        out.write_all(MAGIC)?;
        let file = out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        std::fs::rename(&self.tmp, &self.file)?;
        self.committed = true;
        Ok(MaskedSequences::in_file(
            name,
            seq_len,
            pad_id,
            index,
            file,
            &self.file,
            MAGIC.len() as u64,
        ))
    }
}

impl Drop for PendingEntry {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}
