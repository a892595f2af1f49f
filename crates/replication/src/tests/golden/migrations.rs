//! Golden-script commands that move a tablet between simulated nodes, one committed stage
//! at a time, the way the server's migration driver does:
//!
//! - `join` — starts the next node and adds it to the cluster as `Joining`.
//! - `move k=KEY from=nX to=nY` — starts moving the key's tablet from nX to nY
//!   (`from=` or `to=` alone: a replica dropped or added).
//! - `stage k=KEY write-both|read-new|cleanup [only="nX nY"]` — the next stage, applied by
//!   every node or only by the listed ones (the others keep routing by the old map).
//! - `end k=KEY [abort]` — the migration ends, the leaving replica dropping its copy (or
//!   it is aborted before cleanup).
//! - `sync` — every node applies the metadata committed so far.
//! - `barrier [except="nX …"]` — the topology barrier for the current version on every node
//!   but the listed ones.
//! - `stream k=KEY` — the tablet's stored cells copied from the leaving replica (from every
//!   old replica when it is down) to the pending one, as streaming does.
//! - `replicas k=KEY` shows a move under way after the replicas.

use super::super::sim::{SimCluster, TABLE};
use super::{partition, Outcome, Runner};
use goldenscript::Command;
use shoal_cluster::{Command as MetadataCommand, CommandOutcome, MemberState};
use shoal_model::{keys, TabletId};
use shoal_placement::MigrationStage;
use shoal_storage::{Engine, WriteBatch};
use std::fmt::Write as _;
use std::time::Duration;

/// The tablet holding `key`.
fn tablet_of(cluster: &SimCluster, key: &str) -> Result<TabletId, String> {
    let (token, _) = partition(key);
    let placement = cluster.state.tables.get(&TABLE).ok_or("no table")?;
    Ok(placement.tablets.tablet_for(token).id)
}

fn node_names(cluster: &SimCluster, list: &str) -> Result<Vec<usize>, String> {
    list.split([',', ' '])
        .filter(|name| !name.is_empty())
        .map(|name| cluster.index_of(name))
        .collect()
}

fn show(outcome: CommandOutcome) -> String {
    match outcome {
        CommandOutcome::Applied => String::new(),
        other => format!("{other:?}"),
    }
}

impl Runner {
    pub(super) fn join(&mut self) -> Outcome {
        let cluster = self.cluster()?;
        let index = cluster.start_node();
        let mut member = cluster.member(index);
        member.state = MemberState::Joining;
        let outcome = cluster.commit(MetadataCommand::AddMember(member));
        cluster.publish(None);
        Ok(match outcome {
            CommandOutcome::Applied => format!("{} joined", cluster.nodes[index].name),
            other => show(other),
        })
    }

    pub(super) fn start_move(&mut self, command: &Command) -> Outcome {
        let mut args = command.consume_args();
        let key = args.take_key("k").ok_or("k= is required")?.to_string();
        let from = args.take_key("from").map(str::to_string);
        let to = args.take_key("to").map(str::to_string);
        args.reject_next()?;
        let cluster = self.cluster()?;
        let host = |name: &Option<String>| -> Result<_, String> {
            name.as_deref()
                .map(|name| {
                    cluster
                        .index_of(name)
                        .map(|i| cluster.nodes[i].member.host_id)
                })
                .transpose()
        };
        let (leaving, pending) = (host(&from)?, host(&to)?);
        let tablet = tablet_of(cluster, &key)?;
        let outcome = cluster.commit(MetadataCommand::StartMigration {
            table: TABLE,
            tablet,
            leaving,
            pending,
        });
        cluster.publish(None);
        Ok(show(outcome))
    }

    pub(super) fn stage(&mut self, command: &Command) -> Outcome {
        let mut args = command.consume_args();
        let key = args.take_key("k").ok_or("k= is required")?.to_string();
        let to = match args.next_pos() {
            Some("write-both") => MigrationStage::WriteBoth,
            Some("read-new") => MigrationStage::ReadNew,
            Some("cleanup") => MigrationStage::Cleanup,
            _ => return Err("stage k=KEY write-both|read-new|cleanup".into()),
        };
        let only = args.take_key("only").map(str::to_string);
        args.reject_next()?;
        let cluster = self.cluster()?;
        let tablet = tablet_of(cluster, &key)?;
        let migration = cluster.state.tables[&TABLE]
            .tablets
            .get(tablet)
            .and_then(|t| t.transition.as_ref())
            .map(|t| t.id)
            .ok_or("the tablet is not moving")?;
        let outcome = cluster.commit(MetadataCommand::AdvanceMigration {
            table: TABLE,
            tablet,
            migration,
            to,
        });
        let only = only.map(|list| node_names(cluster, &list)).transpose()?;
        cluster.publish(only.as_deref());
        Ok(show(outcome))
    }

