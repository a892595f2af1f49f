//! What a logged-in role may do, computed once per change of the roles, not per request.
//!
//! [`Access`] folds a role's closure (the role and every role granted to it) into one map
//! from resource to permissions, so a check is a few hash lookups: the resource, then each
//! resource above it.

use crate::model::{Permission, Resource, Roles};
use shoal_cql::{CqlError, ErrorCode};
use std::collections::{BTreeSet, HashMap};

/// The effective rights of one role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    pub role: String,
    pub is_superuser: bool,
    pub can_login: bool,
    /// The role and every role granted to it.
    pub roles: BTreeSet<String>,
    granted: HashMap<Resource, BTreeSet<Permission>>,
}

impl Access {
    /// The rights of `name` in `roles`; `None` when there is no such role.
    pub fn compute(roles: &Roles, name: &str) -> Option<Access> {
        let role = roles.roles.get(name)?;
        let closure = roles.closure(name);
        let mut granted: HashMap<Resource, BTreeSet<Permission>> = HashMap::new();
        for ((grantee, resource), permissions) in &roles.grants {
            if closure.contains(grantee) {
                granted
                    .entry(resource.clone())
                    .or_default()
                    .extend(permissions.iter().copied());
            }
        }
        let is_superuser = closure
            .iter()
            .filter_map(|r| roles.roles.get(r))
            .any(|r| r.is_superuser);
        Some(Access {
            role: name.to_string(),
            is_superuser,
            can_login: role.can_login,
            roles: closure,
            granted,
        })
    }

    /// Whether the role holds `permission` on `resource` or on anything above it.
    pub fn allows(&self, permission: Permission, resource: &Resource) -> bool {
        self.is_superuser
            || resource.chain().any(|r| {
                self.granted
                    .get(&r)
                    .is_some_and(|permissions| permissions.contains(&permission))
            })
    }

    /// `Unauthorized` unless the role holds `permission` on `resource`, worded as
    /// Cassandra words it.
    pub fn ensure(&self, permission: Permission, resource: &Resource) -> Result<(), CqlError> {
        if self.allows(permission, resource) {
            return Ok(());
        }
        Err(unauthorized(format!(
            "User {} has no {} permission on {} or any of its parents",
            self.role,
            permission.name(),
            resource
        )))
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
