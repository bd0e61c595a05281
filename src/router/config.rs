//! `rbgctl router` configuration. Flags are named as in sglang-router 0.3.2 (`--worker-urls`,
//! `--policy`, `--cache-threshold`, `--pd-disaggregation --prefill URL [PORT] --decode URL`, ...)
//! with the same defaults, so an existing launch line works unchanged. Precedence: flag > TOML
//! file (`--config`) > the defaults documented on each field. Example: `config/router.toml`.

use super::policy::{AssignmentMode, CacheAwareConfig, ManualConfig, PolicyKind, PrefixHashConfig};
use super::vllm::{self, Connector, Legs};
use crate::config::flat::FlatTable;
use crate::config::{check_pair, layered, ConfigError, Millis, Secs};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// A prefill worker of a disaggregated deployment.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PrefillSpec {
    pub url: String,
    /// Port of the worker's KV bootstrap server, sent to both sides as `bootstrap_port`;
    /// `None` sends `null`.
    #[serde(default)]
    pub bootstrap_port: Option<u16>,
}

/// Everything `rbgctl router` is set up with, grouped by what it concerns. The file and the
/// flags keep sglang-router's flat names (`retry_max_retries`, `--retry-max-retries`); each
/// section says which it reads (`config::flat`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct RouterConfig {
    #[serde(flatten)]
    pub server: ServerConfig,
    #[serde(flatten)]
    pub limits: LimitsConfig,
    #[serde(flatten)]
    pub metrics: MetricsConfig,
    #[serde(flatten)]
    pub policy: PolicyConfig,
    #[serde(flatten)]
    pub cache: CacheAwareConfig,
    #[serde(flatten)]
    pub manual: ManualConfig,
    #[serde(flatten)]
    pub prefix_hash: PrefixHashConfig,
    #[serde(flatten)]
    pub retry: RetryConfig,
    #[serde(flatten)]
    pub breaker: BreakerConfig,
    #[serde(flatten)]
    pub health: HealthConfig,
    #[serde(flatten)]
    pub pd: PdConfig,
    #[serde(flatten)]
    pub discovery: DiscoveryConfig,
    #[serde(flatten)]
    pub tls: TlsConfig,
    #[serde(flatten)]
    pub tenants: TenantsConfig,
}

impl<'de> Deserialize<'de> for RouterConfig {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut t = FlatTable::new(toml::Table::deserialize(d)?);
        let mut read = || -> Result<RouterConfig, String> {
            Ok(RouterConfig {
                server: t.section()?,
                limits: t.section()?,
                metrics: t.section()?,
                policy: t.section()?,
                cache: t.section()?,
                manual: t.section()?,
                prefix_hash: t.section()?,
                retry: t.section()?,
                breaker: t.section()?,
                health: t.section()?,
                pd: t.section()?,
                discovery: t.section()?,
                tls: t.section()?,
                tenants: t.section()?,
            })
        };
        let c = read().map_err(serde::de::Error::custom)?;
        t.finish().map_err(serde::de::Error::custom)?;
        Ok(c)
    }
}

/// Where the router listens, what it serves, and who may call it.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Address the service listens on. Default `0.0.0.0` (as sglang-router).
    pub host: String,
    /// The service port. Default 30000.
    pub port: u16,
    /// Workers of a regular (not disaggregated) deployment.
    pub worker_urls: Vec<String>,
    /// The engines' API: `sglang` (bootstrap fields in the request) or `vllm` (OpenAI routes;
    /// in PD, vLLM's `kv_transfer_params` contract). Default `sglang`.
    pub backend: Backend,
    /// Each worker's data-parallel ranks (its `/get_server_info` `dp_size`) become workers
    /// of their own, `URL@rank`; requests carry `data_parallel_rank`. Default false.
    pub dp_aware: bool,
    /// Several models behind one router: a request goes to the workers serving its `model`,
    /// each model with policies of its own. Default false.
    pub enable_igw: bool,
    /// Clients must send `Authorization: Bearer <key>` to inference and admin routes.
    pub api_key: Option<String>,
    /// Keys for the control plane (worker management, cache flush, loads), as sglang-router
    /// writes them: `id:name:role:key`, role `admin` (may change workers) or `user` (may read).
    /// When set, those routes take these keys instead of `api_key`. Default: none.
    pub control_plane_api_keys: Vec<String>,
    /// Browser origins allowed to call the router (CORS); empty allows any origin, as
    /// sglang-router does. Default: empty.
    pub cors_allowed_origins: Vec<String>,
    /// Headers a request id is taken from, first match wins. Default `x-request-id`,
    /// `x-correlation-id`, `x-trace-id`, `request-id`.
    pub request_id_headers: Vec<String>,
    /// On SIGTERM, how long requests in flight may take to finish. Default 180 s (as
    /// sglang-router).
    #[serde(rename = "shutdown_grace_period_secs")]
    pub shutdown_grace_period: Secs,
    /// Threads serving the API. Default: one per core, at most [`DEFAULT_MAX_THREADS`].
    pub runtime_threads: Option<usize>,
    /// How those threads share the work. Default `thread_per_core`.
    pub runtime: RuntimeKind,
    /// Also write the log to daily files `rbgctl-router.YYYY-MM-DD` in this folder. Default:
    /// none (standard error only).
    pub log_dir: Option<PathBuf>,
    /// A local `tokenizer.json` (or a directory holding one): `/v1/tokenize`,
    /// `/v1/detokenize`, and cache-aware matching by token. Never downloaded. Default: none
    /// (routing on text).
    pub tokenizer_path: Option<PathBuf>,
    /// sglang-router's model path: used as `tokenizer_path` when that is not given, and must
    /// then be a local directory holding `tokenizer.json`. Default: none.
    pub model_path: Option<PathBuf>,
}

/// Threads the router serves with unless told: one thread serves tens of thousands of requests
/// a second, and each further thread wakes up for fewer of them, which costs CPU per request
/// (on 16 cores, thread-per-core: 26 µs at 2 threads, 28.5 at 4, 32 at 6, 47 at 8).
pub const DEFAULT_MAX_THREADS: usize = 4;

impl ServerConfig {
    /// Threads serving the API: `runtime_threads`, or one per core up to
    /// [`DEFAULT_MAX_THREADS`].
    pub fn threads(&self) -> usize {
        self.runtime_threads.unwrap_or_else(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            cores.min(DEFAULT_MAX_THREADS)
        })
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "0.0.0.0".into(),
            port: 30000,
            worker_urls: Vec::new(),
            backend: Backend::Sglang,
            dp_aware: false,
            enable_igw: false,
            api_key: None,
            control_plane_api_keys: Vec::new(),
            cors_allowed_origins: Vec::new(),
            request_id_headers: [
                "x-request-id",
                "x-correlation-id",
                "x-trace-id",
                "request-id",
            ]
            .map(String::from)
            .to_vec(),
            shutdown_grace_period: Secs::from_secs(180),
            runtime_threads: None,
            runtime: RuntimeKind::default(),
            log_dir: None,
            tokenizer_path: None,
            model_path: None,
        }
    }
}

/// What one client may hold: bodies, time, a place in the queue.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Largest request body accepted. Default 512 MiB.
    pub max_payload_size: usize,
    /// Largest body of the routes that answer from the router itself (`/query`,
    /// `/query_by_hash`, `/v1/tokenize`, `/v1/detokenize`). Default 16 MiB.
    pub max_query_payload_size: usize,
    /// Bytes of request bodies received at once, all requests together; beyond it a request
    /// is answered 503. Default 0: a quarter of this machine's memory.
    pub max_inflight_body_bytes: usize,
    /// Longest wait for a worker's response headers. Default 1800 s.
    #[serde(rename = "request_timeout_secs")]
    pub request_timeout: Secs,
    /// Requests proxied at once; −1 is unlimited. Default −1.
    pub max_concurrent_requests: i64,
    /// Requests waiting for a slot; beyond it 429. Default 100.
    pub queue_size: usize,
    /// Longest wait in the queue; then 408. Default 60 s.
    #[serde(rename = "queue_timeout_secs")]
    pub queue_timeout: Secs,
    /// Requests per second admitted (a token bucket, burst `max_concurrent_requests`);
    /// requests beyond it wait in the queue. Default: none (no rate limit).
    pub rate_limit_tokens_per_second: Option<f64>,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_payload_size: 512 << 20,
            max_query_payload_size: 16 << 20,
            max_inflight_body_bytes: 0,
            request_timeout: Secs::from_secs(1800),
            max_concurrent_requests: -1,
            queue_size: 100,
            queue_timeout: Secs::from_secs(60),
            rate_limit_tokens_per_second: None,
        }
    }
}

