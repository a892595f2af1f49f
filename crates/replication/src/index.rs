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
//! A query asks replicas for *candidates* — base partitions with an entry for the value, or
//! for any value of a range ([`IndexPredicate`]) —
//! tablet by tablet in token order, from as many replicas per tablet as the consistency
//! level needs ([`StorageProxy::index_candidates`]); the coordinator then reads those
//! partitions like a scan and filters them ([`IndexLookup`], `ReplicaRequest::IndexLookup`).
//!
//! A vector index answers nearest-neighbour searches instead ([`VectorSearch`]): each
//! replica asked returns its best-scoring partitions for the tablets asked, and the
//! coordinator merges them by score ([`StorageProxy::vector_candidates`]).

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

    /// True when `table` has an index here, i.e. when [`LocalIndexes::entries`] may add
    /// entries for its cells (callers that would have to prepare cells for it skip that
    /// work for the tables it would find nothing in).
    fn indexes_table(&self, table: &TableId) -> bool;

    /// Candidates for `lookup` with tokens up to `upto`, in token order: from the index
    /// entries once this node's index covers everything it stores ([`lookup_candidates`]),
    /// from a scan of the data itself while the index is still being built here.
    fn candidates(
        &self,
        engine: &dyn Engine,
        lookup: &IndexLookup,
        upto: Token,
    ) -> Result<Vec<PartitionRef>, String>;

    /// The partitions stored here with the rows nearest to `search.query` among tokens
    /// `[search.from, search.upto]`, best first, at most `search.limit` of them.
    fn vector_search(
        &self,
        engine: &dyn Engine,
        search: &VectorSearch,
    ) -> Result<VectorAnswer, String>;

    /// Every cell of `table` stored here was just removed (TRUNCATE).
    fn truncated(&self, table: TableId);
}

/// A nearest-neighbour search of one vector index over a token range.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VectorSearch {
    pub table: TableId,
    pub index: TableId,
    pub query: Vec<f32>,
    pub from: Token,
    /// Inclusive.
    pub upto: Token,
    /// The rows searched for: at most this many partitions come back.
    pub limit: u32,
}

/// The answer to a [`VectorSearch`]: the nearest partitions, best first, and whether
/// they are all there are (fewer rows qualified than were searched for).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VectorAnswer {
    pub hits: Vec<VectorHit>,
    pub complete: bool,
}

/// A partition holding a row near the query, and that row's similarity score (in
/// [0, 1], higher is nearer: `shoal_model::vector::Similarity::score`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VectorHit {
    pub token: Token,
    pub partition_key: Vec<u8>,
    pub score: f32,
}

/// Merges hits from several replicas and tablets: one per partition (its best score),
/// best first, at most `limit`.
pub fn merge_vector_hits(mut hits: Vec<VectorHit>, limit: usize) -> Vec<VectorHit> {
    hits.sort_by(|a, b| {
        (a.token, &a.partition_key)
            .cmp(&(b.token, &b.partition_key))
            .then(b.score.total_cmp(&a.score))
    });
    hits.dedup_by(|later, kept| {
        later.token == kept.token && later.partition_key == kept.partition_key
    });
    hits.sort_by(|a, b| b.score.total_cmp(&a.score));
    hits.truncate(limit);
    hits
}

/// Candidates for an index predicate: the base partitions of `table` that have an entry
/// in `index` matching `predicate`, from token `from` on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexLookup {
    pub table: TableId,
    pub index: TableId,
    pub predicate: IndexPredicate,
    pub from: Token,
    /// At most this many partitions.
    pub limit: u32,
}

/// Which indexed values a lookup wants, each as its byte-comparable encoding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum IndexPredicate {
    /// One value (`=`, `CONTAINS`, `CONTAINS KEY`, `m[key] = value`).
    Equals(Vec<u8>),
    /// The values between two bounds (`<`, `<=`, `>`, `>=`), each with whether it is
    /// included; `None` leaves that side open.
    Range {
        lower: RangeBound,
        upper: RangeBound,
    },
}

/// One side of an [`IndexPredicate::Range`]: a byte-comparable value and whether it is
/// included, or `None` for an open side.
pub type RangeBound = Option<(Vec<u8>, bool)>;

impl IndexPredicate {
    /// True when an entry of `value` answers this predicate.
    pub fn matches(&self, value: &[u8]) -> bool {
        match self {
            IndexPredicate::Equals(wanted) => value == wanted.as_slice(),
            IndexPredicate::Range { lower, upper } => {
                let above = match lower {
                    None => true,
                    Some((bound, true)) => value >= bound.as_slice(),
                    Some((bound, false)) => value > bound.as_slice(),
                };
                let below = match upper {
                    None => true,
                    Some((bound, true)) => value <= bound.as_slice(),
                    Some((bound, false)) => value < bound.as_slice(),
                };
                above && below
            }
        }
    }
}

