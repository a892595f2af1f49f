//! CQL values as JSON and back, as Cassandra writes and reads them (`SELECT JSON`,
//! `INSERT JSON`, `toJson()`, `fromJson()`).
//!
//! Writing: numbers and booleans are JSON numbers and booleans; text, uuids, inet
//! addresses, blobs (`"0x…"`), timestamps (`"2024-01-31 12:00:00.000Z"`), dates, times and
//! durations are JSON strings; lists, sets and tuples are arrays; maps are objects whose
//! keys are the keys' JSON written as a string (`{"1": "a"}` for `map<int, text>`).
//!
//! Reading is lenient the way Cassandra's is: a number may also come as a string
//! (`"42"`), a timestamp as milliseconds or any timestamp string CQL accepts, a boolean as
//! `"true"`, and a map key is read from its string as the key type's JSON.

use super::literals::{civil_from_days, parse_duration, parse_timestamp};
use super::{literal_value, sort_dedup, sort_dedup_keys};
use crate::CqlError;
use serde_json::Value as Json;
use shoal_cql::ast::Literal;
use shoal_model::value::DATE_EPOCH_OFFSET;
use shoal_model::{CqlType, Value};
use std::fmt::Write;

/// `value` as Cassandra's JSON text.
pub fn to_json(value: &Value) -> String {
    let mut out = String::new();
    write_json(&mut out, value, None);
    out
}

/// `value` of type `cql_type` as JSON text, `null` for a missing value. The type tells a
/// user-defined type's value (an object by field name) from a tuple (an array).
pub fn optional_to_json(value: Option<&Value>, cql_type: &CqlType) -> String {
    let mut out = String::new();
    write_optional(&mut out, value, Some(cql_type));
    out
}

fn write_optional(out: &mut String, value: Option<&Value>, cql_type: Option<&CqlType>) {
    match value {
        Some(value) => write_json(out, value, cql_type),
        None => out.push_str("null"),
    }
}

/// A name as a JSON object key: quoted for CQL when it needs quotes, as Cassandra does.
pub fn json_key(name: &str) -> String {
    let needs_quotes = name.chars().any(|c| c.is_ascii_uppercase());
    let key = if needs_quotes {
        format!("\"{name}\"")
    } else {
        name.to_string()
    };
    Json::String(key).to_string()
}

fn write_string(out: &mut String, text: &str) {
    out.push_str(&Json::String(text.to_string()).to_string());
}

