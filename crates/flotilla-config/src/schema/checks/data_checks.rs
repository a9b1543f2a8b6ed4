//! The data section's checks: its sequence length, each kind's required keys, and which
//! records make the training and held-out sets (`path` or a mixture of `sources`, carved
//! held-out records or documents), with the fix for each.

use super::super::types::{DataConfig, DataSource, ModelConfig, RecordSelection};
use super::{Check, MAX_ARITHMETIC_DIGITS};

impl Check<'_> {
    pub(super) fn data(&mut self, d: &DataConfig, model: Option<&ModelConfig>) {
        let seq_len = d.seq_len();
        if self.at_least("data.seq_len", seq_len as u64, 1) {
            // A job from a base has the base's positions, checked where the base is read
            // (`run`'s pre-flight, the trainer), not the preset's.
            let own = model.filter(|m| m.max_position_embeddings > 0 && m.init_from.is_none());
            if let Some(m) = own {
                if seq_len > m.max_position_embeddings {
                    self.invalid(
                        "data.seq_len",
                        format!(
                            "{seq_len} exceeds model.max_position_embeddings ({})",
                            m.max_position_embeddings
                        ),
                        format!(
                            "set data.seq_len={} or less, or raise model.max_position_embeddings",
                            m.max_position_embeddings
                        ),
                    );
                }
            }
        }
        match d {
            DataConfig::Arithmetic(a) => {
                if a.digits == 0 || a.digits > MAX_ARITHMETIC_DIGITS {
                    self.invalid(
                        "data.digits",
                        format!(
                            "must be between 1 and {MAX_ARITHMETIC_DIGITS}, got {}",
                            a.digits
                        ),
                        "set e.g. data.digits=3".into(),
                    );
                }
                self.at_least("data.num_train", a.num_train as u64, 1);
            }
            DataConfig::Tokens(t) => {
                self.non_empty("data.path", &t.path);
            }
            DataConfig::Text(t) => {
                if t.paths.is_empty() {
                    self.invalid(
                        "data.paths",
                        "is an empty list".into(),
                        "list the text files or globs, e.g. data.paths=[/path/to/a.txt]".into(),
                    );
                }
                let named = t.eval_paths.is_some().then_some("data.eval_paths");
                self.held_out(t.eval_fraction, t.eval_records, named, "documents");
                self.vocab(t.tokenizer.as_ref(), t.vocab_size, model);
            }
            DataConfig::Jsonl(j) => {
                self.record_selection(&j.selection(), "jsonl data", "train.jsonl");
                self.non_empty("data.completion_key", &j.completion_key);
                self.vocab(j.tokenizer.as_ref(), j.vocab_size, model);
            }
            DataConfig::Chat(c) => {
                self.record_selection(&c.selection(), "chat data", "chats.jsonl");
                self.non_empty("data.messages_key", &c.messages_key);
                self.at_least("data.seq_len", c.seq_len as u64, 1);
                self.hf_tokenizer(c.tokenizer.as_deref(), model, "chat");
            }
            DataConfig::Preference(p) => {
                self.record_selection(&p.selection(), "preference data", "pairs.jsonl");
                if let Some(n) = p.max_prompt_length {
                    self.at_least("data.max_prompt_length", n as u64, 1);
                }
                self.hf_tokenizer(p.tokenizer.as_deref(), model, "preference");
            }
        }
    }

    /// The records of `what` (chat or preference data, whose example file is `example`):
    /// `path` or `sources` (one of them), each source's share, and the held-out set (from
    /// `eval_path`/`eval_split`, or carved by `eval_fraction`/`eval_records`).
    fn record_selection(&mut self, c: &RecordSelection, what: &str, example: &str) {
        match (c.path, c.sources) {
            (None, None) => self.invalid(
                "data.path",
                format!("is null and data.sources is null: {what} needs records"),
                format!(
                    "set data.path=/path/to/{example} (or a .parquet file, a directory of \
                     shards), or data.sources=[{{path: ..., weight: ...}}, ...]"
                ),
            ),
            (Some(p), None) => self.non_empty("data.path", p),
            (Some(_), Some(_)) => self.invalid(
                "data.sources",
                "is set together with data.path".into(),
                "set data.path=null to mix data.sources, or data.sources=null to read data.path"
                    .into(),
            ),
            (None, Some(sources)) => self.mixture(sources),
        }
        for (key, value) in [("data.split", c.split), ("data.eval_split", c.eval_split)] {
            if let Some(v) = value {
                self.non_empty(key, v);
            }
        }
        let named = match (c.eval_path, c.eval_split) {
            (Some(_), _) => Some("data.eval_path"),
            (None, Some(_)) => Some("data.eval_split"),
            (None, None) => None,
        };
        self.held_out(c.eval_fraction, c.eval_records, named, "records");
    }

    /// Held-out `what` carved from the training data: `data.eval_fraction` in (0, 1) or a
    /// positive `data.eval_records`, not both, and neither when `named` (the key that names
    /// held-out data already) is set.
    fn held_out(
        &mut self,
        fraction: Option<f64>,
        records: Option<usize>,
        named: Option<&str>,
        what: &str,
    ) {
        if let Some(f) = fraction {
            if !(f > 0.0 && f < 1.0) {
                self.invalid(
                    "data.eval_fraction",
                    format!("must be above 0 and below 1, got {f}"),
                    format!("set e.g. data.eval_fraction=0.05, or null for no held-out {what}"),
                );
            }
        }
        if records == Some(0) {
            self.invalid(
                "data.eval_records",
                "is 0".into(),
                format!("set a number of {what}, e.g. data.eval_records=500, or null"),
            );
        }
        if fraction.is_some() && records.is_some() {
            self.invalid(
                "data.eval_records",
                "is set together with data.eval_fraction".into(),
                "set one of them, the other to null".into(),
            );
        }
        if let (true, Some(other)) = (fraction.is_some() || records.is_some(), named) {
            let carving = if fraction.is_some() {
                "data.eval_fraction"
            } else {
                "data.eval_records"
            };
            self.invalid(
                carving,
                format!(
                    "carves held-out {what} from the training data, but {other} names them \
                     already"
                ),
                format!("set {carving}=null, or {other}=null"),
            );
        }
    }

    /// `data.sources`: a non-empty list, each with at most one of weight/fraction/records,
    /// weights on all sources or on none.
    fn mixture(&mut self, sources: &[DataSource]) {
        if sources.is_empty() {
            self.invalid(
                "data.sources",
                "is an empty list".into(),
                "list the sources, e.g. data.sources=[{path: /data/a.parquet, weight: 1}], or \
                 set data.path instead"
                    .into(),
            );
        }
        let weighted = sources.iter().filter(|s| s.weight.is_some()).count();
        for (i, s) in sources.iter().enumerate() {
            let key = format!("data.sources[{i}]");
            self.non_empty(&format!("{key}.path"), &s.path);
            let set: Vec<&str> = [
                ("weight", s.weight.is_some()),
                ("fraction", s.fraction.is_some()),
                ("records", s.records.is_some()),
            ]
            .iter()
            .filter(|(_, on)| *on)
            .map(|(name, _)| *name)
            .collect();
            if set.len() > 1 {
                self.invalid(
                    &key,
                    format!("sets {}: a source takes one of them", set.join(" and ")),
                    format!("keep one of {key}.{}", set.join(", .")),
                );
            }
            if let Some(w) = s.weight {
                if !(w > 0.0 && w.is_finite()) {
                    self.invalid(
                        &format!("{key}.weight"),
                        format!("must be above 0, got {w}"),
                        format!("set e.g. {key}.weight=1.0, or leave the source out"),
                    );
                }
            }
            if let Some(f) = s.fraction {
                if !(f > 0.0 && f.is_finite()) {
                    self.invalid(
                        &format!("{key}.fraction"),
                        format!("must be above 0, got {f}"),
                        format!("set e.g. {key}.fraction=0.5 (above 1 repeats records)"),
                    );
                }
            }
            if s.records == Some(0) {
                self.invalid(
                    &format!("{key}.records"),
                    "is 0".into(),
                    "set a number of records, or leave the source out".into(),
                );
            }
            if weighted > 0 && s.weight.is_none() {
                self.invalid(
                    &format!("{key}.weight"),
                    format!(
                        "is unset while {weighted} other source(s) have a weight: weights share \
                         the mixture among all sources"
                    ),
                    format!(
                        "give {key} a weight too, or use fraction/records on every source instead"
                    ),
                );
            }
        }
    }
}
