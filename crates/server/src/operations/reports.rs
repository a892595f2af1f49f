//! What `shoal admin` reports about this node: `netstats`, `tablestats`,
//! `tablehistograms`, `info`, `streams` and `ring`.

use super::*;

impl NodeOperations {
    /// As `nodetool netstats`: the node's mode, the tablets it streams in and out (and
    /// hints, the data waiting to reach other nodes), and the messages exchanged with
    /// each peer.
    pub(super) fn net_stats(&self) -> Value {
        let mode = if *self.close_clients.borrow() {
            "DRAINED"
        } else {
            match self.my_state() {
                Some(shoal_cluster::MemberState::Joining) => "JOINING",
                Some(shoal_cluster::MemberState::Leaving) => "LEAVING",
                Some(_) => "NORMAL",
                None => "DECOMMISSIONED",
            }
        };
        let (hint_bytes, hints_dropped) = self.hints.stats();
        let status = self.streaming.status();
        let receiving = status.incoming.iter().map(|s| {
            json!({
                "direction": "receiving",
                "tablet": s.tablet,
                "peers": s.sources.join(","),
                "bytes_done": s.bytes_received,
                "bytes_total": s.bytes_estimated,
            })
        });
        let sending = status.outgoing.iter().map(|s| {
            json!({
                "direction": "sending",
                "tablet": null,
                "peers": null,
                "bytes_done": s.bytes_sent,
                "bytes_total": null,
            })
        });
        json!({
            "mode": mode,
            "streams": receiving.chain(sending).collect::<Vec<_>>(),
            "stream_rate_limit_mib_per_s": status.rate_bytes_per_s.map(|b| b >> 20),
            "stream_policy": status.policy,
            "hints_pending_bytes": hint_bytes,
            "hints_dropped": hints_dropped,
            "peers": self.peers.statistics(),
        })
    }

    pub(super) fn table_stats(&self, keyspace: Option<&str>) -> Result<Value, String> {
        let schema = self.coordinator.schema();
        if let Some(keyspace) = keyspace {
            schema.keyspace(keyspace).map_err(|e| e.message)?;
        }
        let engine = self.coordinator.engine();
        let tables: Vec<Value> = schema
            .user_keyspaces()
            .filter(|k| keyspace.is_none_or(|name| name == k.name))
            .flat_map(|k| k.tables.values())
            .map(|table| {
                let lower = shoal_model::keys::table_prefix(&table.id);
                let upper = shoal_model::keys::table_end(&table.id);
                let (reads, writes) = self.metrics.table_requests(&table.id);
                json!({
                    "keyspace": table.keyspace,
                    "table": table.name,
                    "disk_bytes": engine.approximate_range_bytes(&lower, &upper),
                    "local_reads": reads,
                    "local_writes": writes,
                    "gc_grace_seconds": table.options.gc_grace_seconds,
                })
            })
            .collect();
        Ok(json!({ "tables": tables }))
    }

    /// Percentiles of a table's read and write latencies coordinated here, as the upper
    /// bound of the histogram bucket they fall in (buckets double from 50 µs).
    pub(super) fn table_histograms(&self, keyspace: &str, table: &str) -> Result<Value, String> {
        let schema = self.coordinator.schema();
        let metadata = schema.table(keyspace, table).map_err(|e| e.message)?;
        let (reads, writes) = self
            .metrics
            .table_latencies(&metadata.id)
            .unwrap_or_default();
        let percentiles: Vec<Value> = [0.5, 0.75, 0.95, 0.98, 0.99, 1.0]
            .into_iter()
            .map(|quantile| {
                let micros = |latency: &crate::metrics::Latency| {
                    latency
                        .quantile(quantile)
                        .map(|seconds| if seconds >= f64::MAX { None } else { Some((seconds * 1e6).round() as u64) })
                };
                json!({
                    "percentile": if quantile >= 1.0 { "max".to_string() } else { format!("{}%", quantile * 100.0) },
                    "read_latency_us_at_most": micros(&reads),
                    "write_latency_us_at_most": micros(&writes),
                })
            })
            .collect();
        Ok(json!({ "keyspace": keyspace, "table": table, "percentiles": percentiles }))
    }

