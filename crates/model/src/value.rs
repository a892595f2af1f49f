//! Typed CQL values and their native-protocol serialization.
//!
//! The serialized form ([`Value::serialize`]) is exactly what the CQL v4 protocol puts in
//! a `[bytes]` value, and it is also what a cell stores on disk: a read returns stored bytes
//! to the client without decoding them. [`Value::deserialize`] checks every length, so a
//! malformed value from a client is an error, never a panic.

use crate::{CqlType, DecodeError};
use num_bigint::BigInt;
use std::cmp::Ordering;
use std::fmt::Write as _;
use std::net::IpAddr;

/// A non-null CQL value. Null is `Option<Value>::None` wherever a value may be absent.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Ascii(String),
    Bigint(i64),
    Blob(Vec<u8>),
    Boolean(bool),
    Counter(i64),
    Decimal {
        unscaled: BigInt,
        scale: i32,
    },
    Double(f64),
    Duration {
        months: i32,
        days: i32,
        nanoseconds: i64,
    },
    Float(f32),
    Inet(IpAddr),
    Int(i32),
    Smallint(i16),
    Text(String),
    /// Nanoseconds since midnight.
    Time(i64),
    /// Milliseconds since the epoch.
    Timestamp(i64),
    Timeuuid([u8; 16]),
    Tinyint(i8),
    Uuid([u8; 16]),
    Varint(BigInt),
    /// Days since the epoch, offset by 2^31 (the protocol's unsigned form).
    Date(u32),
    List(Vec<Value>),
    Set(Vec<Value>),
    Map(Vec<(Value, Value)>),
    Tuple(Vec<Option<Value>>),
    /// A `vector<T, n>`'s elements (exactly `n`, none null).
    Vector(Vec<Value>),
}

/// The epoch day in [`Value::Date`]'s unsigned representation.
pub const DATE_EPOCH_OFFSET: u32 = 1 << 31;

/// A `time` value is nanoseconds since midnight: `0..NANOSECONDS_PER_DAY`.
pub const NANOSECONDS_PER_DAY: i64 = 86_400_000_000_000;

fn need(bytes: &[u8], length: usize, what: &str) -> Result<(), DecodeError> {
    if bytes.len() != length {
        return Err(DecodeError(format!(
            "Expected {length} bytes for a {what} value, got {}",
            bytes.len()
        )));
    }
    Ok(())
}

/// Reads a signed variable-length integer (zig-zag vint, as Cassandra's duration uses).
fn read_signed_vint(bytes: &[u8], position: &mut usize) -> Result<i64, DecodeError> {
    let value = read_unsigned_vint(bytes, position, "duration")?;
    Ok(((value >> 1) as i64) ^ -((value & 1) as i64))
}

/// Reads Cassandra's unsigned vint: the first byte's leading one bits count the bytes
/// that follow, big-endian.
fn read_unsigned_vint(bytes: &[u8], position: &mut usize, what: &str) -> Result<u64, DecodeError> {
    let truncated = || DecodeError(format!("Truncated {what}"));
    let first = *bytes.get(*position).ok_or_else(truncated)?;
    *position += 1;
    let extra = first.leading_ones() as usize;
    let mut value: u64 = if extra >= 8 {
        0
    } else {
        (first & (0xff >> extra)) as u64
    };
    for _ in 0..extra {
        let byte = *bytes.get(*position).ok_or_else(truncated)?;
        *position += 1;
        value = (value << 8) | byte as u64;
    }
    Ok(value)
}

fn write_signed_vint(out: &mut Vec<u8>, value: i64) {
    write_unsigned_vint(out, ((value << 1) ^ (value >> 63)) as u64);
}

