//! One client connection: the CQL v4 conversation.
//!
//! A reader task decodes frames and starts each request as its own task, so that many
//! requests (stream ids) are in flight per connection; each answer is encoded into a frame
//! and queued for the writer task, which coalesces every queued frame into one socket
//! write. In-flight requests per connection are bounded: past the bound a request is
//! answered `Overloaded` at once instead of queueing without limit.

use crate::events::EventBus;
use futures::FutureExt;
use shoal_coordinator::{Coordinator, Session};
use shoal_cql::frame::{self, opcode, FrameHeader, HEADER_LENGTH};
use shoal_cql::request::Request;
use shoal_cql::response::{Event, Response, ResultBody};
use shoal_cql::CqlError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Mutex, Semaphore};

/// Limits for one connection.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    pub max_frame_bytes: usize,
    pub max_in_flight: usize,
}

/// Per-connection protocol state shared by its request tasks.
struct ConnectionState {
    session: Mutex<Session>,
    started: AtomicBool,
    compression: AtomicBool,
}

/// Largest number of bytes the writer gathers into one socket write.
const MAX_COALESCED_BYTES: usize = 256 * 1024;

fn encode_frame(out: &mut Vec<u8>, stream: i16, response: &Response, compress: bool) {
    let (op, body) = response.encode();
    // READY and the STARTUP error are never compressed; everything after is, if agreed.
    frame::write_frame(out, stream, op, &body, compress);
}

pub async fn serve(
    socket: TcpStream,
    coordinator: Arc<Coordinator>,
    events: Arc<EventBus>,
    limits: ConnectionLimits,
) {
    let peer = socket.peer_addr().ok();
    let _ = socket.set_nodelay(true);
    let (read_half, mut write_half) = socket.into_split();
    let (frames_tx, mut frames_rx) = mpsc::channel::<Vec<u8>>(limits.max_in_flight + 16);

    let writer = tokio::spawn(async move {
        let mut buffer = Vec::with_capacity(64 * 1024);
        while let Some(frame) = frames_rx.recv().await {
            buffer.clear();
            buffer.extend_from_slice(&frame);
            while buffer.len() < MAX_COALESCED_BYTES {
                match frames_rx.try_recv() {
                    Ok(more) => buffer.extend_from_slice(&more),
                    Err(_) => break,
                }
            }
            if write_half.write_all(&buffer).await.is_err() {
                break;
            }
        }
        let _ = write_half.shutdown().await;
    });

    let state = Arc::new(ConnectionState {
        session: Mutex::new(Session::default()),
        started: AtomicBool::new(false),
        compression: AtomicBool::new(false),
    });
    let in_flight = Arc::new(Semaphore::new(limits.max_in_flight));
    let mut reader = BufReader::with_capacity(64 * 1024, read_half);
    let mut header_bytes = [0u8; HEADER_LENGTH];
    loop {
        if reader.read_exact(&mut header_bytes).await.is_err() {
            break;
        }
        let header = FrameHeader::parse(&header_bytes);
        let compress = state.compression.load(Ordering::Relaxed);
        if let Err(error) = header.check_version() {
            // Answer in v4 and close, as Cassandra does; the driver retries with v4.
            let mut out = Vec::new();
            encode_frame(&mut out, header.stream, &Response::Error(error), false);
            let _ = frames_tx.send(out).await;
            break;
        }
        let length = header.length as usize;
        if length > limits.max_frame_bytes {
            // Skip the body without buffering it, then refuse the request.
            let mut remaining = length as u64;
            let mut sink = [0u8; 8192];
            while remaining > 0 {
                let chunk = remaining.min(sink.len() as u64) as usize;
                if reader.read_exact(&mut sink[..chunk]).await.is_err() {
                    remaining = u64::MAX;
                    break;
                }
                remaining -= chunk as u64;
            }
            if remaining == u64::MAX {
                break;
            }
            let error = CqlError::protocol(format!(
                "Request is too big: length {length} exceeds maximum allowed length {}",
                limits.max_frame_bytes
            ));
            let mut out = Vec::new();
            encode_frame(&mut out, header.stream, &Response::Error(error), compress);
            if frames_tx.send(out).await.is_err() {
                break;
            }
            continue;
        }
        let mut body = vec![0u8; length];
        if reader.read_exact(&mut body).await.is_err() {
            break;
        }
        let Ok(permit) = Arc::clone(&in_flight).try_acquire_owned() else {
            let error = CqlError::overloaded(format!(
                "Too many requests in flight on this connection (limit {})",
                limits.max_in_flight
            ));
            let mut out = Vec::new();
            encode_frame(&mut out, header.stream, &Response::Error(error), compress);
            if frames_tx.send(out).await.is_err() {
                break;
            }
            continue;
        };
        // STARTUP, OPTIONS and REGISTER change connection state: handle them in order.
        let ordered = matches!(
            header.opcode,
            opcode::STARTUP | opcode::OPTIONS | opcode::REGISTER
        );
        let task = handle_frame(
            header,
            body,
            Arc::clone(&state),
            Arc::clone(&coordinator),
            Arc::clone(&events),
            frames_tx.clone(),
            limits,
        );
        if ordered {
            task.await;
            drop(permit);
        } else {
            tokio::spawn(async move {
                task.await;
                drop(permit);
            });
        }
    }
    drop(frames_tx);
    let _ = writer.await;
    tracing::debug!(?peer, "connection closed");
}

