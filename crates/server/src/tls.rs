//! TLS (rustls): for client connections, Cassandra's `client_encryption_options`
//! ([`ServerCertificates`]); between nodes, mutual TLS ([`InternodeTls`]).
//!
//! - `client_tls = "required"`: every connection on the CQL port must start a TLS
//!   handshake; `"optional"`: a connection may start with TLS or with plain CQL, told apart
//!   by its first byte (a TLS record starts with 0x16, a CQL v3–v5 request frame with its
//!   version byte), as Cassandra's optional mode does.
//! - `client_tls_ca_certificate`: clients must also present a certificate signed by that
//!   CA (Cassandra's `require_client_auth`); one without fails the handshake.
//! - The certificate chain and private key are PEM files. A bad file stops the node at
//!   start-up with a message naming it; afterwards the files are watched ([`Reloading`]),
//!   the client port's and the internode ones alike: a connection accepted or made after
//!   they change (checked at most every [`RELOAD_CHECK_INTERVAL`]) gets the new
//!   certificate, without a restart. A change that does not load is logged and the
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

/// Bytes a TLS connection reads from its socket per system call, at most.
const SOCKET_READ_BYTES: usize = 64 * 1024;

/// A TCP socket read through a buffer: what a TLS session reads from.
///
/// rustls asks its transport for at most 4 KiB per read. On a bare socket that is one
/// system call per 4 KiB: a client's pass of requests took two or three, a streaming chunk
/// of a couple of MiB hundreds. Through this buffer one call takes whatever the socket
/// holds, up to [`SOCKET_READ_BYTES`], and rustls' reads are served from memory. Writes go
/// straight to the socket.
pub type BufferedSocket = tokio::io::BufReader<tokio::net::TcpStream>;

/// `socket` behind a read buffer, ready for a TLS handshake ([`BufferedSocket`]).
pub fn buffered(socket: tokio::net::TcpStream) -> BufferedSocket {
    tokio::io::BufReader::with_capacity(SOCKET_READ_BYTES, socket)
}

/// TLS built from PEM files and built again when one of them changes: a connection
/// accepted or made after the change (checked at most every [`RELOAD_CHECK_INTERVAL`]) uses
/// the new certificate, without a restart; a change that does not load is logged and the
/// previous configuration kept.
pub struct Reloading<T: Clone> {
    what: &'static str,
    files: Vec<PathBuf>,
    build: Box<dyn Fn() -> anyhow::Result<T> + Send + Sync>,
    state: Mutex<Loaded<T>>,
}

struct Loaded<T> {
    current: T,
    modified: Vec<Option<SystemTime>>,
    checked: Instant,
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

impl<T: Clone> Reloading<T> {
    /// Builds now (an error names the file and what is wrong with it) and keeps `build`
    /// for when one of `files` changes.
    fn new(
        what: &'static str,
        files: Vec<PathBuf>,
        build: impl Fn() -> anyhow::Result<T> + Send + Sync + 'static,
    ) -> anyhow::Result<Reloading<T>> {
        let current = build()?;
        Ok(Reloading {
            what,
            state: Mutex::new(Loaded {
                current,
                modified: files.iter().map(|f| modified(f)).collect(),
                checked: Instant::now(),
            }),
            files,
            build: Box::new(build),
        })
    }

    /// The configuration for a new connection, built again first if the files changed
    /// since they were last read.
    pub fn current(&self) -> T {
        let mut state = self.state.lock();
        if state.checked.elapsed() >= RELOAD_CHECK_INTERVAL {
            state.checked = Instant::now();
            let now: Vec<Option<SystemTime>> = self.files.iter().map(|f| modified(f)).collect();
            if now != state.modified {
                state.modified = now;
                match (self.build)() {
                    Ok(current) => {
                        state.current = current;
                        tracing::info!(certificate = %self.files[0].display(), "reloaded the {} certificate", self.what);
                    }
                    Err(error) => tracing::error!(
                        "cannot reload the {} certificate, keeping the previous one: {error:#}",
                        self.what
                    ),
                }
            }
        }
        state.current.clone()
    }
}

/// The CQL port's certificate and key (and, when clients must present certificates, the
/// CA that signs them), reloaded when their files change.
pub type ServerCertificates = Reloading<TlsAcceptor>;

impl Reloading<TlsAcceptor> {
    /// Loads the client-facing TLS configuration. With `client_ca`, every client must
    /// present a certificate that chains to it (Cassandra's `require_client_auth`); a
    /// client without one fails the handshake.
    pub fn load(
        certificate: &Path,
        private_key: &Path,
        client_ca: Option<&Path>,
    ) -> anyhow::Result<ServerCertificates> {
        let (certificate, private_key) = (certificate.to_path_buf(), private_key.to_path_buf());
        let client_ca = client_ca.map(Path::to_path_buf);
        let files = [&certificate, &private_key]
            .into_iter()
            .chain(client_ca.as_ref())
            .cloned()
            .collect();
        Reloading::new("client TLS", files, move || {
            client_server_config(&certificate, &private_key, client_ca.as_deref())
                .map(|config| TlsAcceptor::from(Arc::new(config)))
        })
    }

