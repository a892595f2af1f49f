//! The [`RoleStore`]: the current [`Roles`] of this node, changed through the cluster's
//! replicated metadata (Raft) so that every node agrees, and each role's [`Access`]
//! computed once per change.
//!
//! A change is compare-and-set on the version, as schema changes are: a change computed
//! from an older version is recomputed against the newer one. Nodes install a new version
//! as they apply the Raft log ([`RoleStore::install_from_cluster`], called by the loop that
//! follows the metadata), so a GRANT or REVOKE holds on every node as soon as that node
//! has applied it — the node that ran it before it answers. Without a cluster (tests,
//! embedding) the roles are kept in the engine's metadata.

use crate::access::Access;
use crate::model::{Role, Roles};
use crate::password;
use parking_lot::RwLock;
use shoal_cluster::{ClusterMetadata, Command, CommandOutcome, VersionedRecord};
use shoal_cql::{CqlError, ErrorCode};
use shoal_storage::Engine;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

const ROLES_METADATA_KEY: &[u8] = b"roles";

/// How often a change is recomputed when another change got there first.
const CHANGE_ATTEMPTS: usize = 20;

/// The first superuser of a new cluster, as Cassandra creates it: `cassandra`/`cassandra`.
/// The README's first step is to replace it.
pub const DEFAULT_SUPERUSER: &str = "cassandra";
const DEFAULT_SUPERUSER_PASSWORD: &str = "cassandra";

struct Installed {
    roles: Arc<Roles>,
    access: HashMap<String, Arc<Access>>,
}

impl Installed {
    fn new(roles: Roles) -> Installed {
        let access = roles
            .roles
            .keys()
            .filter_map(|name| Access::compute(&roles, name).map(|a| (name.clone(), Arc::new(a))))
            .collect();
        Installed {
            roles: Arc::new(roles),
            access,
        }
    }
}

/// This node's view of the roles.
pub struct RoleStore {
    installed: RwLock<Arc<Installed>>,
    engine: Arc<dyn Engine>,
    cluster: RwLock<Option<Arc<ClusterMetadata>>>,
    /// Held while installing, so installs happen in the order the cluster applied them.
    install_lock: parking_lot::Mutex<()>,
}

fn decode(bytes: &[u8]) -> Result<Roles, CqlError> {
    bincode::deserialize(bytes)
        .map_err(|e| CqlError::server(format!("the roles are unreadable: {e}")))
}

impl RoleStore {
    /// The roles kept in `engine` (none on a new node).
    pub fn open(engine: Arc<dyn Engine>) -> Result<RoleStore, CqlError> {
        let stored = engine
            .metadata_with_prefix(ROLES_METADATA_KEY)
            .map_err(|e| CqlError::server(e.to_string()))?;
        let roles = match stored.into_iter().find(|(k, _)| k == ROLES_METADATA_KEY) {
            Some((_, bytes)) => decode(&bytes)?,
            None => Roles::default(),
        };
        Ok(RoleStore {
            installed: RwLock::new(Arc::new(Installed::new(roles))),
            engine,
            cluster: RwLock::new(None),
            install_lock: parking_lot::Mutex::new(()),
        })
    }

    /// From now on, changes go through `cluster`'s replicated metadata.
    pub fn attach_cluster(&self, cluster: Arc<ClusterMetadata>) {
        *self.cluster.write() = Some(cluster);
    }

    pub fn current(&self) -> Arc<Roles> {
        Arc::clone(&self.installed.read().roles)
    }

    /// The rights of `role`; `None` once it has been dropped.
    pub fn access(&self, role: &str) -> Option<Arc<Access>> {
        self.installed.read().access.get(role).cloned()
    }

    /// Installs the cluster's roles if they differ from this node's. The cluster's state
    /// is read under the install lock, so two racing callers install in the order the
    /// cluster applied the changes and a REVOKE is never undone by a stale read.
    pub fn install_from_cluster(&self, cluster: &ClusterMetadata) -> Result<(), CqlError> {
        let _serialized = self.install_lock.lock();
        let Some(record) = cluster.state().roles.clone() else {
            return Ok(());
        };
        if record.version == self.current().version {
            return Ok(());
        }
        let roles = decode(&record.bytes)?;
        *self.installed.write() = Arc::new(Installed::new(roles));
        Ok(())
    }

    /// Checks a login: the role must exist, be allowed to log in, and the password must
    /// match. Slow by design (bcrypt): call it on a blocking thread.
    pub fn authenticate(&self, username: &str, password: &str) -> Result<Arc<Access>, CqlError> {
        let roles = self.current();
        let role = roles.roles.get(username);
        let hash = role.and_then(|r| r.salted_hash.as_deref());
        let access = self.access(username);
        match (password::matches(password, hash), access) {
            (true, Some(access)) if access.can_login => Ok(access),
            (true, Some(_)) => Err(CqlError::new(
                ErrorCode::BadCredentials,
                format!("{username} is not permitted to log in"),
            )),
            _ => Err(CqlError::new(
                ErrorCode::BadCredentials,
                format!("Provided username {username} and/or password are incorrect"),
            )),
        }
    }

