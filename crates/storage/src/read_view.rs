//! [`ReadView`]: an [`Engine`] that only reads.
//!
//! Several readers take an engine but must read something other than the node's own data
//! as it is: the data as far as it is in memory ([`crate::InMemory`]), a table across its
//! replicas (the replication layer's replicated view), the rows an index names (the
//! coordinator's index view). Each is written once as a `ReadView` — how it opens a
//! cursor, and what it knows of tables — and is an `Engine` through the blanket impl
//! below, which refuses every write and metadata change and does no maintenance. So a
//! view says only what it reads, and a new method on `Engine` is answered for every view
//! in one place.

use crate::{Cursor, Engine, GarbageReport, Result, StorageError, WriteBatch};
use shoal_model::{TableId, WriteTimestamp};

/// A read-only source of cells, an [`Engine`] through the blanket impl (see the module
/// documentation).
pub trait ReadView: Send + Sync + 'static {
    /// What the view is, for the error a write to it gets: "a replicated view".
    fn description(&self) -> &'static str;

    /// A cursor over keys in `[lower, upper)`, as [`Engine::scan`]; also the view's
    /// [`Engine::scan_in_memory`].
    fn cursor<'a>(
        &'a self,
        lower: &[u8],
        upper: &[u8],
        reverse: bool,
    ) -> Result<Box<dyn Cursor + 'a>>;

    /// Metadata entries under `prefix`, as [`Engine::metadata_with_prefix`]: none unless
    /// the view reads them from somewhere.
    fn metadata_with_prefix(&self, _prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        Ok(Vec::new())
    }

    /// The grace period of `table_id`'s deletions, as [`Engine::gc_grace_seconds`].
    fn gc_grace_seconds(&self, _table_id: &TableId) -> Option<i32> {
        None
    }

    /// The truncation of `table_id`, as [`Engine::truncated_at`].
    fn truncated_at(&self, _table_id: &TableId) -> Option<WriteTimestamp> {
        None
    }

    /// Bytes the view's data takes, as [`Engine::approximate_size_bytes`].
    fn approximate_size_bytes(&self) -> u64 {
        0
    }
}

/// The error every write to `view` gets.
fn refused(view: &impl ReadView) -> StorageError {
    StorageError::Io(format!("{} is read-only", view.description()))
}

impl<V: ReadView> Engine for V {
    fn write(&self, _batch: &WriteBatch) -> Result<()> {
        Err(refused(self))
    }

    fn scan<'a>(
        &'a self,
        lower: &[u8],
        upper: &[u8],
        reverse: bool,
    ) -> Result<Box<dyn Cursor + 'a>> {
        self.cursor(lower, upper, reverse)
    }

    fn scan_in_memory<'a>(
        &'a self,
        lower: &[u8],
        upper: &[u8],
        reverse: bool,
    ) -> Result<Box<dyn Cursor + 'a>> {
        self.cursor(lower, upper, reverse)
    }

    fn delete_range(&self, _lower: &[u8], _upper: &[u8]) -> Result<()> {
        Err(refused(self))
    }

    fn sync(&self) -> Result<()> {
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        Ok(())
    }

    fn compact_all(&self) -> Result<()> {
        Ok(())
    }

    fn put_metadata(&self, _key: &[u8], _value: &[u8]) -> Result<()> {
        Err(refused(self))
    }

    fn delete_metadata(&self, _key: &[u8]) -> Result<()> {
        Err(refused(self))
    }

    fn metadata_with_prefix(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        ReadView::metadata_with_prefix(self, prefix)
    }

    fn set_gc_grace_seconds(&self, _table_id: TableId, _seconds: i32) {}

    fn gc_grace_seconds(&self, table_id: &TableId) -> Option<i32> {
        ReadView::gc_grace_seconds(self, table_id)
    }

    fn truncated_at(&self, table_id: &TableId) -> Option<WriteTimestamp> {
        ReadView::truncated_at(self, table_id)
    }

    fn collect_garbage(&self) -> Result<GarbageReport> {
        Ok(GarbageReport::default())
    }

    fn approximate_size_bytes(&self) -> u64 {
        ReadView::approximate_size_bytes(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SnapshotCursor;

    /// A view of two fixed entries.
    struct TwoEntries;

    impl ReadView for TwoEntries {
        fn description(&self) -> &'static str {
            "a view of two entries"
        }

        fn cursor<'a>(
            &'a self,
            lower: &[u8],
            upper: &[u8],
            reverse: bool,
        ) -> Result<Box<dyn Cursor + 'a>> {
            let mut entries: Vec<_> = [
                (b"a".to_vec(), b"1".to_vec()),
                (b"b".to_vec(), b"2".to_vec()),
            ]
            .into_iter()
            .filter(|(key, _)| key.as_slice() >= lower && key.as_slice() < upper)
            .collect();
            // A snapshot cursor walks its entries in the order given.
            if reverse {
                entries.reverse();
            }
            Ok(Box::new(SnapshotCursor::new(entries, reverse)))
        }
    }

    #[test]
    fn a_view_reads_through_the_engine_interface_and_refuses_every_change_by_name() {
        let engine: &dyn Engine = &TwoEntries;
        let mut cursor = engine.scan(b"a", b"z", true).unwrap();
        assert_eq!(cursor.current(), Some((&b"b"[..], &b"2"[..])));
        cursor.advance();
        assert_eq!(cursor.current(), Some((&b"a"[..], &b"1"[..])));
        drop(cursor);
        let in_memory = engine.scan_in_memory(b"b", b"z", false).unwrap();
        assert_eq!(in_memory.current(), Some((&b"b"[..], &b"2"[..])));

        let refusals = [
            engine.write(&WriteBatch::new()),
            engine.delete_range(b"a", b"z"),
            engine.put_metadata(b"k", b"v"),
            engine.delete_metadata(b"k"),
            engine.ingest(&[(&b"c"[..], &b"3"[..])]),
        ];
        for refusal in refusals {
            let error = refusal.expect_err("a view takes no change").to_string();
            assert!(
                error.contains("a view of two entries is read-only"),
                "{error}"
            );
        }
        assert!(engine.metadata_with_prefix(b"").unwrap().is_empty());
        assert_eq!(engine.approximate_size_bytes(), 0);
    }
}