    /// The acceptor for a new client connection.
    pub fn acceptor(&self) -> TlsAcceptor {
        self.current()
    }
}

/// The roots of trust in a CA certificate file.
fn roots(ca_certificate: &Path) -> anyhow::Result<Arc<rustls::RootCertStore>> {
    let mut roots = rustls::RootCertStore::empty();
    for ca in certificates(ca_certificate)? {
        roots.add(ca).with_context(|| {
            format!(
                "{} is not a usable CA certificate",
                ca_certificate.display()
            )
        })?;
    }
    Ok(Arc::new(roots))
}

/// Builds the client-facing TLS server configuration from PEM files.
fn client_server_config(
    certificate: &Path,
    private_key: &Path,
    client_ca: Option<&Path>,
) -> anyhow::Result<rustls::ServerConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .context("no TLS protocol version available")?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => builder.with_client_cert_verifier(
            rustls::server::WebPkiClientVerifier::builder_with_provider(roots(ca)?, provider)
                .build()
                .context("cannot verify client certificates with the CA certificate")?,
        ),
    };
    builder
        .with_single_cert(certificates(certificate)?, key(private_key)?)
        .with_context(|| mismatch(certificate, private_key))
}

/// Mutual TLS between nodes (Cassandra's `server_encryption_options` with
/// `require_client_auth`): every node presents its certificate on both sides of an
/// internode connection, and accepts a peer only if the peer's certificate chains to the
/// cluster's CA (`tls_ca_certificate`) and names the address it is reached at. Messages,
/// Raft and `shoal admin` all use these connections. The files are reloaded when they
/// change ([`Reloading`]): connections made or accepted afterwards use the new ones.
#[derive(Clone)]
pub struct InternodeTlsConfig {
    pub acceptor: TlsAcceptor,
    pub connector: tokio_rustls::TlsConnector,
}

/// [`InternodeTlsConfig`], reloaded when its files change.
pub type InternodeTls = Reloading<InternodeTlsConfig>;

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

impl Reloading<InternodeTlsConfig> {
    pub fn load(
        certificate: &Path,
        private_key: &Path,
        ca_certificate: &Path,
    ) -> anyhow::Result<InternodeTls> {
        let files = vec![
            certificate.to_path_buf(),
            private_key.to_path_buf(),
            ca_certificate.to_path_buf(),
        ];
        let paths = files.clone();
        Reloading::new("internode TLS", files, move || {
            internode_config(&paths[0], &paths[1], &paths[2])
        })
    }

    /// The acceptor for a new connection from a peer.
    pub fn acceptor(&self) -> TlsAcceptor {
        self.current().acceptor
    }

    /// The connector for a new connection to a peer.
    pub fn connector(&self) -> tokio_rustls::TlsConnector {
        self.current().connector
    }
}

/// The consensus streams' connections made mutual TLS: the same handshake as an internode
/// message connection's, the peer named by the address it is reached at (the listener
/// tells the stream by its preface once decrypted).
pub fn securing_consensus_streams(tls: Arc<InternodeTls>) -> shoal_consensus::runtime::tcp::Secure {
    Arc::new(move |socket, address| {
        let connector = tls.connector();
        Box::pin(async move {
            let name = rustls::pki_types::ServerName::IpAddress(address.ip().into());
            let stream = connector.connect(name, socket).await?;
            Ok(Box::new(stream) as shoal_consensus::runtime::tcp::PeerStream)
        })
    })
}

fn internode_config(
    certificate: &Path,
    private_key: &Path,
    ca_certificate: &Path,
) -> anyhow::Result<InternodeTlsConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let roots = roots(ca_certificate)?;
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
    Ok(InternodeTlsConfig {
        acceptor: TlsAcceptor::from(Arc::new(server)),
        connector: tokio_rustls::TlsConnector::from(Arc::new(client)),
    })
}
