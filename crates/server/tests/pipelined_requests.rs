#![allow(clippy::unwrap_used)]
//! A client that sends many requests in one write, without waiting for any answer — what
//! every driver does with many requests in flight on one connection — gets every one of
//! them answered, once, without sending anything more. The node serves a connection's
//! requests in passes of a bounded size, leaving the frames after a pass in its buffer;
//! those must be served from the buffer, not only when more bytes arrive.

mod common;

use common::{free_ports, query, read_answer, runtime, startup};
use shoal_cql::frame::opcode;
use shoal_server::config::Config;
use shoal_server::Node;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Far more than one pass of requests.
const PIPELINED: i16 = 300;
const RESULT_VOID: i32 = 1;

/// Reads one answer: its stream, opcode and body, within a bound.
async fn answer(socket: &mut TcpStream) -> (i16, u8, Vec<u8>) {
    read_answer(socket, Duration::from_secs(20)).await
}

async fn run_one(socket: &mut TcpStream, frame: &[u8]) -> (u8, Vec<u8>) {
    socket.write_all(frame).await.unwrap();
    let (_, op, body) = answer(socket).await;
    (op, body)
}

#[test]
fn every_request_sent_in_one_write_is_answered_once() {
    let runtime = runtime();
    let directory = tempfile::tempdir().unwrap();
    let (cql_port, internode_port) = free_ports();
    let config = Config {
        data_dir: directory.path().to_path_buf(),
        cql_port,
        internode_port,
        ..Config::default()
    };
    let node = runtime.block_on(Node::start(config)).unwrap();
    let address = node.cql_address();
    runtime.block_on(async {
        let mut socket = TcpStream::connect(address).await.unwrap();
        socket.set_nodelay(true).unwrap();
        assert_eq!(run_one(&mut socket, &startup()).await.0, opcode::READY);
        for text in [
            "CREATE KEYSPACE ks WITH replication = {'class': 'SimpleStrategy', 'replication_factor': 1}",
            "CREATE TABLE ks.t (k int PRIMARY KEY, v int)",
        ] {
            let (op, body) = run_one(&mut socket, &query(1, text)).await;
            assert_eq!(op, opcode::RESULT, "{text}: {}", String::from_utf8_lossy(&body));
        }

        let mut frames = Vec::new();
        for stream in 1..=PIPELINED {
            frames.extend(query(
                stream,
                &format!("INSERT INTO ks.t (k, v) VALUES ({stream}, {stream})"),
            ));
        }
        socket.write_all(&frames).await.unwrap();
        let mut answered = BTreeMap::new();
        for _ in 1..=PIPELINED {
            let (stream, op, body) = answer(&mut socket).await;
            assert_eq!(op, opcode::RESULT, "{}", String::from_utf8_lossy(&body));
            assert_eq!(body[..4], RESULT_VOID.to_be_bytes());
            *answered.entry(stream).or_insert(0) += 1;
        }
        assert_eq!(
            answered.keys().copied().collect::<Vec<_>>(),
            (1..=PIPELINED).collect::<Vec<_>>()
        );
        assert!(answered.values().all(|&count| count == 1));

        // The writes are all there.
        let (op, body) = run_one(&mut socket, &query(1, "SELECT count(*) FROM ks.t")).await;
        assert_eq!(op, opcode::RESULT);
        assert!(
            body.ends_with(&(PIPELINED as i64).to_be_bytes()),
            "count(*) answers {PIPELINED}"
        );
        node.stop().await;
    });
}
