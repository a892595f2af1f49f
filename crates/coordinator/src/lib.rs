//! The coordinator: executes CQL statements for the clients connected to this node.
//!
//! A request arrives as text (QUERY), as a prepared id (EXECUTE) or as a BATCH, with
//! [`QueryParameters`]. The [`Coordinator`] parses it (or finds the prepared statement),
//! checks it against the schema, and runs it:
//!
//! - [`ddl`] — CREATE/ALTER/DROP of keyspaces and tables, TRUNCATE, USE, through the
//!   [`SchemaStore`];
//! - [`plan`] — every statement is planned once against the schema; a prepared statement
//!   ([`prepared`]) caches its plan until the schema changes;
//! - [`modify`] — INSERT, UPDATE, DELETE and BATCH become cell mutations
//!   ([`shoal_storage::WriteBatch`]); [`counter`] — counter increments, led by a replica;
//! - [`select`] — SELECT becomes partition reads or token-ordered scans, filtered,
//!   projected, grouped and paged ([`paging`]); [`restrictions`] analyses WHERE clauses;
//!   `reads` runs read plans (point and slice reads, `SERIAL` reads, scans, index
//!   queries, vector search);
//! - [`values`] — terms become typed values (literals, bind markers, `fromJson`), and
//!   values JSON; [`functions`] — the native functions selections call;
//! - [`system_tables`] and [`describe`] — the virtual `system` / `system_schema` tables
//!   and the server-side `DESCRIBE` statements, generated from the schema;
//! - [`prepared`] — prepared statements and the types of their bind markers.
//!
//! Everything a statement reads or writes goes through one trait,
//! [`shoal_replication::Replication`]: how many replicas, which consistency level, digests
//! and repair are its business, not the statement code's. This crate owns no sockets and
//! no threads: the server layer calls it and performs the I/O.

#![cfg_attr(test, allow(clippy::unwrap_used))]

mod access;
pub mod class;
pub mod counter;
pub mod ddl;
pub mod describe;
pub(crate) mod functions;
pub mod index;
pub(crate) mod masking;
pub mod modify;
pub mod observe;
pub mod paging;
pub mod plan;
pub mod prepared;
mod reads;
pub mod restrictions;
mod roles;
pub mod schedule;
pub mod select;
pub mod system_tables;
pub mod traces;
pub mod values;

pub use shoal_cql::{ensure, CqlError, ErrorCode};

use class::StatementClass;
use plan::Plan;
use shoal_cluster::ClusterMetadata;
use shoal_cql::ast::Statement;
use shoal_cql::request::{BatchQuery, BatchRequest, Consistency, QueryParameters};
use shoal_cql::response::ResultBody;
use shoal_model::{HostId, TableId};
use shoal_replication::index::LocalIndexes;
use shoal_replication::{ImmediateWriteLog, Liveness, LocalReplica, LocalReplication, Replication};
use shoal_schema::SchemaStore;
use shoal_storage::Engine;
use std::net::IpAddr;
use std::sync::Arc;

/// What this node tells clients about itself (`system.local`, `system.peers`).
#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub cluster_name: String,
    pub address: IpAddr,
    pub cql_port: u16,
    pub datacenter: String,
    pub rack: String,
    pub host_id: HostId,
    /// The tokens this node reports when it is not part of a cluster.
    pub tokens: Vec<i64>,
    pub gossip_generation: i32,
    /// The order this node serves reads in, and its read threads (0: one per core).
    pub read_scheduling: schedule::Ordering,
    pub read_threads: usize,
    /// The niceness of scan work in the point-first orders (`scan_nice`).
    pub scan_nice: u8,
    /// How long scan work may wait for its turn before it is refused
    /// (`range_request_timeout_ms`: Cassandra's `range_request_timeout`).
    pub range_request_timeout: std::time::Duration,
}

/// Per-connection state.
#[derive(Debug, Clone, Default)]
pub struct Session {
    /// The keyspace chosen by `USE`.
    pub keyspace: Option<String>,
    /// The role the client logged in as (`None`: authentication is off).
    pub user: Option<String>,
}

impl Session {
    /// The same login, in `keyspace`.
    fn in_keyspace(&self, keyspace: Option<String>) -> Session {
        Session {
            keyspace,
            user: self.user.clone(),
        }
    }
}

