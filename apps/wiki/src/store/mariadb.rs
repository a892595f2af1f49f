//! The same wiki on MariaDB (or MySQL), for the comparison of seed 000: the same tables as
//! on Shoal, the same term index, InnoDB transactions in place of lightweight
//! transactions.
//!
//! ```text
//! pages          (title PRIMARY KEY, revision BINARY(16), body)
//! revisions      (title, ticks, revision, body, size, deleted)   PRIMARY KEY (title, ticks, revision)
//! recent_changes (ticks, revision, title, deleted)               PRIMARY KEY (ticks, revision)
//! search_terms   (term, title)                                   PRIMARY KEY (term, title)
//! ```
//!
//! `ticks` is the revision's timestamp (a time-based UUID's 100 ns clock), which orders
//! history and recent changes as the timeuuid clustering order does on Shoal. The title
//! list is the `pages` table's primary key. A save runs in one transaction (read
//! committed) that locks the page's row at the edit's base revision (`SELECT … FOR
//! UPDATE`; an `INSERT` for a new page, which a duplicate key refuses) and writes
//! everything; a transaction InnoDB picks as a deadlock's victim is run again, as a MySQL
//! application must.

use super::{Change, Edit, Page, Revision, RevisionInfo, SaveOutcome, WikiStore};
use anyhow::{bail, Context, Result};
use async_trait::async_trait;
use mysql_async::prelude::Queryable;
use mysql_async::{IsolationLevel, Opts, Pool, TxOpts};
use std::collections::BTreeSet;
use std::time::Duration;
use uuid::Uuid;

/// The wiki's tables in one MariaDB database.
pub struct MariaDbStore {
    pool: Pool,
}

const SCHEMA: [&str; 4] = [
    "CREATE TABLE IF NOT EXISTS pages (title VARCHAR(255) NOT NULL PRIMARY KEY, \
     revision BINARY(16) NOT NULL, body MEDIUMTEXT NOT NULL) \
     ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS revisions (title VARCHAR(255) NOT NULL, ticks BIGINT UNSIGNED NOT NULL, \
     revision BINARY(16) NOT NULL, body MEDIUMTEXT NOT NULL, size INT NOT NULL, deleted BOOL NOT NULL, \
     PRIMARY KEY (title, ticks, revision)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS recent_changes (ticks BIGINT UNSIGNED NOT NULL, revision BINARY(16) NOT NULL, \
     title VARCHAR(255) NOT NULL, deleted BOOL NOT NULL, PRIMARY KEY (ticks, revision)) \
     ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS search_terms (term VARCHAR(255) NOT NULL, title VARCHAR(255) NOT NULL, \
     PRIMARY KEY (term, title)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
];

impl MariaDbStore {
    /// Connects to `url` (`mysql://user:password@host:port/database`) and creates the
    /// tables if they are missing.
    pub async fn connect(url: &str) -> Result<MariaDbStore> {
        let opts = Opts::from_url(url).with_context(|| format!("not a MariaDB address: {url}"))?;
        let pool = Pool::new(opts);
        let mut connection = pool
            .get_conn()
            .await
            .with_context(|| format!("cannot connect to MariaDB at {url}"))?;
        for statement in SCHEMA {
            connection
                .query_drop(statement)
                .await
                .with_context(|| format!("cannot create the schema: {statement}"))?;
        }
        Ok(MariaDbStore { pool })
    }
}

fn uuid_from(bytes: &[u8]) -> Result<Uuid> {
    match Uuid::from_slice(bytes) {
        Ok(uuid) => Ok(uuid),
        Err(_) => bail!("a stored revision id is {} bytes, not 16", bytes.len()),
    }
}

/// Transactions a save tries when InnoDB picks it as a deadlock's victim.
const SAVE_ATTEMPTS: usize = 10;
/// MariaDB's error codes: a deadlock, a lock wait timeout, a duplicate key.
const ER_LOCK_DEADLOCK: u16 = 1213;
const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;
const ER_DUP_ENTRY: u16 = 1062;

fn server_error(error: &mysql_async::Error) -> Option<u16> {
    match error {
        mysql_async::Error::Server(error) => Some(error.code),
        _ => None,
    }
}

