//! The sample contract every dataset implements: [`Sample`] (`T` input ids and their already
//! shifted labels), [`IGNORE_INDEX`] for positions without loss, and the [`Dataset`] trait
//! (random access to fixed-length samples). The layout of each kind of data is described in
//! the [`data`](super) module; this file depends only on its error type.

use super::error::Result;

/// Label of a position that does not count in the loss (PyTorch's `ignore_index`).
pub const IGNORE_INDEX: i64 = -100;

/// One training sample: `T` input ids and their `T` (already shifted) labels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    pub input_ids: Vec<i64>,
    pub labels: Vec<i64>,
}

impl Sample {
    /// Labelled positions (labels other than [`IGNORE_INDEX`]).
    pub fn num_loss_tokens(&self) -> usize {
        self.labels.iter().filter(|&&l| l != IGNORE_INDEX).count()
    }
}

/// A list of fixed-length samples with random access.
pub trait Dataset: Send + Sync {
    /// Number of samples.
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `T`: positions per sample.
    fn seq_len(&self) -> usize;

    /// Sample `index` (`index < len()`).
    fn get(&self, index: usize) -> Result<Sample>;

    /// Labelled positions of sample `index`; datasets override it when they know it without
    /// reading the sample.
    fn num_loss_tokens(&self, index: usize) -> Result<usize> {
        Ok(self.get(index)?.num_loss_tokens())
    }

    /// A short description for logs (`tokens /data/train.bin: 1234 samples of 512`).
    fn describe(&self) -> String;
}
