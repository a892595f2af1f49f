//! Internode messaging: two multiplexed TCP connections per peer and direction, one for
//! small messages and one for bulk.
//!
//! A frame is `u32 length | u8 protocol version | u64 request id | bincode payload |
//! attachment`. The attachment is empty except in the replies carrying a streamed chunk or
//! a scan chunk, whose megabytes of cells, packed (`shoal_replication::messages::packed`),
//! follow the encoding instead of being serialized into it: the source writes its buffer to
//! the socket as it is, and the destination takes them as a slice of the frame it read
//! (`Reply::attachment`). Packing and unpacking them is left to the threads that read and
//! use the cells, so a connection's tasks, which carry point reads too, only move bytes.
//!
//! The caller's side ([`Peers`]) keeps one connection per peer address and [`Lane`]: any
//! number of requests are in flight on it, each waiting for the response with its id; a
//! writer task coalesces every frame that is ready into one socket write, and each side's
//! reader reads frames through a buffer, so the frames that arrived together cost one
//! read.
//!
//! **Why two lanes.** A connection is one byte stream: a frame waits for every frame queued
//! before it to be written, read and decoded. A scan chunk's reply is megabytes; a point
//! read's is a few hundred bytes. On one connection, a point read answered while a
//! node streams chunks to the same peer waits behind them — milliseconds per chunk — which
//! is what seed 002's scheduling removes everywhere else. So, as Cassandra 4.0 splits small
//! and large messages over separate connections, the requests whose replies are bulk
//! ([`Message::lane`]: scan chunks and streaming) travel on a connection of their own, and
//! their replies are written, read and decoded there. The serving side ([`serve`]) runs the
//! requests of a connection concurrently as futures of the connection's own task (no task
//! per request, as for CQL connections — decision 0004) and coalesces the responses.
//!
//! With mutual TLS on ([`crate::tls::InternodeTls`]), both sides of every connection
//! present a certificate of the cluster's CA before the first frame.
//!
//! Messages are versioned by enum variant: a new message kind is a new variant, added at
//! the end. Outgoing connections leave from the node's own address. Bounded everywhere: a frame beyond [`MAX_FRAME_BYTES`] is refused before it is
//! sent (and closes the connection if a peer sends one anyway), the outgoing queue per
//! peer holds [`QUEUE_FRAMES`] frames, a connection serves at most
//! [`MAX_REQUESTS_RUNNING`] requests at once, and every call has a timeout.

use bytes::Bytes;
use futures::stream::FuturesUnordered;
use futures::StreamExt;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use shoal_cluster::{ClusterRequest, ClusterResponse};
use shoal_model::HostId;
use shoal_replication::{ReplicaRequest, ReplicaResponse};
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

/// The internode protocol version every frame carries; a peer speaking another one is
/// disconnected with a message saying so. 2: tablet maps carry the tablets to merge, and
/// the metadata log the commands that merge them. 3: a streamed chunk's cells travel as its
/// reply's attachment. 4: so do a scan chunk's, packed (`ReplicaResponse::PackedScanCells`).
pub const PROTOCOL_VERSION: u8 = 4;
/// `version | request id` after the length.
const HEADER_BYTES: usize = 9;
/// The largest frame a peer may send (hints and scan chunks stay far below).
pub const MAX_FRAME_BYTES: usize = 256 * 1024 * 1024;
/// Frames queued per peer connection before callers wait.
const QUEUE_FRAMES: usize = 8192;
/// Bytes a connection's reader takes from the socket at once: frames are read through a
/// buffer, so the small frames that arrived together cost one read, not three each
/// (length, header, body).
const READ_BUFFER_BYTES: usize = 64 * 1024;
/// Requests from one peer connection served at once; more wait their turn.
const MAX_REQUESTS_RUNNING: usize = 1024;
/// After a failed connect, calls to that peer fail at once for this long.
const RECONNECT_BACKOFF: Duration = Duration::from_millis(300);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// What a connection of the streaming lane sends first, before its frames: the serving
/// node then runs it on its streaming lane's runtime (`streaming::lane`), at streaming's
/// lower priority. Read as a frame's length it is far beyond [`MAX_FRAME_BYTES`], so no
/// frame is ever taken for it (nor it for a frame).
pub const STREAMING_LANE_PREFACE: [u8; 4] = *b"SLNE";

/// Which of a peer's connections a message (and its reply) travels on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lane {
    /// Everything whose reply is small: point reads and writes, Paxos, consensus
    /// forwarding, failure detection, metadata, operations.
    Small,
    /// Requests answered with megabytes: scan chunks and streaming.
    Bulk,
}

/// What one node asks another.
#[derive(Debug, Serialize, Deserialize)]
pub enum Message {
    Cluster(ClusterRequest),
    /// A replica request, routed by the tablet map of `topology_version` (the replica
    /// refuses it once a topology barrier has fenced that version out).
    Replica {
        request: ReplicaRequest,
        topology_version: u64,
    },
    /// Failure detection: "I am alive, and this is my schema".
    Ping {
        from: HostId,
        schema_version: [u8; 16],
        load_bytes: u64,
    },
    /// `shoal admin status`: every member as this node sees it.
    Status,
    /// `shoal admin repair`: repair these tables, coordinated by the receiving node.
    Repair {
        keyspace: Option<String>,
        table: Option<String>,
    },
    /// `shoal admin flush|compact|snapshot|…`: an operation on the receiving node.
    Operate(crate::operations::Operation),
    /// A round of the topology barrier for `version` (`shoal_replication::barrier`):
    /// settle (apply it, drain older requests), or raise the fence.
    Barrier {
        version: u64,
        fence: bool,
    },
    /// Streaming and the steps of a tablet migration (`crate::streaming`).
    Stream(crate::streaming::StreamRequest),
    /// A strongly consistent tablet's write or read, sent to its Raft leader
    /// (`crate::strong`).
    Strong(crate::strong::StrongRequest),
}

