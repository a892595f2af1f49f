//! Roles and permissions: CREATE/ALTER/DROP ROLE (and the older USER forms), GRANT and
//! REVOKE of permissions and of roles, LIST ROLES/USERS/PERMISSIONS — Cassandra's grammar.

use super::{ParseResult, Parser};
use crate::ast::{AuthResource, Literal, Properties, Statement, Term};
use crate::lexer::Token;
use crate::CqlError;

/// Words that name a permission in GRANT, REVOKE and LIST.
const PERMISSION_WORDS: [&str; 8] = [
    "create",
    "alter",
    "drop",
    "select",
    "modify",
    "authorize",
    "describe",
    "execute",
];

impl Parser {
    /// A role's name: an identifier (lowercased unless quoted) or a string literal.
    pub(super) fn role_name(&mut self) -> ParseResult<String> {
        if let Some(Token::String(name)) = self.peek() {
            let name = name.clone();
            self.position += 1;
            return Ok(name);
        }
        match self.peek() {
            // Role names may be words that are reserved elsewhere, as in Cassandra.
            Some(Token::Word(word)) => {
                let name = word.clone();
                self.position += 1;
                Ok(name)
            }
            _ => self
                .identifier()
                .map_err(|_| self.error_here("a role name")),
        }
    }

    /// After `CREATE ROLE`.
    pub(super) fn create_role(&mut self) -> ParseResult<Statement> {
        let if_not_exists = self.if_not_exists()?;
        let name = self.role_name()?;
        let options = if self.eat_word("with") {
            self.properties()?
        } else {
            Vec::new()
        };
        Ok(Statement::CreateRole {
            name,
            if_not_exists,
            options,
        })
    }

    /// After `ALTER ROLE`.
    pub(super) fn alter_role(&mut self) -> ParseResult<Statement> {
        let name = self.role_name()?;
        self.expect_word("with")?;
        let options = self.properties()?;
        Ok(Statement::AlterRole { name, options })
    }

    /// After `CREATE USER`: a role that may log in.
    pub(super) fn create_user(&mut self) -> ParseResult<Statement> {
        let if_not_exists = self.if_not_exists()?;
        let name = self.role_name()?;
        let mut options = vec![("login".to_string(), boolean(true))];
        options.extend(self.user_options()?);
        Ok(Statement::CreateRole {
            name,
            if_not_exists,
            options,
        })
    }

    /// After `ALTER USER`.
    pub(super) fn alter_user(&mut self) -> ParseResult<Statement> {
        let name = self.role_name()?;
        let options = self.user_options()?;
        if options.is_empty() {
            return Err(self.error_here("WITH PASSWORD, SUPERUSER or NOSUPERUSER"));
        }
        Ok(Statement::AlterRole { name, options })
    }

    /// `[WITH PASSWORD 'pw'] [SUPERUSER | NOSUPERUSER]`.
    fn user_options(&mut self) -> ParseResult<Properties> {
        let mut options = Vec::new();
        if self.eat_word("with") {
            self.expect_word("password")?;
            match self.next() {
                Some(Token::String(password)) => options.push((
                    "password".to_string(),
                    Term::Literal(Literal::String(password)),
                )),
                _ => return Err(CqlError::syntax("PASSWORD must be followed by a string")),
            }
        }
        if self.eat_word("superuser") {
            options.push(("superuser".to_string(), boolean(true)));
        } else if self.eat_word("nosuperuser") {
            options.push(("superuser".to_string(), boolean(false)));
        }
        Ok(options)
    }

    /// GRANT/REVOKE of a permission (`… ON resource TO|FROM role`) or of a role
    /// (`GRANT r TO grantee`, `REVOKE r FROM grantee`).
    pub(super) fn grant_or_revoke(&mut self) -> ParseResult<Statement> {
        let grant = self.is_word("grant");
        self.position += 1;
        let direction = if grant { "to" } else { "from" };
        let is_permission = (self.is_word("all")
            || PERMISSION_WORDS.iter().any(|w| self.is_word(w)))
            && !self.is_word_at(1, direction);
        if !is_permission {
            let role = self.role_name()?;
            self.expect_word(direction)?;
            let grantee = self.role_name()?;
            return Ok(Statement::RoleMembership {
                grant,
                role,
                grantee,
            });
        }
        let permissions = self.permissions()?;
        self.expect_word("on")?;
        let resource = self.resource()?;
        self.expect_word(direction)?;
        let role = self.role_name()?;
        Ok(Statement::Permissions {
            grant,
            permissions,
            resource,
            role,
        })
    }

