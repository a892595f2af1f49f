//! The Shoal wiki: a YukiWiki-style wiki whose pages live in Shoal (or, for comparison,
//! in MariaDB). See `apps/wiki/README.md`.
//!
//! ```text
//! shoal-wiki --shoal 127.0.0.1:9042 --listen 127.0.0.1:8080
//! shoal-wiki --mariadb mysql://root@127.0.0.1:3306/wiki --listen 127.0.0.1:8081
//! ```

mod markup;
mod search;
mod store;
mod web;

use anyhow::{bail, Context, Result};
use clap::Parser;
use std::sync::Arc;
use store::WikiStore;

#[derive(Parser)]
#[command(name = "shoal-wiki", about = "A YukiWiki-style wiki stored in Shoal")]
struct Args {
    /// Shoal contact points, host:port, comma-separated.
    #[arg(long, value_delimiter = ',', conflicts_with = "mariadb")]
    shoal: Vec<String>,
    /// The keyspace the wiki's tables live in.
    #[arg(long, default_value = "wiki")]
    keyspace: String,
    /// The replication factor of a keyspace the wiki creates (3 on a cluster).
    #[arg(long, default_value_t = 1)]
    replication_factor: u32,
    /// A MariaDB (or MySQL) database instead: mysql://user:password@host:port/database.
    #[arg(long)]
    mariadb: Option<String>,
    /// Where to serve the wiki; port 0 picks a free one (the address is printed).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
}

#[tokio::main]
async fn main() -> Result<()> {
    // Logs go to stderr: stdout carries the one line scripts wait for (a pipe nobody
    // reads after it would fill up and stop the server at its next log line).
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "shoal_wiki=info".into()),
        )
        .init();
    let args = Args::parse();
    let store: Arc<dyn WikiStore> = match (&args.mariadb, args.shoal.is_empty()) {
        (Some(url), true) => Arc::new(store::mariadb::MariaDbStore::connect(url).await?),
        (None, false) => Arc::new(
            store::shoal::ShoalStore::connect(&args.shoal, &args.keyspace, args.replication_factor)
                .await?,
        ),
        _ => bail!("name the store: --shoal HOST:PORT[,…] or --mariadb URL"),
    };
    web::ensure_front_page(store.as_ref()).await?;
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let address = listener.local_addr()?;
    // Scripts and tests wait for this line.
    println!("wiki on {} serving http://{address}/", store.name());
    axum::serve(listener, web::router(store))
        .with_graceful_shutdown(shutdown_requested())
        .await?;
    Ok(())
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_requested() {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM can be handled");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}
