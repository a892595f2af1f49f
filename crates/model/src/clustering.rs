//! Order-preserving ("byte-comparable") encoding of clustering keys.
//!
//! The storage engine sorts keys as raw bytes. Encoding each clustering component so that
//! byte order equals Cassandra's comparator order for its type lets a partition's rows sit
//! in clustering order on disk, so a slice (`c > 3 AND c <= 9`) is one contiguous range.
//!
//! Every component encoding is *prefix-free* (no encoding is a prefix of another), which
//! makes the concatenation of components order like the tuple of components, and makes
//! a DESC component simply the bitwise complement of its ASC encoding.
//!
//! - fixed-width integers, timestamps, dates, times: big-endian with the sign bit flipped;
//! - floats and doubles: IEEE-754 total order (flip the sign bit of positives, all bits of
//!   negatives);
//! - text, ascii, blob, inet: bytes with `0x00` escaped as `0x00 0xff`, ended by `0x00 0x00`;
//! - uuid/timeuuid: a prefix giving Cassandra's order (version and embedded time), then the
//!   16 raw bytes;
//! - varint: sign class, length and magnitude; decimal: an approximate order key (f64)
//!   followed by the exact bytes (a documented simplification);
//! - frozen collections and tuples: element encodings, each preceded by `0x01`, ended by
//!   `0x00`.
//!
//! [`decode_component`] inverts the encoding, so clustering values are read back from keys.

use crate::value::{timeuuid_order_key, uuid_order_key};
use crate::{CqlType, DecodeError, Value};
use num_bigint::BigInt;
use num_bigint::Sign;

/// Appends the byte-comparable encoding of `value` (of type `cql_type`), complemented when
/// `descending`.
pub fn encode_component(out: &mut Vec<u8>, value: &Value, descending: bool) {
    let start = out.len();
    encode_ascending(out, value);
    if descending {
        for byte in &mut out[start..] {
            *byte = !*byte;
        }
    }
}

/// Appends `bytes` with `0x00` escaped as `0x00 0xff`, ended by `0x00 0x00`: order-preserving
/// and self-delimiting (text and blob components; index entries escape their whole value).
pub(crate) fn escape_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    for &byte in bytes {
        out.push(byte);
        if byte == 0 {
            out.push(0xff);
        }
    }
    out.extend_from_slice(&[0, 0]);
}

fn encode_ascending(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Ascii(s) | Value::Text(s) => escape_bytes(out, s.as_bytes()),
        Value::Blob(b) => escape_bytes(out, b),
        Value::Inet(a) => escape_bytes(out, &crate::value::inet_bytes(a)),
        Value::Bigint(v) | Value::Counter(v) | Value::Timestamp(v) | Value::Time(v) => {
            out.extend_from_slice(&((*v as u64) ^ (1 << 63)).to_be_bytes())
        }
        Value::Int(v) => out.extend_from_slice(&((*v as u32) ^ (1 << 31)).to_be_bytes()),
        Value::Smallint(v) => out.extend_from_slice(&((*v as u16) ^ (1 << 15)).to_be_bytes()),
        Value::Tinyint(v) => out.push((*v as u8) ^ 0x80),
        Value::Date(d) => out.extend_from_slice(&d.to_be_bytes()),
        Value::Boolean(b) => out.push(*b as u8),
        Value::Double(v) => {
            let bits = v.to_bits();
            let sortable = if bits >> 63 == 1 {
                !bits
            } else {
                bits | (1 << 63)
            };
            out.extend_from_slice(&sortable.to_be_bytes());
        }
        Value::Float(v) => {
            let bits = v.to_bits();
            let sortable = if bits >> 31 == 1 {
                !bits
            } else {
                bits | (1 << 31)
            };
            out.extend_from_slice(&sortable.to_be_bytes());
        }
        Value::Timeuuid(u) => {
            let (time, rest) = timeuuid_order_key(u);
            out.extend_from_slice(&time.to_be_bytes());
            out.extend_from_slice(&rest);
            out.extend_from_slice(u);
        }
        Value::Uuid(u) => {
            let (version, time, _) = uuid_order_key(u);
            out.push(version);
            out.extend_from_slice(&time.to_be_bytes());
            out.extend_from_slice(u);
        }
        Value::Varint(v) => encode_varint(out, v),
        Value::Decimal { unscaled, scale } => {
            let approximate: f64 =
                unscaled.to_string().parse::<f64>().unwrap_or(0.0) / 10f64.powi(*scale);
            encode_ascending(out, &Value::Double(approximate));
            escape_bytes(out, &value.serialize());
        }
        Value::Duration { .. } => escape_bytes(out, &value.serialize()),
        Value::List(elements) | Value::Set(elements) | Value::Vector(elements) => {
            for element in elements {
                out.push(1);
                encode_ascending(out, element);
            }
            out.push(0);
        }
        Value::Map(entries) => {
            for (key, value) in entries {
                out.push(1);
                encode_ascending(out, key);
                encode_ascending(out, value);
            }
            out.push(0);
        }
        Value::Tuple(elements) => {
            for element in elements {
                match element {
                    Some(value) => {
                        out.push(2);
                        encode_ascending(out, value);
                    }
                    None => out.push(1),
                }
            }
            out.push(0);
        }
    }
}

