//! Turning CQL terms into typed values: literals checked against the receiving column's
//! type, bind markers decoded from the client's bytes, and the built-in functions that
//! may appear as terms (`now()`, `uuid()`, `toTimestamp(now())`, `fromJson('...')`, ...).
//! [`json`] writes values as JSON and reads them back.

pub mod json;
mod literals;

pub use literals::{
    civil_from_days, days_from_civil, literal_value, parse_duration, parse_timestamp,
};

use crate::CqlError;
use shoal_cql::ast::{BindMarker, Literal, Term};
use shoal_cql::request::BoundValue;
use shoal_model::value::DATE_EPOCH_OFFSET;
use shoal_model::{CqlType, Value};
use std::borrow::Cow;

/// The outcome of evaluating a term.
#[derive(Debug, Clone, PartialEq)]
pub enum Bound {
    Value(Value),
    Null,
    /// An unset bind value: leave the column as it is.
    Unset,
}

impl Bound {
    pub fn into_value(self, receiver: &str) -> Result<Value, CqlError> {
        match self {
            Bound::Value(value) => Ok(value),
            Bound::Null => Err(CqlError::invalid(format!(
                "Invalid null value for {receiver}"
            ))),
            Bound::Unset => Err(CqlError::invalid(format!(
                "Invalid unset value for {receiver}"
            ))),
        }
    }
}

/// The outcome of evaluating a term, in its stored form (what [`Value::serialize`] gives).
#[derive(Debug)]
pub enum SerializedBound<'a> {
    /// Borrowed when the client's bytes could be stored as they came.
    Value(Cow<'a, [u8]>),
    Null,
    Unset,
}

impl From<Bound> for SerializedBound<'_> {
    fn from(bound: Bound) -> Self {
        match bound {
            Bound::Value(value) => SerializedBound::Value(Cow::Owned(value.serialize())),
            Bound::Null => SerializedBound::Null,
            Bound::Unset => SerializedBound::Unset,
        }
    }
}

/// The client's bound values for one statement.
#[derive(Debug, Clone, Copy)]
pub struct Bindings<'a> {
    pub values: &'a [BoundValue],
    pub names: Option<&'a [String]>,
}

impl<'a> Bindings<'a> {
    pub const NONE: Bindings<'static> = Bindings {
        values: &[],
        names: None,
    };

    fn get(&self, marker: &BindMarker) -> Result<&'a BoundValue, CqlError> {
        if let (Some(names), Some(name)) = (self.names, &marker.name) {
            let index = names
                .iter()
                .position(|n| n.eq_ignore_ascii_case(name))
                .ok_or_else(|| {
                    CqlError::invalid(format!("No value was bound for the bind marker :{name}"))
                })?;
            return Ok(&self.values[index]);
        }
        self.values.get(marker.index).ok_or_else(|| {
            CqlError::invalid(format!(
                "There were {} markers(?) in CQL but {} bound variables",
                marker.index + 1,
                self.values.len()
            ))
        })
    }
}

/// A term typed against its receiver when a statement is planned: evaluated then if it is
/// a constant (no bind marker, no clock or random function), which also reports a bad
/// literal at PREPARE as Cassandra does; otherwise evaluated against each execution's
/// bindings.
#[derive(Debug, Clone)]
pub struct TypedTerm {
    pub cql_type: CqlType,
    pub receiver: String,
    source: TermSource,
}

#[derive(Debug, Clone)]
enum TermSource {
    Constant(Bound),
    Term(Term),
}

/// True when `term` evaluates the same way every time.
fn is_constant(term: &Term) -> bool {
    match term {
        Term::Literal(_) => true,
        Term::Negative(inner) => is_constant(inner),
        Term::Bind(_) => false,
        Term::List(elements) | Term::Set(elements) | Term::Tuple(elements) => {
            elements.iter().all(is_constant)
        }
        Term::Map(entries) => entries
            .iter()
            .all(|(k, v)| is_constant(k) && is_constant(v)),
        Term::UserType(fields) => fields.iter().all(|(_, v)| is_constant(v)),
        Term::Cast { term, .. } => is_constant(term),
        Term::Function { name, arguments } => {
            let name = name.to_ascii_lowercase();
            matches!(
                name.as_str(),
                "totimestamp"
                    | "dateof"
                    | "tounixtimestamp"
                    | "unixtimestampof"
                    | "mintimeuuid"
                    | "maxtimeuuid"
                    | "fromjson"
            ) && arguments.iter().all(is_constant)
        }
    }
}

