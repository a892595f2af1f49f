//! Reading and writing the protocol's primitive notations ([int], [short], [string],
//! [long string], [bytes], [short bytes], [string map], ...), bounds-checked.

use crate::CqlError;

pub(crate) struct WireReader<'a> {
    bytes: &'a [u8],
    position: usize,
}

fn truncated(what: &str) -> CqlError {
    CqlError::protocol(format!("Not enough bytes to read {what}"))
}

impl<'a> WireReader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> WireReader<'a> {
        WireReader { bytes, position: 0 }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len() - self.position
    }

    pub(crate) fn take(&mut self, length: usize, what: &str) -> Result<&'a [u8], CqlError> {
        let end = self
            .position
            .checked_add(length)
            .filter(|end| *end <= self.bytes.len())
            .ok_or_else(|| truncated(what))?;
        let slice = &self.bytes[self.position..end];
        self.position = end;
        Ok(slice)
    }

    pub(crate) fn byte(&mut self) -> Result<u8, CqlError> {
        Ok(self.take(1, "a byte")?[0])
    }

    pub(crate) fn short(&mut self) -> Result<u16, CqlError> {
        let b = self.take(2, "a [short]")?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    pub(crate) fn int(&mut self) -> Result<i32, CqlError> {
        let b = self.take(4, "an [int]")?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn long(&mut self) -> Result<i64, CqlError> {
        let b = self.take(8, "a [long]")?;
        Ok(i64::from_be_bytes(b.try_into().unwrap_or([0; 8])))
    }

    pub(crate) fn string(&mut self) -> Result<String, CqlError> {
        let length = self.short()? as usize;
        let bytes = self.take(length, "a [string]")?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| CqlError::protocol("Invalid UTF-8 in [string]"))
    }

    pub(crate) fn long_string(&mut self) -> Result<String, CqlError> {
        let length = self.int()?;
        if length < 0 {
            return Err(CqlError::protocol("Negative [long string] length"));
        }
        let bytes = self.take(length as usize, "a [long string]")?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| CqlError::protocol("Invalid UTF-8 in [long string]"))
    }

    pub(crate) fn short_bytes(&mut self) -> Result<Vec<u8>, CqlError> {
        let length = self.short()? as usize;
        Ok(self.take(length, "[short bytes]")?.to_vec())
    }

    /// A [value]: `Some(Some(bytes))`, null (`Some(None)`), or not set (`None`).
    pub(crate) fn value(&mut self) -> Result<BoundValue, CqlError> {
        let length = self.int()?;
        match length {
            -1 => Ok(BoundValue::Null),
            -2 => Ok(BoundValue::Unset),
            n if n < 0 => Err(CqlError::protocol(format!("Invalid value length {n}"))),
            n => Ok(BoundValue::Bytes(
                self.take(n as usize, "a [value]")?.to_vec(),
            )),
        }
    }

    pub(crate) fn string_map(&mut self) -> Result<Vec<(String, String)>, CqlError> {
        let count = self.short()?;
        let mut entries = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let key = self.string()?;
            let value = self.string()?;
            entries.push((key, value));
        }
        Ok(entries)
    }

    pub(crate) fn string_list(&mut self) -> Result<Vec<String>, CqlError> {
        let count = self.short()?;
        let mut entries = Vec::with_capacity(count as usize);
        for _ in 0..count {
            entries.push(self.string()?);
        }
        Ok(entries)
    }
}

/// A bound value from the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BoundValue {
    Bytes(Vec<u8>),
    Null,
    /// Protocol v4's "not set": leave the column untouched.
    Unset,
}

pub(crate) fn put_short(out: &mut Vec<u8>, value: u16) {
    out.extend_from_slice(&value.to_be_bytes());
}

pub(crate) fn put_int(out: &mut Vec<u8>, value: i32) {
    out.extend_from_slice(&value.to_be_bytes());
}

pub(crate) fn put_string(out: &mut Vec<u8>, value: &str) {
    let bytes = value.as_bytes();
    let length = bytes.len().min(u16::MAX as usize);
    put_short(out, length as u16);
    out.extend_from_slice(&bytes[..length]);
}

pub(crate) fn put_short_bytes(out: &mut Vec<u8>, value: &[u8]) {
    put_short(out, value.len() as u16);
    out.extend_from_slice(value);
}

pub(crate) fn put_bytes(out: &mut Vec<u8>, value: Option<&[u8]>) {
    match value {
        Some(bytes) => {
            put_int(out, bytes.len() as i32);
            out.extend_from_slice(bytes);
        }
        None => put_int(out, -1),
    }
}

pub(crate) fn put_string_list(out: &mut Vec<u8>, values: &[&str]) {
    put_short(out, values.len() as u16);
    for value in values {
        put_string(out, value);
    }
}
