//! [`CandidateView`]: a read-only engine over the partitions an index names.
//!
//! An index query runs as a filtered scan of its table. The view makes that scan visit
//! only the index's candidate partitions: its cursor fetches candidates in token order, a
//! chunk at a time (from the scan's lower bound on, so a resumed page fetches only what
//! follows), and walks each candidate's keys in the underlying engine — this node's, or a
//! view across the replicas — so everything the scan does to a partition (reconciling
//! replicas, applying deletions, filtering rows, paging) happens as usual.

use shoal_cql::CqlError;
use shoal_model::{keys, TableId, Token};
use shoal_replication::{PartitionRef, ScanSource};
use shoal_storage::{Cursor, Engine, ReadView};
use std::collections::VecDeque;
use std::sync::Arc;

/// Candidates fetched per round trip to the replicas.
const CANDIDATES_PER_FETCH: u32 = 512;

/// Fetches candidate partitions: from a token on, at most a number of them, in token
/// order (fewer than asked: there are no more).
pub type FetchCandidates =
    Box<dyn Fn(Token, u32) -> Result<Vec<PartitionRef>, CqlError> + Send + Sync>;

/// An engine whose scans see only the candidate partitions of one index lookup.
pub struct CandidateView {
    /// Where the candidates' rows are read.
    rows: Rows,
    table: TableId,
    fetch: FetchCandidates,
    /// The first error a fetch met, for the client (the reader only sees a storage error).
    error: parking_lot::Mutex<Option<CqlError>>,
}

/// Where an index query reads its candidates' rows.
pub enum Rows {
    /// A view across the table's replicas (a scan on the scan stage).
    Replicated(Box<shoal_replication::range::ReplicatedView>),
    /// An engine: this node's, or the candidates' partitions as reconciled from their
    /// replicas.
    Engine(Arc<dyn Engine>),
}

impl Rows {
    /// Where a scan of `source` reads, `local` being this node's engine.
    pub fn of(source: ScanSource, local: &Arc<dyn Engine>) -> Rows {
        match source {
            ScanSource::Replicated(view) => Rows::Replicated(view),
            ScanSource::Local => Rows::Engine(Arc::clone(local)),
        }
    }
}

impl CandidateView {
    pub fn new(rows: Rows, table: TableId, fetch: FetchCandidates) -> Self {
        CandidateView {
            rows,
            table,
            fetch,
            error: parking_lot::Mutex::new(None),
        }
    }

    /// A view of candidates already fetched (all of them, in token order).
    pub fn of_candidates(rows: Rows, table: TableId, candidates: Vec<PartitionRef>) -> Self {
        let fetch: FetchCandidates = Box::new(move |from, limit| {
            Ok(candidates
                .iter()
                .filter(|(token, _)| *token >= from)
                .take(limit as usize)
                .cloned()
                .collect())
        });
        CandidateView::new(rows, table, fetch)
    }

    fn inner(&self) -> &dyn Engine {
        match &self.rows {
            Rows::Replicated(view) => view.as_ref(),
            Rows::Engine(engine) => engine.as_ref(),
        }
    }

    /// The error that stopped the scan, if one did.
    pub fn take_error(&self) -> Option<CqlError> {
        self.error.lock().take().or_else(|| match &self.rows {
            Rows::Replicated(view) => view.take_error(),
            Rows::Engine(_) => None,
        })
    }
}

/// The token a scan bound starts at (`table id` alone: the first token).
fn token_of(key: &[u8]) -> Token {
    keys::token_of_key(key).unwrap_or(Token::MIN)
}

struct CandidateCursor<'v> {
    view: &'v CandidateView,
    lower: Vec<u8>,
    upper: Vec<u8>,
    /// Candidates fetched and not yet walked.
    queue: VecDeque<PartitionRef>,
    /// Where the next fetch starts; `None` once the candidates are exhausted.
    next_fetch: Option<Token>,
    /// The partition being walked.
    current: Option<Box<dyn Cursor + 'v>>,
    error: Option<String>,
}

