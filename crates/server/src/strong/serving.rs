//! The leader's side: answering another node's [`StrongRequest`] — proposing its write,
//! reading at the read index, reporting a group's status, changing a group's members — and
//! the membership changes the migration driver asks for.

use super::{
    machine, StrongReply, StrongRequest, StrongTables, TabletGroup, WireSnapshot, WireStatus,
    MEMBERSHIP_CHANGE_WAIT, STRONG_WRITE_TIMEOUT,
};
use shoal_consensus::runtime::ProposeError;
use shoal_consensus::GroupId;
use shoal_model::{HostId, TableId, Token};

impl StrongTables {
    /// Answers another node's request, as the group's leader.
    pub async fn serve(&self, request: StrongRequest) -> StrongReply {
        let deadline = tokio::time::Instant::now() + STRONG_WRITE_TIMEOUT;
        self.serve_until(&request, deadline).await
    }

    /// Runs `request` here, as the group's leader, a proposal waiting until `deadline`.
    pub(super) async fn serve_until(
        &self,
        request: &StrongRequest,
        deadline: tokio::time::Instant,
    ) -> StrongReply {
        match request {
            StrongRequest::Propose { group, entry } => {
                if self.records.fence(GroupId(*group)).is_some() {
                    return StrongReply::Fenced;
                }
                let entry = bytes::Bytes::copy_from_slice(entry);
                // Held until applied: a conditional statement on the partition waits.
                let _shared = match machine::entry_partition(&entry) {
                    Some(partition) => match self.locks.shared(partition, deadline).await {
                        Some(shared) => Some(shared),
                        None => return StrongReply::Busy,
                    },
                    None => None,
                };
                self.propose_here(GroupId(*group), entry, deadline).await
            }
            StrongRequest::Lock {
                group,
                table,
                token,
                lower,
                upper,
            } => {
                self.lock_here(
                    GroupId(*group),
                    (TableId(*table), Token(*token)),
                    lower,
                    upper,
                )
                .await
            }
            StrongRequest::ProposeLocked {
                group,
                lease,
                entry,
            } => {
                let entry = bytes::Bytes::copy_from_slice(entry);
                self.propose_locked_here(GroupId(*group), *lease, entry, deadline)
                    .await
            }
            StrongRequest::Unlock { lease } => {
                self.leases.end(*lease);
                StrongReply::Applied
            }
            StrongRequest::Read {
                group,
                lower,
                upper,
                limit,
                reverse,
            } => self
                .read_here(GroupId(*group), lower, upper, *limit, *reverse)
                .await
                .unwrap_or(StrongReply::NotLeader { leader: None }),
            StrongRequest::Status { group, leader_only } => {
                self.status_here(GroupId(*group), *leader_only).await
            }
            StrongRequest::ChangeMembers { group, add, remove } => {
                self.change_members_here(GroupId(*group), add.map(HostId), remove.map(HostId))
                    .await
            }
            StrongRequest::SnapshotPoint { group } => {
                match self.raft.snapshot_point(GroupId(*group)).await {
                    Some(point) => StrongReply::Snapshot(WireSnapshot::from_point(point)),
                    None => StrongReply::Refused("no replica of the group here".into()),
                }
            }
            StrongRequest::Install { group, point } => {
                let group = GroupId(*group);
                if self.raft.status(group).await.is_none() {
                    return StrongReply::Refused("no replica of the group here yet".into());
                }
                // A replica that already applied that far keeps what it has.
                self.raft
                    .install_snapshot(group, point.clone().into_point())
                    .await;
                StrongReply::Applied
            }
        }
    }

    pub(super) async fn status_here(&self, group: GroupId, leader_only: bool) -> StrongReply {
        let Some(status) = self.raft.status(group).await else {
            return StrongReply::Refused("no replica of the group here".into());
        };
        if leader_only && !status.is_leader {
            return StrongReply::NotLeader {
                leader: self.raft.leader(group).await.map(|h| h.0),
            };
        }
        StrongReply::Status(WireStatus {
            members: status.members.iter().map(|m| m.0).collect(),
            replica: self.me.0,
            is_leader: status.is_leader,
            applied: status.applied.0,
            members_settled: status.members_settled,
            matched: status.matched.iter().map(|(m, i)| (m.0, i.0)).collect(),
            fenced: self
                .records
                .fence(group)
                .map(|fence| (fence.plan, fence.clock)),
        })
    }

    /// The leader's side of a membership change: one member added or removed, answered
    /// once committed (`Unknown` while it still commits: the caller asks for the status).
    pub(super) async fn change_members_here(
        &self,
        group: GroupId,
        add: Option<HostId>,
        remove: Option<HostId>,
    ) -> StrongReply {
        let Some(status) = self.raft.status(group).await else {
            return StrongReply::Refused("no replica of the group here".into());
        };
        if !status.is_leader {
            return StrongReply::NotLeader {
                leader: self.raft.leader(group).await.map(|h| h.0),
            };
        }
        let mut members = status.members.clone();
        if let Some(add) = add.filter(|a| !members.contains(a)) {
            members.push(add);
        }
        members.retain(|m| Some(*m) != remove);
        if members == status.members {
            return StrongReply::Applied;
        }
        match tokio::time::timeout(
            MEMBERSHIP_CHANGE_WAIT,
            self.raft.change_members(group, members),
        )
        .await
        {
            Ok(Ok(())) => StrongReply::Applied,
            Ok(Err(ProposeError::NotLeader(leader))) => StrongReply::NotLeader {
                leader: leader.map(|h| h.0),
            },
            Ok(Err(ProposeError::Membership(refused))) => {
                StrongReply::Refused(format!("membership change refused for now: {refused:?}"))
            }
            Ok(Err(ProposeError::Superseded)) => StrongReply::NotLeader { leader: None },
            Ok(Err(ProposeError::Stopped | ProposeError::Refused)) | Err(_) => StrongReply::Unknown,
        }
    }

    /// The status of `target`'s group at its leader.
    pub async fn leader_status(&self, target: &TabletGroup) -> Result<WireStatus, String> {
        let request = StrongRequest::Status {
            group: target.group.0,
            leader_only: true,
        };
        match self
            .at_leader(target, &request, Self::operation_deadline())
            .await
        {
            Some(StrongReply::Status(status)) => Ok(status),
            other => Err(format!("no leader answered for the group: {other:?}")),
        }
    }

    /// Asks the leader of `target`'s group to add or remove one member: `Ok` once the
    /// change is proposed (committed, or still committing: [`Self::leader_status`] tells).
    pub async fn change_members(
        &self,
        target: &TabletGroup,
        add: Option<HostId>,
        remove: Option<HostId>,
    ) -> Result<(), String> {
        let request = StrongRequest::ChangeMembers {
            group: target.group.0,
            add: add.map(|h| h.0),
            remove: remove.map(|h| h.0),
        };
        match self
            .at_leader(target, &request, Self::operation_deadline())
            .await
        {
            Some(StrongReply::Applied | StrongReply::Unknown) => Ok(()),
            other => Err(format!("the membership change was not made: {other:?}")),
        }
    }
}
