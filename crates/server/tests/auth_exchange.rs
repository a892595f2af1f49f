#![allow(clippy::unwrap_used)]
//! Fuzzing the login exchange of a node with authentication on, over a real socket:
//! whatever a client sends as its SASL response — arbitrary bytes, or the right
//! credentials with one byte changed — it gets `BadCredentials` (or a protocol error),
//! never a panic, a hang or a session: a query on that connection is still refused. The
//! right credentials then log in. bcrypt makes each attempt take tens of milliseconds, so
//! the suite runs a short round; `PROPTEST_CASES=2000` runs a longer one.

mod common;

use common::{free_ports, query, read_answer, request, runtime, startup};
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestCaseError, TestRunner};
use shoal_cql::frame::opcode;
use shoal_server::config::{Authenticator, Authorizer, Config};
use shoal_server::Node;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const VALID_TOKEN: &[u8] = b"\0cassandra\0cassandra";
const BAD_CREDENTIALS: i32 = 0x0100;
const UNAUTHORIZED: i32 = 0x2100;
const PROTOCOL_ERROR: i32 = 0x000A;

fn auth_response(token: &[u8]) -> Vec<u8> {
    let mut body = (token.len() as i32).to_be_bytes().to_vec();
    body.extend_from_slice(token);
    request(1, opcode::AUTH_RESPONSE, &body)
}

/// Sends a frame and reads the answer: its opcode and body, within a bound.
async fn exchange(socket: &mut TcpStream, frame: &[u8]) -> (u8, Vec<u8>) {
    socket.write_all(frame).await.unwrap();
    let (_, op, body) = read_answer(socket, Duration::from_secs(10)).await;
    (op, body)
}

fn error_code(body: &[u8]) -> i32 {
    i32::from_be_bytes([body[0], body[1], body[2], body[3]])
}

/// One connection that answers `token`: refused, and still not logged in.
async fn try_token(address: SocketAddr, token: &[u8]) -> Result<(), TestCaseError> {
    let mut socket = TcpStream::connect(address).await.unwrap();
    let (op, _) = exchange(&mut socket, &startup()).await;
    prop_assert_eq!(op, opcode::AUTHENTICATE);
    let (op, body) = exchange(&mut socket, &auth_response(token)).await;
    prop_assert_eq!(op, opcode::ERROR, "a wrong token logged in: {:?}", token);
    prop_assert!([BAD_CREDENTIALS, PROTOCOL_ERROR].contains(&error_code(&body)));
    let (op, body) = exchange(&mut socket, &query(1, "SELECT key FROM system.local")).await;
    prop_assert_eq!(op, opcode::ERROR);
    prop_assert_eq!(error_code(&body), UNAUTHORIZED);
    Ok(())
}

fn tokens() -> impl Strategy<Value = Vec<u8>> {
    let flipped = (0..VALID_TOKEN.len(), 1u8..=255).prop_map(|(at, mask)| {
        let mut token = VALID_TOKEN.to_vec();
        token[at] ^= mask;
        token
    });
    let truncated = (0..VALID_TOKEN.len()).prop_map(|len| VALID_TOKEN[..len].to_vec());
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..64),
        flipped,
        truncated
    ]
}

#[test]
fn no_sasl_response_but_the_right_one_logs_in() {
    let runtime = runtime();
    let directory = tempfile::tempdir().unwrap();
    let (cql_port, internode_port) = free_ports();
    let config = Config {
        data_dir: directory.path().to_path_buf(),
        cql_port,
        internode_port,
        authenticator: Authenticator::PasswordAuthenticator,
        authorizer: Authorizer::CassandraAuthorizer,
        ..Config::default()
    };
    let node = runtime.block_on(Node::start(config)).unwrap();
    let address = node.cql_address();
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(40);
    let mut runner = TestRunner::new(ProptestConfig::with_cases(cases));
    let outcome = runner.run(&tokens(), |token| {
        runtime.block_on(try_token(address, &token))
    });
    runtime.block_on(async {
        let mut socket = TcpStream::connect(address).await.unwrap();
        exchange(&mut socket, &startup()).await;
        let (op, _) = exchange(&mut socket, &auth_response(VALID_TOKEN)).await;
        assert_eq!(op, opcode::AUTH_SUCCESS);
        let (op, _) = exchange(&mut socket, &query(1, "SELECT key FROM system.local")).await;
        assert_eq!(op, opcode::RESULT);
        node.stop().await;
    });
    outcome.unwrap();
}
