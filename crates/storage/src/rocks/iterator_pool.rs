//! Iterators that partition reads reuse instead of creating one per read.
//!
//! Creating a RocksDB iterator takes a reference on the column family's current super
//! version and builds an iterator over each memtable, each level-0 file and each level;
//! dropping it undoes all of that. A point read then seeks once and reads a row's few
//! entries, so creating and dropping its iterator cost about a third of what the read
//! itself costs (16% of a node's CPU against 42% for the seeks, `perf record` under a
//! point-read load). Reads within one token — every partition read, point reads
//! included — therefore take an iterator from an [`IteratorPool`] and give it back when
//! their cursor is dropped:
//!
//! - The bounds change in place. RocksDB reads `iterate_lower_bound` and
//!   `iterate_upper_bound` through pointers into the C read options the iterator was
//!   created with (which [`PooledIterator`] owns), and checks them again on every seek.
//! - `Refresh` makes a taken iterator see every write acknowledged so far: it moves the
//!   iterator to the latest sequence number and, only if a flush or compaction installed
//!   a new super version since, rebuilds the iterator over the new files.
//!
//! A pooled iterator keeps the super version it last saw alive, and with it memtables
//! already flushed and files already compacted away. So the pool holds at most
//! [`POOL_CAPACITY`] iterators, and [`IteratorPool::drop_idle`] (called by the node about
//! once a second, through [`crate::Engine::release_idle_readers`]) drops those unused for
//! [`IDLE_LIMIT`].
//!
//! An engine keeps two pools: one for reads of everything, one for reads of what is in
//! memory only ([`Tier::Memory`], [`crate::Engine::scan_in_memory`]). A read tier is fixed
//! when an iterator is created, and an iterator of memory that stopped at a block on disk
//! is pooled again: its next seek starts afresh.
//!
//! rust-rocksdb does not expose `Refresh`, so this module drives its iterators through the
//! C API of `librocksdb-sys`, the same bindings rust-rocksdb is built on. It is the one
//! module of the workspace allowed `unsafe` code (the workspace denies it): each block
//! is one C call on an iterator this module created and alone destroys.

#![allow(unsafe_code)]

use super::cursor::{DirectedCursor, RawIterator};
use crate::{Cursor, Result, StorageError};
use parking_lot::Mutex;
use rocksdb::{AsColumnFamilyRef, DBAccess, ReadOptions, DB};
use std::ffi::{c_char, CStr};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

/// Iterators a pool keeps at most: more than the threads that read a node's storage at
/// once, so that a read finds one whenever reads run.
pub(crate) const POOL_CAPACITY: usize = 16;

/// How long an iterator stays pooled unused before it is dropped, releasing the files and
/// memtables it keeps alive.
pub(crate) const IDLE_LIMIT: Duration = Duration::from_secs(1);

/// What the iterators of a pool read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tier {
    /// Memtables, block cache and files.
    All,
    /// Memtables and block cache only: an iterator that comes to a block not cached stops
    /// there with `Incomplete` ([`StorageError::NotInMemory`]) instead of reading it.
    Memory,
}

impl Tier {
    /// Sets read options to read this tier.
    pub(crate) fn apply(self, read_options: &mut ReadOptions) {
        if self == Tier::Memory {
            read_options.set_read_tier(rocksdb::ReadTier::BlockCache);
        }
    }
}

/// A RocksDB iterator created with read options of its own, whose bounds can change.
pub(crate) struct PooledIterator {
    raw: NonNull<librocksdb_sys::rocksdb_iterator_t>,
    /// Owns the C read options (and the bounds) the iterator reads through pointers. It is
    /// dropped after `raw` is destroyed (in `Drop`).
    read_options: ReadOptions,
    /// When the iterator was last given back to the pool.
    returned_at: Instant,
}

// SAFETY: a RocksDB iterator may be used from any thread, one at a time; a
// `PooledIterator` is only ever used through `&mut` or by its one owner.
unsafe impl Send for PooledIterator {}

impl Drop for PooledIterator {
    fn drop(&mut self) {
        // SAFETY: `raw` came from `create_iterator_cf` and is destroyed once, here.
        unsafe { librocksdb_sys::rocksdb_iter_destroy(self.raw.as_ptr()) }
    }
}

