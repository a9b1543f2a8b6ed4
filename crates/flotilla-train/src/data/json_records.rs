//! The records of a JSON data file: the lines of a `.jsonl` file or the items of a `.json`
//! array, each with its place (line or item number) for error messages.

use std::path::Path;

use serde_json::Value;

use super::error::{DataError, Result};

/// A record (or why its line is not JSON) with its line number (`.jsonl`) or 1-based item
/// number (`.json` array).
pub type Placed = (usize, std::result::Result<Value, String>);

/// Reads `path` (`key`: its config key) into its records. Blank lines are skipped; a line
/// that is not JSON is kept as its parse error, so that the caller decides whether to skip it.
pub fn read_json_records(key: &str, path: &Path) -> Result<Vec<Placed>> {
    let bytes = std::fs::read(path).map_err(|e| DataError::open(key, path, e))?;
    let text = std::str::from_utf8(&bytes).map_err(|e| DataError::NotUtf8 {
        path: path.to_path_buf(),
        offset: e.valid_up_to(),
    })?;
    if path.extension().is_some_and(|e| e == "json") {
        let value: Value = serde_json::from_str(text).map_err(|e| DataError::ChatRecord {
            path: path.to_path_buf(),
            place: format!(":{}", e.line()),
            message: format!("invalid JSON: {e}"),
        })?;
        let Value::Array(items) = value else {
            return Err(DataError::ChatRecord {
                path: path.to_path_buf(),
                place: String::new(),
                message: "a .json data file must hold an array of records (use .jsonl for one \
                          record per line)"
                    .into(),
            });
        };
        return Ok(items
            .into_iter()
            .enumerate()
            .map(|(i, v)| (i + 1, Ok(v)))
            .collect());
    }
    Ok(text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            (
                i + 1,
                serde_json::from_str(l).map_err(|e| format!("invalid JSON: {e}")),
            )
        })
        .collect())
}
