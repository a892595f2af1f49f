//! `shoal bench vector`: vector search for any CQL cluster (Shoal or Apache Cassandra),
//! the benchmark of issue 15's (c).
//!
//! A `vectors (id int PRIMARY KEY, v vector<float, n>)` table with a storage-attached
//! index on `v` (cosine). `--phase load` inserts `--records` vectors; `--phase query`
//! first measures recall@k — for `--recall-queries` query vectors, the rows
//! `SELECT id FROM vectors ORDER BY v ANN OF ? LIMIT k` returns against the exact `k`
//! nearest computed here by brute force — then runs the same query for random query
//! vectors for `--duration-seconds` and reports queries/s and latency percentiles.
//!
//! The vectors are embeddings-like rather than uniform noise (in which no index finds
//! neighbours, since every point is almost equally far): a mixture of 100 clusters in a
//! 16-dimensional latent space, projected to `n` dimensions with a little noise, then
//! normalized — a low intrinsic dimension, as real text and image embeddings have. The
//! same seed gives the same vectors to every system. Benchmarks are never tests: figures
//! are printed (and written as JSON), not asserted.

use crate::point::{consistency, PhaseResult};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use scylla::client::session::Session;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum VectorPhase {
    /// Insert every vector once.
    Load,
    /// Measure recall, then queries/s.
    Query,
}

#[derive(clap::Args, Debug)]
pub struct VectorArgs {
    /// Contact point, host:port.
    #[arg(long, default_value = "127.0.0.1:9042")]
    pub contact: String,
    #[command(flatten)]
    pub login: crate::login::Login,
    /// Keyspace to create and use.
    #[arg(long, default_value = "vector_bench")]
    pub keyspace: String,
    /// Vectors stored.
    #[arg(long, default_value_t = 100_000)]
    pub records: u64,
    /// Their dimension.
    #[arg(long, default_value_t = 96)]
    pub dimension: usize,
    #[arg(long, value_enum)]
    pub phase: VectorPhase,
    /// Neighbours asked for (LIMIT).
    #[arg(long, default_value_t = 10)]
    pub k: usize,
    /// Queries whose answers are checked against an exact search.
    #[arg(long, default_value_t = 200)]
    pub recall_queries: usize,
    /// Requests kept in flight.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Length of the measured query phase, in seconds.
    #[arg(long, default_value_t = 30)]
    pub duration_seconds: u64,
    /// Seconds of queries before measuring starts.
    #[arg(long, default_value_t = 5)]
    pub warmup_seconds: u64,
    /// Consistency level: one, quorum, all, ...
    #[arg(long, default_value = "one")]
    pub consistency: String,
    /// Seed of the vectors (the same for every system compared).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Write the phase's figures as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// The embeddings-like generator: clusters in a small latent space, projected up.
struct Embeddings {
    projection: Vec<Vec<f32>>,
    centers: Vec<Vec<f32>>,
}

const LATENT_DIMENSION: usize = 16;
const CLUSTERS: usize = 100;

impl Embeddings {
    fn new(dimension: usize, seed: u64) -> Embeddings {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut uniform = |count: usize| -> Vec<f32> {
            (0..count).map(|_| rng.random_range(-1.0f32..1.0)).collect()
        };
        let projection = (0..dimension).map(|_| uniform(LATENT_DIMENSION)).collect();
        let centers = (0..CLUSTERS).map(|_| uniform(LATENT_DIMENSION)).collect();
        Embeddings {
            projection,
            centers,
        }
    }

