//! The replica side of Paxos (the acceptor): a partition's state — the ballot it
//! promised, the proposal it accepted last, the update it committed last — kept in one
//! cell under [`super::PAXOS_TABLE_ID`], written through the write log before the replica
//! answers, and the steps of one partition serialized by a striped lock.

use super::{is_state_of, state_range, Ballot, PaxosKey, STATE_LOCK_STRIPES, STATE_TTL_SECONDS};
use crate::messages::Cells;
use crate::read::GATHER_LIMIT_CELLS;
use crate::replica::{read_visible, LocalReplica};
use serde::{Deserialize, Serialize};
use shoal_model::{keys, Cell, TableId, Token, WriteTimestamp};
use shoal_storage::{Engine, WriteBatch};
use std::sync::Arc;

/// States [`forget_state`] removes per write.
const FORGET_BATCH: usize = 4096;

/// Removes the Paxos state of `table`'s partitions in the token range `(after, last]`
/// from `replica`: before a tablet moves here (what an earlier stay left is stale — a
/// proposal accepted back then must not be finished now) and after it moved away. The
/// node is not among the tablet's Paxos participants at either time, so no round
/// changes the state meanwhile. Answers how many partitions' state was removed.
pub async fn forget_state(
    replica: &LocalReplica,
    table: TableId,
    after: Option<Token>,
    last: Token,
) -> Result<usize, String> {
    let (mut lower, upper) = state_range(after, last);
    let mut forgotten = 0;
    loop {
        let engine = Arc::clone(&replica.engine);
        let end = upper.clone();
        let (batch, resume) = tokio::task::spawn_blocking(move || {
            state_tombstones(engine.as_ref(), &table, &lower, &end)
        })
        .await
        .map_err(|e| format!("removing Paxos state failed: {e}"))??;
        forgotten += batch.len();
        if !batch.is_empty() {
            replica.log.append(batch).await.map_err(|e| e.message)?;
        }
        match resume {
            Some(next) => lower = next,
            None => return Ok(forgotten),
        }
    }
}

/// Tombstones for up to [`FORGET_BATCH`] of `table`'s live Paxos states in
/// `[lower, upper)`, each newer than the state it removes, and the key to go on from.
fn state_tombstones(
    engine: &dyn Engine,
    table: &TableId,
    lower: &[u8],
    upper: &[u8],
) -> Result<(WriteBatch, Option<Vec<u8>>), String> {
    let now_seconds = shoal_model::timestamp::now_seconds();
    let now_micros = shoal_model::timestamp::now_micros();
    let mut batch = WriteBatch::new();
    let mut cursor = engine
        .scan(lower, upper, false)
        .map_err(|e| e.to_string())?;
    while let Some((key, value)) = cursor.current() {
        if batch.len() == FORGET_BATCH {
            return Ok((batch, Some(key.to_vec())));
        }
        if is_state_of(key, table) {
            let cell = Cell::decode(value).map_err(|e| e.to_string())?;
            if cell.is_live(now_seconds) {
                let timestamp = WriteTimestamp(now_micros.max(cell.timestamp.0 + 1));
                batch.merge(
                    key.to_vec(),
                    Cell::tombstone(timestamp, now_seconds).encode(),
                );
            }
        }
        cursor.advance();
    }
    cursor.status().map_err(|e| e.to_string())?;
    Ok((batch, None))
}

/// An update proposed or committed under a ballot (the cells it writes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    pub ballot: Ballot,
    #[serde(with = "crate::messages::cells_serde")]
    pub update: Cells,
}

/// A replica's answer to a prepare.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Promise {
    /// True when the replica promised the ballot asked for.
    pub promised: bool,
    /// The highest ballot the replica has promised (the one asked for, when promised).
    pub highest: Ballot,
    /// The last proposal it accepted, if not yet known committed.
    pub accepted: Option<Proposal>,
    /// The last update it committed.
    pub committed: Option<Proposal>,
    /// When the prepare asked for it and the ballot was promised: the partition's visible
    /// cells, read under the promise (at most [`GATHER_LIMIT_CELLS`]), and whether that
    /// is all of them.
    pub partition: Option<(Cells, bool)>,
}

/// What a replica remembers of one partition's rounds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct PaxosState {
    promised: Option<Ballot>,
    accepted: Option<Proposal>,
    committed: Option<Proposal>,
}

