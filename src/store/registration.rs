//! Keeping the master informed: mount the segment, heartbeat, mount again when the master asks
//! (it restarted or expired us), unmount on a clean stop. A persistent store reports every object
//! in its durable index after each mount, so that a restarted master (or one that saw the store
//! go away) binds them again. Optionally publishes the segment's Mooncake descriptor to an HTTP
//! metadata server.

use super::index::Records;
use super::server::ReadLease;
use crate::ha::link::MasterLink;
use crate::mooncake::metadata::MetadataServer;
use crate::shutdown::Shutdown;
use crate::transfer::grant::GrantKey;
use crate::transfer::message::{
    HandOverReq, HandOverResp, HashedReq, LeaseReq, ListSegmentsResp, MountReq, MountResp, PingReq,
    PingResp, ReportReq, ReportResp, SegmentInfo, UnmountReq,
};
use crate::transfer::rpc;
use crate::transfer::{ConnOptions, Status, TransferError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Objects per `ReportObjects` request.
const REPORT_CHUNK: usize = 8192;

/// A store's report of the objects it kept, as the requests that carry it: chunks of
/// `REPORT_CHUNK` records, the last one marked done (one empty request for no objects).
pub fn report_requests(
    client_id: u64,
    segment_id: u64,
    objects: &[crate::transfer::message::StoredObject],
) -> impl Iterator<Item = ReportReq> + '_ {
    let chunks = objects.len().div_ceil(REPORT_CHUNK).max(1);
    (0..chunks).map(move |i| {
        let from = (i * REPORT_CHUNK).min(objects.len());
        let to = ((i + 1) * REPORT_CHUNK).min(objects.len());
        ReportReq {
            client_id,
            segment_id,
            objects: objects[from..to].to_vec(),
            done: i + 1 == chunks,
        }
    })
}

/// A store's standing with the master: its mount, heartbeats and reports.
pub struct Registration {
    pub client_id: u64,
    /// The cluster secret: sent as a Bearer token with the metadata server writes.
    auth: Option<Arc<crate::auth::Secret>>,
    pub master: MasterLink,
    pub segment: Option<SegmentInfo>,
    /// The key this store checks the master's grants and orders with, sent with each mount.
    grant_key: GrantKey,
    /// What the segment holds (the durable index of a persistent store).
    pub records: Arc<Records>,
    /// The segment's bytes, where records may wait to be hashed (`hasher`): hashed before a
    /// report, so that every record reported has its checksum.
    pub memory: Option<Arc<super::segment::SegmentMemory>>,
    /// Revoked whenever the segment is mounted (again): the master renews it once it knows
    /// the segment's objects.
    pub lease: Arc<ReadLease>,
    /// The master's `write_floor` at the last mount, shared with the data service.
    pub write_floor: Arc<AtomicU64>,
    /// The id the master gave the segment; 0 while not mounted.
    pub segment_id: AtomicU64,
    /// Where the segment's descriptor is published on each mount, if anywhere.
    pub metadata_server: Option<MetadataServer>,
    /// The segment's Transfer Engine endpoint, as the store's Mooncake door serves it (the
    /// descriptor published is the one its handshake answers).
    pub te_endpoint: Option<crate::mooncake::handshake::TeEndpoint>,
    /// Fired on a clean stop: the heartbeat loop returns.
    pub stop: Shutdown,
    pub interval: Duration,
    /// How long to wait while another running store holds our name.
    pub conflict_wait: Duration,
    /// Fired when the store cannot go on (its name stays taken); `failure` says why.
    pub fatal: Shutdown,
    failure: parking_lot::Mutex<Option<String>>,
    /// What went wrong with the last heartbeat; `None` when it went through.
    last_error: parking_lot::Mutex<Option<String>>,
    /// Whether the master answered the last heartbeat (an error answer counts).
    pub reachable: std::sync::atomic::AtomicBool,
    /// Bytes of the segment in use, as the master last said.
    pub used_bytes: AtomicU64,
    /// When the use was last asked for.
    usage_asked: parking_lot::Mutex<Option<std::time::Instant>>,
}

/// How often the store asks the master how much of its segment is in use.
const USAGE_EVERY: Duration = Duration::from_secs(5);

/// How often a store the master refuses for want of the cluster secret says so again.
const UNAUTHENTICATED_LOG_EVERY: Duration = Duration::from_secs(60);

/// How often a store that cannot reach its master says so again.
const UNREACHABLE_LOG_EVERY: Duration = Duration::from_secs(30);

