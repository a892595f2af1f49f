//! Which replicas hold a key, as one request sees them: the cluster's tablet map (through
//! a [`Topology`]) joined with the failure detector's view ([`crate::Liveness`]).

use crate::consistency::{unavailable, Requirement};
use crate::transport::Liveness;
use shoal_cluster::{ClusterMetadata, ClusterState, Member};
use shoal_cql::request::Consistency;
use shoal_cql::CqlError;
use shoal_model::{HostId, TableId, Token};
use shoal_placement::ReplicationStrategy;
use std::net::SocketAddr;
use std::sync::Arc;

/// The cluster as this node has applied it. [`ClusterMetadata`] is the real one; tests
/// use a fixed [`ClusterState`].
pub trait Topology: Send + Sync + 'static {
    /// This node.
    fn me(&self) -> &Member;
    /// The members, schema and tablets as applied on this node.
    fn state(&self) -> Arc<ClusterState>;
}

impl Topology for ClusterMetadata {
    fn me(&self) -> &Member {
        ClusterMetadata::me(self)
    }

    fn state(&self) -> Arc<ClusterState> {
        ClusterMetadata::state(self)
    }
}

/// A replica as one request sees it.
#[derive(Debug, Clone)]
pub struct Replica {
    pub host_id: HostId,
    pub address: SocketAddr,
    pub datacenter: String,
    /// This node.
    pub local: bool,
    /// Up as far as the failure detector knows (this node always is).
    pub alive: bool,
}

impl Replica {
    /// `member` as a live replica; `local` when it is this node.
    pub(crate) fn of(member: &Member, local: bool) -> Replica {
        Replica {
            host_id: member.host_id,
            address: member.internode_address,
            datacenter: member.datacenter.clone(),
            local,
            alive: true,
        }
    }
}

/// A tablet's replicas for one request, with the keyspace's replication.
#[derive(Debug, Clone)]
pub struct TabletReplicas {
    pub(crate) replicas: Vec<Replica>,
    pub(crate) strategy: Option<ReplicationStrategy>,
}

impl std::ops::Deref for TabletReplicas {
    type Target = [Replica];
    fn deref(&self) -> &[Replica] {
        &self.replicas
    }
}

/// The replicas of the tablet of `table` holding `token`, primary first.
pub(crate) fn replicas_of(
    me: &Member,
    liveness: &dyn Liveness,
    state: &ClusterState,
    table: &TableId,
    token: Token,
) -> TabletReplicas {
    let replicas = state
        .replicas(table, token)
        .unwrap_or(&[])
        .iter()
        .filter_map(|host| state.member_by_host(host))
        .map(|member| Replica {
            host_id: member.host_id,
            address: member.internode_address,
            datacenter: member.datacenter.clone(),
            local: member.host_id == me.host_id,
            alive: member.host_id == me.host_id || liveness.is_alive(&member.host_id),
        })
        .collect();
    TabletReplicas {
        replicas,
        strategy: state.tables.get(table).map(|p| p.strategy.clone()),
    }
}

/// What `consistency` needs for a tablet with `replicas`, counted against the keyspace's
/// replication factor: a factor beyond the nodes available (RF 3 on two nodes) still
/// needs its quorum, as in Cassandra.
pub(crate) fn requirement(
    local_datacenter: &str,
    consistency: Consistency,
    replicas: &TabletReplicas,
) -> Requirement {
    let mut dcs: Vec<&str> = replicas.iter().map(|r| r.datacenter.as_str()).collect();
    match &replicas.strategy {
        Some(ReplicationStrategy::Simple { factor }) => {
            while dcs.len() < *factor {
                dcs.push(local_datacenter);
            }
        }
        Some(ReplicationStrategy::NetworkTopology { factors }) => {
            for (dc, factor) in factors {
                let placed = replicas.iter().filter(|r| &r.datacenter == dc).count();
                for _ in placed..*factor {
                    dcs.push(dc.as_str());
                }
            }
        }
        None => {}
    }
    Requirement::of(consistency, &dcs, local_datacenter)
}

/// The replicas a read at `consistency` asks, local first: the requirement, the replicas
/// chosen (just enough to meet it) and every live candidate (the rest stand by).
pub(crate) fn plan_read<'r>(
    local_datacenter: &str,
    replicas: &'r TabletReplicas,
    consistency: Consistency,
) -> Result<(Requirement, Vec<&'r Replica>, Vec<&'r Replica>), CqlError> {
    let requirement = requirement(local_datacenter, consistency, replicas);
    let mut candidates: Vec<&Replica> = replicas.iter().filter(|r| r.alive).collect();
    candidates.sort_by_key(|r| !r.local);
    if !requirement.met_by(candidates.iter().map(|r| r.datacenter.as_str())) {
        return Err(unavailable(
            consistency,
            requirement.block_for(),
            candidates.len(),
        ));
    }
    let mut chosen: Vec<&Replica> = Vec::new();
    for candidate in &candidates {
        if requirement.met_by(chosen.iter().map(|r| r.datacenter.as_str())) {
            break;
        }
        if requirement.counts(&candidate.datacenter) {
            chosen.push(candidate);
        }
    }
    Ok((requirement, chosen, candidates))
}
