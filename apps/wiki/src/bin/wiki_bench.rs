//! Load on a running wiki, as seed 000 measured YukiWiki on Cassandra and MySQL: parallel
//! clients, each issuing a fixed number of requests over many pages (or over one hot page),
//! in a read-heavy or a write-heavy mix. For each number of clients: throughput and the
//! latency percentiles of reads and writes.
//!
//! ```text
//! wiki-bench --url http://127.0.0.1:8080 --prepare --pages 500
//! wiki-bench --url http://127.0.0.1:8080 --pages 500 --mix read --clients 1,2,4,8,16,32,64,90 --json out.json
//! ```
//!
//! A read is `GET /page/{title}` (the page and the existence of every page it links to).
//! A write is what an editor does: `GET /edit/{title}` (the current revision), then the
//! form posted with new text; a save answered with a conflict (another client saved the
//! page in between) counts as a write done and is reported separately.

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The form token every benchmark client uses (the wiki accepts any token whose cookie
/// and form copies match).
const TOKEN: &str = "0123456789abcdef0123456789abcdef";

#[derive(Clone, Copy, ValueEnum, Debug, Serialize)]
#[serde(rename_all = "lowercase")]
enum Mix {
    /// 95% reads, 5% writes.
    Read,
    /// 20% reads, 80% writes.
    Write,
}

impl Mix {
    fn read_share(self) -> f64 {
        match self {
            Mix::Read => 0.95,
            Mix::Write => 0.20,
        }
    }
}

#[derive(Parser)]
#[command(name = "wiki-bench", about = "Parallel clients against a running wiki")]
struct Args {
    /// The wiki's address.
    #[arg(long)]
    url: String,
    /// Pages the requests spread over.
    #[arg(long, default_value_t = 500)]
    pages: usize,
    /// Create the pages first (and nothing else).
    #[arg(long)]
    prepare: bool,
    /// Every request goes to one page (the first).
    #[arg(long)]
    hot: bool,
    #[arg(long, value_enum, default_value = "read")]
    mix: Mix,
    /// Numbers of parallel clients, one run each.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64,90")]
    clients: Vec<usize>,
    /// Requests each client issues per run.
    #[arg(long, default_value_t = 200)]
    requests_per_client: usize,
    /// Where to write the results as JSON.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

fn title(page: usize) -> String {
    format!("BenchPage{page:05}")
}

/// About 1 KB of wiki text for version `version` of `page`, linking to two other pages.
fn page_text(page: usize, version: u64, pages: usize) -> String {
    let mut text = format!(
        "*{}\nVersion {version}. See [[{}]] and [[{}]].\n\n",
        title(page),
        title((page + 1) % pages),
        title((page * 7 + 3) % pages)
    );
    let words = [
        "shoal", "wiki", "page", "tablet", "replica", "quorum", "node", "scan", "write", "read",
    ];
    let mut line = 0;
    while text.len() < 1000 {
        let _ = std::fmt::Write::write_fmt(
            &mut text,
            format_args!(
                "-{} {} {} line {line}\n",
                words[(page + line) % words.len()],
                words[(version as usize + line * 3) % words.len()],
                words[line % words.len()]
            ),
        );
        line += 1;
    }
    text
}

/// Percentiles of one kind of request in one run.
#[derive(Serialize, Default)]
struct Latency {
    count: u64,
    p50_ms: f64,
    p99_ms: f64,
    mean_ms: f64,
}

impl Latency {
    fn of(histogram: &Histogram<u64>) -> Latency {
        let ms = |micros: u64| micros as f64 / 1000.0;
        Latency {
            count: histogram.len(),
            p50_ms: ms(histogram.value_at_quantile(0.50)),
            p99_ms: ms(histogram.value_at_quantile(0.99)),
            mean_ms: histogram.mean() / 1000.0,
        }
    }
}

#[derive(Serialize)]
struct Run {
    clients: usize,
    requests: u64,
    seconds: f64,
    requests_per_second: f64,
    all: Latency,
    reads: Latency,
    writes: Latency,
    conflicts: u64,
    errors: u64,
}

struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    fn page_url(&self, action: &str, page: usize) -> String {
        format!("{}/{action}/{}", self.base, title(page))
    }

    async fn read(&self, page: usize) -> Result<()> {
        let response = self.http.get(self.page_url("page", page)).send().await?;
        if !response.status().is_success() {
            bail!("reading {} answered {}", title(page), response.status());
        }
        response.bytes().await?;
        Ok(())
    }

    /// An edit: true when saved, false on a conflict.
    async fn write(&self, page: usize, version: u64, pages: usize) -> Result<bool> {
        let editor = self.http.get(self.page_url("edit", page)).send().await?;
        if !editor.status().is_success() {
            bail!(
                "opening the editor of {} answered {}",
                title(page),
                editor.status()
            );
        }
        let editor = editor.text().await?;
        let base = editor
            .split_once(r#"name="base" value=""#)
            .and_then(|(_, rest)| rest.split_once('"'))
            .map(|(base, _)| base.to_string())
            .context("the editor has no base revision")?;
        self.save(page, &base, &page_text(page, version, pages))
            .await
    }

    async fn save(&self, page: usize, base: &str, text: &str) -> Result<bool> {
        let response = self
            .http
            .post(self.page_url("edit", page))
            .header("Cookie", format!("wiki_csrf={TOKEN}"))
            .form(&[
                ("text", text),
                ("base", base),
                ("csrf", TOKEN),
                ("action", "save"),
            ])
            .send()
            .await?;
        match response.status().as_u16() {
            303 => Ok(true),
            409 => Ok(false),
            status => bail!(
                "saving {} answered {status}: {}",
                title(page),
                response.text().await.unwrap_or_default()
            ),
        }
    }
}

async fn prepare(client: &Client, pages: usize) -> Result<()> {
    let created = AtomicU64::new(0);
    let next = AtomicU64::new(0);
    let workers = (0..16).map(|_| async {
        loop {
            let page = next.fetch_add(1, Ordering::Relaxed) as usize;
            if page >= pages {
                return anyhow::Ok(());
            }
            // A page that already exists conflicts: it is there, which is all we need.
            if client.save(page, "", &page_text(page, 0, pages)).await? {
                created.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    futures::future::try_join_all(workers).await?;
    println!(
        "{} pages ready ({} created)",
        pages,
        created.load(Ordering::Relaxed)
    );
    Ok(())
}

async fn run(client: Arc<Client>, args: &Args, clients: usize) -> Result<Run> {
    let started = Instant::now();
    let tasks = (0..clients).map(|number| {
        let client = Arc::clone(&client);
        let (pages, hot, mix, requests) =
            (args.pages, args.hot, args.mix, args.requests_per_client);
        tokio::spawn(async move {
            let mut rng = SmallRng::seed_from_u64(number as u64 * 7919 + clients as u64);
            let mut reads = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
            let mut writes = reads.clone();
            let (mut conflicts, mut errors) = (0u64, 0u64);
            for request in 0..requests {
                let page = if hot { 0 } else { rng.random_range(0..pages) };
                let sent = Instant::now();
                if rng.random_bool(mix.read_share()) {
                    match client.read(page).await {
                        Ok(()) => reads.record(sent.elapsed().as_micros().max(1) as u64)?,
                        Err(error) => {
                            errors += 1;
                            eprintln!("{error:#}");
                        }
                    }
                } else {
                    let version = (number * requests + request) as u64 + 1;
                    match client.write(page, version, pages).await {
                        Ok(saved) => {
                            conflicts += u64::from(!saved);
                            writes.record(sent.elapsed().as_micros().max(1) as u64)?;
                        }
                        Err(error) => {
                            errors += 1;
                            eprintln!("{error:#}");
                        }
                    }
                }
            }
            anyhow::Ok((reads, writes, conflicts, errors))
        })
    });
    let results = futures::future::try_join_all(tasks).await?;
    let seconds = started.elapsed().as_secs_f64();
    let mut reads = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut writes = reads.clone();
    let (mut conflicts, mut errors) = (0, 0);
    for result in results {
        let (client_reads, client_writes, client_conflicts, client_errors) = result?;
        reads.add(&client_reads)?;
        writes.add(&client_writes)?;
        conflicts += client_conflicts;
        errors += client_errors;
    }
    let mut all = reads.clone();
    all.add(&writes)?;
    let requests = all.len();
    Ok(Run {
        clients,
        requests,
        seconds,
        requests_per_second: requests as f64 / seconds,
        all: Latency::of(&all),
        reads: Latency::of(&reads),
        writes: Latency::of(&writes),
        conflicts,
        errors,
    })
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    if args.pages == 0 {
        bail!("--pages must be at least 1");
    }
    let max_clients = args.clients.iter().copied().max().unwrap_or(1);
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(max_clients.max(16))
        .timeout(Duration::from_secs(60))
        .build()?;
    let client = Arc::new(Client {
        http,
        base: args.url.trim_end_matches('/').to_string(),
    });
    if args.prepare {
        return prepare(&client, args.pages).await;
    }
    let mut runs = Vec::new();
    for &clients in &args.clients {
        let result = run(Arc::clone(&client), &args, clients).await?;
        println!(
            "{:>3} clients: {:>8.0} req/s  read p50 {:>7.2} ms p99 {:>7.2} ms  write p50 {:>7.2} ms p99 {:>7.2} ms  conflicts {} errors {}",
            clients,
            result.requests_per_second,
            result.reads.p50_ms,
            result.reads.p99_ms,
            result.writes.p50_ms,
            result.writes.p99_ms,
            result.conflicts,
            result.errors
        );
        runs.push(result);
    }
    if let Some(path) = &args.json {
        let report = serde_json::json!({
            "url": args.url,
            "mix": args.mix,
            "hot": args.hot,
            "pages": args.pages,
            "requests_per_client": args.requests_per_client,
            "runs": runs,
        });
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}
