//! Safetensors files read by ranges and written as a stream, so that no rank ever holds a
//! whole model to load or save one.
//!
//! [`SafetensorsFile`] parses only the header (names, dtypes, shapes, byte ranges) and reads
//! the elements `lo..hi` of one flattened tensor straight from the file into a tensor
//! (`pread`, no memory map, no other bytes touched): FSDP ranks load the slices of a Hugging
//! Face checkpoint or a full training checkpoint that their shards hold.
//!
//! [`SafetensorsWriter`] writes the header first, from the names, dtypes and shapes known in
//! advance, then takes the tensors one at a time in that order and appends their bytes: rank 0
//! streams a gathered model group by group. It writes to a hidden temporary name beside the
//! target and renames it into place only when every tensor was written, so a failure leaves no
//! file a reader would take for complete. The format is the one the `safetensors` package
//! writes (an 8-byte little-endian header size, a JSON header padded with spaces to a multiple
//! of 8, the data), with `__metadata__` `{"format": "pt"}` as transformers expects.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

/// A safetensors file that cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum SafetensorsError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: not a safetensors file: {reason}", path.display())]
    Format { path: PathBuf, reason: String },
    #[error("{}: no tensor `{name}`", path.display())]
    Missing { path: PathBuf, name: String },
    #[error("{}: `{name}` has {numel} elements; elements {lo}..{hi} were asked for", path.display())]
    Range {
        path: PathBuf,
        name: String,
        numel: i64,
        lo: i64,
        hi: i64,
    },
    #[error("{}: {message}", path.display())]
    Write { path: PathBuf, message: String },
    #[error(transparent)]
    Torch(#[from] tch::TchError),
}

impl SafetensorsError {
    /// Whether the file is at fault (missing, not a safetensors file, without a tensor asked
    /// for) rather than the machine.
    pub fn is_bad_input(&self) -> bool {
        match self {
            SafetensorsError::Io { source, .. } => source.kind() == std::io::ErrorKind::NotFound,
            SafetensorsError::Format { .. } | SafetensorsError::Missing { .. } => true,
            SafetensorsError::Range { .. }
            | SafetensorsError::Write { .. }
            | SafetensorsError::Torch(_) => false,
        }
    }
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> SafetensorsError + '_ {
    move |source| SafetensorsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The safetensors name of a tensor kind.
pub fn dtype_name(kind: Kind) -> Option<&'static str> {
    Some(match kind {
        Kind::Float => "F32",
        Kind::BFloat16 => "BF16",
        Kind::Half => "F16",
        Kind::Double => "F64",
        Kind::Int64 => "I64",
        Kind::Int => "I32",
        Kind::Int16 => "I16",
        Kind::Int8 => "I8",
        Kind::Uint8 => "U8",
        Kind::Bool => "BOOL",
        _ => return None,
    })
}

fn kind_of(name: &str) -> Option<Kind> {
    Some(match name {
        "F32" => Kind::Float,
        "BF16" => Kind::BFloat16,
        "F16" => Kind::Half,
        "F64" => Kind::Double,
        "I64" => Kind::Int64,
        "I32" => Kind::Int,
        "I16" => Kind::Int16,
        "I8" => Kind::Int8,
        "U8" => Kind::Uint8,
        "BOOL" => Kind::Bool,
        _ => return None,
    })
}

/// One tensor's entry in a header.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub kind: Kind,
    pub shape: Vec<i64>,
    /// Byte offset of its data from the start of the file.
    pub start: u64,
    pub numel: i64,
}

#[derive(Serialize, Deserialize)]
struct HeaderEntry {
    dtype: String,
    shape: Vec<i64>,
    data_offsets: [u64; 2],
}

/// A safetensors file opened for reading by ranges: its header, parsed.
#[derive(Debug)]
pub struct SafetensorsFile {
    path: PathBuf,
    file: File,
    tensors: BTreeMap<String, TensorInfo>,
}

/// Headers above this size are refused (the format's own limit is 100 MB).
const MAX_HEADER: u64 = 100 << 20;