impl CandidateCursor<'_> {
    /// Opens the next candidate partition with keys in range, fetching more candidates
    /// as needed.
    fn open_next(&mut self) {
        self.current = None;
        loop {
            if self.queue.is_empty() {
                let Some(from) = self.next_fetch else {
                    return;
                };
                match (self.view.fetch)(from, CANDIDATES_PER_FETCH) {
                    Ok(found) => {
                        self.next_fetch = match found.last() {
                            Some((last, _)) if found.len() == CANDIDATES_PER_FETCH as usize => {
                                // The next fetch repeats the last token (other partitions
                                // may share it); those already walked are skipped below.
                                Some(*last)
                            }
                            _ => None,
                        };
                        self.queue.extend(found);
                        if self.queue.is_empty() {
                            return;
                        }
                    }
                    Err(error) => {
                        self.error = Some(error.message.clone());
                        self.view.error.lock().get_or_insert(error);
                        return;
                    }
                }
            }
            let Some((token, partition_key)) = self.queue.pop_front() else {
                return;
            };
            let prefix = keys::partition_prefix(&self.view.table, token, &partition_key);
            let end = keys::increment_prefix(&prefix).unwrap_or_else(|| self.upper.clone());
            // Partitions wholly before the cursor's position (or already walked) are
            // skipped; the first one may start part-way.
            if end <= self.lower {
                continue;
            }
            if prefix >= self.upper {
                self.next_fetch = None;
                self.queue.clear();
                return;
            }
            let lower = std::cmp::max(prefix, self.lower.clone());
            let upper = std::cmp::min(end, self.upper.clone());
            match self.view.inner().scan(&lower, &upper, false) {
                Ok(cursor) => {
                    if cursor.current().is_some() {
                        self.current = Some(cursor);
                        return;
                    }
                    if let Err(error) = cursor.status() {
                        self.error = Some(error.to_string());
                        return;
                    }
                }
                Err(error) => {
                    self.error = Some(error.to_string());
                    return;
                }
            }
        }
    }
}

impl Cursor for CandidateCursor<'_> {
    fn current(&self) -> Option<(&[u8], &[u8])> {
        self.current.as_ref()?.current()
    }

    fn advance(&mut self) {
        let Some(cursor) = self.current.as_mut() else {
            return;
        };
        cursor.advance();
        if cursor.current().is_none() {
            if let Err(error) = cursor.status() {
                self.error = Some(error.to_string());
                self.current = None;
                return;
            }
            // Everything up to this partition's end is behind the cursor now.
            if let Some((key, _)) = self.current.as_ref().and_then(|c| c.current()) {
                self.lower = key.to_vec();
            }
            self.open_next();
        } else if let Some((key, _)) = cursor.current() {
            self.lower = key.to_vec();
        }
    }

    fn skip_to(&mut self, key: &[u8]) {
        if key <= self.lower.as_slice() {
            return;
        }
        self.lower = key.to_vec();
        if let Some(cursor) = self.current.as_mut() {
            cursor.skip_to(key);
            if cursor.current().is_some() {
                return;
            }
        }
        self.open_next();
    }

    fn status(&self) -> shoal_storage::Result<()> {
        match &self.error {
            Some(error) => Err(shoal_storage::StorageError::Corrupt(format!(
                "index query: {error}"
            ))),
            None => Ok(()),
        }
    }
}

impl ReadView for CandidateView {
    fn description(&self) -> &'static str {
        "an index query view"
    }

    fn cursor<'s>(
        &'s self,
        lower: &[u8],
        upper: &[u8],
        reverse: bool,
    ) -> shoal_storage::Result<Box<dyn Cursor + 's>> {
        if reverse {
            return Err(shoal_storage::StorageError::Corrupt(
                "an index query reads forwards".into(),
            ));
        }
        let mut cursor = CandidateCursor {
            view: self,
            lower: lower.to_vec(),
            upper: upper.to_vec(),
            queue: VecDeque::new(),
            next_fetch: Some(token_of(lower)),
            current: None,
            error: None,
        };
        cursor.open_next();
        Ok(Box::new(cursor))
    }

    fn gc_grace_seconds(&self, table_id: &TableId) -> Option<i32> {
        self.inner().gc_grace_seconds(table_id)
    }

    fn truncated_at(&self, table_id: &TableId) -> Option<shoal_model::WriteTimestamp> {
        self.inner().truncated_at(table_id)
    }
}
