//! A job's logged metrics, read from whichever file its program wrote: the built-in trainer's
//! `metrics.csv`, a `metrics.jsonl` (one JSON object per line with a `step`), or TensorBoard
//! event files (`tb/` or the job directory itself), in that order. Every reader tolerates a
//! file still being written (a cut last line or record) and says what it could not read. A
//! reader asks for the series it uses ([`Wanted`]: whole, the first of several that has a
//! value, or the last value only), and a `metrics.csv` cell of any other is not parsed.

use crate::events;
pub use crate::layout::{METRICS_CSV, METRICS_JSONL};
use indexmap::IndexMap;
use std::path::{Path, PathBuf};

/// One metric's values by step, in file order.
pub type Series = Vec<(u64, f64)>;

/// What a job logged.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JobMetrics {
    /// The file the metrics came from (`None` when the job has none).
    pub source: Option<PathBuf>,
    /// Series by name, in the order the names first appear.
    pub series: IndexMap<String, Series>,
    /// Why some or all of the metrics could not be read.
    pub problem: Option<String>,
    /// The series with values that were not read (not asked for), by name.
    pub unread: Vec<String>,
    /// The last step of any record, whatever was read of it.
    pub last_record_step: Option<u64>,
}

impl JobMetrics {
    /// The last step logged by any series (read or not).
    pub fn last_step(&self) -> Option<u64> {
        self.series
            .values()
            .filter_map(|s| s.last().map(|(step, _)| *step))
            .chain(self.last_record_step)
            .max()
    }

    /// The names of every series with values, read or not.
    pub fn logged(&self) -> impl Iterator<Item = &str> {
        self.series
            .keys()
            .map(String::as_str)
            .chain(self.unread.iter().map(String::as_str))
    }

    pub fn get(&self, name: &str) -> Option<&Series> {
        self.series.get(name).filter(|s| !s.is_empty())
    }
}

/// Which series of a job's metrics are read, and how much of each: a series named nowhere is
/// left unread (its name kept in [`JobMetrics::unread`] when it has values), and a
/// `metrics.csv` cell of it is not even parsed.
#[derive(Clone, Copy, Debug, Default)]
pub struct Wanted<'a> {
    /// Series read whole; `None`: every series, whole.
    whole: Option<&'a [String]>,
    first_of: &'a [String],
    last: &'a [String],
    /// The series of `last` are read whole (and cut to their last value afterwards).
    lasts_whole: bool,
}

/// How a column is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReadAs {
    /// Every value; `rank`: its place in [`Wanted::first_of`] when it is one of those.
    Whole { rank: Option<usize> },
    /// The last value only.
    Last,
}

