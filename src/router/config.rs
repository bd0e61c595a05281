//! `rbgctl router` configuration. Flags are named as in sglang-router 0.3.2 (`--worker-urls`,
//! `--policy`, `--cache-threshold`, `--pd-disaggregation --prefill URL [PORT] --decode URL`, ...)
//! with the same defaults, so an existing launch line works unchanged. Precedence: flag > TOML
//! file (`--config`) > the defaults documented on each field. Example: `config/router.toml`.

use super::policy::{
    CacheAwareArgs, CacheAwareConfig, ManualArgs, ManualConfig, PolicyKind, PrefixHashArgs,
    PrefixHashConfig,
};
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

crate::config::settings::settings! {
    /// Where the router listens, what it serves, and who may call it.
    #[derive(Clone, Debug, Deserialize, Serialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct ServerConfig;

    /// The router's listener flags.
    #[serde_with::skip_serializing_none]
    #[derive(Clone, Debug, Default, clap::Args, Serialize)]
    #[command(next_help_heading = "Server")]
    pub struct ServerArgs {}

    settings {
        /// Address the service listens on (as sglang-router).
        #[arg(long)]
        host: String = "0.0.0.0".into();
        /// The service port.
        #[arg(long)]
        port: u16 = 30000;
        /// Workers of a regular (not disaggregated) deployment (`http://host:port`). Default:
        /// none.
        #[arg(long)]
        worker_urls: Vec<String> = Vec::new();
        /// The engines' API: `sglang` (bootstrap fields in the request) or `vllm` (OpenAI
        /// routes; in PD, vLLM's `kv_transfer_params` contract); `vllm` with the
        /// `--prefiller-host` family.
        #[arg(long)]
        backend: Backend = Backend::Sglang;
        /// Each worker's data-parallel ranks (its `/get_server_info` `dp_size`) become workers
        /// of their own, `URL@rank`; requests carry `data_parallel_rank`.
        #[arg(long)]
        dp_aware: bool = false;
        /// Inference gateway mode: workers of several models; a request goes to the workers
        /// serving its `model`, each model with policies of its own.
        #[arg(long)]
        enable_igw: bool = false;
        /// Clients must send `Authorization: Bearer <key>` to inference and admin routes.
        /// Default: none (no key asked).
        #[arg(long, env = "RBGCTL_ROUTER_API_KEY")]
        api_key: Option<String> = None;
        /// Keys for the control plane (worker management, cache flush, loads), as
        /// sglang-router writes them: `id:name:role:key`, role `admin` (may change workers) or
        /// `user` (may read). When set, those routes take these keys instead of `api_key`.
        /// Default: none.
        #[arg(long, num_args = 0..)]
        control_plane_api_keys: Vec<String> = Vec::new();
        /// Browser origins allowed to call the router (CORS), e.g. `https://ui.example.com`.
        /// Default: none listed, which allows any origin (as sglang-router).
        #[arg(long, num_args = 0..)]
        cors_allowed_origins: Vec<String> = Vec::new();
        /// Headers a request id is taken from, first match wins.
        #[arg(long)]
        request_id_headers: Vec<String> =
            ["x-request-id", "x-correlation-id", "x-trace-id", "request-id"]
                .map(String::from)
                .to_vec();
        /// On SIGTERM, how long requests in flight may take to finish (as sglang-router).
        #[arg(id = "shutdown_grace_period_secs", long = "shutdown-grace-period-secs")]
        #[serde(rename = "shutdown_grace_period_secs")]
        shutdown_grace_period: Secs = Secs::from_secs(180);
        /// Threads serving the API. Default: one per core, at most 4 (one thread serves tens
        /// of thousands of requests a second; more threads each wake up for fewer requests,
        /// and spend more CPU per request).
        #[arg(long)]
        runtime_threads: Option<usize> = None;
        /// How the threads share the work: `thread_per_core` (each thread serves the
        /// connections it is handed, with its own connections to the workers: a request never
        /// crosses a thread) or `work_stealing` (one runtime whose threads take each other's
        /// tasks).
        #[arg(long)]
        runtime: RuntimeKind = RuntimeKind::ThreadPerCore;
        /// Also write the log to daily files `rbgctl-router.YYYY-MM-DD` in this folder.
        /// Default: none (standard error only).
        #[arg(long)]
        log_dir: Option<PathBuf> = None;
        /// A local `tokenizer.json` (or a directory holding one): `/v1/tokenize`,
        /// `/v1/detokenize`, and cache-aware matching by token. Never downloaded. Default: none
        /// (routing on text).
        #[arg(long)]
        tokenizer_path: Option<PathBuf> = None;
        /// sglang-router's model path: used as `tokenizer_path` when that is not given, and
        /// must then be a local directory holding `tokenizer.json` (a hub id is refused:
        /// nothing is downloaded). Default: none.
        #[arg(long)]
        model_path: Option<PathBuf> = None;
    }
}

