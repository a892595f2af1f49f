//! A recursive-descent parser from CQL text to [`Statement`]s.
//!
//! Error messages follow Cassandra's shape (`line 1:N no viable alternative at input
//! 'X'`, `... mismatched input ...`) closely enough for people and tools that show them; the
//! error code is always SyntaxError for text that does not parse.
//!
//! This file holds the parser's cursor over the tokens, names, terms, types and the
//! dispatch on a statement's first words; each family of statements has its own file:
//! `select` (SELECT and WHERE relations), `modify` (INSERT, UPDATE, DELETE, BATCH and
//! their conditions), `schema` (CREATE/ALTER/DROP, DESCRIBE) and `roles` (roles and
//! permissions).

use crate::ast::*;
use crate::lexer::{tokenize, Token};
use crate::CqlError;
use shoal_model::CqlType;

/// Parses one statement (a trailing `;` is allowed).
pub fn parse_statement(text: &str) -> Result<Statement, CqlError> {
    parse_with_marker_count(text).map(|(statement, _)| statement)
}

/// Parses a statement and returns the number of bind markers it has.
pub fn parse_with_marker_count(text: &str) -> Result<(Statement, usize), CqlError> {
    let tokens = tokenize(text)?;
    let mut parser = Parser {
        tokens,
        position: 0,
        bind_count: 0,
    };
    let statement = parser.statement()?;
    while parser.eat_symbol(";") {}
    if let Some(token) = parser.peek() {
        return Err(CqlError::syntax(format!(
            "line 1:{} mismatched input '{}' expecting EOF",
            parser.position,
            token.describe()
        )));
    }
    Ok((statement, parser.bind_count))
}

struct Parser {
    tokens: Vec<Token>,
    position: usize,
    bind_count: usize,
}

