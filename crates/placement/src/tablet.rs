//! Tablets, their replica sets, and a replica set in the middle of changing.
//!
//! A [`Tablet`] is a token range with the nodes that hold it. When a replica moves (a node
//! joins, leaves or is replaced, the balancer evens out load, the replication factor
//! changes), the tablet carries a [`Transition`] through five [`MigrationStage`]s, each a
//! committed metadata change:
//!
//! | stage | writes go to | a write waits for its level in | reads come from |
//! |---|---|---|---|
//! | `Allocated` | the old replicas | the old set | the old replicas |
//! | `WriteBoth` | old and new replicas | the old set | the old replicas |
//! | `Streamed` | old and new replicas | the old and the new set | the old replicas |
//! | `ReadNew` | old and new replicas | the old and the new set | the new replicas |
//! | `Cleanup` | the new replicas (`replicas` now holds them) | the new set | the new replicas |
//!
//! The pending replica is told to clear any leftover of the range while nobody writes to it
//! (`Allocated`), receives every write from `WriteBoth` on, is streamed the data written
//! before, and only then serves reads (`ReadNew`); the leaving replica drops its copy once
//! nobody reads or writes it any more (`Cleanup`).
//!
//! **Why `Streamed`.** While the data streams (`WriteBoth`), a write is acknowledged once
//! its level is met in the old set, without waiting for the pending replica: that replica
//! serves no reads yet, and waiting for it put a second node's round trip (a node busy
//! ingesting files) under every write to a moving tablet. What the pending replica must
//! not miss is checked before reads move instead. `Streamed` makes writes wait for both
//! sets again, and the topology barrier that follows it drains every `WriteBoth` write,
//! its delivery to the pending replica included; each node answers how many deliveries
//! failed and since when it runs (`shoal_replication::barrier`). Only if none failed, no
//! coordinator restarted and no node was out of the barrier's reach does the pending
//! replica have every write acknowledged before; otherwise it is streamed again, from a
//! snapshot taken after the barrier (every write since waited for it), before `ReadNew`.

use serde::{Deserialize, Serialize};
use shoal_model::{HostId, TabletId, Token};
use std::borrow::Cow;
use std::collections::BTreeSet;
use std::fmt;

/// One replica move, unique in the cluster's life (the metadata hands them out in order).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct MigrationId(pub u64);

impl fmt::Display for MigrationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "migration {}", self.0)
    }
}

/// Where a replica move stands (see the module documentation for what each stage means to
/// requests). [`MigrationStage::next`] gives their order; the declaration order is the
/// encoding in the metadata's log and snapshots, so a new stage goes last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MigrationStage {
    /// Chosen; nothing changed for requests yet. The pending replica clears the range.
    Allocated,
    /// Writes reach the pending replica too, without waiting for it; its data is being
    /// streamed.
    WriteBoth,
    /// The pending replica has the data: reads use the new replica set.
    ReadNew,
    /// The new set is the tablet's replica set; the leaving replica drops its copy.
    Cleanup,
    /// Streamed: writes wait for the pending replica too; once every node has drained the
    /// writes that did not, reads may move (after `WriteBoth`, before `ReadNew`).
    Streamed,
}

impl MigrationStage {
    pub fn name(self) -> &'static str {
        match self {
            MigrationStage::Allocated => "allocated",
            MigrationStage::WriteBoth => "write both",
            MigrationStage::Streamed => "streamed",
            MigrationStage::ReadNew => "read new",
            MigrationStage::Cleanup => "cleanup",
        }
    }

    /// The stage after this one, `None` after `Cleanup` (the transition ends).
    pub fn next(self) -> Option<MigrationStage> {
        match self {
            MigrationStage::Allocated => Some(MigrationStage::WriteBoth),
            MigrationStage::WriteBoth => Some(MigrationStage::Streamed),
            MigrationStage::Streamed => Some(MigrationStage::ReadNew),
            MigrationStage::ReadNew => Some(MigrationStage::Cleanup),
            MigrationStage::Cleanup => None,
        }
    }
}

/// A replica set changing: `leaving` gives up the tablet, `pending` takes it. A move has
/// both; adding a replica (the factor grew, a replica was lost with its node) has only
/// `pending`; dropping one (the factor shrank) only `leaving`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transition {
    pub id: MigrationId,
    pub leaving: Option<HostId>,
    pub pending: Option<HostId>,
    pub stage: MigrationStage,
}

