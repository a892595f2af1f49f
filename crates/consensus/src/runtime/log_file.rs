//! The node's epoch log on disk: segment files written with `O_DIRECT`, one write and one
//! `fdatasync` for every group of epochs waiting.
//!
//! **Records.** Each [`PersistBatch`] is a record, `u32 length | u32 crc32 | batch`. A
//! write is a run of records padded with zeros to the next 4 KiB, written at a 4 KiB
//! offset; a zero header is padding (reading skips to the next 4 KiB). So that the
//! padding always holds a whole zero header, a write that would end fewer than eight
//! bytes before a 4 KiB boundary gets another 4 KiB of zeros. Logs written before that
//! rule may end a write one to seven bytes short of a boundary: replay takes such a
//! zero tail for padding when no intact record starts there.
//!
//! **Why `O_DIRECT` into preallocated segments.** Written through the page cache, every
//! byte of the log cost the kernel a page allocation, a page clear and a copy: on the
//! seed-001 benchmark that was ~40% of all CPU (`perf`: `clear_page_erms` 20%,
//! `copy_folio_from_iter_atomic` 17%). Direct writes from an aligned buffer skip all
//! three. Segments ([`SEGMENT_BYTES`]) are allocated with `fallocate` when opened, so a
//! write never grows the file.
//!
//! **Recovery.** Opening replays every segment in order into what the groups need to
//! start again (each group's term, vote and log). A record whose length or checksum does
//! not hold can only be the last write, torn by a crash, and nothing in it was reported
//! durable (reports wait for the sync): it and the rest of its segment are zeroed, so a
//! later replay reads them as padding and goes on to the segments written since. New
//! writes go to a new segment.
//!
//! **Checkpoints.** Every so often the node writes a checkpoint: one record holding every
//! group's term and vote, a snapshot at its applied index (whose data the state machine
//! made durable first) and the entries after it — everything the earlier records said
//! that still matters. It starts a new segment, and once it is durable every earlier
//! segment is deleted ([`EpochLogFile::append_checkpoint`]): the log stays about as large
//! as the entries not yet applied, and a restart replays the checkpoint and what followed.

use crate::codec::{decode_persist_batch, encode_persist_batch, encoded_persist_batch_len};
use crate::log::{Entry, Log};
use crate::node::{LogWrite, PersistBatch};
use crate::{Epoch, GroupId, HardState, LogIndex, Term};
use bytes::Bytes;
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

const RECORD_HEADER_BYTES: usize = 8;
/// Direct I/O's unit: write offsets, lengths and buffers are multiples of it.
const ALIGNMENT: usize = 4096;
/// Each segment's size (a larger write gets a segment of its own size).
pub const SEGMENT_BYTES: u64 = 64 << 20;
/// A record longer than this is taken as damage, not allocated.
const MAX_RECORD_BYTES: usize = 1 << 30;

/// What the segments held when they were opened.
#[derive(Default, Debug)]
pub struct Recovered {
    pub hard_states: BTreeMap<GroupId, HardState>,
    /// Each group's log.
    pub logs: BTreeMap<GroupId, RecoveredLog>,
    /// The last snapshot each group installed, if any: its members and the state
    /// machine's record of it.
    pub snapshots: BTreeMap<GroupId, RecoveredSnapshot>,
    /// The last epoch written (the next incarnation starts above it).
    pub last_epoch: Epoch,
    /// Replay stopped at a damaged record (a torn last write).
    pub damaged: bool,
    /// The size of the segments replayed (what a checkpoint would let go).
    pub segment_bytes: u64,
}

/// One group's entries as the file holds them: from index 1, or after its last snapshot.
#[derive(Default, Debug)]
pub struct RecoveredLog {
    /// The index before `entries[0]` (0, or the snapshot's index) and its entry's term.
    pub before: LogIndex,
    pub before_term: Term,
    pub entries: Vec<Entry>,
}

impl RecoveredLog {
    /// Keeps the entries before `index` (and after the snapshot).
    fn truncate_from(&mut self, index: LogIndex) {
        let keep = index.0.saturating_sub(self.before.0 + 1) as usize;
        self.entries.truncate(keep);
    }
}

#[derive(Debug, Clone)]
pub struct RecoveredSnapshot {
    pub members: Vec<crate::NodeId>,
    pub state: Bytes,
}