/// Entries read per lookup chunk on a replica.
const LOOKUP_CHUNK_CELLS: u32 = 4096;

/// Answers a lookup from this node's index: the distinct base partitions with a visible
/// matching entry whose token lies in `[from, upto]`, in token order, at most `limit` of
/// them. One value's entries are in token order, so an equality lookup reads only as far
/// as it needs; a range's entries are in value order, so a range lookup reads all of them
/// and keeps the `limit` lowest partitions.
pub fn lookup_candidates(
    engine: &dyn Engine,
    lookup: &IndexLookup,
    upto: Token,
) -> Result<Vec<PartitionRef>, String> {
    match &lookup.predicate {
        IndexPredicate::Equals(value) => {
            let (lower, upper) = keys::index_value_range(&lookup.index, value, lookup.from);
            let mut found: Vec<PartitionRef> = Vec::new();
            for_each_visible_entry(engine, lower, &upper, |token, partition_key| {
                token <= upto && add_candidate(&mut found, token, partition_key, lookup.limit)
            })?;
            Ok(found)
        }
        IndexPredicate::Range { lower, upper } => {
            let (start, end) =
                keys::index_values_range(&lookup.index, as_bound(lower), as_bound(upper));
            let mut lowest: std::collections::BTreeSet<PartitionRef> = Default::default();
            for_each_visible_entry(engine, start, &end, |token, partition_key| {
                let full = lowest.len() >= lookup.limit as usize;
                // Once `limit` are kept, only a lower partition displaces the highest.
                let kept = token >= lookup.from
                    && token <= upto
                    && !(full
                        && lowest.last().is_none_or(|(last_token, last_key)| {
                            (token, partition_key) >= (*last_token, last_key.as_slice())
                        }));
                if kept && lowest.insert((token, partition_key.to_vec())) && full {
                    lowest.pop_last();
                }
                true
            })?;
            Ok(lowest.into_iter().collect())
        }
    }
}

/// A range bound as [`keys::index_values_range`] takes it.
fn as_bound(bound: &RangeBound) -> Option<(&[u8], bool)> {
    bound
        .as_ref()
        .map(|(value, inclusive)| (value.as_slice(), *inclusive))
}

