//! Where a rank's starting weights and resumed optimizer state come from, read by ranges: a
//! [`TensorSource`] gives elements `lo..hi` of one flattened parameter (or of its AdamW
//! moment) without producing the rest. The seeded initialisation ([`Seeded`]) computes just
//! those elements; safetensors files ([`FileSource`]: a Hugging Face directory, a full
//! checkpoint's `model.safetensors` / `optimizer.safetensors`) read just those bytes; tensors
//! already in memory ([`Params`]) are sliced; an [`Overlay`] takes some parameters from one
//! source and the rest from another. Higher layers add their own sources (a sharded
//! checkpoint's, `checkpoint::files::ShardedSource`) and build from any source: an FSDP rank
//! only its shards (`parallel::layout::GroupLayout::shard_from`), replicated weights every
//! parameter whole ([`materialize`]).
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use tch::{Device, Kind, Tensor};

use crate::error::TrainError;
use crate::model::names::{FileTensor, ParamName};
use crate::model::{is_float_kind, CausalLm, Init, ModelError, Params};
use crate::safetensors_io::{SafetensorsError, SafetensorsFile};

/// Elements of flattened tensors, by parameter name.
pub trait TensorSource {
    /// Elements `lo..hi` of the flattened tensor of parameter `name`, as a 1-D CPU tensor (any
    /// floating dtype; callers cast).
    fn read_range(&self, name: &str, lo: i64, hi: i64) -> Result<Tensor, TrainError>;

    /// Checks, before anything is read, that the source has every parameter of `model` with
    /// its shape (errors name the culprit). Default: nothing to check.
    fn check(&self, _model: &CausalLm) -> Result<(), TrainError> {
        Ok(())
    }
}

/// The seeded initialisation of a model (`Init`, a pure function of seed, name and index).
pub struct Seeded {
    init: HashMap<String, Init>,
    seed: u64,
}

impl Seeded {
    pub fn new(model: &CausalLm, seed: u64) -> Self {
        Self {
            init: model
                .param_specs()
                .iter()
                .map(|s| (s.name.clone(), s.init))
                .collect(),
            seed,
        }
    }
}

impl TensorSource for Seeded {
    fn read_range(&self, name: &str, lo: i64, hi: i64) -> Result<Tensor, TrainError> {
        let init = self
            .init
            .get(name)
            .ok_or_else(|| ModelError::MissingParam { name: name.into() })?;
        let out = Tensor::f_empty([hi - lo], (Kind::Float, Device::Cpu))?;
        let n = (hi - lo) as usize;
        if n > 0 {
            // SAFETY: `out` is a fresh contiguous f32 CPU tensor of `n` elements, referenced
            // by nothing else until it is returned.
            let buf = unsafe { std::slice::from_raw_parts_mut(out.data_ptr() as *mut f32, n) };
            init.fill_parallel(self.seed, name, lo as usize, buf);
        }
        Ok(out)
    }
}

impl TensorSource for Params {
    fn check(&self, model: &CausalLm) -> Result<(), TrainError> {
        Ok(model.check_params(self)?)
    }

    fn read_range(&self, name: &str, lo: i64, hi: i64) -> Result<Tensor, TrainError> {
        let t = self.require(name)?;
        Ok(t.f_detach()?
            .f_reshape([-1])?
            .f_narrow(0, lo, hi - lo)?
            .f_to_device(Device::Cpu)?)
    }
}

/// Tensors in safetensors files, found by parameter name with a prefix (`""`, or PEFT's
/// `"base_model.model."` in an adapter file) and a suffix (`""` for parameters, `".exp_avg"`
/// for a moment of the optimizer file).
pub struct FileSource {
    files: Vec<SafetensorsFile>,
    by_name: HashMap<String, usize>,
    prefix: String,
    suffix: String,
    /// The parameters a Hugging Face weights file holds in parts (stacked experts, per expert),
    /// read from those parts where the files do not hold them whole.
    parts: HashMap<String, Vec<FileTensor>>,
    /// The keys of those parts.
    part_keys: HashSet<String>,
}

impl FileSource {
    /// The tensors of `files` (a name in several files: the first).
    pub fn open(files: &[PathBuf], suffix: &str) -> Result<Self, SafetensorsError> {
        Self::open_with_prefix(files, "", suffix)
    }

    /// [`FileSource::open`] for files whose keys put `prefix` before the parameter names.
    pub fn open_with_prefix(
        files: &[PathBuf],
        prefix: &str,
        suffix: &str,
    ) -> Result<Self, SafetensorsError> {
        let mut opened = vec![];
        let mut by_name = HashMap::new();
        for (i, path) in files.iter().enumerate() {
            let f = SafetensorsFile::open(path)?;
            for name in f.tensors().keys() {
                by_name.entry(name.clone()).or_insert(i);
            }
            opened.push(f);
        }
        Ok(Self {
            files: opened,
            by_name,
            prefix: prefix.to_string(),
            suffix: suffix.to_string(),
            parts: HashMap::new(),
            part_keys: HashSet::new(),
        })
    }

    /// Reads `model`'s parameters that a Hugging Face weights file holds in parts (a stacked
    /// expert parameter as its experts' tensors, [`ParamName::file_parts`]) from those parts
    /// when the files do not hold them whole.
    pub fn with_parts_of(mut self, model: &CausalLm) -> Self {
        for s in model.param_specs() {
            let Some(parts) = ParamName::parse(&s.name).and_then(|p| p.file_parts(&s.shape)) else {
                continue;
            };
            for p in &parts {
                self.part_keys.insert(self.key(&p.name));
            }
            self.parts.insert(s.name.clone(), parts);
        }
        self
    }

