//! Permission checks: every statement, on every path (QUERY, EXECUTE of a cached plan,
//! BATCH, a page of a paged query), is checked against the session's role before it runs,
//! as `CassandraAuthorizer` checks it.
//!
//! The check reads the planned table, so a prepared statement costs no extra lookup by
//! name; the role's rights come from the [`shoal_auth::RoleStore`], recomputed when the
//! roles change, so a GRANT or REVOKE holds from the next request on.
//!
//! | statement | permission | on |
//! |---|---|---|
//! | SELECT | SELECT | the table |
//! | INSERT, UPDATE, DELETE, TRUNCATE | MODIFY | the table |
//! | … IF (lightweight transaction) | MODIFY and SELECT | the table |
//! | CREATE KEYSPACE | CREATE | all keyspaces |
//! | CREATE TABLE | CREATE | the keyspace |
//! | ALTER, DROP of a keyspace or table | ALTER, DROP | it |
//! | role and permission statements | see [`crate::roles`] | |
//!
//! The tables drivers read on connecting (`system`, `system_schema`, the virtual schema)
//! are readable by every role, as in Cassandra; `system_auth` is not.

use crate::modify::ModifyPlan;
use crate::plan::Plan;
use crate::select::SelectPlan;
use crate::{Coordinator, CqlError, Session};
use shoal_auth::{unauthorized, Access, Permission, Resource};
use shoal_cql::ast::Statement;
use shoal_schema::TableMetadata;
use std::sync::Arc;

/// Keyspaces every role may read: what drivers read to learn the cluster and schema.
const READABLE_BY_ALL: [&str; 4] = [
    "system",
    "system_schema",
    "system_virtual_schema",
    "system_views",
];

impl Coordinator {
    /// The session's rights, or `None` when authorization is off (everything allowed).
    pub(crate) fn access(&self, session: &Session) -> Result<Option<Arc<Access>>, CqlError> {
        if !self.auth.settings.authorization {
            return Ok(None);
        }
        let Some(user) = &session.user else {
            return Err(unauthorized("You have not logged in"));
        };
        match self.auth.roles.access(user) {
            Some(access) => Ok(Some(access)),
            None => Err(unauthorized(format!("Role {user} no longer exists"))),
        }
    }

    /// Checks a planned statement against the session's role.
    pub(crate) fn authorize(&self, session: &Session, plan: &Plan) -> Result<(), CqlError> {
        let Some(access) = self.access(session)? else {
            return Ok(());
        };
        match plan {
            Plan::Select(select) => authorize_read(&access, select),
            Plan::Modify(modify) => authorize_write(&access, modify),
            Plan::Statement(statement) => self.authorize_statement(session, &access, statement),
        }
    }

    /// Checks each statement of a batch.
    pub(crate) fn authorize_writes(
        &self,
        session: &Session,
        plans: &[&ModifyPlan],
    ) -> Result<(), CqlError> {
        let Some(access) = self.access(session)? else {
            return Ok(());
        };
        plans
            .iter()
            .try_for_each(|plan| authorize_write(&access, plan))
    }

