//! Rotary embeddings as a model config describes them: the rope types ([`RopeType`]) and
//! `model.rope_scaling` ([`RopeScaling`]), which keys of it each rope type reads and requires ([`RopeType::keys`], [`RopeType::required`]), the values
//! transformers fills in when a key is absent ([`ModelConfig::rope_factor`],
//! [`ModelConfig::rope_original_max_position_embeddings`], [`ModelConfig::rotary_dim`]), and
//! the checks ([`ModelConfig::rope_problems`]) that the YAML validation, the `config.json`
//! reader and the model builder share, so that all three refuse the same configs with the same
//! words. The numbers themselves (inverse frequencies, attention scaling) are computed by
//! `flotilla-train`'s `model/layers/rope.rs`.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::from_node::{field, parse_choice, Choice, Cx, Fail, FromNode, Parsed};
use super::hf_config::{HfLlamaConfig, HfRopeParameters};
use super::messages::{alternatives, quote_list};
use super::types::{choice, section, ModelConfig, ModelType};
use crate::node::{python_float_repr, Dict, Node, Value};

choice! {
    /// The rotary-embedding type (Hugging Face `rope_scaling.rope_type`), transformers' names:
    /// what each reads is [`RopeType::keys`], what each computes `flotilla-train`'s `rope.rs`.
    pub enum RopeType {
        Default = "default",
        Linear = "linear",
        Dynamic = "dynamic",
        Yarn = "yarn",
        Longrope = "longrope",
        Llama3 = "llama3",
    }
}

section! {
    /// `model.rope_scaling`: Hugging Face's `rope_scaling` dict, with its keys. Which keys each
    /// `rope_type` reads, requires and defaults is [`RopeType::keys`]'s; a key the type does
    /// not read is refused.
    pub struct RopeScaling {
        rope_type: RopeType,
        /// The context extension: every type but `default` (`yarn`, `longrope`: absent is
        /// `max_position_embeddings / original_max_position_embeddings`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        factor: Option<f64> => "8.0",
        /// `llama3`, `yarn`, `longrope`: the pretraining context; absent:
        /// `max_position_embeddings`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        original_max_position_embeddings: Option<usize> => "8192",
        /// `llama3`: the wavelength bounds of the smoothed band.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        low_freq_factor: Option<f64> => "1.0",
        #[serde(default, skip_serializing_if = "Option::is_none")]
        high_freq_factor: Option<f64> => "4.0",
        /// `yarn`, `longrope`: the factor cos and sin are scaled by; absent: the type's own.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        attention_factor: Option<f64> => "1.0",
        /// `yarn`: the ramp's bounds in rotations (absent: 32 and 1), the attention factor's
        /// `mscale` and `mscale_all_dim`, and whether the ramp's bounds are rounded
        /// (absent: true).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        beta_fast: Option<f64> => "32.0",
        #[serde(default, skip_serializing_if = "Option::is_none")]
        beta_slow: Option<f64> => "1.0",
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mscale: Option<f64> => "1.0",
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mscale_all_dim: Option<f64> => "1.0",
        #[serde(default, skip_serializing_if = "Option::is_none")]
        truncate: Option<bool> => "true",
        /// `longrope`: one divisor per inverse frequency, for sequences up to
        /// `original_max_position_embeddings` and beyond.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        short_factor: Option<Vec<f64>> => "[1.0, 1.0]",
        #[serde(default, skip_serializing_if = "Option::is_none")]
        long_factor: Option<Vec<f64>> => "[1.0, 4.0]",
    }
}

/// One thing wrong with a config's rotary embeddings: the key (under the prefix the caller
/// gave), what is wrong, and how to fix it.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeProblem {
    pub key: String,
    pub problem: String,
    pub fix: String,
}

impl fmt::Display for RopeProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}; {}", self.key, self.problem, self.fix)
    }
}

