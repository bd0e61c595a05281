//! Mooncake's own wire, so that Mooncake's unchanged clients (the PyPI wheel, SGLang's
//! `mooncake` HiCache backend, vLLM's Mooncake connector) use rbgctl's pool: the master RPC
//! (coro_rpc framing, struct_pack bodies) and its types, as Mooncake's and yalantinglibs'
//! sources define them and captures of the 0.3.13.post1 wheel show them
//! (`tests/vectors/mooncake/`).

pub mod coro_rpc;
pub mod endpoints;
pub mod handshake;
pub mod master;
pub mod metadata;
pub mod objects;
pub mod rdma;
#[cfg(feature = "rdma")]
pub mod rdma_target;
pub mod rpcs;
mod segments;
pub mod struct_pack;
pub mod te_tcp;
pub mod types;
