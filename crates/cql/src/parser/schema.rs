//! Schema statements: CREATE, ALTER and DROP of keyspaces, tables, types, indexes,
//! materialized views and functions, their WITH properties, and DESCRIBE.

use super::{ParseResult, Parser};
use crate::ast::*;
use crate::lexer::Token;
use crate::CqlError;

impl Parser {
    pub(super) fn if_not_exists(&mut self) -> ParseResult<bool> {
        if self.eat_word("if") {
            self.expect_word("not")?;
            self.expect_word("exists")?;
            return Ok(true);
        }
        Ok(false)
    }

    pub(super) fn if_exists(&mut self) -> ParseResult<bool> {
        if self.eat_word("if") {
            self.expect_word("exists")?;
            return Ok(true);
        }
        Ok(false)
    }

    pub(super) fn properties(&mut self) -> ParseResult<Properties> {
        let mut properties = Vec::new();
        loop {
            let name = self.identifier()?;
            self.expect_symbol("=")?;
            let value = match self.peek() {
                Some(Token::Word(w)) if !matches!(w.as_str(), "true" | "false" | "null") => {
                    // Bare words as values (e.g. `read_repair = BLOCKING`).
                    let word = w.clone();
                    self.position += 1;
                    Term::Literal(Literal::String(word))
                }
                _ => self.term()?,
            };
            properties.push((name, value));
            if !self.eat_word("and") {
                return Ok(properties);
            }
        }
    }

    pub(super) fn create(&mut self) -> ParseResult<Statement> {
        self.expect_word("create")?;
        if self.eat_word("keyspace") || self.eat_word("schema") {
            let if_not_exists = self.if_not_exists()?;
            let name = self.identifier()?;
            self.expect_word("with")?;
            let properties = self.properties()?;
            return Ok(Statement::CreateKeyspace {
                name,
                if_not_exists,
                properties,
            });
        }
        if self.eat_word("table") || self.eat_word("columnfamily") {
            return Ok(Statement::CreateTable(Box::new(self.create_table()?)));
        }
        if self.is_word("index") || (self.is_word("custom") && self.is_word_at(1, "index")) {
            return self.create_index();
        }
        if self.eat_word("type") {
            let if_not_exists = self.if_not_exists()?;
            let name = self.qualified_name()?;
            self.expect_symbol("(")?;
            let mut fields = Vec::new();
            loop {
                let field = self.identifier()?;
                fields.push((field, self.cql_type()?));
                if self.eat_symbol(")") {
                    break;
                }
                self.expect_symbol(",")?;
            }
            return Ok(Statement::CreateType {
                name,
                if_not_exists,
                fields,
            });
        }
        if self.eat_word("role") {
            return self.create_role();
        }
        if self.eat_word("user") {
            return self.create_user();
        }
        let what = self.peek().map(Token::describe).unwrap_or_default();
        Err(CqlError::invalid(format!(
            "CREATE {} is not supported by Shoal yet",
            what.to_uppercase()
        )))
    }

    pub(super) fn create_table(&mut self) -> ParseResult<CreateTable> {
        let if_not_exists = self.if_not_exists()?;
        let table = self.qualified_name()?;
        self.expect_symbol("(")?;
        let mut columns = Vec::new();
        let mut partition_key = Vec::new();
        let mut clustering_key = Vec::new();
        let mut inline_primary_key = None;
        loop {
            if self.is_word("primary") && self.is_word_at(1, "key") {
                self.position += 2;
                self.expect_symbol("(")?;
                if self.eat_symbol("(") {
                    loop {
                        partition_key.push(self.identifier()?);
                        if self.eat_symbol(")") {
                            break;
                        }
                        self.expect_symbol(",")?;
                    }
                } else {
                    partition_key.push(self.identifier()?);
                }
                while self.eat_symbol(",") {
                    clustering_key.push(self.identifier()?);
                }
                self.expect_symbol(")")?;
            } else {
                let name = self.identifier()?;
                let cql_type = self.cql_type()?;
                let mut is_static = false;
                loop {
                    if self.eat_word("static") {
                        is_static = true;
                    } else if self.is_word("primary") && self.is_word_at(1, "key") {
                        self.position += 2;
                        if inline_primary_key.is_some() {
                            return Err(CqlError::invalid(
                                "Multiple PRIMARY KEYs specified (exactly one required)",
                            ));
                        }
                        inline_primary_key = Some(name.clone());
                    } else {
                        break;
                    }
                }
                columns.push(ColumnDefinition {
                    name,
                    cql_type,
                    is_static,
                });
            }
            if self.eat_symbol(")") {
                break;
            }
            self.expect_symbol(",")?;
            if self.eat_symbol(")") {
                break;
            }
        }
        if let Some(name) = inline_primary_key {
            if !partition_key.is_empty() {
                return Err(CqlError::invalid(
                    "Multiple PRIMARY KEYs specified (exactly one required)",
                ));
            }
            partition_key.push(name);
        }
        let mut clustering_order = Vec::new();
        let mut properties = Vec::new();
        let mut compact_storage = false;
        if self.eat_word("with") {
            loop {
                if self.eat_word("clustering") {
                    self.expect_word("order")?;
                    self.expect_word("by")?;
                    self.expect_symbol("(")?;
                    loop {
                        let column = self.identifier()?;
                        let descending = if self.eat_word("desc") {
                            true
                        } else {
                            self.expect_word("asc")?;
                            false
                        };
                        clustering_order.push((column, descending));
                        if self.eat_symbol(")") {
                            break;
                        }
                        self.expect_symbol(",")?;
                    }
                } else if self.eat_word("compact") {
                    self.expect_word("storage")?;
                    compact_storage = true;
                } else {
                    let mut more = self.properties()?;
                    properties.append(&mut more);
                    break;
                }
                if !self.eat_word("and") {
                    break;
                }
            }
        }
        Ok(CreateTable {
            table,
            if_not_exists,
            columns,
            partition_key,
            clustering_key,
            clustering_order,
            properties,
            compact_storage,
        })
    }

