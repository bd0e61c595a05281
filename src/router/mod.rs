//! `rbgctl router`: the OpenAI/SGLang-compatible gateway in front of SGLang or vLLM workers, a
//! drop-in for sglang-router 0.3.2 (same flags, endpoints and defaults).
//!
//! [`Router`] is the router: its state (settings, workers, routing, limits, access, metrics)
//! and, in `proxy`, its request path (choosing, dispatching, sending, relaying).
//!
//! - `config`: flags and TOML, validated.
//! - `request` (pure): routing text, request ids, bootstrap injection, retry backoff.
//! - `policy` + `tree` (pure): random, round_robin, power_of_two, cache_aware, consistent_hashing.
//! - `worker`: workers, their health and circuit-breaker state machines, the registry.
//! - `limiter`: concurrency limit with a bounded queue.
//! - `tenants`: callers by API key or trusted header, their limits, priority classes and fair
//!   sharing (instead of `limiter` when a tenants file is given).
//! - `upstream`: the client to workers (keep-alive HTTP/1.1 connections per runtime, read by
//!   the relaying task; hyper's client for `https://` workers).
//! - `proxy`: the request path (`impl Router`), the answer relayed frame by frame
//!   (`proxy/relay.rs`); `route`: how a request reaches workers (regular, SGLang PD, vLLM PD),
//!   chosen at start.
//! - `front`: the front door hyper serves, and the one way in for inference (body guard, key,
//!   metrics, CORS, the inference handler); `handlers`: every other route, by concern;
//!   `server`: start-up and serving; `background`: health checks, tree eviction, worker
//!   metadata.
//! - `discovery`: workers from the RBG discovery file; `kube`: from Kubernetes pods; `dp`:
//!   a data-parallel worker's ranks.
//! - `metrics`: Prometheus.

pub mod background;
pub mod compat;
pub mod config;
pub mod discovery;
pub mod dp;
pub mod front;
pub mod handlers;
pub mod kube;
pub mod kv_index;
pub mod limiter;
pub mod metrics;
pub mod policy;
pub mod proxy;
pub mod request;
pub mod route;
pub mod server;
pub mod tenants;
pub mod tokenize;
pub mod ui;
pub mod upstream;
pub mod vllm;
pub mod worker;

use crate::config::ConfigError;
use crate::http_server::lanes::Lane;
use crate::kube::KubeError;
use crate::role::{self, BindError};
use crate::router::config::{RouterConfig, RuntimeKind, TlsConfig};
use crate::router::limiter::Limiter;
use crate::router::metrics::Metrics;
use crate::router::policy::{LoadBalancingPolicy, PolicySettings};
use crate::router::worker::RegistryError;
use crate::router::worker::{Registry, Source, WorkerSpec, WorkerType};
use crate::shutdown::Shutdown;
use serde::{Deserialize, Serialize};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

