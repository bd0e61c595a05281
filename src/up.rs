//! `rbgctl up`: the whole service on loopback, as child processes of this one: a master and
//! stores (the KV pool), SIMULATED engines using the pool as their L3 cache, and the router in
//! front of them. The layout comes from a TOML file (`config/up.toml`; every key has a default)
//! and a few flags. Ctrl-C (or SIGTERM) stops everything cleanly. A child that dies is started
//! again with the same name, ports and files (a store recovers its objects), after a backoff that
//! grows while it keeps failing; the others go on serving. The children die with `up` itself,
//! even when it is killed.
//!
//! [`Stack`] is the same machinery as a library: `rbgctl bench tiers` and the tests use it.

use crate::config::{ByteSize, ConfigError};
use crate::engine::{EngineConfig, Mode};
use crate::launch::{self, wait_http_ok, Child, Dir, Launcher, Logs, Pool, PoolSpec};
use crate::router::config::{
    LimitsConfig, MetricsConfig, PdConfig, PolicyConfig, PrefillSpec, RouterConfig, ServerConfig,
    TenantsConfig,
};
use crate::router::policy::PolicyKind;
use crate::router::tenants::table::share_of;
use crate::shutdown::Shutdown;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The KV pool: master and stores.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolConfig {
    /// Stores (0 = no pool at all; engines then run without L3). Default 2.
    pub stores: usize,
    /// Memory each store contributes. Default 256MiB.
    pub segment_size: ByteSize,
    /// Master RPC port. Default 50051.
    pub master_port: u16,
    /// HTTP metadata server port. Default 8080.
    pub metadata_port: u16,
    /// Master metrics and admin API port. Default 9003.
    pub metrics_port: u16,
    /// Directory of the stores' segment files. Default: a fresh one under /dev/shm.
    pub shm_dir: Option<PathBuf>,
    /// Each store's disk tier (objects memory gives up go there). Default 0: none.
    pub disk_tier_size: ByteSize,
    /// Directory of the stores' disk tiers (a local filesystem). Default: a fresh one under
    /// the system's temporary directory, removed on exit.
    pub disk_tier_dir: Option<PathBuf>,
    /// The cluster secret's file: the master, the stores, the engines' L3 clients and `up`'s
    /// own checks all hold it (`docs/security.md`). Default: `RBGCTL_AUTH_TOKEN_FILE`, else
    /// none.
    pub auth_token_file: Option<PathBuf>,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            stores: 2,
            segment_size: ByteSize(256 << 20),
            master_port: 50051,
            metadata_port: 8080,
            metrics_port: 9003,
            shm_dir: None,
            disk_tier_size: ByteSize(0),
            disk_tier_dir: None,
            auth_token_file: None,
        }
    }
}

/// The SIMULATED engines (see `rbgctl sim-engine --help` for the model).
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EnginesConfig {
    /// Regular (prefill + decode) engines. Default 2. Ignored when `prefill` and `decode` are set.
    pub count: usize,
    /// Prefill engines of a disaggregated (PD) deployment. Default 0.
    pub prefill: usize,
    /// Decode engines of a disaggregated deployment. Default 0.
    pub decode: usize,
    /// First engine port; the others follow. Default 30001.
    pub base_port: u16,
    /// First KV bootstrap port of prefill engines. Default 8998.
    pub bootstrap_base_port: u16,
    /// Tokens per page. Default 64.
    pub page_size: usize,
    /// Device (L1) cache, tokens. Default 32768.
    pub device_cache_tokens: usize,
    /// Host (L2) cache, tokens; 0 = none. Default 131072.
    pub host_cache_tokens: usize,
    /// Use the pool as L3 (needs `pool.stores` > 0). Default true.
    pub l3: bool,
    /// KV bytes per token. Default 4096 (a page of 64 tokens is 256 KiB).
    pub bytes_per_token: usize,
    /// Default 100.
    pub prefill_us_per_token: f64,
    /// Default 5.
    pub load_us_per_token: f64,
    /// Default 5.
    pub decode_ms_per_token: f64,
    /// Publish each engine's caches as KV events (on free ports, described in its
    /// `/server_info`). Default: on when the router's policy is `precise_prefix`.
    pub kv_events: Option<bool>,
    /// Prefill tokens computed in one go (SGLang's `--chunked-prefill-size`; −1: whole).
    /// Default 8192.
    pub chunked_prefill_size: i64,
    /// Prefills by the requests' `priority`, higher first (SGLang's
    /// `--enable-priority-scheduling`): what a router class's `engine_priority` sets.
    /// Default false.
    pub enable_priority_scheduling: bool,
}

