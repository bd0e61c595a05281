//! `rbgctl master`: the KV-cache pool manager. It owns the metadata — which stores contribute
//! which segments, where every object's replicas are, leases and pins — and never touches object
//! bytes, which move directly between clients and stores.
//!
//! Parts: `state` (the state machine), `allocator` (space in a segment), `placement` (which
//! segments), `eviction` (which objects), `rpc` (the binary protocol service), `metadata` and
//! `http` (HTTP servers), `config`.

pub mod allocator;
pub mod config;
pub mod eviction;
pub mod http;
pub mod metadata;
pub mod notifier;
pub mod placement;
pub mod rpc;
pub mod state;

use crate::config::human_bytes;
use crate::telemetry::OpStats;
use crate::transfer::server::{self, ServerOptions};
use config::MasterConfig;
use parking_lot::Mutex;
use state::MasterState;
use std::net::TcpListener;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Errors that stop the master.
#[derive(Debug, thiserror::Error)]
pub enum MasterError {
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        what: &'static str,
        addr: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// State shared by the RPC threads, the housekeeper and the HTTP handlers.
pub struct Shared {
    pub state: Arc<Mutex<MasterState>>,
    pub service: Arc<rpc::MasterService>,
    pub started: Instant,
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
        "Storage: {} / {} ({pct:.1}%) | Keys: {} (soft-pinned: {}, pending: {}) | Clients: {} | Segments: {} | Evicted: {}",
        human_bytes(s.used_bytes),
        human_bytes(s.capacity_bytes),
        s.keys,
        s.soft_pinned_keys,
        s.pending_puts,
        s.clients,
        s.segments,
        st.counters.evicted_objects,
    )
}

fn bind(what: &'static str, host: &str, port: u16) -> Result<TcpListener, MasterError> {
    let addr = format!("{host}:{port}");
    TcpListener::bind(&addr).map_err(|source| MasterError::Bind { what, addr, source })
}

/// Runs the master until SIGINT or SIGTERM.
pub fn run(cfg: MasterConfig) -> Result<(), MasterError> {
    let state = Arc::new(Mutex::new(MasterState::new(cfg.clone())));
    let notifier = notifier::Notifier::new(state.clone());
    notifier.spawn()?;
    let service = Arc::new(rpc::MasterService {
        state: state.clone(),
        notifier,
        stats: Arc::new(OpStats::default()),
        bad_frames: AtomicU64::new(0),
    });
    let shared = Arc::new(Shared {
        state: state.clone(),
        service: service.clone(),
        started: Instant::now(),
    });

    let rpc_listener = bind("rpc", &cfg.rpc_address, cfg.rpc_port)?;
    let metrics_listener = bind("metrics", &cfg.metrics_host, cfg.metrics_port)?;
    let metadata_listener = if cfg.enable_http_metadata_server {
        Some(bind(
            "http metadata",
            &cfg.http_metadata_server_host,
            cfg.http_metadata_server_port,
        )?)
    } else {
        None
    };

    let mut rpc = server::spawn(
        rpc_listener,
        service.clone(),
        ServerOptions {
            max_connections: cfg.max_connections,
            spin: Duration::from_micros(cfg.poll_spin_us),
            role: "master",
        },
    )?;
    tracing::info!(addr = %rpc.addr, "master RPC listening");

    let housekeeper = {
        let state = state.clone();
        let interval = cfg.summary_interval_ms.0;
        std::thread::Builder::new()
            .name("master-housekeeper".into())
            .spawn(move || {
                let mut last_summary = Instant::now();
                loop {
                    std::thread::sleep(Duration::from_millis(50));
                    let now = Instant::now();
                    let mut st = state.lock();
                    st.housekeeping(now);
                    if now.duration_since(last_summary) >= interval {
                        last_summary = now;
                        tracing::info!("{}", summary_line(&st, now));
                    }
                }
            })?
    };
    drop(housekeeper);

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("master-http")
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        metrics_listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(metrics_listener)?;
        tracing::info!(addr = %listener.local_addr()?, "master metrics and admin API listening");
        tokio::spawn(serve(listener, http::admin_router(shared.clone())));
        if let Some(l) = metadata_listener {
            l.set_nonblocking(true)?;
            let listener = tokio::net::TcpListener::from_std(l)?;
            tracing::info!(addr = %listener.local_addr()?, "HTTP metadata server listening");
            let store = Arc::new(Mutex::new(metadata::MetadataStore::default()));
            tokio::spawn(serve(listener, http::metadata_router(store)));
        }
        crate::shutdown_signal().await;
        Ok::<(), MasterError>(())
    })?;
    tracing::info!("master stopping");
    rpc.stop();
    Ok(())
}

async fn serve(listener: tokio::net::TcpListener, app: axum::Router) {
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!(error = %e, "HTTP server failed");
    }
}