impl Message {
    /// The connection this message and its reply travel on.
    pub fn lane(&self) -> Lane {
        match self {
            Message::Replica {
                request: ReplicaRequest::ScanChunk { .. } | ReplicaRequest::ReadBefore { .. },
                ..
            }
            | Message::Stream(_) => Lane::Bulk,
            _ => Lane::Small,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
pub enum Reply {
    Cluster(ClusterResponse),
    Replica(ReplicaResponse),
    Pong {
        host_id: HostId,
        schema_version: [u8; 16],
        load_bytes: u64,
    },
    Status(Vec<MemberStatus>),
    Repaired(shoal_replication::RepairReport),
    /// What an operation did, as JSON text.
    Operated(String),
    Error(String),
    /// Done (a barrier passed).
    Done,
    Stream(crate::streaming::StreamReply),
    Strong(crate::strong::StrongReply),
}

impl Reply {
    /// Bytes that travel after the reply's encoding instead of inside it: a streamed
    /// chunk's cells ([`crate::streaming::Chunk`]).
    fn attachment(&self) -> Option<&Bytes> {
        match self {
            Reply::Stream(crate::streaming::StreamReply::Chunk(chunk)) => Some(&chunk.cells),
            Reply::Replica(ReplicaResponse::PackedScanCells { cells, .. }) => Some(cells),
            _ => None,
        }
    }

    fn attachment_mut(&mut self) -> Option<&mut Bytes> {
        match self {
            Reply::Stream(crate::streaming::StreamReply::Chunk(chunk)) => Some(&mut chunk.cells),
            Reply::Replica(ReplicaResponse::PackedScanCells { cells, .. }) => Some(cells),
            _ => None,
        }
    }
}

/// One line of `shoal admin status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberStatus {
    pub address: std::net::IpAddr,
    pub host_id: HostId,
    pub datacenter: String,
    pub rack: String,
    pub up: bool,
    pub state: String,
    /// Bytes stored, as the member reported last (`None`: never heard from).
    pub load_bytes: Option<u64>,
    pub tablets: usize,
    pub voter: bool,
}

/// Answers messages from peers.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, message: Message) -> Pin<Box<dyn Future<Output = Reply> + Send + '_>>;

    /// The node's consensus runtime, which takes the consensus streams that arrive on this
    /// port (`None`: such streams are closed).
    fn consensus(&self) -> Option<shoal_consensus::runtime::RaftHandle> {
        None
    }

    /// The runtime the connections of the streaming lane are served on
    /// ([`STREAMING_LANE_PREFACE`]); `None`: served as any other.
    fn streaming_lane(&self) -> Option<tokio::runtime::Handle> {
        None
    }
}

/// A frame ready to be written: its head (length, version, id and the encoded message)
/// and the attachment that follows it — a streamed chunk's cells, empty for every other
/// message — which is written from where it is rather than copied into the head.
struct Frame {
    head: Vec<u8>,
    attachment: Bytes,
}

impl Frame {
    fn len(&self) -> usize {
        self.head.len() + self.attachment.len()
    }
}

/// Encodes a frame; a message too large for a peer to accept is an error here, before it
/// is sent, rather than a closed connection that fails every request in flight on it.
fn encode_frame(id: u64, payload: &impl Serialize) -> Result<Vec<u8>, String> {
    encode_frame_within(id, payload, 0, MAX_FRAME_BYTES)
}

/// Encodes a reply, with its attachment ([`Reply::attachment`]) after it.
fn encode_reply(id: u64, reply: &Reply) -> Result<Frame, String> {
    let attachment = reply.attachment().cloned().unwrap_or_default();
    let head = encode_frame_within(id, reply, attachment.len(), MAX_FRAME_BYTES)?;
    Ok(Frame { head, attachment })
}

/// The head of a frame whose encoded `payload` is followed by `attachment_bytes`.
fn encode_frame_within(
    id: u64,
    payload: &impl Serialize,
    attachment_bytes: usize,
    max_frame_bytes: usize,
) -> Result<Vec<u8>, String> {
    let size =
        bincode::serialized_size(payload).map_err(|e| e.to_string())? as usize + attachment_bytes;
    if HEADER_BYTES + size > max_frame_bytes {
        return Err(format!(
            "an internode message of {size} bytes exceeds the frame limit of {max_frame_bytes} bytes"
        ));
    }
    // Serialized straight into the frame: a scan chunk's megabytes are copied once.
    let mut frame = Vec::with_capacity(4 + HEADER_BYTES + size - attachment_bytes);
    frame.extend_from_slice(&((HEADER_BYTES + size) as u32).to_be_bytes());
    frame.push(PROTOCOL_VERSION);
    frame.extend_from_slice(&id.to_be_bytes());
    bincode::serialize_into(&mut frame, payload).map_err(|e| e.to_string())?;
    Ok(frame)
}

/// Decodes a reply's frame body, giving it its attachment: the bytes after its encoding,
/// as a slice of the body (not a copy).
fn decode_reply(body: Vec<u8>) -> Reply {
    let mut reply: Reply = match bincode::deserialize(&body) {
        Ok(reply) => reply,
        Err(error) => return Reply::Error(format!("undecodable reply: {error}")),
    };
    if reply.attachment().is_none() {
        return reply;
    }
    let encoded = match bincode::serialized_size(&reply) {
        Ok(encoded) if encoded as usize <= body.len() => encoded as usize,
        _ => return Reply::Error("a reply shorter than its encoding".into()),
    };
    if let Some(attachment) = reply.attachment_mut() {
        *attachment = Bytes::from(body).slice(encoded..);
    }
    reply
}

/// Reads one frame: `(id, payload)`; `None` at a clean end of stream. A frame of another
/// protocol version, or of an impossible length, is an error that ends the connection.
async fn read_frame(
    reader: &mut (impl AsyncReadExt + Unpin),
) -> std::io::Result<Option<(u64, Vec<u8>)>> {
    let mut length = [0u8; 4];
    match reader.read_exact(&mut length).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let invalid = |message: String| std::io::Error::new(std::io::ErrorKind::InvalidData, message);
    let length = u32::from_be_bytes(length) as usize;
    if !(HEADER_BYTES..=MAX_FRAME_BYTES).contains(&length) {
        return Err(invalid(format!("internode frame of {length} bytes")));
    }
    let mut header = [0u8; HEADER_BYTES];
    reader.read_exact(&mut header).await?;
    if header[0] != PROTOCOL_VERSION {
        return Err(invalid(format!(
            "the peer speaks internode protocol version {}, this node version {PROTOCOL_VERSION}",
            header[0]
        )));
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&header[1..]);
    // Read into spare capacity rather than a zeroed buffer: a streamed chunk is megabytes,
    // and zeroing them first costs as much as copying them in.
    let body_length = length - HEADER_BYTES;
    let mut body = Vec::with_capacity(body_length);
    (&mut *reader)
        .take(body_length as u64)
        .read_to_end(&mut body)
        .await?;
    if body.len() < body_length {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(Some((u64::from_be_bytes(id), body)))
}

/// Frames of at least this many bytes are written as they are instead of being gathered
/// with others into the connection's write buffer.
const WRITE_DIRECTLY_BYTES: usize = 64 * 1024;

/// Writes queued frames, coalescing whatever small ones are ready into one write.
async fn write_frames(
    mut writer: impl AsyncWriteExt + Unpin,
    mut frames: mpsc::Receiver<Frame>,
) -> std::io::Result<()> {
    let mut buffer = Vec::with_capacity(64 * 1024);
    while let Some(first) = frames.recv().await {
        let mut next = Some(first);
        // Small frames waiting together leave in one write; a large one (a scan chunk, a
        // stream chunk) leaves from where it is, not copied into the buffer first.
        while let Some(frame) = next.take() {
            if frame.len() >= WRITE_DIRECTLY_BYTES {
                buffer.extend_from_slice(&frame.head);
                writer.write_all(&buffer).await?;
                buffer.clear();
                writer.write_all(&frame.attachment).await?;
            } else {
                buffer.extend_from_slice(&frame.head);
                buffer.extend_from_slice(&frame.attachment);
            }
            if buffer.len() < 1 << 20 {
                next = frames.try_recv().ok();
            }
        }
        if !buffer.is_empty() {
            writer.write_all(&buffer).await?;
            buffer.clear();
        }
        // Over TLS the last records may still be in rustls' buffer: send them now.
        writer.flush().await?;
    }
    Ok(())
}

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Reply>>>>;

struct PeerConnection {
    frames: mpsc::Sender<Frame>,
    pending: Pending,
    closed: Arc<AtomicBool>,
    /// Messages answered, and messages that got no answer in time or whose connection
    /// closed first (`shoal admin netstats`).
    completed: AtomicU64,
    dropped: AtomicU64,
}

/// The messages exchanged with one peer over this node's connections to it (both lanes).
#[derive(Debug, Clone, serde::Serialize)]
pub struct PeerStatistics {
    pub address: SocketAddr,
    /// The small-message connection is up.
    pub connected: bool,
    /// Waiting for an answer now.
    pub pending: usize,
    pub completed: u64,
    pub dropped: u64,
}

/// Outgoing connections to peers.
#[derive(Default)]
pub struct Peers {
    /// The address outgoing connections leave from (the node's own, as in Cassandra, so
    /// that a firewall rule can cut one node off by address); `None`: the system's choice.
    source: Option<std::net::IpAddr>,
    connections: Mutex<HashMap<(SocketAddr, Lane), Arc<PeerConnection>>>,
    failed_connects: Mutex<HashMap<SocketAddr, Instant>>,
    next_id: AtomicU64,
    /// Set on shutdown: no new connections.
    stopped: AtomicBool,
    /// Mutual TLS with every peer, when the cluster uses it.
    tls: Option<Arc<crate::tls::InternodeTls>>,
    /// Sent on every new connection before its first frame
    /// ([`Peers::for_streaming_lane`]).
    preface: Option<[u8; 4]>,
    /// The runtime connections are opened on, whoever asks ([`Peers::opened_on`]);
    /// `None`: the asker's.
    home: Option<tokio::runtime::Handle>,
}

/// Connects to `to` from `source` (any port), or from wherever the system picks.
async fn connect_from(
    source: Option<std::net::IpAddr>,
    to: SocketAddr,
) -> std::io::Result<TcpStream> {
    let Some(source) = source else {
        return TcpStream::connect(to).await;
    };
    let socket = if source.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.bind(SocketAddr::new(source, 0))?;
    socket.connect(to).await
}

/// Why an outgoing connection could not be opened.
enum OpenFailure {
    /// The peer could not be reached (no retry before [`RECONNECT_BACKOFF`]).
    Unreachable(String),
    Other(String),
}

/// Connects to `to`, shakes hands (TLS, when the cluster uses it), writes the lane's
/// preface and starts the connection's tasks on the current runtime.
async fn open_connection(
    source: Option<std::net::IpAddr>,
    tls: Option<Arc<crate::tls::InternodeTls>>,
    preface: Option<[u8; 4]>,
    to: SocketAddr,
) -> Result<Arc<PeerConnection>, OpenFailure> {
    let connect = connect_from(source, to);
    let socket = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
        Ok(Ok(socket)) => socket,
        Ok(Err(error)) => {
            return Err(OpenFailure::Unreachable(format!(
                "cannot connect to {to}: {error}"
            )))
        }
        Err(_) => {
            return Err(OpenFailure::Unreachable(format!(
                "connecting to {to} timed out"
            )))
        }
    };
    let _ = socket.set_nodelay(true);
    match &tls {
        None => {
            let mut socket = socket;
            send_preface(preface, &mut socket, to)
                .await
                .map_err(OpenFailure::Other)?;
            let (reader, writer) = socket.into_split();
            Ok(start_connection(reader, writer))
        }
        Some(tls) => {
            let connector = tls.connector();
            let name = rustls::pki_types::ServerName::IpAddress(to.ip().into());
            let handshake = connector.connect(name, crate::tls::buffered(socket));
            let mut stream = match tokio::time::timeout(CONNECT_TIMEOUT, handshake).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(error)) => {
                    return Err(OpenFailure::Unreachable(format!(
                        "TLS with {to} failed: {error}"
                    )))
                }
                Err(_) => {
                    return Err(OpenFailure::Unreachable(format!(
                        "the TLS handshake with {to} timed out"
                    )))
                }
            };
            send_preface(preface, &mut stream, to)
                .await
                .map_err(OpenFailure::Other)?;
            let (reader, writer) = tokio::io::split(stream);
            Ok(start_connection(reader, writer))
        }
    }
}

