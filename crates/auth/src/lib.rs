//! Authentication and authorization, with Cassandra's semantics.
//!
//! - [`model`] — roles, the resources permissions are granted on (`<all keyspaces>`,
//!   `<keyspace ks>`, `<table ks.t>`, `<all roles>`, `<role r>`), and the permissions.
//! - [`store`] — the [`RoleStore`]: the replicated roles of this node (through the
//!   cluster's Raft metadata), the default superuser, and login checks.
//! - [`access`] — [`Access`]: what a logged-in role may do, computed once per change.
//! - [`password`] — bcrypt hashes and the SASL PLAIN token drivers send.
//!
//! The server runs the SASL exchange ([`AuthSettings::authentication`]); the coordinator
//! executes the role and permission statements and checks every statement against the
//! session's [`Access`] ([`AuthSettings::authorization`]).

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod access;
pub mod model;
pub mod password;
pub mod store;

pub use access::{unauthorized, Access};
pub use model::{Permission, Resource, Role, Roles};
pub use store::{RoleStore, DEFAULT_SUPERUSER};

/// The class name drivers are told in AUTHENTICATE (they pick their SASL mechanism by it).
pub const PASSWORD_AUTHENTICATOR: &str = "org.apache.cassandra.auth.PasswordAuthenticator";

/// Which of authentication and authorization a node enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AuthSettings {
    /// Clients must log in with a role's name and password (`PasswordAuthenticator`).
    pub authentication: bool,
    /// Every statement is checked against the logged-in role's permissions
    /// (`CassandraAuthorizer`); needs authentication.
    pub authorization: bool,
}