/// One tablet: the tokens `(previous tablet's last token, last_token]`, the nodes that hold
/// them (primary first), and the move under way, if any.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tablet {
    /// Stable while the tablet exists (a move keeps it; a split makes new ones).
    pub id: TabletId,
    pub last_token: Token,
    pub replicas: Vec<HostId>,
    pub transition: Option<Transition>,
}

/// The replicas a write must reach: the `old` set, and while a move is under way the `new`
/// one too. The consistency level must be met in the old set, and in the new one when
/// `wait_for_new` (from `Streamed` on; see the module documentation).
///
/// The old set is the tablet's own (borrowed: every write looks it up, and most tablets
/// are not moving).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteReplicas<'a> {
    pub old: &'a [HostId],
    pub new: Option<Vec<HostId>>,
    pub wait_for_new: bool,
}

impl WriteReplicas<'_> {
    /// Every node a write goes to, each once, old set first.
    pub fn all(&self) -> Vec<HostId> {
        let mut all = self.old.to_vec();
        for host in self.new.iter().flatten() {
            if !all.contains(host) {
                all.push(*host);
            }
        }
        all
    }
}

impl Tablet {
    /// The replica set once the transition is done (the current set without one).
    /// The pending replica takes the leaving one's place, so the primary stays first.
    pub fn new_replicas(&self) -> Vec<HostId> {
        let Some(transition) = &self.transition else {
            return self.replicas.clone();
        };
        if transition.stage == MigrationStage::Cleanup {
            return self.replicas.clone();
        }
        apply_move(&self.replicas, transition.leaving, transition.pending)
    }

    /// True when `other` is held by the same nodes (in any order): what merging the two
    /// needs, so that no data moves.
    pub fn held_by_same_nodes(&self, other: &Tablet) -> bool {
        self.replicas.len() == other.replicas.len()
            && self.replicas.iter().all(|h| other.replicas.contains(h))
    }

    /// The replicas reads ask (the tablet's own set, borrowed, unless reads have moved to
    /// the new one).
    pub fn read_replicas(&self) -> Cow<'_, [HostId]> {
        match &self.transition {
            Some(transition) if transition.stage == MigrationStage::ReadNew => {
                Cow::Owned(self.new_replicas())
            }
            _ => Cow::Borrowed(&self.replicas),
        }
    }

    /// The replicas writes reach.
    pub fn write_replicas(&self) -> WriteReplicas<'_> {
        let stage = self.transition.as_ref().map(|t| t.stage);
        let new = match stage {
            Some(
                MigrationStage::WriteBoth | MigrationStage::Streamed | MigrationStage::ReadNew,
            ) => Some(self.new_replicas()),
            _ => None,
        };
        WriteReplicas {
            old: &self.replicas,
            new,
            wait_for_new: matches!(
                stage,
                Some(MigrationStage::Streamed | MigrationStage::ReadNew)
            ),
        }
    }

    /// True when `host` holds or receives data of this tablet (a replica, or the pending
    /// replica of a move).
    pub fn involves(&self, host: &HostId) -> bool {
        self.replicas.contains(host)
            || self.transition.as_ref().is_some_and(|t| {
                t.pending.as_ref() == Some(host) || t.leaving.as_ref() == Some(host)
            })
    }
}

/// `replicas` with `leaving` replaced by `pending` (or removed, or `pending` added).
pub fn apply_move(
    replicas: &[HostId],
    leaving: Option<HostId>,
    pending: Option<HostId>,
) -> Vec<HostId> {
    let mut next: Vec<HostId> = Vec::with_capacity(replicas.len() + 1);
    let mut placed = false;
    for host in replicas {
        if Some(*host) == leaving {
            if let Some(pending) = pending {
                next.push(pending);
                placed = true;
            }
        } else {
            next.push(*host);
        }
    }
    if let (false, Some(pending)) = (placed, pending) {
        if !next.contains(&pending) {
            next.push(pending);
        }
    }
    next
}

/// A table's tablets, in token order, covering the whole ring, and the pairs of
/// neighbours that are to be merged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TabletMap {
    tablets: Vec<Tablet>,
    /// Tablets to be merged with the one after them, once both have the same replicas
    /// (the balancer moves the second onto the first's nodes first).
    #[serde(default)]
    merging: BTreeSet<TabletId>,
}

impl TabletMap {
    /// A map of `tablets`, which must be in token order and end at `Token::MAX`.
    pub fn new(tablets: Vec<Tablet>) -> TabletMap {
        TabletMap {
            tablets,
            merging: BTreeSet::new(),
        }
    }

    /// The tablets, in token order.
    pub fn tablets(&self) -> &[Tablet] {
        &self.tablets
    }

