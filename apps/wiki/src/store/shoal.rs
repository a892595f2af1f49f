//! The wiki on Shoal, through the `scylla` driver with prepared statements.
//!
//! ```text
//! pages          (title text PRIMARY KEY, revision timeuuid, body text)
//! revisions      ((title), revision timeuuid DESC, body text, size int, deleted boolean)
//! recent_changes ((day date), revision timeuuid DESC, title text, deleted boolean)
//! titles         ((bucket int), title text)               -- 16 buckets
//! search_terms   ((term text), title text)
//! ```
//!
//! Every table is partitioned so that no partition is hot for the whole wiki: a page and
//! its history are one partition each; recent changes are one partition per day (a day's
//! edits, not all edits ever); the list of titles is spread over [`TITLE_BUCKETS`]
//! partitions by a hash of the title and merged when read; the search index is one
//! partition per term.
//!
//! Saving is a lightweight transaction on the page's row — `INSERT … IF NOT EXISTS` for a
//! new page, `UPDATE … IF revision = ?` or `DELETE … IF revision = ?` for an existing one
//! — so of two editors who started from the same revision exactly one wins, whichever
//! node coordinates. The winner then writes the revision, the recent change, the title
//! list and the search-index differences in one logged batch (all applied eventually, even
//! if the wiki process dies half-way; retried for a while if it fails, as it is
//! idempotent). Reads and the batch are at `QUORUM`; the transactions at `SERIAL`. A
//! transaction whose outcome is unknown (a `CAS` write timeout under contention) is
//! settled by a read at `SERIAL` ([`ShoalStore::settle`]).

use super::{Change, Edit, Page, Revision, RevisionInfo, SaveOutcome, WikiStore};
use anyhow::{bail, Context, Result};
use async_trait::async_trait;
use futures::future::try_join_all;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::errors::{DbError, ExecutionError, RequestAttemptError, WriteType};
use scylla::response::query_result::QueryResult;
use scylla::serialize::row::SerializeRow;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::{Consistency, SerialConsistency};
use scylla::value::{CqlDate, CqlTimeuuid, CqlValue, Row};
use std::collections::BTreeSet;
use std::time::{Duration, Instant, UNIX_EPOCH};
use uuid::Uuid;

/// Partitions of the title list.
pub const TITLE_BUCKETS: i32 = 16;
/// Reads at SERIAL a save with an unknown outcome tries before giving up.
const SETTLE_ATTEMPTS: usize = 3;
/// How long the writes that follow a saved page are retried.
const RECORD_RETRY_FOR: Duration = Duration::from_secs(15);
/// How many days back RecentChanges looks.
const RECENT_DAYS: i64 = 31;

/// The wiki's prepared statements.
struct Statements {
    page: PreparedStatement,
    /// The same read at `SERIAL`, which settles a transaction whose outcome is unknown.
    page_serial: PreparedStatement,
    page_exists: PreparedStatement,
    create_page: PreparedStatement,
    update_page: PreparedStatement,
    delete_page: PreparedStatement,
    history: PreparedStatement,
    revision: PreparedStatement,
    insert_revision: PreparedStatement,
    recent_changes: PreparedStatement,
    insert_change: PreparedStatement,
    titles: PreparedStatement,
    insert_title: PreparedStatement,
    delete_title: PreparedStatement,
    search: PreparedStatement,
    insert_term: PreparedStatement,
    delete_term: PreparedStatement,
}

/// The wiki's tables in one keyspace of a Shoal (or Cassandra) cluster.
pub struct ShoalStore {
    session: Session,
    statements: Statements,
}

impl ShoalStore {
    /// Connects to `contact_points` and creates the keyspace and tables if they are missing
    /// (`replication_factor` for a new keyspace).
    pub async fn connect(
        contact_points: &[String],
        keyspace: &str,
        replication_factor: u32,
    ) -> Result<ShoalStore> {
        if keyspace.is_empty()
            || !keyspace
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
        {
            bail!("a keyspace name is letters, digits and underscores, not {keyspace:?}");
        }
        let session = SessionBuilder::new()
            .known_nodes(contact_points)
            .build()
            .await
            .with_context(|| format!("cannot connect to Shoal at {}", contact_points.join(",")))?;
        create_schema(&session, keyspace, replication_factor).await?;
        let statements = Statements::prepare(&session, keyspace).await?;
        Ok(ShoalStore {
            session,
            statements,
        })
    }
}