    pub(super) fn end(&mut self, command: &Command) -> Outcome {
        let mut args = command.consume_args();
        let key = args.take_key("k").ok_or("k= is required")?.to_string();
        let aborted = match args.next_pos() {
            Some("abort") => true,
            None => false,
            Some(other) => return Err(format!("unexpected {other}").into()),
        };
        args.reject_next()?;
        let cluster = self.cluster()?;
        let tablet = tablet_of(cluster, &key)?;
        let placement = &cluster.state.tables[&TABLE];
        let transition = placement
            .tablets
            .get(tablet)
            .and_then(|t| t.transition.clone())
            .ok_or("the tablet is not moving")?;
        let migration = transition.id;
        let mut out = String::new();
        if !aborted {
            let (after, last) = placement.tablets.bounds_of(tablet).ok_or("no tablet")?;
            let (lower, upper) = keys::token_range(&TABLE, after, last);
            let leaving = transition
                .leaving
                .and_then(|host| cluster.nodes.iter().find(|n| n.member.host_id == host))
                .filter(|n| cluster.liveness.is_alive_now(&n.member.host_id));
            if let Some(leaving) = leaving {
                leaving.engine.delete_range(&lower, &upper)?;
                writeln!(out, "{} dropped its copy", leaving.name)?;
            }
        }
        let outcome = cluster.commit(MetadataCommand::EndMigration {
            table: TABLE,
            tablet,
            migration,
            aborted,
        });
        cluster.publish(None);
        Ok(out + &show(outcome))
    }

    pub(super) fn sync(&mut self) -> Outcome {
        self.cluster()?.publish(None);
        Ok(String::new())
    }

    pub(super) fn barrier(&mut self, command: &Command) -> Outcome {
        let mut args = command.consume_args();
        let except = args.take_key("except").unwrap_or("").to_string();
        args.reject_next()?;
        let cluster = self.cluster.as_ref().ok_or("no cluster")?;
        let skipped = node_names(cluster, &except)?;
        let version = cluster.state.topology_version;
        let mut out = String::new();
        let mut settled = Vec::new();
        for (index, node) in cluster.nodes.iter().enumerate() {
            if skipped.contains(&index) {
                continue;
            }
            let outcome = self
                .runtime
                .block_on(node.proxy.settle(version, Duration::from_secs(5)));
            match outcome {
                Ok(()) => settled.push(index),
                Err(error) => writeln!(out, "{}: {error}", node.name)?,
            }
        }
        if !out.is_empty() {
            return Ok(out);
        }
        for index in settled {
            let node = &cluster.nodes[index];
            node.proxy.fence(version);
            writeln!(out, "{}: fenced at version {version}", node.name)?;
        }
        Ok(out)
    }

    pub(super) fn stream(&mut self, command: &Command) -> Outcome {
        let mut args = command.consume_args();
        let key = args.take_key("k").ok_or("k= is required")?.to_string();
        args.reject_next()?;
        let cluster = self.cluster()?;
        let tablet = tablet_of(cluster, &key)?;
        let placement = &cluster.state.tables[&TABLE];
        let moving = placement.tablets.get(tablet).ok_or("no tablet")?;
        let transition = moving
            .transition
            .as_ref()
            .ok_or("the tablet is not moving")?;
        let pending = transition.pending.ok_or("nothing to stream to")?;
        let (after, last) = placement.tablets.bounds_of(tablet).ok_or("no tablet")?;
        let (lower, upper) = keys::token_range(&TABLE, after, last);
        let alive = |host| cluster.liveness.is_alive_now(host);
        let sources: Vec<_> = match transition.leaving {
            Some(leaving) if alive(&leaving) => vec![leaving],
            _ => moving
                .replicas
                .iter()
                .filter(|h| alive(h) && Some(**h) != transition.leaving)
                .copied()
                .collect(),
        };
        let node = |host| cluster.nodes.iter().find(|n| n.member.host_id == host);
        let target = node(pending).ok_or("no pending node")?;
        let mut out = String::new();
        for source in sources {
            let source = node(source).ok_or("no source node")?;
            let mut batch = WriteBatch::new();
            let mut cursor = source.engine.scan(&lower, &upper, false)?;
            while let Some((key, value)) = cursor.current() {
                batch.merge(key.to_vec(), value.to_vec());
                cursor.advance();
            }
            let count = batch.len();
            target.engine.write(&batch)?;
            writeln!(out, "{} → {}: {count} cells", source.name, target.name)?;
        }
        Ok(out)
    }
}
