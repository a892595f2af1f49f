//! Cassandra 5.0's native scalar functions of one argument, as selections use them (and
//! nest them): math (`abs`, `exp`, `log`, `log10`, `round`), blob conversions
//! (`intAsBlob`, `blobAsInt`, … for every native type), `CAST(x AS type)`, time
//! conversions (`toTimestamp`, `toDate`, `toUnixTimestamp`) and collection functions
//! (`map_keys`, `map_values`, `collection_count|min|max|sum|avg`).
//!
//! [`resolve`] checks a call against its argument's type once, when the statement is
//! planned, and fixes its result type; [`Call::apply`] runs it on each row. Results
//! follow Cassandra's Java semantics: a function returns its argument's type (`exp` of
//! an int is an int, truncated), `round` rounds half up, a cast from a floating-point
//! number to an integer truncates towards zero. Known difference: `exp`, `log` and
//! `log10` of a `decimal` or `varint` are computed in double precision (Cassandra uses
//! 34 significant digits).

use crate::values::json;
use crate::values::timeuuid_millis;
use crate::CqlError;
use num_bigint::BigInt;
use shoal_cql::ast::Literal;
use shoal_model::value::DATE_EPOCH_OFFSET;
use shoal_model::{CqlType, Value};

/// What a call computes.
#[derive(Debug, Clone, PartialEq)]
enum Function {
    Abs,
    Exp,
    Log,
    Log10,
    Round,
    /// `<type>AsBlob`: the value's serialized bytes.
    AsBlob,
    /// `blobAs<type>`: bytes read as a value of the type (checked).
    BlobAs,
    Cast,
    ToTimestamp,
    ToDate,
    ToUnixTimestamp,
    MapKeys,
    MapValues,
    CollectionCount,
    CollectionMin,
    CollectionMax,
    CollectionSum,
    CollectionAvg,
}

/// A function resolved against its argument's type.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Call {
    function: Function,
    pub(crate) argument_type: CqlType,
    pub(crate) return_type: CqlType,
}

fn invalid_argument(name: &str, argument_type: &CqlType) -> CqlError {
    CqlError::invalid(format!(
        "Type error: cannot call system.{name} with an argument of type {argument_type}"
    ))
}

/// True when `name` is one of the functions [`resolve`] knows (lower case).
pub(crate) fn is_scalar(name: &str) -> bool {
    matches!(
        name,
        "abs"
            | "exp"
            | "log"
            | "log10"
            | "round"
            | "totimestamp"
            | "dateof"
            | "todate"
            | "tounixtimestamp"
            | "unixtimestampof"
            | "map_keys"
            | "map_values"
            | "collection_count"
            | "collection_min"
            | "collection_max"
            | "collection_sum"
            | "collection_avg"
    ) || blob_conversion(name).is_some()
}

/// The type a function's argument is read as where it is a term (`INSERT … VALUES
/// (intAsBlob(3))`, and the bind markers inside it): a timeuuid for the time conversions
/// (`toTimestamp(now())`), a timestamp for `minTimeuuid`/`maxTimeuuid`, text for
/// `fromJson`, what a blob conversion names, otherwise the receiver's type (so `abs(-3)`
/// into an int column reads `-3` as an int). `name` is in lower case.
pub(crate) fn term_argument_type(name: &str, receiver_type: &CqlType) -> CqlType {
    match name {
        "totimestamp" | "dateof" | "todate" | "tounixtimestamp" | "unixtimestampof" => {
            return CqlType::Timeuuid
        }
        "mintimeuuid" | "maxtimeuuid" => return CqlType::Timestamp,
        "fromjson" => return CqlType::Text,
        _ => {}
    }
    match blob_conversion(name) {
        Some((Function::AsBlob, cql_type)) => cql_type,
        Some((Function::BlobAs, _)) => CqlType::Blob,
        _ => receiver_type.clone(),
    }
}