impl PaxosState {
    /// Joins the state another replica keeps of the same partition into this one: the
    /// higher promise, the newer accepted proposal, the newer commit — what both replicas
    /// together have promised, accepted and committed, so the replica holding it
    /// keeps every promise and reports every acceptance either made. Answers the commit
    /// that is new here (its update must be applied with the state).
    fn join(&mut self, other: PaxosState) -> Option<Proposal> {
        self.promised = self.promised.max(other.promised);
        let newer = |mine: &Option<Proposal>, theirs: &Proposal| {
            mine.as_ref().is_none_or(|mine| mine.ballot < theirs.ballot)
        };
        if let Some(accepted) = other.accepted.filter(|a| newer(&self.accepted, a)) {
            self.accepted = Some(accepted);
        }
        let new_commit = other.committed.filter(|c| newer(&self.committed, c));
        if let Some(committed) = &new_commit {
            self.committed = Some(committed.clone());
        }
        // An acceptance no newer than the latest commit is finished.
        if let (Some(accepted), Some(committed)) = (&self.accepted, &self.committed) {
            if accepted.ballot <= committed.ballot {
                self.accepted = None;
            }
        }
        new_commit
    }
}

/// The replica side: each step reads the partition's state, decides and writes the new
/// state through the write log before answering, under the partition's lock stripe.
pub struct PaxosReplica {
    stripes: Vec<tokio::sync::Mutex<()>>,
}

impl Default for PaxosReplica {
    fn default() -> Self {
        PaxosReplica {
            stripes: (0..STATE_LOCK_STRIPES)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
        }
    }
}

/// The partition's state as stored, and the timestamp its cell was written with.
fn load_state(engine: &dyn Engine, key: &[u8]) -> Result<(PaxosState, i64), String> {
    let mut upper = key.to_vec();
    upper.push(0);
    let cursor = engine.scan(key, &upper, false).map_err(|e| e.to_string())?;
    let Some((_, value)) = cursor.current() else {
        cursor.status().map_err(|e| e.to_string())?;
        return Ok((PaxosState::default(), 0));
    };
    let cell = Cell::decode(value).map_err(|e| e.to_string())?;
    if !cell.is_live(shoal_model::timestamp::now_seconds()) {
        return Ok((PaxosState::default(), cell.timestamp.0));
    }
    let state = bincode::deserialize(&cell.value).map_err(|e| e.to_string())?;
    Ok((state, cell.timestamp.0))
}

/// The ballots of what a replica remembers of `key`'s partition: the promise, the
/// accepted proposal and the latest commit (for tests).
#[cfg(test)]
pub(crate) fn stored_ballots(
    engine: &dyn Engine,
    key: &PaxosKey,
) -> Result<[Option<Ballot>; 3], String> {
    let (state, _) = load_state(engine, &key.storage_key())?;
    let ballot = |proposal: &Option<Proposal>| proposal.as_ref().map(|p| p.ballot);
    Ok([
        state.promised,
        ballot(&state.accepted),
        ballot(&state.committed),
    ])
}

/// The cell that replaces the state written at `previous`: always newer, so the write
/// wins whatever the clock did.
fn state_cell(key: Vec<u8>, state: &PaxosState, previous: i64) -> Result<WriteBatch, String> {
    let timestamp = shoal_model::timestamp::now_micros().max(previous + 1);
    let value = bincode::serialize(state).map_err(|e| e.to_string())?;
    let cell = Cell::with_ttl(
        WriteTimestamp(timestamp),
        value,
        STATE_TTL_SECONDS,
        shoal_model::timestamp::now_seconds(),
    );
    let mut batch = WriteBatch::new();
    batch.merge(key, cell.encode());
    Ok(batch)
}

/// A partition's state, read under its lock stripe (held until this is dropped).
struct LockedState<'a> {
    _stripe: tokio::sync::MutexGuard<'a, ()>,
    storage_key: Vec<u8>,
    state: PaxosState,
    /// The timestamp the state's cell was written with.
    written: i64,
}

impl LockedState<'_> {
    /// The write that replaces the state with `self.state`.
    fn write(&self) -> Result<WriteBatch, String> {
        state_cell(self.storage_key.clone(), &self.state, self.written)
    }

    /// Writes `self.state` through the replica's log (before the replica answers).
    async fn save(&self, replica: &LocalReplica) -> Result<(), String> {
        replica
            .log
            .append(self.write()?)
            .await
            .map_err(|e| e.message)
    }
}

