//! Buffers of a megabyte or more, kept for reuse instead of freed.
//!
//! A join moves hundreds of megabytes between nodes in chunks of about 2 MiB: the source
//! packs each chunk into a buffer, the destination reads each frame into another. Freed,
//! such a buffer goes back to the operating system, and the next one costs a page fault
//! and the zeroing of a fresh page for every 4 KiB written into it. On the destination of
//! an idle 1 GiB join that was a third of the CPU time of the thread receiving the chunks
//! (`bench/results/2026-12-07-diag-join-cpu`).
//!
//! So [`take`] hands out a kept buffer when one is large enough, and a buffer handed on as
//! [`Bytes`] through [`into_bytes`] comes back here when the last of those bytes is
//! dropped (after the chunk is written to the socket, or built into a file). Buffers of at
//! most [`LARGEST_KEPT_BYTES`] are kept, [`KEPT_BYTES`] of them at most, so what stays
//! allocated is bounded.

use bytes::Bytes;
use parking_lot::Mutex;

/// Buffers smaller than this are allocated and freed as usual.
pub const SMALLEST_KEPT_BYTES: usize = 1 << 20;
/// Buffers larger than this (a rare huge message's) are freed, not kept.
pub const LARGEST_KEPT_BYTES: usize = 8 << 20;
/// Bytes of buffers kept at most. A node's chunks in flight at once are about four per
/// stream (`streaming::outgoing` reads four ahead; a receiving job holds the one being
/// read, two queued for its file and the one being built in), and a node runs up to eight
/// streams: some 32 chunks of 2 MiB.
pub const KEPT_BYTES: usize = 72 << 20;
/// Capacities are rounded up to this, so that chunks of slightly different sizes share
/// buffers.
const CAPACITY_STEP: usize = 256 << 10;

/// Whether a buffer of `capacity` bytes is one to keep: large, but not huge.
fn worth_keeping(capacity: usize) -> bool {
    (SMALLEST_KEPT_BYTES..=LARGEST_KEPT_BYTES).contains(&capacity)
}

/// Kept buffers: the process's [`PROCESS`], or a test's own.
pub struct KeptBuffers {
    kept: Mutex<Vec<Vec<u8>>>,
}

/// The buffers the whole process shares.
static PROCESS: KeptBuffers = KeptBuffers::new();

/// An empty buffer with room for at least `capacity` bytes, from the process's kept ones
/// ([`KeptBuffers::take`]).
pub fn take(capacity: usize) -> Vec<u8> {
    PROCESS.take(capacity)
}

/// Keeps `buffer` for the process ([`KeptBuffers::give_back`]).
pub fn give_back(buffer: Vec<u8>) {
    PROCESS.give_back(buffer)
}

/// `buffer` as [`Bytes`] that give it back to the process ([`KeptBuffers::into_bytes`]).
pub fn into_bytes(buffer: Vec<u8>) -> Bytes {
    PROCESS.into_bytes(buffer)
}

impl KeptBuffers {
    pub const fn new() -> KeptBuffers {
        KeptBuffers {
            kept: Mutex::new(Vec::new()),
        }
    }

    /// An empty buffer with room for at least `capacity` bytes: a kept one if one is
    /// large enough, a new one otherwise.
    pub fn take(&self, capacity: usize) -> Vec<u8> {
        if !worth_keeping(capacity) {
            return Vec::with_capacity(capacity);
        }
        let reused = {
            let mut kept = self.kept.lock();
            kept.iter()
                .position(|buffer| buffer.capacity() >= capacity)
                .map(|found| kept.swap_remove(found))
        };
        match reused {
            Some(mut buffer) => {
                buffer.clear();
                buffer
            }
            None => Vec::with_capacity(capacity.div_ceil(CAPACITY_STEP) * CAPACITY_STEP),
        }
    }

    /// Keeps `buffer` for a later [`KeptBuffers::take`] if it is large (but not huge) and
    /// there is room; frees it otherwise.
    pub fn give_back(&self, buffer: Vec<u8>) {
        if !worth_keeping(buffer.capacity()) {
            return;
        }
        let mut kept = self.kept.lock();
        let kept_bytes: usize = kept.iter().map(Vec::capacity).sum();
        if kept_bytes + buffer.capacity() <= KEPT_BYTES {
            kept.push(buffer);
        }
    }

    /// `buffer` as [`Bytes`] that give it back ([`KeptBuffers::give_back`]) once the last
    /// of them is dropped.
    pub fn into_bytes(&'static self, buffer: Vec<u8>) -> Bytes {
        if !worth_keeping(buffer.capacity()) {
            return Bytes::from(buffer);
        }
        Bytes::from_owner(GivenBackOnDrop {
            buffer,
            owner: self,
        })
    }
}

impl Default for KeptBuffers {
    fn default() -> Self {
        KeptBuffers::new()
    }
}

struct GivenBackOnDrop {
    buffer: Vec<u8>,
    owner: &'static KeptBuffers,
}

impl AsRef<[u8]> for GivenBackOnDrop {
    fn as_ref(&self) -> &[u8] {
        &self.buffer
    }
}

impl Drop for GivenBackOnDrop {
    fn drop(&mut self) {
        self.owner.give_back(std::mem::take(&mut self.buffer));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_buffer_comes_back_when_its_last_bytes_are_dropped_and_is_reused() {
        static BUFFERS: KeptBuffers = KeptBuffers::new();
        let size = SMALLEST_KEPT_BYTES + 12_345;
        let mut buffer = BUFFERS.take(size);
        assert!(buffer.is_empty() && buffer.capacity() >= size);
        buffer.extend_from_slice(b"chunk");
        let address = buffer.as_ptr();
        let bytes = BUFFERS.into_bytes(buffer);
        let part = bytes.slice(1..3);
        drop(bytes);
        assert_eq!(&part[..], b"hu", "the bytes live while a slice does");
        assert!(
            BUFFERS.kept.lock().is_empty(),
            "not given back while a slice lives"
        );
        drop(part);
        let again = BUFFERS.take(size);
        assert_eq!(again.as_ptr(), address, "the same buffer, reused");
        assert!(again.is_empty(), "a reused buffer is handed out empty");
        // Too small for a larger request, which gets a new one (the kept one is still
        // allocated, so the new one cannot sit at its address).
        BUFFERS.give_back(again);
        let larger = BUFFERS.take(size * 4);
        assert_ne!(larger.as_ptr(), address);
        assert_eq!(BUFFERS.kept.lock().len(), 1);
    }

    #[test]
    fn small_and_huge_buffers_are_not_kept_and_the_kept_ones_are_bounded() {
        static BUFFERS: KeptBuffers = KeptBuffers::new();
        BUFFERS.give_back(BUFFERS.take(1024));
        BUFFERS.give_back(BUFFERS.take(LARGEST_KEPT_BYTES + 1));
        assert!(BUFFERS.kept.lock().is_empty());
        let fit = KEPT_BYTES / SMALLEST_KEPT_BYTES;
        for _ in 0..fit + 4 {
            BUFFERS.give_back(Vec::with_capacity(SMALLEST_KEPT_BYTES));
        }
        assert_eq!(BUFFERS.kept.lock().len(), fit);
    }
}
