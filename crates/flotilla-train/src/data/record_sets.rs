//! Which records make a data set's training and held-out sets, for chat and preference data
//! alike ([`RecordSelection`]): `data.path` (a file, a glob, a directory of shards, a
//! `save_to_disk` directory; `data.split` of a directory) or a mixture of `data.sources`; held
//! out by `data.eval_path`/`data.eval_split`, or carved from the training records by
//! `data.eval_fraction`/`data.eval_records` (the picks are `mixture`'s, seeded by `data.seed`).
//! A [`RecordSet`] is the result: each source's files and how many times it takes each record.

use flotilla_config::schema::RecordSelection;
use serde::{Deserialize, Serialize};

use super::error::{DataError, Result};
use super::mixture::{self, HeldOut, Share};
use super::records::{self, RecordFiles};

/// One source of a [`RecordSet`]: its records and, unless it takes each once, how many times it
/// takes each (by the record's index among the source's records).
#[derive(Clone, Debug)]
pub struct SetPart {
    pub files: RecordFiles,
    pub takes: Option<Vec<u32>>,
}

impl SetPart {
    /// How many times this set takes the source's record `index` (0: not at all).
    pub fn times(&self, index: usize) -> u32 {
        self.takes.as_ref().map_or(1, |t| t[index])
    }
}

/// The records a data set (chat or preference) is made of: the training set (a file, or a mixture of
/// sources), or the held-out set.
#[derive(Clone, Debug)]
pub struct RecordSet {
    pub parts: Vec<SetPart>,
    /// Records each source holds and holds out, when counted before reading (a mixture or
    /// carved held-out records).
    pub counted: Vec<Option<(usize, usize)>>,
}

impl RecordSet {
    /// Every record of `files`, once.
    pub fn whole(files: RecordFiles) -> Self {
        RecordSet {
            parts: vec![SetPart { files, takes: None }],
            counted: vec![None],
        }
    }

    /// The sources' paths (with their number of files), joined by ` + `, for messages.
    pub fn name(&self) -> String {
        self.parts
            .iter()
            .map(|p| p.files.describe())
            .collect::<Vec<_>>()
            .join(" + ")
    }
}

/// What preparing took from one source.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceStats {
    /// The source's path as the config names it.
    pub path: String,
    /// Records the source holds.
    pub records: usize,
    /// Records of it held out for evaluation.
    pub held_out: usize,
    /// Records of it this set takes, repeats counted.
    pub taken: usize,
}

/// `; from PATH: N of M records (K held out), ...` for a mixture or a carved held-out set,
/// else nothing.
pub fn sources_note(sources: &[SourceStats]) -> String {
    if sources.len() < 2 && sources.iter().all(|s| s.held_out == 0) {
        return String::new();
    }
    let parts: Vec<String> = sources
        .iter()
        .map(|s| {
            let held = match s.held_out {
                0 => String::new(),
                n => format!(", {n} held out"),
            };
            format!("{}: {} of {} records{held}", s.path, s.taken, s.records)
        })
        .collect();
    format!("; from {}", parts.join(", "))
}

/// The training set and, when the config has one, the held-out set.
pub fn plan(cfg: &RecordSelection) -> Result<(RecordSet, Option<RecordSet>)> {
    let mut sources: Vec<(RecordFiles, Share)> = vec![];
    match (cfg.path, cfg.sources) {
        (Some(path), _) => {
            sources.push((records::locate("data.path", path, cfg.split)?, Share::All))
        }
        (None, Some(list)) => {
            for (i, s) in list.iter().enumerate() {
                let key = format!("data.sources[{i}].path");
                let split = s.split.as_deref().or(cfg.split);
                let share = match (s.weight, s.fraction, s.records) {
                    (Some(w), _, _) => Share::Weight(w),
                    (_, Some(f), _) => Share::Fraction(f),
                    (_, _, Some(r)) => Share::Records(r),
                    _ => Share::All,
                };
                sources.push((records::locate(&key, &s.path, split)?, share));
            }
        }
        (None, None) => {
            return Err(DataError::config(
                "data.path",
                "is null and data.sources is null; set data.path=/path/to/records.jsonl or \
                 data.sources=[{path: ..., weight: ...}]",
            ))
        }
    }
    let held_out = match (cfg.eval_fraction, cfg.eval_records) {
        (Some(f), _) => HeldOut::Fraction(f),
        (_, Some(r)) => HeldOut::Records(r),
        _ => HeldOut::None,
    };
    let mixed = cfg.sources.is_some() || held_out != HeldOut::None;
    if !mixed {
        let (files, _) = sources.pop().expect("one source");
        return Ok((RecordSet::whole(files), named_eval(cfg)?));
    }
    let counts: Vec<usize> = sources
        .iter()
        .map(|(files, _)| files.count())
        .collect::<Result<_>>()?;
    let shares: Vec<Share> = sources.iter().map(|s| s.1).collect();
    let picks = mixture::pick(&counts, &shares, held_out, cfg.seed).map_err(|e| {
        let key = match held_out {
            HeldOut::Records(_) => "data.eval_records",
            HeldOut::Fraction(_) => "data.eval_fraction",
            HeldOut::None => "data.sources",
        };
        DataError::config(key, e)
    })?;
    let counted: Vec<Option<(usize, usize)>> = picks
        .iter()
        .zip(&counts)
        .map(|(p, &n)| Some((n, p.eval_total())))
        .collect();
    let mut train = RecordSet {
        parts: vec![],
        counted: counted.clone(),
    };
    let mut eval = RecordSet {
        parts: vec![],
        counted,
    };
    for ((files, _), picks) in sources.into_iter().zip(picks) {
        eval.parts.push(SetPart {
            files: files.clone(),
            takes: Some(picks.eval.iter().map(|&e| e as u32).collect()),
        });
        train.parts.push(SetPart {
            files,
            takes: Some(picks.train),
        });
    }
    let eval = match held_out {
        HeldOut::None => named_eval(cfg)?,
        _ => Some(eval),
    };
    Ok((train, eval))
}

/// The held-out set `data.eval_path` (with `data.eval_split`) names, or `data.eval_split` of
/// `data.path`.
fn named_eval(cfg: &RecordSelection) -> Result<Option<RecordSet>> {
    let (key, path) = match (cfg.eval_path, cfg.eval_split, cfg.path) {
        (Some(p), _, _) => ("data.eval_path", p),
        (None, Some(_), Some(p)) => ("data.eval_split", p),
        (None, Some(_), None) => {
            return Err(DataError::config(
                "data.eval_split",
                "names a split of data.path, but data.path is null (data.sources mixes the \
                 training data); set data.eval_path to the directory to take it from",
            ))
        }
        (None, None, _) => return Ok(None),
    };
    let files = records::locate(key, path, cfg.eval_split)?;
    Ok(Some(RecordSet::whole(files)))
}
