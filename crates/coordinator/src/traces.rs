//! Finished query traces, written to `system_traces` where drivers and cqlsh read them.
//!
//! The server decides which requests are traced (the client's tracing flag, or the
//! node's [`shoal_trace::Sampler`]) and runs them inside a [`shoal_trace::Trace`]; when
//! one finishes, [`Coordinator::record_trace`] writes its session row and its events as
//! one unlogged batch at consistency ONE, with Cassandra's one-day TTL, in the background:
//! the client has its answer already and polls `system_traces.sessions` until `duration`
//! is there (as every driver does). The writes are internal: no permission check, and
//! they do not count in the request metrics.

use crate::prepared::PreparedStatement;
use crate::values::{timeuuid_at, Bindings};
use crate::{plan::Plan, Coordinator, Session};
use shoal_cql::request::BoundValue;
use shoal_cql::request::Consistency;
use shoal_cql::CqlError;
use shoal_trace::Trace;
use std::net::IpAddr;
use std::sync::Arc;

/// How long traces are kept (Cassandra's `trace_type_query_ttl`).
pub const TRACE_TTL_SECONDS: u32 = 86_400;

/// The request a trace is of, as `system_traces.sessions` describes it.
#[derive(Debug, Clone)]
pub struct TracedRequest {
    /// The client's address.
    pub client: IpAddr,
    /// The protocol message: `QUERY`, `EXECUTE`, `BATCH`, `PREPARE`.
    pub command: &'static str,
    /// What Cassandra calls the request ("Execute CQL3 query", …).
    pub request: &'static str,
    /// `query`, `consistency_level`, `page_size`…
    pub parameters: Vec<(String, String)>,
}

impl TracedRequest {
    /// The request a protocol message is, by its opcode name.
    pub fn new(client: IpAddr, command: &'static str) -> TracedRequest {
        let request = match command {
            "QUERY" => "Execute CQL3 query",
            "EXECUTE" => "Execute CQL3 prepared query",
            "BATCH" => "Execute batch of CQL3 queries",
            "PREPARE" => "Preparing CQL3 query",
            _ => "Execute CQL3 request",
        };
        TracedRequest {
            client,
            command,
            request,
            parameters: Vec::new(),
        }
    }
}

const INSERT_SESSION: &str = "INSERT INTO system_traces.sessions (session_id, client, command, coordinator, coordinator_port, duration, parameters, request, started_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) USING TTL 86400";
const INSERT_EVENT: &str = "INSERT INTO system_traces.events (session_id, event_id, activity, source, source_elapsed, thread) VALUES (?, ?, ?, ?, ?, ?) USING TTL 86400";

fn bytes(value: impl Into<Vec<u8>>) -> BoundValue {
    BoundValue::Bytes(value.into())
}

fn inet(address: IpAddr) -> BoundValue {
    match address {
        IpAddr::V4(v4) => bytes(v4.octets()),
        IpAddr::V6(v6) => bytes(v6.octets()),
    }
}

fn int(value: i64) -> BoundValue {
    let clamped = value.clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32;
    bytes(clamped.to_be_bytes())
}

fn text_map(entries: &[(String, String)]) -> BoundValue {
    let mut out = Vec::new();
    out.extend_from_slice(&(entries.len() as i32).to_be_bytes());
    for (key, value) in entries {
        for part in [key, value] {
            out.extend_from_slice(&(part.len() as i32).to_be_bytes());
            out.extend_from_slice(part.as_bytes());
        }
    }
    bytes(out)
}

/// A plan as the trace event before it runs describes it.
pub(crate) fn describe_plan(plan: &Plan, consistency: Consistency) -> String {
    let (class, table) = match plan {
        Plan::Select(select) => (select.class, Some(&select.table)),
        Plan::Modify(modify) => (modify.class, Some(&modify.table)),
        Plan::Statement(statement) => (crate::plan::statement_class(statement), None),
    };
    match table {
        Some(table) => format!(
            "Executing {} on {}.{} at consistency {}",
            class.name(),
            table.keyspace,
            table.name,
            consistency.name()
        ),
        None => format!("Executing {} statement", class.name()),
    }
}

