//! Token sequences with a per-token loss mask, one sample each (chat data: a conversation or a
//! packed window of several). Sequence `s` of `L <= T+1` ids gives inputs `s[..L-1]` and
//! labels `s[i+1]` where token `i+1` is trained, right-padded to `T` (PAD inputs, -100
//! labels).
//!
//! # Storage
//! The index (where each sequence starts, its record line, where its conversations start) is
//! held in memory, 24 bytes a sequence. The tokens are bytes, sequence after sequence: a
//! sequence of `n` tokens is its `n` ids (`u32`, little-endian) then its `n` mask bytes (1:
//! trained), at byte [`BYTES_PER_TOKEN`]` * bounds[k]` of the token store. [`SequenceWriter`]
//! writes them as they are made to any writer; the store they are read from is memory, or a
//! region of a file read by one positional read a sample (the preprocessing cache), so that
//! prepared data of any size costs only its index in memory.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::dataset::{Dataset, Example, Sample, IGNORE_INDEX};
use super::error::{DataError, Result};
use super::positional_read::read_exact_at;

/// Bytes a token takes in the store: its `u32` id and its mask byte.
pub const BYTES_PER_TOKEN: u64 = 5;

/// Where each sequence lies among the tokens, where it came from and where its conversations
/// start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SequenceIndex {
    /// Sequence `k` is tokens `bounds[k]..bounds[k+1]`.
    pub(crate) bounds: Vec<usize>,
    /// Where sequence `k` came from (the record's line, or its first record's when packed).
    pub(crate) lines: Vec<usize>,
    /// Token offsets where each conversation starts, ascending; every `bounds[k]` of a
    /// non-empty sequence is one of them, and a packed sequence holds more.
    pub(crate) starts: Vec<usize>,
}

impl Default for SequenceIndex {
    fn default() -> Self {
        SequenceIndex {
            bounds: vec![0],
            lines: vec![],
            starts: vec![],
        }
    }
}

impl SequenceIndex {
    /// Sequences indexed.
    pub fn len(&self) -> usize {
        self.lines.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    /// Tokens in all sequences.
    pub fn num_tokens(&self) -> usize {
        self.bounds[self.bounds.len() - 1]
    }

    fn push(&mut self, len: usize, starts: &[usize], line: usize) {
        let base = self.num_tokens();
        self.starts
            .extend(starts.iter().filter(|&&s| s < len).map(|s| base + s));
        self.bounds.push(base + len);
        self.lines.push(line);
    }

    fn range(&self, index: usize) -> std::ops::Range<usize> {
        self.bounds[index]..self.bounds[index + 1]
    }

    /// Whether the arrays fit together (bounds from 0, ascending, conversation starts ascending
    /// inside the tokens): what a file read back must satisfy before it is trusted.
    pub(crate) fn is_consistent(&self) -> bool {
        self.bounds.first() == Some(&0)
            && self.bounds.len() == self.lines.len() + 1
            && self.bounds.windows(2).all(|w| w[0] <= w[1])
            && self.starts.windows(2).all(|w| w[0] < w[1])
            && self.starts.last().is_none_or(|&s| s < self.num_tokens())
    }
}

/// Writes sequences one after another as the token store's bytes (module docs) to `out`, and
/// indexes them.
#[derive(Debug)]
pub struct SequenceWriter<W: Write> {
    out: W,
    index: SequenceIndex,
    trained_tokens: usize,
    bytes: Vec<u8>,
}

impl<W: Write> SequenceWriter<W> {
    pub fn new(out: W) -> Self {
        SequenceWriter {
            out,
            index: SequenceIndex::default(),
            trained_tokens: 0,
            bytes: vec![],
        }
    }

    /// Appends one sequence (at most `seq_len + 1` ids) with its mask, holding one
    /// conversation.
    pub fn push(&mut self, ids: &[u32], trained: &[bool], line: usize) -> std::io::Result<()> {
        self.push_packed(ids, trained, &[0], line)
    }

