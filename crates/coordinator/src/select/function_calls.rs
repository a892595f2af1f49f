//! Function calls in a selection: aggregates (`count`, `min`, `max`, `sum`, `avg`) and
//! native functions with any number of arguments (`compile_function`), the vector
//! similarity functions (`similarity_cosine(v, [..])` …) and the masking functions
//! (`mask_default(c)` …).

use super::selection::{compile_argument, Aggregate, Output};
use crate::values::TypedTerm;
use crate::{ensure, CqlError};
use shoal_cql::ast::{Select, Selector};
use shoal_model::vector::Similarity;
use shoal_model::CqlType;
use shoal_schema::TableMetadata;

/// The similarity `similarity_<name>` computes, for a function of that name.
pub(super) fn similarity_function(name: &str) -> Option<Similarity> {
    let lower = name.to_ascii_lowercase();
    Similarity::named(lower.strip_prefix("similarity_")?)
}

/// `similarity_<name>(a, b)`: both arguments `vector<float, n>` of one dimension; a
/// literal argument (`[0.1, 0.2, 0.3]`) takes the other argument's type.
pub(super) fn compile_similarity(
    table: &TableMetadata,
    select: &Select,
    name: &str,
    arguments: &[Selector],
) -> Result<(String, CqlType, Output), CqlError> {
    let function = format!("system.{}", name.to_ascii_lowercase());
    let similarity = similarity_function(name)
        .ok_or_else(|| CqlError::invalid(format!("Unknown function {function}")))?;
    let [left, right] = arguments else {
        return Err(CqlError::invalid(format!(
            "Invalid number of arguments in call to function {function}: 2 required but {} provided",
            arguments.len()
        )));
    };
    let is_literal = |selector: &Selector| matches!(selector, Selector::Literal(_));
    let typed = match (is_literal(left), is_literal(right)) {
        (true, true) => {
            return Err(CqlError::invalid(format!(
                "Cannot infer type of argument in call to function {function}: use type casts to disambiguate"
            )))
        }
        (true, false) => right,
        _ => left,
    };
    let (_, vector_type, _) = compile_argument(table, select, typed)?;
    ensure(
        matches!(&vector_type, CqlType::Vector { element, .. } if **element == CqlType::Float),
        || {
            CqlError::invalid(format!(
                "Function {function} requires a float vector argument, but found argument of type {vector_type}"
            ))
        },
    )?;
    let mut compiled = Vec::with_capacity(2);
    let mut shown = Vec::with_capacity(2);
    for argument in [left, right] {
        let (text, output) = match argument {
            Selector::Literal(term) => (
                literal_text(term),
                Output::Term(TypedTerm::new(term, &vector_type, &function)?),
            ),
            other => {
                let (text, argument_type, output) = compile_argument(table, select, other)?;
                ensure(argument_type == vector_type, || {
                    CqlError::invalid(format!(
                        "All arguments of {function} must be of one vector type, got {vector_type} and {argument_type}"
                    ))
                })?;
                (text, output)
            }
        };
        shown.push(text);
        compiled.push(output);
    }
    let arguments: [Output; 2] = compiled
        .try_into()
        .map_err(|_| CqlError::server("a similarity has two arguments"))?;
    Ok((
        format!("{function}({})", shown.join(", ")),
        CqlType::Float,
        Output::Similarity {
            similarity,
            arguments: Box::new(arguments),
        },
    ))
}

