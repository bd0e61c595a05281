//! sglang-router 0.3.2 flags that need engines or services rbgctl does not have (gRPC workers
//! with server-side parsing, MCP, tokenizer downloads, conversation history stores, JWT
//! identity providers, OpenTelemetry): accepted by the parser, so that a copied launch line gets
//! a clear answer instead of "unexpected argument", and refused at start with one line each
//! naming the flag and why. They are hidden from `--help`.

use clap::{Arg, ArgAction, ArgMatches, Command};

/// A flag refused at start.
pub struct Refused {
    /// The long flag, without `--`.
    pub flag: &'static str,
    /// Takes no value (a switch).
    pub switch: bool,
    /// Values that are accepted after all (a flag whose default is harmless here).
    pub accepted: &'static [&'static str],
    pub why: &'static str,
}

const TOKENIZER: &str =
    "rbgctl reads only a local tokenizer.json (--tokenizer-path); it never downloads tokenizers \
     and applies no chat templates or tokenizer caches";
const GRPC: &str =
    "parsing reasoning and tool calls is the engine's job over HTTP (sglang-router does it only \
     for gRPC workers, which rbgctl does not serve)";
const HISTORY: &str =
    "rbgctl keeps no conversation history (the worker keeps what it keeps); only `memory` and \
     `none` are accepted";
const JWT: &str = "JWT/OIDC authentication is not built; use --api-key";
const OTEL: &str = "OpenTelemetry export is not built; use the Prometheus /metrics and the logs";

macro_rules! refused {
    ($flag:literal, $why:expr) => {
        Refused {
            flag: $flag,
            switch: false,
            accepted: &[],
            why: $why,
        }
    };
    (switch $flag:literal, $why:expr) => {
        Refused {
            flag: $flag,
            switch: true,
            accepted: &[],
            why: $why,
        }
    };
}

/// sglang-router's flags rbgctl refuses, each with why and what to use instead.
pub const REFUSED: &[Refused] = &[
    refused!("chat-template", TOKENIZER),
    refused!(switch "tokenizer-cache-enable-l0", TOKENIZER),
    refused!(switch "tokenizer-cache-enable-l1", TOKENIZER),
    refused!("tokenizer-cache-l0-max-entries", TOKENIZER),
    refused!("tokenizer-cache-l1-max-memory", TOKENIZER),
    refused!("reasoning-parser", GRPC),
    refused!("tool-call-parser", GRPC),
    refused!(
        "mcp-config-path",
        "MCP (Model Context Protocol) tool servers are not served by rbgctl"
    ),
    Refused {
        flag: "history-backend",
        switch: false,
        accepted: &["memory", "none"],
        why: HISTORY,
    },
    refused!("oracle-connect-descriptor", HISTORY),
    refused!("oracle-password", HISTORY),
    refused!("oracle-pool-max", HISTORY),
    refused!("oracle-pool-min", HISTORY),
    refused!("oracle-pool-timeout-secs", HISTORY),
    refused!("oracle-tns-alias", HISTORY),
    refused!("oracle-username", HISTORY),
    refused!("oracle-wallet-path", HISTORY),
    refused!("postgres-db-url", HISTORY),
    refused!("postgres-pool-max", HISTORY),
    refused!("redis-url", HISTORY),
    refused!("redis-pool-max", HISTORY),
    refused!("redis-retention-days", HISTORY),
    refused!("jwt-issuer", JWT),
    refused!("jwt-audience", JWT),
    refused!("jwt-jwks-uri", JWT),
    refused!("jwt-role-mapping", JWT),
    refused!(switch "control-plane-audit-enabled", "audit logging of control-plane calls is not built"),
    refused!(switch "enable-trace", OTEL),
    refused!("otlp-traces-endpoint", OTEL),
    refused!(
        switch "mini-lb",
        "sglang's Python mini load balancer is a debugging stand-in for the router; rbgctl is \
         the router (use --pd-disaggregation)"
    ),
];

/// The command with every refused flag accepted (hidden).
pub fn accept_refused(cmd: Command) -> Command {
    cmd.args(REFUSED.iter().map(|r| {
        let a = Arg::new(r.flag).long(r.flag).hide(true).help(format!(
            "sglang-router's flag, refused by rbgctl: {}. Default: none.",
            r.why
        ));
        if r.switch {
            a.action(ArgAction::SetTrue)
        } else {
            a.num_args(1..).action(ArgAction::Append)
        }
    }))
}

/// The first refused flag given, as the line that says so.
pub fn check(m: &ArgMatches) -> Result<(), String> {
    for r in REFUSED {
        let given = if r.switch {
            m.get_flag(r.flag)
        } else {
            m.get_many::<String>(r.flag)
                .is_some_and(|mut vs| vs.any(|v| !r.accepted.contains(&v.as_str())))
        };
        if given {
            return Err(format!("--{}: {}", r.flag, r.why));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(args: &[&str]) -> ArgMatches {
        accept_refused(Command::new("router"))
            .try_get_matches_from(std::iter::once("router").chain(args.iter().copied()))
            .unwrap()
    }

    #[test]
    fn each_refused_flag_is_named_with_its_reason() {
        for r in REFUSED {
            let flag = format!("--{}", r.flag);
            let args: Vec<&str> = if r.switch {
                vec![&flag]
            } else {
                vec![&flag, "x"]
            };
            let e = check(&matches(&args)).unwrap_err();
            assert!(e.starts_with(&flag) && e.len() > flag.len() + 20, "{e}");
        }
        assert!(check(&matches(&[])).is_ok());
        assert!(
            check(&matches(&["--history-backend", "memory"])).is_ok(),
            "the default"
        );
        assert!(check(&matches(&["--history-backend", "redis"])).is_err());
    }
}
