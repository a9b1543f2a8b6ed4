//! The data layer's error type: every variant names its culprit (the config key, the file and
//! the line or token position, the offending value) so that a user can fix the problem from
//! the message alone.

use std::path::PathBuf;

/// Anything that can go wrong while building or reading the training data.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A file named by the config does not exist.
    #[error("{key}: file not found: {}", path.display())]
    NotFound { key: String, path: PathBuf },

    /// Reading a file failed.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// Writing a file failed.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// Prepared samples that cannot be written where training reads them from (the cache
    /// beside the data, or a temporary file); what was written is removed.
    #[error(
        "cannot write the prepared samples to {}: {source}; training reads them from there (5 \
         bytes a token), so free space on that disk",
        path.display()
    )]
    SamplesNotWritten {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A token file whose size is not a whole number of elements.
    #[error(
        "{}: size {size} bytes is not a multiple of {width} (data.token_dtype={dtype}); the file \
         is truncated or has another dtype",
        path.display()
    )]
    BadFileSize {
        path: PathBuf,
        size: u64,
        width: u64,
        dtype: String,
    },

    /// Too little data for one sequence.
    #[error("{what}: {tokens} tokens is too few for one sample of data.seq_len={seq_len} (needs {} tokens)", seq_len + 1)]
    TooShort {
        what: String,
        tokens: u64,
        seq_len: usize,
    },

    /// A token id that does not fit the model's embedding table.
    #[error(
        "{}: token id {id} at position {position} is out of range for model.vocab_size={vocab_size}",
        path.display()
    )]
    TokenOutOfRange {
        path: PathBuf,
        position: u64,
        id: u64,
        vocab_size: usize,
    },

    /// A glob pattern in `data.paths`/`data.eval_paths` that matches no file.
    #[error("{key}: pattern '{pattern}' matches no file")]
    GlobNoMatch { key: String, pattern: String },

    /// A glob pattern that does not parse.
    #[error("{key}: bad glob pattern '{pattern}': {message}")]
    BadGlob {
        key: String,
        pattern: String,
        message: String,
    },

    /// A text file that is not UTF-8.
    #[error("{}: not valid UTF-8 text (at byte {offset})", path.display())]
    NotUtf8 { path: PathBuf, offset: usize },

    /// A problem with the tokenizer (loading, training, encoding, missing special tokens).
    #[error("tokenizer {what}: {message}")]
    Tokenizer { what: String, message: String },

    /// A chat template that cannot be found, parsed or rendered (`origin`: the tokenizer
    /// directory or file it comes from).
    #[error("chat template {}: {message}", origin.display())]
    ChatTemplate { origin: PathBuf, message: String },

    /// A record that cannot be read or used (`place`: `:LINE` of a `.jsonl` file, ` record N`
    /// of a `.json` array, ` row N` of a Parquet or Arrow file).
    #[error("{}{place}: {message}", path.display())]
    Record {
        path: PathBuf,
        place: String,
        message: String,
    },

    /// A data file that cannot be read as what its name says (a damaged Parquet file, an
    /// Arrow directory without its files).
    #[error("{}: {message}", path.display())]
    File { path: PathBuf, message: String },

    /// A config value the data layer cannot work with.
    #[error("{key}: {message}")]
    Config { key: String, message: String },

    /// A sampler state that does not belong to this data (restore after the data changed).
    #[error("sampler state does not match the data: {0}")]
    SamplerMismatch(String),

    /// Batching/split parameters that do not divide evenly.
    #[error("batch split: {0}")]
    BatchSplit(String),

    /// The generate callback given to the exact-match evaluation failed or answered wrongly.
    #[error("generate callback: {0}")]
    Generate(String),

    /// A libtorch error while building tensors.
    #[error("tensor: {0}")]
    Tensor(#[from] tch::TchError),
}

impl DataError {
    /// Whether the user's data or config is at fault (a missing or damaged file, a bad record,
    /// a bad setting), which the task reports with the usage exit status (2), rather than
    /// the machine (a failed read or write, libtorch).
    pub fn is_input(&self) -> bool {
        !matches!(
            self,
            DataError::Io { .. }
                | DataError::Write { .. }
                | DataError::SamplesNotWritten { .. }
                | DataError::Tensor(_)
                | DataError::Generate(_)
                | DataError::SamplerMismatch(_)
                | DataError::BatchSplit(_)
        )
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        DataError::Io {
            path: path.into(),
            source,
        }
    }

    /// A read error, mapped to [`DataError::NotFound`] when the file does not exist.
    pub(crate) fn open(key: &str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        let path = path.into();
        if source.kind() == std::io::ErrorKind::NotFound {
            DataError::NotFound {
                key: key.to_string(),
                path,
            }
        } else {
            DataError::Io { path, source }
        }
    }

    pub(crate) fn config(key: &str, message: impl Into<String>) -> Self {
        DataError::Config {
            key: key.to_string(),
            message: message.into(),
        }
    }
}

/// Result with [`DataError`].
pub type Result<T, E = DataError> = std::result::Result<T, E>;