impl Default for EnginesConfig {
    fn default() -> Self {
        EnginesConfig {
            count: 2,
            prefill: 0,
            decode: 0,
            base_port: 30001,
            bootstrap_base_port: 8998,
            page_size: 64,
            device_cache_tokens: 32_768,
            host_cache_tokens: 131_072,
            l3: true,
            bytes_per_token: 4096,
            prefill_us_per_token: 100.0,
            load_us_per_token: 5.0,
            decode_ms_per_token: 5.0,
            kv_events: None,
            chunked_prefill_size: 8192,
            enable_priority_scheduling: false,
        }
    }
}

impl EnginesConfig {
    /// Whether the engines are split into prefill and decode.
    pub fn pd(&self) -> bool {
        self.prefill > 0 && self.decode > 0
    }

    /// Engines in all: prefill and decode when split, else `count`.
    pub fn total(&self) -> usize {
        if self.pd() {
            self.prefill + self.decode
        } else {
            self.count
        }
    }
}

/// The router in front of the engines.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RouterUpConfig {
    /// Default true (when there are engines).
    pub enabled: bool,
    /// The service's port. Default 30000.
    pub port: u16,
    /// Routing policy. Default cache_aware.
    pub policy: PolicyKind,
    /// Routers started side by side in front of the same engines, as replicas behind a load
    /// balancer: the first on `port`, the others on ports the kernel chooses (printed, and in
    /// the ready file's `routers`). Each keeps its own view: `cache_aware`'s tree of the
    /// requests it sent itself, `precise_prefix`'s index of every engine's KV events.
    /// Default 1.
    pub replicas: usize,
    /// The routers' tenants file (keys, limits, priority classes; docs/router.md). With
    /// replicas, each enforces its share of every tenant's limits. Default: none.
    pub tenants_file: Option<PathBuf>,
    /// Requests the engines are given at once, all routers together (each replica takes its
    /// share); with tenants, requests beyond it wait in their class's queue. −1: no bound.
    /// Default −1.
    pub max_concurrent_requests: i64,
}

impl Default for RouterUpConfig {
    fn default() -> Self {
        RouterUpConfig {
            enabled: true,
            port: 30000,
            policy: PolicyKind::CacheAware,
            replicas: 1,
            tenants_file: None,
            max_concurrent_requests: -1,
        }
    }
}

/// `rbgctl up`'s configuration file: the pool, the engines and the router to start.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpConfig {
    pub pool: PoolConfig,
    pub engines: EnginesConfig,
    pub router: RouterUpConfig,
}

impl UpConfig {
    /// This layout with every port chosen by the kernel and a fresh segment directory: one
    /// of several services a benchmark starts in turn.
    pub fn on_free_ports(&self) -> UpConfig {
        let mut c = self.clone();
        c.pool.shm_dir = None;
        c.pool.master_port = 0;
        c.pool.metadata_port = 0;
        c.pool.metrics_port = 0;
        c.router.port = 0;
        c.engines.base_port = 0;
        c.engines.bootstrap_base_port = 0;
        c
    }

    /// Reads a layout file (unknown keys are errors naming the key and line).
    pub fn from_file(path: &Path) -> Result<UpConfig, ConfigError> {
        crate::config::load_toml(path)
    }

    /// Refuses settings that cannot run together, naming the setting to fix.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.pool.disk_tier_size.0 % 4096 != 0 {
            return Err(ConfigError::invalid(
                "pool.disk_tier_size",
                format!(
                    "must be a multiple of 4 KiB, got {}",
                    self.pool.disk_tier_size.0
                ),
            ));
        }
        if self.pool.stores > 0 && self.pool.segment_size.0 < 4096 {
            return Err(ConfigError::invalid(
                "pool.segment_size",
                format!(
                    "each store needs at least 4 KiB of memory to contribute, got {} bytes \
                     (--segment-size)",
                    self.pool.segment_size.0
                ),
            ));
        }
        crate::router::config::check_max_concurrent(
            "router.max_concurrent_requests",
            self.router.max_concurrent_requests,
        )?;
        if self.router.enabled && self.router.replicas == 0 {
            return Err(ConfigError::invalid(
                "router.replicas",
                "must be at least 1 (or set router.enabled = false for no router)",
            ));
        }
        let e = &self.engines;
        if e.l3 && e.total() > 0 && self.pool.stores == 0 {
            return Err(ConfigError::invalid(
                "engines.l3",
                "needs a pool: set pool.stores > 0 or engines.l3 = false",
            ));
        }
        if (e.prefill == 0) != (e.decode == 0) {
            return Err(ConfigError::invalid(
                "engines.prefill",
                "a disaggregated deployment needs both engines.prefill and engines.decode",
            ));
        }
        if e.page_size == 0 || e.device_cache_tokens < e.page_size {
            return Err(ConfigError::invalid(
                "engines.device_cache_tokens",
                "must hold at least one page (engines.page_size > 0)",
            ));
        }
        Ok(())
    }
}

