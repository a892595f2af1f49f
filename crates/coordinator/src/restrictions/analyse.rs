//! The analysis half of a WHERE clause: every decision its shape makes, with Cassandra's
//! rules and error messages.

use super::{
    equality_filter, key_column_index, FilterPlan, SliceBound, TokenSource, ValuesSource, WherePlan,
};
use crate::values::TypedTerm;
use crate::{ensure, CqlError};
use shoal_cql::ast::{Operator, Relation, RelationTarget, Term};
use shoal_model::CqlType;
use shoal_schema::{ColumnKind, TableMetadata};

/// What the first pass over the relations found, before the decisions that need all of
/// them.
#[derive(Default)]
struct Found {
    partition: Vec<Option<ValuesSource>>,
    clustering_eq: Vec<Option<ValuesSource>>,
    multi_column_prefix: Option<(usize, ValuesSource)>,
    clustering_ranges: Vec<(usize, Operator, ValuesSource)>,
    multi_ranges: Vec<(Vec<usize>, Operator, ValuesSource)>,
}

impl WherePlan {
    /// Analyses `relations` against `table`'s primary key (Cassandra's rules, Cassandra's
    /// error messages).
    pub fn analyse(table: &TableMetadata, relations: &[Relation]) -> Result<WherePlan, CqlError> {
        let mut plan = WherePlan::default();
        let mut found = Found {
            partition: vec![None; table.partition_key_count()],
            clustering_eq: vec![None; table.clustering_count()],
            ..Found::default()
        };
        for relation in relations {
            match &relation.target {
                RelationTarget::Token(columns) => plan.token_relation(table, columns, relation)?,
                RelationTarget::Columns(names) => {
                    multi_column_relation(table, names, relation, &mut found)?
                }
                RelationTarget::MapEntry(name, key) => {
                    plan.map_entry_relation(table, name, key, relation)?
                }
                RelationTarget::Column(name) => {
                    plan.column_relation(table, name, relation, &mut found)?
                }
            }
        }
        let partition = std::mem::take(&mut found.partition);
        plan.settle_partition_key(table, partition);
        plan.settle_clustering(table, found)?;
        Ok(plan)
    }

    fn token_relation(
        &mut self,
        table: &TableMetadata,
        columns: &[String],
        relation: &Relation,
    ) -> Result<(), CqlError> {
        let expected: Vec<&str> = table.partition_key().map(|c| c.name.as_str()).collect();
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
        let source = match &relation.value {
            // `token(k) >= token(?)`: the token of the given key.
            Term::Function { name, arguments } if name == "token" => {
                let key_columns: Vec<_> = table.partition_key().collect();
                ensure(arguments.len() == key_columns.len(), || {
                    CqlError::invalid(format!(
                        "token() on the right of a relation takes the {} partition key columns",
                        key_columns.len()
                    ))
                })?;
                TokenSource::Key(
                    arguments
                        .iter()
                        .zip(key_columns)
                        .map(|(argument, column)| {
                            TypedTerm::new(argument, &column.cql_type, &column.name)
                        })
                        .collect::<Result<_, _>>()?,
                )
            }
            value => TokenSource::Value(TypedTerm::new(
                value,
                &CqlType::Bigint,
                "partition key token",
            )?),
        };
        match relation.operator {
            Operator::Gt => self.token_lower = Some((source, false)),
            Operator::Gte => self.token_lower = Some((source, true)),
            Operator::Lt => self.token_upper = Some((source, false)),
            Operator::Lte => self.token_upper = Some((source, true)),
            Operator::Eq => {
                self.token_lower = Some((source.clone(), true));
                self.token_upper = Some((source, true));
            }
            _ => {
                return Err(CqlError::invalid(
                    "Only EQ, LT, LTE, GT and GTE relations are supported on token()",
                ))
            }
        }
        Ok(())
    }

    fn map_entry_relation(
        &mut self,
        table: &TableMetadata,
        name: &str,
        key: &Term,
        relation: &Relation,
    ) -> Result<(), CqlError> {
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
        self.filters.push(FilterPlan {
            column: index,
            operator: Operator::Eq,
            values: ValuesSource::One(TypedTerm::new(&relation.value, value_type, name)?),
            map_key: Some(TypedTerm::new(key, key_type, name)?),
        });
        self.needs_filtering = true;
        Ok(())
    }

