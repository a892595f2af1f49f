//! One client connection: the CQL v4 conversation.
//!
//! Each connection is one task, on one connection thread for its whole life
//! ([`crate::connection_threads`]). It reads whatever bytes the socket has into a buffer,
//! cuts complete frames out of it — at most [`REQUESTS_PER_PASS`] per pass, the rest wait
//! in the buffer for the next pass — and starts every request as a future in the
//! connection's own [`FuturesUnordered`] — so many requests (stream ids) are in flight at
//! once without spawning a task per request or waking another thread. Requests that finish
//! at once (a point read) answer in the same pass; the writes of a pass are applied
//! together ([`WriteDeferral`]: one engine write for all of them) and answer right after;
//! requests that wait (a replica's answer, a group commit's sync) finish later. The task
//! is the socket's only writer: event frames pushed by other tasks reach it through a
//! channel, and all answers of a pass leave in one socket write.
//!
//! Reads that can run long — scans and partition slices — run as tasks of their own on
//! the node's shared runtime instead (`apart::runs_apart`): their coordinator work (merging
//! chunk replies, building and encoding up to thousands of rows) takes milliseconds of
//! CPU, and inside the connection's task every other request of the connection — point
//! reads whose answers are ready — would wait for it, as would the other connections of
//! its thread. A point read stays in the task: it is done sooner than a hand-off
//! (`apart`). Traced requests and logins are in `traced`.
//!
//! A pass that leaves requests unanswered acknowledges the bytes it read at once
//! ([`acknowledge_now`]): a client that does not set `TCP_NODELAY` (the Python driver's
//! default) holds its next request back until its last segment is acknowledged, and the
//! kernel delays that acknowledgement (up to 40 ms) hoping to send it with an answer — so
//! without this, a point read sent right after a scan on the same connection would wait
//! for the delayed ACK.
//!
//! The connection decides itself when it lets other tasks run — once it has worked for
//! [`RUN_BEFORE_YIELD`] without waiting, after a pass's answers are sent — rather than
//! tokio's cooperative budget, which could stop it between applying a pass's writes and
//! answering them ([`serve_halves`]).
//!
//! Limits: a frame body beyond `max_frame_bytes` is skipped and refused with a protocol
//! error; requests beyond `max_in_flight` are answered `Overloaded` at once.

use crate::events::EventBus;
use bytes::{Buf, BytesMut};
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use parking_lot::Mutex;
use shoal_coordinator::traces::TracedRequest;
use shoal_coordinator::{Coordinator, Session};
use shoal_cql::frame::{self, opcode, FrameHeader, HEADER_LENGTH};
use shoal_cql::request::Request;
use shoal_cql::response::{Event, Response, ResultBody};
use shoal_cql::CqlError;
use shoal_storage::WriteDeferral;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::sync::mpsc;

mod apart;
mod traced;

use apart::*;
use traced::*;

/// Limits for one connection.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    pub max_frame_bytes: usize,
    pub max_in_flight: usize,
}

/// What a node gives each of its client connections.
#[derive(Clone)]
pub struct ConnectionServices {
    pub coordinator: Arc<Coordinator>,
    pub events: Arc<EventBus>,
    pub limits: ConnectionLimits,
    /// Where requests run apart run: the node's shared runtime, whose workers share their
    /// tasks (a connection's own thread serves other connections too; see
    /// `connection_threads`).
    pub apart_runtime: Handle,
}

/// Per-connection protocol state shared by its requests.
struct ConnectionState {
    session: Mutex<Session>,
    started: AtomicBool,
    /// The client has logged in (or needs not: authentication is off).
    authenticated: AtomicBool,
    compression: AtomicBool,
    /// The metadata flag marking a prepared lightweight transaction, if the client
    /// negotiated [`LWT_MARK_EXTENSION`] (0: it did not).
    lwt_mark: AtomicU32,
    /// The client's address (`None` when the transport has none, as in tests).
    peer: Option<std::net::SocketAddr>,
}