/// `rbgctl up`'s arguments.
#[derive(Debug, clap::Args)]
pub struct UpArgs {
    /// Layout file (TOML; example in config/up.toml). Flags below override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Number of stores.
    #[arg(long)]
    pub stores: Option<usize>,
    /// Memory each store contributes.
    #[arg(allow_hyphen_values = true, long)]
    pub segment_size: Option<ByteSize>,
    /// Master RPC port.
    #[arg(long)]
    pub master_port: Option<u16>,
    /// HTTP metadata server port.
    #[arg(long)]
    pub metadata_port: Option<u16>,
    /// Master metrics and admin API port.
    #[arg(long)]
    pub metrics_port: Option<u16>,
    /// Directory for the stores' segment files (default: a fresh one under /dev/shm).
    #[arg(long)]
    pub shm_dir: Option<PathBuf>,
    /// Each store's disk tier size (0 = none).
    #[arg(allow_hyphen_values = true, long)]
    pub disk_tier_size: Option<ByteSize>,
    /// Directory for the stores' disk tiers (default: a fresh one in the temporary directory).
    #[arg(long)]
    pub disk_tier_dir: Option<PathBuf>,
    /// The cluster secret's file, held by every role `up` starts.
    #[arg(long, env = "RBGCTL_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,
    /// Number of regular SIMULATED engines (0 = the pool only, no router).
    #[arg(long)]
    pub engines: Option<usize>,
    /// The first engine's port; the others follow (0: ports the kernel chooses).
    #[arg(long)]
    pub engine_base_port: Option<u16>,
    /// The router's port.
    #[arg(long)]
    pub router_port: Option<u16>,
    /// Routers side by side in front of the engines: the first on --router-port, the others
    /// on ports the kernel chooses (printed).
    #[arg(long)]
    pub router_replicas: Option<usize>,
    /// The routers' tenants file (API keys as SHA-256, limits, priority classes); each
    /// replica enforces its share of every tenant's limits.
    #[arg(long)]
    pub router_tenants_file: Option<PathBuf>,
    /// Requests the engines are given at once, all routers together; with tenants, requests
    /// beyond it wait in their class's queue (-1: no bound).
    #[arg(long, allow_negative_numbers = true)]
    pub router_max_concurrent_requests: Option<i64>,
}

impl UpArgs {
    /// The config: the file's (or the defaults), then the flags given over it, validated.
    pub fn resolve(&self) -> Result<UpConfig, ConfigError> {
        let mut c = match &self.config {
            Some(p) => UpConfig::from_file(p)?,
            None => UpConfig::default(),
        };
        if let Some(v) = self.stores {
            c.pool.stores = v;
        }
        if let Some(v) = self.segment_size {
            c.pool.segment_size = v;
        }
        if let Some(v) = self.master_port {
            c.pool.master_port = v;
        }
        if let Some(v) = self.metadata_port {
            c.pool.metadata_port = v;
        }
        if let Some(v) = self.metrics_port {
            c.pool.metrics_port = v;
        }
        if let Some(v) = &self.shm_dir {
            c.pool.shm_dir = Some(v.clone());
        }
        if let Some(v) = self.disk_tier_size {
            c.pool.disk_tier_size = v;
        }
        if let Some(v) = &self.disk_tier_dir {
            c.pool.disk_tier_dir = Some(v.clone());
        }
        if let Some(v) = &self.auth_token_file {
            c.pool.auth_token_file = Some(v.clone());
        }
        if let Some(v) = self.engine_base_port {
            c.engines.base_port = v;
        }
        if let Some(v) = self.engines {
            c.engines.count = v;
            c.engines.prefill = 0;
            c.engines.decode = 0;
        }
        if let Some(v) = self.router_port {
            c.router.port = v;
        }
        if let Some(v) = self.router_replicas {
            c.router.replicas = v;
        }
        if let Some(v) = &self.router_tenants_file {
            c.router.tenants_file = Some(v.clone());
        }
        if let Some(v) = self.router_max_concurrent_requests {
            c.router.max_concurrent_requests = v;
        }
        c.validate()?;
        Ok(c)
    }
}

