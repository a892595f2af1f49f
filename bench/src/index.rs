//! `shoal bench index`: secondary-index load for any CQL cluster (Shoal or Apache
//! Cassandra), the benchmark of issue 15's (a) and (b).
//!
//! A `users (id bigint PRIMARY KEY, email text, payload blob)` table, optionally with an
//! index on `email` (`--index default` or `--index sai`). `--phase write` inserts every
//! record once (`user<id>@example.com`, 100-byte payload) and reports writes/s: run it
//! with and without an index to see what the index costs. `--phase lookup` then asks
//! `SELECT id FROM users WHERE email = ?` for random existing e-mails (one row each) for
//! `--duration-seconds` and reports lookups/s and latency percentiles. Benchmarks are
//! never tests: the figures are printed (and written as JSON), not asserted.

use crate::point::{consistency, PhaseResult};
use rand::Rng;
use scylla::client::session::Session;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexKind {
    /// No index on `email`.
    None,
    /// `CREATE INDEX ON users (email)`.
    Default,
    /// `CREATE INDEX ON users (email) USING 'sai'` (Cassandra 5.0's storage-attached index).
    Sai,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexPhase {
    /// Insert every record once.
    Write,
    /// Look records up by their indexed e-mail.
    Lookup,
}

#[derive(clap::Args, Debug)]
pub struct IndexArgs {
    /// Contact point, host:port.
    #[arg(long, default_value = "127.0.0.1:9042")]
    pub contact: String,
    #[command(flatten)]
    pub login: crate::login::Login,
    /// Keyspace to create and use.
    #[arg(long, default_value = "index_bench")]
    pub keyspace: String,
    /// Records (users).
    #[arg(long, default_value_t = 100_000)]
    pub records: u64,
    /// The index on `email`, created with the table.
    #[arg(long, value_enum, default_value_t = IndexKind::Sai)]
    pub index: IndexKind,
    #[arg(long, value_enum)]
    pub phase: IndexPhase,
    /// Requests kept in flight.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Length of the measured lookup phase, in seconds.
    #[arg(long, default_value_t = 30)]
    pub duration_seconds: u64,
    /// Seconds of lookups before measuring starts.
    #[arg(long, default_value_t = 5)]
    pub warmup_seconds: u64,
    /// Consistency level: one, quorum, all, ...
    #[arg(long, default_value = "one")]
    pub consistency: String,
    /// Write the phase's figures as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

async fn setup(session: &Session, args: &IndexArgs) -> anyhow::Result<()> {
    let keyspace = &args.keyspace;
    session
        .query_unpaged(
            format!("CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': 1}}"),
            &[],
        )
        .await?;
    session
        .query_unpaged(
            format!("CREATE TABLE IF NOT EXISTS {keyspace}.users (id bigint PRIMARY KEY, email text, payload blob)"),
            &[],
        )
        .await?;
    let using = match args.index {
        IndexKind::None => None,
        IndexKind::Default => Some(""),
        IndexKind::Sai => Some(" USING 'sai'"),
    };
    if let Some(using) = using {
        session
            .query_unpaged(
                format!(
                    "CREATE INDEX IF NOT EXISTS users_email ON {keyspace}.users (email){using}"
                ),
                &[],
            )
            .await?;
    }
    session.await_schema_agreement().await?;
    Ok(())
}

fn email(id: u64) -> String {
    format!("user{id}@example.com")
}

async fn write_all(session: &Session, args: &IndexArgs) -> anyhow::Result<PhaseResult> {
    let mut insert = session
        .prepare(format!(
            "INSERT INTO {}.users (id, email, payload) VALUES (?, ?, ?)",
            args.keyspace
        ))
        .await?;
    insert.set_consistency(consistency(&args.consistency)?);
    let (insert, payload) = (&insert, &vec![0x5au8; 100]);
    PhaseResult::each_once(args.records, args.concurrency, |id| async move {
        session
            .execute_unpaged(insert, (id as i64, email(id), payload))
            .await
            .is_ok()
    })
    .await
}

async fn look_up(session: &Session, args: &IndexArgs) -> anyhow::Result<PhaseResult> {
    let mut select = session
        .prepare(format!(
            "SELECT id FROM {}.users WHERE email = ?",
            args.keyspace
        ))
        .await?;
    select.set_consistency(consistency(&args.consistency)?);
    let (select, records) = (&select, args.records);
    PhaseResult::timed(
        args.concurrency,
        Duration::from_secs(args.warmup_seconds),
        Duration::from_secs(args.duration_seconds),
        || async move {
            let id = rand::rng().random_range(0..records);
            let outcome = session.execute_unpaged(select, (email(id),)).await;
            // Exactly the one row asked for, or the lookup is wrong.
            let found = outcome.ok().and_then(|result| {
                let rows = result.into_rows_result().ok()?;
                let ids: Vec<i64> = rows
                    .rows::<(i64,)>()
                    .ok()?
                    .filter_map(|row| row.ok().map(|(id,)| id))
                    .collect();
                Some(ids == [id as i64])
            });
            found == Some(true)
        },
    )
    .await
}

pub fn run(args: IndexArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.concurrency >= 1, "--concurrency must be at least 1");
    anyhow::ensure!(args.records >= 1, "--records must be at least 1");
    args.login.run_with_session(&args.contact, async |session| {
        setup(session, &args).await?;
        println!(
            "shoal bench index: {} users, index {:?}, {} in flight, consistency {}, against {}",
            args.records, args.index, args.concurrency, args.consistency, args.contact
        );
        let (name, result) = match args.phase {
            IndexPhase::Write => ("write", write_all(session, &args).await?),
            IndexPhase::Lookup => ("lookup", look_up(session, &args).await?),
        };
        result.report(name, args.json.as_deref(), serde_json::Map::new())
    })
}
