//! The caller's side: one outgoing connection per peer address and [`Lane`], opened from
//! the node's own address, with any number of requests in flight on it, each waiting for
//! the reply with its id.

use super::*;

pub(super) type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Reply>>>>;

pub(super) struct PeerConnection {
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
    pub(super) connections: Mutex<HashMap<(SocketAddr, Lane), Arc<PeerConnection>>>,
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

/// Connects to `to` from `source` (any port), or from wherever the system picks; a
/// connection of the streaming lane with its buffers bounded
/// ([`super::bound_streaming_buffers`]).
pub(super) async fn connect_from(
    source: Option<std::net::IpAddr>,
    to: SocketAddr,
    streaming_lane: bool,
) -> std::io::Result<TcpStream> {
    let socket = if to.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    if let Some(source) = source {
        socket.bind(SocketAddr::new(source, 0))?;
    }
    if streaming_lane {
        super::bound_streaming_buffers(socket2::SockRef::from(&socket));
    }
    socket.connect(to).await
}

/// Why a [`Peers::call`] has no reply. Whether the peer may have acted on the message is
/// what a caller needs to know before it sends the message again, or elsewhere.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The message never left this node: no connection could be opened (the peer is down
    /// or unreachable, this node is stopping), or it closed before the message was handed
    /// to it. The peer cannot have acted on it.
    #[error("{0}")]
    NotSent(String),
    /// The message was handed to the connection, and no reply came in time or the
    /// connection closed first: the peer may have acted on it.
    #[error("{0}")]
    NoReply(String),
}

impl From<CallError> for String {
    fn from(error: CallError) -> String {
        error.to_string()
    }
}

/// Why an outgoing connection could not be opened.
pub(super) enum OpenFailure {
    /// The peer could not be reached (no retry before [`RECONNECT_BACKOFF`]).
    Unreachable(String),
    Other(String),
}

/// Connects to `to`, shakes hands (TLS, when the cluster uses it), writes the lane's
/// preface and starts the connection's tasks on the current runtime.
pub(super) async fn open_connection(
    source: Option<std::net::IpAddr>,
    tls: Option<Arc<crate::tls::InternodeTls>>,
    preface: Option<[u8; 4]>,
    to: SocketAddr,
) -> Result<Arc<PeerConnection>, OpenFailure> {
    let connect = connect_from(source, to, preface == Some(super::STREAMING_LANE_PREFACE));
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
pub(super) async fn send_preface(
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
pub(super) fn start_connection(
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
    ) -> Result<Reply, CallError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let connection = tokio::time::timeout_at(deadline, self.connection(to, message.lane()))
            .await
            .map_err(|_| CallError::NotSent(format!("connecting to {to} timed out")))?
            .map_err(CallError::NotSent)?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let frame = Frame {
            head: encode_frame(id, message).map_err(CallError::NotSent)?,
            attachment: Bytes::new(),
        };
        let (sender, receiver) = oneshot::channel();
        connection.pending.lock().insert(id, sender);
        let closed = || format!("the connection to {to} closed");
        let outcome = tokio::time::timeout_at(deadline, async {
            if connection.frames.send(frame).await.is_err() {
                return Err(CallError::NotSent(closed()));
            }
            receiver.await.map_err(|_| CallError::NoReply(closed()))
        })
        .await;
        let (counter, result) = match outcome {
            Ok(Ok(reply)) => (&connection.completed, Ok(reply)),
            Ok(Err(error)) => (&connection.dropped, Err(error)),
            Err(_) => {
                connection.pending.lock().remove(&id);
                let error = CallError::NoReply(format!("{to} did not answer within {timeout:?}"));
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