impl PooledIterator {
    /// A new iterator over `family` within `[lower, upper)`, all keys of which share one
    /// token (so that prefix bloom filters apply).
    fn create(
        db: &DB,
        family: &impl AsColumnFamilyRef,
        tier: Tier,
        lower: &[u8],
        upper: &[u8],
    ) -> Result<PooledIterator> {
        let mut read_options = ReadOptions::default();
        read_options.set_iterate_lower_bound(lower.to_vec());
        read_options.set_iterate_upper_bound(upper.to_vec());
        read_options.set_prefix_same_as_start(true);
        tier.apply(&mut read_options);
        // SAFETY: the column family belongs to `db`; the iterator is destroyed (in `Drop`)
        // before `read_options`, and the pool holding it is cleared before `db` closes
        // (`RocksEngine`'s `Drop`).
        let raw = unsafe { db.create_iterator_cf(family.inner(), &read_options) };
        let raw = NonNull::new(raw)
            .ok_or_else(|| StorageError::Io("RocksDB did not create an iterator".into()))?;
        Ok(PooledIterator {
            raw,
            read_options,
            returned_at: Instant::now(),
        })
    }

    /// Moves the iterator to `[lower, upper)` and to the latest writes.
    fn reuse_for(&mut self, lower: &[u8], upper: &[u8]) -> Result<()> {
        self.read_options.set_iterate_lower_bound(lower.to_vec());
        self.read_options.set_iterate_upper_bound(upper.to_vec());
        let mut error: *mut c_char = std::ptr::null_mut();
        // SAFETY: `raw` is a live iterator; `error` receives a message RocksDB allocated.
        unsafe { librocksdb_sys::rocksdb_iter_refresh(self.raw.as_ptr(), &mut error) };
        take_error(error)
    }
}

impl RawIterator for PooledIterator {
    fn valid(&self) -> bool {
        // SAFETY: `raw` is a live iterator.
        unsafe { librocksdb_sys::rocksdb_iter_valid(self.raw.as_ptr()) != 0 }
    }

    fn entry(&self) -> Option<(&[u8], &[u8])> {
        if !self.valid() {
            return None;
        }
        let (mut key_length, mut value_length) = (0, 0);
        // SAFETY: the iterator is on an entry; the slices live until the iterator moves,
        // which needs `&mut self`.
        unsafe {
            let key = librocksdb_sys::rocksdb_iter_key(self.raw.as_ptr(), &mut key_length);
            let value = librocksdb_sys::rocksdb_iter_value(self.raw.as_ptr(), &mut value_length);
            Some((
                std::slice::from_raw_parts(key.cast::<u8>(), key_length),
                std::slice::from_raw_parts(value.cast::<u8>(), value_length),
            ))
        }
    }

    fn seek(&mut self, key: &[u8]) {
        // SAFETY: `raw` is a live iterator; RocksDB copies what it needs of `key`.
        unsafe {
            librocksdb_sys::rocksdb_iter_seek(self.raw.as_ptr(), key.as_ptr().cast(), key.len())
        }
    }

    fn seek_for_prev(&mut self, key: &[u8]) {
        // SAFETY: as for `seek`.
        unsafe {
            librocksdb_sys::rocksdb_iter_seek_for_prev(
                self.raw.as_ptr(),
                key.as_ptr().cast(),
                key.len(),
            )
        }
    }

    fn seek_to_first(&mut self) {
        // SAFETY: `raw` is a live iterator.
        unsafe { librocksdb_sys::rocksdb_iter_seek_to_first(self.raw.as_ptr()) }
    }

    fn seek_to_last(&mut self) {
        // SAFETY: `raw` is a live iterator.
        unsafe { librocksdb_sys::rocksdb_iter_seek_to_last(self.raw.as_ptr()) }
    }

    fn next(&mut self) {
        // SAFETY: called only while `valid()`.
        unsafe { librocksdb_sys::rocksdb_iter_next(self.raw.as_ptr()) }
    }

    fn prev(&mut self) {
        // SAFETY: called only while `valid()`.
        unsafe { librocksdb_sys::rocksdb_iter_prev(self.raw.as_ptr()) }
    }

    fn status(&self) -> Result<()> {
        let mut error: *mut c_char = std::ptr::null_mut();
        // SAFETY: `raw` is a live iterator; `error` receives a message RocksDB allocated.
        unsafe { librocksdb_sys::rocksdb_iter_get_error(self.raw.as_ptr(), &mut error) };
        take_error(error)
    }
}