/// `intasblob` → (AsBlob, int); `blobasint` → (BlobAs, int).
fn blob_conversion(name: &str) -> Option<(Function, CqlType)> {
    if let Some(type_name) = name.strip_suffix("asblob") {
        return CqlType::native_from_name(type_name).map(|t| (Function::AsBlob, t));
    }
    let type_name = name.strip_prefix("blobas")?;
    CqlType::native_from_name(type_name).map(|t| (Function::BlobAs, t))
}

/// Resolves `name(argument)` for an argument of `argument_type` (`name` in lower case).
pub(crate) fn resolve(name: &str, argument_type: &CqlType) -> Result<Call, CqlError> {
    let call = |function, return_type| {
        Ok(Call {
            function,
            argument_type: argument_type.clone(),
            return_type,
        })
    };
    let numeric = argument_type.is_numeric() && *argument_type != CqlType::Counter;
    match name {
        "abs" | "exp" | "log" | "log10" | "round" if numeric => {
            let function = match name {
                "abs" => Function::Abs,
                "exp" => Function::Exp,
                "log" => Function::Log,
                "log10" => Function::Log10,
                _ => Function::Round,
            };
            call(function, argument_type.clone())
        }
        "totimestamp" | "dateof" | "todate" | "tounixtimestamp" | "unixtimestampof"
            if matches!(
                argument_type,
                CqlType::Timeuuid | CqlType::Timestamp | CqlType::Date
            ) =>
        {
            match name {
                "totimestamp" | "dateof" => call(Function::ToTimestamp, CqlType::Timestamp),
                "todate" => call(Function::ToDate, CqlType::Date),
                _ => call(Function::ToUnixTimestamp, CqlType::Bigint),
            }
        }
        "map_keys" | "map_values" => match argument_type {
            CqlType::Map { key, value, .. } => {
                if name == "map_keys" {
                    call(
                        Function::MapKeys,
                        CqlType::Set {
                            element: key.clone(),
                            frozen: true,
                        },
                    )
                } else {
                    call(
                        Function::MapValues,
                        CqlType::List {
                            element: value.clone(),
                            frozen: true,
                        },
                    )
                }
            }
            _ => Err(invalid_argument(name, argument_type)),
        },
        "collection_count" | "collection_min" | "collection_max" | "collection_sum"
        | "collection_avg" => {
            let element = match argument_type {
                CqlType::List { element, .. } | CqlType::Set { element, .. } => element,
                CqlType::Map { .. } if name == "collection_count" => {
                    return call(Function::CollectionCount, CqlType::Int)
                }
                _ => return Err(invalid_argument(name, argument_type)),
            };
            match name {
                "collection_count" => call(Function::CollectionCount, CqlType::Int),
                "collection_min" => call(Function::CollectionMin, element.as_ref().clone()),
                "collection_max" => call(Function::CollectionMax, element.as_ref().clone()),
                _ if element.is_numeric() => {
                    let function = if name == "collection_sum" {
                        Function::CollectionSum
                    } else {
                        Function::CollectionAvg
                    };
                    call(function, element.as_ref().clone())
                }
                _ => Err(invalid_argument(name, argument_type)),
            }
        }
        _ => match blob_conversion(name) {
            Some((Function::AsBlob, cql_type)) if same_storage(&cql_type, argument_type) => {
                call(Function::AsBlob, CqlType::Blob)
            }
            // Any value is its bytes to `blobAs…`, as in Cassandra.
            Some((Function::BlobAs, cql_type)) => call(Function::BlobAs, cql_type),
            Some(_) => Err(invalid_argument(name, argument_type)),
            None => Err(CqlError::invalid(format!("Unknown function '{name}'"))),
        },
    }
}

/// `text` and `varchar` are one type; `ascii` converts as text.
fn same_storage(a: &CqlType, b: &CqlType) -> bool {
    a == b || matches!((a, b), (CqlType::Text, CqlType::Ascii))
}