    /// The tablet with `id`, to change.
    pub fn get_mut(&mut self, id: TabletId) -> Option<&mut Tablet> {
        self.tablets.iter_mut().find(|tablet| tablet.id == id)
    }

    /// The tablet with `id`.
    pub fn get(&self, id: TabletId) -> Option<&Tablet> {
        self.tablets.iter().find(|tablet| tablet.id == id)
    }

    /// The index of the tablet holding `token`.
    pub fn tablet_index(&self, token: Token) -> usize {
        self.tablets
            .partition_point(|tablet| tablet.last_token < token)
            .min(self.tablets.len().saturating_sub(1))
    }

    /// The tablet holding `token`.
    pub fn tablet_for(&self, token: Token) -> &Tablet {
        &self.tablets[self.tablet_index(token)]
    }

    /// The first token after the previous tablet (`None`: the tablet starts the ring), and
    /// the last token, of the tablet with `id`: `(after, last]`.
    pub fn bounds_of(&self, id: TabletId) -> Option<(Option<Token>, Token)> {
        let index = self.tablets.iter().position(|tablet| tablet.id == id)?;
        let after = index
            .checked_sub(1)
            .map(|previous| self.tablets[previous].last_token);
        Some((after, self.tablets[index].last_token))
    }

    /// The tokens `node` reports in `system.local`/`system.peers`: the last tokens of the
    /// tablets it is the primary replica of.
    pub fn tokens_of(&self, node: &HostId) -> Vec<Token> {
        self.tablets
            .iter()
            .filter(|tablet| tablet.replicas.first() == Some(node))
            .map(|tablet| tablet.last_token)
            .collect()
    }

    /// Splits the tablet `id` in two at `at`: `(after, at]` and `(at, last]`. Both halves
    /// keep its replicas — every replica already holds both, since data is stored by token,
    /// so no data moves — and get new ids, the next unused ones of this map (so an id is
    /// never reused: state keyed by the old id cannot be mistaken for a half's). A tablet
    /// that is moving or to be merged is not split, nor at a token outside it. Returns the
    /// new ids.
    pub fn split(&mut self, id: TabletId, at: Token) -> Result<[TabletId; 2], String> {
        let index = self
            .tablets
            .iter()
            .position(|tablet| tablet.id == id)
            .ok_or_else(|| format!("no {id} to split"))?;
        let tablet = &self.tablets[index];
        if tablet.transition.is_some() {
            return Err(format!("{id} is moving"));
        }
        if self.in_merge(id) {
            return Err(format!("{id} is to be merged"));
        }
        let after = index
            .checked_sub(1)
            .map_or(Token::MIN, |previous| self.tablets[previous].last_token);
        if at <= after || at >= tablet.last_token {
            return Err(format!(
                "token {} is not strictly inside {id} ({}, {}]",
                at.0, after.0, tablet.last_token.0
            ));
        }
        let next = self.tablets.iter().map(|t| t.id.0).max().unwrap_or(0) + 1;
        let ids = [TabletId(next), TabletId(next + 1)];
        let upper = Tablet {
            id: ids[1],
            ..tablet.clone()
        };
        let lower = Tablet {
            id: ids[0],
            last_token: at,
            ..tablet.clone()
        };
        self.tablets.splice(index..=index, [lower, upper]);
        Ok(ids)
    }

    /// Marks the tablet `first` and the one after it to be merged ([`TabletMap::merge`]
    /// once they have the same replicas). Neither may be moving or marked already; `first`
    /// must not be the last tablet. Returns the second's id.
    pub fn plan_merge(&mut self, first: TabletId) -> Result<TabletId, String> {
        let index = self
            .tablets
            .iter()
            .position(|tablet| tablet.id == first)
            .ok_or_else(|| format!("no {first} to merge"))?;
        let second = self
            .tablets
            .get(index + 1)
            .ok_or_else(|| format!("{first} is the last tablet: nothing follows it"))?;
        for tablet in [&self.tablets[index], second] {
            if tablet.transition.is_some() {
                return Err(format!("{} is moving", tablet.id));
            }
            if self.in_merge(tablet.id) {
                return Err(format!("{} is to be merged already", tablet.id));
            }
        }
        let second = second.id;
        self.merging.insert(first);
        Ok(second)
    }

    /// The pairs of neighbouring tablets to be merged: (first, second).
    pub fn merges(&self) -> impl Iterator<Item = (&Tablet, &Tablet)> {
        self.tablets
            .windows(2)
            .filter(|pair| self.merging.contains(&pair[0].id))
            .map(|pair| (&pair[0], &pair[1]))
    }

