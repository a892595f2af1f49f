//! What the server's integration tests share: free ports, a runtime like the node's, and
//! CQL v4 request frames built by hand (the tests speak to the node's socket directly).
//! Each test binary uses a part of it.
#![allow(dead_code)]

use shoal_cql::frame::opcode;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// Two different ports free on 127.0.0.1 right now, for a node's CQL and internode
/// ports. Both listeners are held while the second port is chosen. Two separate picks could
/// be handed the same port (the first is released before the second is asked for), and the
/// node refuses to start with equal ports.
pub fn free_ports() -> (u16, u16) {
    let first = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let second = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    (
        first.local_addr().unwrap().port(),
        second.local_addr().unwrap().port(),
    )
}

/// A two-worker Tokio runtime, as on the machines the node runs on.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A request frame on `stream`.
pub fn request(stream: i16, opcode: u8, body: &[u8]) -> Vec<u8> {
    let mut frame = vec![0x04, 0];
    frame.extend_from_slice(&stream.to_be_bytes());
    frame.push(opcode);
    frame.extend_from_slice(&(body.len() as u32).to_be_bytes());
    frame.extend_from_slice(body);
    frame
}

/// STARTUP with CQL 3.0.0, on stream 0.
pub fn startup() -> Vec<u8> {
    let mut body = 1u16.to_be_bytes().to_vec();
    for text in ["CQL_VERSION", "3.0.0"] {
        body.extend_from_slice(&(text.len() as u16).to_be_bytes());
        body.extend_from_slice(text.as_bytes());
    }
    request(0, opcode::STARTUP, &body)
}

/// QUERY of `text` at consistency ONE, without flags, on `stream`.
pub fn query(stream: i16, text: &str) -> Vec<u8> {
    let mut body = (text.len() as u32).to_be_bytes().to_vec();
    body.extend_from_slice(text.as_bytes());
    body.extend_from_slice(&1u16.to_be_bytes()); // consistency ONE
    body.push(0); // no flags
    request(stream, opcode::QUERY, &body)
}

/// Reads one answer frame: its stream, opcode and body. Fails the test if its header does
/// not arrive `within`.
pub async fn read_answer(socket: &mut TcpStream, within: Duration) -> (i16, u8, Vec<u8>) {
    let mut header = [0u8; 9];
    tokio::time::timeout(within, socket.read_exact(&mut header))
        .await
        .unwrap_or_else(|_| panic!("the node answers within {} s", within.as_secs()))
        .unwrap();
    let length = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) as usize;
    let mut body = vec![0u8; length];
    socket.read_exact(&mut body).await.unwrap();
    (i16::from_be_bytes([header[2], header[3]]), header[4], body)
}
