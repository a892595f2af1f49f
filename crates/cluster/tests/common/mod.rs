//! What the in-process cluster tests share.

use shoal_cluster::{Member, MemberState};
use shoal_model::HostId;
use std::net::SocketAddr;

/// Node `n` (on 127.0.0.`n`) as a member, with the id `host_id`.
pub fn member(n: u8, host_id: HostId) -> Member {
    let address = |port| SocketAddr::from(([127, 0, 0, n], port));
    Member {
        host_id,
        internode_address: address(7000),
        cql_address: address(9042),
        datacenter: "datacenter1".into(),
        rack: "rack1".into(),
        state: MemberState::Normal,
        replaces: None,
    }
}