impl SafetensorsFile {
    /// Opens `path` and reads its header; checks that every tensor's bytes lie inside the file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, SafetensorsError> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(io_error(&path))?;
        let len = file.metadata().map_err(io_error(&path))?.len();
        let format = |reason: String| SafetensorsError::Format {
            path: path.clone(),
            reason,
        };
        let mut size = [0u8; 8];
        file.read_exact_at(&mut size, 0)
            .map_err(|e| format(format!("cannot read the header size ({e})")))?;
        let header_len = u64::from_le_bytes(size);
        if header_len > MAX_HEADER || 8 + header_len > len {
            return Err(format(format!(
                "header of {header_len} bytes in a file of {len}"
            )));
        }
        let mut header = vec![0u8; header_len as usize];
        file.read_exact_at(&mut header, 8)
            .map_err(io_error(&path))?;
        let raw: BTreeMap<String, serde_json::Value> = serde_json::from_slice(&header)
            .map_err(|e| format(format!("header is not a JSON object ({e})")))?;
        let data_start = 8 + header_len;
        let mut tensors = BTreeMap::new();
        for (name, value) in raw {
            if name == "__metadata__" {
                continue;
            }
            let entry: HeaderEntry = serde_json::from_value(value)
                .map_err(|e| format(format!("tensor `{name}`: {e}")))?;
            let kind = kind_of(&entry.dtype)
                .ok_or_else(|| format(format!("tensor `{name}`: dtype {}", entry.dtype)))?;
            let numel: i64 = entry.shape.iter().product();
            let [a, b] = entry.data_offsets;
            let bytes = numel as u64 * kind.elt_size_in_bytes() as u64;
            if b < a || b - a != bytes || data_start + b > len {
                return Err(format(format!(
                    "tensor `{name}`: data offsets {a}..{b} do not hold {numel} {} elements \
                     inside the file",
                    entry.dtype
                )));
            }
            tensors.insert(
                name,
                TensorInfo {
                    kind,
                    shape: entry.shape,
                    start: data_start + a,
                    numel,
                },
            );
        }
        Ok(Self {
            path,
            file,
            tensors,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The tensors of the file, by name.
    pub fn tensors(&self) -> &BTreeMap<String, TensorInfo> {
        &self.tensors
    }

    pub fn info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.get(name)
    }

    fn require(&self, name: &str) -> Result<&TensorInfo, SafetensorsError> {
        self.info(name).ok_or_else(|| SafetensorsError::Missing {
            path: self.path.clone(),
            name: name.to_string(),
        })
    }

    /// Elements `lo..hi` of the flattened tensor `name`, as a 1-D CPU tensor of the file's
    /// dtype; only those bytes are read.
    pub fn read_range(&self, name: &str, lo: i64, hi: i64) -> Result<Tensor, SafetensorsError> {
        let info = self.require(name)?;
        if lo < 0 || hi < lo || hi > info.numel {
            return Err(SafetensorsError::Range {
                path: self.path.clone(),
                name: name.to_string(),
                numel: info.numel,
                lo,
                hi,
            });
        }
        let elt = info.kind.elt_size_in_bytes() as u64;
        let out = Tensor::f_empty([hi - lo], (info.kind, Device::Cpu))?;
        let nbytes = ((hi - lo) as u64 * elt) as usize;
        if nbytes > 0 {
            // SAFETY: `out` is a fresh, contiguous CPU tensor of exactly `nbytes` bytes that
            // nothing else references until this function returns it.
            let buf = unsafe { std::slice::from_raw_parts_mut(out.data_ptr() as *mut u8, nbytes) };
            self.file
                .read_exact_at(buf, info.start + lo as u64 * elt)
                .map_err(io_error(&self.path))?;
        }
        Ok(out)
    }

    /// The whole tensor `name`, in its shape (CPU, the file's dtype).
    pub fn read(&self, name: &str) -> Result<Tensor, SafetensorsError> {
        let info = self.require(name)?;
        let shape = info.shape.clone();
        Ok(self.read_range(name, 0, info.numel)?.f_reshape(shape)?)
    }
}

/// A safetensors file written tensor by tensor, in the order its header was declared.
pub struct SafetensorsWriter {
    path: PathBuf,
    tmp: PathBuf,
    out: Option<BufWriter<File>>,
    /// `(name, kind, numel)` in write order.
    order: Vec<(String, Kind, i64)>,
    next: usize,
}

/// Elements copied to the host at a time while writing a tensor.
const WRITE_CHUNK: i64 = 1 << 24;

impl SafetensorsWriter {
    /// Starts `path` (through a hidden temporary file beside it) with the tensors `order`
    /// declares: `(name, dtype, shape)`, to be written in that order.
    pub fn create(
        path: impl AsRef<Path>,
        order: Vec<(String, Kind, Vec<i64>)>,
    ) -> Result<Self, SafetensorsError> {
        let path = path.as_ref().to_path_buf();
        let write_error = |message: String| SafetensorsError::Write {
            path: path.clone(),
            message,
        };
        let mut header = serde_json::Map::new();
        let mut meta = serde_json::Map::new();
        meta.insert("format".into(), "pt".into());
        header.insert("__metadata__".into(), serde_json::Value::Object(meta));
        let mut offset = 0u64;
        let mut plan = Vec::with_capacity(order.len());
        for (name, kind, shape) in order {
            let dtype =
                dtype_name(kind).ok_or_else(|| write_error(format!("`{name}`: dtype {kind:?}")))?;
            let numel: i64 = shape.iter().product();
            let bytes = numel as u64 * kind.elt_size_in_bytes() as u64;
            let entry = HeaderEntry {
                dtype: dtype.to_string(),
                shape,
                data_offsets: [offset, offset + bytes],
            };
            offset += bytes;
            if header
                .insert(
                    name.clone(),
                    serde_json::to_value(entry).expect("a header entry serialises"),
                )
                .is_some()
            {
                return Err(write_error(format!("`{name}` declared twice")));
            }
            plan.push((name, kind, numel));
        }
        let mut json = serde_json::to_vec(&header).expect("a header serialises");
        while !json.len().is_multiple_of(8) {
            json.push(b' ');
        }
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
        let file = File::create(&tmp).map_err(io_error(&tmp))?;
        let mut out = BufWriter::with_capacity(1 << 22, file);
        let started = out
            .write_all(&(json.len() as u64).to_le_bytes())
            .and_then(|()| out.write_all(&json));
        let writer = Self {
            path,
            tmp,
            out: Some(out),
            order: plan,
            next: 0,
        };
        started.map_err(io_error(&writer.tmp))?;
        Ok(writer)
    }

