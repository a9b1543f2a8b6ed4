//! The protobuf wire format, as far as TensorBoard's event files need it: a field encoder
//! ([`Message`]) and a field iterator ([`Fields`]) over varint, 64-bit, length-delimited and
//! 32-bit fields. Message layouts live with their users (`mod.rs`), by field number.

/// A message being encoded: fields appended in the order written.
#[derive(Clone, Debug, Default)]
pub struct Message {
    bytes: Vec<u8>,
}

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LENGTH_DELIMITED: u8 = 2;
const FIXED32: u8 = 5;

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

impl Message {
    pub fn new() -> Message {
        Message::default()
    }

    fn key(&mut self, field: u32, wire_type: u8) {
        put_varint(
            &mut self.bytes,
            (u64::from(field) << 3) | u64::from(wire_type),
        );
    }

    /// An `int32`/`int64`/`enum`/`bool` field (two's complement for negatives, as protobuf).
    pub fn varint(mut self, field: u32, value: i64) -> Message {
        self.key(field, VARINT);
        put_varint(&mut self.bytes, value as u64);
        self
    }

    /// A `double` field.
    pub fn double(mut self, field: u32, value: f64) -> Message {
        self.key(field, FIXED64);
        self.bytes.extend_from_slice(&value.to_le_bytes());
        self
    }

    /// A `float` field.
    pub fn float(mut self, field: u32, value: f32) -> Message {
        self.key(field, FIXED32);
        self.bytes.extend_from_slice(&value.to_le_bytes());
        self
    }

    /// A `bytes` field.
    pub fn bytes(mut self, field: u32, value: &[u8]) -> Message {
        self.key(field, LENGTH_DELIMITED);
        put_varint(&mut self.bytes, value.len() as u64);
        self.bytes.extend_from_slice(value);
        self
    }

    /// A `string` field.
    pub fn string(self, field: u32, value: &str) -> Message {
        self.bytes(field, value.as_bytes())
    }

    /// An embedded message field.
    pub fn message(self, field: u32, value: &Message) -> Message {
        self.bytes(field, &value.bytes)
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}

/// One decoded field.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Field<'a> {
    Varint(u64),
    Fixed64([u8; 8]),
    Bytes(&'a [u8]),
    Fixed32([u8; 4]),
}

impl Field<'_> {
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Field::Fixed64(b) => Some(f64::from_le_bytes(*b)),
            _ => None,
        }
    }

    pub fn as_f32(&self) -> Option<f32> {
        match self {
            Field::Fixed32(b) => Some(f32::from_le_bytes(*b)),
            _ => None,
        }
    }

    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Field::Varint(v) => Some(*v as i64),
            _ => None,
        }
    }
}

/// The fields of an encoded message, in order; `Err` once at the first malformed byte.
pub struct Fields<'a> {
    rest: &'a [u8],
    failed: bool,
}

/// Iterates the fields of `bytes` as `(field number, value)`.
pub fn fields(bytes: &[u8]) -> Fields<'_> {
    Fields {
        rest: bytes,
        failed: false,
    }
}

/// A message that does not follow the wire format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed protobuf message")]
pub struct Malformed;

fn take_varint(rest: &mut &[u8]) -> Result<u64, Malformed> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, tail) = rest.split_first().ok_or(Malformed)?;
        *rest = tail;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(Malformed)
}

fn take<'a>(rest: &mut &'a [u8], n: usize) -> Result<&'a [u8], Malformed> {
    if rest.len() < n {
        return Err(Malformed);
    }
    let (head, tail) = rest.split_at(n);
    *rest = tail;
    Ok(head)
}

impl<'a> Fields<'a> {
    fn next_field(&mut self) -> Result<(u32, Field<'a>), Malformed> {
        let key = take_varint(&mut self.rest)?;
        let number = u32::try_from(key >> 3).map_err(|_| Malformed)?;
        let field = match (key & 7) as u8 {
            VARINT => Field::Varint(take_varint(&mut self.rest)?),
            FIXED64 => Field::Fixed64(take(&mut self.rest, 8)?.try_into().map_err(|_| Malformed)?),
            LENGTH_DELIMITED => {
                let len = usize::try_from(take_varint(&mut self.rest)?).map_err(|_| Malformed)?;
                Field::Bytes(take(&mut self.rest, len)?)
            }
            FIXED32 => Field::Fixed32(take(&mut self.rest, 4)?.try_into().map_err(|_| Malformed)?),
            _ => return Err(Malformed),
        };
        Ok((number, field))
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u32, Field<'a>), Malformed>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.rest.is_empty() {
            return None;
        }
        let item = self.next_field();
        self.failed = item.is_err();
        Some(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip() {
        let inner = Message::new().string(1, "loss");
        let bytes = Message::new()
            .double(1, 1.5)
            .varint(2, 300)
            .varint(3, -1)
            .message(5, &inner)
            .float(2, 0.25)
            .into_bytes();
        let decoded: Vec<(u32, Field)> = fields(&bytes).map(Result::unwrap).collect();
        assert_eq!(decoded[0].1.as_f64(), Some(1.5));
        assert_eq!(decoded[1].1.as_i64(), Some(300));
        assert_eq!(decoded[2].1.as_i64(), Some(-1));
        assert_eq!(
            decoded[3],
            (5, Field::Bytes(&[0x0a, 4, b'l', b'o', b's', b's']))
        );
        assert_eq!(decoded[4].1.as_f32(), Some(0.25));
        // 300 = 0b10_0101100 → 0xac 0x02 (the protobuf documentation's example).
        assert_eq!(&bytes[9..12], &[0x10, 0xac, 0x02]);
    }

    #[test]
    fn truncated_input_is_malformed_not_a_panic() {
        let bytes = Message::new().string(1, "abcdef").into_bytes();
        for cut in 0..bytes.len() {
            let all: Vec<_> = fields(&bytes[..cut]).collect();
            if cut > 0 {
                assert_eq!(all.last(), Some(&Err(Malformed)), "cut {cut}");
            }
        }
    }
}