/// The error RocksDB reported through `error` (null: none), freeing its message.
/// `Incomplete` (a read of memory only came to a block on disk) is
/// [`StorageError::NotInMemory`]; the C API tells statuses apart by their message only.
fn take_error(error: *mut c_char) -> Result<()> {
    if error.is_null() {
        return Ok(());
    }
    // SAFETY: RocksDB hands out a NUL-terminated message allocated with malloc, which
    // the caller owns and frees with `rocksdb_free`.
    let message = unsafe {
        let message = CStr::from_ptr(error).to_string_lossy().into_owned();
        librocksdb_sys::rocksdb_free(error.cast());
        message
    };
    if message.starts_with("Result incomplete") {
        return Err(StorageError::NotInMemory);
    }
    Err(StorageError::Io(message))
}

/// Iterators of one column family, kept for reuse (see the module documentation).
pub(crate) struct IteratorPool {
    tier: Tier,
    idle: Mutex<Vec<PooledIterator>>,
}

impl IteratorPool {
    /// An empty pool of iterators reading `tier`.
    pub(crate) fn new(tier: Tier) -> IteratorPool {
        IteratorPool {
            tier,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// A cursor over `[lower, upper)` of `family`, whose keys all share one token, on a
    /// pooled iterator when one is idle.
    pub(crate) fn cursor<'a>(
        &'a self,
        db: &DB,
        family: &impl AsColumnFamilyRef,
        lower: &[u8],
        upper: &[u8],
        reverse: bool,
    ) -> Result<PooledCursor<'a>> {
        let pooled = self.idle.lock().pop();
        let iterator = match pooled {
            Some(mut iterator) => {
                iterator.reuse_for(lower, upper)?;
                iterator
            }
            None => PooledIterator::create(db, family, self.tier, lower, upper)?,
        };
        Ok(PooledCursor {
            cursor: Some(DirectedCursor::start(iterator, reverse)),
            pool: self,
        })
    }

    /// Takes `iterator` back, unless it failed (other than by coming to a block on disk)
    /// or the pool is full.
    fn give_back(&self, mut iterator: PooledIterator) {
        match iterator.status() {
            Ok(()) | Err(StorageError::NotInMemory) => {}
            Err(_) => return,
        }
        iterator.returned_at = Instant::now();
        let mut idle = self.idle.lock();
        if idle.len() < POOL_CAPACITY {
            idle.push(iterator);
        }
    }

    /// Drops the iterators unused for `limit` by `now` (all of them when the limit is
    /// zero), returning how many are left.
    pub(crate) fn drop_idle(&self, now: Instant, limit: Duration) -> usize {
        let (expired, left) = {
            let mut idle = self.idle.lock();
            let (kept, expired): (Vec<_>, Vec<_>) = std::mem::take(&mut *idle)
                .into_iter()
                .partition(|iterator| now.saturating_duration_since(iterator.returned_at) < limit);
            *idle = kept;
            (expired, idle.len())
        };
        // Destroyed outside the lock: the last iterator on an old super version cleans it
        // up, which may delete obsolete files.
        drop(expired);
        left
    }

    /// Iterators pooled now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.idle.lock().len()
    }

    /// Drops every pooled iterator (before the database they read closes).
    pub(crate) fn clear(&self) {
        let all = std::mem::take(&mut *self.idle.lock());
        // Destroyed outside the lock, as in `drop_idle`.
        drop(all);
    }
}

/// A [`Cursor`] on a pooled iterator, which goes back to its pool when the cursor drops.
pub(crate) struct PooledCursor<'a> {
    /// `None` only while being dropped.
    cursor: Option<DirectedCursor<PooledIterator>>,
    pool: &'a IteratorPool,
}

impl Drop for PooledCursor<'_> {
    fn drop(&mut self) {
        if let Some(cursor) = self.cursor.take() {
            self.pool.give_back(cursor.into_iterator());
        }
    }
}

impl PooledCursor<'_> {
    fn cursor(&self) -> &DirectedCursor<PooledIterator> {
        self.cursor
            .as_ref()
            .expect("a cursor holds its iterator until dropped")
    }

    fn cursor_mut(&mut self) -> &mut DirectedCursor<PooledIterator> {
        self.cursor
            .as_mut()
            .expect("a cursor holds its iterator until dropped")
    }
}

impl Cursor for PooledCursor<'_> {
    fn current(&self) -> Option<(&[u8], &[u8])> {
        self.cursor().current()
    }

    fn advance(&mut self) {
        self.cursor_mut().advance();
    }

    fn skip_to(&mut self, key: &[u8]) {
        self.cursor_mut().skip_to(key);
    }

    fn status(&self) -> Result<()> {
        self.cursor().status()
    }
}
