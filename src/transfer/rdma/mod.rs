//! RDMA for the data path: libibverbs loaded at run time (`verbs`), the NICs a process uses
//! (`nic`), and the store's side of the connection (`serve`): its segment registered once per
//! NIC, and a queue pair per client connection that asks. The client's side is
//! `client::datapath::rdma`.
//!
//! Tested on soft-RoCE (the kernel's `rdma_rxe`, in QEMU: `scripts/rdma-vm.sh`, `tests/it/rdma.rs`)
//! only; see docs/kv-pool.md for what a user with ConnectX or EFA should check first.

pub mod nic;
pub mod serve;
pub mod verbs;