    /// Creates the default superuser if there are no roles at all (a new cluster with
    /// authentication on). Of several nodes trying at once, one succeeds.
    pub async fn ensure_default_superuser(&self) -> Result<(), CqlError> {
        if !self.current().roles.is_empty() {
            return Ok(());
        }
        let salted_hash = password::hash(DEFAULT_SUPERUSER_PASSWORD)?;
        self.change(|roles| {
            if !roles.roles.is_empty() {
                return Ok(false);
            }
            roles.roles.insert(
                DEFAULT_SUPERUSER.to_string(),
                Role {
                    name: DEFAULT_SUPERUSER.to_string(),
                    is_superuser: true,
                    can_login: true,
                    salted_hash: Some(salted_hash.clone()),
                    member_of: BTreeSet::new(),
                    options: BTreeMap::new(),
                },
            );
            Ok(true)
        })
        .await?;
        tracing::warn!(
            "created the default superuser '{DEFAULT_SUPERUSER}' with the default password: change it (ALTER ROLE {DEFAULT_SUPERUSER} WITH PASSWORD = '…')"
        );
        Ok(())
    }

    /// Applies `change` to a copy of the roles and publishes it (on a cluster: through the
    /// replicated metadata, recomputing the change if another one got there first).
    /// `change` returns `Ok(false)` when it made no change.
    pub async fn change(
        &self,
        mut change: impl FnMut(&mut Roles) -> Result<bool, CqlError>,
    ) -> Result<bool, CqlError> {
        let cluster = self.cluster.read().clone();
        for _ in 0..CHANGE_ATTEMPTS {
            let base = self.current();
            let mut next = (*base).clone();
            if !change(&mut next)? {
                return Ok(false);
            }
            next.version = *uuid::Uuid::new_v4().as_bytes();
            let bytes = bincode::serialize(&next).map_err(|e| CqlError::server(e.to_string()))?;
            let Some(cluster) = &cluster else {
                self.engine
                    .put_metadata(ROLES_METADATA_KEY, &bytes)
                    .map_err(|e| CqlError::server(format!("could not persist the roles: {e}")))?;
                *self.installed.write() = Arc::new(Installed::new(next));
                return Ok(true);
            };
            let base_version = cluster.state().roles.as_ref().map(|r| r.version);
            if base_version.is_some_and(|v| v != base.version) {
                self.install_from_cluster(cluster)?;
                continue;
            }
            let command = Command::ChangeRoles {
                base_version,
                roles: VersionedRecord {
                    version: next.version,
                    bytes,
                },
            };
            let outcome = cluster.propose(command).await.map_err(|e| {
                CqlError::server(format!(
                    "the change of roles did not reach the cluster: {e}"
                ))
            })?;
            self.install_from_cluster(cluster)?;
            match outcome {
                CommandOutcome::Applied => return Ok(true),
                CommandOutcome::Moved => {}
                CommandOutcome::Rejected(message) => return Err(CqlError::server(message)),
            }
        }
        Err(CqlError::server(
            "the roles kept changing concurrently; retry the statement",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_storage::MemoryEngine;

    fn store() -> RoleStore {
        RoleStore::open(Arc::new(MemoryEngine::default())).unwrap()
    }

    #[tokio::test]
    async fn the_default_superuser_logs_in_once_created_and_only_with_its_password() {
        let store = store();
        store.ensure_default_superuser().await.unwrap();
        let access = store.authenticate("cassandra", "cassandra").unwrap();
        assert!(access.is_superuser);
        for (user, password) in [("cassandra", "wrong"), ("nobody", "cassandra")] {
            let error = store.authenticate(user, password).unwrap_err();
            assert_eq!(error.code, ErrorCode::BadCredentials);
        }
    }

    #[tokio::test]
    async fn roles_survive_a_restart_of_a_node_without_a_cluster() {
        let engine: Arc<dyn Engine> = Arc::new(MemoryEngine::default());
        let store = RoleStore::open(Arc::clone(&engine)).unwrap();
        store.ensure_default_superuser().await.unwrap();
        let reopened = RoleStore::open(engine).unwrap();
        assert!(reopened.access(DEFAULT_SUPERUSER).is_some());
        assert_eq!(reopened.current(), store.current());
    }

    #[tokio::test]
    async fn a_role_that_may_not_log_in_is_refused() {
        let store = store();
        let salted_hash = password::hash("pw").unwrap();
        store
            .change(|roles| {
                roles.roles.insert(
                    "app".into(),
                    Role {
                        name: "app".into(),
                        is_superuser: false,
                        can_login: false,
                        salted_hash: Some(salted_hash.clone()),
                        member_of: BTreeSet::new(),
                        options: BTreeMap::new(),
                    },
                );
                Ok(true)
            })
            .await
            .unwrap();
        let error = store.authenticate("app", "pw").unwrap_err();
        assert!(error.message.contains("not permitted to log in"));
    }
}