    pub(super) fn alter(&mut self) -> ParseResult<Statement> {
        self.expect_word("alter")?;
        if self.eat_word("keyspace") || self.eat_word("schema") {
            let name = self.identifier()?;
            self.expect_word("with")?;
            let properties = self.properties()?;
            return Ok(Statement::AlterKeyspace { name, properties });
        }
        if self.eat_word("role") {
            return self.alter_role();
        }
        if self.eat_word("type") {
            return self.alter_type();
        }
        if self.eat_word("user") {
            return self.alter_user();
        }
        if !(self.eat_word("table") || self.eat_word("columnfamily")) {
            return Err(CqlError::invalid(format!(
                "ALTER {} is not supported by Shoal yet",
                self.peek()
                    .map(Token::describe)
                    .unwrap_or_default()
                    .to_uppercase()
            )));
        }
        let table = self.qualified_name()?;
        let action = if self.eat_word("add") {
            let parenthesized = self.eat_symbol("(");
            let mut definitions = Vec::new();
            loop {
                let name = self.identifier()?;
                let cql_type = self.cql_type()?;
                let is_static = self.eat_word("static");
                definitions.push(ColumnDefinition {
                    name,
                    cql_type,
                    is_static,
                });
                if !(parenthesized && self.eat_symbol(",")) {
                    break;
                }
            }
            if parenthesized {
                self.expect_symbol(")")?;
            }
            AlterTableAction::Add(definitions)
        } else if self.eat_word("drop") {
            let parenthesized = self.eat_symbol("(");
            let mut names = vec![self.identifier()?];
            while parenthesized && self.eat_symbol(",") {
                names.push(self.identifier()?);
            }
            if parenthesized {
                self.expect_symbol(")")?;
            }
            AlterTableAction::Drop(names)
        } else if self.eat_word("rename") {
            let mut renames = Vec::new();
            loop {
                let from = self.identifier()?;
                self.expect_word("to")?;
                let to = self.identifier()?;
                renames.push((from, to));
                if !self.eat_word("and") {
                    break;
                }
            }
            AlterTableAction::Rename(renames)
        } else if self.eat_word("alter") {
            let column = self.identifier()?;
            self.expect_word("type")?;
            let cql_type = self.cql_type()?;
            AlterTableAction::AlterType { column, cql_type }
        } else if self.eat_word("with") {
            AlterTableAction::With(self.properties()?)
        } else {
            return Err(self.error_here("ADD, DROP, RENAME, ALTER or WITH"));
        };
        Ok(Statement::AlterTable { table, action })
    }

    /// `CREATE [CUSTOM] INDEX [IF NOT EXISTS] [name] ON table (target) [USING 'class']
    /// [WITH OPTIONS = {...}]`.
    pub(super) fn create_index(&mut self) -> ParseResult<Statement> {
        let custom = self.eat_word("custom");
        self.expect_word("index")?;
        let if_not_exists = self.if_not_exists()?;
        let name = if self.is_word("on") {
            None
        } else {
            Some(self.identifier()?)
        };
        self.expect_word("on")?;
        let table = self.qualified_name()?;
        self.expect_symbol("(")?;
        let kinds = [
            ("values", IndexTargetKind::Values),
            ("keys", IndexTargetKind::Keys),
            ("entries", IndexTargetKind::Entries),
            ("full", IndexTargetKind::Full),
        ];
        let wrapped = kinds
            .iter()
            .find(|(word, _)| self.is_word(word) && self.is_symbol_at(1, "("))
            .map(|(_, kind)| *kind);
        let (column, target) = match wrapped {
            Some(kind) => {
                self.position += 2;
                let column = self.identifier()?;
                self.expect_symbol(")")?;
                (column, kind)
            }
            None => (self.identifier()?, IndexTargetKind::Simple),
        };
        self.expect_symbol(")")?;
        let using = if self.eat_word("using") {
            match self.next() {
                Some(Token::String(class)) => Some(class),
                _ => return Err(self.error_here("an index class string")),
            }
        } else {
            None
        };
        if custom && using.is_none() {
            return Err(CqlError::invalid(
                "CUSTOM index requires specifying the index class",
            ));
        }
        let mut options = Vec::new();
        if self.eat_word("with") {
            options = self.properties()?;
        }
        Ok(Statement::CreateIndex(Box::new(CreateIndex {
            name,
            table,
            if_not_exists,
            column,
            target,
            using,
            options,
        })))
    }