async fn create_schema(session: &Session, keyspace: &str, replication_factor: u32) -> Result<()> {
    let statements = [
        format!(
            "CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = \
             {{'class': 'SimpleStrategy', 'replication_factor': {replication_factor}}}"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {keyspace}.pages \
             (title text PRIMARY KEY, revision timeuuid, body text)"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {keyspace}.revisions \
             (title text, revision timeuuid, body text, size int, deleted boolean, \
             PRIMARY KEY (title, revision)) WITH CLUSTERING ORDER BY (revision DESC)"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {keyspace}.recent_changes \
             (day date, revision timeuuid, title text, deleted boolean, \
             PRIMARY KEY (day, revision)) WITH CLUSTERING ORDER BY (revision DESC)"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {keyspace}.titles \
             (bucket int, title text, PRIMARY KEY (bucket, title))"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {keyspace}.search_terms \
             (term text, title text, PRIMARY KEY (term, title))"
        ),
    ];
    for statement in statements {
        session
            .query_unpaged(statement.as_str(), &[])
            .await
            .with_context(|| format!("cannot create the schema: {statement}"))?;
    }
    session.await_schema_agreement().await?;
    Ok(())
}

impl Statements {
    async fn prepare(session: &Session, keyspace: &str) -> Result<Statements> {
        let prepare = |cql: String, lightweight: bool| async move {
            let mut statement = session
                .prepare(cql.as_str())
                .await
                .with_context(|| format!("cannot prepare {cql}"))?;
            statement.set_consistency(Consistency::Quorum);
            if lightweight {
                statement.set_serial_consistency(Some(SerialConsistency::Serial));
            }
            anyhow::Ok(statement)
        };
        let k = keyspace;
        Ok(Statements {
            page: prepare(format!("SELECT revision, body FROM {k}.pages WHERE title = ?"), false).await?,
            page_serial: {
                let mut read =
                    prepare(format!("SELECT revision, body FROM {k}.pages WHERE title = ?"), false).await?;
                read.set_consistency(Consistency::Serial);
                read
            },
            page_exists: prepare(format!("SELECT title FROM {k}.pages WHERE title = ?"), false).await?,
            create_page: prepare(
                format!("INSERT INTO {k}.pages (title, revision, body) VALUES (?, ?, ?) IF NOT EXISTS"),
                true,
            )
            .await?,
            update_page: prepare(
                format!("UPDATE {k}.pages SET revision = ?, body = ? WHERE title = ? IF revision = ?"),
                true,
            )
            .await?,
            delete_page: prepare(format!("DELETE FROM {k}.pages WHERE title = ? IF revision = ?"), true).await?,
            history: prepare(format!("SELECT revision, size, deleted FROM {k}.revisions WHERE title = ?"), false)
                .await?,
            revision: prepare(
                format!("SELECT body, deleted FROM {k}.revisions WHERE title = ? AND revision = ?"),
                false,
            )
            .await?,
            insert_revision: prepare(
                format!("INSERT INTO {k}.revisions (title, revision, body, size, deleted) VALUES (?, ?, ?, ?, ?)"),
                false,
            )
            .await?,
            recent_changes: prepare(
                format!("SELECT revision, title, deleted FROM {k}.recent_changes WHERE day = ? LIMIT ?"),
                false,
            )
            .await?,
            insert_change: prepare(
                format!("INSERT INTO {k}.recent_changes (day, revision, title, deleted) VALUES (?, ?, ?, ?)"),
                false,
            )
            .await?,
            titles: prepare(format!("SELECT title FROM {k}.titles WHERE bucket = ?"), false).await?,
            insert_title: prepare(format!("INSERT INTO {k}.titles (bucket, title) VALUES (?, ?)"), false).await?,
            delete_title: prepare(format!("DELETE FROM {k}.titles WHERE bucket = ? AND title = ?"), false).await?,
            search: prepare(format!("SELECT title FROM {k}.search_terms WHERE term = ?"), false).await?,
            insert_term: prepare(format!("INSERT INTO {k}.search_terms (term, title) VALUES (?, ?)"), false).await?,
            delete_term: prepare(format!("DELETE FROM {k}.search_terms WHERE term = ? AND title = ?"), false)
                .await?,
        })
    }
}