    /// Appends one sequence holding conversations that start at the offsets `starts`
    /// (ascending, the first 0).
    pub fn push_packed(
        &mut self,
        ids: &[u32],
        trained: &[bool],
        starts: &[usize],
        line: usize,
    ) -> std::io::Result<()> {
        debug_assert_eq!(ids.len(), trained.len());
        debug_assert!(starts.first() == Some(&0) && starts.windows(2).all(|w| w[0] < w[1]));
        self.bytes.clear();
        self.bytes.reserve(ids.len() * BYTES_PER_TOKEN as usize);
        for id in ids {
            self.bytes.extend_from_slice(&id.to_le_bytes());
        }
        self.bytes.extend(trained.iter().map(|&t| t as u8));
        self.out.write_all(&self.bytes)?;
        self.trained_tokens += trained.iter().skip(1).filter(|&&t| t).count();
        self.index.push(ids.len(), starts, line);
        Ok(())
    }

    /// The sequences written so far.
    pub fn index(&self) -> &SequenceIndex {
        &self.index
    }

    /// Tokens that are targets of the loss in all sequences written (the first token of each
    /// sequence never is).
    pub fn trained_tokens(&self) -> usize {
        self.trained_tokens
    }

    /// The writer and the index of what was written to it.
    pub fn into_parts(self) -> (W, SequenceIndex) {
        (self.out, self.index)
    }
}

/// Where the token bytes are read from.
#[derive(Debug)]
enum TokenStore {
    Held(Vec<u8>),
    /// The bytes from `offset` of `file` (`path` names it in errors).
    File {
        file: File,
        path: PathBuf,
        offset: u64,
    },
}

/// Sequences with per-token masks, padded to `T` on read.
#[derive(Debug)]
pub struct MaskedSequences {
    name: String,
    index: SequenceIndex,
    store: TokenStore,
    /// Samples of packed sequences carry per-conversation positions (see the module docs).
    isolate: bool,
    seq_len: usize,
    pad_id: u32,
}

impl MaskedSequences {
    /// Sequences of at most `seq_len + 1` ids whose bytes (module docs) are `bytes`, as a
    /// [`SequenceWriter`] wrote them into memory.
    pub fn held(
        name: &str,
        seq_len: usize,
        pad_id: u32,
        index: SequenceIndex,
        bytes: Vec<u8>,
    ) -> Self {
        Self::with_store(name, seq_len, pad_id, index, TokenStore::Held(bytes))
    }

    /// Sequences whose bytes begin at `offset` of `file` (named `path` in errors), read one
    /// sample at a time.
    pub fn in_file(
        name: &str,
        seq_len: usize,
        pad_id: u32,
        index: SequenceIndex,
        file: File,
        path: &Path,
        offset: u64,
    ) -> Self {
        let store = TokenStore::File {
            file,
            path: path.to_path_buf(),
            offset,
        };
        Self::with_store(name, seq_len, pad_id, index, store)
    }

    fn with_store(
        name: &str,
        seq_len: usize,
        pad_id: u32,
        index: SequenceIndex,
        store: TokenStore,
    ) -> Self {
        MaskedSequences {
            name: name.to_string(),
            index,
            store,
            isolate: false,
            seq_len,
            pad_id,
        }
    }

    /// `count` bytes of the store from `start`.
    fn read(&self, start: u64, count: usize) -> Result<Vec<u8>> {
        match &self.store {
            TokenStore::Held(bytes) => Ok(bytes[start as usize..start as usize + count].to_vec()),
            TokenStore::File { file, path, offset } => {
                let mut buf = vec![0u8; count];
                read_exact_at(file, &mut buf, offset + start)
                    .map_err(|e| DataError::io(path, e))?;
                Ok(buf)
            }
        }
    }

    /// The ids and mask of sequence `index`.
    pub fn sequence(&self, index: usize) -> Result<(Vec<u32>, Vec<bool>)> {
        let r = self.index.range(index);
        let n = r.len();
        let bytes = self.read(
            r.start as u64 * BYTES_PER_TOKEN,
            n * BYTES_PER_TOKEN as usize,
        )?;
        let (ids, mask) = bytes.split_at(n * 4);
        let ids = ids
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok((ids, mask.iter().map(|&b| b != 0).collect()))
    }

    /// The mask of sequence `index`.
    fn mask(&self, index: usize) -> Result<Vec<bool>> {
        let r = self.index.range(index);
        let n = r.len();
        let bytes = self.read(r.start as u64 * BYTES_PER_TOKEN + n as u64 * 4, n)?;
        Ok(bytes.iter().map(|&b| b != 0).collect())
    }

