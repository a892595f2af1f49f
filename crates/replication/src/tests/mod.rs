//! Deterministic tests of the distributed logic: a simulated cluster ([`sim`]) driven by
//! plain-text golden scripts ([`golden`], scripts in `src/testscripts/`).

mod golden;
mod paxos;
mod reverse;
mod scan;
mod sim;
