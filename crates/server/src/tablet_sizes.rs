//! Tablet sizes for the balancer: what the metadata leader last measured of every tablet,
//! so that `shoal_placement::balance` evens out bytes per node as well as tablets.
//!
//! A tablet's size is RocksDB's estimate of its key range on one replica holding it (this
//! node when it is one, else the first live one). A refresh asks every such node once, for
//! all its tablets in one message, in parallel; a node that does not answer keeps its
//! tablets' earlier sizes. The migration driver starts a refresh in the background when the
//! sizes are older than [`REFRESH`], and plans with whatever it has meanwhile: a tablet
//! never measured weighs nothing, so a new cluster balances by counts alone until its
//! first measure.

use crate::internode::Peers;
use crate::streaming::TabletKeys;
use futures::future::join_all;
use parking_lot::Mutex;
use shoal_cluster::ClusterState;
use shoal_model::{HostId, TableId, TabletId};
use shoal_storage::Engine;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How old sizes may be before a refresh starts.
pub const REFRESH: Duration = Duration::from_secs(10);
/// How long a node may take to answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

/// Tablet sizes, as last measured.
#[derive(Default)]
pub struct TabletSizes {
    measured: Mutex<Measured>,
    measuring: AtomicBool,
}

#[derive(Default)]
struct Measured {
    at: Option<Instant>,
    sizes: BTreeMap<(TableId, TabletId), u64>,
}

/// Where a refresh asks: this node (its own engine) or a peer.
pub struct Sources<'a> {
    pub me: HostId,
    pub engine: &'a dyn Engine,
    pub peers: &'a Peers,
    pub alive: &'a (dyn Fn(&HostId) -> bool + Sync),
}

impl TabletSizes {
    /// The sizes last measured.
    pub fn current(&self) -> BTreeMap<(TableId, TabletId), u64> {
        self.measured.lock().sizes.clone()
    }

    /// Whether a refresh is due (and none is under way); when it is, the caller is the
    /// one to run it, and must call [`TabletSizes::refresh`].
    pub fn claim_refresh(&self) -> bool {
        let due = self
            .measured
            .lock()
            .at
            .is_none_or(|at| at.elapsed() >= REFRESH);
        due && !self.measuring.swap(true, Ordering::AcqRel)
    }

    /// Measures every tablet of `state` (after [`TabletSizes::claim_refresh`]).
    pub async fn refresh(&self, state: &ClusterState, sources: Sources<'_>) {
        let mut asked: BTreeMap<HostId, Vec<(TabletId, TabletKeys)>> = BTreeMap::new();
        for (table, placement) in &state.tables {
            for tablet in placement.tablets.tablets() {
                let replicas = tablet.read_replicas();
                let holder = if replicas.contains(&sources.me) {
                    Some(sources.me)
                } else {
                    replicas.iter().find(|h| (sources.alive)(h)).copied()
                };
                let (Some(holder), Some((after, last))) =
                    (holder, placement.tablets.bounds_of(tablet.id))
                else {
                    continue;
                };
                let keys = TabletKeys {
                    table: *table,
                    after,
                    last,
                };
                asked.entry(holder).or_default().push((tablet.id, keys));
            }
        }
        let answers = join_all(asked.into_iter().map(|(holder, tablets)| {
            let address: Option<SocketAddr> = state
                .member_by_host(&holder)
                .map(|member| member.internode_address);
            async move {
                let keys: Vec<TabletKeys> = tablets.iter().map(|(_, k)| k.clone()).collect();
                let bytes = if holder == sources.me {
                    Some(crate::splitting::tablets_bytes(sources.engine, &keys))
                } else if let Some(address) = address {
                    crate::splitting::ask_tablet_bytes(sources.peers, address, keys, ASK_TIMEOUT)
                        .await
                } else {
                    None
                };
                (tablets, bytes)
            }
        }))
        .await;
        let mut measured = self.measured.lock();
        let mut sizes: BTreeMap<(TableId, TabletId), u64> = BTreeMap::new();
        for (tablets, bytes) in answers {
            for (index, (tablet, keys)) in tablets.into_iter().enumerate() {
                let id = (keys.table, tablet);
                let size = match &bytes {
                    Some(bytes) => bytes.get(index).copied(),
                    None => measured.sizes.get(&id).copied(),
                };
                if let Some(size) = size {
                    sizes.insert(id, size);
                }
            }
        }
        tracing::debug!(
            tablets = sizes.len(),
            bytes = sizes.values().sum::<u64>(),
            "tablet sizes measured"
        );
        *measured = Measured {
            at: Some(Instant::now()),
            sizes,
        };
        self.measuring.store(false, Ordering::Release);
    }
}
