//! rbgctl: one binary for every role of an LLM inference service with an externalized,
//! distributed KV cache.
//!
//! - `transfer`: the wire protocol and TCP transport shared by master, store and client.
//! - `master`: the pool manager (segments, objects, replicas, leases, eviction, HTTP servers).
//! - `store`: a storage node contributing a segment of memory.
//! - `client`: the library inference engines use to put and get KV-cache objects.
//! - `router`: the gateway in front of inference workers.
//! - `engine`: a SIMULATED SGLang-compatible engine (cost-model timing, L1/L2/L3 page cache).
//! - `operator`: the RoleBasedGroup controller (plain REST to the Kubernetes API server); `kube`
//!   is its client, patch algebra, and an in-process API server stand-in for tests.
//! - `bench`: load tools, with `report` drawing their charts into HTML pages; `up`: every role on
//!   loopback in one command; `kv`: a command-line client.
//! - `config`, `telemetry`: shared configuration layering and observability.

pub mod auth;
pub mod backoff;
pub mod bench;
pub mod checksum;
pub mod cli;
pub mod client;
pub mod config;
pub mod engine;
pub mod ha;
pub mod hash;
pub mod http1;
pub mod http_server;
pub mod kube;
pub mod kv;
pub mod kv_events;
pub mod launch;
pub mod master;
pub mod mooncake;
pub mod operator;
pub mod report;
pub mod role;
pub mod router;
pub mod shutdown;
pub mod simulated_tokens;
pub mod store;
pub mod telemetry;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
pub mod tls;
pub mod token_bucket;
pub mod transfer;
pub mod up;
pub mod url;
