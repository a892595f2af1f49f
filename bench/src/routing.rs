//! Point reads of an ordered table sent straight to the node that holds their key.
//!
//! A token-aware driver sends a request to a replica of its partition, so no coordinator
//! forwards it. Drivers compute Murmur3 tokens, though, and an ordered table's token is its
//! key's leading bytes ([`ordered_token`]), so against an ordered table they pick a node at
//! random and two of three point reads on three nodes take an extra hop. Seed 002's client
//! (YCSB's Cassandra binding on the Java driver, which routes ByteOrderedPartitioner keys)
//! did not pay that hop. [`PointRoutes`] gives this client the same routing: it reads the
//! table's tablet map as `shoal admin ring KEYSPACE TABLE --json` prints it (each tablet's
//! last token and its replicas' addresses), finds a key's tablet by its ordered token, and
//! picks a copy of the prepared point read bound to that tablet's first replica (an
//! execution profile with a single-target load-balancing policy).
//!
//! The map is read once, before the run: a tablet that moves during the run only sends its
//! reads through one more hop, as an unrouted client always does.

use anyhow::Context;
use scylla::client::execution_profile::ExecutionProfile;
use scylla::policies::load_balancing::{NodeIdentifier, SingleTargetLoadBalancingPolicy};
use scylla::statement::prepared::PreparedStatement;
use shoal_model::token::ordered_token;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

/// Which prepared statement reaches the node holding a key.
pub struct PointRoutes {
    map: TabletMap,
    /// The point read bound to each of `map.nodes` (same index).
    statements: Vec<PreparedStatement>,
}

impl PointRoutes {
    /// Routes for `point_read` by the ring in `ring_file`; every node is reached on
    /// `cql_port`. `request_timeout` is the client's timeout, as for unrouted requests.
    pub fn load(
        ring_file: &Path,
        point_read: &PreparedStatement,
        cql_port: u16,
        request_timeout: Duration,
    ) -> anyhow::Result<PointRoutes> {
        let text = std::fs::read_to_string(ring_file)
            .with_context(|| format!("cannot read the tablet map {}", ring_file.display()))?;
        let map = TabletMap::parse(&text)
            .with_context(|| format!("in the tablet map {}", ring_file.display()))?;
        let statements = map
            .nodes
            .iter()
            .map(|node| {
                bound_to(
                    point_read,
                    SocketAddr::new(*node, cql_port),
                    request_timeout,
                )
            })
            .collect();
        Ok(PointRoutes { map, statements })
    }

    /// The point read that reaches the node holding `key` (an ordered table's text key).
    pub fn statement_for(&self, key: &str) -> &PreparedStatement {
        &self.statements[self.map.node_of(key)]
    }
}

/// A table's tablets: where each ends and which node holds it first.
#[derive(Debug)]
struct TabletMap {
    /// Each tablet's last token, ascending (the last one is the ring's end).
    last_tokens: Vec<i64>,
    /// Each tablet's first replica (same index), as an index into `nodes`.
    owners: Vec<usize>,
    nodes: Vec<IpAddr>,
}

#[derive(serde::Deserialize)]
struct Ring {
    tablets: Vec<RingTablet>,
}

#[derive(serde::Deserialize)]
struct RingTablet {
    last_token: i64,
    replicas: Vec<String>,
}

impl TabletMap {
    /// The map `shoal admin ring KEYSPACE TABLE --json` prints.
    fn parse(text: &str) -> anyhow::Result<TabletMap> {
        let mut ring: Ring = serde_json::from_str(text)
            .context("not a tablet map as `shoal admin ring --json` prints it")?;
        anyhow::ensure!(!ring.tablets.is_empty(), "the tablet map has no tablets");
        ring.tablets.sort_by_key(|tablet| tablet.last_token);
        let mut map = TabletMap {
            last_tokens: Vec::with_capacity(ring.tablets.len()),
            owners: Vec::with_capacity(ring.tablets.len()),
            nodes: Vec::new(),
        };
        for tablet in ring.tablets {
            let first = tablet.replicas.first().with_context(|| {
                format!("the tablet ending at {} has no replica", tablet.last_token)
            })?;
            let address: IpAddr = first
                .parse()
                .with_context(|| format!("replica address {first:?} is not an IP address"))?;
            let owner = match map.nodes.iter().position(|node| *node == address) {
                Some(known) => known,
                None => {
                    map.nodes.push(address);
                    map.nodes.len() - 1
                }
            };
            map.last_tokens.push(tablet.last_token);
            map.owners.push(owner);
        }
        Ok(map)
    }

    /// The node (an index into `nodes`) holding `key`: the first replica of the first
    /// tablet whose last token is not below the key's token.
    fn node_of(&self, key: &str) -> usize {
        let token = ordered_token(key.as_bytes()).0;
        let tablet = self
            .last_tokens
            .partition_point(|last| *last < token)
            .min(self.last_tokens.len() - 1);
        self.owners[tablet]
    }
}

/// A copy of `statement` that is always sent to `node`.
fn bound_to(
    statement: &PreparedStatement,
    node: SocketAddr,
    request_timeout: Duration,
) -> PreparedStatement {
    let profile = ExecutionProfile::builder()
        .request_timeout(Some(request_timeout))
        .load_balancing_policy(SingleTargetLoadBalancingPolicy::new(
            NodeIdentifier::NodeAddress(node),
            None,
        ))
        .build();
    let mut bound = statement.clone();
    bound.set_execution_profile_handle(Some(profile.into_handle()));
    bound
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_goes_to_the_first_replica_of_the_tablet_ending_at_or_after_its_token() {
        let middle = ordered_token(b"user5").0;
        // Listed out of order, as nothing promises the order of the JSON.
        let text = format!(
            r#"{{"keyspace": "ycsb", "table": "usertable", "tablets": [
                {{"id": 2, "last_token": {}, "replicas": ["127.0.0.2", "127.0.0.3"], "moving": null}},
                {{"id": 1, "last_token": {middle}, "replicas": ["127.0.0.1"], "moving": null}}
            ]}}"#,
            i64::MAX
        );
        let map = TabletMap::parse(&text).unwrap();
        let node = |key: &str| map.nodes[map.node_of(key)].to_string();
        assert_eq!(node("user1"), "127.0.0.1");
        assert_eq!(
            node("user5"),
            "127.0.0.1",
            "a tablet includes its last token"
        );
        assert_eq!(node("user9"), "127.0.0.2");
        assert_eq!(node("zzzz"), "127.0.0.2");
        assert_eq!(map.nodes.len(), 2);
    }

    #[test]
    fn a_map_without_tablets_or_with_a_replica_that_is_no_address_is_refused() {
        let empty = TabletMap::parse(r#"{"tablets": []}"#).unwrap_err();
        assert!(empty.to_string().contains("no tablets"), "{empty:#}");
        let named =
            TabletMap::parse(r#"{"tablets": [{"last_token": 5, "replicas": ["node-one"]}]}"#)
                .unwrap_err();
        assert!(
            format!("{named:#}").contains("not an IP address"),
            "{named:#}"
        );
        let orphan =
            TabletMap::parse(r#"{"tablets": [{"last_token": 5, "replicas": []}]}"#).unwrap_err();
        assert!(format!("{orphan:#}").contains("no replica"), "{orphan:#}");
        assert!(TabletMap::parse("status: ok").is_err());
    }
}
