//! Frames on the wire: encoding a message or a reply (with its attachment after it),
//! reading one frame whole through a connection's buffer, and writing every ready frame
//! in one socket write.

use super::*;

/// A frame ready to be written: its head (length, version, id and the encoded message)
/// and the attachment that follows it — a streamed chunk's cells, empty for every other
/// message — which is written from where it is rather than copied into the head.
pub(super) struct Frame {
    pub(super) head: Vec<u8>,
    pub(super) attachment: Bytes,
}

impl Frame {
    fn len(&self) -> usize {
        self.head.len() + self.attachment.len()
    }
}

/// Encodes a frame; a message too large for a peer to accept is an error here, before it
/// is sent, rather than a closed connection that fails every request in flight on it.
pub(super) fn encode_frame(id: u64, payload: &impl Serialize) -> Result<Vec<u8>, String> {
    encode_frame_within(id, payload, 0, MAX_FRAME_BYTES)
}

/// Encodes a reply, with its attachment ([`Reply::attachment`]) after it.
pub(super) fn encode_reply(id: u64, reply: &Reply) -> Result<Frame, String> {
    let attachment = reply.attachment().cloned().unwrap_or_default();
    let head = encode_frame_within(id, reply, attachment.len(), MAX_FRAME_BYTES)?;
    Ok(Frame { head, attachment })
}

/// The head of a frame whose encoded `payload` is followed by `attachment_bytes`.
pub(super) fn encode_frame_within(
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
pub(super) fn decode_reply(body: Vec<u8>) -> Reply {
    let mut reply: Reply = match bincode::deserialize(&body) {
        Ok(reply) => reply,
        Err(error) => return Reply::Error(format!("undecodable reply: {error}")),
    };
    if reply.attachment().is_none() {
        crate::large_buffers::give_back(body);
        return reply;
    }
    let encoded = match bincode::serialized_size(&reply) {
        Ok(encoded) if encoded as usize <= body.len() => encoded as usize,
        _ => return Reply::Error("a reply shorter than its encoding".into()),
    };
    if let Some(attachment) = reply.attachment_mut() {
        *attachment = crate::large_buffers::into_bytes(body).slice(encoded..);
    }
    reply
}

/// Reads one frame: `(id, payload)`; `None` at a clean end of stream. A frame of another
/// protocol version, or of an impossible length, is an error that ends the connection.
pub(super) async fn read_frame(
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
    // and zeroing them first costs as much as copying them in. A chunk's buffer is one
    // used before where there is one (`large_buffers`).
    let body_length = length - HEADER_BYTES;
    let mut body = crate::large_buffers::take(body_length);
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
pub(super) const WRITE_DIRECTLY_BYTES: usize = 64 * 1024;

/// Writes queued frames, coalescing whatever small ones are ready into one write.
pub(super) async fn write_frames(
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