fn write_json(out: &mut String, value: &Value, cql_type: Option<&CqlType>) {
    let element_type = match cql_type {
        Some(
            CqlType::List { element, .. }
            | CqlType::Set { element, .. }
            | CqlType::Vector { element, .. },
        ) => Some(element.as_ref()),
        _ => None,
    };
    match value {
        Value::Ascii(text) | Value::Text(text) => write_string(out, text),
        Value::Bigint(n) | Value::Counter(n) => {
            let _ = write!(out, "{n}");
        }
        Value::Int(n) => {
            let _ = write!(out, "{n}");
        }
        Value::Smallint(n) => {
            let _ = write!(out, "{n}");
        }
        Value::Tinyint(n) => {
            let _ = write!(out, "{n}");
        }
        Value::Varint(n) => {
            let _ = write!(out, "{n}");
        }
        Value::Decimal { unscaled, scale } => out.push_str(&decimal_text(unscaled, *scale)),
        Value::Double(n) => write_float(out, *n, n.to_string(), format!("{n:e}")),
        Value::Float(n) => write_float(out, f64::from(*n), n.to_string(), format!("{n:e}")),
        Value::Boolean(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Blob(bytes) => {
            out.push_str("\"0x");
            for byte in bytes {
                let _ = write!(out, "{byte:02x}");
            }
            out.push('"');
        }
        Value::Uuid(bytes) | Value::Timeuuid(bytes) => {
            let _ = write!(out, "\"{}\"", uuid::Uuid::from_bytes(*bytes));
        }
        Value::Inet(address) => {
            let _ = write!(out, "\"{address}\"");
        }
        Value::Timestamp(millis) => {
            let _ = write!(out, "\"{}\"", timestamp_text(*millis, ' '));
        }
        Value::Date(days) => {
            let (year, month, day) = civil_from_days(*days as i64 - DATE_EPOCH_OFFSET as i64);
            let _ = write!(out, "\"{year:04}-{month:02}-{day:02}\"");
        }
        Value::Time(nanos) => {
            let seconds = nanos / 1_000_000_000;
            let _ = write!(
                out,
                "\"{:02}:{:02}:{:02}.{:09}\"",
                seconds / 3600,
                seconds / 60 % 60,
                seconds % 60,
                nanos % 1_000_000_000
            );
        }
        Value::Duration {
            months,
            days,
            nanoseconds,
        } => {
            let _ = write!(out, "\"{}\"", duration_text(*months, *days, *nanoseconds));
        }
        Value::List(elements) | Value::Set(elements) | Value::Vector(elements) => {
            out.push('[');
            for (i, element) in elements.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_json(out, element, element_type);
            }
            out.push(']');
        }
        Value::Map(entries) => {
            let (key_type, value_type) = match cql_type {
                Some(CqlType::Map { key, value, .. }) => (Some(key.as_ref()), Some(value.as_ref())),
                _ => (None, None),
            };
            out.push('{');
            for (i, (key, value)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                let mut key_json = String::new();
                write_json(&mut key_json, key, key_type);
                if key_json.starts_with('"') {
                    out.push_str(&key_json);
                } else {
                    write_string(out, &key_json);
                }
                out.push_str(": ");
                write_json(out, value, value_type);
            }
            out.push('}');
        }
        Value::Tuple(elements) => match cql_type {
            Some(CqlType::Udt(user_type)) => {
                out.push('{');
                for (i, (field, field_type)) in user_type.fields.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    out.push_str(&json_key(field));
                    out.push_str(": ");
                    let element = elements.get(i).and_then(Option::as_ref);
                    write_optional(out, element, Some(field_type));
                }
                out.push('}');
            }
            _ => {
                let types = match cql_type {
                    Some(CqlType::Tuple(types)) => types.as_slice(),
                    _ => &[],
                };
                out.push('[');
                for (i, element) in elements.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_optional(out, element.as_ref(), types.get(i));
                }
                out.push(']');
            }
        },
    }
}

/// Floating-point numbers as Java prints them: the shortest digits that read back the
/// same, `1.0` rather than `1`, and scientific notation (`1.0E8`, `1.5E-4`) outside
/// [10⁻³, 10⁷). `plain` and `scientific` are the number's shortest Rust forms (`{}` and
/// `{:e}`, taken from the float's own width). JSON has no NaN or infinity: they are
/// written as Cassandra writes them, unquoted.
fn write_float(out: &mut String, n: f64, plain: String, scientific: String) {
    let with_point = |digits: &str| {
        if digits.contains('.') {
            digits.to_string()
        } else {
            format!("{digits}.0")
        }
    };
    if n.is_nan() {
        out.push_str("NaN");
    } else if n.is_infinite() {
        out.push_str(if n > 0.0 { "Infinity" } else { "-Infinity" });
    } else if n == 0.0 || (1e-3..1e7).contains(&n.abs()) {
        out.push_str(&with_point(&plain));
    } else {
        let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
        let _ = write!(out, "{}E{exponent}", with_point(mantissa));
    }
}

fn decimal_text(unscaled: &num_bigint::BigInt, scale: i32) -> String {
    let digits = unscaled.magnitude().to_string();
    let sign = if unscaled.sign() == num_bigint::Sign::Minus {
        "-"
    } else {
        ""
    };
    if scale <= 0 {
        let zeros = "0".repeat(scale.unsigned_abs() as usize);
        return format!("{sign}{digits}{zeros}");
    }
    let scale = scale as usize;
    let padded = format!("{digits:0>width$}", width = scale + 1);
    let (whole, fraction) = padded.split_at(padded.len() - scale);
    format!("{sign}{whole}.{fraction}")
}