/// Tenants: who calls, with what keys, limits and priority classes (docs/router.md, Tenants).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct TenantsConfig {
    /// The tenants file (keys stored as SHA-256, limits, classes), read again when it changes;
    /// with it every inference request must name its tenant. Default: none (no tenants).
    pub tenants_file: Option<PathBuf>,
    /// A header a trusted front names the tenant in (e.g. `x-tenant`), taken only from the
    /// addresses of `tenant_header_trusted_from`. Default: none.
    pub tenant_header: Option<String>,
    /// Addresses (`10.0.0.0/8`, `::1`) whose requests may name their tenant in
    /// `tenant_header`; a request from elsewhere carrying it is refused (403). Default: none.
    pub tenant_header_trusted_from: Vec<String>,
    /// Routers sharing each tenant's traffic evenly behind one load balancer: each enforces
    /// this share of every tenant's rates and concurrency cap. Default 1.
    pub tenant_limits_replicas: usize,
}

impl Default for TenantsConfig {
    fn default() -> Self {
        TenantsConfig {
            tenants_file: None,
            tenant_header: None,
            tenant_header_trusted_from: Vec::new(),
            tenant_limits_replicas: 1,
        }
    }
}

/// The separate `/metrics` listener and the duration histograms.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// `/metrics` also on a separate listener at this address. Default `0.0.0.0`.
    pub prometheus_host: String,
    /// Port of that listener (0: none, `/metrics` stays on the main port). Default 29000.
    pub prometheus_port: u16,
    /// Upper bounds (seconds, increasing) of the duration histograms. Default: empty, the
    /// built-in 0.5 ms .. 60 s.
    pub prometheus_duration_buckets: Vec<f64>,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            prometheus_host: "0.0.0.0".into(),
            prometheus_port: 29000,
            prometheus_duration_buckets: Vec::new(),
        }
    }
}

/// Which policy chooses a worker, per worker type.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyConfig {
    /// How a worker is chosen. Default `cache_aware`.
    pub policy: PolicyKind,
    /// PD only; falls back to `policy`.
    pub prefill_policy: Option<PolicyKind>,
    /// PD only; falls back to `policy`.
    pub decode_policy: Option<PolicyKind>,
    /// `bucket` policy: time between boundary adjustments (also the window of requests they
    /// follow). Default 5 s.
    #[serde(rename = "bucket_adjust_interval_secs")]
    pub bucket_adjust_interval: Secs,
    /// `predicted_ttft`: a session (`X-Session-Id` or `X-SMG-Routing-Key`) idle this long no
    /// longer counts its last turn as held on its worker. Default 600 s.
    #[serde(rename = "session_idle_secs")]
    pub session_idle: Secs,
    /// `precise_prefix`: the PUB endpoint of the pool master's KV events (`rbgctl master
    /// --kv-events-config`); what the pool holds counts for every engine. Default: none.
    pub kv_events_pool_endpoint: Option<String>,
    /// ... and its replay endpoint. Default: none.
    pub kv_events_pool_replay_endpoint: Option<String>,
    /// ... and the master's admin URL (`http://host:port`), asked for a snapshot of every
    /// page at start. Default: none (the pool's blocks come in as they change).
    pub kv_events_pool_snapshot_url: Option<String>,
    /// The pool's cluster secret, sent to its master with the snapshot request (which needs
    /// it when the pool has one). Default: none.
    pub kv_events_pool_auth_token_file: Option<std::path::PathBuf>,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            policy: PolicyKind::CacheAware,
            prefill_policy: None,
            decode_policy: None,
            bucket_adjust_interval: Secs::from_secs(5),
            session_idle: Secs::from_secs(600),
            kv_events_pool_endpoint: None,
            kv_events_pool_replay_endpoint: None,
            kv_events_pool_snapshot_url: None,
            kv_events_pool_auth_token_file: None,
        }
    }
}

/// Retries on another worker (sglang-router's names and defaults).
#[derive(Clone, Copy, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryConfig {
    /// Tries of a request on another worker after a retryable failure (408, 429, 5xx, no
    /// connection). Default 5.
    #[serde(rename = "retry_max_retries")]
    pub max_retries: u32,
    /// Wait before the first retry. Default 50 ms.
    #[serde(rename = "retry_initial_backoff_ms")]
    pub initial_backoff: Millis,
    /// Longest wait between retries. Default 30 s.
    #[serde(rename = "retry_max_backoff_ms")]
    pub max_backoff: Millis,
    /// Each retry waits this many times longer than the one before. Default 1.5.
    #[serde(rename = "retry_backoff_multiplier")]
    pub multiplier: f64,
    /// Waits move by up to ± this fraction at random. Default 0.2.
    #[serde(rename = "retry_jitter_factor")]
    pub jitter: f64,
    /// No retries at all. Default false.
    #[serde(rename = "disable_retries")]
    pub disabled: bool,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_retries: 5,
            initial_backoff: Millis(Duration::from_millis(50)),
            max_backoff: Millis(Duration::from_secs(30)),
            multiplier: 1.5,
            jitter: 0.2,
            disabled: false,
        }
    }
}

impl RetryConfig {
    /// Tries after the first: none when retries are off.
    pub fn retries(&self) -> u32 {
        if self.disabled {
            0
        } else {
            self.max_retries
        }
    }

    /// The waits between tries: `min(initial × multiplier^(n-1), max)` before retry `n`, moved
    /// by up to ± `jitter` of itself.
    pub fn backoff(&self) -> crate::backoff::Backoff {
        crate::backoff::Backoff::new(self.initial_backoff.0, self.max_backoff.0)
            .growing_by(self.multiplier)
            .jittered_by(self.jitter)
    }
}

/// Each worker's circuit breaker (sglang-router's names and defaults).
#[derive(Clone, Copy, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct BreakerConfig {
    /// Consecutive failures that open a worker's circuit. Default 10.
    #[serde(rename = "cb_failure_threshold")]
    pub failure_threshold: u32,
    /// Consecutive successes in half-open that close it. Default 3.
    #[serde(rename = "cb_success_threshold")]
    pub success_threshold: u32,
    /// Open → half-open after this. Default 60 s.
    #[serde(rename = "cb_timeout_duration_secs")]
    pub timeout: Secs,
    /// Accepted for compatibility (sglang-router validates but does not use it). Default 120 s.
    #[serde(rename = "cb_window_duration_secs")]
    pub window: Secs,
    /// No circuit breakers. Default false.
    #[serde(rename = "disable_circuit_breaker")]
    pub disabled: bool,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            failure_threshold: 10,
            success_threshold: 3,
            timeout: Secs::from_secs(60),
            window: Secs::from_secs(120),
            disabled: false,
        }
    }
}

/// Health checks of workers, and the wait for those given at start.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct HealthConfig {
    /// Failed health checks in a row that take a worker out. Default 3.
    #[serde(rename = "health_failure_threshold")]
    pub failure_threshold: u32,
    /// Passed health checks in a row that bring it back. Default 2.
    #[serde(rename = "health_success_threshold")]
    pub success_threshold: u32,
    /// Longest wait for one health check. Default 5 s.
    #[serde(rename = "health_check_timeout_secs")]
    pub timeout: Secs,
    /// Time between health checks of a worker. Default 60 s.
    #[serde(rename = "health_check_interval_secs")]
    pub interval: Secs,
    /// The path health checks ask. Default `/health`.
    #[serde(rename = "health_check_endpoint")]
    pub endpoint: String,
    /// No health checks (every worker counts as healthy). Default false.
    #[serde(rename = "disable_health_check")]
    pub disabled: bool,
    /// Workers given at start (flags or config) must answer their health check within this
    /// long, else the router exits with an error naming them. Default 1800 s (as
    /// sglang-router).
    #[serde(rename = "worker_startup_timeout_secs")]
    pub startup_timeout: Secs,
    /// How often those workers are checked until they answer. Default 30 s.
    #[serde(rename = "worker_startup_check_interval")]
    pub startup_check_interval: Secs,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            failure_threshold: 3,
            success_threshold: 2,
            timeout: Secs::from_secs(5),
            interval: Secs::from_secs(60),
            endpoint: "/health".into(),
            disabled: false,
            startup_timeout: Secs::from_secs(1800),
            startup_check_interval: Secs::from_secs(30),
        }
    }
}

