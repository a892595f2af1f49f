//! Prepared statements: parsed and planned once, identified by a hash of their text and
//! keyspace, executed many times. Each keeps the [`Plan`] it was last planned to, with the
//! schema version it was planned against; an EXECUTE reuses it until the schema changes.
//! Preparing also works out each bind marker's name and type (what drivers serialize
//! values with) and which markers make up the partition key (what token-aware drivers
//! route with).

use crate::plan::Plan;
use crate::{Coordinator, CqlError, Session};
use futures::future::{BoxFuture, FutureExt, Shared};
use parking_lot::RwLock;
use shoal_cql::ast::{
    Assignment, Conditions, Operator, Relation, RelationTarget, Statement, Term, Using,
};
use shoal_cql::response::{ColumnSpec, Prepared, ResultBody};
use shoal_model::CqlType;
use shoal_schema::{ColumnKind, TableMetadata};
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// How many prepared statements a node keeps; beyond it, arbitrary entries are evicted and
/// clients re-prepare on `Unprepared`.
pub const PREPARED_CACHE_CAPACITY: usize = 10_000;

pub struct PreparedStatement {
    pub statement: Statement,
    /// The statement as the client sent it (for traces).
    pub text: String,
    /// The session keyspace when the statement was prepared.
    pub keyspace: Option<String>,
    /// The last plan, for the schema version and keyspace it was made for.
    cached: RwLock<Option<CachedPlan>>,
}

struct CachedPlan {
    schema_version: [u8; 16],
    keyspace: Option<String>,
    plan: Plan,
}

impl PreparedStatement {
    pub fn parse(text: &str, keyspace: Option<String>) -> Result<PreparedStatement, CqlError> {
        Ok(PreparedStatement::new(
            shoal_cql::parser::parse_statement(text)?,
            text,
            keyspace,
        ))
    }

    fn new(statement: Statement, text: &str, keyspace: Option<String>) -> PreparedStatement {
        PreparedStatement {
            statement,
            text: text.to_string(),
            keyspace,
            cached: RwLock::new(None),
        }
    }

    /// The identity of the cached plan (tests check it is reused).
    #[cfg(test)]
    pub(crate) fn cached_plan_identity(&self) -> Option<usize> {
        self.cached
            .read()
            .as_ref()
            .map(|cached| match &cached.plan {
                Plan::Select(plan) => Arc::as_ptr(plan) as usize,
                Plan::Modify(plan) => Arc::as_ptr(plan) as usize,
                Plan::Statement(plan) => Arc::as_ptr(plan) as usize,
            })
    }

    /// The class of the plan last made for this statement (`None` before its first
    /// execution on this node).
    pub(crate) fn planned_class(&self) -> Option<crate::plan::StatementClass> {
        self.cached
            .read()
            .as_ref()
            .map(|cached| cached.plan.class())
    }

    /// The plan for executing in `session`: the cached one while the schema and the
    /// keyspace are those it was made for, a new one otherwise.
    pub(crate) fn plan(
        &self,
        coordinator: &Coordinator,
        session: &Session,
    ) -> Result<Plan, CqlError> {
        let keyspace = self.keyspace.as_deref().or(session.keyspace.as_deref());
        let schema_version = coordinator.schema.version();
        if let Some(cached) = self.cached.read().as_ref() {
            if cached.schema_version == schema_version && cached.keyspace.as_deref() == keyspace {
                return Ok(cached.plan.clone());
            }
        }
        let planning_session = session.in_keyspace(keyspace.map(str::to_string));
        let plan = Plan::new(coordinator, &planning_session, &self.statement)?;
        *self.cached.write() = Some(CachedPlan {
            schema_version,
            keyspace: planning_session.keyspace,
            plan: plan.clone(),
        });
        Ok(plan)
    }
}

/// The prepared statements by id. Looked up on every EXECUTE (twice: the connection asks
/// its class first), so hashed with foldhash rather than SipHash. Its seed is random per
/// process, so ids cannot be chosen (through the statement texts that make them,
/// [`statement_id`]) to collide in this map.
pub struct PreparedCache {
    statements: RwLock<HashMap<Vec<u8>, Arc<PreparedStatement>, foldhash::fast::RandomState>>,
    capacity: usize,
}

impl PreparedCache {
    pub fn new(capacity: usize) -> PreparedCache {
        PreparedCache {
            statements: RwLock::new(HashMap::default()),
            capacity,
        }
    }

    pub fn get(&self, id: &[u8]) -> Option<Arc<PreparedStatement>> {
        self.statements.read().get(id).cloned()
    }

