//! Test infrastructure, compiled only into tests and into builds with the `testkit` feature
//! (which `cargo test` turns on for the integration tests and the benches that need it); the
//! release binary carries none of it.
//!
//! - `proxy`: a TCP link that delays what it forwards.

pub mod proxy;