/// The title list's partition of a title (FNV-1a: stable across processes and versions).
fn title_bucket(title: &str) -> i32 {
    let hash = title.bytes().fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    });
    (hash % TITLE_BUCKETS as u64) as i32
}

/// The day (since the Unix epoch) a revision was made.
fn revision_day(revision: Uuid) -> i64 {
    let time = super::revision_time(revision);
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |since| (since.as_secs() / 86_400) as i64)
}

/// A CQL `date` of a day since the epoch.
fn cql_date(day: i64) -> CqlValue {
    CqlValue::Date(CqlDate(((1i64 << 31) + day) as u32))
}

fn text(value: &str) -> CqlValue {
    CqlValue::Text(value.to_string())
}

fn timeuuid(value: Uuid) -> CqlValue {
    CqlValue::Timeuuid(CqlTimeuuid::from(value))
}

/// The page a read of `pages` found.
fn page_of(title: &str, result: QueryResult) -> Result<Option<Page>> {
    let row = result
        .into_rows_result()?
        .maybe_first_row::<(CqlTimeuuid, Option<String>)>()?;
    Ok(row.map(|(revision, body)| Page {
        title: title.to_string(),
        text: body.unwrap_or_default(),
        revision: revision.into(),
    }))
}

/// True when a lightweight transaction ended without knowing whether it was applied.
fn outcome_unknown(error: &ExecutionError) -> bool {
    matches!(
        error,
        ExecutionError::LastAttemptError(RequestAttemptError::DbError(
            DbError::WriteTimeout {
                write_type: WriteType::Cas,
                ..
            },
            _,
        ))
    )
}

/// True when a lightweight transaction's `[applied]` column is true.
fn applied(result: QueryResult) -> Result<bool> {
    let rows = result.into_rows_result()?;
    let row = rows.first_row::<Row>()?;
    match row.columns.first() {
        Some(Some(CqlValue::Boolean(applied))) => Ok(*applied),
        other => bail!("a conditional write answered {other:?} for [applied]"),
    }
}

