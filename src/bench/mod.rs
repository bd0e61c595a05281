//! `rbgctl bench`: load tools that print a table a person can read, or JSON with `--json`.

pub mod limits;
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
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.kind {
        BenchKind::Store(a) => store::run(a),
    }
}
