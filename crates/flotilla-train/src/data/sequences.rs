//! One sequence per sample, for prompt/completion data (`jsonl`, `arithmetic`): a sequence
//! `s` of at most `T+1` ids gives inputs `s[..L-1]` and labels `s[1..]`, right-padded to `T`
//! (PAD inputs, -100 labels). Label `i` (the target `s[i+1]`) counts only when `i+1` is at or
//! after the sequence's `loss_from`, so a prompt of `P` tokens is masked with `loss_from = P`.

use super::dataset::{Dataset, Example, Sample, IGNORE_INDEX};
use super::error::{DataError, Result};

/// Sequences with their loss start, padded to `T` on read.
#[derive(Clone, Debug)]
pub struct SequenceDataset {
    name: String,
    seqs: Vec<Vec<u32>>,
    loss_from: Vec<usize>,
    seq_len: usize,
    pad_id: u32,
    truncated: usize,
}

impl SequenceDataset {
    /// `items` are `(ids, loss_from)`; sequences longer than `seq_len + 1` are truncated on the
    /// right (counted by [`SequenceDataset::truncated`]).
    pub fn new(
        name: &str,
        items: Vec<(Vec<u32>, usize)>,
        seq_len: usize,
        pad_id: u32,
    ) -> Result<Self> {
        if items.is_empty() {
            return Err(DataError::config(
                name,
                "has no records (an empty dataset cannot be sampled)",
            ));
        }
        if seq_len == 0 {
            return Err(DataError::config("data.seq_len", "must be at least 1"));
        }
        let mut truncated = 0;
        let mut seqs = Vec::with_capacity(items.len());
        let mut loss_from = Vec::with_capacity(items.len());
        for (mut ids, from) in items {
            if ids.len() > seq_len + 1 {
                ids.truncate(seq_len + 1);
                truncated += 1;
            }
            seqs.push(ids);
            loss_from.push(from.max(1));
        }
        Ok(SequenceDataset {
            name: name.to_string(),
            seqs,
            loss_from,
            seq_len,
            pad_id,
            truncated,
        })
    }

    /// Sequences cut to fit `seq_len + 1` ids.
    pub fn truncated(&self) -> usize {
        self.truncated
    }

    /// The full (possibly truncated) id sequence of sample `index` and its loss start.
    pub fn sequence(&self, index: usize) -> (&[u32], usize) {
        (&self.seqs[index], self.loss_from[index])
    }
}

impl Dataset for SequenceDataset {
    fn len(&self) -> usize {
        self.seqs.len()
    }

    fn seq_len(&self) -> usize {
        self.seq_len
    }

    fn get(&self, index: usize) -> Result<Sample> {
        let s = &self.seqs[index];
        let from = self.loss_from[index];
        let t = self.seq_len;
        let mut input_ids = vec![self.pad_id as i64; t];
        let mut labels = vec![IGNORE_INDEX; t];
        for i in 0..s.len().saturating_sub(1) {
            input_ids[i] = s[i] as i64;
            if i + 1 >= from {
                labels[i] = s[i + 1] as i64;
            }
        }
        Ok(Sample {
            input_ids,
            labels,
            positions: None,
            rejected: None,
        })
    }

    fn num_loss_tokens(&self, index: usize) -> Result<usize> {
        let len = self.seqs[index].len();
        Ok(len.saturating_sub(self.loss_from[index]))
    }

    fn num_tokens(&self, index: usize) -> Result<usize> {
        Ok(self.seqs[index].len())
    }

    fn example(&self, index: usize) -> Result<Example> {
        let s = &self.seqs[index];
        let from = self.loss_from[index];
        Ok(Example {
            ids: s.clone(),
            trained: (0..s.len()).map(|j| j >= from).collect(),
            source: None,
            positions: None,
            rejected: None,
        })
    }

    fn describe(&self) -> String {
        format!(
            "{}: {} sequences padded to {} ({} truncated)",
            self.name,
            self.seqs.len(),
            self.seq_len,
            self.truncated
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_prompt_and_pads() {
        // BOS=1, prompt 5 6, completion 7 8, EOS=2; PAD=0; T=6.
        let d = SequenceDataset::new("t", vec![(vec![1, 5, 6, 7, 8, 2], 3)], 6, 0).unwrap();
        let s = d.get(0).unwrap();
        assert_eq!(s.input_ids, vec![1, 5, 6, 7, 8, 0]);
        assert_eq!(s.labels, vec![-100, -100, 7, 8, 2, -100]);
        assert_eq!(d.num_loss_tokens(0).unwrap(), 3);
        assert_eq!(s.num_loss_tokens(), 3);
        // Truncated to T+1 = 4 ids.
        let d = SequenceDataset::new("t", vec![(vec![1, 5, 6, 7, 8, 2], 3)], 3, 0).unwrap();
        let s = d.get(0).unwrap();
        assert_eq!(
            (s.input_ids, s.labels),
            (vec![1, 5, 6], vec![-100, -100, 7])
        );
        assert_eq!(d.num_loss_tokens(0).unwrap(), 1);
        assert_eq!(d.truncated(), 1);
    }
}
