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
    /// `vector<T, n>` (Cassandra 5.0): exactly `dimension` non-null elements, always one
    /// cell. Elements of a fixed width (float, int, uuid…) are stored back to back;
    /// others each with an unsigned vint length ([`crate::Value::serialize`]).
    Vector {
        element: Box<CqlType>,
        dimension: u32,
    },
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

    /// The width of every serialized value of this type, for the types Cassandra treats
    /// as fixed-width (which decides how a vector of them is laid out); `None` otherwise.
    pub fn fixed_width(&self) -> Option<usize> {
        match self {
            CqlType::Boolean => Some(1),
            CqlType::Int | CqlType::Float => Some(4),
            CqlType::Bigint | CqlType::Double | CqlType::Timestamp | CqlType::Time => Some(8),
            CqlType::Uuid | CqlType::Timeuuid => Some(16),
            CqlType::Vector { element, dimension } => element
                .fixed_width()
                .and_then(|width| width.checked_mul(*dimension as usize)),
            _ => None,
        }
    }

    /// Cassandra's internal name of this type (`org.apache.cassandra.db.marshal.…`), as
    /// the protocol carries a custom type and as the drivers parse it.
    pub fn marshal_class(&self) -> String {
        const PACKAGE: &str = "org.apache.cassandra.db.marshal.";
        let simple = match self {
            CqlType::Ascii => "AsciiType",
            CqlType::Bigint => "LongType",
            CqlType::Blob => "BytesType",
            CqlType::Boolean => "BooleanType",
            CqlType::Counter => "CounterColumnType",
            CqlType::Decimal => "DecimalType",
            CqlType::Double => "DoubleType",
            CqlType::Duration => "DurationType",
            CqlType::Float => "FloatType",
            CqlType::Inet => "InetAddressType",
            CqlType::Int => "Int32Type",
            CqlType::Smallint => "ShortType",
            CqlType::Text => "UTF8Type",
            CqlType::Time => "TimeType",
            CqlType::Timestamp => "TimestampType",
            CqlType::Timeuuid => "TimeUUIDType",
            CqlType::Tinyint => "ByteType",
            CqlType::Uuid => "UUIDType",
            CqlType::Varint => "IntegerType",
            CqlType::Date => "SimpleDateType",
            CqlType::List { element, frozen } => {
                return frozen_marshal(
                    *frozen,
                    format!("{PACKAGE}ListType({})", element.marshal_class()),
                );
            }
            CqlType::Set { element, frozen } => {
                return frozen_marshal(
                    *frozen,
                    format!("{PACKAGE}SetType({})", element.marshal_class()),
                );
            }
            CqlType::Map { key, value, frozen } => {
                return frozen_marshal(
                    *frozen,
                    format!(
                        "{PACKAGE}MapType({},{})",
                        key.marshal_class(),
                        value.marshal_class()
                    ),
                );
            }
            CqlType::Tuple(elements) => {
                let elements: Vec<String> = elements.iter().map(CqlType::marshal_class).collect();
                return format!("{PACKAGE}TupleType({})", elements.join(","));
            }
            CqlType::Vector { element, dimension } => {
                // Cassandra's own spelling, spaces around the comma included.
                return format!(
                    "{PACKAGE}VectorType({} , {dimension})",
                    element.marshal_class()
                );
            }
        };
        format!("{PACKAGE}{simple}")
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
            "vector" => {
                self.expect(b'<')?;
                let element = self.parse_type()?.frozen();
                self.expect(b',')?;
                self.skip_spaces();
                let start = self.position;
                if self.text.get(self.position) == Some(&b'-') {
                    self.position += 1;
                }
                while self.text.get(self.position).is_some_and(u8::is_ascii_digit) {
                    self.position += 1;
                }
                let digits = String::from_utf8_lossy(&self.text[start..self.position]).into_owned();
                let dimension: i64 = digits
                    .parse()
                    .map_err(|_| format!("Expected the dimension of a vector, got '{digits}'"))?;
                self.expect(b'>')?;
                if dimension <= 0 {
                    return Err(format!(
                        "vectors may only have positive dimensions; given {dimension}"
                    ));
                }
                let dimension = u32::try_from(dimension)
                    .ok()
                    .filter(|d| *d <= i32::MAX as u32)
                    .ok_or_else(|| {
                        format!("The dimension of a vector is too large: {dimension}")
                    })?;
                if element == CqlType::Counter {
                    return Err("vectors may not contain counters".into());
                }
                Ok(CqlType::Vector {
                    element: Box::new(element),
                    dimension,
                })
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
            CqlType::Vector { element, dimension } => {
                return write!(f, "vector<{element}, {dimension}>");
            }
        };
        f.write_str(native)
    }
}

fn frozen_marshal(frozen: bool, class: String) -> String {
    if frozen {
        format!("org.apache.cassandra.db.marshal.FrozenType({class})")
    } else {
        class
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
            "vector<float, 3>",
            "vector<frozen<list<int>>, 2>",
        ] {
            assert_eq!(CqlType::parse(text).unwrap().to_string(), text);
        }
        assert_eq!(CqlType::parse("varchar").unwrap(), CqlType::Text);
        assert!(CqlType::parse("list<list<int>>").is_err());
        assert!(CqlType::parse("nosuchtype").is_err());
        assert_eq!(
            CqlType::parse("vector<float, 0>").unwrap_err(),
            "vectors may only have positive dimensions; given 0"
        );
        assert!(CqlType::parse("vector<float>").is_err());
        assert!(CqlType::parse("vector<counter, 2>").is_err());
    }

    #[test]
    fn vectors_of_fixed_width_elements_have_a_fixed_width() {
        let floats = CqlType::parse("vector<float, 3>").unwrap();
        assert_eq!(floats.fixed_width(), Some(12));
        assert_eq!(
            CqlType::parse("vector<text, 3>").unwrap().fixed_width(),
            None
        );
        assert_eq!(
            floats.marshal_class(),
            "org.apache.cassandra.db.marshal.VectorType(org.apache.cassandra.db.marshal.FloatType , 3)"
        );
    }
}
