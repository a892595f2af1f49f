//! The selection clause of a SELECT, compiled once when the statement is planned: the
//! result columns (names and types, as drivers see them in the result metadata) and how
//! each is computed from a row — a column, `writetime`/`ttl`, `token`, an aggregate, a
//! conversion function, `toJson()`, or a term. `SELECT JSON` returns each row as one JSON
//! object in a single `[json]` text column.

use super::function_calls::{
    compile_function, compile_masking, compile_similarity, similarity_function,
};
use crate::functions;
use crate::select::grouping::Grouping;
use crate::values::{json, Bindings, Bound, TypedTerm};
use crate::{ensure, CqlError};
use shoal_cql::ast::{Select, Selector};
use shoal_cql::response::ColumnSpec;
use shoal_model::vector::Similarity;
use shoal_model::CqlType;
use shoal_schema::{ColumnKind, TableMetadata};

/// What one selected output column computes.
#[derive(Debug, Clone)]
pub(crate) enum Output {
    Column(usize),
    /// `writetime(c)` of a single-cell column: its cell's timestamp.
    WriteTime(usize),
    /// `ttl(c)` of a single-cell column.
    Ttl(usize),
    /// `writetime(c)` of a non-frozen collection or user-defined type: a `list<bigint>`,
    /// one timestamp per element (per field of a UDT, null where it has no cell).
    WriteTimes(usize),
    /// `ttl(c)` of a non-frozen collection or UDT: a `list<int>`, null where none.
    Ttls(usize),
    /// `maxwritetime(c)`: the latest timestamp of the column's cells.
    MaxWriteTime(usize),
    Token,
    /// An aggregate over the rows of the result (or of a group): `count(*)` has no
    /// argument; otherwise the argument is computed per row (`max(abs(v))`). Its running
    /// state is accumulator `slot` ([`Selection::aggregate_slots`]).
    Aggregate {
        function: Aggregate,
        argument: Option<Box<Output>>,
        argument_type: CqlType,
        slot: usize,
    },
    /// A native function of one argument, or a CAST ([`functions`]).
    Call {
        call: functions::Call,
        argument: Box<Output>,
    },
    /// `similarity_cosine|euclidean|dot_product(a, b)` of two `vector<float, n>`.
    Similarity {
        similarity: Similarity,
        arguments: Box<[Output; 2]>,
    },
    /// A masking function ([`crate::masking`]): `arguments` are the masked value and, for
    /// `mask_replace`, the replacement (a term).
    Mask {
        masking: crate::masking::Masking,
        value_type: CqlType,
        arguments: Vec<Output>,
    },
    /// `toJson(argument)`: the argument's value as JSON text.
    ToJson {
        argument: Box<Output>,
        cql_type: CqlType,
    },
    Constant(Option<Vec<u8>>),
    /// A term evaluated once per execution (`now()`, a bind marker, a literal).
    Term(TypedTerm),
    /// `argument.field`: field `index` of a user-defined type's value.
    Field {
        argument: Box<Output>,
        index: usize,
    },
}

/// The aggregate functions of CQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Aggregate {
    Count,
    Min,
    Max,
    Sum,
    Avg,
}

impl Output {
    /// The outputs this one computes its value from.
    pub(crate) fn arguments(&self) -> &[Output] {
        match self {
            Output::Call { argument, .. }
            | Output::ToJson { argument, .. }
            | Output::Field { argument, .. } => std::slice::from_ref(argument),
            Output::Aggregate {
                argument: Some(argument),
                ..
            } => std::slice::from_ref(argument),
            Output::Similarity { arguments, .. } => &arguments[..],
            Output::Mask { arguments, .. } => arguments,
            _ => &[],
        }
    }

    fn arguments_mut(&mut self) -> &mut [Output] {
        match self {
            Output::Call { argument, .. }
            | Output::ToJson { argument, .. }
            | Output::Field { argument, .. } => std::slice::from_mut(argument),
            Output::Aggregate {
                argument: Some(argument),
                ..
            } => std::slice::from_mut(argument),
            Output::Similarity { arguments, .. } => &mut arguments[..],
            Output::Mask { arguments, .. } => arguments,
            _ => &mut [],
        }
    }

    /// True when the output holds a term (at any depth) still to evaluate.
    fn has_terms(&self) -> bool {
        matches!(self, Output::Term(_)) || self.arguments().iter().any(Output::has_terms)
    }

    /// True when the output lists the write times or TTLs of a collection's elements.
    fn reads_element_times(&self) -> bool {
        matches!(self, Output::WriteTimes(_) | Output::Ttls(_))
            || self.arguments().iter().any(Output::reads_element_times)
    }