crate::config::settings::named_setting!(Backend, RuntimeKind, Connector, Legs);

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

crate::config::settings::settings! {
    /// What one client may hold: bodies, time, a place in the queue.
    #[derive(Clone, Debug, Deserialize, Serialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct LimitsConfig;

    /// The router's flags for request sizes, concurrency and timeouts.
    #[serde_with::skip_serializing_none]
    #[derive(Clone, Debug, Default, clap::Args, Serialize)]
    #[command(next_help_heading = "Limits")]
    pub struct LimitsArgs {}

    settings {
        /// Largest request body accepted, in bytes.
        #[arg(long)]
        max_payload_size: usize = 512 << 20;
        /// Largest body of the routes that answer from the router itself (`/query`,
        /// `/query_by_hash`, `/v1/tokenize`, `/v1/detokenize`), in bytes.
        #[arg(long)]
        max_query_payload_size: usize = 16 << 20;
        /// Bytes of request bodies received at once, all requests together; beyond it a
        /// request is answered 503. 0: a quarter of this machine's memory.
        #[arg(long)]
        max_inflight_body_bytes: usize = 0;
        /// Longest wait for a worker's response headers.
        #[arg(id = "request_timeout_secs", long = "request-timeout-secs")]
        #[serde(rename = "request_timeout_secs")]
        request_timeout: Secs = Secs::from_secs(1800);
        /// Requests proxied at once; −1 is unlimited.
        #[arg(long)]
        max_concurrent_requests: i64 = -1;
        /// Requests waiting for a slot; beyond it 429.
        #[arg(long)]
        queue_size: usize = 100;
        /// Longest wait in the queue; then 408.
        #[arg(id = "queue_timeout_secs", long = "queue-timeout-secs")]
        #[serde(rename = "queue_timeout_secs")]
        queue_timeout: Secs = Secs::from_secs(60);
        /// Requests per second admitted (a token bucket, burst `max_concurrent_requests`);
        /// requests beyond it wait in the queue. Default: none (no rate limit).
        #[arg(long)]
        rate_limit_tokens_per_second: Option<f64> = None;
    }
}

crate::config::settings::settings! {
    /// Tenants: who calls, with what keys, limits and priority classes (docs/router.md,
    /// Tenants).
    #[derive(Clone, Debug, Deserialize, Serialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct TenantsConfig;

    /// The router's tenant flags.
    #[serde_with::skip_serializing_none]
    #[derive(Clone, Debug, Default, clap::Args, Serialize)]
    #[command(next_help_heading = "Tenants")]
    pub struct TenantsArgs {}

    settings {
        /// The tenants file (API keys stored as SHA-256, per-tenant rates and concurrency,
        /// priority classes), read again when it changes; with it every inference request
        /// must name its tenant. Default: none (no tenants).
        #[arg(long, env = "RBGCTL_ROUTER_TENANTS_FILE")]
        tenants_file: Option<PathBuf> = None;
        /// A header a trusted front names the tenant in (e.g. `x-tenant`), taken only from
        /// the addresses of `tenant_header_trusted_from`. Default: none.
        #[arg(long)]
        tenant_header: Option<String> = None;
        /// Addresses (`10.0.0.0/8`, `::1`) whose requests may name their tenant in
        /// `tenant_header`; a request from elsewhere carrying it is refused (403). Default:
        /// none.
        #[arg(long)]
        tenant_header_trusted_from: Vec<String> = Vec::new();
        /// Routers sharing each tenant's traffic evenly behind one load balancer: each
        /// enforces this share of every tenant's rates and concurrency cap.
        #[arg(long)]
        tenant_limits_replicas: usize = 1;
    }
}

