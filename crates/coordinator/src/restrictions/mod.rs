//! WHERE clauses, analysed against a table's primary key once, bound to values on every
//! execution.
//!
//! Relations on the primary key decide *where* to read or write: equality (or IN) on
//! every partition key column names partitions; `token(...)` bounds name a token range;
//! equality/IN on a prefix of the clustering columns followed by at most one range names
//! clustering slices. Everything else is a row filter, allowed on reads only with
//! `ALLOW FILTERING` — Cassandra's rules, so the same queries are accepted and refused.
//!
//! [`WherePlan::analyse`] makes every one of those decisions from the statement's shape
//! (which column, which operator), with each value left as a [`TypedTerm`];
//! [`WherePlan::bind`] evaluates the terms of one execution into [`Restrictions`]: keys,
//! slices and filters. A prepared statement analyses once and binds per EXECUTE.

mod analyse;

use crate::values::{Bindings, TypedTerm};
use crate::{ensure, CqlError};
use shoal_cql::ast::{Operator, Term};
use shoal_model::clustering::encode_component;
use shoal_model::keys::{increment_prefix, serialize_partition_key};
use shoal_model::{CqlType, Value};
use shoal_schema::{ColumnKind, TableMetadata};
use shoal_storage::reader::ClusteringSlice;

/// Where the values of one restriction come from.
#[derive(Debug, Clone)]
enum ValuesSource {
    /// `c = x`, `c > x`, `CONTAINS x`.
    One(TypedTerm),
    /// `c IN (x, y, ?)`.
    Each(Vec<TypedTerm>),
    /// `c IN ?`: a bound list.
    List(TypedTerm),
}

impl ValuesSource {
    fn values(&self, bindings: Bindings<'_>) -> Result<Vec<Value>, CqlError> {
        match self {
            ValuesSource::One(term) => Ok(vec![term.value(bindings)?]),
            ValuesSource::Each(terms) => terms.iter().map(|t| t.value(bindings)).collect(),
            ValuesSource::List(term) => match term.value(bindings)? {
                Value::List(values) => Ok(values),
                _ => Err(CqlError::invalid(format!(
                    "Invalid IN value for {}",
                    term.receiver
                ))),
            },
        }
    }

    /// `IN (...)` or `IN ?` for a receiver of `cql_type`.
    fn in_list(term: &Term, cql_type: &CqlType, receiver: &str) -> Result<Self, CqlError> {
        match term {
            Term::Tuple(elements) | Term::List(elements) => Ok(ValuesSource::Each(
                elements
                    .iter()
                    .map(|e| TypedTerm::new(e, cql_type, receiver))
                    .collect::<Result<_, _>>()?,
            )),
            _ => {
                let list_type = CqlType::List {
                    element: Box::new(cql_type.clone()),
                    frozen: false,
                };
                Ok(ValuesSource::List(TypedTerm::new(
                    term, &list_type, receiver,
                )?))
            }
        }
    }
}

/// Tuples of clustering values: `(c1, c2) = (x, y)` or `(c1, c2) IN (...)`.
fn tuples(source: &ValuesSource, bindings: Bindings<'_>) -> Result<Vec<Vec<Value>>, CqlError> {
    source
        .values(bindings)?
        .into_iter()
        .map(|tuple| match tuple {
            Value::Tuple(elements) => elements
                .into_iter()
                .map(|e| e.ok_or_else(|| CqlError::invalid("Invalid null value in tuple")))
                .collect(),
            _ => Err(CqlError::invalid("Invalid tuple")),
        })
        .collect()
}

/// A row filter on one column.
#[derive(Debug, Clone)]
pub struct Filter {
    pub column: usize,
    pub operator: Operator,
    /// One value, or the IN list.
    pub values: Vec<Value>,
    /// For `m[key] = value` filters.
    pub map_key: Option<Value>,
}

/// A filter before its values are bound.
#[derive(Debug, Clone)]
struct FilterPlan {
    column: usize,
    operator: Operator,
    values: ValuesSource,
    map_key: Option<TypedTerm>,
}

/// A bound of a `token(...)` relation.
#[derive(Debug, Clone)]
enum TokenSource {
    /// `token(k) > 42`.
    Value(TypedTerm),
    /// `token(k) > token(?)`: the token of a partition key.
    Key(Vec<TypedTerm>),
}

