//! Taking nodes out: `decommission` (this node streams its tablets away and leaves, once
//! the others have room for its replicas) and `removenode` (a dead node's tablets are
//! re-replicated from the survivors), each returning when the node is gone — and the
//! wait for a join to end (`shoal admin join --wait`), which watches the same metadata.

use super::*;

impl NodeOperations {
    /// The cluster this node is part of (an error for a node that is not).
    fn cluster(&self) -> Result<&shoal_coordinator::ClusterView, String> {
        self.coordinator
            .cluster()
            .ok_or_else(|| "this node is not part of a cluster".to_string())
    }

    /// This node's state in the cluster (`None`: not a member, or no cluster).
    pub(super) fn my_state(&self) -> Option<shoal_cluster::MemberState> {
        let cluster = self.coordinator.cluster()?;
        let state = cluster.metadata.state();
        state
            .member_by_host(&self.coordinator.info().host_id)
            .map(|m| m.state)
    }

    /// Waits until `host` is no longer a member, as this node applies the metadata or, if
    /// this node stopped hearing the metadata (it has left itself), as another member
    /// says.
    pub(super) async fn wait_until_gone(&self, host: shoal_model::HostId) -> Result<(), String> {
        let cluster = self.cluster()?;
        let mut states = cluster.metadata.subscribe();
        loop {
            let state = Arc::clone(&states.borrow_and_update());
            if state.member_by_host(&host).is_none() {
                return Ok(());
            }
            let others: Vec<std::net::SocketAddr> = state
                .members
                .values()
                .filter(|m| m.host_id != host && m.host_id != self.coordinator.info().host_id)
                .filter(|m| {
                    shoal_replication::Liveness::is_alive(self.detector.as_ref(), &m.host_id)
                })
                .map(|m| m.internode_address)
                .collect();
            for other in others.iter().take(1) {
                let answer = self
                    .peers
                    .call(
                        *other,
                        &crate::internode::Message::Status,
                        std::time::Duration::from_secs(5),
                    )
                    .await;
                if let Ok(crate::internode::Reply::Status(members)) = answer {
                    if members.iter().all(|m| m.host_id != host) {
                        return Ok(());
                    }
                }
            }
            let _ = tokio::time::timeout(std::time::Duration::from_secs(1), states.changed()).await;
        }
    }

    /// Waits until this node is a normal member and no tablet migration is under way, as
    /// this node applies the metadata: its join is over, the old replicas' cleanup
    /// included. Answers how long it waited.
    pub(super) async fn wait_until_joined(&self) -> Result<Value, String> {
        use shoal_cluster::MemberState;
        let started = Instant::now();
        let cluster = self.cluster()?;
        let me = self.coordinator.info().host_id;
        let mut states = cluster.metadata.subscribe();
        loop {
            let state = Arc::clone(&states.borrow_and_update());
            match state.member_by_host(&me).map(|m| m.state) {
                Some(MemberState::Normal) if state.migrations().is_empty() => {
                    return Ok(json!({
                        "joined": true,
                        "waited_seconds": started.elapsed().as_secs_f64(),
                    }))
                }
                // Not admitted yet, joining, or normal while the last moves finish.
                None | Some(MemberState::Joining) | Some(MemberState::Normal) => {}
                Some(other) => {
                    return Err(format!(
                        "this node is {}, not joining the cluster",
                        other.name()
                    ))
                }
            }
            if states.changed().await.is_err() {
                return Err("the node is stopping".into());
            }
        }
    }