/// Errors that stop the router.
#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("pod discovery: {0}")]
    Kube(#[from] KubeError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// Workers given at start did not answer within `--worker-startup-timeout-secs`.
    #[error("{0}")]
    Startup(String),
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    #[error("router.tokenizer_path: {0}")]
    Tokenizer(#[from] tokenize::TokenizeError),
    #[error("router.tenants_file: {0}")]
    Tenants(#[from] tenants::TenantsError),
}

/// The router: the state shared by every request and background task, by concern (the
/// settings as given, the workers, how requests are routed to them, what bounds the intake,
/// who may call, and the metrics; nothing here copies a setting), and its request path
/// (`proxy`).
pub struct Router {
    pub cfg: RouterConfig,
    pub workers: Workers,
    pub routing: Routing,
    pub limits: Limits,
    pub access: Access,
    pub metrics: Metrics,
}

/// The workers and what is learnt about them.
pub struct Workers {
    pub registry: Registry,
    /// The client to the workers, with a lane (its pooled connections) per runtime.
    pub upstream: upstream::Upstream,
    /// vLLM PD with Mooncake: each prefill worker's engine, learnt from its bootstrap server.
    pub mooncake_engines:
        parking_lot::Mutex<std::collections::HashMap<Arc<str>, vllm::MooncakeEngine>>,
    /// `--dp-aware`: each worker address's rank count, once learnt.
    pub dp_sizes: parking_lot::Mutex<std::collections::HashMap<String, usize>>,
}

/// How a request is routed: the mode, what is read of its body, the policies.
pub struct Routing {
    /// How inference requests reach workers, chosen once at start.
    pub route: route::Route,
    /// What routing reads of a request body (the text only for policies that match it, and
    /// for prefill/decode batches).
    pub reads: request::Reads,
    pub policy: Arc<dyn LoadBalancingPolicy>,
    pub prefill_policy: Arc<dyn LoadBalancingPolicy>,
    pub decode_policy: Arc<dyn LoadBalancingPolicy>,
    /// How policies are made (for those made later: one per model with `--enable-igw`).
    pub policy_settings: PolicySettings,
    /// `--enable-igw`: each model's policies (per worker type), made when first needed.
    pub model_policies: parking_lot::Mutex<
        std::collections::HashMap<(String, WorkerType), Arc<dyn LoadBalancingPolicy>>,
    >,
    /// `--tokenizer-path` (or a local `--model-path`).
    pub tokenizer: Option<Arc<tokenize::Tokenizer>>,
    /// With `precise_prefix`: the global KV index, fed by the workers' KV events.
    pub kv_index: Option<Arc<kv_index::KvIndex>>,
}

/// What bounds the router's intake.
pub struct Limits {
    /// Requests in flight and queued (`--max-concurrent-requests`, `--queue-size`, rate).
    pub limiter: Limiter,
    /// Bytes of request bodies received at once, all threads together.
    pub body_budget: Arc<crate::http_server::BodyBudget>,
    /// Turns at CPU work the router does for a request itself (a Conductor query's hashes),
    /// on blocking threads: half the cores, so that routing always has the rest.
    pub cpu_work: tokio::sync::Semaphore,
}

/// Who may call the router, and over what.
pub struct Access {
    /// `--tenants-file`: the tenants, their limits and classes; with it, every inference
    /// request names its tenant and is admitted by `tenants::admission`.
    pub tenants: Option<Arc<tenants::Tenants>>,
    /// `--control-plane-api-keys`, parsed.
    pub control_keys: Vec<config::ControlKey>,
    /// `--tls-cert-path`: the listener's TLS.
    pub server_tls: Option<Arc<rustls::ServerConfig>>,
}

/// Open connections to the API, all threads together.
pub(crate) const MAX_CONNECTIONS: usize = 16_384;
/// Of them, from one address (a load balancer's may carry every client's): past it, that
/// address's connection waiting longest for its client makes way.
pub(crate) const MAX_CONNECTIONS_PER_PEER: usize = 8_192;

/// Runtimes the router runs: one per thread when thread-per-core, else one.
fn runtimes(cfg: &RouterConfig) -> usize {
    match cfg.server.runtime {
        RuntimeKind::ThreadPerCore => cfg.server.threads(),
        RuntimeKind::WorkStealing => 1,
    }
}

/// The client TLS of `cfg`: the public roots and `ca_cert_paths`, with the client identity.
pub fn client_tls(cfg: &TlsConfig) -> Result<rustls::ClientConfig, crate::tls::TlsError> {
    let identity = cfg
        .client_cert_path
        .as_deref()
        .zip(cfg.client_key_path.as_deref());
    crate::tls::client_config(&cfg.ca_cert_paths, identity)
}

impl Router {
    /// The router its config describes: its workers given at start, policies, limits and
    /// access.
    pub fn new(cfg: RouterConfig) -> Result<Router, RouterError> {
        let kinds = [cfg.policy.policy, cfg.prefill_policy(), cfg.decode_policy()];
        let kv_index = kinds
            .iter()
            .any(|k| k.follows_kv_events())
            .then(|| Arc::new(kv_index::KvIndex::new(kv_index::DEFAULT_BUDGET)));
        if let (Some(k), Some(endpoint)) = (&kv_index, &cfg.policy.kv_events_pool_endpoint) {
            k.follow_pool(endpoint, cfg.policy.kv_events_pool_replay_endpoint.clone())
                .map_err(|e| ConfigError::invalid("router.kv_events_pool_endpoint", e))?;
        }
        let settings = PolicySettings {
            cache: cfg.cache,
            manual: cfg.manual,
            prefix_hash: cfg.prefix_hash,
            bucket_interval: cfg.policy.bucket_adjust_interval.0,
            prefixes: kv_index.clone().map(|k| k as Arc<dyn policy::PrefixView>),
            session_idle: cfg.policy.session_idle.0,
        };
        let policy = |kind| settings.build(kind);
        let limits = &cfg.limits;
        let max =
            (limits.max_concurrent_requests > 0).then_some(limits.max_concurrent_requests as usize);
        let text_policy = kinds.iter().any(|k| k.matches_text());
        let router = Router {
            workers: Workers {
                registry: Registry::default(),
                upstream: upstream::Upstream::new(runtimes(&cfg), client_tls(&cfg.tls)?),
                mooncake_engines: Default::default(),
                dp_sizes: Default::default(),
            },
            routing: Routing {
                route: route::Route::for_config(cfg.pd.enabled, cfg.server.backend),
                reads: match text_policy || cfg.pd.enabled {
                    true => request::Reads::Text,
                    false => request::Reads::Flags,
                },
                policy: policy(cfg.policy.policy),
                prefill_policy: policy(cfg.prefill_policy()),
                decode_policy: policy(cfg.decode_policy()),
                policy_settings: settings.clone(),
                model_policies: Default::default(),
                tokenizer: match cfg
                    .server
                    .tokenizer_path
                    .as_ref()
                    .or(cfg.server.model_path.as_ref())
                {
                    Some(path) => {
                        let t = tokenize::Tokenizer::load(path)?;
                        tracing::info!(tokenizer = %t.path.display(), "local tokenizer read");
                        Some(Arc::new(t))
                    }
                    None => None,
                },
                kv_index,
            },
            limits: Limits {
                limiter: {
                    let l = Limiter::new(max, limits.queue_size, limits.queue_timeout.0);
                    match limits.rate_limit_tokens_per_second {
                        Some(r) => l.with_rate(r),
                        None => l,
                    }
                },
                body_budget: crate::http_server::BodyBudget::new(
                    match limits.max_inflight_body_bytes {
                        0 => crate::http_server::BodyBudget::quarter_of_memory(),
                        n => n,
                    },
                ),
                cpu_work: tokio::sync::Semaphore::new(
                    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1)),
                ),
            },
            access: Access {
                tenants: match &cfg.tenants.tenants_file {
                    Some(path) => {
                        let t = &cfg.tenants;
                        let trusted = t.tenant_header.as_ref().map(|h| tenants::TrustedHeader {
                            name: h.to_ascii_lowercase(),
                            from: t
                                .tenant_header_trusted_from
                                .iter()
                                .filter_map(|c| c.parse().ok())
                                .collect(),
                        });
                        if max.is_none() {
                            tracing::warn!(
                                "tenants without --max-concurrent-requests: their limits apply, \
                                 but priority classes order nothing (requests never wait)"
                            );
                        }
                        Some(Arc::new(tenants::Tenants::load(
                            path,
                            trusted,
                            max,
                            t.tenant_limits_replicas,
                        )?))
                    }
                    None => None,
                },
                control_keys: cfg
                    .server
                    .control_plane_api_keys
                    .iter()
                    .map(|k| config::ControlKey::parse(k))
                    .collect::<Result<_, _>>()
                    .map_err(|e| ConfigError::invalid("router.control_plane_api_keys", e))?,
                server_tls: match (&cfg.tls.cert_path, &cfg.tls.key_path) {
                    (Some(cert), Some(key)) => Some(crate::tls::server_config(cert, key, None)?),
                    _ => None,
                },
            },
            metrics: Metrics::with_buckets(&cfg.metrics.prometheus_duration_buckets),
            cfg,
        };
        // With --dp-aware the workers given at start join once they tell their ranks
        // (server::await_startup).
        if !router.cfg.server.dp_aware {
            for spec in router.flag_specs() {
                router.workers.registry.add(spec, Source::Flags)?;
            }
        }
        Ok(router)
    }

    /// Threads serving the API (each with its lane of connections to workers).
    pub fn threads(&self) -> usize {
        self.workers.upstream.lanes()
    }

    /// Whether requests are split over prefill and decode workers.
    pub fn pd(&self) -> bool {
        self.cfg.pd.enabled
    }

    /// The workers given on the command line (or in the config file).
    pub fn flag_specs(&self) -> Vec<WorkerSpec> {
        let c = &self.cfg;
        let regular = c.server.worker_urls.iter().map(WorkerSpec::regular);
        let prefill = c.pd.prefill.iter().map(|p| WorkerSpec {
            worker_type: WorkerType::Prefill,
            bootstrap_port: p.bootstrap_port,
            ..WorkerSpec::regular(&p.url)
        });
        let decode = c.pd.decode.iter().map(|url| WorkerSpec {
            worker_type: WorkerType::Decode,
            ..WorkerSpec::regular(url)
        });
        regular.chain(prefill).chain(decode).collect()
    }

    /// Forgets a removed worker in every policy (and its events in the KV index).
    pub fn forget(&self, url: &str) {
        if let Some(k) = &self.routing.kv_index {
            k.forget(url);
        }
        self.routing.policy.on_worker_removed(url);
        self.routing.prefill_policy.on_worker_removed(url);
        self.routing.decode_policy.on_worker_removed(url);
        for p in self.routing.model_policies.lock().values() {
            p.on_worker_removed(url);
        }
    }
}