impl Coordinator {
    /// Which untraced requests this node traces anyway (`settraceprobability`).
    pub fn trace_sampler(&self) -> &shoal_trace::Sampler {
        &self.trace_sampler
    }

    /// Writes `trace` (finished now) to `system_traces` in the background.
    pub fn record_trace(self: &Arc<Self>, trace: Arc<Trace>, request: TracedRequest) {
        let duration = trace.elapsed_micros();
        let coordinator = Arc::clone(self);
        tokio::spawn(async move {
            if let Err(error) = coordinator.write_trace(&trace, duration, &request).await {
                tracing::debug!(message = %error.message, "could not write a query trace");
            }
        });
    }

    pub(crate) async fn write_trace(
        &self,
        trace: &Trace,
        duration_micros: i64,
        request: &TracedRequest,
    ) -> Result<(), CqlError> {
        let session_id = bytes(trace.id());
        let me = self.info.address;
        let mut rows: Vec<(&'static str, Vec<BoundValue>)> = vec![(
            INSERT_SESSION,
            vec![
                session_id.clone(),
                inet(request.client),
                bytes(request.command),
                inet(me),
                int(i64::from(self.info.cql_port)),
                int(duration_micros),
                text_map(&request.parameters),
                bytes(request.request),
                bytes((trace.started_at_micros() / 1000).to_be_bytes()),
            ],
        )];
        for event in trace.events() {
            rows.push((
                INSERT_EVENT,
                vec![
                    session_id.clone(),
                    bytes(timeuuid_at(event.at_micros)),
                    bytes(event.activity),
                    inet(me),
                    int(event.elapsed_micros),
                    bytes(event.thread),
                ],
            ));
        }
        let internal = Session::default();
        let mut plans = Vec::with_capacity(2);
        for text in [INSERT_SESSION, INSERT_EVENT] {
            match PreparedStatement::parse(text, None)?.plan(self, &internal)? {
                Plan::Modify(plan) => plans.push((text, plan)),
                _ => return Err(CqlError::server("a trace insert did not plan as a write")),
            }
        }
        let statements: Vec<_> = rows
            .iter()
            .filter_map(|(text, values)| {
                let (_, plan) = plans.iter().find(|(t, _)| t == text)?;
                Some((
                    plan.as_ref(),
                    Bindings {
                        values,
                        names: None,
                    },
                ))
            })
            .collect();
        // Events first, then the session row that tells readers the trace is complete;
        // each on every replica when they are all up (so a reader asking any one of them
        // at ONE, as drivers do, sees the whole trace once it sees the session), else on
        // one.
        let (sessions, events) = statements.split_at(1);
        self.write_trace_rows(events).await?;
        self.write_trace_rows(sessions).await
    }

    async fn write_trace_rows(
        &self,
        statements: &[(&crate::modify::ModifyPlan, Bindings<'_>)],
    ) -> Result<(), CqlError> {
        if statements.is_empty() {
            return Ok(());
        }
        let apply = |consistency| {
            crate::modify::batch::apply(
                self,
                statements,
                (consistency, None),
                shoal_cql::ast::BatchType::Unlogged,
                (None, None),
            )
        };
        match apply(Consistency::All).await {
            Ok(_) => Ok(()),
            Err(_) => apply(Consistency::One).await.map(drop),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_are_encoded_as_the_protocol_encodes_them() {
        let BoundValue::Bytes(encoded) = text_map(&[("query".into(), "SELECT".into())]) else {
            panic!("a map is bytes");
        };
        assert_eq!(
            encoded,
            [
                &[0, 0, 0, 1, 0, 0, 0, 5][..],
                b"query",
                &[0, 0, 0, 6],
                b"SELECT"
            ]
            .concat()
        );
    }

    #[test]
    fn ints_saturate_instead_of_wrapping() {
        assert!(matches!(int(i64::MAX), BoundValue::Bytes(b) if b == i32::MAX.to_be_bytes()));
    }
}
