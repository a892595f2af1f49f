//! End-to-end statement tests against the in-memory engine.
