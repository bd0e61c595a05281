//! `rbgctl router`: the OpenAI/SGLang-compatible gateway in front of SGLang or vLLM workers, a
//! drop-in for sglang-router 0.3.2 (same flags, endpoints and defaults).
//!
//! - `config`: flags and TOML, validated.
//! - `request` (pure): routing text, request ids, bootstrap injection, retry backoff.
//! - `policy` + `tree` (pure): random, round_robin, power_of_two, cache_aware, consistent_hashing.
//! - `worker`: workers, their health and circuit-breaker state machines, the registry.
//! - `limiter`: concurrency limit with a bounded queue.
//! - `proxy`: retries, PD dual dispatch, frame-by-frame relay.
//! - `server`: the HTTP API; `background`: health checks, tree eviction, worker metadata.
//! - `discovery`: workers from the RBG discovery file; `kube`: from Kubernetes pods.
//! - `metrics`: Prometheus.

pub mod background;
pub mod compat;
pub mod config;
pub mod discovery;
pub mod dp;
pub mod kube;
pub mod limiter;
pub mod metrics;
pub mod policy;
pub mod proxy;
pub mod request;
pub mod server;
pub mod tokenize;
pub mod ui;
pub mod vllm;
pub mod worker;

use crate::config::ConfigError;
use crate::kube::KubeError;
use crate::role::{self, BindError};
use crate::router::config::{RouterConfig, TlsConfig};
use crate::router::limiter::Limiter;
use crate::router::metrics::Metrics;
use crate::router::policy::{LoadBalancingPolicy, PolicySettings};
use crate::router::worker::RegistryError;
use crate::router::worker::{Registry, Source, WorkerSpec, WorkerType};
use crate::shutdown::Shutdown;
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
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
}

/// The client to workers: plain HTTP, or HTTPS for `https://` workers.
pub type HttpClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

/// State shared by every request and background task.
pub struct Shared {
    pub cfg: RouterConfig,
    pub pd: bool,
    pub registry: Registry,
    pub policy: Arc<dyn LoadBalancingPolicy>,
    pub prefill_policy: Arc<dyn LoadBalancingPolicy>,
    pub decode_policy: Arc<dyn LoadBalancingPolicy>,
    pub client: HttpClient,
    pub limiter: Limiter,
    pub metrics: Metrics,
    /// `--control-plane-api-keys`, parsed.
    pub control_keys: Vec<config::ControlKey>,
    /// vLLM PD with Mooncake: each prefill worker's engine, learnt from its bootstrap server.
    pub mooncake_engines:
        parking_lot::Mutex<std::collections::HashMap<Arc<str>, vllm::MooncakeEngine>>,
    /// How policies are made (for those made later: one per model with `--enable-igw`).
    pub policy_settings: PolicySettings,
    /// `--enable-igw`: each model's policies (per worker type), made when first needed.
    pub model_policies: parking_lot::Mutex<
        std::collections::HashMap<(String, WorkerType), Arc<dyn LoadBalancingPolicy>>,
    >,
    /// `--tokenizer-path` (or a local `--model-path`).
    pub tokenizer: Option<Arc<tokenize::Tokenizer>>,
    /// `--tls-cert-path`: the listener's TLS.
    pub server_tls: Option<Arc<rustls::ServerConfig>>,
    /// `--dp-aware`: each worker address's rank count, once learnt.
    pub dp_sizes: parking_lot::Mutex<std::collections::HashMap<String, usize>>,
}

/// The pooled keep-alive client to workers, with Nagle off (small SSE chunks go out at once);
/// `https://` workers are reached with `tls`.
pub fn http_client(tls: rustls::ClientConfig) -> HttpClient {
    let mut conn = HttpConnector::new();
    conn.set_nodelay(true);
    conn.set_keepalive(Some(Duration::from_secs(60)));
    conn.set_connect_timeout(Some(Duration::from_secs(5)));
    conn.enforce_http(false);
    let conn = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(conn);
    Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(1024)
        .build(conn)
}

/// The client TLS of `cfg`: the public roots and `ca_cert_paths`, with the client identity.
pub fn client_tls(cfg: &TlsConfig) -> Result<rustls::ClientConfig, crate::tls::TlsError> {
    let identity = cfg
        .client_cert_path
        .as_deref()
        .zip(cfg.client_key_path.as_deref());
    crate::tls::client_config(&cfg.ca_cert_paths, identity)
}

