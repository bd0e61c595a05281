//! The roles of the binary, in one table. An invocation selects a role by its subcommand
//! (`rbgctl master …`) or, busybox style, by the program name it was started under: a link
//! named `mooncake_master` runs the master with Mooncake's flag spellings.

use crate::config::mooncake::MooncakeEnv;
use crate::master::compat as mooncake;
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
        crate::telemetry::LogArgs::augment_args((self.args)(Command::new(self.name)))
            .about(self.about)
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
        links: &["smg", "sglang-router"],
        about: "OpenAI/SGLang-compatible gateway (sglang-router's flags): cache-aware routing, \
                prefill/decode disaggregation, health checks, retries, circuit breakers",
        args: |c| crate::router::compat::accept_refused(
            crate::router::config::RouterArgs::augment_args(c),
        ),
        run: |m| {
            crate::router::compat::check(m)?;
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
        run: |m| {
            let args: crate::operator::OperatorArgs = parsed(m)?;
            Ok(crate::operator::run(args.resolve()?)?)
        },
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
        name: "mooncake-wire",
        links: &[],
        about: "Checks a Mooncake client version against this master: the function ids and \
                request type hashes it expects beside those the wheel in --python sends",
        args: crate::bench::mooncake_wire::WireArgs::augment_args,
        run: |m| Ok(crate::bench::mooncake_wire::run(parsed(m)?)?),
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
            if mooncake::asks_for_help(&args) {
                print!("{}", mooncake::master_flags_help());
                return Ok(());
            }
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
    /// Arguments that held a flag and its value, split by [`split_joined_flags`].
    joined: Vec<JoinedFlag>,
}

/// One argument that held a flag and its value (`"--port 8000"`), and how it was split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinedFlag {
    pub argument: String,
    pub flag: String,
    pub value: String,
}

impl std::fmt::Debug for Invocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Invocation")
            .field("role", &self.role.name)
            .finish()
    }
}

impl Invocation {
    /// The logging flags, to set up logging before the role runs.
    pub fn log_args(&self) -> crate::telemetry::LogArgs {
        // The flags are on every role's command, so they always parse.
        crate::telemetry::LogArgs::from_arg_matches(&self.matches).unwrap_or_default()
    }

    /// Logs what parsing did that a reader of the log should know (arguments split).
    pub fn log_parsing(&self) {
        for j in &self.joined {
            tracing::info!(
                argument = %j.argument, flag = %j.flag, value = %j.value,
                "one argument held a flag and its value (as a Kubernetes command list item \
                 `- --flag value` passes them); split"
            );
        }
    }

    /// Runs the role with its parsed arguments.
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
        let mut argv = argv;
        // `smg launch …`: SMG's CLI runs the router under a `launch` subcommand.
        if role.name == "router" && argv.get(1).is_some_and(|a| a == "launch") {
            argv.remove(1);
        }
        let cmd = role.command();
        let (argv, joined) = split_joined_flags(argv, &cmd, 1);
        let matches = cmd.try_get_matches_from(argv)?;
        return Ok(Invocation {
            role,
            matches,
            joined,
        });
    }
    let (argv, joined) = match argv
        .get(1)
        .and_then(|a| a.to_str())
        .and_then(|name| ROLES.iter().find(|r| r.name == name))
    {
        Some(role) => split_joined_flags(argv, &role.command(), 2),
        None => (argv, Vec::new()),
    };
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
        joined,
    })
}

