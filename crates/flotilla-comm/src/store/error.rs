//! How the store fails ([`StoreError`]) and the small formatting helpers its messages share
//! (durations, rank lists, keys, raw bytes), so every error names what went wrong and who is
//! missing in the same words.

use std::fmt::Write as _;
use std::io;
use std::time::Duration;

use super::wire::MAX_KEY_LEN;

/// What went wrong with the store, precisely.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The configuration cannot work.
    #[error("invalid store configuration: {0}")]
    Config(String),
    /// Rank 0 could not listen.
    #[error("cannot bind {addr}: {reason}{hint}")]
    Bind {
        addr: String,
        reason: String,
        hint: String,
    },
    /// A rank could not connect to the master.
    #[error("cannot reach master {addr} after {} ({reason})", secs(*.waited))]
    Unreachable {
        addr: String,
        waited: Duration,
        reason: String,
    },
    /// The master turned this process away.
    #[error("the master {addr} rejected this process: {reason}")]
    Rejected { addr: String, reason: String },
    /// Something at the master's address is not a flotilla store.
    #[error("protocol error with {addr}: {detail}")]
    Protocol { addr: String, detail: String },
    /// The connection closed under an operation.
    #[error("the master closed the connection (rank 0 exited?) during {op} on {addr}")]
    MasterClosed { addr: String, op: String },
    /// The master is stopping and serves nothing new.
    #[error("the master {addr} is shutting down (rank 0 is exiting) during {op}")]
    ShuttingDown { addr: String, op: String },
    /// The master did not answer at all (it is stuck, or the network is).
    #[error("the master {addr} did not answer {op} within {}", secs(*.waited))]
    NoAnswer {
        addr: String,
        op: String,
        waited: Duration,
    },
    /// A blocking operation timed out; `detail` says who is missing, `missing` lists them.
    #[error("{op} timed out after {}: {detail}", secs(*.waited))]
    Timeout {
        op: String,
        waited: Duration,
        detail: String,
        missing: Vec<usize>,
    },
    /// A rank this operation needs has left.
    #[error("{op} failed: {detail}")]
    PeerLeft { op: String, detail: String },
    /// The master refused the operation (for instance, `add` on a key that is not a counter).
    #[error("{op} refused: {reason}")]
    Refused { op: String, reason: String },
    /// A key or value is over the limit.
    #[error("{what} is {len} bytes, over the limit of {limit} bytes")]
    TooLarge {
        what: String,
        len: usize,
        limit: usize,
    },
    /// Any other I/O error.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
}

/// `12 s`, `2.5 s`, `300 s`.
pub(super) fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if d < Duration::from_millis(100) {
        format!("{} ms", d.as_millis())
    } else if s >= 10.0 {
        format!("{s:.0} s")
    } else {
        let t = format!("{s:.1}");
        format!("{} s", t.strip_suffix(".0").unwrap_or(&t))
    }
}

/// `2`, `2,3`, `2-5,9` (runs of three or more become ranges).
fn format_ranks(ranks: &[usize]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        if !out.is_empty() {
            out.push(',');
        }
        if j >= i + 2 {
            let _ = write!(out, "{}-{}", ranks[i], ranks[j]);
        } else {
            let _ = write!(out, "{}", ranks[i]);
            if j == i + 1 {
                let _ = write!(out, ",{}", ranks[j]);
            }
        }
        i = j + 1;
    }
    out
}

/// `rank 2 of 4`, `ranks 2,3 of 4`.
pub(super) fn ranks_of(ranks: &[usize], world: usize) -> String {
    let noun = if ranks.len() == 1 { "rank" } else { "ranks" };
    format!("{noun} {} of {world}", format_ranks(ranks))
}

/// A key for messages: quoted, shortened if long.
pub(super) fn show_key(key: &str) -> String {
    if key.chars().count() > 80 {
        let head: String = key.chars().take(77).collect();
        format!("'{head}...'")
    } else {
        format!("'{key}'")
    }
}

pub(super) fn show_keys(keys: &[&str]) -> String {
    let mut shown: Vec<String> = keys.iter().take(5).map(|k| show_key(k)).collect();
    if keys.len() > 5 {
        shown.push(format!("and {} more", keys.len() - 5));
    }
    shown.join(", ")
}

/// A short, printable view of bytes received where a protocol message was expected.
pub(super) fn show_bytes(b: &[u8]) -> String {
    let mut s = String::from("\"");
    for &c in b.iter().take(16) {
        match c {
            b' '..=b'~' if c != b'"' && c != b'\\' => s.push(c as char),
            b'\r' => s.push_str("\\r"),
            b'\n' => s.push_str("\\n"),
            _ => {
                let _ = write!(s, "\\x{c:02x}");
            }
        }
    }
    s.push('"');
    s
}

pub(super) fn check_key(what: &str, key: &str) -> Result<(), StoreError> {
    if key.len() > MAX_KEY_LEN {
        return Err(StoreError::TooLarge {
            what: format!("{what} {}", show_key(key)),
            len: key.len(),
            limit: MAX_KEY_LEN,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formatting_helpers() {
        assert_eq!(format_ranks(&[2]), "2");
        assert_eq!(format_ranks(&[2, 3]), "2,3");
        assert_eq!(format_ranks(&[1, 2, 3, 4, 7, 9, 10]), "1-4,7,9,10");
        assert_eq!(ranks_of(&[2, 3], 4), "ranks 2,3 of 4");
        assert_eq!(ranks_of(&[1], 2), "rank 1 of 2");
        assert_eq!(secs(Duration::from_secs(300)), "300 s");
        assert_eq!(secs(Duration::from_millis(2500)), "2.5 s");
        assert_eq!(secs(Duration::from_secs(2)), "2 s");
        assert_eq!(secs(Duration::from_millis(2040)), "2 s");
        assert_eq!(secs(Duration::from_millis(9960)), "10 s");
        assert_eq!(secs(Duration::from_millis(42)), "42 ms");
        assert_eq!(show_bytes(b"GET /\r\n\x00"), "\"GET /\\r\\n\\x00\"");
    }
}