impl TypedTerm {
    /// Types `term` for `receiver` of type `cql_type`, folding constants.
    pub fn new(term: &Term, cql_type: &CqlType, receiver: &str) -> Result<TypedTerm, CqlError> {
        let source = if is_constant(term) {
            TermSource::Constant(evaluate(term, cql_type, Bindings::NONE, receiver)?)
        } else {
            TermSource::Term(term.clone())
        };
        Ok(TypedTerm {
            cql_type: cql_type.clone(),
            receiver: receiver.to_string(),
            source,
        })
    }

    /// The term's value for one execution.
    pub fn evaluate(&self, bindings: Bindings<'_>) -> Result<Bound, CqlError> {
        match &self.source {
            TermSource::Constant(bound) => Ok(bound.clone()),
            TermSource::Term(term) => evaluate(term, &self.cql_type, bindings, &self.receiver),
        }
    }

    /// [`TypedTerm::evaluate`], serialized. A value bound for a scalar type whose
    /// serialized form is canonical is checked and borrowed as the client sent it, without
    /// building a [`Value`] to serialize it back: the write path's common case.
    pub fn evaluate_serialized<'a>(
        &self,
        bindings: Bindings<'a>,
    ) -> Result<SerializedBound<'a>, CqlError> {
        if let TermSource::Term(Term::Bind(marker)) = &self.source {
            if let BoundValue::Bytes(bytes) = bindings.get(marker)? {
                if Value::is_canonical_serialized(&self.cql_type, bytes) {
                    return Ok(SerializedBound::Value(Cow::Borrowed(bytes)));
                }
            }
        }
        self.evaluate(bindings).map(SerializedBound::from)
    }

    /// The term's value, which must be neither null nor unset (keys, bounds, filters).
    pub fn value(&self, bindings: Bindings<'_>) -> Result<Value, CqlError> {
        match self.evaluate(bindings)? {
            Bound::Value(value) => Ok(value),
            Bound::Null => Err(CqlError::invalid(format!(
                "Invalid null value in condition for column {}",
                self.receiver
            ))),
            Bound::Unset => Err(CqlError::invalid(format!(
                "Invalid unset value for column {}",
                self.receiver
            ))),
        }
    }
}

pub(crate) fn type_error(receiver: &str, cql_type: &CqlType, literal: &str) -> CqlError {
    CqlError::invalid(format!(
        "Invalid {literal} constant for {receiver} of type {cql_type}"
    ))
}