    /// Gives packed sequences' samples per-conversation positions (`true`) or none, so that
    /// they attend across the window (`false`).
    pub fn isolate(&mut self, isolate: bool) {
        self.isolate = isolate;
    }

    /// Where the conversations of sequence `index` start, as offsets within it.
    pub fn conversation_starts(&self, index: usize) -> Vec<usize> {
        let r = self.index.range(index);
        let starts = &self.index.starts;
        let first = starts.partition_point(|&s| s < r.start);
        let last = starts.partition_point(|&s| s < r.end);
        starts[first..last].iter().map(|s| s - r.start).collect()
    }

    /// The positions of the first `len` tokens of sequence `index` (padding included) when it
    /// packs several conversations and they are isolated: counting from each conversation's
    /// first token, the padding continuing the last.
    fn positions(&self, index: usize, len: usize) -> Option<Vec<i64>> {
        if !self.isolate {
            return None;
        }
        let starts = self.conversation_starts(index);
        if starts.len() < 2 {
            return None;
        }
        let mut positions = Vec::with_capacity(len);
        let mut next = starts.iter().skip(1).peekable();
        let mut begin = 0;
        for i in 0..len {
            if next.peek() == Some(&&i) {
                begin = i;
                next.next();
            }
            positions.push((i - begin) as i64);
        }
        Some(positions)
    }

    /// The record line sequence `index` starts with.
    pub fn line(&self, index: usize) -> usize {
        self.index.lines[index]
    }

    /// Tokens in all sequences.
    pub fn num_tokens(&self) -> usize {
        self.index.num_tokens()
    }
}

/// Two sets are equal when they hold the same sequences (ids, masks, lines, conversation
/// starts) read the same way, wherever their bytes are stored.
impl PartialEq for MaskedSequences {
    fn eq(&self, other: &Self) -> bool {
        let same_shape = (
            &self.name,
            &self.index,
            self.isolate,
            self.seq_len,
            self.pad_id,
        ) == (
            &other.name,
            &other.index,
            other.isolate,
            other.seq_len,
            other.pad_id,
        );
        same_shape
            && (0..self.len()).all(|k| match (self.sequence(k), other.sequence(k)) {
                (Ok(a), Ok(b)) => a == b,
                _ => false,
            })
    }
}

impl Dataset for MaskedSequences {
    fn len(&self) -> usize {
        self.index.len()
    }

    fn seq_len(&self) -> usize {
        self.seq_len
    }

    fn get(&self, index: usize) -> Result<Sample> {
        let (s, trained) = self.sequence(index)?;
        let t = self.seq_len;
        let mut input_ids = vec![self.pad_id as i64; t];
        let mut labels = vec![IGNORE_INDEX; t];
        for i in 0..s.len().saturating_sub(1) {
            input_ids[i] = s[i] as i64;
            if trained[i + 1] {
                labels[i] = s[i + 1] as i64;
            }
        }
        Ok(Sample {
            input_ids,
            labels,
            positions: self.positions(index, t),
            rejected: None,
        })
    }

    fn num_loss_tokens(&self, index: usize) -> Result<usize> {
        Ok(self.mask(index)?.iter().skip(1).filter(|&&t| t).count())
    }

    fn num_tokens(&self, index: usize) -> Result<usize> {
        Ok(self.index.range(index).len())
    }

    fn example(&self, index: usize) -> Result<Example> {
        let (ids, mut trained) = self.sequence(index)?;
        if let Some(first) = trained.first_mut() {
            *first = false;
        }
        let positions = self.positions(index, ids.len());
        Ok(Example {
            ids,
            trained,
            source: Some(self.index.lines[index]),
            positions,
            rejected: None,
        })
    }

