//! Role and permission statements: CREATE/ALTER/DROP ROLE (and USER), GRANT and REVOKE of
//! permissions and of roles, LIST ROLES/USERS/PERMISSIONS — with Cassandra's rules for who
//! may run them and its messages. Changes go through the [`shoal_auth::RoleStore`], so
//! every node of the cluster applies them.
//!
//! Who may do what (when authorization is on; with it off, anyone may):
//! - CREATE ROLE needs CREATE on `<all roles>`, and only superusers create superusers; the
//!   creator gets every permission on the new role.
//! - ALTER ROLE needs ALTER on the role, except a role changing its own password; only
//!   superusers change superuser status, and nobody their own.
//! - DROP ROLE needs DROP on the role; nobody drops the role they are logged in as.
//! - GRANT/REVOKE of a permission needs AUTHORIZE and that permission on the resource;
//!   of a role, AUTHORIZE on the role granted.
//! - LIST shows everything to superusers (and to DESCRIBE on `<all roles>` for roles), and
//!   otherwise what the role itself holds.

use crate::values::literal_value;
use crate::{Coordinator, CqlError, Session};
use shoal_auth::{password, unauthorized, Access, Permission, Resource, Role, Roles};
use shoal_cql::ast::{AuthResource, Literal, Properties, Statement, Term};
use shoal_cql::response::{ColumnSpec, ResultBody, Rows, RowsBuffer};
use shoal_model::{CqlType, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// `WITH PASSWORD = … AND LOGIN = … AND SUPERUSER = … AND OPTIONS = {…}`.
#[derive(Default)]
struct RoleOptions {
    password: Option<String>,
    login: Option<bool>,
    superuser: Option<bool>,
    options: Option<BTreeMap<String, String>>,
}

impl RoleOptions {
    fn parse(properties: &Properties) -> Result<RoleOptions, CqlError> {
        let mut options = RoleOptions::default();
        for (name, term) in properties {
            let value = |cql_type: &CqlType| match term {
                Term::Literal(literal) => literal_value(literal, cql_type, name, false),
                _ => Err(CqlError::invalid(format!(
                    "Invalid value for role option {name}"
                ))),
            };
            match name.as_str() {
                "password" => match value(&CqlType::Text)? {
                    Value::Text(password) => options.password = Some(password),
                    _ => unreachable_option(name)?,
                },
                "login" => options.login = Some(boolean(value(&CqlType::Boolean)?, name)?),
                "superuser" => options.superuser = Some(boolean(value(&CqlType::Boolean)?, name)?),
                "options" => options.options = Some(text_map(term, name)?),
                other => return Err(CqlError::syntax(format!("Invalid role option: {other}"))),
            }
        }
        Ok(options)
    }
}

fn unreachable_option(name: &str) -> Result<(), CqlError> {
    Err(CqlError::invalid(format!(
        "Invalid value for role option {name}"
    )))
}

fn boolean(value: Value, name: &str) -> Result<bool, CqlError> {
    match value {
        Value::Boolean(b) => Ok(b),
        _ => Err(CqlError::invalid(format!(
            "Invalid value for role option {name}: expected true or false"
        ))),
    }
}

fn text_map(term: &Term, name: &str) -> Result<BTreeMap<String, String>, CqlError> {
    let text = |term: &Term| match term {
        Term::Literal(Literal::String(s)) => Ok(s.clone()),
        _ => Err(CqlError::invalid(format!(
            "Invalid value for role option {name}: expected a map of strings"
        ))),
    };
    match term {
        Term::Map(entries) => entries
            .iter()
            .map(|(k, v)| Ok((text(k)?, text(v)?)))
            .collect(),
        _ => Err(CqlError::invalid(format!(
            "Invalid value for role option {name}: expected a map"
        ))),
    }
}

/// Hashes on a blocking thread: bcrypt is slow by design.
async fn hash_password(password: Option<String>) -> Result<Option<String>, CqlError> {
    let Some(password) = password else {
        return Ok(None);
    };
    if password.is_empty() {
        return Err(CqlError::invalid("Password must not be empty"));
    }
    tokio::task::spawn_blocking(move || password::hash(&password))
        .await
        .map_err(|_| CqlError::server("hashing the password failed"))?
        .map(Some)
}

fn allowed(access: &Option<Arc<Access>>, permission: Permission, resource: &Resource) -> bool {
    access
        .as_ref()
        .is_none_or(|access| access.allows(permission, resource))
}

fn ensure(
    access: &Option<Arc<Access>>,
    permission: Permission,
    resource: &Resource,
) -> Result<(), CqlError> {
    match access {
        Some(access) => access.ensure(permission, resource),
        None => Ok(()),
    }
}

fn is_superuser(access: &Option<Arc<Access>>) -> bool {
    access.as_ref().is_none_or(|a| a.is_superuser)
}

impl Coordinator {
    /// Runs a role or permission statement.
    pub(crate) async fn execute_role_statement(
        &self,
        session: &Session,
        statement: &Statement,
    ) -> Result<ResultBody, CqlError> {
        let access = self.access(session)?;
        match statement {
            Statement::CreateRole {
                name,
                if_not_exists,
                options,
            } => {
                self.create_role(session, &access, name, *if_not_exists, options)
                    .await
            }
            Statement::AlterRole { name, options } => {
                self.alter_role(session, &access, name, options).await
            }
            Statement::DropRole { name, if_exists } => {
                self.drop_role(session, &access, name, *if_exists).await
            }
            Statement::Permissions {
                grant,
                permissions,
                resource,
                role,
            } => {
                self.grant_permissions(session, &access, *grant, permissions, resource, role)
                    .await
            }
            Statement::RoleMembership {
                grant,
                role,
                grantee,
            } => self.grant_role(&access, *grant, role, grantee).await,
            Statement::ListRoles {
                of,
                recursive,
                users,
            } => self.list_roles(&access, of.as_deref(), *recursive, *users),
            Statement::ListPermissions {
                permissions,
                resource,
                of,
                recursive,
            } => self.list_permissions(session, &access, permissions, resource, of, *recursive),
            _ => Err(CqlError::server("not a role statement")),
        }
    }

    async fn create_role(
        &self,
        session: &Session,
        access: &Option<Arc<Access>>,
        name: &str,
        if_not_exists: bool,
        properties: &Properties,
    ) -> Result<ResultBody, CqlError> {
        ensure(access, Permission::Create, &Resource::AllRoles)?;
        let options = RoleOptions::parse(properties)?;
        if options.superuser == Some(true) && !is_superuser(access) {
            return Err(unauthorized(
                "Only superusers can create a role with superuser status",
            ));
        }
        if name.is_empty() {
            return Err(CqlError::invalid("Role name can't be an empty string"));
        }
        if self.auth.roles.current().roles.contains_key(name) {
            return exists_or_void(if_not_exists, name);
        }
        let salted_hash = hash_password(options.password).await?;
        let creator = session.user.clone();
        let created = self
            .auth
            .roles
            .change(|roles| {
                if roles.roles.contains_key(name) {
                    return Ok(false);
                }
                roles.roles.insert(
                    name.to_string(),
                    Role {
                        name: name.to_string(),
                        is_superuser: options.superuser.unwrap_or(false),
                        can_login: options.login.unwrap_or(false),
                        salted_hash: salted_hash.clone(),
                        member_of: BTreeSet::new(),
                        options: options.options.clone().unwrap_or_default(),
                    },
                );
                if let Some(creator) = creator.as_deref().filter(|c| roles.roles.contains_key(*c)) {
                    let resource = Resource::Role(name.to_string());
                    roles.grants.insert(
                        (creator.to_string(), resource.clone()),
                        resource.applicable().iter().copied().collect(),
                    );
                }
                Ok(true)
            })
            .await?;
        if created {
            Ok(ResultBody::Void)
        } else {
            exists_or_void(if_not_exists, name)
        }
    }

    async fn alter_role(
        &self,
        session: &Session,
        access: &Option<Arc<Access>>,
        name: &str,
        properties: &Properties,
    ) -> Result<ResultBody, CqlError> {
        let options = RoleOptions::parse(properties)?;
        self.auth.roles.current().role(name)?;
        let own = session.user.as_deref() == Some(name);
        if options.superuser.is_some() {
            if own || access.as_ref().is_some_and(|a| a.roles.contains(name)) {
                return Err(unauthorized(
                    "You aren't allowed to alter your own superuser status or that of a role granted to you",
                ));
            }
            if !is_superuser(access) {
                return Err(unauthorized(
                    "Only superusers are allowed to alter superuser status",
                ));
            }
        }
        let only_password =
            options.login.is_none() && options.superuser.is_none() && options.options.is_none();
        if !(own && only_password) {
            ensure(access, Permission::Alter, &Resource::Role(name.to_string()))?;
        }
        let salted_hash = hash_password(options.password.clone()).await?;
        self.auth
            .roles
            .change(|roles| {
                let role = roles
                    .roles
                    .get_mut(name)
                    .ok_or_else(|| CqlError::invalid(format!("{name} doesn't exist")))?;
                if let Some(hash) = &salted_hash {
                    role.salted_hash = Some(hash.clone());
                }
                if let Some(login) = options.login {
                    role.can_login = login;
                }
                if let Some(superuser) = options.superuser {
                    role.is_superuser = superuser;
                }
                if let Some(map) = &options.options {
                    role.options = map.clone();
                }
                Ok(true)
            })
            .await?;
        Ok(ResultBody::Void)
    }

    async fn drop_role(
        &self,
        session: &Session,
        access: &Option<Arc<Access>>,
        name: &str,
        if_exists: bool,
    ) -> Result<ResultBody, CqlError> {
        if session.user.as_deref() == Some(name) {
            return Err(CqlError::invalid(
                "Cannot DROP primary role for current login",
            ));
        }
        let roles = self.auth.roles.current();
        let Some(role) = roles.roles.get(name) else {
            return missing_or_void(if_exists, name);
        };
        ensure(access, Permission::Drop, &Resource::Role(name.to_string()))?;
        if role.is_superuser && !is_superuser(access) {
            return Err(unauthorized(
                "Only superusers can drop a role with superuser status",
            ));
        }
        self.auth
            .roles
            .change(|roles| {
                if !roles.roles.contains_key(name) {
                    return Ok(false);
                }
                roles.remove_role(name);
                Ok(true)
            })
            .await?;
        Ok(ResultBody::Void)
    }

    /// The resource a statement names, checked to exist.
    fn resolve_resource(
        &self,
        session: &Session,
        roles: &Roles,
        resource: &AuthResource,
    ) -> Result<Resource, CqlError> {
        let schema = self.schema();
        let missing =
            |resource: &Resource| CqlError::invalid(format!("Resource {resource} doesn't exist"));
        Ok(match resource {
            AuthResource::AllKeyspaces => Resource::AllKeyspaces,
            AuthResource::AllRoles => Resource::AllRoles,
            AuthResource::Keyspace(name) => {
                let resource = Resource::Keyspace(name.clone());
                schema.keyspace(name).map_err(|_| missing(&resource))?;
                resource
            }
            AuthResource::Table(name) => {
                let keyspace = self.keyspace_for(session, &name.keyspace)?;
                let resource = Resource::table(&keyspace, &name.name);
                schema
                    .table(&keyspace, &name.name)
                    .map_err(|_| missing(&resource))?;
                resource
            }
            AuthResource::Role(name) => {
                let resource = Resource::Role(name.clone());
                if !roles.roles.contains_key(name) {
                    return Err(missing(&resource));
                }
                resource
            }
        })
    }

    fn require_authorizer(&self, operation: &str) -> Result<(), CqlError> {
        if self.auth.settings.authorization {
            return Ok(());
        }
        Err(CqlError::invalid(format!(
            "{operation} operation is not supported by AllowAllAuthorizer"
        )))
    }

    async fn grant_permissions(
        &self,
        session: &Session,
        access: &Option<Arc<Access>>,
        grant: bool,
        permissions: &Option<Vec<String>>,
        resource: &AuthResource,
        role: &str,
    ) -> Result<ResultBody, CqlError> {
        self.require_authorizer(if grant { "GRANT" } else { "REVOKE" })?;
        let roles = self.auth.roles.current();
        let resource = self.resolve_resource(session, &roles, resource)?;
        roles.role(role)?;
        let permissions: BTreeSet<Permission> = match permissions {
            None => resource.applicable().iter().copied().collect(),
            Some(words) => words
                .iter()
                .map(|word| {
                    let permission = Permission::parse(word)?;
                    resource.check_applicable(permission)?;
                    Ok(permission)
                })
                .collect::<Result<_, CqlError>>()?,
        };
        ensure(access, Permission::Authorize, &resource)?;
        for permission in &permissions {
            ensure(access, *permission, &resource)?;
        }
        let key = (role.to_string(), resource);
        self.auth
            .roles
            .change(|roles| {
                roles.role(role)?;
                if grant {
                    roles
                        .grants
                        .entry(key.clone())
                        .or_default()
                        .extend(permissions.iter().copied());
                } else if let Some(held) = roles.grants.get_mut(&key) {
                    held.retain(|p| !permissions.contains(p));
                    if held.is_empty() {
                        roles.grants.remove(&key);
                    }
                } else {
                    return Ok(false);
                }
                Ok(true)
            })
            .await?;
        Ok(ResultBody::Void)
    }

    async fn grant_role(
        &self,
        access: &Option<Arc<Access>>,
        grant: bool,
        role: &str,
        grantee: &str,
    ) -> Result<ResultBody, CqlError> {
        let roles = self.auth.roles.current();
        roles.role(role)?;
        roles.role(grantee)?;
        ensure(
            access,
            Permission::Authorize,
            &Resource::Role(role.to_string()),
        )?;
        self.auth
            .roles
            .change(|roles| {
                let granted_to = roles.closure(role);
                let member = roles.role(grantee)?;
                if grant {
                    if member.member_of.contains(role) {
                        return Err(CqlError::invalid(format!(
                            "{grantee} is a member of {role}"
                        )));
                    }
                    if granted_to.contains(grantee) {
                        return Err(CqlError::invalid(format!(
                            "{role} is a member of {grantee}"
                        )));
                    }
                } else if !member.member_of.contains(role) {
                    return Err(CqlError::invalid(format!(
                        "{grantee} is not a member of {role}"
                    )));
                }
                let Some(member) = roles.roles.get_mut(grantee) else {
                    return Ok(false);
                };
                if grant {
                    member.member_of.insert(role.to_string());
                } else {
                    member.member_of.remove(role);
                }
                Ok(true)
            })
            .await?;
        Ok(ResultBody::Void)
    }

    fn list_roles(
        &self,
        access: &Option<Arc<Access>>,
        of: Option<&str>,
        recursive: bool,
        users: bool,
    ) -> Result<ResultBody, CqlError> {
        let roles = self.auth.roles.current();
        let sees_all = allowed(access, Permission::Describe, &Resource::AllRoles);
        let listed: BTreeSet<String> = match of {
            Some(name) => {
                let role = roles.role(name)?;
                if !sees_all && !access.as_ref().is_some_and(|a| a.roles.contains(name)) {
                    return Err(unauthorized(format!(
                        "You are not authorized to view roles granted to {name}"
                    )));
                }
                if recursive {
                    roles.closure(name)
                } else {
                    let mut direct = role.member_of.clone();
                    direct.insert(name.to_string());
                    direct
                }
            }
            None if sees_all => roles.roles.keys().cloned().collect(),
            None => access.as_ref().map(|a| a.roles.clone()).unwrap_or_default(),
        };
        let listed = listed
            .iter()
            .filter_map(|name| roles.roles.get(name))
            .filter(|role| !users || role.can_login);
        let text = |s: &str| Some(Value::Text(s.to_string()));
        let rows: Vec<Vec<Option<Value>>> = if users {
            listed
                .map(|role| {
                    vec![
                        text(&role.name),
                        Some(Value::Boolean(role.is_superuser)),
                        text("ALL"),
                    ]
                })
                .collect()
        } else {
            listed
                .map(|role| {
                    let options = role
                        .options
                        .iter()
                        .map(|(k, v)| (Value::Text(k.clone()), Value::Text(v.clone())))
                        .collect();
                    vec![
                        text(&role.name),
                        Some(Value::Boolean(role.is_superuser)),
                        Some(Value::Boolean(role.can_login)),
                        Some(Value::Map(options)),
                        text("ALL"),
                    ]
                })
                .collect()
        };
        let text_map = CqlType::Map {
            key: Box::new(CqlType::Text),
            value: Box::new(CqlType::Text),
            frozen: false,
        };
        let columns: &[(&str, CqlType)] = if users {
            &[
                ("name", CqlType::Text),
                ("super", CqlType::Boolean),
                ("datacenters", CqlType::Text),
            ]
        } else {
            &[
                ("role", CqlType::Text),
                ("super", CqlType::Boolean),
                ("login", CqlType::Boolean),
                ("options", text_map),
                ("datacenters", CqlType::Text),
            ]
        };
        Ok(rows_result("roles", columns, rows))
    }

    fn list_permissions(
        &self,
        session: &Session,
        access: &Option<Arc<Access>>,
        permissions: &Option<Vec<String>>,
        resource: &Option<AuthResource>,
        of: &Option<String>,
        recursive: bool,
    ) -> Result<ResultBody, CqlError> {
        self.require_authorizer("LIST PERMISSIONS")?;
        let roles = self.auth.roles.current();
        let grantees: Option<BTreeSet<String>> = match of {
            Some(name) => {
                roles.role(name)?;
                if !is_superuser(access) && !access.as_ref().is_some_and(|a| a.roles.contains(name))
                {
                    return Err(unauthorized(format!(
                        "You are not authorized to view {name}'s permissions"
                    )));
                }
                Some(if recursive {
                    roles.closure(name)
                } else {
                    BTreeSet::from([name.clone()])
                })
            }
            None if is_superuser(access) => None,
            None => {
                return Err(unauthorized(
                    "You are not authorized to view everyone's permissions",
                ))
            }
        };
        let resource = match resource {
            Some(resource) => Some(self.resolve_resource(session, &roles, resource)?),
            None => None,
        };
        let wanted: Option<BTreeSet<Permission>> = match permissions {
            None => None,
            Some(words) => Some(
                words
                    .iter()
                    .map(|w| Permission::parse(w))
                    .collect::<Result<_, _>>()?,
            ),
        };
        let mut rows = Vec::new();
        for ((grantee, granted_on), held) in &roles.grants {
            if grantees.as_ref().is_some_and(|g| !g.contains(grantee)) {
                continue;
            }
            let covered = resource.as_ref().is_none_or(|r| {
                if recursive {
                    r.chain().any(|ancestor| ancestor == *granted_on)
                } else {
                    r == granted_on
                }
            });
            if !covered {
                continue;
            }
            for permission in held {
                if wanted.as_ref().is_some_and(|w| !w.contains(permission)) {
                    continue;
                }
                rows.push(vec![
                    Some(Value::Text(grantee.clone())),
                    Some(Value::Text(grantee.clone())),
                    Some(Value::Text(granted_on.to_string())),
                    Some(Value::Text(permission.name().to_string())),
                ]);
            }
        }
        let columns = [
            ("role", CqlType::Text),
            ("username", CqlType::Text),
            ("resource", CqlType::Text),
            ("permission", CqlType::Text),
        ];
        Ok(rows_result("permissions", &columns, rows))
    }
}

fn exists_or_void(if_not_exists: bool, name: &str) -> Result<ResultBody, CqlError> {
    if if_not_exists {
        Ok(ResultBody::Void)
    } else {
        Err(CqlError::invalid(format!("{name} already exists")))
    }
}

fn missing_or_void(if_exists: bool, name: &str) -> Result<ResultBody, CqlError> {
    if if_exists {
        Ok(ResultBody::Void)
    } else {
        Err(CqlError::invalid(format!("{name} doesn't exist")))
    }
}

fn rows_result(
    table: &str,
    columns: &[(&str, CqlType)],
    rows: Vec<Vec<Option<Value>>>,
) -> ResultBody {
    let mut buffer = RowsBuffer::new(columns.len());
    for row in &rows {
        let cells: Vec<Option<Vec<u8>>> = row
            .iter()
            .map(|v| v.as_ref().map(Value::serialize))
            .collect();
        buffer.push_row(cells.iter().map(|c| c.as_deref()));
    }
    ResultBody::Rows(Rows {
        columns: columns
            .iter()
            .map(|(name, cql_type)| ColumnSpec {
                keyspace: "system_auth".into(),
                table: table.into(),
                name: name.to_string(),
                cql_type: cql_type.clone(),
            })
            .collect(),
        paging_state: None,
        skip_metadata: false,
        rows: buffer,
    })
}
