//! The coordinator: executes CQL statements against the node's data.
//!
//! A request arrives as text (QUERY), as a prepared id (EXECUTE) or as a BATCH, with
//! [`QueryParameters`]. The [`Coordinator`] parses it (or finds the prepared statement),
//! checks the consistency level against the keyspace's replication, and runs it:
//!
//! - [`ddl`] — CREATE/ALTER/DROP of keyspaces and tables, TRUNCATE, USE, through the
//!   [`schema::SchemaStore`];
//! - [`write`] — INSERT, UPDATE, DELETE and BATCH become cell mutations ([`WriteBatch`])
//!   handed to the [`WriteLog`], which acknowledges them once durable by the node's
//!   commit policy;
//! - [`read`] — SELECT becomes partition reads or token-ordered scans over the storage
//!   engine, filtered, projected and paged ([`paging`]);
//! - [`system_tables`] and [`describe`] — the virtual `system` / `system_schema` tables
//!   and the server-side `DESCRIBE` statements, generated from the schema;
//! - [`prepared`] — prepared statements and the types of their bind markers.
//!
//! This crate owns no sockets and no threads: the server layer calls it and performs
//! the I/O. In a single-node deployment every replica is local; the cluster issue replaces
//! the local [`WriteLog`]/engine calls with fan-out to replicas behind the same API.

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod ddl;
pub mod describe;
pub mod hints;
pub mod paging;
pub mod prepared;
pub mod read;
pub mod repair;
pub mod replication;
pub mod restrictions;
pub mod schema;
pub mod system_tables;
pub mod values;
pub mod write;

pub use shoal_cql::{CqlError, ErrorCode};

use futures::future::BoxFuture;
use shoal_cql::ast::Statement;
use shoal_cql::request::{BatchRequest, Consistency, QueryParameters};
use shoal_cql::response::ResultBody;
use shoal_storage::{Engine, WriteBatch};
use std::net::IpAddr;
use std::sync::Arc;

/// Returns `error()` unless `condition` holds.
pub fn ensure(condition: bool, error: impl FnOnce() -> CqlError) -> Result<(), CqlError> {
    if condition {
        Ok(())
    } else {
        Err(error())
    }
}

/// Where acknowledged writes go. The server implements it with its commit policy
/// (periodic sync or epoch group commit); the future resolves when the batch may be
/// acknowledged to the client.
pub trait WriteLog: Send + Sync {
    fn append(&self, batch: WriteBatch) -> BoxFuture<'_, Result<(), CqlError>>;
}

/// A [`WriteLog`] that applies writes to the engine and acknowledges at once (tests).
pub struct ImmediateWriteLog(pub Arc<dyn Engine>);

impl WriteLog for ImmediateWriteLog {
    fn append(&self, batch: WriteBatch) -> BoxFuture<'_, Result<(), CqlError>> {
        let result = self
            .0
            .write(&batch)
            .map_err(|e| CqlError::server(e.to_string()));
        Box::pin(async move { result })
    }
}

/// What this node tells clients about itself (`system.local`, `system.peers`).
#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub cluster_name: String,
    pub address: IpAddr,
    pub cql_port: u16,
    pub datacenter: String,
    pub rack: String,
    pub host_id: [u8; 16],
    /// The tokens this node reports (the ring drivers build).
    pub tokens: Vec<i64>,
    pub gossip_generation: i32,
}

/// Per-connection state.
#[derive(Debug, Clone, Default)]
pub struct Session {
    /// The keyspace chosen by `USE`.
    pub keyspace: Option<String>,
}

/// Executes statements for one node.
pub struct Coordinator {
    pub(crate) engine: Arc<dyn Engine>,
    pub(crate) schema: schema::SchemaStore,
    pub(crate) log: Arc<dyn WriteLog>,
    pub(crate) prepared: prepared::PreparedCache,
    pub(crate) info: NodeInfo,
    /// Serializes conditional (IF ...) writes per partition stripe on this node.
    pub(crate) condition_locks: Vec<tokio::sync::Mutex<()>>,
    /// Scans running at once (see [`Coordinator::run_scan`]).
    scan_slots: tokio::sync::Semaphore,
    /// The cluster this node is part of; `None` runs everything locally (tests).
    pub(crate) cluster: Option<replication::ClusterContext>,
    /// Local reads so far, for sampling background replica checks.
    pub(crate) local_reads: std::sync::atomic::AtomicU64,
}

/// How many scans may run at once; further scans wait for a slot.
pub const SCAN_SLOTS: usize = 4;

/// The release version this node reports; cqlsh uses the server-side DESCRIBE of 4.0+.
pub const RELEASE_VERSION: &str = "5.0.0-shoal";
pub const CQL_VERSION: &str = "3.4.7";