impl PaxosReplica {
    /// Takes the partition's lock stripe and reads its state.
    async fn lock<'a>(
        &'a self,
        replica: &LocalReplica,
        key: &PaxosKey,
    ) -> Result<LockedState<'a>, String> {
        let spread = (key.token.0 as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let stripe = &self.stripes[(spread >> 32) as usize % self.stripes.len()];
        let guard = stripe.lock().await;
        let storage_key = key.storage_key();
        let (state, written) = load_state(replica.engine.as_ref(), &storage_key)?;
        Ok(LockedState {
            _stripe: guard,
            storage_key,
            state,
            written,
        })
    }

    /// Promises `ballot` unless a higher or equal one was promised; with `read`, answers
    /// with the partition's cells as well, read while the partition's stripe is held — so
    /// no commit on this replica falls between the promise and the read.
    pub(crate) async fn prepare(
        &self,
        replica: &LocalReplica,
        key: &PaxosKey,
        ballot: Ballot,
        read: bool,
    ) -> Result<Promise, String> {
        let mut locked = self.lock(replica, key).await?;
        if let Some(promised) = locked.state.promised.filter(|p| *p >= ballot) {
            return Ok(Promise {
                promised: false,
                highest: promised,
                accepted: None,
                committed: None,
                partition: None,
            });
        }
        locked.state.promised = Some(ballot);
        locked.save(replica).await?;
        let partition = if read {
            let lower = keys::partition_prefix(&key.table, key.token, &key.partition_key);
            let upper = keys::increment_prefix(&lower).unwrap_or_else(|| vec![0xff; 64]);
            Some(read_visible(
                replica.engine.as_ref(),
                &lower,
                &upper,
                GATHER_LIMIT_CELLS,
            )?)
        } else {
            None
        };
        Ok(Promise {
            promised: true,
            highest: ballot,
            accepted: locked.state.accepted.take(),
            committed: locked.state.committed.take(),
            partition,
        })
    }

    /// Accepts `proposal` unless a higher ballot was promised since; answers whether it
    /// did and the highest ballot promised.
    pub(crate) async fn propose(
        &self,
        replica: &LocalReplica,
        key: &PaxosKey,
        proposal: Proposal,
    ) -> Result<(bool, Ballot), String> {
        let mut locked = self.lock(replica, key).await?;
        if let Some(promised) = locked.state.promised.filter(|p| *p > proposal.ballot) {
            return Ok((false, promised));
        }
        let ballot = proposal.ballot;
        locked.state.promised = Some(ballot);
        locked.state.accepted = Some(proposal);
        locked.save(replica).await?;
        Ok((true, ballot))
    }

    /// Takes in a partition's state as another replica stored it (`storage_key`,
    /// `stored`), streamed here with a tablet this node takes over: joins it into this
    /// node's state ([`PaxosState::join`]) and applies the commit it brings that is new
    /// here, so this replica never reports a commit it does not hold the data of.
    /// Answers whether anything changed.
    pub(crate) async fn absorb(
        &self,
        replica: &LocalReplica,
        storage_key: &[u8],
        stored: &[u8],
    ) -> Result<bool, String> {
        let key = PaxosKey::from_storage_key(storage_key)
            .ok_or("a streamed key is not a partition's Paxos state")?;
        let cell = Cell::decode(stored).map_err(|e| e.to_string())?;
        if !cell.is_live(shoal_model::timestamp::now_seconds()) {
            return Ok(false);
        }
        let theirs: PaxosState = bincode::deserialize(&cell.value).map_err(|e| e.to_string())?;
        let mut locked = self.lock(replica, &key).await?;
        let before = locked.state.clone();
        let new_commit = locked.state.join(theirs);
        if locked.state == before {
            return Ok(false);
        }
        let mut batch = new_commit.map_or_else(WriteBatch::new, |c| WriteBatch::from(c.update));
        batch.extend(locked.write()?);
        replica
            .apply(batch.into_entries())
            .await
            .map_err(|e| e.message)?;
        Ok(true)
    }

    /// Applies a committed update and remembers it as the latest commit (an older commit
    /// arriving late is applied — its cells are older anyway — but not remembered).
    pub(crate) async fn commit(
        &self,
        replica: &LocalReplica,
        key: &PaxosKey,
        proposal: Proposal,
    ) -> Result<(), String> {
        let mut locked = self.lock(replica, key).await?;
        let state = &mut locked.state;
        let update = proposal.update.clone();
        let newer = state
            .committed
            .as_ref()
            .is_none_or(|committed| committed.ballot < proposal.ballot);
        if newer {
            if state
                .accepted
                .as_ref()
                .is_some_and(|accepted| accepted.ballot <= proposal.ballot)
            {
                state.accepted = None;
            }
            state.committed = Some(proposal);
        }
        let mut batch = WriteBatch::from(update);
        if newer {
            batch.extend(locked.write()?);
        }
        replica
            .apply(batch.into_entries())
            .await
            .map_err(|e| e.message)
    }
}
