//! Requests with tracing on: what `system_traces.sessions` records of them, and their
//! answer run inside the trace's scope; and the SASL login check.

use super::*;

/// `responding` run inside `trace`'s scope, boxed (tracing is rare; the box keeps the
/// traced future out of every request's future).
pub(super) fn boxed_in_trace<'a, F: std::future::Future + Send + 'a>(
    trace: &Arc<shoal_trace::Trace>,
    responding: F,
) -> BoxFuture<'a, F::Output> {
    Box::pin(Arc::clone(trace).scope(responding))
}

/// What `system_traces.sessions` says of a traced request: its message, the query and
/// the consistency level (decoded again: tracing is rare, and the request's own decoding
/// stays where it is).
pub(super) fn traced_request(
    header: FrameHeader,
    body: &[u8],
    state: &ConnectionState,
    coordinator: &Coordinator,
    limits: ConnectionLimits,
) -> TracedRequest {
    let client = state
        .peer
        .map_or(std::net::IpAddr::from([0, 0, 0, 0]), |peer| peer.ip());
    let command = match header.opcode {
        opcode::QUERY => "QUERY",
        opcode::PREPARE => "PREPARE",
        opcode::EXECUTE => "EXECUTE",
        _ => "BATCH",
    };
    let mut traced = TracedRequest::new(client, command);
    let body = if header.flags & frame::flags::COMPRESSION != 0 {
        frame::decompress_body(body, limits.max_frame_bytes).ok()
    } else {
        Some(body.to_vec())
    };
    let Some(Ok(request)) = body.map(|body| Request::decode(header.opcode, &body)) else {
        return traced;
    };
    let mut parameter = |name: &str, value: String| traced.parameters.push((name.into(), value));
    match request {
        Request::Query { query, parameters } => {
            parameter("query", query);
            parameter("consistency_level", parameters.consistency.name().into());
            if let Some(page_size) = parameters.page_size {
                parameter("page_size", page_size.to_string());
            }
        }
        Request::Execute { id, parameters } => {
            if let Some(text) = coordinator.prepared_text(&id) {
                parameter("query", text);
            }
            parameter("consistency_level", parameters.consistency.name().into());
            if let Some(page_size) = parameters.page_size {
                parameter("page_size", page_size.to_string());
            }
        }
        Request::Prepare { query } => parameter("query", query),
        Request::Batch(batch) => {
            parameter("consistency_level", batch.consistency.name().into());
            parameter("batch_size", batch.statements.len().to_string());
        }
        _ => {}
    }
    traced
}

/// Checks a SASL PLAIN response on a blocking thread (bcrypt is slow by design); returns
/// the role logged in as.
pub(super) async fn log_in(
    coordinator: &Arc<Coordinator>,
    token: &[u8],
) -> Result<String, CqlError> {
    let credentials = shoal_auth::password::PlainCredentials::decode(token)?;
    let roles = Arc::clone(coordinator.roles());
    tokio::task::spawn_blocking(move || {
        roles
            .authenticate(&credentials.username, &credentials.password)
            .map(|access| access.role.clone())
    })
    .await
    .map_err(|_| CqlError::server("the login check failed"))?
}