impl Registration {
    /// The store's registration with the master at `master`: its segment, records and read
    /// lease, heartbeating every `interval`.
    pub fn new(
        master: &str,
        segment: Option<SegmentInfo>,
        records: Arc<Records>,
        lease: Arc<ReadLease>,
        metadata_server: Option<MetadataServer>,
        interval: Duration,
        (auth, grant_key): (Option<Arc<crate::auth::Secret>>, GrantKey),
    ) -> Result<Registration, crate::ha::HaError> {
        let opts = ConnOptions {
            io_timeout: Duration::from_secs(3),
            spin: Duration::ZERO,
            auth: auth.clone(),
            ..ConnOptions::default()
        };
        Ok(Registration {
            client_id: fastrand::u64(1..),
            auth,
            master: MasterLink::new(master, opts)?,
            segment,
            grant_key,
            records,
            memory: None,
            lease,
            write_floor: Arc::default(),
            segment_id: AtomicU64::new(0),
            metadata_server,
            te_endpoint: None,
            stop: Shutdown::new(),
            interval,
            conflict_wait: Duration::from_secs(30),
            fatal: Shutdown::new(),
            failure: parking_lot::Mutex::new(None),
            last_error: parking_lot::Mutex::new(None),
            reachable: std::sync::atomic::AtomicBool::new(false),
            used_bytes: AtomicU64::new(0),
            usage_asked: parking_lot::Mutex::new(None),
        })
    }

    /// Whether the segment is mounted with the master (always, for a store without one).
    pub fn mounted(&self) -> bool {
        self.segment.is_none() || self.segment_id.load(Ordering::SeqCst) != 0
    }

    fn mount(&self) -> Result<(), TransferError> {
        let Some(seg) = &self.segment else {
            return Ok(());
        };
        // Until the master knows this segment's objects again, no location a client cached
        // may be trusted here. Whatever the store holds (its durable index, or the records of
        // a running non-persistent store), it reports: a master that restarted or took over
        // learns the objects from their stores, persistent or not.
        self.lease.revoke();
        let req = MountReq {
            client_id: self.client_id,
            segment: seg.clone(),
            recovering: seg.segment_uuid != 0,
            grant_key: self.grant_key.bytes().to_vec(),
        };
        let resp: MountResp = self.master.with(|c| c.call::<rpc::MountSegment>(&req))?;
        // Authoritative, not a maximum: the master answering is the current one (an older
        // one's answer is refused by its epoch), and its clock may be behind a predecessor's.
        self.write_floor.store(resp.write_floor, Ordering::Release);
        if req.recovering {
            self.report(resp.segment_id, resp.discard)?;
        }
        let previous = self.segment_id.swap(resp.segment_id, Ordering::SeqCst);
        if previous != resp.segment_id {
            tracing::info!(segment = %seg.name, segment_id = resp.segment_id, master = %self.master.addr(), "segment mounted");
        }
        // On every mount: a master that restarted or took over has an empty metadata server
        // (a standby's redirects the PUT to the leader's).
        if let Some(server) = &self.metadata_server {
            publish_descriptor(server, seg, self.te_endpoint.as_ref(), self.auth.as_deref());
        }
        Ok(())
    }

    /// Reports the records to the master in chunks and drops what the master does not take.
    fn report(&self, segment_id: u64, discard: bool) -> Result<(), TransferError> {
        if discard {
            tracing::warn!(
                "the master gave this segment's objects up (away longer than its \
                grace period); forgetting them"
            );
            if let Err(e) = self.records.clear() {
                tracing::error!(error = %e, "cannot clear the records");
            }
        }
        if let Some(memory) = &self.memory {
            let threads = crate::transfer::hashing::threads();
            if let Err(e) = self.records.hash_unhashed(memory, threads) {
                tracing::error!(error = %e, "cannot record the checksums of hashed objects");
            }
        }
        let objects = self.records.snapshot();
        let total = objects.len();
        let mut dropped = 0;
        for req in report_requests(self.client_id, segment_id, &objects) {
            let resp: ReportResp = self.master.with(|c| c.call::<rpc::ReportObjects>(&req))?;
            dropped += resp.forget.len();
            if let Err(e) = self.records.forget(&resp.forget) {
                tracing::error!(error = %e, "cannot drop records the master did not take");
            }
        }
        tracing::info!(
            reported = total,
            kept = total - dropped,
            dropped,
            "objects reported to the master"
        );
        Ok(())
    }

    /// Gives the master the checksums of objects recorded unhashed (`OBJECTS_HASHED`), in
    /// chunks; returns how many were sent. Nothing is sent while the segment is not mounted:
    /// the next mount's report carries them.
    pub fn report_hashed(
        &self,
        objects: &[crate::transfer::message::StoredObject],
    ) -> Result<usize, TransferError> {
        let segment_id = self.segment_id.load(Ordering::SeqCst);
        if segment_id == 0 {
            return Ok(0);
        }
        for chunk in objects.chunks(REPORT_CHUNK) {
            let req = HashedReq {
                client_id: self.client_id,
                segment_id,
                objects: chunk.to_vec(),
            };
            self.master.with(|c| c.call::<rpc::ObjectsHashed>(&req))?;
        }
        Ok(objects.len())
    }