type ParseResult<T> = Result<T, CqlError>;

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.position)
    }

    fn peek_at(&self, offset: usize) -> Option<&Token> {
        self.tokens.get(self.position + offset)
    }

    fn next(&mut self) -> Option<Token> {
        let token = self.tokens.get(self.position).cloned();
        if token.is_some() {
            self.position += 1;
        }
        token
    }

    fn error_here(&self, expecting: &str) -> CqlError {
        match self.peek() {
            Some(token) => CqlError::syntax(format!(
                "line 1:{} no viable alternative at input '{}' ({expecting})",
                self.position,
                token.describe()
            )),
            None => CqlError::syntax(format!(
                "line 1:{} mismatched input '<EOF>' expecting {expecting}",
                self.position
            )),
        }
    }

    fn is_word(&self, word: &str) -> bool {
        matches!(self.peek(), Some(Token::Word(w)) if w == word)
    }

    fn is_word_at(&self, offset: usize, word: &str) -> bool {
        matches!(self.peek_at(offset), Some(Token::Word(w)) if w == word)
    }

    fn eat_word(&mut self, word: &str) -> bool {
        if self.is_word(word) {
            self.position += 1;
            true
        } else {
            false
        }
    }

    fn expect_word(&mut self, word: &str) -> ParseResult<()> {
        if self.eat_word(word) {
            Ok(())
        } else {
            Err(self.error_here(&word.to_uppercase()))
        }
    }

    fn is_symbol(&self, symbol: &str) -> bool {
        matches!(self.peek(), Some(Token::Symbol(s)) if *s == symbol)
    }

    fn eat_symbol(&mut self, symbol: &str) -> bool {
        if self.is_symbol(symbol) {
            self.position += 1;
            true
        } else {
            false
        }
    }

    fn expect_symbol(&mut self, symbol: &str) -> ParseResult<()> {
        if self.eat_symbol(symbol) {
            Ok(())
        } else {
            Err(self.error_here(&format!("'{symbol}'")))
        }
    }

    /// An identifier: an unquoted word (lowercased) or a quoted name.
    fn identifier(&mut self) -> ParseResult<String> {
        match self.peek() {
            Some(Token::Word(w)) if !is_reserved(w) => {
                let name = w.clone();
                self.position += 1;
                Ok(name)
            }
            Some(Token::QuotedName(n)) => {
                let name = n.clone();
                self.position += 1;
                Ok(name)
            }
            _ => Err(self.error_here("an identifier")),
        }
    }

    fn qualified_name(&mut self) -> ParseResult<QualifiedName> {
        let first = self.identifier()?;
        if self.eat_symbol(".") {
            let name = self.identifier()?;
            Ok(QualifiedName {
                keyspace: Some(first),
                name,
            })
        } else {
            Ok(QualifiedName {
                keyspace: None,
                name: first,
            })
        }
    }

    fn statement(&mut self) -> ParseResult<Statement> {
        let Some(Token::Word(first)) = self.peek().cloned() else {
            return Err(self.error_here("a statement"));
        };
        match first.as_str() {
            "select" => Ok(Statement::Select(Box::new(self.select()?))),
            "insert" => Ok(Statement::Insert(Box::new(self.insert()?))),
            "update" => Ok(Statement::Update(Box::new(self.update()?))),
            "delete" => Ok(Statement::Delete(Box::new(self.delete()?))),
            "begin" => Ok(Statement::Batch(Box::new(self.batch()?))),
            "use" => {
                self.position += 1;
                Ok(Statement::Use(self.identifier()?))
            }
            "truncate" => {
                self.position += 1;
                self.eat_word("table");
                Ok(Statement::Truncate(self.qualified_name()?))
            }
            "create" => self.create(),
            "alter" => self.alter(),
            "drop" => self.drop(),
            "describe" | "desc" => self.describe(),
            "grant" | "revoke" => self.grant_or_revoke(),
            "list" => self.list(),
            _ => Err(self.error_here("a statement")),
        }
    }

    // ----- terms -----

    fn bind_marker(&mut self, name: Option<String>) -> Term {
        let index = self.bind_count;
        self.bind_count += 1;
        Term::Bind(BindMarker { index, name })
    }

    fn term(&mut self) -> ParseResult<Term> {
        let token = self.next().ok_or_else(|| self.error_here("a value"))?;
        Ok(match token {
            Token::String(s) => Term::Literal(Literal::String(s)),
            Token::Integer(s) => Term::Literal(Literal::Integer(s)),
            Token::Float(s) => Term::Literal(Literal::Float(s)),
            Token::Uuid(s) => Term::Literal(Literal::Uuid(s)),
            Token::Blob(b) => Term::Literal(Literal::Blob(b)),
            Token::Duration(d) => Term::Literal(Literal::Duration(d)),
            Token::Question => self.bind_marker(None),
            Token::NamedMarker(name) => self.bind_marker(Some(name)),
            Token::Symbol("-") => Term::Negative(Box::new(self.term()?)),
            Token::Symbol("[") => {
                let mut elements = Vec::new();
                if !self.eat_symbol("]") {
                    loop {
                        elements.push(self.term()?);
                        if self.eat_symbol("]") {
                            break;
                        }
                        self.expect_symbol(",")?;
                    }
                }
                Term::List(elements)
            }
            Token::Symbol("{") => {
                if self.eat_symbol("}") {
                    // `{}` is an empty map or set; the type decides later.
                    return Ok(Term::Map(Vec::new()));
                }
                if self.is_field_name_before_colon() {
                    let mut fields = Vec::new();
                    loop {
                        let field = self.identifier()?;
                        self.expect_symbol(":")?;
                        fields.push((field, self.term()?));
                        if self.eat_symbol("}") {
                            break;
                        }
                        self.expect_symbol(",")?;
                    }
                    return Ok(Term::UserType(fields));
                }
                let first = self.term()?;
                if self.eat_symbol(":") {
                    let value = self.term()?;
                    let mut entries = vec![(first, value)];
                    while self.eat_symbol(",") {
                        let key = self.term()?;
                        self.expect_symbol(":")?;
                        entries.push((key, self.term()?));
                    }
                    self.expect_symbol("}")?;
                    Term::Map(entries)
                } else {
                    let mut elements = vec![first];
                    while self.eat_symbol(",") {
                        elements.push(self.term()?);
                    }
                    self.expect_symbol("}")?;
                    Term::Set(elements)
                }
            }
            Token::Symbol("(") => {
                // A cast `(type) term`, or a tuple.
                if let Some(Token::Word(word)) = self.peek().cloned() {
                    if self.is_symbol_at(1, ")") && is_type_name(&word) {
                        let cql_type = self.cql_type()?;
                        self.expect_symbol(")")?;
                        let term = self.term()?;
                        return Ok(Term::Cast {
                            cql_type,
                            term: Box::new(term),
                        });
                    }
                }
                let mut elements = Vec::new();
                if !self.eat_symbol(")") {
                    loop {
                        elements.push(self.term()?);
                        if self.eat_symbol(")") {
                            break;
                        }
                        self.expect_symbol(",")?;
                    }
                }
                Term::Tuple(elements)
            }
            Token::Word(word) => match word.as_str() {
                "true" => Term::Literal(Literal::Boolean(true)),
                "false" => Term::Literal(Literal::Boolean(false)),
                "null" => Term::Literal(Literal::Null),
                "nan" => Term::Literal(Literal::NaN),
                "infinity" => Term::Literal(Literal::Infinity),
                _ if self.is_symbol(".") || self.is_symbol("(") => {
                    let mut name = word;
                    if self.eat_symbol(".") {
                        name = self.identifier()?;
                    }
                    self.expect_symbol("(")?;
                    let mut arguments = Vec::new();
                    if !self.eat_symbol(")") {
                        loop {
                            arguments.push(self.term()?);
                            if self.eat_symbol(")") {
                                break;
                            }
                            self.expect_symbol(",")?;
                        }
                    }
                    Term::Function { name, arguments }
                }
                _ if word.starts_with('p') && word.len() > 1 => {
                    // ISO 8601 duration, e.g. P1DT2H (lexed as a word).
                    Term::Literal(Literal::Duration(word.to_uppercase()))
                }
                _ => {
                    self.position -= 1;
                    return Err(self.error_here("a value"));
                }
            },
            _ => {
                self.position -= 1;
                return Err(self.error_here("a value"));
            }
        })
    }

    /// True at `name:` inside braces: a user-defined type literal's field (a bare word is
    /// never a map key, except the literal keywords).
    fn is_field_name_before_colon(&self) -> bool {
        let is_name = match self.peek() {
            Some(Token::Word(word)) => !matches!(
                word.as_str(),
                "true" | "false" | "null" | "nan" | "infinity"
            ),
            Some(Token::QuotedName(_)) => true,
            _ => false,
        };
        is_name && self.is_symbol_at(1, ":")
    }

    fn is_symbol_at(&self, offset: usize, symbol: &str) -> bool {
        matches!(self.peek_at(offset), Some(Token::Symbol(s)) if *s == symbol)
    }

    fn cql_type(&mut self) -> ParseResult<CqlType> {
        let name = match self.next() {
            Some(Token::Word(w)) => w,
            Some(Token::QuotedName(n)) => n,
            _ => {
                self.position = self.position.saturating_sub(1);
                return Err(self.error_here("a type"));
            }
        };
        let parse_inner = |parser: &mut Parser| -> ParseResult<String> {
            // Re-assemble the generic arguments' text and let CqlType::parse validate it.
            parser.expect_symbol("<")?;
            let mut depth = 1;
            let mut text = String::new();
            while depth > 0 {
                match parser.next() {
                    Some(Token::Symbol("<")) => {
                        depth += 1;
                        text.push('<');
                    }
                    Some(Token::Symbol(">")) => {
                        depth -= 1;
                        if depth > 0 {
                            text.push('>');
                        }
                    }
                    Some(Token::Symbol(",")) => text.push_str(", "),
                    Some(Token::Symbol(".")) => text.push('.'),
                    Some(Token::Word(w)) => text.push_str(&w),
                    Some(Token::QuotedName(n)) => text.push_str(&n),
                    // A vector's dimension.
                    Some(Token::Integer(digits)) => text.push_str(&digits),
                    _ => return Err(parser.error_here("a type")),
                }
            }
            Ok(text)
        };
        match name.as_str() {
            "frozen" | "list" | "set" | "map" | "tuple" | "vector" => {
                let inner = parse_inner(self)?;
                CqlType::parse(&format!("{name}<{inner}>")).map_err(CqlError::invalid)
            }
            other => match CqlType::native_from_name(other) {
                Some(native) => Ok(native),
                None => {
                    // A user-defined type, `name` or `keyspace.name`.
                    let (keyspace, name) = if self.eat_symbol(".") {
                        (Some(name.clone()), self.identifier()?)
                    } else {
                        (None, name.clone())
                    };
                    Ok(CqlType::UdtName {
                        keyspace,
                        name,
                        frozen: false,
                    })
                }
            },
        }
    }
}