impl TokenSource {
    fn token(&self, table: &TableMetadata, bindings: Bindings<'_>) -> Result<i64, CqlError> {
        match self {
            TokenSource::Value(term) => match term.value(bindings)? {
                Value::Bigint(token) => Ok(token),
                _ => Err(CqlError::invalid("Invalid token value")),
            },
            TokenSource::Key(components) => {
                let serialized: Vec<Vec<u8>> = components
                    .iter()
                    .map(|c| c.value(bindings).map(|v| v.serialize()))
                    .collect::<Result<_, _>>()?;
                Ok(table.token(&serialize_partition_key(&serialized)).0)
            }
        }
    }
}

/// One bound of the clustering slice: a single column or a multi-column tuple.
#[derive(Debug, Clone)]
struct SliceBound {
    /// The clustering positions it covers (one, or several for a tuple).
    positions: Vec<usize>,
    values: ValuesSource,
    inclusive: bool,
}

/// A storage-order bound on clustering bytes (after the EQ/IN prefix).
#[derive(Debug, Clone)]
struct StorageBound {
    bytes: Vec<u8>,
    inclusive: bool,
}

/// The clustering EQ/IN prefix before binding: a multi-column tuple over the first
/// `tuple_width` columns, if any, then one source per following column.
#[derive(Debug, Clone, Default)]
struct PrefixPlan {
    /// `(c1, c2) = (...)` / `(c1, c2) IN (...)`.
    tuples: Option<ValuesSource>,
    tuple_width: usize,
    /// `c3 = x AND c4 IN (...)`, one source per column after the tuple.
    columns: Vec<ValuesSource>,
}

/// A WHERE clause analysed against a table: what to read or write, with its values still
/// to be bound.
#[derive(Debug, Clone, Default)]
pub struct WherePlan {
    /// One source per partition key column, when every one is restricted by EQ/IN.
    partition_keys: Option<Vec<ValuesSource>>,
    /// True when the partition key restriction used IN (several partitions may match).
    pub partition_in: bool,
    token_lower: Option<(TokenSource, bool)>,
    token_upper: Option<(TokenSource, bool)>,
    prefix: PrefixPlan,
    /// How many leading clustering columns EQ/IN restrict.
    pub clustering_prefix_columns: usize,
    /// Slice bounds in storage order (a DESC column's logical lower bound is its storage
    /// upper bound).
    lower: Option<SliceBound>,
    upper: Option<SliceBound>,
    /// True when a clustering range (slice) relation is present.
    pub has_clustering_slice: bool,
    filters: Vec<FilterPlan>,
    /// Restrictions that need ALLOW FILTERING on a read.
    pub needs_filtering: bool,
}

/// A WHERE clause with one execution's values: keys, token bounds, slices, filters.
#[derive(Debug, Default)]
pub struct Restrictions {
    /// Serialized partition keys, when every partition key column is restricted by EQ/IN.
    pub partition_keys: Option<Vec<Vec<u8>>>,
    /// Token bounds from `token(...)` relations: (value, inclusive).
    pub token_lower: Option<(i64, bool)>,
    pub token_upper: Option<(i64, bool)>,
    /// Encoded clustering prefixes from EQ/IN on the leading clustering columns.
    pub clustering_prefixes: Vec<Vec<u8>>,
    /// How many leading clustering columns EQ/IN restrict.
    pub clustering_prefix_columns: usize,
    lower: Option<StorageBound>,
    upper: Option<StorageBound>,
    /// True when a clustering range (slice) relation is present.
    pub has_clustering_slice: bool,
    pub filters: Vec<Filter>,
}

/// The index in `table.columns` of the key column of `kind` at `position`.
fn key_column_index(table: &TableMetadata, kind: ColumnKind, position: usize) -> usize {
    table
        .columns
        .iter()
        .position(|c| c.kind == kind && c.position as usize == position)
        .unwrap_or(0)
}

