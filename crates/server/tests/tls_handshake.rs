#![allow(clippy::unwrap_used)]
//! Fuzzing the TLS handshake path of the CQL port (optional TLS, so both the sniffing of
//! the first byte and the handshake are reached): arbitrary bytes, and a real ClientHello
//! with bytes flipped or cut short, each on its own connection. Every such connection
//! ends — closed by the node or answered — within a bound, no connection gets a CQL
//! session without a handshake, and afterwards the node still completes a real TLS
//! handshake and answers a query. `PROPTEST_CASES=5000` runs a longer round.

mod common;

use common::{free_ports, runtime};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestRunner};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use shoal_server::config::{ClientTls, Config};
use shoal_server::Node;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn make_certificate(directory: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let certificate = directory.join("node.crt");
    let key = directory.join("node.key");
    let output = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "2"])
        .args([
            "-subj",
            "/CN=shoal",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ])
        // An end-entity certificate (webpki refuses a CA certificate as a server's).
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&certificate)
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    (certificate, key)
}

fn client_config(certificate: &Path) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for der in CertificateDer::pem_file_iter(certificate).unwrap() {
        roots.add(der.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// The first flight of a real TLS client: a ClientHello record.
fn client_hello(config: Arc<rustls::ClientConfig>) -> Vec<u8> {
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let mut connection = rustls::ClientConnection::new(config, name).unwrap();
    let mut bytes = Vec::new();
    connection.write_tls(&mut bytes).unwrap();
    bytes
}

const STARTUP: &[u8] =
    b"\x04\x00\x00\x01\x01\x00\x00\x00\x16\x00\x01\x00\x0bCQL_VERSION\x00\x053.0.0";
const READY: u8 = 0x02;

/// Sends `bytes` then a plain STARTUP: the node must close the connection or answer
/// garbage with TLS alerts, but never READY (a CQL session reached without TLS) — unless
/// the input was plain CQL from its first byte, which optional TLS serves.
async fn send_garbage(address: SocketAddr, bytes: &[u8]) -> Result<(), TestCaseError> {
    let mut socket = TcpStream::connect(address).await.unwrap();
    let _ = socket.write_all(bytes).await;
    let _ = socket.write_all(STARTUP).await;
    // Nothing more is coming: the node sees the end of the input instead of waiting for
    // the rest of a truncated record until its handshake timeout.
    let _ = socket.shutdown().await;
    let mut received = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(15), async {
        let mut chunk = [0u8; 4096];
        loop {
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&chunk[..n]),
            }
            if received.len() > 1 << 16 {
                break;
            }
        }
    })
    .await;
    let starts_as_tls = bytes.first() == Some(&0x16);
    if starts_as_tls {
        prop_assert!(
            read.is_ok(),
            "the node neither answered nor closed within 15 s"
        );
        let ready = received.len() >= 5 && received[0] == 0x84 && received[4] == READY;
        prop_assert!(!ready, "a CQL session without a TLS handshake");
    }
    Ok(())
}

fn garbage(hello: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let length = hello.len();
    let flipped = {
        let hello = hello.clone();
        proptest::collection::vec((0..length, 1u8..=255), 1..4).prop_map(move |flips| {
            let mut bytes = hello.clone();
            for (at, mask) in flips {
                bytes[at] ^= mask;
            }
            bytes
        })
    };
    let truncated = (0..length).prop_map(move |cut| hello[..cut].to_vec());
    let arbitrary = proptest::collection::vec(any::<u8>(), 0..512).prop_map(|mut bytes| {
        if let Some(first) = bytes.first_mut() {
            *first = 0x16;
        }
        bytes
    });
    prop_oneof![flipped, truncated, arbitrary]
}

#[test]
fn garbage_on_the_tls_port_ends_and_the_node_still_serves_tls() {
    let runtime = runtime();
    let directory = tempfile::tempdir().unwrap();
    let (certificate, key) = make_certificate(directory.path());
    let (cql_port, internode_port) = free_ports();
    let config = Config {
        data_dir: directory.path().join("data"),
        cql_port,
        internode_port,
        client_tls: ClientTls::Optional,
        tls_certificate: Some(certificate.clone()),
        tls_private_key: Some(key),
        ..Config::default()
    };
    let node = runtime.block_on(Node::start(config)).unwrap();
    let address = node.cql_address();
    let client = client_config(&certificate);
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(64);
    let mut runner = TestRunner::new(ProptestConfig::with_cases(cases));
    let outcome = runner.run(&garbage(client_hello(Arc::clone(&client))), |bytes| {
        runtime.block_on(send_garbage(address, &bytes))
    });
    runtime.block_on(async {
        let socket = TcpStream::connect(address).await.unwrap();
        let connector = tokio_rustls::TlsConnector::from(client);
        let name = ServerName::try_from("127.0.0.1").unwrap();
        let mut stream = connector.connect(name, socket).await.unwrap();
        stream.write_all(STARTUP).await.unwrap();
        let mut header = [0u8; 9];
        stream.read_exact(&mut header).await.unwrap();
        assert_eq!(header[4], READY);
        node.stop().await;
    });
    outcome.unwrap();
}