/// ScyllaDB's protocol extension that marks prepared lightweight transactions in their
/// metadata flags: its drivers then route every transaction on a partition to the same
/// replica, where they take turns instead of contending through Paxos ballots from
/// several coordinators. Offered in SUPPORTED; a client opts in at STARTUP. (A driver
/// that sees it takes the server for ScyllaDB and adds `USING TIMEOUT` to its metadata
/// queries, which Shoal's SELECT accepts.)
const LWT_MARK_EXTENSION: &str = "SCYLLA_LWT_ADD_METADATA_MARK";
const LWT_MARK_KEY: &str = "LWT_OPTIMIZATION_META_BIT_MASK";
/// The flag offered: the highest bit, which protocol v4 leaves unused (ScyllaDB's value).
const LWT_MARK: u32 = 0x8000_0000;

/// Event frames (SCHEMA_CHANGE, STATUS_CHANGE...) queued for the connection.
const EVENT_QUEUE_CAPACITY: usize = 64;
/// Body bytes an answer's buffer has room for from the start.
const SMALL_BODY_BYTES: usize = 120;
/// Requests started in one pass at most; the frames after them wait in the buffer for the
/// next pass. A pass's answers leave together once its writes are applied, so a client
/// that sent many requests at once gets the first of them back while the server works on
/// the rest, instead of waiting for all (and leaving the server idle in turn).
const REQUESTS_PER_PASS: usize = 16;
/// Bytes read from the socket per read call, at least.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// How long a connection works without waiting before it lets the other tasks of its
/// thread run (see [`serve_halves`]); it yields after the pass that reaches it, once that
/// pass's answers are sent. Every yield costs more than the yielding task: tokio wakes a
/// parked worker to take the yielded task, and that worker usually finds it already
/// running again and parks. Yielding after every four passes (a few hundred microseconds)
/// cost 4% more CPU per point read over TLS than tokio's budget did
/// (`bench/results/2026-12-02-tls-coop-tails`).
const RUN_BEFORE_YIELD: std::time::Duration = std::time::Duration::from_millis(1);

fn encode_frame(out: &mut Vec<u8>, stream: i16, response: &Response, compress: bool) {
    if compress {
        let (op, body) = response.encode();
        frame::write_frame(out, stream, op, &body, compress);
        return;
    }
    // The body is encoded behind room for the header, which is filled in once the body's
    // length is known: a result of thousands of rows is not copied again.
    let start = out.len();
    // Room for a small answer (a write's, an error's) at once: one allocation.
    out.reserve(HEADER_LENGTH + SMALL_BODY_BYTES);
    out.resize(start + HEADER_LENGTH, 0);
    let (op, encoded) = response.encode_onto(std::mem::take(out));
    *out = encoded;
    let length = out.len() - start - HEADER_LENGTH;
    frame::write_header(&mut out[start..], stream, op, 0, length);
}

/// Adds an answer to what the pass will send; the first is taken as it is (a scan's
/// megabytes are not copied again).
fn gather(output: &mut Vec<u8>, frame: Vec<u8>) {
    if output.is_empty() {
        *output = frame;
    } else {
        output.extend_from_slice(&frame);
    }
}

/// The requests that can be traced: the ones that run statements.
fn traceable(opcode: u8) -> bool {
    matches!(
        opcode,
        opcode::QUERY | opcode::PREPARE | opcode::EXECUTE | opcode::BATCH
    )
}

fn error_frame(stream: i16, error: CqlError, compress: bool) -> Vec<u8> {
    let mut out = Vec::new();
    encode_frame(&mut out, stream, &Response::Error(error), compress);
    out
}

/// Serves a plain TCP connection.
pub async fn serve(socket: TcpStream, services: ConnectionServices) {
    let peer = socket.peer_addr().ok();
    let _ = socket.set_nodelay(true);
    let (read_half, write_half) = socket.into_split();
    let acknowledge = |half: &OwnedReadHalf| acknowledge_now(half.as_ref());
    serve_halves(read_half, write_half, acknowledge, peer, services).await
}

/// Serves a connection after its TLS handshake.
pub async fn serve_tls(
    stream: tokio_rustls::server::TlsStream<crate::tls::BufferedSocket>,
    services: ConnectionServices,
) {
    let socket = stream.get_ref().0.get_ref();
    let peer = socket.peer_addr().ok();
    let _ = socket.set_nodelay(true);
    // The TLS stream's read half does not lend out its socket: a second descriptor of it
    // does the acknowledging.
    let socket = socket.as_fd().try_clone_to_owned().ok();
    let (read_half, write_half) = tokio::io::split(stream);
    let acknowledge = move |_: &_| {
        if let Some(socket) = &socket {
            acknowledge_now(socket)
        }
    };
    serve_halves(read_half, write_half, acknowledge, peer, services).await
}