/// Resolves `CAST(argument AS target)`; `None` when the cast changes nothing.
pub(crate) fn resolve_cast(
    argument_type: &CqlType,
    target: &CqlType,
) -> Result<Option<Call>, CqlError> {
    if argument_type == target {
        return Ok(None);
    }
    let numeric = |t: &CqlType| t.is_numeric() && *t != CqlType::Counter;
    let textual = matches!(target, CqlType::Text | CqlType::Ascii);
    let allowed = (numeric(argument_type) && numeric(target))
        || (textual
            && (numeric(argument_type)
                || matches!(
                    argument_type,
                    CqlType::Text
                        | CqlType::Ascii
                        | CqlType::Boolean
                        | CqlType::Uuid
                        | CqlType::Timeuuid
                        | CqlType::Inet
                        | CqlType::Timestamp
                        | CqlType::Date
                        | CqlType::Time
                        | CqlType::Duration
                )))
        || matches!(
            (argument_type, target),
            (CqlType::Timestamp, CqlType::Date)
                | (CqlType::Date, CqlType::Timestamp)
                | (CqlType::Timeuuid, CqlType::Timestamp | CqlType::Date)
        );
    if !allowed {
        return Err(CqlError::invalid(format!(
            "{argument_type} cannot be cast to {target}"
        )));
    }
    Ok(Some(Call {
        function: Function::Cast,
        argument_type: argument_type.clone(),
        return_type: target.clone(),
    }))
}

fn millis_of(value: &Value) -> Option<i64> {
    match value {
        Value::Timeuuid(u) => Some(timeuuid_millis(u)),
        Value::Timestamp(t) => Some(*t),
        Value::Date(d) => Some((*d as i64 - DATE_EPOCH_OFFSET as i64) * 86_400_000),
        _ => None,
    }
}

fn date_of_millis(millis: i64) -> Value {
    Value::Date((millis.div_euclid(86_400_000) + DATE_EPOCH_OFFSET as i64) as u32)
}

impl Call {
    /// The result for one argument value (`None`: null in, null out).
    pub(crate) fn apply(&self, argument: Option<Value>) -> Result<Option<Value>, CqlError> {
        let Some(value) = argument else {
            return Ok(None);
        };
        let result = match self.function {
            Function::Abs | Function::Exp | Function::Log | Function::Log10 => {
                math(&self.function, &value)
            }
            Function::Round => round(&value),
            Function::AsBlob => Value::Blob(value.serialize()),
            Function::BlobAs => {
                let bytes = match value {
                    Value::Blob(bytes) => bytes,
                    other => other.serialize(),
                };
                Value::deserialize(&self.return_type, &bytes).map_err(|e| {
                    CqlError::invalid(format!(
                        "In call to function system.blobas{}, value 0x{} is not a valid binary representation for type {}: {}",
                        self.return_type,
                        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>(),
                        self.return_type,
                        e.0
                    ))
                })?
            }
            Function::Cast => cast(value, &self.return_type)?,
            Function::ToTimestamp => Value::Timestamp(millis_of(&value).unwrap_or_default()),
            Function::ToUnixTimestamp => Value::Bigint(millis_of(&value).unwrap_or_default()),
            Function::ToDate => date_of_millis(millis_of(&value).unwrap_or_default()),
            Function::MapKeys | Function::MapValues => match value {
                Value::Map(entries) => {
                    if self.function == Function::MapKeys {
                        Value::Set(entries.into_iter().map(|(k, _)| k).collect())
                    } else {
                        Value::List(entries.into_iter().map(|(_, v)| v).collect())
                    }
                }
                _ => return Ok(None),
            },
            Function::CollectionCount => Value::Int(match &value {
                Value::List(e) | Value::Set(e) => e.len() as i32,
                Value::Map(e) => e.len() as i32,
                _ => 0,
            }),
            Function::CollectionMin
            | Function::CollectionMax
            | Function::CollectionSum
            | Function::CollectionAvg => {
                let (Value::List(elements) | Value::Set(elements)) = value else {
                    return Ok(None);
                };
                return Ok(self.fold_collection(elements));
            }
        };
        Ok(Some(result))
    }

