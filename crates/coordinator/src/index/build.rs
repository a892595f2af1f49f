//! Building an index over the rows a table already holds: in the background, a batch of
//! entries at a time, remembering how far each build got (so a restart resumes it) and
//! reporting its progress; and re-indexing a token range that arrived by streaming.

use super::*;

impl IndexCatalog {
    /// Starts a background build, on a blocking thread, of every index of the schema
    /// that this node has not built yet; forgets indexes that were dropped (removing
    /// their entries).
    pub fn build_pending(self: &Arc<Self>) {
        let indexed = self.current();
        let schema = self.schema.current();
        let dropped: Vec<TableId> = self
            .built
            .read()
            .iter()
            .filter(|id| !indexed.names.contains_key(id))
            .copied()
            .collect();
        for id in dropped {
            let _ = self
                .engine
                .delete_range(&keys::table_prefix(&id), &keys::table_end(&id));
            let _ = self.engine.delete_metadata(&built_key(&id));
            self.built.write().remove(&id);
        }
        for table in schema.user_keyspaces().flat_map(|k| k.tables.values()) {
            for index in &table.indexes {
                if self.built.read().contains(&index.id) {
                    continue;
                }
                {
                    let mut progress = self.progress.lock();
                    if progress.contains_key(&index.id) {
                        continue;
                    }
                    progress.insert(
                        index.id,
                        BuildProgress {
                            index: index.name.clone(),
                            table: format!("{}.{}", table.keyspace, table.name),
                            ..BuildProgress::default()
                        },
                    );
                }
                let catalog = Arc::clone(self);
                let (index_id, table_id) = (index.id, table.id);
                tokio::task::spawn_blocking(move || match catalog.build(index_id, table_id) {
                    Ok(()) => {}
                    Err(error) => {
                        tracing::warn!(%error, "building a secondary index failed; retrying");
                        catalog.progress.lock().remove(&index_id);
                    }
                });
            }
        }
    }

    /// Writes the entries of `index` for every cell of `table` stored here, after deleting
    /// whatever entries it had (a build interrupted by a restart, or entries in an older
    /// layout). Entries that concurrent writes add meanwhile stay correct: a write's entry
    /// deleted here is written again by the scan, which starts after the deletion and
    /// sees that write's cells.
    pub(super) fn build(&self, index: TableId, table: TableId) -> Result<(), String> {
        self.engine
            .delete_range(&keys::table_prefix(&index), &keys::table_end(&index))
            .map_err(|e| e.to_string())?;
        let lower = keys::table_prefix(&table);
        let upper = keys::table_end(&table);
        self.index_range_with(&lower, &upper, Some(index))?;
        // A vector index lives in memory: built again each time the node starts.
        if !self.current().vectors.contains_key(&index) {
            self.engine.sync().map_err(|e| e.to_string())?;
            self.engine
                .put_metadata(&built_key(&index), b"")
                .map_err(|e| e.to_string())?;
        }
        self.built.write().insert(index);
        if let Some(progress) = self.progress.lock().get_mut(&index) {
            progress.done = true;
        }
        tracing::info!(index = ?index, "secondary index built");
        Ok(())
    }

    /// Writes the index entries of every cell stored in `[lower, upper)` (a tablet just
    /// streamed to this node), for every index of its table.
    pub fn index_range(&self, lower: &[u8], upper: &[u8]) -> Result<(), String> {
        self.index_range_with(lower, upper, None)
    }

    pub(super) fn index_range_with(
        &self,
        lower: &[u8],
        upper: &[u8],
        only: Option<TableId>,
    ) -> Result<(), String> {
        let indexed = self.current();
        let mut restricted = Indexed::default();
        let indexed: &Indexed = match only {
            None => &indexed,
            Some(id) => {
                if let Some(vector) = indexed.vectors.get(&id) {
                    restricted.vectors.insert(id, Arc::clone(vector));
                }
                for (table, specs) in &indexed.by_table {
                    let kept: Vec<IndexSpec> =
                        specs.iter().filter(|s| s.id == id).cloned().collect();
                    if !kept.is_empty() {
                        restricted.by_table.insert(*table, kept);
                    }
                }
                &restricted
            }
        };
        if indexed.by_table.is_empty() && indexed.vectors.is_empty() {
            return Ok(());
        }
        let mut cursor = self
            .engine
            .stream_range(lower, upper)
            .map_err(|e| e.to_string())?;
        let mut cells: Cells = Vec::new();
        let mut scanned = 0u64;
        while let Some((key, value)) = cursor.current() {
            // Entries as stored: a row fragment's cells are indexed one by one
            // (decision 0018).
            let stored = shoal_model::fragment::expand(key, value).map_err(|e| e.to_string())?;
            cells.extend(stored.into_iter().map(|(key, cell)| (key, cell.to_vec())));
            cursor.advance();
            scanned += 1;
            if cells.len() >= BUILD_BATCH_ENTRIES {
                self.write_entries(indexed, &std::mem::take(&mut cells))?;
                if let Some(id) = only {
                    if let Some(progress) = self.progress.lock().get_mut(&id) {
                        progress.keys_scanned = scanned;
                    }
                }
            }
        }
        cursor.status().map_err(|e| e.to_string())?;
        self.write_entries(indexed, &cells)?;
        if let Some(id) = only {
            if let Some(progress) = self.progress.lock().get_mut(&id) {
                progress.keys_scanned = scanned;
            }
        }
        Ok(())
    }

    /// Every build this node ran or is running since it started.
    pub fn progress(&self) -> Vec<BuildProgress> {
        let mut all: Vec<BuildProgress> = self.progress.lock().values().cloned().collect();
        all.sort_by(|a, b| (&a.table, &a.index).cmp(&(&b.table, &b.index)));
        all
    }
}