/// Who may connect and what they may do: the replicated roles and which checks are on.
pub struct AccessControl {
    pub roles: Arc<shoal_auth::RoleStore>,
    pub settings: shoal_auth::AuthSettings,
}

/// The cluster as the system tables show it: members and their state.
pub struct ClusterView {
    pub metadata: Arc<ClusterMetadata>,
    pub liveness: Arc<dyn Liveness>,
}

/// Executes statements for one node.
pub struct Coordinator {
    pub(crate) schema: Arc<SchemaStore>,
    pub(crate) replication: Arc<dyn Replication>,
    pub(crate) prepared: prepared::PreparedCache,
    pub(crate) info: NodeInfo,
    /// Serializes increments of one counter shard led by this node ([`counter`]).
    pub(crate) counter_locks: counter::CounterLocks,
    /// This node's secondary indexes ([`index`]).
    pub(crate) indexes: Arc<index::IndexCatalog>,
    /// The read threads and the order reads are served in ([`schedule`]).
    reads: schedule::ReadScheduler,
    /// The cluster this node is part of, for the system tables; `None` on its own.
    cluster: Option<ClusterView>,
    /// Roles, and whether logins and permissions are checked.
    pub(crate) auth: AccessControl,
    /// Told about every statement run (request metrics); set once by the server.
    observer: std::sync::OnceLock<Arc<dyn observe::StatementObserver>>,
    /// Where statements executed here but prepared only on other nodes are found; set
    /// once by the server when the node is part of a cluster.
    prepared_elsewhere: std::sync::OnceLock<Arc<dyn prepared::PreparedElsewhere>>,
    /// The lookups in `prepared_elsewhere` under way, shared by the requests missing the
    /// same statement.
    prepared_lookups: prepared::Lookups,
    /// Which untraced requests are traced anyway ([`traces`]).
    trace_sampler: shoal_trace::Sampler,
}

/// An index query whose value names at most this many partitions runs inline, like a
/// read of named partitions; more, and it runs on the scan stage.
pub const INLINE_INDEX_CANDIDATES: u32 = 64;

/// A nearest-neighbour query filtered on another indexed column scores every row of the
/// partitions that filter names, when it names at most this many; more, and the vector
/// index leads instead, its candidates filtered.
pub const NEAREST_FILTER_CANDIDATES: u32 = 1024;

/// The release version this node reports; cqlsh uses the server-side DESCRIBE of 4.0+.
pub const RELEASE_VERSION: &str = "5.0.0-shoal";
pub const CQL_VERSION: &str = "3.4.7";

impl Coordinator {
    /// A coordinator whose data is replicated by `replication` and whose schema is kept by
    /// `schema` (through the cluster's metadata when `cluster` is given).
    pub fn new(
        schema: Arc<SchemaStore>,
        auth: AccessControl,
        replication: Arc<dyn Replication>,
        info: NodeInfo,
        cluster: Option<ClusterView>,
    ) -> Coordinator {
        if let Some(cluster) = &cluster {
            schema.attach_cluster(Arc::clone(&cluster.metadata));
            auth.roles.attach_cluster(Arc::clone(&cluster.metadata));
        }
        let indexes = Arc::new(index::IndexCatalog::new(
            Arc::clone(&schema),
            Arc::clone(replication.local_engine()),
        ));
        replication.set_local_indexes(Arc::clone(&indexes) as Arc<dyn LocalIndexes>);
        let read_threads = match info.read_threads {
            0 => std::thread::available_parallelism().map_or(2, |n| n.get()),
            threads => threads,
        };
        let reads = schedule::ReadScheduler::with_scan_nice(
            info.read_scheduling,
            read_threads,
            info.scan_nice,
        )
        .with_scan_deadline(info.range_request_timeout);
        replication.set_scan_stage(reads.chunk_stage());
        Coordinator {
            reads,
            indexes,
            schema,
            replication,
            prepared: prepared::PreparedCache::new(prepared::PREPARED_CACHE_CAPACITY),
            info,
            counter_locks: counter::CounterLocks::default(),
            cluster,
            auth,
            observer: std::sync::OnceLock::new(),
            prepared_elsewhere: std::sync::OnceLock::new(),
            prepared_lookups: prepared::Lookups::default(),
            trace_sampler: shoal_trace::Sampler::default(),
        }
    }

