//! `kind: text`: plain-text files (globs allowed) tokenized and packed. Each file is one
//! document, and so is each record's `text` of a record file (`.jsonl`, `.json`, Parquet,
//! Arrow) or a directory of them; the stream `doc_0 EOS doc_1 EOS ... doc_n EOS` is held in
//! memory and cut into samples exactly like a token file ([`super::tokens::window`]). Files
//! are read whole, so corpora of many GB belong in a pre-tokenized `tokens` file instead.
//! `data.eval_fraction`/`data.eval_records` hold documents out for evaluation ([`carve`]).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use flotilla_config::schema::TextData;

use super::dataset::{Dataset, Sample};
use super::error::{DataError, Result};
use super::mixture::{self, HeldOut, Share};
use super::records::FileFormat;
use super::tokenizer::Tokenizer;
use super::tokens::{num_windows, window};

/// Documents and where each comes from (a file, or a record file's record).
pub type Documents = Vec<(PathBuf, String)>;

/// Splits `docs` into the training documents and, with `data.eval_fraction` or
/// `data.eval_records`, the held-out ones, each in reading order: the documents `mixture`
/// picks for the seed `data.seed` (the same whatever `trainer.seed` is).
pub fn carve(docs: Documents, cfg: &TextData) -> Result<(Documents, Option<Documents>)> {
    let (held_out, key) = match (cfg.eval_fraction, cfg.eval_records) {
        (Some(f), _) => (HeldOut::Fraction(f), "data.eval_fraction"),
        (None, Some(r)) => (HeldOut::Records(r), "data.eval_records"),
        (None, None) => return Ok((docs, None)),
    };
    let seed = cfg.seed.unwrap_or(0) as u64;
    let picks = mixture::pick(&[docs.len()], &[Share::All], held_out, seed)
        .map_err(|e| DataError::config(key, e.replace("records", "documents")))?;
    let eval_flags = &picks[0].eval;
    let (mut train, mut eval) = (vec![], vec![]);
    for (doc, held) in docs.into_iter().zip(eval_flags) {
        if *held {
            eval.push(doc);
        } else {
            train.push(doc);
        }
    }
    if eval.is_empty() {
        return Err(DataError::config(
            key,
            format!(
                "holds out no document of the {} in data.paths; raise it, or set it to null",
                train.len()
            ),
        ));
    }
    Ok((train, Some(eval)))
}

/// Documents longer than this are encoded in pieces cut after a newline, so that the
/// tokenizer's per-encoding bookkeeping stays small.
const CHUNK_BYTES: usize = 1 << 20;

fn is_glob(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// Expands `patterns` (files or globs, `key` names the config key): glob matches in
/// alphabetical order, each file once, in order of first mention. A pattern that matches no
/// file and a plain path that does not exist are errors.
pub fn resolve_paths(key: &str, patterns: &[String]) -> Result<Vec<PathBuf>> {
    let mut seen = HashSet::new();
    let mut out = vec![];
    for pat in patterns {
        let matches: Vec<PathBuf> = if is_glob(pat) {
            let paths = glob::glob(pat).map_err(|e| DataError::BadGlob {
                key: key.into(),
                pattern: pat.clone(),
                message: e.to_string(),
            })?;
            let mut m = vec![];
            for p in paths {
                let p = p.map_err(|e| {
                    let path = e.path().to_path_buf();
                    DataError::io(path, e.into())
                })?;
                if p.is_file() {
                    m.push(p);
                }
            }
            if m.is_empty() {
                return Err(DataError::GlobNoMatch {
                    key: key.into(),
                    pattern: pat.clone(),
                });
            }
            m
        } else {
            let p = PathBuf::from(pat);
            if !p.is_file() {
                return Err(DataError::NotFound {
                    key: key.into(),
                    path: p,
                });
            }
            vec![p]
        };
        for m in matches {
            if seen.insert(m.clone()) {
                out.push(m);
            }
        }
    }
    Ok(out)
}

/// Reads one UTF-8 text file.
pub fn read_text(key: &str, path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).map_err(|e| DataError::open(key, path, e))?;
    String::from_utf8(bytes).map_err(|e| DataError::NotUtf8 {
        path: path.to_path_buf(),
        offset: e.utf8_error().valid_up_to(),
    })
}

