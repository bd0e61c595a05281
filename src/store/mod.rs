//! `rbgctl store`: a storage node. It contributes one segment of memory to the pool, registers it
//! with the master and heartbeats, and serves reads and writes of byte ranges that the master
//! assigned to clients. The same machinery runs embedded in a client that contributes memory.

pub mod access;
pub mod claims;
pub mod config;
pub mod disk;
pub mod hasher;
pub mod index;
pub mod mooncake;
pub mod registration;
pub mod segment;
pub mod server;
pub mod tier;

use crate::role::{self, BindError};
use crate::shutdown::Shutdown;
use crate::telemetry::{Family, OpStats, PromText};
use crate::transfer::grant::GrantKey;
use crate::transfer::message::{SegmentInfo, Tier};
use crate::transfer::server::{self as tserver, ServerHandle};
use crate::transfer::Opcode;
use access::Access;
use config::StoreConfig;
use index::{DurableIndex, IndexError, Opened};
use registration::Registration;
use segment::{DirLock, SegmentError, SegmentMemory};
use serde::{Deserialize, Serialize};
use server::StoreService;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

// The `/metrics` families this file writes, each declared once.
const CHECKSUM_MISMATCHES_TOTAL: Family = Family::counter(
    "rbgctl_store_checksum_mismatches_total",
    "Checked writes refused: their bytes did not match the CRC-32C their writer sent.",
);
const DEMOTED_BYTES_TOTAL: Family = Family::counter(
    "rbgctl_store_demoted_bytes_total",
    "Bytes copied from memory to the disk tier.",
);
const DEMOTIONS_TOTAL: Family = Family::counter(
    "rbgctl_store_demotions_total",
    "Objects copied from memory to the disk tier.",
);
const DISK_CHECKSUM_FAILURES_TOTAL: Family = Family::counter(
    "rbgctl_store_disk_checksum_failures_total",
    "Moves refused because the source bytes failed their checksum.",
);
const DISK_ERRORS_TOTAL: Family = Family::counter(
    "rbgctl_store_disk_errors_total",
    "Disk tier reads and writes the filesystem failed.",
);
const DISK_INDEX_ERRORS_TOTAL: Family = Family::counter(
    "rbgctl_store_disk_index_errors_total",
    "Disk tier index writes that failed.",
);
const DISK_READS_TOTAL: Family = Family::counter(
    "rbgctl_store_disk_reads_total",
    "Reads served from the disk tier.",
);
const DISK_READ_BYTES_TOTAL: Family = Family::counter(
    "rbgctl_store_disk_read_bytes_total",
    "Payload bytes read from the disk tier.",
);
const DISK_STALE_READS_TOTAL: Family = Family::counter(
    "rbgctl_store_disk_stale_reads_total",
    "Version-checked disk tier reads refused (stale location or no lease).",
);
const DISK_TIER_BYTES: Family = Family::gauge(
    "rbgctl_store_disk_tier_bytes",
    "Bytes of the disk tier's file.",
);
const DISK_TIER_DIRECT_IO: Family = Family::gauge(
    "rbgctl_store_disk_tier_direct_io",
    "1 when the disk tier bypasses the page cache (O_DIRECT).",
);
const DISK_TIER_MOUNTED: Family = Family::gauge(
    "rbgctl_store_disk_tier_mounted",
    "1 while the master has the disk tier's segment mounted.",
);
const DISK_TIER_RECORDS: Family = Family::gauge(
    "rbgctl_store_disk_tier_records",
    "Objects the disk tier holds a record of.",
);
const DISK_UNGRANTED_TOTAL: Family = Family::counter(
    "rbgctl_store_disk_ungranted_total",
    "Moves and forgets to the disk tier refused: not tagged by the master.",
);
const HASHED_LATER_BYTES_TOTAL: Family = Family::counter(
    "rbgctl_store_hashed_later_bytes_total",
    "Bytes hashed after their put was answered.",
);
const HASHED_LATER_OBJECTS_TOTAL: Family = Family::counter(
    "rbgctl_store_hashed_later_objects_total",
    "Objects hashed after their put was answered.",
);
const HASHES_REPORTED_TOTAL: Family = Family::counter(
    "rbgctl_store_hashes_reported_total",
    "Checksums of objects hashed after their put sent to the master.",
);
const HASH_REPORT_FAILURES_TOTAL: Family = Family::counter(
    "rbgctl_store_hash_report_failures_total",
    "Requests carrying such checksums that the master did not answer (it keeps those objects unhashed).",
);
const INDEX_ERRORS_TOTAL: Family = Family::counter(
    "rbgctl_store_index_errors_total",
    "Index writes that failed (the request failed with them).",
);
const INDEX_RECORDS: Family = Family::gauge(
    "rbgctl_store_index_records",
    "Objects the store has a record of (in its durable index when persistent).",
);
const MOUNTED: Family = Family::gauge(
    "rbgctl_store_mounted",
    "1 while the master has the segment mounted.",
);
const PERSISTENT: Family = Family::gauge(
    "rbgctl_store_persistent",
    "1 when objects are kept across restarts.",
);
const PROMOTED_BYTES_TOTAL: Family = Family::counter(
    "rbgctl_store_promoted_bytes_total",
    "Bytes copied from the disk tier back to memory.",
);
const PROMOTIONS_TOTAL: Family = Family::counter(
    "rbgctl_store_promotions_total",
    "Objects copied from the disk tier back to memory.",
);
const RDMA_DEVICE_QUEUE_PAIRS_TOTAL: Family = Family::counter(
    "rbgctl_store_rdma_device_queue_pairs_total",
    "RDMA queue pairs connected for clients, by the device (NIC) they use.",
);
const RDMA_QUEUE_PAIRS_TOTAL: Family = Family::counter(
    "rbgctl_store_rdma_queue_pairs_total",
    "RDMA queue pairs connected for clients (each lives as long as its TCP connection).",
);
const RDMA_SEALED_BYTES_TOTAL: Family = Family::counter(
    "rbgctl_store_rdma_sealed_bytes_total",
    "Bytes clients wrote into the segment with RDMA WRITE, checked against their CRC-32C \
             and recorded.",
);
const READ_BYTES_TOTAL: Family = Family::counter(
    "rbgctl_store_read_bytes_total",
    "Payload bytes read from the segment.",
);
const READ_LEASE: Family = Family::gauge(
    "rbgctl_store_read_lease",
    "1 while the master's lease lets this store answer reads of cached locations.",
);
const RECOVERED_OBJECTS: Family = Family::gauge(
    "rbgctl_store_recovered_objects",
    "Objects kept from the previous run at start-up.",
);
const RECOVERY_CORRUPT_OBJECTS: Family = Family::gauge(
    "rbgctl_store_recovery_corrupt_objects",
    "Objects dropped at start-up because their bytes failed the checksum.",
);
const RECOVERY_SECONDS: Family = Family::gauge(
    "rbgctl_store_recovery_seconds",
    "Time to open, map and verify the persistent segment at start-up.",
);
const SEALED_BYTES_TOTAL: Family = Family::counter(
    "rbgctl_store_sealed_bytes_total",
    "Bytes same-host clients copied into the segment through shared memory and reported \
             (persistent stores; a non-persistent store is not told of such copies).",
);
const SEGMENT_BYTES: Family =
    Family::gauge("rbgctl_store_segment_bytes", "Bytes of memory contributed.");
