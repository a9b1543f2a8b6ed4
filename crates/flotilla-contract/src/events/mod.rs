//! TensorBoard event files: writing a job's scalars and HParams summaries so that `tensorboard
//! --logdir <sweep dir>` shows a (running) sweep, and reading event files back so that `flotilla
//! report` can report programs that log only to TensorBoard.
//!
//! A file is a sequence of TFRecords (`u64` length, masked CRC-32C of the length, the bytes, their
//! masked CRC-32C) each holding one `Event` protobuf; the first event carries the file version.
//! Scalars are `Summary.Value.simple_value`s (what `EventAccumulator.Scalars` returns); the
//! HParams plugin reads an `Experiment` (the hyperparameter and metric names), a
//! `SessionStartInfo` (this job's values) and a `SessionEndInfo` (its status), each a
//! `Summary.Value` whose metadata names the `hparams` plugin.
//!
//! The writer never stops its caller: a failed write (full disk, removed directory) is logged
//! once as a warning and the writer goes quiet.

pub mod proto;

use proto::{fields, Field, Malformed, Message};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The directory of a job's event file, inside its job directory.
pub use crate::layout::TB_DIR;
/// The prefix of every event file name.
pub const FILE_PREFIX: &str = "events.out.tfevents.";

const HPARAMS_PLUGIN: &str = "hparams";
const EXPERIMENT_TAG: &str = "_hparams_/experiment";
const SESSION_START_TAG: &str = "_hparams_/session_start_info";
const SESSION_END_TAG: &str = "_hparams_/session_end_info";

/// `0xa282ead8`, added to the rotated CRC (TFRecord's masking).
const CRC_MASK_DELTA: u32 = 0xa282_ead8;

fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(CRC_MASK_DELTA)
}

/// One framed record.
fn record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
    out
}

/// A hyperparameter's value, as the HParams plugin types them.
#[derive(Clone, Debug, PartialEq)]
pub enum HParam {
    Number(f64),
    Text(String),
    Bool(bool),
}

/// How a job ended, as the HParams plugin's `Status` enum says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionStatus {
    Success = 1,
    Failure = 2,
    Running = 3,
}

/// Seconds since the Unix epoch, now.
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn event(wall_time: f64, step: i64) -> Message {
    Message::new().double(1, wall_time).varint(2, step)
}

fn plugin_value(tag: &str, content: &Message) -> Message {
    let plugin_data = Message::new().string(1, HPARAMS_PLUGIN).message(2, content);
    let metadata = Message::new().message(1, &plugin_data);
    Message::new().string(1, tag).message(9, &metadata)
}

fn summary_event(values: &[Message], step: i64) -> Vec<u8> {
    let mut summary = Message::new();
    for v in values {
        summary = summary.message(1, v);
    }
    event(unix_now(), step).message(5, &summary).into_bytes()
}

fn hparam_value(value: &HParam) -> Message {
    match value {
        HParam::Number(x) => Message::new().double(2, *x),
        HParam::Text(s) => Message::new().string(3, s),
        HParam::Bool(b) => Message::new().varint(4, i64::from(*b)),
    }
}

/// Appends a job's events to `<dir>/events.out.tfevents.<unix time>.<host>.<pid>.0`, flushing
/// every write so a reader sees each step as soon as it is logged.
pub struct EventWriter {
    path: PathBuf,
    file: Option<File>,
}

impl EventWriter {
    /// Creates `dir` and the event file in it, and writes the file-version event. On failure the
    /// writer is returned quiet, after one warning.
    pub fn create(dir: &Path) -> EventWriter {
        let name = format!(
            "{FILE_PREFIX}{}.{}.{}.0",
            unix_now() as u64,
            crate::host_name(),
            std::process::id()
        );
        let path = dir.join(name);
        let opened = std::fs::create_dir_all(dir).and_then(|()| File::create(&path));
        let mut writer = EventWriter { path, file: None };
        match opened {
            Ok(file) => {
                writer.file = Some(file);
                let version = event(unix_now(), 0).string(3, "brain.Event:2").into_bytes();
                writer.append(&version);
            }
            Err(error) => writer.warn(&error),
        }
        writer
    }

    /// The event file (it may not exist when creating it failed).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether writes still reach the file.
    pub fn is_writing(&self) -> bool {
        self.file.is_some()
    }

    fn warn(&self, error: &std::io::Error) {
        tracing::warn!(
            "TensorBoard events: cannot write {}: {error}; training goes on without them",
            self.path.display()
        );
    }

    fn append(&mut self, event: &[u8]) {
        let Some(file) = &mut self.file else { return };
        if let Err(error) = file.write_all(&record(event)).and_then(|()| file.flush()) {
            self.warn(&error);
            self.file = None;
        }
    }