fn write_unsigned_vint(out: &mut Vec<u8>, zigzag: u64) {
    let significant_bits = 64 - zigzag.leading_zeros() as usize;
    let mut extra = if significant_bits <= 7 {
        0
    } else {
        (significant_bits - 1) / 7
    };
    if extra > 8 {
        extra = 8;
    }
    let total = extra + 1;
    let mut buffer = [0u8; 9];
    let mut remaining = zigzag;
    for i in (0..total).rev() {
        buffer[i] = (remaining & 0xff) as u8;
        remaining >>= 8;
    }
    if extra < 8 {
        buffer[0] |= !(0xffu8 >> extra);
    } else {
        buffer[0] = 0xff;
    }
    out.extend_from_slice(&buffer[..total]);
}

fn read_length_prefixed<'a>(
    bytes: &'a [u8],
    position: &mut usize,
) -> Result<Option<&'a [u8]>, DecodeError> {
    let header = bytes
        .get(*position..*position + 4)
        .ok_or_else(|| DecodeError::new("Truncated collection element length"))?;
    let length = i32::from_be_bytes([header[0], header[1], header[2], header[3]]);
    *position += 4;
    if length < 0 {
        return Ok(None);
    }
    let end = position
        .checked_add(length as usize)
        .filter(|end| *end <= bytes.len())
        .ok_or_else(|| DecodeError::new("Truncated collection element"))?;
    let slice = &bytes[*position..end];
    *position = end;
    Ok(Some(slice))
}

fn read_count(bytes: &[u8], position: &mut usize) -> Result<usize, DecodeError> {
    let header = bytes
        .get(*position..*position + 4)
        .ok_or_else(|| DecodeError::new("Truncated collection size"))?;
    *position += 4;
    let count = i32::from_be_bytes([header[0], header[1], header[2], header[3]]);
    if count < 0 || count as usize > bytes.len() {
        return Err(DecodeError::new("Invalid collection size"));
    }
    Ok(count as usize)
}

/// Element `index` of a serialized tuple or user-defined type value, without decoding the
/// rest; `None` when it is null or the value has fewer elements.
pub fn tuple_element(bytes: &[u8], index: usize) -> Option<Vec<u8>> {
    let mut position = 0;
    for _ in 0..index {
        read_length_prefixed(bytes, &mut position).ok()?;
    }
    read_length_prefixed(bytes, &mut position)
        .ok()
        .flatten()
        .map(<[u8]>::to_vec)
}

/// Decodes a tuple-like value: one `[bytes]` per element (-1 for null), elements missing
/// at the end being null.
fn deserialize_fields<'a>(
    types: impl Iterator<Item = &'a CqlType>,
    bytes: &[u8],
    what: &str,
) -> Result<Vec<Option<Value>>, DecodeError> {
    let mut position = 0;
    let mut elements = Vec::new();
    for element_type in types {
        if position == bytes.len() {
            elements.push(None);
            continue;
        }
        match read_length_prefixed(bytes, &mut position)? {
            Some(element) => elements.push(Some(Value::deserialize(element_type, element)?)),
            None => elements.push(None),
        }
    }
    if position != bytes.len() {
        return Err(DecodeError(format!("Trailing bytes in {what}")));
    }
    Ok(elements)
}

fn write_length_prefixed(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as i32).to_be_bytes());
    out.extend_from_slice(bytes);
}

impl Value {
    /// The native protocol serialization of this value.
    pub fn serialize(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.serialize_into(&mut out);
        out
    }