impl RopeType {
    /// The keys of `rope_scaling` this type reads, besides `rope_type` (transformers'
    /// required and optional keys of `_validate_{type}_rope_parameters`).
    pub fn keys(self) -> &'static [&'static str] {
        match self {
            RopeType::Default => &[],
            RopeType::Linear | RopeType::Dynamic => &["factor"],
            RopeType::Yarn => &[
                "factor",
                "original_max_position_embeddings",
                "attention_factor",
                "beta_fast",
                "beta_slow",
                "mscale",
                "mscale_all_dim",
                "truncate",
            ],
            RopeType::Longrope => &[
                "factor",
                "original_max_position_embeddings",
                "attention_factor",
                "short_factor",
                "long_factor",
            ],
            RopeType::Llama3 => &[
                "factor",
                "original_max_position_embeddings",
                "low_freq_factor",
                "high_freq_factor",
            ],
        }
    }

    /// The keys this type cannot do without (`original_max_position_embeddings` and `yarn`'s
    /// and `longrope`'s `factor` have defaults).
    pub fn required(self) -> &'static [&'static str] {
        match self {
            RopeType::Default => &[],
            RopeType::Linear | RopeType::Dynamic => &["factor"],
            RopeType::Yarn => &[],
            RopeType::Longrope => &["short_factor", "long_factor"],
            RopeType::Llama3 => &["factor", "low_freq_factor", "high_freq_factor"],
        }
    }

    /// The type named `name`, or the error naming the types there are.
    pub fn from_name(name: &str) -> Result<RopeType, String> {
        RopeType::ALL
            .iter()
            .copied()
            .find(|t| t.as_str() == name)
            .ok_or_else(|| {
                let names: Vec<&str> = RopeType::ALL.iter().map(|t| t.as_str()).collect();
                format!(
                    "`{name}` is not a rope type flotilla implements; the types are {}",
                    alternatives(&names, true)
                )
            })
    }
}

impl RopeScaling {
    /// A `rope_type` with none of its keys set.
    pub fn new(rope_type: RopeType) -> Self {
        RopeScaling {
            rope_type,
            factor: None,
            original_max_position_embeddings: None,
            low_freq_factor: None,
            high_freq_factor: None,
            attention_factor: None,
            beta_fast: None,
            beta_slow: None,
            mscale: None,
            mscale_all_dim: None,
            truncate: None,
            short_factor: None,
            long_factor: None,
        }
    }

    /// The keys that are set, in the struct's order.
    pub fn present_keys(&self) -> Vec<&'static str> {
        let set = [
            ("factor", self.factor.is_some()),
            (
                "original_max_position_embeddings",
                self.original_max_position_embeddings.is_some(),
            ),
            ("low_freq_factor", self.low_freq_factor.is_some()),
            ("high_freq_factor", self.high_freq_factor.is_some()),
            ("attention_factor", self.attention_factor.is_some()),
            ("beta_fast", self.beta_fast.is_some()),
            ("beta_slow", self.beta_slow.is_some()),
            ("mscale", self.mscale.is_some()),
            ("mscale_all_dim", self.mscale_all_dim.is_some()),
            ("truncate", self.truncate.is_some()),
            ("short_factor", self.short_factor.is_some()),
            ("long_factor", self.long_factor.is_some()),
        ];
        set.iter().filter(|(_, s)| *s).map(|(k, _)| *k).collect()
    }

    /// This dict with only the keys its type reads (transformers ignores the others).
    pub fn read_keys_only(mut self) -> Self {
        let keys = self.rope_type.keys();
        let keep = |k: &str| keys.contains(&k);
        macro_rules! drop_unread {
            ($($f:ident),+) => { $( if !keep(stringify!($f)) { self.$f = None; } )+ };
        }
        drop_unread!(
            factor,
            original_max_position_embeddings,
            low_freq_factor,
            high_freq_factor,
            attention_factor,
            beta_fast,
            beta_slow,
            mscale,
            mscale_all_dim,
            truncate,
            short_factor,
            long_factor
        );
        self
    }
}

fn example(key: &str) -> &'static str {
    match key {
        "factor" => "8.0",
        "low_freq_factor" => "1.0",
        "high_freq_factor" => "4.0",
        _ => "[1.0, 1.0]",
    }
}

fn finite_positive(v: f64) -> bool {
    v.is_finite() && v > 0.0
}

impl ModelConfig {
    /// `partial_rotary_factor`, 1.0 when absent.
    pub fn partial_rotary(&self) -> f64 {
        self.partial_rotary_factor.unwrap_or(1.0)
    }

    /// The features of each head the rotary embeddings see: transformers'
    /// `int(head_dim * partial_rotary_factor)` (an odd count rotates one more feature, as
    /// transformers' `arange(0, dim, 2)` does).
    pub fn rotary_dim(&self) -> usize {
        (self.head_dim() as f64 * self.partial_rotary()) as usize
    }

    /// The number of inverse frequencies: `ceil(rotary_dim / 2)`.
    pub fn rotary_frequencies(&self) -> usize {
        self.rotary_dim().div_ceil(2)
    }