/// `mask_…(value, …)`: the value any selector, the other arguments constants.
pub(super) fn compile_masking(
    table: &TableMetadata,
    select: &Select,
    name: &str,
    arguments: &[Selector],
) -> Result<(String, CqlType, Output), CqlError> {
    let Some((value, rest)) = arguments.split_first() else {
        return Err(CqlError::invalid(format!(
            "Invalid number of arguments for function system.{name}: 0 given"
        )));
    };
    let (shown, value_type, value) = compile_argument(table, select, value)?;
    let compiled = crate::masking::Masking::compile(name, &value_type, rest)?;
    let mut shown_arguments = vec![shown];
    shown_arguments.extend(rest.iter().map(|selector| match selector {
        Selector::Literal(shoal_cql::ast::Term::Literal(shoal_cql::ast::Literal::String(text))) => {
            format!("'{text}'")
        }
        Selector::Literal(term) => literal_text(term),
        _ => "?".to_string(),
    }));
    let mut outputs = vec![value];
    outputs.extend(compiled.replacement.map(Output::Term));
    Ok((
        format!("system.{name}({})", shown_arguments.join(", ")),
        compiled.result_type,
        Output::Mask {
            masking: compiled.masking,
            value_type,
            arguments: outputs,
        },
    ))
}

/// A literal as the query wrote it, for a result column's name.
fn literal_text(term: &shoal_cql::ast::Term) -> String {
    use shoal_cql::ast::{Literal, Term};
    match term {
        Term::Literal(Literal::Integer(text) | Literal::Float(text)) => text.clone(),
        Term::Negative(inner) => format!("-{}", literal_text(inner)),
        Term::List(elements) => format!(
            "[{}]",
            elements
                .iter()
                .map(literal_text)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Term::Bind(_) => "?".to_string(),
        _ => "literal".to_string(),
    }
}

/// An aggregate of one argument, or a function without arguments.
pub(super) fn compile_function(
    table: &TableMetadata,
    select: &Select,
    name: &str,
    arguments: &[Selector],
) -> Result<(String, CqlType, Output), CqlError> {
    let function = name.to_ascii_lowercase();
    let aggregate = match function.as_str() {
        "count" => Some(Aggregate::Count),
        "min" => Some(Aggregate::Min),
        "max" => Some(Aggregate::Max),
        "sum" => Some(Aggregate::Sum),
        "avg" => Some(Aggregate::Avg),
        _ => None,
    };
    Ok(match (aggregate, arguments) {
        (Some(aggregate), [argument]) => {
            let (shown, argument_type, argument) = compile_argument(table, select, argument)?;
            ensure(!argument.has_aggregate(), || {
                CqlError::invalid(format!(
                    "Aggregate {shown} cannot be the argument of another aggregate"
                ))
            })?;
            if matches!(aggregate, Aggregate::Sum | Aggregate::Avg) {
                ensure(argument_type.is_numeric(), || {
                    CqlError::invalid(format!(
                        "Invalid call to function {function}: {shown} is not numeric"
                    ))
                })?;
            }
            let result_type = match aggregate {
                Aggregate::Count => CqlType::Bigint,
                _ => argument_type.clone(),
            };
            (
                format!("system.{function}({shown})"),
                result_type,
                Output::Aggregate {
                    function: aggregate,
                    argument: Some(Box::new(argument)),
                    argument_type,
                    slot: 0,
                },
            )
        }
        (None, [])
            if matches!(
                function.as_str(),
                "now"
                    | "uuid"
                    | "currenttimestamp"
                    | "currentdate"
                    | "currenttime"
                    | "currenttimeuuid"
            ) =>
        {
            let cql_type = match function.as_str() {
                "now" | "currenttimeuuid" => CqlType::Timeuuid,
                "uuid" => CqlType::Uuid,
                "currenttimestamp" => CqlType::Timestamp,
                "currentdate" => CqlType::Date,
                _ => CqlType::Time,
            };
            let term = shoal_cql::ast::Term::Function {
                name: function.clone(),
                arguments: Vec::new(),
            };
            let output = Output::Term(TypedTerm::new(&term, &cql_type, &function)?);
            (format!("system.{function}()"), cql_type, output)
        }
        _ => {
            return Err(CqlError::invalid(format!(
                "Unknown function '{function}' with {} arguments",
                arguments.len()
            )))
        }
    })
}