    fn column_relation(
        &mut self,
        table: &TableMetadata,
        name: &str,
        relation: &Relation,
        found: &mut Found,
    ) -> Result<(), CqlError> {
        let (index, column) = table.require_column(name)?;
        if let Some(user_type) = column.cql_type.as_udt().filter(|udt| !udt.frozen) {
            return Err(CqlError::invalid(format!(
                "Non-frozen UDT column '{name}' ({}) cannot be restricted by any relation",
                user_type.name
            )));
        }
        let operator = relation.operator;
        ensure(operator != Operator::NotEq, || {
            CqlError::invalid(format!("Unsupported \"!=\" relation: {name} != ..."))
        })?;
        ensure(operator != Operator::Like, || {
            CqlError::invalid("LIKE restrictions are only supported on indexed columns")
        })?;
        let values = match operator {
            Operator::In => ValuesSource::in_list(&relation.value, &column.cql_type, name)?,
            Operator::Contains => {
                let element = match &column.cql_type {
                    CqlType::List { element, .. } | CqlType::Set { element, .. } => {
                        element.as_ref().clone()
                    }
                    CqlType::Map { value, .. } => value.as_ref().clone(),
                    other => {
                        return Err(CqlError::invalid(format!(
                            "Cannot use CONTAINS on non-collection column {name} of type {other}"
                        )))
                    }
                };
                ValuesSource::One(TypedTerm::new(&relation.value, &element, name)?)
            }
            Operator::ContainsKey => {
                let CqlType::Map { key, .. } = &column.cql_type else {
                    return Err(CqlError::invalid(format!(
                        "Cannot use CONTAINS KEY on non-map column {name}"
                    )));
                };
                ValuesSource::One(TypedTerm::new(&relation.value, key, name)?)
            }
            _ => ValuesSource::One(TypedTerm::new(&relation.value, &column.cql_type, name)?),
        };
        let equality = matches!(operator, Operator::Eq | Operator::In);
        let range = matches!(
            operator,
            Operator::Gt | Operator::Gte | Operator::Lt | Operator::Lte
        );
        match column.kind {
            ColumnKind::PartitionKey if equality => {
                let slot = &mut found.partition[column.position as usize];
                ensure(slot.is_none(), || {
                    CqlError::invalid(format!("{name} cannot be restricted by more than one relation if it includes an Equal"))
                })?;
                self.partition_in |= operator == Operator::In;
                *slot = Some(values);
            }
            ColumnKind::Clustering if equality => {
                let slot = &mut found.clustering_eq[column.position as usize];
                ensure(slot.is_none(), || {
                    CqlError::invalid(format!("{name} cannot be restricted by more than one relation if it includes an Equal"))
                })?;
                *slot = Some(values);
            }
            ColumnKind::Clustering if range => {
                found
                    .clustering_ranges
                    .push((column.position as usize, operator, values));
            }
            // Ranges on partition key columns, and any relation on other columns, filter
            // rows (Cassandra requires ALLOW FILTERING).
            _ => {
                if range {
                    let lower = |o: Operator| matches!(o, Operator::Gt | Operator::Gte);
                    let side_taken = self.filters.iter().any(|f| {
                        f.column == index && f.map_key.is_none() && {
                            let other = f.operator;
                            matches!(
                                other,
                                Operator::Gt | Operator::Gte | Operator::Lt | Operator::Lte
                            ) && lower(other) == lower(operator)
                        }
                    });
                    ensure(!side_taken, || {
                        let side = if lower(operator) { "start" } else { "end" };
                        CqlError::invalid(format!(
                            "More than one restriction was found for the {side} bound on {name}"
                        ))
                    })?;
                }
                self.filters.push(FilterPlan {
                    column: index,
                    operator,
                    values,
                    map_key: None,
                });
                self.needs_filtering = true;
            }
        }
        Ok(())
    }

    /// Partition keys: every component restricted, or none (otherwise they filter).
    fn settle_partition_key(
        &mut self,
        table: &TableMetadata,
        partition: Vec<Option<ValuesSource>>,
    ) {
        let restricted = partition.iter().filter(|c| c.is_some()).count();
        if restricted == partition.len() {
            self.partition_keys = Some(partition.into_iter().flatten().collect());
        } else if restricted > 0 {
            for (position, source) in partition.into_iter().enumerate() {
                if let Some(values) = source {
                    self.filters.push(equality_filter(
                        table,
                        ColumnKind::PartitionKey,
                        position,
                        values,
                    ));
                }
            }
            self.needs_filtering = true;
        }
    }

