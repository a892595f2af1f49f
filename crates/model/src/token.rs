//! Tokens: where a partition sits on the ring. A table chooses its [`Partitioner`]:
//!
//! - **Murmur3** (the default): Cassandra's `Murmur3Partitioner`, reproduced exactly, so
//!   drivers' token-aware routing finds the replicas. Keys spread evenly; no order.
//! - **Ordered**: the token is the first eight bytes of the key in key order
//!   ([`ordered_token`]), so a token range is a key range and a scan walks keys in order
//!   (seed 002's order-preserving placement). Keys sharing their first eight bytes share a
//!   token; the storage layout keeps them in key order within it (`keys`).
//!
//! Cassandra hashes the serialized partition key with its Java port of MurmurHash3
//! x64_128 (seed 0) and takes the first 64-bit half as the token. The port has one quirk
//! that must be copied for tokens to match: the tail bytes are read as *signed* Java
//! bytes, so a tail byte ≥ 0x80 is sign-extended before being shifted into place. The
//! minimum `i64` is reserved by Cassandra as the ring's minimum token, so a hash equal to
//! it becomes `i64::MAX`.

use serde::{Deserialize, Serialize};

/// A position on the ring, `i64::MIN` (exclusive minimum) to `i64::MAX`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Token(pub i64);

impl Token {
    pub const MIN: Token = Token(i64::MIN);
    pub const MAX: Token = Token(i64::MAX);

    /// Big-endian bytes whose unsigned order equals the token's signed order.
    pub fn to_sortable_bytes(self) -> [u8; 8] {
        ((self.0 as u64) ^ (1 << 63)).to_be_bytes()
    }

    pub fn from_sortable_bytes(bytes: [u8; 8]) -> Token {
        Token((u64::from_be_bytes(bytes) ^ (1 << 63)) as i64)
    }
}

/// How a table maps its partition keys to tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash, Serialize, Deserialize)]
pub enum Partitioner {
    /// Cassandra's Murmur3Partitioner: keys spread evenly over the ring, in no order.
    #[default]
    Murmur3,
    /// Order-preserving: token order is key order ([`ordered_token`]).
    Ordered,
}

impl Partitioner {
    /// The name `WITH partitioner = '…'` takes and DESCRIBE prints.
    pub fn name(self) -> &'static str {
        match self {
            Partitioner::Murmur3 => "murmur3",
            Partitioner::Ordered => "ordered",
        }
    }

    /// Parses a `partitioner` option: our names, or Cassandra's class names for the same
    /// idea (`Murmur3Partitioner`, `ByteOrderedPartitioner`, with or without the package).
    pub fn parse(name: &str) -> Option<Partitioner> {
        let short = name
            .strip_prefix("org.apache.cassandra.dht.")
            .unwrap_or(name);
        match short.to_ascii_lowercase().as_str() {
            "murmur3" | "murmur3partitioner" => Some(Partitioner::Murmur3),
            "ordered" | "byteorderedpartitioner" => Some(Partitioner::Ordered),
            _ => None,
        }
    }
}

/// The token of an ordered table's partition, from its key in a byte-comparable form
/// (`order_bytes`: bytes whose unsigned order is the keys' order): the first eight bytes,
/// zero-padded. Monotonic — a smaller key never has a larger token — but not one-to-one:
/// keys that share their first eight bytes share a token. The ring's minimum token is
/// reserved, so a key whose bytes start with eight zeros takes the next one.
pub fn ordered_token(order_bytes: &[u8]) -> Token {
    let mut first = [0u8; 8];
    let length = order_bytes.len().min(8);
    first[..length].copy_from_slice(&order_bytes[..length]);
    match Token::from_sortable_bytes(first) {
        Token::MIN => Token(i64::MIN + 1),
        token => token,
    }
}

/// The token of a serialized partition key, as Cassandra's Murmur3Partitioner computes it.
pub fn murmur3_token(key: &[u8]) -> Token {
    let h1 = murmur3_x64_128_first_half(key);
    Token(if h1 == i64::MIN { i64::MAX } else { h1 })
}

const C1: i64 = 0x87c3_7b91_1142_53d5_u64 as i64;
const C2: i64 = 0x4cf5_ad43_2745_937f_u64 as i64;

fn fmix(mut k: i64) -> i64 {
    k ^= ((k as u64) >> 33) as i64;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd_u64 as i64);
    k ^= ((k as u64) >> 33) as i64;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53_u64 as i64);
    k ^= ((k as u64) >> 33) as i64;
    k
}

