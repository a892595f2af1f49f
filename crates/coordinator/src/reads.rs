//! Running read plans: a SELECT of named partitions or slices (through the replication
//! layer, or read here when this node can answer alone), a `SERIAL` read, a token-ordered
//! scan (on the scan stage), and the reads behind secondary-index queries and vector
//! search (`ORDER BY … ANN OF`). [`Coordinator::run_plan`] dispatches to them.

use crate::class::StatementClass;
use crate::select::SelectPlan;
use crate::{
    index, modify, restrictions, schedule, select, values, Coordinator, CqlError,
    INLINE_INDEX_CANDIDATES, NEAREST_FILTER_CANDIDATES,
};
use shoal_cql::request::QueryParameters;
use shoal_cql::response::ResultBody;
use shoal_model::Token;
use shoal_replication::{PartitionSource, ScanSource};
use shoal_storage::Engine;
use std::sync::Arc;

impl Coordinator {
    /// A SELECT: named partitions through the replication layer (read here when this node
    /// can answer alone), scans on the scan stage.
    pub(crate) async fn run_select(
        self: &Arc<Self>,
        select: &Arc<SelectPlan>,
        parameters: &QueryParameters,
        bindings: values::Bindings<'_>,
    ) -> Result<ResultBody, CqlError> {
        let table_id = select.table.id;
        match select.class {
            StatementClass::System => {
                return select.execute(self, self.engine().as_ref(), parameters, bindings, None)
            }
            StatementClass::Scan => {
                if select.nearest.is_some() {
                    return Box::pin(self.run_nearest(select, parameters, bindings)).await;
                }
                if let Some(choice) = select.index {
                    let restrictions = select.where_plan.bind(&select.table, bindings)?;
                    let inline = Box::pin(self.run_selective_index_query(
                        select,
                        choice,
                        &restrictions,
                        parameters,
                        bindings,
                        INLINE_INDEX_CANDIDATES,
                    ));
                    if let Some(result) = inline.await? {
                        return Ok(result);
                    }
                }
                return Box::pin(self.run_scan(select, parameters)).await;
            }
            _ => {}
        }
        let restrictions = select.where_plan.bind(&select.table, bindings)?;
        let partitions = SelectPlan::partitions(&select.table, &restrictions).unwrap_or_default();
        if parameters.consistency.is_serial() {
            return self
                .run_serial_select(select, parameters, bindings, &restrictions, partitions)
                .await;
        }
        match self
            .replication
            .read_partitions(table_id, &partitions, parameters.consistency)
            .await?
        {
            PartitionSource::Local(in_flight) => {
                // In the point-first orders the read is served here, from memory; one
                // that needs data not in memory, and every one in arrival order, is run
                // in its turn.
                let read_from_memory = self.reads.point_read_inline().then(|| {
                    shoal_storage::InMemory::read(self.engine(), |memory| {
                        select.execute(self, memory, parameters, bindings, Some(&restrictions))
                    })
                });
                let result = if let Some(Some(result)) = read_from_memory {
                    result
                } else {
                    let coordinator = Arc::clone(self);
                    let select = Arc::clone(select);
                    let parameters = parameters.clone();
                    self.reads
                        .run_point(schedule::ReadClass::LocalPoint, move || {
                            let bindings = values::Bindings {
                                values: &parameters.values,
                                names: parameters.names.as_deref(),
                            };
                            select.execute(
                                &coordinator,
                                coordinator.engine().as_ref(),
                                &parameters,
                                bindings,
                                Some(&restrictions),
                            )
                        })
                        .await?
                };
                // The engine has been read: a topology barrier need not wait any more.
                drop(in_flight);
                Arc::clone(&self.replication).after_local_read(table_id, partitions);
                result
            }
            PartitionSource::Merged(merged) => {
                select.execute(self, &merged, parameters, bindings, Some(&restrictions))
            }
            PartitionSource::TooLarge => Box::pin(self.run_scan(select, parameters)).await,
        }
    }