/// Writes a connection's preface, if its lane has one.
async fn send_preface(
    preface: Option<[u8; 4]>,
    stream: &mut (impl AsyncWriteExt + Unpin),
    to: SocketAddr,
) -> Result<(), String> {
    let Some(preface) = preface else {
        return Ok(());
    };
    let written = async {
        stream.write_all(&preface).await?;
        stream.flush().await
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, written).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(error)) => Err(format!("cannot write to {to}: {error}")),
        Err(_) => Err(format!("writing to {to} timed out")),
    }
}

/// Starts the writer and reader tasks of an outgoing connection.
fn start_connection(
    reader: impl AsyncReadExt + Unpin + Send + 'static,
    writer: impl AsyncWriteExt + Unpin + Send + 'static,
) -> Arc<PeerConnection> {
    let (frames, outgoing) = mpsc::channel(QUEUE_FRAMES);
    let pending: Pending = Arc::default();
    let closed = Arc::new(AtomicBool::new(false));
    let connection = Arc::new(PeerConnection {
        frames,
        pending: Arc::clone(&pending),
        closed: Arc::clone(&closed),
        completed: AtomicU64::new(0),
        dropped: AtomicU64::new(0),
    });
    let writer_closed = Arc::clone(&closed);
    tokio::spawn(async move {
        let _ = write_frames(writer, outgoing).await;
        writer_closed.store(true, Ordering::Release);
    });
    tokio::spawn(async move {
        let mut reader = tokio::io::BufReader::with_capacity(READ_BUFFER_BYTES, reader);
        while let Ok(Some((id, payload))) = read_frame(&mut reader).await {
            let Some(waiter) = pending.lock().remove(&id) else {
                continue;
            };
            let _ = waiter.send(decode_reply(payload));
        }
        closed.store(true, Ordering::Release);
        // Dropping the senders fails every call still waiting.
        pending.lock().clear();
    });
    connection
}