impl Recovered {
    /// What a checkpoint must carry of the groups recovered here and not added to the
    /// node (yet): their terms and votes, and their logs with the snapshots they start
    /// after.
    pub fn checkpoint_writes(&self) -> (Vec<(GroupId, HardState)>, Vec<LogWrite>) {
        let hard_states = self
            .hard_states
            .iter()
            .map(|(group, state)| (*group, *state))
            .collect();
        let mut writes = Vec::new();
        for (group, log) in &self.logs {
            if let Some(snapshot) = self.snapshots.get(group) {
                writes.push(LogWrite::Snapshot {
                    group: *group,
                    index: log.before,
                    term: log.before_term,
                    members: snapshot.members.clone(),
                    state: snapshot.state.clone(),
                });
            }
            if !log.entries.is_empty() {
                writes.push(LogWrite::Append {
                    group: *group,
                    first: log.before.next(),
                    entries: log.entries.clone(),
                });
            }
        }
        (hard_states, writes)
    }

    /// The log of `group` as [`crate::MultiRaft::add_group`] takes it, moved out of what
    /// was recovered (a group is restored once).
    pub fn take_log(&mut self, group: GroupId) -> Log {
        let log = self.logs.remove(&group).unwrap_or_default();
        Log::restore(log.before.next(), log.before_term, log.entries)
    }
}

pub struct EpochLogFile {
    directory: PathBuf,
    segment: File,
    segment_number: u64,
    segment_bytes: u64,
    /// Where the next write goes in the current segment (a multiple of [`ALIGNMENT`]).
    offset: u64,
    buffer: AlignedBuffer,
    /// Bytes written since opened, padding included (the benchmark's log bytes).
    pub bytes_written: u64,
    pub syncs: u64,
}

impl EpochLogFile {
    /// Opens the log in `directory` (creating it), replays it, and starts a new segment.
    pub fn open(directory: &Path) -> io::Result<(EpochLogFile, Recovered)> {
        std::fs::create_dir_all(directory)?;
        let mut segments: Vec<(u64, PathBuf)> = std::fs::read_dir(directory)?
            .filter_map(|entry| {
                let path = entry.ok()?.path();
                let number = path
                    .file_name()?
                    .to_str()?
                    .strip_prefix("epochs-")?
                    .strip_suffix(".log")?
                    .parse()
                    .ok()?;
                Some((number, path))
            })
            .collect();
        segments.sort();
        let mut recovered = Recovered::default();
        for (_, path) in &segments {
            let contents = std::fs::read(path)?;
            recovered.segment_bytes += contents.len() as u64;
            if let Some(damage) = replay(&contents, &mut recovered) {
                recovered.damaged = true;
                tracing::warn!(
                    segment = %path.display(),
                    offset = damage,
                    "the epoch log ends in a damaged record (a torn last write); it is erased"
                );
                // Nothing from there on was reported durable. Zeroed, it reads as padding,
                // so segments written after this recovery are replayed after it next time.
                erase_from(path, damage as u64, contents.len() as u64)?;
            }
        }
        let next = segments.last().map_or(1, |(number, _)| number + 1);
        let (segment, segment_bytes) = create_segment(directory, next, SEGMENT_BYTES)?;
        Ok((
            EpochLogFile {
                directory: directory.to_path_buf(),
                segment,
                segment_number: next,
                segment_bytes,
                offset: 0,
                buffer: AlignedBuffer::with_capacity(1 << 20),
                bytes_written: 0,
                syncs: 0,
            },
            recovered,
        ))
    }

    /// Writes `batches`, which hold a checkpoint (a record that supersedes every record
    /// before it), into a new segment, then deletes every earlier segment.
    pub fn append_checkpoint(&mut self, batches: &[PersistBatch]) -> io::Result<()> {
        self.start_segment(SEGMENT_BYTES)?;
        self.append(batches)?;
        let current = self.segment_number;
        for entry in std::fs::read_dir(&self.directory)? {
            let path = entry?.path();
            let number = path
                .file_name()
                .and_then(|name| name.to_str())
                .and_then(|name| name.strip_prefix("epochs-")?.strip_suffix(".log"))
                .and_then(|number| number.parse::<u64>().ok());
            if number.is_some_and(|number| number < current) {
                std::fs::remove_file(&path)?;
            }
        }
        Ok(())
    }