    /// `ALTER TYPE [IF EXISTS] name ADD [IF NOT EXISTS] field type` or
    /// `... RENAME [IF EXISTS] a TO b [AND c TO d]`.
    pub(super) fn alter_type(&mut self) -> ParseResult<Statement> {
        let if_exists = self.if_exists()?;
        let name = self.qualified_name()?;
        let action = if self.eat_word("add") {
            let if_not_exists = self.if_not_exists()?;
            let field = self.identifier()?;
            let cql_type = self.cql_type()?;
            AlterTypeAction::Add {
                field,
                cql_type,
                if_not_exists,
            }
        } else if self.eat_word("rename") {
            let if_exists = self.if_exists()?;
            let mut renames = Vec::new();
            loop {
                let from = self.identifier()?;
                self.expect_word("to")?;
                renames.push((from, self.identifier()?));
                if !self.eat_word("and") {
                    break;
                }
            }
            AlterTypeAction::Rename { renames, if_exists }
        } else if self.eat_word("alter") {
            return Err(CqlError::invalid(
                "Altering field types is no longer supported",
            ));
        } else {
            return Err(self.error_here("ADD or RENAME"));
        };
        Ok(Statement::AlterType {
            name,
            if_exists,
            action,
        })
    }

    pub(super) fn drop(&mut self) -> ParseResult<Statement> {
        self.expect_word("drop")?;
        if self.eat_word("keyspace") || self.eat_word("schema") {
            let if_exists = self.if_exists()?;
            let name = self.identifier()?;
            return Ok(Statement::DropKeyspace { name, if_exists });
        }
        if self.eat_word("table") || self.eat_word("columnfamily") {
            let if_exists = self.if_exists()?;
            let table = self.qualified_name()?;
            return Ok(Statement::DropTable { table, if_exists });
        }
        if self.eat_word("role") || self.eat_word("user") {
            let if_exists = self.if_exists()?;
            let name = self.role_name()?;
            return Ok(Statement::DropRole { name, if_exists });
        }
        if self.eat_word("type") {
            let if_exists = self.if_exists()?;
            let name = self.qualified_name()?;
            return Ok(Statement::DropType { name, if_exists });
        }
        if self.eat_word("index") {
            let if_exists = self.if_exists()?;
            let name = self.qualified_name()?;
            return Ok(Statement::DropIndex { name, if_exists });
        }
        Err(CqlError::invalid(format!(
            "DROP {} is not supported by Shoal yet",
            self.peek()
                .map(Token::describe)
                .unwrap_or_default()
                .to_uppercase()
        )))
    }

    pub(super) fn describe(&mut self) -> ParseResult<Statement> {
        self.position += 1;
        let only = self.eat_word("only");
        let target = if self.eat_word("cluster") {
            DescribeTarget::Cluster
        } else if self.eat_word("keyspaces") {
            DescribeTarget::Keyspaces
        } else if self.eat_word("tables") {
            DescribeTarget::Tables
        } else if self.eat_word("types") {
            DescribeTarget::Types
        } else if self.eat_word("functions") {
            DescribeTarget::Functions
        } else if self.eat_word("aggregates") {
            DescribeTarget::Aggregates
        } else if self.eat_word("full") {
            self.expect_word("schema")?;
            DescribeTarget::Schema { full: true }
        } else if self.eat_word("schema") {
            DescribeTarget::Schema { full: false }
        } else if self.eat_word("keyspace") {
            if self.peek().is_some() && !self.is_symbol(";") {
                DescribeTarget::Keyspace(Some(self.identifier()?))
            } else {
                DescribeTarget::Keyspace(None)
            }
        } else if self.eat_word("table") || self.eat_word("columnfamily") {
            DescribeTarget::Table(self.qualified_name()?)
        } else if self.eat_word("type") {
            DescribeTarget::Type(self.qualified_name()?)
        } else {
            DescribeTarget::Name(self.qualified_name()?)
        };
        // `WITH INTERNALS` is accepted and ignored.
        if self.eat_word("with") {
            self.expect_word("internals")?;
        }
        Ok(Statement::Describe { target, only })
    }
}
