//! `flotilla data show`: composes a job's config, builds its training data exactly as the
//! trainer does, and formats the first examples (see [`crate::data::show`]) as text or JSON.
//! The caller prints the result.

use std::io::IsTerminal;
use std::path::Path;

use anyhow::Context;

use crate::commands::task_error::TaskError;
use crate::data::show::{marked_text, show, Marking};
use crate::data::{self, DataOptions};

/// Output format of `data show`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
}

/// Whether the text output uses colours.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorChoice {
    Auto,
    Always,
    Never,
}

/// The output of `data show` for a composed job.
pub fn run(
    composed: &flotilla_config::Composed,
    num: usize,
    format: Format,
    color: ColorChoice,
) -> Result<String, TaskError> {
    let job = composed.typed.as_ref().ok_or_else(|| {
        TaskError::Other(anyhow::anyhow!(
            "the composed config is not a flotilla job (or --no-validate was given)"
        ))
    })?;
    let init_from = job.model.init_from.as_deref().map(Path::new);
    let vocab = match init_from {
        Some(dir) => {
            crate::model::read_model_config(dir)
                .with_context(|| format!("reading model.init_from={}", dir.display()))?
                .vocab_size
        }
        None => job.model.vocab_size,
    };
    let built = data::build(
        &job.data,
        &DataOptions {
            model_vocab_size: vocab,
            run_dir: None,
            init_from,
        },
    );
    let data = match built {
        Ok(data) => data,
        Err(e) if e.is_input() => {
            return Err(TaskError::Usage(
                anyhow::Error::new(e).context("building the training data"),
            ))
        }
        Err(e) => {
            return Err(anyhow::Error::new(e)
                .context("building the training data")
                .into())
        }
    };
    let shown = show(&data, num).context("reading the examples")?;
    if format == Format::Json {
        let mut text = serde_json::to_string(&shown).context("writing JSON")?;
        text.push('\n');
        return Ok(text);
    }
    let marking = match color {
        ColorChoice::Always => Marking::Color,
        ColorChoice::Never => Marking::Brackets,
        ColorChoice::Auto if std::io::stdout().is_terminal() => Marking::Color,
        ColorChoice::Auto => Marking::Brackets,
    };
    let mut out = String::new();
    let total = data.train.len();
    for (k, e) in shown.examples.iter().enumerate() {
        let trained = e.example.trained.iter().filter(|&&t| t).count();
        let source = match e.source {
            Some(at) => {
                let path = data_path(&job.data);
                // a line of a JSON file, else a row of a Parquet or Arrow file
                let place = if path.ends_with(".jsonl") || path.ends_with(".json") {
                    "line"
                } else {
                    "row"
                };
                format!(" · {path} {place} {at}")
            }
            None => String::new(),
        };
        let packed = match &e.position_ids {
            Some(p) => format!(
                " · {} conversations, each attending only to itself",
                p.iter().filter(|&&p| p == 0).count()
            ),
            None => String::new(),
        };
        if let Some(rejected) = &e.rejected {
            // A preference pair: the prompt (not trained) with each completion (trained).
            out.push_str(&format!("── pair {} of {total}{source} ──\n", k + 1));
            for (label, side) in [("chosen", e), ("rejected", rejected.as_ref())] {
                let trained = side.example.trained.iter().filter(|&&t| t).count();
                out.push_str(&format!(
                    "{label} ({} tokens, {trained} trained): ",
                    side.input_ids.len()
                ));
                if let Some(t) = &data.tokenizer {
                    out.push_str(&marked_text(&side.example, t, marking).context("decoding")?);
                }
                out.push('\n');
            }
            out.push('\n');
            continue;
        }
        out.push_str(&format!(
            "── example {} of {total}{source} · {} tokens · {trained} trained{packed} ──\n",
            k + 1,
            e.input_ids.len(),
        ));
        match &data.tokenizer {
            Some(t) => out.push_str(&marked_text(&e.example, t, marking).context("decoding")?),
            None => out.push_str(&format!("{:?}", e.input_ids)),
        }
        out.push_str("\n\n");
    }
    if marking == Marking::Brackets && !shown.examples.is_empty() {
        out.push_str("(trained tokens stand between ⟦ and ⟧)\n");
    }
    match &shown.data_line {
        Some(line) => out.push_str(&format!("{line}\n")),
        None => out.push_str(&format!("{}\n", shown.summary.line())),
    }
    Ok(out)
}

fn data_path(cfg: &flotilla_config::schema::DataConfig) -> &str {
    use flotilla_config::schema::DataConfig;
    match cfg {
        DataConfig::Chat(c) => c.selection().describe(),
        DataConfig::Jsonl(j) => j.selection().describe(),
        DataConfig::Preference(p) => p.selection().describe(),
        _ => "data",
    }
}