/// Calls `visit` with the base partition of every visible entry in `[lower, upper)`, in
/// key order, until it returns `false`.
fn for_each_visible_entry(
    engine: &dyn Engine,
    mut lower: Vec<u8>,
    upper: &[u8],
    mut visit: impl FnMut(Token, &[u8]) -> bool,
) -> Result<(), String> {
    loop {
        let (cells, complete) = read_visible(engine, &lower, upper, LOOKUP_CHUNK_CELLS)?;
        for (key, _) in &cells {
            let Some((token, partition_key)) = keys::index_entry_base(key) else {
                continue;
            };
            if !visit(token, &partition_key) {
                return Ok(());
            }
        }
        match cells.last() {
            Some((last, _)) if !complete => {
                lower = last.clone();
                lower.push(0);
            }
            _ => return Ok(()),
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

/// Consecutive tablets whose lookups ask the same replicas: one request covers them all.
struct TabletGroup {
    asked: Vec<Replica>,
    /// The other live replicas, to ask instead of one that fails.
    spare: Vec<Replica>,
    from: Token,
    upto: Token,
}

impl StorageProxy {
    /// The table's tablets from token `from` on, grouped into runs that ask the same live
    /// replicas (this node first, as many as `consistency` needs): a write that reached
    /// that level is on one of them.
    fn tablet_groups(
        &self,
        table: &TableId,
        from: Token,
        consistency: Consistency,
    ) -> Result<Vec<TabletGroup>, CqlError> {
        let state = self.topology.state();
        let placement = state
            .tables
            .get(table)
            .ok_or_else(|| CqlError::invalid("the table was dropped during the query"))?;
        // The replicas a tablet's lookup asks (live ones, this node first, as many as the
        // level needs), and the other live ones.
        let choose = |token: Token| -> Result<(Vec<Replica>, Vec<Replica>), CqlError> {
            let replicas = self.replicas_of(&state, table, token);
            let needed = requirement(self.local_datacenter(), consistency, &replicas);
            let mut alive: Vec<&Replica> = replicas.replicas.iter().filter(|r| r.alive).collect();
            alive.sort_by_key(|r| !r.local);
            let mut alive = alive.into_iter();
            let mut asked: Vec<Replica> = Vec::new();
            while !needed.met_by(asked.iter().map(|r| r.datacenter.as_str())) {
                let Some(replica) = alive.next() else {
                    let alive = replicas.replicas.iter().filter(|r| r.alive).count();
                    return Err(unavailable(consistency, needed.block_for(), alive));
                };
                asked.push(replica.clone());
            }
            Ok((asked, alive.cloned().collect()))
        };
        let same_hosts = |a: &[Replica], b: &[Replica]| {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.host_id == y.host_id)
        };
        let mut groups = Vec::new();
        let mut from = from;
        loop {
            let mut tablet = placement.tablets.tablet_for(from);
            let (asked, spare) = choose(from)?;
            while tablet.last_token != Token::MAX {
                let next_first = Token(tablet.last_token.0 + 1);
                let next = placement.tablets.tablet_for(next_first);
                if !same_hosts(&asked, &choose(next_first)?.0) {
                    break;
                }
                tablet = next;
            }
            let upto = tablet.last_token;
            groups.push(TabletGroup {
                asked,
                spare,
                from,
                upto,
            });
            if upto == Token::MAX {
                return Ok(groups);
            }
            from = Token(upto.0 + 1);
        }
    }

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
        let mut found: Vec<PartitionRef> = Vec::new();
        for group in self.tablet_groups(&lookup.table, lookup.from, consistency)? {
            let request = IndexLookup {
                from: group.from,
                limit: lookup.limit.saturating_sub(found.len() as u32),
                ..lookup.clone()
            };
            let answers = group.asked.iter().map(|replica| {
                let call = self.call(
                    replica,
                    ReplicaRequest::IndexLookup {
                        lookup: request.clone(),
                        upto: group.upto,
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
            if found.len() >= lookup.limit as usize {
                break;
            }
        }
        Ok(found)
    }

    /// The partitions nearest to `search.query` across the whole table: every run of
    /// tablets asked at once, each from as many live replicas as `consistency` needs,
    /// merged by score (best first, at most `search.limit`).
    pub async fn vector_candidates(
        &self,
        search: VectorSearch,
        consistency: Consistency,
    ) -> Result<VectorAnswer, CqlError> {
        let _in_flight = self.enter();
        let groups = self.tablet_groups(&search.table, search.from, consistency)?;
        let searches = groups
            .iter()
            .filter(|group| group.from <= search.upto)
            .map(|group| {
                let request = VectorSearch {
                    from: group.from,
                    upto: group.upto.min(search.upto),
                    ..search.clone()
                };
                self.search_group(group, request)
            });
        let mut hits = Vec::new();
        let mut complete = true;
        for answer in futures::future::join_all(searches).await {
            let answer = answer?;
            hits.extend(answer.hits);
            complete &= answer.complete;
        }
        Ok(VectorAnswer {
            hits: merge_vector_hits(hits, search.limit as usize),
            complete,
        })
    }

    /// One run of tablets searched on the replicas it asks; a replica that fails (it died
    /// before the failure detector noticed) is replaced by a spare one.
    async fn search_group(
        &self,
        group: &TabletGroup,
        request: VectorSearch,
    ) -> Result<VectorAnswer, CqlError> {
        let search_on = |replica: &Replica| {
            let call = self.call(
                replica,
                ReplicaRequest::VectorSearch(request.clone()),
                READ_TIMEOUT,
            );
            async move {
                match call.await {
                    Ok(ReplicaResponse::VectorHits(answer)) => Ok(answer),
                    Ok(other) => Err(format!("unexpected answer {other:?}")),
                    Err(error) => Err(error),
                }
            }
        };
        let mut merged = VectorAnswer {
            hits: Vec::new(),
            complete: true,
        };
        let mut add = |answer: VectorAnswer| {
            merged.hits.extend(answer.hits);
            merged.complete &= answer.complete;
        };
        let mut failures = Vec::new();
        for answer in futures::future::join_all(group.asked.iter().map(search_on)).await {
            match answer {
                Ok(found) => add(found),
                Err(error) => failures.push(error),
            }
        }
        let mut spares = group.spare.iter();
        while let Some(error) = failures.pop() {
            let Some(spare) = spares.next() else {
                return Err(CqlError::server(format!(
                    "a vector search failed on a replica and no other replica is left: {error}"
                )));
            };
            match search_on(spare).await {
                Ok(found) => add(found),
                Err(error) => failures.push(error),
            }
        }
        Ok(merged)
    }
}