/// What `rbgctl up` reports through `RBGCTL_READY_FILE` once everything is up.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct UpAddrs {
    pub router: Option<String>,
    /// Every router replica's base URL, the first being `router`.
    #[serde(default)]
    pub routers: Vec<String>,
    pub master: Option<String>,
    pub metadata: Option<String>,
    pub master_metrics: Option<String>,
    pub engines: Vec<String>,
    /// Each store's metrics base URL (`http://host:port`).
    #[serde(default)]
    pub store_metrics: Vec<String>,
}

/// A started service.
pub struct Stack {
    // Declared in stop order: routers, engines, stores, master (children stop when dropped).
    router_procs: Vec<Child<launch::Router>>,
    engine_procs: Vec<Child<launch::Engine>>,
    pool: Option<Pool>,
    /// Restarts of the children that died, by child name.
    restarts: std::collections::HashMap<String, Restarts>,
    pub master: Option<String>,
    pub metadata: Option<String>,
    pub master_metrics: Option<String>,
    pub stores: Vec<String>,
    /// Engine base URLs, with their role.
    pub engines: Vec<(String, &'static str)>,
    /// The first router's base URL: the service's address.
    pub router: Option<String>,
    /// Every router replica's base URL (`router.replicas`), the first being `router`.
    pub routers: Vec<String>,
}

/// The `i`-th port from `base` (0: each one chosen by the kernel).
fn nth_port(base: u16, i: usize, what: &str) -> Result<u16, ConfigError> {
    if base == 0 {
        return Ok(0);
    }
    u16::try_from(base as usize + i)
        .map_err(|_| ConfigError::invalid(what, format!("{base} + {i} is past 65535")))
}

impl Stack {
    /// Starts every part and waits until each is ready. `logs` says where the children's
    /// output goes.
    pub fn start(cfg: &UpConfig, launcher: &Launcher) -> Result<Stack, UpError> {
        cfg.validate()?;
        let host = "127.0.0.1";
        let mut st = Stack {
            router_procs: Vec::new(),
            engine_procs: Vec::new(),
            pool: None,
            restarts: Default::default(),
            master: None,
            metadata: None,
            master_metrics: None,
            stores: Vec::new(),
            engines: Vec::new(),
            router: None,
            routers: Vec::new(),
        };
        let p = &cfg.pool;
        // A policy on KV events over engines backed by the pool: the pool's pages are
        // followed too.
        let pool_events = cfg.router.policy.follows_kv_events() && cfg.engines.l3;
        if p.stores > 0 {
            let mut spec = PoolSpec::loopback(p.stores, p.segment_size.0);
            spec.name = "rbgctl-up".into();
            spec.master.rpc_port = p.master_port;
            spec.master.http_metadata_server_port = p.metadata_port;
            spec.master.metrics_port = p.metrics_port;
            // The stores get it from the master's spec; the pool's own checks hold it too.
            spec.master.auth_token_file = p.auth_token_file.clone();
            if pool_events {
                spec.master.kv_events_config = Some(format!(
                    r#"{{"publisher":"zmq","endpoint":"tcp://{host}:0","bind":true,"replay_endpoint":"tcp://{host}:0"}}"#
                ));
            }
            // A store that dies is started again on its files and keeps its objects.
            spec.store.persistent = true;
            spec.shm_dir = match &p.shm_dir {
                Some(d) => Dir::At(d.clone()),
                None => Dir::Inside("/dev/shm".into()),
            };
            if p.disk_tier_size.0 > 0 {
                let dir = match &p.disk_tier_dir {
                    Some(d) => Dir::At(d.clone()),
                    None => Dir::Inside(std::env::temp_dir()),
                };
                spec.disk_tier = Some((dir, p.disk_tier_size));
            }
            spec.ready_timeout = Duration::from_secs(15);
            spec.keep_dirs_after_unclean_stop = true;
            let pool = Pool::start(launcher, spec)?;
            for (i, store) in pool.stores.iter().enumerate() {
                st.stores.push(format!(
                    "{:<10} data {}   metrics http://{}/metrics   ({})",
                    format!("store-{i}"),
                    store.addrs.data,
                    store.addrs.metrics,
                    crate::config::human_bytes(p.segment_size.0)
                ));
            }
            st.master = Some(pool.rpc.clone());
            st.metadata = pool.metadata_url();
            st.master_metrics = Some(format!("http://{}", pool.master().addrs.metrics));
            st.pool = Some(pool);
        }
        let master_events = st.pool.as_ref().filter(|_| pool_events).and_then(|pool| {
            let a = &pool.master().addrs;
            Some((a.kv_events.clone()?, a.kv_events_replay.clone()))
        });
        let e = &cfg.engines;
        let roles: Vec<Mode> = if e.pd() {
            std::iter::repeat_n(Mode::Prefill, e.prefill)
                .chain(std::iter::repeat_n(Mode::Decode, e.decode))
                .collect()
        } else {
            vec![Mode::Regular; e.count]
        };
        let mut router_cfg = RouterConfig {
            server: ServerConfig {
                host: host.into(),
                port: cfg.router.port,
                ..Default::default()
            },
            policy: PolicyConfig {
                policy: cfg.router.policy,
                kv_events_pool_endpoint: master_events.as_ref().map(|(e, _)| e.clone()),
                kv_events_pool_replay_endpoint: master_events.as_ref().and_then(|(_, r)| r.clone()),
                kv_events_pool_snapshot_url: master_events.as_ref().and(st.master_metrics.clone()),
                kv_events_pool_auth_token_file: cfg.pool.auth_token_file.clone(),
                ..Default::default()
            },
            metrics: MetricsConfig {
                prometheus_port: 0,
                ..Default::default()
            },
            pd: PdConfig {
                enabled: e.pd(),
                ..Default::default()
            },
            tenants: TenantsConfig {
                tenants_file: cfg.router.tenants_file.clone(),
                tenant_limits_replicas: cfg.router.replicas.max(1),
                ..Default::default()
            },
            limits: LimitsConfig {
                max_concurrent_requests: match cfg.router.max_concurrent_requests {
                    n if n > 0 => share_of(n as usize, cfg.router.replicas) as i64,
                    n => n,
                },
                ..Default::default()
            },
            ..RouterConfig::default()
        };
        for (i, mode) in roles.iter().enumerate() {
            let engine = launcher.spawn::<launch::Engine>(
                &format!("engine-{i}"),
                EngineConfig {
                    host: host.into(),
                    port: nth_port(e.base_port, i, "engines.base_port")?,
                    mode: *mode,
                    disaggregation_bootstrap_port: match mode {
                        Mode::Prefill => Some(nth_port(
                            e.bootstrap_base_port,
                            i,
                            "engines.bootstrap_base_port",
                        )?),
                        _ => None,
                    },
                    page_size: e.page_size,
                    device_cache_tokens: e.device_cache_tokens,
                    host_cache_tokens: e.host_cache_tokens,
                    bytes_per_token: e.bytes_per_token,
                    prefill_us_per_token: e.prefill_us_per_token,
                    load_us_per_token: e.load_us_per_token,
                    decode_ms_per_token: e.decode_ms_per_token,
                    chunked_prefill_size: e.chunked_prefill_size,
                    enable_priority_scheduling: e.enable_priority_scheduling,
                    l3_master: st.master.clone().filter(|_| e.l3),
                    auth_token_file: cfg.pool.auth_token_file.clone(),
                    kv_events_config: e
                        .kv_events
                        .unwrap_or(cfg.router.policy.follows_kv_events())
                        .then(|| {
                            format!(
                                r#"{{"publisher":"zmq","endpoint":"tcp://{host}:0","bind":true,"replay_endpoint":"tcp://{host}:0"}}"#
                            )
                        }),
                    ..EngineConfig::default()
                },
            )?;
            let url = format!("http://{}", engine.addrs.http);
            match mode {
                Mode::Prefill => router_cfg.pd.prefill.push(PrefillSpec {
                    url: url.clone(),
                    bootstrap_port: engine.addrs.bootstrap.map(|b| b.port()),
                }),
                Mode::Decode => router_cfg.pd.decode.push(url.clone()),
                Mode::Regular => router_cfg.server.worker_urls.push(url.clone()),
            }
            st.engines.push((url, mode.name()));
            st.engine_procs.push(engine);
        }
        for (url, _) in &st.engines {
            wait_http_ok(&format!("{url}/health"), Duration::from_secs(40))?;
        }
        if cfg.router.enabled && !st.engines.is_empty() {
            for i in 0..cfg.router.replicas {
                let name = match i {
                    0 => "router".to_string(),
                    i => format!("router-{i}"),
                };
                let mut replica = router_cfg.clone();
                if i > 0 {
                    replica.server.port = 0;
                }
                let router = launcher.spawn::<launch::Router>(&name, replica)?;
                let url = format!("http://{}", router.addrs.http);
                wait_http_ok(&format!("{url}/readiness"), Duration::from_secs(30))?;
                st.routers.push(url);
                st.router_procs.push(router);
            }
            st.router = st.routers.first().cloned();
        }
        Ok(st)
    }