fn encode_varint(out: &mut Vec<u8>, value: &BigInt) {
    let (sign, magnitude) = value.to_bytes_be();
    let magnitude = if sign == Sign::NoSign {
        vec![]
    } else {
        magnitude
    };
    let length = magnitude.len() as u32;
    match sign {
        Sign::Minus => {
            out.push(0);
            out.extend_from_slice(&(!length).to_be_bytes());
            out.extend(magnitude.iter().map(|b| !b));
        }
        Sign::NoSign => out.push(1),
        Sign::Plus => {
            out.push(2);
            out.extend_from_slice(&length.to_be_bytes());
            out.extend_from_slice(&magnitude);
        }
    }
}

/// A cursor over an encoded key, for decoding.
struct Reader<'a> {
    bytes: &'a [u8],
    position: usize,
    /// Complement every byte read (DESC components).
    invert: bool,
}

impl Reader<'_> {
    fn byte(&mut self) -> Result<u8, DecodeError> {
        let byte = *self
            .bytes
            .get(self.position)
            .ok_or_else(|| DecodeError::new("Truncated clustering key"))?;
        self.position += 1;
        Ok(if self.invert { !byte } else { byte })
    }

    fn fixed<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut array = [0u8; N];
        for slot in &mut array {
            *slot = self.byte()?;
        }
        Ok(array)
    }

    fn escaped(&mut self) -> Result<Vec<u8>, DecodeError> {
        let mut bytes = Vec::new();
        loop {
            let byte = self.byte()?;
            if byte == 0 {
                match self.byte()? {
                    0 => return Ok(bytes),
                    0xff => bytes.push(0),
                    _ => return Err(DecodeError::new("Bad escape in clustering key")),
                }
            } else {
                bytes.push(byte);
            }
        }
    }
}

/// The bytes that [`escape_bytes`] escaped at the front of `escaped`.
pub(crate) fn unescape_front(escaped: &[u8]) -> Result<Vec<u8>, DecodeError> {
    Reader {
        bytes: escaped,
        position: 0,
        invert: false,
    }
    .escaped()
}

/// How many bytes (end marker included) the bytes [`escape_bytes`] escaped at the front of
/// `escaped` take, found without copying them.
pub(crate) fn escaped_length(escaped: &[u8]) -> Option<usize> {
    let mut at = 0;
    loop {
        match *escaped.get(at)? {
            0 => match *escaped.get(at + 1)? {
                0 => return Some(at + 2),
                0xff => at += 2,
                _ => return None,
            },
            _ => at += 1,
        }
    }
}

