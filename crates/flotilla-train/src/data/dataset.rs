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
    /// The position id of each input when the sample packs several sequences that must not
    /// see each other: a position that does not follow its predecessor by one starts a new
    /// sequence (transformers' packed `position_ids`). `None`: positions `0..T`, one sequence.
    pub positions: Option<Vec<i64>>,
    /// A preference pair's rejected sequence (this sample is the chosen one); `None` for
    /// every other kind of data.
    pub rejected: Option<Box<Sample>>,
}

impl Sample {
    /// Labelled positions (labels other than [`IGNORE_INDEX`]), a pair's rejected sequence's
    /// included.
    pub fn num_loss_tokens(&self) -> usize {
        self.labels.iter().filter(|&&l| l != IGNORE_INDEX).count()
            + self.rejected.as_ref().map_or(0, |r| r.num_loss_tokens())
    }
}

/// One sample as a person reads it: the sequence of ids the model sees (padding left out) and
/// which of them are targets of the loss (`trained[0]` is always false: nothing predicts the
/// first token).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Example {
    pub ids: Vec<u32>,
    pub trained: Vec<bool>,
    /// The line (or record) of the data file it came from, where the dataset knows it.
    pub source: Option<usize>,
    /// Each id's position when the example packs sequences that see only themselves
    /// ([`Sample::positions`]); `None`: one sequence at positions `0..`.
    pub positions: Option<Vec<i64>>,
    /// A preference pair's rejected sequence (this example is the chosen one).
    pub rejected: Option<Box<Example>>,
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

    /// Tokens in sample `index` as [`Dataset::example`] gives them (padding left out);
    /// datasets override it when they know it without reading the sample.
    fn num_tokens(&self, index: usize) -> Result<usize> {
        Ok(self.example(index)?.ids.len())
    }

    /// Sample `index` as [`Example`]. The default reads the sample: its `T` inputs and the
    /// last label when it has one (datasets that pad override it to leave the padding out).
    fn example(&self, index: usize) -> Result<Example> {
        let s = self.get(index)?;
        let mut ids: Vec<u32> = s.input_ids.iter().map(|&i| i as u32).collect();
        let mut trained = vec![false];
        trained.extend(s.labels.iter().map(|&l| l != IGNORE_INDEX));
        match s.labels.last() {
            Some(&l) if l != IGNORE_INDEX => ids.push(l as u32),
            _ => {
                trained.pop();
            }
        }
        Ok(Example {
            ids,
            trained,
            source: None,
            positions: None,
            rejected: None,
        })
    }

    /// A short description for logs (`tokens /data/train.bin: 1234 samples of 512`).
    fn describe(&self) -> String;
}