    /// The scalars of one step, in one event.
    pub fn scalars(&mut self, step: u64, values: &[(&str, f64)]) {
        if self.file.is_none() || values.is_empty() {
            return;
        }
        let values: Vec<Message> = values
            .iter()
            .map(|(tag, v)| Message::new().string(1, tag).float(2, *v as f32))
            .collect();
        self.append(&summary_event(&values, step as i64));
    }

    /// The HParams plugin's experiment (hyperparameter and metric names) and this job's session
    /// start (its values).
    pub fn hparams_start(&mut self, hparams: &[(String, HParam)], metric_tags: &[&str]) {
        let mut experiment = Message::new().double(3, unix_now());
        for (name, value) in hparams {
            let data_type = match value {
                HParam::Text(_) => 1,
                HParam::Bool(_) => 2,
                HParam::Number(_) => 3,
            };
            experiment =
                experiment.message(4, &Message::new().string(1, name).varint(4, data_type));
        }
        for tag in metric_tags {
            let name = Message::new().string(2, tag);
            experiment = experiment.message(5, &Message::new().message(1, &name));
        }
        let mut start = Message::new();
        for (name, value) in hparams {
            let entry = Message::new()
                .string(1, name)
                .message(2, &hparam_value(value));
            start = start.message(1, &entry);
        }
        start = start.double(5, unix_now());
        let experiment_data = Message::new().varint(1, 0).message(2, &experiment);
        let start_data = Message::new().varint(1, 0).message(3, &start);
        let event = summary_event(
            &[
                plugin_value(EXPERIMENT_TAG, &experiment_data),
                plugin_value(SESSION_START_TAG, &start_data),
            ],
            0,
        );
        self.append(&event);
    }

    /// The HParams plugin's session end.
    pub fn hparams_end(&mut self, status: SessionStatus) {
        let end = Message::new()
            .varint(1, status as i64)
            .double(2, unix_now());
        let data = Message::new().varint(1, 0).message(4, &end);
        let event = summary_event(&[plugin_value(SESSION_END_TAG, &data)], 0);
        self.append(&event);
    }
}

/// One scalar read back.
#[derive(Clone, Debug, PartialEq)]
pub struct Scalar {
    pub tag: String,
    pub step: i64,
    pub wall_time: f64,
    pub value: f64,
}

/// What an event file holds, as far as flotilla reads it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EventFile {
    pub scalars: Vec<Scalar>,
    /// The hyperparameters of the last session start, in file order.
    pub hparams: Vec<(String, HParam)>,
    /// The status of the last session end.
    pub status: Option<SessionStatus>,
    /// Why reading stopped early (a record cut short by a writer still at work, a bad
    /// checksum); what came before it is kept.
    pub stopped: Option<String>,
}

/// Errors reading an event file.
#[derive(Debug, thiserror::Error)]
pub enum TfEventsError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// The event files of a directory (not recursive), oldest name first.
pub fn event_files(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.is_file()
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(FILE_PREFIX))
        })
        .collect();
    files.sort();
    files
}

