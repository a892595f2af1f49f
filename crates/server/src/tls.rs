//! TLS (rustls): for client connections, Cassandra's `client_encryption_options`
//! ([`ServerCertificates`]); between nodes, mutual TLS ([`InternodeTls`]).
//!
//! - `client_tls = "required"`: every connection on the CQL port must start a TLS
//!   handshake; `"optional"`: a connection may start with TLS or with plain CQL, told apart
//!   by its first byte (a TLS record starts with 0x16, a CQL v3–v5 request frame with its
//!   version byte), as Cassandra's optional mode does.
//! - The certificate chain and private key are PEM files. A bad file stops the node at
//!   start-up with a message naming it; afterwards the files are watched: a connection
//!   accepted after they change (checked at most every [`RELOAD_CHECK_INTERVAL`]) gets the
//!   new certificate, without a restart. A change that does not load is logged and the
//!   previous certificate kept.

use anyhow::Context;
use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use tokio_rustls::TlsAcceptor;

/// How often the certificate files are checked for a change, at most.
pub const RELOAD_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// The first byte of a TLS handshake record.
pub const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// The server certificate and key, reloaded when their files change.
pub struct ServerCertificates {
    certificate: PathBuf,
    private_key: PathBuf,
    state: Mutex<Loaded>,
}

struct Loaded {
    acceptor: TlsAcceptor,
    modified: (Option<SystemTime>, Option<SystemTime>),
    checked: Instant,
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Builds a TLS server configuration from PEM files, with messages that name the file.
fn server_config(certificate: &Path, private_key: &Path) -> anyhow::Result<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("no TLS protocol version available")?
        .with_no_client_auth()
        .with_single_cert(certificates(certificate)?, key(private_key)?)
        .with_context(|| mismatch(certificate, private_key))
}

impl ServerCertificates {
    /// Loads the files; an error names the file and what is wrong with it.
    pub fn load(certificate: &Path, private_key: &Path) -> anyhow::Result<ServerCertificates> {
        let config = server_config(certificate, private_key)?;
        Ok(ServerCertificates {
            certificate: certificate.to_path_buf(),
            private_key: private_key.to_path_buf(),
            state: Mutex::new(Loaded {
                acceptor: TlsAcceptor::from(Arc::new(config)),
                modified: (modified(certificate), modified(private_key)),
                checked: Instant::now(),
            }),
        })
    }

    /// The acceptor for a new connection: the current certificate, reloaded first if the
    /// files changed since they were last loaded.
    pub fn acceptor(&self) -> TlsAcceptor {
        let mut state = self.state.lock();
        if state.checked.elapsed() >= RELOAD_CHECK_INTERVAL {
            state.checked = Instant::now();
            let now = (modified(&self.certificate), modified(&self.private_key));
            if now != state.modified {
                state.modified = now;
                match server_config(&self.certificate, &self.private_key) {
                    Ok(config) => {
                        state.acceptor = TlsAcceptor::from(Arc::new(config));
                        tracing::info!(certificate = %self.certificate.display(), "reloaded the TLS certificate");
                    }
                    Err(error) => {
                        tracing::error!("cannot reload the TLS certificate, keeping the previous one: {error:#}")
                    }
                }
            }
        }
        state.acceptor.clone()
    }
}

/// Mutual TLS between nodes (Cassandra's `server_encryption_options` with
/// `require_client_auth`): every node presents its certificate on both sides of an
/// internode connection, and accepts a peer only if the peer's certificate chains to the
/// cluster's CA (`tls_ca_certificate`) and names the address it is reached at. Messages,
/// Raft and `shoal admin` all use these connections. Read at start-up.
#[derive(Clone)]
pub struct InternodeTls {
    pub acceptor: TlsAcceptor,
    pub connector: tokio_rustls::TlsConnector,
}

/// The private key in a PEM file (PKCS#8, PKCS#1 or SEC1).
fn key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path)
        .with_context(|| format!("cannot read a private key (PEM) from {}", path.display()))
}

fn mismatch(certificate: &Path, private_key: &Path) -> String {
    format!(
        "the private key {} does not fit the certificate {}",
        private_key.display(),
        certificate.display()
    )
}

/// The certificate chain in a PEM file; an empty file is an error.
fn certificates(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .with_context(|| format!("cannot read the TLS certificate {}", path.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("the TLS certificate {} is not valid PEM", path.display()))?;
    anyhow::ensure!(
        !chain.is_empty(),
        "the TLS certificate file {} holds no certificate",
        path.display()
    );
    Ok(chain)
}

impl InternodeTls {
    pub fn load(
        certificate: &Path,
        private_key: &Path,
        ca_certificate: &Path,
    ) -> anyhow::Result<InternodeTls> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for ca in certificates(ca_certificate)? {
            roots.add(ca).with_context(|| {
                format!(
                    "{} is not a usable CA certificate",
                    ca_certificate.display()
                )
            })?;
        }
        let roots = Arc::new(roots);
        let chain = certificates(certificate)?;
        let client_verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::clone(&roots),
            Arc::clone(&provider),
        )
        .build()
        .context("cannot verify peers with the CA certificate")?;
        let server = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(client_verifier)
            .with_single_cert(chain.clone(), key(private_key)?)
            .with_context(|| mismatch(certificate, private_key))?;
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key(private_key)?)
            .context("the node's certificate cannot authenticate it to peers")?;
        Ok(InternodeTls {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            connector: tokio_rustls::TlsConnector::from(Arc::new(client)),
        })
    }
}
