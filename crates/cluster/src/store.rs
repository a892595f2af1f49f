//! Raft's storage, kept in the node's engine metadata (durable on return):
//!
//! - [`LogStore`]: the vote, the committed id and the log entries under `raft/log/`
//!   (index big-endian, so key order is index order), mirrored in memory so that
//!   replication never reads the engine;
//! - [`StateMachine`]: the [`ClusterState`] with the last applied log id and membership,
//!   which is also the snapshot Raft ships to a member that is too far behind.
//!
//! **The state machine is persisted with each snapshot, not after every apply.** What makes
//! an applied entry durable is the log: an entry is synced before it is acknowledged
//! ([`LogStore`]'s `append`), and the committed log id is synced before anything is
//! applied (openraft calls `save_committed`, then `apply`). A node that restarts loads the
//! state machine persisted last and openraft applies every committed entry after it again
//! from the log, before the node serves anything. The log is only purged up to a snapshot,
//! and building one persists (and syncs) the state machine first, so the entries a
//! restart needs are always still there. Persisting the whole state after every apply
//! was a synced write of every tablet map on every node for every metadata change: a
//! join's dozens of migration steps each paid it four times over, on the nodes the join
//! kept busiest.
//!
//! Every applied state is published on a `watch` channel; the node reacts to it (schema,
//! tablets, peers).

// openraft's traits return its StorageError, which is large; helpers return it too.
#![allow(clippy::result_large_err)]

use crate::state::{ClusterState, Command, CommandOutcome};
use crate::{NodeId, TypeConfig};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftLogReader, RaftSnapshotBuilder,
    SnapshotMeta, StorageError, StorageIOError, StoredMembership, Vote,
};
use serde::{Deserialize, Serialize};
use shoal_storage::Engine;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::RangeBounds;
use std::sync::Arc;
use tokio::sync::{watch, Mutex};

const LOG_PREFIX: &[u8] = b"raft/log/";
const VOTE_KEY: &[u8] = b"raft/vote";
const COMMITTED_KEY: &[u8] = b"raft/committed";
const PURGED_KEY: &[u8] = b"raft/purged";
const STATE_MACHINE_KEY: &[u8] = b"raft/state_machine";

type StorageResult<T> = Result<T, StorageError<NodeId>>;

fn log_key(index: u64) -> Vec<u8> {
    let mut key = LOG_PREFIX.to_vec();
    key.extend_from_slice(&index.to_be_bytes());
    key
}

fn read_key(
    engine: &dyn Engine,
    key: &[u8],
) -> Result<Option<Vec<u8>>, shoal_storage::StorageError> {
    Ok(engine
        .metadata_with_prefix(key)?
        .into_iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v))
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, bincode::Error> {
    bincode::serialize(value)
}

/// Writes metadata entries durably, together, on a blocking thread: the write is synced,
/// which must not hold a runtime worker (and the requests queued on it) for the length of
/// an fsync.
async fn put_durably(
    engine: &Arc<dyn Engine>,
    entries: Vec<(Vec<u8>, Vec<u8>)>,
) -> Result<(), shoal_storage::StorageError> {
    on_blocking_thread(engine, move |engine| engine.put_metadata_all(&entries)).await
}

/// Deletes metadata entries durably, together, on a blocking thread ([`put_durably`]).
async fn delete_durably(
    engine: &Arc<dyn Engine>,
    keys: Vec<Vec<u8>>,
) -> Result<(), shoal_storage::StorageError> {
    on_blocking_thread(engine, move |engine| engine.delete_metadata_all(&keys)).await
}

async fn on_blocking_thread(
    engine: &Arc<dyn Engine>,
    write: impl FnOnce(&dyn Engine) -> Result<(), shoal_storage::StorageError> + Send + 'static,
) -> Result<(), shoal_storage::StorageError> {
    let engine = Arc::clone(engine);
    tokio::task::spawn_blocking(move || write(engine.as_ref()))
        .await
        .map_err(|_| {
            shoal_storage::StorageError::Io("a metadata write failed unexpectedly".into())
        })?
}

struct LogInner {
    engine: Arc<dyn Engine>,
    entries: BTreeMap<u64, Entry<TypeConfig>>,
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId<NodeId>>,
    last_purged: Option<LogId<NodeId>>,
}

impl LogInner {
    /// Deletes the log entries whose indexes are in `range`, on disk (together, off the
    /// runtime's workers: a purge after a snapshot removes hundreds) and in memory.
    async fn remove_entries(&mut self, range: impl RangeBounds<u64>) -> StorageResult<()> {
        let doomed: Vec<u64> = self.entries.range(range).map(|(i, _)| *i).collect();
        if doomed.is_empty() {
            return Ok(());
        }
        let keys = doomed.iter().map(|index| log_key(*index)).collect();
        delete_durably(&self.engine, keys)
            .await
            .map_err(|e| StorageIOError::write_logs(&e))?;
        for index in doomed {
            self.entries.remove(&index);
        }
        Ok(())
    }
}

