//! `rbgctl sim-engine`: a SIMULATED SGLang-compatible inference engine. There is no model and
//! no GPU: it answers SGLang's and OpenAI's endpoints with made-up tokens, and its timing comes
//! from a cost model (prefill time in proportion to uncached tokens, a time per decode step).
//! Its KV cache is modelled page by page, as SGLang's HiCache keeps it: a bounded device tier
//! (L1), an optional host tier (L2), and an optional third tier (L3) that is the rbgctl KV pool,
//! reached through the client library and moving real bytes. It reports `cached_tokens` as
//! SGLang does, so that `rbgctl bench multiturn` measures cache hit rates against it. It can
//! play the prefill or the decode side of a disaggregated deployment behind `rbgctl router`.

pub mod cache;
pub mod config;
pub mod cost;
pub mod device;
pub mod l3;
pub mod server;

use crate::config::ConfigError;
use crate::role::{self, BindError};
use crate::shutdown::Shutdown;
use clap::ValueEnum;
pub use config::{EngineConfig, SimEngineArgs};
use serde::{Deserialize, Serialize};
use std::net::{SocketAddr, TcpListener};

/// The part it plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Prefill and decode.
    Regular,
    /// Prefill only; decode engines fetch the KV cache through its bootstrap port.
    Prefill,
    /// Decode only; waits for the prefill named by the request's bootstrap fields.
    Decode,
}

impl Mode {
    /// The mode as flags and metrics name it.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Regular => "regular",
            Mode::Prefill => "prefill",
            Mode::Decode => "decode",
        }
    }
}

/// Errors that stop the SIMULATED engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    L3(#[from] l3::L3Error),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    KvEvents(#[from] crate::kv_events::publish::PublishError),
}

/// The engine's sockets, bound before it starts (port 0 lets the kernel choose).
pub struct Listeners {
    /// SGLang's and OpenAI's API.
    pub http: TcpListener,
    /// The KV bootstrap (prefill mode with a bootstrap port only).
    pub bootstrap: Option<TcpListener>,
}

impl Listeners {
    /// Binds the engine's sockets its config names (port 0: the kernel chooses).
    pub fn bind(cfg: &EngineConfig) -> Result<Listeners, EngineError> {
        Ok(Listeners {
            http: role::bind("engine", &cfg.host, cfg.port)?,
            bootstrap: match (cfg.mode, cfg.disaggregation_bootstrap_port) {
                (Mode::Prefill, Some(p)) => Some(role::bind("engine bootstrap", &cfg.host, p)?),
                _ => None,
            },
        })
    }
}

/// Where a started engine listens.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Addrs {
    pub http: SocketAddr,
    pub bootstrap: Option<SocketAddr>,
    /// With `kv_events_config`: the KV events' PUB endpoint as bound, and the replay's.
    #[serde(default)]
    pub kv_events: Option<String>,
    #[serde(default)]
    pub kv_events_replay: Option<String>,
}

/// A running SIMULATED engine: its addresses, and how to stop it and wait for it.
pub type Handle = role::Handle<Addrs, EngineError>;

/// Starts the SIMULATED engine on bound listeners (after connecting to its L3 pool, if any);
/// it runs until `shutdown` fires.
pub fn start(
    cfg: EngineConfig,
    listeners: Listeners,
    shutdown: Shutdown,
) -> Result<Handle, EngineError> {
    cfg.validate()?;
    let events = match &cfg.kv_events_config {
        Some(json) => {
            let c = crate::kv_events::KvEventsConfig::parse(json)
                .map_err(|e| ConfigError::invalid("engine.kv_events_config", e))?;
            match c.enabled() {
                true => Some((crate::kv_events::Publisher::start(&c)?, c)),
                false => None,
            }
        }
        None => None,
    };
    let addrs = Addrs {
        http: listeners.http.local_addr()?,
        bootstrap: role::local_addr(listeners.bootstrap.as_ref())?,
        kv_events: events.as_ref().map(|(p, _)| p.endpoint.clone()),
        kv_events_replay: events.as_ref().and_then(|(p, _)| p.replay_endpoint.clone()),
    };
    let l3 = match &cfg.l3_master {
        Some(master) => Some(l3::L3::connect(
            master,
            cfg.auth_token_file.as_deref(),
            cfg.page_size * cfg.bytes_per_token,
            std::time::Duration::from_secs(30),
        )?),
        None => None,
    };
    let runtime = role::runtime("sim-engine", None)?;
    let (http, bootstrap) = {
        let _guard = runtime.enter();
        (
            role::async_listener(listeners.http)?,
            listeners.bootstrap.map(role::async_listener).transpose()?,
        )
    };
    let app = server::app(cfg, l3, events, &addrs);
    if let Some(b) = bootstrap {
        runtime.spawn(crate::http_server::serve(b, app.clone(), shutdown.clone()));
    }
    role::announce("sim-engine", &addrs);
    let stop = shutdown.clone();
    Ok(Handle::spawn("sim-engine", addrs, shutdown, move || {
        runtime.block_on(crate::http_server::serve(http, app, stop));
        runtime.shutdown_timeout(std::time::Duration::from_secs(1));
        Ok(())
    })?)
}

/// Runs the SIMULATED engine on the addresses of its config until SIGINT or SIGTERM.
pub fn run(cfg: EngineConfig) -> Result<(), EngineError> {
    cfg.validate()?;
    let listeners = Listeners::bind(&cfg)?;
    start(cfg, listeners, Shutdown::on_signals()?)?.wait()
}