    /// A node on its own, without a cluster: every write is applied to `engine` at once
    /// ([`LocalReplication`]). For tests and embedding.
    pub fn local(engine: Arc<dyn Engine>, info: NodeInfo) -> Result<Coordinator, CqlError> {
        Coordinator::local_with_auth(engine, info, shoal_auth::AuthSettings::default())
    }

    /// [`Coordinator::local`] with logins and permission checks as `settings` says.
    pub fn local_with_auth(
        engine: Arc<dyn Engine>,
        info: NodeInfo,
        settings: shoal_auth::AuthSettings,
    ) -> Result<Coordinator, CqlError> {
        let schema = Arc::new(SchemaStore::open(Arc::clone(&engine))?);
        let auth = AccessControl {
            roles: Arc::new(shoal_auth::RoleStore::open(Arc::clone(&engine))?),
            settings,
        };
        let log = Arc::new(ImmediateWriteLog(Arc::clone(&engine)));
        let replication = Arc::new(LocalReplication::new(
            LocalReplica::new(engine, log),
            Arc::clone(&schema),
        ));
        Ok(Coordinator::new(schema, auth, replication, info, None))
    }

    pub fn cluster(&self) -> Option<&ClusterView> {
        self.cluster.as_ref()
    }

    /// Installs the cluster's current schema (a node calls it whenever the cluster's
    /// metadata changes); returns the changes for SCHEMA_CHANGE events.
    pub fn sync_schema(&self) -> Result<Vec<shoal_cql::response::SchemaChange>, CqlError> {
        let Some(cluster) = &self.cluster else {
            return Ok(Vec::new());
        };
        self.schema.install_from_cluster(&cluster.metadata)
    }

    /// From now on, `observer` is told about every statement this coordinator runs.
    pub fn set_observer(&self, observer: Arc<dyn observe::StatementObserver>) {
        let _ = self.observer.set(observer);
    }

    /// From now on, statements executed here but not prepared here are looked for
    /// `elsewhere` before the client is told to prepare them again.
    pub fn set_prepared_elsewhere(&self, elsewhere: Arc<dyn prepared::PreparedElsewhere>) {
        let _ = self.prepared_elsewhere.set(elsewhere);
    }

    /// Tells the observer a read of `table` went over `count` tombstones.
    pub(crate) fn observe_tombstones(&self, table: &shoal_schema::TableMetadata, count: u64) {
        if let Some(observer) = self.observer.get() {
            if !table.is_virtual {
                observer.tombstones(table, count);
            }
        }
    }

    /// Tells the observer about an error answered to a client.
    pub fn report_error(&self, error: &CqlError) {
        if let Some(observer) = self.observer.get() {
            observer.error(error);
        }
    }

    /// The read scheduler: its order and what each class of reads has seen.
    pub fn reads(&self) -> &schedule::ReadScheduler {
        &self.reads
    }

    /// Installs the cluster's current roles (a node calls it whenever the cluster's
    /// metadata changes), so GRANT and REVOKE hold here once this node has applied them.
    pub fn sync_roles(&self) -> Result<(), CqlError> {
        let Some(cluster) = &self.cluster else {
            return Ok(());
        };
        self.auth.roles.install_from_cluster(&cluster.metadata)
    }

    /// The roles, for the server's login exchange.
    pub fn roles(&self) -> &Arc<shoal_auth::RoleStore> {
        &self.auth.roles
    }

    /// Whether clients must log in and whether their permissions are checked.
    pub fn auth_settings(&self) -> shoal_auth::AuthSettings {
        self.auth.settings
    }

    /// Members of the cluster (1 without a cluster).
    pub fn member_count(&self) -> usize {
        self.cluster
            .as_ref()
            .map_or(1, |c| c.metadata.state().members.len().max(1))
    }

    /// The tokens this node reports in `system.local`.
    pub fn local_tokens(&self) -> Vec<i64> {
        match &self.cluster {
            Some(cluster) => cluster
                .metadata
                .state()
                .tokens_of(&self.info.host_id, system_tables::routed_table)
                .into_iter()
                .map(|t| t.0)
                .collect(),
            None => self.info.tokens.clone(),
        }
    }

    pub fn info(&self) -> &NodeInfo {
        &self.info
    }

    pub fn schema(&self) -> Arc<shoal_schema::Schema> {
        self.schema.current()
    }

    /// The schema's keeper (for changes the node makes itself).
    pub fn schema_store(&self) -> &Arc<SchemaStore> {
        &self.schema
    }

