//! A recursive-descent parser from CQL text to [`Statement`]s.
//!
//! Error messages follow Cassandra's shape (`line 1:N no viable alternative at input
//! 'X'`, `... mismatched input ...`) closely enough for people and tools that show them; the
//! error code is always SyntaxError for text that does not parse.

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

    // ----- SELECT -----

    fn select(&mut self) -> ParseResult<Select> {
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

    fn selector(&mut self) -> ParseResult<Selector> {
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

    fn relations(&mut self) -> ParseResult<Vec<Relation>> {
        let mut relations = vec![self.relation()?];
        while self.eat_word("and") {
            relations.push(self.relation()?);
        }
        Ok(relations)
    }

    fn operator(&mut self) -> ParseResult<Operator> {
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

    fn relation(&mut self) -> ParseResult<Relation> {
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

    // ----- modifications -----

    fn using(&mut self, using: &mut Using) -> ParseResult<()> {
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

    fn insert(&mut self) -> ParseResult<Insert> {
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

    fn conditions(&mut self) -> ParseResult<Option<Conditions>> {
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

    fn update(&mut self) -> ParseResult<Update> {
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

    fn assignment(&mut self) -> ParseResult<Assignment> {
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

    fn delete(&mut self) -> ParseResult<Delete> {
        self.expect_word("delete")?;
        let mut targets = Vec::new();
        if !self.is_word("from") {
            loop {
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

    fn batch(&mut self) -> ParseResult<Batch> {
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

    // ----- DDL -----

    fn if_not_exists(&mut self) -> ParseResult<bool> {
        if self.eat_word("if") {
            self.expect_word("not")?;
            self.expect_word("exists")?;
            return Ok(true);
        }
        Ok(false)
    }

    fn if_exists(&mut self) -> ParseResult<bool> {
        if self.eat_word("if") {
            self.expect_word("exists")?;
            return Ok(true);
        }
        Ok(false)
    }

    fn properties(&mut self) -> ParseResult<Properties> {
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

    fn create(&mut self) -> ParseResult<Statement> {
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

    fn create_table(&mut self) -> ParseResult<CreateTable> {
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

    fn alter(&mut self) -> ParseResult<Statement> {
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
    fn create_index(&mut self) -> ParseResult<Statement> {
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
    fn alter_type(&mut self) -> ParseResult<Statement> {
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

    fn drop(&mut self) -> ParseResult<Statement> {
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

    fn describe(&mut self) -> ParseResult<Statement> {
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

mod roles;
#[cfg(test)]
mod tests;
