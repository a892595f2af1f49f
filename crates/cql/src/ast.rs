//! The parsed form of CQL statements. Names are already case-folded (unquoted names
//! lowercased); values are still untyped [`Term`]s, typed later against the schema.

use shoal_model::CqlType;

/// `keyspace.name` or just `name` (the session's keyspace is filled in later).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QualifiedName {
    pub keyspace: Option<String>,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Literal {
    String(String),
    /// Integer text (may exceed 64 bits for varint).
    Integer(String),
    Float(String),
    Boolean(bool),
    Null,
    Uuid(String),
    Blob(Vec<u8>),
    Duration(String),
    NaN,
    Infinity,
}

/// A bind marker; `index` is its position among all markers of the statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindMarker {
    pub index: usize,
    pub name: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Term {
    Literal(Literal),
    Negative(Box<Term>),
    Bind(BindMarker),
    List(Vec<Term>),
    Set(Vec<Term>),
    Map(Vec<(Term, Term)>),
    /// `(a, b, c)`: a tuple value, or the list of an `IN (...)`.
    Tuple(Vec<Term>),
    Function {
        name: String,
        arguments: Vec<Term>,
    },
    Cast {
        cql_type: CqlType,
        term: Box<Term>,
    },
    /// `{street: 'Main St', zip: 1}`: a user-defined type's value, by field name.
    UserType(Vec<(String, Term)>),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Selector {
    Column(String),
    WriteTime(String),
    /// `maxwritetime(c)`: the latest write time of any of the column's cells.
    MaxWriteTime(String),
    Ttl(String),
    /// `count(*)` or `count(1)`.
    CountAll,
    Token(Vec<String>),
    Function {
        name: String,
        arguments: Vec<Selector>,
    },
    Cast {
        selector: Box<Selector>,
        cql_type: CqlType,
    },
    Literal(Term),
    /// `addr.zip`: one field of a user-defined type.
    Field {
        selector: Box<Selector>,
        field: String,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct SelectItem {
    pub selector: Selector,
    pub alias: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    Eq,
    NotEq,
    Lt,
    Lte,
    Gt,
    Gte,
    In,
    Contains,
    ContainsKey,
    Like,
}

#[derive(Debug, Clone, PartialEq)]
pub enum RelationTarget {
    Column(String),
    /// `(c1, c2) > (1, 2)`: a multi-column relation on clustering columns.
    Columns(Vec<String>),
    Token(Vec<String>),
    /// `m['key'] = value` on a map column (filtering).
    MapEntry(String, Term),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Relation {
    pub target: RelationTarget,
    pub operator: Operator,
    pub value: Term,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Select {
    pub table: QualifiedName,
    pub json: bool,
    pub distinct: bool,
    /// Empty means `*`.
    pub items: Vec<SelectItem>,
    pub relations: Vec<Relation>,
    pub group_by: Vec<String>,
    /// `(column, descending)`.
    pub order_by: Vec<(String, bool)>,
    /// `ORDER BY v ANN OF [...]`: the vector column and the vector rows are ordered
    /// by nearness to (alone: any other ordering is refused when planning).
    pub ann: Option<(String, Term)>,
    pub per_partition_limit: Option<Term>,
    pub limit: Option<Term>,
    pub allow_filtering: bool,
    /// `USING TIMEOUT 500ms` (ScyllaDB's extension, which its drivers use): how long the
    /// coordinator may take before it answers with a timeout.
    pub timeout: Option<Term>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Using {
    pub ttl: Option<Term>,
    pub timestamp: Option<Term>,
}

/// A lightweight-transaction condition.
#[derive(Debug, Clone, PartialEq)]
pub enum Conditions {
    NotExists,
    Exists,
    Columns(Vec<ColumnCondition>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct ColumnCondition {
    pub column: String,
    /// `IF m['k'] = v` / `IF l[0] = v`.
    pub element: Option<Term>,
    /// `IF addr.zip = v`: a field of a user-defined type.
    pub field: Option<String>,
    pub operator: Operator,
    pub value: Term,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Insert {
    pub table: QualifiedName,
    pub columns: Vec<String>,
    pub values: Vec<Term>,
    /// `INSERT ... JSON '...'`: the JSON text term.
    pub json: Option<Term>,
    /// `INSERT ... JSON '...' DEFAULT UNSET`: columns missing from the JSON are left as
    /// they are (by default they are set to null).
    pub json_default_unset: bool,
    pub if_not_exists: bool,
    pub using: Using,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Assignment {
    /// `c = value`
    Set { column: String, value: Term },
    /// `c = c + value` (append, union, counter increment)
    Add { column: String, value: Term },
    /// `c = value + c` (list prepend)
    Prepend { column: String, value: Term },
    /// `c = c - value`
    Remove { column: String, value: Term },
    /// `c[key] = value`
    SetElement {
        column: String,
        key: Term,
        value: Term,
    },
    /// `c.field = value` on a non-frozen user-defined type.
    SetField {
        column: String,
        field: String,
        value: Term,
    },
}

impl Assignment {
    pub fn column(&self) -> &str {
        match self {
            Assignment::Set { column, .. }
            | Assignment::Add { column, .. }
            | Assignment::Prepend { column, .. }
            | Assignment::Remove { column, .. }
            | Assignment::SetElement { column, .. }
            | Assignment::SetField { column, .. } => column,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Update {
    pub table: QualifiedName,
    pub using: Using,
    pub assignments: Vec<Assignment>,
    pub relations: Vec<Relation>,
    pub conditions: Option<Conditions>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DeleteTarget {
    pub column: String,
    /// `DELETE m['k']` / `DELETE l[2]`.
    pub element: Option<Term>,
    /// `DELETE addr.zip`: one field of a non-frozen user-defined type.
    pub field: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Delete {
    pub table: QualifiedName,
    pub targets: Vec<DeleteTarget>,
    pub using: Using,
    pub relations: Vec<Relation>,
    pub conditions: Option<Conditions>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchType {
    Logged,
    Unlogged,
    Counter,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub batch_type: BatchType,
    pub using: Using,
    pub statements: Vec<Statement>,
}

/// `WITH name = value AND ...` options; values are terms (maps, strings, numbers).
pub type Properties = Vec<(String, Term)>;

#[derive(Debug, Clone, PartialEq)]
pub struct ColumnDefinition {
    pub name: String,
    pub cql_type: CqlType,
    pub is_static: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CreateTable {
    pub table: QualifiedName,
    pub if_not_exists: bool,
    pub columns: Vec<ColumnDefinition>,
    pub partition_key: Vec<String>,
    pub clustering_key: Vec<String>,
    /// `(column, descending)` from `CLUSTERING ORDER BY`.
    pub clustering_order: Vec<(String, bool)>,
    pub properties: Properties,
    pub compact_storage: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum AlterTableAction {
    Add(Vec<ColumnDefinition>),
    Drop(Vec<String>),
    Rename(Vec<(String, String)>),
    AlterType { column: String, cql_type: CqlType },
    With(Properties),
}

/// What `CREATE INDEX` indexes: `c`, `VALUES(c)`, `KEYS(m)`, `ENTRIES(m)` or `FULL(c)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexTargetKind {
    /// A bare column name.
    Simple,
    Values,
    Keys,
    Entries,
    Full,
}

#[derive(Debug, Clone, PartialEq)]
pub struct CreateIndex {
    pub name: Option<String>,
    pub table: QualifiedName,
    pub if_not_exists: bool,
    pub column: String,
    pub target: IndexTargetKind,
    /// `USING 'class'` (with or without `CUSTOM`).
    pub using: Option<String>,
    pub options: Properties,
}

#[derive(Debug, Clone, PartialEq)]
pub enum AlterTypeAction {
    /// `ADD [IF NOT EXISTS] field type`.
    Add {
        field: String,
        cql_type: CqlType,
        if_not_exists: bool,
    },
    /// `RENAME [IF EXISTS] a TO b AND c TO d`.
    Rename {
        renames: Vec<(String, String)>,
        if_exists: bool,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub enum DescribeTarget {
    Cluster,
    Keyspaces,
    /// `None`: the current keyspace.
    Keyspace(Option<String>),
    Tables,
    Table(QualifiedName),
    Schema {
        full: bool,
    },
    Types,
    /// `DESCRIBE TYPE name`.
    Type(QualifiedName),
    Functions,
    Aggregates,
    /// `DESCRIBE name`: a keyspace or a table, whichever exists.
    Name(QualifiedName),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Statement {
    Select(Box<Select>),
    Insert(Box<Insert>),
    Update(Box<Update>),
    Delete(Box<Delete>),
    Batch(Box<Batch>),
    CreateKeyspace {
        name: String,
        if_not_exists: bool,
        properties: Properties,
    },
    AlterKeyspace {
        name: String,
        properties: Properties,
    },
    DropKeyspace {
        name: String,
        if_exists: bool,
    },
    CreateTable(Box<CreateTable>),
    AlterTable {
        table: QualifiedName,
        action: AlterTableAction,
    },
    DropTable {
        table: QualifiedName,
        if_exists: bool,
    },
    Truncate(QualifiedName),
    /// `CREATE TYPE [IF NOT EXISTS] name (field type, ...)`.
    CreateType {
        name: QualifiedName,
        if_not_exists: bool,
        fields: Vec<(String, CqlType)>,
    },
    AlterType {
        name: QualifiedName,
        if_exists: bool,
        action: AlterTypeAction,
    },
    DropType {
        name: QualifiedName,
        if_exists: bool,
    },
    /// `CREATE [CUSTOM] INDEX [IF NOT EXISTS] [name] ON table (target) [USING 'class']
    /// [WITH OPTIONS = {...}]`.
    CreateIndex(Box<CreateIndex>),
    /// `DROP INDEX [IF EXISTS] [keyspace.]name`.
    DropIndex {
        name: QualifiedName,
        if_exists: bool,
    },
    Use(String),
    Describe {
        target: DescribeTarget,
        only: bool,
    },
    /// CREATE ROLE, and CREATE USER (a role that may log in).
    CreateRole {
        name: String,
        if_not_exists: bool,
        options: Properties,
    },
    /// ALTER ROLE, and ALTER USER.
    AlterRole {
        name: String,
        options: Properties,
    },
    DropRole {
        name: String,
        if_exists: bool,
    },
    /// GRANT (`grant: true`) or REVOKE of permissions; `permissions: None` is ALL.
    Permissions {
        grant: bool,
        permissions: Option<Vec<String>>,
        resource: AuthResource,
        role: String,
    },
    /// GRANT `role` TO `grantee` (`grant: true`) or REVOKE `role` FROM `grantee`.
    RoleMembership {
        grant: bool,
        role: String,
        grantee: String,
    },
    /// LIST ROLES [OF r] [NORECURSIVE], and LIST USERS (`users: true`).
    ListRoles {
        of: Option<String>,
        recursive: bool,
        users: bool,
    },
    /// LIST ALL|perm [PERMISSIONS] [ON resource] [OF role] [NORECURSIVE].
    ListPermissions {
        permissions: Option<Vec<String>>,
        resource: Option<AuthResource>,
        of: Option<String>,
        recursive: bool,
    },
}

/// What GRANT, REVOKE and LIST PERMISSIONS name, as written (a table's keyspace may be
/// the session's).
#[derive(Debug, Clone, PartialEq)]
pub enum AuthResource {
    AllKeyspaces,
    Keyspace(String),
    Table(QualifiedName),
    AllRoles,
    Role(String),
}

impl Statement {
    /// True for statements that change data (allowed inside BATCH).
    pub fn is_modification(&self) -> bool {
        matches!(
            self,
            Statement::Insert(_) | Statement::Update(_) | Statement::Delete(_)
        )
    }

    /// True for lightweight transactions: a modification with an `IF`, or a batch holding
    /// one.
    pub fn is_conditional(&self) -> bool {
        match self {
            Statement::Insert(insert) => insert.if_not_exists,
            Statement::Update(update) => update.conditions.is_some(),
            Statement::Delete(delete) => delete.conditions.is_some(),
            Statement::Batch(batch) => batch.statements.iter().any(Statement::is_conditional),
            _ => false,
        }
    }
}
