//! A model's weights split into the files of a Hugging Face directory as `save_pretrained`
//! splits them (huggingface_hub's `split_state_dict_into_shards`): tensors in order, a file
//! closed when the next tensor would take it past the largest size, a tensor larger than that
//! alone in its own file; `model.safetensors` when one file holds them all, else
//! `model-0000k-of-0000n.safetensors` with `model.safetensors.index.json` (`metadata`:
//! `total_parameters` and `total_size`; `weight_map`: tensor → file). [`ShardedWriter`] writes
//! every file of such a plan at once as the tensors arrive in order, each through a temporary
//! file renamed when complete, so no host holds more than the tensor being written and nothing
//! half-written is left behind.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tch::{Kind, Tensor};

use crate::safetensors_io::{SafetensorsError, SafetensorsWriter};

/// One tensor of a plan: its name, the dtype it is written in and its shape.
pub type PlannedTensor = (String, Kind, Vec<i64>);

/// Parameter `name` (of `shape`, written in `kind`) as a Hugging Face weights file's tensors.
pub fn hub_planned(name: &str, kind: Kind, shape: &[i64]) -> Vec<PlannedTensor> {
    crate::model::names::file_tensors_of(name, shape)
        .into_iter()
        .map(|t| (t.name, kind, t.shape))
        .collect()
}

/// The files a plan writes: each file's name and the indices of its tensors (in order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardPlan {
    pub files: Vec<(String, Vec<usize>)>,
    /// Bytes of every tensor.
    pub total_size: u64,
}

fn bytes_of(kind: Kind, shape: &[i64]) -> u64 {
    shape.iter().product::<i64>() as u64 * kind.elt_size_in_bytes() as u64
}

/// The files of `stem` (`model`) for `tensors` with at most `max_bytes` a file (a larger tensor
/// alone in its own file).
pub fn plan(stem: &str, tensors: &[PlannedTensor], max_bytes: u64) -> ShardPlan {
    let mut shards: Vec<Vec<usize>> = vec![];
    let (mut current, mut current_size, mut total) = (vec![], 0u64, 0u64);
    for (i, (_, kind, shape)) in tensors.iter().enumerate() {
        let size = bytes_of(*kind, shape);
        total += size;
        if size > max_bytes {
            shards.push(vec![i]);
            continue;
        }
        if current_size + size > max_bytes {
            shards.push(std::mem::take(&mut current));
            current_size = 0;
        }
        current.push(i);
        current_size += size;
    }
    if !current.is_empty() || shards.is_empty() {
        shards.push(current);
    }
    let n = shards.len();
    let files = shards
        .into_iter()
        .enumerate()
        .map(|(k, tensors)| {
            let name = match n {
                1 => format!("{stem}.safetensors"),
                _ => format!("{stem}-{:05}-of-{n:05}.safetensors", k + 1),
            };
            (name, tensors)
        })
        .collect();
    ShardPlan {
        files,
        total_size: total,
    }
}

/// The index file of `stem`'s shards (`model.safetensors.index.json`).
pub fn index_file(stem: &str) -> String {
    format!("{stem}.safetensors.index.json")
}

impl ShardPlan {
    /// `model.safetensors.index.json` as transformers writes it (keys sorted, two-space
    /// indent, a final newline), for a plan of more than one file.
    pub fn index_json(&self, tensors: &[PlannedTensor]) -> Option<String> {
        if self.files.len() < 2 {
            return None;
        }
        let parameters: i64 = tensors
            .iter()
            .map(|(_, _, s)| s.iter().product::<i64>())
            .sum();
        let mut weight_map = std::collections::BTreeMap::new();
        for (file, members) in &self.files {
            for &i in members {
                weight_map.insert(tensors[i].0.clone(), file.clone());
            }
        }
        let index = serde_json::json!({
            "metadata": {"total_parameters": parameters, "total_size": self.total_size},
            "weight_map": weight_map,
        });
        let mut text = serde_json::to_string_pretty(&index).expect("an index serialises");
        text.push('\n');
        Some(text)
    }
}