#[async_trait]
impl WikiStore for ShoalStore {
    fn name(&self) -> &'static str {
        "Shoal"
    }

    async fn page(&self, title: &str) -> Result<Option<Page>> {
        let result = self
            .session
            .execute_unpaged(&self.statements.page, (title,))
            .await?;
        page_of(title, result)
    }

    async fn existing(&self, titles: &[String]) -> Result<BTreeSet<String>> {
        let found =
            try_join_all(titles.iter().map(|title| {
                self.titles_from::<Vec<String>>(&self.statements.page_exists, (title,))
            }))
            .await?;
        Ok(found.into_iter().flatten().collect())
    }

    async fn save(&self, edit: &Edit) -> Result<SaveOutcome> {
        let current = self.page(&edit.title).await?;
        if current.as_ref().map(|page| page.revision) != edit.base {
            return Ok(SaveOutcome::Conflict(current));
        }
        let deleting = edit.text.is_empty();
        let Some(base) = edit.base else {
            if deleting {
                return Ok(SaveOutcome::NothingToDelete);
            }
            let revision = super::new_revision();
            let result = self
                .session
                .execute_unpaged(
                    &self.statements.create_page,
                    (&edit.title, CqlTimeuuid::from(revision), &edit.text),
                )
                .await;
            if let Some(conflict) = self.settle(edit, result, Some(revision)).await? {
                return Ok(conflict);
            }
            self.record(edit, None, revision).await?;
            return Ok(SaveOutcome::Saved(revision));
        };
        let revision = super::new_revision();
        let result = if deleting {
            self.session
                .execute_unpaged(
                    &self.statements.delete_page,
                    (&edit.title, CqlTimeuuid::from(base)),
                )
                .await
        } else {
            self.session
                .execute_unpaged(
                    &self.statements.update_page,
                    (
                        CqlTimeuuid::from(revision),
                        &edit.text,
                        &edit.title,
                        CqlTimeuuid::from(base),
                    ),
                )
                .await
        };
        let expected = (!deleting).then_some(revision);
        if let Some(conflict) = self.settle(edit, result, expected).await? {
            return Ok(conflict);
        }
        let old_text = current.map(|page| page.text);
        self.record(edit, old_text.as_deref(), revision).await?;
        Ok(SaveOutcome::Saved(revision))
    }

    async fn history(&self, title: &str) -> Result<Vec<RevisionInfo>> {
        let result = self
            .session
            .execute_unpaged(&self.statements.history, (title,))
            .await?;
        let rows = result.into_rows_result()?;
        rows.rows::<(CqlTimeuuid, Option<i32>, Option<bool>)>()?
            .map(|row| {
                let (revision, size, deleted) = row?;
                Ok(RevisionInfo {
                    revision: revision.into(),
                    size: size.unwrap_or(0).max(0) as usize,
                    deleted: deleted.unwrap_or(false),
                })
            })
            .collect()
    }

    async fn revision(&self, title: &str, revision: Uuid) -> Result<Option<Revision>> {
        let result = self
            .session
            .execute_unpaged(
                &self.statements.revision,
                (title, CqlTimeuuid::from(revision)),
            )
            .await?;
        let row = result
            .into_rows_result()?
            .maybe_first_row::<(Option<String>, Option<bool>)>()?;
        Ok(row.map(|(body, deleted)| Revision {
            title: title.to_string(),
            revision,
            text: body.unwrap_or_default(),
            deleted: deleted.unwrap_or(false),
        }))
    }

    async fn recent_changes(&self, limit: usize) -> Result<Vec<Change>> {
        let today = revision_day(super::new_revision());
        let mut changes = Vec::new();
        for day in (today - RECENT_DAYS..=today).rev() {
            if changes.len() >= limit {
                break;
            }
            let wanted = (limit - changes.len()) as i32;
            let result = self
                .session
                .execute_unpaged(&self.statements.recent_changes, (cql_date(day), wanted))
                .await?;
            let rows = result.into_rows_result()?;
            for row in rows.rows::<(CqlTimeuuid, String, Option<bool>)>()? {
                let (revision, title, deleted) = row?;
                changes.push(Change {
                    title,
                    revision: revision.into(),
                    deleted: deleted.unwrap_or(false),
                });
            }
        }
        Ok(changes)
    }

    async fn titles(&self) -> Result<Vec<String>> {
        let buckets = try_join_all(
            (0..TITLE_BUCKETS)
                .map(|bucket| self.titles_from::<Vec<String>>(&self.statements.titles, (bucket,))),
        )
        .await?;
        let mut titles: Vec<String> = buckets.into_iter().flatten().collect();
        titles.sort();
        Ok(titles)
    }

    async fn search(&self, terms: &BTreeSet<String>) -> Result<Vec<String>> {
        let matches =
            try_join_all(terms.iter().map(|term| {
                self.titles_from::<BTreeSet<String>>(&self.statements.search, (term,))
            }))
            .await?;
        let mut matches = matches.into_iter();
        let Some(first) = matches.next() else {
            return Ok(Vec::new());
        };
        let found = matches.fold(first, |found, next| &found & &next);
        Ok(found.into_iter().collect())
    }
}

impl ShoalStore {
    /// The titles a statement selecting one text column finds.
    async fn titles_from<C: FromIterator<String>>(
        &self,
        statement: &PreparedStatement,
        values: impl SerializeRow,
    ) -> Result<C> {
        let result = self.session.execute_unpaged(statement, values).await?;
        let rows = result.into_rows_result()?;
        rows.rows::<(String,)>()?.map(|row| Ok(row?.0)).collect()
    }

