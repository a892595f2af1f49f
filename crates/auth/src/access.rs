//! What a logged-in role may do, computed once per change of the roles, not per request.
//!
//! [`Access`] folds a role's closure (the role and every role granted to it) into sets of
//! permissions (bit sets) by resource, so a check on a table is two hash lookups by name
//! (its keyspace, then the table) and no allocation.

use crate::model::{Permission, Resource, Roles};
use shoal_cql::{CqlError, ErrorCode};
use std::collections::{BTreeSet, HashMap};

/// A set of permissions, one bit each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Permissions(u16);

impl Permissions {
    fn add(&mut self, permission: Permission) {
        self.0 |= 1 << permission as u16;
    }

    fn contains(self, permission: Permission) -> bool {
        self.0 & (1 << permission as u16) != 0
    }
}

/// What is granted on a keyspace and on each of its tables.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct KeyspaceGrants {
    on_keyspace: Permissions,
    tables: HashMap<String, Permissions>,
}

/// The effective rights of one role: what the role and every role granted to it hold,
/// by resource, looked up by name without allocating.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    pub role: String,
    pub is_superuser: bool,
    pub can_login: bool,
    /// The role and every role granted to it.
    pub roles: BTreeSet<String>,
    on_all_keyspaces: Permissions,
    keyspaces: HashMap<String, KeyspaceGrants>,
    on_all_roles: Permissions,
    on_roles: HashMap<String, Permissions>,
}

impl Access {
    /// The rights of `name` in `roles`; `None` when there is no such role.
    pub fn compute(roles: &Roles, name: &str) -> Option<Access> {
        let role = roles.roles.get(name)?;
        let closure = roles.closure(name);
        let is_superuser = closure
            .iter()
            .filter_map(|r| roles.roles.get(r))
            .any(|r| r.is_superuser);
        let mut access = Access {
            role: name.to_string(),
            is_superuser,
            can_login: role.can_login,
            roles: closure,
            on_all_keyspaces: Permissions::default(),
            keyspaces: HashMap::new(),
            on_all_roles: Permissions::default(),
            on_roles: HashMap::new(),
        };
        for ((grantee, resource), permissions) in &roles.grants {
            if !access.roles.contains(grantee) {
                continue;
            }
            let set = match resource {
                Resource::AllKeyspaces => &mut access.on_all_keyspaces,
                Resource::Keyspace(keyspace) => {
                    &mut access
                        .keyspaces
                        .entry(keyspace.clone())
                        .or_default()
                        .on_keyspace
                }
                Resource::Table { keyspace, table } => access
                    .keyspaces
                    .entry(keyspace.clone())
                    .or_default()
                    .tables
                    .entry(table.clone())
                    .or_default(),
                Resource::AllRoles => &mut access.on_all_roles,
                Resource::Role(role) => access.on_roles.entry(role.clone()).or_default(),
            };
            for permission in permissions {
                set.add(*permission);
            }
        }
        Some(access)
    }

    /// Whether the role holds `permission` on table `keyspace.table` or above it (the
    /// request path: no allocation).
    pub fn allows_table(&self, permission: Permission, keyspace: &str, table: &str) -> bool {
        self.is_superuser
            || self.on_all_keyspaces.contains(permission)
            || self.keyspaces.get(keyspace).is_some_and(|grants| {
                grants.on_keyspace.contains(permission)
                    || grants
                        .tables
                        .get(table)
                        .is_some_and(|set| set.contains(permission))
            })
    }

    /// Whether the role holds `permission` on `resource` or on anything above it.
    pub fn allows(&self, permission: Permission, resource: &Resource) -> bool {
        if self.is_superuser {
            return true;
        }
        match resource {
            Resource::Table { keyspace, table } => self.allows_table(permission, keyspace, table),
            Resource::Keyspace(keyspace) => {
                self.on_all_keyspaces.contains(permission)
                    || self
                        .keyspaces
                        .get(keyspace)
                        .is_some_and(|grants| grants.on_keyspace.contains(permission))
            }
            Resource::AllKeyspaces => self.on_all_keyspaces.contains(permission),
            Resource::Role(role) => {
                self.on_all_roles.contains(permission)
                    || self
                        .on_roles
                        .get(role)
                        .is_some_and(|set| set.contains(permission))
            }
            Resource::AllRoles => self.on_all_roles.contains(permission),
        }
    }

    /// `Unauthorized` unless the role holds `permission` on `resource`, worded as
    /// Cassandra words it.
    pub fn ensure(&self, permission: Permission, resource: &Resource) -> Result<(), CqlError> {
        if self.allows(permission, resource) {
            return Ok(());
        }
        Err(refusal(&self.role, permission, resource))
    }

    /// [`Access::ensure`] for a table, allocating only to word a refusal.
    pub fn ensure_table(
        &self,
        permission: Permission,
        keyspace: &str,
        table: &str,
    ) -> Result<(), CqlError> {
        if self.allows_table(permission, keyspace, table) {
            return Ok(());
        }
        Err(refusal(
            &self.role,
            permission,
            &Resource::table(keyspace, table),
        ))
    }

    pub fn ensure_superuser(&self, what: &str) -> Result<(), CqlError> {
        if self.is_superuser {
            return Ok(());
        }
        Err(unauthorized(format!(
            "Only superusers are allowed to {what}"
        )))
    }
}

fn refusal(role: &str, permission: Permission, resource: &Resource) -> CqlError {
    unauthorized(format!(
        "User {role} has no {} permission on {resource} or any of its parents",
        permission.name()
    ))
}

pub fn unauthorized(message: impl Into<String>) -> CqlError {
    CqlError::new(ErrorCode::Unauthorized, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Role;

    fn role(name: &str, member_of: &[&str], superuser: bool) -> Role {
        Role {
            name: name.into(),
            is_superuser: superuser,
            can_login: true,
            salted_hash: None,
            member_of: member_of.iter().map(|s| s.to_string()).collect(),
            options: Default::default(),
        }
    }

    #[test]
    fn rights_are_inherited_through_granted_roles() {
        let mut roles = Roles::default();
        for r in [
            role("alice", &["reader"], false),
            role("reader", &["base"], false),
            role("base", &[], false),
        ] {
            roles.roles.insert(r.name.clone(), r);
        }
        roles.grants.insert(
            ("base".into(), Resource::Keyspace("ks".into())),
            BTreeSet::from([Permission::Select]),
        );
        let alice = Access::compute(&roles, "alice").unwrap();
        assert!(alice.allows(Permission::Select, &Resource::table("ks", "t")));
        assert!(!alice.allows(Permission::Modify, &Resource::table("ks", "t")));
        assert!(!alice.allows(Permission::Select, &Resource::table("other", "t")));
        let error = alice
            .ensure(Permission::Modify, &Resource::table("ks", "t"))
            .unwrap_err();
        assert_eq!(error.code, ErrorCode::Unauthorized);
    }

    #[test]
    fn a_role_granted_a_superuser_role_is_a_superuser() {
        let mut roles = Roles::default();
        for r in [role("bob", &["admin"], false), role("admin", &[], true)] {
            roles.roles.insert(r.name.clone(), r);
        }
        let bob = Access::compute(&roles, "bob").unwrap();
        assert!(bob.allows(Permission::Drop, &Resource::AllKeyspaces));
    }
}