    fn describe(&self) -> String {
        format!(
            "{}: {} sequences of at most {} tokens ({} tokens)",
            self.name,
            self.len(),
            self.seq_len + 1,
            self.num_tokens()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sequences written by `write` into memory.
    fn held(
        seq_len: usize,
        write: impl FnOnce(&mut SequenceWriter<Vec<u8>>) -> std::io::Result<()>,
    ) -> MaskedSequences {
        let mut w = SequenceWriter::new(vec![]);
        write(&mut w).unwrap();
        let (bytes, index) = w.into_parts();
        MaskedSequences::held("t", seq_len, 0, index, bytes)
    }

    #[test]
    fn labels_follow_the_mask_and_pad() {
        let d = held(5, |w| {
            w.push(&[1, 5, 6, 7, 2], &[false, false, true, true, true], 3)
        });
        let s = d.get(0).unwrap();
        assert_eq!(s.input_ids, vec![1, 5, 6, 7, 0]);
        assert_eq!(s.labels, vec![-100, 6, 7, 2, -100]);
        assert_eq!(d.num_loss_tokens(0).unwrap(), 3);
        assert_eq!(s.num_loss_tokens(), 3);
        let e = d.example(0).unwrap();
        assert_eq!(e.trained, vec![false, false, true, true, true]);
        assert_eq!(e.source, Some(3));
        assert_eq!(s.positions, None);
    }

    #[test]
    fn packed_conversations_restart_their_positions_when_isolated() {
        let mut d = held(8, |w| {
            w.push(&[9, 9], &[false, true], 0)?;
            // Conversations of 3, 4 and 2 ids in one window of 9.
            w.push_packed(
                &[1, 5, 2, 1, 6, 7, 2, 1, 3],
                &[false, true, true, false, true, true, true, false, true],
                &[0, 3, 7],
                4,
            )?;
            w.push(&[1, 4, 4, 2], &[false, true, true, true], 5)
        });
        assert_eq!(d.conversation_starts(0), vec![0]);
        assert_eq!(d.conversation_starts(1), vec![0, 3, 7]);
        assert_eq!(d.conversation_starts(2), vec![0]);
        assert_eq!(d.get(1).unwrap().positions, None, "not isolated");
        d.isolate(true);
        let s = d.get(1).unwrap();
        assert_eq!(s.input_ids, vec![1, 5, 2, 1, 6, 7, 2, 1]);
        // The first token of each later conversation is not a target.
        assert_eq!(s.labels, vec![5, 2, -100, 6, 7, 2, -100, 3]);
        assert_eq!(s.positions, Some(vec![0, 1, 2, 0, 1, 2, 3, 0]));
        let e = d.example(1).unwrap();
        assert_eq!(e.positions, Some(vec![0, 1, 2, 0, 1, 2, 3, 0, 1]));
        assert_eq!(d.get(0).unwrap().positions, None, "one conversation");
        assert_eq!(d.get(2).unwrap().positions, None, "one conversation");

        // Padding continues the last conversation.
        let mut d = held(6, |w| {
            w.push_packed(&[1, 5, 1, 6], &[false, true, false, true], &[0, 2], 0)
        });
        d.isolate(true);
        assert_eq!(d.get(0).unwrap().positions, Some(vec![0, 1, 0, 1, 2, 3]));
    }

    /// The same sequences read from a file (after bytes that are not theirs) and from memory
    /// give the same samples, and the writer counts the trained tokens as it goes.
    #[test]
    fn a_file_store_reads_what_memory_holds() {
        let write = |w: &mut SequenceWriter<Vec<u8>>| {
            w.push(&[1, 70000, 3], &[false, true, true], 2)?;
            w.push_packed(&[4, 5, 6, 7], &[false, true, false, true], &[0, 2], 9)?;
            w.push(&[8], &[true], 11)
        };
        let mut memory = held(4, write);
        let mut w = SequenceWriter::new(b"header".to_vec());
        write(&mut w).unwrap();
        assert_eq!(w.trained_tokens(), 4);
        let (bytes, index) = w.into_parts();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&bytes).unwrap();
        let mut file = MaskedSequences::in_file("t", 4, 0, index, f, Path::new("t.bin"), 6);
        for isolate in [false, true] {
            memory.isolate(isolate);
            file.isolate(isolate);
            assert_eq!(memory, file);
            for k in 0..memory.len() {
                assert_eq!(memory.get(k).unwrap(), file.get(k).unwrap());
                assert_eq!(memory.example(k).unwrap(), file.example(k).unwrap());
                assert_eq!(
                    memory.num_loss_tokens(k).unwrap(),
                    file.num_loss_tokens(k).unwrap()
                );
            }
        }
        assert_eq!(file.sequence(0).unwrap().0, vec![1, 70000, 3]);
        assert_eq!(file.num_tokens(), 8);
    }
}
