//! How a benchmark logs in to a cluster: credentials and TLS, and the sessions made with them.

use anyhow::Context;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::client::PoolSize;

/// Credentials and TLS for a cluster that requires them (Shoal `--auth` and
/// `client_tls`, Cassandra's PasswordAuthenticator and client_encryption_options).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct Login {
    /// Role to log in as.
    #[arg(long, requires = "password")]
    pub user: Option<String>,
    /// Its password.
    #[arg(long, requires = "user")]
    pub password: Option<String>,
    /// Connect over TLS, trusting the certificates this PEM file holds (the node's
    /// certificate or its CA).
    #[arg(long)]
    pub tls_trust: Option<std::path::PathBuf>,
}

impl Login {
    /// `builder`, logging in and using TLS as asked.
    pub fn apply(&self, builder: SessionBuilder) -> anyhow::Result<SessionBuilder> {
        let mut builder = match (&self.user, &self.password) {
            (Some(user), Some(password)) => builder.user(user, password),
            _ => builder,
        };
        if let Some(trusted) = &self.tls_trust {
            use openssl::ssl::{SslContextBuilder, SslMethod, SslVerifyMode};
            let mut context = SslContextBuilder::new(SslMethod::tls())?;
            context.set_verify(SslVerifyMode::PEER);
            context
                .set_ca_file(trusted)
                .with_context(|| format!("cannot read {}", trusted.display()))?;
            builder = builder.tls_context(Some(context.build()));
        }
        Ok(builder)
    }

    /// A session to the cluster at `contact`, logged in as asked, with `pool`
    /// connections.
    pub async fn connect(&self, contact: &str, pool: PoolSize) -> anyhow::Result<Session> {
        self.apply(SessionBuilder::new())?
            .known_node(contact)
            .pool_size(pool)
            .build()
            .await
            .with_context(|| format!("cannot connect to {contact}"))
    }

    /// Runs `body` with a session to `contact` (default pool) on a runtime of its own:
    /// how the one-phase benchmarks (`index`, `vector`, `lwt`) run.
    pub fn run_with_session<T>(
        &self,
        contact: &str,
        body: impl AsyncFnOnce(&Session) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        self.run_with_configured_session(contact, |builder| builder, body)
    }

    /// [`Login::run_with_session`] with the session's builder set up by `configure` too.
    pub fn run_with_configured_session<T>(
        &self,
        contact: &str,
        configure: impl FnOnce(SessionBuilder) -> SessionBuilder,
        body: impl AsyncFnOnce(&Session) -> anyhow::Result<T>,
    ) -> anyhow::Result<T> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async {
            let session = configure(self.apply(SessionBuilder::new())?)
                .known_node(contact)
                .pool_size(PoolSize::default())
                .build()
                .await
                .with_context(|| format!("cannot connect to {contact}"))?;
            body(&session).await
        })
    }
}
