//! What the server's integration tests share: free ports, a runtime like the node's, and
//! CQL v4 request frames built by hand (the tests speak to the node's socket directly).
//! Each test binary uses a part of it.
#![allow(dead_code)]

use shoal_cql::frame::opcode;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// A port for a node under test, free right now on every one of `addresses`.
///
/// Ports come from below the kernel's ephemeral range (`ip_local_port_range`): a port
/// from that range, found free a moment ago, can be taken by any outgoing connection (a
/// driver's, a node's internode one) before the node under test binds it, and the node
/// then fails to start with "Address already in use". Below the range, only a process
/// that asks for that very port can take it. Each port is handed out once per test
/// binary (a counter shared by its tests, which run in parallel), starting at a place
/// that depends on the process id, so two binaries run one after the other start apart.
pub fn free_port_on(addresses: &[std::net::IpAddr]) -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static HANDED_OUT: AtomicU32 = AtomicU32::new(0);
    let (floor, ceiling) = (10_000, ephemeral_range_start().max(10_001));
    let span = ceiling - floor;
    let start = std::process::id() * 97 % span;
    loop {
        let count = HANDED_OUT.fetch_add(1, Ordering::Relaxed);
        assert!(
            count < span,
            "no port free below {ceiling} on {addresses:?}"
        );
        let port = (floor + (start + count) % span) as u16;
        let free = |address: &std::net::IpAddr| {
            std::net::TcpListener::bind(std::net::SocketAddr::new(*address, port)).is_ok()
        };
        if addresses.iter().all(free) {
            return port;
        }
    }
}

/// The first port of the kernel's ephemeral range, from which it picks the local port of
/// an outgoing connection (32768 unless the machine is configured otherwise).
fn ephemeral_range_start() -> u32 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// Two different ports free on 127.0.0.1, for a node's CQL and internode ports (see
/// [`free_port_on`]; a port is never handed out twice, so the two differ).
pub fn free_ports() -> (u16, u16) {
    let loopback = [std::net::IpAddr::from([127, 0, 0, 1])];
    (free_port_on(&loopback), free_port_on(&loopback))
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