/// Sends the acknowledgement of the bytes received so far now, instead of letting the
/// kernel delay it until an answer could carry it.
fn acknowledge_now(socket: &impl AsFd) {
    let _ = socket2::SockRef::from(socket).set_tcp_quickack(true);
}

/// What every request a connection starts is given.
struct RequestContext {
    state: Arc<ConnectionState>,
    /// Where event frames for this connection go (its task writes them out).
    events_tx: mpsc::Sender<Vec<u8>>,
    services: ConnectionServices,
}

/// The connection's loop. It runs outside tokio's cooperative budget
/// ([`tokio::task::unconstrained`]) and yields on its own terms instead, after
/// working for [`RUN_BEFORE_YIELD`] without waiting. Under the
/// budget, a pass could be cut between applying its writes and answering them: the
/// budget runs out, the applied writes' futures report themselves pending, and their
/// answers wait until the scheduler comes back to this task — milliseconds behind the
/// other connections on a busy node (over TLS, whose reads and writes spend more of the
/// budget, one write in a hundred waited 3 ms or more). Yielding here, after a pass's
/// answers are sent, only ever delays requests not read yet.
fn serve_halves<R: AsyncRead + Unpin>(
    read_half: R,
    write_half: impl AsyncWrite + Unpin,
    acknowledge: impl Fn(&R),
    peer: Option<std::net::SocketAddr>,
    services: ConnectionServices,
) -> impl std::future::Future<Output = ()> {
    let (events_tx, events_rx) = mpsc::channel::<Vec<u8>>(EVENT_QUEUE_CAPACITY);
    let state = Arc::new(ConnectionState {
        session: Mutex::new(Session::default()),
        authenticated: AtomicBool::new(false),
        started: AtomicBool::new(false),
        compression: AtomicBool::new(false),
        lwt_mark: AtomicU32::new(0),
        peer,
    });
    let context = RequestContext {
        state,
        events_tx,
        services,
    };
    tokio::task::unconstrained(converse(
        read_half,
        write_half,
        acknowledge,
        events_rx,
        context,
    ))
}

/// What woke a connection's loop.
enum Wakeup {
    Answer(Vec<u8>),
    Event(Vec<u8>),
    Read(std::io::Result<usize>),
    /// Frames already read wait for a pass.
    Buffered,
    /// Nothing can happen any more.
    Done,
}

async fn converse<R: AsyncRead + Unpin>(
    mut read_half: R,
    mut write_half: impl AsyncWrite + Unpin,
    acknowledge: impl Fn(&R),
    mut events_rx: mpsc::Receiver<Vec<u8>>,
    context: RequestContext,
) {
    let mut input = BytesMut::with_capacity(READ_CHUNK_BYTES);
    let mut in_flight: FuturesUnordered<BoxFuture<'static, Vec<u8>>> = FuturesUnordered::new();
    let mut output: Vec<u8> = Vec::new();
    // Bytes of an oversized frame body still to be discarded.
    let mut skipping: usize = 0;
    let mut closing = false;
    // Complete frames may still wait in `input`: the last pass stopped at its size.
    let mut buffered = false;
    // Since when the loop has found work without waiting (`None`: it just waited).
    let mut busy_since: Option<std::time::Instant> = None;
    loop {
        let (wakeup, waited) = noting_wait(async {
            tokio::select! {
                Some(frame) = in_flight.next(), if !in_flight.is_empty() => Wakeup::Answer(frame),
                Some(event) = events_rx.recv() => Wakeup::Event(event),
                read = read_half.read_buf(&mut input), if !closing && !buffered => Wakeup::Read(read),
                () = std::future::ready(()), if buffered => Wakeup::Buffered,
                else => Wakeup::Done,
            }
        })
        .await;
        let mut received = false;
        match wakeup {
            Wakeup::Answer(frame) => gather(&mut output, frame),
            Wakeup::Event(event) => output.extend_from_slice(&event),
            Wakeup::Read(Ok(0) | Err(_)) => closing = true,
            Wakeup::Read(Ok(_)) => received = true,
            Wakeup::Buffered => {}
            Wakeup::Done => break,
        }
        if received || buffered {
            buffered = start_requests(
                &mut input,
                &mut skipping,
                &mut closing,
                &mut output,
                &mut in_flight,
                &context,
            )
            .await;
        }
        // Collect every answer that is ready now, then hand them over in one piece. The
        // writes of the requests run meanwhile are applied together (one engine write) and
        // their answers collected in the next round.
        loop {
            let deferral = WriteDeferral::begin();
            while let Some(Some(frame)) = in_flight.next().now_or_never() {
                gather(&mut output, frame);
            }
            if deferral.apply() == 0 {
                break;
            }
        }
        if !output.is_empty() {
            // Flush too: over TLS, `write_all` can return with the last records still in
            // rustls' buffer (the socket was full), and nothing would send them until the
            // next answer — a client waiting for them would wait for ever.
            if write_half.write_all(&output).await.is_err() || write_half.flush().await.is_err() {
                break;
            }
            // A pass that answered a scan leaves megabytes of room: not kept for later.
            if output.capacity() > 1 << 20 {
                output = Vec::new();
            } else {
                output.clear();
            }
        } else if received && !in_flight.is_empty() {
            // No answer carries the acknowledgement of what was just read.
            acknowledge(&read_half);
        }
        if closing && in_flight.is_empty() {
            break;
        }
        if waited {
            busy_since = None;
        } else {
            let since = *busy_since.get_or_insert_with(std::time::Instant::now);
            if since.elapsed() >= RUN_BEFORE_YIELD {
                busy_since = None;
                tokio::task::yield_now().await;
            }
        }
    }
    let _ = write_half.shutdown().await;
    tracing::debug!(peer = ?context.state.peer, "connection closed");
}

