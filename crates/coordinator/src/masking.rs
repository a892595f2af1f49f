//! Cassandra 5.0's masking functions, which hide a value in a query's result while
//! keeping its type: `mask_null(v)`, `mask_default(v)` (a fixed value of the type),
//! `mask_replace(v, replacement)`, `mask_inner(v, begin, end[, padding])` and
//! `mask_outer(v, begin, end[, padding])` (text with its inner or outer characters
//! padded), and `mask_hash(v[, algorithm])` (a digest of the value's bytes, as a blob).
//!
//! A masking function is compiled into the selection once ([`Masking::compile`]); the
//! extra arguments must be constants, as they are for the functions' use in Cassandra's
//! column masks. `mask_replace`'s replacement is any term of the value's type, bound
//! with the statement's other terms.

use crate::values::TypedTerm;
use crate::{ensure, CqlError};
use shoal_cql::ast::{Literal, Selector, Term};
use shoal_model::{CqlType, Value};

/// One masking function with its constant arguments.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Masking {
    Null,
    Default,
    /// The replacement is the selection's second argument.
    Replace,
    /// Keeps `begin` characters at the start and `end` at the end, pads the rest.
    Inner {
        begin: usize,
        end: usize,
        padding: char,
    },
    /// Pads `begin` characters at the start and `end` at the end, keeps the rest.
    Outer {
        begin: usize,
        end: usize,
        padding: char,
    },
    Hash(&'static ring::digest::Algorithm),
}

/// What [`Masking::compile`] gives: the function, its result type and, for
/// `mask_replace`, the replacement term.
pub(crate) struct Compiled {
    pub(crate) masking: Masking,
    pub(crate) result_type: CqlType,
    pub(crate) replacement: Option<TypedTerm>,
}

/// True for the masking functions' names (lower case).
pub(crate) fn is_masking(name: &str) -> bool {
    matches!(
        name,
        "mask_null" | "mask_default" | "mask_replace" | "mask_inner" | "mask_outer" | "mask_hash"
    )
}

impl Masking {
    /// The masking function `name` applied to a value of `value_type`, with the
    /// arguments after the value (`rest`).
    pub(crate) fn compile(
        name: &str,
        value_type: &CqlType,
        rest: &[Selector],
    ) -> Result<Compiled, CqlError> {
        let function = format!("system.{name}");
        let arity = |allowed: &[usize]| {
            ensure(allowed.contains(&(rest.len() + 1)), || {
                CqlError::invalid(format!(
                    "Invalid number of arguments for function {function}: {} given",
                    rest.len() + 1
                ))
            })
        };
        let plain = |masking| Compiled {
            masking,
            result_type: value_type.clone(),
            replacement: None,
        };
        Ok(match name {
            "mask_null" => {
                arity(&[1])?;
                plain(Masking::Null)
            }
            "mask_default" => {
                arity(&[1])?;
                plain(Masking::Default)
            }
            "mask_replace" => {
                arity(&[2])?;
                let Selector::Literal(term) = &rest[0] else {
                    return Err(constant_needed(&function));
                };
                Compiled {
                    masking: Masking::Replace,
                    result_type: value_type.clone(),
                    replacement: Some(TypedTerm::new(term, value_type, &function)?),
                }
            }
            "mask_inner" | "mask_outer" => {
                arity(&[3, 4])?;
                ensure(matches!(value_type, CqlType::Text | CqlType::Ascii), || {
                    CqlError::invalid(format!(
                            "Function {function} requires an argument of type text, ascii or varchar, but found argument of type {value_type}"
                        ))
                })?;
                let begin = count_argument(&function, &rest[0])?;
                let end = count_argument(&function, &rest[1])?;
                let padding = match rest.get(2) {
                    None => '*',
                    Some(selector) => padding_argument(&function, selector)?,
                };
                plain(if name == "mask_inner" {
                    Masking::Inner {
                        begin,
                        end,
                        padding,
                    }
                } else {
                    Masking::Outer {
                        begin,
                        end,
                        padding,
                    }
                })
            }
            _ => {
                arity(&[1, 2])?;
                let algorithm = match rest.first() {
                    None => &ring::digest::SHA256,
                    Some(Selector::Literal(Term::Literal(Literal::String(name)))) => {
                        digest_named(name).ok_or_else(|| {
                            CqlError::invalid(format!("Hash algorithm not found: {name}"))
                        })?
                    }
                    Some(_) => return Err(constant_needed(&function)),
                };
                Compiled {
                    masking: Masking::Hash(algorithm),
                    result_type: CqlType::Blob,
                    replacement: None,
                }
            }
        })
    }

