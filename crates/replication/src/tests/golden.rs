//! Runs the plain-text scripts in `src/testscripts/` against a [`SimCluster`]: each block
//! of commands, then `---`, then what they printed. Regenerate the expected output with
//! `UPDATE_GOLDENFILES=1 cargo test -p shoal-replication` and read the diff.
//!
//! Commands (a `nX:` prefix picks the coordinator; `n1` otherwise):
//!
//! - `cluster nodes=N rf=R [hint_window=SECONDS]` — a fresh cluster with one table.
//! - `write k=KEY v=VALUE [cl=LEVEL] [ts=MICROS]`, `delete k=KEY [cl=] [ts=]` — a cell
//!   write or a cell deletion of column `v` through the coordinator.
//! - `read k=KEY [cl=LEVEL]` — what a read at that level returns.
//! - `put nX k=KEY v=VALUE|deleted ts=MICROS` — a cell written into one node's storage
//!   only (a replica that missed writes, or holds old ones).
//! - `state nX up|down|paused|failing|read-only|slow=MILLIS` — how a node answers; `down` is also
//!   what the failure detector says.
//! - `replicas k=KEY` — the replicas of a key's tablet, primary first.
//! - `dump` — every node's visible cells.
//! - `hints` — how many hints every node keeps, and for whom.
//! - `replay` — every node replays its hints to the live nodes they are for.
//! - `sweep` — every node removes the hints that are no longer due.
//! - `restart nX` — a new process over the same storage (hints survive).
//! - `advance SECONDS` — moves the clock on.
//! - `repair` — anti-entropy repair of the table, coordinated by the prefix node.
//! - `batch logged|unlogged KEY=VALUE... [cl=LEVEL] [ts=MICROS] [crash=after-log]` — a
//!   BATCH writing column `v` of each key; `crash=after-log` stops the coordinator once
//!   the batch is in the batchlog, before any part is applied.
//! - `batchlog` — the batches every node keeps in its batchlog.
//! - `replay-batches` — every node replays every batch in its batchlog.
//! - `truncate ts=MICROS [except=nX]` — TRUNCATE as every node applies it: the truncation
//!   recorded, the table's data removed (not on the `except` node, whose removal failed).
//!
//! - `join`, `move`, `stage`, `end`, `barrier`, `stream` — a tablet moving between
//!   nodes; `accept`, `promise`, `paxos`, `prepare` — Paxos rounds left unfinished and finished
//!   ([`migrations`]).
//!
//! After every command the clock moves on 10 s, so writes still on their way to slow or
//! paused replicas finish (or time out) before the next one: the output never depends on
//! scheduling.

mod migrations;

use super::sim::{Behaviour, SimCluster, TABLE};
use crate::consistency::WriteType;
use crate::read::PartitionSource;
use crate::repair::RepairReport;
use goldenscript::{Command, Context};
use shoal_cql::request::Consistency;
use shoal_model::token::murmur3_token;
use shoal_model::{keys, Cell, CellKind, Token, WriteTimestamp};
use shoal_storage::{Engine, WriteBatch};
use std::error::Error;
use std::fmt::Write as _;
use std::time::Duration;

/// How long the clock moves after each command.
const SETTLE: Duration = Duration::from_secs(10);

struct Runner {
    runtime: tokio::runtime::Runtime,
    cluster: Option<SimCluster>,
}

type Outcome = Result<String, Box<dyn Error>>;

fn consistency(name: &str) -> Result<Consistency, Box<dyn Error>> {
    Ok(match name.to_ascii_uppercase().as_str() {
        "ANY" => Consistency::Any,
        "ONE" => Consistency::One,
        "TWO" => Consistency::Two,
        "THREE" => Consistency::Three,
        "QUORUM" => Consistency::Quorum,
        "ALL" => Consistency::All,
        "LOCAL_ONE" => Consistency::LocalOne,
        "LOCAL_QUORUM" => Consistency::LocalQuorum,
        "EACH_QUORUM" => Consistency::EachQuorum,
        other => return Err(format!("unknown consistency level {other}").into()),
    })
}

fn partition(key: &str) -> (Token, Vec<u8>) {
    (murmur3_token(key.as_bytes()), key.as_bytes().to_vec())
}

/// The storage key of column `v` of partition `key` (a table without clustering).
fn cell_key(key: &str) -> Vec<u8> {
    let (token, partition_key) = partition(key);
    let mut cell = keys::partition_prefix(&TABLE, token, &partition_key);
    cell.push(keys::SECTION_ROW);
    keys::push_column_part(&mut cell, |k| keys::push_cell_column(k, "v", b""));
    cell
}