    /// Moves writing to a new segment of at least `bytes`.
    fn start_segment(&mut self, bytes: u64) -> io::Result<()> {
        self.segment_number += 1;
        let (segment, bytes) = create_segment(
            &self.directory,
            self.segment_number,
            SEGMENT_BYTES.max(bytes),
        )?;
        self.segment = segment;
        self.segment_bytes = bytes;
        self.offset = 0;
        Ok(())
    }

    /// Writes `batches` as one aligned write and syncs once.
    pub fn append(&mut self, batches: &[PersistBatch]) -> io::Result<()> {
        let needed = batches
            .iter()
            .map(|batch| RECORD_HEADER_BYTES + encoded_persist_batch_len(batch))
            .sum::<usize>();
        let buffer = &mut self.buffer;
        buffer.prepare(needed);
        for batch in batches {
            let at = buffer.len();
            let body = buffer.encode(batch);
            let length = body.len() as u32;
            let checksum = crc32fast::hash(body);
            let header = buffer.header_mut(at);
            header[..4].copy_from_slice(&length.to_le_bytes());
            header[4..].copy_from_slice(&checksum.to_le_bytes());
        }
        buffer.pad_to_alignment();
        let length = buffer.len() as u64;
        if self.offset + length > self.segment_bytes {
            self.start_segment(length)?;
        }
        self.segment
            .write_all_at(self.buffer.as_slice(), self.offset)?;
        self.segment.sync_data()?;
        self.offset += length;
        self.bytes_written += length;
        self.syncs += 1;
        Ok(())
    }
}

/// Creates segment `number`, its blocks allocated, opened for direct writes.
fn create_segment(directory: &Path, number: u64, bytes: u64) -> io::Result<(File, u64)> {
    let bytes = bytes.div_ceil(ALIGNMENT as u64) * ALIGNMENT as u64;
    let path = directory.join(format!("epochs-{number:012}.log"));
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags((rustix::fs::OFlags::DIRECT | rustix::fs::OFlags::CLOEXEC).bits() as i32)
        .open(&path)
        .or_else(|_| {
            // A file system without direct I/O (tmpfs): buffered writes, same format.
            OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
        })?;
    if rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, bytes).is_err() {
        file.set_len(bytes)?;
    }
    // The new file's name must survive a crash before any record in it counts.
    File::open(directory)?.sync_all()?;
    Ok((file, bytes))
}

/// Applies every whole, intact record of one segment; where a damaged one starts, if any.
fn replay(contents: &[u8], recovered: &mut Recovered) -> Option<usize> {
    let mut position = 0;
    while let Some(header) = contents.get(position..position + RECORD_HEADER_BYTES) {
        let length = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let checksum = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        if length == 0 && checksum == 0 {
            // Padding up to the next aligned write (or the unwritten rest of the segment).
            position = (position / ALIGNMENT + 1) * ALIGNMENT;
            continue;
        }
        let start = position + RECORD_HEADER_BYTES;
        let body = contents.get(start..start.saturating_add(length));
        let intact =
            body.filter(|body| length <= MAX_RECORD_BYTES && crc32fast::hash(body) == checksum);
        let Some(batch) =
            intact.and_then(|body| decode_persist_batch(Bytes::copy_from_slice(body)).ok())
        else {
            // A write of an older version ending fewer than eight bytes before a boundary:
            // zeros up to it, and the next write from there.
            let boundary = (position / ALIGNMENT + 1) * ALIGNMENT;
            let zero_tail = contents
                .get(position..boundary)
                .is_some_and(|tail| tail.iter().all(|byte| *byte == 0));
            if zero_tail {
                position = boundary;
                continue;
            }
            return Some(position);
        };
        apply(recovered, batch);
        position = start + length;
    }
    None
}

/// Zeroes `[from, end)` of a segment and makes that durable.
fn erase_from(path: &Path, from: u64, end: u64) -> io::Result<()> {
    let file = OpenOptions::new().write(true).open(path)?;
    let zeros = vec![0u8; 1 << 20];
    let mut at = from;
    while at < end {
        let chunk = (end - at).min(zeros.len() as u64) as usize;
        file.write_all_at(&zeros[..chunk], at)?;
        at += chunk as u64;
    }
    file.sync_data()
}