crate::config::settings::settings! {
    /// The separate `/metrics` listener and the duration histograms.
    #[derive(Clone, Debug, Deserialize, Serialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct MetricsConfig;

    /// The router's metrics flags.
    #[serde_with::skip_serializing_none]
    #[derive(Clone, Debug, Default, clap::Args, Serialize)]
    #[command(next_help_heading = "Metrics")]
    pub struct MetricsArgs {}

    settings {
        /// `/metrics` also on a separate listener at this address.
        #[arg(long)]
        prometheus_host: String = "0.0.0.0".into();
        /// Port of that listener (0: none, `/metrics` stays on the main port).
        #[arg(long)]
        prometheus_port: u16 = 29000;
        /// Upper bounds (seconds, increasing) of the request duration histograms. Default:
        /// none given, the built-in 0.0005 .. 60 (14 buckets).
        #[arg(long)]
        prometheus_duration_buckets: Vec<f64> = Vec::new();
    }
}

crate::config::settings::settings! {
    /// Which policy chooses a worker, per worker type.
    #[derive(Clone, Debug, Deserialize, Serialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct PolicyConfig;

    /// The router's worker-choice flags.
    #[serde_with::skip_serializing_none]
    #[derive(Clone, Debug, Default, clap::Args, Serialize)]
    #[command(next_help_heading = "Policies")]
    pub struct PolicyArgs {}

    settings {
        /// How a worker is chosen.
        #[arg(long)]
        policy: PolicyKind = PolicyKind::CacheAware;
        /// PD only. Default: `policy`.
        #[arg(long)]
        prefill_policy: Option<PolicyKind> = None;
        /// PD only. Default: `policy`.
        #[arg(long)]
        decode_policy: Option<PolicyKind> = None;
        /// `bucket` policy: time between adjustments of the length buckets to the requests of
        /// the last interval (also the window of requests they follow).
        #[arg(id = "bucket_adjust_interval_secs", long = "bucket-adjust-interval-secs")]
        #[serde(rename = "bucket_adjust_interval_secs")]
        bucket_adjust_interval: Secs = Secs::from_secs(5);
        /// `predicted_ttft` policy: a session (`X-Session-Id` or `X-SMG-Routing-Key`) idle
        /// this long no longer counts its last turn as held on its worker.
        #[arg(id = "session_idle_secs", long = "session-idle-secs")]
        #[serde(rename = "session_idle_secs")]
        session_idle: Secs = Secs::from_secs(600);
        /// `precise_prefix`: the PUB endpoint of the pool master's KV events
        /// (`tcp://host:port`, `rbgctl master --kv-events-config`); what the pool holds counts
        /// for every engine. Default: none.
        #[arg(long)]
        kv_events_pool_endpoint: Option<String> = None;
        /// `precise_prefix`: the pool master's KV event replay endpoint, to fill gaps.
        /// Default: none.
        #[arg(long)]
        kv_events_pool_replay_endpoint: Option<String> = None;
        /// `precise_prefix`: the pool master's admin URL (`http://host:port`), asked at start
        /// for a snapshot of every page on its event stream. Default: none (the pool's blocks
        /// come in as they change).
        #[arg(long)]
        kv_events_pool_snapshot_url: Option<String> = None;
        /// `precise_prefix`: the pool's cluster secret, sent to its master with the snapshot
        /// request (which needs it when the pool has one). Default: none.
        #[arg(long, env = "RBGCTL_AUTH_TOKEN_FILE")]
        kv_events_pool_auth_token_file: Option<PathBuf> = None;
    }
}

crate::config::settings::named_setting!(PolicyKind);

