//! `rbgctl store`: a storage node. It contributes one segment of memory to the pool, registers it
//! with the master and heartbeats, and serves reads and writes of byte ranges that the master
//! assigned to clients. The same machinery runs embedded in a client that contributes memory.

pub mod config;
pub mod registration;
pub mod segment;
pub mod server;

use crate::telemetry::{OpStats, PromText};
use crate::transfer::message::SegmentInfo;
use crate::transfer::server::{self as tserver, ServerHandle, ServerOptions};
use crate::transfer::Opcode;
use config::StoreConfig;
use registration::Registration;
use segment::{SegmentError, SegmentMemory};
use server::StoreService;
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Segment(#[from] SegmentError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// A running store: data server, segment, heartbeat.
pub struct Store {
    pub service: Arc<StoreService>,
    pub registration: Arc<Registration>,
    server: ServerHandle,
    pub name: String,
    pub endpoint: String,
}

impl Store {
    /// Binds, creates the segment and starts serving and heartbeating (in background threads).
    pub fn start(cfg: &StoreConfig) -> Result<Store, StoreError> {
        if cfg.protocol == "rdma" {
            tracing::warn!(device = %cfg.device,
                "protocol rdma requested, but this build has no RDMA transport; serving over TCP");
        }
        let addr = format!("{}:{}", cfg.bind_address, cfg.port);
        let listener =
            TcpListener::bind(&addr).map_err(|source| StoreError::Bind { addr, source })?;
        let port = listener.local_addr()?.port();
        let endpoint = format!("{}:{port}", cfg.local_hostname);
        let name = cfg.name.clone().unwrap_or_else(|| endpoint.clone());
        let memory = if cfg.segment_size.0 > 0 {
            Some(Arc::new(SegmentMemory::create(
                &cfg.shm_dir,
                &name,
                cfg.segment_size.0,
            )?))
        } else {
            tracing::warn!("segment_size is 0: this store contributes no memory (pure client)");
            None
        };
        let segment = memory.as_ref().map(|m| {
            let (shm_path, shm_token) = m
                .shared_file()
                .map(|(p, t)| (p.display().to_string(), t))
                .unwrap_or_default();
            SegmentInfo {
                name: name.clone(),
                endpoint: endpoint.clone(),
                size: m.size(),
                shm_path,
                shm_token,
                host_id: crate::transfer::local_host_id(),
            }
        });
        let service = Arc::new(StoreService {
            name: name.clone(),
            memory,
            stats: OpStats::default(),
            bytes_written: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            bad_frames: AtomicU64::new(0),
        });
        let server = tserver::spawn(
            listener,
            service.clone(),
            ServerOptions {
                max_connections: cfg.max_connections,
                spin: Duration::from_micros(cfg.poll_spin_us),
                role: "store",
            },
        )?;
        let metadata_server = cfg
            .metadata_server
            .starts_with("http")
            .then(|| cfg.metadata_server.clone());
        let registration = Arc::new(Registration::new(
            &cfg.master,
            segment,
            metadata_server,
            cfg.heartbeat_interval_ms.0,
        ));
        let reg = registration.clone();
        std::thread::Builder::new()
            .name("store-heartbeat".into())
            .spawn(move || reg.run())?;
        tracing::info!(%name, %endpoint, segment_bytes = cfg.segment_size.0, master = %cfg.master,
            local_buffer_bytes = cfg.local_buffer_size.0, "store serving");
        Ok(Store {
            service,
            registration,
            server,
            name,
            endpoint,
        })
    }

    /// Unmounts from the master and stops accepting connections.
    pub fn shutdown(&mut self) {
        self.registration.stop.store(true, Ordering::SeqCst);
        self.registration.unmount();
        self.server.stop();
    }

    pub fn metrics_text(&self) -> String {
        let s = &self.service;
        let mut p = PromText::new();
        p.single(
            "rbgctl_store_segment_bytes",
            "gauge",
            "Bytes of memory contributed.",
            s.memory.as_ref().map_or(0, |m| m.size()) as f64,
        )
        .single(
            "rbgctl_store_mounted",
            "gauge",
            "1 while the master has the segment mounted.",
            (self.registration.segment_id.load(Ordering::SeqCst) != 0) as u8 as f64,
        )
        .single(
            "rbgctl_store_written_bytes_total",
            "counter",
            "Payload bytes written into the segment.",
            s.bytes_written.load(Ordering::Relaxed) as f64,
        )
        .single(
            "rbgctl_store_read_bytes_total",
            "counter",
            "Payload bytes read from the segment.",
            s.bytes_read.load(Ordering::Relaxed) as f64,
        )
        .single(
            "rbgctl_store_bad_frames_total",
            "counter",
            "Connections closed because of malformed input.",
            s.bad_frames.load(Ordering::Relaxed) as f64,
        );
        s.stats.render(&mut p, "rbgctl_store", |op| {
            Opcode::from_u8(op).map(|o| o.name())
        });
        p.finish()
    }
}

/// Runs `rbgctl store` until SIGINT or SIGTERM, then unmounts cleanly.
pub fn run(cfg: StoreConfig) -> Result<(), StoreError> {
    // Bind the metrics port before registering: a store that cannot serve never mounts.
    let metrics_addr = format!("{}:{}", cfg.metrics_host, cfg.metrics_port);
    let metrics_listener = TcpListener::bind(&metrics_addr).map_err(|source| StoreError::Bind {
        addr: metrics_addr,
        source,
    })?;
    let store = Arc::new(parking_lot::Mutex::new(Store::start(&cfg)?));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("store-http")
        .enable_all()
        .build()?;
    let http_store = store.clone();
    runtime.block_on(async move {
        metrics_listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(metrics_listener)?;
        tracing::info!(addr = %listener.local_addr()?, "store metrics listening");
        let app = axum::Router::new()
            .route("/metrics", axum::routing::get({
                let s = http_store.clone();
                move || async move { s.lock().metrics_text() }
            }))
            .route("/health", axum::routing::get({
                let s = http_store.clone();
                move || async move {
                    let st = s.lock();
                    let mounted = st.registration.mounted();
                    let body = serde_json::json!({"status": if mounted {"ok"} else {"unregistered"},
                        "segment": st.name, "endpoint": st.endpoint, "mounted": mounted});
                    let code = if mounted { axum::http::StatusCode::OK } else { axum::http::StatusCode::SERVICE_UNAVAILABLE };
                    (code, axum::Json(body))
                }
            }));
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "store metrics server failed");
            }
        });
        crate::shutdown_signal().await;
        Ok::<(), StoreError>(())
    })?;
    tracing::info!("store stopping");
    store.lock().shutdown();
    Ok(())
}