    /// Clustering: an EQ/IN prefix, then at most one slice on the next column.
    fn settle_clustering(&mut self, table: &TableMetadata, found: Found) -> Result<(), CqlError> {
        let mut clustering_eq = found.clustering_eq;
        let mut prefix_columns = 0;
        if let Some((start, tuples)) = found.multi_column_prefix {
            ensure(start == 0, || {
                CqlError::invalid(
                    "Multi-column relations must start at the first clustering column",
                )
            })?;
            prefix_columns = match &tuples {
                ValuesSource::One(term) | ValuesSource::List(term) => tuple_width(&term.cql_type),
                ValuesSource::Each(terms) => terms.first().map_or(0, |t| tuple_width(&t.cql_type)),
            };
            self.prefix.tuples = Some(tuples);
            self.prefix.tuple_width = prefix_columns;
        }
        while prefix_columns < clustering_eq.len() {
            let Some(values) = clustering_eq[prefix_columns].take() else {
                break;
            };
            self.prefix.columns.push(values);
            prefix_columns += 1;
        }
        // Leftover EQ/IN (a gap before them) become filters.
        for (position, leftover) in clustering_eq.into_iter().enumerate() {
            if let Some(values) = leftover {
                self.filters.push(equality_filter(
                    table,
                    ColumnKind::Clustering,
                    position,
                    values,
                ));
                self.needs_filtering = true;
            }
        }
        for (position, operator, values) in found.clustering_ranges {
            if position == prefix_columns {
                let descending = table
                    .clustering()
                    .nth(position)
                    .is_some_and(|c| c.descending);
                self.set_slice_bound(operator, descending, vec![position], values)?;
            } else {
                self.filters.push(FilterPlan {
                    column: key_column_index(table, ColumnKind::Clustering, position),
                    operator,
                    values,
                    map_key: None,
                });
                self.needs_filtering = true;
            }
        }
        for (positions, operator, values) in found.multi_ranges {
            ensure(positions.first() == Some(&prefix_columns), || {
                CqlError::invalid("Multi-column slice restrictions must start right after the equality restrictions")
            })?;
            let ordered: Vec<_> = positions
                .iter()
                .filter_map(|i| table.clustering().nth(*i))
                .collect();
            let descending = ordered.first().is_some_and(|c| c.descending);
            ensure(ordered.iter().all(|c| c.descending == descending), || {
                CqlError::invalid("Multi-column slices over columns of mixed clustering order are not supported by Shoal yet")
            })?;
            self.set_slice_bound(operator, descending, positions, values)?;
        }
        self.clustering_prefix_columns = prefix_columns;
        Ok(())
    }

    fn set_slice_bound(
        &mut self,
        operator: Operator,
        descending: bool,
        positions: Vec<usize>,
        values: ValuesSource,
    ) -> Result<(), CqlError> {
        let inclusive = matches!(operator, Operator::Gte | Operator::Lte);
        let logical_lower = matches!(operator, Operator::Gt | Operator::Gte);
        let storage_lower = logical_lower != descending;
        let slot = if storage_lower {
            &mut self.lower
        } else {
            &mut self.upper
        };
        ensure(slot.is_none(), || {
            CqlError::invalid("More than one restriction was found for the start (or end) bound of a clustering column")
        })?;
        *slot = Some(SliceBound {
            positions,
            values,
            inclusive,
        });
        self.has_clustering_slice = true;
        Ok(())
    }
}

fn multi_column_relation(
    table: &TableMetadata,
    names: &[String],
    relation: &Relation,
    found: &mut Found,
) -> Result<(), CqlError> {
    let mut positions = Vec::new();
    for name in names {
        let (_, column) = table.require_column(name)?;
        ensure(column.kind == ColumnKind::Clustering, || {
            CqlError::invalid(format!("Multi-column relations can only be applied to clustering columns but was applied to: {name}"))
        })?;
        positions.push(column.position as usize);
    }
    ensure(
        positions
            .iter()
            .enumerate()
            .all(|(i, p)| *p == i + positions[0]),
        || {
            CqlError::invalid(
                "Clustering columns must appear in the PRIMARY KEY order in multi-column relations",
            )
        },
    )?;
    let types: Vec<CqlType> = positions
        .iter()
        .map(|i| {
            table
                .clustering()
                .nth(*i)
                .map(|c| c.cql_type.clone())
                .unwrap_or(CqlType::Blob)
        })
        .collect();
    let tuple_type = CqlType::Tuple(types);
    match relation.operator {
        Operator::Eq => {
            found.multi_column_prefix = Some((
                positions[0],
                ValuesSource::One(TypedTerm::new(&relation.value, &tuple_type, "tuple")?),
            ));
        }
        Operator::In => {
            found.multi_column_prefix = Some((
                positions[0],
                ValuesSource::in_list(&relation.value, &tuple_type, "tuple")?,
            ));
        }
        Operator::Gt | Operator::Gte | Operator::Lt | Operator::Lte => {
            found.multi_ranges.push((
                positions,
                relation.operator,
                ValuesSource::One(TypedTerm::new(&relation.value, &tuple_type, "tuple")?),
            ));
        }
        _ => {
            return Err(CqlError::invalid(
                "Unsupported operator for a multi-column relation",
            ))
        }
    }
    Ok(())
}

fn tuple_width(cql_type: &CqlType) -> usize {
    match cql_type {
        CqlType::Tuple(types) => types.len(),
        CqlType::List { element, .. } => tuple_width(element),
        _ => 1,
    }
}
