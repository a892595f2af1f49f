//! The serving side: accepting peers' connections (TLS first when the cluster uses it,
//! the consensus and streaming-lane prefaces), and answering the requests of a connection
//! concurrently as futures of its own task, coalescing the responses.

use super::*;

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

pub(super) async fn serve_socket(
    socket: TcpStream,
    peer: SocketAddr,
    handler: Arc<dyn Handler>,
    tls: Option<tokio_rustls::TlsAcceptor>,
) {
    // A streaming-lane connection, known by its first bytes (it is served on the lane's
    // runtime), gets its socket's buffers bounded (`bound_streaming_buffers`).
    let Some(acceptor) = tls else {
        let Some((socket, first, runtime)) = consensus_or_first_bytes(socket, &handler).await
        else {
            return;
        };
        if let Some(lane) = runtime {
            return serve_lane_socket(lane, socket, first, handler).await;
        }
        let (reader, writer) = socket.into_split();
        let reader = std::io::Cursor::new(first).chain(reader);
        return serve_connection(reader, writer, handler).await;
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
            if runtime.is_some() {
                let socket = stream.get_ref().0.get_ref();
                super::bound_streaming_buffers(socket2::SockRef::from(socket));
            }
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
pub(super) async fn consensus_or_first_bytes<S: AsyncRead + Unpin>(
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

/// Serves a streaming-lane connection (its first frame's `first` bytes already read) on
/// the lane's runtime, its socket's buffers bounded (`bound_streaming_buffers`).
///
/// The socket moves to the lane's own I/O driver as well as its tasks. Accepted here, it
/// is registered with the node's main runtime, whose workers serve client requests at
/// normal priority: left there, every readiness event of a socket that carries a tablet's
/// megabytes wakes one of those workers only for it to wake the lane's thread. (Over the
/// 2 s of a join under `bench/elastic`'s write load, `perf sched` counted 5,513 switches
/// of the main runtimes' threads with the sockets there and 5,010 with them here: most of
/// those threads' work during a join is the clients' writes.) If this future is dropped
/// (the node shuts down), the connection ends too.
async fn serve_lane_socket(
    lane: tokio::runtime::Handle,
    socket: TcpStream,
    first: [u8; 4],
    handler: Arc<dyn Handler>,
) {
    super::bound_streaming_buffers(socket2::SockRef::from(&socket));
    let socket = match socket.into_std() {
        Ok(socket) => socket,
        Err(error) => {
            tracing::warn!(%error, "cannot hand a streaming connection to the lane's runtime");
            return;
        }
    };
    run_on(lane, async move {
        // Registered with the runtime this runs on: the lane's.
        let socket = match TcpStream::from_std(socket) {
            Ok(socket) => socket,
            Err(error) => {
                tracing::warn!(%error, "cannot serve a streaming connection on the lane's runtime");
                return;
            }
        };
        let (reader, writer) = socket.into_split();
        let reader = std::io::Cursor::new(first).chain(reader);
        serve_connection(reader, writer, handler).await
    })
    .await
}

/// Runs `work` on `runtime` until it ends; if this future is dropped (the node shuts
/// down), `work` is aborted.
async fn run_on(runtime: tokio::runtime::Handle, work: impl Future<Output = ()> + Send + 'static) {
    let mut task = crate::AbortOnDrop(runtime.spawn(work));
    let _ = (&mut task.0).await;
}

/// Serves a connection on `runtime` (here when `None`). Its tasks go with it; if this
/// future is dropped (the node shuts down), the connection ends too.
pub(super) async fn serve_connection_on(
    runtime: Option<tokio::runtime::Handle>,
    reader: impl AsyncReadExt + Unpin + Send + 'static,
    writer: impl AsyncWriteExt + Unpin + Send + 'static,
    handler: Arc<dyn Handler>,
) {
    let Some(runtime) = runtime else {
        return serve_connection(reader, writer, handler).await;
    };
    run_on(runtime, serve_connection(reader, writer, handler)).await
}

pub(super) async fn serve_connection(
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
                        let message = bincode::deserialize::<Message>(&payload);
                        crate::large_buffers::give_back(payload);
                        let reply = match message {
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
