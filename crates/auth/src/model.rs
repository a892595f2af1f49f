//! What is stored: roles, the resources permissions are granted on, and the permissions.
//!
//! The vocabulary is Cassandra's (`CassandraRoleManager`, `CassandraAuthorizer`): a
//! permission is granted to a role on a resource, and holds for everything below that
//! resource (`<all keyspaces>` ⊃ `<keyspace ks>` ⊃ `<table ks.t>`; `<all roles>` ⊃
//! `<role r>`). A role has every permission of the roles granted to it, transitively, and
//! is a superuser if any of them is.

use serde::{Deserialize, Serialize};
use shoal_cql::CqlError;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// A permission, as `GRANT` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Permission {
    Create,
    Alter,
    Drop,
    Select,
    Modify,
    Authorize,
    Describe,
    Execute,
}

impl Permission {
    pub const ALL: [Permission; 8] = [
        Permission::Create,
        Permission::Alter,
        Permission::Drop,
        Permission::Select,
        Permission::Modify,
        Permission::Authorize,
        Permission::Describe,
        Permission::Execute,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Permission::Create => "CREATE",
            Permission::Alter => "ALTER",
            Permission::Drop => "DROP",
            Permission::Select => "SELECT",
            Permission::Modify => "MODIFY",
            Permission::Authorize => "AUTHORIZE",
            Permission::Describe => "DESCRIBE",
            Permission::Execute => "EXECUTE",
        }
    }

    /// Parses a permission name (any case).
    pub fn parse(word: &str) -> Result<Permission, CqlError> {
        Permission::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(word))
            .ok_or_else(|| CqlError::syntax(format!("Unknown permission {word}")))
    }
}

/// What a permission is granted on.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Resource {
    AllKeyspaces,
    Keyspace(String),
    Table { keyspace: String, table: String },
    AllRoles,
    Role(String),
}

impl Resource {
    pub fn table(keyspace: &str, table: &str) -> Resource {
        Resource::Table {
            keyspace: keyspace.to_string(),
            table: table.to_string(),
        }
    }

    /// The resource this one is part of; a grant on it covers this one.
    pub fn parent(&self) -> Option<Resource> {
        match self {
            Resource::AllKeyspaces | Resource::AllRoles => None,
            Resource::Keyspace(_) => Some(Resource::AllKeyspaces),
            Resource::Table { keyspace, .. } => Some(Resource::Keyspace(keyspace.clone())),
            Resource::Role(_) => Some(Resource::AllRoles),
        }
    }

    /// This resource and every resource above it, nearest first.
    pub fn chain(&self) -> impl Iterator<Item = Resource> {
        std::iter::successors(Some(self.clone()), Resource::parent)
    }

    /// The permissions that mean something on this resource (what `GRANT ALL` grants).
    pub fn applicable(&self) -> &'static [Permission] {
        use Permission::*;
        match self {
            Resource::AllKeyspaces | Resource::Keyspace(_) => {
                &[Create, Alter, Drop, Select, Modify, Authorize]
            }
            Resource::Table { .. } => &[Alter, Drop, Select, Modify, Authorize],
            Resource::AllRoles => &[Create, Alter, Drop, Authorize, Describe],
            Resource::Role(_) => &[Alter, Drop, Authorize],
        }
    }

    /// Refuses a permission that does not apply here, as Cassandra does.
    pub fn check_applicable(&self, permission: Permission) -> Result<(), CqlError> {
        if self.applicable().contains(&permission) {
            return Ok(());
        }
        let kind = match self {
            Resource::AllKeyspaces | Resource::Keyspace(_) | Resource::Table { .. } => {
                "DataResource"
            }
            Resource::AllRoles | Resource::Role(_) => "RoleResource",
        };
        Err(CqlError::invalid(format!(
            "Resource type {kind} does not support any of the requested permissions ({})",
            permission.name()
        )))
    }
}

/// Cassandra's display form, as `LIST PERMISSIONS` shows it: `<table ks.t>`.
impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Resource::AllKeyspaces => write!(f, "<all keyspaces>"),
            Resource::Keyspace(keyspace) => write!(f, "<keyspace {keyspace}>"),
            Resource::Table { keyspace, table } => write!(f, "<table {keyspace}.{table}>"),
            Resource::AllRoles => write!(f, "<all roles>"),
            Resource::Role(role) => write!(f, "<role {role}>"),
        }
    }
}

/// A role: a user when it may log in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Role {
    pub name: String,
    pub is_superuser: bool,
    pub can_login: bool,
    /// The bcrypt hash of the password (salt included); `None`: no password, no login.
    pub salted_hash: Option<String>,
    /// The roles granted to this one (`GRANT r TO this`).
    pub member_of: BTreeSet<String>,
    /// `OPTIONS = {…}`, kept for the application.
    pub options: BTreeMap<String, String>,
}

/// Every role and grant: the replicated document.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Roles {
    pub version: [u8; 16],
    pub roles: BTreeMap<String, Role>,
    /// The permissions granted directly to a role on a resource.
    pub grants: BTreeMap<(String, Resource), BTreeSet<Permission>>,
}

impl Roles {
    pub fn role(&self, name: &str) -> Result<&Role, CqlError> {
        self.roles
            .get(name)
            .ok_or_else(|| CqlError::invalid(format!("{name} doesn't exist")))
    }

    /// `name` and every role granted to it, transitively (each once; cycles are refused
    /// when granting, and would end here anyway).
    pub fn closure(&self, name: &str) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut pending = vec![name.to_string()];
        while let Some(next) = pending.pop() {
            if !seen.insert(next.clone()) {
                continue;
            }
            if let Some(role) = self.roles.get(&next) {
                pending.extend(role.member_of.iter().cloned());
            }
        }
        seen
    }

    /// Drops a role, its grants, and its membership in other roles.
    pub fn remove_role(&mut self, name: &str) {
        self.roles.remove(name);
        for role in self.roles.values_mut() {
            role.member_of.remove(name);
        }
        self.grants.retain(|(grantee, resource), _| {
            grantee != name && *resource != Resource::Role(name.to_string())
        });
    }

    /// Forgets every grant on `resource` and below it (the resource was dropped).
    pub fn remove_resource(&mut self, resource: &Resource) {
        self.grants
            .retain(|(_, granted_on), _| !granted_on.chain().any(|ancestor| ancestor == *resource));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_covered_by_its_keyspace_and_all_keyspaces() {
        let chain: Vec<Resource> = Resource::table("ks", "t").chain().collect();
        assert_eq!(
            chain,
            vec![
                Resource::table("ks", "t"),
                Resource::Keyspace("ks".into()),
                Resource::AllKeyspaces
            ]
        );
        assert_eq!(Resource::table("ks", "t").to_string(), "<table ks.t>");
    }

    #[test]
    fn permissions_that_do_not_apply_are_refused() {
        assert!(Resource::table("ks", "t")
            .check_applicable(Permission::Create)
            .is_err());
        assert!(Resource::AllRoles
            .check_applicable(Permission::Describe)
            .is_ok());
        assert!(Permission::parse("select").is_ok());
        assert!(Permission::parse("read").is_err());
    }

    #[test]
    fn dropping_a_keyspace_forgets_grants_on_its_tables() {
        let mut roles = Roles::default();
        let all = BTreeSet::from([Permission::Select]);
        roles
            .grants
            .insert(("r".into(), Resource::table("ks", "t")), all.clone());
        roles
            .grants
            .insert(("r".into(), Resource::table("other", "t")), all);
        roles.remove_resource(&Resource::Keyspace("ks".into()));
        assert_eq!(roles.grants.len(), 1);
    }
}
