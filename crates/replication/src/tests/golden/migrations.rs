//! Golden-script commands that move a tablet between simulated nodes, one committed stage
//! at a time, the way the server's migration driver does:
//!
//! - `join` — starts the next node and adds it to the cluster as `Joining`.
//! - `move k=KEY from=nX to=nY` — starts moving the key's tablet from nX to nY
//!   (`from=` or `to=` alone: a replica dropped or added).
//! - `stage k=KEY write-both|streamed|read-new|cleanup [only="nX nY"]` — the next stage,
//!   applied by every node or only by the listed ones (the others keep routing by the old
//!   map).
//! - `end k=KEY [abort]` — the migration ends, the leaving replica dropping its copy (or
//!   it is aborted before cleanup).
//! - `sync` — every node applies the metadata committed so far.
//! - `barrier [except="nX …"]` — the topology barrier for the current version on every node
//!   but the listed ones; each node's line shows the deliveries it coordinated that failed,
//!   per replica, when there were any.
//! - `stream k=KEY` — the tablet's stored cells copied from the leaving replica (from every
//!   old replica when it is down) to the pending one, then its Paxos state joined into the
//!   pending one's, as streaming does.
//! - `replicas k=KEY` shows a move under way after the replicas.
//! - `accept k=KEY v=VALUE ballot=MICROS on="nX …"` — a coordinator's Paxos proposal
//!   (column `v`, written at the ballot's time) promised and accepted by the listed
//!   replicas only: it died before proposing to the others or committing.
//!   `promise k=KEY ballot=MICROS on="nX …"`: one that died after its prepare.
//! - `paxos k=KEY` — the Paxos state every node keeps of the key's partition: the ballots
//!   (microseconds) it promised, accepted and committed last.
//! - `prepare k=KEY` — a Paxos round prepared through the coordinator on the key's
//!   partition at SERIAL, finishing what earlier rounds left (a SERIAL read's first half).

use super::super::sim::{SimCluster, TABLE};
use super::{cell_key, partition, show_error, Outcome, Runner};
use crate::messages::{ReplicaRequest, ReplicaResponse};
use crate::paxos::{self, Ballot, PaxosKey, Proposal};
use goldenscript::Command;
use shoal_cluster::{Command as MetadataCommand, CommandOutcome, MemberState};
use shoal_cql::request::Consistency;
use shoal_model::{keys, Cell, TabletId};
use shoal_placement::MigrationStage;
use shoal_storage::{Engine, WriteBatch};
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

/// The tablet holding `key`.
fn tablet_of(cluster: &SimCluster, key: &str) -> Result<TabletId, String> {
    let (token, _) = partition(key);
    let placement = cluster.state.tables.get(&TABLE).ok_or("no table")?;
    Ok(placement.tablets.tablet_for(token).id)
}