/// Decodes one component of type `cql_type` from the front of `bytes`; returns the value and
/// the number of bytes it used.
pub fn decode_component(
    bytes: &[u8],
    cql_type: &CqlType,
    descending: bool,
) -> Result<(Value, usize), DecodeError> {
    let mut reader = Reader {
        bytes,
        position: 0,
        invert: descending,
    };
    let value = decode_ascending(&mut reader, cql_type)?;
    Ok((value, reader.position))
}

fn decode_ascending(reader: &mut Reader<'_>, cql_type: &CqlType) -> Result<Value, DecodeError> {
    Ok(match cql_type {
        CqlType::Ascii | CqlType::Text | CqlType::Blob | CqlType::Inet | CqlType::Duration => {
            let bytes = reader.escaped()?;
            Value::deserialize(cql_type, &bytes)?
        }
        CqlType::Bigint | CqlType::Counter | CqlType::Timestamp | CqlType::Time => {
            let raw = (u64::from_be_bytes(reader.fixed::<8>()?) ^ (1 << 63)) as i64;
            Value::deserialize(cql_type, &raw.to_be_bytes())?
        }
        CqlType::Int => Value::Int((u32::from_be_bytes(reader.fixed::<4>()?) ^ (1 << 31)) as i32),
        CqlType::Smallint => {
            Value::Smallint((u16::from_be_bytes(reader.fixed::<2>()?) ^ (1 << 15)) as i16)
        }
        CqlType::Tinyint => Value::Tinyint((reader.byte()? ^ 0x80) as i8),
        CqlType::Date => Value::Date(u32::from_be_bytes(reader.fixed::<4>()?)),
        CqlType::Boolean => Value::Boolean(reader.byte()? != 0),
        CqlType::Double => {
            let sortable = u64::from_be_bytes(reader.fixed::<8>()?);
            let bits = if sortable >> 63 == 1 {
                sortable & !(1 << 63)
            } else {
                !sortable
            };
            Value::Double(f64::from_bits(bits))
        }
        CqlType::Float => {
            let sortable = u32::from_be_bytes(reader.fixed::<4>()?);
            let bits = if sortable >> 31 == 1 {
                sortable & !(1 << 31)
            } else {
                !sortable
            };
            Value::Float(f32::from_bits(bits))
        }
        CqlType::Timeuuid => {
            reader.fixed::<16>()?;
            Value::Timeuuid(reader.fixed::<16>()?)
        }
        CqlType::Uuid => {
            reader.fixed::<9>()?;
            Value::Uuid(reader.fixed::<16>()?)
        }
        CqlType::Varint => match reader.byte()? {
            0 => {
                let length = !u32::from_be_bytes(reader.fixed::<4>()?) as usize;
                let mut magnitude = Vec::with_capacity(length.min(1024));
                for _ in 0..length {
                    magnitude.push(!reader.byte()?);
                }
                Value::Varint(BigInt::from_bytes_be(Sign::Minus, &magnitude))
            }
            1 => Value::Varint(BigInt::from(0)),
            2 => {
                let length = u32::from_be_bytes(reader.fixed::<4>()?) as usize;
                let mut magnitude = Vec::with_capacity(length.min(1024));
                for _ in 0..length {
                    magnitude.push(reader.byte()?);
                }
                Value::Varint(BigInt::from_bytes_be(Sign::Plus, &magnitude))
            }
            _ => return Err(DecodeError::new("Bad varint in clustering key")),
        },
        CqlType::Decimal => {
            reader.fixed::<8>()?;
            let bytes = reader.escaped()?;
            Value::deserialize(cql_type, &bytes)?
        }
        CqlType::List { element, .. } | CqlType::Set { element, .. } => {
            let mut elements = Vec::new();
            while reader.byte()? == 1 {
                elements.push(decode_ascending(reader, element)?);
            }
            if matches!(cql_type, CqlType::List { .. }) {
                Value::List(elements)
            } else {
                Value::Set(elements)
            }
        }
        CqlType::Map { key, value, .. } => {
            let mut entries = Vec::new();
            while reader.byte()? == 1 {
                let k = decode_ascending(reader, key)?;
                let v = decode_ascending(reader, value)?;
                entries.push((k, v));
            }
            Value::Map(entries)
        }
        CqlType::Vector { element, .. } => {
            let mut elements = Vec::new();
            while reader.byte()? == 1 {
                elements.push(decode_ascending(reader, element)?);
            }
            Value::Vector(elements)
        }
        CqlType::Tuple(types) => Value::Tuple(decode_fields(reader, types.iter())?),
        CqlType::Udt(user_type) => Value::Tuple(decode_fields(reader, user_type.field_types())?),
        CqlType::UdtName { name, .. } => {
            return Err(DecodeError(format!(
                "Unknown type {name} in clustering key"
            )))
        }
    })
}

