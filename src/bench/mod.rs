//! `rbgctl bench`: load tools that print a table a person can read, or JSON with `--json`.

pub mod abuse;
pub mod disk_tier;
pub mod failover;
pub mod hicache;
pub mod kit;
pub mod master;
pub mod mooncake_wire;
pub mod multiturn;
#[cfg(feature = "testkit")]
pub mod operator;
pub mod policies;
#[cfg(feature = "rdma")]
pub mod recovery;
#[cfg(feature = "testkit")]
pub mod router;
pub mod serving;
pub mod store;
pub mod tenants;
pub mod tiers;

use clap::{Args, Subcommand};

/// `rbgctl bench`'s arguments: which benchmark, and its own.
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub kind: BenchKind,
}

/// The benchmarks `rbgctl bench` runs.
#[derive(Debug, Subcommand)]
pub enum BenchKind {
    /// Put/get throughput and latency of the KV pool, beside the machine's own limits.
    Store(store::StoreBenchArgs),
    /// SGLang's L3 page traffic: batches of 128 KV pages of 256 KiB put and read back, from the
    /// Rust client and from the Python HiCache backend, over TCP and same-host shared memory.
    Hicache(hicache::HicacheBenchArgs),
    /// The master at scale, by metadata operations over its RPC protocol (a PAPER store mounts
    /// a segment that exists only on paper): load rate, exists, describe, put and remove
    /// throughput and latency, memory per object, CPU at rest, rebuild after SIGKILL.
    Master(master::MasterBenchArgs),
    /// Lossless restarts: fill a persistent store, kill -9 it and then the master, and time
    /// until every object is readable again (verified byte for byte).
    Recovery(recovery::RecoveryBenchArgs),
    /// Bad input against a master and store started here: idle connection floods, slowloris
    /// HTTP, frames and bodies announcing huge lengths. Memory and open files of both roles
    /// before, at the peak and after; how soon they close the connections; a normal client's
    /// put, get and /health meanwhile.
    Abuse(abuse::AbuseBenchArgs),
    /// Master high availability: masters electing through etcd members started here, stores
    /// and a client putting and getting; kill -9 of the leader, then SIGSTOP of the next one.
    /// Time to the first put and until every earlier object is back, writes a paused leader
    /// accepted after its lease (must be 0), objects lost (must be 0).
    Failover(failover::FailoverBenchArgs),
    /// Multi-turn conversations (SGLang's bench_multiturn.py): TTFT, throughput, cache hit rate.
    Multiturn(multiturn::MultiturnArgs),
    /// Random-dataset throughput and latency, like `sglang.bench_serving --dataset-name random`.
    Serving(serving::ServingArgs),
    /// Seed 000's comparison: the same multi-turn workload with L1 only, L1+L2 and L1+L2+L3
    /// (SIMULATED engines on loopback): hit rate, TTFT and throughput side by side.
    Tiers(tiers::TiersArgs),
    /// The router's policies side by side: the same multi-turn workload against a fresh
    /// service per policy (SIMULATED engines with small device caches, the pool as L3): mean
    /// and p90 TTFT, hit rate against an oracle's, and where the hits came from.
    Policies(policies::PoliciesArgs),
    /// Two tenants on one service (SIMULATED engines): A interactive at its usual rate, B a
    /// batch flood at a multiple of the engines' capacity; A alone, with admission (tenants,
    /// classes, the engines' priority) and without: A's TTFT, B's answers (200, 429, 503).
    Tenants(tenants::TenantsBenchArgs),
    /// The router's overhead against direct-to-worker, with FAKE workers (no model). Test kit
    /// builds only (`--features testkit`).
    #[cfg(feature = "testkit")]
    Router(router::RouterBenchArgs),
    /// The operator against the API server stand-in and a SIMULATED kubelet: time and API
    /// requests to bring up a large group, writes during a steady-state resync. Test kit
    /// builds only (`--features testkit`).
    #[cfg(feature = "testkit")]
    Operator(operator::OperatorBenchArgs),
    /// A FAKE SGLang-compatible worker (no model: canned tokens at once) for router tests
    /// and benchmarks. Test kit builds only (`--features testkit`).
    #[cfg(feature = "testkit")]
    FakeWorker(crate::testkit::fake_worker::FakeWorkerArgs),
    /// A put/get/remove load on a small key space that records every operation (times, key,
    /// value digest, outcome) for the history checker of the fault tests. Test kit builds
    /// only (`--features testkit`).
    #[cfg(feature = "testkit")]
    HistoryLoad(crate::testkit::load::HistoryLoadArgs),
}

/// Runs the benchmark `args` names.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.kind {
        BenchKind::Store(a) => store::run(a),
        BenchKind::Hicache(a) => hicache::run(a),
        BenchKind::Recovery(a) => recovery::run(a),
        BenchKind::Abuse(a) => abuse::run(a),
        BenchKind::Failover(a) => failover::run(a),
        BenchKind::Master(a) => master::run(a),
        #[cfg(feature = "testkit")]
        BenchKind::Router(a) => router::run(a),
        BenchKind::Multiturn(a) => multiturn::run(a),
        BenchKind::Tiers(a) => tiers::run(a),
        BenchKind::Policies(a) => policies::run(a),
        BenchKind::Tenants(a) => tenants::run(a),
        BenchKind::Serving(a) => serving::run(a),
        #[cfg(feature = "testkit")]
        BenchKind::FakeWorker(a) => Ok(crate::testkit::fake_worker::run(a)?),
        #[cfg(feature = "testkit")]
        BenchKind::Operator(a) => operator::run(a),
        #[cfg(feature = "testkit")]
        BenchKind::HistoryLoad(a) => Ok(crate::testkit::load::run(a)?),
    }
}
