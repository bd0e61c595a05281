//! `rbgctl master`: the KV-cache pool manager. It owns the metadata — which stores contribute
//! which segments, where every object's replicas are, leases and pins — and never touches object
//! bytes, which move directly between clients and stores.
//!
//! Parts: `state` (the state machine, with the tables and decisions only it uses: space in a
//! segment, which objects to evict, which segments get a replica, ...), `tenants`, `rpc` (the
//! binary protocol service), `metadata` and `http` (HTTP servers), the threads that act on the
//! clock (`housekeeper`, `notifier`, `mover`, `handover`), `config`.

pub mod compat;
pub mod config;
pub mod doorbell;
pub mod handover;
pub mod housekeeper;
pub mod http;
pub mod lock;
pub mod metadata;
pub mod mover;
pub mod notifier;
pub mod rpc;
pub mod state;
pub mod store_pools;
pub mod tenants;
pub mod tenants_file;
pub mod ui;

use self::lock::StateLock;
use crate::config::human_bytes;
use crate::ha::elector::{self, ElectionStats};
use crate::ha::lease::Leadership;
use crate::ha::MasterView;
use crate::role::{self, BindError};
use crate::shutdown::Shutdown;
use crate::telemetry::OpStats;
use crate::transfer::server;
use config::MasterConfig;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use state::MasterState;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Errors that stop the master.
#[derive(Debug, thiserror::Error)]
pub enum MasterError {
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("high availability: {0}")]
    Ha(#[from] crate::ha::HaError),
    #[error(transparent)]
    Auth(#[from] crate::auth::AuthError),
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    #[error(transparent)]
    KvEvents(#[from] crate::kv_events::publish::PublishError),
    #[error(transparent)]
    Tenants(#[from] tenants_file::TenantsFileError),
}

/// State shared by the RPC threads, the housekeeper and the HTTP handlers.
pub struct Shared {
    pub state: Arc<StateLock>,
    pub service: Arc<rpc::MasterService>,
    pub started: Instant,
    pub leadership: Arc<Leadership>,
    pub election: Arc<ElectionStats>,
    /// Carries out moves between memory and disk tiers.
    pub mover: Arc<mover::Mover>,
    /// The status page's rates: counters sampled once a second by the housekeeper.
    pub history: Arc<parking_lot::Mutex<ui::History>>,
    /// The cluster secret: with one, the admin routes that name keys or clients need it.
    pub secret: Option<Arc<crate::auth::Secret>>,
    /// With `kv_events_config`: what the pool's event publisher has done.
    pub kv_events: Option<Arc<crate::kv_events::PublisherStats>>,
    /// When the last KV event snapshot was queued (they are rate-limited).
    pub last_snapshot: parking_lot::Mutex<Option<Instant>>,
}

/// What an election does to the master: a master elected or deposed forgets everything, as a
/// restarted one does, and rebuilds from its stores' reports.
struct ElectionHooks {
    state: Arc<StateLock>,
    service: Arc<rpc::MasterService>,
    reservation_ttl: Duration,
    /// How long a new leader answers unknown keys as unavailable, not missing: the client TTL.
    learning_window: Duration,
}

impl elector::Hooks for ElectionHooks {
    fn elected(&mut self, _epoch: u64) {
        let mut st = self.state.lock();
        st.reset();
        st.learn_for(self.learning_window, Instant::now());
        drop(st);
        self.service.notifier.reset();
        *self.service.allocations_from.lock() = Instant::now() + self.reservation_ttl;
    }

    fn deposed(&mut self) {
        self.state.lock().reset();
        self.service.notifier.reset();
    }
}

/// Starts the election thread of an HA master.
fn spawn_election(
    cfg: &MasterConfig,
    addrs: &Addrs,
    shared: &Shared,
    shutdown: Shutdown,
) -> Result<std::thread::JoinHandle<()>, MasterError> {
    let ttl = cfg.ha_lease_ttl_ms.0;
    let host = cfg.advertised_host()?;
    let identity = format!("{}/{}", hostname(), std::process::id());
    let view = MasterView {
        rpc: format!("{host}:{}", addrs.rpc.port()),
        admin: format!("{host}:{}", addrs.metrics.port()),
        metadata: addrs.metadata.map(|a| format!("{host}:{}", a.port())),
        id: identity.clone(),
    };
    let backend: Box<dyn elector::Backend> = match cfg.ha_backend {
        config::HaBackend::Etcd => {
            let endpoints = crate::ha::etcd::parse_endpoints(&cfg.ha_backend_connstring)
                .map_err(|e| MasterError::Ha(e.into()))?;
            let etcd = crate::ha::etcd::Etcd::new(endpoints, ttl.min(Duration::from_secs(2)))
                .map_err(|e| MasterError::Ha(e.into()))?;
            Box::new(elector::EtcdBackend::new(etcd, &cfg.cluster_id, ttl))
        }
        config::HaBackend::K8s => {
            let (ns, name) = cfg
                .ha_backend_connstring
                .trim()
                .split_once('/')
                .unwrap_or(("default", cfg.ha_backend_connstring.trim()));
            let api = crate::ha::kube_lease::LeaseApi::from_env(ns, name)?;
            Box::new(crate::ha::kube_lease::KubeLeaseBackend::new(
                api, &identity, ttl,
            ))
        }
    };
    tracing::info!(backend = %backend.describe(), rpc = %view.rpc, ttl = ?ttl, "master high availability on: standing by until elected");
    let hooks = Box::new(ElectionHooks {
        state: shared.state.clone(),
        service: shared.service.clone(),
        reservation_ttl: cfg.put_reservation_ttl_ms.0,
        learning_window: cfg.client_ttl_ms.0,
    });
    let (leadership, stats) = (shared.leadership.clone(), shared.election.clone());
    Ok(std::thread::Builder::new()
        .name("master-election".into())
        .spawn(move || elector::run(backend, view, leadership, hooks, stats, ttl, shutdown))?)
}

/// This host's name, for the identity a master elects with.
pub fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown-host".into())
}

/// The log line printed every `summary_interval`: storage used/total, keys, soft-pinned, clients.
pub fn summary_line(st: &MasterState, now: Instant) -> String {
    let s = st.summary(now);
    let pct = if s.capacity_bytes == 0 {
        0.0
    } else {
        100.0 * s.used_bytes as f64 / s.capacity_bytes as f64
    };
    format!(
        "Storage: {} / {} ({pct:.1}%) | Disk tier: {} / {} | Keys: {} (on disk only: {}, soft-pinned: {}, pending: {}) | Clients: {} | Segments: {} | Evicted: {} | Demoted: {} | Promoted: {}",
        human_bytes(s.used_bytes),
        human_bytes(s.capacity_bytes),
        human_bytes(s.disk_used_bytes),
        human_bytes(s.disk_capacity_bytes),
        s.keys,
        s.disk_keys,
        s.soft_pinned_keys,
        s.pending_puts,
        s.clients,
        s.segments,
        st.counters.evicted_objects,
        st.counters.demoted_objects,
        st.counters.promoted_objects,
    )
}

/// The master's sockets, bound before it starts (port 0 lets the kernel choose).
pub struct Listeners {
    pub rpc: TcpListener,
    /// `/metrics`, `/health` and the admin API.
    pub metrics: TcpListener,
    /// Mooncake's HTTP metadata server, when enabled.
    pub metadata: Option<TcpListener>,
}

impl Listeners {
    /// Binds the addresses the config names.
    pub fn bind(cfg: &MasterConfig) -> Result<Listeners, MasterError> {
        Ok(Listeners {
            rpc: role::bind("rpc", &cfg.rpc_address, cfg.rpc_port)?,
            metrics: role::bind("metrics", &cfg.metrics_host, cfg.metrics_port)?,
            metadata: match cfg.enable_http_metadata_server {
                true => Some(role::bind(
                    "http metadata",
                    &cfg.http_metadata_server_host,
                    cfg.http_metadata_server_port,
                )?),
                false => None,
            },
        })
    }

    fn addrs(&self) -> std::io::Result<Addrs> {
        Ok(Addrs {
            rpc: self.rpc.local_addr()?,
            metrics: self.metrics.local_addr()?,
            metadata: role::local_addr(self.metadata.as_ref())?,
            kv_events: None,
            kv_events_replay: None,
        })
    }
}

/// Where a started master listens.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Addrs {
    pub rpc: SocketAddr,
    pub metrics: SocketAddr,
    pub metadata: Option<SocketAddr>,
    /// With `kv_events_config`: the pool's KV events' PUB endpoint as bound, and the replay's.
    #[serde(default)]
    pub kv_events: Option<String>,
    #[serde(default)]
    pub kv_events_replay: Option<String>,
}

/// A running master: its addresses, and how to stop it and wait for it.
pub type Handle = role::Handle<Addrs, MasterError>;

/// The pool's KV events' settings, when they are on.
fn pool_events_config(
    cfg: &MasterConfig,
) -> Result<Option<crate::kv_events::KvEventsConfig>, MasterError> {
    let Some(json) = &cfg.kv_events_config else {
        return Ok(None);
    };
    let c = crate::kv_events::KvEventsConfig::parse(json)
        .map_err(|e| crate::config::ConfigError::invalid("master.kv_events_config", e))?;
    Ok(c.enabled().then_some(c))
}

/// Events per published batch, at most (a batch is one ZMQ message).
const POOL_EVENTS_PER_BATCH: usize = 4096;

/// Hands the pool's events recorded since the last tick to the publisher, in batches.
fn publish_pool_events(
    publisher: &crate::kv_events::Publisher,
    events: Vec<crate::kv_events::KvEvent>,
) {
    if events.is_empty() {
        return;
    }
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let mut events = events.into_iter().peekable();
    while events.peek().is_some() {
        publisher.publish(crate::kv_events::KvEventBatch {
            ts,
            events: events.by_ref().take(POOL_EVENTS_PER_BATCH).collect(),
            attn_dp_rank: None,
        });
    }
}

/// Starts the master on bound listeners; it runs until `shutdown` fires.
pub fn start(
    cfg: MasterConfig,
    listeners: Listeners,
    shutdown: Shutdown,
) -> Result<Handle, MasterError> {
    let mut addrs = listeners.addrs()?;
    let events = match pool_events_config(&cfg)? {
        Some(c) => Some(crate::kv_events::Publisher::start(&c)?),
        None => None,
    };
    if let Some(p) = &events {
        addrs.kv_events = Some(p.endpoint.clone());
        addrs.kv_events_replay = p.replay_endpoint.clone();
    }
    let secret = crate::auth::load(cfg.auth_token_file.as_deref())?;
    crate::auth::warn_if_open("master", &cfg.rpc_address, secret.as_deref());
    let tls =
        crate::tls::optional_server(cfg.tls_cert_path.as_deref(), cfg.tls_key_path.as_deref())?;
    let mut master_state = MasterState::with_system_clock(cfg.clone());
    let tenants_file = match &cfg.tenants_file {
        Some(path) => {
            let (file, quotas) = tenants_file::TenantsFile::load(path)?;
            master_state.set_tenants(quotas);
            Some(file)
        }
        None => None,
    };
    let state = Arc::new(StateLock::new(master_state));
    let leadership = Arc::new(match cfg.enable_ha {
        true => Leadership::elected(),
        false => Leadership::single(),
    });
    let notifier = notifier::Notifier::new(
        state.clone(),
        leadership.clone(),
        cfg.store_read_lease(),
        secret.clone(),
    );
    let notifier_thread = notifier.spawn(shutdown.clone())?;
    let mover = mover::Mover::new(state.clone(), leadership.clone(), secret.clone());
    let metadata_auth = secret.clone();
    let mover_thread = mover.spawn(shutdown.clone())?;
    let copier = handover::Copier::new(
        state.clone(),
        leadership.clone(),
        secret.clone(),
        cfg.hand_over_bytes_per_sec.0,
    );
    let copier_thread = copier.spawn(shutdown.clone())?;
    let housekeeper = housekeeper::Housekeeper::new();
    let service = Arc::new(rpc::MasterService {
        state: state.clone(),
        notifier,
        stats: Arc::new(OpStats::default()),
        connections: Default::default(),
        allocations_from: parking_lot::Mutex::new(Instant::now() + cfg.put_reservation_ttl_ms.0),
        leadership: leadership.clone(),
        mover: mover.clone(),
        copier,
        housekeeper: housekeeper.clone(),
        // Mooncake's RPC carries no authentication: served beside rbgctl's only where the
        // pool has no secret (as the seeds' deployments run).
        mooncake: match secret {
            None => Some(Arc::new(crate::mooncake::master::MooncakeMaster::default())),
            Some(_) => None,
        },
    });
    let shared = Arc::new(Shared {
        state: state.clone(),
        service: service.clone(),
        started: Instant::now(),
        leadership,
        election: Default::default(),
        mover,
        history: Default::default(),
        secret: secret.clone(),
        kv_events: events.as_ref().map(|p| p.stats.clone()),
        last_snapshot: Default::default(),
    });
    let election = match cfg.enable_ha {
        true => Some(spawn_election(&cfg, &addrs, &shared, shutdown.clone())?),
        false => None,
    };
    let rpc_opts = server::ServerOptions {
        auth: secret,
        ..cfg.server_options()
    };
    // Every connection is a file: room for all the connections the master admits.
    // Each connection's socket, and the accept loop's duplicate of it (to end it at a limit).
    role::raise_open_files_limit(2 * cfg.max_connections as u64 + 1024);
    let threads = cfg.rpc_threads();
    let mut rpc = server::spawn_evented(listeners.rpc, service.clone(), rpc_opts, threads)?;
    tracing::info!(addr = %rpc.addr, threads, "master RPC listening");
    let housekeeper_thread = housekeeper.spawn(
        housekeeper::Parts {
            state: state.clone(),
            mover: shared.mover.clone(),
            notifier: service.notifier.clone(),
            history: shared.history.clone(),
            stats: service.stats.clone(),
            events,
            summary_interval: cfg.summary_interval_ms.0,
            tenants_file,
        },
        shutdown.clone(),
    )?;
    let runtime = role::runtime("master-http", Some(2))?;
    let (metrics, metadata) = {
        let _guard = runtime.enter();
        (
            role::async_listener(listeners.metrics)?,
            listeners.metadata.map(role::async_listener).transpose()?,
        )
    };
    tracing::info!(addr = %addrs.metrics, "master metrics and admin API listening");
    runtime.spawn(crate::http_server::serve_tls(
        metrics,
        http::admin_router(shared.clone()),
        shutdown.clone(),
        Default::default(),
        tls.clone(),
        None,
    ));
    if let Some(listener) = metadata {
        tracing::info!(addr = ?addrs.metadata, "HTTP metadata server listening");
        crate::auth::warn_if_open(
            "metadata server",
            &cfg.http_metadata_server_host,
            metadata_auth.as_deref(),
        );
        let store = Arc::new(Mutex::new(metadata::MetadataStore::new(metadata::Limits {
            max_bytes: cfg.http_metadata_max_bytes.0,
            max_keys: cfg.http_metadata_max_keys,
            max_value_bytes: cfg.http_metadata_max_value_bytes.0,
        })));
        let limits = crate::http_server::HttpLimits {
            max_body_bytes: cfg.http_metadata_max_value_bytes.0 as usize,
            ..Default::default()
        };
        runtime.spawn(crate::http_server::serve_tls(
            listener,
            http::metadata_router(
                store,
                shared.leadership.clone(),
                metadata_auth,
                cfg.http_metadata_max_value_bytes.0 as usize,
            ),
            shutdown.clone(),
            limits,
            tls,
            None,
        ));
    }
    role::announce("master", &addrs);
    let stop = shutdown.clone();
    let threads_to_wake = (service.notifier.clone(), shared.mover.clone(), housekeeper);
    Ok(Handle::spawn("master", addrs, shutdown, move || {
        runtime.block_on(stop.wait());
        tracing::info!("master stopping");
        if let Some(e) = election {
            // Resigns first, so that a standby takes over before this master's RPC stops.
            let _ = e.join();
        }
        rpc.stop();
        // The three sleep until woken when idle: woken, they see the stop.
        threads_to_wake.2.wake();
        let _ = housekeeper_thread.join();
        threads_to_wake.0.wake();
        threads_to_wake.1.wake();
        let _ = notifier_thread.join();
        let _ = mover_thread.join();
        let _ = copier_thread.join();
        runtime.shutdown_timeout(Duration::from_secs(5));
        Ok(())
    })?)
}

/// Runs the master on the addresses of its config until SIGINT or SIGTERM.
pub fn run(cfg: MasterConfig) -> Result<(), MasterError> {
    let listeners = Listeners::bind(&cfg)?;
    start(cfg, listeners, Shutdown::on_signals()?)?.wait()
}