    pub(super) fn info(&self) -> Value {
        let info = self.coordinator.info();
        let engine = self.coordinator.engine();
        let clients_served = !*self.close_clients.borrow();
        json!({
            "id": info.host_id.to_string(),
            "address": info.address,
            "datacenter": info.datacenter,
            "rack": info.rack,
            "uptime_seconds": self.started.elapsed().as_secs(),
            "load_bytes": engine.approximate_size_bytes(),
            "schema_version": uuid::Uuid::from_bytes(self.coordinator.schema().version).to_string(),
            "native_transport_active": clients_served,
            "members": self.coordinator.member_count(),
            "data_directory": self.data_dir,
        })
    }

    /// Migrations under way in the cluster (as this node knows them) and this node's
    /// streams.
    pub(super) fn streams(&self) -> Value {
        let mut migrations = Vec::new();
        if let Some(cluster) = self.coordinator.cluster() {
            let state = cluster.metadata.state();
            let schema = self.coordinator.schema();
            let address = |host: &Option<shoal_model::HostId>| {
                host.and_then(|h| state.member_by_host(&h))
                    .map(|m| m.internode_address.ip().to_string())
                    .unwrap_or_else(|| "-".into())
            };
            for (table, tablet, transition) in state.migrations() {
                let name = schema
                    .keyspace_of_table(&table)
                    .and_then(|k| {
                        k.tables
                            .values()
                            .find(|t| t.id == table)
                            .map(|t| format!("{}.{}", k.name, t.name))
                    })
                    .unwrap_or_else(|| table.to_string());
                migrations.push(json!({
                    "migration": transition.id.0,
                    "table": name,
                    "tablet": tablet.0,
                    "from": address(&transition.leaving),
                    "to": address(&transition.pending),
                    "stage": transition.stage.name(),
                }));
            }
        }
        let status = self.streaming.status();
        json!({
            "migrations": migrations,
            "receiving": status.incoming.iter().map(|s| json!({
                "migration": s.migration,
                "tablet": s.tablet,
                "from": s.sources,
                "bytes_done": s.bytes_received,
                "bytes_total": s.bytes_estimated,
                "mib_per_s": (s.bytes_received as f64 / s.seconds.max(0.001) / 1048576.0 * 10.0).round() / 10.0,
                "state": s.state,
            })).collect::<Vec<_>>(),
            "sending": status.outgoing,
            "rate_limit_mib_per_s": status.rate_bytes_per_s.map(|b| b >> 20),
            "policy": status.policy,
            "streamed_bytes_total": status.total_bytes,
        })
    }

    pub(super) fn ring(&self, keyspace: &str, table: &str) -> Result<Value, String> {
        let schema = self.coordinator.schema();
        let metadata = schema.table(keyspace, table).map_err(|e| e.message)?;
        let Some(cluster) = self.coordinator.cluster() else {
            return Err("this node is not part of a cluster".into());
        };
        let state = cluster.metadata.state();
        let Some(placement) = state.tables.get(&metadata.id) else {
            return Err(format!(
                "{keyspace}.{table} has no tablets (a virtual table?)"
            ));
        };
        let address = |host: &shoal_model::HostId| {
            state
                .members
                .values()
                .find(|m| m.host_id == *host)
                .map(|m| m.internode_address.ip().to_string())
                .unwrap_or_else(|| host.to_string())
        };
        let tablets: Vec<Value> = placement
            .tablets
            .tablets()
            .iter()
            .map(|tablet| {
                json!({
                    "id": tablet.id.0,
                    "last_token": tablet.last_token.0,
                    "replicas": tablet.replicas.iter().map(address).collect::<Vec<_>>(),
                    "moving": tablet.transition.as_ref().map(|t| format!(
                        "{} -> {} ({})",
                        t.leaving.as_ref().map_or("-".to_string(), address),
                        t.pending.as_ref().map_or("-".to_string(), address),
                        t.stage.name()
                    )),
                })
            })
            .collect();
        Ok(json!({ "keyspace": keyspace, "table": table, "tablets": tablets }))
    }
}