    /// True when `id` is either tablet of a pair to be merged.
    pub fn in_merge(&self, id: TabletId) -> bool {
        self.merges()
            .any(|(first, second)| first.id == id || second.id == id)
    }

    /// Merges the tablet `first` with `second`, the one right after it, into one tablet
    /// `(first's start, second's last]` with a new id (never one used before) and
    /// `first`'s replicas, primary first. Both must be at rest and held by the same nodes,
    /// so no data moves. Returns the new id.
    pub fn merge(&mut self, first: TabletId, second: TabletId) -> Result<TabletId, String> {
        let index = self
            .tablets
            .iter()
            .position(|tablet| tablet.id == first)
            .ok_or_else(|| format!("no {first} to merge"))?;
        let (lower, upper) = match &self.tablets[index..] {
            [lower, upper, ..] if upper.id == second => (lower, upper),
            _ => return Err(format!("{second} does not follow {first}")),
        };
        if lower.transition.is_some() || upper.transition.is_some() {
            return Err(format!("{first} or {second} is moving"));
        }
        if !lower.held_by_same_nodes(upper) {
            return Err(format!("{first} and {second} are held by different nodes"));
        }
        // The ids only ever grow: the merged tablet's is above both halves'.
        let id = TabletId(self.tablets.iter().map(|t| t.id.0).max().unwrap_or(0) + 1);
        let merged = Tablet {
            id,
            last_token: upper.last_token,
            replicas: lower.replicas.clone(),
            transition: None,
        };
        self.tablets.splice(index..=index + 1, [merged]);
        self.merging.remove(&first);
        Ok(id)
    }