    fn insert(&self, id: Vec<u8>, statement: Arc<PreparedStatement>) {
        let mut statements = self.statements.write();
        if statements.len() >= self.capacity && !statements.contains_key(&id) {
            if let Some(victim) = statements.keys().next().cloned() {
                statements.remove(&victim);
            }
        }
        statements.insert(id, statement);
    }
}

/// Where a node looks for a statement a client executes but never prepared on it: the
/// other nodes of its cluster (the server asks them). A driver prepares a statement on
/// the nodes it knows when it prepares it; a node that joins later, or restarts and so
/// forgets its prepared statements, would otherwise answer the first EXECUTE of each with
/// UNPREPARED, and every connection would re-prepare and send it again — two more round
/// trips, just as the node starts taking requests (the start of a join, the first seconds
/// after a restart).
pub trait PreparedElsewhere: Send + Sync {
    /// The text and keyspace of the statement some other node prepared as `id`, if one
    /// knows it.
    fn find<'a>(&'a self, id: &'a [u8]) -> futures::future::BoxFuture<'a, Option<StatementText>>;
}

/// The lookups on other nodes under way, one per statement id. Every connection of a
/// client that starts sending to a node that just joined (or restarted) misses the same
/// statements at the same moment; they wait for one lookup of each instead of asking the
/// peers once per connection.
#[derive(Default)]
pub(crate) struct Lookups {
    under_way: parking_lot::Mutex<HashMap<Vec<u8>, SharedLookup>>,
}

type SharedLookup = Shared<BoxFuture<'static, Option<StatementText>>>;

impl Lookups {
    /// What `elsewhere` knows of `id`, from the lookup of it already under way if there is
    /// one.
    pub(crate) async fn find(
        &self,
        elsewhere: &Arc<dyn PreparedElsewhere>,
        id: &[u8],
    ) -> Option<StatementText> {
        let lookup = self
            .under_way
            .lock()
            .entry(id.to_vec())
            .or_insert_with(|| {
                let (elsewhere, id) = (Arc::clone(elsewhere), id.to_vec());
                async move { elsewhere.find(&id).await }.boxed().shared()
            })
            .clone();
        let found = lookup.clone().await;
        // The first to see it end forgets it: a later miss asks again.
        let mut under_way = self.under_way.lock();
        if under_way
            .get(id)
            .is_some_and(|current| current.ptr_eq(&lookup))
        {
            under_way.remove(id);
        }
        found
    }
}

/// What makes a prepared statement: the text a client sent and the keyspace its session
/// was in. Its id is a hash of both ([`statement_id`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StatementText {
    pub text: String,
    pub keyspace: Option<String>,
}

impl PreparedCache {
    /// The text and keyspace of the statement prepared here as `id` (for another node).
    pub fn text_of(&self, id: &[u8]) -> Option<StatementText> {
        self.get(id).map(|prepared| StatementText {
            text: prepared.text.clone(),
            keyspace: prepared.keyspace.clone(),
        })
    }

    /// Prepares `found`, which another node prepared as `id`, here too: the statement it
    /// names, or `None` if it does not hash to `id` (a node of another build, say) or no
    /// longer parses. Planned when first executed, as any statement whose plan is stale.
    pub(crate) fn adopt(&self, id: &[u8], found: StatementText) -> Option<Arc<PreparedStatement>> {
        if statement_id(found.keyspace.as_deref(), &found.text) != id {
            return None;
        }
        let statement = Arc::new(PreparedStatement::parse(&found.text, found.keyspace).ok()?);
        self.insert(id.to_vec(), Arc::clone(&statement));
        Some(statement)
    }
}

fn statement_id(keyspace: Option<&str>, text: &str) -> Vec<u8> {
    let mut id = Vec::with_capacity(16);
    for salt in [0x0053_484f_414c_u64, 0x7072_6570_6172_6564] {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        salt.hash(&mut hasher);
        keyspace.hash(&mut hasher);
        text.hash(&mut hasher);
        id.extend_from_slice(&hasher.finish().to_be_bytes());
    }
    id
}

/// Collects `(marker index, name, type)` for every bind marker of a statement.
struct MarkerTypes<'a> {
    table: &'a TableMetadata,
    found: Vec<(usize, String, CqlType)>,
    /// Marker index per partition key position, from `pk = ?` relations or INSERT values.
    partition_key_markers: Vec<Option<usize>>,
}