impl<'a> Wanted<'a> {
    /// Every series, whole.
    pub fn all() -> Wanted<'static> {
        Wanted::default()
    }

    /// The series named in `names`, whole.
    pub fn only(names: &'a [String]) -> Wanted<'a> {
        Wanted {
            whole: Some(names),
            ..Wanted::default()
        }
    }

    /// Also, of the series `names`, the first in that order that has a value, whole; the
    /// others are left unread: `["eval_loss", "loss"]` reads a job's `loss` only when it
    /// logged no `eval_loss` (the metric a report chooses by default).
    pub fn first_of(self, names: &'a [String]) -> Wanted<'a> {
        Wanted {
            first_of: names,
            ..self
        }
    }

    /// Also the last value of each series in `names` (a series read whole already stays so).
    pub fn last(self, names: &'a [String]) -> Wanted<'a> {
        Wanted {
            last: names,
            ..self
        }
    }

    /// This, with the series read for their last value read whole.
    fn lasts_whole(self) -> Wanted<'a> {
        Wanted {
            lasts_whole: true,
            ..self
        }
    }

    fn read_as(&self, name: &str) -> Option<ReadAs> {
        let Some(whole) = self.whole else {
            return Some(ReadAs::Whole { rank: None });
        };
        if whole.iter().any(|w| w == name) {
            return Some(ReadAs::Whole { rank: None });
        }
        if let Some(rank) = self.first_of.iter().position(|f| f == name) {
            return Some(ReadAs::Whole { rank: Some(rank) });
        }
        if self.last.iter().any(|l| l == name) {
            return Some(if self.lasts_whole {
                ReadAs::Whole { rank: None }
            } else {
                ReadAs::Last
            });
        }
        None
    }
}

/// Reads the metrics of `job_dir` (never fails: problems are reported in the result).
pub fn read_job_metrics(job_dir: &Path) -> JobMetrics {
    read_job_metrics_wanted(job_dir, &Wanted::all())
}

/// Reads the series of `job_dir` named in `only` (all of them when `None`). A `metrics.csv`
/// cell of any other column is not even parsed: a sweep's best-so-far reads its metric alone.
pub fn read_job_metrics_named(job_dir: &Path, only: Option<&[String]>) -> JobMetrics {
    match only {
        Some(names) => read_job_metrics_wanted(job_dir, &Wanted::only(names)),
        None => read_job_metrics(job_dir),
    }
}

/// Reads the series of `job_dir` that are [`Wanted`], as much of each as it says.
pub fn read_job_metrics_wanted(job_dir: &Path, wanted: &Wanted) -> JobMetrics {
    // Read at once: asking first whether the file exists would cost a system call per job.
    let csv = job_dir.join(METRICS_CSV);
    match with_file_bytes(&csv, |bytes| read_csv(&csv, bytes, wanted)) {
        Ok(metrics) => return metrics,
        Err(e) if e.kind() != std::io::ErrorKind::NotFound && !csv.is_dir() => {
            return JobMetrics {
                source: Some(csv),
                problem: Some(format!("cannot read {METRICS_CSV}: {e}")),
                ..JobMetrics::default()
            };
        }
        Err(_) => {}
    }
    let jsonl = job_dir.join(METRICS_JSONL);
    let mut out = if jsonl.is_file() {
        read_jsonl(&jsonl)
    } else {
        let mut files = events::event_files(&job_dir.join(events::TB_DIR));
        if files.is_empty() {
            files = events::event_files(job_dir);
        }
        if files.is_empty() {
            return JobMetrics {
                problem: Some("no metrics file yet".into()),
                ..JobMetrics::default()
            };
        }
        read_tfevents(&files)
    };
    out.last_record_step = out.last_step();
    if wanted.whole.is_some() {
        // Of the series `first_of`, the first with a value.
        let first = wanted
            .first_of
            .iter()
            .find(|name| out.series.get(*name).is_some_and(|s| !s.is_empty()));
        let mut unread = Vec::new();
        out.series.retain(|name, _| {
            let keep = match wanted.read_as(name) {
                Some(ReadAs::Whole { rank: Some(_) }) => Some(name) == first,
                read => read.is_some(),
            };
            if !keep {
                unread.push(name.clone());
            }
            keep
        });
        out.unread = unread;
        keep_last_values(&mut out, wanted);
    }
    out
}

/// Bytes kept between two reads on one thread: a sweep's files are read into the same buffer,
/// which is let go of only after a file larger than this.
const KEPT_BUFFER_BYTES: usize = 1 << 20;

thread_local! {
    static FILE_BUFFER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `f` of the bytes of the file at `path`, read into this thread's buffer: no allocation and
/// no `stat` of the file per read (`std::fs::read` asks for the size first), which on a
/// sweep of thousands of jobs is a system call less per job.
fn with_file_bytes<T>(path: &Path, f: impl FnOnce(&[u8]) -> T) -> std::io::Result<T> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    FILE_BUFFER.with(|buffer| {
        // A re-entrant call (none today) would get a buffer of its own.
        let mut own = Vec::new();
        let mut borrowed = buffer.try_borrow_mut();
        let bytes = match borrowed.as_deref_mut() {
            Ok(kept) => kept,
            Err(_) => &mut own,
        };
        bytes.clear();
        if bytes.capacity() == 0 {
            bytes.reserve(64 * 1024);
        }
        let read = file.read_to_end(bytes);
        let out = read.map(|_| f(bytes));
        if bytes.capacity() > KEPT_BUFFER_BYTES {
            *bytes = Vec::new();
        }
        out
    })
}

fn push(series: &mut IndexMap<String, Series>, name: &str, step: u64, value: f64) {
    series
        .entry(name.to_string())
        .or_default()
        .push((step, value));
}

/// `metrics.csv`: a header with a `step` column; empty cells are skipped; a last line cut
/// short by a writer at work is ignored.
fn read_csv(path: &Path, text: &[u8], wanted: &Wanted) -> JobMetrics {
    let mut out = JobMetrics {
        source: Some(path.to_path_buf()),
        ..JobMetrics::default()
    };
    if text.iter().all(|b| b.is_ascii_whitespace()) {
        out.problem = Some(format!("{METRICS_CSV} is empty"));
        return out;
    }
    // A last line without its newline may be cut short: keep it only when it parses whole.
    let complete = text.ends_with(b"\n");
    // The trainer's file holds numbers only, never a quote: its lines are split by hand (one
    // buffer of cells for all of them), which on a sweep of thousands of jobs is most of the
    // time a report takes. A file with quotes goes through the CSV reader.
    if let (None, Ok(text)) = (memchr::memchr(b'"', text), std::str::from_utf8(text)) {
        if read_plain_csv(&mut out, text, complete, wanted) {
            return out;
        }
        // A last value that is not a number: the series' last numbers, read whole.
        let mut out = JobMetrics {
            source: Some(path.to_path_buf()),
            ..JobMetrics::default()
        };
        read_plain_csv(&mut out, text, complete, &wanted.lasts_whole());
        keep_last_values(&mut out, wanted);
        return out;
    }
    let mut reader = csv::ReaderBuilder::new().flexible(true).from_reader(text);
    let headers: Vec<String> = match reader.headers() {
        Ok(h) => h.iter().map(|s| s.trim().to_string()).collect(),
        Err(e) => {
            out.problem = Some(format!("{METRICS_CSV}: unreadable header: {e}"));
            return out;
        }
    };
    let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
    // The last values too are read whole here (a record's cells do not outlive it).
    let Some(mut rows) = CsvRows::new(&mut out, &headers, &wanted.lasts_whole(), 0) else {
        return out;
    };
    let mut records = reader.records().enumerate().peekable();
    while let Some((i, record)) = records.next() {
        let Ok(record) = record else {
            out.problem = Some(format!("{METRICS_CSV}: row {} is malformed", i + 2));
            continue;
        };
        let cells: Vec<&str> = record.iter().collect();
        let last_and_cut = records.peek().is_none() && !complete;
        if !rows.row(&mut out, i, &cells, last_and_cut, &mut []) {
            break;
        }
    }
    rows.finish(&mut out, &headers, &[]);
    keep_last_values(&mut out, wanted);
    out
}

/// A line without its `\r`; `None` for an empty one (skipped).
fn content(line: &str) -> Option<&str> {
    let line = line.strip_suffix('\r').unwrap_or(line);
    (!line.is_empty()).then_some(line)
}

/// A `metrics.csv` without quotes, `complete` when it ends with a newline. `false` when the
/// last value of a series read for its last value only is not a number: the caller reads the
/// file again with that series whole.
fn read_plain_csv(out: &mut JobMetrics, text: &str, complete: bool, wanted: &Wanted) -> bool {
    // Where the last line with content starts: the one a writer may be cutting short.
    let last_start = text
        .rsplit('\n')
        .find(|l| content(l).is_some())
        .map(|l| l.as_ptr() as usize - text.as_ptr() as usize);
    let mut lines = text.split('\n').filter_map(content);
    let Some(header) = lines.next() else {
        out.problem = Some(format!("{METRICS_CSV} is empty"));
        return true;
    };
    let headers: Vec<&str> = header.split(',').map(str::trim).collect();
    // Room for about a value per line in each series read whole (the file's size over its
    // first row's), so that they do not grow as they fill.
    let header_end = header.as_ptr() as usize - text.as_ptr() as usize + header.len();
    let rows_hint = text[header_end..]
        .split('\n')
        .find_map(content)
        .map_or(0, |l| text.len() / (l.len() + 1) + 1);
    let Some(mut rows) = CsvRows::new(out, &headers, wanted, rows_hint) else {
        return true;
    };
    let mut last_cells = vec![None; rows.last.len()];
    let mut cells: Vec<&str> = Vec::with_capacity(headers.len());
    for (i, line) in lines.enumerate() {
        split_commas(line, &mut cells);
        let start = line.as_ptr() as usize - text.as_ptr() as usize;
        let last_and_cut = !complete && Some(start) == last_start;
        if !rows.row(out, i, &cells, last_and_cut, &mut last_cells) {
            break;
        }
    }
    rows.finish(out, &headers, &last_cells)
}

/// The cells of an unquoted CSV line into `cells` (cleared first). The commas are found
/// eight bytes at a time: cells of a few characters are too short for a search per cell.
fn split_commas<'a>(line: &'a str, cells: &mut Vec<&'a str>) {
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    const COMMAS: u64 = 0x2c2c_2c2c_2c2c_2c2c;
    cells.clear();
    let bytes = line.as_bytes();
    let mut start = 0;
    let mut chunks = bytes.chunks_exact(8);
    for (k, chunk) in chunks.by_ref().enumerate() {
        let word = u64::from_le_bytes(chunk.try_into().expect("8 bytes")) ^ COMMAS;
        // The high bit of each byte that was a comma (now zero), and of no other byte.
        let mut commas = !((((word & LOW7) + LOW7) | word) | LOW7);
        while commas != 0 {
            let i = k * 8 + (commas.trailing_zeros() / 8) as usize;
            cells.push(&line[start..i]);
            start = i + 1;
            commas &= commas - 1;
        }
    }
    let tail = bytes.len() - chunks.remainder().len();
    for (i, b) in chunks.remainder().iter().enumerate() {
        if *b == b',' {
            cells.push(&line[start..tail + i]);
            start = tail + i + 1;
        }
    }
    cells.push(&line[start..]);
}