/// Runs `future` to its end, and tells whether it had to wait on the way (whether the
/// task was suspended, so that other tasks could run).
async fn noting_wait<T>(future: impl std::future::Future<Output = T>) -> (T, bool) {
    let mut future = std::pin::pin!(future);
    let mut waited = false;
    let output = std::future::poll_fn(|cx| {
        let poll = future.as_mut().poll(cx);
        waited |= poll.is_pending();
        poll
    })
    .await;
    (output, waited)
}

/// One pass: cuts complete frames out of `input`, up to [`REQUESTS_PER_PASS`] of them,
/// and starts their requests (answering at once those refused before they start).
/// Returns whether complete frames may still wait in `input`.
async fn start_requests(
    input: &mut BytesMut,
    skipping: &mut usize,
    closing: &mut bool,
    output: &mut Vec<u8>,
    in_flight: &mut FuturesUnordered<BoxFuture<'static, Vec<u8>>>,
    context: &RequestContext,
) -> bool {
    let limits = context.services.limits;
    let mut started = 0;
    loop {
        if *skipping > 0 {
            let dropped = (*skipping).min(input.len());
            input.advance(dropped);
            *skipping -= dropped;
            if *skipping > 0 {
                return false;
            }
        }
        if input.len() < HEADER_LENGTH {
            return false;
        }
        let mut header_bytes = [0u8; HEADER_LENGTH];
        header_bytes.copy_from_slice(&input[..HEADER_LENGTH]);
        let header = FrameHeader::parse(&header_bytes);
        let compress = context.state.compression.load(Ordering::Relaxed);
        if let Err(error) = header.check_version() {
            // Answer in v4 and close, as Cassandra does; the driver retries with v4.
            output.extend_from_slice(&error_frame(header.stream, error, false));
            *closing = true;
            input.clear();
            return false;
        }
        let length = header.length as usize;
        if length > limits.max_frame_bytes {
            input.advance(HEADER_LENGTH);
            *skipping = length;
            let error = CqlError::protocol(format!(
                "Request is too big: length {length} exceeds maximum allowed length {}",
                limits.max_frame_bytes
            ));
            output.extend_from_slice(&error_frame(header.stream, error, compress));
            continue;
        }
        if input.len() < HEADER_LENGTH + length {
            input.reserve(HEADER_LENGTH + length - input.len());
            return false;
        }
        input.advance(HEADER_LENGTH);
        let body = input.split_to(length).to_vec();
        if in_flight.len() >= limits.max_in_flight {
            let error = CqlError::overloaded(format!(
                "Too many requests in flight on this connection (limit {})",
                limits.max_in_flight
            ));
            output.extend_from_slice(&error_frame(header.stream, error, compress));
            continue;
        }
        let apart = runs_apart(&header, &body, &context.services.coordinator);
        let request = handle_frame(
            header,
            body,
            Arc::clone(&context.state),
            Arc::clone(&context.services.coordinator),
            Arc::clone(&context.services.events),
            context.events_tx.clone(),
            limits,
        );
        // STARTUP, OPTIONS and REGISTER change connection state: finish them in order.
        if matches!(
            header.opcode,
            opcode::STARTUP | opcode::OPTIONS | opcode::REGISTER
        ) {
            output.extend_from_slice(&request.await);
        } else if apart {
            in_flight.push(run_apart(
                &context.services.apart_runtime,
                request,
                header.stream,
                compress,
            ));
        } else {
            in_flight.push(request.boxed());
        }
        started += 1;
        if started == REQUESTS_PER_PASS {
            return true;
        }
    }
}

