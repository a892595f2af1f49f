//! Figures computed when Prometheus scrapes (rather than counted as requests run): the
//! engine's statistics and table sizes, the read scheduler's queues, the metadata Raft
//! group and the members, hints and repairs, streaming, and the consensus log.

use super::*;

/// Figures read when Prometheus scrapes.
pub(super) struct NodeCollector {
    pub(super) coordinator: Weak<Coordinator>,
    pub(super) proxy: Option<Arc<StorageProxy>>,
    pub(super) streaming: Arc<std::sync::OnceLock<Arc<crate::streaming::Streaming>>>,
    pub(super) consensus: Arc<std::sync::OnceLock<Arc<shoal_consensus::runtime::Counters>>>,
}

impl std::fmt::Debug for NodeCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NodeCollector")
    }
}

pub(super) fn gauge(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: i64,
) -> Result<(), std::fmt::Error> {
    let metric =
        encoder.encode_descriptor(name, help, None, ConstGauge::new(value).metric_type())?;
    ConstGauge::new(value).encode(metric)
}

pub(super) fn counter(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: u64,
) -> Result<(), std::fmt::Error> {
    let metric =
        encoder.encode_descriptor(name, help, None, ConstCounter::new(value).metric_type())?;
    ConstCounter::new(value).encode(metric)
}

impl Collector for NodeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(coordinator) = self.coordinator.upgrade() else {
            return Ok(());
        };
        self.encode_storage(&coordinator, &mut encoder)?;
        self.encode_reads_and_roles(&coordinator, &mut encoder)?;
        self.encode_cluster(&coordinator, &mut encoder)?;
        self.encode_replication(&mut encoder)?;
        self.encode_streaming(&mut encoder)?;
        self.encode_consensus(&mut encoder)
    }
}

impl NodeCollector {
    /// The engine's statistics and each table's bytes on disk.
    fn encode_storage(
        &self,
        coordinator: &Coordinator,
        encoder: &mut DescriptorEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        let engine = coordinator.engine();
        for statistic in engine.statistics() {
            gauge(
                encoder,
                statistic.name,
                statistic.help,
                statistic.value as i64,
            )?;
        }
        let schema = coordinator.schema();
        let sizes = Family::<TableLabels, Gauge>::default();
        for table in schema.user_keyspaces().flat_map(|k| k.tables.values()) {
            let lower = shoal_model::keys::table_prefix(&table.id);
            let upper = shoal_model::keys::table_end(&table.id);
            if let Some(bytes) = engine.approximate_range_bytes(&lower, &upper) {
                sizes
                    .get_or_create(&TableLabels {
                        keyspace: table.keyspace.clone(),
                        table: table.name.clone(),
                    })
                    .set(bytes as i64);
            }
        }
        let metric = encoder.encode_descriptor(
            "table_disk_bytes",
            "Bytes each table holds on disk on this node (estimate; memtables not included)",
            None,
            sizes.metric_type(),
        )?;
        sizes.encode(metric)?;
        Ok(())
    }

    /// The read scheduler's queues, and the roles known here.
    fn encode_reads_and_roles(
        &self,
        coordinator: &Coordinator,
        encoder: &mut DescriptorEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        for class in coordinator.reads().statistics() {
            gauge(
                encoder,
                &format!("read_queue_{}", class.class),
                "Reads of this class waiting in the read scheduler's queue",
                class.queued as i64,
            )?;
            gauge(
                encoder,
                &format!("read_queue_{}_served", class.class),
                "Reads of this class the read scheduler has served since the node started",
                class.served as i64,
            )?;
            gauge(
                encoder,
                &format!("read_queue_{}_wait_microseconds", class.class),
                "Total time served reads of this class waited in the queue",
                class.waited.as_micros() as i64,
            )?;
        }
        gauge(
            encoder,
            "roles",
            "Roles known to this node",
            coordinator.roles().current().roles.len() as i64,
        )?;
        Ok(())
    }