/// Encodes one clustering component as stored.
pub fn encode_clustering_value(
    table: &TableMetadata,
    clustering_index: usize,
    value: &Value,
) -> Vec<u8> {
    let descending = table
        .clustering()
        .nth(clustering_index)
        .is_some_and(|c| c.descending);
    let mut out = Vec::new();
    encode_component(&mut out, value, descending);
    out
}

/// An EQ/IN restriction that cannot narrow the read, kept as a row filter.
fn equality_filter(
    table: &TableMetadata,
    kind: ColumnKind,
    position: usize,
    values: ValuesSource,
) -> FilterPlan {
    let operator = match values {
        ValuesSource::One(_) => Operator::Eq,
        _ => Operator::In,
    };
    FilterPlan {
        column: key_column_index(table, kind, position),
        operator,
        values,
        map_key: None,
    }
}

impl WherePlan {
    /// True when the partition key is restricted by EQ/IN on every column.
    pub fn names_partitions(&self) -> bool {
        self.partition_keys.is_some()
    }

    /// Each filter's `(column index, operator, is a map entry)`, in the order of
    /// [`Restrictions::filters`].
    pub fn filter_shapes(&self) -> Vec<(usize, Operator, bool)> {
        self.filters
            .iter()
            .map(|f| (f.column, f.operator, f.map_key.is_some()))
            .collect()
    }

    /// Also checks the EQ restriction on clustering column `position` (part of the EQ
    /// prefix) as a row filter, so an index on that column can answer a scan; `false`
    /// when it is not a single-column EQ.
    pub fn filter_clustering_eq(&mut self, table: &TableMetadata, position: usize) -> bool {
        if self.prefix.tuples.is_some() {
            return false;
        }
        match self.prefix.columns.get(position) {
            Some(source @ ValuesSource::One(_)) => {
                let filter =
                    equality_filter(table, ColumnKind::Clustering, position, source.clone());
                self.filters.push(filter);
                true
            }
            _ => false,
        }
    }

    /// True when the restrictions pin down whole rows: every clustering column by EQ/IN.
    pub fn names_full_rows(&self, table: &TableMetadata) -> bool {
        self.clustering_prefix_columns == table.clustering_count() && !self.has_clustering_slice
    }

    /// True when a `token(...)` relation bounds the read.
    pub fn has_token_bounds(&self) -> bool {
        self.token_lower.is_some() || self.token_upper.is_some()
    }

    /// The first filter's column, if any (modifications refuse filters).
    pub fn first_filter_column(&self) -> Option<usize> {
        self.filters.first().map(|f| f.column)
    }

    /// The restrictions with this execution's values.
    pub fn bind(
        &self,
        table: &TableMetadata,
        bindings: Bindings<'_>,
    ) -> Result<Restrictions, CqlError> {
        let partition_keys = match &self.partition_keys {
            Some(components) => Some(partition_keys(components, bindings)?),
            None => None,
        };
        let token = |bound: &Option<(TokenSource, bool)>| -> Result<Option<(i64, bool)>, CqlError> {
            bound
                .as_ref()
                .map(|(source, inclusive)| Ok((source.token(table, bindings)?, *inclusive)))
                .transpose()
        };
        let bound = |slice: &Option<SliceBound>| -> Result<Option<StorageBound>, CqlError> {
            slice
                .as_ref()
                .map(|slice| {
                    let values = match slice.positions.as_slice() {
                        [_] => slice.values.values(bindings)?,
                        _ => tuples(&slice.values, bindings)?
                            .into_iter()
                            .next()
                            .unwrap_or_default(),
                    };
                    let mut bytes = Vec::new();
                    for (position, value) in slice.positions.iter().zip(&values) {
                        bytes.extend(encode_clustering_value(table, *position, value));
                    }
                    Ok(StorageBound {
                        bytes,
                        inclusive: slice.inclusive,
                    })
                })
                .transpose()
        };
        let filters = self
            .filters
            .iter()
            .map(|filter| {
                Ok(Filter {
                    column: filter.column,
                    operator: filter.operator,
                    values: filter.values.values(bindings)?,
                    map_key: filter
                        .map_key
                        .as_ref()
                        .map(|key| key.value(bindings))
                        .transpose()?,
                })
            })
            .collect::<Result<_, CqlError>>()?;
        Ok(Restrictions {
            partition_keys,
            token_lower: token(&self.token_lower)?,
            token_upper: token(&self.token_upper)?,
            clustering_prefixes: clustering_prefixes(table, &self.prefix, bindings)?,
            clustering_prefix_columns: self.clustering_prefix_columns,
            lower: bound(&self.lower)?,
            upper: bound(&self.upper)?,
            has_clustering_slice: self.has_clustering_slice,
            filters,
        })
    }
}

