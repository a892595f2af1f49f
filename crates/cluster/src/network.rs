//! openraft's view of the network: each Raft call (append entries, install snapshot, vote)
//! is one request/response over the server's [`ClusterTransport`], to the address the
//! target node registered.

use super::*;

/// openraft's view of the network: each call is one request/response over the transport.
pub(super) struct Network {
    pub(super) transport: Arc<dyn ClusterTransport>,
}

pub(super) struct PeerChannel {
    target: NodeId,
    address: Result<SocketAddr, String>,
    transport: Arc<dyn ClusterTransport>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerChannel;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerChannel {
        PeerChannel {
            target,
            address: node
                .addr
                .parse()
                .map_err(|e| format!("bad peer address {}: {e}", node.addr)),
            transport: Arc::clone(&self.transport),
        }
    }
}

#[derive(Debug)]
pub(super) struct PeerProblem(String);

impl std::fmt::Display for PeerProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PeerProblem {}

impl PeerChannel {
    async fn call<E: std::error::Error>(
        &self,
        request: ClusterRequest,
        option: &RPCOption,
    ) -> Result<ClusterResponse, RPCError<NodeId, BasicNode, E>> {
        let address = self
            .address
            .clone()
            .map_err(|e| RPCError::Network(NetworkError::new(&PeerProblem(e))))?;
        match self
            .transport
            .call(address, request, option.hard_ttl())
            .await
        {
            Ok(ClusterResponse::Error(message)) => {
                Err(RPCError::Network(NetworkError::new(&PeerProblem(message))))
            }
            Ok(response) => Ok(response),
            Err(message) => Err(RPCError::Unreachable(Unreachable::new(&PeerProblem(
                message,
            )))),
        }
    }
}

pub(super) fn unexpected<E: std::error::Error>(
    response: ClusterResponse,
) -> RPCError<NodeId, BasicNode, E> {
    RPCError::Network(NetworkError::new(&PeerProblem(format!(
        "unexpected answer {response:?}"
    ))))
}

impl RaftNetwork<TypeConfig> for PeerChannel {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        match self
            .call(
                ClusterRequest::AppendEntries {
                    to: self.target,
                    rpc,
                },
                &option,
            )
            .await?
        {
            ClusterResponse::AppendEntries(response) => Ok(response),
            other => Err(unexpected(other)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        match self
            .call(
                ClusterRequest::InstallSnapshot {
                    to: self.target,
                    rpc,
                },
                &option,
            )
            .await?
        {
            ClusterResponse::InstallSnapshot(response) => Ok(response),
            other => Err(unexpected(other)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let request = ClusterRequest::Vote {
            to: self.target,
            rpc,
        };
        match self.call(request, &option).await? {
            ClusterResponse::Vote(response) => Ok(response),
            other => Err(unexpected(other)),
        }
    }
}