impl Peers {
    /// Outgoing connections leaving from `source`, the node's own address.
    pub fn from_address(source: std::net::IpAddr) -> Peers {
        Peers {
            source: (!source.is_unspecified()).then_some(source),
            ..Peers::default()
        }
    }

    /// Every connection made from now on is mutual TLS.
    pub fn with_tls(mut self, tls: Arc<crate::tls::InternodeTls>) -> Peers {
        self.tls = Some(tls);
        self
    }

    /// Every connection is opened on `runtime` and its tasks run there, whichever thread
    /// asks for it first (a client connection's thread, say: see `connection_threads`).
    pub fn opened_on(mut self, runtime: tokio::runtime::Handle) -> Peers {
        self.home = Some(runtime);
        self
    }

    /// Connections of the streaming lane: each opens with [`STREAMING_LANE_PREFACE`], so
    /// the peer serves it on its streaming runtime. Its tasks run on the runtime that
    /// opens it (the destination's streaming jobs run on this node's).
    pub fn for_streaming_lane(mut self) -> Peers {
        self.preface = Some(STREAMING_LANE_PREFACE);
        self
    }

    async fn connection(&self, to: SocketAddr, lane: Lane) -> Result<Arc<PeerConnection>, String> {
        if let Some(existing) = self.connections.lock().get(&(to, lane)) {
            if !existing.closed.load(Ordering::Acquire) {
                return Ok(Arc::clone(existing));
            }
        }
        if self.stopped.load(Ordering::Acquire) {
            return Err("this node is shutting down".into());
        }
        if let Some(failed) = self.failed_connects.lock().get(&to) {
            if failed.elapsed() < RECONNECT_BACKOFF {
                return Err(format!("{to} is unreachable"));
            }
        }
        let open = open_connection(self.source, self.tls.clone(), self.preface, to);
        // Opened on the home runtime when there is one: the connection's tasks and socket
        // belong there, not to whichever thread asked first (a client connection's).
        let opened = match &self.home {
            Some(home) => home
                .spawn(open)
                .await
                .unwrap_or_else(|_| Err(OpenFailure::Other("the node is shutting down".into()))),
            None => open.await,
        };
        let connection = match opened {
            Ok(connection) => connection,
            Err(OpenFailure::Unreachable(error)) => {
                self.failed_connects.lock().insert(to, Instant::now());
                return Err(error);
            }
            Err(OpenFailure::Other(error)) => return Err(error),
        };
        self.failed_connects.lock().remove(&to);
        self.connections
            .lock()
            .insert((to, lane), Arc::clone(&connection));
        Ok(connection)
    }

