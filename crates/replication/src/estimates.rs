//! How many cells each tablet holds, as far as a scan needs to know: seed 002's
//! key-count estimates piggybacked on range replies.
//!
//! A forward scan over a table's tablets costs one round trip per tablet when it asks for
//! them one after another. A scan that knows how many cells the next tablets hold can ask
//! for all the tablets its LIMIT needs at once, and no more. So:
//!
//! - **Every replica piggybacks** on each scan chunk it answers
//!   (`ReplicaResponse::ScanCells`) its estimate of the cells it holds in each tablet of
//!   the table it replicates ([`TabletCellEstimator`]: the engine's approximate cells per
//!   key range, recomputed at most every [`ESTIMATES_FRESH_FOR`]).
//! - **The coordinator keeps them** ([`ScanEstimates`]), per tablet; a tablet no reply has
//!   told of yet counts as the table's mean (or, for a table whose chunks are read by
//!   their Raft leaders, which do not piggyback, as the whole tablets its scans read).
//! - **A scan asks in parallel** for the tablet it starts in and the fewest following
//!   tablets whose estimated cells cover what it wants — its LIMIT in cells, at most one
//!   chunk ([`tablets_to_fetch`]) — and asks for more only when the rows fall short. The
//!   first tablet does not count: the scan may start near its end.

use crate::messages::TabletCells;
use crate::topology::Topology;
use parking_lot::Mutex;
use shoal_model::{keys, TableId, TabletId, Token};
use shoal_storage::Engine;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// How long a replica answers with the same estimates before it asks its engine again.
pub const ESTIMATES_FRESH_FOR: Duration = Duration::from_secs(1);

/// Tablets fetched at once at most, unless the node is configured otherwise
/// (`scan_parallel_tablets`).
pub const MAX_PARALLEL_TABLETS: usize = 8;

/// Tablets a coordinator keeps estimates of per table, at most (split tablets leave their
/// old ids behind; past this many, the table's estimates start afresh).
const MAX_TABLETS_REMEMBERED: usize = 4096;

/// The replica side: estimates of the cells this node holds per tablet, by table.
#[derive(Default)]
pub struct TabletCellEstimator {
    /// The tablet map this node follows; set once as the node starts.
    topology: OnceLock<Arc<dyn Topology>>,
    /// The last estimates per table, and when they were made.
    fresh: Mutex<HashMap<TableId, (Instant, Arc<TabletCells>)>>,
}

impl TabletCellEstimator {
    /// Estimates the tablets of the map `topology` applies from now on.
    pub fn follow(&self, topology: Arc<dyn Topology>) {
        let _ = self.topology.set(topology);
    }

    /// The cells `engine` holds in each tablet of `table` this node replicates; `None`
    /// when the node follows no tablet map or the engine cannot tell.
    pub fn estimates(&self, engine: &dyn Engine, table: TableId) -> Option<Arc<TabletCells>> {
        let topology = self.topology.get()?;
        if let Some((made, estimates)) = self.fresh.lock().get(&table) {
            if made.elapsed() < ESTIMATES_FRESH_FOR {
                return Some(Arc::clone(estimates));
            }
        }
        let me = topology.me().host_id;
        let state = topology.state();
        let tablets = state.tables.get(&table)?.tablets.tablets();
        let mut after: Option<Token> = None;
        let (mut held, mut ranges) = (Vec::new(), Vec::new());
        for tablet in tablets {
            let range = keys::token_range(&table, after, tablet.last_token);
            after = Some(tablet.last_token);
            if tablet.replicas.contains(&me) {
                held.push(tablet.id);
                ranges.push(range);
            }
        }
        let cells = engine.approximate_range_cells(&ranges)?;
        let estimates = Arc::new(TabletCells {
            table,
            tablets: held.into_iter().zip(cells).collect(),
        });
        self.fresh
            .lock()
            .insert(table, (Instant::now(), Arc::clone(&estimates)));
        Some(estimates)
    }
}

/// The coordinator side: what this node has learnt of each table's tablets.
#[derive(Default)]
pub struct ScanEstimates {
    tables: Mutex<HashMap<TableId, TableEstimates>>,
}

#[derive(Default)]
struct TableEstimates {
    /// Cells per tablet, as its replicas last told.
    tablets: HashMap<TabletId, u64>,
    /// Cells of the whole tablets this node's scans read (a moving average): what is
    /// known of tables whose replicas tell nothing.
    observed: Option<f64>,
}

impl TableEstimates {
    fn mean(&self) -> Option<f64> {
        (!self.tablets.is_empty())
            .then(|| self.tablets.values().sum::<u64>() as f64 / self.tablets.len() as f64)
    }
}

impl ScanEstimates {
    /// Takes in a replica's estimates.
    pub fn record(&self, estimates: &TabletCells) {
        let mut tables = self.tables.lock();
        let table = tables.entry(estimates.table).or_default();
        if table.tablets.len() + estimates.tablets.len() > MAX_TABLETS_REMEMBERED {
            table.tablets.clear();
        }
        table.tablets.extend(estimates.tablets.iter().copied());
    }

    /// A whole tablet of `table` held `cells` visible cells.
    pub fn observe(&self, table: TableId, cells: u64) {
        let mut tables = self.tables.lock();
        let observed = &mut tables.entry(table).or_default().observed;
        *observed = Some(match *observed {
            Some(estimate) => 0.75 * estimate + 0.25 * cells as f64,
            None => cells as f64,
        });
    }

    /// The estimated cells of each of `tablets` of `table`: its replicas' word, else the
    /// table's mean, else what whole tablets read held; `None` when nothing is known.
    pub fn cells_in(&self, table: &TableId, tablets: &[TabletId]) -> Vec<Option<f64>> {
        let tables = self.tables.lock();
        let Some(known) = tables.get(table) else {
            return vec![None; tablets.len()];
        };
        let fallback = known.mean().or(known.observed);
        tablets
            .iter()
            .map(|id| {
                known
                    .tablets
                    .get(id)
                    .map(|cells| *cells as f64)
                    .or(fallback)
            })
            .collect()
    }
}

/// How many tablets to fetch at once, the first included: the first (the scan may start
/// anywhere in it, so its cells do not count), then the fewest of the `following`
/// tablets whose estimated cells add up to `wanted` — at most `most` and never more than
/// there are. A following tablet nothing is known of ends the set before it: the scan
/// asks for it once it knows more.
pub fn tablets_to_fetch(following: &[Option<f64>], wanted: f64, most: usize) -> usize {
    let mut count = 1;
    let mut covered = 0.0;
    for estimate in following {
        if covered >= wanted || count >= most {
            break;
        }
        let Some(cells) = estimate else {
            break;
        };
        count += 1;
        covered += cells;
    }
    count
}