impl MarkerTypes<'_> {
    fn term(&mut self, term: &Term, name: &str, cql_type: &CqlType) {
        match term {
            Term::Bind(marker) => {
                let name = marker.name.clone().unwrap_or_else(|| name.to_string());
                self.found.push((marker.index, name, cql_type.clone()));
            }
            Term::List(elements) | Term::Set(elements) => {
                let element = match cql_type {
                    CqlType::List { element, .. }
                    | CqlType::Set { element, .. }
                    | CqlType::Vector { element, .. } => element.as_ref().clone(),
                    other => other.clone(),
                };
                for e in elements {
                    self.term(e, name, &element);
                }
            }
            Term::Tuple(elements) => {
                for (i, e) in elements.iter().enumerate() {
                    let element = match cql_type {
                        CqlType::Tuple(types) => types.get(i).cloned().unwrap_or(CqlType::Blob),
                        other => other.clone(),
                    };
                    self.term(e, name, &element);
                }
            }
            Term::Map(entries) => {
                if let CqlType::Map { key, value, .. } = cql_type {
                    for (k, v) in entries {
                        self.term(k, name, key);
                        self.term(v, name, value);
                    }
                }
            }
            Term::UserType(fields) => {
                for (field, value) in fields {
                    let field_type = cql_type
                        .as_udt()
                        .and_then(|udt| udt.field_index(field).map(|i| udt.fields[i].1.clone()))
                        .unwrap_or(CqlType::Blob);
                    self.term(value, &format!("{name}.{field}"), &field_type);
                }
            }
            Term::Cast { cql_type, term } => self.term(term, name, cql_type),
            Term::Negative(inner) => self.term(inner, name, cql_type),
            Term::Function {
                name: function,
                arguments,
            } => {
                let function = function.to_ascii_lowercase();
                let argument_type = crate::functions::term_argument_type(&function, cql_type);
                for argument in arguments {
                    self.term(argument, &function, &argument_type);
                }
            }
            Term::Literal(_) => {}
        }
    }

    fn column_type(&self, name: &str) -> CqlType {
        self.table
            .column(name)
            .map(|c| c.cql_type.clone())
            .unwrap_or(CqlType::Blob)
    }

    fn relations(&mut self, relations: &[Relation]) {
        for relation in relations {
            match &relation.target {
                RelationTarget::Column(name) => {
                    let cql_type = self.column_type(name);
                    match (relation.operator, &relation.value) {
                        (Operator::In, Term::Bind(_)) => self.term(
                            &relation.value,
                            &format!("in({name})"),
                            &CqlType::List {
                                element: Box::new(cql_type),
                                frozen: false,
                            },
                        ),
                        (Operator::In, _) => self.term(&relation.value, name, &cql_type),
                        (Operator::Contains, _) => {
                            let element = match &cql_type {
                                CqlType::List { element, .. } | CqlType::Set { element, .. } => {
                                    element.as_ref().clone()
                                }
                                CqlType::Map { value, .. } => value.as_ref().clone(),
                                other => other.clone(),
                            };
                            self.term(&relation.value, name, &element)
                        }
                        (Operator::ContainsKey, _) => {
                            let key = match &cql_type {
                                CqlType::Map { key, .. } => key.as_ref().clone(),
                                other => other.clone(),
                            };
                            self.term(&relation.value, name, &key)
                        }
                        (operator, value) => {
                            if let (Operator::Eq, Term::Bind(marker)) = (operator, value) {
                                if let Some(column) = self
                                    .table
                                    .column(name)
                                    .filter(|c| c.kind == ColumnKind::PartitionKey)
                                {
                                    self.partition_key_markers[column.position as usize] =
                                        Some(marker.index);
                                }
                            }
                            self.term(value, name, &cql_type)
                        }
                    }
                }
                RelationTarget::Token(columns) => match &relation.value {
                    Term::Function { name, arguments } if name == "token" => {
                        for (argument, column) in arguments.iter().zip(columns) {
                            let cql_type = self.column_type(column);
                            self.term(argument, column, &cql_type);
                        }
                    }
                    value => self.term(
                        value,
                        &format!("partition key token({})", columns.join(", ")),
                        &CqlType::Bigint,
                    ),
                },
                RelationTarget::Columns(columns) => {
                    let types: Vec<CqlType> = columns.iter().map(|c| self.column_type(c)).collect();
                    let tuple = CqlType::Tuple(types);
                    let shown = format!("({})", columns.join(","));
                    if relation.operator == Operator::In {
                        match &relation.value {
                            Term::Bind(_) => self.term(
                                &relation.value,
                                &format!("in{shown}"),
                                &CqlType::List {
                                    element: Box::new(tuple),
                                    frozen: false,
                                },
                            ),
                            Term::Tuple(elements) | Term::List(elements) => {
                                for e in elements {
                                    self.term(e, &shown, &tuple);
                                }
                            }
                            other => self.term(other, &shown, &tuple),
                        }
                    } else {
                        self.term(&relation.value, &shown, &tuple);
                    }
                }
                RelationTarget::MapEntry(name, key) => {
                    if let CqlType::Map {
                        key: key_type,
                        value,
                        ..
                    } = self.column_type(name)
                    {
                        self.term(key, &format!("key({name})"), &key_type);
                        self.term(&relation.value, &format!("value({name})"), &value);
                    }
                }
            }
        }
    }

    fn using(&mut self, using: &Using) {
        if let Some(ttl) = &using.ttl {
            self.term(ttl, "[ttl]", &CqlType::Int);
        }
        if let Some(timestamp) = &using.timestamp {
            self.term(timestamp, "[timestamp]", &CqlType::Bigint);
        }
    }

    fn conditions(&mut self, conditions: &Option<Conditions>) {
        if let Some(Conditions::Columns(list)) = conditions {
            for condition in list {
                let name = &condition.column;
                let cql_type = self.column_type(name);
                let receiver = match (&condition.field, &condition.element, &cql_type) {
                    (Some(field), _, _) => cql_type
                        .as_udt()
                        .and_then(|udt| udt.field_index(field).map(|i| udt.fields[i].1.clone()))
                        .unwrap_or(CqlType::Blob),
                    (
                        None,
                        Some(key),
                        CqlType::Map {
                            key: key_type,
                            value,
                            ..
                        },
                    ) => {
                        self.term(key, &format!("key({name})"), key_type);
                        value.as_ref().clone()
                    }
                    (None, Some(index), CqlType::List { element, .. }) => {
                        self.term(index, &format!("idx({name})"), &CqlType::Int);
                        element.as_ref().clone()
                    }
                    _ => cql_type.clone(),
                };
                self.term(&condition.value, name, &receiver);
            }
        }
    }

    fn statement(&mut self, statement: &Statement) {
        match statement {
            Statement::Select(select) => {
                self.relations(&select.relations);
                if let Some((name, vector)) = &select.ann {
                    if let Some(column) = self.table.column(name) {
                        let cql_type = column.cql_type.clone();
                        self.term(vector, name, &cql_type);
                    }
                }
                if let Some(limit) = &select.per_partition_limit {
                    self.term(limit, "[per_partition_limit]", &CqlType::Int);
                }
                if let Some(limit) = &select.limit {
                    self.term(limit, "[limit]", &CqlType::Int);
                }
                if let Some(timeout) = &select.timeout {
                    self.term(timeout, "[timeout]", &CqlType::Duration);
                }
            }
            Statement::Insert(insert) => {
                for (name, value) in insert.columns.iter().zip(&insert.values) {
                    if let (Term::Bind(marker), Some(column)) = (value, self.table.column(name)) {
                        if column.kind == ColumnKind::PartitionKey {
                            self.partition_key_markers[column.position as usize] =
                                Some(marker.index);
                        }
                    }
                    let cql_type = self.column_type(name);
                    self.term(value, name, &cql_type);
                }
                if let Some(json) = &insert.json {
                    self.term(json, "[json]", &CqlType::Text);
                }
                self.using(&insert.using);
            }
            Statement::Update(update) => {
                self.using(&update.using);
                for assignment in &update.assignments {
                    let name = assignment.column().to_string();
                    let cql_type = self.column_type(&name);
                    match assignment {
                        Assignment::Set { value, .. }
                        | Assignment::Add { value, .. }
                        | Assignment::Prepend { value, .. } => self.term(value, &name, &cql_type),
                        Assignment::Remove { value, .. } => {
                            let removed = match &cql_type {
                                CqlType::Map { key, .. } => CqlType::Set {
                                    element: key.clone(),
                                    frozen: false,
                                },
                                other => other.clone(),
                            };
                            self.term(value, &name, &removed)
                        }
                        Assignment::SetElement { key, value, .. } => match &cql_type {
                            CqlType::List { element, .. } => {
                                self.term(key, &format!("idx({name})"), &CqlType::Int);
                                self.term(value, &format!("value({name})"), element);
                            }
                            CqlType::Map {
                                key: key_type,
                                value: value_type,
                                ..
                            } => {
                                self.term(key, &format!("key({name})"), key_type);
                                self.term(value, &format!("value({name})"), value_type);
                            }
                            _ => {}
                        },
                        Assignment::SetField { field, value, .. } => {
                            let field_type = cql_type
                                .as_udt()
                                .and_then(|udt| {
                                    udt.field_index(field).map(|i| udt.fields[i].1.clone())
                                })
                                .unwrap_or(CqlType::Blob);
                            self.term(value, &format!("{name}.{field}"), &field_type);
                        }
                    }
                }
                self.relations(&update.relations);
                self.conditions(&update.conditions);
            }
            Statement::Delete(delete) => {
                for target in &delete.targets {
                    if let Some(element) = &target.element {
                        let element_type = match self.column_type(&target.column) {
                            CqlType::List { .. } => CqlType::Int,
                            CqlType::Map { key, .. } => *key,
                            CqlType::Set { element, .. } => *element,
                            other => other,
                        };
                        self.term(element, &target.column, &element_type);
                    }
                }
                self.using(&delete.using);
                self.relations(&delete.relations);
                self.conditions(&delete.conditions);
            }
            _ => {}
        }
    }
}