    /// The `index`-th vector of the stream named `stream` (stored vectors and queries are
    /// different streams), the same on every call.
    fn vector(&self, stream: u64, index: u64) -> Vec<f32> {
        let mut rng = StdRng::seed_from_u64(stream.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ index);
        let center = &self.centers[rng.random_range(0..CLUSTERS)];
        let latent: Vec<f32> = center
            .iter()
            .map(|x| x + rng.random_range(-0.4f32..0.4))
            .collect();
        let mut vector: Vec<f32> = self
            .projection
            .iter()
            .map(|row| {
                row.iter().zip(&latent).map(|(a, b)| a * b).sum::<f32>()
                    + rng.random_range(-0.05f32..0.05)
            })
            .collect();
        let norm = vector
            .iter()
            .map(|x| x * x)
            .sum::<f32>()
            .sqrt()
            .max(f32::MIN_POSITIVE);
        vector.iter_mut().for_each(|x| *x /= norm);
        vector
    }
}

const STORED: u64 = 1;
const QUERIES: u64 = 2;

async fn setup(session: &Session, args: &VectorArgs) -> anyhow::Result<()> {
    let keyspace = &args.keyspace;
    session
        .query_unpaged(
            format!("CREATE KEYSPACE IF NOT EXISTS {keyspace} WITH replication = {{'class': 'SimpleStrategy', 'replication_factor': 1}}"),
            &[],
        )
        .await?;
    session
        .query_unpaged(
            format!(
                "CREATE TABLE IF NOT EXISTS {keyspace}.vectors (id int PRIMARY KEY, v vector<float, {}>)",
                args.dimension
            ),
            &[],
        )
        .await?;
    session
        .query_unpaged(
            format!("CREATE INDEX IF NOT EXISTS vectors_v ON {keyspace}.vectors (v) USING 'sai' WITH OPTIONS = {{'similarity_function': 'cosine'}}"),
            &[],
        )
        .await?;
    session.await_schema_agreement().await?;
    Ok(())
}

async fn load(session: &Session, args: &VectorArgs) -> anyhow::Result<PhaseResult> {
    let mut insert = session
        .prepare(format!(
            "INSERT INTO {}.vectors (id, v) VALUES (?, ?)",
            args.keyspace
        ))
        .await?;
    insert.set_consistency(consistency(&args.consistency)?);
    let (insert, embeddings) = (&insert, &Embeddings::new(args.dimension, args.seed));
    PhaseResult::each_once(args.records, args.concurrency, |id| async move {
        let vector = embeddings.vector(STORED, id);
        session
            .execute_unpaged(insert, (id as i32, vector))
            .await
            .is_ok()
    })
    .await
}

/// The ids of the `k` stored vectors nearest to `query` (cosine), by brute force.
fn exact_neighbours(stored: &[Vec<f32>], query: &[f32], k: usize) -> Vec<i32> {
    let mut scored: Vec<(f32, i32)> = stored
        .iter()
        .enumerate()
        .map(|(id, v)| {
            (
                v.iter().zip(query).map(|(a, b)| a * b).sum::<f32>(),
                id as i32,
            )
        })
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    scored.truncate(k);
    scored.into_iter().map(|(_, id)| id).collect()
}

async fn nearest(
    session: &Session,
    select: &scylla::statement::prepared::PreparedStatement,
    query: &[f32],
) -> anyhow::Result<Vec<i32>> {
    let result = session.execute_unpaged(select, (query.to_vec(),)).await?;
    let rows = result.into_rows_result()?;
    let mut ids = Vec::new();
    for row in rows.rows::<(i32,)>()? {
        ids.push(row?.0);
    }
    Ok(ids)
}

/// Recall@k over `--recall-queries` queries (stored vectors are unit length, so cosine
/// order is dot-product order).
async fn measure_recall(
    session: &Session,
    select: &scylla::statement::prepared::PreparedStatement,
    args: &VectorArgs,
    embeddings: &Embeddings,
) -> anyhow::Result<f64> {
    let stored: Vec<Vec<f32>> = (0..args.records)
        .map(|id| embeddings.vector(STORED, id))
        .collect();
    let (mut found, mut expected) = (0usize, 0usize);
    for index in 0..args.recall_queries as u64 {
        let query = embeddings.vector(QUERIES, index);
        let truth = exact_neighbours(&stored, &query, args.k);
        let answer = nearest(session, select, &query).await?;
        found += answer.iter().filter(|id| truth.contains(id)).count();
        expected += truth.len();
    }
    Ok(found as f64 / expected.max(1) as f64)
}

async fn query(session: &Session, args: &VectorArgs) -> anyhow::Result<(f64, PhaseResult)> {
    let mut select = session
        .prepare(format!(
            "SELECT id FROM {}.vectors ORDER BY v ANN OF ? LIMIT {}",
            args.keyspace, args.k
        ))
        .await?;
    select.set_consistency(consistency(&args.consistency)?);
    let embeddings = Embeddings::new(args.dimension, args.seed);
    let recall = measure_recall(session, &select, args, &embeddings).await?;
    // A pool of query vectors (not the ones recall was measured on).
    let pool: Vec<Vec<f32>> = (0..1000u64)
        .map(|i| embeddings.vector(QUERIES, 1_000_000 + i))
        .collect();
    let (select, pool, k) = (&select, &pool, args.k);
    let result = PhaseResult::timed(
        args.concurrency,
        Duration::from_secs(args.warmup_seconds),
        Duration::from_secs(args.duration_seconds),
        || async move {
            let query = &pool[rand::rng().random_range(0..pool.len())];
            matches!(nearest(session, select, query).await, Ok(ids) if ids.len() == k)
        },
    )
    .await?;
    Ok((recall, result))
}

pub fn run(args: VectorArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.concurrency >= 1, "--concurrency must be at least 1");
    anyhow::ensure!(args.records >= 1, "--records must be at least 1");
    anyhow::ensure!(args.dimension >= 2, "--dimension must be at least 2");
    anyhow::ensure!(
        args.k >= 1 && args.k as u64 <= args.records,
        "--k must be between 1 and --records"
    );
    args.login.run_with_session(&args.contact, async |session| {
        setup(session, &args).await?;
        println!(
            "shoal bench vector: {} vectors of {} dimensions, k = {}, {} in flight, consistency {}, against {}",
            args.records, args.dimension, args.k, args.concurrency, args.consistency, args.contact
        );
        let mut extra = serde_json::Map::new();
        let (name, result) = match args.phase {
            VectorPhase::Load => ("load", load(session, &args).await?),
            VectorPhase::Query => {
                let (recall, result) = query(session, &args).await?;
                println!("recall@{}: {recall:.4}", args.k);
                extra.insert("recall".into(), serde_json::json!(recall));
                extra.insert("k".into(), serde_json::json!(args.k));
                ("query", result)
            }
        };
        result.report(name, args.json.as_deref(), extra)
    })
}