/// Runs one request and returns its encoded response frame.
async fn handle_frame(
    header: FrameHeader,
    body: Vec<u8>,
    state: Arc<ConnectionState>,
    coordinator: Arc<Coordinator>,
    events: Arc<EventBus>,
    output: mpsc::Sender<Vec<u8>>,
    limits: ConnectionLimits,
) -> Vec<u8> {
    let compressed_connection = state.compression.load(Ordering::Relaxed);
    // Traced: when the client asks (the frame's flag) or the node samples the request.
    let trace_requested = traceable(header.opcode) && header.flags & frame::flags::TRACING != 0;
    let trace = (trace_requested
        || (traceable(header.opcode) && coordinator.trace_sampler().sample()))
    .then(shoal_trace::Trace::start);
    let traced_body = trace.as_ref().map(|_| body.clone());
    // The untraced path awaits the response in place, as it did before tracing existed:
    // no future is held beside it, so the request's future stays as small as it was.
    let outcome = match &trace {
        None => {
            std::panic::AssertUnwindSafe(respond(
                header,
                body,
                &state,
                &coordinator,
                &events,
                &output,
                limits,
            ))
            .catch_unwind()
            .await
        }
        Some(trace) => {
            let traced = boxed_in_trace(
                trace,
                std::panic::AssertUnwindSafe(respond(
                    header,
                    body,
                    &state,
                    &coordinator,
                    &events,
                    &output,
                    limits,
                ))
                .catch_unwind(),
            );
            traced.await
        }
    };
    if let (Some(trace), Some(body)) = (trace.as_ref(), traced_body) {
        trace.record("Request complete".into());
        let request = traced_request(header, &body, &state, &coordinator, limits);
        coordinator.record_trace(Arc::clone(trace), request);
    }
    let response = match outcome {
        Ok(Ok(response)) => response,
        Ok(Err(error)) => {
            coordinator.report_error(&error);
            Response::Error(error)
        }
        Err(_) => {
            tracing::error!(opcode = header.opcode, "request handler panicked");
            Response::Error(CqlError::server(
                "Internal error while executing the request",
            ))
        }
    };
    // The answer to STARTUP is never compressed; everything after it is, if agreed.
    let compress = compressed_connection && header.opcode != opcode::STARTUP;
    let mut out = Vec::new();
    match trace.filter(|_| trace_requested) {
        Some(trace) => {
            let (op, body) = response.encode();
            frame::write_traced_frame(
                &mut out,
                header.stream,
                op,
                &body,
                compress,
                Some(trace.id()),
            );
        }
        None => encode_frame(&mut out, header.stream, &response, compress),
    }
    out
}