/// `cell.trim()`, without its search when the cell neither starts nor ends with a space or a
/// byte of a longer character (the trainer's cells never do).
fn trim(cell: &str) -> &str {
    let plain = |b: u8| b.is_ascii() && !b.is_ascii_whitespace() && b != 0x0b;
    match (cell.as_bytes().first(), cell.as_bytes().last()) {
        (Some(&first), Some(&last)) if plain(first) && plain(last) => cell,
        _ => cell.trim(),
    }
}

/// A column whose values are read into a series.
struct ReadColumn {
    col: usize,
    /// Its index in `out.series`.
    series: usize,
    /// Its place in [`Wanted::first_of`], when it is one of those.
    rank: Option<usize>,
    /// A cell of it has been seen with something in it.
    seen: bool,
    /// Outranked by an earlier series of [`Wanted::first_of`]: its values are let go of and
    /// only a last row cut short is parsed (to say so), as a column read would be.
    outranked: bool,
}

/// A column of which only the last value is read (its last cell with something in it, kept
/// by the caller, is parsed at the end).
struct LastColumn {
    col: usize,
    series: usize,
}

/// The step and the text of the last cell with something in it of each [`LastColumn`].
type LastCells<'c> = [Option<(u64, &'c str)>];

/// What becomes of a CSV's rows: where the step is, which column fills which series, which
/// columns are not read (and whether any row has a value in them).
struct CsvRows {
    columns: usize,
    step_col: usize,
    read: Vec<ReadColumn>,
    last: Vec<LastColumn>,
    /// `(column, seen a value)` of each column not read.
    unread: Vec<(usize, bool)>,
}