    /// min / max / sum / avg over a collection's elements, like the aggregates of the
    /// same name over rows (an empty collection: null for min and max, zero otherwise).
    fn fold_collection(&self, elements: Vec<Value>) -> Option<Value> {
        match self.function {
            Function::CollectionMin => elements.into_iter().min_by(|a, b| a.compare(b)),
            Function::CollectionMax => elements.into_iter().max_by(|a, b| a.compare(b)),
            _ => {
                let count = elements.len().max(1);
                let sum: f64 = elements.iter().map(numeric_as_f64).sum();
                let integral_sum: i128 = elements.iter().map(integral).sum();
                Some(if self.function == Function::CollectionSum {
                    numeric_from_f64(&self.return_type, sum, integral_sum)
                } else {
                    numeric_from_f64(
                        &self.return_type,
                        sum / count as f64,
                        integral_sum / count as i128,
                    )
                })
            }
        }
    }
}

/// `abs`, `exp`, `log` or `log10` of a number, in the number's own type: `abs` exactly;
/// the others through `f64` (an integer result truncated, as Java's `(int) Math.exp(i)`).
fn math(function: &Function, value: &Value) -> Value {
    let float = |n: f64| match function {
        Function::Abs => n.abs(),
        Function::Exp => n.exp(),
        Function::Log => n.ln(),
        _ => n.log10(),
    };
    match value {
        Value::Double(n) => Value::Double(float(*n)),
        Value::Float(n) => Value::Float(float(f64::from(*n)) as f32),
        Value::Decimal { unscaled, scale } if *function == Function::Abs => Value::Decimal {
            unscaled: BigInt::from_biguint(num_bigint::Sign::Plus, unscaled.magnitude().clone()),
            scale: *scale,
        },
        Value::Varint(n) if *function == Function::Abs => Value::Varint(BigInt::from_biguint(
            num_bigint::Sign::Plus,
            n.magnitude().clone(),
        )),
        Value::Decimal { .. } => decimal_of(float(numeric_as_f64(value))),
        Value::Varint(_) => Value::Varint(BigInt::from(float(numeric_as_f64(value)) as i128)),
        _ if *function == Function::Abs => integer_like(value, integral(value).abs()),
        _ => integer_like(value, float(numeric_as_f64(value)) as i128),
    }
}

/// `n` in the integer type of `like` (wrapping as Java's narrowing does).
fn integer_like(like: &Value, n: i128) -> Value {
    match like {
        Value::Tinyint(_) => Value::Tinyint(n as i8),
        Value::Smallint(_) => Value::Smallint(n as i16),
        Value::Int(_) => Value::Int(n as i32),
        Value::Counter(_) => Value::Counter(n as i64),
        _ => Value::Bigint(n as i64),
    }
}

fn decimal_of(n: f64) -> Value {
    crate::values::literal_value(
        &Literal::Float(format!("{:?}", n.abs())),
        &CqlType::Decimal,
        "result",
        n < 0.0,
    )
    .unwrap_or(Value::Decimal {
        unscaled: BigInt::from(0),
        scale: 0,
    })
}

/// Java's `Math.round` for floating point (half up, towards positive infinity), the
/// value itself for integers, `setScale(0, HALF_UP)` for decimals.
fn round(value: &Value) -> Value {
    match value {
        Value::Double(n) => Value::Double((n + 0.5).floor()),
        Value::Float(n) => Value::Float((n + 0.5).floor()),
        Value::Decimal { unscaled, scale } if *scale > 0 => {
            let divisor = num_bigint::BigUint::from(10u32).pow(*scale as u32);
            let half = &divisor / 2u32;
            let rounded = (unscaled.magnitude() + half) / divisor;
            Value::Decimal {
                unscaled: BigInt::from_biguint(unscaled.sign(), rounded),
                scale: 0,
            }
        }
        other => other.clone(),
    }
}