/// A tuple's (or frozen UDT's) elements: each `2` and its encoding, or `1` for null; then
/// `0`. A value with fewer elements than the type ends early.
fn decode_fields<'a>(
    reader: &mut Reader<'_>,
    types: impl Iterator<Item = &'a CqlType>,
) -> Result<Vec<Option<Value>>, DecodeError> {
    let mut elements = Vec::new();
    for element_type in types {
        match reader.byte()? {
            2 => elements.push(Some(decode_ascending(reader, element_type)?)),
            1 => elements.push(None),
            0 => return Ok(elements),
            _ => return Err(DecodeError::new("Bad tuple in clustering key")),
        }
    }
    if reader.byte()? != 0 {
        return Err(DecodeError::new("Bad tuple end in clustering key"));
    }
    Ok(elements)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cmp::Ordering;

    fn encoded(value: &Value, descending: bool) -> Vec<u8> {
        let mut out = Vec::new();
        encode_component(&mut out, value, descending);
        out
    }

    fn check_order(cql_type: &str, values: Vec<Value>) {
        let cql_type = CqlType::parse(cql_type).unwrap();
        for a in &values {
            for b in &values {
                let expected = a.compare(b);
                assert_eq!(
                    encoded(a, false).cmp(&encoded(b, false)),
                    expected,
                    "{a:?} {b:?}"
                );
                assert_eq!(
                    encoded(a, true).cmp(&encoded(b, true)),
                    expected.reverse(),
                    "{a:?} {b:?} desc"
                );
            }
            for descending in [false, true] {
                let bytes = encoded(a, descending);
                let (decoded, used) = decode_component(&bytes, &cql_type, descending).unwrap();
                assert_eq!(used, bytes.len());
                assert_eq!(decoded.compare(a), Ordering::Equal);
            }
        }
    }

    #[test]
    fn encodings_preserve_order_and_decode() {
        check_order(
            "int",
            vec![
                Value::Int(i32::MIN),
                Value::Int(-1),
                Value::Int(0),
                Value::Int(9),
            ],
        );
        check_order(
            "text",
            vec![
                Value::Text("".into()),
                Value::Text("a".into()),
                Value::Text("a\0".into()),
                Value::Text("a\0b".into()),
                Value::Text("ab".into()),
                Value::Text("b".into()),
            ],
        );
        check_order(
            "double",
            vec![
                Value::Double(f64::NEG_INFINITY),
                Value::Double(-2.5),
                Value::Double(-0.0),
                Value::Double(0.0),
                Value::Double(1e300),
            ],
        );
        check_order(
            "varint",
            vec![
                Value::Varint(BigInt::from(-70000)),
                Value::Varint(BigInt::from(-1)),
                Value::Varint(BigInt::from(0)),
                Value::Varint(BigInt::from(255)),
                Value::Varint(BigInt::from(70000)),
            ],
        );
        check_order(
            "frozen<list<int>>",
            vec![
                Value::List(vec![]),
                Value::List(vec![Value::Int(1)]),
                Value::List(vec![Value::Int(1), Value::Int(2)]),
                Value::List(vec![Value::Int(2)]),
            ],
        );
    }
}
