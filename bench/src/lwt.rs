//! `shoal bench lwt`: lightweight transactions for any CQL cluster (Shoal or Apache
//! Cassandra), the side-by-side comparison of issue 12.
//!
//! An `accounts (id bigint PRIMARY KEY, balance bigint, payload blob)` table.
//! `--phase insert` creates every record once with `INSERT … IF NOT EXISTS` (each one
//! applied: a new key). `--phase update` then runs `UPDATE accounts SET payload = ? WHERE
//! id = ? IF EXISTS` on uniformly random records for `--duration-seconds` (conditions hold,
//! contention is rare, as in seed 001's uniform workload). Both at serial consistency
//! SERIAL, committed at `--consistency`. An answer counts when it is applied. Benchmarks
//! are never tests: the figures are printed (and written as JSON), not asserted.

use crate::point::{consistency, PhaseResult};
use rand::Rng;
use scylla::client::session::Session;
use scylla::statement::SerialConsistency;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LwtPhase {
    /// `INSERT … IF NOT EXISTS` of every record once.
    Insert,
    /// `UPDATE … IF EXISTS` of random records.
    Update,
}

#[derive(clap::Args, Debug)]
pub struct LwtArgs {
    /// Contact point, host:port.
    #[arg(long, default_value = "127.0.0.1:9042")]
    pub contact: String,
    #[command(flatten)]
    pub login: crate::login::Login,
    /// Keyspace to create and use.
    #[arg(long, default_value = "lwt_bench")]
    pub keyspace: String,
    /// Replication factor of the keyspace.
    #[arg(long, default_value_t = 1)]
    pub replication_factor: u32,
    /// Records (accounts).
    #[arg(long, default_value_t = 20_000)]
    pub records: u64,
    #[arg(long, value_enum)]
    pub phase: LwtPhase,
    /// Requests kept in flight.
    #[arg(long, default_value_t = 32)]
    pub concurrency: usize,
    /// Length of the measured update phase, in seconds.
    #[arg(long, default_value_t = 30)]
    pub duration_seconds: u64,
    /// Seconds of updates before measuring starts.
    #[arg(long, default_value_t = 5)]
    pub warmup_seconds: u64,
    /// Consistency level the decided update is committed at: one, quorum, all, ...
    #[arg(long, default_value = "quorum")]
    pub consistency: String,
    /// Write the phase's figures as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Send each request to any node in turn instead of the partition's first replica,
    /// as drivers that do not know ScyllaDB's LWT mark spread a partition's
    /// transactions over several coordinators.
    #[arg(long)]
    pub spread: bool,
    /// Create the keyspace strongly consistent (`AND consistency = 'strong'`): the
    /// transactions are decided by each tablet's Raft leader instead of Paxos.
    #[arg(long)]
    pub strong: bool,
}

async fn setup(session: &Session, args: &LwtArgs) -> anyhow::Result<()> {
    let keyspace = &args.keyspace;
    let consistency = if args.strong {
        " AND consistency = 'strong'"
    } else {
        ""
    };
    session
        .query_unpaged(
            format!("CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': {}}}{consistency}", args.replication_factor),
            &[],
        )
        .await?;
    session
        .query_unpaged(
            format!("CREATE TABLE IF NOT EXISTS {keyspace}.accounts (id bigint PRIMARY KEY, balance bigint, payload blob)"),
            &[],
        )
        .await?;
    session.await_schema_agreement().await?;
    Ok(())
}

/// True when the answer's `[applied]` column is true.
fn applied(
    result: Result<scylla::response::query_result::QueryResult, impl std::fmt::Debug>,
) -> bool {
    let Ok(result) = result else {
        return false;
    };
    let Ok(rows) = result.into_rows_result() else {
        return false;
    };
    let first = rows.first_row::<(bool,)>();
    matches!(first, Ok((true,)))
}

async fn insert_all(session: &Session, args: &LwtArgs) -> anyhow::Result<PhaseResult> {
    let mut insert = session
        .prepare(format!(
            "INSERT INTO {}.accounts (id, balance, payload) VALUES (?, 0, ?) IF NOT EXISTS",
            args.keyspace
        ))
        .await?;
    insert.set_consistency(consistency(&args.consistency)?);
    insert.set_serial_consistency(Some(SerialConsistency::Serial));
    let (insert, payload) = (&insert, &vec![0x5au8; 100]);
    PhaseResult::each_once(args.records, args.concurrency, |id| async move {
        applied(session.execute_unpaged(insert, (id as i64, payload)).await)
    })
    .await
}

async fn update_random(session: &Session, args: &LwtArgs) -> anyhow::Result<PhaseResult> {
    let mut update = session
        .prepare(format!(
            "UPDATE {}.accounts SET payload = ? WHERE id = ? IF EXISTS",
            args.keyspace
        ))
        .await?;
    update.set_consistency(consistency(&args.consistency)?);
    update.set_serial_consistency(Some(SerialConsistency::Serial));
    let (update, records, payload) = (&update, args.records, &vec![0xa5u8; 100]);
    PhaseResult::timed(
        args.concurrency,
        Duration::from_secs(args.warmup_seconds),
        Duration::from_secs(args.duration_seconds),
        || async move {
            let id = rand::rng().random_range(0..records) as i64;
            applied(session.execute_unpaged(update, (payload, id)).await)
        },
    )
    .await
}

pub fn run(args: LwtArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.concurrency >= 1, "--concurrency must be at least 1");
    anyhow::ensure!(args.records >= 1, "--records must be at least 1");
    let spread = args.spread;
    let configure = move |builder: scylla::client::session_builder::SessionBuilder| {
        if !spread {
            return builder;
        }
        let policy = scylla::policies::load_balancing::DefaultPolicy::builder()
            .token_aware(false)
            .build();
        let profile = scylla::client::execution_profile::ExecutionProfile::builder()
            .load_balancing_policy(policy)
            .build();
        builder.default_execution_profile_handle(profile.into_handle())
    };
    args.login.run_with_configured_session(&args.contact, configure, async |session| {
        setup(session, &args).await?;
        println!(
            "shoal bench lwt: {} accounts, RF {}, {} in flight, commit consistency {}, against {}{}",
            args.records,
            args.replication_factor,
            args.concurrency,
            args.consistency,
            args.contact,
            if args.spread { ", requests spread over every node" } else { "" }
        );
        let (name, result) = match args.phase {
            LwtPhase::Insert => ("insert", insert_all(session, &args).await?),
            LwtPhase::Update => ("update", update_random(session, &args).await?),
        };
        result.report(name, args.json.as_deref(), serde_json::Map::new())
    })
}