/// The Paxos partition of `key`.
fn paxos_key(key: &str) -> PaxosKey {
    let (token, partition_key) = partition(key);
    PaxosKey {
        table: TABLE,
        token,
        partition_key,
    }
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
            Some("streamed") => MigrationStage::Streamed,
            Some("read-new") => MigrationStage::ReadNew,
            Some("cleanup") => MigrationStage::Cleanup,
            _ => return Err("stage k=KEY write-both|streamed|read-new|cleanup".into()),
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
        let cluster = self.cluster.as_mut().ok_or("no cluster")?;
        let tablet = tablet_of(cluster, &key)?;
        let placement = &cluster.state.tables[&TABLE];
        let transition = placement
            .tablets
            .get(tablet)
            .and_then(|t| t.transition.clone())
            .ok_or("the tablet is not moving")?;
        let migration = transition.id;
        let runtime = &self.runtime;
        let mut out = String::new();
        if !aborted {
            let (after, last) = placement.tablets.bounds_of(tablet).ok_or("no tablet")?;
            let (lower, upper) = keys::token_range(&TABLE, after, last);
            let leaving = transition
                .leaving
                .and_then(|host| cluster.node_of(&host))
                .filter(|n| cluster.liveness.is_alive_now(&n.member.host_id));
            if let Some(leaving) = leaving {
                leaving.engine.delete_range(&lower, &upper)?;
                let replica = leaving.proxy.local();
                runtime.block_on(paxos::forget_state(replica, TABLE, after, last))?;
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
                Ok(answer) => settled.push((index, answer)),
                Err(error) => writeln!(out, "{}: {error}", node.name)?,
            }
        }
        if !out.is_empty() {
            return Ok(out);
        }
        for (index, answer) in settled {
            let node = &cluster.nodes[index];
            node.proxy.fence(version);
            write!(out, "{}: fenced at version {version}", node.name)?;
            // The deliveries it coordinated that failed, per replica, since it started.
            let missed: Vec<String> = answer
                .missed
                .iter()
                .map(|(host, count)| format!("{} ×{count}", cluster.name_of(host)))
                .collect();
            if !missed.is_empty() {
                write!(out, " (missed deliveries: {})", missed.join(", "))?;
            }
            writeln!(out)?;
        }
        Ok(out)
    }

    pub(super) fn stream(&mut self, command: &Command) -> Outcome {
        let mut args = command.consume_args();
        let key = args.take_key("k").ok_or("k= is required")?.to_string();
        args.reject_next()?;
        let cluster = self.cluster.as_ref().ok_or("no cluster")?;
        let runtime = &self.runtime;
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
        let node = |host| cluster.node_of(&host);
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
            let (lower, upper) = paxos::state_range(after, last);
            let mut states = Vec::new();
            let mut cursor = source.engine.scan(&lower, &upper, false)?;
            while let Some((key, value)) = cursor.current() {
                if paxos::is_state_of(key, &TABLE) {
                    states.push((key.to_vec(), value.to_vec()));
                }
                cursor.advance();
            }
            drop(cursor);
            let replica = target.proxy.local();
            let mut joined = 0;
            for (key, value) in &states {
                if runtime.block_on(replica.absorb_paxos_state(key, value))? {
                    joined += 1;
                }
            }
            write!(out, "{} → {}: {count} cells", source.name, target.name)?;
            if !states.is_empty() {
                write!(out, ", Paxos states joined: {joined}")?;
            }
            writeln!(out)?;
        }
        Ok(out)
    }

    /// `accept` (`propose`: promised and accepted) or `promise` (promised only).
    pub(super) fn accept(&mut self, command: &Command, propose: bool) -> Outcome {
        let mut args = command.consume_args();
        let key = args.take_key("k").ok_or("k= is required")?.to_string();
        let value = if propose {
            args.take_key("v").ok_or("v= is required")?.to_string()
        } else {
            String::new()
        };
        let micros: i64 = args
            .take_key("ballot")
            .ok_or("ballot= is required")?
            .parse()?;
        let on = args.take_key("on").ok_or("on= is required")?.to_string();
        args.reject_next()?;
        let cluster = self.cluster()?;
        let ballot = Ballot { micros, node: 99 };
        let proposal = Proposal {
            ballot,
            update: vec![(
                cell_key(&key),
                Cell::live(ballot.timestamp(), value.into_bytes()).encode(),
            )],
        };
        let replicas: Vec<_> = node_names(cluster, &on)?
            .into_iter()
            .map(|index| {
                (
                    cluster.nodes[index].name.clone(),
                    Arc::clone(cluster.nodes[index].proxy.local()),
                )
            })
            .collect();
        let mut out = String::new();
        for (name, replica) in replicas {
            let prepare_request = ReplicaRequest::PaxosPrepare {
                key: paxos_key(&key),
                ballot,
                read: false,
            };
            let propose_request = ReplicaRequest::PaxosPropose {
                key: paxos_key(&key),
                proposal: proposal.clone(),
            };
            let verdict = self.runtime.block_on(async {
                let promised = matches!(replica.serve(prepare_request).await, ReplicaResponse::PaxosPromise(p) if p.promised);
                if !promised {
                    return "refused";
                }
                if !propose {
                    return "promised";
                }
                match replica.serve(propose_request).await {
                    ReplicaResponse::PaxosAccepted { accepted: true, .. } => "accepted",
                    _ => "refused",
                }
            });
            writeln!(out, "{name}: {verdict}")?;
        }
        Ok(out)
    }

    pub(super) fn paxos_state(&mut self, command: &Command) -> Outcome {
        let mut args = command.consume_args();
        let key = args.take_key("k").ok_or("k= is required")?.to_string();
        args.reject_next()?;
        let cluster = self.cluster()?;
        let mut out = String::new();
        for node in &cluster.nodes {
            let ballots = paxos::stored_ballots(node.engine.as_ref(), &paxos_key(&key))?;
            let shown: Vec<String> = ["promised", "accepted", "committed"]
                .iter()
                .zip(ballots)
                .filter_map(|(what, ballot)| {
                    // Ballots this script made are small; the clock's are shown as "now".
                    ballot.map(|b| match b.micros {
                        micros if micros < 1_000_000 => format!("{what} {micros}"),
                        _ => format!("{what} now"),
                    })
                })
                .collect();
            let shown = if shown.is_empty() {
                "nothing".to_string()
            } else {
                shown.join(", ")
            };
            writeln!(out, "{}: {shown}", node.name)?;
        }
        Ok(out)
    }

    pub(super) fn prepare(&mut self, command: &Command, coordinator: usize) -> Outcome {
        let mut args = command.consume_args();
        let key = args.take_key("k").ok_or("k= is required")?.to_string();
        args.reject_next()?;
        let proxy = Arc::clone(&self.cluster()?.nodes[coordinator].proxy);
        let deadline = tokio::time::Instant::now() + paxos::CAS_CONTENTION_TIMEOUT;
        let prepared = self.runtime.block_on(paxos::prepare(
            proxy.as_ref(),
            &paxos_key(&key),
            Consistency::Serial,
            deadline,
        ));
        Ok(match prepared {
            Ok(_) => "prepared".into(),
            Err(error) => show_error(&error),
        })
    }
}