fn show_cell(cell: &Cell) -> String {
    match cell.kind {
        CellKind::Tombstone { .. } => format!("deleted@{}", cell.timestamp.0),
        _ => format!(
            "'{}'@{}",
            String::from_utf8_lossy(&cell.value),
            cell.timestamp.0
        ),
    }
}

/// Every visible cell of the table in `engine`, as `key=value@ts`.
fn visible_cells(engine: &dyn Engine) -> Result<Vec<String>, Box<dyn Error>> {
    let mut shown = Vec::new();
    let mut failure = None;
    shoal_storage::shadow::visit_visible(
        engine,
        &keys::table_prefix(&TABLE),
        &keys::table_end(&TABLE),
        shoal_model::timestamp::now_seconds(),
        |key, value| {
            match (keys::split_partition(key), Cell::decode(value)) {
                (Some((_, partition_key, _)), Ok(cell)) => shown.push(format!(
                    "{}={}",
                    String::from_utf8_lossy(&partition_key),
                    show_cell(&cell)
                )),
                (_, Err(error)) => failure = Some(error.to_string()),
                (None, _) => failure = Some("malformed key".into()),
            }
            true
        },
    )?;
    match failure {
        Some(error) => Err(error.into()),
        None => {
            shown.sort();
            Ok(shown)
        }
    }
}

fn show_error(error: &shoal_cql::CqlError) -> String {
    use shoal_cql::ErrorCode;
    match &error.code {
        ErrorCode::Unavailable {
            required, alive, ..
        } => format!("Unavailable (required {required}, alive {alive})"),
        ErrorCode::WriteTimeout {
            received,
            block_for,
            write_type,
            ..
        } => format!("WriteTimeout (received {received} of {block_for}, {write_type})"),
        ErrorCode::ReadTimeout {
            received,
            block_for,
            data_present,
            ..
        } => format!(
            "ReadTimeout (received {received} of {block_for}, data {})",
            if *data_present { "present" } else { "absent" }
        ),
        other => format!("{other:?}: {}", error.message),
    }
}

impl Runner {
    fn cluster(&mut self) -> Result<&mut SimCluster, Box<dyn Error>> {
        self.cluster
            .as_mut()
            .ok_or_else(|| "no cluster yet: start with `cluster`".into())
    }

    fn coordinator(&mut self, context: &Context) -> Result<usize, Box<dyn Error>> {
        let name = context.prefix.clone().unwrap_or_else(|| "n1".into());
        Ok(self.cluster()?.index_of(&name)?)
    }

    fn write(&mut self, command: &Command, context: &Context, deletion: bool) -> Outcome {
        let coordinator = self.coordinator(context)?;
        let mut args = command.consume_args();
        let key = args.take_key("k").ok_or("k= is required")?.to_string();
        let value = if deletion {
            None
        } else {
            Some(args.take_key("v").ok_or("v= is required")?.to_string())
        };
        let level = consistency(args.take_key("cl").unwrap_or("ONE"))?;
        let timestamp = match args.take_key("ts") {
            Some(ts) => WriteTimestamp(ts.parse()?),
            None => WriteTimestamp::now(),
        };
        args.reject_next()?;
        let cell = match value {
            Some(value) => Cell::live(timestamp, value.into_bytes()),
            None => Cell::tombstone(timestamp, shoal_model::timestamp::now_seconds()),
        };
        let mut batch = WriteBatch::new();
        batch.merge(cell_key(&key), cell.encode());
        let proxy = self.cluster()?.nodes[coordinator].proxy.clone();
        let result = self
            .runtime
            .block_on(proxy.write(batch, level, WriteType::Simple));
        Ok(match result {
            Ok(()) => "ok".into(),
            Err(error) => show_error(&error),
        })
    }