    /// The masked value of `value` (of `value_type`); `replacement` is `mask_replace`'s.
    pub(crate) fn apply(
        &self,
        value: Option<Value>,
        value_type: &CqlType,
        replacement: Option<Value>,
    ) -> Option<Value> {
        match self {
            Masking::Null => None,
            // A null is masked like any value by these two, as in Cassandra.
            Masking::Default => Some(default_of(value_type)),
            Masking::Replace => replacement,
            Masking::Inner {
                begin,
                end,
                padding,
            } => value.map(|value| pad_text(value, *padding, |i, n| i >= *begin && i + end < n)),
            Masking::Outer {
                begin,
                end,
                padding,
            } => value.map(|value| pad_text(value, *padding, |i, n| i < *begin || i + end >= n)),
            Masking::Hash(algorithm) => value.map(|value| {
                Value::Blob(
                    ring::digest::digest(algorithm, &value.serialize())
                        .as_ref()
                        .to_vec(),
                )
            }),
        }
    }
}

fn constant_needed(function: &str) -> CqlError {
    CqlError::invalid(format!(
        "Function {function} takes constant arguments after the masked value"
    ))
}

/// A count of characters (`begin`, `end`): a non-negative integer constant.
fn count_argument(function: &str, selector: &Selector) -> Result<usize, CqlError> {
    match selector {
        Selector::Literal(Term::Literal(Literal::Integer(text))) => {
            text.parse::<usize>().map_err(|_| {
                CqlError::invalid(format!(
                    "Function {function} requires a non-negative number of characters, got {text}"
                ))
            })
        }
        Selector::Literal(Term::Negative(_)) => Err(CqlError::invalid(format!(
            "Function {function} requires a non-negative number of characters"
        ))),
        _ => Err(constant_needed(function)),
    }
}

/// The padding character: a one-character text constant.
fn padding_argument(function: &str, selector: &Selector) -> Result<char, CqlError> {
    match selector {
        Selector::Literal(Term::Literal(Literal::String(text))) => {
            let mut characters = text.chars();
            match (characters.next(), characters.next()) {
                (Some(padding), None) => Ok(padding),
                _ => Err(CqlError::invalid(format!(
                    "The padding argument for function {function} should be single-character, but '{text}' has {} characters.",
                    text.chars().count()
                ))),
            }
        }
        _ => Err(constant_needed(function)),
    }
}

/// The digest algorithms `mask_hash` accepts, by their Java names.
fn digest_named(name: &str) -> Option<&'static ring::digest::Algorithm> {
    match name.to_ascii_uppercase().as_str() {
        "SHA-1" => Some(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY),
        "SHA-256" => Some(&ring::digest::SHA256),
        "SHA-384" => Some(&ring::digest::SHA384),
        "SHA-512" => Some(&ring::digest::SHA512),
        _ => None,
    }
}

/// Text with the characters at positions `masked(position, length)` replaced by `padding`.
fn pad_text(value: Value, padding: char, masked: impl Fn(usize, usize) -> bool) -> Value {
    let pad = |text: &str| -> String {
        let length = text.chars().count();
        text.chars()
            .enumerate()
            .map(|(i, c)| if masked(i, length) { padding } else { c })
            .collect()
    };
    match value {
        Value::Text(text) => Value::Text(pad(&text)),
        Value::Ascii(text) => Value::Ascii(pad(&text)),
        other => other,
    }
}