/// `yyyy-mm-dd hh:mm:ss.fffZ`, the form Cassandra gives timestamps in JSON.
/// (`CAST(… AS text)` uses `T` between date and time, ISO 8601's form).
pub(crate) fn timestamp_text(millis: i64, date_time_separator: char) -> String {
    let days = millis.div_euclid(86_400_000);
    let of_day = millis.rem_euclid(86_400_000);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}{date_time_separator}{:02}:{:02}:{:02}.{:03}Z",
        of_day / 3_600_000,
        of_day / 60_000 % 60,
        of_day / 1000 % 60,
        of_day % 1000
    )
}

/// A duration in CQL's unit form: `1y2mo3d4h5m6s7ms8us9ns`, `-1d`, `0s`.
fn duration_text(months: i32, days: i32, nanoseconds: i64) -> String {
    let negative = months < 0 || days < 0 || nanoseconds < 0;
    let mut out = String::from(if negative { "-" } else { "" });
    let months = months.unsigned_abs() as u64;
    let days = days.unsigned_abs() as u64;
    let mut nanos = nanoseconds.unsigned_abs();
    let mut part = |amount: u64, unit: &str| {
        if amount > 0 {
            let _ = write!(out, "{amount}{unit}");
        }
    };
    part(months / 12, "y");
    part(months % 12, "mo");
    part(days, "d");
    for (size, unit) in [
        (3_600_000_000_000u64, "h"),
        (60_000_000_000, "m"),
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
        (1_000, "us"),
        (1, "ns"),
    ] {
        part(nanos / size, unit);
        nanos %= size;
    }
    if out.is_empty() || out == "-" {
        out.push_str("0s");
    }
    out
}

/// Parses JSON text (`INSERT JSON`, `fromJson()`), with Cassandra's error for bad text.
pub fn parse(text: &str) -> Result<Json, CqlError> {
    serde_json::from_str(text)
        .map_err(|e| CqlError::invalid(format!("Could not decode JSON string '{text}': {e}")))
}