/// `CAST(value AS target)` for the pairs [`resolve_cast`] allows.
fn cast(value: Value, target: &CqlType) -> Result<Value, CqlError> {
    if matches!(target, CqlType::Text | CqlType::Ascii) {
        let text = text_form(&value);
        return Ok(if *target == CqlType::Ascii {
            Value::Ascii(text)
        } else {
            Value::Text(text)
        });
    }
    if let (Some(millis), CqlType::Timestamp | CqlType::Date) = (millis_of(&value), target) {
        return Ok(if *target == CqlType::Date {
            date_of_millis(millis)
        } else {
            Value::Timestamp(millis)
        });
    }
    let float = numeric_as_f64(&value);
    let whole = match &value {
        Value::Double(_) | Value::Float(_) | Value::Decimal { .. } => float.trunc() as i128,
        other => integral(other),
    };
    Ok(match target {
        CqlType::Tinyint => Value::Tinyint(whole as i8),
        CqlType::Smallint => Value::Smallint(whole as i16),
        CqlType::Int => Value::Int(whole as i32),
        CqlType::Bigint => Value::Bigint(whole as i64),
        CqlType::Varint => Value::Varint(BigInt::from(whole)),
        CqlType::Float => Value::Float(float as f32),
        CqlType::Double => Value::Double(float),
        CqlType::Decimal => match &value {
            Value::Varint(n) => Value::Decimal {
                unscaled: n.clone(),
                scale: 0,
            },
            Value::Double(_) | Value::Float(_) => crate::values::literal_value(
                &Literal::Float(json::to_json(&value).trim_start_matches('-').to_string()),
                &CqlType::Decimal,
                "CAST",
                float < 0.0,
            )?,
            other => Value::Decimal {
                unscaled: BigInt::from(integral(other)),
                scale: 0,
            },
        },
        _ => return Err(CqlError::invalid(format!("cannot cast to {target}"))),
    })
}

/// A value as `CAST(… AS text)` writes it.
fn text_form(value: &Value) -> String {
    match value {
        Value::Text(text) | Value::Ascii(text) => text.clone(),
        Value::Timestamp(millis) => json::timestamp_text(*millis, 'T'),
        // The JSON forms of the rest are their text forms, in quotes for strings.
        other => {
            let written = json::to_json(other);
            match written.strip_prefix('"').and_then(|w| w.strip_suffix('"')) {
                Some(inner) => inner.to_string(),
                None => written,
            }
        }
    }
}

/// A number as `f64` (aggregates and math functions).
pub(crate) fn numeric_as_f64(value: &Value) -> f64 {
    match value {
        Value::Tinyint(v) => *v as f64,
        Value::Smallint(v) => *v as f64,
        Value::Int(v) => *v as f64,
        Value::Bigint(v) | Value::Counter(v) => *v as f64,
        Value::Float(v) => *v as f64,
        Value::Double(v) => *v,
        Value::Varint(v) => v.to_string().parse().unwrap_or(0.0),
        Value::Decimal { unscaled, scale } => {
            unscaled.to_string().parse::<f64>().unwrap_or(0.0) / 10f64.powi(*scale)
        }
        _ => 0.0,
    }
}

/// A sum or average in `cql_type`: integers from the exact `integral` sum, floating point
/// and decimals from `value`.
pub(crate) fn numeric_from_f64(cql_type: &CqlType, value: f64, integral: i128) -> Value {
    match cql_type {
        CqlType::Tinyint => Value::Tinyint(integral as i8),
        CqlType::Smallint => Value::Smallint(integral as i16),
        CqlType::Int => Value::Int(integral as i32),
        CqlType::Bigint | CqlType::Counter => Value::Bigint(integral as i64),
        CqlType::Varint => Value::Varint(BigInt::from(integral)),
        CqlType::Float => Value::Float(value as f32),
        CqlType::Decimal => decimal_of(value),
        _ => Value::Double(value),
    }
}

/// An integer's exact value (0 for other values).
pub(crate) fn integral(value: &Value) -> i128 {
    match value {
        Value::Tinyint(v) => *v as i128,
        Value::Smallint(v) => *v as i128,
        Value::Int(v) => *v as i128,
        Value::Bigint(v) | Value::Counter(v) => *v as i128,
        Value::Varint(v) => i128::try_from(v).unwrap_or(0),
        _ => 0,
    }
}