fn apply(recovered: &mut Recovered, batch: PersistBatch) {
    recovered.last_epoch = recovered.last_epoch.max(batch.epoch);
    for (group, hard_state) in batch.hard_states {
        recovered.hard_states.insert(group, hard_state);
    }
    for write in batch.writes {
        match write {
            LogWrite::Truncate {
                group,
                from: LogIndex(0),
            } => {
                recovered.logs.remove(&group);
                recovered.snapshots.remove(&group);
            }
            LogWrite::Truncate { group, from } => {
                recovered.logs.entry(group).or_default().truncate_from(from);
            }
            LogWrite::Append {
                group,
                first,
                entries,
            } => {
                let log = recovered.logs.entry(group).or_default();
                // Appends follow the log's end (or rewrite its tail after a truncation);
                // entries a snapshot covers are skipped.
                log.truncate_from(first);
                let covered = log.before.0.saturating_sub(first.0.saturating_sub(1)) as usize;
                log.entries.extend(entries.into_iter().skip(covered));
            }
            LogWrite::Snapshot {
                group,
                index,
                term,
                members,
                state,
            } => {
                let log = recovered.logs.entry(group).or_default();
                // As `Log::restart_after`: entries after the snapshot that agree stay.
                let offset = index.0.checked_sub(log.before.0 + 1);
                let agrees = offset
                    .and_then(|offset| log.entries.get(offset as usize))
                    .is_some_and(|entry| entry.term == term);
                if agrees {
                    let drop = (index.0 - log.before.0) as usize;
                    log.entries.drain(..drop);
                } else {
                    log.entries.clear();
                }
                log.before = index;
                log.before_term = term;
                recovered
                    .snapshots
                    .insert(group, RecoveredSnapshot { members, state });
            }
        }
    }
}

/// A byte buffer whose contents start on an [`ALIGNMENT`] boundary, as direct I/O needs:
/// a vector whose first `start` bytes are skipped. Records are encoded straight into it;
/// [`AlignedBuffer::prepare`] reserves room for a whole write first, so the vector never
/// moves (which would lose the alignment) while one is encoded.
struct AlignedBuffer {
    storage: Vec<u8>,
    start: usize,
}

impl AlignedBuffer {
    fn with_capacity(capacity: usize) -> AlignedBuffer {
        let mut storage: Vec<u8> = Vec::with_capacity(capacity + ALIGNMENT);
        let start = storage.as_ptr().align_offset(ALIGNMENT);
        storage.resize(start, 0);
        AlignedBuffer { storage, start }
    }

    /// Empties the buffer with room for `bytes` (a fresh aligned allocation if needed).
    fn prepare(&mut self, bytes: usize) {
        if self.storage.capacity() < self.start + bytes + ALIGNMENT {
            *self = AlignedBuffer::with_capacity((bytes * 2).max(1 << 20));
        }
        self.storage.truncate(self.start);
    }

    fn len(&self) -> usize {
        self.storage.len() - self.start
    }

    fn as_slice(&self) -> &[u8] {
        &self.storage[self.start..]
    }

    fn header_mut(&mut self, at: usize) -> &mut [u8] {
        let at = self.start + at;
        &mut self.storage[at..at + RECORD_HEADER_BYTES]
    }

    /// Appends a record's place-holder header and its encoded batch; returns the body.
    fn encode(&mut self, batch: &PersistBatch) -> &[u8] {
        self.storage.extend_from_slice(&[0; RECORD_HEADER_BYTES]);
        let body = self.storage.len();
        encode_persist_batch(batch, &mut self.storage);
        &self.storage[body..]
    }

