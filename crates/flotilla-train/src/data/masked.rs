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

    /// Appends one sequence (at most `seq_len + 1` ids) with its mask.
    pub fn push(&mut self, ids: &[u32], trained: &[bool], line: usize) {
        debug_assert_eq!(ids.len(), trained.len());
        debug_assert!(ids.len() <= self.seq_len + 1);
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
        Ok(Sample { input_ids, labels })
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
    }
}