    /// The addresses `up` reports.
    pub fn addrs(&self) -> UpAddrs {
        UpAddrs {
            router: self.router.clone(),
            routers: self.routers.clone(),
            master: self.master.clone(),
            metadata: self.metadata.clone(),
            master_metrics: self.master_metrics.clone(),
            engines: self.engines.iter().map(|(u, _)| u.clone()).collect(),
            store_metrics: self
                .pool
                .iter()
                .flat_map(|p| &p.stores)
                .map(|s| format!("http://{}", s.addrs.metrics))
                .collect(),
        }
    }

    /// Starts again every child that died, each once its backoff has passed; the others go on
    /// serving. A child that cannot start again is tried again for as long as `up` runs.
    pub fn supervise(&mut self, now: Instant) -> Result<(), UpError> {
        let restarts = &mut self.restarts;
        for r in &mut self.router_procs {
            supervise_one(r, restarts, now)?;
        }
        for e in &mut self.engine_procs {
            supervise_one(e, restarts, now)?;
        }
        if let Some(pool) = &mut self.pool {
            for s in &mut pool.stores {
                supervise_one(s, restarts, now)?;
            }
            for m in &mut pool.masters {
                supervise_one(m, restarts, now)?;
            }
        }
        Ok(())
    }

    /// Stops the children one by one, last started first (the router before the engines,
    /// the stores before the master, so that they can unmount). This stack's own directories
    /// go only when every store stopped cleanly: a store's files are never removed after it
    /// exited abnormally.
    pub fn stop(&mut self) {
        for mut r in self.router_procs.drain(..).rev() {
            r.stop();
        }
        for mut e in self.engine_procs.drain(..).rev() {
            e.stop();
        }
        if let Some(mut pool) = self.pool.take() {
            pool.stop();
        }
    }