/// The fixed value `mask_default` shows for a type: `****` for text, zero for numbers,
/// false, the epoch, empty collections; each element's default in tuples, UDTs and vectors.
fn default_of(cql_type: &CqlType) -> Value {
    use num_bigint::BigInt;
    match cql_type {
        CqlType::Ascii => Value::Ascii("****".into()),
        CqlType::Text => Value::Text("****".into()),
        CqlType::Bigint => Value::Bigint(0),
        CqlType::Counter => Value::Counter(0),
        CqlType::Int => Value::Int(0),
        CqlType::Smallint => Value::Smallint(0),
        CqlType::Tinyint => Value::Tinyint(0),
        CqlType::Varint => Value::Varint(BigInt::from(0)),
        CqlType::Decimal => Value::Decimal {
            unscaled: BigInt::from(0),
            scale: 0,
        },
        CqlType::Double => Value::Double(0.0),
        CqlType::Float => Value::Float(0.0),
        CqlType::Boolean => Value::Boolean(false),
        CqlType::Blob => Value::Blob(Vec::new()),
        CqlType::Timestamp => Value::Timestamp(0),
        CqlType::Time => Value::Time(0),
        CqlType::Date => Value::Date(shoal_model::value::DATE_EPOCH_OFFSET),
        CqlType::Duration => Value::Duration {
            months: 0,
            days: 0,
            nanoseconds: 0,
        },
        CqlType::Uuid => Value::Uuid([0; 16]),
        CqlType::Timeuuid => Value::Timeuuid([0; 16]),
        CqlType::Inet => Value::Inet(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)),
        CqlType::List { .. } => Value::List(Vec::new()),
        CqlType::Set { .. } => Value::Set(Vec::new()),
        CqlType::Map { .. } => Value::Map(Vec::new()),
        CqlType::Tuple(elements) => {
            Value::Tuple(elements.iter().map(|t| Some(default_of(t))).collect())
        }
        CqlType::Udt(user_type) => Value::Tuple(
            user_type
                .fields
                .iter()
                .map(|(_, t)| Some(default_of(t)))
                .collect(),
        ),
        CqlType::Vector { element, dimension } => {
            Value::Vector((0..*dimension).map(|_| default_of(element)).collect())
        }
        // Names are resolved to their definitions before a selection is compiled.
        CqlType::UdtName { .. } => Value::Tuple(Vec::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(value: &str) -> Option<Value> {
        Some(Value::Text(value.into()))
    }

    #[test]
    fn inner_and_outer_keep_what_they_say_and_pad_the_rest() {
        let inner = Masking::Inner {
            begin: 1,
            end: 2,
            padding: '#',
        };
        assert_eq!(
            inner.apply(text("secret"), &CqlType::Text, None),
            text("s###et")
        );
        let outer = Masking::Outer {
            begin: 1,
            end: 2,
            padding: '*',
        };
        assert_eq!(
            outer.apply(text("secret"), &CqlType::Text, None),
            text("*ecr**")
        );
        // More to keep than there is: all kept; more to pad: all padded.
        let wide = Masking::Inner {
            begin: 9,
            end: 9,
            padding: '*',
        };
        assert_eq!(wide.apply(text("abc"), &CqlType::Text, None), text("abc"));
        let all = Masking::Outer {
            begin: 9,
            end: 0,
            padding: '*',
        };
        assert_eq!(all.apply(text("héé"), &CqlType::Text, None), text("***"));
    }

    #[test]
    fn defaults_keep_the_type_and_hashes_are_digests_of_the_value() {
        assert_eq!(
            Masking::Default.apply(Some(Value::Int(7)), &CqlType::Int, None),
            Some(Value::Int(0))
        );
        assert_eq!(
            Masking::Default.apply(text("x"), &CqlType::Text, None),
            text("****")
        );
        assert_eq!(Masking::Null.apply(text("x"), &CqlType::Text, None), None);
        let hashed = Masking::Hash(&ring::digest::SHA256)
            .apply(Some(Value::Int(1)), &CqlType::Int, None)
            .unwrap();
        let expected = ring::digest::digest(&ring::digest::SHA256, &[0, 0, 0, 1]);
        assert_eq!(hashed, Value::Blob(expected.as_ref().to_vec()));
    }
}
