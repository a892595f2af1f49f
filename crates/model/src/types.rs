//! CQL's type system: the native types, collections and tuples, with Cassandra's textual
//! form (`map<text, frozen<list<int>>>`), which is what `system_schema.columns.type` shows
//! and what `CREATE TABLE` accepts.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A CQL data type.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CqlType {
    Ascii,
    Bigint,
    Blob,
    Boolean,
    Counter,
    Decimal,
    Double,
    Duration,
    Float,
    Inet,
    Int,
    Smallint,
    Text,
    Time,
    Timestamp,
    Timeuuid,
    Tinyint,
    Uuid,
    Varint,
    Date,
    /// `list<T>`; `frozen` lists are one cell, non-frozen ones a cell per element.
    List {
        element: Box<CqlType>,
        frozen: bool,
    },
    Set {
        element: Box<CqlType>,
        frozen: bool,
    },
    Map {
        key: Box<CqlType>,
        value: Box<CqlType>,
        frozen: bool,
    },
    /// Tuples are always frozen.
    Tuple(Vec<CqlType>),
}

impl CqlType {
    /// Looks up a native type by its CQL name (case-insensitive).
    pub fn native_from_name(name: &str) -> Option<CqlType> {
        Some(match name.to_ascii_lowercase().as_str() {
            "ascii" => CqlType::Ascii,
            "bigint" => CqlType::Bigint,
            "blob" => CqlType::Blob,
            "boolean" => CqlType::Boolean,
            "counter" => CqlType::Counter,
            "decimal" => CqlType::Decimal,
            "double" => CqlType::Double,
            "duration" => CqlType::Duration,
            "float" => CqlType::Float,
            "inet" => CqlType::Inet,
            "int" => CqlType::Int,
            "smallint" => CqlType::Smallint,
            "text" | "varchar" => CqlType::Text,
            "time" => CqlType::Time,
            "timestamp" => CqlType::Timestamp,
            "timeuuid" => CqlType::Timeuuid,
            "tinyint" => CqlType::Tinyint,
            "uuid" => CqlType::Uuid,
            "varint" => CqlType::Varint,
            "date" => CqlType::Date,
            _ => return None,
        })
    }

    /// True for list, set and map that are not frozen: stored as one cell per element.
    pub fn is_multi_cell(&self) -> bool {
        matches!(
            self,
            CqlType::List { frozen: false, .. }
                | CqlType::Set { frozen: false, .. }
                | CqlType::Map { frozen: false, .. }
        )
    }

    pub fn is_collection(&self) -> bool {
        matches!(
            self,
            CqlType::List { .. } | CqlType::Set { .. } | CqlType::Map { .. }
        )
    }

    /// The same type, frozen (collections only; others are returned unchanged).
    pub fn frozen(self) -> CqlType {
        match self {
            CqlType::List { element, .. } => CqlType::List {
                element,
                frozen: true,
            },
            CqlType::Set { element, .. } => CqlType::Set {
                element,
                frozen: true,
            },
            CqlType::Map { key, value, .. } => CqlType::Map {
                key,
                value,
                frozen: true,
            },
            other => other,
        }
    }

    /// Integer-like and floating types accept numeric literals.
    pub fn is_numeric(&self) -> bool {
        matches!(
            self,
            CqlType::Bigint
                | CqlType::Counter
                | CqlType::Decimal
                | CqlType::Double
                | CqlType::Float
                | CqlType::Int
                | CqlType::Smallint
                | CqlType::Tinyint
                | CqlType::Varint
        )
    }

    /// Parses Cassandra's textual form, e.g. `frozen<map<text, list<int>>>`.
    pub fn parse(text: &str) -> Result<CqlType, String> {
        let mut parser = TypeTextParser {
            text: text.as_bytes(),
            position: 0,
        };
        let parsed = parser.parse_type()?;
        parser.skip_spaces();
        if parser.position != parser.text.len() {
            return Err(format!("Unexpected text after type in '{text}'"));
        }
        Ok(parsed)
    }
}

struct TypeTextParser<'a> {
    text: &'a [u8],
    position: usize,
}