/// Prefill/decode disaggregation.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct PdConfig {
    /// Prefill/decode disaggregation. Default false.
    #[serde(rename = "pd_disaggregation")]
    pub enabled: bool,
    /// Prefill workers, each with its bootstrap port.
    pub prefill: Vec<PrefillSpec>,
    /// Decode workers.
    pub decode: Vec<String>,
    /// vLLM PD: the engines' KV connector. Default `mooncake`.
    pub vllm_kv_connector: Connector,
    /// vLLM PD with Mooncake: run the prefill and decode legs at once, or decode after
    /// prefill. Default `concurrent`.
    pub vllm_pd_legs: Legs,
    /// vLLM PD with Mooncake: the prefill engines' bootstrap port (`GET /query`), unless a
    /// prefill worker names its own. Default 8998 (`VLLM_MOONCAKE_BOOTSTRAP_PORT`'s default).
    pub vllm_bootstrap_port: u16,
}

impl Default for PdConfig {
    fn default() -> Self {
        PdConfig {
            enabled: false,
            prefill: Vec::new(),
            decode: Vec::new(),
            vllm_kv_connector: Connector::Mooncake,
            vllm_pd_legs: Legs::Concurrent,
            vllm_bootstrap_port: 8998,
        }
    }
}

/// Workers found rather than given: Kubernetes pods, or an RBG discovery file.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// Discover workers from Kubernetes pods (Running and Ready) matching `selector`.
    #[serde(rename = "service_discovery")]
    pub kubernetes: bool,
    /// `key=value` labels a regular worker pod must carry.
    pub selector: Vec<String>,
    /// `key=value` labels a prefill worker pod must carry (PD).
    pub prefill_selector: Vec<String>,
    /// `key=value` labels a decode worker pod must carry (PD).
    pub decode_selector: Vec<String>,
    /// Port of discovered pods' HTTP server. Default 80.
    #[serde(rename = "service_discovery_port")]
    pub port: u16,
    /// Namespace to watch; all namespaces when unset.
    #[serde(rename = "service_discovery_namespace")]
    pub namespace: Option<String>,
    /// RBG discovery file (`/etc/rbg/config.yaml` in a RoleBasedGroup pod). Unset: not used.
    pub rbg_config: Option<PathBuf>,
    /// Role of the regular workers in the RBG discovery file.
    pub rbg_role: Option<String>,
    /// Role of the prefill workers in the RBG discovery file (PD).
    pub rbg_prefill_role: Option<String>,
    /// Role of the decode workers in the RBG discovery file (PD).
    pub rbg_decode_role: Option<String>,
    /// Port name (as in `servicePorts`, lower case, `-` → `_`) of the workers' HTTP server;
    /// when unset the role's only port, else `http`, else the first by name.
    pub rbg_port_name: Option<String>,
    /// Port name of the prefill workers' bootstrap server (PD). Unset: `bootstrap_port` null.
    pub rbg_bootstrap_port_name: Option<String>,
    /// How often the RBG discovery file is re-read. Default 2 s.
    #[serde(rename = "rbg_poll_secs")]
    pub rbg_poll: Secs,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        DiscoveryConfig {
            kubernetes: false,
            selector: Vec::new(),
            prefill_selector: Vec::new(),
            decode_selector: Vec::new(),
            port: 80,
            namespace: None,
            rbg_config: None,
            rbg_role: None,
            rbg_prefill_role: None,
            rbg_decode_role: None,
            rbg_port_name: None,
            rbg_bootstrap_port_name: None,
            rbg_poll: Secs::from_secs(2),
        }
    }
}

/// HTTPS to clients, and to `https://` workers.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    /// Serve HTTPS with this PEM certificate chain (with `tls_key_path`). Default: none
    /// (plain HTTP).
    #[serde(rename = "tls_cert_path")]
    pub cert_path: Option<PathBuf>,
    /// The PEM private key of `tls_cert_path`. Default: none.
    #[serde(rename = "tls_key_path")]
    pub key_path: Option<PathBuf>,
    /// PEM CA certificates trusted for `https://` workers, beside the public web's roots.
    /// Default: none.
    pub ca_cert_paths: Vec<PathBuf>,
    /// PEM certificate the router presents to `https://` workers (mutual TLS; with
    /// `client_key_path`). Default: none.
    pub client_cert_path: Option<PathBuf>,
    /// The PEM private key of `client_cert_path`. Default: none.
    pub client_key_path: Option<PathBuf>,
}

/// A `key=value` label selector term.
pub fn parse_selector(field: &str, terms: &[String]) -> Result<Vec<(String, String)>, ConfigError> {
    terms
        .iter()
        .map(|t| match t.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().into(), v.trim().into())),
            _ => Err(ConfigError::invalid(
                field,
                format!("expected key=value, got {t:?}"),
            )),
        })
        .collect()
}

/// A worker URL: `http://host:port` (a bare `host:port` gets `http://`), no trailing slash.
pub fn normalize_url(field: &str, url: &str) -> Result<String, ConfigError> {
    let url = url.trim().trim_end_matches('/');
    let full = if url.contains("://") {
        url.to_string()
    } else {
        format!("http://{url}")
    };
    let uri: http::Uri = full
        .parse()
        .map_err(|e| ConfigError::invalid(field, format!("{url:?} is not a URL: {e}")))?;
    match (uri.scheme_str(), uri.authority()) {
        (Some("http" | "https"), Some(_)) if uri.path() == "/" || uri.path().is_empty() => Ok(full),
        (Some("http" | "https"), Some(_)) => Err(ConfigError::invalid(
            field,
            format!("{url:?}: a worker URL has no path"),
        )),
        (Some(s), _) if s != "http" && s != "https" => Err(ConfigError::invalid(
            field,
            format!("{url:?}: only http:// and https:// workers are supported"),
        )),
        _ => Err(ConfigError::invalid(field, format!("{url:?}: no host"))),
    }
}

/// Flags of `rbgctl router`, spelled as sglang-router's, grouped as the config's sections.
#[derive(Clone, Debug, Default, clap::Args, Serialize)]
pub struct RouterArgs {
    /// TOML config file (see config/router.toml). Default: none (built-in defaults).
    #[arg(long, env = "RBGCTL_ROUTER_CONFIG")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    #[serde(flatten)]
    pub server: ServerArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub limits: LimitsArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub metrics: MetricsArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub policy: PolicyArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub retry: RetryArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub breaker: BreakerArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub health: HealthArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub pd: PdArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub discovery: DiscoveryArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub tenants: TenantsArgs,
}

/// The router's tenant flags.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, clap::Args, Serialize)]
#[command(next_help_heading = "Tenants")]
pub struct TenantsArgs {
    /// The tenants file: API keys (as SHA-256), per-tenant rates and concurrency, priority
    /// classes; read again when it changes. Every inference request must then name its
    /// tenant. Default: none (no tenants).
    #[arg(long, env = "RBGCTL_ROUTER_TENANTS_FILE")]
    pub tenants_file: Option<PathBuf>,
    /// A header a trusted front names the tenant in (e.g. x-tenant), taken only from
    /// --tenant-header-trusted-from. Default: none.
    #[arg(long)]
    pub tenant_header: Option<String>,
    /// Addresses (10.0.0.0/8, ::1) allowed to name a tenant in --tenant-header; the header
    /// from elsewhere is refused (403). Default: none.
    #[arg(long, num_args = 1..)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tenant_header_trusted_from: Vec<String>,
    /// Routers sharing each tenant's traffic evenly behind one load balancer: each enforces
    /// this share of every tenant's rates and concurrency cap. Default 1.
    #[arg(long)]
    pub tenant_limits_replicas: Option<usize>,
}

