//! The integration tests, in one binary so that the crate is linked once for all of them:
//! each module is what was a test file of its own (`cargo test --test it router::` runs one,
//! `cargo test --test it router::precise_prefix` one test). Real processes of the built
//! binary on loopback, started through `common`.
//!
//! One test stays a binary of its own: `tests/kv_index_memory.rs` counts every byte its process
//! allocates (its own global allocator), which other tests running beside it would disturb.

mod common;

mod architecture;
mod auth;
mod benches;
mod cli;
mod containers;
mod disk_tier;
mod faults;
mod ha;
mod https;
mod kv_events;
mod kv_pool;
mod lifecycle;
mod local_users;
mod master_scale;
mod mooncake_clients;
mod mooncake_wire;
mod operator;
mod packaging;
mod persistence;
mod pictures;
mod protocol_vectors;
mod python;
mod rdma;
mod robustness;
mod router;
mod service;
mod store_liveness;
