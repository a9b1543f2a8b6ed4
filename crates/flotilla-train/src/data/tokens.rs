//! `kind: tokens`: a flat little-endian uint16/uint32 file of token ids (nanoGPT's `.bin`),
//! read lazily with positional reads so that files of many GB cost no memory, and cut into
//! samples by [`window`]: sample `k` is inputs `tokens[k*T .. k*T+T]`, labels
//! `tokens[k*T+1 .. k*T+T+1]`; `(N-1)/T` samples, the incomplete tail dropped.

use std::fs::File;
use std::path::{Path, PathBuf};

use flotilla_config::schema::TokenDtype;

use super::dataset::{Dataset, Sample};
use super::error::{DataError, Result};
use super::positional_read::read_exact_at;

/// Bytes per element of `dtype`.
pub fn dtype_width(dtype: TokenDtype) -> u64 {
    match dtype {
        TokenDtype::Uint16 => 2,
        TokenDtype::Uint32 => 4,
    }
}

/// Number of whole samples of `seq_len` in a stream of `num_tokens` ids: `(N-1) / T`.
pub fn num_windows(num_tokens: u64, seq_len: usize) -> u64 {
    num_tokens.saturating_sub(1) / seq_len.max(1) as u64
}

/// Sample from `seq_len + 1` consecutive ids: inputs are the first `T`, labels the last `T`.
pub fn window(ids: &[u64]) -> Sample {
    let t = ids.len() - 1;
    Sample {
        input_ids: ids[..t].iter().map(|&i| i as i64).collect(),
        labels: ids[1..].iter().map(|&i| i as i64).collect(),
        positions: None,
        rejected: None,
    }
}

/// A token file opened for random access.
#[derive(Debug)]
pub struct TokensDataset {
    path: PathBuf,
    file: File,
    dtype: TokenDtype,
    num_tokens: u64,
    seq_len: usize,
    vocab_size: usize,
}

impl TokensDataset {
    /// Opens `path` (`key` names the config key for errors), checks that its size is a whole
    /// number of `dtype` elements and that it holds at least one sample. Ids are checked
    /// against `vocab_size` as samples are read.
    pub fn open(
        path: impl AsRef<Path>,
        key: &str,
        dtype: TokenDtype,
        seq_len: usize,
        vocab_size: usize,
    ) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|e| DataError::open(key, &path, e))?;
        let size = file.metadata().map_err(|e| DataError::io(&path, e))?.len();
        let width = dtype_width(dtype);
        if size % width != 0 {
            return Err(DataError::BadFileSize {
                path,
                size,
                width,
                dtype: dtype.to_string(),
            });
        }
        let num_tokens = size / width;
        if seq_len == 0 || num_windows(num_tokens, seq_len) == 0 {
            return Err(DataError::TooShort {
                what: path.display().to_string(),
                tokens: num_tokens,
                seq_len,
            });
        }
        Ok(TokensDataset {
            path,
            file,
            dtype,
            num_tokens,
            seq_len,
            vocab_size,
        })
    }

    pub fn num_tokens(&self) -> u64 {
        self.num_tokens
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Ids `start .. start+n` of the file, each checked against the vocabulary.
    pub fn read_tokens(&self, start: u64, n: usize) -> Result<Vec<u64>> {
        let width = dtype_width(self.dtype);
        let mut buf = vec![0u8; n * width as usize];
        read_exact_at(&self.file, &mut buf, start * width)
            .map_err(|e| DataError::io(&self.path, e))?;
        let ids: Vec<u64> = match self.dtype {
            TokenDtype::Uint16 => buf
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]) as u64)
                .collect(),
            TokenDtype::Uint32 => buf
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u64)
                .collect(),
        };
        if let Some(i) = ids.iter().position(|&id| id >= self.vocab_size as u64) {
            return Err(DataError::TokenOutOfRange {
                path: self.path.clone(),
                position: start + i as u64,
                id: ids[i],
                vocab_size: self.vocab_size,
            });
        }
        Ok(ids)
    }
}

impl Dataset for TokensDataset {
    fn len(&self) -> usize {
        num_windows(self.num_tokens, self.seq_len) as usize
    }

    fn seq_len(&self) -> usize {
        self.seq_len
    }

    fn get(&self, index: usize) -> Result<Sample> {
        assert!(index < self.len(), "sample {index} of {}", self.len());
        let ids = self.read_tokens(index as u64 * self.seq_len as u64, self.seq_len + 1)?;
        Ok(window(&ids))
    }

    fn num_loss_tokens(&self, _index: usize) -> Result<usize> {
        Ok(self.seq_len)
    }

    fn num_tokens(&self, _index: usize) -> Result<usize> {
        Ok(self.seq_len + 1)
    }

    fn describe(&self) -> String {
        format!(
            "tokens {} ({}, {} tokens): {} samples of {}",
            self.path.display(),
            self.dtype,
            self.num_tokens,
            self.len(),
            self.seq_len
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_drop_the_tail() {
        assert_eq!(num_windows(9, 4), 2); // 0..4|1..5, 4..8|5..9
        assert_eq!(num_windows(8, 4), 1); // the 2nd would need id 8
        assert_eq!(num_windows(4, 4), 0);
        assert_eq!(num_windows(0, 4), 0);
        let s = window(&[1, 2, 3]);
        assert_eq!((s.input_ids, s.labels), (vec![1, 2], vec![2, 3]));
    }
}