/// True for the errors after which InnoDB asks the transaction to be run again.
fn must_retry(error: &mysql_async::Error) -> bool {
    matches!(
        server_error(error),
        Some(ER_LOCK_DEADLOCK | ER_LOCK_WAIT_TIMEOUT)
    )
}

impl MariaDbStore {
    /// One transaction of a save: the page's row changes only if it is still at the
    /// edit's base (a conditional UPDATE or DELETE, or an INSERT that a duplicate key
    /// refuses), then the history, recent changes and search terms follow. Read committed:
    /// the locks are the rows written, not the gaps between them.
    async fn try_save(&self, edit: &Edit) -> Result<SaveOutcome, mysql_async::Error> {
        let mut connection = self.pool.get_conn().await?;
        let mut options = TxOpts::default();
        options.with_isolation_level(IsolationLevel::ReadCommitted);
        let mut transaction = connection.start_transaction(options).await?;
        let deleted = edit.text.is_empty();
        let revision = super::new_revision();
        let (id, ticks) = (
            revision.as_bytes().to_vec(),
            super::revision_ticks(revision),
        );
        let old_text = match edit.base {
            None if deleted => {
                transaction.rollback().await?;
                return Ok(SaveOutcome::NothingToDelete);
            }
            None => {
                let inserted = transaction
                    .exec_drop(
                        "INSERT INTO pages (title, revision, body) VALUES (?, ?, ?)",
                        (&edit.title, &id, &edit.text),
                    )
                    .await;
                match inserted {
                    Err(error) if server_error(&error) == Some(ER_DUP_ENTRY) => {
                        transaction.rollback().await?;
                        return Ok(SaveOutcome::Conflict(self.current(&edit.title).await?));
                    }
                    other => other?,
                }
                None
            }
            Some(base) => {
                let old: Option<String> = transaction
                    .exec_first(
                        "SELECT body FROM pages WHERE title = ? AND revision = ? FOR UPDATE",
                        (&edit.title, base.as_bytes().to_vec()),
                    )
                    .await?;
                let Some(old) = old else {
                    transaction.rollback().await?;
                    return Ok(SaveOutcome::Conflict(self.current(&edit.title).await?));
                };
                if deleted {
                    transaction
                        .exec_drop("DELETE FROM pages WHERE title = ?", (&edit.title,))
                        .await?;
                } else {
                    transaction
                        .exec_drop(
                            "UPDATE pages SET revision = ?, body = ? WHERE title = ?",
                            (&id, &edit.text, &edit.title),
                        )
                        .await?;
                }
                Some(old)
            }
        };
        transaction
            .exec_drop(
                "INSERT INTO revisions (title, ticks, revision, body, size, deleted) VALUES (?, ?, ?, ?, ?, ?)",
                (&edit.title, ticks, &id, &edit.text, edit.text.len() as i64, deleted),
            )
            .await?;
        transaction
            .exec_drop(
                "INSERT INTO recent_changes (ticks, revision, title, deleted) VALUES (?, ?, ?, ?)",
                (ticks, &id, &edit.title, deleted),
            )
            .await?;
        let (added, removed) = super::term_changes(
            &edit.title,
            old_text.as_deref(),
            (!deleted).then_some(edit.text.as_str()),
        );
        if !added.is_empty() {
            transaction
                .exec_batch(
                    "INSERT IGNORE INTO search_terms (term, title) VALUES (?, ?)",
                    added.iter().map(|term| (term, &edit.title)),
                )
                .await?;
        }
        if !removed.is_empty() {
            transaction
                .exec_batch(
                    "DELETE FROM search_terms WHERE term = ? AND title = ?",
                    removed.iter().map(|term| (term, &edit.title)),
                )
                .await?;
        }
        transaction.commit().await?;
        Ok(SaveOutcome::Saved(revision))
    }

    /// The page as it is now, for a conflict.
    async fn current(&self, title: &str) -> Result<Option<Page>, mysql_async::Error> {
        self.page(title)
            .await
            .map_err(|error| mysql_async::Error::Other(error.into()))
    }
}

