//! One TCP stream per peer node and direction, carrying every group's messages: a frame is
//! `u32 length | sender host id (16) | message` ([`crate::codec`]). A writer task per peer
//! writes whatever frames are queued with one vectored write, so epoch batches stream
//! back to back without waiting for their acknowledgements. Outgoing connections leave
//! from the node's own address (so a firewall rule can cut one node off by address).
//!
//! A stream opens with [`STREAM_PREFACE`], so a listener that serves another protocol too
//! (a server's internode port) can tell a consensus stream by its first four bytes and hand
//! it to [`serve_stream`]. Peers are found through a resolver each time a connection is
//! made, so nodes that join later, or move, are reached without restarting anything.
//!
//! Bounded: [`PEER_QUEUE_FRAMES`] frames wait per peer (past that [`Transport::send`]
//! refuses and the protocol resends later), and a frame over [`MAX_FRAME_BYTES`] closes
//! the connection.
//!
//! Encryption is the embedder's: [`TcpTransport::securing`] hands every new connection to
//! a [`Secure`] function (a server does its internode mutual-TLS handshake there) before
//! the preface is written, so the preface and every frame travel inside it. The receiving
//! side ([`serve_stream`]) reads any byte stream, plain or decrypted.

use super::{RaftHandle, Transport};
use crate::codec::{decode_message, encode_message, encoded_message_len};
use crate::message::Message;
use crate::NodeId;
use bytes::BytesMut;
use std::collections::HashMap;
use std::future::Future;
use std::io::IoSlice;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
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
/// Connecting to a peer (and securing the connection) gives up after this long, so a peer
/// cut off by a firewall is tried again soon after it is back.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The first bytes of every consensus stream. Read as the big-endian length an internode
/// frame starts with, it is beyond any frame's limit, so the two cannot be confused.
pub const STREAM_PREFACE: [u8; 4] = *b"SRFT";

/// Where a peer node listens now (`None`: not known, the messages for it are dropped).
pub type Resolver = Arc<dyn Fn(NodeId) -> Option<SocketAddr> + Send + Sync>;

/// The writing end of a connection to a peer, as [`Secure`] returns it.
pub type PeerStream = Box<dyn AsyncWrite + Send + Unpin>;

/// Turns a freshly connected stream to the peer at the address into the stream frames are
/// written to (a TLS handshake, say); an error closes the connection and it is tried again.
pub type Secure = Arc<
    dyn Fn(
            TcpStream,
            SocketAddr,
        ) -> Pin<Box<dyn Future<Output = std::io::Result<PeerStream>> + Send>>
        + Send
        + Sync,
>;

/// The sending side: a queue and a writer task per peer, started on the first message.
pub struct TcpTransport {
    me: NodeId,
    source: IpAddr,
    resolve: Resolver,
    secure: Option<Secure>,
    queues: Mutex<HashMap<NodeId, mpsc::Sender<Vec<u8>>>>,
}

impl TcpTransport {
    /// A transport to the fixed `peers` (host id → address), connecting from `source`.
    pub fn start(me: NodeId, source: IpAddr, peers: HashMap<NodeId, SocketAddr>) -> TcpTransport {
        TcpTransport::resolving(
            me,
            source,
            Arc::new(move |peer: NodeId| peers.get(&peer).copied()),
        )
    }

    /// A transport that asks `resolve` where a peer is each time it connects to it.
    pub fn resolving(me: NodeId, source: IpAddr, resolve: Resolver) -> TcpTransport {
        TcpTransport {
            me,
            source,
            resolve,
            secure: None,
            queues: Mutex::new(HashMap::new()),
        }
    }

    /// Every connection made from now on passes through `secure` before anything is
    /// written to it.
    pub fn securing(mut self, secure: Secure) -> TcpTransport {
        self.secure = Some(secure);
        self
    }