    /// One heartbeat; mounts first when not mounted or when the master does not know us.
    pub fn beat(&self) -> Result<(), TransferError> {
        let resp: PingResp = self.master.with(|c| {
            c.call::<rpc::Ping>(&PingReq {
                client_id: self.client_id,
            })
        })?;
        if resp.need_remount || !self.mounted() {
            if resp.need_remount && self.segment_id.load(Ordering::SeqCst) != 0 {
                tracing::warn!(
                    "master does not know this store (restarted or expired us); mounting again"
                );
                self.segment_id.store(0, Ordering::SeqCst);
            }
            self.mount()?;
        }
        self.renew_lease();
        self.refresh_usage();
        Ok(())
    }

    /// Asks the master for a read lease, counted from before the request leaves: however late
    /// the answer comes, the lease ends no later than the master thinks it does.
    fn renew_lease(&self) {
        let segment_id = self.segment_id.load(Ordering::SeqCst);
        if segment_id == 0 {
            return;
        }
        let sent = std::time::Instant::now();
        let req = LeaseReq {
            client_id: self.client_id,
            segment_id,
        };
        match self.master.with(|c| c.call::<rpc::Lease>(&req)) {
            // Mounted again meanwhile: that mount revoked the lease, and this one is not its.
            Ok(r) if r.lease_ms > 0 && self.segment_id.load(Ordering::SeqCst) == segment_id => {
                self.lease
                    .extend(sent, std::time::Duration::from_millis(r.lease_ms));
            }
            Ok(_) => {}
            // The master gave the segment up (or never had it) while an answer telling us so
            // was lost: mount again at the next heartbeat.
            Err(e)
                if matches!(
                    e.status(),
                    Some(Status::SegmentNotFound | Status::IllegalClient)
                ) =>
            {
                tracing::warn!(error = %e, "the master no longer has this segment mounted; mounting again");
                let _ = self.segment_id.compare_exchange(
                    segment_id,
                    0,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                );
            }
            Err(e) => {
                tracing::debug!(error = %e, "no read lease from the master");
            }
        }
    }

    /// Every few seconds: how much of the segment is in use, from the master's segment list.
    fn refresh_usage(&self) {
        let id = self.segment_id.load(Ordering::SeqCst);
        let due = self
            .usage_asked
            .lock()
            .is_none_or(|t| t.elapsed() >= USAGE_EVERY);
        if id == 0 || !due {
            return;
        }
        *self.usage_asked.lock() = Some(std::time::Instant::now());
        let listed: Result<ListSegmentsResp, _> =
            self.master.with(|c| c.call::<rpc::ListSegments>(&()));
        if let Some(s) = listed
            .ok()
            .and_then(|r| r.segments.into_iter().find(|s| s.id == id))
        {
            self.used_bytes.store(s.used, Ordering::Relaxed);
        }
    }