    /// Settles a conditional write: `None` when it was applied, the conflict when not.
    ///
    /// Under contention a lightweight transaction can end with its outcome unknown (a
    /// `WriteTimeout` of type `CAS`: its proposal reached some replicas but not a
    /// quorum). A read at `SERIAL` settles it — it finishes or supersedes whatever
    /// proposal is in flight — and the page then either is at `expected` (the revision
    /// this edit wrote; `None` for a deletion: no page) or has moved on without it.
    async fn settle(
        &self,
        edit: &Edit,
        result: Result<QueryResult, ExecutionError>,
        expected: Option<Uuid>,
    ) -> Result<Option<SaveOutcome>> {
        match result {
            Ok(result) => {
                return Ok(match applied(result)? {
                    true => None,
                    false => Some(SaveOutcome::Conflict(self.page(&edit.title).await?)),
                })
            }
            Err(error) if outcome_unknown(&error) => {
                tracing::debug!(title = %edit.title, "a save's outcome is unknown; settling it at SERIAL");
            }
            Err(error) => return Err(error.into()),
        }
        let mut attempts = 0;
        let current = loop {
            attempts += 1;
            let read = &self.statements.page_serial;
            match self.session.execute_unpaged(read, (&edit.title,)).await {
                Ok(result) => break page_of(&edit.title, result)?,
                Err(error) if attempts < SETTLE_ATTEMPTS => {
                    tracing::info!(%error, "settling a save failed; trying again");
                }
                Err(error) => return Err(error.into()),
            }
        };
        if current.as_ref().map(|page| page.revision) == expected {
            Ok(None)
        } else {
            Ok(Some(SaveOutcome::Conflict(current)))
        }
    }

    /// Everything a saved edit changes besides the page itself, in one logged batch.
    async fn record(&self, edit: &Edit, old_text: Option<&str>, revision: Uuid) -> Result<()> {
        let deleted = edit.text.is_empty();
        let new_text = (!deleted).then_some(edit.text.as_str());
        let (added, removed) = super::term_changes(&edit.title, old_text, new_text);
        let statements = &self.statements;
        let mut batch = Batch::new(BatchType::Logged);
        batch.set_consistency(Consistency::Quorum);
        let mut values: Vec<Vec<CqlValue>> = Vec::new();
        batch.append_statement(statements.insert_revision.clone());
        values.push(vec![
            text(&edit.title),
            timeuuid(revision),
            text(&edit.text),
            CqlValue::Int(edit.text.len() as i32),
            CqlValue::Boolean(deleted),
        ]);
        batch.append_statement(statements.insert_change.clone());
        values.push(vec![
            cql_date(revision_day(revision)),
            timeuuid(revision),
            text(&edit.title),
            CqlValue::Boolean(deleted),
        ]);
        let bucket = CqlValue::Int(title_bucket(&edit.title));
        batch.append_statement(if deleted {
            statements.delete_title.clone()
        } else {
            statements.insert_title.clone()
        });
        values.push(vec![bucket, text(&edit.title)]);
        for term in &added {
            batch.append_statement(statements.insert_term.clone());
            values.push(vec![text(term), text(&edit.title)]);
        }
        for term in &removed {
            batch.append_statement(statements.delete_term.clone());
            values.push(vec![text(term), text(&edit.title)]);
        }
        // The page itself is saved: the rest must follow. The batch is idempotent, so it is
        // retried (a node that just died is still chosen for the batchlog until the
        // cluster notices, within seconds).
        let mut pause = Duration::from_millis(100);
        let give_up = Instant::now() + RECORD_RETRY_FOR;
        loop {
            match self.session.batch(&batch, &values).await {
                Ok(_) => return Ok(()),
                Err(error) if Instant::now() + pause < give_up => {
                    tracing::info!(%error, title = %edit.title, "recording a save failed; retrying");
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
                Err(error) => return Err(error.into()),
            }
        }
    }
}