/// The weights files of a model directory (`model.safetensors`, `model-*-of-*.safetensors`
/// and the index) that a new write replaces: removed first, so that no stale shard or index
/// of an earlier write is read beside the new ones.
pub fn remove_stale(dir: &Path, stem: &str) -> std::io::Result<()> {
    let single = format!("{stem}.safetensors");
    let index = index_file(stem);
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let shard = name
            .strip_prefix(&format!("{stem}-"))
            .and_then(|r| r.strip_suffix(".safetensors"))
            .is_some_and(|r| {
                let (a, b) = r.split_once("-of-").unwrap_or(("", ""));
                a.len() == 5
                    && b.len() == 5
                    && a.bytes().all(|c| c.is_ascii_digit())
                    && b.bytes().all(|c| c.is_ascii_digit())
            });
        if name == single || name == index || shard {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

/// Every file of a [`ShardPlan`], written as the tensors arrive in plan order.
pub struct ShardedWriter {
    dir: PathBuf,
    stem: String,
    tensors: Vec<PlannedTensor>,
    plan: ShardPlan,
    writers: Vec<SafetensorsWriter>,
    /// Tensor name → its file's writer.
    file_of: HashMap<String, usize>,
}

impl ShardedWriter {
    /// Starts the files of `stem` in `dir` for `tensors` (name, dtype written, shape), at most
    /// `max_bytes` a file, after removing the weights files an earlier write left there.
    pub fn create(
        dir: &Path,
        stem: &str,
        tensors: Vec<PlannedTensor>,
        max_bytes: u64,
    ) -> Result<Self, SafetensorsError> {
        remove_stale(dir, stem).map_err(|source| SafetensorsError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let plan = plan(stem, &tensors, max_bytes);
        let mut writers = Vec::with_capacity(plan.files.len());
        let mut file_of = HashMap::with_capacity(tensors.len());
        for (k, (file, members)) in plan.files.iter().enumerate() {
            let order = members.iter().map(|&i| tensors[i].clone()).collect();
            writers.push(SafetensorsWriter::create(dir.join(file), order)?);
            for &i in members {
                file_of.insert(tensors[i].0.clone(), k);
            }
        }
        Ok(ShardedWriter {
            dir: dir.to_path_buf(),
            stem: stem.to_string(),
            tensors,
            plan,
            writers,
            file_of,
        })
    }

    /// The files this writer writes, in order.
    pub fn files(&self) -> impl Iterator<Item = &str> {
        self.plan.files.iter().map(|(f, _)| f.as_str())
    }

    /// Writes tensor `name` (cast to its planned dtype) into its file.
    pub fn write(&mut self, name: &str, tensor: &Tensor) -> Result<(), SafetensorsError> {
        let Some(&k) = self.file_of.get(name) else {
            return Err(SafetensorsError::Write {
                path: self.dir.clone(),
                message: format!("`{name}` is not among the planned tensors"),
            });
        };
        self.writers[k].write(name, tensor)
    }

    /// Writes parameter `name`'s whole tensor as a Hugging Face weights file holds it: itself,
    /// or a stacked expert parameter's per-expert tensors
    /// ([`file_tensors_of`](crate::model::names::file_tensors_of); the plan lists them so,
    /// [`hub_planned`]).
    pub fn write_param(&mut self, name: &str, tensor: &Tensor) -> Result<(), SafetensorsError> {
        let flat = tensor.reshape([-1]);
        for part in crate::model::names::file_tensors_of(name, &tensor.size()) {
            self.write(&part.name, &flat.narrow(0, part.offset, part.numel()))?;
        }
        Ok(())
    }

    /// Finishes every file (each renamed into place once whole) and writes the index when
    /// there is more than one.
    pub fn finish(self) -> Result<(), SafetensorsError> {
        for w in self.writers {
            w.finish()?;
        }
        if let Some(text) = self.plan.index_json(&self.tensors) {
            let path = self.dir.join(index_file(&self.stem));
            let tmp = self.dir.join(format!(
                ".{}.tmp-{}",
                index_file(&self.stem),
                std::process::id()
            ));
            let io = |path: &Path| {
                let path = path.to_path_buf();
                move |source| SafetensorsError::Io { path, source }
            };
            std::fs::write(&tmp, text).map_err(io(&tmp))?;
            std::fs::rename(&tmp, &path).map_err(io(&path))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str, numel: i64) -> PlannedTensor {
        (name.to_string(), Kind::Float, vec![numel])
    }

    /// huggingface_hub's documented example, [6, 6, 2, 6, 2, 2] GB at 10 GB a file, and a
    /// tensor larger than a file alone in its own, ahead of the file being filled.
    #[test]
    fn files_split_as_huggingface_hub_splits_them() {
        let gb = 250_000_000; // float32 elements in 1 GB
        let tensors: Vec<PlannedTensor> = [6, 6, 2, 6, 2, 2]
            .iter()
            .enumerate()
            .map(|(i, g)| t(&format!("w{i}"), g * gb))
            .collect();
        let p = plan("model", &tensors, 10_000_000_000);
        let groups: Vec<Vec<usize>> = p.files.iter().map(|(_, m)| m.clone()).collect();
        assert_eq!(groups, vec![vec![0], vec![1, 2], vec![3, 4, 5]]);
        assert_eq!(p.files[0].0, "model-00001-of-00003.safetensors");
        assert_eq!(p.total_size, 24_000_000_000);
        let index: serde_json::Value =
            serde_json::from_str(&p.index_json(&tensors).unwrap()).unwrap();
        assert_eq!(
            index["weight_map"]["w2"],
            "model-00002-of-00003.safetensors"
        );
        assert_eq!(index["metadata"]["total_size"], 24_000_000_000u64);

        let big = vec![t("a", 10), t("b", 100), t("c", 10)];
        let p = plan("model", &big, 200);
        let groups: Vec<Vec<usize>> = p.files.iter().map(|(_, m)| m.clone()).collect();
        assert_eq!(groups, vec![vec![1], vec![0, 2]]);

        let one = plan("model", &big, 1 << 30);
        assert_eq!(
            one.files,
            vec![("model.safetensors".to_string(), vec![0, 1, 2])]
        );
        assert!(one.index_json(&big).is_none());
    }
}