    /// Sends `message` to `to` and waits for the reply, at most `timeout`.
    pub async fn call(
        &self,
        to: SocketAddr,
        message: &Message,
        timeout: Duration,
    ) -> Result<Reply, String> {
        let deadline = tokio::time::Instant::now() + timeout;
        let connection = tokio::time::timeout_at(deadline, self.connection(to, message.lane()))
            .await
            .map_err(|_| format!("connecting to {to} timed out"))??;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = Frame {
            head: encode_frame(id, message)?,
            attachment: Bytes::new(),
        };
        let (sender, receiver) = oneshot::channel();
        connection.pending.lock().insert(id, sender);
        let outcome = tokio::time::timeout_at(deadline, async {
            connection
                .frames
                .send(frame)
                .await
                .map_err(|_| format!("the connection to {to} closed"))?;
            receiver
                .await
                .map_err(|_| format!("the connection to {to} closed"))
        })
        .await;
        let (counter, result) = match outcome {
            Ok(Ok(reply)) => (&connection.completed, Ok(reply)),
            Ok(Err(error)) => (&connection.dropped, Err(error)),
            Err(_) => {
                connection.pending.lock().remove(&id);
                let error = format!("{to} did not answer within {timeout:?}");
                (&connection.dropped, Err(error))
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
        result
    }

    /// The messages exchanged with each peer over the current connections, by address.
    pub fn statistics(&self) -> Vec<PeerStatistics> {
        let mut by_address: std::collections::BTreeMap<SocketAddr, PeerStatistics> =
            std::collections::BTreeMap::new();
        for ((address, lane), connection) in self.connections.lock().iter() {
            let peer = by_address
                .entry(*address)
                .or_insert_with(|| PeerStatistics {
                    address: *address,
                    connected: false,
                    pending: 0,
                    completed: 0,
                    dropped: 0,
                });
            if *lane == Lane::Small {
                peer.connected = !connection.closed.load(Ordering::Acquire);
            }
            peer.pending += connection.pending.lock().len();
            peer.completed += connection.completed.load(Ordering::Relaxed);
            peer.dropped += connection.dropped.load(Ordering::Relaxed);
        }
        by_address.into_values().collect()
    }

    /// Closes every connection and refuses new ones.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.connections.lock().clear();
    }
}

/// Accepts peers' connections and answers their messages until `shutdown` fires.
/// With `tls`, every peer must complete a mutual TLS handshake first.
pub async fn serve(
    listener: TcpListener,
    handler: Arc<dyn Handler>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
    tls: Option<Arc<crate::tls::InternodeTls>>,
) {
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            accepted = listener.accept() => {
                let Ok((socket, peer)) = accepted else { continue };
                let _ = socket.set_nodelay(true);
                let handler = Arc::clone(&handler);
                let tls = tls.as_ref().map(|tls| tls.acceptor());
                let mut connection_shutdown = shutdown.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        _ = serve_socket(socket, peer, handler, tls) => {}
                        _ = connection_shutdown.changed() => {}
                    }
                });
            }
        }
    }
}

