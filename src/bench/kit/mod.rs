//! What the benchmarks share, apart from the commands (`super`): the cluster they start, the
//! load they drive, the machine's limits and the peers they are measured beside (Mooncake,
//! Redis, perftest), the statistics and progress they print, and the processes they watch.

pub mod cluster;
pub mod flood;
pub mod idle_clients;
pub mod limits;
pub mod llm;
pub mod load;
pub mod mooncake_peer;
pub mod paper_store;
pub mod procfs;
pub mod progress;
pub mod rdma;
pub mod redis_peer;
pub mod report;
pub mod stats;
