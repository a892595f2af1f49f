//! Tokens: Cassandra's `Murmur3Partitioner`, reproduced exactly.
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
