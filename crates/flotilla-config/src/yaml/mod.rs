//! YAML in and out, as Hydra reads and OmegaConf writes it.
//!
//! Reading follows PyYAML's SafeLoader with OmegaConf's adjustments: YAML 1.1 plain scalars
//! (`yes`/`no`/`on`/`off` are booleans, `0x1F`/`0o17`/`017`/`1_000` are integers, `1e-4` and
//! `.5` are floats), no timestamps, duplicate keys rejected, anchors, aliases and `<<` merge keys
//! honoured, `???` as the missing value. Every node records the file and line it came from.
//! Hydra's `# @package` header is read from the comment lines at the top of a file.
//! Writing follows `OmegaConf.to_yaml`: PyYAML's block style, insertion order, strings quoted
//! when they would otherwise read back as another type.
//!
//! This module owns the public YAML surface; the work lives in three parts: `load` (the loader
//! with provenance, the `# @package` header and the alias-bomb bound), `scalars` (YAML 1.1
//! scalar resolution) and `emit` (the OmegaConf-style emitter).

mod emit;
mod load;
mod scalars;

pub use emit::{scalar_text, to_yaml, yaml_float_text, EmitOptions};
pub use load::{load_str, parse_header, Header, YamlError, MAX_DOCUMENT_COST};
pub use scalars::{parse_yaml11_float, parse_yaml11_int, plain_scalar, yaml11_bool};