impl CsvRows {
    /// The plan for `headers` (the series `wanted`), the series created in `out` with room for
    /// `rows` values; `None`, with the problem in `out`, without a `step` column.
    fn new(
        out: &mut JobMetrics,
        headers: &[&str],
        wanted: &Wanted,
        rows: usize,
    ) -> Option<CsvRows> {
        let Some(step_col) = headers.iter().position(|h| *h == "step") else {
            out.problem = Some(format!("{METRICS_CSV} has no 'step' column"));
            return None;
        };
        let mut read = Vec::new();
        let mut last = Vec::new();
        let mut unread = Vec::new();
        for (col, name) in headers.iter().enumerate() {
            if col == step_col {
                continue;
            }
            match wanted.read_as(name) {
                Some(ReadAs::Whole { rank }) => {
                    let (series, _) = out
                        .series
                        .insert_full(name.to_string(), Vec::with_capacity(rows));
                    read.push(ReadColumn {
                        col,
                        series,
                        rank,
                        seen: false,
                        outranked: false,
                    });
                }
                Some(ReadAs::Last) => {
                    let (series, _) = out.series.insert_full(name.to_string(), Vec::new());
                    last.push(LastColumn { col, series });
                }
                None => unread.push((col, false)),
            }
        }
        Some(CsvRows {
            columns: headers.len(),
            step_col,
            read,
            last,
            unread,
        })
    }

    /// Row `i` (0 for the first after the header), the last cells of the [`LastColumn`]s
    /// kept in `last_cells`; `false` to stop (a last row cut short).
    fn row<'c>(
        &mut self,
        out: &mut JobMetrics,
        i: usize,
        cells: &[&'c str],
        last_and_cut: bool,
        last_cells: &mut LastCells<'c>,
    ) -> bool {
        if last_and_cut && cells.len() != self.columns {
            out.problem = Some(format!("{METRICS_CSV}: its last row is cut short"));
            return false;
        }
        let Some(step) = cells
            .get(self.step_col)
            .and_then(|s| trim(s).parse::<u64>().ok())
        else {
            out.problem = Some(format!("{METRICS_CSV}: row {} has no step", i + 2));
            return true;
        };
        out.last_record_step = out.last_record_step.max(Some(step));
        for (col, seen) in self.unread.iter_mut().filter(|(_, seen)| !seen) {
            *seen = cells.get(*col).is_some_and(|c| !trim(c).is_empty());
        }
        let mut outranked: Option<usize> = None;
        for column in &mut self.read {
            let Some(cell) = cells.get(column.col).map(|c| trim(c)) else {
                continue;
            };
            if cell.is_empty() {
                continue;
            }
            column.seen = true;
            if column.outranked && !last_and_cut {
                continue;
            }
            match parse_number(cell) {
                Some(_) if column.outranked => {}
                Some(v) => {
                    let series = &mut out.series[column.series];
                    if series.is_empty() {
                        if let Some(rank) = column.rank {
                            outranked = Some(outranked.map_or(rank, |r| r.min(rank)));
                        }
                    }
                    series.push((step, v));
                }
                None if last_and_cut => {
                    out.problem = Some(format!("{METRICS_CSV}: its last row is cut short"));
                }
                None => {}
            }
        }
        for (column, last) in self.last.iter().zip(last_cells.iter_mut()) {
            let Some(cell) = cells.get(column.col).map(|c| trim(c)) else {
                continue;
            };
            if cell.is_empty() {
                continue;
            }
            if !last_and_cut || parse_number(cell).is_some() {
                *last = Some((step, cell));
            } else {
                out.problem = Some(format!("{METRICS_CSV}: its last row is cut short"));
            }
        }
        if let Some(rank) = outranked {
            self.outrank(out, rank);
        }
        true
    }