/// A JSON value read as a value of `cql_type` for `receiver`; `None` for JSON `null`.
pub fn from_json(
    json: &Json,
    cql_type: &CqlType,
    receiver: &str,
) -> Result<Option<Value>, CqlError> {
    let wrong = |expected: &str| {
        CqlError::invalid(format!(
            "Error decoding JSON value for {receiver}: Expected {expected} for {cql_type}, but got {json}"
        ))
    };
    if json.is_null() {
        return Ok(None);
    }
    let value = match cql_type {
        CqlType::Ascii | CqlType::Text => match json {
            Json::String(text) => {
                if matches!(cql_type, CqlType::Ascii) && !text.is_ascii() {
                    return Err(CqlError::invalid(format!(
                        "Error decoding JSON value for {receiver}: invalid ASCII characters in {json}"
                    )));
                }
                if matches!(cql_type, CqlType::Ascii) {
                    Value::Ascii(text.clone())
                } else {
                    Value::Text(text.clone())
                }
            }
            _ => return Err(wrong("a string")),
        },
        CqlType::Boolean => match json {
            Json::Bool(b) => Value::Boolean(*b),
            Json::String(text) if text.eq_ignore_ascii_case("true") => Value::Boolean(true),
            Json::String(text) if text.eq_ignore_ascii_case("false") => Value::Boolean(false),
            _ => return Err(wrong("a boolean")),
        },
        CqlType::Tinyint
        | CqlType::Smallint
        | CqlType::Int
        | CqlType::Bigint
        | CqlType::Counter
        | CqlType::Varint
        | CqlType::Decimal
        | CqlType::Float
        | CqlType::Double => {
            let text = match json {
                Json::Number(number) => number.to_string(),
                Json::String(text) => text.trim().to_string(),
                _ => return Err(wrong("a number")),
            };
            number_value(&text, cql_type).ok_or_else(|| {
                CqlError::invalid(format!(
                    "Error decoding JSON value for {receiver}: Unable to make {} from '{text}'",
                    java_number_name(cql_type)
                ))
            })?
        }
        CqlType::Timestamp => match json {
            Json::Number(number) => {
                Value::Timestamp(number.as_i64().ok_or_else(|| wrong("milliseconds"))?)
            }
            Json::String(text) => match text.trim().parse::<i64>() {
                Ok(millis) => Value::Timestamp(millis),
                Err(_) => Value::Timestamp(
                    parse_timestamp(text).ok_or_else(|| wrong("a timestamp string"))?,
                ),
            },
            _ => return Err(wrong("a timestamp")),
        },
        CqlType::Date => match json {
            Json::Number(number) => Value::Date(
                number
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .ok_or_else(|| wrong("a date"))?,
            ),
            Json::String(_) => string_literal(json, cql_type, receiver)?,
            _ => return Err(wrong("a date string")),
        },
        CqlType::Time => match json {
            Json::Number(number) => {
                Value::Time(number.as_i64().ok_or_else(|| wrong("nanoseconds"))?)
            }
            Json::String(_) => string_literal(json, cql_type, receiver)?,
            _ => return Err(wrong("a time string")),
        },
        CqlType::Uuid | CqlType::Timeuuid => match json {
            Json::String(text) => {
                let uuid =
                    uuid::Uuid::parse_str(text.trim()).map_err(|_| wrong("a UUID string"))?;
                if matches!(cql_type, CqlType::Timeuuid) {
                    if uuid.get_version_num() != 1 {
                        return Err(CqlError::invalid(format!(
                            "Error decoding JSON value for {receiver}: {text} is not a time-based UUID"
                        )));
                    }
                    Value::Timeuuid(*uuid.as_bytes())
                } else {
                    Value::Uuid(*uuid.as_bytes())
                }
            }
            _ => return Err(wrong("a UUID string")),
        },
        CqlType::Blob => match json {
            Json::String(text) => {
                let hex = text
                    .strip_prefix("0x")
                    .or_else(|| text.strip_prefix("0X"))
                    .ok_or_else(|| wrong("a string starting with 0x"))?;
                Value::Blob(decode_hex(hex).ok_or_else(|| wrong("hexadecimal digits"))?)
            }
            _ => return Err(wrong("a string starting with 0x")),
        },
        CqlType::Inet | CqlType::Duration => match json {
            Json::String(text) if matches!(cql_type, CqlType::Duration) => {
                parse_duration(text.trim()).ok_or_else(|| wrong("a duration string"))?
            }
            Json::String(_) => string_literal(json, cql_type, receiver)?,
            _ => return Err(wrong("a string")),
        },
        CqlType::List { .. }
        | CqlType::Set { .. }
        | CqlType::Map { .. }
        | CqlType::Vector { .. }
        | CqlType::Tuple(_)
        | CqlType::Udt(_) => composite_from_json(json, cql_type, receiver)?,
        CqlType::UdtName { name, .. } => {
            return Err(CqlError::invalid(format!("Unknown type {name}")))
        }
    };
    Ok(Some(value))
}

