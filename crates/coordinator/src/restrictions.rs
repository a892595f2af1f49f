//! WHERE clauses, analysed against a table's primary key.
//!
//! Relations on the primary key decide *where* to read or write: equality (or IN) on
//! every partition key column names partitions; `token(...)` bounds name a token range;
//! equality/IN on a prefix of the clustering columns followed by at most one range names
//! clustering slices. Everything else is a row filter, allowed on reads only with
//! `ALLOW FILTERING` — Cassandra's rules, so the same queries are accepted and refused.

use crate::values::{evaluate, Bindings, Bound};
use crate::{ensure, CqlError};
use shoal_cql::ast::{Operator, Relation, RelationTarget, Term};
use shoal_model::clustering::encode_component;
use shoal_model::keys::{increment_prefix, serialize_partition_key};
use shoal_model::{CqlType, Value};
use shoal_schema::{ColumnKind, TableMetadata};
use shoal_storage::reader::ClusteringSlice;

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

/// A storage-order bound on clustering bytes (after the EQ/IN prefix).
#[derive(Debug, Clone)]
struct StorageBound {
    bytes: Vec<u8>,
    inclusive: bool,
}

#[derive(Debug, Default)]
pub struct Restrictions {
    /// Serialized partition keys, when every partition key column is restricted by EQ/IN.
    pub partition_keys: Option<Vec<Vec<u8>>>,
    /// True when the partition key restriction used IN (several partitions may match).
    pub partition_in: bool,
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
    /// Restrictions that need ALLOW FILTERING on a read.
    pub needs_filtering: bool,
}

fn eval_value(
    term: &Term,
    cql_type: &CqlType,
    bindings: Bindings<'_>,
    receiver: &str,
) -> Result<Value, CqlError> {
    match evaluate(term, cql_type, bindings, receiver)? {
        Bound::Value(value) => Ok(value),
        Bound::Null => Err(CqlError::invalid(format!(
            "Invalid null value in condition for column {receiver}"
        ))),
        Bound::Unset => Err(CqlError::invalid(format!(
            "Invalid unset value for column {receiver}"
        ))),
    }
}

/// The values of an `IN` term: a literal list `(a, b)` or a bound list.
fn in_values(
    term: &Term,
    cql_type: &CqlType,
    bindings: Bindings<'_>,
    receiver: &str,
) -> Result<Vec<Value>, CqlError> {
    match term {
        Term::Tuple(elements) | Term::List(elements) => elements
            .iter()
            .map(|e| eval_value(e, cql_type, bindings, receiver))
            .collect(),
        _ => {
            let list_type = CqlType::List {
                element: Box::new(cql_type.clone()),
                frozen: false,
            };
            match eval_value(term, &list_type, bindings, receiver)? {
                Value::List(values) => Ok(values),
                _ => Err(CqlError::invalid(format!(
                    "Invalid IN value for {receiver}"
                ))),
            }
        }
    }
}

fn in_tuples(
    term: &Term,
    types: &[CqlType],
    bindings: Bindings<'_>,
    receiver: &str,
) -> Result<Vec<Vec<Value>>, CqlError> {
    let tuple_type = CqlType::Tuple(types.to_vec());
    let tuples: Vec<Value> = match term {
        Term::Tuple(elements) | Term::List(elements) => elements
            .iter()
            .map(|e| eval_value(e, &tuple_type, bindings, receiver))
            .collect::<Result<_, _>>()?,
        _ => match eval_value(
            term,
            &CqlType::List {
                element: Box::new(tuple_type.clone()),
                frozen: false,
            },
            bindings,
            receiver,
        )? {
            Value::List(values) => values,
            _ => return Err(CqlError::invalid("Invalid IN value")),
        },
    };
    tuples
        .into_iter()
        .map(|tuple| match tuple {
            Value::Tuple(elements) => elements
                .into_iter()
                .map(|e| e.ok_or_else(|| CqlError::invalid("Invalid null value in IN tuple")))
                .collect(),
            _ => Err(CqlError::invalid("Invalid IN tuple")),
        })
        .collect()
}

