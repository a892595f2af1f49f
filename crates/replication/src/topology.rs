//! Which replicas hold a key, as one request sees them: the cluster's tablet map (through
//! a [`Topology`]) joined with the failure detector's view ([`crate::Liveness`]).
//!
//! While a tablet is moving (see [`shoal_placement::tablet`]) reads and writes see
//! different sets: [`replicas_of`] gives the replicas reads ask, [`write_replicas_of`] the
//! old set and, from `WriteBoth` until `Cleanup`, the new one, in which the consistency
//! level must be met as well. Every [`Replica`] carries the topology version it was chosen
//! by, which the replica checks against its fence ([`crate::barrier`]).

use crate::consistency::{unavailable, Requirement};
use crate::transport::Liveness;
use futures::future::BoxFuture;
use shoal_cluster::{ClusterMetadata, ClusterState, Member};
use shoal_cql::request::Consistency;
use shoal_cql::CqlError;
use shoal_model::{HostId, TableId, Token};
use shoal_placement::ReplicationStrategy;
use smallvec::SmallVec;
use std::net::SocketAddr;
use std::sync::Arc;

/// The cluster as this node has applied it. [`ClusterMetadata`] is the real one; tests
/// use a fixed [`ClusterState`].
pub trait Topology: Send + Sync + 'static {
    /// This node.
    fn me(&self) -> &Member;
    /// The members, schema and tablets as applied on this node.
    fn state(&self) -> Arc<ClusterState>;
    /// Resolves once this node has applied topology `version` (or later); `false` if that
    /// did not happen within `timeout`.
    fn reached(&self, version: u64, timeout: std::time::Duration) -> BoxFuture<'_, bool>;
}

impl Topology for ClusterMetadata {
    fn me(&self) -> &Member {
        ClusterMetadata::me(self)
    }

    fn state(&self) -> Arc<ClusterState> {
        ClusterMetadata::state(self)
    }

    fn reached(&self, version: u64, timeout: std::time::Duration) -> BoxFuture<'_, bool> {
        let mut states = self.subscribe();
        Box::pin(async move {
            tokio::time::timeout(
                timeout,
                states.wait_for(|state| state.topology_version >= version),
            )
            .await
            .is_ok_and(|waited| waited.is_ok())
        })
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
    /// The topology version of the tablet map it was chosen from (the replica refuses
    /// the request if it has been fenced past it).
    pub topology_version: u64,
}

impl Replica {
    /// `member` of `state` as a live replica; `local` when it is this node.
    pub(crate) fn of(member: &Member, local: bool, state: &ClusterState) -> Replica {
        Replica {
            host_id: member.host_id,
            address: member.internode_address,
            datacenter: member.datacenter.clone(),
            local,
            alive: true,
            topology_version: state.topology_version,
        }
    }
}

/// A tablet's replicas for one request, with the keyspace's replication.
#[derive(Debug, Clone)]
pub struct TabletReplicas {
    /// For a read, the replicas to ask; for a write, the current (old) replica set.
    pub(crate) replicas: Vec<Replica>,
    pub(crate) strategy: Option<ReplicationStrategy>,
    /// For a write to a tablet being moved: the replica set it is moving to. The write
    /// goes to both sets and must meet its level in the old one, and in the new one when
    /// `wait_for_new` (`shoal_placement::tablet`: not while the data streams).
    pub(crate) new: Option<Vec<Replica>>,
    pub(crate) wait_for_new: bool,
}

impl TabletReplicas {
    /// Every replica a write goes to, each once.
    pub(crate) fn targets(&self) -> Vec<&Replica> {
        let mut all: Vec<&Replica> = self.replicas.iter().collect();
        for replica in self.new.iter().flatten() {
            if !all.iter().any(|r| r.host_id == replica.host_id) {
                all.push(replica);
            }
        }
        all
    }

    /// The new replica set as a replica list of its own (for its requirement).
    pub(crate) fn new_set(&self) -> Option<TabletReplicas> {
        self.new.as_ref().map(|new| TabletReplicas {
            replicas: new.clone(),
            strategy: self.strategy.clone(),
            new: None,
            wait_for_new: false,
        })
    }

    /// True when both are the same replicas (and the same move).
    pub(crate) fn same_hosts(&self, other: &TabletReplicas) -> bool {
        let hosts = |set: &[Replica]| set.iter().map(|r| r.host_id).collect::<Vec<_>>();
        hosts(&self.replicas) == hosts(&other.replicas)
            && self.new.as_deref().map(hosts) == other.new.as_deref().map(hosts)
    }
}

impl std::ops::Deref for TabletReplicas {
    type Target = [Replica];
    fn deref(&self) -> &[Replica] {
        &self.replicas
    }
}

