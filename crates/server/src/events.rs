//! Server-pushed events (protocol EVENT frames, stream id -1) to connections that
//! REGISTERed for them: SCHEMA_CHANGE when a schema change is applied here (whichever node
//! made it), TOPOLOGY_CHANGE when a member has joined, STATUS_CHANGE when the failure
//! detector sees a member go down or come back (`crate::membership`; a member still joining
//! is announced only once it is normal).

use parking_lot::Mutex;
use shoal_cql::frame;
use shoal_cql::response::{Event, Response};
use shoal_cql::CqlError;
use tokio::sync::mpsc;

const KNOWN_EVENTS: [&str; 3] = ["TOPOLOGY_CHANGE", "STATUS_CHANGE", "SCHEMA_CHANGE"];

struct Subscriber {
    kinds: Vec<String>,
    frames: mpsc::Sender<Vec<u8>>,
    compress: bool,
}

/// Connections registered for events.
#[derive(Default)]
pub struct EventBus {
    subscribers: Mutex<Vec<Subscriber>>,
}

impl EventBus {
    pub fn subscribe(
        &self,
        kinds: &[String],
        frames: mpsc::Sender<Vec<u8>>,
        compress: bool,
    ) -> Result<(), CqlError> {
        for kind in kinds {
            if !KNOWN_EVENTS.contains(&kind.as_str()) {
                return Err(CqlError::protocol(format!(
                    "Invalid value '{kind}' for Type"
                )));
            }
        }
        let mut subscribers = self.subscribers.lock();
        subscribers.retain(|s| !s.frames.is_closed());
        subscribers.push(Subscriber {
            kinds: kinds.to_vec(),
            frames,
            compress,
        });
        Ok(())
    }

    pub fn publish(&self, event: Event) {
        let kind = match &event {
            Event::SchemaChange(_) => "SCHEMA_CHANGE",
            Event::TopologyChange { .. } => "TOPOLOGY_CHANGE",
            Event::StatusChange { .. } => "STATUS_CHANGE",
        };
        let (op, body) = Response::Event(event).encode();
        let mut subscribers = self.subscribers.lock();
        subscribers.retain(|s| !s.frames.is_closed());
        for subscriber in subscribers
            .iter()
            .filter(|s| s.kinds.iter().any(|k| k == kind))
        {
            let mut out = Vec::new();
            frame::write_frame(&mut out, -1, op, &body, subscriber.compress);
            // A subscriber too slow to take events loses them rather than blocking us.
            let _ = subscriber.frames.try_send(out);
        }
    }
}
