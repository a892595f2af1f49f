//! Frames: `version | flags | stream (i16) | opcode | length (u32)` then the body.
//!
//! Shoal speaks protocol v4 only. A client offering any other version gets a protocol
//! error whose message contains "Invalid or unsupported protocol version", which is what
//! the Python, Java and Rust drivers look for before retrying with v4. Bodies may be LZ4
//! compressed (flag 0x01) once the client asked for it in STARTUP; in v4 a compressed body
//! is the uncompressed length as a big-endian int followed by one LZ4 block.

use crate::CqlError;

pub const HEADER_LENGTH: usize = 9;
/// The only protocol version Shoal speaks.
pub const PROTOCOL_VERSION: u8 = 4;
/// The version byte of responses (direction bit set).
pub const RESPONSE_VERSION: u8 = 0x80 | PROTOCOL_VERSION;
/// Default maximum body length (Cassandra's `native_transport_max_frame_size`).
pub const DEFAULT_MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;

pub mod opcode {
    pub const ERROR: u8 = 0x00;
    pub const STARTUP: u8 = 0x01;
    pub const READY: u8 = 0x02;
    pub const AUTHENTICATE: u8 = 0x03;
    pub const OPTIONS: u8 = 0x05;
    pub const SUPPORTED: u8 = 0x06;
    pub const QUERY: u8 = 0x07;
    pub const RESULT: u8 = 0x08;
    pub const PREPARE: u8 = 0x09;
    pub const EXECUTE: u8 = 0x0A;
    pub const REGISTER: u8 = 0x0B;
    pub const EVENT: u8 = 0x0C;
    pub const BATCH: u8 = 0x0D;
    pub const AUTH_CHALLENGE: u8 = 0x0E;
    pub const AUTH_RESPONSE: u8 = 0x0F;
    pub const AUTH_SUCCESS: u8 = 0x10;
}

pub mod flags {
    pub const COMPRESSION: u8 = 0x01;
    pub const TRACING: u8 = 0x02;
    pub const CUSTOM_PAYLOAD: u8 = 0x04;
    pub const WARNING: u8 = 0x08;
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// The version byte as sent, direction bit included.
    pub version: u8,
    pub flags: u8,
    pub stream: i16,
    pub opcode: u8,
    pub length: u32,
}

impl FrameHeader {
    pub fn parse(bytes: &[u8; HEADER_LENGTH]) -> FrameHeader {
        FrameHeader {
            version: bytes[0],
            flags: bytes[1],
            stream: i16::from_be_bytes([bytes[2], bytes[3]]),
            opcode: bytes[4],
            length: u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]),
        }
    }

    /// The protocol version the client asked for (direction bit removed).
    pub fn requested_version(&self) -> u8 {
        self.version & 0x7f
    }

    /// `Err` with the protocol error Cassandra sends for a version other than v4.
    pub fn check_version(&self) -> Result<(), CqlError> {
        let version = self.requested_version();
        if version == PROTOCOL_VERSION && self.version & 0x80 == 0 {
            Ok(())
        } else {
            Err(CqlError::protocol(format!(
                "Invalid or unsupported protocol version ({version}); supported versions are (4/v4)"
            )))
        }
    }
}

/// Appends a complete response frame to `out`, compressing the body if `compress`.
pub fn write_frame(out: &mut Vec<u8>, stream: i16, opcode: u8, body: &[u8], compress: bool) {
    write_traced_frame(out, stream, opcode, body, compress, None);
}

/// [`write_frame`] for a request the client asked to trace: the tracing flag is set and
/// the body starts with the trace's id (the `session_id` of `system_traces`).
pub fn write_traced_frame(
    out: &mut Vec<u8>,
    stream: i16,
    opcode: u8,
    body: &[u8],
    compress: bool,
    tracing_id: Option<[u8; 16]>,
) {
    let mut frame_flags = 0;
    let traced;
    let body = match tracing_id {
        Some(id) => {
            frame_flags |= flags::TRACING;
            traced = [&id[..], body].concat();
            &traced[..]
        }
        None => body,
    };
    let compressed;
    let body = if compress {
        frame_flags |= flags::COMPRESSION;
        compressed = compress_body(body);
        &compressed[..]
    } else {
        body
    };
    let start = out.len();
    out.resize(start + HEADER_LENGTH, 0);
    write_header(&mut out[start..], stream, opcode, frame_flags, body.len());
    out.extend_from_slice(body);
}

/// Writes a response frame's header into the first [`HEADER_LENGTH`] bytes of `header`,
/// for a body of `length` bytes.
pub fn write_header(header: &mut [u8], stream: i16, opcode: u8, flags: u8, length: usize) {
    header[0] = RESPONSE_VERSION;
    header[1] = flags;
    header[2..4].copy_from_slice(&stream.to_be_bytes());
    header[4] = opcode;
    header[5..9].copy_from_slice(&(length as u32).to_be_bytes());
}

/// v4 LZ4 body: uncompressed length (i32 BE) then one LZ4 block.
pub fn compress_body(body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + lz4_flex::block::get_maximum_output_size(body.len()));
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&lz4_flex::block::compress(body));
    out
}

/// Inverse of [`compress_body`], refusing to inflate past `max_bytes`.
pub fn decompress_body(body: &[u8], max_bytes: usize) -> Result<Vec<u8>, CqlError> {
    if body.len() < 4 {
        return Err(CqlError::protocol("Compressed body too short"));
    }
    let length = u32::from_be_bytes([body[0], body[1], body[2], body[3]]) as usize;
    if length > max_bytes {
        return Err(CqlError::protocol(format!(
            "Decompressed frame of {length} bytes exceeds the maximum of {max_bytes} bytes"
        )));
    }
    lz4_flex::block::decompress(&body[4..], length)
        .map_err(|e| CqlError::protocol(format!("Invalid LZ4 compressed body: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traced_response_carries_its_trace_id_before_the_body() {
        let mut out = Vec::new();
        write_traced_frame(&mut out, 3, opcode::RESULT, b"body", false, Some([7; 16]));
        let header = FrameHeader::parse(out[..HEADER_LENGTH].try_into().unwrap());
        assert_eq!(header.flags, flags::TRACING);
        assert_eq!(header.length, 20);
        assert_eq!(&out[HEADER_LENGTH..HEADER_LENGTH + 16], &[7; 16]);
        assert_eq!(&out[HEADER_LENGTH + 16..], b"body");
    }

    #[test]
    fn other_versions_are_refused_with_the_drivers_message() {
        let mut header = [0x05, 0, 0, 1, opcode::OPTIONS, 0, 0, 0, 0];
        let parsed = FrameHeader::parse(&header);
        let error = parsed.check_version().unwrap_err();
        assert!(error
            .message
            .contains("Invalid or unsupported protocol version"));
        header[0] = 0x04;
        assert!(FrameHeader::parse(&header).check_version().is_ok());
    }

    #[test]
    fn compression_round_trips_and_rejects_garbage() {
        let body = b"hello hello hello hello".repeat(10);
        let compressed = compress_body(&body);
        assert_eq!(decompress_body(&compressed, 1 << 20).unwrap(), body);
        assert!(decompress_body(&compressed, 10).is_err());
        assert!(decompress_body(&[0, 0, 0, 50, 1, 2, 3], 1 << 20).is_err());
    }
}