    pub fn serialize_into(&self, out: &mut Vec<u8>) {
        match self {
            Value::Ascii(s) | Value::Text(s) => out.extend_from_slice(s.as_bytes()),
            Value::Bigint(v) | Value::Counter(v) | Value::Timestamp(v) | Value::Time(v) => {
                out.extend_from_slice(&v.to_be_bytes())
            }
            Value::Blob(b) => out.extend_from_slice(b),
            Value::Boolean(b) => out.push(*b as u8),
            Value::Decimal { unscaled, scale } => {
                out.extend_from_slice(&scale.to_be_bytes());
                out.extend_from_slice(&unscaled.to_signed_bytes_be());
            }
            Value::Double(v) => out.extend_from_slice(&v.to_be_bytes()),
            Value::Duration {
                months,
                days,
                nanoseconds,
            } => {
                write_signed_vint(out, *months as i64);
                write_signed_vint(out, *days as i64);
                write_signed_vint(out, *nanoseconds);
            }
            Value::Float(v) => out.extend_from_slice(&v.to_be_bytes()),
            Value::Inet(IpAddr::V4(a)) => out.extend_from_slice(&a.octets()),
            Value::Inet(IpAddr::V6(a)) => out.extend_from_slice(&a.octets()),
            Value::Int(v) => out.extend_from_slice(&v.to_be_bytes()),
            Value::Smallint(v) => out.extend_from_slice(&v.to_be_bytes()),
            Value::Tinyint(v) => out.extend_from_slice(&v.to_be_bytes()),
            Value::Timeuuid(u) | Value::Uuid(u) => out.extend_from_slice(u),
            Value::Varint(v) => out.extend_from_slice(&v.to_signed_bytes_be()),
            Value::Date(d) => out.extend_from_slice(&d.to_be_bytes()),
            Value::List(elements) | Value::Set(elements) => {
                out.extend_from_slice(&(elements.len() as i32).to_be_bytes());
                for element in elements {
                    write_length_prefixed(out, &element.serialize());
                }
            }
            Value::Map(entries) => {
                out.extend_from_slice(&(entries.len() as i32).to_be_bytes());
                for (key, value) in entries {
                    write_length_prefixed(out, &key.serialize());
                    write_length_prefixed(out, &value.serialize());
                }
            }
            Value::Tuple(elements) => {
                for element in elements {
                    match element {
                        Some(value) => write_length_prefixed(out, &value.serialize()),
                        None => out.extend_from_slice(&(-1i32).to_be_bytes()),
                    }
                }
            }
            Value::Vector(elements) => {
                for element in elements {
                    if element.has_fixed_width() {
                        element.serialize_into(out);
                    } else {
                        let bytes = element.serialize();
                        write_unsigned_vint(out, bytes.len() as u64);
                        out.extend_from_slice(&bytes);
                    }
                }
            }
        }
    }

    /// True when this value's type is one Cassandra serializes at a fixed width
    /// ([`CqlType::fixed_width`]): how a vector of such values is laid out.
    fn has_fixed_width(&self) -> bool {
        match self {
            Value::Boolean(_)
            | Value::Int(_)
            | Value::Float(_)
            | Value::Bigint(_)
            | Value::Double(_)
            | Value::Timestamp(_)
            | Value::Time(_)
            | Value::Uuid(_)
            | Value::Timeuuid(_) => true,
            Value::Vector(elements) => elements.iter().all(Value::has_fixed_width),
            _ => false,
        }
    }

    /// Whether `bytes` is a valid value of `cql_type` that [`Value::deserialize`] then
    /// [`Value::serialize`] would give back unchanged: true only for the scalar types whose
    /// serialized form is canonical, so a writer may store such bytes as they came. False
    /// for every other type and for invalid bytes ([`Value::deserialize`] says what is
    /// wrong with those).
    pub fn is_canonical_serialized(cql_type: &CqlType, bytes: &[u8]) -> bool {
        match cql_type {
            CqlType::Blob => true,
            CqlType::Text => std::str::from_utf8(bytes).is_ok(),
            CqlType::Ascii => bytes.is_ascii(),
            CqlType::Bigint | CqlType::Timestamp | CqlType::Double => bytes.len() == 8,
            CqlType::Time => <[u8; 8]>::try_from(bytes)
                .is_ok_and(|b| (0..NANOSECONDS_PER_DAY).contains(&i64::from_be_bytes(b))),
            CqlType::Int | CqlType::Float | CqlType::Date => bytes.len() == 4,
            CqlType::Smallint => bytes.len() == 2,
            CqlType::Tinyint => bytes.len() == 1,
            CqlType::Uuid => bytes.len() == 16,
            CqlType::Timeuuid => bytes.len() == 16 && bytes[6] >> 4 == 1,
            CqlType::Inet => bytes.len() == 4 || bytes.len() == 16,
            _ => false,
        }
    }