impl Coordinator {
    pub fn new(
        engine: Arc<dyn Engine>,
        log: Arc<dyn WriteLog>,
        info: NodeInfo,
    ) -> Result<Coordinator, CqlError> {
        let schema = schema::SchemaStore::open(Arc::clone(&engine))?;
        Ok(Coordinator {
            engine,
            schema,
            log,
            prepared: prepared::PreparedCache::new(prepared::PREPARED_CACHE_CAPACITY),
            info,
            condition_locks: (0..64).map(|_| tokio::sync::Mutex::new(())).collect(),
            scan_slots: tokio::sync::Semaphore::new(SCAN_SLOTS),
            cluster: None,
            local_reads: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// A coordinator that is part of a cluster: schema changes go through the cluster's
    /// metadata and data is replicated by tablet.
    pub fn clustered(
        engine: Arc<dyn Engine>,
        log: Arc<dyn WriteLog>,
        info: NodeInfo,
        cluster: replication::ClusterContext,
    ) -> Result<Coordinator, CqlError> {
        let mut coordinator = Coordinator::new(engine, log, info)?;
        coordinator
            .schema
            .attach_cluster(Arc::clone(&cluster.metadata));
        coordinator.cluster = Some(cluster);
        Ok(coordinator)
    }

    pub fn cluster(&self) -> Option<&replication::ClusterContext> {
        self.cluster.as_ref()
    }

    /// Installs the cluster's current schema (a node calls it whenever the cluster's
    /// metadata changes); returns the changes for SCHEMA_CHANGE events.
    pub fn sync_schema(&self) -> Result<Vec<shoal_cql::response::SchemaChange>, CqlError> {
        let Some(cluster) = &self.cluster else {
            return Ok(Vec::new());
        };
        match &cluster.metadata.state().schema {
            Some(record) => self.schema.install_from_cluster(record),
            None => Ok(Vec::new()),
        }
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
                .tokens_of(&self.info.host_id)
                .into_iter()
                .map(|t| t.0)
                .collect(),
            None => self.info.tokens.clone(),
        }
    }

    pub fn info(&self) -> &NodeInfo {
        &self.info
    }

    pub fn schema(&self) -> Arc<schema::Schema> {
        self.schema.current()
    }

    pub fn engine(&self) -> &Arc<dyn Engine> {
        &self.engine
    }

    /// QUERY: parse and run.
    pub async fn query(
        self: &Arc<Self>,
        session: &mut Session,
        text: &str,
        parameters: &QueryParameters,
    ) -> Result<ResultBody, CqlError> {
        let statement = shoal_cql::parser::parse_statement(text)?;
        self.run(session, &statement, parameters).await
    }

    /// EXECUTE: run a prepared statement.
    pub async fn execute(
        self: &Arc<Self>,
        session: &mut Session,
        id: &[u8],
        parameters: &QueryParameters,
    ) -> Result<ResultBody, CqlError> {
        let prepared = self.prepared.get(id).ok_or_else(|| {
            CqlError::new(
                ErrorCode::Unprepared { id: id.to_vec() },
                format!("Prepared query with ID {} not found (either the query was not prepared on this host (maybe the host has been restarted?) or you have prepared too many queries and it has been evicted from the internal cache)", hex(id)),
            )
        })?;
        let mut statement_session = Session {
            keyspace: prepared
                .keyspace
                .clone()
                .or_else(|| session.keyspace.clone()),
        };
        let result = self
            .run(&mut statement_session, &prepared.statement, parameters)
            .await;
        if let Statement::Use(_) = prepared.statement {
            session.keyspace = statement_session.keyspace;
        }
        result
    }

    /// PREPARE.
    pub fn prepare(&self, session: &Session, text: &str) -> Result<ResultBody, CqlError> {
        prepared::prepare(self, session, text)
    }

    /// BATCH.
    pub async fn batch(
        &self,
        session: &mut Session,
        batch: &BatchRequest,
    ) -> Result<ResultBody, CqlError> {
        write::execute_protocol_batch(self, session, batch).await
    }

    pub(crate) async fn run(
        self: &Arc<Self>,
        session: &mut Session,
        statement: &Statement,
        parameters: &QueryParameters,
    ) -> Result<ResultBody, CqlError> {
        let bindings = values::Bindings {
            values: &parameters.values,
            names: parameters.names.as_deref(),
        };
        match statement {
            Statement::Select(select) if read::is_scan(self, session, select) => {
                self.run_scan(session, select, parameters).await
            }
            Statement::Select(select) => {
                let read_locally = || {
                    read::execute_select(
                        self,
                        self.engine.as_ref(),
                        session,
                        select,
                        parameters,
                        bindings,
                    )
                };
                let Some((table_id, partitions)) =
                    read::partitions_of(self, session, select, bindings)
                else {
                    return read_locally();
                };
                match self
                    .gather_partitions(&table_id, &partitions, parameters.consistency)
                    .await?
                {
                    replication::Gathered::Local => {
                        self.maybe_check_replicas_in_background(table_id, partitions);
                        read_locally()
                    }
                    replication::Gathered::Merged(engine) => {
                        read::execute_select(self, &engine, session, select, parameters, bindings)
                    }
                    replication::Gathered::TooLarge => {
                        self.run_scan(session, select, parameters).await
                    }
                }
            }
            Statement::Insert(_) | Statement::Update(_) | Statement::Delete(_) => {
                write::execute_modification(self, session, statement, parameters, bindings).await
            }
            Statement::Batch(batch) => {
                write::execute_batch_statement(self, session, batch, parameters, bindings).await
            }
            Statement::Use(keyspace) => {
                self.schema().keyspace(keyspace)?;
                session.keyspace = Some(keyspace.clone());
                Ok(ResultBody::SetKeyspace(keyspace.clone()))
            }
            Statement::Describe { target, only } => describe::execute(self, session, target, *only),
            Statement::Truncate(_)
            | Statement::CreateKeyspace { .. }
            | Statement::AlterKeyspace { .. }
            | Statement::DropKeyspace { .. }
            | Statement::CreateTable(_)
            | Statement::AlterTable { .. }
            | Statement::DropTable { .. } => ddl::execute(self, session, statement).await,
        }
    }

    /// Runs a scan (a SELECT not limited to named partitions, or a partition read too
    /// large to gather whole from its replicas) on a blocking thread, so that it holds
    /// neither a runtime worker nor the point requests queued behind it on its
    /// connection. At most [`SCAN_SLOTS`] run at once; more wait for a slot.
    async fn run_scan(
        self: &Arc<Self>,
        session: &Session,
        select: &shoal_cql::ast::Select,
        parameters: &QueryParameters,
    ) -> Result<ResultBody, CqlError> {
        let _slot = self
            .scan_slots
            .acquire()
            .await
            .map_err(|_| CqlError::server("the scan stage is closed"))?;
        let coordinator = Arc::clone(self);
        let session = session.clone();
        let select = select.clone();
        let parameters = parameters.clone();
        let runtime = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || {
            let bindings = values::Bindings {
                values: &parameters.values,
                names: parameters.names.as_deref(),
            };
            let replicated = coordinator.member_count() > 1;
            let view = match coordinator.scan_table_id(&session, &select) {
                Some(table_id) if replicated => Some(replication::ReplicatedView {
                    coordinator: Arc::clone(&coordinator),
                    table_id,
                    consistency: parameters.consistency,
                    runtime,
                    error: Default::default(),
                }),
                _ => None,
            };
            let engine: &dyn Engine = match &view {
                Some(view) => view,
                None => coordinator.engine.as_ref(),
            };
            let result = read::execute_select(
                &coordinator,
                engine,
                &session,
                &select,
                &parameters,
                bindings,
            );
            // A replicated scan's reader sees only a storage error; the client gets the
            // real one (Unavailable, ReadTimeout).
            match view.and_then(|v| v.error.lock().take()) {
                Some(error) => Err(error),
                None => result,
            }
        })
        .await
        .map_err(|_| CqlError::server("the scan failed unexpectedly"))?
    }

    /// The stored table a scan reads (`None` for virtual tables and unknown names).
    fn scan_table_id(
        &self,
        session: &Session,
        select: &shoal_cql::ast::Select,
    ) -> Option<[u8; 16]> {
        let keyspace = self.keyspace_for(session, &select.table.keyspace).ok()?;
        let schema = self.schema();
        let table = schema.table(&keyspace, &select.table.name).ok()?;
        (!table.is_virtual).then_some(table.id)
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
        keyspace: &schema::KeyspaceMetadata,
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
        if is_write && matches!(consistency, Consistency::Serial | Consistency::LocalSerial) {
            return Err(CqlError::invalid(
                "You must use conditional updates for serializable writes",
            ));
        }
        if matches!(consistency, Consistency::Serial | Consistency::LocalSerial)
            && self.member_count() > 1
        {
            return Err(CqlError::invalid(format!(
                "{} consistency is only for lightweight transactions (conditional statements), which need a single node for now",
                consistency.name()
            )));
        }
        if consistency == Consistency::Any || self.cluster.is_some() {
            // On a cluster the replication layer checks the live replicas per tablet.
            return Ok(());
        }
        let replication_factor = keyspace.replication_factor();
        let required = consistency.required_replicas(replication_factor);
        let alive = replication_factor.min(1);
        if required > alive {
            return Err(replication::unavailable(consistency, required, alive));
        }
        Ok(())
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests;