    /// True when the output is an aggregate or is computed from one (`abs(max(v))`).
    pub(crate) fn has_aggregate(&self) -> bool {
        matches!(self, Output::Aggregate { .. })
            || self.arguments().iter().any(Output::has_aggregate)
    }

    /// Numbers the aggregates inside the output from `next` on; returns the next free one.
    fn number_aggregates(&mut self, mut next: usize) -> usize {
        if let Output::Aggregate { slot, .. } = self {
            *slot = next;
            next += 1;
        }
        for argument in self.arguments_mut() {
            next = argument.number_aggregates(next);
        }
        next
    }

    /// Evaluates every term inside the output to a constant (once per execution).
    fn bind_terms(&mut self, bindings: Bindings<'_>) -> Result<(), CqlError> {
        match self {
            Output::Term(term) => {
                let bytes = match term.evaluate(bindings)? {
                    Bound::Value(value) => Some(value.serialize()),
                    _ => None,
                };
                *self = Output::Constant(bytes);
            }
            other => {
                for argument in other.arguments_mut() {
                    argument.bind_terms(bindings)?;
                }
            }
        }
        Ok(())
    }
}

/// What a SELECT returns: the result columns and how each is computed.
#[derive(Debug, Clone)]
pub(crate) struct Selection {
    pub(crate) columns: Vec<ColumnSpec>,
    pub(crate) outputs: Vec<Output>,
    pub(crate) aggregate: bool,
    /// How many aggregates the outputs hold (each has its running state while rows are
    /// aggregated).
    pub(crate) aggregate_slots: usize,
    /// Some output lists a collection's per-element write times or TTLs: rows keep them.
    pub(crate) element_times: bool,
    /// `SELECT JSON`: the columns each row's JSON object holds (`columns` is then the one
    /// `[json]` column the client sees).
    pub(crate) json: Option<Vec<ColumnSpec>>,
    /// `GROUP BY`: one result row per group of consecutive rows (see [`Grouping`]).
    pub(crate) grouping: Option<Grouping>,
}

impl Selection {
    /// The selection for one execution: terms evaluated to constants. Borrowed as is when
    /// it has none (the usual case).
    pub(crate) fn bind(
        &self,
        bindings: Bindings<'_>,
    ) -> Result<std::borrow::Cow<'_, Selection>, CqlError> {
        if !self.outputs.iter().any(Output::has_terms) {
            return Ok(std::borrow::Cow::Borrowed(self));
        }
        let mut bound = self.clone();
        for output in &mut bound.outputs {
            output.bind_terms(bindings)?;
        }
        Ok(std::borrow::Cow::Owned(bound))
    }

    /// A row as the client receives it: as computed, or for `SELECT JSON` one JSON object
    /// of every output by its column name.
    pub(crate) fn finish_row(
        &self,
        cells: Vec<Option<Vec<u8>>>,
    ) -> Result<Vec<Option<Vec<u8>>>, CqlError> {
        let Some(columns) = &self.json else {
            return Ok(cells);
        };
        let mut object = String::from("{");
        for (i, (column, cell)) in columns.iter().zip(&cells).enumerate() {
            if i > 0 {
                object.push_str(", ");
            }
            // Names that need quotes in CQL keep them in the JSON key, as in Cassandra.
            object.push_str(&json::json_key(&column.name));
            object.push_str(": ");
            let value = cell
                .as_ref()
                .map(|bytes| shoal_model::Value::deserialize(&column.cql_type, bytes))
                .transpose()?;
            object.push_str(&json::optional_to_json(value.as_ref(), &column.cql_type));
        }
        object.push('}');
        Ok(vec![Some(object.into_bytes())])
    }
}

fn spec(table: &TableMetadata, name: String, cql_type: CqlType) -> ColumnSpec {
    ColumnSpec {
        keyspace: table.keyspace.clone(),
        table: table.name.clone(),
        name,
        cql_type,
    }
}