/// The index in `table.columns` of the key column of `kind` at `position`.
fn key_column_index(table: &TableMetadata, kind: ColumnKind, position: usize) -> usize {
    table
        .columns
        .iter()
        .position(|c| c.kind == kind && c.position as usize == position)
        .unwrap_or(0)
}

/// An EQ/IN restriction that cannot narrow the read, kept as a row filter.
fn equality_filter(
    table: &TableMetadata,
    kind: ColumnKind,
    position: usize,
    values: Vec<Value>,
) -> Filter {
    let operator = if values.len() == 1 {
        Operator::Eq
    } else {
        Operator::In
    };
    Filter {
        column: key_column_index(table, kind, position),
        operator,
        values,
        map_key: None,
    }
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

impl Restrictions {
    pub fn analyse(
        table: &TableMetadata,
        relations: &[Relation],
        bindings: Bindings<'_>,
    ) -> Result<Restrictions, CqlError> {
        let mut restrictions = Restrictions::default();
        let partition_count = table.partition_key_count();
        let clustering_count = table.clustering_count();
        let mut partition_candidates: Vec<Option<Vec<Value>>> = vec![None; partition_count];
        let mut clustering_eq: Vec<Option<Vec<Value>>> = vec![None; clustering_count];
        let mut multi_column_prefixes: Option<(usize, Vec<Vec<Value>>)> = None;
        let mut clustering_ranges: Vec<(usize, Operator, Value)> = Vec::new();
        let mut multi_ranges = Vec::new();

        for relation in relations {
            match &relation.target {
                RelationTarget::Token(columns) => {
                    let expected: Vec<&str> =
                        table.partition_key().map(|c| c.name.as_str()).collect();
                    ensure(
                        columns
                            .iter()
                            .map(String::as_str)
                            .eq(expected.iter().copied()),
                        || {
                            CqlError::invalid(format!(
                            "The token function arguments must be in the partition key order: {}",
                            expected.join(", ")
                        ))
                        },
                    )?;
                    let token = match &relation.value {
                        // `token(k) >= token(?)`: the token of the given key.
                        Term::Function { name, arguments } if name == "token" => {
                            let key_columns: Vec<_> = table.partition_key().collect();
                            ensure(arguments.len() == key_columns.len(), || {
                                CqlError::invalid(format!(
                                    "token() on the right of a relation takes the {} partition key columns",
                                    key_columns.len()
                                ))
                            })?;
                            let mut components = Vec::with_capacity(arguments.len());
                            for (argument, column) in arguments.iter().zip(key_columns) {
                                components.push(
                                    eval_value(argument, &column.cql_type, bindings, &column.name)?
                                        .serialize(),
                                );
                            }
                            shoal_model::token::murmur3_token(&serialize_partition_key(&components))
                                .0
                        }
                        value => match eval_value(
                            value,
                            &CqlType::Bigint,
                            bindings,
                            "partition key token",
                        )? {
                            Value::Bigint(t) => t,
                            _ => return Err(CqlError::invalid("Invalid token value")),
                        },
                    };
                    match relation.operator {
                        Operator::Gt => restrictions.token_lower = Some((token, false)),
                        Operator::Gte => restrictions.token_lower = Some((token, true)),
                        Operator::Lt => restrictions.token_upper = Some((token, false)),
                        Operator::Lte => restrictions.token_upper = Some((token, true)),
                        Operator::Eq => {
                            restrictions.token_lower = Some((token, true));
                            restrictions.token_upper = Some((token, true));
                        }
                        _ => {
                            return Err(CqlError::invalid(
                                "Only EQ, LT, LTE, GT and GTE relations are supported on token()",
                            ))
                        }
                    }
                }
                RelationTarget::Columns(names) => {
                    let mut indexes = Vec::new();
                    for name in names {
                        let (_, column) = table.require_column(name)?;
                        ensure(column.kind == ColumnKind::Clustering, || {
                            CqlError::invalid(format!("Multi-column relations can only be applied to clustering columns but was applied to: {name}"))
                        })?;
                        indexes.push(column.position as usize);
                    }
                    ensure(
                        indexes
                            .iter()
                            .enumerate()
                            .all(|(i, p)| *p == i + indexes[0]),
                        || {
                            CqlError::invalid("Clustering columns must appear in the PRIMARY KEY order in multi-column relations")
                        },
                    )?;
                    let types: Vec<CqlType> = indexes
                        .iter()
                        .map(|i| {
                            table
                                .clustering()
                                .nth(*i)
                                .map(|c| c.cql_type.clone())
                                .unwrap_or(CqlType::Blob)
                        })
                        .collect();
                    match relation.operator {
                        Operator::Eq => {
                            let tuple = match eval_value(
                                &relation.value,
                                &CqlType::Tuple(types.clone()),
                                bindings,
                                "tuple",
                            )? {
                                Value::Tuple(elements) => elements
                                    .into_iter()
                                    .map(|e| {
                                        e.ok_or_else(|| {
                                            CqlError::invalid("Invalid null value in tuple")
                                        })
                                    })
                                    .collect::<Result<Vec<_>, _>>()?,
                                _ => return Err(CqlError::invalid("Invalid tuple")),
                            };
                            multi_column_prefixes = Some((indexes[0], vec![tuple]));
                        }
                        Operator::In => {
                            multi_column_prefixes = Some((
                                indexes[0],
                                in_tuples(&relation.value, &types, bindings, "tuple")?,
                            ))
                        }
                        Operator::Gt | Operator::Gte | Operator::Lt | Operator::Lte => {
                            let tuple = match eval_value(
                                &relation.value,
                                &CqlType::Tuple(types.clone()),
                                bindings,
                                "tuple",
                            )? {
                                Value::Tuple(elements) => elements
                                    .into_iter()
                                    .map(|e| {
                                        e.ok_or_else(|| {
                                            CqlError::invalid("Invalid null value in tuple")
                                        })
                                    })
                                    .collect::<Result<Vec<_>, _>>()?,
                                _ => return Err(CqlError::invalid("Invalid tuple")),
                            };
                            multi_ranges.push((indexes.clone(), relation.operator, tuple));
                        }
                        _ => {
                            return Err(CqlError::invalid(
                                "Unsupported operator for a multi-column relation",
                            ))
                        }
                    }
                }
                RelationTarget::MapEntry(name, key) => {
                    let (index, column) = table.require_column(name)?;
                    let CqlType::Map {
                        key: key_type,
                        value: value_type,
                        ..
                    } = &column.cql_type
                    else {
                        return Err(CqlError::invalid(format!(
                            "Column {name} cannot be used as a map"
                        )));
                    };
                    ensure(relation.operator == Operator::Eq, || {
                        CqlError::invalid("Only EQ relations are supported on map entries")
                    })?;
                    restrictions.filters.push(Filter {
                        column: index,
                        operator: Operator::Eq,
                        values: vec![eval_value(&relation.value, value_type, bindings, name)?],
                        map_key: Some(eval_value(key, key_type, bindings, name)?),
                    });
                    restrictions.needs_filtering = true;
                }
                RelationTarget::Column(name) => {
                    let (index, column) = table.require_column(name)?;
                    let operator = relation.operator;
                    ensure(operator != Operator::NotEq, || {
                        CqlError::invalid(format!("Unsupported \"!=\" relation: {name} != ..."))
                    })?;
                    ensure(operator != Operator::Like, || {
                        CqlError::invalid("LIKE restrictions are only supported on indexed columns")
                    })?;
                    let values = match operator {
                        Operator::In => {
                            in_values(&relation.value, &column.cql_type, bindings, name)?
                        }
                        Operator::Contains => {
                            let element = match &column.cql_type {
                                CqlType::List { element, .. } | CqlType::Set { element, .. } => element.as_ref().clone(),
                                CqlType::Map { value, .. } => value.as_ref().clone(),
                                other => return Err(CqlError::invalid(format!("Cannot use CONTAINS on non-collection column {name} of type {other}"))),
                            };
                            vec![eval_value(&relation.value, &element, bindings, name)?]
                        }
                        Operator::ContainsKey => {
                            let CqlType::Map { key, .. } = &column.cql_type else {
                                return Err(CqlError::invalid(format!(
                                    "Cannot use CONTAINS KEY on non-map column {name}"
                                )));
                            };
                            vec![eval_value(&relation.value, key, bindings, name)?]
                        }
                        _ => vec![eval_value(
                            &relation.value,
                            &column.cql_type,
                            bindings,
                            name,
                        )?],
                    };
                    match column.kind {
                        ColumnKind::PartitionKey
                            if matches!(operator, Operator::Eq | Operator::In) =>
                        {
                            let slot = &mut partition_candidates[column.position as usize];
                            ensure(slot.is_none(), || {
                                CqlError::invalid(format!("{name} cannot be restricted by more than one relation if it includes an Equal"))
                            })?;
                            if operator == Operator::In {
                                restrictions.partition_in = true;
                            }
                            *slot = Some(values);
                        }
                        ColumnKind::Clustering
                            if matches!(operator, Operator::Eq | Operator::In) =>
                        {
                            let slot = &mut clustering_eq[column.position as usize];
                            ensure(slot.is_none(), || {
                                CqlError::invalid(format!("{name} cannot be restricted by more than one relation if it includes an Equal"))
                            })?;
                            *slot = Some(values);
                        }
                        ColumnKind::Clustering
                            if matches!(
                                operator,
                                Operator::Gt | Operator::Gte | Operator::Lt | Operator::Lte
                            ) =>
                        {
                            clustering_ranges.push((
                                column.position as usize,
                                operator,
                                values.into_iter().next().unwrap_or(Value::Int(0)),
                            ));
                        }
                        // Ranges on partition key columns, and any relation on other
                        // columns, filter rows (Cassandra requires ALLOW FILTERING).
                        _ => {
                            restrictions.filters.push(Filter {
                                column: index,
                                operator,
                                values,
                                map_key: None,
                            });
                            restrictions.needs_filtering = true;
                        }
                    }
                }
            }
        }

        // Partition keys: every component restricted, or none (then: filter).
        let restricted = partition_candidates.iter().filter(|c| c.is_some()).count();
        if restricted == partition_count {
            let mut keys: Vec<Vec<Vec<u8>>> = vec![Vec::new()];
            for candidates in partition_candidates.iter().flatten() {
                let mut next = Vec::with_capacity(keys.len() * candidates.len());
                for key in &keys {
                    for value in candidates {
                        let mut extended = key.clone();
                        extended.push(value.serialize());
                        next.push(extended);
                    }
                }
                keys = next;
                ensure(keys.len() <= 65_536, || {
                    CqlError::invalid(
                        "IN restrictions produce too many partition keys (more than 65536)",
                    )
                })?;
            }
            let mut serialized: Vec<Vec<u8>> = keys
                .iter()
                .map(|components| serialize_partition_key(components))
                .collect();
            serialized.sort();
            serialized.dedup();
            restrictions.partition_keys = Some(serialized);
        } else if restricted > 0 {
            for (position, candidates) in partition_candidates.into_iter().enumerate() {
                if let Some(values) = candidates {
                    restrictions.filters.push(equality_filter(
                        table,
                        ColumnKind::PartitionKey,
                        position,
                        values,
                    ));
                }
            }
            restrictions.needs_filtering = true;
        }

        // Clustering: EQ/IN prefix, then at most one slice on the next column.
        let mut prefixes: Vec<Vec<u8>> = vec![Vec::new()];
        let mut prefix_columns = 0;
        if let Some((start, tuples)) = multi_column_prefixes {
            ensure(start == 0, || {
                CqlError::invalid(
                    "Multi-column relations must start at the first clustering column",
                )
            })?;
            let width = tuples.first().map_or(0, Vec::len);
            prefixes = tuples
                .iter()
                .map(|tuple| {
                    let mut bytes = Vec::new();
                    for (i, value) in tuple.iter().enumerate() {
                        bytes.extend(encode_clustering_value(table, i, value));
                    }
                    bytes
                })
                .collect();
            prefix_columns = width;
        }
        while prefix_columns < clustering_count {
            let Some(values) = clustering_eq[prefix_columns].take() else {
                break;
            };
            let mut next = Vec::with_capacity(prefixes.len() * values.len());
            for prefix in &prefixes {
                for value in &values {
                    let mut extended = prefix.clone();
                    extended.extend(encode_clustering_value(table, prefix_columns, value));
                    next.push(extended);
                }
            }
            prefixes = next;
            prefix_columns += 1;
        }
        // Leftover EQ/IN (a gap before them) become filters.
        for (position, leftover) in clustering_eq.into_iter().enumerate() {
            if let Some(values) = leftover {
                restrictions.filters.push(equality_filter(
                    table,
                    ColumnKind::Clustering,
                    position,
                    values,
                ));
                restrictions.needs_filtering = true;
            }
        }
        for (position, operator, value) in clustering_ranges {
            if position == prefix_columns {
                let column = table.clustering().nth(position).cloned();
                let descending = column.as_ref().is_some_and(|c| c.descending);
                let bytes = encode_clustering_value(table, position, &value);
                restrictions.set_slice_bound(operator, descending, bytes)?;
            } else {
                restrictions.filters.push(Filter {
                    column: key_column_index(table, ColumnKind::Clustering, position),
                    operator,
                    values: vec![value],
                    map_key: None,
                });
                restrictions.needs_filtering = true;
            }
        }
        for (indexes, operator, tuple) in multi_ranges {
            ensure(indexes.first() == Some(&prefix_columns), || {
                CqlError::invalid("Multi-column slice restrictions must start right after the equality restrictions")
            })?;
            let columns: Vec<_> = indexes
                .iter()
                .filter_map(|i| table.clustering().nth(*i))
                .collect();
            let descending = columns.first().is_some_and(|c| c.descending);
            ensure(columns.iter().all(|c| c.descending == descending), || {
                CqlError::invalid("Multi-column slices over columns of mixed clustering order are not supported by Shoal yet")
            })?;
            let mut bytes = Vec::new();
            for (i, value) in indexes.iter().zip(&tuple) {
                bytes.extend(encode_clustering_value(table, *i, value));
            }
            restrictions.set_slice_bound(operator, descending, bytes)?;
        }
        prefixes.sort();
        prefixes.dedup();
        restrictions.clustering_prefixes = prefixes;
        restrictions.clustering_prefix_columns = prefix_columns;
        Ok(restrictions)
    }

    fn set_slice_bound(
        &mut self,
        operator: Operator,
        descending: bool,
        bytes: Vec<u8>,
    ) -> Result<(), CqlError> {
        let inclusive = matches!(operator, Operator::Gte | Operator::Lte);
        let logical_lower = matches!(operator, Operator::Gt | Operator::Gte);
        let storage_lower = logical_lower != descending;
        let bound = Some(StorageBound { bytes, inclusive });
        let slot = if storage_lower {
            &mut self.lower
        } else {
            &mut self.upper
        };
        ensure(slot.is_none(), || {
            CqlError::invalid("More than one restriction was found for the start (or end) bound of a clustering column")
        })?;
        *slot = bound;
        self.has_clustering_slice = true;
        Ok(())
    }

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