crate::config::settings::settings! {
    /// Retries on another worker (sglang-router's names and defaults).
    #[derive(Clone, Copy, Debug, Deserialize, Serialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct RetryConfig;

    /// The router's retry flags.
    #[serde_with::skip_serializing_none]
    #[derive(Clone, Debug, Default, clap::Args, Serialize)]
    #[command(next_help_heading = "Retries")]
    pub struct RetryArgs {}

    settings {
        /// Tries of a request on another worker after a retryable failure (408, 429, 5xx, no
        /// connection).
        #[arg(id = "retry_max_retries", long = "retry-max-retries")]
        #[serde(rename = "retry_max_retries")]
        max_retries: u32 = 5;
        /// Wait before the first retry (`50ms`, or milliseconds).
        #[arg(id = "retry_initial_backoff_ms", long = "retry-initial-backoff-ms")]
        #[serde(rename = "retry_initial_backoff_ms")]
        initial_backoff: Millis = Millis(Duration::from_millis(50));
        /// Longest wait between retries (`30s`, or milliseconds).
        #[arg(id = "retry_max_backoff_ms", long = "retry-max-backoff-ms")]
        #[serde(rename = "retry_max_backoff_ms")]
        max_backoff: Millis = Millis(Duration::from_secs(30));
        /// Each retry waits this many times longer than the one before.
        #[arg(id = "retry_backoff_multiplier", long = "retry-backoff-multiplier")]
        #[serde(rename = "retry_backoff_multiplier")]
        multiplier: f64 = 1.5;
        /// Waits move by up to ± this fraction at random.
        #[arg(id = "retry_jitter_factor", long = "retry-jitter-factor")]
        #[serde(rename = "retry_jitter_factor")]
        jitter: f64 = 0.2;
        /// No retries at all.
        #[arg(id = "disable_retries", long = "disable-retries")]
        #[serde(rename = "disable_retries")]
        disabled: bool = false;
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

crate::config::settings::settings! {
    /// Each worker's circuit breaker (sglang-router's names and defaults).
    #[derive(Clone, Copy, Debug, Deserialize, Serialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct BreakerConfig;

    /// The router's circuit-breaker flags.
    #[serde_with::skip_serializing_none]
    #[derive(Clone, Debug, Default, clap::Args, Serialize)]
    #[command(next_help_heading = "Circuit breakers")]
    pub struct BreakerArgs {}

    settings {
        /// Consecutive failures that open a worker's circuit.
        #[arg(id = "cb_failure_threshold", long = "cb-failure-threshold")]
        #[serde(rename = "cb_failure_threshold")]
        failure_threshold: u32 = 10;
        /// Consecutive successes in half-open that close it.
        #[arg(id = "cb_success_threshold", long = "cb-success-threshold")]
        #[serde(rename = "cb_success_threshold")]
        success_threshold: u32 = 3;
        /// Open → half-open after this.
        #[arg(id = "cb_timeout_duration_secs", long = "cb-timeout-duration-secs")]
        #[serde(rename = "cb_timeout_duration_secs")]
        timeout: Secs = Secs::from_secs(60);
        /// Accepted for compatibility (sglang-router validates but does not use it).
        #[arg(id = "cb_window_duration_secs", long = "cb-window-duration-secs")]
        #[serde(rename = "cb_window_duration_secs")]
        window: Secs = Secs::from_secs(120);
        /// No circuit breakers.
        #[arg(id = "disable_circuit_breaker", long = "disable-circuit-breaker")]
        #[serde(rename = "disable_circuit_breaker")]
        disabled: bool = false;
    }
}

crate::config::settings::settings! {
    /// Health checks of workers, and the wait for those given at start.
    #[derive(Clone, Debug, Deserialize, Serialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct HealthConfig;

    /// The router's health-check flags.
    #[serde_with::skip_serializing_none]
    #[derive(Clone, Debug, Default, clap::Args, Serialize)]
    #[command(next_help_heading = "Health checks")]
    pub struct HealthArgs {}

    settings {
        /// Failed health checks in a row that take a worker out.
        #[arg(id = "health_failure_threshold", long = "health-failure-threshold")]
        #[serde(rename = "health_failure_threshold")]
        failure_threshold: u32 = 3;
        /// Passed health checks in a row that bring it back.
        #[arg(id = "health_success_threshold", long = "health-success-threshold")]
        #[serde(rename = "health_success_threshold")]
        success_threshold: u32 = 2;
        /// Longest wait for one health check.
        #[arg(id = "health_check_timeout_secs", long = "health-check-timeout-secs")]
        #[serde(rename = "health_check_timeout_secs")]
        timeout: Secs = Secs::from_secs(5);
        /// Time between health checks of a worker.
        #[arg(id = "health_check_interval_secs", long = "health-check-interval-secs")]
        #[serde(rename = "health_check_interval_secs")]
        interval: Secs = Secs::from_secs(60);
        /// The path health checks ask.
        #[arg(id = "health_check_endpoint", long = "health-check-endpoint")]
        #[serde(rename = "health_check_endpoint")]
        endpoint: String = "/health".into();
        /// No health checks (every worker counts as healthy).
        #[arg(id = "disable_health_check", long = "disable-health-check")]
        #[serde(rename = "disable_health_check")]
        disabled: bool = false;
        /// Workers given at start (flags or config) must answer their health check within
        /// this long, else the router exits with an error naming them (as sglang-router).
        #[arg(id = "worker_startup_timeout_secs", long = "worker-startup-timeout-secs")]
        #[serde(rename = "worker_startup_timeout_secs")]
        startup_timeout: Secs = Secs::from_secs(1800);
        /// How often those workers are checked until they answer.
        #[arg(id = "worker_startup_check_interval", long = "worker-startup-check-interval")]
        #[serde(rename = "worker_startup_check_interval")]
        startup_check_interval: Secs = Secs::from_secs(30);
    }
}

crate::config::settings::settings! {
    /// Prefill/decode disaggregation.
    #[derive(Clone, Debug, Deserialize, Serialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct PdConfig;

    /// The router's prefill/decode disaggregation flags.
    #[serde_with::skip_serializing_none]
    #[derive(Clone, Debug, Default, clap::Args, Serialize)]
    #[command(next_help_heading = "Prefill/decode disaggregation")]
    pub struct PdArgs {
        /// A prefill worker and, optionally, its bootstrap port (or `none`). Repeatable.
        /// Default: none.
        #[arg(long, num_args = 1..=2, value_names = ["URL", "BOOTSTRAP_PORT"], action = clap::ArgAction::Append)]
        #[serde(skip)]
        pub prefill: Vec<String>,
        /// vLLM's disaggregation proxy flags: prefill hosts (`name` or `http://name`), paired
        /// in order with `--prefiller-ports`. They imply `--pd-disaggregation --backend vllm`
        /// and port 8000 unless `--port` is given. Default: none.
        #[arg(long, visible_alias = "prefiller-hosts", num_args = 1..)]
        #[serde(skip)]
        pub prefiller_host: Vec<String>,
        /// Ports of `--prefiller-host` (one for all, or one each). Default: 8000.
        #[arg(long, visible_alias = "prefiller-ports", num_args = 1..)]
        #[serde(skip)]
        pub prefiller_port: Vec<u16>,
        /// Decode hosts, as `--prefiller-host`. Default: none.
        #[arg(long, visible_alias = "decoder-hosts", num_args = 1..)]
        #[serde(skip)]
        pub decoder_host: Vec<String>,
        /// Ports of `--decoder-host` (one for all, or one each). Default: 8000.
        #[arg(long, visible_alias = "decoder-ports", num_args = 1..)]
        #[serde(skip)]
        pub decoder_port: Vec<u16>,
    }

    settings {
        /// Prefill/decode disaggregation.
        #[arg(id = "pd_disaggregation", long = "pd-disaggregation")]
        #[serde(rename = "pd_disaggregation")]
        enabled: bool = false;
        /// Prefill workers, each with its bootstrap port (`--prefill URL [PORT]`).
        prefill: Vec<PrefillSpec> = Vec::new();
        /// A decode worker. Repeatable. Default: none.
        #[arg(long, num_args = 1)]
        decode: Vec<String> = Vec::new();
        /// vLLM PD: the engines' KV connector (`mooncake` or `nixl`).
        #[arg(long)]
        vllm_kv_connector: Connector = Connector::Mooncake;
        /// vLLM PD with Mooncake: `concurrent` legs (as vLLM's Mooncake proxy) or `sequential`
        /// (decode after prefill answered).
        #[arg(long)]
        vllm_pd_legs: Legs = Legs::Concurrent;
        /// vLLM PD with Mooncake: the prefill engines' bootstrap port (`GET /query`), unless a
        /// prefill worker names its own (`VLLM_MOONCAKE_BOOTSTRAP_PORT`'s default).
        #[arg(long)]
        vllm_bootstrap_port: u16 = 8998;
    }
}

crate::config::settings::settings! {
    /// Workers found rather than given: Kubernetes pods, or an RBG discovery file.
    #[derive(Clone, Debug, Deserialize, Serialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct DiscoveryConfig;

    /// The router's worker-discovery flags.
    #[serde_with::skip_serializing_none]
    #[derive(Clone, Debug, Default, clap::Args, Serialize)]
    #[command(next_help_heading = "Discovery")]
    pub struct DiscoveryArgs {}

    settings {
        /// Discover workers from Kubernetes pods (Running and Ready) matching `selector`.
        #[arg(id = "service_discovery", long = "service-discovery")]
        #[serde(rename = "service_discovery")]
        kubernetes: bool = false;
        /// `key=value` labels a regular worker pod must carry. Default: none.
        #[arg(long)]
        selector: Vec<String> = Vec::new();
        /// `key=value` labels a prefill worker pod must carry (PD). Default: none.
        #[arg(long)]
        prefill_selector: Vec<String> = Vec::new();
        /// `key=value` labels a decode worker pod must carry (PD). Default: none.
        #[arg(long)]
        decode_selector: Vec<String> = Vec::new();
        /// Port of discovered pods' HTTP server.
        #[arg(id = "service_discovery_port", long = "service-discovery-port")]
        #[serde(rename = "service_discovery_port")]
        port: u16 = 80;
        /// Namespace to watch. Default: all namespaces.
        #[arg(id = "service_discovery_namespace", long = "service-discovery-namespace")]
        #[serde(rename = "service_discovery_namespace")]
        namespace: Option<String> = None;
        /// RBG discovery file (`/etc/rbg/config.yaml` in a RoleBasedGroup pod). Default: none.
        #[arg(long)]
        rbg_config: Option<PathBuf> = None;
        /// Role of the regular workers in the RBG discovery file. Default: none.
        #[arg(long)]
        rbg_role: Option<String> = None;
        /// Role of the prefill workers in the RBG discovery file (PD). Default: none.
        #[arg(long)]
        rbg_prefill_role: Option<String> = None;
        /// Role of the decode workers in the RBG discovery file (PD). Default: none.
        #[arg(long)]
        rbg_decode_role: Option<String> = None;
        /// Port name (as in `servicePorts`, lower case, `-` → `_`) of the workers' HTTP
        /// server. Default: the role's only port, else `http`, else the first by name.
        #[arg(long)]
        rbg_port_name: Option<String> = None;
        /// Port name of the prefill workers' bootstrap server (PD). Default: none
        /// (`bootstrap_port` null).
        #[arg(long)]
        rbg_bootstrap_port_name: Option<String> = None;
        /// How often the RBG discovery file is re-read.
        #[arg(id = "rbg_poll_secs", long = "rbg-poll-secs")]
        #[serde(rename = "rbg_poll_secs")]
        rbg_poll: Secs = Secs::from_secs(2);
    }
}

crate::config::settings::settings! {
    /// HTTPS to clients, and to `https://` workers.
    #[derive(Clone, Debug, Deserialize, Serialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct TlsConfig;

    /// The router's TLS flags.
    #[serde_with::skip_serializing_none]
    #[derive(Clone, Debug, Default, clap::Args, Serialize)]
    #[command(next_help_heading = "TLS")]
    pub struct TlsArgs {}

    settings {
        /// Serve HTTPS with this PEM certificate chain (with `tls_key_path`). Default: none
        /// (plain HTTP).
        #[arg(id = "tls_cert_path", long = "tls-cert-path")]
        #[serde(rename = "tls_cert_path")]
        cert_path: Option<PathBuf> = None;
        /// The PEM private key of `tls_cert_path`. Default: none.
        #[arg(id = "tls_key_path", long = "tls-key-path")]
        #[serde(rename = "tls_key_path")]
        key_path: Option<PathBuf> = None;
        /// PEM CA certificates trusted for `https://` workers, beside the public web's roots.
        /// Default: none.
        #[arg(long)]
        ca_cert_paths: Vec<PathBuf> = Vec::new();
        /// PEM certificate the router presents to `https://` workers (mutual TLS; with
        /// `client_key_path`). Default: none.
        #[arg(long)]
        client_cert_path: Option<PathBuf> = None;
        /// The PEM private key of `client_cert_path`. Default: none.
        #[arg(long)]
        client_key_path: Option<PathBuf> = None;
    }
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
    pub cache: CacheAwareArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub manual: ManualArgs,
    #[command(flatten)]
    #[serde(flatten)]
    pub prefix_hash: PrefixHashArgs,
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
    /// The backend as flags and logs name it.
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

    /// The policy that chooses prefill workers: `--prefill-policy`, else `--policy`.
    pub fn prefill_policy(&self) -> PolicyKind {
        self.policy.prefill_policy.unwrap_or(self.policy.policy)
    }

    /// The policy that chooses decode workers: `--decode-policy`, else `--policy`.
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

    #[test]
    fn every_stated_default_is_the_real_one() {
        let checked = crate::config::settings::check_stated_defaults(RouterArgs::resolve);
        assert!(checked >= 50, "{checked}");
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
        let e = Cmd::try_parse_from(["router", "--cb-timeout-duration-secs=-1"])
            .err()
            .expect("a negative duration is refused")
            .to_string();
        assert!(
            e.contains("--cb-timeout-duration-secs") && e.contains("not a duration"),
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
