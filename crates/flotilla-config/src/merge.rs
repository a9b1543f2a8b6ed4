//! OmegaConf's merge of one config tree into another ([`merge_into`]): what composition does
//! with each config of the defaults list, and what the schema does to lay a job's `compute`
//! over the built-in defaults. It needs only the tree itself ([`crate::node`]).

use crate::node::{Node, Value};

/// OmegaConf's merge of `src` into `dest`: dictionaries merge key by key (new keys appended,
/// existing keys keep their position), everything else replaces, a `???` in `src` never
/// replaces an existing value, and a dictionary and a list cannot be merged into each other.
/// On error, returns the dotted path of the clash.
pub fn merge_into(dest: &mut Node, src: Node) -> Result<(), String> {
    match (&mut dest.value, src.value) {
        (Value::Dict(d), Value::Dict(s)) => {
            for (key, value) in s {
                match d.get_mut(&key) {
                    Some(existing) => {
                        if value.value == Value::Missing {
                            continue;
                        }
                        merge_into(existing, value).map_err(|p| {
                            if p.is_empty() {
                                key.clone()
                            } else {
                                format!("{key}.{p}")
                            }
                        })?;
                    }
                    None => {
                        d.insert(key, value);
                    }
                }
            }
            Ok(())
        }
        (Value::Dict(_), Value::List(_)) | (Value::List(_), Value::Dict(_)) => Err(String::new()),
        (current, Value::Missing) if !matches!(current, Value::Missing) => Ok(()),
        (_, value) => {
            dest.value = value;
            dest.origin = src.origin;
            Ok(())
        }
    }
}
