//! A simulated cluster for deterministic tests: every node is a [`LocalReplica`] over a
//! [`MemoryEngine`] with its own [`StorageProxy`], the network is a map from address to
//! node with a scriptable [`Behaviour`] per node, the failure detector is a shared table,
//! and time is tokio's paused clock, so timeouts and hint windows play out the same way on
//! every run.

use crate::hints::Hints;
use crate::messages::{ReplicaRequest, ReplicaResponse};
use crate::proxy::StorageProxy;
use crate::replica::{ImmediateWriteLog, LocalReplica};
use crate::topology::Topology;
use crate::transport::{Liveness, ReplicaTransport};
use futures::future::BoxFuture;
use parking_lot::Mutex;
use shoal_cluster::{ClusterState, Command, Member, MemberState, VersionedRecord};
use shoal_model::{HostId, TableId};
use shoal_placement::ReplicationStrategy;
use shoal_storage::{Engine, MemoryEngine};
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The one table every simulated cluster has.
pub const TABLE: TableId = TableId([0x7a; 16]);

/// How a simulated node treats requests sent to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// Answers at once.
    Up,
    /// Dead and known to be: connections are refused, the failure detector says down.
    Down,
    /// Stopped (SIGSTOP) but not convicted yet: requests wait until their timeout.
    Paused,
    /// Answers after this long.
    Slow(Duration),
    /// Answers every request with an error.
    Failing,
    /// Answers reads and refuses writes (a full disk, say).
    ReadOnly,
}

/// The simulated network: which node listens where, and how it behaves.
#[derive(Default)]
pub struct Network {
    nodes: Mutex<HashMap<SocketAddr, (Arc<LocalReplica>, Behaviour)>>,
    /// Each node's storage proxy, which leads the lightweight transactions sent to it
    /// (as the server hands it `PaxosLead` requests).
    proxies: Mutex<HashMap<SocketAddr, std::sync::Weak<StorageProxy>>>,
    /// Cells sent back in answers to reads, for tests of how much a read fetches.
    pub cells_answered: std::sync::atomic::AtomicU64,
}

impl Network {
    pub fn set_behaviour(&self, address: SocketAddr, behaviour: Behaviour) {
        if let Some(node) = self.nodes.lock().get_mut(&address) {
            node.1 = behaviour;
        }
    }
}

/// A [`ReplicaTransport`] over the simulated network.
pub struct SimTransport(pub Arc<Network>);

impl ReplicaTransport for SimTransport {
    fn send(
        &self,
        to: SocketAddr,
        request: ReplicaRequest,
        topology_version: u64,
        timeout: Duration,
    ) -> BoxFuture<'static, Result<ReplicaResponse, String>> {
        let target = self.0.nodes.lock().get(&to).cloned();
        let proxy = self
            .0
            .proxies
            .lock()
            .get(&to)
            .and_then(std::sync::Weak::upgrade);
        let network = Arc::clone(&self.0);
        Box::pin(async move {
            let Some((replica, behaviour)) = target else {
                return Err(format!("no node at {to}"));
            };
            let timed_out = || Err(format!("{to} did not answer within {timeout:?}"));
            match behaviour {
                Behaviour::Up => {
                    let request = match (request, &proxy) {
                        (ReplicaRequest::PaxosLead(lead), Some(proxy)) => {
                            return Ok(ReplicaResponse::PaxosLed(proxy.lead(lead).await));
                        }
                        (request, _) => request,
                    };
                    let response = replica.serve_routed(request, topology_version).await;
                    if let ReplicaResponse::Cells { cells, .. }
                    | ReplicaResponse::ScanCells { cells, .. }
                    | ReplicaResponse::CellsFrom { cells, .. } = &response
                    {
                        network
                            .cells_answered
                            .fetch_add(cells.len() as u64, std::sync::atomic::Ordering::Relaxed);
                    }
                    Ok(response)
                }
                Behaviour::Down => Err(format!("cannot connect to {to}: refused")),
                Behaviour::Paused => {
                    tokio::time::sleep(timeout).await;
                    timed_out()
                }
                Behaviour::Slow(delay) if delay < timeout => {
                    tokio::time::sleep(delay).await;
                    Ok(replica.serve_routed(request, topology_version).await)
                }
                Behaviour::Slow(_) => {
                    tokio::time::sleep(timeout).await;
                    timed_out()
                }
                Behaviour::Failing => Ok(ReplicaResponse::Error("injected failure".into())),
                Behaviour::ReadOnly => match request {
                    ReplicaRequest::Apply(_) => {
                        Ok(ReplicaResponse::Error("injected write failure".into()))
                    }
                    request => Ok(replica.serve_routed(request, topology_version).await),
                },
            }
        })
    }
}

