//! `rbgctl bench`: load tools that print a table a person can read, or JSON with `--json`.

pub mod cluster;
pub mod limits;
pub mod recovery;
pub mod stats;
pub mod store;

use clap::{Args, Subcommand};

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub kind: BenchKind,
}

#[derive(Debug, Subcommand)]
pub enum BenchKind {
    /// Put/get throughput and latency of the KV pool, beside the machine's own limits.
    Store(store::StoreBenchArgs),
    /// Lossless restarts: fill a persistent store, kill -9 it and then the master, and time
    /// until every object is readable again (verified byte for byte).
    Recovery(recovery::RecoveryBenchArgs),
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.kind {
        BenchKind::Store(a) => store::run(a),
        BenchKind::Recovery(a) => recovery::run(a),
    }
}