/// Compiles a SELECT's selection clause against its table (once, when it is planned).
pub(crate) fn compile_selection(
    table: &TableMetadata,
    select: &Select,
) -> Result<Selection, CqlError> {
    let mut columns = Vec::new();
    let mut outputs = Vec::new();
    if select.items.is_empty() {
        for (index, column) in table.columns.iter().enumerate() {
            if select.distinct
                && !matches!(column.kind, ColumnKind::PartitionKey | ColumnKind::Static)
            {
                continue;
            }
            columns.push(spec(table, column.name.clone(), column.cql_type.clone()));
            outputs.push(Output::Column(index));
        }
    }
    for item in &select.items {
        let (name, cql_type, output) = compile_selector(table, select, item)?;
        columns.push(spec(table, item.alias.clone().unwrap_or(name), cql_type));
        outputs.push(output);
    }
    let aggregate = outputs.iter().any(Output::has_aggregate);
    let aggregate_slots = outputs
        .iter_mut()
        .fold(0, |next, output| output.number_aggregates(next));
    let element_times = outputs.iter().any(Output::reads_element_times);
    let json = select.json.then(|| {
        std::mem::replace(
            &mut columns,
            vec![spec(table, "[json]".to_string(), CqlType::Text)],
        )
    });
    Ok(Selection {
        columns,
        outputs,
        aggregate,
        aggregate_slots,
        element_times,
        json,
        grouping: Grouping::of(table, select)?,
    })
}

/// One selected item: its result column's name and type, and what computes it.
fn compile_selector(
    table: &TableMetadata,
    select: &Select,
    item: &shoal_cql::ast::SelectItem,
) -> Result<(String, CqlType, Output), CqlError> {
    Ok(match &item.selector {
        Selector::Column(name) => {
            let (index, column) = table.require_column(name)?;
            if select.distinct {
                ensure(
                    matches!(column.kind, ColumnKind::PartitionKey | ColumnKind::Static),
                    || {
                        CqlError::invalid(format!("SELECT DISTINCT queries must only request partition key columns and/or static columns (not {name})"))
                    },
                )?;
            }
            (name.clone(), column.cql_type.clone(), Output::Column(index))
        }
        Selector::WriteTime(name) => compile_timed(table, name, Timed::WriteTime)?,
        Selector::MaxWriteTime(name) => compile_timed(table, name, Timed::MaxWriteTime)?,
        Selector::Ttl(name) => compile_timed(table, name, Timed::Ttl)?,
        Selector::CountAll => (
            "count".to_string(),
            CqlType::Bigint,
            Output::Aggregate {
                function: Aggregate::Count,
                argument: None,
                argument_type: CqlType::Bigint,
                slot: 0,
            },
        ),
        Selector::Token(names) => compile_token(table, names)?,
        Selector::Function { name, arguments }
            if name.eq_ignore_ascii_case("tojson") && arguments.len() == 1 =>
        {
            let (shown, cql_type, output) = compile_argument(table, select, &arguments[0])?;
            (
                format!("system.tojson({shown})"),
                CqlType::Text,
                Output::ToJson {
                    argument: Box::new(output),
                    cql_type,
                },
            )
        }
        Selector::Function { name, arguments }
            if arguments.len() == 1 && functions::is_scalar(&name.to_ascii_lowercase()) =>
        {
            let function = name.to_ascii_lowercase();
            let (shown, argument_type, argument) = compile_argument(table, select, &arguments[0])?;
            let call = functions::resolve(&function, &argument_type)?;
            (
                format!("system.{function}({shown})"),
                call.return_type.clone(),
                Output::Call {
                    call,
                    argument: Box::new(argument),
                },
            )
        }
        Selector::Function { name, arguments }
            if crate::masking::is_masking(&name.to_ascii_lowercase()) =>
        {
            compile_masking(table, select, &name.to_ascii_lowercase(), arguments)?
        }
        Selector::Function { name, arguments } if similarity_function(name).is_some() => {
            compile_similarity(table, select, name, arguments)?
        }
        Selector::Function { name, arguments } => compile_function(table, select, name, arguments)?,
        Selector::Cast { selector, cql_type } => {
            let (shown, argument_type, argument) = compile_argument(table, select, selector)?;
            match functions::resolve_cast(&argument_type, cql_type)? {
                // A cast to the value's own type is the value, named as it is.
                None => (shown, argument_type, argument),
                Some(call) => (
                    format!("cast({shown} as {cql_type})"),
                    cql_type.clone(),
                    Output::Call {
                        call,
                        argument: Box::new(argument),
                    },
                ),
            }
        }
        Selector::Field { selector, field } => compile_field(table, select, selector, field)?,
        Selector::Literal(term) => compile_literal(term)?,
    })
}

/// Which time of a column a selector reads.
#[derive(Clone, Copy)]
enum Timed {
    WriteTime,
    MaxWriteTime,
    Ttl,
}