/// Every document `patterns` names, with its path: a text file whole, or each record's
/// `text` field of a record file (`.jsonl`, `.json`, `.parquet`, `.arrow`) or a directory of
/// them ([`super::records`]).
pub fn read_documents(key: &str, patterns: &[String]) -> Result<Vec<(PathBuf, String)>> {
    let mut docs = vec![];
    for pattern in patterns {
        if Path::new(pattern).is_dir() {
            record_documents(key, pattern, &mut docs)?;
            continue;
        }
        for p in resolve_paths(key, std::slice::from_ref(pattern))? {
            if FileFormat::of(&p).is_some() {
                record_documents(key, &p.to_string_lossy(), &mut docs)?;
            } else {
                let text = read_text(key, &p)?;
                docs.push((p, text));
            }
        }
    }
    Ok(docs)
}

/// The `text` field of each record `spec` names, as documents.
fn record_documents(key: &str, spec: &str, docs: &mut Vec<(PathBuf, String)>) -> Result<()> {
    let files = super::records::locate(key, spec, None)?;
    for item in files.records() {
        let (origin, record) = item?;
        match record.get("text") {
            Some(serde_json::Value::String(t)) => docs.push((origin.file.to_path_buf(), t.clone())),
            _ => {
                return Err(origin
                    .error("a record of text data needs a string 'text' field (the document)"))
            }
        }
    }
    Ok(())
}

/// Token ids of a (possibly long) document, encoded in pieces of about 1 MiB cut
/// just after a newline.
pub fn encode_document(tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>> {
    let mut ids = vec![];
    let mut rest = text;
    while !rest.is_empty() {
        let cut = if rest.len() <= CHUNK_BYTES {
            rest.len()
        } else {
            let mut at = CHUNK_BYTES;
            while !rest.is_char_boundary(at) {
                at += 1;
            }
            rest[at..].find('\n').map_or(rest.len(), |i| at + i + 1)
        };
        ids.extend(tokenizer.encode(&rest[..cut])?);
        rest = &rest[cut..];
    }
    Ok(ids)
}

/// A packed token stream in memory.
#[derive(Debug)]
pub struct PackedDataset {
    name: String,
    tokens: Vec<u32>,
    seq_len: usize,
    num_documents: usize,
}

impl PackedDataset {
    /// Packs `docs` with `tokenizer`: each document's ids followed by EOS.
    pub fn from_documents(
        key: &str,
        docs: &[(PathBuf, String)],
        tokenizer: &Tokenizer,
        seq_len: usize,
    ) -> Result<Self> {
        let eos = tokenizer.require_eos()?;
        let mut tokens = vec![];
        for (_, text) in docs {
            tokens.extend(encode_document(tokenizer, text)?);
            tokens.push(eos);
        }
        Self::from_tokens(key, tokens, seq_len, docs.len())
    }

    /// A packed stream from ids already joined with EOS.
    pub fn from_tokens(
        name: &str,
        tokens: Vec<u32>,
        seq_len: usize,
        num_documents: usize,
    ) -> Result<Self> {
        if seq_len == 0 || num_windows(tokens.len() as u64, seq_len) == 0 {
            return Err(DataError::TooShort {
                what: name.to_string(),
                tokens: tokens.len() as u64,
                seq_len,
            });
        }
        Ok(PackedDataset {
            name: name.to_string(),
            tokens,
            seq_len,
            num_documents,
        })
    }

    /// The whole packed stream.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }
}

impl Dataset for PackedDataset {
    fn len(&self) -> usize {
        num_windows(self.tokens.len() as u64, self.seq_len) as usize
    }

    fn seq_len(&self) -> usize {
        self.seq_len
    }

    fn get(&self, index: usize) -> Result<Sample> {
        assert!(index < self.len(), "sample {index} of {}", self.len());
        let start = index * self.seq_len;
        let ids: Vec<u64> = self.tokens[start..start + self.seq_len + 1]
            .iter()
            .map(|&i| i as u64)
            .collect();
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
            "text {} ({} documents, {} tokens): {} samples of {}",
            self.name,
            self.num_documents,
            self.tokens.len(),
            self.len(),
            self.seq_len
        )
    }
}