/// `similarity_<name>(left, right)` of two serialized `vector<float, n>` values (checked
/// to be of one type when the selection was compiled).
pub(crate) fn similarity(
    similarity: shoal_model::vector::Similarity,
    left: &[u8],
    right: &[u8],
) -> Result<f32, CqlError> {
    use shoal_model::vector::{floats, SimilarityError};
    let function = format!("system.similarity_{}", similarity.name());
    similarity
        .score(&floats(left), &floats(right))
        .map_err(|error| match error {
            SimilarityError::ZeroVector => CqlError::invalid(format!(
                "Function {function} doesn't support all-zero vectors."
            )),
            SimilarityError::Dimensions { left, right } => CqlError::invalid(format!(
                "All arguments of {function} must have the same dimensions, got {left} and {right}"
            )),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decimal(unscaled: i64, scale: i32) -> Value {
        Value::Decimal {
            unscaled: BigInt::from(unscaled),
            scale,
        }
    }

    fn apply(name: &str, argument: Value, argument_type: CqlType) -> Value {
        resolve(name, &argument_type)
            .unwrap()
            .apply(Some(argument))
            .unwrap()
            .unwrap()
    }

    #[test]
    fn round_is_half_up_like_java() {
        assert_eq!(
            apply("round", decimal(25, 1), CqlType::Decimal),
            decimal(3, 0)
        );
        assert_eq!(
            apply("round", decimal(-25, 1), CqlType::Decimal),
            decimal(-3, 0)
        );
        assert_eq!(
            apply("round", decimal(314159, 5), CqlType::Decimal),
            decimal(3, 0)
        );
        assert_eq!(
            apply("round", Value::Double(-2.5), CqlType::Double),
            Value::Double(-2.0)
        );
        assert_eq!(
            apply("round", Value::Float(0.5), CqlType::Float),
            Value::Float(1.0)
        );
    }

    #[test]
    fn integer_math_stays_in_its_type() {
        assert_eq!(
            apply("abs", Value::Tinyint(-128), CqlType::Tinyint),
            Value::Tinyint(-128)
        );
        assert_eq!(apply("exp", Value::Int(3), CqlType::Int), Value::Int(20));
        assert_eq!(
            apply("log10", Value::Bigint(1000), CqlType::Bigint),
            Value::Bigint(3)
        );
    }

    #[test]
    fn casts_truncate_and_write_text_like_cassandra() {
        let cast = |value: Value, from: CqlType, to: CqlType| {
            resolve_cast(&from, &to)
                .unwrap()
                .unwrap()
                .apply(Some(value))
                .unwrap()
                .unwrap()
        };
        assert_eq!(
            cast(Value::Double(-2.9), CqlType::Double, CqlType::Int),
            Value::Int(-2)
        );
        assert_eq!(
            cast(Value::Timestamp(0), CqlType::Timestamp, CqlType::Text),
            Value::Text("1970-01-01T00:00:00.000Z".into())
        );
        assert_eq!(
            cast(Value::Double(1e8), CqlType::Double, CqlType::Text),
            Value::Text("1.0E8".into())
        );
        assert!(resolve_cast(&CqlType::Blob, &CqlType::Int).is_err());
        assert!(resolve_cast(&CqlType::Int, &CqlType::Int)
            .unwrap()
            .is_none());
    }

    #[test]
    fn blob_conversions_check_the_bytes() {
        let as_bigint = resolve("blobasbigint", &CqlType::Blob).unwrap();
        assert!(as_bigint.apply(Some(Value::Blob(vec![1, 2]))).is_err());
        assert_eq!(
            apply("blobasint", Value::Blob(vec![0, 0, 0, 42]), CqlType::Blob),
            Value::Int(42)
        );
        assert!(resolve("intasblob", &CqlType::Bigint).is_err());
    }
}