impl Shared {
    pub fn new(cfg: RouterConfig) -> Result<Shared, RouterError> {
        let settings = PolicySettings {
            cache: cfg.cache,
            manual: cfg.manual,
            bucket_interval: cfg.policy.bucket_adjust_interval.0,
        };
        let policy = |kind| settings.build(kind);
        let limits = &cfg.limits;
        let max =
            (limits.max_concurrent_requests > 0).then_some(limits.max_concurrent_requests as usize);
        let shared = Shared {
            pd: cfg.pd.enabled,
            registry: Registry::default(),
            policy: policy(cfg.policy.policy),
            prefill_policy: policy(cfg.prefill_policy()),
            decode_policy: policy(cfg.decode_policy()),
            policy_settings: settings,
            model_policies: Default::default(),
            client: http_client(client_tls(&cfg.tls)?),
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
            server_tls: match (&cfg.tls.cert_path, &cfg.tls.key_path) {
                (Some(cert), Some(key)) => Some(crate::tls::server_config(cert, key, None)?),
                _ => None,
            },
            limiter: {
                let l = Limiter::new(max, limits.queue_size, limits.queue_timeout.0);
                match limits.rate_limit_tokens_per_second {
                    Some(r) => l.with_rate(r),
                    None => l,
                }
            },
            metrics: Metrics::with_buckets(&cfg.metrics.prometheus_duration_buckets),
            mooncake_engines: Default::default(),
            dp_sizes: Default::default(),
            control_keys: cfg
                .server
                .control_plane_api_keys
                .iter()
                .map(|k| config::ControlKey::parse(k))
                .collect::<Result<_, _>>()
                .map_err(|e| ConfigError::invalid("router.control_plane_api_keys", e))?,
            cfg,
        };
        // With --dp-aware the workers given at start join once they tell their ranks
        // (server::await_startup).
        if !shared.cfg.server.dp_aware {
            for spec in shared.flag_specs() {
                shared.registry.add(spec, Source::Flags)?;
            }
        }
        Ok(shared)
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

    /// Forgets a removed worker in every policy.
    pub fn forget(&self, url: &str) {
        self.policy.on_worker_removed(url);
        self.prefill_policy.on_worker_removed(url);
        self.decode_policy.on_worker_removed(url);
        for p in self.model_policies.lock().values() {
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

pub type Handle = role::Handle<Addrs, RouterError>;

/// Starts the router on bound listeners; when `shutdown` fires it stops accepting and gives
/// requests in flight up to 30 s.
pub fn start(
    cfg: RouterConfig,
    listeners: Listeners,
    shutdown: Shutdown,
) -> Result<Handle, RouterError> {
    let addrs = Addrs {
        http: listeners.http.local_addr()?,
        metrics: role::local_addr(listeners.metrics.as_ref())?,
    };
    let runtime = role::runtime("router", cfg.server.runtime_threads)?;
    let (shared, http, metrics) = {
        let _guard = runtime.enter();
        (
            Arc::new(Shared::new(cfg)?),
            role::async_listener(listeners.http)?,
            listeners.metrics.map(role::async_listener).transpose()?,
        )
    };
    runtime.block_on(server::start_background(&shared))?;
    role::announce("router", &addrs);
    let stop = shutdown.clone();
    Ok(Handle::spawn("router", addrs, shutdown, move || {
        let r = runtime.block_on(async {
            let serving = server::serve(shared.clone(), http, metrics, stop.clone());
            tokio::pin!(serving);
            tokio::select! {
                _ = &mut serving => Ok(()),
                started = server::await_startup(shared) => {
                    if started.is_err() {
                        stop.trigger();
                    }
                    serving.await;
                    started
                }
            }
        });
        runtime.shutdown_timeout(Duration::from_secs(1));
        r
    })?)
}

/// Runs the router on the addresses of its config until SIGINT or SIGTERM.
pub fn run(cfg: RouterConfig) -> Result<(), RouterError> {
    if let Some(dir) = &cfg.server.log_dir {
        crate::telemetry::log_to_dir(dir, "rbgctl-router")?;
    }
    let listeners = Listeners::bind(&cfg)?;
    start(cfg, listeners, Shutdown::on_signals()?)?.wait()
}