async fn respond(
    header: FrameHeader,
    body: Vec<u8>,
    state: &Arc<ConnectionState>,
    coordinator: &Arc<Coordinator>,
    events: &Arc<EventBus>,
    output: &mpsc::Sender<Vec<u8>>,
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
            (
                LWT_MARK_EXTENSION.into(),
                vec![format!("{LWT_MARK_KEY}={LWT_MARK}")],
            ),
        ])),
        Request::Startup(options) => {
            if started {
                return Err(CqlError::protocol(
                    "Unexpected message STARTUP, the connection is already initialized",
                ));
            }
            // Like Cassandra, any well-formed CQL_VERSION is accepted (drivers send 3.0.0,
            // 3.4.x or 4.0.0); it must be present.
            if !options
                .iter()
                .any(|(key, _)| key.eq_ignore_ascii_case("CQL_VERSION"))
            {
                return Err(CqlError::protocol(
                    "Missing value CQL_VERSION in STARTUP message",
                ));
            }
            for (key, value) in &options {
                if key == LWT_MARK_EXTENSION {
                    let mark = value
                        .strip_prefix(LWT_MARK_KEY)
                        .and_then(|rest| rest.strip_prefix('='))
                        .and_then(|mark| mark.parse::<u32>().ok());
                    match mark {
                        Some(mark) if mark != 0 => state.lwt_mark.store(mark, Ordering::Relaxed),
                        _ => {
                            return Err(CqlError::protocol(format!(
                                "Invalid {LWT_MARK_EXTENSION} option: {value:?}"
                            )))
                        }
                    }
                }
                if key.to_ascii_uppercase().as_str() == "COMPRESSION" {
                    match value.to_ascii_lowercase().as_str() {
                        "lz4" => state.compression.store(true, Ordering::Relaxed),
                        "" => {}
                        other => {
                            return Err(CqlError::protocol(format!(
                                "Unknown compression algorithm: {other}"
                            )))
                        }
                    }
                }
            }
            state.started.store(true, Ordering::Release);
            if coordinator.auth_settings().authentication {
                return Ok(Response::Authenticate(
                    shoal_auth::PASSWORD_AUTHENTICATOR.into(),
                ));
            }
            state.authenticated.store(true, Ordering::Release);
            Ok(Response::Ready)
        }
        _ if !started => Err(CqlError::protocol(format!(
            "Unexpected message {:#04x}, expecting STARTUP or OPTIONS",
            header.opcode
        ))),
        Request::AuthResponse(token) => {
            if !coordinator.auth_settings().authentication {
                return Err(CqlError::protocol(
                    "Authentication is not enabled on this node",
                ));
            }
            if state.authenticated.load(Ordering::Acquire) {
                return Err(CqlError::protocol(
                    "Unexpected message AUTH_RESPONSE, the client has already logged in",
                ));
            }
            let user = log_in(coordinator, &token).await?;
            state.session.lock().user = Some(user);
            state.authenticated.store(true, Ordering::Release);
            Ok(Response::AuthSuccess(None))
        }
        _ if !state.authenticated.load(Ordering::Acquire) => Err(CqlError::new(
            shoal_cql::ErrorCode::Unauthorized,
            "You have not logged in",
        )),
        Request::Register(kinds) => {
            events.subscribe(
                &kinds,
                output.clone(),
                state.compression.load(Ordering::Relaxed),
            )?;
            Ok(Response::Ready)
        }
        Request::Query { query, parameters } => {
            let mut session = state.session.lock().clone();
            let result = coordinator.query(&mut session, &query, &parameters).await?;
            Ok(finish_result(state, events, result))
        }
        Request::Prepare { query } => {
            let session = state.session.lock().clone();
            let result = coordinator.prepare(&session, &query)?;
            Ok(finish_result(state, events, result))
        }
        Request::Execute { id, parameters } => {
            let mut session = state.session.lock().clone();
            let result = coordinator.execute(&mut session, &id, &parameters).await?;
            Ok(finish_result(state, events, result))
        }
        Request::Batch(batch) => {
            let mut session = state.session.lock().clone();
            let result = coordinator.batch(&mut session, &batch).await?;
            Ok(finish_result(state, events, result))
        }
    }
}

/// Applies `USE` to the connection, publishes schema changes to registered clients and
/// marks prepared lightweight transactions for a client that asked for the mark.
fn finish_result(state: &ConnectionState, events: &EventBus, mut result: ResultBody) -> Response {
    match &mut result {
        ResultBody::Prepared(prepared) => {
            prepared.lwt_mark = match state.lwt_mark.load(Ordering::Relaxed) {
                0 => None,
                mark => Some(mark),
            };
        }
        ResultBody::SetKeyspace(keyspace) => {
            state.session.lock().keyspace = Some(keyspace.clone());
        }
        ResultBody::SchemaChange(change) => {
            events.publish(Event::SchemaChange(change.clone()));
        }
        _ => {}
    }
    Response::Result(result)
}

#[cfg(test)]
mod tests;