    /// A series of [`Wanted::first_of`] at `rank` has its first value: those after it are
    /// not read any more (their values so far let go of), and named as columns not read.
    fn outrank(&mut self, out: &mut JobMetrics, rank: usize) {
        for column in &mut self.read {
            if column.rank.is_some_and(|r| r > rank) && !column.outranked {
                column.outranked = true;
                out.series[column.series] = Vec::new();
            }
        }
    }

    /// Parses the last values, drops the series without a value and names the columns with
    /// values left unread; `false` when a last value is not a number.
    fn finish(self, out: &mut JobMetrics, headers: &[&str], last_cells: &LastCells) -> bool {
        let mut numbers = true;
        for (column, last) in self.last.iter().zip(last_cells) {
            if let Some((step, cell)) = *last {
                match parse_number(cell) {
                    Some(v) => out.series[column.series].push((step, v)),
                    None => numbers = false,
                }
            }
        }
        // Room left over is let go of: a sweep of thousands of jobs keeps their series.
        out.series.retain(|_, s| {
            s.shrink_to_fit();
            !s.is_empty()
        });
        let mut unread = self.unread;
        unread.extend(
            self.read
                .iter()
                .filter(|c| c.outranked)
                .map(|c| (c.col, c.seen)),
        );
        unread.sort_unstable();
        out.unread = unread
            .into_iter()
            .filter(|(_, seen)| *seen)
            .map(|(col, _)| headers[col].to_string())
            .collect();
        numbers
    }
}

/// Cuts the series `wanted` for their last value only down to it.
fn keep_last_values(out: &mut JobMetrics, wanted: &Wanted) {
    for name in wanted.last {
        if wanted.read_as(name) == Some(ReadAs::Last) {
            if let Some(series) = out.series.get_mut(name) {
                let last = series.pop();
                series.clear();
                series.extend(last);
            }
        }
    }
}

/// A number as Python, pandas or Rust print it (`nan`, `NaN`, `inf`, `-Infinity`, ...).
fn parse_number(cell: &str) -> Option<f64> {
    if let Ok(v) = cell.parse() {
        return Some(v);
    }
    match cell.to_ascii_lowercase().as_str() {
        "nan" => Some(f64::NAN),
        "inf" | "infinity" | "+inf" => Some(f64::INFINITY),
        "-inf" | "-infinity" => Some(f64::NEG_INFINITY),
        _ => None,
    }
}

/// `metrics.jsonl`: one object per line with an integer `step` and numeric fields.
fn read_jsonl(path: &Path) -> JobMetrics {
    let mut out = JobMetrics {
        source: Some(path.to_path_buf()),
        ..JobMetrics::default()
    };
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            out.problem = Some(format!("cannot read {METRICS_JSONL}: {e}"));
            return out;
        }
    };
    if text.trim().is_empty() {
        out.problem = Some(format!("{METRICS_JSONL} is empty"));
        return out;
    }
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let object = match serde_json::from_str::<serde_json::Value>(line) {
            Ok(serde_json::Value::Object(o)) => o,
            _ if i + 1 == lines.len() && !text.ends_with('\n') => {
                out.problem = Some(format!("{METRICS_JSONL}: its last line is cut short"));
                break;
            }
            _ => {
                out.problem = Some(format!(
                    "{METRICS_JSONL}: line {} is not a JSON object",
                    i + 1
                ));
                continue;
            }
        };
        let Some(step) = object.get("step").and_then(serde_json::Value::as_u64) else {
            out.problem = Some(format!("{METRICS_JSONL}: line {} has no step", i + 1));
            continue;
        };
        for (name, value) in &object {
            let number = match value {
                serde_json::Value::Number(n) => n.as_f64(),
                serde_json::Value::String(s) => parse_number(s),
                _ => None,
            };
            if let (Some(v), true) = (number, name != "step") {
                push(&mut out.series, name, step, v);
            }
        }
    }
    out
}