/// A JSON array or object read as a collection, vector, tuple or user-defined type value
/// (for [`from_json`], which has ruled out `null`).
fn composite_from_json(json: &Json, cql_type: &CqlType, receiver: &str) -> Result<Value, CqlError> {
    let wrong = |expected: &str| {
        CqlError::invalid(format!(
            "Error decoding JSON value for {receiver}: Expected {expected} for {cql_type}, but got {json}"
        ))
    };
    Ok(match cql_type {
        CqlType::List { element, .. } | CqlType::Set { element, .. } => {
            let Json::Array(items) = json else {
                return Err(wrong("a list"));
            };
            let mut values = Vec::with_capacity(items.len());
            for item in items {
                values.push(from_json(item, element, receiver)?.ok_or_else(|| {
                    CqlError::invalid(format!(
                        "Invalid null value in JSON for {receiver}: collections cannot hold null"
                    ))
                })?);
            }
            if matches!(cql_type, CqlType::Set { .. }) {
                sort_dedup(&mut values);
                Value::Set(values)
            } else {
                Value::List(values)
            }
        }
        CqlType::Map { key, value, .. } => {
            let Json::Object(entries) = json else {
                return Err(wrong("a map"));
            };
            let mut pairs = Vec::with_capacity(entries.len());
            for (key_text, item) in entries {
                let key_json = match key.as_ref() {
                    CqlType::Ascii | CqlType::Text => Json::String(key_text.clone()),
                    _ => serde_json::from_str(key_text)
                        .unwrap_or_else(|_| Json::String(key_text.clone())),
                };
                let key_value = from_json(&key_json, key, receiver)?.ok_or_else(|| {
                    CqlError::invalid(format!("Invalid null map key in JSON for {receiver}"))
                })?;
                let item_value = from_json(item, value, receiver)?.ok_or_else(|| {
                    CqlError::invalid(format!("Invalid null map value in JSON for {receiver}"))
                })?;
                pairs.push((key_value, item_value));
            }
            sort_dedup_keys(&mut pairs);
            Value::Map(pairs)
        }
        CqlType::Vector { element, dimension } => {
            let Json::Array(items) = json else {
                return Err(wrong("a list"));
            };
            let mut values = Vec::with_capacity(items.len());
            for item in items {
                values.push(from_json(item, element, receiver)?.ok_or_else(|| {
                    CqlError::invalid(format!(
                        "Invalid null value in JSON for {receiver}: vectors cannot hold null"
                    ))
                })?);
            }
            super::check_dimension(&values, *dimension, cql_type, receiver)?;
            Value::Vector(values)
        }
        CqlType::Tuple(types) => {
            let Json::Array(items) = json else {
                return Err(wrong("a tuple (JSON array)"));
            };
            if items.len() > types.len() {
                return Err(CqlError::invalid(format!(
                    "Error decoding JSON value for {receiver}: tuple of {} elements, but {cql_type} has {}",
                    items.len(),
                    types.len()
                )));
            }
            let mut values = Vec::with_capacity(types.len());
            for (position, element_type) in types.iter().enumerate() {
                values.push(match items.get(position) {
                    Some(item) => from_json(item, element_type, receiver)?,
                    None => None,
                });
            }
            Value::Tuple(values)
        }
        CqlType::Udt(user_type) => {
            let Json::Object(entries) = json else {
                return Err(wrong("a map (JSON object)"));
            };
            let mut values = vec![None; user_type.fields.len()];
            for (key, item) in entries {
                // A quoted key names a case-sensitive field; others are case-folded.
                let field = match key.strip_prefix('"').and_then(|k| k.strip_suffix('"')) {
                    Some(quoted) => quoted.to_string(),
                    None => key.to_lowercase(),
                };
                let index = user_type.field_index(&field).ok_or_else(|| {
                    CqlError::invalid(format!(
                        "Error decoding JSON value for {receiver}: Unknown field '{field}' in value of user defined type {}",
                        user_type.name
                    ))
                })?;
                values[index] = from_json(item, &user_type.fields[index].1, receiver)?;
            }
            Value::Tuple(values)
        }
        _ => return Err(wrong("a collection, tuple or user-defined type")),
    })
}

/// How Cassandra's error messages name a numeric type (its Java class).
fn java_number_name(cql_type: &CqlType) -> &'static str {
    match cql_type {
        CqlType::Tinyint => "byte",
        CqlType::Smallint => "short",
        CqlType::Int => "int",
        CqlType::Bigint | CqlType::Counter => "long",
        CqlType::Float => "float",
        CqlType::Double => "double",
        CqlType::Decimal => "decimal",
        _ => "varint",
    }
}

/// A number's text as a value of the numeric `cql_type`; `None` when it is not a number
/// or out of the type's range.
fn number_value(text: &str, cql_type: &CqlType) -> Option<Value> {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let is_integer = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
    let literal = if is_integer {
        Literal::Integer(digits.to_string())
    } else if digits.parse::<f64>().is_ok() {
        Literal::Float(digits.to_string())
    } else {
        return None;
    };
    literal_value(&literal, cql_type, "", negative).ok()
}