/// `writetime(c)`, `maxwritetime(c)` or `ttl(c)`: one time per cell — a list of them for
/// a non-frozen collection or user-defined type (one cell per element).
fn compile_timed(
    table: &TableMetadata,
    name: &str,
    timed: Timed,
) -> Result<(String, CqlType, Output), CqlError> {
    let what = match timed {
        Timed::WriteTime => "writetime",
        Timed::MaxWriteTime => "maxwritetime",
        Timed::Ttl => "ttl",
    };
    let (index, column) = table.require_column(name)?;
    ensure(
        !matches!(
            column.kind,
            ColumnKind::PartitionKey | ColumnKind::Clustering
        ),
        || {
            CqlError::invalid(format!(
                "Cannot use selection function {what} on PRIMARY KEY part {name}"
            ))
        },
    )?;
    let per_element = column.cql_type.is_multi_cell();
    let list_of = |element: CqlType| CqlType::List {
        element: Box::new(element),
        frozen: false,
    };
    let shown = format!("{what}({name})");
    Ok(match (timed, per_element) {
        (Timed::WriteTime, false) => (shown, CqlType::Bigint, Output::WriteTime(index)),
        (Timed::WriteTime, true) => (shown, list_of(CqlType::Bigint), Output::WriteTimes(index)),
        (Timed::MaxWriteTime, _) => (shown, CqlType::Bigint, Output::MaxWriteTime(index)),
        (Timed::Ttl, false) => (shown, CqlType::Int, Output::Ttl(index)),
        (Timed::Ttl, true) => (shown, list_of(CqlType::Int), Output::Ttls(index)),
    })
}

/// `token(k1, k2, …)`: the partition key's columns, in order.
fn compile_token(
    table: &TableMetadata,
    names: &[String],
) -> Result<(String, CqlType, Output), CqlError> {
    let expected: Vec<&str> = table.partition_key().map(|c| c.name.as_str()).collect();
    ensure(
        names
            .iter()
            .map(String::as_str)
            .eq(expected.iter().copied()),
        || {
            CqlError::invalid(format!(
                "token() must be called with the partition key columns in order: {}",
                expected.join(", ")
            ))
        },
    )?;
    Ok((
        format!("system.token({})", names.join(", ")),
        CqlType::Bigint,
        Output::Token,
    ))
}

/// `selector.field`: a field of a user-defined type's value.
fn compile_field(
    table: &TableMetadata,
    select: &Select,
    selector: &Selector,
    field: &str,
) -> Result<(String, CqlType, Output), CqlError> {
    let (shown, argument_type, argument) = compile_argument(table, select, selector)?;
    let user_type = argument_type.as_udt().ok_or_else(|| {
        CqlError::invalid(format!(
            "Invalid field selection: {shown} of type {argument_type} is not a user type"
        ))
    })?;
    let index = user_type.field_index(field).ok_or_else(|| {
        CqlError::invalid(format!(
            "{shown} of type {} has no field {field}",
            user_type.name
        ))
    })?;
    Ok((
        format!("{shown}.{field}"),
        user_type.fields[index].1.clone(),
        Output::Field {
            argument: Box::new(argument),
            index,
        },
    ))
}

/// A literal (or bind marker) selected as a value: an integer is an `int`, a string a
/// `text`, a cast term its type.
fn compile_literal(term: &shoal_cql::ast::Term) -> Result<(String, CqlType, Output), CqlError> {
    let (cql_type, shown) = match term {
        shoal_cql::ast::Term::Literal(shoal_cql::ast::Literal::Integer(text)) => {
            (CqlType::Int, text.clone())
        }
        shoal_cql::ast::Term::Literal(shoal_cql::ast::Literal::String(text)) => {
            (CqlType::Text, format!("'{text}'"))
        }
        shoal_cql::ast::Term::Cast { cql_type, .. } => (cql_type.clone(), "?".to_string()),
        _ => (CqlType::Text, "literal".to_string()),
    };
    let output = Output::Term(TypedTerm::new(term, &cql_type, "selection")?);
    Ok((shown, cql_type, output))
}

/// The argument of a function or a CAST: any selector, an aggregate too (`abs(max(v))`
/// is computed from the aggregate's result).
pub(super) fn compile_argument(
    table: &TableMetadata,
    select: &Select,
    selector: &Selector,
) -> Result<(String, CqlType, Output), CqlError> {
    let item = shoal_cql::ast::SelectItem {
        selector: selector.clone(),
        alias: None,
    };
    compile_selector(table, select, &item)
}

/// The result columns a SELECT returns (for PREPARE), checking the selection.
pub(crate) fn result_columns(
    table: &TableMetadata,
    select: &Select,
) -> Result<Vec<ColumnSpec>, CqlError> {
    Ok(compile_selection(table, select)?.columns)
}