    /// The pretraining context of `llama3`, `yarn` and `longrope`: `rope_scaling`'s
    /// `original_max_position_embeddings`, else `max_position_embeddings` (transformers'
    /// default).
    pub fn rope_original_max_position_embeddings(&self) -> usize {
        self.rope_scaling
            .as_ref()
            .and_then(|s| s.original_max_position_embeddings)
            .unwrap_or(self.max_position_embeddings)
    }

    /// `rope_scaling.factor`; absent (`yarn`, `longrope`):
    /// `max_position_embeddings / original_max_position_embeddings`, as transformers derives it;
    /// 1.0 without scaling.
    pub fn rope_factor(&self) -> f64 {
        match &self.rope_scaling {
            None => 1.0,
            Some(s) => s.factor.unwrap_or_else(|| {
                self.max_position_embeddings as f64
                    / self.rope_original_max_position_embeddings() as f64
            }),
        }
    }

    /// Everything wrong with the rotary embeddings' settings, keys under `prefix` (`model.` in
    /// a job config, empty for a `config.json`): `partial_rotary_factor` outside (0, 1], a key
    /// the rope type does not read or a required one missing, values out of range, `longrope`
    /// factors not one per inverse frequency.
    pub fn rope_problems(&self, prefix: &str) -> Vec<RopeProblem> {
        let mut out = Vec::new();
        let mut push =
            |key: String, problem: String, fix: String| out.push(RopeProblem { key, problem, fix });
        let partial_key = format!("{prefix}partial_rotary_factor");
        if let Some(f) = self.partial_rotary_factor {
            if !(f.is_finite() && f > 0.0 && f <= 1.0) {
                push(
                    partial_key.clone(),
                    format!(
                        "must be above 0 and at most 1, got {}",
                        python_float_repr(f)
                    ),
                    format!("set {partial_key} in (0, 1] (Phi-4-mini uses 0.75), or remove it"),
                );
            } else if self.rotary_dim() < 2 {
                push(
                    partial_key.clone(),
                    format!(
                        "rotates int({} * {}) = {} features of each head; rotary embeddings \
                         need at least 2",
                        self.head_dim(),
                        python_float_repr(f),
                        self.rotary_dim()
                    ),
                    format!("raise {partial_key}"),
                );
            }
        }
        let Some(s) = &self.rope_scaling else {
            return out;
        };
        let t = s.rope_type;
        let key = |k: &str| format!("{prefix}rope_scaling.{k}");
        let reads = t.keys();
        for k in s.present_keys() {
            if !reads.contains(&k) {
                let what = if reads.is_empty() {
                    "no other keys".to_string()
                } else {
                    alternatives(reads, false)
                };
                push(
                    key(k),
                    format!("is not read by rope_type {t}"),
                    format!("remove it (rope_type {t} reads {what})"),
                );
            }
        }
        let present = s.present_keys();
        for k in t.required() {
            if !present.contains(k) {
                push(
                    key(k),
                    format!("is missing; rope_type {t} requires it"),
                    format!("add it, e.g. {}={}", key(k), example(k)),
                );
            }
        }
        if let Some(f) = s.factor {
            if !(f.is_finite() && f >= 1.0) {
                push(
                    key("factor"),
                    format!("must be at least 1, got {}", python_float_repr(f)),
                    format!("set {}=1.0 or more (Llama 3.1 uses 8.0)", key("factor")),
                );
            }
        }
        if s.original_max_position_embeddings == Some(0) {
            let k = key("original_max_position_embeddings");
            push(
                k.clone(),
                "must be at least 1, got 0".into(),
                format!("set {k} to the pretraining context (e.g. 8192)"),
            );
        }
        if let (Some(low), Some(high)) = (s.low_freq_factor, s.high_freq_factor) {
            if !finite_positive(low) {
                push(
                    key("low_freq_factor"),
                    format!("must be a positive number, got {}", python_float_repr(low)),
                    format!("set {} to a number above 0", key("low_freq_factor")),
                );
            } else if !(high.is_finite() && high > low) {
                push(
                    key("high_freq_factor"),
                    format!(
                        "{} must be above {} ({})",
                        python_float_repr(high),
                        key("low_freq_factor"),
                        python_float_repr(low)
                    ),
                    "raise it (Llama 3 uses low 1.0, high 4.0)".into(),
                );
            }
        }
        if let Some(a) = s.attention_factor {
            if !finite_positive(a) {
                push(
                    key("attention_factor"),
                    format!("must be a positive number, got {}", python_float_repr(a)),
                    format!(
                        "set {} above 0, or remove it for the type's own",
                        key("attention_factor")
                    ),
                );
            }
        }
        for (k, v) in [
            ("beta_fast", s.beta_fast),
            ("beta_slow", s.beta_slow),
            ("mscale", s.mscale),
            ("mscale_all_dim", s.mscale_all_dim),
        ] {
            if let Some(v) = v.filter(|v| !v.is_finite()) {
                push(
                    key(k),
                    format!("must be a finite number, got {}", python_float_repr(v)),
                    format!("set {} to a number, or remove it", key(k)),
                );
            }
        }
        let n = self.rotary_frequencies();
        for (k, list) in [
            ("short_factor", &s.short_factor),
            ("long_factor", &s.long_factor),
        ] {
            let Some(list) = list else { continue };
            if list.len() != n {
                push(
                    key(k),
                    format!(
                        "has {} values; rope_type longrope needs one per inverse frequency, {n} \
                         (int(head_dim {} * partial_rotary_factor {}) / 2)",
                        list.len(),
                        self.head_dim(),
                        python_float_repr(self.partial_rotary())
                    ),
                    format!("give {} {n} values", key(k)),
                );
            } else if let Some(v) = list.iter().find(|v| !finite_positive(**v)) {
                push(
                    key(k),
                    format!(
                        "holds {}; each must be a positive number",
                        python_float_repr(*v)
                    ),
                    format!("fix {}", key(k)),
                );
            }
        }
        if t == RopeType::Dynamic && self.rotary_dim() <= 2 {
            push(
                key("rope_type"),
                format!(
                    "dynamic scaling needs more than 2 rotary features per head, the model has {}",
                    self.rotary_dim()
                ),
                "use another rope_type, or a larger head".into(),
            );
        }
        out
    }