/// TensorBoard event files, oldest first; negative steps are skipped.
fn read_tfevents(files: &[PathBuf]) -> JobMetrics {
    let mut out = JobMetrics {
        source: files.last().cloned(),
        ..JobMetrics::default()
    };
    for file in files {
        match events::read_event_file(file) {
            Ok(events) => {
                for s in events.scalars {
                    if let Ok(step) = u64::try_from(s.step) {
                        push(&mut out.series, &s.tag, step, s.value);
                    }
                }
                if let Some(why) = events.stopped {
                    out.problem = Some(format!("{}: {why}", file.display()));
                }
            }
            Err(e) => out.problem = Some(e.to_string()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn csv_text(text: &str) -> JobMetrics {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(METRICS_CSV), text).unwrap();
        read_job_metrics(dir.path())
    }

    #[test]
    fn csv_with_sparse_eval_columns() {
        let m = csv_text("step,loss,eval_loss\n0,2.5,\n1,2.0,2.2\n2,1.5,\n");
        assert_eq!(m.get("loss").unwrap(), &vec![(0, 2.5), (1, 2.0), (2, 1.5)]);
        assert_eq!(m.get("eval_loss").unwrap(), &vec![(1, 2.2)]);
        assert_eq!(m.last_step(), Some(2));
        assert_eq!(m.problem, None);
    }

    #[test]
    fn csv_cut_short_keeps_complete_rows() {
        let m = csv_text("step,loss,eval_loss\n0,2.5,\n1,2.");
        assert_eq!(m.get("loss").unwrap(), &vec![(0, 2.5)]);
        assert!(m.problem.unwrap().contains("cut short"));
    }

    #[test]
    fn csv_with_nan_and_empty_files() {
        let m = csv_text("step,loss\n0,2.5\n1,nan\n");
        assert!(m.get("loss").unwrap()[1].1.is_nan());
        assert!(csv_text("").problem.unwrap().contains("empty"));
        assert!(csv_text("a,b\n1,2\n")
            .problem
            .unwrap()
            .contains("no 'step'"));
    }

    #[test]
    fn quoted_and_plain_files_read_the_same() {
        let plain = "step,loss,eval_loss\r\n0,2.5,\r\n\r\n1,2.0,2.2\r\n2,1.5,\r\n";
        let quoted = "\"step\",loss,\"eval_loss\"\n0,2.5,\n1,\"2.0\",2.2\n2,1.5,\n";
        let (a, b) = (csv_text(plain), csv_text(quoted));
        assert_eq!(a.series, b.series);
        assert_eq!(a.get("eval_loss").unwrap(), &vec![(1, 2.2)]);
        assert_eq!((a.problem, b.problem), (None, None));
        let cut = csv_text("step,loss,eval_loss\n0,2.5,\n1,\"2.");
        assert_eq!(cut.get("loss").unwrap(), &vec![(0, 2.5)]);
        assert!(cut.problem.unwrap().contains("cut short"));
    }

    #[test]
    fn jsonl_metrics() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(METRICS_JSONL),
            "{\"step\": 0, \"loss\": 3.0}\n{\"step\": 5, \"loss\": 2.0, \"acc\": 0.5}\n{\"step\": 6",
        )
        .unwrap();
        let m = read_job_metrics(dir.path());
        assert_eq!(m.get("loss").unwrap(), &vec![(0, 3.0), (5, 2.0)]);
        assert_eq!(m.get("acc").unwrap(), &vec![(5, 0.5)]);
        assert!(m.problem.unwrap().contains("cut short"));
    }

    #[test]
    fn only_the_named_series_are_read() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(METRICS_CSV),
            "step,loss,lr,eval_loss\n0,2.5,0.1,\n1,2.0,0.1,2.2\n2,Infinity,x,\n",
        )
        .unwrap();
        let only = ["eval_loss".to_string(), "loss".to_string()];
        let m = read_job_metrics_named(dir.path(), Some(&only));
        assert_eq!(m.series.keys().collect::<Vec<_>>(), ["loss", "eval_loss"]);
        // What was left unread is still known by name, and the last row by its step.
        assert_eq!(m.unread, ["lr"]);
        assert_eq!(m.logged().collect::<Vec<_>>(), ["loss", "eval_loss", "lr"]);
        let eval_only = read_job_metrics_named(dir.path(), Some(&only[..1]));
        assert_eq!(eval_only.last_step(), Some(2));
        assert_eq!(m.get("loss").unwrap()[..2], [(0, 2.5), (1, 2.0)]);
        assert_eq!(m.get("loss").unwrap()[2].1, f64::INFINITY);
        assert_eq!(m.get("eval_loss").unwrap(), &vec![(1, 2.2)]);
        let all = read_job_metrics(dir.path());
        assert_eq!(all.get("lr").unwrap(), &vec![(0, 0.1), (1, 0.1)]);
        std::fs::remove_file(dir.path().join(METRICS_CSV)).unwrap();
        std::fs::write(
            dir.path().join(METRICS_JSONL),
            "{\"step\": 0, \"loss\": 3.0, \"acc\": 0.5}\n",
        )
        .unwrap();
        let m = read_job_metrics_named(dir.path(), Some(&only));
        assert_eq!(m.series.keys().collect::<Vec<_>>(), ["loss"]);
        assert_eq!(m.unread, ["acc"]);
    }

    #[test]
    fn no_metrics_is_a_problem_not_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let m = read_job_metrics(dir.path());
        assert!(m.series.is_empty());
        assert_eq!(m.problem.as_deref(), Some("no metrics file yet"));
    }

    fn names(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    fn read_text(text: &str, wanted: &Wanted) -> JobMetrics {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(METRICS_CSV), text).unwrap();
        read_job_metrics_wanted(dir.path(), wanted)
    }

    #[test]
    fn of_the_first_of_series_only_the_first_with_a_value_is_read() {
        let first_of = names(&["eval_loss", "loss"]);
        let none: [String; 0] = [];
        let wanted = Wanted::only(&none).first_of(&first_of);
        // `eval_loss` logged: `loss` is left unread, though read until `eval_loss` had a value.
        let m = read_text(
            "step,loss,lr,eval_loss\n0,2.5,0.1,\n1,2.0,0.1,2.2\n2,1.5,0.1,\n",
            &wanted,
        );
        assert_eq!(m.series.keys().collect::<Vec<_>>(), ["eval_loss"]);
        assert_eq!(m.get("eval_loss").unwrap(), &vec![(1, 2.2)]);
        assert_eq!(m.unread, ["loss", "lr"]);
        assert_eq!(m.last_step(), Some(2));
        // No `eval_loss`: `loss` is read whole.
        let m = read_text("step,loss,eval_loss\n0,2.5,\n1,2.0,\n", &wanted);
        assert_eq!(m.get("loss").unwrap(), &vec![(0, 2.5), (1, 2.0)]);
        assert!(m.get("eval_loss").is_none());
        // A column left unread is still checked on a last row cut short.
        let m = read_text("step,eval_loss,loss\n0,2.2,2.5\n1,2.1,2.", &wanted);
        assert_eq!(m.get("eval_loss").unwrap(), &vec![(0, 2.2), (1, 2.1)]);
        assert!(m.problem.is_none());
        let whole = read_text("step,eval_loss,loss\n0,2.2,2.5\n1,2.1,2.e", &Wanted::all());
        let first = read_text("step,eval_loss,loss\n0,2.2,2.5\n1,2.1,2.e", &wanted);
        assert_eq!(whole.get("eval_loss"), first.get("eval_loss"));
        assert_eq!(whole.problem, first.problem);
        // A series named both whole and first_of is read whole.
        let both = names(&["loss"]);
        let m = read_text(
            "step,loss,eval_loss\n0,2.5,2.2\n",
            &Wanted::only(&both).first_of(&first_of),
        );
        assert_eq!(m.series.keys().collect::<Vec<_>>(), ["loss", "eval_loss"]);
        // The same rule for metrics.jsonl.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(METRICS_JSONL),
            "{\"step\": 0, \"loss\": 3.0}\n{\"step\": 1, \"loss\": 2.0, \"eval_loss\": 2.5}\n",
        )
        .unwrap();
        let m = read_job_metrics_wanted(dir.path(), &wanted);
        assert_eq!(m.series.keys().collect::<Vec<_>>(), ["eval_loss"]);
        assert_eq!(m.unread, ["loss"]);
    }

    #[test]
    fn a_series_read_for_its_last_value_has_the_last_number() {
        let last = names(&["elapsed_s"]);
        let none: [String; 0] = [];
        let wanted = Wanted::only(&none).last(&last);
        let m = read_text("step,elapsed_s\n0,0.5\n1,1.0\n2,\n", &wanted);
        assert_eq!(m.get("elapsed_s").unwrap(), &vec![(1, 1.0)]);
        // The last cell is not a number: the last one that is.
        let m = read_text("step,elapsed_s\n0,0.5\n1,1.0\n2,x\n", &wanted);
        assert_eq!(m.get("elapsed_s").unwrap(), &vec![(1, 1.0)]);
        // A last row cut short: the row before it, and the problem said.
        let text = "step,elapsed_s\n0,0.5\n1,1.0\n2,1.";
        let m = read_text(text, &wanted);
        assert_eq!(m.get("elapsed_s").unwrap(), &vec![(2, 1.0)]);
        assert_eq!(m.problem, read_text(text, &Wanted::all()).problem);
        let text = "step,elapsed_s\n0,0.5\n1,1.0\n2,1.e";
        let m = read_text(text, &wanted);
        assert_eq!(m.get("elapsed_s").unwrap(), &vec![(1, 1.0)]);
        assert_eq!(m.problem, read_text(text, &Wanted::all()).problem);
        // Quoted files and metrics.jsonl alike.
        let m = read_text("step,\"elapsed_s\"\n0,0.5\n1,\"1.0\"\n", &wanted);
        assert_eq!(m.get("elapsed_s").unwrap(), &vec![(1, 1.0)]);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(METRICS_JSONL),
            "{\"step\": 0, \"elapsed_s\": 3.0}\n{\"step\": 1, \"elapsed_s\": 4.0}\n",
        )
        .unwrap();
        let m = read_job_metrics_wanted(dir.path(), &wanted);
        assert_eq!(m.get("elapsed_s").unwrap(), &vec![(1, 4.0)]);
        // Named whole too: whole.
        let m = read_text(
            "step,elapsed_s\n0,0.5\n1,1.0\n",
            &Wanted::only(&last).last(&last),
        );
        assert_eq!(m.get("elapsed_s").unwrap(), &vec![(0, 0.5), (1, 1.0)]);
    }

    /// `series` as [`Wanted`] would have them read, from the same series read whole.
    fn as_wanted(all: &JobMetrics, wanted: &Wanted) -> IndexMap<String, Series> {
        let first = wanted
            .first_of
            .iter()
            .find(|n| all.get(n).is_some())
            .cloned();
        all.series
            .iter()
            .filter_map(|(name, series)| match wanted.read_as(name)? {
                ReadAs::Whole { rank: Some(_) } if Some(name) != first.as_ref() => None,
                ReadAs::Last => Some((name.clone(), series.last().into_iter().copied().collect())),
                _ => Some((name.clone(), series.clone())),
            })
            .collect()
    }

    proptest::proptest! {
        #[test]
        fn cells_split_and_trim_as_the_standard_library_does(line in "[a-c1 ,\t\u{b}é\u{a0}]{0,40}") {
            let mut cells = Vec::new();
            split_commas(&line, &mut cells);
            proptest::prop_assert_eq!(&cells, &line.split(',').collect::<Vec<_>>());
            for cell in cells {
                proptest::prop_assert_eq!(trim(cell), cell.trim());
            }
        }

        #[test]
        fn wanted_series_are_the_whole_series_cut_by_the_rules(
            rows in proptest::collection::vec(
                proptest::collection::vec("|1|2.5|-0.25|nan|x| 3 |1e", 4), 0..12),
            steps_ok in proptest::collection::vec(proptest::bool::ANY, 12),
            cut in proptest::bool::ANY,
            quoted in proptest::bool::ANY,
        ) {
            let mut text = String::from("step,eval_loss,loss,elapsed_s,lr\n");
            for (i, cells) in rows.iter().enumerate() {
                let step = if steps_ok[i] { i.to_string() } else { "?".into() };
                let cells: Vec<String> = cells
                    .iter()
                    .map(|c| if quoted && !c.is_empty() { format!("\"{c}\"") } else { c.clone() })
                    .collect();
                text.push_str(&format!("{step},{}\n", cells.join(",")));
            }
            if cut && text.len() > 40 {
                text.pop();
                text.pop();
            }
            let first_of = names(&["eval_loss", "loss"]);
            let last = names(&["elapsed_s"]);
            let none: [String; 0] = [];
            let wanted = Wanted::only(&none).first_of(&first_of).last(&last);
            // The same columns read whole (a column not read is not checked for a row cut
            // short either way).
            let columns = names(&["eval_loss", "loss", "elapsed_s"]);
            let all = read_text(&text, &Wanted::only(&columns));
            let some = read_text(&text, &wanted);
            // Compared by their text: a NaN is not equal to itself.
            proptest::prop_assert_eq!(
                format!("{:?}", some.series),
                format!("{:?}", as_wanted(&all, &wanted))
            );
            proptest::prop_assert_eq!(&some.problem, &all.problem);
            proptest::prop_assert_eq!(some.last_record_step, all.last_record_step);
            proptest::prop_assert_eq!(some.last_step(), all.last_step());
        }
    }
}