    /// Why the store stopped on its own, if it did.
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().clone()
    }

    /// The last heartbeat's error; `None` while the master answers.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().clone()
    }

    /// Heartbeats until `stop` is set. A master that cannot be reached is logged at once and
    /// then every 30 s while it lasts; a name held by another running store is waited out for
    /// `conflict_wait`, then the store stops with an error (`fatal`).
    pub fn run(self: Arc<Self>) {
        let mut failing_since: Option<std::time::Instant> = None;
        let mut last_log = std::time::Instant::now();
        let mut conflict_since: Option<std::time::Instant> = None;
        while !self.stop.is_triggered() {
            match self.beat() {
                Ok(()) => {
                    if let Some(t) = failing_since.take() {
                        tracing::info!(
                            master = %self.master.addr(),
                            down_s = t.elapsed().as_secs(),
                            "master reachable again"
                        );
                    }
                    conflict_since = None;
                    *self.last_error.lock() = None;
                    self.reachable.store(true, Ordering::Relaxed);
                }
                Err(e) if e.status() == Some(crate::transfer::Status::SegmentExists) => {
                    *self.last_error.lock() = Some(e.to_string());
                    self.reachable.store(true, Ordering::Relaxed);
                    let since = *conflict_since.get_or_insert_with(std::time::Instant::now);
                    if since.elapsed() >= self.conflict_wait {
                        let why = format!(
                            "{e} (waited {} s for it to go)",
                            self.conflict_wait.as_secs()
                        );
                        tracing::error!(master = %self.master.addr(), error = %why, "stopping: the segment name is taken");
                        *self.failure.lock() = Some(why);
                        self.fatal.trigger();
                        return;
                    }
                    if since.elapsed() < self.interval
                        || last_log.elapsed() >= Duration::from_secs(5)
                    {
                        tracing::warn!(master = %self.master.addr(), error = %e,
                            wait_s = self.conflict_wait.as_secs(), "segment name taken; waiting for the other store to go");
                        last_log = std::time::Instant::now();
                    }
                }
                Err(e) => {
                    *self.last_error.lock() = Some(e.to_string());
                    self.reachable
                        .store(e.status().is_some(), Ordering::Relaxed);
                    let first = failing_since.is_none();
                    let since = *failing_since.get_or_insert_with(std::time::Instant::now);
                    let refused = e.status() == Some(Status::Unauthenticated);
                    let every = match refused {
                        true => UNAUTHENTICATED_LOG_EVERY,
                        false => UNREACHABLE_LOG_EVERY,
                    };
                    if first || last_log.elapsed() >= every {
                        if refused {
                            tracing::warn!(master = %self.master.addr(), error = %e,
                                failing_s = since.elapsed().as_secs(),
                                "the master requires the cluster secret and this store does not \
                                 prove it: give the store the master's --auth-token-file; retrying");
                        } else {
                            tracing::warn!(master = %self.master.addr(), error = %e,
                                failing_s = since.elapsed().as_secs(), "cannot reach the master; retrying");
                        }
                        last_log = std::time::Instant::now();
                    }
                    self.master.clear();
                }
            }
            self.stop.sleep(self.interval);
        }
    }

    /// Asks the master to hand the segment's objects over to the other stores (within
    /// `deadline`), or how the hand-over it started goes; `None` when nothing is mounted.
    pub fn hand_over(&self, deadline: Duration) -> Result<Option<HandOverResp>, TransferError> {
        let segment_id = self.segment_id.load(Ordering::SeqCst);
        if segment_id == 0 {
            return Ok(None);
        }
        let req = HandOverReq {
            client_id: self.client_id,
            segment_id,
            deadline_ms: deadline.as_millis() as u64,
        };
        self.master
            .with(|c| c.call::<rpc::HandOver>(&req))
            .map(Some)
    }

    /// Unmounts on a clean stop: a non-persistent store's objects are dropped at once, a
    /// persistent store's are kept (unreadable) for the master's grace period.
    pub fn unmount(&self) {
        // Stop serving cached locations before the master stops telling us what is gone.
        self.lease.revoke();
        let id = self.segment_id.swap(0, Ordering::SeqCst);
        if id == 0 {
            return;
        }
        let req = UnmountReq {
            client_id: self.client_id,
            segment_id: id,
            keep: self.records.durable().is_some(),
        };
        match self.master.with(|c| c.call::<rpc::UnmountSegment>(&req)) {
            Ok(()) => tracing::info!(segment_id = id, "segment unmounted"),
            Err(e) => {
                tracing::warn!(error = %e, "unmount failed; the master will expire the segment")
            }
        }
    }
}

/// Publishes `mooncake/ram/<name>` and `mooncake/rpc_meta/<name>` the way Mooncake's transfer
/// engine does, so that tools reading the metadata server see this segment.
fn publish_descriptor(
    server: &MetadataServer,
    seg: &SegmentInfo,
    te: Option<&crate::mooncake::handshake::TeEndpoint>,
    auth: Option<&crate::auth::Secret>,
) {
    let entries = match te {
        // Mooncake's clients find the segment by its Transfer Engine name; the same
        // descriptor stands under the store's own name too.
        Some(te) => {
            let mut entries = te.metadata_entries().to_vec();
            entries.push((format!("mooncake/ram/{}", seg.name), te.descriptor()));
            entries
        }
        // No Transfer Engine: the store's rbgctl endpoint, for tools that list segments.
        None => {
            let (host, port) = seg
                .endpoint
                .rsplit_once(':')
                .unwrap_or((&seg.endpoint, "0"));
            let port: u16 = port.parse().unwrap_or(0);
            let ram = serde_json::json!({
                "buffers": [{"addr": 0, "length": seg.size, "name": seg.name}],
                "name": seg.name,
                "protocol": "rbgctl",
                "tcp_data_host": host,
                "tcp_data_port": port,
            });
            vec![(format!("mooncake/ram/{}", seg.name), ram)]
        }
    };
    for (key, value) in entries {
        match server.put(&key, &value, auth) {
            Ok(()) => tracing::debug!(%key, "published to the metadata server"),
            Err(e) => {
                tracing::warn!(%key, error = %e, "metadata server did not take the descriptor")
            }
        }
    }
}
