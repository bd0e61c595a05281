//! The roles of the binary, in one table. An invocation selects a role by its subcommand
//! (`rbgctl master …`) or, busybox style, by the program name it was started under: a link
//! named `mooncake_master` runs the master with Mooncake's flag spellings.

use crate::config::mooncake::{self, MooncakeEnv};
use clap::{ArgMatches, Args, Command, FromArgMatches};

/// What a role returns to `main`.
pub type RoleResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// One entry of the table.
pub struct Role {
    /// The subcommand.
    pub name: &'static str,
    /// Program names (argv[0] links to the binary) that run this role directly.
    pub links: &'static [&'static str],
    pub about: &'static str,
    /// Adds the role's flags to its command.
    args: fn(Command) -> Command,
    /// Runs the role with its parsed flags.
    run: fn(&ArgMatches) -> RoleResult,
}

impl Role {
    fn command(&self) -> Command {
        (self.args)(Command::new(self.name)).about(self.about)
    }
}

fn parsed<A: FromArgMatches>(m: &ArgMatches) -> Result<A, clap::Error> {
    A::from_arg_matches(m)
}

/// Every role, in the order `rbgctl --help` lists them.
pub static ROLES: &[Role] = &[
    Role {
        name: "master",
        links: &[],
        about: "KV-cache pool manager (Mooncake master): segments, objects, replicas, leases, eviction",
        args: crate::master::config::MasterArgs::augment_args,
        run: |m| {
            let args: crate::master::config::MasterArgs = parsed(m)?;
            Ok(crate::master::run(args.resolve()?)?)
        },
    },
    Role {
        name: "store",
        links: &[],
        about: "Storage node contributing a segment of memory to the pool (Mooncake store)",
        args: crate::store::config::StoreArgs::augment_args,
        run: |m| {
            let args: crate::store::config::StoreArgs = parsed(m)?;
            Ok(crate::store::run(
                args.resolve(&MooncakeEnv::from_process()?)?,
            )?)
        },
    },
    Role {
        name: "router",
        links: &[],
        about: "OpenAI/SGLang-compatible gateway (sglang-router's flags): cache-aware routing, \
                prefill/decode disaggregation, health checks, retries, circuit breakers",
        args: crate::router::config::RouterArgs::augment_args,
        run: |m| {
            let args: crate::router::config::RouterArgs = parsed(m)?;
            Ok(crate::router::run(args.resolve()?)?)
        },
    },
    Role {
        name: "operator",
        links: &[],
        about: "Kubernetes controller for RoleBasedGroup objects (ordered startup, in-place \
                upgrade, coordination, discovery), talking plain REST to the API server",
        args: crate::operator::OperatorArgs::augment_args,
        run: |m| Ok(crate::operator::run(parsed(m)?)?),
    },
    Role {
        name: "up",
        links: &[],
        about: "The whole service on loopback in one command: master, stores, SIMULATED engines, router",
        args: crate::up::UpArgs::augment_args,
        run: |m| Ok(crate::up::run(parsed(m)?)?),
    },
    Role {
        name: "sim-engine",
        links: &[],
        about: "A SIMULATED SGLang-compatible engine (no model, no GPU: timing from a cost model) \
                with a paged prefix cache over device, host and the rbgctl pool (L1/L2/L3)",
        args: crate::engine::SimEngineArgs::augment_args,
        run: |m| {
            let args: crate::engine::SimEngineArgs = parsed(m)?;
            Ok(crate::engine::run(args.resolve()?)?)
        },
    },
    Role {
        name: "kv",
        links: &[],
        about: "Put, get and inspect objects from the command line",
        args: crate::kv::KvArgs::augment_args,
        run: |m| Ok(crate::kv::run(parsed(m)?)?),
    },
    Role {
        name: "bench",
        links: &[],
        about: "Load tools",
        args: crate::bench::BenchArgs::augment_args,
        run: |m| Ok(crate::bench::run(parsed(m)?)?),
    },
    Role {
        name: "mooncake_master",
        links: &["mooncake_master"],
        about: "The master with mooncake_master's flag spellings (--rpc_port=50051, ...)",
        args: |c| {
            c.disable_help_flag(true).arg(
                clap::Arg::new("args")
                    .help(
                        "mooncake_master's own flags, as it spells them (--rpc_port=50051, \
                         --enable_http_metadata_server=true, --config_path=FILE, ...)",
                    )
                    .num_args(0..)
                    .allow_hyphen_values(true)
                    .trailing_var_arg(true),
            )
        },
        run: |m| {
            let args: Vec<String> = m
                .get_many::<String>("args")
                .map(|v| v.cloned().collect())
                .unwrap_or_default();
            let cfg = mooncake::parse_master_flags(&args)?.resolve()?;
            Ok(crate::master::run(cfg)?)
        },
    },
];

/// The top-level command: every role as a subcommand.
pub fn command() -> Command {
    Command::new("rbgctl")
        .version(env!("CARGO_PKG_VERSION"))
        .about("Every role of an LLM inference service with a distributed KV cache")
        .subcommand_required(true)
        .arg_required_else_help(true)
        .subcommands(ROLES.iter().map(Role::command))
}

