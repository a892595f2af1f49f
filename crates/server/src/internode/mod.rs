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
//!
//! The code: `frame` (encoding and reading frames), `peers` (the caller's side) and
//! `serving` (the serving side); the messages and the [`Handler`] are here.

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

mod frame;
mod peers;
mod serving;

use frame::*;
pub use peers::{CallError, PeerStatistics, Peers};
pub use serving::serve;

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

/// The send and receive buffers of a streaming-lane socket, on both ends (Linux doubles
/// the figure, within `net.core.wmem_max` and `rmem_max`). Streaming's threads run at the
/// idle priority, but a thread inside a system call is not preempted on kernels built
/// without kernel preemption (`PREEMPT_NONE`, common on servers): a client request woken
/// on that core waits until the call returns. A socket left to autotune its buffers to
/// megabytes lets one `send` or `recv` copy a whole 2 MiB chunk; with these, each copies a
/// few hundred KiB at most. Measured on a 2-core machine (`bench/wakeup-latency`), a normal thread
/// waking every millisecond beside an idle-priority thread sending 2 MiB at a time over
/// loopback woke 385 µs late at p99 (1.1 ms at worst); beside one sending 256 KiB at a
/// time, 158 µs (280 µs) — and 55 µs beside a thread that only computes.
pub const STREAMING_LANE_SOCKET_BUFFER_BYTES: usize = 256 << 10;

/// Bounds the buffers of a streaming-lane socket ([`STREAMING_LANE_SOCKET_BUFFER_BYTES`]).
/// Best effort: a socket that refuses keeps the system's buffers.
pub(crate) fn bound_streaming_buffers(socket: socket2::SockRef<'_>) {
    let _ = socket.set_send_buffer_size(STREAMING_LANE_SOCKET_BUFFER_BYTES);
    let _ = socket.set_recv_buffer_size(STREAMING_LANE_SOCKET_BUFFER_BYTES);
}

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
    /// The text and keyspace of the statement prepared as `id`, if the receiving node
    /// has it (`crate::peer_statements`).
    PreparedStatement {
        id: Vec<u8>,
    },
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
    /// Done (a barrier's fence raised).
    Done,
    /// A barrier's first round passed: what the node answers with it.
    Settled(shoal_replication::barrier::Settled),
    Stream(crate::streaming::StreamReply),
    Strong(crate::strong::StrongReply),
    PreparedStatement(Option<shoal_coordinator::prepared::StatementText>),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn streaming_lane_connections_have_bounded_socket_buffers_and_others_do_not() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        // Linux doubles what is asked (bookkeeping) and caps it at `net.core.wmem_max`
        // and `rmem_max`: at most twice the figure.
        let most = 2 * STREAMING_LANE_SOCKET_BUFFER_BYTES;
        let lane = peers::connect_from(None, address, true).await.unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        let options = socket2::SockRef::from(&lane);
        assert!(options.send_buffer_size().unwrap() <= most);
        assert!(options.recv_buffer_size().unwrap() <= most);
        // The serving end bounds its side once the preface names the lane.
        bound_streaming_buffers(socket2::SockRef::from(&accepted));
        assert!(
            socket2::SockRef::from(&accepted)
                .send_buffer_size()
                .unwrap()
                <= most
        );

        let other = peers::connect_from(None, address, false).await.unwrap();
        let _ = listener.accept().await.unwrap();
        assert_ne!(
            socket2::SockRef::from(&other).send_buffer_size().unwrap(),
            socket2::SockRef::from(&lane).send_buffer_size().unwrap(),
            "other connections keep the system's buffers"
        );
    }

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