    fn read(&mut self, command: &Command, context: &Context) -> Outcome {
        let coordinator = self.coordinator(context)?;
        let mut args = command.consume_args();
        let key = args.take_key("k").ok_or("k= is required")?.to_string();
        let level = consistency(args.take_key("cl").unwrap_or("ONE"))?;
        args.reject_next()?;
        let node = &self.cluster()?.nodes[coordinator];
        let (proxy, local) = (node.proxy.clone(), node.engine.clone());
        let partitions = [partition(&key)];
        let source = self
            .runtime
            .block_on(proxy.read_partitions(TABLE, &partitions, level));
        let cells = match source {
            Err(error) => return Ok(show_error(&error)),
            Ok(PartitionSource::Local(_in_flight)) => visible_cells(local.as_ref())?,
            Ok(PartitionSource::Merged(merged)) => visible_cells(&merged)?,
            Ok(PartitionSource::TooLarge) => return Ok("too large to gather".into()),
        };
        let shown: Vec<&String> = cells
            .iter()
            .filter(|c| c.starts_with(&format!("{key}=")))
            .collect();
        Ok(match shown.as_slice() {
            [] => format!("{key}: nothing"),
            _ => shown
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
    }

    fn put(&mut self, command: &Command) -> Outcome {
        let mut args = command.consume_args();
        let name = args.next_pos().ok_or("which node?")?.to_string();
        let key = args.take_key("k").ok_or("k= is required")?.to_string();
        let value = args.take_key("v").ok_or("v= is required")?.to_string();
        let timestamp = WriteTimestamp(args.take_key("ts").ok_or("ts= is required")?.parse()?);
        args.reject_next()?;
        let cell = if value == "deleted" {
            Cell::tombstone(timestamp, shoal_model::timestamp::now_seconds())
        } else {
            Cell::live(timestamp, value.into_bytes())
        };
        let cluster = self.cluster()?;
        let index = cluster.index_of(&name)?;
        let mut batch = WriteBatch::new();
        batch.merge(cell_key(&key), cell.encode());
        cluster.nodes[index].engine.write(&batch)?;
        Ok(String::new())
    }

    fn state(&mut self, command: &Command) -> Outcome {
        let mut args = command.consume_args();
        let name = args.next_pos().ok_or("which node?")?.to_string();
        let behaviour = match (args.next_pos(), args.take_key("slow")) {
            (Some("up"), None) => Behaviour::Up,
            (Some("down"), None) => Behaviour::Down,
            (Some("paused"), None) => Behaviour::Paused,
            (Some("failing"), None) => Behaviour::Failing,
            (Some("read-only"), None) => Behaviour::ReadOnly,
            (None, Some(millis)) => Behaviour::Slow(Duration::from_millis(millis.parse()?)),
            _ => return Err("state nX up|down|paused|failing|read-only|slow=MILLIS".into()),
        };
        args.reject_next()?;
        let cluster = self.cluster()?;
        let index = cluster.index_of(&name)?;
        cluster.set_behaviour(index, behaviour);
        Ok(String::new())
    }

    fn dump(&mut self) -> Outcome {
        let cluster = self.cluster()?;
        let mut out = String::new();
        for node in &cluster.nodes {
            let cells = visible_cells(node.engine.as_ref())?;
            writeln!(out, "{}: {}", node.name, cells.join(" "))?;
        }
        Ok(out)
    }

    fn hints(&mut self) -> Outcome {
        let cluster = self.cluster()?;
        let mut out = String::new();
        for node in &cluster.nodes {
            let (bytes, dropped) = node.proxy.hints().stats();
            let pending: Vec<&str> = cluster
                .nodes
                .iter()
                .filter(|target| node.proxy.hints().pending_for(&target.member.host_id))
                .map(|target| target.name.as_str())
                .collect();
            writeln!(
                out,
                "{}: for [{}] ({} bytes kept, {} dropped)",
                node.name,
                pending.join(" "),
                bytes,
                dropped
            )?;
        }
        Ok(out)
    }

    fn replay(&mut self) -> Outcome {
        let cluster = self.cluster()?;
        let mut replays = Vec::new();
        for node in &cluster.nodes {
            for target in &cluster.nodes {
                let hints = node.proxy.hints().clone();
                if hints.pending_for(&target.member.host_id)
                    && cluster.liveness.is_alive_now(&target.member.host_id)
                {
                    replays.push((
                        format!("{} → {}", node.name, target.name),
                        hints,
                        target.member.host_id,
                        target.member.internode_address,
                    ));
                }
            }
        }
        let transport = super::sim::SimTransport(cluster.network.clone());
        let mut out = String::new();
        for (label, hints, host, address) in replays {
            match self
                .runtime
                .block_on(hints.replay(host, address, &transport))
            {
                Ok(count) => writeln!(out, "{label}: {count} delivered")?,
                Err(error) => writeln!(out, "{label}: {error}")?,
            }
        }
        Ok(out)
    }

    fn batch(&mut self, command: &Command, context: &Context) -> Outcome {
        let coordinator = self.coordinator(context)?;
        let mut logged = None;
        let (mut level, mut timestamp, mut crash) =
            (Consistency::One, WriteTimestamp::now(), false);
        let mut values = Vec::new();
        for argument in &command.args {
            let (key, value) = match argument {
                goldenscript::Argument::Positional(value) => (None, value.as_str()),
                goldenscript::Argument::KeyValue(key, value) => {
                    (Some(key.as_str()), value.as_str())
                }
                other => return Err(format!("unexpected {other}").into()),
            };
            match (key, value) {
                (None, "logged") => logged = Some(true),
                (None, "unlogged") => logged = Some(false),
                (Some("cl"), value) => level = consistency(value)?,
                (Some("ts"), value) => timestamp = WriteTimestamp(value.parse()?),
                (Some("crash"), "after-log") => crash = true,
                (Some(key), value) => values.push((key, value)),
                (None, other) => return Err(format!("unexpected {other}").into()),
            }
        }
        let mut writes = WriteBatch::new();
        for (key, value) in values {
            let cell = Cell::live(timestamp, value.as_bytes().to_vec());
            writes.merge(cell_key(key), cell.encode());
        }
        let logged = logged.ok_or("logged or unlogged?")?;
        let proxy = self.cluster()?.nodes[coordinator].proxy.clone();
        let result = if crash {
            let cells = writes.into_entries();
            self.runtime
                .block_on(proxy.log_batch(&cells))
                .map(|_| "crashed after logging the batch".to_string())
        } else {
            self.runtime
                .block_on(proxy.write_batch(writes, level, logged))
                .map(|()| "ok".to_string())
        };
        Ok(result.unwrap_or_else(|error| show_error(&error)))
    }

    fn batchlog(&mut self) -> Outcome {
        let cluster = self.cluster()?;
        let mut out = String::new();
        for node in &cluster.nodes {
            let pending = crate::batchlog::pending(node.engine.as_ref(), i64::MAX)?;
            let batches: Vec<String> = pending
                .iter()
                .map(|(_, cells)| {
                    let keys: Vec<String> = cells
                        .iter()
                        .filter_map(|(key, _)| keys::split_partition(key))
                        .map(|(_, key, _)| String::from_utf8_lossy(&key).into_owned())
                        .collect();
                    format!("[{}]", keys.join(" "))
                })
                .collect();
            writeln!(out, "{}: {}", node.name, batches.join(" "))?;
        }
        Ok(out)
    }

    fn replay_batches(&mut self) -> Outcome {
        let proxies: Vec<_> = self
            .cluster()?
            .nodes
            .iter()
            .map(|node| (node.name.clone(), node.proxy.clone()))
            .collect();
        let mut out = String::new();
        for (name, proxy) in proxies {
            match self.runtime.block_on(proxy.replay_batches(Duration::ZERO)) {
                Ok(0) => {}
                Ok(count) => writeln!(out, "{name}: {count} replayed")?,
                Err(error) => writeln!(out, "{name}: {error}")?,
            }
        }
        Ok(out)
    }

    fn repair(&mut self, context: &Context) -> Outcome {
        let coordinator = self.coordinator(context)?;
        let proxy = self.cluster()?.nodes[coordinator].proxy.clone();
        Ok(match self.runtime.block_on(proxy.repair(vec![TABLE])) {
            Ok(RepairReport {
                tablets,
                tablets_skipped,
                segments_differing,
                cells_repaired,
                ..
            }) => format!(
                "{tablets} tablets ({tablets_skipped} skipped), {segments_differing} segments differed, {cells_repaired} cells repaired"
            ),
            Err(error) => show_error(&error),
        })
    }
}

impl goldenscript::Runner for Runner {
    type Command = Command;

    fn run(&mut self, command: &Command, context: &Context) -> Outcome {
        let handle = self.runtime.handle().clone();
        let _entered = handle.enter();
        let output = match command.name.as_str() {
            "cluster" => {
                let mut args = command.consume_args();
                let nodes = args.take_key("nodes").unwrap_or("3").parse()?;
                let rf = args.take_key("rf").unwrap_or("3").parse()?;
                let window =
                    Duration::from_secs(args.take_key("hint_window").unwrap_or("10800").parse()?);
                let max_hint_bytes = args
                    .take_key("max_hint_bytes")
                    .unwrap_or("67108864")
                    .parse()?;
                args.reject_next()?;
                self.cluster = Some(SimCluster::new(nodes, rf, window, max_hint_bytes));
                format!("{nodes} nodes, replication factor {rf}")
            }
            "write" => self.write(command, context, false)?,
            "delete" => self.write(command, context, true)?,
            "read" => self.read(command, context)?,
            "put" => self.put(command)?,
            "state" => self.state(command)?,
            "dump" => self.dump()?,
            "hints" => self.hints()?,
            "replay" => self.replay()?,
            "sweep" => {
                let mut out = String::new();
                for node in &self.cluster()?.nodes {
                    let removed = node.proxy.hints().sweep()?;
                    if removed > 0 {
                        writeln!(out, "{}: {removed} removed", node.name)?;
                    }
                }
                out
            }
            "restart" => {
                let mut args = command.consume_args();
                let name = args.next_pos().ok_or("which node?")?.to_string();
                args.reject_next()?;
                let cluster = self.cluster()?;
                let index = cluster.index_of(&name)?;
                cluster.restart(index);
                String::new()
            }
            "advance" => {
                let mut args = command.consume_args();
                let seconds: u64 = args.next_pos().ok_or("how many seconds?")?.parse()?;
                args.reject_next()?;
                self.runtime
                    .block_on(tokio::time::sleep(Duration::from_secs(seconds)));
                String::new()
            }
            "repair" => self.repair(context)?,
            "batch" => self.batch(command, context)?,
            "batchlog" => self.batchlog()?,
            "replay-batches" => self.replay_batches()?,
            "truncate" => {
                let mut args = command.consume_args();
                let at = WriteTimestamp(args.take_key("ts").ok_or("ts= is required")?.parse()?);
                let except = args.take_key("except").map(str::to_string);
                args.reject_next()?;
                for node in &self.cluster()?.nodes {
                    node.engine.set_truncated_at(TABLE, at);
                    if except.as_deref() != Some(node.name.as_str()) {
                        node.engine
                            .delete_range(&keys::table_prefix(&TABLE), &keys::table_end(&TABLE))?;
                    }
                }
                String::new()
            }
            "replicas" => {
                let mut args = command.consume_args();
                let key = args.take_key("k").ok_or("k= is required")?.to_string();
                args.reject_next()?;
                let cluster = self.cluster()?;
                let (token, _) = partition(&key);
                let name = |host: &shoal_model::HostId| cluster.name_of(host);
                let tablet = cluster.state.tables[&TABLE].tablets.tablet_for(token);
                let names: Vec<&str> = tablet.replicas.iter().map(name).collect();
                let moving = match &tablet.transition {
                    None => String::new(),
                    Some(t) => format!(
                        " (moving {} → {}, {})",
                        t.leaving.as_ref().map_or("-", name),
                        t.pending.as_ref().map_or("-", name),
                        t.stage.name()
                    ),
                };
                format!("{key}: {}{moving}", names.join(" "))
            }
            "join" => self.join()?,
            "move" => self.start_move(command)?,
            "stage" => self.stage(command)?,
            "end" => self.end(command)?,
            "barrier" => self.barrier(command)?,
            "sync" => self.sync()?,
            "stream" => self.stream(command)?,
            "accept" => self.accept(command, true)?,
            "promise" => self.accept(command, false)?,
            "paxos" => self.paxos_state(command)?,
            "prepare" => {
                let coordinator = self.coordinator(context)?;
                self.prepare(command, coordinator)?
            }
            other => return Err(format!("unknown command {other}").into()),
        };
        // Let deliveries still on their way finish or time out.
        self.runtime.block_on(tokio::time::sleep(SETTLE));
        Ok(if output.is_empty() || output.ends_with('\n') {
            output
        } else {
            output + "\n"
        })
    }
}

fn run_script(name: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    let mut runner = Runner {
        runtime,
        cluster: None,
    };
    // The directory at run time: one target directory serves several checkouts, and a
    // test binary built in another one still reads this checkout's scripts.
    let manifest = std::env::var("CARGO_MANIFEST_DIR")
        .unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
    let path = std::path::Path::new(&manifest)
        .join("src/testscripts")
        .join(name);
    goldenscript::run(&mut runner, &path).expect("script runs");
}

#[test]
fn tablet_migrations_paxos() {
    run_script("tablet_migrations_paxos");
}

#[test]
fn consistency_levels() {
    run_script("consistency_levels");
}

#[test]
fn timeouts() {
    run_script("timeouts");
}

#[test]
fn read_repair() {
    run_script("read_repair");
}

#[test]
fn hints() {
    run_script("hints");
}

#[test]
fn batchlog() {
    run_script("batchlog");
}

#[test]
fn truncate() {
    run_script("truncate");
}

#[test]
fn tombstone_ties() {
    run_script("tombstone_ties");
}

#[test]
fn tablet_migrations() {
    run_script("tablet_migrations");
}
