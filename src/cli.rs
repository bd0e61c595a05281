//! Command-line definitions and the role each invocation selects. A link to the binary named
//! after a Mooncake program (`mooncake_master`) runs that role with Mooncake's flag spellings.

use crate::master::config::MasterArgs;
use crate::store::config::StoreArgs;
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "rbgctl",
    version,
    about = "Every role of an LLM inference service with a distributed KV cache"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// KV-cache pool manager (Mooncake master): segments, objects, replicas, leases, eviction.
    Master(MasterArgs),
    /// Storage node contributing a segment of memory to the pool (Mooncake store).
    Store(StoreArgs),
    /// OpenAI/SGLang-compatible gateway (sglang-router's flags): cache-aware routing,
    /// prefill/decode disaggregation, health checks, retries, circuit breakers.
    Router(Box<crate::router::config::RouterArgs>),
    /// Kubernetes controller for RoleBasedGroup objects (ordered startup, in-place upgrade,
    /// coordination, discovery), talking plain REST to the API server.
    Operator(crate::operator::OperatorArgs),
    /// The whole service on loopback in one command: master, stores, SIMULATED engines, router.
    Up(crate::up::UpArgs),
    /// A SIMULATED SGLang-compatible engine (no model, no GPU: timing from a cost model) with a
    /// paged prefix cache over device, host and the rbgctl pool (L1/L2/L3).
    SimEngine(crate::engine::SimEngineArgs),
    /// Put, get and inspect objects from the command line.
    Kv(crate::kv::KvArgs),
    /// Load tools.
    Bench(crate::bench::BenchArgs),
    /// The master with `mooncake_master`'s flag spellings (`--rpc_port=50051`, ...).
    #[command(name = "mooncake_master", disable_help_flag = true)]
    MooncakeMaster {
        #[arg(allow_hyphen_values = true, trailing_var_arg = true)]
        args: Vec<String>,
    },
}

/// The role selected by how the binary was invoked.
#[derive(Debug)]
pub enum Invocation {
    Cli(Box<Cli>),
    /// Invoked as `mooncake_master`: the raw arguments after the program name.
    MooncakeMaster(Vec<String>),
}

/// Chooses the role: from the program name (busybox style), else from the subcommand.
pub fn parse(argv: Vec<String>) -> Result<Invocation, clap::Error> {
    let program = argv
        .first()
        .map(|a| {
            std::path::Path::new(a)
                .file_name()
                .and_then(|f| f.to_str())
                .unwrap_or("")
                .to_string()
        })
        .unwrap_or_default();
    if program == "mooncake_master" {
        return Ok(Invocation::MooncakeMaster(argv[1..].to_vec()));
    }
    let cli = Cli::try_parse_from(argv)?;
    Ok(match cli.command {
        Command::MooncakeMaster { args } => Invocation::MooncakeMaster(args),
        command => Invocation::Cli(Box::new(Cli { command })),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn program_name_selects_the_role() {
        match parse(argv("/usr/local/bin/mooncake_master --rpc_port=1")).unwrap() {
            Invocation::MooncakeMaster(a) => assert_eq!(a, vec!["--rpc_port=1"]),
            other => panic!("{other:?}"),
        }
        match parse(argv("rbgctl mooncake_master --rpc_port 2")).unwrap() {
            Invocation::MooncakeMaster(a) => assert_eq!(a, vec!["--rpc_port", "2"]),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            parse(argv("rbgctl master --rpc-port 5")).unwrap(),
            Invocation::Cli(_)
        ));
        assert!(parse(argv("rbgctl frobnicate")).is_err());
    }
}