    /// This node's storage engine.
    pub fn engine(&self) -> &Arc<dyn Engine> {
        self.replication.local_engine()
    }

    /// The ids of the stored tables of `keyspace` (or just `keyspace.table`; every user
    /// table without a keyspace), for repair.
    pub fn table_ids(
        &self,
        keyspace: Option<&str>,
        table: Option<&str>,
    ) -> Result<Vec<TableId>, CqlError> {
        let schema = self.schema();
        if let Some(keyspace) = keyspace {
            schema.keyspace(keyspace)?;
            if let Some(table) = table {
                schema.table(keyspace, table)?;
            }
        }
        Ok(schema
            .user_keyspaces()
            .filter(|k| keyspace.is_none_or(|name| name == k.name))
            .flat_map(|k| k.tables.values())
            .filter(|t| table.is_none_or(|name| name == t.name))
            .map(|t| t.id)
            .collect())
    }

    /// QUERY: parse, plan and run.
    pub async fn query(
        self: &Arc<Self>,
        session: &mut Session,
        text: &str,
        parameters: &QueryParameters,
    ) -> Result<ResultBody, CqlError> {
        shoal_trace::event(|| format!("Parsing {text}"));
        let statement = shoal_cql::parser::parse_statement(text)?;
        shoal_trace::event(|| "Preparing statement".into());
        let plan = Plan::new(self, session, &statement)?;
        self.run(session, &plan, parameters).await
    }

    /// EXECUTE: run a prepared statement with its cached plan.
    pub async fn execute(
        self: &Arc<Self>,
        session: &mut Session,
        id: &[u8],
        parameters: &QueryParameters,
    ) -> Result<ResultBody, CqlError> {
        let prepared = self.prepared_statement(id).await.ok_or_else(|| {
            CqlError::new(
                ErrorCode::Unprepared { id: id.to_vec() },
                format!("Prepared query with ID {} not found (either the query was not prepared on this host (maybe the host has been restarted?) or you have prepared too many queries and it has been evicted from the internal cache)", hex(id)),
            )
        })?;
        let plan = prepared.plan(self, session)?;
        if let Plan::Statement(statement) = &plan {
            // USE, DDL and the like run in the keyspace they were prepared in.
            let mut statement_session = session.in_keyspace(
                prepared
                    .keyspace
                    .clone()
                    .or_else(|| session.keyspace.clone()),
            );
            let result = self.run(&mut statement_session, &plan, parameters).await;
            if let Statement::Use(_) = statement.as_ref() {
                session.keyspace = statement_session.keyspace;
            }
            return result;
        }
        self.run(session, &plan, parameters).await
    }

    /// The class of the statement prepared as `id`, once this node has executed it (a
    /// connection runs scans apart from its other requests by it).
    pub fn prepared_class(&self, id: &[u8]) -> Option<class::StatementClass> {
        self.prepared.get(id)?.planned_class()
    }

    /// The text of the statement prepared as `id`, if this node has it.
    pub fn prepared_text(&self, id: &[u8]) -> Option<String> {
        self.prepared.get(id).map(|p| p.text.clone())
    }

    /// The text and keyspace of the statement prepared here as `id` (asked by another
    /// node whose client executes it there).
    pub fn prepared_statement_text(&self, id: &[u8]) -> Option<prepared::StatementText> {
        self.prepared.text_of(id)
    }

    /// The statement prepared as `id`: this node's, or one another node prepared, adopted
    /// here (`None`: neither this node nor any it asked knows it).
    async fn prepared_statement(&self, id: &[u8]) -> Option<Arc<prepared::PreparedStatement>> {
        if let Some(prepared) = self.prepared.get(id) {
            return Some(prepared);
        }
        let elsewhere = self.prepared_elsewhere.get()?;
        let found = self.prepared_lookups.find(elsewhere, id).await?;
        let adopted = self.prepared.adopt(id, found);
        if adopted.is_some() {
            shoal_trace::event(|| "Prepared statement found on another node".into());
        }
        adopted
    }

    /// PREPARE.
    pub fn prepare(&self, session: &Session, text: &str) -> Result<ResultBody, CqlError> {
        prepared::prepare(self, session, text)
    }