    /// Kills every router replica (SIGKILL) and starts each again on its address; answers
    /// how long until all were ready again.
    pub fn restart_router(&mut self) -> Result<Duration, UpError> {
        if self.router_procs.is_empty() {
            return Err(UpError::Config(ConfigError::invalid(
                "router.enabled",
                "there is no router to restart",
            )));
        }
        let began = Instant::now();
        for r in &mut self.router_procs {
            r.kill();
        }
        for r in &mut self.router_procs {
            r.start()?;
        }
        for r in &self.router_procs {
            wait_http_ok(
                &format!("http://{}/readiness", r.addrs.http),
                Duration::from_secs(30),
            )?;
        }
        Ok(began.elapsed())
    }

    /// The stores' `/metrics` URLs.
    pub fn store_metrics_urls(&self) -> Vec<String> {
        self.pool
            .iter()
            .flat_map(|p| &p.stores)
            .map(|s| format!("http://{}/metrics", s.addrs.metrics))
            .collect()
    }

    fn print(&self) {
        println!("rbgctl is up on loopback:");
        for (i, r) in self.routers.iter().enumerate() {
            match i {
                0 => println!("  service (router)    {r}   (OpenAI and SGLang APIs)"),
                i => println!("  router replica {i:<4} {r}"),
            }
        }
        for (url, role) in &self.engines {
            println!("  SIMULATED engine    {url}   ({role})");
        }
        if let (Some(m), Some(md), Some(mm)) = (&self.master, &self.metadata, &self.master_metrics)
        {
            println!("  master RPC          {m}");
            println!("  metadata server     {md}");
            println!("  metrics / admin     {mm}/metrics  {mm}/api/v1/segments");
            println!("  pool status page    {mm}/ui");
        }
        if let Some(r) = &self.router {
            println!("  router status page  {r}/ui");
        }
        for s in &self.stores {
            println!("  store               {s}");
        }
        let rbgctl = self_command();
        println!();
        println!("Try it:");
        if let Some(r) = &self.router {
            println!("  curl -s {r}/v1/chat/completions -d '{{\"messages\":[{{\"role\":\"user\",\"content\":\"hello\"}}],\"max_tokens\":8}}'");
            let port = r.rsplit(':').next().unwrap_or("30000");
            println!("  {rbgctl} bench multiturn --host 127.0.0.1 --port {port} --num-clients 32 --num-rounds 4 --disable-auto-run --request-rate 8");
        }
        if let Some(m) = &self.master {
            println!("  {rbgctl} kv --master {m} put hello world --replicas 2");
            println!("  {rbgctl} bench store --master {m}");
        }
        println!("Ctrl-C stops everything.");
    }
}

/// After this many failed starts in a row, each further failure is logged as an error.
const FAILED_STARTS_ERROR: u32 = 10;

/// A child's restarts: when the next is due, and a backoff that grows while it keeps dying
/// soon after its start and starts over once it has served for `STABLE`.
#[derive(Debug)]
pub struct Restarts {
    backoff: crate::backoff::Backoff,
    /// When the child is to be started again; `None` while it runs.
    due: Option<Instant>,
    /// When it was last started (or found running).
    started: Instant,
    /// Starts that failed in a row.
    failed_starts: u32,
    /// Restarts so far.
    pub count: u64,
}

/// A child that served this long before dying starts over with the shortest backoff.
const STABLE: Duration = Duration::from_secs(30);

impl Restarts {
    /// A child started at `now`, with the shortest backoff before its first restart.
    pub fn new(now: Instant) -> Restarts {
        Restarts {
            backoff: crate::backoff::Backoff::new(
                Duration::from_millis(200),
                Duration::from_secs(10),
            ),
            due: None,
            started: now,
            failed_starts: 0,
            count: 0,
        }
    }