/// Every combination of the components' values, serialized, sorted and deduplicated.
fn partition_keys(
    components: &[ValuesSource],
    bindings: Bindings<'_>,
) -> Result<Vec<Vec<u8>>, CqlError> {
    // The common case, one component with one value: its bytes are the key.
    if let [ValuesSource::One(term)] = components {
        return Ok(vec![term.value(bindings)?.serialize()]);
    }
    let mut keys: Vec<Vec<Vec<u8>>> = vec![Vec::new()];
    for component in components {
        let values = component.values(bindings)?;
        let mut next = Vec::with_capacity(keys.len() * values.len());
        for key in &keys {
            for value in &values {
                let mut extended = key.clone();
                extended.push(value.serialize());
                next.push(extended);
            }
        }
        keys = next;
        ensure(keys.len() <= 65_536, || {
            CqlError::invalid("IN restrictions produce too many partition keys (more than 65536)")
        })?;
    }
    let mut serialized: Vec<Vec<u8>> = keys
        .iter()
        .map(|components| serialize_partition_key(components))
        .collect();
    serialized.sort();
    serialized.dedup();
    Ok(serialized)
}

/// The encoded clustering prefixes of the EQ/IN restrictions, sorted and deduplicated.
fn clustering_prefixes(
    table: &TableMetadata,
    prefix: &PrefixPlan,
    bindings: Bindings<'_>,
) -> Result<Vec<Vec<u8>>, CqlError> {
    let mut prefixes: Vec<Vec<u8>> = match &prefix.tuples {
        None => vec![Vec::new()],
        Some(source) => tuples(source, bindings)?
            .iter()
            .map(|tuple| {
                let mut bytes = Vec::new();
                for (i, value) in tuple.iter().enumerate() {
                    bytes.extend(encode_clustering_value(table, i, value));
                }
                bytes
            })
            .collect(),
    };
    for (offset, source) in prefix.columns.iter().enumerate() {
        let position = prefix.tuple_width + offset;
        let values = source.values(bindings)?;
        let mut next = Vec::with_capacity(prefixes.len() * values.len());
        for prefix in &prefixes {
            for value in &values {
                let mut extended = prefix.clone();
                extended.extend(encode_clustering_value(table, position, value));
                next.push(extended);
            }
        }
        prefixes = next;
    }
    prefixes.sort();
    prefixes.dedup();
    Ok(prefixes)
}

impl Restrictions {
    /// True when the restrictions pin down whole rows: every clustering column by EQ/IN.
    pub fn names_full_rows(&self, table: &TableMetadata) -> bool {
        self.clustering_prefix_columns == table.clustering_count() && !self.has_clustering_slice
    }

    /// Clustering slices in storage order.
    pub fn slices(&self) -> Vec<ClusteringSlice> {
        let mut slices = Vec::with_capacity(self.clustering_prefixes.len());
        for prefix in &self.clustering_prefixes {
            let lower = match &self.lower {
                Some(bound) => {
                    let mut bytes = prefix.clone();
                    bytes.extend_from_slice(&bound.bytes);
                    if bound.inclusive {
                        Some(bytes)
                    } else {
                        increment_prefix(&bytes)
                    }
                }
                None => Some(prefix.clone()),
            };
            let Some(lower) = lower else { continue };
            let upper = match &self.upper {
                Some(bound) => {
                    let mut bytes = prefix.clone();
                    bytes.extend_from_slice(&bound.bytes);
                    if bound.inclusive {
                        increment_prefix(&bytes)
                    } else {
                        Some(bytes)
                    }
                }
                None if prefix.is_empty() => None,
                None => increment_prefix(prefix),
            };
            if let Some(upper) = &upper {
                if *upper <= lower {
                    continue;
                }
            }
            slices.push(ClusteringSlice { lower, upper });
        }
        slices
    }
}
