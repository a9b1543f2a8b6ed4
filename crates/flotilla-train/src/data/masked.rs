//! Token sequences with a per-token loss mask, one sample each (chat data: a conversation or a
//! packed window of several). Sequence `s` of `L <= T+1` ids gives inputs `s[..L-1]` and
//! labels `s[i+1]` where token `i+1` is trained, right-padded to `T` (PAD inputs, -100
//! labels). The storage is flat (all ids, all mask bytes, the sequence bounds), so it is
//! written to and read from the preprocessing cache as a few contiguous arrays.

use super::dataset::{Dataset, Example, Sample, IGNORE_INDEX};
use super::error::Result;

/// Sequences with per-token masks, padded to `T` on read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MaskedSequences {
    pub(crate) name: String,
    /// Every sequence's ids, one after another.
    pub(crate) ids: Vec<u32>,
    /// `trained[j]`: token `j` of `ids` is a target of the loss.
    pub(crate) trained: Vec<bool>,
    /// Sequence `k` is `ids[bounds[k]..bounds[k+1]]`.
    pub(crate) bounds: Vec<usize>,
    /// Where sequence `k` came from (the record's line, or its first record's when packed).
    pub(crate) lines: Vec<usize>,
    /// Offsets in `ids` where each conversation starts, ascending; every `bounds[k]` of a
    /// non-empty sequence is one of them, and a packed sequence holds more.
    pub(crate) starts: Vec<usize>,
    /// Samples of packed sequences carry per-conversation positions (see the module docs).
    pub(crate) isolate: bool,
    pub(crate) seq_len: usize,
    pub(crate) pad_id: u32,
}

impl MaskedSequences {
    /// An empty set for sequences of at most `seq_len + 1` ids.
    pub fn new(name: &str, seq_len: usize, pad_id: u32) -> Self {
        MaskedSequences {
            name: name.to_string(),
            bounds: vec![0],
            seq_len,
            pad_id,
            ..Default::default()
        }
    }

    /// Appends one sequence (at most `seq_len + 1` ids) with its mask, holding one
    /// conversation.
    pub fn push(&mut self, ids: &[u32], trained: &[bool], line: usize) {
        self.push_packed(ids, trained, &[0], line);
    }

    /// Appends one sequence holding conversations that start at the offsets `starts`
    /// (ascending, the first 0).
    pub fn push_packed(&mut self, ids: &[u32], trained: &[bool], starts: &[usize], line: usize) {
        debug_assert_eq!(ids.len(), trained.len());
        debug_assert!(ids.len() <= self.seq_len + 1);
        debug_assert!(starts.first() == Some(&0) && starts.windows(2).all(|w| w[0] < w[1]));
        let base = self.ids.len();
        self.starts
            .extend(starts.iter().filter(|&&s| s < ids.len()).map(|s| base + s));
        self.ids.extend_from_slice(ids);
        self.trained.extend_from_slice(trained);
        self.bounds.push(self.ids.len());
        self.lines.push(line);
    }

    fn range(&self, index: usize) -> std::ops::Range<usize> {
        self.bounds[index]..self.bounds[index + 1]
    }

    /// The ids and mask of sequence `index`.
    pub fn sequence(&self, index: usize) -> (&[u32], &[bool]) {
        let r = self.range(index);
        (&self.ids[r.clone()], &self.trained[r])
    }

    /// Gives packed sequences' samples per-conversation positions (`true`) or none, so that
    /// they attend across the window (`false`).
    pub fn isolate(&mut self, isolate: bool) {
        self.isolate = isolate;
    }

    /// Where the conversations of sequence `index` start, as offsets within it.
    pub fn conversation_starts(&self, index: usize) -> Vec<usize> {
        let r = self.range(index);
        let first = self.starts.partition_point(|&s| s < r.start);
        let last = self.starts.partition_point(|&s| s < r.end);
        self.starts[first..last]
            .iter()
            .map(|s| s - r.start)
            .collect()
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
        self.lines[index]
    }

    /// Tokens in all sequences.
    pub fn num_tokens(&self) -> usize {
        self.ids.len()
    }
}

impl Dataset for MaskedSequences {
    fn len(&self) -> usize {
        self.lines.len()
    }

    fn seq_len(&self) -> usize {
        self.seq_len
    }

    fn get(&self, index: usize) -> Result<Sample> {
        let (s, trained) = self.sequence(index);
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
        let (_, trained) = self.sequence(index);
        Ok(trained.iter().skip(1).filter(|&&t| t).count())
    }

    fn num_tokens(&self, index: usize) -> Result<usize> {
        Ok(self.range(index).len())
    }

    fn example(&self, index: usize) -> Result<Example> {
        let (ids, trained) = self.sequence(index);
        let mut trained = trained.to_vec();
        if let Some(first) = trained.first_mut() {
            *first = false;
        }
        Ok(Example {
            ids: ids.to_vec(),
            trained,
            source: Some(self.lines[index]),
            positions: self.positions(index, ids.len()),
            rejected: None,
        })
    }

    fn describe(&self) -> String {
        format!(
            "{}: {} sequences of at most {} tokens ({} tokens)",
            self.name,
            self.len(),
            self.seq_len + 1,
            self.ids.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_follow_the_mask_and_pad() {
        let mut d = MaskedSequences::new("t", 5, 0);
        d.push(&[1, 5, 6, 7, 2], &[false, false, true, true, true], 3);
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
        let mut d = MaskedSequences::new("t", 8, 0);
        d.push(&[9, 9], &[false, true], 0);
        // Conversations of 3, 4 and 2 ids in one window of 9.
        d.push_packed(
            &[1, 5, 2, 1, 6, 7, 2, 1, 3],
            &[false, true, true, false, true, true, true, false, true],
            &[0, 3, 7],
            4,
        );
        d.push(&[1, 4, 4, 2], &[false, true, true, true], 5);
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
        let mut d = MaskedSequences::new("t", 6, 0);
        d.push_packed(&[1, 5, 1, 6], &[false, true, false, true], &[0, 2], 0);
        d.isolate(true);
        assert_eq!(d.get(0).unwrap().positions, Some(vec![0, 1, 0, 1, 2, 3]));
    }
}