    /// Whether `key` is a part of a parameter ([`FileSource::with_parts_of`]).
    pub fn is_part(&self, key: &str) -> bool {
        self.part_keys.contains(key)
    }

    /// Elements `lo..hi` of parameter `name`'s flattened tensor: from its tensor, or from the
    /// parts that hold it.
    pub fn read_param(&self, name: &str, lo: i64, hi: i64) -> Result<Tensor, ModelError> {
        let key = self.key(name);
        let Some(parts) = self.parts.get(name).filter(|_| self.find(&key).is_none()) else {
            return self.read_tensor(&key, lo, hi);
        };
        let mut pieces = vec![];
        for part in parts {
            let (start, end) = (part.offset, part.offset + part.numel());
            let (a, b) = (lo.max(start), hi.min(end));
            if a < b {
                pieces.push(self.read_tensor(&self.key(&part.name), a - start, b - start)?);
            }
        }
        Ok(match pieces.len() {
            1 => pieces.pop().expect("one piece"),
            _ => Tensor::f_cat(&pieces, 0)?,
        })
    }

    /// Elements `lo..hi` of tensor `key`, flattened.
    fn read_tensor(&self, key: &str, lo: i64, hi: i64) -> Result<Tensor, ModelError> {
        let file = self
            .find(key)
            .ok_or_else(|| ModelError::MissingParam { name: key.into() })?;
        Ok(file.read_range(key, lo, hi)?)
    }

    /// The file key of parameter `name`.
    pub fn key(&self, name: &str) -> String {
        format!("{}{name}{}", self.prefix, self.suffix)
    }

    /// The files, in the order given.
    pub fn files(&self) -> &[SafetensorsFile] {
        &self.files
    }

    /// The file holding tensor `key` (a full name, suffix included).
    pub fn find(&self, key: &str) -> Option<&SafetensorsFile> {
        self.by_name.get(key).map(|&i| &self.files[i])
    }

    /// Every `(tensor name, file)` of the source.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &SafetensorsFile)> {
        self.by_name
            .iter()
            .map(|(n, &i)| (n.as_str(), &self.files[i]))
    }

    /// Checks that every trainable parameter of `model` (every parameter, but for a LoRA
    /// job's frozen base) is there, under this source's key, with its shape and a floating
    /// dtype.
    pub fn check_all(&self, model: &CausalLm) -> Result<(), ModelError> {
        self.check_specs(model.param_specs().iter().filter(|s| s.trainable))
    }

    /// [`FileSource::check_all`] over the given parameters.
    pub fn check_specs<'a>(
        &self,
        specs: impl IntoIterator<Item = &'a crate::model::ParamSpec>,
    ) -> Result<(), ModelError> {
        for s in specs {
            let key = self.key(&s.name);
            if self.find(&key).is_none() {
                if let Some(parts) = self.parts.get(&s.name) {
                    for part in parts {
                        self.check_tensor(self.key(&part.name), &part.shape)?;
                    }
                    continue;
                }
            }
            self.check_tensor(key, &s.shape)?;
        }
        Ok(())
    }

    /// Checks that tensor `key` is there with `shape` and a floating dtype.
    fn check_tensor(&self, key: String, shape: &[i64]) -> Result<(), ModelError> {
        let Some(file) = self.find(&key) else {
            return Err(ModelError::MissingTensor {
                name: key,
                files: self
                    .files
                    .iter()
                    .map(|f| f.path().display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        };
        let info = file.info(&key).expect("indexed");
        if info.shape != shape {
            return Err(ModelError::ShapeMismatch {
                name: key,
                expected: shape.to_vec(),
                found: info.shape.clone(),
                file: Some(file.path().to_path_buf()),
            });
        }
        if !is_float_kind(info.kind) {
            return Err(ModelError::UnsupportedDtype {
                name: key,
                dtype: format!("{:?}", info.kind),
                file: Some(file.path().to_path_buf()),
            });
        }
        Ok(())
    }
}

impl TensorSource for FileSource {
    fn check(&self, model: &CausalLm) -> Result<(), TrainError> {
        Ok(self.check_all(model)?)
    }

    fn read_range(&self, name: &str, lo: i64, hi: i64) -> Result<Tensor, TrainError> {
        Ok(self.read_param(name, lo, hi)?)
    }
}

/// Parameters from one source, the rest from another: a LoRA job's adapters (from a PEFT
/// adapter directory, or seeded) over its base (a Hugging Face directory, or seeded).
pub struct Overlay<'a> {
    /// The parameters `over` gives.
    pub names: std::collections::HashSet<String>,
    pub over: &'a dyn TensorSource,
    pub base: &'a dyn TensorSource,
}

impl TensorSource for Overlay<'_> {
    fn read_range(&self, name: &str, lo: i64, hi: i64) -> Result<Tensor, TrainError> {
        match self.names.contains(name) {
            true => self.over.read_range(name, lo, hi),
            false => self.base.read_range(name, lo, hi),
        }
    }
}

/// Every parameter of `model` whole, from `source`, on `device` (one parameter on the host at
/// a time): trainable ones in `kind`, a LoRA job's frozen base in `frozen_kind`.
pub fn materialize(
    model: &CausalLm,
    source: &dyn TensorSource,
    kind: Kind,
    frozen_kind: Kind,
    device: Device,
) -> Result<Params, TrainError> {
    let _guard = tch::no_grad_guard();
    let mut out = Params::new();
    for s in model.param_specs() {
        let t = source
            .read_range(&s.name, 0, s.numel() as i64)?
            .f_to_kind(if s.trainable { kind } else { frozen_kind })?
            .f_to_device(device)?
            .f_reshape(s.shape.as_slice())?;
        out.insert(s.name.clone(), t);
    }
    Ok(out)
}