fn murmur3_x64_128_first_half(key: &[u8]) -> i64 {
    let length = key.len();
    let block_count = length / 16;
    let mut h1: i64 = 0;
    let mut h2: i64 = 0;

    for block in key.chunks_exact(16) {
        let mut k1 = i64::from_le_bytes(block[0..8].try_into().unwrap_or([0; 8]));
        let mut k2 = i64::from_le_bytes(block[8..16].try_into().unwrap_or([0; 8]));

        k1 = k1.wrapping_mul(C1).rotate_left(31).wrapping_mul(C2);
        h1 ^= k1;
        h1 = h1
            .rotate_left(27)
            .wrapping_add(h2)
            .wrapping_mul(5)
            .wrapping_add(0x52dc_e729);

        k2 = k2.wrapping_mul(C2).rotate_left(33).wrapping_mul(C1);
        h2 ^= k2;
        h2 = h2
            .rotate_left(31)
            .wrapping_add(h1)
            .wrapping_mul(5)
            .wrapping_add(0x3849_5ab5);
    }

    // The tail, with Java's signed-byte sign extension.
    let tail = &key[block_count * 16..];
    let signed = |i: usize| tail[i] as i8 as i64;
    let mut k1: i64 = 0;
    let mut k2: i64 = 0;
    let rest = length & 15;
    if rest > 8 {
        for i in (8..rest).rev() {
            k2 ^= signed(i) << ((i - 8) * 8);
        }
        k2 = k2.wrapping_mul(C2).rotate_left(33).wrapping_mul(C1);
        h2 ^= k2;
    }
    if rest > 0 {
        for i in (0..rest.min(8)).rev() {
            k1 ^= signed(i) << (i * 8);
        }
        k1 = k1.wrapping_mul(C1).rotate_left(31).wrapping_mul(C2);
        h1 ^= k1;
    }

    h1 ^= length as i64;
    h2 ^= length as i64;
    h1 = h1.wrapping_add(h2);
    h2 = h2.wrapping_add(h1);
    h1 = fmix(h1);
    h2 = fmix(h2);
    h1.wrapping_add(h2)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values computed by Apache Cassandra (`SELECT token(k) FROM t`).
    #[test]
    fn tokens_match_cassandra() {
        // int partition key 1 → 0x00000001
        assert_eq!(
            murmur3_token(&1i32.to_be_bytes()),
            Token(-4069959284402364209)
        );
        // int partition key 0
        assert_eq!(
            murmur3_token(&0i32.to_be_bytes()),
            Token(-3485513579396041028)
        );
        // text 'hello'
        assert_eq!(murmur3_token(b"hello"), Token(-3758069500696749310));
        // the empty key
        assert_eq!(murmur3_token(b""), Token(0));
    }

    #[test]
    fn ordered_tokens_keep_key_order_and_never_take_the_minimum() {
        let keys: [&[u8]; 7] = [
            b"",
            b"\x00\x00\x00\x00\x00\x00\x00\x00\x01",
            b"\x00\x00\x00\x00\x00\x00\x00\x02",
            b"a",
            b"abcdefgh-1",
            b"abcdefgh-2",
            b"\xff\xff\xff\xff\xff\xff\xff\xff\xff",
        ];
        let tokens: Vec<Token> = keys.iter().map(|key| ordered_token(key)).collect();
        assert!(tokens.windows(2).all(|pair| pair[0] <= pair[1]));
        assert!(tokens.iter().all(|&token| token > Token::MIN));
        assert_eq!(
            tokens[4], tokens[5],
            "a shared eight-byte prefix shares a token"
        );
        assert!(tokens[3] < tokens[4]);
        assert_eq!(tokens[6], Token::MAX);
        assert_eq!(
            Partitioner::parse("org.apache.cassandra.dht.ByteOrderedPartitioner"),
            Some(Partitioner::Ordered)
        );
        assert_eq!(Partitioner::parse("Murmur3"), Some(Partitioner::Murmur3));
        assert_eq!(Partitioner::parse("random"), None);
    }

    #[test]
    fn sortable_bytes_preserve_order() {
        let tokens = [i64::MIN, -5, -1, 0, 1, 7, i64::MAX];
        for pair in tokens.windows(2) {
            assert!(Token(pair[0]).to_sortable_bytes() < Token(pair[1]).to_sortable_bytes());
            assert_eq!(
                Token::from_sortable_bytes(Token(pair[0]).to_sortable_bytes()),
                Token(pair[0])
            );
        }
    }
}