fn table_of<'s>(
    coordinator: &Coordinator,
    session: &Session,
    schema: &'s shoal_schema::Schema,
    statement: &Statement,
) -> Result<Option<&'s Arc<TableMetadata>>, CqlError> {
    let name = match statement {
        Statement::Select(s) => &s.table,
        Statement::Insert(s) => &s.table,
        Statement::Update(s) => &s.table,
        Statement::Delete(s) => &s.table,
        _ => return Ok(None),
    };
    let keyspace = coordinator.keyspace_for(session, &name.keyspace)?;
    Ok(Some(schema.table(&keyspace, &name.name)?))
}

pub(crate) fn prepare(
    coordinator: &Coordinator,
    session: &Session,
    text: &str,
) -> Result<ResultBody, CqlError> {
    let (statement, marker_count) = shoal_cql::parser::parse_with_marker_count(text)?;
    let schema = coordinator.schema();
    let mut bind_columns: Vec<Option<ColumnSpec>> = vec![None; marker_count];
    let mut partition_key_indexes = Vec::new();
    let mut result_columns = Vec::new();
    let statements: Vec<&Statement> = match &statement {
        Statement::Batch(batch) => batch.statements.iter().collect(),
        other => vec![other],
    };
    if let Statement::Batch(batch) = &statement {
        if let Some(Term::Bind(marker)) = &batch.using.timestamp {
            bind_columns[marker.index] = Some(ColumnSpec {
                keyspace: String::new(),
                table: String::new(),
                name: "[timestamp]".into(),
                cql_type: CqlType::Bigint,
            });
        }
    }
    for inner in &statements {
        let Some(table) = table_of(coordinator, session, &schema, inner)? else {
            continue;
        };
        let mut walker = MarkerTypes {
            table,
            found: Vec::new(),
            partition_key_markers: vec![None; table.partition_key_count()],
        };
        walker.statement(inner);
        for (index, name, cql_type) in walker.found {
            if let Some(slot) = bind_columns.get_mut(index) {
                *slot = Some(ColumnSpec {
                    keyspace: table.keyspace.clone(),
                    table: table.name.clone(),
                    name,
                    cql_type,
                });
            }
        }
        if statements.len() == 1 && walker.partition_key_markers.iter().all(Option::is_some) {
            partition_key_indexes = walker
                .partition_key_markers
                .iter()
                .flatten()
                .map(|i| *i as u16)
                .collect();
        }
        if let Statement::Select(select) = inner {
            result_columns = crate::select::selection::result_columns(table, select)?;
        }
    }
    let bind_columns: Vec<ColumnSpec> = bind_columns
        .into_iter()
        .enumerate()
        .map(|(i, spec)| {
            spec.unwrap_or(ColumnSpec {
                keyspace: String::new(),
                table: String::new(),
                name: format!("marker{i}"),
                cql_type: CqlType::Blob,
            })
        })
        .collect();
    let keyspace = session.keyspace.clone();
    let id = statement_id(keyspace.as_deref(), text);
    let conditional = statement.is_conditional();
    let prepared = PreparedStatement::new(statement, text, keyspace);
    // Plan now: a statement that cannot run is refused at PREPARE, as in Cassandra.
    if !matches!(prepared.statement, Statement::Batch(_)) {
        prepared.plan(coordinator, session)?;
    }
    coordinator.prepared.insert(id.clone(), Arc::new(prepared));
    Ok(ResultBody::Prepared(Prepared {
        id,
        bind_columns,
        partition_key_indexes,
        result_columns,
        conditional,
        lwt_mark: None,
    }))
}