    /// The queue to `peer`, and its writer task the first time (on the caller's runtime).
    fn queue_to(&self, peer: NodeId) -> mpsc::Sender<Vec<u8>> {
        let mut queues = self
            .queues
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        queues
            .entry(peer)
            .or_insert_with(|| {
                let (frames, queue) = mpsc::channel(PEER_QUEUE_FRAMES);
                let dial = Dial {
                    source: self.source,
                    peer,
                    resolve: Arc::clone(&self.resolve),
                    secure: self.secure.clone(),
                };
                tokio::spawn(write_to_peer(dial, queue));
                frames
            })
            .clone()
    }
}

impl Transport for TcpTransport {
    fn send(&self, to: NodeId, message: &Message) -> bool {
        if to == self.me {
            return false;
        }
        let queue = self.queue_to(to);
        let mut frame = Vec::with_capacity(20 + encoded_message_len(message));
        frame.extend_from_slice(&[0; 4]);
        frame.extend_from_slice(&self.me.0);
        encode_message(message, &mut frame);
        let length = (frame.len() - 4) as u32;
        frame[..4].copy_from_slice(&length.to_le_bytes());
        queue.try_send(frame).is_ok()
    }
}

/// How to reach one peer: from which address, where it is, and how to secure the stream.
struct Dial {
    source: IpAddr,
    peer: NodeId,
    resolve: Resolver,
    secure: Option<Secure>,
}

impl Dial {
    /// A new connection to the peer, secured and with the preface written.
    async fn connect(&self) -> std::io::Result<PeerStream> {
        let address = (self.resolve)(self.peer).ok_or(std::io::ErrorKind::NotFound)?;
        let socket = if address.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        socket.bind(SocketAddr::new(self.source, 0))?;
        let stream = socket.connect(address).await?;
        stream.set_nodelay(true)?;
        let mut stream: PeerStream = match &self.secure {
            None => Box::new(stream),
            Some(secure) => secure(stream, address).await?,
        };
        stream.write_all(&STREAM_PREFACE).await?;
        Ok(stream)
    }
}

/// Keeps a connection to one peer and writes its frames; frames queued while it is down
/// are dropped (the protocol resends what matters).
async fn write_to_peer(dial: Dial, mut queue: mpsc::Receiver<Vec<u8>>) {
    let mut frames: Vec<Vec<u8>> = Vec::with_capacity(WRITE_COALESCE_FRAMES);
    'connect: loop {
        let mut stream = match tokio::time::timeout(CONNECT_TIMEOUT, dial.connect()).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(_)) | Err(_) => {
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

/// Writes `frames` back to back with vectored writes (no copy into one buffer), then
/// flushes (a TLS stream may hold the last record back until then).
async fn write_frames(stream: &mut PeerStream, frames: &[Vec<u8>]) -> std::io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = frames.iter().map(|frame| IoSlice::new(frame)).collect();
    let mut remaining = &mut slices[..];
    while !remaining.is_empty() {
        let written = stream.write_vectored(remaining).await?;
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut remaining, written);
    }
    stream.flush().await
}

/// Accepts peers' connections on a listener of its own and hands every message to
/// `handle`, in arrival order.
pub async fn serve(listener: TcpListener, handle: RaftHandle) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let handle = handle.clone();
        tokio::spawn(async move {
            let mut preface = [0u8; 4];
            let read = stream.read_exact(&mut preface).await;
            if read.is_err() || preface != STREAM_PREFACE {
                tracing::debug!("a connection that is not a consensus stream was closed");
                return;
            }
            serve_stream(stream, handle).await;
        });
    }
}

/// Reads a peer's stream whose [`STREAM_PREFACE`] was already read (by a listener that
/// serves other protocols too) until it closes or the node stops.
pub async fn serve_stream(stream: impl AsyncRead + Unpin, handle: RaftHandle) {
    if let Err(error) = read_from_peer(stream, handle).await {
        tracing::debug!(%error, "a consensus connection closed");
    }
}

async fn read_from_peer(stream: impl AsyncRead + Unpin, handle: RaftHandle) -> std::io::Result<()> {
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