/// The failure detector's view, shared by every simulated node: down since when.
#[derive(Default)]
pub struct SimLiveness {
    down_since: Mutex<HashMap<HostId, Instant>>,
}

impl SimLiveness {
    pub fn set_alive(&self, host: HostId, alive: bool) {
        let mut down = self.down_since.lock();
        if alive {
            down.remove(&host);
        } else {
            down.entry(host).or_insert_with(Instant::now);
        }
    }
}

impl SimLiveness {
    /// What the failure detector says now.
    pub fn is_alive_now(&self, host: &HostId) -> bool {
        self.is_alive(host)
    }
}

impl Liveness for SimLiveness {
    fn is_alive(&self, host_id: &HostId) -> bool {
        !self.down_since.lock().contains_key(host_id)
    }

    fn down_for(&self, host_id: &HostId) -> Option<Duration> {
        self.down_since
            .lock()
            .get(host_id)
            .map(|since| since.elapsed())
    }

    fn schema_version(&self, _host_id: &HostId) -> Option<[u8; 16]> {
        None
    }
}

/// One node's view of the cluster: the metadata it has applied so far.
pub struct SimTopology {
    me: Member,
    state: Mutex<Arc<ClusterState>>,
}

impl Topology for SimTopology {
    fn me(&self) -> &Member {
        &self.me
    }

    fn state(&self) -> Arc<ClusterState> {
        Arc::clone(&self.state.lock())
    }

    fn reached(&self, version: u64, timeout: Duration) -> BoxFuture<'_, bool> {
        Box::pin(async move {
            let deadline = Instant::now() + timeout;
            while self.state.lock().topology_version < version {
                if Instant::now() >= deadline {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            true
        })
    }
}

/// One simulated node.
pub struct SimNode {
    pub name: String,
    pub member: Member,
    pub engine: Arc<MemoryEngine>,
    pub proxy: Arc<StorageProxy>,
    /// The metadata this node has applied.
    pub view: Arc<SimTopology>,
}

/// A simulated cluster of `n1`, `n2`, … with one table.
pub struct SimCluster {
    pub nodes: Vec<SimNode>,
    pub network: Arc<Network>,
    pub liveness: Arc<SimLiveness>,
    /// The metadata as committed; nodes apply it when [`SimCluster::publish`] says.
    pub state: ClusterState,
    hint_window: Duration,
    max_hint_bytes: u64,
}

fn member(index: usize) -> Member {
    let octet = index as u8 + 1;
    Member {
        host_id: HostId([octet; 16]),
        internode_address: SocketAddr::from(([127, 0, 0, octet], 7000)),
        cql_address: SocketAddr::from(([127, 0, 0, octet], 9042)),
        datacenter: "dc1".into(),
        rack: "rack1".into(),
        state: MemberState::Normal,
        replaces: None,
    }
}

impl SimCluster {
    /// The node with this host id.
    pub fn node_of(&self, host: &HostId) -> Option<&SimNode> {
        self.nodes.iter().find(|n| n.member.host_id == *host)
    }

    /// The name of the node with this host id (`?` for none), as scripts print it.
    pub fn name_of(&self, host: &HostId) -> &str {
        self.node_of(host).map_or("?", |n| n.name.as_str())
    }