/// The router's listener flags.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, clap::Args, Serialize)]
#[command(next_help_heading = "Server")]
pub struct ServerArgs {
    /// Address the service listens on. Default `0.0.0.0` (as sglang-router).
    #[arg(long)]
    pub host: Option<String>,
    /// The service port. Default 30000.
    #[arg(long)]
    pub port: Option<u16>,
    /// Regular workers (`http://host:port`). Default: none.
    #[arg(long, num_args = 1..)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub worker_urls: Vec<String>,
    /// The engines' API: `sglang` or `vllm` (OpenAI routes; vLLM's `kv_transfer_params` in
    /// PD). Default `sglang`; `vllm` with the `--prefiller-host` family.
    #[arg(long, value_enum)]
    pub backend: Option<Backend>,
    /// Route to each data-parallel rank of a worker (its `/get_server_info` `dp_size`) as a
    /// worker of its own, `URL@rank`, with `data_parallel_rank` in the body. Default false.
    #[arg(long)]
    #[serde(skip_serializing_if = "crate::config::is_false")]
    pub dp_aware: bool,
    /// Inference gateway mode: workers of several models; a request goes to the workers
    /// serving its `model`, each model with policies of its own. Default false.
    #[arg(long)]
    #[serde(skip_serializing_if = "crate::config::is_false")]
    pub enable_igw: bool,
    /// Clients must send `Authorization: Bearer <key>` to inference and admin routes. Default: none (no key asked).
    #[arg(long, env = "RBGCTL_ROUTER_API_KEY")]
    pub api_key: Option<String>,
    /// Control-plane keys `id:name:role:key` (role `admin`: may add and remove workers;
    /// `user`: may read them); worker management then takes these instead of --api-key.
    /// Default: none.
    #[arg(long, num_args = 0..)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub control_plane_api_keys: Vec<String>,
    /// Browser origins allowed to call the router (CORS), e.g. `https://ui.example.com`.
    /// Default: none listed, which allows any origin (as sglang-router).
    #[arg(long, num_args = 0..)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cors_allowed_origins: Vec<String>,
    /// Headers a request id is taken from, first match wins. Default `x-request-id`,
    /// `x-correlation-id`, `x-trace-id`, `request-id`.
    #[arg(long, num_args = 1..)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub request_id_headers: Vec<String>,
    /// On SIGTERM, how long requests in flight may take to finish, in seconds. Default 180.
    #[arg(long)]
    pub shutdown_grace_period_secs: Option<f64>,
    /// Threads serving the API. Default: one per core, at most 4 (one thread serves tens of
    /// thousands of requests a second; more threads each wake up for fewer requests, and
    /// spend more CPU per request).
    #[arg(long)]
    pub runtime_threads: Option<usize>,
    /// How the threads share the work: `thread_per_core` (each thread serves the connections
    /// it is handed, with its own connections to the workers: a request never crosses a
    /// thread) or `work_stealing` (one runtime whose threads take each other's tasks).
    /// Default `thread_per_core`.
    #[arg(long, value_enum)]
    pub runtime: Option<RuntimeKind>,
    /// Also write the log to daily files `rbgctl-router.YYYY-MM-DD` in this folder. Default:
    /// none (standard error only).
    #[arg(long)]
    pub log_dir: Option<PathBuf>,
    /// A local tokenizer.json (or a directory holding one) for /v1/tokenize, /v1/detokenize
    /// and cache-aware matching by token; never downloaded. Default: none (routing on text).
    #[arg(long)]
    pub tokenizer_path: Option<PathBuf>,
    /// A local model directory holding tokenizer.json, used when --tokenizer-path is not
    /// given (a hub id is refused: nothing is downloaded). Default: none.
    #[arg(long)]
    pub model_path: Option<PathBuf>,
}

/// The router's flags for request sizes, concurrency and timeouts.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, clap::Args, Serialize)]
#[command(next_help_heading = "Limits")]
pub struct LimitsArgs {
    /// Largest request body accepted. Default 512 MiB.
    #[arg(long)]
    pub max_payload_size: Option<usize>,
    /// Largest body of the routes the router answers itself (/query, /query_by_hash,
    /// /v1/tokenize, /v1/detokenize). Default 16 MiB.
    #[arg(long)]
    pub max_query_payload_size: Option<usize>,
    /// Bytes of request bodies received at once, all requests together (503 beyond).
    /// Default 0: a quarter of this machine's memory.
    #[arg(long)]
    pub max_inflight_body_bytes: Option<usize>,
    /// Longest wait for a worker's response headers. Default 1800 s.
    #[arg(long)]
    pub request_timeout_secs: Option<f64>,
    /// Requests proxied at once; −1 is unlimited. Default −1.
    #[arg(long, allow_negative_numbers = true)]
    pub max_concurrent_requests: Option<i64>,
    /// Requests waiting for a slot; beyond it 429. Default 100.
    #[arg(long)]
    pub queue_size: Option<usize>,
    /// Longest wait in the queue; then 408. Default 60 s.
    #[arg(long)]
    pub queue_timeout_secs: Option<f64>,
    /// Requests per second admitted (token bucket; burst: --max-concurrent-requests); others
    /// wait in the queue. Default: none (no rate limit).
    #[arg(long)]
    pub rate_limit_tokens_per_second: Option<f64>,
}

/// The router's metrics flags.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, clap::Args, Serialize)]
#[command(next_help_heading = "Metrics")]
pub struct MetricsArgs {
    /// `/metrics` also on a separate listener at this address. Default `0.0.0.0`.
    #[arg(long)]
    pub prometheus_host: Option<String>,
    /// 0 turns the separate metrics listener off (`/metrics` stays on the main port). Default 29000.
    #[arg(long)]
    pub prometheus_port: Option<u16>,
    /// Upper bounds, in seconds and increasing, of the request duration histograms.
    /// Default: 0.0005 .. 60 (14 buckets).
    #[arg(long, num_args = 1..)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub prometheus_duration_buckets: Vec<f64>,
}

/// The router's worker-choice flags.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, clap::Args, Serialize)]
#[command(next_help_heading = "Policies")]
pub struct PolicyArgs {
    /// How a worker is chosen. Default `cache_aware`.
    #[arg(long, value_enum)]
    pub policy: Option<PolicyKind>,
    /// PD only; falls back to `policy`. Default: --policy.
    #[arg(long, value_enum)]
    pub prefill_policy: Option<PolicyKind>,
    /// PD only; falls back to `policy`. Default: --policy.
    #[arg(long, value_enum)]
    pub decode_policy: Option<PolicyKind>,
    /// cache_aware: a match of more than this fraction of the request text goes to the worker
    /// that has it. Default 0.3.
    #[arg(long)]
    pub cache_threshold: Option<f64>,
    /// cache_aware: load is imbalanced when max − min requests in flight exceed this (and the
    /// relative threshold holds); then the least loaded worker is chosen. Default 64.
    #[arg(long)]
    pub balance_abs_threshold: Option<usize>,
    /// cache_aware: ... and max in flight exceeds min × this. Default 1.5.
    #[arg(long)]
    pub balance_rel_threshold: Option<f64>,
    /// cache_aware: how often the tree is trimmed to `max_tree_size`. Default 60 s.
    #[arg(long)]
    pub eviction_interval_secs: Option<f64>,
    /// cache_aware: characters of request text kept per worker. Default 2^26.
    #[arg(long)]
    pub max_tree_size: Option<usize>,
    /// `manual` policy: how a new routing key gets its worker (`random`, `min_load`,
    /// `min_group`). Default `random`.
    #[arg(long, value_enum)]
    pub assignment_mode: Option<AssignmentMode>,
    /// `manual` policy: seconds after which an idle routing key is forgotten. Default 14400.
    #[arg(long)]
    pub max_idle_secs: Option<f64>,
    /// `bucket` policy: seconds between adjustments of the length buckets to the requests of
    /// the last interval. Default 5.
    #[arg(long)]
    pub bucket_adjust_interval_secs: Option<f64>,
    /// `predicted_ttft` policy: seconds after which an idle session (`X-Session-Id` or
    /// `X-SMG-Routing-Key`) no longer counts its last turn as held on its worker. Default 600.
    #[arg(long)]
    pub session_idle_secs: Option<f64>,
    /// `prefix_hash` policy: tokens of the prompt's head that are hashed (without token ids,
    /// four bytes of text a token). Default 256.
    #[arg(long)]
    pub prefix_token_count: Option<usize>,
    /// `prefix_hash` policy: a worker with more than this times the average load gives way
    /// to the least loaded. Default 1.25.
    #[arg(long)]
    pub prefix_hash_load_factor: Option<f64>,
    /// `precise_prefix`: follow the pool master's KV events at this PUB endpoint
    /// (`tcp://host:port`); what the pool holds counts for every engine. Default: none.
    #[arg(long)]
    pub kv_events_pool_endpoint: Option<String>,
    /// `precise_prefix`: the pool master's KV event replay endpoint, to fill gaps. Default:
    /// none.
    #[arg(long)]
    pub kv_events_pool_replay_endpoint: Option<String>,
    /// `precise_prefix`: the pool master's admin URL (`http://host:port`), asked at start for
    /// a snapshot of every page on its event stream. Default: none.
    #[arg(long)]
    pub kv_events_pool_snapshot_url: Option<String>,
    /// `precise_prefix`: the pool's cluster secret, sent with the snapshot request. Default:
    /// none.
    #[arg(long, env = "RBGCTL_AUTH_TOKEN_FILE")]
    pub kv_events_pool_auth_token_file: Option<std::path::PathBuf>,
}