/// Evaluates `term` for a receiver (a column, an element, a LIMIT...) of type `cql_type`.
pub fn evaluate(
    term: &Term,
    cql_type: &CqlType,
    bindings: Bindings<'_>,
    receiver: &str,
) -> Result<Bound, CqlError> {
    match term {
        Term::Bind(marker) => match bindings.get(marker)? {
            BoundValue::Null => Ok(Bound::Null),
            BoundValue::Unset => Ok(Bound::Unset),
            BoundValue::Bytes(bytes) => {
                if bytes.is_empty()
                    && !matches!(cql_type, CqlType::Text | CqlType::Ascii | CqlType::Blob)
                {
                    // An empty value of a fixed-width type: Cassandra's "empty" — treat as null.
                    return Ok(Bound::Null);
                }
                Value::deserialize(cql_type, bytes)
                    .map(Bound::Value)
                    .map_err(|e| {
                        CqlError::invalid(format!("Invalid value for {receiver}: {}", e.0))
                    })
            }
        },
        Term::Literal(Literal::Null) => Ok(Bound::Null),
        Term::Literal(literal) => {
            literal_value(literal, cql_type, receiver, false).map(Bound::Value)
        }
        Term::Negative(inner) => match inner.as_ref() {
            Term::Literal(literal) => {
                literal_value(literal, cql_type, receiver, true).map(Bound::Value)
            }
            _ => Err(CqlError::invalid(format!(
                "Invalid negation for {receiver}"
            ))),
        },
        Term::Cast { term, .. } => evaluate(term, cql_type, bindings, receiver),
        Term::List(elements) => match cql_type {
            CqlType::List { element, .. } => Ok(Bound::Value(Value::List(evaluate_elements(
                elements, element, bindings, receiver,
            )?))),
            CqlType::Vector { element, dimension } => {
                let values = evaluate_elements(elements, element, bindings, receiver)?;
                check_dimension(&values, *dimension, cql_type, receiver)?;
                Ok(Bound::Value(Value::Vector(values)))
            }
            CqlType::Set { element, .. } => {
                let mut values = evaluate_elements(elements, element, bindings, receiver)?;
                sort_dedup(&mut values);
                Ok(Bound::Value(Value::Set(values)))
            }
            _ => Err(type_error(receiver, cql_type, "list literal")),
        },
        Term::Set(elements) => match cql_type {
            CqlType::Set { element, .. } => {
                let mut values = evaluate_elements(elements, element, bindings, receiver)?;
                sort_dedup(&mut values);
                Ok(Bound::Value(Value::Set(values)))
            }
            _ => Err(type_error(receiver, cql_type, "set literal")),
        },
        Term::Map(entries) => match cql_type {
            CqlType::Map { key, value, .. } => {
                let mut evaluated = Vec::with_capacity(entries.len());
                for (k, v) in entries {
                    let key_value = evaluate(k, key, bindings, receiver)?.into_value(receiver)?;
                    let value_value =
                        evaluate(v, value, bindings, receiver)?.into_value(receiver)?;
                    evaluated.push((key_value, value_value));
                }
                sort_dedup_keys(&mut evaluated);
                Ok(Bound::Value(Value::Map(evaluated)))
            }
            // `{}` is also the empty set.
            CqlType::Set { .. } if entries.is_empty() => Ok(Bound::Value(Value::Set(Vec::new()))),
            _ => Err(type_error(receiver, cql_type, "map literal")),
        },
        // A tuple literal also gives a user-defined type's fields by position.
        Term::Tuple(elements) => {
            let types: Vec<&CqlType> = match cql_type {
                CqlType::Tuple(types) => types.iter().collect(),
                CqlType::Udt(user_type) => user_type.field_types().collect(),
                _ => return Err(type_error(receiver, cql_type, "tuple literal")),
            };
            if elements.len() > types.len() {
                return Err(CqlError::invalid(format!(
                    "Invalid tuple literal for {receiver}: too many elements. Type {cql_type} expects {} but got {}",
                    types.len(),
                    elements.len()
                )));
            }
            let mut values = Vec::with_capacity(types.len());
            for (position, (element, element_type)) in elements.iter().zip(&types).enumerate() {
                let value = evaluate(element, element_type, bindings, receiver).map_err(|e| {
                    literal_mismatch(e, element, || {
                        format!(
                            "Invalid tuple literal for {receiver}: component {position} is not of type {element_type}"
                        )
                    })
                })?;
                values.push(match value {
                    Bound::Value(v) => Some(v),
                    _ => None,
                });
            }
            Ok(Bound::Value(Value::Tuple(values)))
        }
        Term::UserType(fields) => match cql_type {
            CqlType::Udt(user_type) => Ok(Bound::Value(Value::Tuple(evaluate_fields(
                fields, user_type, bindings, receiver,
            )?))),
            _ => Err(type_error(receiver, cql_type, "user type literal")),
        },
        Term::Function { name, arguments } => {
            evaluate_function(name, arguments, cql_type, bindings, receiver)
        }
    }
}

/// A literal inside a tuple or user-defined type literal that does not fit its type is
/// reported as Cassandra reports it, naming the component; errors of bound values pass.
fn literal_mismatch(error: CqlError, term: &Term, message: impl FnOnce() -> String) -> CqlError {
    match term {
        Term::Literal(_) | Term::Negative(_) | Term::List(_) | Term::Set(_) | Term::Map(_) => {
            CqlError::invalid(message())
        }
        _ => error,
    }
}

/// A user-defined type literal's value: every field of the type in order, the ones the
/// literal leaves out null.
fn evaluate_fields(
    fields: &[(String, Term)],
    user_type: &shoal_model::types::UserType,
    bindings: Bindings<'_>,
    receiver: &str,
) -> Result<Vec<Option<Value>>, CqlError> {
    let mut values = vec![None; user_type.fields.len()];
    for (field, term) in fields {
        let index = user_type.field_index(field).ok_or_else(|| {
            CqlError::invalid(format!(
                "Unknown field '{field}' in value of user defined type {}",
                user_type.name
            ))
        })?;
        let field_type = &user_type.fields[index].1;
        let field_receiver = format!("{receiver}.{field}");
        let value = evaluate(term, field_type, bindings, &field_receiver).map_err(|e| {
            literal_mismatch(e, term, || {
                format!(
                    "Invalid user type literal for {receiver}: field {field} is not of type {field_type}"
                )
            })
        })?;
        values[index] = match value {
            Bound::Value(value) => Some(value),
            Bound::Null => None,
            Bound::Unset => {
                return Err(CqlError::invalid(format!(
                    "Invalid unset value for field '{field}' of user defined type {}",
                    user_type.name
                )))
            }
        };
    }
    Ok(values)
}

