//! Garbage collection of covering deletions: compacting in passes until merged operands
//! reach the compaction filter as values, and clearing what one expired covering deletion
//! still shadows before it may go.

use super::*;

impl RocksEngine {
    /// How [`Engine::compact_all`] works here: several passes: RocksDB hands the compaction filter only full values, and a cell
    /// written only as merge operands becomes a full value in the compaction that merges
    /// it; the next one may then drop it. Garbage collection after the first pass marks the
    /// covering deletions that pass reported; the marks merge in the second pass and the
    /// third drops them. Background compactions get there over time the same way.
    pub(super) fn compact_in_passes(&self) -> Result<()> {
        let data = self.data()?;
        self.db.compact_range_cf(data, None::<&[u8]>, None::<&[u8]>);
        self.collect_garbage()?;
        for _ in 0..2 {
            self.db.compact_range_cf(data, None::<&[u8]>, None::<&[u8]>);
        }
        Ok(())
    }

    /// Clears what one expired covering deletion still shadows and marks it; returns the
    /// cells tombstoned, or `None` when the deletion no longer needs it.
    pub(super) fn clear_shadow(
        &self,
        deletion_key: &[u8],
        now_seconds: i64,
    ) -> Result<Option<u64>> {
        let data = self.data()?;
        // The resolved value (merge operands applied): the deletion as it stands now.
        let Some(value) = self.db.get_cf(data, deletion_key).map_err(io_error)? else {
            return Ok(None);
        };
        let deletion = Cell::decode(&value).map_err(|e| StorageError::Corrupt(e.0))?;
        let (
            CellKind::Tombstone {
                deleted_at,
                shadow_cleared: false,
            },
            Some(grace),
        ) = (
            deletion.kind,
            shadow::grace_for(self, deletion_key, now_seconds),
        )
        else {
            return Ok(None);
        };
        if !grace.expired_for(&deletion) {
            return Ok(None);
        }
        let Some((lower, upper, range)) = shadow::coverage(deletion_key) else {
            return Ok(None);
        };
        // Every cell that would be live without this deletion gets a tombstone of the
        // deletion's timestamp. A write racing with this one reconciles with it by
        // last-write-wins: newer writes win, older ones were shadowed anyway.
        let mut batch = WriteBatch::new();
        let tombstone = Cell::tombstone(deletion.timestamp, deleted_at).encode();
        let mut tombstoned = 0u64;
        // A collection deletion covers the cells named by its column, and a row fragment
        // under the row's marker (before the range) may hold one under that name.
        if let Some(marker) = shadow::marker_of_collection_deletion(deletion_key) {
            if let Some(value) = self.db.get_cf(data, &marker).map_err(io_error)? {
                let parts =
                    fragment::expand(&marker, &value).map_err(|e| StorageError::Corrupt(e.0))?;
                for (part_key, encoded) in parts {
                    if part_key < lower || part_key >= upper {
                        continue;
                    }
                    let cell = Cell::decode(encoded).map_err(|e| StorageError::Corrupt(e.0))?;
                    if cell.timestamp <= deletion.timestamp && cell.is_live(now_seconds) {
                        batch.merge(part_key, tombstone.clone());
                        tombstoned += 1;
                    }
                }
            }
        }
        let mut cursor = self.scan(&lower, &upper, false)?;
        while let Some((key, value)) = cursor.current() {
            let inside = match &range {
                None => true,
                Some(range) => keys::split_at_partition_end(key)
                    .and_then(|(_, rest)| keys::split_row_key(rest))
                    .is_some_and(|(_, clustering, _)| range.covers(clustering)),
            };
            if inside && key != deletion_key {
                // A row fragment's marker and cells are cleared one by one, each under its
                // own key as a write names it; the writer packs the tombstones back.
                let parts = fragment::expand(key, value).map_err(|e| StorageError::Corrupt(e.0))?;
                for (part_key, encoded) in parts {
                    let cell = Cell::decode(encoded).map_err(|e| StorageError::Corrupt(e.0))?;
                    if cell.timestamp <= deletion.timestamp && cell.is_live(now_seconds) {
                        batch.merge(part_key, tombstone.clone());
                        tombstoned += 1;
                    }
                }
            }
            cursor.advance();
        }
        cursor.status()?;
        drop(cursor);
        let cleared = Cell {
            kind: CellKind::Tombstone {
                deleted_at,
                shadow_cleared: true,
            },
            ..deletion
        };
        batch.merge(deletion_key.to_vec(), cleared.encode());
        // No sync: losing this batch in a crash loses only progress, never a deletion.
        // Through the writer, like every write, so that collapsing a hot key never
        // races it.
        self.write(&batch)?;
        Ok(Some(tombstoned))
    }
}