    /// `nodes` nodes holding [`TABLE`] with `replication_factor` replicas per tablet.
    /// Hints are kept for `hint_window` and up to `max_hint_bytes` per node.
    pub fn new(
        nodes: usize,
        replication_factor: usize,
        hint_window: Duration,
        max_hint_bytes: u64,
    ) -> SimCluster {
        let mut state = ClusterState::default();
        for index in 0..nodes {
            state.apply(Command::AddMember(member(index)));
        }
        state.apply(Command::ChangeSchema {
            base_version: None,
            schema: VersionedRecord {
                version: [1; 16],
                bytes: Vec::new(),
            },
            tables: BTreeMap::from([(
                TABLE,
                ReplicationStrategy::Simple {
                    factor: replication_factor,
                },
            )]),
        });
        let mut cluster = SimCluster {
            nodes: Vec::new(),
            network: Arc::default(),
            liveness: Arc::default(),
            state,
            hint_window,
            max_hint_bytes,
        };
        for _ in 0..nodes {
            cluster.start_node();
        }
        cluster
    }

    /// Starts the next node (`n1`, `n2`, …) with an empty engine, listening at once; it is
    /// a member only once a command adds it.
    pub fn start_node(&mut self) -> usize {
        let index = self.nodes.len();
        let engine = Arc::new(MemoryEngine::new());
        engine.set_gc_grace_seconds(TABLE, 864_000);
        let node = self.node(index, engine);
        self.network.nodes.lock().insert(
            node.member.internode_address,
            (Arc::clone(node.proxy.local()), Behaviour::Up),
        );
        self.network
            .proxies
            .lock()
            .insert(node.member.internode_address, Arc::downgrade(&node.proxy));
        self.nodes.push(node);
        index
    }

    /// The member node `index` is (whether or not it has joined).
    pub fn member(&self, index: usize) -> Member {
        member(index)
    }

    /// Commits `command` to the metadata; returns its outcome. Nodes see it once
    /// published.
    pub fn commit(&mut self, command: Command) -> shoal_cluster::CommandOutcome {
        self.state.apply(command)
    }

    /// Nodes `only` (every node when `None`) apply the metadata committed so far.
    pub fn publish(&self, only: Option<&[usize]>) {
        for (index, node) in self.nodes.iter().enumerate() {
            if only.is_none_or(|only| only.contains(&index)) {
                *node.view.state.lock() = Arc::new(self.state.clone());
            }
        }
    }

    /// Builds node `index` over `engine` (a restart keeps the engine).
    fn node(&self, index: usize, engine: Arc<MemoryEngine>) -> SimNode {
        let member = member(index);
        let view = Arc::new(SimTopology {
            me: member.clone(),
            state: Mutex::new(Arc::new(self.state.clone())),
        });
        let log = Arc::new(ImmediateWriteLog(engine.clone()));
        let local = Arc::new(LocalReplica::new(engine.clone(), log.clone()));
        let hints = Arc::new(Hints::new(
            engine.clone(),
            log.clone(),
            self.liveness.clone() as Arc<dyn Liveness>,
            self.hint_window,
            self.max_hint_bytes,
        ));
        let proxy = Arc::new(StorageProxy::new(
            Arc::clone(&view) as Arc<dyn Topology>,
            Arc::new(SimTransport(Arc::clone(&self.network))),
            self.liveness.clone() as Arc<dyn Liveness>,
            local,
            hints,
        ));
        SimNode {
            name: format!("n{}", index + 1),
            member,
            engine,
            proxy,
            view,
        }
    }

    pub fn index_of(&self, name: &str) -> Result<usize, String> {
        self.nodes
            .iter()
            .position(|n| n.name == name)
            .ok_or_else(|| format!("no node {name}"))
    }

    /// Sets how node `index` behaves, and what the failure detector says of it.
    pub fn set_behaviour(&self, index: usize, behaviour: Behaviour) {
        let node = &self.nodes[index];
        self.network
            .set_behaviour(node.member.internode_address, behaviour);
        self.liveness
            .set_alive(node.member.host_id, behaviour != Behaviour::Down);
    }

    /// Restarts node `index`: a new proxy and hint store over the same engine.
    pub fn restart(&mut self, index: usize) {
        let engine = Arc::clone(&self.nodes[index].engine);
        let node = self.node(index, engine);
        self.network.nodes.lock().insert(
            node.member.internode_address,
            (Arc::clone(node.proxy.local()), Behaviour::Up),
        );
        self.network
            .proxies
            .lock()
            .insert(node.member.internode_address, Arc::downgrade(&node.proxy));
        self.nodes[index] = node;
    }
}