/// The router's sockets, bound before it starts (port 0 lets the kernel choose).
pub struct Listeners {
    /// The API.
    pub http: TcpListener,
    /// A separate `/metrics` listener (`--prometheus-port`, when not 0 and not the API's port).
    pub metrics: Option<TcpListener>,
}

impl Listeners {
    /// Binds the router's sockets its config names (port 0: the kernel chooses).
    pub fn bind(cfg: &RouterConfig) -> Result<Listeners, RouterError> {
        let (server, m) = (&cfg.server, &cfg.metrics);
        let separate = m.prometheus_port != 0 && m.prometheus_port != server.port;
        Ok(Listeners {
            http: role::bind("router", &server.host, server.port)?,
            metrics: match separate {
                true => Some(role::bind(
                    "router metrics",
                    &m.prometheus_host,
                    m.prometheus_port,
                )?),
                false => None,
            },
        })
    }
}

/// Where a started router listens.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Addrs {
    pub http: SocketAddr,
    pub metrics: Option<SocketAddr>,
}

/// A running router: its addresses, and how to stop it and wait for it.
pub type Handle = role::Handle<Addrs, RouterError>;

/// Starts the router on bound listeners; when `shutdown` fires it stops accepting and gives
/// requests in flight their grace period.
pub fn start(
    cfg: RouterConfig,
    listeners: Listeners,
    shutdown: Shutdown,
) -> Result<Handle, RouterError> {
    let addrs = Addrs {
        http: listeners.http.local_addr()?,
        metrics: role::local_addr(listeners.metrics.as_ref())?,
    };
    // Its clients' connections, one to a worker for each, and the rest.
    role::raise_open_files_limit(2 * MAX_CONNECTIONS as u64 + 1024);
    // The first runtime accepts the API's connections and serves the metrics and every
    // background task; thread-per-core, it hands connections to the threads of the other
    // lanes, each running a runtime of its own.
    let runtime = match cfg.server.runtime {
        RuntimeKind::ThreadPerCore => role::thread_runtime()?,
        RuntimeKind::WorkStealing => role::runtime("router", Some(cfg.server.threads()))?,
    };
    let (handoff, lanes) =
        crate::http_server::lanes::lanes(runtimes(&cfg), MAX_CONNECTIONS, MAX_CONNECTIONS_PER_PEER);
    let (router, http, metrics) = {
        let _guard = runtime.enter();
        (
            Arc::new(Router::new(cfg)?),
            role::async_listener(listeners.http)?,
            listeners.metrics.map(role::async_listener).transpose()?,
        )
    };
    runtime.block_on(server::start_background(&router))?;
    let others: Vec<(tokio::runtime::Runtime, Lane)> = lanes
        .into_iter()
        .map(|l| Ok((role::thread_runtime()?, l)))
        .collect::<std::io::Result<_>>()?;
    role::announce("router", &addrs);
    let stop = shutdown.clone();
    Ok(Handle::spawn("router", addrs, shutdown, move || {
        let threads: Vec<_> = others
            .into_iter()
            .enumerate()
            .map(|(i, (rt, lane))| {
                let (router, stop) = (router.clone(), stop.clone());
                std::thread::Builder::new()
                    .name("router".into())
                    .spawn(move || serve_lane(i + 1, rt, lane, router, stop))
            })
            .collect::<std::io::Result<_>>()?;
        let r = runtime.block_on(async {
            let serving = server::serve(router.clone(), http, metrics, handoff, stop.clone());
            tokio::pin!(serving);
            tokio::select! {
                _ = &mut serving => Ok(()),
                started = server::await_startup(router) => {
                    if started.is_err() {
                        stop.trigger();
                    }
                    serving.await;
                    started
                }
            }
        });
        stop.trigger();
        for t in threads {
            let _ = t.join();
        }
        runtime.shutdown_timeout(Duration::from_secs(1));
        r
    })?)
}

/// One further thread of a thread-per-core router: its runtime serves the connections handed
/// to its lane until `stop` fires.
fn serve_lane(
    index: usize,
    runtime: tokio::runtime::Runtime,
    lane: Lane,
    router: Arc<Router>,
    stop: Shutdown,
) {
    upstream::enter_runtime(index);
    runtime.block_on(server::serve_lane(router, lane, stop));
    runtime.shutdown_timeout(Duration::from_secs(1));
}

/// Runs the router on the addresses of its config until SIGINT or SIGTERM.
pub fn run(cfg: RouterConfig) -> Result<(), RouterError> {
    if let Some(dir) = &cfg.server.log_dir {
        crate::telemetry::log_to_dir(dir, "rbgctl-router")?;
    }
    let listeners = Listeners::bind(&cfg)?;
    start(cfg, listeners, Shutdown::on_signals()?)?.wait()
}
