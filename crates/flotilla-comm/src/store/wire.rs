//! The store's wire codec: the frame layout, the opcodes and error kinds, the protocol's limits,
//! and the encoder ([`Enc`]) and decoder ([`Dec`]) of frames and their payloads. The server
//! and the client both speak through it; neither builds bytes by hand.

use std::io::{self, Read};
use std::time::Duration;

/// First bytes of every hello payload.
pub const PROTOCOL_MAGIC: [u8; 8] = *b"FLOTSTOR";
/// Version of the wire protocol; client and server must agree.
pub const PROTOCOL_VERSION: u32 = 1;
/// Longest key (and barrier name), in bytes.
pub const MAX_KEY_LEN: usize = 4096;
/// Largest value, in bytes.
pub const MAX_VALUE_LEN: usize = 64 << 20;
/// Longest run id, in bytes.
pub const MAX_RUN_ID_LEN: usize = 1024;

/// Largest frame accepted before a hello succeeded (so garbage cannot make us allocate).
pub(super) const MAX_HELLO_FRAME: usize = 64 + MAX_RUN_ID_LEN;
/// Largest frame accepted after the hello.
pub(super) const MAX_FRAME: usize = MAX_VALUE_LEN + MAX_KEY_LEN + 64;
/// Most keys one `wait` may name.
pub(super) const MAX_WAIT_KEYS: usize = 65536;
/// Timeouts are capped here so deadlines never overflow.
pub(super) const MAX_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);

pub(super) mod op {
    pub const HELLO: u8 = 0x01;
    pub const SET: u8 = 0x02;
    pub const GET: u8 = 0x03;
    pub const ADD: u8 = 0x04;
    pub const WAIT: u8 = 0x05;
    pub const DELETE: u8 = 0x06;
    pub const BARRIER: u8 = 0x07;

    pub const OK: u8 = 0x80;
    pub const VALUE: u8 = 0x81;
    pub const INT: u8 = 0x82;
    pub const BOOL: u8 = 0x83;
    pub const TIMEOUT: u8 = 0x84;
    pub const ERR: u8 = 0x85;
}

/// Kinds of `ERR` answers.
pub(super) mod err_kind {
    pub const REJECTED: u8 = 1;
    pub const BAD_REQUEST: u8 = 2;
    pub const REFUSED: u8 = 3;
    pub const SHUTTING_DOWN: u8 = 4;
    pub const PEER_LEFT: u8 = 5;
}

/// Hello flag: this is the rank's first connection (the one the server tracks for joins).
pub(super) const FLAG_PRIMARY: u8 = 1;

/// Builds one frame.
pub(super) struct Enc(Vec<u8>);

impl Enc {
    pub(super) fn new(opcode: u8) -> Enc {
        Enc(vec![0, 0, 0, 0, opcode])
    }
    pub(super) fn u8(mut self, v: u8) -> Enc {
        self.0.push(v);
        self
    }
    pub(super) fn u32(mut self, v: u32) -> Enc {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(super) fn u64(mut self, v: u64) -> Enc {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(super) fn i64(mut self, v: i64) -> Enc {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(super) fn bytes(self, v: &[u8]) -> Enc {
        let mut e = self.u32(v.len() as u32);
        e.0.extend_from_slice(v);
        e
    }
    pub(super) fn str(self, v: &str) -> Enc {
        self.bytes(v.as_bytes())
    }
    pub(super) fn raw(mut self, v: &[u8]) -> Enc {
        self.0.extend_from_slice(v);
        self
    }
    pub(super) fn finish(mut self) -> Vec<u8> {
        let len = (self.0.len() - 4) as u32;
        self.0[..4].copy_from_slice(&len.to_le_bytes());
        self.0
    }
}

/// Reads a payload.
pub(super) struct Dec<'a> {
    pub(super) buf: &'a [u8],
}

impl<'a> Dec<'a> {
    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.buf.len() < n {
            return Err(format!(
                "message truncated (wanted {n} more bytes, have {})",
                self.buf.len()
            ));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }
    pub(super) fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }
    pub(super) fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    pub(super) fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    pub(super) fn i64(&mut self) -> Result<i64, String> {
        Ok(i64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    pub(super) fn bytes(&mut self) -> Result<&'a [u8], String> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    pub(super) fn str(&mut self) -> Result<String, String> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec()).map_err(|_| "a string is not UTF-8".to_string())
    }
    pub(super) fn key(&mut self) -> Result<String, String> {
        let k = self.str()?;
        if k.len() > MAX_KEY_LEN {
            return Err(format!(
                "key of {} bytes is over the limit of {MAX_KEY_LEN}",
                k.len()
            ));
        }
        Ok(k)
    }
    pub(super) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.buf)
    }
    pub(super) fn end(&self) -> Result<(), String> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(format!("{} unexpected trailing bytes", self.buf.len()))
        }
    }
}

#[derive(Debug)]
pub(super) enum FrameError {
    /// The peer closed the connection cleanly before a new frame.
    Closed,
    /// The announced length is zero or over the limit; `head` are the first four bytes.
    BadLength {
        len: u32,
        head: [u8; 4],
    },
    Io(io::Error),
}

pub(super) fn read_frame(r: &mut impl Read, limit: usize) -> Result<(u8, Vec<u8>), FrameError> {
    let mut head = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match r.read(&mut head[got..]) {
            Ok(0) if got == 0 => return Err(FrameError::Closed),
            Ok(0) => return Err(FrameError::Io(io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(FrameError::Io(e)),
        }
    }
    let len = u32::from_le_bytes(head);
    if len == 0 || len as usize > limit {
        return Err(FrameError::BadLength { len, head });
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body).map_err(FrameError::Io)?;
    let opcode = body[0];
    body.remove(0);
    Ok((opcode, body))
}

pub(super) fn err_frame(kind: u8, message: &str) -> Vec<u8> {
    Enc::new(op::ERR).u8(kind).str(message).finish()
}

pub(super) fn timeout_frame(missing: &[usize], detail: &str) -> Vec<u8> {
    let mut e = Enc::new(op::TIMEOUT).u32(missing.len() as u32);
    for &r in missing {
        e = e.u32(r as u32);
    }
    e.str(detail).finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let f = Enc::new(op::GET).u64(7).str("key").finish();
        let (code, payload) = read_frame(&mut &f[..], MAX_FRAME).unwrap();
        assert_eq!(code, op::GET);
        let mut d = Dec { buf: &payload };
        assert_eq!(d.u64().unwrap(), 7);
        assert_eq!(d.key().unwrap(), "key");
        assert!(d.end().is_ok());
        assert!(matches!(
            read_frame(&mut &b""[..], 10),
            Err(FrameError::Closed)
        ));
        assert!(matches!(
            read_frame(&mut &b"GET / HTTP/1.1"[..], 1000),
            Err(FrameError::BadLength { .. })
        ));
        assert!(matches!(
            read_frame(&mut &[5u8, 0, 0, 0, 1][..], 1000),
            Err(FrameError::Io(_))
        ));
        assert!(Dec { buf: &[1, 0, 0] }.u32().is_err());
    }
}
