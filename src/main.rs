//! Entry point: parses the command line and dispatches to a role.

use rbgctl::cli::{self, Command, Invocation};
use rbgctl::config::mooncake::{self, MooncakeEnv};

fn main() {
    rbgctl::telemetry::init_tracing();
    let invocation = match cli::parse(std::env::args().collect()) {
        Ok(i) => i,
        Err(e) => e.exit(),
    };
    if let Err(e) = dispatch(invocation) {
        eprintln!("rbgctl: {e:#}");
        std::process::exit(2);
    }
}

fn dispatch(invocation: Invocation) -> anyhow::Result<()> {
    match invocation {
        Invocation::MooncakeMaster(args) => {
            let cfg = mooncake::parse_master_flags(&args)?.resolve()?;
            rbgctl::master::run(cfg)?;
        }
        Invocation::Cli(cli) => match cli.command {
            Command::Master(args) => rbgctl::master::run(args.resolve()?)?,
            Command::Store(args) => {
                rbgctl::store::run(args.resolve(&MooncakeEnv::from_process()?)?)?
            }
            Command::Router(args) => rbgctl::router::run(args.resolve()?)?,
            Command::Operator(args) => rbgctl::operator::run(args)?,
            Command::Up(args) => rbgctl::up::run(args)?,
            Command::SimEngine(args) => rbgctl::engine::run(args)?,
            Command::Kv(args) => rbgctl::kv::run(args)?,
            Command::Bench(args) => rbgctl::bench::run(args)?,
            Command::MooncakeMaster { .. } => {
                unreachable!("cli::parse maps it to Invocation::MooncakeMaster")
            }
        },
    }
    Ok(())
}