/// A JSON string read as CQL reads the same string literal (dates, times, inet).
fn string_literal(json: &Json, cql_type: &CqlType, receiver: &str) -> Result<Value, CqlError> {
    let Json::String(text) = json else {
        unreachable!("callers pass strings");
    };
    literal_value(&Literal::String(text.clone()), cql_type, receiver, false)
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(value: Value, cql_type: CqlType) {
        let text = to_json(&value);
        let parsed = parse(&text).unwrap();
        let back = from_json(&parsed, &cql_type, "c").unwrap().unwrap();
        assert!(
            back.compare(&value).is_eq(),
            "{value:?} → {text} → {back:?}"
        );
    }

    #[test]
    fn every_type_reads_back_what_it_writes() {
        round_trip(Value::Text("a \"quoted\" é".into()), CqlType::Text);
        round_trip(Value::Int(-42), CqlType::Int);
        round_trip(Value::Bigint(i64::MAX), CqlType::Bigint);
        round_trip(Value::Double(1.5), CqlType::Double);
        round_trip(Value::Float(-2.0), CqlType::Float);
        round_trip(Value::Boolean(true), CqlType::Boolean);
        round_trip(Value::Blob(vec![0, 1, 0xab]), CqlType::Blob);
        round_trip(Value::Timestamp(1_706_702_400_123), CqlType::Timestamp);
        round_trip(Value::Timestamp(-1), CqlType::Timestamp);
        round_trip(Value::Date(DATE_EPOCH_OFFSET + 19_753), CqlType::Date);
        round_trip(Value::Time(3_723_000_000_004), CqlType::Time);
        round_trip(
            Value::Decimal {
                unscaled: (-12345).into(),
                scale: 3,
            },
            CqlType::Decimal,
        );
        round_trip(
            Value::Duration {
                months: 14,
                days: 3,
                nanoseconds: 3_600_000_000_001,
            },
            CqlType::Duration,
        );
        round_trip(Value::Inet("::1".parse().unwrap()), CqlType::Inet);
        let int_text = CqlType::Map {
            key: Box::new(CqlType::Int),
            value: Box::new(CqlType::Text),
            frozen: false,
        };
        round_trip(
            Value::Map(vec![(Value::Int(1), Value::Text("a".into()))]),
            int_text,
        );
        round_trip(
            Value::Tuple(vec![Some(Value::Int(1)), None]),
            CqlType::Tuple(vec![CqlType::Int, CqlType::Text]),
        );
    }

    #[test]
    fn written_forms_match_cassandra() {
        assert_eq!(
            to_json(&Value::Timestamp(0)),
            "\"1970-01-01 00:00:00.000Z\""
        );
        assert_eq!(to_json(&Value::Blob(vec![0xca, 0xfe])), "\"0xcafe\"");
        assert_eq!(to_json(&Value::Double(1.0)), "1.0");
        assert_eq!(to_json(&Value::Double(2.5)), "2.5");
        assert_eq!(to_json(&Value::Float(1e8)), "1.0E8");
        assert_eq!(to_json(&Value::Float(1.1)), "1.1");
        assert_eq!(to_json(&Value::Double(1.5e-4)), "1.5E-4");
        assert_eq!(to_json(&Value::Double(-1234567.5)), "-1234567.5");
        assert_eq!(
            to_json(&Value::Map(vec![(Value::Int(1), Value::Text("a".into()))])),
            "{\"1\": \"a\"}"
        );
        assert_eq!(
            to_json(&Value::List(vec![Value::Int(1), Value::Int(2)])),
            "[1, 2]"
        );
    }

    #[test]
    fn lenient_reads_and_clear_errors() {
        let int = |json: &str| from_json(&parse(json).unwrap(), &CqlType::Int, "c");
        assert_eq!(int("\"42\"").unwrap(), Some(Value::Int(42)));
        assert_eq!(int("null").unwrap(), None);
        assert!(int("\"forty\"")
            .unwrap_err()
            .to_string()
            .contains("Unable to make int from 'forty'"));
        assert!(int("3000000000").is_err());
        assert!(parse("{not json").is_err());
    }
}
