//! What `flotilla data show` shows: a job's first training examples as the model sees them
//! (the ids, which of them carry loss, the text they decode to) and a summary of the whole set,
//! as text for a person (trained spans highlighted, masked ones dimmed) or as JSON
//! (`{"examples": [{"text", "input_ids", "labels"}], "summary": {...}}`, `labels` being the
//! ids with -100 where no loss is taken, in transformers' unshifted convention, and
//! `position_ids` for a packed window whose conversations see only themselves; a preference
//! pair is its chosen sequence with the rejected one under `rejected`).

use serde::Serialize;

use super::chat::{self, ChatStats};
use super::dataset::{Dataset, Example, IGNORE_INDEX};
use super::error::Result;
use super::preference;
use super::record_sets::SourceStats;
use super::tokenizer::Tokenizer;
use super::Data;

/// A dataset's counts.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Summary {
    pub examples: usize,
    pub tokens: usize,
    pub trained_tokens: usize,
    /// Conversations (or records) cut to fit `seq_len`.
    pub truncated: usize,
    /// Left out for their length.
    pub dropped: usize,
    /// Skipped as bad records.
    pub skipped: usize,
    /// Chat conversations whose trained tokens were found by markers (a template that is not
    /// prefix-stable).
    pub masked_by_markers: usize,
    /// Chat data's sources: records each holds, holds out and gives the training set.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<SourceStats>,
}

impl Summary {
    fn of_chat(s: &ChatStats) -> Self {
        Summary {
            examples: s.examples,
            tokens: s.tokens,
            trained_tokens: s.trained_tokens,
            truncated: s.truncated,
            dropped: s.dropped,
            skipped: s.skipped,
            masked_by_markers: s.masked_by_markers,
            sources: s.sources.clone(),
        }
    }

    /// The percentage of tokens that carry loss.
    pub fn trained_percent(&self) -> f64 {
        if self.tokens == 0 {
            0.0
        } else {
            100.0 * self.trained_tokens as f64 / self.tokens as f64
        }
    }

    /// One line for a person.
    pub fn line(&self) -> String {
        let line = format!(
            "{} examples, {} tokens, {:.1}% trained; {} cut to fit, {} dropped for length, {} \
             skipped as bad",
            self.examples,
            self.tokens,
            self.trained_percent(),
            self.truncated,
            self.dropped,
            self.skipped
        );
        line + &super::chat::markers_note(self.masked_by_markers)
    }
}

/// Examples with the summary of the training set.
#[derive(Clone, Debug, Serialize)]
pub struct Shown {
    pub examples: Vec<ShownExample>,
    pub summary: Summary,
    /// Chat or preference data's own line (records, conversations or pairs).
    #[serde(skip)]
    pub data_line: Option<String>,
}

/// One example in JSON form.
#[derive(Clone, Debug, Serialize)]
pub struct ShownExample {
    pub text: String,
    pub input_ids: Vec<u32>,
    pub labels: Vec<i64>,
    /// The line (or record number) of the data file it came from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<usize>,
    /// Each id's position when the example packs conversations that see only themselves
    /// (transformers' packed `position_ids`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position_ids: Option<Vec<i64>>,
    /// A preference pair's rejected sequence (this one being the chosen).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rejected: Option<Box<ShownExample>>,
    #[serde(skip)]
    pub example: Example,
}

impl ShownExample {
    fn of(example: Example, tokenizer: Option<&Tokenizer>) -> Result<Self> {
        let text = match tokenizer {
            Some(t) => t.decode(&example.ids, false)?,
            None => String::new(),
        };
        let labels = example
            .ids
            .iter()
            .zip(&example.trained)
            .map(|(&id, &t)| if t { id as i64 } else { IGNORE_INDEX })
            .collect();
        let rejected = match &example.rejected {
            Some(r) => Some(Box::new(Self::of((**r).clone(), tokenizer)?)),
            None => None,
        };
        Ok(ShownExample {
            text,
            input_ids: example.ids.clone(),
            labels,
            source: example.source,
            position_ids: example.positions.clone(),
            rejected,
            example,
        })
    }
}

/// The first `num` training examples of `data` and the summary of all of them.
pub fn show(data: &Data, num: usize) -> Result<Shown> {
    let train = &data.train;
    let mut examples = vec![];
    for i in 0..num.min(train.len()) {
        examples.push(ShownExample::of(
            train.example(i)?,
            data.tokenizer.as_ref(),
        )?);
    }
    let summary = match (&data.chat_stats, &data.preference_stats) {
        (Some(s), _) => Summary::of_chat(s),
        (None, Some(p)) => Summary {
            truncated: p.truncated,
            dropped: p.dropped_long_prompt,
            skipped: p.skipped,
            ..summarize(train.as_ref())?
        },
        (None, None) => summarize(train.as_ref())?,
    };
    let data_line = match (&data.chat_stats, &data.preference_stats) {
        (Some(s), _) => Some(chat::summary_line(s)),
        (None, Some(p)) => Some(preference::summary_line(p)),
        (None, None) => None,
    };
    Ok(Shown {
        examples,
        summary,
        data_line,
    })
}

/// Counts every example of a dataset that is not chat data (without reading the samples of
/// datasets that know their counts, such as a large `tokens` file).
fn summarize(ds: &dyn Dataset) -> Result<Summary> {
    let (mut tokens, mut trained) = (0, 0);
    for i in 0..ds.len() {
        tokens += ds.num_tokens(i)?;
        trained += ds.num_loss_tokens(i)?;
    }
    Ok(Summary {
        examples: ds.len(),
        tokens,
        trained_tokens: trained,
        truncated: 0,
        dropped: 0,
        skipped: 0,
        masked_by_markers: 0,
        sources: vec![],
    })
}

/// How trained and masked text are told apart on a terminal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Marking {
    /// ANSI: trained text bold, masked text dim.
    Color,
    /// Plain text: trained spans between `⟦` and `⟧`.
    Brackets,
}

/// The text of an example with its trained spans marked: consecutive tokens with the same
/// mask are decoded together.
pub fn marked_text(example: &Example, tokenizer: &Tokenizer, marking: Marking) -> Result<String> {
    let mut out = String::new();
    let mut start = 0;
    let ids = &example.ids;
    while start < ids.len() {
        let trained = example.trained[start];
        let mut end = start + 1;
        while end < ids.len() && example.trained[end] == trained {
            end += 1;
        }
        let piece = tokenizer.decode(&ids[start..end], false)?;
        match (marking, trained) {
            (Marking::Color, true) => out.push_str(&format!("\x1b[1;32m{piece}\x1b[0m")),
            (Marking::Color, false) => out.push_str(&format!("\x1b[2m{piece}\x1b[0m")),
            (Marking::Brackets, true) => out.push_str(&format!("⟦{piece}⟧")),
            (Marking::Brackets, false) => out.push_str(&piece),
        }
        start = end;
    }
    Ok(out)
}