    /// `ALL [PERMISSIONS]` (`None`) or one permission `[PERMISSION]`.
    fn permissions(&mut self) -> ParseResult<Option<Vec<String>>> {
        if self.eat_word("all") {
            self.eat_word("permissions");
            return Ok(None);
        }
        let Some(Token::Word(word)) = self.next() else {
            return Err(self.error_here("a permission"));
        };
        if !PERMISSION_WORDS.contains(&word.as_str()) {
            return Err(CqlError::syntax(format!("Unknown permission {word}")));
        }
        self.eat_word("permission");
        Ok(Some(vec![word]))
    }

    fn resource(&mut self) -> ParseResult<AuthResource> {
        if self.eat_word("all") {
            if self.eat_word("keyspaces") {
                return Ok(AuthResource::AllKeyspaces);
            }
            if self.eat_word("roles") {
                return Ok(AuthResource::AllRoles);
            }
            let what = self.peek().map(Token::describe).unwrap_or_default();
            return Err(CqlError::invalid(format!(
                "Permissions on ALL {} are not supported by Shoal",
                what.to_uppercase()
            )));
        }
        if self.eat_word("keyspace") {
            return Ok(AuthResource::Keyspace(self.identifier()?));
        }
        if self.eat_word("role") {
            return Ok(AuthResource::Role(self.role_name()?));
        }
        self.eat_word("table");
        Ok(AuthResource::Table(self.qualified_name()?))
    }

    /// LIST ROLES, LIST USERS, LIST … PERMISSIONS.
    pub(super) fn list(&mut self) -> ParseResult<Statement> {
        self.expect_word("list")?;
        if self.eat_word("roles") {
            let of = if self.eat_word("of") {
                Some(self.role_name()?)
            } else {
                None
            };
            let recursive = !self.eat_word("norecursive");
            return Ok(Statement::ListRoles {
                of,
                recursive,
                users: false,
            });
        }
        if self.eat_word("users") {
            return Ok(Statement::ListRoles {
                of: None,
                recursive: true,
                users: true,
            });
        }
        let permissions = self.permissions()?;
        let resource = if self.eat_word("on") {
            Some(self.resource()?)
        } else {
            None
        };
        let of = if self.eat_word("of") {
            Some(self.role_name()?)
        } else {
            None
        };
        let recursive = !self.eat_word("norecursive");
        Ok(Statement::ListPermissions {
            permissions,
            resource,
            of,
            recursive,
        })
    }
}

fn boolean(value: bool) -> Term {
    Term::Literal(Literal::Boolean(value))
}

#[cfg(test)]
mod tests {
    use crate::ast::{AuthResource, QualifiedName, Statement};
    use crate::parser::parse_statement;

    #[test]
    fn grants_of_permissions_and_of_roles_are_told_apart() {
        assert_eq!(
            parse_statement("GRANT SELECT ON ks.t TO alice").unwrap(),
            Statement::Permissions {
                grant: true,
                permissions: Some(vec!["select".into()]),
                resource: AuthResource::Table(QualifiedName {
                    keyspace: Some("ks".into()),
                    name: "t".into()
                }),
                role: "alice".into(),
            }
        );
        assert_eq!(
            parse_statement("REVOKE ALL PERMISSIONS ON ALL KEYSPACES FROM 'Bob'").unwrap(),
            Statement::Permissions {
                grant: false,
                permissions: None,
                resource: AuthResource::AllKeyspaces,
                role: "Bob".into(),
            }
        );
        assert_eq!(
            parse_statement("GRANT reader TO alice").unwrap(),
            Statement::RoleMembership {
                grant: true,
                role: "reader".into(),
                grantee: "alice".into(),
            }
        );
    }

    #[test]
    fn user_statements_are_roles_that_log_in() {
        let Statement::CreateRole { name, options, .. } =
            parse_statement("CREATE USER IF NOT EXISTS bob WITH PASSWORD 'pw' NOSUPERUSER")
                .unwrap()
        else {
            panic!("not a role");
        };
        assert_eq!(name, "bob");
        let names: Vec<&str> = options.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["login", "password", "superuser"]);
    }

    #[test]
    fn unknown_permissions_and_resources_are_refused() {
        assert!(parse_statement("GRANT READ ON ks.t TO alice").is_err());
        assert!(parse_statement("GRANT ALL ON ALL MBEANS TO alice").is_err());
        assert!(parse_statement("LIST ALL PERMISSIONS OF alice NORECURSIVE").is_ok());
    }
}
