//! Which requests run as tasks of their own on the node's shared runtime rather than in
//! their connection's task (reads that may return many rows), and running them so.

use super::*;

/// Whether a request runs as a task of its own rather than inside its connection's task:
/// reads that may return many rows. An EXECUTE's class is its prepared statement's plan
/// (known after its first execution on this node; a compressed body is not looked into);
/// a QUERY's is judged by its first word, since it is not parsed yet: every SELECT.
pub(super) fn runs_apart(header: &FrameHeader, body: &[u8], coordinator: &Coordinator) -> bool {
    use shoal_coordinator::class::StatementClass;
    if header.flags & frame::flags::COMPRESSION != 0 {
        return false;
    }
    match header.opcode {
        opcode::EXECUTE => {
            let Some(id) = prepared_id(body) else {
                return false;
            };
            matches!(
                coordinator.prepared_class(id),
                Some(StatementClass::Scan | StatementClass::PartitionSlice)
            )
        }
        opcode::QUERY => query_text_start(body).is_some_and(|start| {
            start
                .get(..6)
                .is_some_and(|word| word.eq_ignore_ascii_case(b"select"))
        }),
        _ => false,
    }
}

/// The statement id an EXECUTE body starts with (`[short bytes]`).
pub(super) fn prepared_id(body: &[u8]) -> Option<&[u8]> {
    let length = u16::from_be_bytes([*body.first()?, *body.get(1)?]) as usize;
    body.get(2..2 + length)
}

/// A QUERY body's text (`[long string]`) from its first non-blank byte.
pub(super) fn query_text_start(body: &[u8]) -> Option<&[u8]> {
    let length = i32::from_be_bytes(body.get(..4)?.try_into().ok()?);
    let text = body.get(4..4 + usize::try_from(length).ok()?)?;
    let blank = text.iter().take_while(|b| b.is_ascii_whitespace()).count();
    Some(&text[blank..])
}

/// `request` spawned as a task; the future answers with its frame. Dropping the future
/// (the connection closed) aborts the task: nobody is left to read its rows.
pub(super) fn run_apart(
    runtime: &Handle,
    request: impl std::future::Future<Output = Vec<u8>> + Send + 'static,
    stream: i16,
    compress: bool,
) -> BoxFuture<'static, Vec<u8>> {
    let mut task = crate::AbortOnDrop(runtime.spawn(request));
    async move {
        (&mut task.0).await.unwrap_or_else(|_| {
            let error = CqlError::server("Internal error while executing the request");
            error_frame(stream, error, compress)
        })
    }
    .boxed()
}