    pub(super) async fn decommission(&self) -> Result<Value, String> {
        let started = Instant::now();
        let cluster = self.cluster()?;
        let me = self.coordinator.info().host_id;
        let state = cluster.metadata.state();
        let member = state
            .member_by_host(&me)
            .ok_or("this node has already left the cluster")?;
        if member.state != shoal_cluster::MemberState::Leaving {
            self.check_room_without(&state, member)?;
            let outcome = cluster
                .metadata
                .propose(shoal_cluster::Command::SetMemberState {
                    host_id: me,
                    from: vec![
                        shoal_cluster::MemberState::Normal,
                        shoal_cluster::MemberState::Joining,
                    ],
                    to: shoal_cluster::MemberState::Leaving,
                })
                .await
                .map_err(|e| e.to_string())?;
            if let shoal_cluster::CommandOutcome::Rejected(reason) = outcome {
                return Err(format!("cannot decommission: {reason}"));
            }
            tracing::info!("decommissioning: streaming every tablet replica to other nodes");
        }
        self.wait_until_gone(me).await?;
        // A node outside the cluster routes by a tablet map nobody updates any more, and
        // must not campaign in a metadata group it is no longer part of.
        self.close_clients.send_replace(true);
        cluster.metadata.mark_left();
        cluster.metadata.shutdown().await;
        tracing::info!(
            "this node has left the cluster; it no longer serves clients and can be stopped"
        );
        Ok(json!({ "decommissioned": true, "seconds": started.elapsed().as_secs_f64() }))
    }

    /// Refuses to take `leaving` out when a keyspace's replication could no longer be met
    /// without it (as Cassandra refuses a decommission that would leave too few nodes).
    pub(super) fn check_room_without(
        &self,
        state: &shoal_cluster::ClusterState,
        leaving: &shoal_cluster::Member,
    ) -> Result<(), String> {
        let remaining: Vec<&shoal_cluster::Member> = state
            .members
            .values()
            .filter(|m| m.host_id != leaving.host_id && m.state.accepts_replicas())
            .collect();
        let schema = self.coordinator.schema();
        for (table, placement) in &state.tables {
            let needed: Vec<(Option<&str>, usize)> = match &placement.strategy {
                shoal_placement::ReplicationStrategy::Simple { factor } => vec![(None, *factor)],
                shoal_placement::ReplicationStrategy::NetworkTopology { factors } => factors
                    .iter()
                    .map(|(dc, factor)| (Some(dc.as_str()), *factor))
                    .collect(),
            };
            for (datacenter, factor) in needed {
                let available = remaining
                    .iter()
                    .filter(|m| datacenter.is_none_or(|dc| m.datacenter == dc))
                    .count();
                let held_before = datacenter.is_none_or(|dc| leaving.datacenter == dc);
                if held_before && available < factor {
                    let keyspace = schema
                        .keyspace_of_table(table)
                        .map(|k| k.name.clone())
                        .unwrap_or_else(|| table.to_string());
                    return Err(format!(
                        "Not enough live nodes to maintain replication factor in keyspace {keyspace} (RF = {factor}, nodes left = {available}). Perform a forceful decommission to ignore."
                    ));
                }
            }
        }
        Ok(())
    }

    pub(super) async fn remove_node(&self, host_id: shoal_model::HostId) -> Result<Value, String> {
        let started = Instant::now();
        let cluster = self.cluster()?;
        if host_id == self.coordinator.info().host_id {
            return Err("Cannot remove self: use decommission on this node instead".into());
        }
        let state = cluster.metadata.state();
        let Some(member) = state.member_by_host(&host_id) else {
            return Err(format!("Host ID not found: {host_id}"));
        };
        if cluster.liveness.is_alive(&host_id) {
            return Err(format!(
                "Node /{} is alive and owns this ID. Use decommission command to remove it from the ring",
                member.internode_address.ip()
            ));
        }
        if member.state != shoal_cluster::MemberState::Removing {
            let outcome = cluster
                .metadata
                .propose(shoal_cluster::Command::SetMemberState {
                    host_id,
                    from: vec![
                        shoal_cluster::MemberState::Normal,
                        shoal_cluster::MemberState::Joining,
                        shoal_cluster::MemberState::Leaving,
                    ],
                    to: shoal_cluster::MemberState::Removing,
                })
                .await
                .map_err(|e| e.to_string())?;
            if let shoal_cluster::CommandOutcome::Rejected(reason) = outcome {
                return Err(format!("cannot remove the node: {reason}"));
            }
            tracing::info!(node = %member.internode_address, "removing a dead node: rebuilding its replicas from the others");
        }
        self.wait_until_gone(host_id).await?;
        Ok(json!({ "removed": host_id.to_string(), "seconds": started.elapsed().as_secs_f64() }))
    }
}