/// Raft's log and vote.
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Mutex<LogInner>>,
}

impl LogStore {
    pub fn open(engine: Arc<dyn Engine>) -> anyhow_like::Result<LogStore> {
        let mut entries = BTreeMap::new();
        for (_, bytes) in engine.metadata_with_prefix(LOG_PREFIX)? {
            let entry: Entry<TypeConfig> = bincode::deserialize(&bytes)?;
            entries.insert(entry.log_id.index, entry);
        }
        let decode = |key: &[u8]| -> anyhow_like::Result<Option<Vec<u8>>> {
            Ok(read_key(engine.as_ref(), key)?)
        };
        let vote = match decode(VOTE_KEY)? {
            Some(bytes) => Some(bincode::deserialize(&bytes)?),
            None => None,
        };
        let committed = match decode(COMMITTED_KEY)? {
            Some(bytes) => bincode::deserialize(&bytes)?,
            None => None,
        };
        let last_purged = match decode(PURGED_KEY)? {
            Some(bytes) => bincode::deserialize(&bytes)?,
            None => None,
        };
        Ok(LogStore {
            inner: Arc::new(Mutex::new(LogInner {
                engine,
                entries,
                vote,
                committed,
                last_purged,
            })),
        })
    }

    /// True when this node has ever taken part in a cluster (it has a vote or a log).
    pub async fn has_state(&self) -> bool {
        let inner = self.inner.lock().await;
        inner.vote.is_some() || !inner.entries.is_empty() || inner.last_purged.is_some()
    }
}

