//! SELECT: the selection (columns, functions, casts, aggregates, JSON), the WHERE clause's
//! relations and operators, GROUP BY, ORDER BY, PER PARTITION LIMIT, LIMIT and ALLOW
//! FILTERING.

use super::{ParseResult, Parser};
use crate::ast::*;
use crate::lexer::Token;

impl Parser {
    pub(super) fn select(&mut self) -> ParseResult<Select> {
        self.expect_word("select")?;
        let json = self.eat_word("json");
        let distinct = self.eat_word("distinct");
        let mut items = Vec::new();
        if !self.eat_symbol("*") {
            loop {
                let selector = self.selector()?;
                let alias = if self.eat_word("as") {
                    Some(self.identifier()?)
                } else {
                    None
                };
                items.push(SelectItem { selector, alias });
                if !self.eat_symbol(",") {
                    break;
                }
            }
        }
        self.expect_word("from")?;
        let table = self.qualified_name()?;
        let relations = if self.eat_word("where") {
            self.relations()?
        } else {
            Vec::new()
        };
        let mut group_by = Vec::new();
        if self.eat_word("group") {
            self.expect_word("by")?;
            loop {
                group_by.push(self.identifier()?);
                if !self.eat_symbol(",") {
                    break;
                }
            }
        }
        let mut order_by = Vec::new();
        let mut ann = None;
        if self.eat_word("order") {
            self.expect_word("by")?;
            loop {
                let column = self.identifier()?;
                if self.eat_word("ann") {
                    self.expect_word("of")?;
                    let vector = self.term()?;
                    if ann.is_some() {
                        // A second ANN ordering: refused with the others when planning.
                        order_by.push((column, false));
                    } else {
                        ann = Some((column, vector));
                    }
                    if !self.eat_symbol(",") {
                        break;
                    }
                    continue;
                }
                let descending = if self.eat_word("desc") {
                    true
                } else {
                    self.eat_word("asc");
                    false
                };
                order_by.push((column, descending));
                if !self.eat_symbol(",") {
                    break;
                }
            }
        }
        let mut per_partition_limit = None;
        if self.is_word("per") {
            self.position += 1;
            self.expect_word("partition")?;
            self.expect_word("limit")?;
            per_partition_limit = Some(self.term()?);
        }
        let limit = if self.eat_word("limit") {
            Some(self.term()?)
        } else {
            None
        };
        let allow_filtering = if self.eat_word("allow") {
            self.expect_word("filtering")?;
            true
        } else {
            false
        };
        let timeout = if self.eat_word("using") {
            self.expect_word("timeout")?;
            Some(self.term()?)
        } else {
            None
        };
        Ok(Select {
            table,
            json,
            distinct,
            items,
            relations,
            group_by,
            order_by,
            ann,
            per_partition_limit,
            limit,
            allow_filtering,
            timeout,
        })
    }

    pub(super) fn selector(&mut self) -> ParseResult<Selector> {
        let selector = match self.peek().cloned() {
            Some(Token::Word(word)) if self.is_symbol_at(1, "(") => {
                self.position += 2;
                match word.as_str() {
                    "count"
                        if self.eat_symbol("*")
                            || matches!(self.peek(), Some(Token::Integer(i)) if i == "1") =>
                    {
                        if !self.is_symbol(")") {
                            self.position += 1;
                        }
                        self.expect_symbol(")")?;
                        Selector::CountAll
                    }
                    "writetime" | "maxwritetime" | "ttl" => {
                        let column = self.identifier()?;
                        self.expect_symbol(")")?;
                        match word.as_str() {
                            "ttl" => Selector::Ttl(column),
                            "maxwritetime" => Selector::MaxWriteTime(column),
                            _ => Selector::WriteTime(column),
                        }
                    }
                    "token" => {
                        let mut columns = vec![self.identifier()?];
                        while self.eat_symbol(",") {
                            columns.push(self.identifier()?);
                        }
                        self.expect_symbol(")")?;
                        Selector::Token(columns)
                    }
                    "cast" => {
                        let inner = self.selector()?;
                        self.expect_word("as")?;
                        let cql_type = self.cql_type()?;
                        self.expect_symbol(")")?;
                        Selector::Cast {
                            selector: Box::new(inner),
                            cql_type,
                        }
                    }
                    _ => {
                        let mut arguments = Vec::new();
                        if !self.eat_symbol(")") {
                            loop {
                                arguments.push(self.selector()?);
                                if self.eat_symbol(")") {
                                    break;
                                }
                                self.expect_symbol(",")?;
                            }
                        }
                        Selector::Function {
                            name: word,
                            arguments,
                        }
                    }
                }
            }
            Some(Token::Word(_)) | Some(Token::QuotedName(_)) if !matches!(self.peek(), Some(Token::Word(w)) if matches!(w.as_str(), "true" | "false" | "null")) => {
                Selector::Column(self.identifier()?)
            }
            _ => Selector::Literal(self.term()?),
        };
        let mut selector = selector;
        while self.eat_symbol(".") {
            selector = Selector::Field {
                selector: Box::new(selector),
                field: self.identifier()?,
            };
        }
        Ok(selector)
    }

    pub(super) fn relations(&mut self) -> ParseResult<Vec<Relation>> {
        let mut relations = vec![self.relation()?];
        while self.eat_word("and") {
            relations.push(self.relation()?);
        }
        Ok(relations)
    }

    pub(super) fn operator(&mut self) -> ParseResult<Operator> {
        let operator = match self.next() {
            Some(Token::Symbol("=")) => Operator::Eq,
            Some(Token::Symbol("!=")) => Operator::NotEq,
            Some(Token::Symbol("<")) => Operator::Lt,
            Some(Token::Symbol("<=")) => Operator::Lte,
            Some(Token::Symbol(">")) => Operator::Gt,
            Some(Token::Symbol(">=")) => Operator::Gte,
            Some(Token::Word(w)) if w == "in" => Operator::In,
            Some(Token::Word(w)) if w == "like" => Operator::Like,
            Some(Token::Word(w)) if w == "contains" => {
                if self.eat_word("key") {
                    Operator::ContainsKey
                } else {
                    Operator::Contains
                }
            }
            _ => {
                self.position = self.position.saturating_sub(1);
                return Err(self.error_here("an operator"));
            }
        };
        Ok(operator)
    }

    pub(super) fn relation(&mut self) -> ParseResult<Relation> {
        let target = if self.is_word("token") && self.is_symbol_at(1, "(") {
            self.position += 2;
            let mut columns = vec![self.identifier()?];
            while self.eat_symbol(",") {
                columns.push(self.identifier()?);
            }
            self.expect_symbol(")")?;
            RelationTarget::Token(columns)
        } else if self.eat_symbol("(") {
            let mut columns = vec![self.identifier()?];
            while self.eat_symbol(",") {
                columns.push(self.identifier()?);
            }
            self.expect_symbol(")")?;
            RelationTarget::Columns(columns)
        } else {
            let column = self.identifier()?;
            if self.eat_symbol("[") {
                let key = self.term()?;
                self.expect_symbol("]")?;
                RelationTarget::MapEntry(column, key)
            } else {
                RelationTarget::Column(column)
            }
        };
        let operator = self.operator()?;
        let value = self.term()?;
        Ok(Relation {
            target,
            operator,
            value,
        })
    }
}
