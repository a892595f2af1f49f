//! [`InMemory`]: an engine's data as far as it is in memory, for reads that must not wait
//! for a disk.
//!
//! A point read served on a runtime worker (the point-first read orders of the
//! coordinator's scheduler) runs there because it is short; but one block not in the
//! block cache turns it into a disk read, and the worker — with every other request on
//! it — waits for that disk. So such a read goes through an `InMemory` view first
//! ([`InMemory::read`]): every cursor it opens is the engine's
//! [`Engine::scan_in_memory`], which stops at the first entry that needs a file read. The
//! read then fails, the view remembers that it needed the disk, `InMemory::read` answers
//! `None`, and the caller reads again — on a thread that may wait for it. Nearly every point read of a warm node is answered from memory at
//! the cost of a read; only those that need the disk are read twice.
//!
//! The view is read-only ([`ReadView`]): writes and metadata changes are refused.

use crate::{Cursor, Engine, ReadView, Result, StorageError};
use shoal_model::{TableId, WriteTimestamp};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A read-only view of an engine's data in memory (see the module documentation).
pub struct InMemory {
    engine: Arc<dyn Engine>,
    needed_disk: AtomicBool,
}

impl InMemory {
    /// What `read` answers through a view of `engine`'s data in memory, or `None` when it
    /// came to data on disk: then it must be read again from the engine itself.
    pub fn read<R>(engine: &Arc<dyn Engine>, read: impl FnOnce(&dyn Engine) -> R) -> Option<R> {
        let memory = InMemory::new(Arc::clone(engine));
        let answer = read(&memory);
        (!memory.needed_disk()).then_some(answer)
    }

    pub(crate) fn new(engine: Arc<dyn Engine>) -> InMemory {
        InMemory {
            engine,
            needed_disk: AtomicBool::new(false),
        }
    }

    /// True once a cursor of this view came to data on disk: whatever was read through
    /// the view must be read again from the engine itself.
    pub(crate) fn needed_disk(&self) -> bool {
        self.needed_disk.load(Ordering::Relaxed)
    }
}

/// A cursor of [`InMemory`], which tells its view when it stops at data on disk.
struct WatchedCursor<'c> {
    cursor: Box<dyn Cursor + 'c>,
    needed_disk: &'c AtomicBool,
}

impl Cursor for WatchedCursor<'_> {
    fn current(&self) -> Option<(&[u8], &[u8])> {
        self.cursor.current()
    }

    fn advance(&mut self) {
        self.cursor.advance();
    }

    fn skip_to(&mut self, key: &[u8]) {
        self.cursor.skip_to(key);
    }

    fn status(&self) -> Result<()> {
        let status = self.cursor.status();
        if matches!(status, Err(StorageError::NotInMemory)) {
            self.needed_disk.store(true, Ordering::Relaxed);
        }
        status
    }
}

impl ReadView for InMemory {
    fn description(&self) -> &'static str {
        "a view of the data in memory"
    }

    fn cursor<'a>(
        &'a self,
        lower: &[u8],
        upper: &[u8],
        reverse: bool,
    ) -> Result<Box<dyn Cursor + 'a>> {
        let cursor = self.engine.scan_in_memory(lower, upper, reverse)?;
        Ok(Box::new(WatchedCursor {
            cursor,
            needed_disk: &self.needed_disk,
        }))
    }

    fn metadata_with_prefix(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.engine.metadata_with_prefix(prefix)
    }

    fn gc_grace_seconds(&self, table_id: &TableId) -> Option<i32> {
        self.engine.gc_grace_seconds(table_id)
    }

    fn truncated_at(&self, table_id: &TableId) -> Option<WriteTimestamp> {
        self.engine.truncated_at(table_id)
    }

    fn approximate_size_bytes(&self) -> u64 {
        self.engine.approximate_size_bytes()
    }
}
