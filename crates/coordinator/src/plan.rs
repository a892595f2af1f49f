//! Plans: a statement analysed once against the schema.
//!
//! A [`Plan`] records everything the statement's shape decides — which table, the WHERE
//! plan (partitions or a token range, clustering slices, filters, each value still a
//! typed term), the selection, the cells a write produces — so that executing it only
//! binds values. A prepared statement caches its plan ([`crate::prepared`]) and rebuilds
//! it only when the schema version it was built against changes; EXECUTE of a prepared
//! point read therefore does no parsing, no table lookup by name and no WHERE analysis.
//!
//! Each read or write plan carries its [`StatementClass`], what request scheduling orders
//! by (point reads before scans). The plan is where later features hook in: index
//! selection and grouping in the select plan, permission checks against the planned
//! table.

pub use crate::class::StatementClass;
use crate::modify::ModifyPlan;
use crate::select::SelectPlan;
use crate::{Coordinator, CqlError, Session};
use shoal_cql::ast::Statement;
use std::sync::Arc;

/// A statement ready to execute.
#[derive(Clone)]
pub(crate) enum Plan {
    Select(Arc<SelectPlan>),
    Modify(Arc<ModifyPlan>),
    /// Executed from the statement itself: schema changes, USE, DESCRIBE, and BATCH,
    /// whose statements are planned when it runs.
    Statement(Arc<Statement>),
}

impl Plan {
    /// Plans `statement` for a session whose keyspace is `session.keyspace`.
    pub(crate) fn new(
        coordinator: &Coordinator,
        session: &Session,
        statement: &Statement,
    ) -> Result<Plan, CqlError> {
        let schema = coordinator.schema();
        Ok(match statement {
            Statement::Select(select) => {
                let keyspace = coordinator.keyspace_for(session, &select.table.keyspace)?;
                Plan::Select(Arc::new(SelectPlan::new(&schema, &keyspace, select)?))
            }
            Statement::Insert(_) | Statement::Update(_) | Statement::Delete(_) => Plan::Modify(
                Arc::new(ModifyPlan::new(coordinator, session, &schema, statement)?),
            ),
            other => Plan::Statement(Arc::new(other.clone())),
        })
    }

    /// What kind of work the statement is.
    pub(crate) fn class(&self) -> StatementClass {
        match self {
            Plan::Select(plan) => plan.class,
            Plan::Modify(plan) => plan.class,
            Plan::Statement(statement) => statement_class(statement),
        }
    }
}

/// The class of a statement executed without a read or write plan.
pub(crate) fn statement_class(statement: &Statement) -> StatementClass {
    match statement {
        Statement::Batch(_) => StatementClass::Write,
        Statement::Use(_) | Statement::Describe { .. } => StatementClass::System,
        Statement::ListRoles { .. } | Statement::ListPermissions { .. } => StatementClass::System,
        _ => StatementClass::Schema,
    }
}