    /// The first of [`ModelConfig::rope_problems`], if any.
    pub fn check_rope(&self, prefix: &str) -> Result<(), RopeProblem> {
        match self.rope_problems(prefix).into_iter().next() {
            Some(p) => Err(p),
            None => Ok(()),
        }
    }
}

/// The rotary settings a `config.json` gives, as transformers reads them.
pub(super) struct HfRope {
    pub rope_theta: f64,
    pub rope_scaling: Option<RopeScaling>,
    pub partial_rotary_factor: Option<f64>,
    /// Where the scaling dict was read from (`rope_parameters` or `rope_scaling`), for errors.
    pub field: &'static str,
}

/// Phi-3's `original_max_position_embeddings` when its `config.json` gives none
/// (`Phi3Config`'s default).
const PHI3_ORIGINAL_MAX_POSITIONS: usize = 4096;

/// Reads the rotary settings of `hf` as transformers' `standardize_rope_params` does:
/// `rope_parameters` (transformers 5) wins over the legacy `rope_scaling`, each with `rope_type`
/// or its older spelling `type`; `rope_theta` from `rope_parameters`, else top-level, else
/// 10000; `partial_rotary_factor` from the dict, else top-level; `original_max_position_embeddings`
/// from the dict, else `max_position_embeddings` (Phi-3: its top-level one or 4096, which wins
/// over the dict's but for `su`); keys the type does not read are dropped, as transformers
/// ignores them. Phi-3's older names `su` and `yarn` are its `longrope`. Errors: the field and
/// the message.
pub(super) fn hf_rope(hf: &HfLlamaConfig) -> Result<HfRope, (String, String)> {
    let (dict, field) = match (&hf.rope_parameters, &hf.rope_scaling) {
        (Some(p), _) => (Some(p), "rope_parameters"),
        (None, Some(s)) => (Some(s), "rope_scaling"),
        (None, None) => (None, "rope_scaling"),
    };
    let rope_theta = hf
        .rope_parameters
        .as_ref()
        .and_then(|p| p.rope_theta)
        .or(hf.rope_theta)
        .unwrap_or(10000.0);
    let partial_rotary_factor = dict
        .and_then(|p| p.partial_rotary_factor)
        .or(hf.partial_rotary_factor);
    let phi3 = hf.model_type.as_deref() == Some("phi3");
    let rope_scaling = match dict {
        None => None,
        Some(p) => {
            let written = p
                .rope_type
                .as_deref()
                .or(p.legacy_type.as_deref())
                .unwrap_or("default");
            let name = match written {
                "su" | "yarn" if phi3 => "longrope",
                other => other,
            };
            let rope_type =
                RopeType::from_name(name).map_err(|m| (format!("{field}.rope_type"), m))?;
            let phi3_original = hf
                .original_max_position_embeddings
                .unwrap_or(PHI3_ORIGINAL_MAX_POSITIONS);
            let original = match p.original_max_position_embeddings {
                // Phi-3's own wins over the dict's, but for `su`, which it renames only after.
                _ if phi3 && written != "su" => phi3_original,
                Some(o) => o,
                None if phi3 => phi3_original,
                None => hf.max_position_embeddings,
            };
            let s = RopeScaling {
                rope_type,
                factor: p.factor,
                original_max_position_embeddings: Some(original),
                low_freq_factor: p.low_freq_factor,
                high_freq_factor: p.high_freq_factor,
                attention_factor: p.attention_factor,
                beta_fast: p.beta_fast,
                beta_slow: p.beta_slow,
                mscale: p.mscale,
                mscale_all_dim: p.mscale_all_dim,
                truncate: p.truncate,
                short_factor: p.short_factor.clone(),
                long_factor: p.long_factor.clone(),
            }
            .read_keys_only();
            (rope_type != RopeType::Default).then_some(s)
        }
    };
    Ok(HfRope {
        rope_theta,
        rope_scaling,
        partial_rotary_factor,
        field,
    })
}