async fn serve_socket(
    socket: TcpStream,
    peer: SocketAddr,
    handler: Arc<dyn Handler>,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    let Some(acceptor) = tls else {
        let Some((socket, first, runtime)) = consensus_or_first_bytes(socket, &handler).await
        else {
            return;
        };
        let (reader, writer) = socket.into_split();
        let reader = std::io::Cursor::new(first).chain(reader);
        return serve_connection_on(runtime, reader, writer, handler).await;
    };
    match tokio::time::timeout(
        CONNECT_TIMEOUT * 10,
        acceptor.accept(crate::tls::buffered(socket)),
    )
    .await
    {
        Ok(Ok(stream)) => {
            // Inside the TLS session, the same kinds of stream as without.
            let Some((stream, first, runtime)) = consensus_or_first_bytes(stream, &handler).await
            else {
                return;
            };
            let (reader, writer) = tokio::io::split(stream);
            let reader = std::io::Cursor::new(first).chain(reader);
            serve_connection_on(runtime, reader, writer, handler).await
        }
        Ok(Err(error)) => {
            tracing::warn!(%peer, %error, "refused an internode connection: TLS failed")
        }
        Err(_) => tracing::warn!(%peer, "refused an internode connection: TLS handshake timed out"),
    }
}

/// Reads a new stream's first four bytes. A consensus stream opens with its preface and is
/// served here by the node's consensus runtime until it closes (`None`); an internode
/// connection opens with a frame's length (never a preface's value), and is handed back
/// with those bytes — a streaming-lane connection after its preface, with the runtime it
/// is to be served on.
async fn consensus_or_first_bytes<S: AsyncRead + Unpin>(
    mut stream: S,
    handler: &Arc<dyn Handler>,
) -> Option<(S, [u8; 4], Option<tokio::runtime::Handle>)> {
    let mut first = [0u8; 4];
    stream.read_exact(&mut first).await.ok()?;
    if first == shoal_consensus::runtime::tcp::STREAM_PREFACE {
        if let Some(consensus) = handler.consensus() {
            shoal_consensus::runtime::tcp::serve_stream(stream, consensus).await;
        }
        return None;
    }
    if first == STREAMING_LANE_PREFACE {
        stream.read_exact(&mut first).await.ok()?;
        return Some((stream, first, handler.streaming_lane()));
    }
    Some((stream, first, None))
}

/// Serves a connection on `runtime` (here when `None`). Its tasks go with it; if this
/// future is dropped (the node shuts down), the connection ends too.
async fn serve_connection_on(
    runtime: Option<tokio::runtime::Handle>,
    reader: impl AsyncReadExt + Unpin + Send + 'static,
    writer: impl AsyncWriteExt + Unpin + Send + 'static,
    handler: Arc<dyn Handler>,
) {
    let Some(runtime) = runtime else {
        return serve_connection(reader, writer, handler).await;
    };
    let mut task = crate::AbortOnDrop(runtime.spawn(serve_connection(reader, writer, handler)));
    let _ = (&mut task.0).await;
}

