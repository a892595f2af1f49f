//! CQL's type system: the native types, collections, tuples, vectors and user-defined
//! types, with Cassandra's textual form (`map<text, frozen<list<int>>>`), which is what
//! `system_schema.columns.type` shows and what `CREATE TABLE` accepts.
//!
//! A user-defined type appears in two forms. A statement names it ([`CqlType::UdtName`]:
//! `frozen<address>` as parsed, before anything knows its fields); schema statements look
//! the name up in the keyspace and store the definition itself ([`CqlType::Udt`] with a
//! [`UserType`]), so a table's columns carry every field they need to encode, decode and
//! describe their values. `ALTER TYPE` rewrites every column that embeds the type.

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
    /// A user-defined type with its definition. Frozen, a value is one cell laid out like a
    /// tuple of its fields; not frozen, each field is a cell of its own (the cell path is
    /// the field's position, [`UserType::field_path`]), so `SET addr.zip = ?` writes one
    /// field.
    Udt(Box<UserType>),
    /// A user-defined type as a statement names it, before schema statements resolve it
    /// against the keyspace's types into [`CqlType::Udt`]. Never stored in a table.
    UdtName {
        keyspace: Option<String>,
        name: String,
        frozen: bool,
    },
}

/// A user-defined type's definition (`CREATE TYPE keyspace.name (field type, ...)`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct UserType {
    pub keyspace: String,
    pub name: String,
    /// Fields in declaration order; a field keeps its position for life (ALTER TYPE only
    /// adds at the end or renames), which is what a non-frozen value's cells are keyed by.
    pub fields: Vec<(String, CqlType)>,
    pub frozen: bool,
}

impl UserType {
    /// The position of the field called `name`.
    pub fn field_index(&self, name: &str) -> Option<usize> {
        self.fields.iter().position(|(field, _)| field == name)
    }

    /// The cell path of field `index` in a non-frozen value: its position as a big-endian
    /// 16-bit number, as Cassandra keys the cells of a non-frozen UDT.
    pub fn field_path(index: usize) -> Vec<u8> {
        (index as u16).to_be_bytes().to_vec()
    }

    /// The field position a cell path names (see [`UserType::field_path`]).
    pub fn field_of_path(path: &[u8]) -> Option<usize> {
        <[u8; 2]>::try_from(path)
            .ok()
            .map(|bytes| u16::from_be_bytes(bytes) as usize)
    }

    /// The field types, in order.
    pub fn field_types(&self) -> impl Iterator<Item = &CqlType> {
        self.fields.iter().map(|(_, cql_type)| cql_type)
    }

    /// True when this type (or a type nested in it) is the type `keyspace.name`.
    pub fn mentions(&self, keyspace: &str, name: &str) -> bool {
        (self.keyspace == keyspace && self.name == name)
            || self.field_types().any(|t| t.mentions_udt(keyspace, name))
    }
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

    /// True for list, set, map and user-defined types that are not frozen: stored as one
    /// cell per element (or field).
    pub fn is_multi_cell(&self) -> bool {
        match self {
            CqlType::List { frozen, .. }
            | CqlType::Set { frozen, .. }
            | CqlType::Map { frozen, .. }
            | CqlType::UdtName { frozen, .. } => !frozen,
            CqlType::Udt(user_type) => !user_type.frozen,
            _ => false,
        }
    }

    /// The definition, for a resolved user-defined type.
    pub fn as_udt(&self) -> Option<&UserType> {
        match self {
            CqlType::Udt(user_type) => Some(user_type),
            _ => None,
        }
    }

    /// True when this type is, or contains, the user-defined type `keyspace.name`.
    pub fn mentions_udt(&self, keyspace: &str, name: &str) -> bool {
        match self {
            CqlType::Udt(user_type) => user_type.mentions(keyspace, name),
            CqlType::List { element, .. }
            | CqlType::Set { element, .. }
            | CqlType::Vector { element, .. } => element.mentions_udt(keyspace, name),
            CqlType::Map { key, value, .. } => {
                key.mentions_udt(keyspace, name) || value.mentions_udt(keyspace, name)
            }
            CqlType::Tuple(elements) => elements.iter().any(|e| e.mentions_udt(keyspace, name)),
            _ => false,
        }
    }