/// [`ModelConfig::check_rope`] of a config read from a `config.json` whose scaling dict was
/// `field`: the key and message as that file names them.
pub(super) fn check_hf_rope(c: &ModelConfig, field: &str) -> Result<(), (String, String)> {
    c.check_rope("").map_err(|p| {
        let rename = |s: &str| s.replace("rope_scaling.", &format!("{field}."));
        (rename(&p.key), rename(&format!("{}; {}", p.problem, p.fix)))
    })
}

/// Phi-3's top-level `original_max_position_embeddings`, which transformers' `Phi3Config` takes
/// over the scaling dict's: written beside the dict's, so that both say the same.
pub(super) fn hf_phi3_original_max(c: &ModelConfig) -> Option<usize> {
    let reads = c.rope_scaling.as_ref().is_some_and(|s| {
        s.rope_type
            .keys()
            .contains(&"original_max_position_embeddings")
    });
    (c.architecture() == ModelType::Phi3 && reads)
        .then(|| c.rope_original_max_position_embeddings())
}

/// The legacy `rope_scaling` dict of `c` (which transformers 4 and 5 both read): its type and
/// the keys it sets, with the pretraining context and, for `yarn` (whose `factor` transformers
/// requires), the factor written out as resolved.
pub(super) fn hf_rope_scaling(c: &ModelConfig) -> Option<HfRopeParameters> {
    let s = c.rope_scaling.as_ref()?;
    let reads = |k: &str| s.rope_type.keys().contains(&k);
    Some(HfRopeParameters {
        rope_type: Some(s.rope_type.as_str().into()),
        factor: match s.rope_type {
            RopeType::Yarn => Some(c.rope_factor()),
            _ => s.factor,
        },
        original_max_position_embeddings: reads("original_max_position_embeddings")
            .then(|| c.rope_original_max_position_embeddings()),
        low_freq_factor: s.low_freq_factor,
        high_freq_factor: s.high_freq_factor,
        attention_factor: s.attention_factor,
        beta_fast: s.beta_fast,
        beta_slow: s.beta_slow,
        mscale: s.mscale,
        mscale_all_dim: s.mscale_all_dim,
        truncate: s.truncate,
        short_factor: s.short_factor.clone(),
        long_factor: s.long_factor.clone(),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::from_node::{read, Cx};
    use super::*;
    use crate::node::{Node, Origin, Value};

    /// A `config.json` of a 4-head, head_dim 16 model with `extra` keys.
    fn hf(extra: &str) -> Result<ModelConfig, String> {
        let text = format!(
            r#"{{"vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
               "num_hidden_layers": 2, "num_attention_heads": 4,
               "max_position_embeddings": 256{extra}}}"#
        );
        let hf = HfLlamaConfig::from_json(&text, Path::new("config.json")).unwrap();
        ModelConfig::try_from(&hf).map_err(|e| e.to_string())
    }

    fn round_trip(c: &ModelConfig) {
        let text = serde_json::to_string(&HfLlamaConfig::from(c)).unwrap();
        let hf = HfLlamaConfig::from_json(&text, Path::new("config.json")).unwrap();
        assert_eq!(&ModelConfig::try_from(&hf).unwrap(), c, "{text}");
    }

    fn tree(j: &serde_json::Value) -> Node {
        use serde_json::Value as J;
        let value = match j {
            J::Null => Value::Null,
            J::Bool(b) => Value::Bool(*b),
            J::Number(n) => match n.as_i64() {
                Some(i) => Value::Int(i),
                None => Value::Float(n.as_f64().unwrap()),
            },
            J::String(s) => Value::Str(s.clone()),
            J::Array(items) => Value::List(items.iter().map(tree).collect()),
            J::Object(m) => Value::Dict(m.iter().map(|(k, v)| (k.clone(), tree(v))).collect()),
        };
        Node::new(value, Origin::Unknown)
    }

    /// `model.rope_scaling` read from YAML as the job config reads it, and the problems of a
    /// 4-head, head_dim 16 model that has it; or the reading's messages.
    fn yaml(text: &str) -> Result<Vec<String>, Vec<String>> {
        let j: serde_json::Value = serde_yaml::from_str(text).unwrap();
        let mut cx = Cx::default();
        let Some(s) = read::<RopeScaling>(&tree(&j), "model.rope_scaling", None, &mut cx) else {
            return Err(cx.problems.into_iter().map(|p| p.message).collect());
        };
        let c = hf("").unwrap();
        let c = ModelConfig {
            rope_scaling: Some(s),
            ..c
        };
        Ok(c.rope_problems("model.")
            .iter()
            .map(ToString::to_string)
            .collect())
    }

    #[test]
    fn each_type_reads_its_keys_with_transformers_defaults() {
        let c = hf(r#", "rope_scaling": {"type": "linear", "factor": 2.0}"#).unwrap();
        let s = c.rope_scaling.clone().unwrap();
        assert_eq!((s.rope_type, s.factor), (RopeType::Linear, Some(2.0)));
        // Keys the type does not read are dropped, as transformers ignores them.
        assert_eq!(s.original_max_position_embeddings, None);
        round_trip(&c);

        let c = hf(
            r#", "rope_parameters": {"rope_type": "dynamic", "factor": 2.0,
                       "rope_theta": 500.0, "low_freq_factor": 3.0}"#,
        )
        .unwrap();
        assert_eq!(c.rope_theta, 500.0);
        assert_eq!(c.rope_scaling.as_ref().unwrap().present_keys(), ["factor"]);
        round_trip(&c);

        // yarn: factor absent is max / original; original absent is max_position_embeddings.
        let c = hf(r#", "rope_scaling": {"rope_type": "yarn", "original_max_position_embeddings": 64,
                       "beta_fast": 16, "mscale": 0.707, "mscale_all_dim": 1.0, "truncate": false}"#)
        .unwrap();
        assert_eq!(c.rope_factor(), 4.0);
        let s = c.rope_scaling.clone().unwrap();
        assert_eq!(
            (s.beta_fast, s.mscale, s.truncate),
            (Some(16.0), Some(0.707), Some(false))
        );
        let written = HfLlamaConfig::from(&c).rope_scaling.unwrap();
        assert_eq!(written.factor, Some(4.0), "yarn's factor is written out");
        let c = hf(r#", "rope_scaling": {"type": "yarn", "factor": 4.0}"#).unwrap();
        assert_eq!(c.rope_original_max_position_embeddings(), 256);
        round_trip(&c);

        let c = hf(r#", "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                       "low_freq_factor": 1.0, "high_freq_factor": 4.0}"#)
        .unwrap();
        assert_eq!(c.rope_original_max_position_embeddings(), 256);
        round_trip(&c);

        let longrope = r#", "rope_scaling": {"rope_type": "longrope", "short_factor":
            [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7], "long_factor":
            [2.0, 2.1, 2.2, 2.3, 2.4, 2.5, 2.6, 2.7], "original_max_position_embeddings": 64}"#;
        let c = hf(longrope).unwrap();
        let s = c.rope_scaling.clone().unwrap();
        assert_eq!(s.long_factor.as_ref().unwrap()[7], 2.7);
        assert_eq!(c.rope_factor(), 4.0, "max / original when factor is absent");
        round_trip(&c);
    }

    #[test]
    fn phi3_reads_its_older_names_and_its_own_context() {
        let factors = r#""short_factor": [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
                         "long_factor": [2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0]"#;
        let c = hf(&format!(
            r#", "model_type": "phi3", "rope_scaling": {{"type": "su", {factors}}}"#
        ))
        .unwrap();
        let s = c.rope_scaling.as_ref().unwrap();
        assert_eq!(s.rope_type, RopeType::Longrope);
        assert_eq!(c.rope_original_max_position_embeddings(), 4096);
        // Written back as longrope with the context it read.
        let written = HfLlamaConfig::from(&c).rope_scaling.unwrap();
        assert_eq!(written.rope_type.as_deref(), Some("longrope"));
        assert_eq!(written.original_max_position_embeddings, Some(4096));
        round_trip(&c);
        for (extra, want) in [
            (
                r#""type": "longrope", "original_max_position_embeddings": 16"#,
                32,
            ),
            (
                r#""type": "yarn", "original_max_position_embeddings": 16"#,
                32,
            ),
            (
                r#""type": "su", "original_max_position_embeddings": 16"#,
                16,
            ),
        ] {
            let c = hf(&format!(
                r#", "model_type": "phi3", "original_max_position_embeddings": 32,
                   "rope_scaling": {{{extra}, {factors}}}"#
            ))
            .unwrap();
            assert_eq!(c.rope_original_max_position_embeddings(), want, "{extra}");
            assert_eq!(
                c.rope_scaling.as_ref().unwrap().rope_type,
                RopeType::Longrope
            );
            round_trip(&c);
        }
        let llama = hf(&format!(
            r#", "original_max_position_embeddings": 64,
               "rope_scaling": {{"type": "longrope", {factors}}}"#
        ))
        .unwrap();
        assert_eq!(
            llama.rope_original_max_position_embeddings(),
            256,
            "Llama reads no top-level original_max_position_embeddings"
        );
        let err = hf(&format!(r#", "rope_scaling": {{"type": "su", {factors}}}"#)).unwrap_err();
        assert!(err.contains("`su`"), "{err}");
    }

    #[test]
    fn partial_rotary_factor_is_read_from_both_places_and_written_back() {
        let c = hf(r#", "model_type": "phi3", "partial_rotary_factor": 0.5"#).unwrap();
        assert_eq!((c.partial_rotary_factor, c.rotary_dim()), (Some(0.5), 8));
        assert_eq!(c.rotary_frequencies(), 4);
        round_trip(&c);
        let c = hf(
            r#", "model_type": "phi3", "partial_rotary_factor": 0.5, "rope_parameters": {"rope_type": "default",
                       "rope_theta": 10000.0, "partial_rotary_factor": 0.75}"#,
        )
        .unwrap();
        assert_eq!((c.partial_rotary_factor, c.rotary_dim()), (Some(0.75), 12));
        let text = serde_json::to_string(&HfLlamaConfig::from(&c)).unwrap();
        assert!(text.contains(r#""partial_rotary_factor":0.75"#), "{text}");
        round_trip(&c);
        // An odd rotary width rotates one feature more, as transformers' arange(0, dim, 2).
        let c = hf(r#", "model_type": "phi3", "partial_rotary_factor": 0.3"#).unwrap();
        assert_eq!((c.rotary_dim(), c.rotary_frequencies()), (4, 2));
        let c = hf(r#", "model_type": "phi3", "partial_rotary_factor": 0.35"#).unwrap();
        assert_eq!((c.rotary_dim(), c.rotary_frequencies()), (5, 3));

        let err = hf(r#", "model_type": "phi3", "partial_rotary_factor": 1.5"#).unwrap_err();
        assert!(
            err.contains("field `partial_rotary_factor`") && err.contains("got 1.5"),
            "{err}"
        );
        let err = hf(r#", "model_type": "phi3", "partial_rotary_factor": 0.1"#).unwrap_err();
        assert!(err.contains("int(16 * 0.1) = 1 features"), "{err}");
    }

    #[test]
    fn a_type_transformers_does_not_know_is_refused_naming_the_known_ones() {
        for (extra, field) in [
            (
                r#", "rope_scaling": {"rope_type": "ntk", "factor": 2.0}"#,
                "rope_scaling",
            ),
            (
                r#", "rope_parameters": {"type": "proportional"}"#,
                "rope_parameters",
            ),
        ] {
            let err = hf(extra).unwrap_err();
            assert!(
                err.contains(&format!("field `{field}.rope_type`"))
                    && err
                        .contains("'default', 'linear', 'dynamic', 'yarn', 'longrope' or 'llama3'"),
                "{err}"
            );
        }
        let err = yaml("{rope_type: ntk, factor: 2.0}").unwrap_err();
        assert!(
            err[0].contains("model.rope_scaling.rope_type")
                && err[0].contains("'default', 'linear', 'dynamic', 'yarn', 'longrope', 'llama3'"),
            "{err:?}"
        );
    }

    #[test]
    fn required_keys_are_named_with_the_fix() {
        for (dict, key) in [
            (r#"{"rope_type": "linear"}"#, "factor"),
            (r#"{"type": "dynamic"}"#, "factor"),
            (
                r#"{"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0}"#,
                "low_freq_factor",
            ),
            (
                r#"{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}"#,
                "high_freq_factor",
            ),
            (
                r#"{"rope_type": "longrope", "long_factor": [1, 1, 1, 1, 1, 1, 1, 1]}"#,
                "short_factor",
            ),
            (
                r#"{"rope_type": "longrope", "short_factor": [1, 1, 1, 1, 1, 1, 1, 1]}"#,
                "long_factor",
            ),
        ] {
            for field in ["rope_scaling", "rope_parameters"] {
                let err = hf(&format!(r#", "{field}": {dict}"#)).unwrap_err();
                assert!(
                    err.contains(&format!("field `{field}.{key}`: is missing; rope_type"))
                        && err.contains(&format!("add it, e.g. {field}.{key}=")),
                    "{err}"
                );
            }
        }
        let problems = yaml("{rope_type: linear}").unwrap();
        assert_eq!(
            problems,
            ["model.rope_scaling.factor: is missing; rope_type linear requires it; add it, e.g. \
              model.rope_scaling.factor=8.0"]
        );
        assert_eq!(yaml("{rope_type: yarn}").unwrap(), Vec::<String>::new());
    }

    #[test]
    fn values_out_of_range_and_unread_keys_are_refused() {
        let err = hf(r#", "rope_scaling": {"rope_type": "linear", "factor": 0.5}"#).unwrap_err();
        assert!(
            err.contains("`rope_scaling.factor`: must be at least 1, got 0.5"),
            "{err}"
        );
        let err = hf(r#", "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                         "low_freq_factor": 4.0, "high_freq_factor": 1.0}"#)
        .unwrap_err();
        assert!(
            err.contains("`rope_scaling.high_freq_factor`: 1.0 must be above rope_scaling.low_freq_factor (4.0)"),
            "{err}"
        );
        let err = hf(r#", "rope_parameters": {"rope_type": "longrope",
                         "short_factor": [1.0, 1.0], "long_factor": [1, 1, 1, 1, 1, 1, 1, 1]}"#)
        .unwrap_err();
        assert!(
            err.contains(
                "`rope_parameters.short_factor`: has 2 values; rope_type longrope needs \
                          one per inverse frequency, 8"
            ),
            "{err}"
        );
        let err = hf(
            r#", "partial_rotary_factor": 0.5, "rope_scaling": {"rope_type": "longrope",
                         "short_factor": [1, 1, 1, 1, 1, 1, 1, 1], "long_factor": [1, 1, 1, 1]}"#,
        )
        .unwrap_err();
        assert!(
            err.contains("`rope_scaling.short_factor`: has 8 values"),
            "{err}"
        );
        let err = hf(r#", "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                         "attention_factor": -1.0}"#)
        .unwrap_err();
        assert!(err.contains("`rope_scaling.attention_factor`"), "{err}");

        // In a job config, a key the type does not read is refused (config.json's are dropped).
        let problems =
            yaml("{rope_type: linear, factor: 2.0, low_freq_factor: 1.0, beta_fast: 8}").unwrap();
        assert_eq!(
            problems,
            [
                "model.rope_scaling.low_freq_factor: is not read by rope_type linear; remove it \
                 (rope_type linear reads factor)",
                "model.rope_scaling.beta_fast: is not read by rope_type linear; remove it \
                 (rope_type linear reads factor)",
            ]
        );
        let problems = yaml("{rope_type: default, factor: 2.0}").unwrap();
        assert!(
            problems[0].contains("(rope_type default reads no other keys)"),
            "{problems:?}"
        );
        let err = yaml("{rope_type: longrope, short_factor: [1, x]}").unwrap_err();
        assert!(
            err[0].contains("model.rope_scaling.short_factor[1]"),
            "{err:?}"
        );
    }

    #[test]
    fn the_shipped_llama3_presets_read_as_before() {
        for (text, factor) in [
            (include_str!("../../../../conf/model/llama-8b.yaml"), 8.0),
            (include_str!("../../../../conf/model/llama-1b.yaml"), 32.0),
        ] {
            let j: serde_yaml::Value = serde_yaml::from_str(text).unwrap();
            let rope = serde_yaml::to_string(&j["rope_scaling"]).unwrap();
            assert_eq!(yaml(&rope).unwrap(), Vec::<String>::new());
            let s: RopeScaling = serde_yaml::from_str(&rope).unwrap();
            assert_eq!(
                (s.rope_type, s.factor, s.low_freq_factor, s.high_freq_factor),
                (RopeType::Llama3, Some(factor), Some(1.0), Some(4.0))
            );
            assert_eq!(s.original_max_position_embeddings, Some(8192));
            // Serialised with the keys it has only.
            let back = serde_json::to_string(&s).unwrap();
            assert!(
                !back.contains("null") && !back.contains("beta_fast"),
                "{back}"
            );
        }
    }
}