async fn serve_connection(
    reader: impl AsyncReadExt + Unpin + Send + 'static,
    writer: impl AsyncWriteExt + Unpin + Send + 'static,
    handler: Arc<dyn Handler>,
) {
    let (frames, outgoing) = mpsc::channel::<Frame>(QUEUE_FRAMES);
    let writer_task = tokio::spawn(write_frames(writer, outgoing));
    // Frames are read by their own task: reading is not cancellation-safe, so it must not
    // race the replies in a select.
    let (requests_tx, mut requests) = mpsc::channel::<(u64, Vec<u8>)>(QUEUE_FRAMES);
    let reader_task = tokio::spawn(async move {
        let mut reader = tokio::io::BufReader::with_capacity(READ_BUFFER_BYTES, reader);
        loop {
            match read_frame(&mut reader).await {
                Ok(Some(frame)) => {
                    if requests_tx.send(frame).await.is_err() {
                        break;
                    }
                }
                Ok(None) => break,
                Err(error) => {
                    if error.kind() == std::io::ErrorKind::InvalidData {
                        tracing::warn!(%error, "closing an internode connection");
                    }
                    break;
                }
            }
        }
    });
    let mut running = FuturesUnordered::new();
    let mut reading = true;
    loop {
        tokio::select! {
            // At most MAX_REQUESTS_RUNNING at once: beyond that, frames wait in the bounded
            // queue and then in the socket, and the peer's sends slow down (backpressure).
            frame = requests.recv(), if reading && running.len() < MAX_REQUESTS_RUNNING => match frame {
                Some((id, payload)) => {
                    let handler = Arc::clone(&handler);
                    running.push(async move {
                        let reply = match bincode::deserialize::<Message>(&payload) {
                            Ok(message) => handler.handle(message).await,
                            Err(e) => Reply::Error(format!("undecodable message: {e}")),
                        };
                        (id, reply)
                    });
                }
                None => reading = false,
            },
            Some((id, reply)) = running.next(), if !running.is_empty() => {
                // A reply that cannot be sent becomes an error the caller hears at once.
                let frame = encode_reply(id, &reply).or_else(|error| {
                    tracing::warn!(%error, "cannot send an internode reply");
                    encode_reply(id, &Reply::Error(error))
                });
                match frame {
                    Ok(frame) => {
                        if frames.send(frame).await.is_err() {
                            break;
                        }
                    }
                    Err(error) => tracing::warn!(%error, "cannot encode an internode reply"),
                }
            }
            else => break,
        }
    }
    reader_task.abort();
    drop(frames);
    let _ = writer_task.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_frame_is_read_whole_and_a_frame_cut_short_is_an_error() {
        let reply = Reply::Error("x".repeat(100_000));
        let frame = encode_frame(7, &reply).unwrap();
        let mut whole = &frame[..];
        let (id, payload) = read_frame(&mut whole).await.unwrap().unwrap();
        assert_eq!(id, 7);
        assert!(
            matches!(bincode::deserialize(&payload).unwrap(), Reply::Error(text) if text.len() == 100_000)
        );
        assert!(
            read_frame(&mut whole).await.unwrap().is_none(),
            "a clean end after it"
        );

        let mut cut = &frame[..frame.len() - 1];
        let error = read_frame(&mut cut).await.unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::UnexpectedEof);
    }

    /// `reply` sent as frame `id` and read back: its head must not hold an attachment.
    async fn sent_and_read(id: u64, reply: &Reply) -> Reply {
        let frame = encode_reply(id, reply).unwrap();
        assert!(frame.head.len() < 64, "no attachment in the head");
        let mut bytes = frame.head.clone();
        bytes.extend_from_slice(&frame.attachment);
        let (read_id, body) = read_frame(&mut bytes.as_slice()).await.unwrap().unwrap();
        assert_eq!(read_id, id);
        decode_reply(body)
    }

    #[tokio::test]
    async fn streamed_and_scan_chunks_travel_as_their_replys_attachment() {
        let mut cells = Vec::new();
        shoal_replication::messages::packed::pack(&mut cells, b"key", &[7; 100_000]);
        shoal_replication::messages::packed::pack(&mut cells, b"other", b"value");
        let reply = Reply::Stream(crate::streaming::StreamReply::Chunk(
            crate::streaming::Chunk {
                cells: Bytes::from(cells.clone()),
                done: true,
            },
        ));
        let Reply::Stream(crate::streaming::StreamReply::Chunk(chunk)) =
            sent_and_read(5, &reply).await
        else {
            panic!("not a chunk");
        };
        assert!(chunk.done);
        assert_eq!(&chunk.cells[..], &cells[..]);

        // So does a scan chunk's answer for another coordinator.
        let reply = Reply::Replica(ReplicaResponse::PackedScanCells {
            cells: Bytes::from(cells.clone()),
            complete: true,
            estimates: None,
        });
        let Reply::Replica(ReplicaResponse::PackedScanCells {
            cells: read,
            complete,
            ..
        }) = sent_and_read(7, &reply).await
        else {
            panic!("not a scan chunk");
        };
        assert!(complete);
        assert_eq!(&read[..], &cells[..]);

        // Replies without one decode as before.
        assert!(encode_reply(6, &Reply::Done).unwrap().attachment.is_empty());
        assert!(matches!(sent_and_read(6, &Reply::Done).await, Reply::Done));
    }

    /// Answers every message with the name of the thread that served it.
    struct ThreadNames {
        lane: crate::streaming::lane::LaneRuntime,
    }

    impl Handler for ThreadNames {
        fn handle(&self, _: Message) -> Pin<Box<dyn Future<Output = Reply> + Send + '_>> {
            Box::pin(async {
                Reply::Error(std::thread::current().name().unwrap_or("").to_string())
            })
        }

        fn streaming_lane(&self) -> Option<tokio::runtime::Handle> {
            Some(self.lane.handle().clone())
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn streaming_lane_connections_are_served_on_the_lanes_runtime() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let handler = Arc::new(ThreadNames {
            lane: crate::streaming::lane::LaneRuntime::start(0).unwrap(),
        });
        let (_stop, stopped) = tokio::sync::watch::channel(false);
        tokio::spawn(serve(listener, handler, stopped, None));
        let served_on = |peers: Peers| async move {
            let next = Message::Stream(crate::streaming::StreamRequest::Next { session: 1 });
            match peers.call(address, &next, Duration::from_secs(10)).await {
                Ok(Reply::Error(thread)) => thread,
                other => panic!("unexpected answer {other:?}"),
            }
        };
        assert_eq!(
            served_on(Peers::default().for_streaming_lane()).await,
            "shoal-stream-io"
        );
        // The same message on an ordinary connection (its bulk lane) stays on the workers.
        assert_ne!(served_on(Peers::default()).await, "shoal-stream-io");
    }

    #[test]
    fn a_connection_opened_on_its_home_runtime_outlives_the_runtime_that_asked() {
        let home = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = home.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
        let address = listener.local_addr().unwrap();
        let handler = Arc::new(ThreadNames {
            lane: crate::streaming::lane::LaneRuntime::start(0).unwrap(),
        });
        let (_stop, stopped) = tokio::sync::watch::channel(false);
        home.spawn(serve(listener, handler, stopped, None));
        let peers = Peers::default().opened_on(home.handle().clone());
        let call_from_a_runtime_of_its_own = || {
            let asking = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let message = Message::Stream(crate::streaming::StreamRequest::Next { session: 1 });
            asking.block_on(peers.call(address, &message, Duration::from_secs(10)))
        };
        // The first call opens the connection, from a runtime that is gone right after...
        assert!(matches!(
            call_from_a_runtime_of_its_own(),
            Ok(Reply::Error(_))
        ));
        // ...and the connection it opened still carries the next call.
        assert!(matches!(
            call_from_a_runtime_of_its_own(),
            Ok(Reply::Error(_))
        ));
        assert_eq!(peers.connections.lock().len(), 1);
    }

    #[test]
    fn a_message_over_the_frame_limit_is_refused_before_it_is_sent() {
        let reply = Reply::Error("x".repeat(1000));
        let error = encode_frame_within(1, &reply, 0, 500).unwrap_err();
        assert!(error.contains("exceeds the frame limit"), "{error}");
        assert!(encode_frame_within(1, &reply, 0, 2000).is_ok());
        let error = encode_frame_within(1, &reply, 1000, 2000).unwrap_err();
        assert!(error.contains("exceeds the frame limit"), "{error}");
    }

    #[test]
    fn scan_chunks_and_streaming_travel_apart_from_small_messages() {
        let replica = |request| Message::Replica {
            request,
            topology_version: 1,
        };
        let bulk = [
            replica(ReplicaRequest::ScanChunk {
                lower: b"a".to_vec(),
                upper: b"z".to_vec(),
                limit: 4096,
                scan: shoal_replication::ScanTicket::now(1, 100),
            }),
            replica(ReplicaRequest::ReadBefore {
                lower: b"a".to_vec(),
                upper: b"z".to_vec(),
                limit: 4096,
            }),
            Message::Stream(crate::streaming::StreamRequest::Next { session: 1 }),
        ];
        for message in &bulk {
            assert_eq!(message.lane(), Lane::Bulk, "{message:?}");
        }
        let small = [
            replica(ReplicaRequest::Read {
                lower: b"a".to_vec(),
                upper: b"z".to_vec(),
                limit: u32::MAX,
            }),
            replica(ReplicaRequest::Apply(vec![(b"k".to_vec(), b"c".to_vec())])),
            Message::Ping {
                from: HostId([1; 16]),
                schema_version: [0; 16],
                load_bytes: 0,
            },
            Message::Status,
        ];
        for message in &small {
            assert_eq!(message.lane(), Lane::Small, "{message:?}");
        }
    }

    #[tokio::test]
    async fn frames_round_trip_and_other_versions_are_refused() {
        let frame = encode_frame(42, &Message::Status).unwrap();
        let (id, payload) = read_frame(&mut frame.as_slice()).await.unwrap().unwrap();
        assert_eq!(id, 42);
        assert!(matches!(
            bincode::deserialize::<Message>(&payload).unwrap(),
            Message::Status
        ));
        let mut other_version = frame.clone();
        other_version[4] = PROTOCOL_VERSION + 1;
        let error = read_frame(&mut other_version.as_slice()).await.unwrap_err();
        assert!(error.to_string().contains("internode protocol version"));
        let mut too_short = frame;
        too_short[..4].copy_from_slice(&3u32.to_be_bytes());
        assert!(read_frame(&mut too_short.as_slice()).await.is_err());
        assert!(read_frame(&mut [].as_slice()).await.unwrap().is_none());
    }

    /// A valid message of most kinds, encoded as it travels.
    fn valid_messages() -> Vec<Vec<u8>> {
        let cells = vec![(b"key".to_vec(), b"cell".to_vec())];
        let messages = [
            Message::Replica {
                request: ReplicaRequest::Apply(cells.clone()),
                topology_version: 3,
            },
            Message::Replica {
                request: ReplicaRequest::Read {
                    lower: b"a".to_vec(),
                    upper: b"z".to_vec(),
                    limit: 10,
                },
                topology_version: 3,
            },
            Message::Stream(crate::streaming::StreamRequest::Next { session: 9 }),
            Message::Ping {
                from: HostId([1; 16]),
                schema_version: [2; 16],
                load_bytes: 3,
            },
            Message::Repair {
                keyspace: Some("ks".into()),
                table: None,
            },
        ];
        messages
            .iter()
            .map(|message| encode_frame(7, message).unwrap())
            .collect()
    }

    proptest::proptest! {
        /// Whatever bytes a peer sends, framing and decoding answer with a message or an
        /// error: no panic, and no allocation beyond what the frame's bytes hold
        /// (`bincode::deserialize` from a slice checks every length against the bytes
        /// left).
        #[test]
        fn arbitrary_internode_bytes_are_refused_or_decoded(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256),
        ) {
            let _ = bincode::deserialize::<Message>(&bytes);
            let _ = bincode::deserialize::<Reply>(&bytes);
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            if let Ok(Some((_, payload))) = runtime.block_on(read_frame(&mut bytes.as_slice())) {
                let _ = bincode::deserialize::<Message>(&payload);
            }
        }

        #[test]
        fn mutated_internode_frames_are_refused_or_decoded(
            which in 0usize..5,
            flips in proptest::collection::vec((proptest::prelude::any::<usize>(), proptest::prelude::any::<u8>()), 1..5),
            keep in 0usize..128,
        ) {
            let mut frame = valid_messages().swap_remove(which);
            for (position, byte) in flips {
                let index = position % frame.len();
                frame[index] = byte;
            }
            frame.truncate(keep);
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            if let Ok(Some((_, payload))) = runtime.block_on(read_frame(&mut frame.as_slice())) {
                let _ = bincode::deserialize::<Message>(&payload);
            }
        }
    }
}
