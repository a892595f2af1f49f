//! Whether the entries of a file about to be ingested are worth compressing.
//!
//! Streaming builds sorted files of the chunks it receives (`Engine::streamed_file`), and
//! compressing that file with LZ4 was a third of the receiving node's streaming CPU. Yet
//! for data that does not compress — random or already compressed values — RocksDB stores
//! each block uncompressed anyway: it keeps a compressed block only when it saves at least
//! an eighth of the block (`max_compressed_bytes_per_kb`, 7/8 by default). For such data
//! the LZ4 pass buys nothing but time, and a join waits for it.
//!
//! So before building the file, a sample of its entries is compressed the way RocksDB
//! would — blocks of [`BLOCK_BYTES`] of values and keys (each without the prefix it shares
//! with the key before, as a block stores them), LZ4 — at [`SAMPLES`] places spread over
//! the file's first batch (a chunk of a couple of MiB of one table's range). If the sample saves less than an eighth, the file is built without
//! compression: RocksDB would have stored (nearly) all of it raw. Otherwise the file gets
//! the configured compression, exactly as before. The cost is a few blocks of LZ4 per file.

/// The data block size of the table format (RocksDB's default).
const BLOCK_BYTES: usize = 4 << 10;
/// Blocks compressed to judge one file.
const SAMPLES: usize = 8;

/// True when LZ4 saves at least an eighth on a sample of `entries` (RocksDB's bar for
/// keeping a compressed block); false when the sample is empty.
pub(crate) fn worth_compressing(entries: &[(&[u8], &[u8])]) -> bool {
    let mut raw = 0usize;
    let mut compressed = 0usize;
    let stride = (entries.len() / SAMPLES).max(1);
    let mut block = Vec::with_capacity(BLOCK_BYTES * 2);
    for start in (0..entries.len()).step_by(stride).take(SAMPLES) {
        block.clear();
        let mut previous: &[u8] = &[];
        for (key, value) in &entries[start..] {
            // A block stores each key without the prefix it shares with the one before.
            let shared = key.iter().zip(previous).take_while(|(a, b)| a == b).count();
            block.extend_from_slice(&key[shared..]);
            block.extend_from_slice(value);
            previous = key;
            if block.len() >= BLOCK_BYTES {
                break;
            }
        }
        raw += block.len();
        compressed += lz4_flex::block::compress(&block).len();
    }
    raw > 0 && compressed < raw - raw / 8
}

/// `length` bytes that do not compress, the same for the same `seed` (xorshift): tests'
/// stand-in for random or already compressed values.
#[cfg(test)]
pub(crate) fn incompressible_bytes(seed: u64, length: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    (0..length)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries_of(values: &[Vec<u8>]) -> Vec<(Vec<u8>, Vec<u8>)> {
        values
            .iter()
            .enumerate()
            .map(|(i, value)| ((i as u64).to_be_bytes().to_vec(), value.clone()))
            .collect()
    }

    fn judge(entries: &[(Vec<u8>, Vec<u8>)]) -> bool {
        worth_compressing(&crate::tests::borrowed(entries))
    }

    #[test]
    fn text_is_worth_compressing() {
        let values: Vec<Vec<u8>> = (0..2000)
            .map(|i| {
                format!("{{\"user\": \"user{i}\", \"status\": \"active\", \"plan\": \"free\"}}")
                    .into_bytes()
            })
            .collect();
        assert!(judge(&entries_of(&values)));
    }

    #[test]
    fn random_values_are_not() {
        let values: Vec<Vec<u8>> = (0..2000).map(|i| incompressible_bytes(i, 100)).collect();
        assert!(!judge(&entries_of(&values)));
    }

    #[test]
    fn nothing_is_not() {
        assert!(!worth_compressing(&[]));
    }

    #[test]
    fn a_few_entries_are_judged_on_all_of_them() {
        let values = vec![vec![b'a'; 300]; 3];
        assert!(judge(&entries_of(&values)));
    }
}