async fn handle_frame(
    header: FrameHeader,
    body: Vec<u8>,
    state: Arc<ConnectionState>,
    coordinator: Arc<Coordinator>,
    events: Arc<EventBus>,
    frames: mpsc::Sender<Vec<u8>>,
    limits: ConnectionLimits,
) {
    let compressed_connection = state.compression.load(Ordering::Relaxed);
    let outcome = std::panic::AssertUnwindSafe(respond(
        header,
        body,
        &state,
        &coordinator,
        &events,
        &frames,
        limits,
    ))
    .catch_unwind()
    .await;
    let response = match outcome {
        Ok(Ok(response)) => response,
        Ok(Err(error)) => Response::Error(error),
        Err(_) => {
            tracing::error!(opcode = header.opcode, "request handler panicked");
            Response::Error(CqlError::server(
                "Internal error while executing the request",
            ))
        }
    };
    let compress = compressed_connection && header.opcode != opcode::STARTUP;
    let mut out = Vec::new();
    encode_frame(&mut out, header.stream, &response, compress);
    let _ = frames.send(out).await;
}

async fn respond(
    header: FrameHeader,
    body: Vec<u8>,
    state: &Arc<ConnectionState>,
    coordinator: &Arc<Coordinator>,
    events: &Arc<EventBus>,
    frames: &mpsc::Sender<Vec<u8>>,
    limits: ConnectionLimits,
) -> Result<Response, CqlError> {
    let body = if header.flags & frame::flags::COMPRESSION != 0 {
        if !state.compression.load(Ordering::Relaxed) {
            return Err(CqlError::protocol(
                "Received a compressed frame, but no compression was negotiated in STARTUP",
            ));
        }
        frame::decompress_body(&body, limits.max_frame_bytes)?
    } else {
        body
    };
    let request = Request::decode(header.opcode, &body)?;
    let started = state.started.load(Ordering::Acquire);
    match request {
        Request::Options => Ok(Response::Supported(vec![
            (
                "CQL_VERSION".into(),
                vec![shoal_coordinator::CQL_VERSION.into()],
            ),
            ("COMPRESSION".into(), vec!["lz4".into()]),
            ("PROTOCOL_VERSIONS".into(), vec!["4/v4".into()]),
        ])),
        Request::Startup(options) => {
            if started {
                return Err(CqlError::protocol(
                    "Unexpected message STARTUP, the connection is already initialized",
                ));
            }
            for (key, value) in &options {
                match key.to_ascii_uppercase().as_str() {
                    "CQL_VERSION" if !value.starts_with('3') => {
                        return Err(CqlError::protocol(format!(
                            "Invalid or unsupported CQL version {value}; supported is {}",
                            shoal_coordinator::CQL_VERSION
                        )));
                    }
                    "COMPRESSION" => match value.to_ascii_lowercase().as_str() {
                        "lz4" => state.compression.store(true, Ordering::Relaxed),
                        "" => {}
                        other => {
                            return Err(CqlError::protocol(format!(
                                "Unknown compression algorithm: {other}"
                            )))
                        }
                    },
                    _ => {}
                }
            }
            state.started.store(true, Ordering::Release);
            Ok(Response::Ready)
        }
        _ if !started => Err(CqlError::protocol(format!(
            "Unexpected message {:#04x}, expecting STARTUP or OPTIONS",
            header.opcode
        ))),
        Request::Register(kinds) => {
            events.subscribe(
                &kinds,
                frames.clone(),
                state.compression.load(Ordering::Relaxed),
            )?;
            Ok(Response::Ready)
        }
        Request::AuthResponse(_) => Err(CqlError::protocol(
            "Authentication is not enabled on this node",
        )),
        Request::Query { query, parameters } => {
            let mut session = state.session.lock().await.clone();
            let result = coordinator.query(&mut session, &query, &parameters).await?;
            finish_result(state, events, &mut session, result).await
        }
        Request::Prepare { query } => {
            let session = state.session.lock().await.clone();
            Ok(Response::Result(coordinator.prepare(&session, &query)?))
        }
        Request::Execute { id, parameters } => {
            let mut session = state.session.lock().await.clone();
            let result = coordinator.execute(&mut session, &id, &parameters).await?;
            finish_result(state, events, &mut session, result).await
        }
        Request::Batch(batch) => {
            let mut session = state.session.lock().await.clone();
            let result = coordinator.batch(&mut session, &batch).await?;
            finish_result(state, events, &mut session, result).await
        }
    }
}

/// Applies `USE` to the connection and publishes schema changes to registered clients.
async fn finish_result(
    state: &Arc<ConnectionState>,
    events: &Arc<EventBus>,
    session: &mut Session,
    result: ResultBody,
) -> Result<Response, CqlError> {
    match &result {
        ResultBody::SetKeyspace(keyspace) => {
            state.session.lock().await.keyspace = Some(keyspace.clone());
        }
        ResultBody::SchemaChange(change) => {
            events.publish(Event::SchemaChange(change.clone()));
        }
        _ => {}
    }
    let _ = session;
    Ok(Response::Result(result))
}
