//! Counter increments, the replication side (design: `docs/decisions/0010-counters.md`).
//!
//! An increment is applied by one replica of its partition, the *leader*, which adds the
//! delta to its own shard and then writes the new shard total to every replica like any
//! other write ([`StorageProxy::write`] with [`WriteType::Counter`]). This module picks the
//! leader — this node when it is a live replica of the partition, else a live replica in
//! its datacenter, else any live one — and forwards increments to a leader elsewhere
//! ([`ReplicaRequest::Increment`]). What the leader does with them is the coordinator's
//! (it reads its shard as CQL sees the row, deletions included).

use crate::consistency::{unavailable, write_timeout, WriteType, WRITE_TIMEOUT};
use crate::messages::{CounterUpdate, ReplicaRequest, ReplicaResponse};
use crate::proxy::StorageProxy;
use crate::topology::{requirement, Replica};
use shoal_cql::request::Consistency;
use shoal_cql::CqlError;
use shoal_model::{TableId, Token};

/// Who applies an increment first.
#[derive(Debug, Clone)]
pub enum CounterLeader {
    /// This node: it is a live replica of the partition.
    Here,
    /// Another live replica; `block_for` is how many acknowledgements the level needs
    /// (for the `WriteTimeout` reported when the leader does not answer).
    Elsewhere { replica: Replica, block_for: usize },
}

impl StorageProxy {
    /// The leader of increments of `token` in `table` at `consistency`: `Unavailable`
    /// when too few replicas are alive to meet it.
    pub fn counter_leader(
        &self,
        table: TableId,
        token: Token,
        consistency: Consistency,
    ) -> Result<CounterLeader, CqlError> {
        let state = self.topology.state();
        let replicas = self.replicas_of(&state, &table, token);
        let needed = requirement(self.local_datacenter(), consistency, &replicas);
        let alive: Vec<&Replica> = replicas.replicas.iter().filter(|r| r.alive).collect();
        if !needed.met_by(alive.iter().map(|r| r.datacenter.as_str())) {
            return Err(unavailable(consistency, needed.block_for(), alive.len()));
        }
        if alive.iter().any(|r| r.local) {
            return Ok(CounterLeader::Here);
        }
        let local_datacenter = self.local_datacenter();
        let chosen = alive
            .iter()
            .find(|r| r.datacenter == local_datacenter)
            .or(alive.first())
            .ok_or_else(|| unavailable(consistency, needed.block_for(), 0))?;
        Ok(CounterLeader::Elsewhere {
            replica: (*chosen).clone(),
            block_for: needed.block_for(),
        })
    }

    /// Sends increments to their leader on another node and waits for it to meet the
    /// level. Any failure is an unknown outcome (the leader may have applied them):
    /// `WriteTimeout` with write type `COUNTER`, as Cassandra reports it.
    pub async fn forward_increment(
        &self,
        leader: &Replica,
        block_for: usize,
        update: CounterUpdate,
    ) -> Result<(), CqlError> {
        let consistency = Consistency::from_code(update.consistency)?;
        // The leader itself waits up to WRITE_TIMEOUT for the replicas.
        let answer = self
            .call(
                leader,
                ReplicaRequest::Increment(update),
                WRITE_TIMEOUT + WRITE_TIMEOUT / 2,
            )
            .await;
        match answer {
            Ok(ReplicaResponse::Applied) => Ok(()),
            Ok(other) => {
                tracing::debug!(?other, "unexpected answer from a counter leader");
                Err(write_timeout(consistency, 0, block_for, WriteType::Counter))
            }
            Err(error) => {
                tracing::debug!(%error, leader = %leader.address, "counter leader failed");
                Err(write_timeout(consistency, 0, block_for, WriteType::Counter))
            }
        }
    }
}