/// Kubernetes passes each item of a `command:` list as one argument, so a YAML line
/// `- --prefill http://host:8000` arrives as the single argument `"--prefill http://host:8000"`
/// (seed 003 writes its gateway this way). An argument from `first` on that starts with `--`,
/// holds a space, is not itself a flag of `cmd`, and whose part before the first space is one, is
/// split there into flag and value; the splits are returned to be logged.
pub fn split_joined_flags(
    argv: Vec<std::ffi::OsString>,
    cmd: &Command,
    first: usize,
) -> (Vec<std::ffi::OsString>, Vec<JoinedFlag>) {
    let known = |flag: &str| {
        cmd.get_arguments().any(|a| {
            a.get_long() == Some(flag) || a.get_all_aliases().is_some_and(|al| al.contains(&flag))
        })
    };
    let mut out = Vec::with_capacity(argv.len() + 4);
    let mut joined = Vec::new();
    for (i, item) in argv.into_iter().enumerate() {
        let split = item.to_str().filter(|_| i >= first).and_then(|s| {
            let long = s.strip_prefix("--")?;
            let (flag, value) = long.split_once(' ')?;
            (!known(long) && known(flag)).then(|| JoinedFlag {
                argument: s.to_string(),
                flag: format!("--{flag}"),
                value: value.trim().to_string(),
            })
        });
        match split {
            Some(j) => {
                out.push(j.flag.clone().into());
                if !j.value.is_empty() {
                    out.push(j.value.clone().into());
                }
                joined.push(j);
            }
            None => out.push(item),
        }
    }
    (out, joined)
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

    fn router_config(i: &Invocation) -> crate::router::config::RouterConfig {
        assert_eq!(i.role.name, "router");
        let a = crate::router::config::RouterArgs::from_arg_matches(&i.matches).unwrap();
        a.resolve().unwrap()
    }

    #[test]
    fn seed_003s_gateway_line_works_as_kubernetes_passes_it() {
        // Each YAML list item is one argument: flag and value joined by a space.
        let argv = [
            "smg",
            "--pd-disaggregation",
            "--prefill http://s-g-prefill-worker:8000",
            "--decode http://s-g-decode-worker:8000",
            "--host 0.0.0.0",
            "--port 8000",
        ];
        let c = router_config(&parse(argv).unwrap());
        assert!(c.pd.enabled);
        assert_eq!(c.pd.prefill[0].url, "http://s-g-prefill-worker:8000");
        assert_eq!(c.pd.decode, ["http://s-g-decode-worker:8000"]);
        assert_eq!((c.server.host.as_str(), c.server.port), ("0.0.0.0", 8000));
        // `smg launch`, `sglang-router` and `rbgctl router` read the same line.
        let c = router_config(&parse(["smg", "launch", "--port 9000"]).unwrap());
        assert_eq!(c.server.port, 9000);
        let c = router_config(&parse(["/usr/bin/sglang-router", "--port", "9001"]).unwrap());
        assert_eq!(c.server.port, 9001);
        let c = router_config(&parse(["rbgctl", "router", "--port 9002"]).unwrap());
        assert_eq!(c.server.port, 9002);
        // Not a flag before the space: left whole, and refused by name.
        let e = parse(["smg", "--frobnicate 3"]).err().unwrap();
        assert!(e.to_string().contains("--frobnicate 3"), "{e}");
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
    fn every_role_takes_the_logging_flags() {
        use crate::telemetry::LogFormat;
        for r in ROLES.iter().filter(|r| !r.name.starts_with("mooncake_")) {
            // Roles with subcommands take the flags after them too.
            let sub = match r.name {
                "kv" => &["segments"][..],
                "bench" => &["store"][..],
                "mooncake-wire" => &["--python", "python3"][..],
                _ => &[],
            };
            let mut argv = vec!["rbgctl", r.name];
            argv.extend(sub);
            argv.extend(["--log-format", "json", "--log-level", "debug"]);
            let i = parse(argv).unwrap_or_else(|e| panic!("{}: {e}", r.name));
            let log = i.log_args();
            assert_eq!(log.log_format, LogFormat::Json, "{}", r.name);
            assert_eq!(log.log_level.as_deref(), Some("debug"), "{}", r.name);
        }
        let e = parse(["rbgctl", "master", "--log-format", "xml"])
            .err()
            .unwrap();
        assert!(e.to_string().contains("--log-format"), "{e}");
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