/// Small error plumbing for opening stores.
pub mod anyhow_like {
    #[derive(Debug, thiserror::Error)]
    pub enum OpenError {
        #[error(transparent)]
        Storage(#[from] shoal_storage::StorageError),
        #[error("stored cluster metadata is unreadable: {0}")]
        Decode(#[from] bincode::Error),
    }
    pub type Result<T> = std::result::Result<T, OpenError>;
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<Entry<TypeConfig>>> {
        let inner = self.inner.lock().await;
        Ok(inner.entries.range(range).map(|(_, e)| e.clone()).collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        let inner = self.inner.lock().await;
        let last = inner
            .entries
            .values()
            .next_back()
            .map(|e| e.log_id)
            .or(inner.last_purged);
        Ok(LogState {
            last_purged_log_id: inner.last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StorageResult<()> {
        let mut inner = self.inner.lock().await;
        let bytes = encode(vote).map_err(|e| StorageIOError::write_vote(&e))?;
        put_durably(&inner.engine, vec![(VOTE_KEY.to_vec(), bytes)])
            .await
            .map_err(|e| StorageIOError::write_vote(&e))?;
        inner.vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote<NodeId>>> {
        Ok(self.inner.lock().await.vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StorageResult<()> {
        let mut inner = self.inner.lock().await;
        let bytes = encode(&committed).map_err(|e| StorageIOError::write(&e))?;
        put_durably(&inner.engine, vec![(COMMITTED_KEY.to_vec(), bytes)])
            .await
            .map_err(|e| StorageIOError::write(&e))?;
        inner.committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId<NodeId>>> {
        Ok(self.inner.lock().await.committed)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut inner = self.inner.lock().await;
        let entries: Vec<Entry<TypeConfig>> = entries.into_iter().collect();
        let mut encoded = Vec::with_capacity(entries.len());
        for entry in &entries {
            let bytes = encode(entry).map_err(|e| StorageIOError::write_logs(&e))?;
            encoded.push((log_key(entry.log_id.index), bytes));
        }
        put_durably(&inner.engine, encoded)
            .await
            .map_err(|e| StorageIOError::write_logs(&e))?;
        for entry in entries {
            inner.entries.insert(entry.log_id.index, entry);
        }
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        let mut inner = self.inner.lock().await;
        inner.remove_entries(log_id.index..).await
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StorageResult<()> {
        let mut inner = self.inner.lock().await;
        let bytes = encode(&Some(log_id)).map_err(|e| StorageIOError::write_logs(&e))?;
        put_durably(&inner.engine, vec![(PURGED_KEY.to_vec(), bytes)])
            .await
            .map_err(|e| StorageIOError::write_logs(&e))?;
        inner.last_purged = Some(log_id);
        inner.remove_entries(..=log_id.index).await
    }
}

/// The persisted form of the state machine (and the snapshot's bytes).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Persisted {
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, BasicNode>,
    state: ClusterState,
}

struct MachineInner {
    engine: Arc<dyn Engine>,
    persisted: Persisted,
    snapshot: Option<(SnapshotMeta<NodeId, BasicNode>, Vec<u8>)>,
    published: watch::Sender<Arc<ClusterState>>,
}

/// The cluster state machine.
#[derive(Clone)]
pub struct StateMachine {
    inner: Arc<Mutex<MachineInner>>,
}

impl StateMachine {
    /// Loads the persisted state; returns it with a channel that sees every applied state.
    pub fn open(
        engine: Arc<dyn Engine>,
    ) -> anyhow_like::Result<(StateMachine, watch::Receiver<Arc<ClusterState>>)> {
        let persisted: Persisted = match read_key(engine.as_ref(), STATE_MACHINE_KEY)? {
            Some(bytes) => bincode::deserialize(&bytes)?,
            None => Persisted::default(),
        };
        let (published, receiver) = watch::channel(Arc::new(persisted.state.clone()));
        Ok((
            StateMachine {
                inner: Arc::new(Mutex::new(MachineInner {
                    engine,
                    persisted,
                    snapshot: None,
                    published,
                })),
            },
            receiver,
        ))
    }
}

impl MachineInner {
    /// Writes the state machine whole and syncs it, on a blocking thread; answers the bytes
    /// persisted.
    async fn persist_durably(&self) -> StorageResult<Vec<u8>> {
        let bytes = encode(&self.persisted).map_err(|e| StorageIOError::write_state_machine(&e))?;
        put_durably(
            &self.engine,
            vec![(STATE_MACHINE_KEY.to_vec(), bytes.clone())],
        )
        .await
        .map_err(|e| StorageIOError::write_state_machine(&e))?;
        Ok(bytes)
    }

    fn publish(&self) {
        self.published
            .send_replace(Arc::new(self.persisted.state.clone()));
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> StorageResult<Snapshot<TypeConfig>> {
        let mut inner = self.inner.lock().await;
        // Raft purges the log up to a snapshot once it is built: the state it holds must be
        // on disk first, or a restart would find neither it nor the entries that made it.
        let bytes = inner.persist_durably().await?;
        let last = inner.persisted.last_applied;
        let meta = SnapshotMeta {
            last_log_id: last,
            last_membership: inner.persisted.membership.clone(),
            snapshot_id: match last {
                Some(id) => format!("{}-{}", id.leader_id.term, id.index),
                None => "empty".to_string(),
            },
        };
        inner.snapshot = Some((meta.clone(), bytes.clone()));
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Self;

    async fn applied_state(
        &mut self,
    ) -> StorageResult<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>)> {
        let inner = self.inner.lock().await;
        Ok((
            inner.persisted.last_applied,
            inner.persisted.membership.clone(),
        ))
    }

    async fn apply<I>(&mut self, entries: I) -> StorageResult<Vec<CommandOutcome>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut inner = self.inner.lock().await;
        let mut outcomes = Vec::new();
        for entry in entries {
            inner.persisted.last_applied = Some(entry.log_id);
            let outcome = match entry.payload {
                EntryPayload::Blank => CommandOutcome::Applied,
                EntryPayload::Normal(command) => {
                    let command: Command = command;
                    inner.persisted.state.apply(command)
                }
                EntryPayload::Membership(membership) => {
                    inner.persisted.membership =
                        StoredMembership::new(Some(entry.log_id), membership);
                    CommandOutcome::Applied
                }
            };
            outcomes.push(outcome);
        }
        // Not persisted here: the log holds what was applied (see the module documentation).
        inner.publish();
        Ok(outcomes)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> StorageResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> StorageResult<()> {
        let bytes = snapshot.into_inner();
        let persisted: Persisted = bincode::deserialize(&bytes)
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e))?;
        let mut inner = self.inner.lock().await;
        inner.persisted = Persisted {
            last_applied: meta.last_log_id,
            membership: meta.last_membership.clone(),
            state: persisted.state,
        };
        inner.persist_durably().await?;
        inner.snapshot = Some((meta.clone(), bytes));
        inner.publish();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot<TypeConfig>>> {
        let (existing, applied) = {
            let inner = self.inner.lock().await;
            (inner.snapshot.clone(), inner.persisted.last_applied)
        };
        match existing {
            Some((meta, bytes)) => Ok(Some(Snapshot {
                meta,
                snapshot: Box::new(Cursor::new(bytes)),
            })),
            // After a restart the persisted state machine is the snapshot.
            None if applied.is_some() => Ok(Some(self.build_snapshot().await?)),
            None => Ok(None),
        }
    }
}
