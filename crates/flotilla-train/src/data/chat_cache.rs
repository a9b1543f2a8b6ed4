//! The cache of prepared chat data: `.flotilla-cache/chat-<key>.bin` beside the data file.
//!
//! The key is the SHA-256 of everything the samples depend on: the data files' bytes (and which
//! records a mixture or a held-out set takes), the
//! tokenizer directory's `tokenizer.json` and its companions, the template's source, the
//! settings (and today's date when the template calls `strftime_now`), and a format version.
//! A file is a magic line, a JSON header (the key, the counts, the sizes) and the flat arrays
//! of [`MaskedSequences`] (bounds, lines, conversation starts, ids, mask); it is written to a
//! temporary name and renamed, so readers never see half a file, and anything that does not
//! match on reading is ignored (and rebuilt).
//!
//! Ranks that share the data folder prepare an entry once: whoever first takes the entry's lock
//! (`chat-<key>.lock`, an exclusive `flock`) prepares and stores it while the others wait, then
//! read what it stored. The lock goes with its holder, so a rank that dies never blocks the rest.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::chat::{ChatStats, ChatTokenizer};
use super::masked::MaskedSequences;

/// The format and the renderer's version: part of every key, so a cache written by an earlier
/// renderer (3: messages reach the template as transformers passes them, values print as
/// Python prints them; 4: templates that are not prefix-stable are masked by markers, not
/// refused; 5: records of every format, with each source's counts) is never served.
const MAGIC: &[u8] = b"FLOTILLA-CHAT-CACHE 5\n";
/// Tokens read or written at once.
const BLOCK: usize = 1 << 20;
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
    /// Conversations (entries of `MaskedSequences::starts`).
    conversations: usize,
    tokens: usize,
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

    /// Waits for this entry's lock and holds it until the returned file is dropped; `None` when
    /// the lock cannot be taken (an unwritable folder, a file system without locks), which only
    /// costs the waiting: each process then prepares for itself.
    pub(crate) fn lock(&self) -> Option<std::fs::File> {
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

    /// The cached samples, their counts and the file, when a complete entry with this key is
    /// there.
    pub(crate) fn load(&self) -> Option<(MaskedSequences, ChatStats, PathBuf)> {
        let mut f = std::io::BufReader::new(std::fs::File::open(&self.file).ok()?);
        let mut magic = vec![0u8; MAGIC.len()];
        f.read_exact(&mut magic).ok()?;
        if magic != MAGIC {
            return None;
        }
        let header_len = read_u64(&mut f)? as usize;
        let mut header = vec![0u8; header_len];
        f.read_exact(&mut header).ok()?;
        let header: Header = serde_json::from_slice(&header).ok()?;
        if header.key != self.key {
            return None;
        }
        let mut out = MaskedSequences::new(&header.name, header.seq_len, header.pad_id);
        out.bounds = read_u64s(&mut f, header.sequences + 1)?
            .into_iter()
            .map(|b| b as usize)
            .collect();
        out.lines = read_u64s(&mut f, header.sequences)?
            .into_iter()
            .map(|b| b as usize)
            .collect();
        out.starts = read_u64s(&mut f, header.conversations)?
            .into_iter()
            .map(|b| b as usize)
            .collect();
        // a block at a time, so that reading needs no second copy of the arrays
        let mut block = vec![0u8; BLOCK * 4];
        out.ids = Vec::with_capacity(header.tokens);
        while out.ids.len() < header.tokens {
            let n = (header.tokens - out.ids.len()).min(BLOCK);
            f.read_exact(&mut block[..n * 4]).ok()?;
            out.ids.extend(
                block[..n * 4]
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            );
        }
        out.trained = Vec::with_capacity(header.tokens);
        while out.trained.len() < header.tokens {
            let n = (header.tokens - out.trained.len()).min(BLOCK);
            f.read_exact(&mut block[..n]).ok()?;
            out.trained.extend(block[..n].iter().map(|&b| b != 0));
        }
        if out.bounds.last() != Some(&header.tokens) || f.read(&mut [0u8; 1]).ok()? != 0 {
            return None;
        }
        Some((out, header.stats, self.file.clone()))
    }

    /// Writes the entry; a failure (a read-only data folder, a full disk) is logged and
    /// costs only the cache.
    pub(crate) fn store(&self, data: &MaskedSequences, stats: &ChatStats) {
        if let Err(e) = self.try_store(data, stats) {
            tracing::warn!(
                "the prepared conversations were not cached in {}: {e}",
                self.file.display()
            );
        }
    }

    fn try_store(&self, data: &MaskedSequences, stats: &ChatStats) -> std::io::Result<()> {
        let dir = self.file.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        let header = serde_json::to_vec(&Header {
            key: self.key.clone(),
            stats: stats.clone(),
            name: data.name.clone(),
            seq_len: data.seq_len,
            pad_id: data.pad_id,
            sequences: data.lines.len(),
            conversations: data.starts.len(),
            tokens: data.ids.len(),
        })?;
        let tmp = self
            .file
            .with_extension(format!("tmp-{}", std::process::id()));
        let result = (|| {
            let mut f = std::io::BufWriter::new(std::fs::File::create(&tmp)?);
            f.write_all(MAGIC)?;
            f.write_all(&(header.len() as u64).to_le_bytes())?;
            f.write_all(&header)?;
            for b in &data.bounds {
                f.write_all(&(*b as u64).to_le_bytes())?;
            }
            for l in data.lines.iter().chain(&data.starts) {
                f.write_all(&(*l as u64).to_le_bytes())?;
            }
            for id in &data.ids {
                f.write_all(&id.to_le_bytes())?;
            }
            // a block at a time: a copy of a million conversations' mask would be as large as
            // the mask
            for block in data.trained.chunks(BLOCK) {
                let mask: Vec<u8> = block.iter().map(|&t| t as u8).collect();
                f.write_all(&mask)?;
            }
            f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
            std::fs::rename(&tmp, &self.file)
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }
}

fn read_u64(f: &mut impl Read) -> Option<u64> {
    let mut b = [0u8; 8];
    f.read_exact(&mut b).ok()?;
    Some(u64::from_le_bytes(b))
}

fn read_u64s(f: &mut impl Read, n: usize) -> Option<Vec<u64>> {
    let mut bytes = vec![0u8; n.checked_mul(8)?];
    f.read_exact(&mut bytes).ok()?;
    Some(
        bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect(),
    )
}