    /// Pads the buffer with zeros to a multiple of [`ALIGNMENT`], leaving room for a
    /// whole zero header (replay's mark of padding) whenever it pads at all.
    fn pad_to_alignment(&mut self) {
        let mut padded = self.len().div_ceil(ALIGNMENT) * ALIGNMENT;
        let gap = padded - self.len();
        if gap > 0 && gap < RECORD_HEADER_BYTES {
            padded += ALIGNMENT;
        }
        self.storage.resize(self.start + padded, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(term: u64, payload: &'static [u8]) -> Entry {
        Entry::new(Term(term), Bytes::from_static(payload))
    }

    #[test]
    fn reopening_replays_truncations_and_stops_at_a_torn_write() {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let group = GroupId(1);
        let first = PersistBatch {
            epoch: Epoch(1),
            hard_states: vec![(
                group,
                HardState {
                    term: Term(1),
                    voted_for: None,
                },
            )],
            writes: vec![LogWrite::Append {
                group,
                first: LogIndex(1),
                entries: vec![entry(1, b"a"), entry(1, b"b"), entry(1, b"c")],
            }],
        };
        let second = PersistBatch {
            epoch: Epoch(2),
            hard_states: vec![],
            writes: vec![
                LogWrite::Truncate {
                    group,
                    from: LogIndex(3),
                },
                LogWrite::Append {
                    group,
                    first: LogIndex(3),
                    entries: vec![entry(2, b"d")],
                },
            ],
        };
        let third = PersistBatch {
            epoch: Epoch(3),
            hard_states: vec![],
            writes: vec![LogWrite::Append {
                group,
                first: LogIndex(4),
                entries: vec![entry(2, b"e")],
            }],
        };
        {
            let (mut file, recovered) = EpochLogFile::open(directory.path()).expect("opens");
            assert!(recovered.logs.is_empty());
            file.append(&[first]).expect("writes");
            file.append(&[second]).expect("writes");
            file.append(&[third]).expect("writes");
        }
        // Tear the third write (the second aligned block of the first segment).
        let segment = directory.path().join("epochs-000000000001.log");
        let raw = OpenOptions::new()
            .write(true)
            .open(&segment)
            .expect("opens");
        raw.write_all_at(&[0xde, 0xad], ALIGNMENT as u64 * 2 + 9)
            .expect("writes");
        drop(raw);

        let (mut file, recovered) = EpochLogFile::open(directory.path()).expect("reopens");
        assert!(recovered.damaged);
        assert_eq!(recovered.last_epoch, Epoch(2));
        assert_eq!(recovered.hard_states[&group].term, Term(1));
        assert_eq!(
            recovered.logs[&group].entries,
            vec![entry(1, b"a"), entry(1, b"b"), entry(2, b"d")]
        );
        // New writes go to a new segment and are replayed after the old ones.
        let fourth = PersistBatch {
            epoch: Epoch(9),
            hard_states: vec![],
            writes: vec![LogWrite::Append {
                group,
                first: LogIndex(4),
                entries: vec![entry(3, b"f")],
            }],
        };
        file.append(&[fourth]).expect("writes");
        drop(file);
        let (_, again) = EpochLogFile::open(directory.path()).expect("reopens");
        assert!(!again.damaged, "the damage was erased");
        assert_eq!(again.last_epoch, Epoch(9));
        assert_eq!(
            again.logs[&group].entries,
            vec![
                entry(1, b"a"),
                entry(1, b"b"),
                entry(2, b"d"),
                entry(3, b"f")
            ]
        );
    }

    /// A batch of one entry whose record (header included) is `record_bytes` long modulo
    /// [`ALIGNMENT`].
    fn batch_with_record_length(epoch: u64, index: u64, record_bytes: usize) -> PersistBatch {
        let batch = |payload: usize| PersistBatch {
            epoch: Epoch(epoch),
            hard_states: vec![],
            writes: vec![LogWrite::Append {
                group: GroupId(1),
                first: LogIndex(index),
                entries: vec![Entry::new(Term(1), Bytes::from(vec![index as u8; payload]))],
            }],
        };
        let length = |payload| RECORD_HEADER_BYTES + encoded_persist_batch_len(&batch(payload));
        let payload = (0..2 * ALIGNMENT)
            .find(|payload| length(*payload) % ALIGNMENT == record_bytes)
            .expect("a payload of that record length");
        batch(payload)
    }

    fn recovered_indexes(directory: &Path) -> Vec<u8> {
        let (_, recovered) = EpochLogFile::open(directory).expect("reopens");
        assert!(!recovered.damaged, "nothing was torn");
        let log = &recovered.logs[&GroupId(1)];
        log.entries.iter().map(|entry| entry.payload[0]).collect()
    }

    #[test]
    fn a_write_ending_just_short_of_a_boundary_does_not_hide_the_writes_after_it() {
        for short_by in 1..=RECORD_HEADER_BYTES {
            let directory = tempfile::tempdir().expect("a temporary directory");
            let (mut file, _) = EpochLogFile::open(directory.path()).expect("opens");
            let near_boundary = batch_with_record_length(1, 1, ALIGNMENT - short_by);
            file.append(&[near_boundary]).expect("writes");
            file.append(&[batch_with_record_length(2, 2, 100)])
                .expect("writes");
            drop(file);
            assert_eq!(
                recovered_indexes(directory.path()),
                vec![1, 2],
                "a write {short_by} bytes short of a boundary"
            );
        }
    }

    #[test]
    fn a_log_whose_writes_end_two_bytes_short_of_a_boundary_is_replayed_whole() {
        // As versions that padded to the boundary only wrote it: records, two zero
        // bytes, the next write at the boundary.
        let record = |batch: &PersistBatch| {
            let mut body = Vec::new();
            encode_persist_batch(batch, &mut body);
            let mut record = (body.len() as u32).to_le_bytes().to_vec();
            record.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
            record.extend_from_slice(&body);
            record
        };
        let mut contents = record(&batch_with_record_length(1, 1, ALIGNMENT - 2));
        contents.resize(contents.len().div_ceil(ALIGNMENT) * ALIGNMENT, 0);
        contents.extend(record(&batch_with_record_length(2, 2, 100)));
        contents.resize(contents.len().div_ceil(ALIGNMENT) * ALIGNMENT, 0);
        let directory = tempfile::tempdir().expect("a temporary directory");
        std::fs::write(directory.path().join("epochs-000000000001.log"), contents).expect("writes");
        assert_eq!(recovered_indexes(directory.path()), vec![1, 2]);
    }

    #[test]
    fn a_write_larger_than_a_segment_gets_a_segment_of_its_own() {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let (mut file, _) = EpochLogFile::open(directory.path()).expect("opens");
        let big = Bytes::from(vec![7u8; SEGMENT_BYTES as usize + 10]);
        let batch = PersistBatch {
            epoch: Epoch(1),
            hard_states: vec![],
            writes: vec![LogWrite::Append {
                group: GroupId(1),
                first: LogIndex(1),
                entries: vec![Entry {
                    kind: crate::EntryKind::Data,
                    term: Term(1),
                    payload: big.clone(),
                }],
            }],
        };
        file.append(&[batch]).expect("writes");
        drop(file);
        let (_, recovered) = EpochLogFile::open(directory.path()).expect("reopens");
        assert_eq!(recovered.logs[&GroupId(1)].entries[0].payload, big);
    }

    #[test]
    fn a_snapshot_restarts_the_log_and_is_recovered_with_its_members_and_state() {
        let directory = tempfile::tempdir().expect("a directory");
        let (mut file, _) = EpochLogFile::open(directory.path()).expect("opens");
        let group = GroupId(3);
        let member = shoal_model::HostId([4; 16]);
        let batches = [
            PersistBatch {
                epoch: Epoch(1),
                hard_states: vec![],
                writes: vec![LogWrite::Append {
                    group,
                    first: LogIndex(1),
                    entries: vec![entry(1, b"a"), entry(1, b"b"), entry(1, b"c")],
                }],
            },
            PersistBatch {
                epoch: Epoch(2),
                hard_states: vec![],
                writes: vec![
                    // The log agrees at 2: entry 3 stays after the snapshot.
                    LogWrite::Snapshot {
                        group,
                        index: LogIndex(2),
                        term: Term(1),
                        members: vec![member],
                        state: Bytes::from_static(b"clock"),
                    },
                    LogWrite::Append {
                        group,
                        first: LogIndex(4),
                        entries: vec![entry(2, b"d")],
                    },
                ],
            },
        ];
        file.append(&batches).expect("writes");
        drop(file);
        let (_, mut recovered) = EpochLogFile::open(directory.path()).expect("reopens");
        let snapshot = recovered.snapshots[&group].clone();
        assert_eq!(snapshot.members, vec![member]);
        assert_eq!(snapshot.state, Bytes::from_static(b"clock"));
        let log = recovered.take_log(group);
        assert_eq!(log.first_index(), LogIndex(3));
        assert_eq!(log.term_at(LogIndex(2)), Some(Term(1)));
        assert_eq!(log.last_index(), LogIndex(4));
        assert_eq!(log.get(LogIndex(3)), Some(&entry(1, b"c")));
        assert_eq!(log.get(LogIndex(4)), Some(&entry(2, b"d")));
    }
}