#[async_trait]
impl WikiStore for MariaDbStore {
    fn name(&self) -> &'static str {
        "MariaDB"
    }

    async fn page(&self, title: &str) -> Result<Option<Page>> {
        let mut connection = self.pool.get_conn().await?;
        let row: Option<(Vec<u8>, String)> = connection
            .exec_first("SELECT revision, body FROM pages WHERE title = ?", (title,))
            .await?;
        row.map(|(revision, text)| {
            Ok(Page {
                title: title.to_string(),
                text,
                revision: uuid_from(&revision)?,
            })
        })
        .transpose()
    }

    async fn existing(&self, titles: &[String]) -> Result<BTreeSet<String>> {
        if titles.is_empty() {
            return Ok(BTreeSet::new());
        }
        let mut connection = self.pool.get_conn().await?;
        let placeholders = vec!["?"; titles.len()].join(",");
        let found: Vec<String> = connection
            .exec(
                format!("SELECT title FROM pages WHERE title IN ({placeholders})"),
                titles.to_vec(),
            )
            .await?;
        Ok(found.into_iter().collect())
    }

    async fn save(&self, edit: &Edit) -> Result<SaveOutcome> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self.try_save(edit).await {
                Err(error) if attempts < SAVE_ATTEMPTS && must_retry(&error) => {
                    tracing::debug!(%error, title = %edit.title, "a save's transaction is retried");
                    tokio::time::sleep(Duration::from_millis(rand::random_range(1..10))).await;
                }
                Err(error) => return Err(error.into()),
                Ok(outcome) => return Ok(outcome),
            }
        }
    }

    async fn history(&self, title: &str) -> Result<Vec<RevisionInfo>> {
        let mut connection = self.pool.get_conn().await?;
        let rows: Vec<(Vec<u8>, i64, bool)> = connection
            .exec(
                "SELECT revision, size, deleted FROM revisions WHERE title = ? ORDER BY ticks DESC, revision DESC",
                (title,),
            )
            .await?;
        rows.into_iter()
            .map(|(revision, size, deleted)| {
                Ok(RevisionInfo {
                    revision: uuid_from(&revision)?,
                    size: size.max(0) as usize,
                    deleted,
                })
            })
            .collect()
    }

    async fn revision(&self, title: &str, revision: Uuid) -> Result<Option<Revision>> {
        let mut connection = self.pool.get_conn().await?;
        let row: Option<(String, bool)> = connection
            .exec_first(
                "SELECT body, deleted FROM revisions WHERE title = ? AND ticks = ? AND revision = ?",
                (title, super::revision_ticks(revision), revision.as_bytes().to_vec()),
            )
            .await?;
        Ok(row.map(|(text, deleted)| Revision {
            title: title.to_string(),
            revision,
            text,
            deleted,
        }))
    }

    async fn recent_changes(&self, limit: usize) -> Result<Vec<Change>> {
        let mut connection = self.pool.get_conn().await?;
        let rows: Vec<(Vec<u8>, String, bool)> = connection
            .exec(
                "SELECT revision, title, deleted FROM recent_changes ORDER BY ticks DESC, revision DESC LIMIT ?",
                (limit as u64,),
            )
            .await?;
        rows.into_iter()
            .map(|(revision, title, deleted)| {
                Ok(Change {
                    title,
                    revision: uuid_from(&revision)?,
                    deleted,
                })
            })
            .collect()
    }

    async fn titles(&self) -> Result<Vec<String>> {
        let mut connection = self.pool.get_conn().await?;
        Ok(connection
            .query("SELECT title FROM pages ORDER BY title")
            .await?)
    }

    async fn search(&self, terms: &BTreeSet<String>) -> Result<Vec<String>> {
        if terms.is_empty() {
            return Ok(Vec::new());
        }
        let mut connection = self.pool.get_conn().await?;
        let placeholders = vec!["?"; terms.len()].join(",");
        let found: Vec<String> = connection
            .exec(
                format!(
                    "SELECT title FROM search_terms WHERE term IN ({placeholders}) \
                     GROUP BY title HAVING COUNT(*) = ? ORDER BY title"
                ),
                terms
                    .iter()
                    .map(|term| mysql_async::Value::from(term.as_str()))
                    .chain([mysql_async::Value::from(terms.len() as u64)])
                    .collect::<Vec<_>>(),
            )
            .await?;
        Ok(found)
    }
}