/// Words that cannot be unquoted identifiers (a subset of Cassandra's reserved keywords).
fn is_reserved(word: &str) -> bool {
    matches!(
        word,
        "select"
            | "from"
            | "where"
            | "and"
            | "insert"
            | "into"
            | "update"
            | "set"
            | "delete"
            | "begin"
            | "apply"
            | "batch"
            | "create"
            | "drop"
            | "alter"
            | "use"
            | "with"
            | "limit"
            | "order"
            | "by"
            | "asc"
            | "desc"
            | "in"
            | "using"
            | "if"
            | "not"
            | "primary"
            | "token"
            | "allow"
            | "table"
            | "keyspace"
            | "truncate"
            | "null"
            | "of"
            | "to"
            | "add"
            | "modify"
            | "rename"
            | "grant"
            | "revoke"
            | "schema"
            | "columnfamily"
            | "index"
            | "on"
            | "is"
            | "infinity"
            | "nan"
            | "unlogged"
            | "describe"
    )
}

fn is_type_name(word: &str) -> bool {
    CqlType::native_from_name(word).is_some()
        || matches!(word, "frozen" | "list" | "set" | "map" | "tuple" | "vector")
}

mod modify;
mod roles;
mod schema;
mod select;
#[cfg(test)]
mod tests;