/// A vector literal must have exactly the type's dimension.
pub(crate) fn check_dimension(
    values: &[Value],
    dimension: u32,
    cql_type: &CqlType,
    receiver: &str,
) -> Result<(), CqlError> {
    if values.len() != dimension as usize {
        return Err(CqlError::invalid(format!(
            "Invalid vector literal for {receiver} of type {cql_type}; expected {dimension} elements, but given {}",
            values.len()
        )));
    }
    Ok(())
}

/// A set's elements in order, each once (the first of equal ones is kept).
pub(super) fn sort_dedup(values: &mut Vec<Value>) {
    values.sort_by(|a, b| a.compare(b));
    values.dedup_by(|a, b| a.compare(b).is_eq());
}

/// A map's entries in key order, each key once (the first entry of a key is kept).
pub(super) fn sort_dedup_keys(entries: &mut Vec<(Value, Value)>) {
    entries.sort_by(|a, b| a.0.compare(&b.0));
    entries.dedup_by(|a, b| a.0.compare(&b.0).is_eq());
}

fn evaluate_elements(
    elements: &[Term],
    cql_type: &CqlType,
    bindings: Bindings<'_>,
    receiver: &str,
) -> Result<Vec<Value>, CqlError> {
    elements
        .iter()
        .map(|element| {
            evaluate(element, cql_type, bindings, receiver)?
                .into_value(receiver)
                .map_err(|_| CqlError::invalid("null is not supported inside collections"))
        })
        .collect()
}

fn evaluate_function(
    name: &str,
    arguments: &[Term],
    cql_type: &CqlType,
    bindings: Bindings<'_>,
    receiver: &str,
) -> Result<Bound, CqlError> {
    let name = name.to_ascii_lowercase();
    let now_millis = shoal_model::timestamp::now_micros() / 1000;
    let value = match (name.as_str(), arguments) {
        ("now", []) | ("currenttimeuuid", []) => Value::Timeuuid(new_timeuuid()),
        ("uuid", []) => Value::Uuid(*uuid::Uuid::new_v4().as_bytes()),
        ("currenttimestamp", []) => Value::Timestamp(now_millis),
        ("currentdate", []) => Value::Date(date_from_days(now_millis.div_euclid(86_400_000))),
        ("currenttime", []) => Value::Time(now_millis.rem_euclid(86_400_000) * 1_000_000),
        ("mintimeuuid", [argument]) | ("maxtimeuuid", [argument]) => {
            match evaluate(argument, &CqlType::Timestamp, bindings, receiver)? {
                Bound::Value(Value::Timestamp(millis)) => {
                    Value::Timeuuid(bound_timeuuid(millis, name == "maxtimeuuid"))
                }
                _ => return Ok(Bound::Null),
            }
        }
        ("fromjson", [argument]) => {
            return match evaluate(argument, &CqlType::Text, bindings, receiver)? {
                Bound::Value(Value::Text(text)) => {
                    // Like Cassandra: a value the function cannot read is its failure.
                    let failed = |error: CqlError| {
                        CqlError::function_failure("fromjson", &["text"], error.message)
                    };
                    let parsed = json::parse(&text).map_err(failed)?;
                    match json::from_json(&parsed, cql_type, receiver).map_err(failed)? {
                        Some(value) => Ok(Bound::Value(value)),
                        None => Ok(Bound::Null),
                    }
                }
                other => Ok(other),
            };
        }
        ("token", _) => {
            return Err(CqlError::invalid(
                "token() is only valid on the left of a WHERE relation",
            ));
        }
        // The native functions of `functions` (toTimestamp(now()), intAsBlob(?), abs(-3)…).
        (_, [argument]) if crate::functions::is_scalar(&name) => {
            let argument_type = crate::functions::term_argument_type(&name, cql_type);
            let call = crate::functions::resolve(&name, &argument_type)?;
            let argument = match evaluate(argument, &argument_type, bindings, receiver)? {
                Bound::Value(value) => Some(value),
                _ => None,
            };
            return match call.apply(argument)? {
                Some(value) if call.return_type == *cql_type => Ok(Bound::Value(value)),
                Some(value) => coerce_function_result(value, cql_type, receiver).map(Bound::Value),
                None => Ok(Bound::Null),
            };
        }
        _ => {
            return Err(CqlError::invalid(format!(
                "Unknown function '{name}' called with {} arguments",
                arguments.len()
            )))
        }
    };
    coerce_function_result(value, cql_type, receiver).map(Bound::Value)
}

