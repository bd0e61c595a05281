//! `rbgctl store`: a storage node. It contributes one segment of memory to the pool, registers it
//! with the master and heartbeats, and serves reads and writes of byte ranges that the master
//! assigned to clients. The same machinery runs embedded in a client that contributes memory.

pub mod config;
pub mod index;
pub mod registration;
pub mod segment;
pub mod server;

use crate::telemetry::{OpStats, PromText};
use crate::transfer::message::SegmentInfo;
use crate::transfer::server::{self as tserver, ServerHandle, ServerOptions};
use crate::transfer::Opcode;
use config::StoreConfig;
use index::{DurableIndex, IndexError, Opened};
use registration::Registration;
use segment::{DirLock, SegmentError, SegmentMemory};
use server::StoreService;
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Segment(#[from] SegmentError),
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// What a persistent store found at start-up.
#[derive(Clone, Debug, Default)]
pub struct Recovery {
    /// Objects kept from the previous run (after checksum verification).
    pub objects: u64,
    /// Objects whose bytes failed their checksum, dropped.
    pub corrupt: u64,
    /// Bytes of a torn last index entry that were cut off.
    pub torn_bytes: u64,
    /// Time to open, map and verify.
    pub seconds: f64,
}

/// A running store: data server, segment, heartbeat.
pub struct Store {
    pub service: Arc<StoreService>,
    pub registration: Arc<Registration>,
    server: ServerHandle,
    pub name: String,
    pub endpoint: String,
    _lock: Option<DirLock>,
}

/// The segment, its index and lock, and what recovery found.
type Opened3 = (
    SegmentMemory,
    Option<(Arc<DurableIndex>, DirLock, Recovery)>,
);

/// Opens a persistent segment: directory checks, exclusive lock, index replay, mapping of the
/// old file, and checksum verification of every object it held.
fn open_persistent(cfg: &StoreConfig, name: &str) -> Result<Opened3, StoreError> {
    let t0 = Instant::now();
    let dir = &cfg.shm_dir;
    let size = cfg.segment_size.0;
    let stem = segment::file_stem(name);
    segment::prepare_dir(dir)?;
    let lock = DirLock::acquire(dir, &stem)?;
    let (index, opened) = DurableIndex::open(dir, &stem, name, size)?;
    let torn_bytes = match opened {
        Opened::Existing { torn_bytes } => Some(torn_bytes),
        Opened::Fresh => None,
    };
    let (memory, kept) = SegmentMemory::open_persistent(dir, &stem, size, torn_bytes.is_some())?;
    let mut rec = Recovery {
        torn_bytes: torn_bytes.unwrap_or(0),
        ..Recovery::default()
    };
    if !kept && !index.is_empty() {
        tracing::warn!(path = %index.path().display(),
            "segment file missing or of another size; its index is void, starting empty");
        index.clear()?;
    }
    if kept {
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        let bad = index.verify(&memory, threads)?;
        for o in bad.iter().take(10) {
            tracing::warn!(key = %o.key, offset = o.offset, size = o.size,
                "object bytes fail their checksum; dropped");
        }
        rec.corrupt = bad.len() as u64;
        rec.objects = index.len() as u64;
    }
    rec.seconds = t0.elapsed().as_secs_f64();
    tracing::info!(dir = %dir.display(), kept, objects = rec.objects, corrupt = rec.corrupt,
        seconds = rec.seconds, "persistent segment opened");
    Ok((memory, Some((Arc::new(index), lock, rec))))
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
        if cfg.persistent && cfg.segment_size.0 > 0 && !cfg.effective_persistence() {
            tracing::warn!(
                "no stable store name (neither name nor a fixed port is set): objects \
                will not be kept across restarts"
            );
        }
        let (memory, persistence) = if cfg.effective_persistence() {
            let (m, p) = open_persistent(cfg, &name)?;
            (Some(Arc::new(m)), p)
        } else if cfg.segment_size.0 > 0 {
            let m = SegmentMemory::create(&cfg.shm_dir, &name, cfg.segment_size.0)?;
            (Some(Arc::new(m)), None)
        } else {
            tracing::warn!("segment_size is 0: this store contributes no memory (pure client)");
            (None, None)
        };
        let (index, lock, recovery) = match persistence {
            Some((i, l, r)) => (Some(i), Some(l), Some(r)),
            None => (None, None, None),
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
                segment_uuid: index.as_ref().map_or(0, |i| i.uuid()),
            }
        });
        let service = Arc::new(StoreService {
            name: name.clone(),
            memory,
            index: index.clone(),
            recovery: recovery.unwrap_or_default(),
            index_errors: AtomicU64::new(0),
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
            index,
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
            _lock: lock,
        })
    }

    /// Unmounts from the master (a persistent store asks it to keep the objects for its return)
    /// and stops accepting connections.
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
            "rbgctl_store_persistent",
            "gauge",
            "1 when objects are kept across restarts.",
            s.index.is_some() as u8 as f64,
        )
        .single(
            "rbgctl_store_index_records",
            "gauge",
            "Objects in the durable index.",
            s.index.as_ref().map_or(0, |i| i.len()) as f64,
        )
        .single(
            "rbgctl_store_recovered_objects",
            "gauge",
            "Objects kept from the previous run at start-up.",
            s.recovery.objects as f64,
        )
        .single(
            "rbgctl_store_recovery_corrupt_objects",
            "gauge",
            "Objects dropped at start-up because their bytes failed the checksum.",
            s.recovery.corrupt as f64,
        )
        .single(
            "rbgctl_store_recovery_seconds",
            "gauge",
            "Time to open, map and verify the persistent segment at start-up.",
            s.recovery.seconds,
        )
        .single(
            "rbgctl_store_index_errors_total",
            "counter",
            "Index writes that failed (the request failed with them).",
            s.index_errors.load(Ordering::Relaxed) as f64,
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