/// The router's retry flags.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, clap::Args, Serialize)]
#[command(next_help_heading = "Retries")]
pub struct RetryArgs {
    /// Tries of a request on another worker after a retryable failure (408, 429, 5xx, no
    /// connection). Default 5.
    #[arg(long)]
    pub retry_max_retries: Option<u32>,
    /// Wait before the first retry, in ms. Default 50.
    #[arg(long)]
    pub retry_initial_backoff_ms: Option<u64>,
    /// Longest wait between retries, in ms. Default 30000.
    #[arg(long)]
    pub retry_max_backoff_ms: Option<u64>,
    /// Each retry waits this many times longer than the one before. Default 1.5.
    #[arg(long)]
    pub retry_backoff_multiplier: Option<f64>,
    /// Waits move by up to ± this fraction at random. Default 0.2.
    #[arg(long)]
    pub retry_jitter_factor: Option<f64>,
    /// No retries at all. Default false.
    #[arg(long)]
    #[serde(skip_serializing_if = "crate::config::is_false")]
    pub disable_retries: bool,
}

/// The router's circuit-breaker flags.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, clap::Args, Serialize)]
#[command(next_help_heading = "Circuit breakers")]
pub struct BreakerArgs {
    /// Consecutive failures that open a worker's circuit. Default 10.
    #[arg(long)]
    pub cb_failure_threshold: Option<u32>,
    /// Consecutive successes in half-open that close it. Default 3.
    #[arg(long)]
    pub cb_success_threshold: Option<u32>,
    /// Open → half-open after this. Default 60 s.
    #[arg(long)]
    pub cb_timeout_duration_secs: Option<f64>,
    /// Accepted for compatibility (sglang-router validates but does not use it). Default 120.
    #[arg(long)]
    pub cb_window_duration_secs: Option<f64>,
    /// No circuit breakers. Default false.
    #[arg(long)]
    #[serde(skip_serializing_if = "crate::config::is_false")]
    pub disable_circuit_breaker: bool,
}

/// The router's health-check flags.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, clap::Args, Serialize)]
#[command(next_help_heading = "Health checks")]
pub struct HealthArgs {
    /// Failed health checks in a row that take a worker out. Default 3.
    #[arg(long)]
    pub health_failure_threshold: Option<u32>,
    /// Passed health checks in a row that bring it back. Default 2.
    #[arg(long)]
    pub health_success_threshold: Option<u32>,
    /// Longest wait for one health check, in seconds. Default 5.
    #[arg(long)]
    pub health_check_timeout_secs: Option<f64>,
    /// Seconds between health checks of a worker. Default 60.
    #[arg(long)]
    pub health_check_interval_secs: Option<f64>,
    /// The path health checks ask. Default `/health`.
    #[arg(long)]
    pub health_check_endpoint: Option<String>,
    /// No health checks (every worker counts as healthy). Default false.
    #[arg(long)]
    #[serde(skip_serializing_if = "crate::config::is_false")]
    pub disable_health_check: bool,
    /// Workers given at start must answer their health check within this many seconds, else
    /// the router exits naming them. Default 1800.
    #[arg(long)]
    pub worker_startup_timeout_secs: Option<f64>,
    /// Seconds between checks of those workers until they answer. Default 30.
    #[arg(long)]
    pub worker_startup_check_interval: Option<f64>,
}

/// The router's prefill/decode disaggregation flags.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, clap::Args, Serialize)]
#[command(next_help_heading = "Prefill/decode disaggregation")]
pub struct PdArgs {
    /// Prefill/decode disaggregation. Default false.
    #[arg(long)]
    #[serde(skip_serializing_if = "crate::config::is_false")]
    pub pd_disaggregation: bool,
    /// A prefill worker and, optionally, its bootstrap port (or `none`). Repeatable. Default: none.
    #[arg(long, num_args = 1..=2, value_names = ["URL", "BOOTSTRAP_PORT"], action = clap::ArgAction::Append)]
    #[serde(skip)]
    pub prefill: Vec<String>,
    /// A decode worker. Repeatable. Default: none.
    #[arg(long, action = clap::ArgAction::Append)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub decode: Vec<String>,
    /// vLLM PD: the engines' KV connector (`mooncake` or `nixl`). Default `mooncake`.
    #[arg(long, value_enum)]
    pub vllm_kv_connector: Option<Connector>,
    /// vLLM PD with Mooncake: `concurrent` legs (as vLLM's Mooncake proxy) or `sequential`
    /// (decode after prefill answered). Default `concurrent`.
    #[arg(long, value_enum)]
    pub vllm_pd_legs: Option<Legs>,
    /// vLLM PD with Mooncake: prefill engines' bootstrap port (`GET /query`). Default 8998.
    #[arg(long)]
    pub vllm_bootstrap_port: Option<u16>,
    /// vLLM's disaggregation proxy flags: prefill hosts (`name` or `http://name`), paired in
    /// order with `--prefiller-ports`. They imply `--pd-disaggregation --backend vllm` and port
    /// 8000 unless `--port` is given. Default: none.
    #[arg(long, visible_alias = "prefiller-hosts", num_args = 1..)]
    #[serde(skip)]
    pub prefiller_host: Vec<String>,
    /// Ports of `--prefiller-host` (one for all, or one each). Default 8000.
    #[arg(long, visible_alias = "prefiller-ports", num_args = 1..)]
    #[serde(skip)]
    pub prefiller_port: Vec<u16>,
    /// Decode hosts, as `--prefiller-host`. Default: none.
    #[arg(long, visible_alias = "decoder-hosts", num_args = 1..)]
    #[serde(skip)]
    pub decoder_host: Vec<String>,
    /// Ports of `--decoder-host` (one for all, or one each). Default 8000.
    #[arg(long, visible_alias = "decoder-ports", num_args = 1..)]
    #[serde(skip)]
    pub decoder_port: Vec<u16>,
}

/// The router's worker-discovery flags.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, clap::Args, Serialize)]
#[command(next_help_heading = "Discovery")]
pub struct DiscoveryArgs {
    /// Discover workers from Kubernetes pods (Running and Ready) matching `selector`.
    #[arg(long)]
    #[serde(skip_serializing_if = "crate::config::is_false")]
    pub service_discovery: bool,
    /// `key=value` labels a regular worker pod must carry. Default: none.
    #[arg(long, num_args = 1..)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub selector: Vec<String>,
    /// `key=value` labels a prefill worker pod must carry (PD). Default: none.
    #[arg(long, num_args = 1..)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub prefill_selector: Vec<String>,
    /// `key=value` labels a decode worker pod must carry (PD). Default: none.
    #[arg(long, num_args = 1..)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub decode_selector: Vec<String>,
    /// Port of discovered pods' HTTP server. Default 80.
    #[arg(long)]
    pub service_discovery_port: Option<u16>,
    /// Namespace to watch; all namespaces when unset. Default: all namespaces.
    #[arg(long)]
    pub service_discovery_namespace: Option<String>,
    /// RBG discovery file, usually /etc/rbg/config.yaml. Default: none.
    #[arg(long)]
    pub rbg_config: Option<PathBuf>,
    /// Role of the regular workers in the RBG discovery file. Default: none.
    #[arg(long)]
    pub rbg_role: Option<String>,
    /// Roles of prefill and decode workers in the RBG discovery file (PD). Default: none.
    #[arg(long)]
    pub rbg_prefill_role: Option<String>,
    /// Role of the decode workers in the RBG discovery file (PD). Default: none.
    #[arg(long)]
    pub rbg_decode_role: Option<String>,
    /// Port name (as in `servicePorts`, lower case, `-` → `_`) of the workers' HTTP server;
    /// when unset the role's only port, else `http`, else the first by name. Default: the role's only port, else `http`, else the first by name.
    #[arg(long)]
    pub rbg_port_name: Option<String>,
    /// Port name of the prefill workers' bootstrap server (PD). Unset: `bootstrap_port` null. Default: none.
    #[arg(long)]
    pub rbg_bootstrap_port_name: Option<String>,
    /// How often the RBG discovery file is re-read. Default 2 s.
    #[arg(long)]
    pub rbg_poll_secs: Option<f64>,
}