    /// A SELECT of named partitions at `SERIAL` or `LOCAL_SERIAL`: a Paxos round on each
    /// partition settles every decision before it (in-progress proposals finished, the
    /// latest commit on a quorum), then the partitions are read at a quorum — so it sees
    /// every conditional write applied before it began. (Scans at a serial level read at
    /// a quorum, as in Cassandra.)
    pub(crate) async fn run_serial_select(
        self: &Arc<Self>,
        select: &Arc<SelectPlan>,
        parameters: &QueryParameters,
        bindings: values::Bindings<'_>,
        restrictions: &restrictions::Restrictions,
        partitions: Vec<shoal_replication::PartitionRef>,
    ) -> Result<ResultBody, CqlError> {
        let serial = parameters.consistency;
        self.check_consistency(&select.keyspace, serial, false)?;
        let deadline =
            tokio::time::Instant::now() + shoal_replication::paxos::CAS_CONTENTION_TIMEOUT;
        // What each partition's promising quorum read in the prepare, while every one did.
        let mut read_in_prepare = Some(shoal_replication::Cells::new());
        for (token, partition_key) in &partitions {
            let key = shoal_replication::paxos::PaxosKey {
                table: select.table.id,
                token: *token,
                partition_key: partition_key.clone(),
            };
            // The read's round takes the partition's turn like a conditional statement's
            // (on its leader while it is busy), so it does not preempt their ballots; the
            // turn ends with the prepare.
            let mut turn = self.replication.paxos_turn(&key, deadline).await;
            let round = self
                .replication
                .paxos_prepare(&key, serial, deadline, &mut turn)
                .await
                .map_err(modify::serial_read_error)?;
            drop(turn);
            read_in_prepare = match (read_in_prepare, round.partition) {
                (Some(mut cells), Some(partition)) => {
                    cells.extend(partition);
                    Some(cells)
                }
                _ => None,
            };
        }
        let state = match read_in_prepare {
            Some(cells) => modify::CurrentState::from_cells(cells)?,
            None => modify::read_in_round(self, &select.table, &partitions, serial).await?,
        };
        select.execute(
            self,
            state.engine(self),
            parameters,
            bindings,
            Some(restrictions),
        )
    }

    /// Runs a scan (a SELECT not limited to named partitions, or a partition read too
    /// large to gather whole from its replicas) in its turn ([`schedule`]), so that it
    /// holds neither a runtime worker nor the point requests queued behind it on its
    /// connection: across the cluster on a scan thread, its chunks served in the turn of
    /// its ticket on every replica; over this node's data alone on a read thread.
    pub(crate) async fn run_scan(
        self: &Arc<Self>,
        select: &Arc<SelectPlan>,
        parameters: &QueryParameters,
    ) -> Result<ResultBody, CqlError> {
        let ticket = select.scan_ticket(parameters)?;
        let coordinator = Arc::clone(self);
        let select = Arc::clone(select);
        let parameters = parameters.clone();
        let runtime = tokio::runtime::Handle::current();
        let source = match select.stored_table() {
            Some(table_id) => Arc::clone(&coordinator.replication)
                .scan_source(table_id, parameters.consistency, runtime.clone())
                .in_turn_of(ticket, select.table.cells_per_row()),
            None => ScanSource::Local,
        };
        let across_cluster = matches!(source, ScanSource::Replicated(_));
        let scan = move || {
            let bindings = values::Bindings {
                values: &parameters.values,
                names: parameters.names.as_deref(),
            };
            if let Some(choice) = select.index {
                let view = coordinator.index_view(&select, choice, source, &parameters, runtime)?;
                let result = select.execute(&coordinator, &view, &parameters, bindings, None);
                return match view.take_error() {
                    Some(error) => Err(error),
                    None => result,
                };
            }
            let engine: &dyn Engine = match &source {
                ScanSource::Replicated(view) => view.as_ref(),
                ScanSource::Local => coordinator.engine().as_ref(),
            };
            let result = select.execute(&coordinator, engine, &parameters, bindings, None);
            // A replicated scan's reader sees only a storage error; the client gets the
            // real one (Unavailable, ReadTimeout).
            let scan_error = match &source {
                ScanSource::Replicated(view) => view.take_error(),
                ScanSource::Local => None,
            };
            match scan_error {
                Some(error) => Err(error),
                None => result,
            }
        };
        if across_cluster {
            self.reads.run_coordinated_scan(ticket, scan).await?
        } else {
            self.reads
                .run(schedule::ReadClass::Scan(ticket), scan)
                .await?
        }
    }