    fn authorize_statement(
        &self,
        session: &Session,
        access: &Access,
        statement: &Statement,
    ) -> Result<(), CqlError> {
        let keyspace = |named: &Option<String>| self.keyspace_for(session, named);
        let table = |name: &shoal_cql::ast::QualifiedName| -> Result<Resource, CqlError> {
            Ok(Resource::table(&keyspace(&name.keyspace)?, &name.name))
        };
        match statement {
            Statement::Truncate(name) => access.ensure(Permission::Modify, &table(name)?),
            Statement::CreateKeyspace { .. } => {
                access.ensure(Permission::Create, &Resource::AllKeyspaces)
            }
            Statement::AlterKeyspace { name, .. } => {
                access.ensure(Permission::Alter, &Resource::Keyspace(name.clone()))
            }
            Statement::DropKeyspace { name, .. } => {
                access.ensure(Permission::Drop, &Resource::Keyspace(name.clone()))
            }
            Statement::CreateTable(create) => access.ensure(
                Permission::Create,
                &Resource::Keyspace(keyspace(&create.table.keyspace)?),
            ),
            Statement::AlterTable { table: name, .. } => {
                access.ensure(Permission::Alter, &table(name)?)
            }
            Statement::DropTable { table: name, .. } => {
                access.ensure(Permission::Drop, &table(name)?)
            }
            // Indexes need ALTER on their table, as in Cassandra.
            Statement::CreateIndex(create) => {
                access.ensure(Permission::Alter, &table(&create.table)?)
            }
            Statement::DropIndex { name, .. } => {
                let keyspace_name = keyspace(&name.keyspace)?;
                let schema = self.schema();
                let owner = schema
                    .keyspace(&keyspace_name)?
                    .tables
                    .values()
                    .find(|t| t.indexes.iter().any(|i| i.name == name.name))
                    .map(|t| t.name.clone());
                match owner {
                    Some(owner) => {
                        access.ensure(Permission::Alter, &Resource::table(&keyspace_name, &owner))
                    }
                    None => Ok(()),
                }
            }
            // Types need the permission on their keyspace, as in Cassandra.
            Statement::CreateType { name, .. } => access.ensure(
                Permission::Create,
                &Resource::Keyspace(keyspace(&name.keyspace)?),
            ),
            Statement::AlterType { name, .. } => access.ensure(
                Permission::Alter,
                &Resource::Keyspace(keyspace(&name.keyspace)?),
            ),
            Statement::DropType { name, .. } => access.ensure(
                Permission::Drop,
                &Resource::Keyspace(keyspace(&name.keyspace)?),
            ),
            // A BATCH's statements are checked as it plans them; role statements check
            // their own rules ([`crate::roles`]); USE and DESCRIBE need none.
            _ => Ok(()),
        }
    }

    /// After a CREATE by a logged-in role, the role gets every permission on what it
    /// created; after a DROP, nobody keeps permissions on what is gone (as Cassandra).
    pub(crate) async fn update_grants_after_schema_change(
        &self,
        session: &Session,
        statement: &Statement,
    ) -> Result<(), CqlError> {
        if !self.auth.settings.authorization {
            return Ok(());
        }
        let keyspace = |named: &Option<String>| self.keyspace_for(session, named);
        let (created, dropped) = match statement {
            Statement::CreateKeyspace { name, .. } => {
                (Some(Resource::Keyspace(name.clone())), None)
            }
            Statement::CreateTable(create) => (
                Some(Resource::table(
                    &keyspace(&create.table.keyspace)?,
                    &create.table.name,
                )),
                None,
            ),
            Statement::DropKeyspace { name, .. } => (None, Some(Resource::Keyspace(name.clone()))),
            Statement::DropTable { table, .. } => (
                None,
                Some(Resource::table(&keyspace(&table.keyspace)?, &table.name)),
            ),
            _ => return Ok(()),
        };
        let creator = session.user.as_deref();
        self.auth
            .roles
            .change(|roles| {
                let before = roles.grants.len();
                if let Some(resource) = &dropped {
                    roles.remove_resource(resource);
                }
                if let (Some(resource), Some(creator)) = (&created, creator) {
                    if roles.roles.contains_key(creator) {
                        roles.grants.insert(
                            (creator.to_string(), resource.clone()),
                            resource.applicable().iter().copied().collect(),
                        );
                        return Ok(true);
                    }
                }
                Ok(roles.grants.len() != before)
            })
            .await
            .map(|_| ())
    }
}

fn authorize_read(access: &Access, select: &SelectPlan) -> Result<(), CqlError> {
    if READABLE_BY_ALL.contains(&select.table.keyspace.as_str()) {
        return Ok(());
    }
    access.ensure_table(
        Permission::Select,
        &select.table.keyspace,
        &select.table.name,
    )
}

fn authorize_write(access: &Access, modify: &ModifyPlan) -> Result<(), CqlError> {
    let table: &TableMetadata = &modify.table;
    access.ensure_table(Permission::Modify, &table.keyspace, &table.name)?;
    if modify.class == crate::class::StatementClass::ConditionalWrite {
        access.ensure_table(Permission::Select, &table.keyspace, &table.name)?;
    }
    Ok(())
}