/// The router's TLS flags.
#[serde_with::skip_serializing_none]
#[derive(Clone, Debug, Default, clap::Args, Serialize)]
#[command(next_help_heading = "TLS")]
pub struct TlsArgs {
    /// Serve HTTPS with this PEM certificate chain (needs --tls-key-path). Default: none
    /// (plain HTTP).
    #[arg(long)]
    pub tls_cert_path: Option<PathBuf>,
    /// PEM private key of --tls-cert-path. Default: none.
    #[arg(long)]
    pub tls_key_path: Option<PathBuf>,
    /// PEM CA certificates trusted for https:// workers, beside the public web's roots.
    /// Default: none.
    #[arg(long, num_args = 1..)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ca_cert_paths: Vec<PathBuf>,
    /// PEM certificate presented to https:// workers (mutual TLS; needs --client-key-path).
    /// Default: none.
    #[arg(long)]
    pub client_cert_path: Option<PathBuf>,
    /// PEM private key of --client-cert-path. Default: none.
    #[arg(long)]
    pub client_key_path: Option<PathBuf>,
}

/// Splits the values of every `--prefill URL [PORT|none]` into one group per URL: a value
/// without a `:` (a port, `none`, or a mistake; never a `host:port` URL) belongs to the URL
/// before it.
fn group_prefill(values: &[String]) -> Vec<Vec<String>> {
    let mut groups: Vec<Vec<String>> = Vec::new();
    for v in values {
        let is_port = !v.contains(':');
        match groups.last_mut() {
            Some(g) if is_port && g.len() == 1 => g.push(v.clone()),
            _ => groups.push(vec![v.clone()]),
        }
    }
    groups
}

/// Parses one `--prefill URL [PORT|none]` occurrence.
fn prefill_spec(values: &[String]) -> Result<PrefillSpec, ConfigError> {
    let url = values
        .first()
        .ok_or_else(|| ConfigError::invalid("router.prefill", "expected URL [BOOTSTRAP_PORT]"))?;
    let bootstrap_port = match values.get(1).map(|s| s.trim()) {
        None => None,
        Some(p) if p.eq_ignore_ascii_case("none") => None,
        Some(p) => Some(u16::from_str(p).map_err(|_| {
            ConfigError::invalid(
                "router.prefill",
                format!("bootstrap port of {url}: expected a port or `none`, got {p:?}"),
            )
        })?),
    };
    Ok(PrefillSpec {
        url: url.clone(),
        bootstrap_port,
    })
}

impl RouterArgs {
    /// Layers the file, then these flags, over the defaults, and validates the result.
    pub fn resolve(&self) -> Result<RouterConfig, ConfigError> {
        let mut c: RouterConfig = layered(self.config.as_deref(), self)?;
        let pd = &self.pd;
        if !pd.prefill.is_empty() {
            c.pd.prefill = group_prefill(&pd.prefill)
                .iter()
                .map(|v| prefill_spec(v))
                .collect::<Result<_, _>>()?;
        }
        if !pd.prefiller_host.is_empty() || !pd.decoder_host.is_empty() {
            // vLLM's proxy flags: its mode, and its port unless one is given.
            let urls = |hosts: &[String], ports: &[u16], field: &'static str| {
                paired_urls(hosts, ports, field)
            };
            c.pd.prefill.extend(
                urls(&pd.prefiller_host, &pd.prefiller_port, "--prefiller-port")?
                    .into_iter()
                    .map(|url| PrefillSpec {
                        url,
                        bootstrap_port: None,
                    }),
            );
            c.pd.decode
                .extend(urls(&pd.decoder_host, &pd.decoder_port, "--decoder-port")?);
            c.pd.enabled = true;
            if self.server.backend.is_none() {
                c.server.backend = Backend::Vllm;
            }
            if self.server.port.is_none() && self.config.is_none() {
                c.server.port = 8000;
            }
        }
        c.validate()?;
        Ok(c)
    }
}

/// `http://host:port` for each host, with its port (one port for all, one each, or 8000).
fn paired_urls(
    hosts: &[String],
    ports: &[u16],
    field: &'static str,
) -> Result<Vec<String>, ConfigError> {
    let port = |i: usize| match ports.len() {
        0 => Ok(8000),
        1 => Ok(ports[0]),
        n if n == hosts.len() => Ok(ports[i]),
        n => Err(ConfigError::invalid(
            field,
            format!(
                "{n} ports for {} hosts: give one port for all, or one per host",
                hosts.len()
            ),
        )),
    };
    hosts
        .iter()
        .enumerate()
        .map(|(i, h)| Ok(vllm::worker_url(h, port(i)?)))
        .collect()
}

/// Who may use the control plane.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControlRole {
    /// May change workers.
    Admin,
    /// May read them.
    User,
}

/// One `--control-plane-api-keys` entry: `id:name:role:key`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControlKey {
    pub id: String,
    pub name: String,
    pub role: ControlRole,
    pub key: String,
}

impl ControlKey {
    /// Reads `id:name:role:key` (the key may hold `:`); the error says what is wrong, never
    /// the key.
    pub fn parse(s: &str) -> Result<ControlKey, String> {
        let mut parts = s.splitn(4, ':');
        let (Some(id), Some(name), Some(role), Some(key)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err("an entry is not id:name:role:key".into());
        };
        let role = match role.trim().to_ascii_lowercase().as_str() {
            "admin" => ControlRole::Admin,
            "user" => ControlRole::User,
            other => {
                return Err(format!(
                    "key {id:?}: role {other:?} is neither admin nor user"
                ))
            }
        };
        if key.is_empty() {
            return Err(format!("key {id:?}: the key is empty"));
        }
        Ok(ControlKey {
            id: id.into(),
            name: name.into(),
            role,
            key: key.into(),
        })
    }
}

/// How the router's threads share the work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum RuntimeKind {
    /// A single-threaded runtime per thread. One listener: the thread that accepts hands each
    /// connection to the thread with the fewest, which serves it from then on with its own
    /// keep-alive connections to the workers, so that a request never crosses a thread.
    #[default]
    ThreadPerCore,
    /// One runtime whose threads take each other's tasks: a request may move between threads
    /// (a wake-up and a hand-off each time), but a thread that falls behind is helped.
    WorkStealing,
}

/// The engines' API.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// SGLang: `/generate` and OpenAI routes; PD through bootstrap fields.
    #[default]
    Sglang,
    /// vLLM: OpenAI routes; PD through `kv_transfer_params`.
    Vllm,
    /// Any OpenAI-compatible upstream (a provider's API, another gateway): OpenAI routes
    /// only, health through `/v1/models`, requests routed to the upstream serving their
    /// `model`.
    Openai,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sglang => "sglang",
            Backend::Vllm => "vllm",
            Backend::Openai => "openai",
        }
    }
}

/// A concurrency bound as the router takes it: positive, or −1 for none.
pub fn check_max_concurrent(field: &'static str, v: i64) -> Result<(), ConfigError> {
    if v < -1 || v == 0 {
        return Err(ConfigError::invalid(
            field,
            format!("must be positive, or -1 for no limit; got {v}"),
        ));
    }
    Ok(())
}