    /// The name the next [`SafetensorsWriter::write`] must give, if any is left.
    pub fn next_name(&self) -> Option<&str> {
        self.order.get(self.next).map(|(n, _, _)| n.as_str())
    }

    /// Appends the next tensor (cast to its declared dtype; any device and layout).
    pub fn write(&mut self, name: &str, tensor: &Tensor) -> Result<(), SafetensorsError> {
        let Some((want, kind, numel)) = self.order.get(self.next).cloned() else {
            return Err(self.write_error(format!("`{name}` is beyond the declared tensors")));
        };
        if want != name || tensor.numel() as i64 != numel {
            return Err(self.write_error(format!(
                "expected `{want}` ({numel} elements) next, got `{name}` ({} elements)",
                tensor.numel()
            )));
        }
        let flat = tensor.f_detach()?.f_reshape([-1])?;
        let elt = kind.elt_size_in_bytes();
        let mut buf = vec![];
        let mut at = 0;
        while at < numel {
            let n = WRITE_CHUNK.min(numel - at);
            let chunk = flat
                .f_narrow(0, at, n)?
                .f_to_device(Device::Cpu)?
                .f_to_kind(kind)?
                .f_contiguous()?;
            buf.resize(n as usize * elt, 0);
            chunk.f_copy_data_u8(&mut buf, n as usize)?;
            let out = self.out.as_mut().expect("open until finish");
            out.write_all(&buf).map_err(io_error(&self.tmp))?;
            at += n;
        }
        self.next += 1;
        Ok(())
    }

    /// Checks that every declared tensor was written, flushes, and renames the file into
    /// place.
    pub fn finish(mut self) -> Result<PathBuf, SafetensorsError> {
        if let Some(name) = self.next_name() {
            return Err(self.write_error(format!("`{name}` and later tensors were never written")));
        }
        let out = self.out.take().expect("open until finish");
        let file = out.into_inner().map_err(|e| SafetensorsError::Io {
            path: self.tmp.clone(),
            source: e.into_error(),
        })?;
        file.sync_all().map_err(io_error(&self.tmp))?;
        drop(file);
        std::fs::rename(&self.tmp, &self.path).map_err(io_error(&self.path))?;
        Ok(self.path.clone())
    }

    fn write_error(&self, message: String) -> SafetensorsError {
        SafetensorsError::Write {
            path: self.path.clone(),
            message,
        }
    }
}

impl Drop for SafetensorsWriter {
    /// An unfinished file is removed: nothing half-written stays behind.
    fn drop(&mut self) {
        if self.out.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streamed_files_read_back_whole_and_by_range_and_through_tch() {
        let dir = std::env::temp_dir().join(format!("flotilla-st-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m.safetensors");
        let a = Tensor::arange(12, (Kind::Float, Device::Cpu)).reshape([3, 4]);
        let b = Tensor::from_slice(&[1.5f32, -2.25, 3.0]);
        let step = Tensor::from(7i64);
        let mut w = SafetensorsWriter::create(
            &path,
            vec![
                ("step".into(), Kind::Int64, vec![]),
                ("a".into(), Kind::BFloat16, vec![3, 4]),
                ("b".into(), Kind::Float, vec![3]),
            ],
        )
        .unwrap();
        assert!(w.write("a", &a).is_err(), "out of order");
        w.write("step", &step).unwrap();
        w.write("a", &a).unwrap();
        assert!(!path.exists(), "nothing in place before finish");
        w.write("b", &b).unwrap();
        w.finish().unwrap();

        let f = SafetensorsFile::open(&path).unwrap();
        assert_eq!(f.info("a").unwrap().kind, Kind::BFloat16);
        assert_eq!(f.read("a").unwrap().to_kind(Kind::Float), a);
        assert_eq!(
            f.read_range("a", 5, 9).unwrap().to_kind(Kind::Float),
            Tensor::from_slice(&[5f32, 6., 7., 8.])
        );
        assert_eq!(f.read_range("b", 1, 3).unwrap(), b.narrow(0, 1, 2));
        assert!(f.read_range("b", 2, 4).is_err());
        assert_eq!(f.read("step").unwrap().int64_value(&[]), 7);
        let via_tch: BTreeMap<String, Tensor> = Tensor::read_safetensors(&path)
            .unwrap()
            .into_iter()
            .collect();
        assert_eq!(via_tch["b"], b);

        // A writer dropped before finishing leaves nothing.
        let partial = dir.join("p.safetensors");
        let mut w =
            SafetensorsWriter::create(&partial, vec![("b".into(), Kind::Float, vec![3])]).unwrap();
        drop(w.write("b", &b.narrow(0, 0, 2)));
        drop(w);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
