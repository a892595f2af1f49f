//! Keyspaces: a replication strategy, the tables that share it and the user-defined types
//! its tables may use.

use crate::TableMetadata;
use serde::{Deserialize, Serialize};
use shoal_model::types::UserType;
use shoal_placement::ReplicationStrategy;
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeyspaceMetadata {
    pub name: String,
    /// `class` plus the strategy's options, as `system_schema.keyspaces.replication` shows.
    pub replication: BTreeMap<String, String>,
    pub durable_writes: bool,
    pub tables: BTreeMap<String, Arc<TableMetadata>>,
    #[serde(default)]
    pub is_system: bool,
    /// User-defined types by name (`CREATE TYPE`). Tables embed the definitions they use;
    /// this is the source ALTER TYPE and new tables resolve names from.
    #[serde(default)]
    pub types: BTreeMap<String, UserType>,
    /// How its tables are replicated: leaderless at each request's consistency level, or
    /// through each tablet's Raft group (`AND consistency = 'strong'`).
    #[serde(default)]
    pub consistency: KeyspaceConsistency,
}

/// A keyspace's replication discipline (`CREATE KEYSPACE … AND consistency = '…'`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum KeyspaceConsistency {
    /// Cassandra's: every request chooses its consistency level.
    #[default]
    Eventual,
    /// Every write and read of its tables goes through the Raft group of the tablet it
    /// touches: linearizable whatever consistency level a request names.
    Strong,
}

impl KeyspaceConsistency {
    /// The option's value as CQL spells it.
    pub fn name(self) -> &'static str {
        match self {
            KeyspaceConsistency::Eventual => "eventual",
            KeyspaceConsistency::Strong => "strong",
        }
    }

    pub fn parse(text: &str) -> Option<KeyspaceConsistency> {
        match text.to_ascii_lowercase().as_str() {
            "eventual" => Some(KeyspaceConsistency::Eventual),
            "strong" => Some(KeyspaceConsistency::Strong),
            _ => None,
        }
    }
}

impl KeyspaceMetadata {
    /// The replication factor in this node's datacenter.
    pub fn replication_factor(&self) -> usize {
        let class = self
            .replication
            .get("class")
            .map(String::as_str)
            .unwrap_or("");
        if class.ends_with("LocalStrategy") {
            return 1;
        }
        if let Some(factor) = self.replication.get("replication_factor") {
            return factor.parse().unwrap_or(1);
        }
        self.replication
            .iter()
            .filter(|(k, _)| k.as_str() != "class")
            .filter_map(|(_, v)| v.parse::<usize>().ok())
            .sum::<usize>()
            .max(1)
    }
}

/// A keyspace's replication as placement understands it.
pub fn replication_strategy(keyspace: &KeyspaceMetadata) -> ReplicationStrategy {
    let class = keyspace
        .replication
        .get("class")
        .map(String::as_str)
        .unwrap_or("");
    if class.ends_with("NetworkTopologyStrategy") {
        let factors = keyspace
            .replication
            .iter()
            .filter(|(k, _)| k.as_str() != "class" && k.as_str() != "replication_factor")
            .filter_map(|(dc, n)| n.parse::<usize>().ok().map(|n| (dc.clone(), n)))
            .collect();
        ReplicationStrategy::NetworkTopology { factors }
    } else {
        ReplicationStrategy::Simple {
            factor: keyspace.replication_factor(),
        }
    }
}