fn replica_of(
    me: &Member,
    liveness: &dyn Liveness,
    state: &ClusterState,
    host: &HostId,
) -> Option<Replica> {
    let member = state.member_by_host(host)?;
    let local = member.host_id == me.host_id;
    Some(Replica {
        host_id: member.host_id,
        address: member.internode_address,
        datacenter: member.datacenter.clone(),
        local,
        alive: local || liveness.is_alive(&member.host_id),
        topology_version: state.topology_version,
    })
}

/// The replicas reads of `token` in `table` ask, primary first.
pub(crate) fn replicas_of(
    me: &Member,
    liveness: &dyn Liveness,
    state: &ClusterState,
    table: &TableId,
    token: Token,
) -> TabletReplicas {
    let Some(placement) = state.tables.get(table) else {
        return TabletReplicas {
            replicas: Vec::new(),
            strategy: None,
            new: None,
            wait_for_new: false,
        };
    };
    let replicas = placement
        .tablets
        .tablet_for(token)
        .read_replicas()
        .iter()
        .filter_map(|host| replica_of(me, liveness, state, host))
        .collect();
    TabletReplicas {
        replicas,
        strategy: Some(placement.strategy.clone()),
        new: None,
        wait_for_new: false,
    }
}

/// The replicas a write of `token` in `table` goes to: the current set and, while the
/// tablet moves, the new one.
pub(crate) fn write_replicas_of(
    me: &Member,
    liveness: &dyn Liveness,
    state: &ClusterState,
    table: &TableId,
    token: Token,
) -> TabletReplicas {
    let Some(placement) = state.tables.get(table) else {
        return TabletReplicas {
            replicas: Vec::new(),
            strategy: None,
            new: None,
            wait_for_new: false,
        };
    };
    let sets = placement.tablets.tablet_for(token).write_replicas();
    let resolve = |hosts: &[HostId]| -> Vec<Replica> {
        hosts
            .iter()
            .filter_map(|host| replica_of(me, liveness, state, host))
            .collect()
    };
    TabletReplicas {
        replicas: resolve(sets.old),
        strategy: Some(placement.strategy.clone()),
        new: sets.new.as_deref().map(resolve),
        wait_for_new: sets.wait_for_new,
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
    requirement_of_set(
        local_datacenter,
        consistency,
        &replicas.replicas,
        replicas.strategy.as_ref(),
    )
}

/// [`requirement`] of one replica set of a tablet replicated by `strategy`.
fn requirement_of_set(
    local_datacenter: &str,
    consistency: Consistency,
    replicas: &[Replica],
    strategy: Option<&ReplicationStrategy>,
) -> Requirement {
    // One entry per replica the replication factor calls for: a handful, kept inline.
    let mut dcs: SmallVec<[&str; 8]> = replicas.iter().map(|r| r.datacenter.as_str()).collect();
    match strategy {
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

/// Checks that `consistency` can be met in each replica set a write of the tablet must
/// meet — the current set and, while the tablet moves, the new one — by their live
/// replicas: `Unavailable` when one cannot (never at `ANY`, which a hint meets).
pub(crate) fn check_writable(
    local_datacenter: &str,
    consistency: Consistency,
    replicas: &TabletReplicas,
) -> Result<(), CqlError> {
    let sets = std::iter::once(replicas.replicas.as_slice()).chain(replicas.new.as_deref());
    for set in sets {
        writable_set(
            local_datacenter,
            consistency,
            set,
            replicas.strategy.as_ref(),
        )?;
    }
    Ok(())
}

/// What `consistency` needs of each replica set a write of the tablet must meet, with the
/// set, once [`check_writable`] would pass.
pub(crate) fn write_requirements(
    local_datacenter: &str,
    consistency: Consistency,
    replicas: &TabletReplicas,
) -> Result<Vec<(Requirement, TabletReplicas)>, CqlError> {
    std::iter::once(replicas.clone())
        .chain(replicas.new_set())
        .map(|set| {
            let needed = writable_set(local_datacenter, consistency, &set, set.strategy.as_ref())?;
            Ok((needed, set))
        })
        .collect()
}

/// What `consistency` needs of one replica set of a write, if its live replicas can meet
/// it: `Unavailable` otherwise (never at `ANY`, which a hint meets).
fn writable_set(
    local_datacenter: &str,
    consistency: Consistency,
    set: &[Replica],
    strategy: Option<&ReplicationStrategy>,
) -> Result<Requirement, CqlError> {
    let needed = requirement_of_set(local_datacenter, consistency, set, strategy);
    let alive = set.iter().filter(|r| r.alive);
    let enough = consistency == Consistency::Any
        || needed.met_by(alive.clone().map(|r| r.datacenter.as_str()));
    if !enough {
        return Err(unavailable(consistency, needed.block_for(), alive.count()));
    }
    Ok(needed)
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