    /// The metadata Raft group, the members by state and the migrations under way.
    fn encode_cluster(
        &self,
        coordinator: &Coordinator,
        encoder: &mut DescriptorEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        if let Some(cluster) = coordinator.cluster() {
            let raft = cluster.metadata.raft_status();
            gauge(
                encoder,
                "raft_term",
                "The cluster metadata's Raft term",
                raft.term as i64,
            )?;
            gauge(
                encoder,
                "raft_is_leader",
                "1 if this node leads the cluster metadata's Raft group",
                i64::from(raft.is_leader),
            )?;
            gauge(
                encoder,
                "raft_applied_index",
                "Index of the last Raft entry applied here",
                raft.last_applied as i64,
            )?;
            let state = cluster.metadata.state();
            gauge(
                encoder,
                "cluster_members",
                "Members of the cluster",
                state.members.len() as i64,
            )?;
            // Members by state, every state present (0 when none), as `shoal admin
            // status` shows them: a join is over when no member is joining and no
            // migration is under way.
            let mut states = encoder.encode_descriptor(
                "cluster_members_in_state",
                "Members of the cluster in each state (joining, normal, leaving, removing)",
                None,
                MetricType::Gauge,
            )?;
            for member_state in [
                MemberState::Joining,
                MemberState::Normal,
                MemberState::Leaving,
                MemberState::Removing,
            ] {
                let count = state
                    .members
                    .values()
                    .filter(|member| member.state == member_state)
                    .count();
                ConstGauge::new(count as i64)
                    .encode(states.encode_family(&[("state", member_state.name())])?)?;
            }
            gauge(
                encoder,
                "tablet_migrations",
                "Tablet replica moves under way in the cluster",
                state.migrations().len() as i64,
            )?;
        }
        Ok(())
    }

    /// Hints, read repairs and repairs, and requests fenced by a topology barrier.
    fn encode_replication(
        &self,
        encoder: &mut DescriptorEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        if let Some(proxy) = &self.proxy {
            let (stored_bytes, dropped) = proxy.hints().stats();
            gauge(
                encoder,
                "hints_stored_bytes",
                "Bytes of hints kept for replicas that were down",
                stored_bytes as i64,
            )?;
            counter(
                encoder,
                "hints_dropped",
                "Hints not kept (window passed or the hints full)",
                dropped,
            )?;
            let repairs = proxy.repair_counters();
            let count = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
            for (name, help, value) in [
                ("read_repairs", "Replicas sent the cells they lacked while being read (reads, background checks, repairs)", count(&repairs.read_repairs)),
                ("read_repair_cells", "Cells sent to replicas that lacked them while being read", count(&repairs.read_repair_cells)),
                ("repairs_finished", "Anti-entropy repairs (shoal admin repair) coordinated here and finished", count(&repairs.repairs_finished)),
                ("repair_cells", "Cells anti-entropy repairs sent to replicas that lacked them", count(&repairs.repair_cells)),
            ] {
                counter(encoder, name, help, value)?;
            }
        }
        if let Some(proxy) = &self.proxy {
            counter(
                encoder,
                "fenced_requests",
                "Replica requests refused because their coordinator routed them by a tablet map a topology barrier had retired",
                proxy.local().fenced.load(Ordering::Relaxed),
            )?;
        }
        Ok(())
    }

    /// Tablet streams and the streaming policy's rate.
    fn encode_streaming(&self, encoder: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        if let Some(streaming) = self.streaming.get() {
            let status = streaming.status();
            gauge(
                encoder,
                "streams_active",
                "Data streams to or from other nodes running now (tablet moves)",
                (status.incoming.len() + status.outgoing.len()) as i64,
            )?;
            counter(
                encoder,
                "streamed_bytes",
                "Bytes of tablets this node sent or received",
                status.total_bytes,
            )?;
            gauge(
                encoder,
                "stream_rate_limit_bytes_per_second",
                "The streaming rate the policy allows now (0: no limit)",
                status.rate_bytes_per_s.unwrap_or(0) as i64,
            )?;
        }
        Ok(())
    }

    /// The consensus log of strongly consistent keyspaces.
    fn encode_consensus(&self, encoder: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        if let Some(consensus) = self.consensus.get() {
            let figures = [
                (
                    "consensus_epochs_sealed",
                    "Epochs the consensus log of strongly consistent keyspaces sealed",
                    &consensus.epochs_sealed,
                ),
                (
                    "consensus_log_syncs",
                    "Durable writes (one sync each) of the consensus log",
                    &consensus.log_syncs,
                ),
                (
                    "consensus_log_bytes",
                    "Bytes written to the consensus log, padding included",
                    &consensus.log_bytes,
                ),
                (
                    "consensus_entries_committed",
                    "Entries of strongly consistent tablets' logs applied here",
                    &consensus.entries_committed,
                ),
            ];
            for (name, help, value) in figures {
                counter(encoder, name, help, value.load(Ordering::Relaxed))?;
            }
        }
        Ok(())
    }
}