    /// Transitions under way.
    pub fn transitions(&self) -> impl Iterator<Item = (&Tablet, &Transition)> {
        self.tablets
            .iter()
            .filter_map(|tablet| tablet.transition.as_ref().map(|t| (tablet, t)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(id: u8) -> HostId {
        HostId([id; 16])
    }

    fn moving(stage: MigrationStage) -> Tablet {
        Tablet {
            id: TabletId(1),
            last_token: Token(0),
            replicas: vec![host(1), host(2), host(3)],
            transition: Some(Transition {
                id: MigrationId(7),
                leaving: Some(host(2)),
                pending: Some(host(4)),
                stage,
            }),
        }
    }

    #[test]
    fn each_stage_sends_reads_and_writes_where_the_table_says() {
        let old = vec![host(1), host(2), host(3)];
        let new = vec![host(1), host(4), host(3)];
        let allocated = moving(MigrationStage::Allocated);
        assert_eq!(*allocated.read_replicas(), *old);
        assert_eq!(allocated.write_replicas().new, None);
        let write_both = moving(MigrationStage::WriteBoth);
        assert_eq!(*write_both.read_replicas(), *old);
        assert_eq!(write_both.write_replicas().new, Some(new.clone()));
        assert_eq!(
            write_both.write_replicas().all(),
            vec![host(1), host(2), host(3), host(4)]
        );
        assert!(!write_both.write_replicas().wait_for_new);
        let streamed = moving(MigrationStage::Streamed);
        assert_eq!(*streamed.read_replicas(), *old);
        assert_eq!(streamed.write_replicas().new, Some(new.clone()));
        assert!(streamed.write_replicas().wait_for_new);
        let read_new = moving(MigrationStage::ReadNew);
        assert_eq!(*read_new.read_replicas(), *new);
        assert_eq!(read_new.write_replicas().old, old);
        assert!(read_new.write_replicas().wait_for_new);
        // At cleanup the replica set already is the new one.
        let mut cleanup = moving(MigrationStage::Cleanup);
        cleanup.replicas = new.clone();
        assert_eq!(*cleanup.read_replicas(), *new);
        assert_eq!(cleanup.write_replicas().all(), new);
    }

    #[test]
    fn a_split_halves_a_tablet_in_place_with_fresh_ids_and_the_same_replicas() {
        let replicas = vec![host(1), host(2)];
        let tablet = |id: u64, last: i64| Tablet {
            id: TabletId(id),
            last_token: Token(last),
            replicas: replicas.clone(),
            transition: None,
        };
        let mut map = TabletMap::new(vec![tablet(0, 0), tablet(1, i64::MAX)]);
        assert_eq!(
            map.split(TabletId(1), Token(100)),
            Ok([TabletId(2), TabletId(3)])
        );
        let layout: Vec<(u64, i64)> = map
            .tablets()
            .iter()
            .map(|t| (t.id.0, t.last_token.0))
            .collect();
        assert_eq!(layout, [(0, 0), (2, 100), (3, i64::MAX)]);
        assert!(map.tablets().iter().all(|t| t.replicas == replicas));
        assert_eq!(map.tablet_for(Token(50)).id, TabletId(2));
        assert_eq!(map.tablet_for(Token(101)).id, TabletId(3));
        // Never at a bound or outside, never a moving tablet, never an unknown one.
        assert!(map.split(TabletId(2), Token(0)).is_err());
        assert!(map.split(TabletId(2), Token(100)).is_err());
        assert!(map.split(TabletId(1), Token(5)).is_err());
        map.get_mut(TabletId(0)).unwrap().transition = moving(MigrationStage::Allocated).transition;
        assert!(map.split(TabletId(0), Token(-5)).is_err());
        // The first tablet starts after the ring's minimum.
        let mut first = TabletMap::new(vec![tablet(0, i64::MAX)]);
        assert!(first.split(TabletId(0), Token::MIN).is_err());
        assert!(first.split(TabletId(0), Token(i64::MIN + 1)).is_ok());
    }

    #[test]
    fn neighbours_held_by_the_same_nodes_merge_into_one_tablet_with_a_new_id() {
        let tablet = |id: u64, last: i64, replicas: &[u8]| Tablet {
            id: TabletId(id),
            last_token: Token(last),
            replicas: replicas.iter().map(|h| host(*h)).collect(),
            transition: None,
        };
        let mut map = TabletMap::new(vec![
            tablet(4, -100, &[1, 2]),
            tablet(7, 0, &[2, 1]),
            tablet(5, 100, &[3, 1]),
            tablet(6, i64::MAX, &[1, 2]),
        ]);
        // Nothing follows the last tablet; an unknown one cannot be marked.
        assert!(map.plan_merge(TabletId(6)).is_err());
        assert!(map.plan_merge(TabletId(9)).is_err());
        assert_eq!(map.plan_merge(TabletId(7)), Ok(TabletId(5)));
        assert!(map.in_merge(TabletId(7)) && map.in_merge(TabletId(5)));
        // A tablet in a pair is neither marked again, nor split.
        assert!(map.plan_merge(TabletId(4)).is_err());
        assert!(map.plan_merge(TabletId(5)).is_err());
        assert!(map.split(TabletId(5), Token(50)).is_err());
        // Held by different nodes: not merged until the balancer has moved the second.
        assert!(map.merge(TabletId(7), TabletId(5)).is_err());
        map.get_mut(TabletId(5)).unwrap().replicas = vec![host(1), host(2)];
        // Only a tablet with the one right after it.
        assert!(map.merge(TabletId(4), TabletId(5)).is_err());
        assert_eq!(map.merge(TabletId(7), TabletId(5)), Ok(TabletId(8)));
        let layout: Vec<(u64, i64)> = map
            .tablets()
            .iter()
            .map(|t| (t.id.0, t.last_token.0))
            .collect();
        assert_eq!(layout, [(4, -100), (8, 100), (6, i64::MAX)]);
        // The first's replicas, primary first; the mark is gone with the pair.
        assert_eq!(map.tablet_for(Token(1)).replicas, vec![host(2), host(1)]);
        assert_eq!(map.tablet_for(Token(-99)).id, TabletId(8));
        assert_eq!(map.merges().count(), 0);
        // A moving tablet is neither marked nor merged.
        map.get_mut(TabletId(6)).unwrap().transition = moving(MigrationStage::Allocated).transition;
        assert!(map.plan_merge(TabletId(8)).is_err());
        assert!(map.merge(TabletId(8), TabletId(6)).is_err());
        // The merged id is above every id the map had, so no id is used twice.
        map.get_mut(TabletId(6)).unwrap().transition = None;
        assert_eq!(map.merge(TabletId(4), TabletId(8)), Ok(TabletId(9)));
    }

    #[test]
    fn a_move_keeps_the_primary_first_and_adds_or_drops_replicas() {
        let replicas = [host(1), host(2)];
        assert_eq!(
            apply_move(&replicas, Some(host(1)), Some(host(9))),
            vec![host(9), host(2)]
        );
        assert_eq!(
            apply_move(&replicas, None, Some(host(9))),
            vec![host(1), host(2), host(9)]
        );
        assert_eq!(apply_move(&replicas, Some(host(2)), None), vec![host(1)]);
    }
}