    /// The same type with every user-defined type in it (at any depth) mapped by `resolve`
    /// — how schema statements resolve names and how ALTER TYPE replaces a definition.
    pub fn map_udts<E>(
        &self,
        resolve: &mut impl FnMut(&CqlType) -> Result<Option<CqlType>, E>,
    ) -> Result<CqlType, E> {
        if let Some(replaced) = resolve(self)? {
            return Ok(replaced);
        }
        let mut boxed = |inner: &CqlType| inner.map_udts(resolve).map(Box::new);
        Ok(match self {
            CqlType::List { element, frozen } => CqlType::List {
                element: boxed(element)?,
                frozen: *frozen,
            },
            CqlType::Set { element, frozen } => CqlType::Set {
                element: boxed(element)?,
                frozen: *frozen,
            },
            CqlType::Map { key, value, frozen } => CqlType::Map {
                key: boxed(key)?,
                value: boxed(value)?,
                frozen: *frozen,
            },
            CqlType::Vector { element, dimension } => CqlType::Vector {
                element: boxed(element)?,
                dimension: *dimension,
            },
            CqlType::Tuple(elements) => CqlType::Tuple(
                elements
                    .iter()
                    .map(|e| e.map_udts(resolve))
                    .collect::<Result<_, _>>()?,
            ),
            CqlType::Udt(user_type) => CqlType::Udt(Box::new(UserType {
                fields: user_type
                    .fields
                    .iter()
                    .map(|(name, t)| Ok((name.clone(), t.map_udts(resolve)?)))
                    .collect::<Result<_, E>>()?,
                ..(**user_type).clone()
            })),
            other => other.clone(),
        })
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
            CqlType::Udt(mut user_type) => {
                user_type.frozen = true;
                CqlType::Udt(user_type)
            }
            CqlType::UdtName { keyspace, name, .. } => CqlType::UdtName {
                keyspace,
                name,
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
            CqlType::Udt(user_type) => {
                let mut class = format!(
                    "{PACKAGE}UserType({},{}",
                    user_type.keyspace,
                    hex(user_type.name.as_bytes())
                );
                for (field, field_type) in &user_type.fields {
                    class.push_str(&format!(
                        ",{}:{}",
                        hex(field.as_bytes()),
                        field_type.marshal_class()
                    ));
                }
                class.push(')');
                return frozen_marshal(user_type.frozen, class);
            }
            // Never on the wire: schema statements resolve names first.
            CqlType::UdtName { .. } => "BytesType",
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

/// Collections hold frozen values only, with Cassandra's messages.
fn check_collection_element(collection: &str, elements: &[&CqlType]) -> Result<(), String> {
    for element in elements {
        if matches!(element, CqlType::UdtName { frozen: false, .. })
            || element.as_udt().is_some_and(|udt| !udt.frozen)
        {
            let inner: Vec<String> = elements.iter().map(|e| e.to_string()).collect();
            return Err(format!(
                "Non-frozen UDTs are not allowed inside collections: {collection}<{}>",
                inner.join(", ")
            ));
        }
        if element.is_multi_cell() {
            return Err("Non-frozen collections are not allowed inside collections".into());
        }
    }
    Ok(())
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
        let written = self.word();
        let name = written.to_ascii_lowercase();
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
                check_collection_element(&name, &[&element])?;
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
                check_collection_element("map", &[&key, &value])?;
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
            other => match CqlType::native_from_name(other) {
                Some(native) => Ok(native),
                None => {
                    // A user-defined type: `name` or `keyspace.name`.
                    let (keyspace, name) = if self.peek() == Some(b'.') {
                        self.position += 1;
                        let name = self.word();
                        if name.is_empty() {
                            return Err(format!("Expected a type name after '{written}.'"));
                        }
                        (Some(written), name)
                    } else {
                        (None, written)
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
            CqlType::Udt(user_type) => {
                let name = quote_if_needed(&user_type.name);
                return wrap_frozen(f, user_type.frozen, |f| f.write_str(&name));
            }
            CqlType::UdtName {
                keyspace,
                name,
                frozen,
            } => {
                let qualified = match keyspace {
                    Some(keyspace) => format!("{keyspace}.{name}"),
                    None => name.clone(),
                };
                return wrap_frozen(f, *frozen, |f| f.write_str(&qualified));
            }
        };
        f.write_str(native)
    }
}

/// A name as CQL must write it: double-quoted unless it is lower-case alphanumeric (the
/// one rule for types, DESCRIBE and messages).
pub fn quote_if_needed(name: &str) -> String {
    let plain = name.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if plain {
        name.to_string()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
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
mod tests;
