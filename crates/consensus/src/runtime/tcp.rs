//! One TCP stream per peer node and direction, carrying every group's messages: a frame is
//! `u32 length | sender host id (16) | message` ([`crate::codec`]). A writer task per peer
//! writes whatever frames are queued with one vectored write, so epoch batches stream
//! back to back without waiting for their acknowledgements. Outgoing connections leave
//! from the node's own address (so a firewall rule can cut one node off by address).
//!
//! Bounded: [`PEER_QUEUE_FRAMES`] frames wait per peer (past that [`Transport::send`]
//! refuses and the protocol resends later), and a frame over [`MAX_FRAME_BYTES`] closes
//! the connection.

use super::{RaftHandle, Transport};
use crate::codec::{decode_message, encode_message, encoded_message_len};
use crate::message::Message;
use crate::NodeId;
use bytes::BytesMut;
use std::collections::HashMap;
use std::io::IoSlice;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::mpsc;

/// Frames queued for one peer before sends are refused.
pub const PEER_QUEUE_FRAMES: usize = 4096;
/// The largest frame accepted.
pub const MAX_FRAME_BYTES: usize = 64 << 20;
/// Bytes and frames gathered into one (vectored) socket write at most.
const WRITE_COALESCE_BYTES: usize = 1 << 20;
const WRITE_COALESCE_FRAMES: usize = 64;
const RECONNECT_PAUSE: Duration = Duration::from_millis(100);

/// The sending side: a queue and a writer task per peer.
pub struct TcpTransport {
    me: NodeId,
    queues: HashMap<NodeId, mpsc::Sender<Vec<u8>>>,
}

impl TcpTransport {
    /// Starts a writer task for each peer in `peers` (host id → address), connecting from
    /// `source`.
    pub fn start(me: NodeId, source: IpAddr, peers: HashMap<NodeId, SocketAddr>) -> TcpTransport {
        let mut queues = HashMap::new();
        for (peer, address) in peers {
            if peer == me {
                continue;
            }
            let (frames, queue) = mpsc::channel(PEER_QUEUE_FRAMES);
            tokio::spawn(write_to_peer(source, address, queue));
            queues.insert(peer, frames);
        }
        TcpTransport { me, queues }
    }
}

impl Transport for TcpTransport {
    fn send(&self, to: NodeId, message: &Message) -> bool {
        let Some(queue) = self.queues.get(&to) else {
            return false;
        };
        let mut frame = Vec::with_capacity(20 + encoded_message_len(message));
        frame.extend_from_slice(&[0; 4]);
        frame.extend_from_slice(&self.me.0);
        encode_message(message, &mut frame);
        let length = (frame.len() - 4) as u32;
        frame[..4].copy_from_slice(&length.to_le_bytes());
        queue.try_send(frame).is_ok()
    }
}

async fn connect(source: IpAddr, address: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = if address.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.bind(SocketAddr::new(source, 0))?;
    let stream = socket.connect(address).await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Keeps a connection to one peer and writes its frames; frames queued while it is down
/// are dropped (the protocol resends what matters).
async fn write_to_peer(source: IpAddr, address: SocketAddr, mut queue: mpsc::Receiver<Vec<u8>>) {
    let mut frames: Vec<Vec<u8>> = Vec::with_capacity(WRITE_COALESCE_FRAMES);
    'connect: loop {
        let mut stream = match connect(source, address).await {
            Ok(stream) => stream,
            Err(_) => {
                tokio::time::sleep(RECONNECT_PAUSE).await;
                // Drop what waited for the dead connection.
                loop {
                    match queue.try_recv() {
                        Ok(_) => {}
                        Err(mpsc::error::TryRecvError::Empty) => continue 'connect,
                        Err(mpsc::error::TryRecvError::Disconnected) => return,
                    }
                }
            }
        };
        loop {
            let Some(frame) = queue.recv().await else {
                return;
            };
            frames.clear();
            let mut bytes = frame.len();
            frames.push(frame);
            while bytes < WRITE_COALESCE_BYTES && frames.len() < WRITE_COALESCE_FRAMES {
                match queue.try_recv() {
                    Ok(frame) => {
                        bytes += frame.len();
                        frames.push(frame);
                    }
                    Err(_) => break,
                }
            }
            if write_frames(&mut stream, &frames).await.is_err() {
                continue 'connect;
            }
        }
    }
}

/// Writes `frames` back to back with vectored writes (no copy into one buffer).
async fn write_frames(stream: &mut TcpStream, frames: &[Vec<u8>]) -> std::io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = frames.iter().map(|frame| IoSlice::new(frame)).collect();
    let mut remaining = &mut slices[..];
    while !remaining.is_empty() {
        let written = stream.write_vectored(remaining).await?;
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut remaining, written);
    }
    Ok(())
}

/// Accepts peers' connections and hands every message to `handle`, in arrival order.
pub async fn serve(listener: TcpListener, handle: RaftHandle) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let handle = handle.clone();
        tokio::spawn(async move {
            if let Err(error) = read_from_peer(stream, handle).await {
                tracing::debug!(%error, "a consensus connection closed");
            }
        });
    }
}

async fn read_from_peer(stream: TcpStream, handle: RaftHandle) -> std::io::Result<()> {
    let mut reader = tokio::io::BufReader::with_capacity(1 << 20, stream);
    // Frames are read into one growing buffer and split off without copying; entries'
    // payloads keep sharing it until the log forgets them.
    let mut buffer = BytesMut::with_capacity(1 << 20);
    loop {
        let mut header = [0u8; 4];
        reader.read_exact(&mut header).await?;
        let length = u32::from_le_bytes(header) as usize;
        if !(16..=MAX_FRAME_BYTES).contains(&length) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a consensus frame of {length} bytes"),
            ));
        }
        buffer.reserve(length);
        while buffer.len() < length {
            let wanted = (length - buffer.len()) as u64;
            if (&mut reader).take(wanted).read_buf(&mut buffer).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
        let frame = buffer.split_to(length).freeze();
        let mut from = [0u8; 16];
        from.copy_from_slice(&frame[..16]);
        let message = decode_message(frame.slice(16..))
            .map_err(|error| std::io::Error::new(std::io::ErrorKind::InvalidData, error))?;
        if !handle.receive(shoal_model::HostId(from), message).await {
            // The node stopped: closing the connection tells the peer.
            return Ok(());
        }
    }
}