fn coerce_function_result(
    value: Value,
    cql_type: &CqlType,
    receiver: &str,
) -> Result<Value, CqlError> {
    let matches = matches!(
        (&value, cql_type),
        (Value::Timeuuid(_), CqlType::Timeuuid)
            | (Value::Uuid(_), CqlType::Uuid)
            | (Value::Timestamp(_), CqlType::Timestamp)
            | (Value::Date(_), CqlType::Date)
            | (Value::Time(_), CqlType::Time)
            | (Value::Bigint(_), CqlType::Bigint)
    );
    match (value, cql_type) {
        (v, _) if matches => Ok(v),
        (Value::Timeuuid(u), CqlType::Uuid) => Ok(Value::Uuid(u)),
        (v, _) => Err(CqlError::invalid(format!(
            "Type error: cannot assign result of function of type {} to {receiver} of type {cql_type}",
            value_type_name(&v)
        ))),
    }
}

fn value_type_name(value: &Value) -> &'static str {
    match value {
        Value::Timeuuid(_) => "timeuuid",
        Value::Uuid(_) => "uuid",
        Value::Timestamp(_) => "timestamp",
        Value::Date(_) => "date",
        Value::Time(_) => "time",
        Value::Bigint(_) => "bigint",
        _ => "value",
    }
}

/// A version-1 UUID for now, unique within this process.
pub fn new_timeuuid() -> [u8; 16] {
    timeuuid_at(shoal_model::timestamp::now_micros())
}

/// A version-1 UUID for `micros` since the epoch (or just after, if this process already
/// made one for a later time), unique within this process.
pub fn timeuuid_at(micros: i64) -> [u8; 16] {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST_TICKS: AtomicU64 = AtomicU64::new(0);
    static NODE: std::sync::OnceLock<[u8; 8]> = std::sync::OnceLock::new();
    // 100 ns ticks since 1582-10-15.
    let now = (micros.max(0) as u64) * 10 + 0x01B2_1DD2_1381_4000;
    let mut last = LAST_TICKS.load(Ordering::Relaxed);
    let ticks = loop {
        let next = now.max(last + 1);
        match LAST_TICKS.compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => break next,
            Err(actual) => last = actual,
        }
    };
    let node = NODE.get_or_init(|| {
        let random = uuid::Uuid::new_v4();
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&random.as_bytes()[..8]);
        bytes[0] = (bytes[0] & 0x3f) | 0x80; // variant
        bytes
    });
    timeuuid_from_ticks(ticks, node)
}

fn timeuuid_from_ticks(ticks: u64, clock_and_node: &[u8; 8]) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    bytes[0..4].copy_from_slice(&((ticks & 0xffff_ffff) as u32).to_be_bytes());
    bytes[4..6].copy_from_slice(&(((ticks >> 32) & 0xffff) as u16).to_be_bytes());
    bytes[6..8].copy_from_slice(&((((ticks >> 48) & 0x0fff) as u16) | 0x1000).to_be_bytes());
    bytes[8..16].copy_from_slice(clock_and_node);
    bytes
}

/// The smallest or largest timeuuid of a millisecond (minTimeuuid/maxTimeuuid).
fn bound_timeuuid(millis: i64, maximum: bool) -> [u8; 16] {
    let ticks = (millis as u64)
        .wrapping_mul(10_000)
        .wrapping_add(0x01B2_1DD2_1381_4000);
    if maximum {
        timeuuid_from_ticks(
            ticks + 9_999,
            &[0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f],
        )
    } else {
        timeuuid_from_ticks(ticks, &[0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80])
    }
}

/// Milliseconds since the epoch embedded in a version-1 UUID.
pub fn timeuuid_millis(bytes: &[u8; 16]) -> i64 {
    let ticks = shoal_model::value::uuid_timestamp(bytes) as i64;
    (ticks - 0x01B2_1DD2_1381_4000) / 10_000
}

pub(crate) fn date_from_days(days: i64) -> u32 {
    (days + DATE_EPOCH_OFFSET as i64) as u32
}
