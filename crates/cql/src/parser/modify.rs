//! Modifications: INSERT (with VALUES or JSON), UPDATE and its assignments, DELETE, the
//! conditions of lightweight transactions (IF ...), USING TIMESTAMP/TTL, and BATCH.

use super::{ParseResult, Parser};
use crate::ast::*;
use crate::lexer::Token;
use crate::CqlError;

impl Parser {
    pub(super) fn using(&mut self, using: &mut Using) -> ParseResult<()> {
        if !self.eat_word("using") {
            return Ok(());
        }
        loop {
            if self.eat_word("ttl") {
                using.ttl = Some(self.term()?);
            } else if self.eat_word("timestamp") {
                using.timestamp = Some(self.term()?);
            } else {
                return Err(self.error_here("TTL or TIMESTAMP"));
            }
            if !self.eat_word("and") {
                return Ok(());
            }
        }
    }

    pub(super) fn insert(&mut self) -> ParseResult<Insert> {
        self.expect_word("insert")?;
        self.expect_word("into")?;
        let table = self.qualified_name()?;
        let mut columns = Vec::new();
        let mut values = Vec::new();
        let mut json = None;
        let mut json_default_unset = false;
        if self.eat_word("json") {
            json = Some(self.term()?);
            if self.eat_word("default") && !self.eat_word("null") {
                self.expect_word("unset")?;
                json_default_unset = true;
            }
        } else {
            self.expect_symbol("(")?;
            loop {
                columns.push(self.identifier()?);
                if self.eat_symbol(")") {
                    break;
                }
                self.expect_symbol(",")?;
            }
            self.expect_word("values")?;
            self.expect_symbol("(")?;
            loop {
                values.push(self.term()?);
                if self.eat_symbol(")") {
                    break;
                }
                self.expect_symbol(",")?;
            }
        }
        let mut if_not_exists = false;
        if self.eat_word("if") {
            self.expect_word("not")?;
            self.expect_word("exists")?;
            if_not_exists = true;
        }
        let mut using = Using::default();
        self.using(&mut using)?;
        Ok(Insert {
            table,
            columns,
            values,
            json,
            json_default_unset,
            if_not_exists,
            using,
        })
    }

    pub(super) fn conditions(&mut self) -> ParseResult<Option<Conditions>> {
        if !self.eat_word("if") {
            return Ok(None);
        }
        if self.eat_word("exists") {
            return Ok(Some(Conditions::Exists));
        }
        if self.is_word("not") && self.is_word_at(1, "exists") {
            self.position += 2;
            return Ok(Some(Conditions::NotExists));
        }
        let mut conditions = Vec::new();
        loop {
            let (column, element, field) = self.column_part()?;
            let operator = self.operator()?;
            let value = self.term()?;
            conditions.push(ColumnCondition {
                column,
                element,
                field,
                operator,
                value,
            });
            if !self.eat_word("and") {
                break;
            }
        }
        Ok(Some(Conditions::Columns(conditions)))
    }

    pub(super) fn update(&mut self) -> ParseResult<Update> {
        self.expect_word("update")?;
        let table = self.qualified_name()?;
        let mut using = Using::default();
        self.using(&mut using)?;
        self.expect_word("set")?;
        let mut assignments = Vec::new();
        loop {
            assignments.push(self.assignment()?);
            if !self.eat_symbol(",") {
                break;
            }
        }
        self.expect_word("where")?;
        let relations = self.relations()?;
        let conditions = self.conditions()?;
        Ok(Update {
            table,
            using,
            assignments,
            relations,
            conditions,
        })
    }

    pub(super) fn assignment(&mut self) -> ParseResult<Assignment> {
        let column = self.identifier()?;
        if self.eat_symbol("[") {
            let key = self.term()?;
            self.expect_symbol("]")?;
            self.expect_symbol("=")?;
            let value = self.term()?;
            return Ok(Assignment::SetElement { column, key, value });
        }
        if self.eat_symbol(".") {
            let field = self.identifier()?;
            self.expect_symbol("=")?;
            let value = self.term()?;
            return Ok(Assignment::SetField {
                column,
                field,
                value,
            });
        }
        self.expect_symbol("=")?;
        // `c = c + x`, `c = c - x`, `c = x + c`, or `c = x`.
        let same_column = |token: Option<&Token>| match token {
            Some(Token::Word(w)) => *w == column,
            Some(Token::QuotedName(n)) => *n == column,
            _ => false,
        };
        if same_column(self.peek()) && (self.is_symbol_at(1, "+") || self.is_symbol_at(1, "-")) {
            self.position += 1;
            let adding = self.eat_symbol("+");
            if !adding {
                self.expect_symbol("-")?;
            }
            let value = self.term()?;
            return Ok(if adding {
                Assignment::Add { column, value }
            } else {
                Assignment::Remove { column, value }
            });
        }
        let value = self.term()?;
        if self.eat_symbol("+") {
            if !same_column(self.peek()) {
                return Err(self.error_here(&format!("the column {column}")));
            }
            self.position += 1;
            return Ok(Assignment::Prepend { column, value });
        }
        Ok(Assignment::Set { column, value })
    }

    /// A column as a condition or a deletion names it: the column's name, then an element
    /// (`m['k']`, `l[0]`) or a field of a user-defined type (`addr.zip`), if given.
    fn column_part(&mut self) -> ParseResult<(String, Option<Term>, Option<String>)> {
        let column = self.identifier()?;
        let element = if self.eat_symbol("[") {
            let key = self.term()?;
            self.expect_symbol("]")?;
            Some(key)
        } else {
            None
        };
        let field = if element.is_none() && self.eat_symbol(".") {
            Some(self.identifier()?)
        } else {
            None
        };
        Ok((column, element, field))
    }

    pub(super) fn delete(&mut self) -> ParseResult<Delete> {
        self.expect_word("delete")?;
        let mut targets = Vec::new();
        if !self.is_word("from") {
            loop {
                let (column, element, field) = self.column_part()?;
                targets.push(DeleteTarget {
                    column,
                    element,
                    field,
                });
                if !self.eat_symbol(",") {
                    break;
                }
            }
        }
        self.expect_word("from")?;
        let table = self.qualified_name()?;
        let mut using = Using::default();
        self.using(&mut using)?;
        self.expect_word("where")?;
        let relations = self.relations()?;
        let conditions = self.conditions()?;
        Ok(Delete {
            table,
            targets,
            using,
            relations,
            conditions,
        })
    }

    pub(super) fn batch(&mut self) -> ParseResult<Batch> {
        self.expect_word("begin")?;
        let batch_type = if self.eat_word("unlogged") {
            BatchType::Unlogged
        } else if self.eat_word("counter") {
            BatchType::Counter
        } else {
            BatchType::Logged
        };
        self.expect_word("batch")?;
        let mut using = Using::default();
        self.using(&mut using)?;
        let mut statements = Vec::new();
        loop {
            while self.eat_symbol(";") {}
            if self.eat_word("apply") {
                self.expect_word("batch")?;
                break;
            }
            let statement = self.statement()?;
            if !statement.is_modification() {
                return Err(CqlError::invalid(
                    "Only INSERT, UPDATE and DELETE statements are allowed in a BATCH",
                ));
            }
            statements.push(statement);
        }
        Ok(Batch {
            batch_type,
            using,
            statements,
        })
    }
}
