//! Local secondary indexes, the replication side.
//!
//! Every replica indexes the rows it stores: whatever applies cells on this node — a
//! client's write, a hint, read repair, anti-entropy repair, a replayed batch — goes
//! through [`LocalReplica`], which asks [`LocalIndexes`] (the coordinator's index catalog)
//! for the index entries those cells add and writes them in the same atomic batch. So an
//! index is never behind the data it indexes on any replica; entries of values since
//! overwritten or deleted remain until they expire with their cell, and every query checks
//! its hits against the rows themselves.
//!
//! A query asks replicas for *candidates* — base partitions with an entry for the value —
//! tablet by tablet in token order, from as many replicas per tablet as the consistency
//! level needs ([`StorageProxy::index_candidates`]); the coordinator then reads those
//! partitions like a scan and filters them ([`IndexLookup`], `ReplicaRequest::IndexLookup`).

use crate::consistency::{unavailable, READ_TIMEOUT};
use crate::messages::{Cells, PartitionRef, ReplicaRequest, ReplicaResponse};
use crate::proxy::StorageProxy;
use crate::replica::read_visible;
use crate::topology::{requirement, Replica};
use serde::{Deserialize, Serialize};
use shoal_cql::request::Consistency;
use shoal_cql::CqlError;
use shoal_model::{keys, TableId, Token};
use shoal_storage::Engine;

/// What this node's index catalog provides to its replica.
pub trait LocalIndexes: Send + Sync {
    /// Appends to `out` the index entries that `cells` (about to be applied) add.
    fn entries(&self, cells: &Cells, out: &mut Cells);

    /// Candidates for `lookup` with tokens up to `upto`, in token order: from the index
    /// entries once this node's index covers everything it stores ([`lookup_candidates`]),
    /// from a scan of the data itself while the index is still being built here.
    fn candidates(
        &self,
        engine: &dyn Engine,
        lookup: &IndexLookup,
        upto: Token,
    ) -> Result<Vec<PartitionRef>, String>;
}

/// Candidates for one indexed value: the base partitions of `table` that have an entry
/// for `value` in `index`, from token `from` on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexLookup {
    pub table: TableId,
    pub index: TableId,
    /// The value's byte-comparable encoding.
    pub value: Vec<u8>,
    pub from: Token,
    /// At most this many partitions.
    pub limit: u32,
}

/// Entries read per lookup chunk on a replica.
const LOOKUP_CHUNK_CELLS: u32 = 4096;

/// Answers a lookup from this node's index: the distinct base partitions with a visible
/// entry for the value whose token lies in `[from, upto]`, in token order, at most
/// `limit` of them.
pub fn lookup_candidates(
    engine: &dyn Engine,
    lookup: &IndexLookup,
    upto: Token,
) -> Result<Vec<PartitionRef>, String> {
    let (mut lower, upper) = keys::index_value_range(&lookup.index, &lookup.value, lookup.from);
    let mut found: Vec<PartitionRef> = Vec::new();
    loop {
        let (cells, complete) = read_visible(engine, &lower, &upper, LOOKUP_CHUNK_CELLS)?;
        for (key, _) in &cells {
            let Some((token, partition_key)) = keys::index_entry_base(key) else {
                continue;
            };
            if token > upto || !add_candidate(&mut found, token, partition_key, lookup.limit) {
                return Ok(found);
            }
        }
        match cells.last() {
            Some((last, _)) if !complete => {
                lower = last.clone();
                lower.push(0);
            }
            _ => return Ok(found),
        }
    }
}

/// Adds the base partition of one entry (entries come in token order, several per
/// partition) to `found`; `false` once `limit` partitions are found and this is another.
pub fn add_candidate(
    found: &mut Vec<PartitionRef>,
    token: Token,
    partition_key: &[u8],
    limit: u32,
) -> bool {
    let same = found
        .last()
        .is_some_and(|(t, k)| *t == token && k.as_slice() == partition_key);
    if same {
        return true;
    }
    if found.len() >= limit as usize {
        return false;
    }
    found.push((token, partition_key.to_vec()));
    true
}

impl StorageProxy {
    /// Candidates for `lookup` across the table's tablets in token order, each tablet's
    /// from as many live replicas as `consistency` needs (this node first): a partition
    /// whose write reached that level has its entry on one of them. At most
    /// `lookup.limit` partitions; fewer means no more exist.
    pub async fn index_candidates(
        &self,
        lookup: IndexLookup,
        consistency: Consistency,
    ) -> Result<Vec<PartitionRef>, CqlError> {
        let _in_flight = self.enter();
        let state = self.topology.state();
        let placement = state
            .tables
            .get(&lookup.table)
            .ok_or_else(|| CqlError::invalid("the table was dropped during the query"))?;
        let mut found: Vec<PartitionRef> = Vec::new();
        let mut from = lookup.from;
        // The replicas a tablet's lookup asks (live ones, this node first, as many as the
        // level needs), by host.
        let asked_for = |token: Token| -> Result<Vec<Replica>, CqlError> {
            let replicas = self.replicas_of(&state, &lookup.table, token);
            let needed = requirement(self.local_datacenter(), consistency, &replicas);
            let mut alive: Vec<&Replica> = replicas.replicas.iter().filter(|r| r.alive).collect();
            alive.sort_by_key(|r| !r.local);
            let mut asked: Vec<Replica> = Vec::new();
            for replica in alive {
                if needed.met_by(asked.iter().map(|r| r.datacenter.as_str())) {
                    break;
                }
                asked.push(replica.clone());
            }
            if !needed.met_by(asked.iter().map(|r| r.datacenter.as_str())) {
                let alive = replicas.replicas.iter().filter(|r| r.alive).count();
                return Err(unavailable(consistency, needed.block_for(), alive));
            }
            Ok(asked)
        };
        let same_hosts = |a: &[Replica], b: &[Replica]| {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.host_id == y.host_id)
        };
        loop {
            let mut tablet = placement.tablets.tablet_for(from);
            let asked = asked_for(from)?;
            // Consecutive tablets with the same replicas to ask are one lookup each.
            while tablet.last_token != Token::MAX {
                let next_first = Token(tablet.last_token.0 + 1);
                let next = placement.tablets.tablet_for(next_first);
                if !same_hosts(&asked, &asked_for(next_first)?) {
                    break;
                }
                tablet = next;
            }
            let request = IndexLookup {
                from,
                limit: lookup.limit.saturating_sub(found.len() as u32),
                ..lookup.clone()
            };
            let answers = asked.iter().map(|replica| {
                let call = self.call(
                    replica,
                    ReplicaRequest::IndexLookup {
                        lookup: request.clone(),
                        upto: tablet.last_token,
                    },
                    READ_TIMEOUT,
                );
                async move {
                    match call.await {
                        Ok(ReplicaResponse::Partitions(partitions)) => Ok(partitions),
                        Ok(other) => Err(format!("unexpected answer {other:?}")),
                        Err(error) => Err(error),
                    }
                }
            });
            let mut union: Vec<PartitionRef> = Vec::new();
            for answer in futures::future::join_all(answers).await {
                union.extend(answer.map_err(CqlError::invalid)?);
            }
            union.sort();
            union.dedup();
            union.truncate(request.limit as usize);
            found.extend(union);
            if found.len() >= lookup.limit as usize || tablet.last_token == Token::MAX {
                return Ok(found);
            }
            from = Token(tablet.last_token.0 + 1);
        }
    }
}