    /// The engine an index query scans: the candidate partitions of the index lookup its
    /// bound filter names, read from `source`.
    pub(crate) fn index_view(
        self: &Arc<Self>,
        select: &SelectPlan,
        choice: select::IndexChoice,
        source: ScanSource,
        parameters: &QueryParameters,
        runtime: tokio::runtime::Handle,
    ) -> Result<index::CandidateView, CqlError> {
        let bindings = values::Bindings {
            values: &parameters.values,
            names: parameters.names.as_deref(),
        };
        let restrictions = select.where_plan.bind(&select.table, bindings)?;
        let predicate = index::lookup_predicate(&restrictions.filters, choice.filter)
            .ok_or_else(|| CqlError::server("the indexed restriction has no single value"))?;
        let replication = Arc::clone(&self.replication);
        let (table, consistency) = (select.table.id, parameters.consistency);
        let fetch: index::view::FetchCandidates = Box::new(move |from, limit| {
            let lookup = shoal_replication::index::IndexLookup {
                table,
                index: choice.id,
                predicate: predicate.clone(),
                from,
                limit,
            };
            runtime.block_on(replication.index_candidates(lookup, consistency))
        });
        Ok(index::CandidateView::new(
            index::view::Rows::of(source, self.engine()),
            table,
            fetch,
        ))
    }

    /// An index query that names few partitions runs like a read of named partitions:
    /// inline, its candidates read at the level from their replicas (this node alone
    /// when it can answer). `None` when the index names more partitions than that: the
    /// query then runs as a scan.
    pub(crate) async fn run_selective_index_query(
        self: &Arc<Self>,
        select: &Arc<SelectPlan>,
        choice: select::IndexChoice,
        restrictions: &restrictions::Restrictions,
        parameters: &QueryParameters,
        bindings: values::Bindings<'_>,
        max_candidates: u32,
    ) -> Result<Option<ResultBody>, CqlError> {
        let Some(predicate) = index::lookup_predicate(&restrictions.filters, choice.filter) else {
            return Ok(None);
        };
        let table = select.table.id;
        let lookup = shoal_replication::index::IndexLookup {
            table,
            index: choice.id,
            predicate,
            from: shoal_model::Token::MIN,
            limit: max_candidates + 1,
        };
        let candidates = self
            .replication
            .index_candidates(lookup, parameters.consistency)
            .await?;
        if candidates.len() > max_candidates as usize {
            return Ok(None);
        }
        self.read_candidates(select, candidates, restrictions, parameters, bindings)
            .await
            .map(Some)
    }