    /// Decodes a serialized value of type `cql_type`, validating it as Cassandra does.
    pub fn deserialize(cql_type: &CqlType, bytes: &[u8]) -> Result<Value, DecodeError> {
        Ok(match cql_type {
            CqlType::Ascii => {
                if !bytes.is_ascii() {
                    return Err(DecodeError::new(
                        "Invalid ASCII character in string literal",
                    ));
                }
                Value::Ascii(String::from_utf8_lossy(bytes).into_owned())
            }
            CqlType::Text => Value::Text(
                String::from_utf8(bytes.to_vec())
                    .map_err(|_| DecodeError::new("Invalid UTF-8 bytes"))?,
            ),
            CqlType::Bigint | CqlType::Counter | CqlType::Timestamp | CqlType::Time => {
                need(bytes, 8, "64-bit")?;
                let v = i64::from_be_bytes(bytes.try_into().unwrap_or([0; 8]));
                match cql_type {
                    CqlType::Bigint => Value::Bigint(v),
                    CqlType::Counter => Value::Counter(v),
                    CqlType::Timestamp => Value::Timestamp(v),
                    _ => {
                        if !(0..NANOSECONDS_PER_DAY).contains(&v) {
                            return Err(DecodeError::new("Time value out of range"));
                        }
                        Value::Time(v)
                    }
                }
            }
            CqlType::Blob => Value::Blob(bytes.to_vec()),
            CqlType::Boolean => {
                need(bytes, 1, "boolean")?;
                Value::Boolean(bytes[0] != 0)
            }
            CqlType::Decimal => {
                if bytes.len() < 4 {
                    return Err(DecodeError::new("Decimal value too short"));
                }
                Value::Decimal {
                    scale: i32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]),
                    unscaled: BigInt::from_signed_bytes_be(&bytes[4..]),
                }
            }
            CqlType::Double => {
                need(bytes, 8, "double")?;
                Value::Double(f64::from_be_bytes(bytes.try_into().unwrap_or([0; 8])))
            }
            CqlType::Duration => {
                let mut position = 0;
                let months = read_signed_vint(bytes, &mut position)?;
                let days = read_signed_vint(bytes, &mut position)?;
                let nanoseconds = read_signed_vint(bytes, &mut position)?;
                if position != bytes.len() {
                    return Err(DecodeError::new("Trailing bytes in duration"));
                }
                Value::Duration {
                    months: months as i32,
                    days: days as i32,
                    nanoseconds,
                }
            }
            CqlType::Float => {
                need(bytes, 4, "float")?;
                Value::Float(f32::from_be_bytes(bytes.try_into().unwrap_or([0; 4])))
            }
            CqlType::Inet => match bytes.len() {
                4 => Value::Inet(IpAddr::from(<[u8; 4]>::try_from(bytes).unwrap_or([0; 4]))),
                16 => Value::Inet(IpAddr::from(<[u8; 16]>::try_from(bytes).unwrap_or([0; 16]))),
                n => {
                    return Err(DecodeError(format!(
                        "Invalid inet value: expected 4 or 16 bytes, got {n}"
                    )))
                }
            },
            CqlType::Int => {
                need(bytes, 4, "int")?;
                Value::Int(i32::from_be_bytes(bytes.try_into().unwrap_or([0; 4])))
            }
            CqlType::Smallint => {
                need(bytes, 2, "smallint")?;
                Value::Smallint(i16::from_be_bytes([bytes[0], bytes[1]]))
            }
            CqlType::Tinyint => {
                need(bytes, 1, "tinyint")?;
                Value::Tinyint(bytes[0] as i8)
            }
            CqlType::Uuid | CqlType::Timeuuid => {
                need(bytes, 16, "uuid")?;
                let array: [u8; 16] = bytes.try_into().unwrap_or([0; 16]);
                if *cql_type == CqlType::Timeuuid {
                    if array[6] >> 4 != 1 {
                        return Err(DecodeError::new(
                            "Unsupported UUID version for timeuuid: only version 1 is allowed",
                        ));
                    }
                    Value::Timeuuid(array)
                } else {
                    Value::Uuid(array)
                }
            }
            CqlType::Varint => {
                if bytes.is_empty() {
                    return Err(DecodeError::new("Empty varint"));
                }
                Value::Varint(BigInt::from_signed_bytes_be(bytes))
            }
            CqlType::Date => {
                need(bytes, 4, "date")?;
                Value::Date(u32::from_be_bytes(bytes.try_into().unwrap_or([0; 4])))
            }
            CqlType::List { element, .. } | CqlType::Set { element, .. } => {
                Value::deserialize_list_or_set(cql_type, element, bytes)?
            }
            CqlType::Map { key, value, .. } => Value::deserialize_map(key, value, bytes)?,
            CqlType::Tuple(types) => {
                Value::Tuple(deserialize_fields(types.iter(), bytes, "tuple")?)
            }
            // A UDT value is laid out like a tuple of its fields; trailing fields may be
            // missing (a value written before ALTER TYPE ADD), and read as null.
            CqlType::Udt(user_type) => Value::Tuple(deserialize_fields(
                user_type.field_types(),
                bytes,
                "user-defined type",
            )?),
            CqlType::UdtName { name, .. } => {
                return Err(DecodeError(format!("Unknown type {name}")))
            }
            CqlType::Vector { element, dimension } => {
                Value::deserialize_vector(cql_type, element, *dimension, bytes)?
            }
        })
    }

    /// Decodes a list's or a set's elements (a set's sorted and deduplicated).
    fn deserialize_list_or_set(
        cql_type: &CqlType,
        element: &CqlType,
        bytes: &[u8],
    ) -> Result<Value, DecodeError> {
        let mut position = 0;
        let count = read_count(bytes, &mut position)?;
        let mut elements = Vec::with_capacity(count);
        for _ in 0..count {
            let element_bytes = read_length_prefixed(bytes, &mut position)?
                .ok_or_else(|| DecodeError::new("null is not supported inside collections"))?;
            elements.push(Value::deserialize(element, element_bytes)?);
        }
        if position != bytes.len() {
            return Err(DecodeError::new("Trailing bytes in collection"));
        }
        if matches!(cql_type, CqlType::List { .. }) {
            Ok(Value::List(elements))
        } else {
            elements.sort_by(|a, b| a.compare(b));
            elements.dedup_by(|a, b| a.compare(b) == Ordering::Equal);
            Ok(Value::Set(elements))
        }
    }

    /// Decodes a map's entries, sorted by key and deduplicated.
    fn deserialize_map(key: &CqlType, value: &CqlType, bytes: &[u8]) -> Result<Value, DecodeError> {
        let mut position = 0;
        let count = read_count(bytes, &mut position)?;
        let mut entries = Vec::with_capacity(count);
        for _ in 0..count {
            let key_bytes = read_length_prefixed(bytes, &mut position)?
                .ok_or_else(|| DecodeError::new("null is not supported inside collections"))?;
            let value_bytes = read_length_prefixed(bytes, &mut position)?
                .ok_or_else(|| DecodeError::new("null is not supported inside collections"))?;
            entries.push((
                Value::deserialize(key, key_bytes)?,
                Value::deserialize(value, value_bytes)?,
            ));
        }
        if position != bytes.len() {
            return Err(DecodeError::new("Trailing bytes in map"));
        }
        entries.sort_by(|a, b| a.0.compare(&b.0));
        entries.dedup_by(|a, b| a.0.compare(&b.0) == Ordering::Equal);
        Ok(Value::Map(entries))
    }

    /// Decodes a vector of `dimension` elements: packed when the element type has a fixed
    /// width, each length-prefixed (unsigned vint) otherwise.
    fn deserialize_vector(
        cql_type: &CqlType,
        element: &CqlType,
        dimension: u32,
        bytes: &[u8],
    ) -> Result<Value, DecodeError> {
        let dimension = dimension as usize;
        let mut elements = Vec::with_capacity(dimension.min(bytes.len()));
        if let Some(width) = element.fixed_width() {
            if bytes.len() != width * dimension {
                return Err(DecodeError(format!(
                    "Expected {} bytes for a {cql_type} value ({dimension} elements of {width} bytes), got {}",
                    width * dimension,
                    bytes.len()
                )));
            }
            for chunk in bytes.chunks_exact(width) {
                elements.push(Value::deserialize(element, chunk)?);
            }
        } else {
            let mut position = 0;
            for _ in 0..dimension {
                let length = read_unsigned_vint(bytes, &mut position, "vector element")?;
                let end = usize::try_from(length)
                    .ok()
                    .and_then(|length| position.checked_add(length))
                    .filter(|end| *end <= bytes.len())
                    .ok_or_else(|| DecodeError::new("Truncated vector element"))?;
                elements.push(Value::deserialize(element, &bytes[position..end])?);
                position = end;
            }
            if position != bytes.len() {
                return Err(DecodeError(format!(
                    "Trailing bytes in a {cql_type} value: more than {dimension} elements"
                )));
            }
        }
        Ok(Value::Vector(elements))
    }

    /// Cassandra's comparator order for two values of the same type.
    pub fn compare(&self, other: &Value) -> Ordering {
        use Value::*;
        match (self, other) {
            (Ascii(a), Ascii(b)) | (Text(a), Text(b)) => a.as_bytes().cmp(b.as_bytes()),
            (Bigint(a), Bigint(b))
            | (Counter(a), Counter(b))
            | (Timestamp(a), Timestamp(b))
            | (Time(a), Time(b)) => a.cmp(b),
            (Blob(a), Blob(b)) => a.cmp(b),
            (Boolean(a), Boolean(b)) => a.cmp(b),
            (
                Decimal {
                    unscaled: ua,
                    scale: sa,
                },
                Decimal {
                    unscaled: ub,
                    scale: sb,
                },
            ) => {
                // Compare a·10^-sa with b·10^-sb exactly by bringing both to the larger scale.
                let max_scale = (*sa).max(*sb);
                let scale_up =
                    |u: &BigInt, s: i32| u * BigInt::from(10).pow((max_scale - s) as u32);
                scale_up(ua, *sa).cmp(&scale_up(ub, *sb))
            }
            (Double(a), Double(b)) => a.total_cmp(b),
            (Float(a), Float(b)) => a.total_cmp(b),
            (Inet(a), Inet(b)) => inet_bytes(a).cmp(&inet_bytes(b)),
            (Int(a), Int(b)) => a.cmp(b),
            (Smallint(a), Smallint(b)) => a.cmp(b),
            (Tinyint(a), Tinyint(b)) => a.cmp(b),
            (Timeuuid(a), Timeuuid(b)) => timeuuid_order_key(a).cmp(&timeuuid_order_key(b)),
            (Uuid(a), Uuid(b)) => uuid_order_key(a).cmp(&uuid_order_key(b)),
            (Varint(a), Varint(b)) => a.cmp(b),
            (Date(a), Date(b)) => a.cmp(b),
            (List(a), List(b)) | (Set(a), Set(b)) | (Vector(a), Vector(b)) => {
                compare_sequences(a, b)
            }
            (Map(a), Map(b)) => {
                for ((ka, va), (kb, vb)) in a.iter().zip(b.iter()) {
                    let order = ka.compare(kb).then_with(|| va.compare(vb));
                    if order != Ordering::Equal {
                        return order;
                    }
                }
                a.len().cmp(&b.len())
            }
            (Tuple(a), Tuple(b)) => {
                for (x, y) in a.iter().zip(b.iter()) {
                    let order = match (x, y) {
                        (None, None) => Ordering::Equal,
                        (None, Some(_)) => Ordering::Less,
                        (Some(_), None) => Ordering::Greater,
                        (Some(x), Some(y)) => x.compare(y),
                    };
                    if order != Ordering::Equal {
                        return order;
                    }
                }
                a.len().cmp(&b.len())
            }
            (Duration { .. }, Duration { .. }) => self.serialize().cmp(&other.serialize()),
            // Different types never meet in a well-typed comparison; order them stably.
            _ => self.serialize().cmp(&other.serialize()),
        }
    }

    /// The value as a CQL literal, as `DESCRIBE` prints it.
    pub fn to_cql_literal(&self) -> String {
        match self {
            Value::Ascii(s) | Value::Text(s) => format!("'{}'", s.replace('\'', "''")),
            Value::Blob(b) => {
                let mut text = String::from("0x");
                for byte in b {
                    let _ = write!(text, "{byte:02x}");
                }
                text
            }
            Value::Map(entries) => {
                let inner: Vec<String> = entries
                    .iter()
                    .map(|(k, v)| format!("{}: {}", k.to_cql_literal(), v.to_cql_literal()))
                    .collect();
                format!("{{{}}}", inner.join(", "))
            }
            Value::List(elements) | Value::Vector(elements) => format!(
                "[{}]",
                elements
                    .iter()
                    .map(Value::to_cql_literal)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Value::Set(elements) => format!(
                "{{{}}}",
                elements
                    .iter()
                    .map(Value::to_cql_literal)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Value::Bigint(v) | Value::Counter(v) | Value::Timestamp(v) | Value::Time(v) => {
                v.to_string()
            }
            Value::Int(v) => v.to_string(),
            Value::Smallint(v) => v.to_string(),
            Value::Tinyint(v) => v.to_string(),
            Value::Boolean(b) => b.to_string(),
            Value::Double(v) => v.to_string(),
            Value::Float(v) => v.to_string(),
            Value::Varint(v) => v.to_string(),
            Value::Uuid(u) | Value::Timeuuid(u) => uuid::Uuid::from_bytes(*u).to_string(),
            Value::Inet(a) => format!("'{a}'"),
            Value::Date(d) => (*d as i64 - DATE_EPOCH_OFFSET as i64).to_string(),
            Value::Decimal { unscaled, scale } => format!("{unscaled}E{}", -scale),
            Value::Duration {
                months,
                days,
                nanoseconds,
            } => format!("{months}mo{days}d{nanoseconds}ns"),
            Value::Tuple(elements) => format!(
                "({})",
                elements
                    .iter()
                    .map(|e| e.as_ref().map_or("null".to_string(), Value::to_cql_literal))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

fn compare_sequences(a: &[Value], b: &[Value]) -> Ordering {
    for (x, y) in a.iter().zip(b.iter()) {
        let order = x.compare(y);
        if order != Ordering::Equal {
            return order;
        }
    }
    a.len().cmp(&b.len())
}

pub(crate) fn inet_bytes(address: &IpAddr) -> Vec<u8> {
    match address {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// The 60-bit timestamp of a version-1 UUID.
pub fn uuid_timestamp(bytes: &[u8; 16]) -> u64 {
    let time_low = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as u64;
    let time_mid = u16::from_be_bytes([bytes[4], bytes[5]]) as u64;
    let time_high = (u16::from_be_bytes([bytes[6], bytes[7]]) & 0x0fff) as u64;
    (time_high << 48) | (time_mid << 32) | time_low
}

/// TimeUUIDType order: by embedded timestamp, then by the remaining bytes (signed).
pub(crate) fn timeuuid_order_key(bytes: &[u8; 16]) -> (u64, [u8; 8]) {
    let mut rest = [0u8; 8];
    for (i, byte) in bytes[8..].iter().enumerate() {
        rest[i] = byte ^ 0x80;
    }
    (uuid_timestamp(bytes), rest)
}

/// UUIDType order: by version, then time-based UUIDs by timestamp, then by bytes.
pub(crate) fn uuid_order_key(bytes: &[u8; 16]) -> (u8, u64, [u8; 16]) {
    let version = bytes[6] >> 4;
    let time = if version == 1 {
        uuid_timestamp(bytes)
    } else {
        0
    };
    (version, time, *bytes)
}

#[cfg(test)]
mod tests;
