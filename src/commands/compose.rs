//! `flotilla compose`: the resolved config of one job, as YAML or JSON, with provenance.

use anyhow::Context;
use clap::{Args, ValueEnum};
use flotilla_config::node::{to_json_text, Node, Value};
use flotilla_config::yaml::{to_yaml, EmitOptions};

use super::{write_stdout, ConfigArgs, Failure};

pub const COMPOSE_EXAMPLES: &str =
    "Overrides use Hydra's grammar: key=value sets a value, +key=value adds one, ++key=value adds \
or replaces, ~key deletes, group=option picks a config group option.

Examples:
  flotilla compose
  flotilla compose model=small trainer.lr=3e-4 --provenance
  flotilla compose trainer/dist=fsdp '+tags=[a,b]' --format json";

#[derive(Args)]
pub struct ComposeArgs {
    #[command(flatten)]
    config: ConfigArgs,
    #[arg(long, value_enum, default_value_t = ComposeFormat::Yaml)]
    format: ComposeFormat,
    /// Show where every value came from (file:line or override).
    #[arg(long)]
    provenance: bool,
    /// Overrides: key=value, +key=value, ++key=value, ~key, group=option, ...
    overrides: Vec<String>,
}

#[derive(Clone, Copy, ValueEnum)]
enum ComposeFormat {
    Yaml,
    Json,
}

pub fn compose(args: ComposeArgs) -> Result<(), Failure> {
    let composed = args
        .config
        .composer(&super::settings()?)?
        .compose(&args.overrides)?;
    let text = match args.format {
        ComposeFormat::Yaml => to_yaml(
            &composed.job,
            EmitOptions {
                provenance: args.provenance,
            },
        ),
        ComposeFormat::Json => {
            let config = to_json_text(&composed.job, Some(2));
            if args.provenance {
                let mut map = serde_json::Map::new();
                provenance_map(&composed.job, "", &mut map);
                let map = serde_json::to_string_pretty(&map).context("JSON output")?;
                format!("{{\"config\": {config},\n\"provenance\": {map}}}\n")
            } else {
                format!("{config}\n")
            }
        }
    };
    write_stdout(&text)
}

/// Every leaf's dotted path and origin.
fn provenance_map(node: &Node, prefix: &str, out: &mut serde_json::Map<String, serde_json::Value>) {
    match &node.value {
        Value::Dict(d) if !d.is_empty() => {
            for (k, v) in d {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                provenance_map(v, &p, out);
            }
        }
        Value::List(items) if !items.is_empty() => {
            for (i, v) in items.iter().enumerate() {
                provenance_map(v, &format!("{prefix}[{i}]"), out);
            }
        }
        _ => {
            out.insert(
                prefix.to_string(),
                serde_json::Value::String(node.origin.to_string()),
            );
        }
    }
}