    /// `ORDER BY v ANN OF [...] LIMIT k` over the whole table (or a token range). With a
    /// filter on another indexed column that names few partitions, those are read and
    /// scored exactly. Otherwise the vector index names the partitions nearest to the
    /// query on every tablet (merged by score); they are read at the consistency level
    /// and every row scored from its stored vector, filtered, and the best `k` kept. A
    /// candidate may be stale (its row since deleted) or filtered out: while fewer than
    /// `k` rows remain and the index may hold more, the search asks for four times as many.
    pub(crate) async fn run_nearest(
        self: &Arc<Self>,
        select: &Arc<SelectPlan>,
        parameters: &QueryParameters,
        bindings: values::Bindings<'_>,
    ) -> Result<ResultBody, CqlError> {
        let Some(nearest) = &select.nearest else {
            return Err(CqlError::server("not a nearest-neighbour query"));
        };
        let restrictions = select.where_plan.bind(&select.table, bindings)?;
        let query = nearest.query(bindings)?;
        let limit = match select.limit_of(bindings)? {
            Some(limit) => select::nearest_limit(limit)?,
            None => {
                return Err(CqlError::invalid(
                    "Top-K queries must have a limit specified",
                ))
            }
        };
        if let Some(choice) = select.index {
            let filtered = Box::pin(self.run_selective_index_query(
                select,
                choice,
                &restrictions,
                parameters,
                bindings,
                NEAREST_FILTER_CANDIDATES,
            ));
            if let Some(result) = filtered.await? {
                return Ok(result);
            }
        }
        let from = match restrictions.token_lower {
            None => Some(Token::MIN),
            Some((token, true)) => Some(Token(token)),
            Some((token, false)) => token.checked_add(1).map(Token),
        };
        let upto = match restrictions.token_upper {
            None => Some(Token::MAX),
            Some((token, true)) => Some(Token(token)),
            Some((token, false)) => token.checked_sub(1).map(Token),
        };
        let table = select.table.id;
        // As many partitions as rows wanted: stale candidates are rare, and the loop
        // below asks again for more when some are.
        let mut wanted = limit as u32;
        loop {
            let mut candidates: Vec<shoal_replication::PartitionRef> = Vec::new();
            let mut exhausted = true;
            if let (Some(from), Some(upto)) = (from, upto) {
                if from <= upto {
                    let search = shoal_replication::index::VectorSearch {
                        table,
                        index: nearest.index,
                        query: query.clone(),
                        from,
                        upto,
                        limit: wanted,
                    };
                    let answer = self
                        .replication
                        .vector_candidates(search, parameters.consistency)
                        .await?;
                    exhausted = answer.complete;
                    candidates = answer
                        .hits
                        .into_iter()
                        .map(|hit| (hit.token, hit.partition_key))
                        .collect();
                    candidates.sort();
                }
            }
            let result = self
                .read_candidates(select, candidates, &restrictions, parameters, bindings)
                .await?;
            let found = match &result {
                ResultBody::Rows(rows) => rows.rows.row_count.max(0) as u64,
                _ => limit,
            };
            if found >= limit || exhausted {
                return Ok(result);
            }
            wanted = wanted.saturating_mul(4);
        }
    }

    /// Runs `select` over the candidate partitions only, read at the level from their
    /// replicas (this node alone when it can answer; on a blocking thread through the
    /// replicated view when they are too large to gather at once).
    pub(crate) async fn read_candidates(
        self: &Arc<Self>,
        select: &Arc<SelectPlan>,
        candidates: Vec<shoal_replication::PartitionRef>,
        restrictions: &restrictions::Restrictions,
        parameters: &QueryParameters,
        bindings: values::Bindings<'_>,
    ) -> Result<ResultBody, CqlError> {
        let table = select.table.id;
        // Held until the read is done (a topology barrier waits for it).
        let mut _in_flight = None;
        let rows = match self
            .replication
            .read_partitions(table, &candidates, parameters.consistency)
            .await?
        {
            PartitionSource::Local(guard) => {
                _in_flight = Some(guard);
                index::view::Rows::Engine(Arc::clone(self.engine()))
            }
            PartitionSource::Merged(merged) => index::view::Rows::Engine(Arc::new(merged)),
            PartitionSource::TooLarge => {
                let coordinator = Arc::clone(self);
                let select = Arc::clone(select);
                let parameters = parameters.clone();
                let runtime = tokio::runtime::Handle::current();
                return tokio::task::spawn_blocking(move || {
                    let bindings = values::Bindings {
                        values: &parameters.values,
                        names: parameters.names.as_deref(),
                    };
                    let source = Arc::clone(&coordinator.replication).scan_source(
                        table,
                        parameters.consistency,
                        runtime,
                    );
                    let rows = index::view::Rows::of(source, coordinator.engine());
                    let view = index::CandidateView::of_candidates(rows, table, candidates);
                    let result = select.execute(&coordinator, &view, &parameters, bindings, None);
                    match view.take_error() {
                        Some(error) => Err(error),
                        None => result,
                    }
                })
                .await
                .map_err(|_| CqlError::server("the read failed unexpectedly"))?;
            }
        };
        let view = index::CandidateView::of_candidates(rows, table, candidates);
        let result = select.execute(self, &view, parameters, bindings, Some(restrictions));
        match view.take_error() {
            Some(error) => Err(error),
            None => result,
        }
    }
}