impl RouterConfig {
    /// Checks ranges and combinations; every error names the field.
    pub fn validate(&mut self) -> Result<(), ConfigError> {
        let (server, pd, discovery) = (&mut self.server, &mut self.pd, &self.discovery);
        if server.backend == Backend::Openai {
            if pd.enabled {
                return Err(ConfigError::invalid(
                    "router.backend",
                    "openai: an OpenAI-compatible upstream has no prefill/decode split; \
                     drop --pd-disaggregation or use --backend sglang|vllm",
                ));
            }
            // OpenAI-compatible servers have no /health; their model list answers instead.
            if self.health.endpoint == "/health" {
                self.health.endpoint = "/v1/models".into();
            }
        }
        let tls = &self.tls;
        check_pair(
            ("router.tls_cert_path", tls.cert_path.is_some()),
            ("router.tls_key_path", tls.key_path.is_some()),
        )?;
        check_pair(
            ("router.client_cert_path", tls.client_cert_path.is_some()),
            ("router.client_key_path", tls.client_key_path.is_some()),
        )?;
        let pol = &self.policy;
        for (field, set) in [
            (
                "router.kv_events_pool_replay_endpoint",
                pol.kv_events_pool_replay_endpoint.is_some(),
            ),
            (
                "router.kv_events_pool_snapshot_url",
                pol.kv_events_pool_snapshot_url.is_some(),
            ),
        ] {
            if set && pol.kv_events_pool_endpoint.is_none() {
                return Err(ConfigError::invalid(
                    field,
                    "needs kv_events_pool_endpoint (the pool master's PUB endpoint)",
                ));
            }
        }
        let follows = [Some(pol.policy), pol.prefill_policy, pol.decode_policy]
            .iter()
            .flatten()
            .any(|k| k.follows_kv_events());
        if pol.kv_events_pool_endpoint.is_some() && !follows {
            return Err(ConfigError::invalid(
                "router.kv_events_pool_endpoint",
                "only precise_prefix and predicted_ttft route on KV events: set --policy to one \
                 of them, or drop it",
            ));
        }
        let cache = &self.cache;
        if !(0.0..=1.0).contains(&cache.cache_threshold) {
            return Err(ConfigError::invalid(
                "router.cache_threshold",
                format!("must be in [0, 1], got {}", cache.cache_threshold),
            ));
        }
        if !(cache.balance_rel_threshold.is_finite() && cache.balance_rel_threshold >= 1.0) {
            return Err(ConfigError::invalid(
                "router.balance_rel_threshold",
                format!("must be at least 1, got {}", cache.balance_rel_threshold),
            ));
        }
        self.prefix_hash
            .check()
            .map_err(|(field, why)| ConfigError::invalid(field, why))?;
        let retry = &self.retry;
        if !(retry.multiplier.is_finite() && retry.multiplier >= 1.0) {
            return Err(ConfigError::invalid(
                "router.retry_backoff_multiplier",
                format!("must be at least 1, got {}", retry.multiplier),
            ));
        }
        if !(0.0..=1.0).contains(&retry.jitter) {
            return Err(ConfigError::invalid(
                "router.retry_jitter_factor",
                format!("must be in [0, 1], got {}", retry.jitter),
            ));
        }
        let tenants = &self.tenants;
        if tenants.tenant_limits_replicas == 0 {
            return Err(ConfigError::invalid(
                "router.tenant_limits_replicas",
                "must be at least 1",
            ));
        }
        match (
            &tenants.tenant_header,
            tenants.tenant_header_trusted_from.is_empty(),
        ) {
            (Some(h), false) => {
                if http::HeaderName::from_bytes(h.as_bytes()).is_err() {
                    return Err(ConfigError::invalid(
                        "router.tenant_header",
                        format!("{h:?} is not a header name"),
                    ));
                }
            }
            (Some(_), true) => {
                return Err(ConfigError::invalid(
                    "router.tenant_header",
                    "needs tenant_header_trusted_from: the addresses of the front that sets \
                     it (anyone else could name any tenant)",
                ))
            }
            (None, false) => {
                return Err(ConfigError::invalid(
                    "router.tenant_header_trusted_from",
                    "needs tenant_header",
                ))
            }
            (None, true) => {}
        }
        if tenants.tenant_header.is_some() && tenants.tenants_file.is_none() {
            return Err(ConfigError::invalid(
                "router.tenant_header",
                "needs tenants_file (the tenants it may name)",
            ));
        }
        for c in &tenants.tenant_header_trusted_from {
            c.parse::<super::tenants::Cidr>()
                .map_err(|e| ConfigError::invalid("router.tenant_header_trusted_from", e))?;
        }
        for k in &server.control_plane_api_keys {
            ControlKey::parse(k)
                .map_err(|e| ConfigError::invalid("router.control_plane_api_keys", e))?;
        }
        let limits = &self.limits;
        if let Some(r) = limits.rate_limit_tokens_per_second {
            if !(r.is_finite() && r > 0.0) {
                return Err(ConfigError::invalid(
                    "router.rate_limit_tokens_per_second",
                    format!("must be a positive rate, got {r}"),
                ));
            }
        }
        check_max_concurrent(
            "router.max_concurrent_requests",
            limits.max_concurrent_requests,
        )?;
        if server.runtime_threads == Some(0) {
            return Err(ConfigError::invalid(
                "router.runtime_threads",
                format!(
                    "must be at least 1 (leave it out for one per core, at most \
                     {DEFAULT_MAX_THREADS})"
                ),
            ));
        }
        let b = &self.metrics.prometheus_duration_buckets;
        if b.iter().any(|x| !(x.is_finite() && *x > 0.0)) || b.windows(2).any(|w| w[0] >= w[1]) {
            return Err(ConfigError::invalid(
                "router.prometheus_duration_buckets",
                format!("must be positive seconds in increasing order, got {b:?}"),
            ));
        }
        // Every duration is finite and not negative once read (config::Secs); these must
        // also be more than 0.
        let (health, breaker) = (&self.health, &self.breaker);
        for (field, d) in [
            ("router.max_idle_secs", self.manual.max_idle),
            (
                "router.bucket_adjust_interval_secs",
                self.policy.bucket_adjust_interval,
            ),
            ("router.session_idle_secs", self.policy.session_idle),
            ("router.eviction_interval_secs", cache.eviction_interval),
            ("router.rbg_poll_secs", discovery.rbg_poll),
            ("router.request_timeout_secs", limits.request_timeout),
            ("router.queue_timeout_secs", limits.queue_timeout),
            ("router.cb_timeout_duration_secs", breaker.timeout),
            ("router.cb_window_duration_secs", breaker.window),
            ("router.health_check_timeout_secs", health.timeout),
            ("router.health_check_interval_secs", health.interval),
            ("router.worker_startup_timeout_secs", health.startup_timeout),
            (
                "router.worker_startup_check_interval",
                health.startup_check_interval,
            ),
        ] {
            if d.is_zero() {
                return Err(ConfigError::invalid(field, "must be more than 0"));
            }
        }
        for (field, v) in [
            ("router.cb_failure_threshold", breaker.failure_threshold),
            ("router.cb_success_threshold", breaker.success_threshold),
            ("router.health_failure_threshold", health.failure_threshold),
            ("router.health_success_threshold", health.success_threshold),
        ] {
            if v == 0 {
                return Err(ConfigError::invalid(field, "must be at least 1"));
            }
        }
        if !health.endpoint.starts_with('/') {
            return Err(ConfigError::invalid(
                "router.health_check_endpoint",
                format!("must start with '/', got {:?}", health.endpoint),
            ));
        }
        for u in &mut server.worker_urls {
            *u = normalize_url("router.worker_urls", u)?;
        }
        for p in &mut pd.prefill {
            p.url = normalize_url("router.prefill", &p.url)?;
        }
        for u in &mut pd.decode {
            *u = normalize_url("router.decode", u)?;
        }
        parse_selector("router.selector", &discovery.selector)?;
        parse_selector("router.prefill_selector", &discovery.prefill_selector)?;
        parse_selector("router.decode_selector", &discovery.decode_selector)?;
        if pd.enabled {
            if !server.worker_urls.is_empty() {
                return Err(ConfigError::invalid(
                    "router.worker_urls",
                    "with --pd-disaggregation, give workers as --prefill and --decode",
                ));
            }
            if discovery.rbg_config.is_some()
                && (discovery.rbg_prefill_role.is_none() || discovery.rbg_decode_role.is_none())
            {
                return Err(ConfigError::invalid(
                    "router.rbg_prefill_role",
                    "PD discovery from the RBG file needs --rbg-prefill-role and --rbg-decode-role",
                ));
            }
        } else {
            if !pd.prefill.is_empty() || !pd.decode.is_empty() {
                return Err(ConfigError::invalid(
                    "router.prefill",
                    "--prefill/--decode need --pd-disaggregation",
                ));
            }
            if discovery.rbg_config.is_some() && discovery.rbg_role.is_none() {
                return Err(ConfigError::invalid(
                    "router.rbg_role",
                    "--rbg-config needs --rbg-role (the role whose instances are workers)",
                ));
            }
        }
        if discovery.kubernetes
            && discovery.selector.is_empty()
            && discovery.prefill_selector.is_empty()
            && discovery.decode_selector.is_empty()
        {
            return Err(ConfigError::invalid(
                "router.selector",
                "--service-discovery needs --selector (or --prefill-selector/--decode-selector)",
            ));
        }
        if let Some(k) = &server.api_key {
            if k.is_empty() {
                return Err(ConfigError::invalid("router.api_key", "must not be empty"));
            }
        }
        Ok(())
    }