const SEGMENT_PREFAULTED_BYTES: Family = Family::gauge(
    "rbgctl_store_segment_prefaulted_bytes",
    "Bytes of the segment whose pages are faulted in (done in the background after start).",
);
const SEGMENT_PREFAULT_ENDED: Family = Family::gauge(
    "rbgctl_store_segment_prefault_ended",
    "1 once the background prefault has finished (all pages, or as far as the kernel allows), or when none runs (prefault = false).",
);
const STALE_READS_TOTAL: Family = Family::counter(
    "rbgctl_store_stale_reads_total",
    "Reads of a cached location refused (the version moved, or no lease): the client \
             asked the master instead.",
);
const STALE_WRITES_TOTAL: Family = Family::counter(
    "rbgctl_store_stale_writes_total",
    "Writes refused because an earlier master (restarted or deposed) started their put; \
             the client starts it again.",
);
const SUPERSEDED_WRITES_TOTAL: Family = Family::counter(
    "rbgctl_store_superseded_writes_total",
    "Writes refused because a newer put holds or is writing their range (their put was \
             given up: late bytes from a writer that stopped waiting), or an older put was still \
             writing it.",
);
const UNGRANTED_TOTAL: Family = Family::counter(
    "rbgctl_store_ungranted_total",
    "Writes and seals refused because the master granted no such write (range, size, \
             version), and forgets refused because the master did not tag them.",
);
const UNHASHED_OBJECTS: Family = Family::gauge(
    "rbgctl_store_unhashed_objects",
    "Objects recorded before their bytes were hashed (Mooncake's one-sided writes), waiting for the hasher.",
);
const USED_BYTES: Family = Family::gauge(
    "rbgctl_store_used_bytes",
    "Bytes of the segment holding objects, as the master accounts them (refreshed every \
             few seconds).",
);
const WRITTEN_BYTES_TOTAL: Family = Family::counter(
    "rbgctl_store_written_bytes_total",
    "Payload bytes written into the segment over TCP.",
);