    /// The child died at `now`: returns the wait before it is started again.
    pub fn died(&mut self, now: Instant) -> Duration {
        if now.saturating_duration_since(self.started) >= STABLE {
            self.backoff.reset();
        }
        let wait = self.backoff.next_delay();
        self.due = Some(now + wait);
        wait
    }

    /// Whether a restart is due at `now`.
    pub fn due(&self, now: Instant) -> bool {
        self.due.is_some_and(|d| now >= d)
    }

    /// Whether the child is waiting for its restart.
    pub fn waiting(&self) -> bool {
        self.due.is_some()
    }

    /// It started again at `now`.
    pub fn started(&mut self, now: Instant) {
        self.due = None;
        self.started = now;
        self.failed_starts = 0;
        self.count += 1;
    }

    /// Its start failed at `now`: returns the wait before the next try (the backoff's, at
    /// most 10 s) and how many starts have failed in a row. `up` never gives up on a child:
    /// one role that cannot start again must not take the rest (the pool's objects) down.
    pub fn start_failed(&mut self, now: Instant) -> (Duration, u32) {
        self.failed_starts += 1;
        let wait = self.backoff.next_delay();
        self.due = Some(now + wait);
        (wait, self.failed_starts)
    }
}

/// Notices that `child` died, and starts it again once its backoff has passed.
fn supervise_one<R: launch::Launchable>(
    child: &mut Child<R>,
    restarts: &mut std::collections::HashMap<String, Restarts>,
    now: Instant,
) -> Result<(), UpError> {
    let name = child.name.clone();
    let r = restarts
        .entry(name.clone())
        .or_insert_with(|| Restarts::new(now));
    if !r.waiting() {
        let Some(status) = child.exited() else {
            return Ok(());
        };
        let wait = r.died(now);
        tracing::warn!(child = %name, %status, restart_in_ms = wait.as_millis() as u64,
            "exited; starting it again with the same name, ports and files");
        return Ok(());
    }
    if !r.due(now) {
        return Ok(());
    }
    match child.start() {
        Ok(()) => {
            r.started(Instant::now());
            tracing::info!(child = %name, restarts = r.count, "started again");
            Ok(())
        }
        Err(e) => {
            let (wait, failed) = r.start_failed(Instant::now());
            let retry_in_ms = wait.as_millis() as u64;
            if failed >= FAILED_STARTS_ERROR {
                tracing::error!(child = %name, error = %e, failed, retry_in_ms,
                    "still cannot start it again; the other roles go on (Ctrl-C stops everything)");
            } else {
                tracing::warn!(child = %name, error = %e, failed, retry_in_ms,
                    "could not start it again; retrying");
            }
            Ok(())
        }
    }
}

/// How to run this program again from the shell `up` was started in: `rbgctl` when that name
/// on the PATH is this program, else its path (relative to the working directory when under it,
/// as `./target/release/rbgctl` after `cargo build`).
fn self_command() -> String {
    let Ok(exe) = std::env::current_exe() else {
        return "rbgctl".into();
    };
    let on_path = std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|d| {
            std::fs::canonicalize(d.join("rbgctl"))
                .is_ok_and(|p| std::fs::canonicalize(&exe).is_ok_and(|e| e == p))
        })
    });
    if on_path {
        return "rbgctl".into();
    }
    let relative = std::env::current_dir().ok().and_then(|cwd| {
        exe.strip_prefix(cwd)
            .ok()
            .map(|p| format!("./{}", p.display()))
    });
    relative.unwrap_or_else(|| exe.display().to_string())
}