/// A role chosen, with its parsed flags.
pub struct Invocation {
    pub role: &'static Role,
    matches: ArgMatches,
}

impl std::fmt::Debug for Invocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Invocation")
            .field("role", &self.role.name)
            .finish()
    }
}

impl Invocation {
    pub fn run(&self) -> RoleResult {
        (self.role.run)(&self.matches)
    }
}

/// Chooses the role: from the program name (busybox style), else from the subcommand.
pub fn parse<T: Into<std::ffi::OsString>>(
    argv: impl IntoIterator<Item = T>,
) -> Result<Invocation, clap::Error> {
    // Arguments that are not UTF-8 reach clap as they are, which refuses them with a message
    // naming the argument instead of panicking.
    let argv: Vec<std::ffi::OsString> = argv.into_iter().map(Into::into).collect();
    let program = argv
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .and_then(|f| f.to_str())
        .unwrap_or("");
    if let Some(role) = ROLES.iter().find(|r| r.links.contains(&program)) {
        let matches = role.command().try_get_matches_from(argv)?;
        return Ok(Invocation { role, matches });
    }
    let top = command().try_get_matches_from(argv)?;
    let Some((name, sub)) = top.subcommand() else {
        return Err(command().error(
            clap::error::ErrorKind::MissingSubcommand,
            "a role is required",
        ));
    };
    let role = ROLES.iter().find(|r| r.name == name).ok_or_else(|| {
        command().error(
            clap::error::ErrorKind::InvalidSubcommand,
            format!("no role {name}"),
        )
    })?;
    Ok(Invocation {
        role,
        matches: sub.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    fn mooncake_args(i: &Invocation) -> Vec<String> {
        i.matches
            .get_many::<String>("args")
            .map(|v| v.cloned().collect())
            .unwrap_or_default()
    }

    #[test]
    fn program_name_selects_the_role() {
        let i = parse(argv("/usr/local/bin/mooncake_master --rpc_port=1")).unwrap();
        assert_eq!(i.role.name, "mooncake_master");
        assert_eq!(mooncake_args(&i), vec!["--rpc_port=1"]);
        let i = parse(argv("rbgctl mooncake_master --rpc_port 2")).unwrap();
        assert_eq!(i.role.name, "mooncake_master");
        assert_eq!(mooncake_args(&i), vec!["--rpc_port", "2"]);
        assert_eq!(
            parse(argv("rbgctl master --rpc-port 5")).unwrap().role.name,
            "master"
        );
        assert!(parse(argv("rbgctl frobnicate")).is_err());
    }

    #[test]
    fn the_table_is_a_valid_command_line() {
        command().debug_assert();
        let names: std::collections::HashSet<_> = ROLES.iter().map(|r| r.name).collect();
        assert_eq!(names.len(), ROLES.len(), "role names are unique");
        for r in ROLES {
            for link in r.links {
                assert_eq!(
                    ROLES.iter().filter(|o| o.links.contains(link)).count(),
                    1,
                    "link {link} names one role"
                );
            }
        }
    }
}

#[cfg(test)]
mod help_audit {
    use super::*;

    /// Options of a command (and its subcommands) without a description.
    fn undescribed(cmd: &Command, path: &str, out: &mut Vec<String>) {
        for a in cmd.get_arguments() {
            let id = a.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            if a.get_help().is_none() && a.get_long_help().is_none() {
                out.push(format!("{path} --{}", a.get_long().unwrap_or(id)));
            }
        }
        for sub in cmd.get_subcommands() {
            undescribed(sub, &format!("{path} {}", sub.get_name()), out);
        }
    }

    /// Value options of a server role whose help states no default (and clap shows none).
    fn without_default(cmd: &Command, out: &mut Vec<String>) {
        for a in cmd.get_arguments() {
            let help = a
                .get_long_help()
                .or(a.get_help())
                .map(|h| h.to_string())
                .unwrap_or_default()
                .to_lowercase();
            let takes_value = a.get_action().takes_values();
            let stated = help.contains("default") || !a.get_default_values().is_empty();
            if takes_value && !stated {
                out.push(format!(
                    "{} --{}",
                    cmd.get_name(),
                    a.get_long().unwrap_or("?")
                ));
            }
        }
    }

    #[test]
    fn every_option_says_what_it_does() {
        let mut out = Vec::new();
        for r in ROLES {
            undescribed(&r.command(), r.name, &mut out);
        }
        assert!(
            out.is_empty(),
            "options without a description:\n{}",
            out.join("\n")
        );
    }

    #[test]
    fn every_server_option_states_its_default() {
        let mut out = Vec::new();
        for r in ROLES
            .iter()
            .filter(|r| ["master", "store", "router"].contains(&r.name))
        {
            without_default(&r.command(), &mut out);
        }
        assert!(
            out.is_empty(),
            "options without a stated default:\n{}",
            out.join("\n")
        );
    }
}