/// Reads the scalars and hparams of an event file. A file cut short or damaged is read up to
/// the first bad record (see [`EventFile::stopped`]).
pub fn read_event_file(path: &Path) -> Result<EventFile, TfEventsError> {
    let bytes = std::fs::read(path).map_err(|source| TfEventsError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut out = EventFile::default();
    let mut rest = bytes.as_slice();
    while !rest.is_empty() {
        if rest.len() < 12 {
            out.stopped = Some("the last record is cut short".into());
            break;
        }
        let (len_bytes, tail) = rest.split_at(8);
        let len_crc = u32::from_le_bytes(tail[..4].try_into().expect("4 bytes"));
        if masked_crc(len_bytes) != len_crc {
            out.stopped = Some("a record length fails its checksum".into());
            break;
        }
        let len = u64::from_le_bytes(len_bytes.try_into().expect("8 bytes"));
        let tail = &tail[4..];
        let Some(len) = usize::try_from(len).ok().filter(|l| l + 4 <= tail.len()) else {
            out.stopped = Some("the last record is cut short".into());
            break;
        };
        let (data, tail) = tail.split_at(len);
        let data_crc = u32::from_le_bytes(tail[..4].try_into().expect("4 bytes"));
        if masked_crc(data) != data_crc {
            out.stopped = Some("a record fails its checksum".into());
            break;
        }
        rest = &tail[4..];
        if read_event(data, &mut out).is_err() {
            out.stopped = Some("a record is not a valid event".into());
            break;
        }
    }
    Ok(out)
}

fn read_event(data: &[u8], out: &mut EventFile) -> Result<(), Malformed> {
    let (mut wall_time, mut step, mut summary) = (0.0, 0, None);
    for field in fields(data) {
        match field? {
            (1, f) => wall_time = f.as_f64().unwrap_or(0.0),
            (2, f) => step = f.as_i64().unwrap_or(0),
            (5, Field::Bytes(b)) => summary = Some(b),
            _ => {}
        }
    }
    let Some(summary) = summary else {
        return Ok(());
    };
    for field in fields(summary) {
        if let (1, Field::Bytes(value)) = field? {
            read_value(value, wall_time, step, out)?;
        }
    }
    Ok(())
}

fn read_value(
    value: &[u8],
    wall_time: f64,
    step: i64,
    out: &mut EventFile,
) -> Result<(), Malformed> {
    let (mut tag, mut scalar, mut plugin) = (String::new(), None, None);
    for field in fields(value) {
        match field? {
            (1, Field::Bytes(b)) => tag = String::from_utf8_lossy(b).into_owned(),
            (2, f) => scalar = f.as_f32().map(f64::from),
            (8, Field::Bytes(tensor)) => scalar = tensor_scalar(tensor)?.or(scalar),
            (9, Field::Bytes(metadata)) => plugin = plugin_content(metadata)?,
            _ => {}
        }
    }
    if let Some((name, content)) = plugin {
        if name == HPARAMS_PLUGIN {
            return read_hparams(content, out);
        }
    }
    if let Some(value) = scalar {
        out.scalars.push(Scalar {
            tag,
            step,
            wall_time,
            value,
        });
    }
    Ok(())
}

/// The one number of a scalar `TensorProto` (TF2 summaries): DT_FLOAT or DT_DOUBLE, in
/// `tensor_content` or the packed `float_val` / `double_val`.
fn tensor_scalar(tensor: &[u8]) -> Result<Option<f64>, Malformed> {
    let mut value = None;
    let mut dtype = 0;
    for field in fields(tensor) {
        match field? {
            (1, f) => dtype = f.as_i64().unwrap_or(0),
            (4, Field::Bytes(b)) if b.len() == 4 && dtype == 1 => {
                value = Some(f64::from(f32::from_le_bytes(b.try_into().expect("4"))))
            }
            (4, Field::Bytes(b)) if b.len() == 8 && dtype == 2 => {
                value = Some(f64::from_le_bytes(b.try_into().expect("8")))
            }
            (5, Field::Bytes(b)) if b.len() == 4 => {
                value = Some(f64::from(f32::from_le_bytes(b.try_into().expect("4"))))
            }
            (5, f @ Field::Fixed32(_)) => value = f.as_f32().map(f64::from),
            (6, Field::Bytes(b)) if b.len() == 8 => {
                value = Some(f64::from_le_bytes(b.try_into().expect("8")))
            }
            (6, f @ Field::Fixed64(_)) => value = f.as_f64(),
            _ => {}
        }
    }
    Ok(value)
}

fn plugin_content(metadata: &[u8]) -> Result<Option<(String, &[u8])>, Malformed> {
    for field in fields(metadata) {
        if let (1, Field::Bytes(plugin_data)) = field? {
            let (mut name, mut content) = (String::new(), &[][..]);
            for f in fields(plugin_data) {
                match f? {
                    (1, Field::Bytes(b)) => name = String::from_utf8_lossy(b).into_owned(),
                    (2, Field::Bytes(b)) => content = b,
                    _ => {}
                }
            }
            return Ok(Some((name, content)));
        }
    }
    Ok(None)
}

fn read_hparams(content: &[u8], out: &mut EventFile) -> Result<(), Malformed> {
    for field in fields(content) {
        match field? {
            (3, Field::Bytes(start)) => {
                out.hparams.clear();
                for f in fields(start) {
                    if let (1, Field::Bytes(entry)) = f? {
                        out.hparams.push(read_hparam_entry(entry)?);
                    }
                }
            }
            (4, Field::Bytes(end)) => {
                for f in fields(end) {
                    if let (1, Field::Varint(s)) = f? {
                        out.status = match s {
                            1 => Some(SessionStatus::Success),
                            2 => Some(SessionStatus::Failure),
                            3 => Some(SessionStatus::Running),
                            _ => None,
                        };
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn read_hparam_entry(entry: &[u8]) -> Result<(String, HParam), Malformed> {
    let (mut name, mut value) = (String::new(), HParam::Text(String::new()));
    for field in fields(entry) {
        match field? {
            (1, Field::Bytes(b)) => name = String::from_utf8_lossy(b).into_owned(),
            (2, Field::Bytes(v)) => {
                for f in fields(v) {
                    value = match f? {
                        (2, f) => HParam::Number(f.as_f64().unwrap_or(f64::NAN)),
                        (3, Field::Bytes(b)) => HParam::Text(String::from_utf8_lossy(b).into()),
                        (4, Field::Varint(b)) => HParam::Bool(b != 0),
                        _ => value,
                    };
                }
            }
            _ => {}
        }
    }
    Ok((name, value))
}

/// A job's hyperparameters for the HParams plugin: each task override of its `overrides.yaml`
/// (`trainer.lr=3e-4`, `model=tiny`, `+seed=1`) with the value its resolved `config.yaml` holds
/// at that key (the override's own text for a group choice or a key the config lacks).
pub fn job_hparams(job_dir: &Path) -> Vec<(String, HParam)> {
    use flotilla_config::node::Value;
    let Some(overrides) = crate::layout::read_overrides(job_dir) else {
        return Vec::new();
    };
    let config = crate::layout::load_job_config_tree(job_dir);
    crate::layout::override_assignments(&overrides)
        .into_iter()
        .map(|(key, text)| {
            let value = match config
                .as_ref()
                .and_then(|c| c.select(&key))
                .map(|n| &n.value)
            {
                Some(Value::Int(i)) => HParam::Number(*i as f64),
                Some(Value::Float(x)) => HParam::Number(*x),
                Some(Value::Bool(b)) => HParam::Bool(*b),
                Some(Value::Str(s)) => HParam::Text(s.clone()),
                _ => HParam::Text(text),
            };
            (key, value)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_crc_matches_tensorflow() {
        // CRC-32C of "123456789" is 0xe3069283 (RFC 3720's check value); masked as TFRecord does.
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(
            masked_crc(b"123456789"),
            0xe306_9283u32.rotate_right(15).wrapping_add(0xa282_ead8)
        );
    }

    #[test]
    fn written_events_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(&dir.path().join(TB_DIR));
        w.hparams_start(
            &[
                ("trainer.lr".into(), HParam::Number(0.003)),
                ("model".into(), HParam::Text("tiny".into())),
            ],
            &["loss", "eval_loss"],
        );
        w.scalars(0, &[("loss", 10.5), ("lr", 0.001)]);
        w.scalars(1, &[("loss", 9.25)]);
        w.hparams_end(SessionStatus::Success);
        assert!(w.is_writing());
        let files = event_files(&dir.path().join(TB_DIR));
        assert_eq!(files, vec![w.path().to_path_buf()]);
        let read = read_event_file(&files[0]).unwrap();
        assert_eq!(read.stopped, None);
        let got: Vec<(&str, i64, f64)> = read
            .scalars
            .iter()
            .map(|s| (s.tag.as_str(), s.step, s.value))
            .collect();
        assert_eq!(
            got,
            [
                ("loss", 0, 10.5),
                ("lr", 0, f64::from(0.001f32)),
                ("loss", 1, 9.25)
            ]
        );
        assert_eq!(
            read.hparams[0],
            ("trainer.lr".into(), HParam::Number(0.003))
        );
        assert_eq!(
            read.hparams[1],
            ("model".into(), HParam::Text("tiny".into()))
        );
        assert_eq!(read.status, Some(SessionStatus::Success));
    }

    #[test]
    fn a_file_cut_short_keeps_its_complete_records() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(dir.path());
        w.scalars(0, &[("loss", 1.0)]);
        w.scalars(1, &[("loss", 2.0)]);
        let bytes = std::fs::read(w.path()).unwrap();
        std::fs::write(w.path(), &bytes[..bytes.len() - 3]).unwrap();
        let read = read_event_file(w.path()).unwrap();
        assert_eq!(read.scalars.len(), 1);
        assert_eq!(
            read.stopped.as_deref(),
            Some("the last record is cut short")
        );
    }

    #[test]
    fn a_removed_directory_warns_and_goes_quiet() {
        let dir = tempfile::tempdir().unwrap();
        let tb = dir.path().join("tb");
        let mut w = EventWriter::create(&tb);
        std::fs::remove_dir_all(&tb).unwrap();
        // The open file survives its directory's removal on Linux; a file that cannot be
        // created at all leaves the writer quiet.
        let blocked = dir.path().join("file");
        std::fs::write(&blocked, b"").unwrap();
        let mut quiet = EventWriter::create(&blocked.join("tb"));
        assert!(!quiet.is_writing());
        quiet.scalars(0, &[("loss", 1.0)]);
        w.scalars(0, &[("loss", 1.0)]);
    }

    #[test]
    fn a_full_disk_warns_and_goes_quiet() {
        let Ok(full) = File::options().write(true).open("/dev/full") else {
            return;
        };
        let mut w = EventWriter {
            path: PathBuf::from("/dev/full"),
            file: Some(full),
        };
        w.scalars(0, &[("loss", 1.0)]);
        assert!(!w.is_writing());
        w.scalars(1, &[("loss", 1.0)]);
    }
}