    /// BATCH: prepared statements bring their cached plans, texts are planned.
    pub async fn batch(
        &self,
        session: &mut Session,
        request: &BatchRequest,
    ) -> Result<ResultBody, CqlError> {
        let mut prepared = Vec::with_capacity(request.statements.len());
        for statement in &request.statements {
            prepared.push(match &statement.query {
                BatchQuery::Prepared(id) => self.prepared_statement(id).await.ok_or_else(|| {
                    CqlError::new(
                        ErrorCode::Unprepared { id: id.clone() },
                        format!("Prepared query with ID {} not found", hex(id)),
                    )
                })?,
                BatchQuery::Text(text) => Arc::new(prepared::PreparedStatement::parse(
                    text,
                    session.keyspace.clone(),
                )?),
            });
            ensure(
                prepared
                    .last()
                    .is_some_and(|p| p.statement.is_modification()),
                modify::batch::only_modifications,
            )?;
        }
        // Statements prepared in another keyspace keep it.
        let batch_session = session.in_keyspace(
            prepared
                .first()
                .and_then(|p| p.keyspace.clone())
                .or_else(|| session.keyspace.clone()),
        );
        let mut plans = Vec::with_capacity(prepared.len());
        for statement in &prepared {
            match statement.plan(self, &batch_session)? {
                Plan::Modify(plan) => plans.push(plan),
                _ => return Err(modify::batch::only_modifications()),
            }
        }
        let checked: Vec<&modify::ModifyPlan> = plans.iter().map(|p| p.as_ref()).collect();
        self.authorize_writes(&batch_session, &checked)?;
        let statements: Vec<(&modify::ModifyPlan, values::Bindings<'_>)> = plans
            .iter()
            .zip(&request.statements)
            .map(|(plan, statement)| {
                let bindings = values::Bindings {
                    values: &statement.values,
                    names: None,
                };
                (plan.as_ref(), bindings)
            })
            .collect();
        let started = std::time::Instant::now();
        let result = modify::batch::apply(
            self,
            &statements,
            (request.consistency, request.serial_consistency),
            match request.kind {
                shoal_cql::request::BatchKind::Logged => shoal_cql::ast::BatchType::Logged,
                shoal_cql::request::BatchKind::Unlogged => shoal_cql::ast::BatchType::Unlogged,
                shoal_cql::request::BatchKind::Counter => shoal_cql::ast::BatchType::Counter,
            },
            (None, request.default_timestamp),
        )
        .await;
        if let Some(observer) = self.observer.get() {
            let tables: Vec<&shoal_schema::TableMetadata> =
                plans.iter().map(|p| p.table.as_ref()).collect();
            observer.observe(&observe::Observed {
                class: StatementClass::Write,
                consistency: request.consistency,
                tables: &tables,
                elapsed: started.elapsed(),
            });
        }
        result
    }

    /// Runs a plan with this request's parameters, and tells the observer.
    pub(crate) async fn run(
        self: &Arc<Self>,
        session: &mut Session,
        plan: &Plan,
        parameters: &QueryParameters,
    ) -> Result<ResultBody, CqlError> {
        let started = self.observer.get().map(|_| std::time::Instant::now());
        shoal_trace::event(|| traces::describe_plan(plan, parameters.consistency));
        let result = self.run_plan(session, plan, parameters).await;
        shoal_trace::event(|| match &result {
            Ok(ResultBody::Rows(rows)) => format!("Read {} live rows", rows.rows.row_count),
            Ok(_) => "Statement done".into(),
            Err(error) => format!("Failed: {}", error.message),
        });
        let (Some(observer), Some(started)) = (self.observer.get(), started) else {
            return result;
        };
        let (class, table) = match plan {
            Plan::Select(select) => (select.class, Some(select.table.as_ref())),
            Plan::Modify(modify) => (modify.class, Some(modify.table.as_ref())),
            Plan::Statement(statement) => (plan::statement_class(statement), None),
        };
        let table = table.filter(|t| !t.is_virtual);
        observer.observe(&observe::Observed {
            class,
            consistency: parameters.consistency,
            tables: table.as_slice(),
            elapsed: started.elapsed(),
        });
        result
    }

    async fn run_plan(
        self: &Arc<Self>,
        session: &mut Session,
        plan: &Plan,
        parameters: &QueryParameters,
    ) -> Result<ResultBody, CqlError> {
        self.authorize(session, plan)?;
        let bindings = values::Bindings {
            values: &parameters.values,
            names: parameters.names.as_deref(),
        };
        match plan {
            // A read's future is boxed (one allocation): unboxed, it made every request's
            // future as large as a read's, and a write's was copied whole at each await
            // between the connection and the engine.
            Plan::Select(select) => match select.timeout_of(bindings)? {
                None => Box::pin(self.run_select(select, parameters, bindings)).await,
                // The coordinator stops waiting and answers with a timeout; replicas
                // still working finish on their own.
                Some(timeout) => {
                    let read = Box::pin(self.run_select(select, parameters, bindings));
                    tokio::time::timeout(timeout, read)
                        .await
                        .unwrap_or_else(|_| {
                            Err(shoal_replication::consistency::read_timeout(
                                parameters.consistency,
                                0,
                                1,
                                false,
                            ))
                        })
                }
            },
            Plan::Modify(modify) => modify.execute(self, parameters, bindings).await,
            // The rarer statements are boxed: their futures are large, and a request's
            // future is as large as its largest branch (it is moved into a box per request).
            Plan::Statement(statement) => match statement.as_ref() {
                Statement::Batch(batch) => {
                    Box::pin(modify::batch::execute_batch_statement(
                        self, session, batch, parameters, bindings,
                    ))
                    .await
                }
                Statement::Use(keyspace) => {
                    self.schema().keyspace(keyspace)?;
                    session.keyspace = Some(keyspace.clone());
                    Ok(ResultBody::SetKeyspace(keyspace.clone()))
                }
                Statement::Describe { target, only } => {
                    describe::execute(self, session, target, *only)
                }
                Statement::Select(_)
                | Statement::Insert(_)
                | Statement::Update(_)
                | Statement::Delete(_) => Err(CqlError::server("a read or write without a plan")),
                Statement::Truncate(_)
                | Statement::CreateKeyspace { .. }
                | Statement::AlterKeyspace { .. }
                | Statement::DropKeyspace { .. }
                | Statement::CreateTable(_)
                | Statement::AlterTable { .. }
                | Statement::DropTable { .. }
                | Statement::CreateType { .. }
                | Statement::AlterType { .. }
                | Statement::DropType { .. }
                | Statement::CreateIndex(_)
                | Statement::DropIndex { .. } => {
                    // Boxed whole: the grants update awaits the cluster's metadata, a
                    // large future that would otherwise enlarge every request's.
                    Box::pin(async {
                        let result = ddl::execute(self, session, statement).await?;
                        if matches!(result, ResultBody::SchemaChange(_)) {
                            self.update_grants_after_schema_change(session, statement)
                                .await?;
                        }
                        Ok(result)
                    })
                    .await
                }
                Statement::CreateRole { .. }
                | Statement::AlterRole { .. }
                | Statement::DropRole { .. }
                | Statement::Permissions { .. }
                | Statement::RoleMembership { .. }
                | Statement::ListRoles { .. }
                | Statement::ListPermissions { .. } => {
                    Box::pin(self.execute_role_statement(session, statement)).await
                }
            },
        }
    }

    /// This node's secondary indexes: the server builds them as the schema asks
    /// ([`index::IndexCatalog::build_pending`]) and indexes tablets streamed in.
    pub fn index_catalog(&self) -> &Arc<index::IndexCatalog> {
        &self.indexes
    }

    /// The keyspace a statement names, or the session's.
    pub(crate) fn keyspace_for(
        &self,
        session: &Session,
        named: &Option<String>,
    ) -> Result<String, CqlError> {
        named.clone().or_else(|| session.keyspace.clone()).ok_or_else(|| {
            CqlError::invalid("No keyspace has been specified. USE a keyspace, or explicitly specify keyspace.tablename")
        })
    }

    /// Checks that enough replicas are alive for `consistency` (one node: one replica).
    pub(crate) fn check_consistency(
        &self,
        keyspace: &shoal_schema::KeyspaceMetadata,
        consistency: Consistency,
        is_write: bool,
    ) -> Result<(), CqlError> {
        if keyspace.is_system {
            return Ok(());
        }
        if !is_write && consistency == Consistency::Any {
            return Err(CqlError::invalid(
                "ANY ConsistencyLevel is only supported for writes",
            ));
        }
        if is_write && consistency.is_serial() {
            return Err(CqlError::invalid(
                "You must use conditional updates for serializable writes",
            ));
        }
        Ok(())
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests;