/// Why a store could not start or went down.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Bind(#[from] BindError),
    #[error(transparent)]
    Segment(#[from] SegmentError),
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("{0}")]
    NameTaken(String),
    #[error(transparent)]
    Disk(#[from] disk::DiskError),
    #[error(transparent)]
    Auth(#[from] crate::auth::AuthError),
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    #[error(transparent)]
    Grant(#[from] crate::transfer::grant::GrantError),
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
    pub status: Arc<StoreStatus>,
    server: ServerHandle,
    heartbeat: Option<JoinHandle<()>>,
    /// Faults the segment's pages in while the store already serves.
    prefault: Option<JoinHandle<()>>,
    /// Hashes what came in one-sided after its put was answered.
    hasher: Option<JoinHandle<()>>,
    /// How long a stop may spend handing the objects over first (`hand_over_secs`).
    hand_over: Duration,
    _lock: Option<DirLock>,
}

/// How often a stopping store asks how its hand-over goes.
const HAND_OVER_POLL: Duration = Duration::from_millis(100);
/// Past its deadline, how long a stopping store waits for the master to say it ended.
const HAND_OVER_SLACK: Duration = Duration::from_secs(5);

/// What the store's HTTP endpoints read.
pub struct StoreStatus {
    pub service: Arc<StoreService>,
    pub registration: Arc<Registration>,
    pub name: String,
    pub endpoint: String,
    pub disk: Option<DiskTier>,
    /// Mooncake's Transfer Engine and handshake into the memory segment, when served.
    pub mooncake: Option<mooncake::MooncakeDoor>,
}

/// A running disk tier: its segment's data service and registration.
pub struct DiskTier {
    pub service: Arc<tier::DiskService>,
    pub registration: Arc<Registration>,
    pub endpoint: String,
    server: parking_lot::Mutex<Option<ServerHandle>>,
    heartbeat: parking_lot::Mutex<Option<JoinHandle<()>>>,
    _lock: DirLock,
}

/// A non-persistent segment's incarnation: this process's. Its memory outlives a master
/// restart or failover, so the store mounts it again under the same id and reports what it holds.
fn incarnation() -> u64 {
    fastrand::u64(1..)
}

/// The disk tier's segment name: the store's, with `/disk`.
pub fn disk_segment_name(store: &str) -> String {
    format!("{store}/disk")
}

impl DiskTier {
    /// Opens the disk tier of `cfg` (its directory must exist) and starts serving it on
    /// `listener`, registered with the master as `client_id`'s second segment.
    fn start(
        cfg: &StoreConfig,
        store_name: &str,
        host: &str,
        listener: TcpListener,
        memory: (&Arc<SegmentMemory>, &Arc<index::Records>),
        (client_id, grant_key): (u64, &GrantKey),
    ) -> Result<DiskTier, StoreError> {
        let Some(dir) = &cfg.disk_tier else {
            return Err(crate::config::ConfigError::invalid("store.disk_tier", "not set").into());
        };
        let size = cfg.disk_tier_size.0;
        let name = disk_segment_name(store_name);
        let stem = format!("{}-disk", segment::file_stem(store_name));
        if !dir.is_dir() {
            return Err(disk::DiskError::Missing(dir.clone()).into());
        }
        let access = Access::new(cfg.shm_group.as_deref())?;
        access.prepare_dir(dir)?;
        let lock = DirLock::acquire(dir, &stem)?;
        let area = Arc::new(disk::DiskArea::open(dir, &stem, size)?);
        let records = if cfg.effective_persistence() {
            let (index, _) = DurableIndex::open(dir, &stem, &name, size)?;
            index::Records::Durable(Arc::new(index))
        } else {
            index::Records::in_memory()
        };
        let records = Arc::new(records);
        let endpoint = format!("{host}:{}", listener.local_addr()?.port());
        // Same-host clients read the file directly once they find this token beside it.
        let token = fastrand::u64(1..);
        let token_path = area.path().with_extension("token");
        std::fs::write(&token_path, format!("{token:016x}\n"))?;
        access.apply(area.path(), access::FileKind::Segment)?;
        access.apply_all(dir, &stem)?;
        let info = SegmentInfo {
            name: name.clone(),
            endpoint: endpoint.clone(),
            size,
            shm_path: area.path().display().to_string(),
            shm_token: token,
            host_id: crate::transfer::local_host_id(),
            segment_uuid: records.durable().map_or_else(incarnation, |i| i.uuid()),
            tier: Tier::Disk,
            persistent: records.durable().is_some(),
            ..SegmentInfo::default()
        };
        let service = Arc::new(tier::DiskService::new(
            name.clone(),
            area.clone(),
            records.clone(),
            memory.0.clone(),
            memory.1.clone(),
            grant_key.clone(),
        ));
        let secret = crate::auth::load(cfg.auth_token_file.as_deref())?;
        let opts = tserver::ServerOptions {
            auth: secret.clone(),
            ..cfg.server_options()
        };
        let server = tserver::spawn(listener, service.clone(), opts)?;
        let mut registration = Registration::new(
            &cfg.master,
            Some(info),
            records.clone(),
            service.lease.clone(),
            None,
            cfg.heartbeat_interval_ms.0,
            (secret, grant_key.clone()),
        )
        .map_err(|e| crate::config::ConfigError::invalid("store.master", e.to_string()))?;
        registration.client_id = client_id;
        registration.conflict_wait = cfg.name_conflict_wait_ms.0;
        let registration = Arc::new(registration);
        let reg = registration.clone();
        let heartbeat = std::thread::Builder::new()
            .name("store-disk-heartbeat".into())
            .spawn(move || reg.run())?;
        tracing::info!(%name, %endpoint, bytes = size, dir = %dir.display(), direct_io = area.direct(),
            records = records.len(), "disk tier serving");
        Ok(DiskTier {
            service,
            registration,
            endpoint,
            server: parking_lot::Mutex::new(Some(server)),
            heartbeat: parking_lot::Mutex::new(Some(heartbeat)),
            _lock: lock,
        })
    }

    fn render(&self, p: &mut PromText) {
        let s = &self.service;
        let c = &s.counters;
        let n = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        p.single(&DISK_TIER_BYTES, s.area.size() as f64)
            .single(
                &DISK_TIER_MOUNTED,
                f64::from(u8::from(self.registration.mounted())),
            )
            .single(&DISK_TIER_DIRECT_IO, f64::from(u8::from(s.area.direct())))
            .single(&DISK_TIER_RECORDS, s.records.len() as f64)
            .single(&DISK_READS_TOTAL, n(&c.reads))
            .single(&DISK_READ_BYTES_TOTAL, n(&c.bytes_read))
            .single(&DEMOTIONS_TOTAL, n(&c.demoted))
            .single(&DEMOTED_BYTES_TOTAL, n(&c.demoted_bytes))
            .single(&PROMOTIONS_TOTAL, n(&c.promoted))
            .single(&PROMOTED_BYTES_TOTAL, n(&c.promoted_bytes))
            .single(&DISK_CHECKSUM_FAILURES_TOTAL, n(&c.checksum_failures))
            .single(&DISK_UNGRANTED_TOTAL, n(&s.grants.refused))
            .single(&DISK_ERRORS_TOTAL, n(&c.io_errors))
            .single(&DISK_INDEX_ERRORS_TOTAL, n(&c.index_errors))
            .single(&DISK_STALE_READS_TOTAL, n(&c.stale_reads));
    }

    fn stop_heartbeat(&self) {
        self.registration.stop.trigger();
        if let Some(h) = self.heartbeat.lock().take() {
            let _ = h.join();
        }
    }

    fn stop_serving(&self) {
        if let Some(mut server) = self.server.lock().take() {
            server.stop();
        }
    }
}

/// The segment, its index and lock, and what recovery found.
type Opened3 = (
    SegmentMemory,
    Option<(Arc<DurableIndex>, DirLock, Recovery)>,
);

/// Opens a non-persistent segment: removes the files dead non-persistent stores left in the
/// directory, takes the segment's lock (it goes at exit, with the files) and creates the
/// segment. The lock also tells same-host clients whether this store still runs.
fn open_ephemeral(
    cfg: &StoreConfig,
    access: &Access,
    name: &str,
) -> Result<(SegmentMemory, DirLock), StoreError> {
    let dir = &cfg.shm_dir;
    access.prepare_dir(dir)?;
    let freed = segment::sweep_stale(dir);
    if freed > 0 {
        tracing::info!(dir = %dir.display(), bytes = freed, "stale segment files removed");
    }
    let stem = segment::file_stem(name);
    let lock = DirLock::acquire_ephemeral(dir, &stem)?;
    let memory = SegmentMemory::create(dir, name, cfg.segment_size.0)?;
    access.apply_all(dir, &stem)?;
    Ok((memory, lock))
}

/// Opens a persistent segment: directory checks, exclusive lock, index replay, mapping of the
/// old file, and checksum verification of every object it held.
fn open_persistent(cfg: &StoreConfig, access: &Access, name: &str) -> Result<Opened3, StoreError> {
    let t0 = Instant::now();
    let dir = &cfg.shm_dir;
    let size = cfg.segment_size.0;
    let stem = segment::file_stem(name);
    access.prepare_dir(dir)?;
    let lock = DirLock::acquire(dir, &stem)?;
    let (index, opened) = DurableIndex::open(dir, &stem, name, size)?;
    let torn_bytes = match opened {
        Opened::Existing { torn_bytes } => Some(torn_bytes),
        Opened::Fresh => None,
    };
    let (memory, kept) = SegmentMemory::open_persistent(dir, &stem, size, torn_bytes.is_some())?;
    access.apply_all(dir, &stem)?;
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

/// Registers the memory segment on the store's RDMA devices (`device`), so that clients can
/// READ and WRITE it one-sidedly.
#[cfg(feature = "rdma")]
fn register_rdma(
    cfg: &StoreConfig,
    mem: &Arc<segment::SegmentMemory>,
    stamps: Arc<crate::transfer::stamps::StampTable>,
) -> Result<crate::transfer::rdma::serve::RdmaSegment, StoreError> {
    use crate::transfer::rdma::{nic, serve::RdmaSegment};
    let bad = |e: crate::transfer::rdma::verbs::VerbsError| {
        StoreError::Config(crate::config::ConfigError::invalid(
            "store.device",
            e.to_string(),
        ))
    };
    let nics = nic::open_all(&cfg.device, None).map_err(bad)?;
    let len = mem.size() as usize;
    // SAFETY: the range is the whole mapping, which the Arc handed over keeps mapped for as
    // long as the registration lives.
    unsafe {
        let base = mem.slice_mut(0, mem.size()).as_mut_ptr();
        RdmaSegment::register(nics, base, len, mem.clone(), stamps, cfg.idle_timeout_ms.0)
            .map_err(bad)
    }
}

impl Store {
    /// Creates the segment and starts serving on `listener` and heartbeating (in background
    /// threads).
    pub fn start(cfg: &StoreConfig, listener: TcpListener) -> Result<Store, StoreError> {
        Store::start_tiers(cfg, listener, None)
    }

    /// As `start`, with the disk tier's listener when `cfg` has a disk tier.
    pub fn start_tiers(
        cfg: &StoreConfig,
        listener: TcpListener,
        disk_listener: Option<TcpListener>,
    ) -> Result<Store, StoreError> {
        cfg.protocol.check_built("store.protocol")?;
        let port = listener.local_addr()?.port();
        let host = cfg.advertised_host();
        let endpoint = format!("{host}:{port}");
        let name = cfg.name.clone().unwrap_or_else(|| endpoint.clone());
        if cfg.persistent && cfg.segment_size.0 > 0 && !cfg.effective_persistence() {
            tracing::warn!(
                "no stable store name (neither name nor a fixed port is set): objects \
                will not be kept across restarts"
            );
        }
        let access = Access::new(cfg.shm_group.as_deref())?;
        let (memory, lock, index, recovery) = if cfg.effective_persistence() {
            match open_persistent(cfg, &access, &name)? {
                (m, Some((i, l, r))) => (Some(Arc::new(m)), Some(l), Some(i), Some(r)),
                (m, None) => (Some(Arc::new(m)), None, None, None),
            }
        } else if cfg.segment_size.0 > 0 {
            let (m, l) = open_ephemeral(cfg, &access, &name)?;
            (Some(Arc::new(m)), Some(l), None, None)
        } else {
            tracing::warn!("segment_size is 0: this store contributes no memory (pure client)");
            (None, None, None, None)
        };
        let mut segment = memory.as_ref().map(|m| {
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
                segment_uuid: index.as_ref().map_or_else(incarnation, |i| i.uuid()),
                tier: Tier::Memory,
                persistent: index.is_some(),
                ..SegmentInfo::default()
            }
        });
        let records: Arc<index::Records> = Arc::new(match index {
            Some(index) => index::Records::Durable(index),
            None => index::Records::in_memory(),
        });
        #[cfg(feature = "rdma")]
        let rdma = match (&memory, cfg.protocol) {
            (Some(mem), crate::transfer::Transport::Rdma) => {
                // One-sided readers check versions in this table; it follows the records.
                let stamps = Arc::new(crate::transfer::stamps::StampTable::new(mem.size())?);
                records.attach_stamps(stamps.clone());
                Some(Arc::new(register_rdma(cfg, mem, stamps)?))
            }
            _ => None,
        };
        let te_hashes = Arc::new(crate::mooncake::te_tcp::WrittenHashes::default());
        let door = match (&memory, &mut segment) {
            (Some(memory), Some(info)) if cfg.serves_mooncake_transfer() => {
                // An RDMA store serves Mooncake's RDMA transport; a descriptor names one.
                #[cfg(feature = "rdma")]
                let rdma_transport = rdma.clone().map(mooncake::TeTransport::Rdma);
                #[cfg(not(feature = "rdma"))]
                let rdma_transport = None;
                let transport = match rdma_transport {
                    Some(t) => t,
                    None => mooncake::TeTransport::Tcp(mooncake::bind(
                        "store Mooncake transfer",
                        &cfg.bind_address,
                        cfg.te_port,
                    )?),
                };
                let listeners = (
                    transport,
                    mooncake::bind(
                        "store Mooncake handshake",
                        &cfg.bind_address,
                        cfg.te_handshake_port,
                    )?,
                );
                let door = mooncake::MooncakeDoor::start(
                    &host,
                    listeners,
                    (memory.clone(), records.clone(), te_hashes.clone()),
                    cfg.server_options(),
                )?;
                info.te_endpoint = door.endpoint.name.clone();
                info.te_data_port = u32::from(door.endpoint.data_port);
                info.te_base = door.endpoint.base;
                Some(door)
            }
            _ => None,
        };
        let lease = Arc::new(server::ReadLease::default());
        let write_floor = Arc::new(AtomicU64::new(0));
        // This process's key for the master's grants: made afresh with each start, so a put
        // granted before a restart cannot write after it.
        let grant_key = GrantKey::generate()?;
        let (hasher, hasher_woken) = hasher::Hasher::new();
        let service = Arc::new(StoreService {
            name: name.clone(),
            memory,
            grants: server::GrantCheck::new(grant_key.clone()),
            records: records.clone(),
            te_hashes,
            hasher: hasher.clone(),
            lease: lease.clone(),
            write_floor: write_floor.clone(),
            stale_writes: AtomicU64::new(0),
            claims: Default::default(),
            superseded_writes: AtomicU64::new(0),
            stale_reads: AtomicU64::new(0),
            recovery: recovery.unwrap_or_default(),
            index_errors: AtomicU64::new(0),
            checksum_mismatches: AtomicU64::new(0),
            stats: OpStats::default(),
            bytes_written: AtomicU64::new(0),
            bytes_sealed: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            connections: Default::default(),
            #[cfg(feature = "rdma")]
            rdma,
            rdma_connects: AtomicU64::new(0),
            rdma_bytes_sealed: AtomicU64::new(0),
        });
        let secret = crate::auth::load(cfg.auth_token_file.as_deref())?;
        crate::auth::warn_if_open("store", &cfg.bind_address, secret.as_deref());
        let opts = tserver::ServerOptions {
            auth: secret.clone(),
            ..cfg.server_options()
        };
        let server = tserver::spawn(listener, service.clone(), opts)?;
        let metadata_server = cfg
            .metadata_server
            .starts_with("http")
            .then(|| {
                crate::mooncake::metadata::MetadataServer::new(
                    &cfg.metadata_server,
                    &cfg.ca_cert_paths,
                    std::time::Duration::from_secs(3),
                )
            })
            .transpose()?;
        let mut registration = Registration::new(
            &cfg.master,
            segment,
            records.clone(),
            lease,
            metadata_server,
            cfg.heartbeat_interval_ms.0,
            (secret, grant_key.clone()),
        )
        .map_err(|e| crate::config::ConfigError::invalid("store.master", e.to_string()))?;
        registration.te_endpoint = door.as_ref().map(|d| d.endpoint.clone());
        registration.memory = service.memory.clone();
        registration.conflict_wait = cfg.name_conflict_wait_ms.0;
        registration.write_floor = write_floor;
        let registration = Arc::new(registration);
        let disk = match (&cfg.disk_tier, &service.memory) {
            (Some(_), Some(memory)) => {
                let l = match disk_listener {
                    Some(l) => l,
                    None => role::bind("store disk tier", &cfg.bind_address, cfg.disk_tier_port)?,
                };
                let tier = (memory, &records);
                Some(DiskTier::start(
                    cfg,
                    &name,
                    &host,
                    l,
                    tier,
                    (registration.client_id, &grant_key),
                )?)
            }
            _ => None,
        };
        // Without it, the wake-ups of seals go nowhere: unhashed objects stay so.
        let hasher = match &service.memory {
            Some(memory) if cfg.hash_mooncake_writes => Some(hasher.spawn(
                hasher_woken,
                records.clone(),
                memory.clone(),
                registration.clone(),
            )?),
            _ => None,
        };
        let reg = registration.clone();
        let heartbeat = std::thread::Builder::new()
            .name("store-heartbeat".into())
            .spawn(move || reg.run())?;
        let prefault = match &service.memory {
            Some(memory) if !cfg.prefault => {
                memory.leave_pages_to_fault();
                tracing::info!("segment pages fault in on first write (prefault = false)");
                None
            }
            Some(memory) => {
                let (memory, stop) = (memory.clone(), registration.stop.clone());
                Some(
                    std::thread::Builder::new()
                        .name("store-prefault".into())
                        .spawn(move || {
                            let t0 = std::time::Instant::now();
                            let bytes = memory.prefault(|| stop.is_triggered());
                            tracing::info!(
                                bytes,
                                ms = t0.elapsed().as_millis() as u64,
                                "segment pages faulted in"
                            );
                        })?,
                )
            }
            None => None,
        };
        tracing::info!(%name, %endpoint, segment_bytes = cfg.segment_size.0, master = %cfg.master,
            local_buffer_bytes = cfg.local_buffer_size.0, "store serving");
        Ok(Store {
            status: Arc::new(StoreStatus {
                service,
                registration,
                name,
                endpoint,
                disk,
                mooncake: door,
            }),
            server,
            heartbeat: Some(heartbeat),
            prefault,
            hasher,
            hand_over: Duration::from_secs(cfg.hand_over_secs),
            _lock: lock,
        })
    }

    /// The store's name (its segment's).
    pub fn name(&self) -> &str {
        &self.status.name
    }

    /// Has the master copy the segment's objects to the other stores, serving reads and
    /// heartbeats meanwhile, until it says the hand-over ended or `hand_over` (and a little
    /// for the last copies' answers) has passed.
    fn hand_over_objects(&self) {
        let started = Instant::now();
        let give_up = started + self.hand_over + HAND_OVER_SLACK;
        let mut told = started;
        loop {
            match self.status.registration.hand_over(self.hand_over) {
                Ok(None) => return,
                Ok(Some(r)) if r.state != 0 => {
                    let state = if r.state == 1 { "done" } else { "expired" };
                    tracing::info!(
                        state,
                        objects = r.objects,
                        moved = r.moved_objects,
                        bytes = r.moved_bytes,
                        failed = r.failed,
                        no_room = r.no_room,
                        took_ms = started.elapsed().as_millis() as u64,
                        "hand-over to the other stores ended"
                    );
                    return;
                }
                Ok(Some(r)) => {
                    if told.elapsed() >= Duration::from_secs(1) {
                        told = Instant::now();
                        tracing::info!(
                            objects = r.objects,
                            moved = r.moved_objects,
                            "handing objects over to the other stores"
                        );
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "hand-over not done: the master did not take it");
                    return;
                }
            }
            if Instant::now() >= give_up {
                tracing::warn!("hand-over still running at its deadline; stopping anyway");
                return;
            }
            std::thread::sleep(HAND_OVER_POLL);
        }
    }

    /// Unmounts from the master (a persistent store asks it to keep the objects for its return)
    /// and stops accepting connections. The heartbeat is stopped and joined first: a beat in
    /// flight could otherwise mount the segment again after the unmount.
    pub fn shutdown(&mut self) {
        if !self.hand_over.is_zero() {
            self.hand_over_objects();
        }
        let registration = &self.status.registration;
        registration.stop.trigger();
        if let Some(h) = self.heartbeat.take() {
            let _ = h.join();
        }
        if let Some(disk) = &self.status.disk {
            disk.stop_heartbeat();
        }
        if let Some(h) = self.prefault.take() {
            let _ = h.join();
        }
        // What is left unhashed is hashed, and the master told, before the unmount.
        if let Some(h) = self.hasher.take() {
            self.status.service.hasher.stop(h);
        }
        // The disk segment first: the master's moves into memory stop before memory goes.
        if let Some(disk) = &self.status.disk {
            disk.registration.unmount();
            disk.stop_serving();
        }
        registration.unmount();
        if let Some(door) = &self.status.mooncake {
            door.stop();
        }
        self.server.stop();
        // Connections still open (the master's among them) hold the service, and with it the
        // segment, until they close: its files go now.
        if let Some(memory) = &self.status.service.memory {
            memory.unlink();
        }
    }
}

impl StoreStatus {
    /// The store's `/metrics` text.
    pub fn metrics_text(&self) -> String {
        let s = &self.service;
        let mut p = PromText::new();
        p.single(
            &SEGMENT_BYTES,
            s.memory.as_ref().map_or(0, |m| m.size()) as f64,
        )
        .single(
            &SEGMENT_PREFAULTED_BYTES,
            s.memory.as_ref().map_or(0, |m| m.prefaulted()) as f64,
        )
        .single(
            &SEGMENT_PREFAULT_ENDED,
            f64::from(u8::from(
                s.memory.as_ref().is_none_or(|m| m.prefault_ended()),
            )),
        )
        .single(
            &MOUNTED,
            (self.registration.segment_id.load(Ordering::SeqCst) != 0) as u8 as f64,
        )
        .atomic(&WRITTEN_BYTES_TOTAL, &s.bytes_written)
        .single(&UNHASHED_OBJECTS, s.records.unhashed_count() as f64)
        .atomic(&HASHED_LATER_OBJECTS_TOTAL, &s.hasher.stats.objects)
        .atomic(&HASHED_LATER_BYTES_TOTAL, &s.hasher.stats.bytes)
        .atomic(&HASHES_REPORTED_TOTAL, &s.hasher.stats.reported)
        .atomic(&HASH_REPORT_FAILURES_TOTAL, &s.hasher.stats.report_failures)
        .atomic(&SEALED_BYTES_TOTAL, &s.bytes_sealed)
        .atomic(&RDMA_QUEUE_PAIRS_TOTAL, &s.rdma_connects)
        .atomic(&RDMA_SEALED_BYTES_TOTAL, &s.rdma_bytes_sealed)
        .atomic(&USED_BYTES, &self.registration.used_bytes)
        .atomic(&READ_BYTES_TOTAL, &s.bytes_read)
        .single(&PERSISTENT, s.records.durable().is_some() as u8 as f64)
        .single(&INDEX_RECORDS, s.records.len() as f64)
        .single(
            &READ_LEASE,
            s.lease.valid(std::time::Instant::now()) as u8 as f64,
        )
        .atomic(&STALE_READS_TOTAL, &s.stale_reads)
        .atomic(&STALE_WRITES_TOTAL, &s.stale_writes)
        .atomic(&SUPERSEDED_WRITES_TOTAL, &s.superseded_writes)
        .atomic(&UNGRANTED_TOTAL, &s.grants.refused)
        .single(&RECOVERED_OBJECTS, s.recovery.objects as f64)
        .single(&RECOVERY_CORRUPT_OBJECTS, s.recovery.corrupt as f64)
        .single(&RECOVERY_SECONDS, s.recovery.seconds)
        .atomic(&INDEX_ERRORS_TOTAL, &s.index_errors)
        .atomic(&CHECKSUM_MISMATCHES_TOTAL, &s.checksum_mismatches);
        if let Some(d) = &self.disk {
            d.render(&mut p);
        }
        if let Some(door) = &self.mooncake {
            door.render(&mut p);
        }
        #[cfg(feature = "rdma")]
        if let Some(rdma) = &s.rdma {
            p.family(&RDMA_DEVICE_QUEUE_PAIRS_TOTAL);
            for (device, n) in rdma.devices() {
                p.sample(
                    &RDMA_DEVICE_QUEUE_PAIRS_TOTAL,
                    &[("device", &device)],
                    n as f64,
                );
            }
        }
        s.connections.render(&mut p, "rbgctl_store");
        s.stats.render(&mut p, "rbgctl_store", |op| {
            Opcode::from_u8(op).map(|o| o.name())
        });
        p.finish()
    }
}

/// The store's sockets, bound before it starts (port 0 lets the kernel choose).
pub struct Listeners {
    /// Reads and writes of segment bytes.
    pub data: TcpListener,
    /// `/metrics` and `/health`.
    pub metrics: TcpListener,
    /// Reads of the disk tier and the master's moves (with a disk tier only).
    pub disk: Option<TcpListener>,
}

impl Listeners {
    /// Binds the store's sockets its config names (port 0: the kernel chooses).
    pub fn bind(cfg: &StoreConfig) -> Result<Listeners, StoreError> {
        let disk = match &cfg.disk_tier {
            Some(_) => Some(role::bind(
                "store disk tier",
                &cfg.bind_address,
                cfg.disk_tier_port,
            )?),
            None => None,
        };
        Ok(Listeners {
            data: role::bind("store data", &cfg.bind_address, cfg.port)?,
            metrics: role::bind("store metrics", &cfg.metrics_host, cfg.metrics_port)?,
            disk,
        })
    }
}

/// Where a started store listens.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Addrs {
    pub data: SocketAddr,
    pub metrics: SocketAddr,
    /// The disk tier's data service, when the store has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<SocketAddr>,
}

/// A running store: its addresses, and how to stop it and wait for it.
pub type Handle = role::Handle<Addrs, StoreError>;

/// Starts the store on bound listeners; it runs until `shutdown` fires, then unmounts cleanly.
pub fn start(
    cfg: StoreConfig,
    listeners: Listeners,
    shutdown: Shutdown,
) -> Result<Handle, StoreError> {
    let tls =
        crate::tls::optional_server(cfg.tls_cert_path.as_deref(), cfg.tls_key_path.as_deref())?;
    let addrs = Addrs {
        data: listeners.data.local_addr()?,
        metrics: listeners.metrics.local_addr()?,
        disk: listeners
            .disk
            .as_ref()
            .map(|l| l.local_addr())
            .transpose()?,
    };
    let runtime = role::runtime("store-http", Some(1))?;
    let metrics = {
        let _guard = runtime.enter();
        role::async_listener(listeners.metrics)?
    };
    let mut store = Store::start_tiers(&cfg, listeners.data, listeners.disk)?;
    tracing::info!(addr = %addrs.metrics, "store metrics listening");
    runtime.spawn(crate::http_server::serve_tls(
        metrics,
        http_router(store.status.clone()),
        shutdown.clone(),
        Default::default(),
        tls,
        None,
    ));
    role::announce("store", &addrs);
    let stop = shutdown.clone();
    let fatal = store.status.registration.fatal.clone();
    Ok(Handle::spawn("store", addrs, shutdown, move || {
        runtime.block_on(async {
            tokio::select! {
                _ = stop.wait() => {}
                _ = fatal.wait() => {}
            }
        });
        tracing::info!("store stopping");
        store.shutdown();
        runtime.shutdown_timeout(Duration::from_secs(5));
        match store.status.registration.failure() {
            Some(why) => Err(StoreError::NameTaken(why)),
            None => Ok(()),
        }
    })?)
}

fn http_router(status: Arc<StoreStatus>) -> axum::Router {
    use axum::http::StatusCode;
    let metrics = {
        let s = status.clone();
        move || async move { s.metrics_text() }
    };
    let health = move || async move {
        let reg = &status.registration;
        let disk = status.disk.as_ref().map(|d| {
            serde_json::json!({"segment": d.service.name, "endpoint": d.endpoint,
                "mounted": d.registration.mounted(), "error": d.registration.last_error(),
                "direct_io": d.service.area.direct()})
        });
        let mounted = reg.mounted()
            && status
                .disk
                .as_ref()
                .is_none_or(|d| d.registration.mounted());
        let error = reg.last_error();
        let body = serde_json::json!({"status": if mounted {"ok"} else {"unregistered"},
            "segment": status.name, "endpoint": status.endpoint, "mounted": mounted,
            "master": &*reg.master.addr(),
            "master_reachable": reg.reachable.load(Ordering::Relaxed), "error": error,
            "disk_tier": disk});
        let code = match mounted {
            true => StatusCode::OK,
            false => StatusCode::SERVICE_UNAVAILABLE,
        };
        (code, axum::Json(body))
    };
    axum::Router::new()
        .route("/metrics", axum::routing::get(metrics))
        .route("/health", axum::routing::get(health))
}

/// Runs `rbgctl store` on the addresses of its config until SIGINT or SIGTERM.
pub fn run(cfg: StoreConfig) -> Result<(), StoreError> {
    access::private_umask();
    // Both ports are bound before registering: a store that cannot serve never mounts.
    let listeners = Listeners::bind(&cfg)?;
    start(cfg, listeners, Shutdown::on_signals()?)?.wait()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ByteSize, Millis};
    use crate::master::{self, config::MasterConfig};
    use crate::testkit::proxy::DelayProxy;

    use crate::transfer::{ConnOptions, Connection};

    fn local_master() -> master::Handle {
        let cfg = MasterConfig {
            rpc_address: "127.0.0.1".into(),
            rpc_port: 0,
            metrics_host: "127.0.0.1".into(),
            metrics_port: 0,
            ..MasterConfig::default()
        };
        let listeners = master::Listeners::bind(&cfg).unwrap();
        master::start(cfg, listeners, Shutdown::new()).unwrap()
    }

    fn live_segments(master: SocketAddr) -> usize {
        let mut c = Connection::connect(&master.to_string(), &ConnOptions::default()).unwrap();
        let r = c.call::<crate::transfer::rpc::ListSegments>(&()).unwrap();
        r.segments.len()
    }

    #[test]
    fn a_heartbeat_in_flight_does_not_mount_the_segment_again_after_a_clean_stop() {
        let master = local_master();
        // A slow link: each heartbeat takes 300 ms, so one is in flight almost all the time.
        let link = DelayProxy::start(master.addrs.rpc, Duration::from_millis(150)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let cfg = StoreConfig {
            master: link.addr.to_string(),
            bind_address: "127.0.0.1".into(),
            local_hostname: "127.0.0.1".into(),
            segment_size: ByteSize(1 << 20),
            shm_dir: dir.path().into(),
            persistent: false,
            heartbeat_interval_ms: Millis(Duration::from_millis(10)),
            ..StoreConfig::default()
        };
        let data = role::bind("store data", "127.0.0.1", 0).unwrap();
        let mut store = Store::start(&cfg, data).unwrap();
        assert!(crate::testkit::wait_until(Duration::from_secs(10), || {
            store.status.registration.mounted()
        }));
        assert_eq!(live_segments(master.addrs.rpc), 1);
        assert!(
            crate::testkit::wait_until(Duration::from_secs(10), || link.in_flight() > 0),
            "a heartbeat on its way"
        );
        store.shutdown();
        assert!(link.wait_quiet(Duration::from_secs(10)));
        assert_eq!(
            live_segments(master.addrs.rpc),
            0,
            "the segment was mounted again after its store stopped"
        );
    }
}