impl Drop for Stack {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What stops `rbgctl up`.
#[derive(Debug, thiserror::Error)]
pub enum UpError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Launch(#[from] crate::launch::LaunchError),
    #[error(transparent)]
    Pool(#[from] crate::launch::PoolError),
    #[error(transparent)]
    Http(#[from] crate::launch::HttpWaitError),
    #[error("{0}")]
    NotReady(String),
    #[error("{0}; stopped the rest")]
    Exited(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// Runs `rbgctl up`: starts every role on loopback and keeps them until Ctrl-C.
pub fn run(args: UpArgs) -> Result<(), UpError> {
    let cfg = args.resolve()?;
    // The signal token first, so that a SIGTERM during start-up still stops the children cleanly.
    let stop = Shutdown::on_signals()?;
    let launcher = Launcher::new(Logs::Inherit)?;
    let mut stack = Stack::start(&cfg, &launcher)?;
    stack.print();
    crate::role::announce("up", &stack.addrs());
    let failed = loop {
        if stop.sleep(Duration::from_millis(200)) {
            break None;
        }
        if let Err(e) = stack.supervise(Instant::now()) {
            break Some(e);
        }
    };
    eprintln!("stopping...");
    stack.stop();
    match failed {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_that_keeps_dying_waits_longer_each_time_and_one_that_served_starts_over() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut r = Restarts::new(t0);
        assert!(!r.waiting());
        assert_eq!(r.died(t0 + ms(100)), ms(200));
        assert!(r.waiting() && !r.due(t0 + ms(299)) && r.due(t0 + ms(300)));
        r.started(t0 + ms(300));
        assert_eq!(r.died(t0 + ms(400)), ms(400), "died soon after its start");
        r.started(t0 + ms(800));
        assert_eq!(r.died(t0 + ms(900)), ms(800));
        // Served for longer than STABLE: the shortest wait again.
        r.started(t0 + ms(1700));
        assert_eq!(r.died(t0 + ms(1700) + STABLE), ms(200));
        assert_eq!(r.count, 3);
        // Failed starts are tried again for ever, each wait at most 10 s.
        let mut r = Restarts::new(t0);
        r.died(t0);
        let tries: Vec<(Duration, u32)> = (0..20).map(|_| r.start_failed(t0)).collect();
        assert_eq!(tries.last().unwrap().1, 20);
        assert!(tries.iter().all(|(w, _)| *w <= Duration::from_secs(10)));
        let waits: Vec<Duration> = (0..8).map(|_| Restarts::new(t0).backoff.nth(8)).collect();
        assert!(
            waits.iter().all(|w| *w <= Duration::from_secs(10)),
            "capped"
        );
    }

    /// Issue 62, item B9: `--engine-base-port` overrides the layout, and the engines take
    /// consecutive ports from it (a base too high for them is refused by name).
    #[test]
    fn the_engine_base_port_flag_places_the_engines() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            up: UpArgs,
        }
        let cli =
            Cli::try_parse_from(["up", "--engines", "3", "--engine-base-port", "31000"]).unwrap();
        let c = cli.up.resolve().unwrap();
        assert_eq!(c.engines.base_port, 31000);
        let ports: Vec<u16> = (0..c.engines.total())
            .map(|i| nth_port(c.engines.base_port, i, "engines.base_port").unwrap())
            .collect();
        assert_eq!(ports, [31000, 31001, 31002]);
        assert_eq!(
            nth_port(0, 2, "engines.base_port").unwrap(),
            0,
            "kernel's choice"
        );
        let e = nth_port(65535, 1, "engines.base_port")
            .unwrap_err()
            .to_string();
        assert!(e.contains("engines.base_port"), "{e}");
    }

    #[test]
    fn the_example_config_parses_and_bad_layouts_are_refused() {
        let c: UpConfig = toml::from_str(
            &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/up.toml"))
                .unwrap(),
        )
        .unwrap();
        c.validate().unwrap();
        assert!(
            toml::from_str::<UpConfig>("[engines]\nbogus = 1").is_err(),
            "unknown keys"
        );
        let mut c = UpConfig::default();
        c.pool.stores = 0;
        assert!(c.validate().is_err(), "L3 without a pool");
        c.engines.l3 = false;
        c.validate().unwrap();
        c.engines.prefill = 1;
        assert!(c.validate().is_err(), "prefill without decode");
        c.engines.decode = 2;
        c.validate().unwrap();
        assert_eq!(c.engines.total(), 3);
        c.router.replicas = 0;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("router.replicas"), "{e}");
        c.router.enabled = false;
        c.validate().unwrap();
        c.router.enabled = true;
        c.router.replicas = 2;
        c.validate().unwrap();
    }
}