impl TypeTextParser<'_> {
    fn skip_spaces(&mut self) {
        while self.position < self.text.len() && self.text[self.position].is_ascii_whitespace() {
            self.position += 1;
        }
    }

    fn word(&mut self) -> String {
        self.skip_spaces();
        let start = self.position;
        while self.position < self.text.len()
            && (self.text[self.position].is_ascii_alphanumeric()
                || self.text[self.position] == b'_')
        {
            self.position += 1;
        }
        String::from_utf8_lossy(&self.text[start..self.position]).into_owned()
    }

    fn expect(&mut self, symbol: u8) -> Result<(), String> {
        self.skip_spaces();
        if self.text.get(self.position) == Some(&symbol) {
            self.position += 1;
            Ok(())
        } else {
            Err(format!("Expected '{}' in type", symbol as char))
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_spaces();
        self.text.get(self.position).copied()
    }

    fn parse_type(&mut self) -> Result<CqlType, String> {
        let name = self.word().to_ascii_lowercase();
        match name.as_str() {
            "frozen" => {
                self.expect(b'<')?;
                let inner = self.parse_type()?;
                self.expect(b'>')?;
                Ok(inner.frozen())
            }
            "list" | "set" => {
                self.expect(b'<')?;
                let element = self.parse_type()?;
                self.expect(b'>')?;
                if element.is_multi_cell() {
                    return Err("Non-frozen collections are not allowed inside collections".into());
                }
                let element = Box::new(element);
                Ok(if name == "list" {
                    CqlType::List {
                        element,
                        frozen: false,
                    }
                } else {
                    CqlType::Set {
                        element,
                        frozen: false,
                    }
                })
            }
            "map" => {
                self.expect(b'<')?;
                let key = self.parse_type()?;
                self.expect(b',')?;
                let value = self.parse_type()?;
                self.expect(b'>')?;
                if key.is_multi_cell() || value.is_multi_cell() {
                    return Err("Non-frozen collections are not allowed inside collections".into());
                }
                Ok(CqlType::Map {
                    key: Box::new(key),
                    value: Box::new(value),
                    frozen: false,
                })
            }
            "tuple" => {
                self.expect(b'<')?;
                let mut elements = vec![self.parse_type()?.frozen()];
                while self.peek() == Some(b',') {
                    self.position += 1;
                    elements.push(self.parse_type()?.frozen());
                }
                self.expect(b'>')?;
                Ok(CqlType::Tuple(elements))
            }
            "" => Err("Expected a type name".into()),
            other => {
                CqlType::native_from_name(other).ok_or_else(|| format!("Unknown type {other}"))
            }
        }
    }
}

impl fmt::Display for CqlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let native = match self {
            CqlType::Ascii => "ascii",
            CqlType::Bigint => "bigint",
            CqlType::Blob => "blob",
            CqlType::Boolean => "boolean",
            CqlType::Counter => "counter",
            CqlType::Decimal => "decimal",
            CqlType::Double => "double",
            CqlType::Duration => "duration",
            CqlType::Float => "float",
            CqlType::Inet => "inet",
            CqlType::Int => "int",
            CqlType::Smallint => "smallint",
            CqlType::Text => "text",
            CqlType::Time => "time",
            CqlType::Timestamp => "timestamp",
            CqlType::Timeuuid => "timeuuid",
            CqlType::Tinyint => "tinyint",
            CqlType::Uuid => "uuid",
            CqlType::Varint => "varint",
            CqlType::Date => "date",
            CqlType::List { element, frozen } => {
                return wrap_frozen(f, *frozen, |f| write!(f, "list<{element}>"));
            }
            CqlType::Set { element, frozen } => {
                return wrap_frozen(f, *frozen, |f| write!(f, "set<{element}>"));
            }
            CqlType::Map { key, value, frozen } => {
                return wrap_frozen(f, *frozen, |f| write!(f, "map<{key}, {value}>"));
            }
            CqlType::Tuple(elements) => {
                write!(f, "frozen<tuple<")?;
                for (i, element) in elements.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{element}")?;
                }
                return write!(f, ">>");
            }
        };
        f.write_str(native)
    }
}

fn wrap_frozen(
    f: &mut fmt::Formatter<'_>,
    frozen: bool,
    inner: impl FnOnce(&mut fmt::Formatter<'_>) -> fmt::Result,
) -> fmt::Result {
    if frozen {
        f.write_str("frozen<")?;
        inner(f)?;
        f.write_str(">")
    } else {
        inner(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_text_round_trips() {
        for text in [
            "int",
            "text",
            "list<int>",
            "frozen<set<text>>",
            "map<text, frozen<list<int>>>",
            "frozen<tuple<int, text>>",
        ] {
            assert_eq!(CqlType::parse(text).unwrap().to_string(), text);
        }
        assert_eq!(CqlType::parse("varchar").unwrap(), CqlType::Text);
        assert!(CqlType::parse("list<list<int>>").is_err());
        assert!(CqlType::parse("nosuchtype").is_err());
    }
}
