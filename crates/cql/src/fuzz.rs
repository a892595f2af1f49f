//! Fuzzing everything a client's bytes reach in this crate: frame headers, LZ4 bodies,
//! request bodies of every opcode and CQL statement text — each must answer with a value
//! or a protocol error, never panic, and allocate in proportion to its input (collection
//! counts are checked against the bytes left before anything is reserved).
//!
//! Two kinds of input: arbitrary bytes, and valid requests with random mutations (flipped
//! bytes, cut short), which get past the first length checks and reach the deeper
//! decoders. `cargo test -p shoal-cql fuzz` runs a short round in the test suite; the long
//! run is `PROPTEST_CASES=1000000 cargo test --release -p shoal-cql fuzz`.

use crate::frame::{self, opcode, FrameHeader, HEADER_LENGTH};
use crate::request::Request;
use proptest::collection::vec;
use proptest::prelude::*;

fn long_string(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(&(text.len() as i32).to_be_bytes());
    out.extend_from_slice(text.as_bytes());
}

fn short_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
    out.extend_from_slice(bytes);
}

fn value(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as i32).to_be_bytes());
    out.extend_from_slice(bytes);
}

/// Query parameters with values, a page size, a paging state, a serial consistency and a
/// default timestamp: every flag the decoder knows.
fn parameters(out: &mut Vec<u8>) {
    out.extend_from_slice(&1u16.to_be_bytes());
    out.push(0x01 | 0x04 | 0x08 | 0x10 | 0x20);
    out.extend_from_slice(&2u16.to_be_bytes());
    value(out, &7i32.to_be_bytes());
    value(out, b"text");
    out.extend_from_slice(&100i32.to_be_bytes());
    value(out, &[1, 2, 3]);
    out.extend_from_slice(&9u16.to_be_bytes());
    out.extend_from_slice(&1_700_000_000_000_000i64.to_be_bytes());
}

/// One valid body of each request kind, with its opcode.
fn valid_requests() -> Vec<(u8, Vec<u8>)> {
    let mut query = Vec::new();
    long_string(&mut query, "SELECT * FROM ks.t WHERE k = ? AND c = ?");
    parameters(&mut query);
    let mut execute = Vec::new();
    short_bytes(&mut execute, &[0xab; 16]);
    parameters(&mut execute);
    let mut batch = vec![0u8];
    batch.extend_from_slice(&2u16.to_be_bytes());
    batch.push(0);
    long_string(&mut batch, "INSERT INTO t (k, v) VALUES (?, ?)");
    batch.extend_from_slice(&2u16.to_be_bytes());
    value(&mut batch, &1i32.to_be_bytes());
    value(&mut batch, b"v");
    batch.push(1);
    short_bytes(&mut batch, &[0xcd; 16]);
    batch.extend_from_slice(&0u16.to_be_bytes());
    batch.extend_from_slice(&4u16.to_be_bytes());
    batch.push(0x10 | 0x20);
    batch.extend_from_slice(&8u16.to_be_bytes());
    batch.extend_from_slice(&5i64.to_be_bytes());
    let mut startup = 1u16.to_be_bytes().to_vec();
    for text in ["CQL_VERSION", "3.0.0"] {
        short_bytes(&mut startup, text.as_bytes());
    }
    let mut register = 2u16.to_be_bytes().to_vec();
    for text in ["SCHEMA_CHANGE", "STATUS_CHANGE"] {
        short_bytes(&mut register, text.as_bytes());
    }
    let mut prepare = Vec::new();
    long_string(&mut prepare, "UPDATE t SET l = l + ? WHERE k = ?");
    vec![
        (opcode::QUERY, query),
        (opcode::EXECUTE, execute),
        (opcode::BATCH, batch),
        (opcode::STARTUP, startup),
        (opcode::REGISTER, register),
        (opcode::PREPARE, prepare),
    ]
}

/// `body` with bytes at the given positions replaced, then cut to `keep` bytes.
fn mutate(mut body: Vec<u8>, flips: &[(usize, u8)], keep: usize) -> Vec<u8> {
    for (position, byte) in flips {
        if !body.is_empty() {
            let index = position % body.len();
            body[index] = *byte;
        }
    }
    body.truncate(keep);
    body
}

#[test]
fn the_valid_requests_decode() {
    for (op, body) in valid_requests() {
        assert!(Request::decode(op, &body).is_ok(), "opcode {op}");
    }
}

proptest! {
    #[test]
    fn arbitrary_request_bodies_are_refused_or_decoded(op in 0u8..=0x10, body in vec(any::<u8>(), 0..256)) {
        let _ = Request::decode(op, &body);
    }

    #[test]
    fn mutated_requests_are_refused_or_decoded(
        which in 0usize..6,
        flips in vec((any::<usize>(), any::<u8>()), 1..6),
        keep in 0usize..512,
    ) {
        let (op, body) = valid_requests().swap_remove(which);
        let _ = Request::decode(op, &mutate(body, &flips, keep));
    }

    #[test]
    fn arbitrary_compressed_bodies_inflate_within_the_limit(body in vec(any::<u8>(), 0..256)) {
        if let Ok(inflated) = frame::decompress_body(&body, 1 << 16) {
            prop_assert!(inflated.len() <= 1 << 16);
        }
    }

    #[test]
    fn frame_headers_parse_whatever_their_bytes(bytes in any::<[u8; HEADER_LENGTH]>()) {
        let header = FrameHeader::parse(&bytes);
        let _ = header.check_version();
    }

    #[test]
    fn statement_text_parses_or_is_refused(text in "\\PC{0,80}") {
        let _ = crate::parser::parse_statement(&text);
    }

    #[test]
    fn mutated_statements_parse_or_are_refused(
        which in 0usize..4,
        cut in 0usize..80,
        insert in "[(){}\\[\\]'\",.;:?<>=+*/ a-z0-9-]{0,4}",
    ) {
        let statements = [
            "SELECT a, writetime(b) FROM ks.t WHERE k IN (1, 2) AND (c1, c2) > (1, 'x') ORDER BY c1 DESC LIMIT 10 ALLOW FILTERING",
            "UPDATE ks.t USING TTL 10 SET m['k'] = 1, l = [1, 2] + l, s = s - {'a'} WHERE k = 1 IF v = 2",
            "CREATE TABLE ks.t (k int, c text, v map<text, frozen<list<int>>>, PRIMARY KEY ((k), c)) WITH CLUSTERING ORDER BY (c DESC) AND gc_grace_seconds = 0",
            "BEGIN UNLOGGED BATCH USING TIMESTAMP 5 INSERT INTO t (k, v) VALUES (1, 0x00ff) IF NOT EXISTS; DELETE l[1] FROM t WHERE k = 2; APPLY BATCH",
        ];
        let text = statements[which];
        let cut = text.char_indices().map(|(i, _)| i).nth(cut).unwrap_or(text.len());
        let _ = crate::parser::parse_statement(&format!("{}{insert}{}", &text[..cut], &text[cut..]));
    }
}
