//! TRUNCATE across the cluster: every member removes the table's data; every member must
//! be up, as in Cassandra.

use crate::consistency::WRITE_TIMEOUT;
use crate::messages::{ReplicaRequest, ReplicaResponse};
use crate::proxy::StorageProxy;
use shoal_cql::request::Consistency;
use shoal_cql::{CqlError, ErrorCode};
use shoal_model::TableId;

impl StorageProxy {
    /// Removes `table`'s data on every member.
    pub async fn truncate(&self, table: TableId) -> Result<(), CqlError> {
        let state = self.topology.state();
        let me = self.topology.me().host_id;
        let down: Vec<String> = state
            .members
            .values()
            .filter(|m| m.host_id != me && !self.liveness.is_alive(&m.host_id))
            .map(|m| m.internode_address.ip().to_string())
            .collect();
        if !down.is_empty() {
            return Err(CqlError::new(
                ErrorCode::Unavailable {
                    consistency: Consistency::All.code(),
                    required: state.members.len() as i32,
                    alive: (state.members.len() - down.len()) as i32,
                },
                format!(
                    "Cannot achieve consistency level ALL: TRUNCATE needs every node up, and {} {} down",
                    down.join(", "),
                    if down.len() == 1 { "is" } else { "are" }
                ),
            ));
        }
        let mut calls = Vec::new();
        for member in state.members.values() {
            if member.host_id == me {
                continue;
            }
            calls.push(self.transport.send(
                member.internode_address,
                ReplicaRequest::Truncate(table),
                state.topology_version,
                WRITE_TIMEOUT,
            ));
        }
        self.local
            .truncate(table)
            .await
            .map_err(|e| CqlError::server(format!("could not remove the table's data: {e}")))?;
        for result in futures::future::join_all(calls).await {
            match result {
                Ok(ReplicaResponse::Applied) => {}
                Ok(ReplicaResponse::Error(e)) | Err(e) => {
                    return Err(CqlError::new(
                        ErrorCode::Truncate,
                        format!("Error during truncate: {e}"),
                    ))
                }
                Ok(_) => {}
            }
        }
        Ok(())
    }
}