    pub fn prefill_policy(&self) -> PolicyKind {
        self.policy.prefill_policy.unwrap_or(self.policy.policy)
    }

    pub fn decode_policy(&self) -> PolicyKind {
        self.policy.decode_policy.unwrap_or(self.policy.policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        args: RouterArgs,
    }

    /// Every flag but those resolved by hand names a setting of the config: the shared
    /// layering rule would refuse it the moment it is given.
    #[test]
    fn every_flag_names_a_setting() {
        let by_hand = [
            "config",
            "prefill",
            "prefiller_host",
            "prefiller_port",
            "decoder_host",
            "decoder_port",
        ];
        let checked =
            crate::config::check_flags_name_settings::<RouterArgs, RouterConfig>(&by_hand, &[]);
        assert!(checked > 70, "{checked}");
    }

    fn resolve(line: &str) -> Result<RouterConfig, ConfigError> {
        let argv = std::iter::once("router").chain(line.split_whitespace());
        Cmd::try_parse_from(argv)
            .expect("flags parse")
            .args
            .resolve()
    }

    #[test]
    fn control_plane_keys_read_as_sglang_router_writes_them() {
        let k = ControlKey::parse("k1:CI:admin:s3cr:et").unwrap();
        assert_eq!(
            (k.id.as_str(), k.role, k.key.as_str()),
            ("k1", ControlRole::Admin, "s3cr:et")
        );
        assert_eq!(
            ControlKey::parse("k2:ro:USER:x").unwrap().role,
            ControlRole::User
        );
        let e = ControlKey::parse("k3:x:root:secret").unwrap_err();
        assert!(e.contains("root") && !e.contains("secret"), "{e}");
        assert!(ControlKey::parse("k4:x:admin").is_err());
        assert!(ControlKey::parse("k5:x:admin:").is_err());
    }

    #[test]
    fn sglang_router_launch_lines_parse() {
        let c = resolve(
            "--pd-disaggregation --prefill http://10.0.0.1:30000 8998 --prefill 10.0.0.2:30000 none \
             --prefill http://10.0.0.3:30000 --decode http://10.0.0.4:30000 --decode http://10.0.0.5:30000/ \
             --prefill-policy cache_aware --decode-policy round_robin --host 127.0.0.1 --port 8000",
        )
        .unwrap();
        assert!(c.pd.enabled);
        assert_eq!(
            c.pd.prefill,
            vec![
                PrefillSpec {
                    url: "http://10.0.0.1:30000".into(),
                    bootstrap_port: Some(8998)
                },
                PrefillSpec {
                    url: "http://10.0.0.2:30000".into(),
                    bootstrap_port: None
                },
                PrefillSpec {
                    url: "http://10.0.0.3:30000".into(),
                    bootstrap_port: None
                },
            ]
        );
        assert_eq!(
            c.pd.decode,
            ["http://10.0.0.4:30000", "http://10.0.0.5:30000"]
        );
        assert_eq!(c.prefill_policy(), PolicyKind::CacheAware);
        assert_eq!(c.decode_policy(), PolicyKind::RoundRobin);

        let c = resolve("--worker-urls http://a:1 http://b:2 --policy power_of_two").unwrap();
        assert_eq!(c.server.worker_urls.len(), 2);
        assert_eq!(c.policy.policy, PolicyKind::PowerOfTwo);
        assert_eq!(c.cache.cache_threshold, 0.3);
        assert_eq!(c.cache.balance_abs_threshold, 64);
        assert_eq!(c.cache.max_tree_size, 1 << 26);
        assert_eq!(c.server.port, 30000);
    }

    /// The file keeps sglang-router's flat names while the settings are read in sections: a
    /// misspelt key and a mistyped value are refused, naming the key and its line; a flag
    /// wins over the file.
    #[test]
    fn a_flat_file_fills_the_sections_and_its_mistakes_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = |text: &str| {
            let path = dir.path().join("router.toml");
            std::fs::write(&path, text).unwrap();
            path.display().to_string()
        };
        let path = file(
            "port = 8001\nretry_max_retries = 2\ncb_timeout_duration_secs = \"90s\"\n\
             health_check_interval_secs = 0.5\ndisable_circuit_breaker = true\n",
        );
        let c = resolve(&format!("--config {path} --retry-max-retries 7")).unwrap();
        assert_eq!(c.server.port, 8001);
        assert_eq!(c.retry.max_retries, 7, "the flag wins over the file");
        assert_eq!(c.breaker.timeout.0, Duration::from_secs(90));
        assert!(c.breaker.disabled);
        assert_eq!(c.health.interval.0, Duration::from_millis(500));

        let path = file("port = 8001\n\nretry_max_retrys = 2\n");
        let e = resolve(&format!("--config {path}"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("retry_max_retrys: unknown field") && e.contains("line 3"),
            "{e}"
        );
        let path = file("port = 8001\ncache_threshold = \"high\"\n");
        let e = resolve(&format!("--config {path}"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cache_threshold: invalid type") && e.contains("line 2"),
            "{e}"
        );
        let e = resolve("--cb-timeout-duration-secs=-1")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cb_timeout_duration_secs") && e.contains("not a duration"),
            "{e}"
        );
        let e = resolve("--queue-timeout-secs 0").unwrap_err().to_string();
        assert!(e.contains("router.queue_timeout_secs"), "{e}");
    }

    #[test]
    fn bad_values_name_the_field() {
        let e = resolve("--prefill http://a:1 abc --pd-disaggregation").unwrap_err();
        assert!(e.to_string().contains("router.prefill"), "{e}");
        let e = resolve("--worker-urls grpc://a:1").unwrap_err();
        assert!(e.to_string().contains("only http:// and https://"), "{e}");
        let e = resolve("--backend openai --pd-disaggregation --prefill http://a:1").unwrap_err();
        assert!(e.to_string().contains("router.backend"), "{e}");
        let e = resolve("--client-key-path k.pem").unwrap_err();
        assert!(e.to_string().contains("router.client_cert_path"), "{e}");
        let e = resolve("--cache-threshold 1.5").unwrap_err();
        assert!(e.to_string().contains("router.cache_threshold"), "{e}");
        let e = resolve("--decode http://a:1").unwrap_err();
        assert!(e.to_string().contains("--pd-disaggregation"), "{e}");
        let e = resolve("--max-concurrent-requests 0").unwrap_err();
        assert!(
            e.to_string().contains("router.max_concurrent_requests"),
            "{e}"
        );
        let e = resolve("--service-discovery").unwrap_err();
        assert!(e.to_string().contains("--selector"), "{e}");
        let e = resolve("--selector app").unwrap_err();
        assert!(e.to_string().contains("key=value"), "{e}");
    }
}

#[cfg(test)]
mod example_file {
    #[test]
    fn the_example_config_parses() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/router.toml");
        let mut c: super::RouterConfig = crate::config::load_toml(&path).unwrap();
        c.validate().unwrap();
        assert_eq!(c.server.worker_urls.len(), 2);
    }
}
