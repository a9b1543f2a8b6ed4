//! `trainer.max_shard_size`: the largest weights file of a job's `final/`, read as transformers
//! and the Hub write sizes (`"50GB"`, `"2GiB"`, a number of bytes), from a config node and
//! through serde alike.

use serde::{Deserialize, Serialize};

use super::from_node::{Cx, Fail, FromNode, Parsed};
use super::messages::{set_note, show};
use super::ProblemKind;
use crate::node::{Node, Value};

/// `trainer.max_shard_size` when the config does not set it: transformers' own default for
/// `save_pretrained` (5.x).
pub const DEFAULT_MAX_SHARD_SIZE: u64 = 50_000_000_000;

/// `trainer.max_shard_size`: the largest weights file of `final/`, in bytes. Written as
/// transformers and the Hub write it: `50GB`, `500MB` (powers of 1000: TB, GB, MB, KB), `2GiB`
/// (powers of 1024: TiB, GiB, MiB, KiB), or a number of bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct ShardSize(pub u64);

impl<'de> Deserialize<'de> for ShardSize {
    /// A number of bytes, or a size with its unit as the config writes it (`"50GB"`).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Bytes(u64),
            Text(String),
        }
        match Written::deserialize(d)? {
            Written::Bytes(n) if n > 0 => Ok(ShardSize(n)),
            Written::Bytes(_) => Err(serde::de::Error::custom("a shard size must be positive")),
            Written::Text(t) => ShardSize::parse(&t).ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "`{t}` is not a size such as '5GB', '500MB' or '2GiB'"
                ))
            }),
        }
    }
}

impl ShardSize {
    /// The bytes of a size written with a unit (`"5GB"`, `"1.5GiB"`) or without (`"1000"`).
    pub fn parse(text: &str) -> Option<ShardSize> {
        let t = text.trim();
        let units: [(&str, f64); 8] = [
            ("TIB", 1024f64.powi(4)),
            ("GIB", 1024f64.powi(3)),
            ("MIB", 1024f64.powi(2)),
            ("KIB", 1024.0),
            ("TB", 1e12),
            ("GB", 1e9),
            ("MB", 1e6),
            ("KB", 1e3),
        ];
        let upper = t.to_ascii_uppercase();
        let (number, scale) = units
            .iter()
            .find(|(u, _)| upper.ends_with(u))
            .map_or((t, 1.0), |(u, m)| (t[..t.len() - u.len()].trim(), *m));
        let value: f64 = number.parse().ok()?;
        let bytes = value * scale;
        (bytes.is_finite() && bytes >= 1.0).then_some(ShardSize(bytes as u64))
    }
}

impl FromNode for ShardSize {
    fn expected() -> String {
        "a size such as '5GB', '500MB' or '2GiB', or a number of bytes".into()
    }
    fn example() -> String {
        "50GB".into()
    }
    fn parse(node: &Node, key: &str, cx: &mut Cx) -> Parsed<Self> {
        let parsed = match &node.value {
            Value::Int(n) if *n > 0 => Some(ShardSize(*n as u64)),
            Value::Str(s) => ShardSize::parse(s),
            Value::Int(_) => None,
            _ => return Err(Fail::WrongType),
        };
        parsed.ok_or_else(|| {
            let message = format!(
                "{key}: expected {}, got {}{}",
                Self::expected(),
                show(&node.value),
                set_note(&node.origin)
            );
            cx.push(ProblemKind::BadChoice, key, &node.origin, message);
            Fail::Reported
        })
    }
}
